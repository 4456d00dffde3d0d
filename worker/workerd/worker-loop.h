/* workerd's life: register with pscoord, wait for the job, load its data
 * partition, run pull -> compute -> push until the epochs are done, evaluate
 * (rank 0), report and leave. */
#pragma once

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
        char *prefetch;            /* on: pull the next clock while the step computes; off */
} WorkerConfig;

int worker_run(const WorkerConfig *cfg);
