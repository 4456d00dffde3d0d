/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's state and logic: membership (shards, workers, leases), the shard
 * map, the job and its lifecycle, and answers to psctl. The event loop that
 * feeds it is in coord.c too; pscoord.c holds only main. */
#pragma once
#include <stdint.h>
#include <stdbool.h>
#include "job.h"

typedef struct CoordConfig {
        char *listen;
        char *keys;         /* --keys DIR: CURVE and the allow-list (NULL: none) */
        char *key;          /* this daemon's key name in keys (default pscoord) */
        bool insecure;      /* listen on a non-loopback tcp:// without keys */
        char *http;         /* --http ADDR:PORT (NULL: none) */
        unsigned lease_ms;       /* workers' lease */
        unsigned shard_lease_ms; /* shards' lease: a fail-over starts when it runs out */
        unsigned stall_timeout;  /* s: a member the others wait on this long is evicted (0: never) */
        char *checkpoint_dir;    /* where checkpoints go (NULL: none), one directory each */
        unsigned checkpoint_every;   /* clocks between automatic checkpoints (0: none) */
        unsigned checkpoint_keep;    /* automatic checkpoints kept (0: all) */
        unsigned checkpoint_timeout; /* s a save may take */
        unsigned idle_timeout;      /* s: a connection silent this long after a ZMTP ping is dropped (0: never) */
        char *restore;           /* start with the job of this checkpoint */
        char *state_dir;         /* --state-dir: pscoord's state on disk (NULL: none) */
        bool keep_standby;       /* a shard registering after a fail-over stays on standby */
        Job job;            /* the job pscoord starts with */
} CoordConfig;

/* Runs until SIGTERM/SIGINT; 0 after a clean stop, negative errno otherwise. */
int coord_run(const CoordConfig *cfg);
