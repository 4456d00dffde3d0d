/* SPDX-License-Identifier: Apache-2.0 */
/* A training job: its tensors (cut into chunks = keys), optimizer, consistency
 * mode and data. Shared by pscoord (which owns it), psd (which stores and
 * updates the chunks) and workerd (which computes on them). Its wire form and
 * the conversions live in common/net/wire-job.h. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "compress.h"
#include "fed.h"
#include "modeldesc.h"
#include "table-spec.h"

#define JOB_MAX_TENSORS MD_MAX_TENSORS
#define JOB_DEFAULT_WARMUP_CLOCKS 100
#define JOB_DEFAULT_CHUNK_FLOATS (256u * 1024u) /* 1 MiB of f32 */

/* MODE_FED: federated rounds run by pscoord (edge workers train locally and
 * push deltas; the shards aggregate per round, common/fed.h). */
typedef enum { MODE_BSP, MODE_ASP, MODE_SSP, MODE_FED } ConsistencyMode;
typedef enum { OPTIM_SGD, OPTIM_ADAM } OptimKind;
/* How the learning rate follows the number of members W (job_lr_factor). */
typedef enum { LR_SCALING_NONE, LR_SCALING_AUTO, LR_SCALING_LINEAR, LR_SCALING_SQRT } LrScaling;
/* What workers send and receive (--wire): f32, or bf16 (the shards keep f32). */
typedef enum { JOB_WIRE_F32, JOB_WIRE_BF16 } JobWire;
/* How the learning rate follows the job's progress (job_lr_factor). */
typedef enum { LR_SCHEDULE_CONSTANT, LR_SCHEDULE_COSINE } LrSchedule;
/* A job's life at pscoord: waiting for its shards and workers, running, then
 * done (evaluated), stopped (by the operator) or failed (no worker left). */
typedef enum { JOB_WAITING, JOB_RUNNING, JOB_DONE, JOB_STOPPED, JOB_FAILED } JobState;

#define JOB_MAX_STALENESS 1000000u
#define JOB_MAX_CHUNK_FLOATS (64u * 1024u * 1024u)
#define JOB_MIN_FAIR_CHUNK_FLOATS 16u

typedef struct OptimConf {
        OptimKind kind;
        float lr, momentum, weight_decay, beta1, beta2, eps;
        bool nesterov;
} OptimConf;

#define JOB_MAX_REPLICAS 8u

typedef struct JobTensor {
        char name[MD_MAX_NAME];
        uint32_t shape[4];
        unsigned ndim;
        uint64_t numel;
        TensorInit init;
        uint32_t nchunks;
        uint32_t fan_in, fan_out;
        bool buffer;         /* not trained: each update sets the mean of the pushed values (MdTensor) */
} JobTensor;

/* A federated job's rounds (mode fed): what pscoord samples and waits for,
 * what the clients train, how the shards aggregate. */
typedef struct FedConf {
        FedParams strategy;         /* the shards' aggregation (common/fed.h) */
        uint32_t rounds;            /* aggregated rounds the job runs */
        float fraction;             /* of the connected clients sampled per round, (0, 1] */
        uint32_t min_clients;       /* a round samples, and needs answers from, at least this many */
        uint32_t min_available;     /* rounds start once this many clients are connected */
        uint32_t round_timeout_ms;  /* a round closes with what arrived after this long */
        uint32_t local_epochs;      /* passes over its own data a client trains per round */
        float prox_mu;              /* FedProx: the client adds mu (w - w_round) to its gradients */
        float dp_delta;             /* with noise (strategy.dp_noise): the delta of the epsilon reported */
        /* Secure aggregation (common/secagg.h): the shards see only masked updates. */
        bool secagg;
        float secagg_clip;          /* each coordinate of an update is clamped to +-this before quantising */
        float secagg_threshold;     /* share of a round's clients whose shares rebuild a seed, (0, 1] */
        uint32_t secagg_timeout_ms; /* how long each key, share and unmask exchange waits for clients */
        CompressKind compress;      /* how clients encode their updates (common/compress.h) */
        float topk;                 /* COMPRESS_TOPK: the share of each chunk's values sent, (0, 1] */
        uint32_t eval_every;        /* every N aggregated rounds an edge worker tests the model (0: the final only) */
        float fraction_evaluate;    /* after each round this share of the clients test it on their own data (0: none) */
        /* --mode fedasync (FedBuff, Nguyen et al. 2022): no rounds to wait for;
         * the shards apply each buffer of `buffer` updates as they come, an
         * update trained on the model of s aggregations ago weighing
         * (1 + s)^-staleness_exp times its examples. */
        bool async;
        uint32_t buffer;
        float staleness_exp;
} FedConf;

#define JOB_MAX_FED_ROUNDS 1000000u
#define JOB_MAX_LOCAL_EPOCHS 1000u

typedef struct Job {
        uint32_t id;
        char model[MD_MAX_TEXT];   /* the model's text (common/modeldesc.h) */
        char model_name[128];      /* for logs and status: mlp:..., cnn, vit or the JSON's name */
        JobTensor tensors[JOB_MAX_TENSORS];
        size_t ntensors;
        uint32_t in_numel;         /* values of one sample the model takes */
        uint32_t classes;          /* of its labels, 0..classes-1 */
        bool external;             /* tensors alone: computed by the client (0 inputs, 0 classes) */
        bool click;                /* "lr:D", "dlrm:...": a click log's model, its row per id in tables[0] */
        uint32_t click_dim;        /* that row's floats: lr 1, dlrm its embedding's E */
        uint32_t click_fields;     /* dlrm: the categorical fields of each sample (0: any) */
        OptimConf optim;
        ConsistencyMode mode;
        uint32_t staleness;  /* SSP: a worker at clock c pulls once the slowest reached c - staleness */
        LrScaling lr_scaling; /* how lr follows the number of members W (job_lr_factor) */
        uint32_t warmup_clocks; /* with lr_scaling: the factor ramps up from 1 over these clocks */
        LrSchedule lr_schedule; /* lr over the job's progress (job_lr_factor) */
        JobWire wire;        /* the values in workers' pushes and pulls */
        float sparsify;      /* (0, 1]: pushes carry that share of each chunk's largest gradients; 0: dense */
        bool allow_nonfinite;/* accept NaN/Inf gradients (refused by default) */
        float max_grad_norm; /* > 0: a push's L2 norm at a shard above it is refused; 0: no bound */
        uint32_t replicas;   /* copies of every chunk on distinct shards (0: 2 with >= 2 shards, else 1) */
        uint32_t chunk_floats;
        uint64_t seed;
        uint32_t batch, epochs;
        char dataset[256];
        /* --init: the job starts from the values of this safetensors file, not
         * from its initialisers (common/job-init.h): an absolute path that
         * pscoord and every shard read, with the size and digest64 pscoord
         * checked it at. Empty: the initialisers. */
        char init[256];
        uint64_t init_size, init_digest;
        uint32_t expect_workers, expect_shards;
        uint32_t train_limit, test_limit;
        FedConf fed;         /* mode fed only */
        /* --tables: sparse tables beside the tensors, their rows placed on the
         * shards by the id (shardmap_row_holder), pulled and pushed by id
         * (common/table-spec.h); seeds 0 here, job_table_conf gives them. */
        TableConf tables[JOB_MAX_TABLES];
        size_t ntables;
} Job;

/* Fills *job with defaults (sgd lr 0.02 momentum 0.9, bsp, 1 MiB chunks, seed 42,
 * batch 64, 5 epochs, the Debian Fashion-MNIST directory) and model "mlp:784-256-10". */
/* The factor on the optimizer's lr for an update of clock under mode with W
 * members, at progress (the share of the job's samples trained before the
 * clock, 0..1; negative or NaN: not known).
 * Workers: so that accuracy holds as workers are added (W workers make the
 * global batch W x batch). LR_SCALING_LINEAR: x W; SQRT: x sqrt(W); AUTO (the
 * default): linear under BSP (one synchronous step over the global batch),
 * square root under ASP and SSP (every push is applied as it comes, with
 * stale gradients: linear diverges there) and for Adam (its steps are
 * normalized); NONE: 1. This factor ramps up linearly from 1 over the first
 * warmup_clocks clocks; it is 1 with one member.
 * Progress: LR_SCHEDULE_COSINE multiplies by (1 + cos(pi x progress)) / 2,
 * from 1 at the start to 0 at the end (progress clamped to 0..1; 1 when not
 * known); CONSTANT by 1. */
float job_lr_factor(const Job *job, ConsistencyMode mode, uint32_t workers, int64_t clock, float progress);
/* "none", "auto", "linear", "sqrt"; -EINVAL for anything else. */
int lr_scaling_from_string(const char *s, LrScaling *ret);
const char *lr_scaling_name(LrScaling s);
/* "constant", "cosine"; -EINVAL for anything else. */
int lr_schedule_from_string(const char *s, LrSchedule *ret);
const char *lr_schedule_name(LrSchedule s);
void job_defaults(Job *job);

/* Sets job->model and its tensors from a model's text (modeldesc_parse: the
 * mlp:D0-D1-...-Dn strings, cnn, vit, or a JSON description), tensors named
 * as PyTorch's state_dict ("0.weight", "0.bias", "2.weight", ...). -EINVAL
 * for anything else; job_set_model_why also says why in err. */
int job_set_model(Job *job, const char *model);
int job_set_model_why(Job *job, const char *model, char *err, size_t errlen);
/* Floats of optimizer state kept per parameter value (sgd with momentum 1,
 * plain sgd 0, adam 2). */
size_t optim_state_per_value(const OptimConf *c);
/* The same for the job's chunks: its optimizer's, or under mode fed its
 * aggregation strategy's (fed_state_per_value). */
size_t job_state_per_value(const Job *job);
/* Bytes a shard holds for chunk (t, c): its values and their optimizer state. */
uint64_t job_chunk_bytes(const Job *job, uint32_t t, uint32_t c);
/* The same for the whole model. */
uint64_t job_model_bytes(const Job *job);
/* Re-cuts the model's tensors into chunks of chunk_floats (the model stays). */
int job_set_chunk(Job *job, uint32_t chunk_floats);
/* The chunk size that lets nshards shards each hold a fair share of the
 * model's bytes, within 10% of 1/nshards: no chunk larger than a tenth of a
 * share (a placement that gives each key to the least loaded shard is then
 * within one chunk of even). The job's own chunk_floats when that is small
 * enough already, or for one shard; never below JOB_MIN_FAIR_CHUNK_FLOATS (a model of fewer
 * than 10 x that per shard may stay less even). */
uint32_t job_fair_chunk(const Job *job, size_t nshards);
/* "bsp" | "asp" | "ssp:S" (S = 0..JOB_MAX_STALENESS) | "fed" into a mode and a
 * staleness; -EINVAL otherwise. */
int mode_parse(const char *s, ConsistencyMode *ret_mode, uint32_t *ret_staleness);
/* The mode as mode_parse reads it, e.g. "ssp:3". */
const char *mode_string(ConsistencyMode mode, uint32_t staleness, char *buf, size_t n);
int job_set_mode(Job *job, const char *mode);
/* job_set_mode's input for this job, e.g. "ssp:3". */
const char *job_mode_string(const Job *job, char *buf, size_t n);
int job_set_optim(Job *job, const char *kind);      /* "sgd" | "adam"; keeps lr etc. */
const char *optim_kind_name(OptimKind k);            /* "sgd", "adam" */
const char *tensor_init_name(TensorInit i);          /* "zeros", "he", "xavier" */
const char *job_state_name(JobState s);              /* "waiting", "running", ... */
/* True for the states a job does not leave by itself: done, stopped, failed. */
bool job_state_final(JobState s);
/* Checks ranges (lr > 0, chunk_floats 1..64Mi, batch >= 1, ...); on failure
 * writes the reason into err and returns -EINVAL. */
int job_validate(const Job *job, char *err, size_t errlen);

/* A click model's table when the job declares none: Adagrad at 0.1 (on the
 * demo's click log it beat FTRL-proximal's defaults, AUC 0.78 against 0.67;
 * ftrl stays a --tables away). */
#define JOB_CLICK_TABLE "ids:%u:adagrad:lr=0.1"
/* That table's --tables text for the job's click model (its dim). */
void job_click_table(const Job *job, char *buf, size_t n);
/* Sets the job's tables from --tables' text (common/table-spec.h; "" for
 * none): 0, or -EINVAL with why in err. */
int job_set_tables(Job *job, const char *text, char *err, size_t errlen);
/* Table i as a shard builds it: its seed the job's mixed with its place. */
void job_table_conf(const Job *job, size_t i, TableConf *ret);
/* The index of the table named name, or -ENOENT. */
int job_table_find(const Job *job, const char *name);

/* Number of floats in chunk c of tensor t; 0 if (t, c) is not a key of the job. */
uint32_t job_chunk_len(const Job *job, uint32_t t, uint32_t c);
/* Total number of keys and of f32 values. */
uint64_t job_nkeys(const Job *job);
uint64_t job_nfloats(const Job *job);

/* Deterministic initial values of chunk c of tensor t, a function of
 * (seed, t, c) only, so any shard computes the same values. out has
 * job_chunk_len floats. */
void job_init_chunk(const Job *job, uint32_t t, uint32_t c, float *out);

