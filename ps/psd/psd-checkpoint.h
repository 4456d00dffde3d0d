/* SPDX-License-Identifier: Apache-2.0 */
/* A shard's part of checkpoints (see docs/durability.md, "Checkpoints").
 *
 * Save: pscoord fences the shards, picks a clock boundary B and asks each to
 * write the chunks it leads as of B. Under BSP the chunks stop at clock B (no
 * clock past the fence closes); under ASP/SSP no member may pull past B - 1,
 * so none pushes B, and the cut is reached once every member completed B
 * clocks here. Then, in the loop, the shard takes its snapshot (a reference to
 * each chunk's values, which later updates copy before writing; a copy of the
 * optimizer state and de-dup table), ends its own fence, and writes the file
 * in libuv's thread pool while training goes on. It answers pscoord with the
 * file's size and checksum, or why it could not.
 *
 * Restore: the job's first map comes with a checkpoint; the shard creates no
 * chunk from the seed, reads the keys the map gives it (as primary or backup)
 * from the checkpoint's files in the thread pool, checks every checksum, and
 * installs them; until then they answer MIGRATING. It tells pscoord when it is
 * done, or which file and key failed (pscoord fails the job with it).
 *
 * Tables (psd-rows.h) go with them: the cut also waits until every table's
 * rows stand at B (BSP: clock B - 1 closed; ASP/SSP: every member pushed
 * each table at B - 1, or completed B clocks of the chunks here), the
 * tables freeze while the writer reads their rows straight into the file
 * (blocks of CKPT_ROWS records; no copy: a rows push is answered
 * UNAVAILABLE, a BSP clock of the rows does not close meanwhile, while the
 * chunks train on), and a restore reads the rows of every file, keeps those the first map
 * places here (rendezvous hashing: onto any number of shards), builds the
 * tables in the thread pool and swaps them in. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "psd-gate.h"
#include "psd-rows.h"

typedef struct Checkpointer Checkpointer;

/* A checkpoint answer for pscoord: status OK or an error with reason. */
typedef void (*CheckpointDoneFn)(void *ud, uint64_t seq, const Psnet__CheckpointRep *rep, int status,
                                 const char *reason);

int checkpointer_new(Gate *g, uv_loop_t *loop, uint32_t shard, CheckpointDoneFn done, void *ud,
                     Checkpointer **ret);
/* The job's tables (psd-rows.h), saved and restored with the chunks: a
 * save's cut waits for them to stand at its clock too; a restore loads the
 * rows this shard holds under the job's first map from every file. */
void checkpointer_set_rows(Checkpointer *k, Rows *rows);
/* Whether a restore or a seed is being loaded (the tables' rows answer
 * UNAVAILABLE meanwhile: they are swapped in at the end). */
bool checkpoint_loading(const Checkpointer *k);
/* Frees it; a write or load in flight finishes first (the loop runs until it has). */
void checkpointer_free(Checkpointer *k);

/* Starts a save of the chunks this shard leads as of clock into dir (the
 * checkpoint's directory). 0, or a status with reason (a save in flight, not
 * fenced, already past clock). */
int checkpoint_save(Checkpointer *k, uint64_t seq, const char *name, const char *dir, int64_t clock, char *reason,
                    size_t n);
/* After every event: takes a pending save's snapshot once the chunks stand at
 * its clock, or gives the save up when the fence ended first. */
void checkpoint_poll(Checkpointer *k);

/* Loads the keys the store's map gives this shard from the checkpoint in dir
 * (the job was configured with store->restoring set). */
int checkpoint_restore(Checkpointer *k, const char *name, const char *dir, int64_t clock);
/* Builds the job's initial values for the keys this shard holds and lacks in
 * libuv's thread pool and installs them (store->restoring must be set before
 * the job's first map, and is cleared once they are in); requests for them
 * are answered MIGRATING meanwhile. From the initialisers, nothing is
 * answered to pscoord and a failure builds them in the loop instead. From
 * the job's --init file (common/job-init.h), pscoord hears that they are in
 * or why not (it fails the job: never random values instead of the file's).
 * -EBUSY while a save or load runs. */
int checkpoint_seed(Checkpointer *k);
/* Tells pscoord that job's chunks cannot be built from its --init file
 * (checkpoint_seed did not start: err). */
void checkpoint_init_failed(Checkpointer *k, const Job *job, int err);
