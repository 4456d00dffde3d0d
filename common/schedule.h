/* SPDX-License-Identifier: Apache-2.0 */
/* The job's schedule. Epochs are the job's: one epoch is a pass over the
 * training set by all workers together, however many there are and whenever
 * they joined. A clock of a membership of W workers trains W x batch samples;
 * pscoord counts the samples trained before the current membership's base
 * clock and publishes (base_clock, samples_before) with the membership. Every
 * worker derives from them, with W and its own training set's size, the job's
 * epoch at a clock and the clock at which the job ends, so that all members
 * stop at the same clock. */
#pragma once
#include <stdint.h>

typedef struct Schedule {
        int64_t base_clock;       /* where the current membership started counting */
        uint64_t samples_before;  /* samples trained before base_clock */
        uint32_t workers;         /* members from base_clock on */
        uint32_t batch;           /* samples per worker per clock */
} Schedule;

/* Samples the job has trained before clock (samples_before at or below base). */
uint64_t schedule_samples_at(const Schedule *s, int64_t clock);
/* The first clock by which total samples are trained: base_clock +
 * ceil((total - samples_before) / (workers x batch)), never below base_clock
 * (base_clock itself when no worker is left). */
int64_t schedule_end_clock(const Schedule *s, uint64_t total);
/* The membership becomes workers at clock: the samples before it are counted
 * and clock becomes the base. A clock below the base changes only workers. */
void schedule_rebase(Schedule *s, int64_t clock, uint32_t workers);
/* The job's 1-based epoch once samples are trained, per_epoch samples an
 * epoch, capped at epochs. */
uint32_t schedule_epoch(uint64_t samples, uint64_t per_epoch, uint32_t epochs);
