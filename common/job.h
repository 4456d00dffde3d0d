/* A training job: its tensors (cut into chunks = keys), optimizer, consistency
 * mode and data. Shared by pscoord (which owns it), psd (which stores and
 * updates the chunks) and workerd (which computes on them). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "psnet.pb-c.h"

#define JOB_MAX_TENSORS 64
#define JOB_DEFAULT_CHUNK_FLOATS (256u * 1024u) /* 1 MiB of f32 */

typedef enum { MODE_BSP, MODE_ASP, MODE_SSP } ConsistencyMode;

#define JOB_MAX_STALENESS 1000000u

typedef struct OptimConf {
        char kind[8];        /* "sgd" or "adam" */
        float lr, momentum, weight_decay, beta1, beta2, eps;
        bool nesterov;
} OptimConf;

typedef struct JobTensor {
        char name[32];
        uint32_t shape[4];
        unsigned ndim;
        uint64_t numel;
        char init[12];       /* "zeros", "he", "xavier" */
        uint32_t nchunks;
        uint32_t fan_in, fan_out;
} JobTensor;

typedef struct Job {
        uint32_t id;
        char model[128];
        JobTensor tensors[JOB_MAX_TENSORS];
        size_t ntensors;
        uint32_t layers[JOB_MAX_TENSORS / 2 + 1]; /* MLP widths, e.g. 784,256,10 */
        size_t nlayers;
        OptimConf optim;
        ConsistencyMode mode;
        uint32_t staleness;  /* SSP: a worker at clock c pulls once the slowest reached c - staleness */
        bool lr_scaling;     /* multiply lr by the number of active workers */
        uint32_t chunk_floats;
        uint64_t seed;
        uint32_t batch, epochs;
        char dataset[256];
        uint32_t expect_workers, expect_shards;
        uint32_t train_limit, test_limit;
} Job;

/* Fills *job with defaults (sgd lr 0.02 momentum 0.9, bsp, 1 MiB chunks, seed 42,
 * batch 64, 5 epochs, the Debian Fashion-MNIST directory) and model "mlp:784-256-10". */
void job_defaults(Job *job);

/* Sets job->model and its tensors from "mlp:D0-D1-...-Dn" (2..16 widths, each
 * 1..65536): tensors W0 [D1 x D0] (he init), b0 [D1] (zeros), W1, b1, ...
 * Returns -EINVAL for anything else. */
int job_set_model(Job *job, const char *model);
/* "bsp" | "asp" | "ssp:S" (S = 0..JOB_MAX_STALENESS); -EINVAL otherwise. */
int job_set_mode(Job *job, const char *mode);
/* The mode as job_set_mode reads it, e.g. "ssp:3". */
const char *job_mode_string(const Job *job, char *buf, size_t n);
int job_set_optim(Job *job, const char *kind);      /* "sgd" | "adam"; keeps lr etc. */
/* Checks ranges (lr > 0, chunk_floats 1..64Mi, batch >= 1, ...); on failure
 * writes the reason into err and returns -EINVAL. */
int job_validate(const Job *job, char *err, size_t errlen);

/* Number of floats in chunk c of tensor t; 0 if (t, c) is not a key of the job. */
uint32_t job_chunk_len(const Job *job, uint32_t t, uint32_t c);
/* Total number of keys and of f32 values. */
uint64_t job_nkeys(const Job *job);
uint64_t job_nfloats(const Job *job);

/* Deterministic initial values of chunk c of tensor t, a function of
 * (seed, t, c) only, so any shard computes the same values. out has
 * job_chunk_len floats. */
void job_init_chunk(const Job *job, uint32_t t, uint32_t c, float *out);

/* Conversion to and from the wire. job_to_proto allocates with malloc; free with
 * job_proto_free. job_from_proto validates (see job_validate). */
int job_to_proto(const Job *job, Psnet__JobSpec **ret);
void job_proto_free(Psnet__JobSpec *spec);
int job_from_proto(const Psnet__JobSpec *spec, Job *ret, char *err, size_t errlen);
