/* SPDX-License-Identifier: Apache-2.0 */
/* workerd's trainer: joins the job through libpsnet, loads its partition of
 * the data, and runs pull -> compute -> push steps until the epochs are done,
 * then evaluates (when pscoord asks), reports and leaves. One uv_loop: the
 * steps run on it, the data loading and the evaluation in libuv's thread pool,
 * the pscoord session and the shards' replies are events on it. */
#pragma once
#include <stdbool.h>

typedef struct WorkerConfig {
        char *coord;
        char *backend;             /* cpu, cuda, auto */
        char *data;                /* overrides the job's dataset directory */
        unsigned threads;          /* OpenBLAS threads for the cpu backend */
        unsigned connect_timeout;  /* seconds to wait for pscoord */
        unsigned round_timeout;    /* seconds a pull/push round may take */
        unsigned progress_ms;      /* progress log interval */
        bool trace_pulls;          /* log a checksum of the weights pulled at each clock */
        unsigned step_delay_ms;    /* test knob: wait this long before each push */
        bool tf32;                 /* allow TF32 tensor-core gemm (cuda) */
        bool no_graphs;            /* run each step op by op instead of a captured graph */
        bool prefetch;             /* pull the next clock while the step computes */
        char *keys, *key, *coord_key; /* CURVE: --keys DIR, this worker's key, pscoord's */
        char *gateway, *gateway_key;  /* --edge: psgate, the one endpoint dialled, and its key in --keys */
        char *http;                /* --http ADDR:PORT (NULL: none) */
        /* --edge (edge.h): a federated client */
        bool edge;
        unsigned part, part_n;     /* --partition K/N: its share of the training set (part_n 0: all) */
        double alpha;              /* --alpha: Dirichlet concentration of the split (<= 0: iid) */
        unsigned simulate;         /* --simulate N: N clients in this process (0: one) */
        unsigned parallel;         /* --parallel N: of them, N train at once (0: one per core) */
} WorkerConfig;

/* Runs until the job is done (or the worker is stopped). 0, or a negative
 * errno after logging why. */
int trainer_run(const WorkerConfig *cfg);
