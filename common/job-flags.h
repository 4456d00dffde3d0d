/* SPDX-License-Identifier: Apache-2.0 */
/* The job options shared by pscoord (the job it starts with) and
 * "psctl job submit": one table, so both speak the same flags. */
#pragma once
#include <stddef.h>
#include "config.h"
#include "job.h"

#define JOBFLAGS_NOPTS 50

typedef struct JobFlags {
        char *model, *mode, *optim, *data, *init, *tables;
        float lr, momentum, weight_decay, sparsify;
        unsigned epochs, batch, workers, shards, chunk_kb, train_limit, test_limit;
        uint64_t seed;
        char *lr_scaling, *lr_schedule, *wire;
        unsigned warmup_clocks;
        bool allow_nonfinite;
        float max_grad_norm;
        unsigned replicas;
        /* mode fed; the strategy's figures < 0: its defaults */
        char *strategy;
        float server_lr, server_momentum, tau, trim, fraction, prox_mu, dp_clip, dp_noise, dp_delta;
        unsigned rounds, min_clients, min_available, round_timeout, local_epochs;
        bool secagg;
        float secagg_clip, secagg_threshold;
        unsigned secagg_timeout;
        char *compress;
        unsigned eval_every, buffer;
        float staleness_exp, fraction_evaluate, byzantine;
} JobFlags;

/* Defaults from job_defaults(). */
void jobflags_init(JobFlags *f);
/* Writes the option table (JOBFLAGS_NOPTS entries) into opts; returns the count. */
size_t jobflags_options(JobFlags *f, Option *opts);
/* Builds a validated job; on failure writes why into err and returns -EINVAL. */
int jobflags_to_job(const JobFlags *f, Job *ret, char *err, size_t errlen);
