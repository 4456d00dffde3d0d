/* SPDX-License-Identifier: Apache-2.0 */
/* libpsnet: a training worker's connection to a psnet cluster, on the
 * caller's libuv loop.
 *
 * A PsnetWorker registers with pscoord as a worker, keeps its lease, learns
 * the job, the shard map and the membership, and runs push/pull rounds against
 * the shards. Everything is asynchronous: results come back through callbacks
 * on the loop, nothing in here blocks. A shard map that changes during a round
 * (shards added or removed) is followed inside the round; the caller sees a
 * round that took a little longer.
 *
 *     psnet_worker_new(loop, &opts, &events, ud, &w);   // registers
 *     ... events.job(w): psnet_worker_start_clock(w), psnet_job_*(w) ...
 *     psnet_worker_round(w, grads, c, params, c + 1, done, ud);
 *     ... done(w, 0, ud): next step ...
 *     psnet_worker_result(w, ...); psnet_worker_leave(w, left, ud);
 *
 * Build with `pkg-config --cflags --libs psnet` (libuv comes with it). All
 * functions return 0 or a negative errno. The library logs in logfmt on stderr
 * (PSNET_LOG_LEVEL sets the level). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PsnetWorker PsnetWorker;

/* The job's state as pscoord last said it. */
typedef enum { PSNET_JOB_WAITING, PSNET_JOB_RUNNING, PSNET_JOB_DONE, PSNET_JOB_STOPPED, PSNET_JOB_FAILED } PsnetJobState;

typedef struct PsnetWorkerOptions {
        const char *coord;              /* pscoord endpoint, e.g. tcp://coord:7000 */
        unsigned connect_timeout_ms;    /* first registration gives up after this (0: 10 s) */
        unsigned round_timeout_ms;      /* a round gives up after this (0: 120 s) */
        const char *keys_dir;           /* CURVE: directory of psctl keys gen (NULL: no encryption) */
        const char *key_name;           /* CURVE: this worker's key in keys_dir (NULL: "worker") */
        const char *coord_key_name;     /* CURVE: pscoord's key in keys_dir (NULL: "pscoord") */
} PsnetWorkerOptions;

typedef struct PsnetWorkerEvents {
        /* Registered with pscoord (again, after pscoord restarted). May be NULL. */
        void (*registered)(PsnetWorker *w, void *ud);
        /* This worker is a member of the running job: train from
         * psnet_worker_start_clock(w). Called once. */
        void (*job)(PsnetWorker *w, void *ud);
        /* The membership changed (rank, number of workers). May be NULL. */
        void (*membership)(PsnetWorker *w, void *ud);
        /* Stop after the current step: why says who asked (operator, drain,
         * another job). Called once. */
        void (*stop)(PsnetWorker *w, const char *why, void *ud);
        /* Every member has finished training and pscoord asks this worker
         * (which finished too) to evaluate the final weights: pull them
         * (psnet_worker_round without grads), evaluate, report the accuracy
         * with psnet_worker_result. May be NULL if the worker never
         * evaluates. */
        void (*evaluate)(PsnetWorker *w, void *ud);
        /* Could not join: err -ETIMEDOUT (pscoord did not answer) or
         * -ECONNREFUSED (refused; reason says why). */
        void (*failed)(PsnetWorker *w, int err, const char *reason, void *ud);
} PsnetWorkerEvents;

/* What a worker reports with its heartbeats (psctl status, /metrics). */
typedef struct PsnetProgress {
        int64_t clock;
        uint32_t epoch;                 /* the job's epoch (1-based) */
        uint64_t step, samples;
        float steps_per_s, samples_per_s, loss;
        float progress;                 /* the job's progress, 0..1 */
        int64_t end_clock;              /* the clock at which the job ends */
} PsnetProgress;

/* A test-set evaluation after epoch epochs, of the weights of clock. */
typedef struct PsnetEval {
        uint32_t epoch;
        float accuracy, test_loss, train_loss;
        int64_t clock;
        float auc; /* a binary model's test AUC (lr:D); 0 or NaN: not measured */
} PsnetEval;

/* -EINVAL for unusable options or keys (logged with the reason). */
int psnet_worker_new(uv_loop_t *loop, const PsnetWorkerOptions *opts, const PsnetWorkerEvents *events, void *ud,
                     PsnetWorker **ret);
/* Closes everything (no deregistration: see psnet_worker_leave). NULL is fine. */
PsnetWorker *psnet_worker_free(PsnetWorker *w);

uint32_t psnet_worker_id(const PsnetWorker *w);
PsnetJobState psnet_worker_job_state(const PsnetWorker *w);
uint32_t psnet_worker_rank(const PsnetWorker *w);
uint32_t psnet_worker_count(const PsnetWorker *w);   /* workers in the job */
int64_t psnet_worker_start_clock(const PsnetWorker *w);
/* The clock the current membership started counting from (its schedule's
 * base): a worker that starts after it (a job restored from a checkpoint)
 * resumes its data that many steps in. */
int64_t psnet_worker_base_clock(const PsnetWorker *w);

/* The job, once the job event came. Tensors are float32, dense, row-major. */
const char *psnet_job_model(const PsnetWorker *w);
size_t psnet_job_ntensors(const PsnetWorker *w);
const char *psnet_job_tensor_name(const PsnetWorker *w, size_t t);
uint64_t psnet_job_tensor_numel(const PsnetWorker *w, size_t t);
uint32_t psnet_job_batch(const PsnetWorker *w);
uint32_t psnet_job_epochs(const PsnetWorker *w);
const char *psnet_job_dataset(const PsnetWorker *w);
/* The model's description as JSON, every field spelled out (docs/models.md;
 * what an export carries): a framework builds the same model from it.
 * -ENOSPC if it does not fit n, -ENOENT before the job. */
int psnet_job_model_json(const PsnetWorker *w, char *buf, size_t n);

/* The job's sparse tables (--tables, docs/tables.md): their count, and table
 * i's name and floats per row (NULL and 0 for no table i). */
size_t psnet_job_ntables(const PsnetWorker *w);
const char *psnet_job_table_name(const PsnetWorker *w, size_t i);
uint32_t psnet_job_table_dim(const PsnetWorker *w, size_t i);

/* The job's schedule. Epochs are the job's: an epoch is a pass over the
 * training set by all workers together; a clock of W members trains W x
 * batch samples. The samples the job has trained before clock, and the first
 * clock by which it has trained total (epochs x training images): every
 * member stops there. Both follow the membership pscoord publishes.
 * psnet_job_end_clock also keeps total: from then on each push carries the
 * job's progress at its clock (samples before it / total), which a job's
 * --lr-schedule follows; a worker that never calls it pushes none, and its
 * pushes are applied at the unscheduled rate. */
uint64_t psnet_job_samples_at(const PsnetWorker *w, int64_t clock);
int64_t psnet_job_end_clock(PsnetWorker *w, uint64_t total);

/* One round: when grads != NULL, pushes grads (one buffer per tensor, numel
 * floats each) as this worker's gradient of push_clock, and pulls every tensor
 * into params for pull_clock (BSP: once that clock has closed). grads must stay
 * untouched until done is called. -EBUSY while a round runs. r in done: 0, or
 * -ETIMEDOUT, -EPROTO (a shard refused; logged), -ECANCELED (the worker was
 * freed), or -ESTALE: this worker had left the membership (its lease ran out:
 * stopped, cut off) and has been admitted again; nothing of the round counts,
 * train on from psnet_worker_start_clock(w), whose data position is
 * psnet_worker_start_clock(w) - psnet_worker_base_clock(w) steps into this
 * membership. */
typedef void (*PsnetRoundFn)(PsnetWorker *w, int r, void *ud);

/* A sparse table's rows by id, between rounds (never beside one): grads NULL
 * pulls the rows of ids[0..n) into out (n x dim floats; a row never pushed
 * reads as its initial values), else pushes one gradient row per id (n x dim
 * floats) as this worker's for clock, which the shards apply with the
 * table's optimizer as it comes (one push per table and clock: a second is
 * answered DUPLICATE and not applied). Push every table once each clock,
 * n 0 where the step touched none of its rows (it goes to every shard):
 * under BSP a table's clock closes, and in every mode a checkpoint's cut
 * comes, once every member has. ids must be distinct (a shard
 * refuses a push naming one twice); each goes to the shard that holds it.
 * The arrays are copied before this returns; out is written before done. r
 * in done: 0, -ETIMEDOUT, -EPROTO (a shard refused: logged), -ESTALE (not a
 * member). A shard's share travels in parts of at most 4 MiB of rows
 * (WIRE_ROWS_PART_BYTES); a push of more than 64 parts to one shard
 * returns -EMSGSIZE (logged) at once,
 * -EAGAIN (the shards moved to a newer map: again once it arrived),
 * -ECANCELED (the worker was freed). */
typedef void (*PsnetRowsFn)(PsnetWorker *w, int r, void *ud);
/* The rows pulls read from the tables' hot-row caches (cache=S) and those
 * they fetched from the shards, since the worker started; and the bytes of
 * rows and tensors it pulled. */
void psnet_worker_rows_cache(const PsnetWorker *w, uint64_t *hits, uint64_t *misses, uint64_t *pulled_bytes);
int psnet_worker_rows(PsnetWorker *w, size_t table, const int64_t *ids, size_t n, const float *grads, int64_t clock,
                      float *out, PsnetRowsFn done, void *ud);
/* One table of psnet_worker_rows_many: as psnet_worker_rows' arguments. */
typedef struct PsnetRowsTable {
        size_t table;
        const int64_t *ids;
        size_t n;
        const float *grads;     /* a push's */
        float *out;             /* a pull's */
} PsnetRowsTable;
/* psnet_worker_rows of ntabs distinct tables at once, all pulled or all
 * pushed (push): every table's requests in flight together, one round trip
 * for all (a model with a table per field waits once, not once a table);
 * done once every table's rows are in (or at the first error). */
int psnet_worker_rows_many(PsnetWorker *w, const PsnetRowsTable *tabs, size_t ntabs, bool push, int64_t clock,
                           PsnetRowsFn done, void *ud);
int psnet_worker_round(PsnetWorker *w, const float *const *grads, int64_t push_clock, float *const *params,
                       int64_t pull_clock, PsnetRoundFn done, void *ud);
/* The clock of the weights the last round pulled (the smallest the shards reported). */
int64_t psnet_worker_round_clock(const PsnetWorker *w);
/* Sends the pull of pull_clock into params now; the next psnet_worker_round
 * with the same params and pull_clock pushes and completes both. */
int psnet_worker_prefetch(PsnetWorker *w, float *const *params, int64_t pull_clock);
/* The job's tensors in memory this worker shares with the shards on its host
 * (once the job is known: -EAGAIN before): nsets sets of every tensor, set k's
 * tensor t at ret[k * ntensors + t] (numel floats each, zeroed at first).
 * Set 0 is for gradients, sets 1.. for values: a round whose grads are set 0
 * and whose params are another set (or NULL) pushes and pulls in place, the
 * shards reading and writing these tensors where they lie (no copy on the
 * worker's side); shards on other hosts get frames from them as from any
 * buffer. -ENOTSUP where PSNET_SHM is off or copy (the caller keeps buffers
 * of its own). Made on the first call and the same afterwards (-EEXIST for
 * another nsets); freed with the worker. After a round fails the tensors
 * are the caller's again once the shards have ended their sessions over
 * them (waited for, 2 s at most). */
#define PSNET_MEMORY_MAX_SETS 8
int psnet_worker_memory(PsnetWorker *w, size_t nsets, float **ret);
/* A reference that keeps that memory mapped after the worker is freed (for
 * callers whose arrays may outlive it: Python's); NULL before
 * psnet_worker_memory. Each reference is dropped with psnet_memory_unref,
 * from any thread. */
typedef struct PsnetMemory PsnetMemory;
PsnetMemory *psnet_worker_memory_ref(PsnetWorker *w);
void psnet_memory_unref(PsnetMemory *m);
/* Bytes pushed and pulled, rounds done, seconds spent waiting for shards. */
void psnet_worker_traffic(const PsnetWorker *w, uint64_t *pushed, uint64_t *pulled, uint64_t *rounds, double *wait_s);

/* What psctl status shows of this worker, sent with its heartbeats: call it
 * after each step, with that step's loss. A heartbeat carries the mean loss
 * of the steps reported since the one before (the job's loss by clock in
 * psctl report) and the samples and steps per second since then from the
 * counts (the rates given count only for the first); a report with the clock
 * of the last one replaces it without counting its loss again. */
void psnet_worker_progress(PsnetWorker *w, const PsnetProgress *p);
/* Reports an evaluation (epochs ascending; -EINVAL for an older one) with the
 * heartbeats and the result that follow: pscoord keeps them as the job's
 * accuracy by epoch. The newest PSNET_EVALS_KEPT are repeated, so a
 * heartbeat lost or epochs shorter than a heartbeat lose none. */
#define PSNET_EVALS_KEPT 32
int psnet_worker_evaluated(PsnetWorker *w, const PsnetEval *e);

/* Reports that this worker finished training (reached the job's end clock),
 * or, when has_accuracy, the accuracy of the final weights it was asked to
 * evaluate. done's evaluate says whether pscoord asks this worker to evaluate
 * them now; otherwise the worker waits: for the stop event (the job is done)
 * or the evaluate event (the evaluating worker failed, this one takes over).
 * pscoord restarting meanwhile loses nothing: the worker registers again and
 * the result leaves again; one unanswered for PSNET_RESULT_TIMEOUT_MS is sent
 * again, PSNET_RESULT_TRIES times in all, before done gets -ETIMEDOUT. */
#define PSNET_RESULT_TIMEOUT_MS 5000u
#define PSNET_RESULT_TRIES 6u
typedef void (*PsnetResultFn)(PsnetWorker *w, int r, bool evaluate, void *ud);
int psnet_worker_result(PsnetWorker *w, bool has_accuracy, float accuracy, PsnetResultFn done, void *ud);
/* What a caller that stops gives the work in flight (workerd's). */
#define PSNET_STOP_GRACE_MS 3000u
/* For a caller that stops after the round in flight: that round and any
 * later one end within ms (done then gets -ETIMEDOUT), not at
 * --round-timeout (a shard that stopped too, a peer that never comes to
 * the barrier). */
void psnet_worker_stopping(PsnetWorker *w, unsigned ms);
/* Leaves the job (answered or not within a second), then done (may be NULL). */
typedef void (*PsnetDoneFn)(PsnetWorker *w, void *ud);
int psnet_worker_leave(PsnetWorker *w, PsnetDoneFn done, void *ud);
/* The same for a worker that fails: reason (up to 200 characters are kept)
 * tells pscoord why, and a job that fails because its workers left names the
 * reason of the last of them in its state (psctl status). */
int psnet_worker_leave_because(PsnetWorker *w, const char *reason, PsnetDoneFn done, void *ud);

/* --- Federated edge clients -----------------------------------------------------------
 *
 * A PsnetEdge is one federated client (role edge) on the caller's libuv loop:
 * it registers with pscoord, learns the federated job (mode fed or fedasync)
 * and, for each round pscoord samples it for, tells the caller with a round
 * event. The caller pulls the round's model, trains on its own data, writes
 * its update (its weights after training minus the pulled ones) into the
 * client's update buffers and pushes it with its example count. What the job
 * asks of an update is done here, the same for every client: clipping to the
 * job's --dp-clip, its --compress codec with error feedback, and with --secagg
 * the key and share exchanges with pscoord and the masking; the caller sees
 * none of it. The data never leaves the caller: only the update goes out.
 *
 *     psnet_edge_new(loop, &opts, &events, ud, &e);
 *     events.job(e): load the data; psnet_edge_set_examples(e, n)
 *     events.round(e, rd): psnet_edge_pull(e, rd->number, params, pulled, ud)
 *     pulled: train; psnet_edge_update(e, &upd); upd[t][i] = w[t][i] - w0[t][i];
 *             psnet_edge_push(e, rd->number, n, loss, pushed, ud)
 *     rd->evaluate: pull (number 0), test, psnet_edge_report(e, rd, accuracy, loss, done, ud)
 *     events.end(e, state): psnet_edge_leave(e, left, ud)
 *
 * Several clients of one process (a simulation of many) share one ZeroMQ
 * context and one key: PsnetEdgeOptions.share. */
typedef struct PsnetEdge PsnetEdge;

typedef struct PsnetEdgeOptions {
        const char *coord;              /* pscoord endpoint, e.g. tcp://coord:7000 */
        unsigned connect_timeout_ms;    /* first registration gives up after this (0: 10 s) */
        unsigned round_timeout_ms;      /* a pull or push gives up after this (0: 120 s) */
        const char *keys_dir;           /* CURVE: directory of psctl keys gen (NULL: no encryption) */
        const char *key_name;           /* CURVE: this client's key in keys_dir (NULL: "edge") */
        const char *coord_key_name;     /* CURVE: pscoord's key in keys_dir (NULL: "pscoord") */
        PsnetEdge *share;               /* another client of this process whose ZeroMQ context and keys this
                                         * one uses (NULL: its own; keys_dir and the key names are then
                                         * ignored). Either may be freed first. */
        unsigned clients;               /* without share: how many clients will share this one's context
                                         * (sizes its socket table; 0: 1) */
        const char *gateway;            /* psgate's endpoint: the client's one connection, pscoord and the
                                         * shards through it (coord is then only a name for logs; NULL:
                                         * pscoord and every shard directly) */
        const char *gateway_key_name;   /* CURVE: psgate's key in keys_dir (NULL: "psgate") */
        bool strategy;                  /* the job's strategy process (--strategy custom; role strategy, key
                                         * "strategy" by default), not a client: below */
} PsnetEdgeOptions;

/* A request of pscoord's: train for a round, or test a model. */
typedef struct PsnetEdgeRound {
        uint64_t number;        /* pscoord's number for it: the pull, push and report name it */
        uint32_t round;         /* training: the aggregated round it makes (0: not said). evaluate: the
                                 * rounds in the model to test (0: the final model, reported as the
                                 * job's result) */
        bool evaluate;          /* test the model on the client's test data instead of training */
        unsigned timeout_ms;    /* the round closes this long after it opened (0: not said) */
        bool local;             /* evaluate: a federated evaluation (--fraction-evaluate): test the model
                                 * of `round` on the client's own data, psnet_edge_report_local */
        bool aggregate;         /* a strategy process: aggregate the round's nupdates updates */
        uint32_t nupdates;
} PsnetEdgeRound;

typedef struct PsnetEdgeEvents {
        /* Registered with pscoord (again, after pscoord restarted). May be NULL. */
        void (*registered)(PsnetEdge *e, bool again, void *ud);
        /* Could not join: err -ETIMEDOUT (pscoord did not answer), -ECONNREFUSED
         * or -EACCES (refused; reason says why), -EINVAL (the job is not a
         * federated one, or does not validate). */
        void (*failed)(PsnetEdge *e, int err, const char *reason, void *ud);
        /* The federated job (psnet_edge_job_*): load the data. Called once. */
        void (*job)(PsnetEdge *e, void *ud);
        /* pscoord asks for a round (rd valid during the call); one may come
         * while the caller is still busy with an earlier one. */
        void (*round)(PsnetEdge *e, const PsnetEdgeRound *rd, void *ud);
        /* The job ended (state DONE, STOPPED or FAILED): leave. Called once. */
        void (*end)(PsnetEdge *e, PsnetJobState state, void *ud);
} PsnetEdgeEvents;

/* -EINVAL for unusable options or keys (logged with the reason). */
int psnet_edge_new(uv_loop_t *loop, const PsnetEdgeOptions *opts, const PsnetEdgeEvents *events, void *ud,
                   PsnetEdge **ret);
/* Closes everything (no deregistration: see psnet_edge_leave); a pull, push
 * or report in progress ends without its callback. NULL is fine. */
PsnetEdge *psnet_edge_free(PsnetEdge *e);

uint32_t psnet_edge_id(const PsnetEdge *e);   /* pscoord's id for this client (0: not registered) */
/* The job, once the job event came (NULL and 0 before). */
const char *psnet_edge_job_model(const PsnetEdge *e);
size_t psnet_edge_job_ntensors(const PsnetEdge *e);
const char *psnet_edge_job_tensor_name(const PsnetEdge *e, size_t t);
uint64_t psnet_edge_job_tensor_numel(const PsnetEdge *e, size_t t);
uint32_t psnet_edge_job_batch(const PsnetEdge *e);
uint32_t psnet_edge_job_local_epochs(const PsnetEdge *e);
float psnet_edge_job_lr(const PsnetEdge *e);
float psnet_edge_job_prox_mu(const PsnetEdge *e);      /* FedProx's mu (0: plain FedAvg) */
uint64_t psnet_edge_job_seed(const PsnetEdge *e);
bool psnet_edge_job_async(const PsnetEdge *e);         /* fedasync: rounds are tasks, numbered alone */
uint32_t psnet_edge_job_rounds(const PsnetEdge *e);    /* the aggregated rounds the job runs */
/* The model's description as JSON (psnet_job_model_json): the tensors'
 * shapes. -ENOSPC if it does not fit n, -ENOENT before the job. */
int psnet_edge_job_model_json(const PsnetEdge *e, char *buf, size_t n);

/* The number of training examples this client holds: sent with its keys
 * in a --secagg job (which wait for it), and with each update. */
void psnet_edge_set_examples(PsnetEdge *e, uint64_t examples);

/* Pulls the model into params (one buffer per tensor, numel floats each,
 * kept until done): the round's (number, as the round event gave it), or
 * with number 0 the model as it is now (to test it). done's rounds: the
 * aggregated rounds in the model pulled. -EBUSY while a pull runs. The
 * last pull's params are the weights psnet_edge_report digests. */
typedef void (*PsnetEdgePullFn)(PsnetEdge *e, int r, int64_t rounds, void *ud);
int psnet_edge_pull(PsnetEdge *e, uint64_t number, float *const *params, PsnetEdgePullFn done, void *ud);

/* The client's update buffers (one per tensor, numel floats each, in
 * ret[t]; made on the first call after the last push ended): write the
 * update there, then push it. -EBUSY while a push runs. */
int psnet_edge_update(PsnetEdge *e, float *const **ret);
/* What came of a push: the update's L2 norm before clipping, whether it was
 * clipped to the job's --dp-clip, its bytes as sent and as f32, and
 * pscoord's reason when it did not count. */
typedef struct PsnetEdgePushInfo {
        double norm;
        bool clipped;
        uint64_t bytes, bytes_raw;
        char reason[160];
} PsnetEdgePushInfo;
/* r in done: 0 (pscoord counted the update), -ESTALE (it came after its
 * round closed: not counted), -ECANCELED (dropped: a --secagg round went on
 * without it, or the job ended), -ERANGE (the update holds NaN or infinity:
 * nothing sent), or another error (logged). info is valid during the call. */
typedef void (*PsnetEdgePushFn)(PsnetEdge *e, int r, const PsnetEdgePushInfo *info, void *ud);
/* Pushes the update buffers' content as this client's update of round
 * number, trained on examples examples with mean loss loss: clipped,
 * encoded (and masked) here, sent to every shard, then told to pscoord,
 * which counts it if its round is still open. The buffers are the
 * library's again until done. -ESTALE at once when a --secagg round was
 * sampled again since (its peers went on without this one), -EBUSY while
 * a push runs, -EINVAL without psnet_edge_update. */
int psnet_edge_push(PsnetEdge *e, uint64_t number, uint64_t examples, float loss, PsnetEdgePushFn done, void *ud);

/* For a caller that stops: drops an update that waits for its round's
 * peers (--secagg) and gives up a pull in flight, their done getting
 * -ECANCELED. An update on its way goes on (or one pushed after this), and
 * the answers to pscoord: all within PSNET_STOP_GRACE_MS of this call
 * (then -ETIMEDOUT). */
void psnet_edge_abandon(PsnetEdge *e);

/* Reports a test of the model rd asked for (rd as the round event gave it):
 * its accuracy (0..1) and loss on the client's test data, for the model the
 * last pull wrote (a test's report names the rounds the pull found in it).
 * A final model's (rd->round 0) is the job's result, with a digest of those
 * weights (which must be unchanged since). */
typedef void (*PsnetEdgeDoneFn)(PsnetEdge *e, int r, void *ud);
int psnet_edge_report(PsnetEdge *e, const PsnetEdgeRound *rd, float accuracy, float loss, PsnetEdgeDoneFn done,
                      void *ud);
/* Reports a federated evaluation (rd->local) of the model the last pull
 * wrote: its accuracy (0..1) and mean loss on the client's own examples. */
int psnet_edge_report_local(PsnetEdge *e, const PsnetEdgeRound *rd, float accuracy, float loss, uint64_t examples,
                            PsnetEdgeDoneFn done, void *ud);
/* Tells pscoord that this client sends no update for round number, and
 * why (its training failed, or made what an update cannot be): the round
 * stops waiting for it and counts it as refused, with the reason in
 * pscoord's log. -EBUSY while a report or another decline runs. */
int psnet_edge_decline(PsnetEdge *e, uint64_t number, const char *reason, PsnetEdgeDoneFn done, void *ud);
/* Leaves the job (answered or not within a second), then done (may be NULL);
 * a push that waits for its round's peers is dropped first. */
int psnet_edge_leave(PsnetEdge *e, PsnetEdgeDoneFn done, void *ud);

/* A strategy process (PsnetEdgeOptions.strategy, --strategy custom) is
 * asked by pscoord to aggregate each round's updates (a round event with
 * aggregate): it reads each one from the shards, computes the round's delta
 * (the change of the model), writes it into the update buffers
 * (psnet_edge_update) and pushes it (psnet_edge_push: as f32, with no clip
 * or codec; pscoord closes the round once it is on every shard), or
 * declines the round with the reason (it is then dropped and runs again).
 * Update i (0 to rd->nupdates - 1) of the round asked for last: the client
 * that sent it, its examples and its training loss; -ESTALE for another
 * number, -ENOENT past the last. */
int psnet_edge_round_update(const PsnetEdge *e, uint64_t number, size_t i, uint32_t *client, uint64_t *examples,
                            float *loss);
/* Pulls client's update of round number (as it pushed it, f32) into
 * params, as psnet_edge_pull does the model. */
int psnet_edge_pull_update(PsnetEdge *e, uint64_t number, uint32_t client, float *const *params,
                           PsnetEdgePullFn done, void *ud);

/* --- Blocking -------------------------------------------------------------------------
 *
 * The same worker for callers without a libuv loop (Python through ctypes, a
 * framework's training loop): psnet_sync_new starts a thread that runs a
 * loop of its own with a PsnetWorker in it, so the lease is kept while the
 * caller computes. Each call below runs on that thread and returns when it is
 * done; one call at a time (-EBUSY for a second thread's). libpsnet's events
 * are bits collected by psnet_sync_wait.
 *
 *     psnet_sync_new(&opts, &s);
 *     psnet_sync_wait(s, PSNET_EV_JOB | PSNET_EV_FAILED, PSNET_WAIT_FOREVER);
 *     psnet_sync_info(s, &info);                 // clocks, rank, tensors, batch...
 *     psnet_sync_round(s, NULL, 0, params, info.start_clock);
 *     loop: compute grads; psnet_sync_round(s, grads, c, params, c + 1); c++
 *     psnet_sync_result(s, false, 0, &evaluate); ... psnet_sync_leave(s); psnet_sync_free(s);
 */
typedef struct PsnetSync PsnetSync;

#define PSNET_EV_REGISTERED 1u  /* registered with pscoord (again) */
#define PSNET_EV_JOB 2u         /* a member of the running job: train from info.start_clock */
#define PSNET_EV_MEMBERSHIP 4u  /* rank or number of workers changed */
#define PSNET_EV_STOP 8u        /* stop after this step (psnet_sync_reason: why) */
#define PSNET_EV_EVALUATE 16u   /* evaluate the final weights (the worker asked first has gone) */
#define PSNET_EV_FAILED 32u     /* could not join (psnet_sync_reason: why) */

typedef struct PsnetSyncInfo {
        uint32_t id, rank, workers;
        PsnetJobState state;
        int64_t start_clock, base_clock, round_clock;
        bool has_job;
        size_t ntensors;
        uint32_t batch, epochs, train_limit, test_limit;
        uint64_t seed;
        char dataset[256];
        char model_name[128];
} PsnetSyncInfo;

int psnet_sync_new(const PsnetWorkerOptions *opts, PsnetSync **ret);
/* Stops the thread and frees everything (no deregistration: psnet_sync_leave). NULL is fine. */
void psnet_sync_free(PsnetSync *s);
/* Waits until one of the events in mask has happened since they were last
 * collected, at most timeout_ms (0: only looks; PSNET_WAIT_FOREVER: no
 * limit), collects and returns them; 0 on timeout. */
#define PSNET_WAIT_FOREVER 0xffffffffu
int psnet_sync_wait(PsnetSync *s, unsigned mask, unsigned timeout_ms);
/* The reason that came with the last stop or failed event. */
void psnet_sync_reason(PsnetSync *s, char *buf, size_t n);
int psnet_sync_info(PsnetSync *s, PsnetSyncInfo *ret);
/* Tensor t's name (state_dict's) and values; -ENOENT past the last. */
int psnet_sync_tensor(PsnetSync *s, size_t t, char *name, size_t n, uint64_t *numel);
int psnet_sync_model_json(PsnetSync *s, char *buf, size_t n);
/* psnet_job_samples_at(clock) and psnet_job_end_clock(total). */
int psnet_sync_schedule(PsnetSync *s, int64_t clock, uint64_t total, uint64_t *samples, int64_t *end_clock);
/* psnet_worker_round, waited for: its result (-ESTALE: admitted again, see
 * there). The arrays of pointers may go when it returns; the buffers the
 * last round pulled into must stay until psnet_sync_result (which reports a
 * digest of the weights evaluated). */
/* psnet_worker_rows, blocking; the table's name and dim by index. */
int psnet_sync_rows(PsnetSync *s, size_t table, const int64_t *ids, size_t n, const float *grads, int64_t clock,
                    float *out);
/* psnet_worker_rows_many, blocking. */
int psnet_sync_rows_many(PsnetSync *s, const PsnetRowsTable *tabs, size_t ntabs, bool push, int64_t clock);
int psnet_sync_table(PsnetSync *s, size_t i, char *name, size_t n, uint32_t *dim);
int psnet_sync_rows_cache(PsnetSync *s, uint64_t *hits, uint64_t *misses, uint64_t *pulled_bytes);
int psnet_sync_round(PsnetSync *s, const float *const *grads, int64_t push_clock, float *const *params,
                     int64_t pull_clock);
/* psnet_worker_memory, with a reference to it in *ref (psnet_memory_unref
 * when the arrays over it are gone: it outlives psnet_sync_free). */
int psnet_sync_memory(PsnetSync *s, size_t nsets, float **ret, PsnetMemory **ref);
int psnet_sync_progress(PsnetSync *s, const PsnetProgress *p);
int psnet_sync_evaluated(PsnetSync *s, const PsnetEval *e);
/* psnet_worker_result, waited for; *evaluate: pscoord asks this worker to evaluate now. */
int psnet_sync_result(PsnetSync *s, bool has_accuracy, float accuracy, bool *evaluate);
/* psnet_worker_leave, waited for (at most about a second). */
int psnet_sync_leave(PsnetSync *s);

/* --- Blocking federated clients -------------------------------------------------------
 *
 * The federated client for callers without a libuv loop (Python's psnet.fed
 * through ctypes): psnet_edge_sync_new starts a thread that runs a loop of
 * its own with `clients` PsnetEdge in it (one for a real device; many for a
 * simulation, sharing one ZeroMQ context and key), so their registrations
 * are kept while the caller trains. What pscoord tells them comes as events,
 * in order, from psnet_edge_sync_next; the calls below run on that thread
 * and return when done (one at a time: -EBUSY for a second thread's).
 *
 *     psnet_edge_sync_new(&opts, 1, &s);
 *     next: JOB → psnet_edge_sync_info, _tensor, _model_json; psnet_edge_sync_set_examples
 *     next: ROUND → psnet_edge_sync_pull(s, 0, rd.number, params, &rounds); train;
 *           psnet_edge_sync_push(s, 0, rd.number, update, n, loss) (or _decline)
 *     next: PUSHED → ev.r: counted (0) or why not
 *     next: ROUND with evaluate → pull (number 0), test, psnet_edge_sync_report
 *     next: END → psnet_edge_sync_leave; psnet_edge_sync_free
 */
typedef struct PsnetEdgeSync PsnetEdgeSync;

#define PSNET_EDGE_SYNC_MAX_CLIENTS 10000u

enum {
        PSNET_EDGE_EV_REGISTERED = 1,   /* r: 1 when again (pscoord restarted) */
        PSNET_EDGE_EV_FAILED,           /* r: the error (PsnetEdgeEvents.failed), reason */
        PSNET_EDGE_EV_JOB,              /* the federated job is known */
        PSNET_EDGE_EV_ROUND,            /* round: train (or, round.evaluate, test) */
        PSNET_EDGE_EV_PUSHED,           /* a push ended: r and push as PsnetEdgePushFn's; round.number */
        PSNET_EDGE_EV_END,              /* r: the job's PsnetJobState */
};

typedef struct PsnetEdgeEvent {
        int kind;
        unsigned client;                /* which of the clients, 0-based */
        int r;
        PsnetEdgeRound round;
        PsnetEdgePushInfo push;
        char reason[256];
} PsnetEdgeEvent;

typedef struct PsnetEdgeSyncInfo {
        uint32_t id;                    /* pscoord's id for the client (0: not registered) */
        bool has_job, async;
        size_t ntensors;
        uint32_t batch, local_epochs, rounds;
        float lr, prox_mu;
        uint64_t seed;
        char model_name[128];
} PsnetEdgeSyncInfo;

/* opts as for psnet_edge_new (share and clients are set here). -EINVAL for
 * unusable options or keys, or clients outside 1..PSNET_EDGE_SYNC_MAX_CLIENTS. */
int psnet_edge_sync_new(const PsnetEdgeOptions *opts, unsigned clients, PsnetEdgeSync **ret);
/* Stops the thread and frees everything (no deregistration: psnet_edge_sync_leave). NULL is fine. */
void psnet_edge_sync_free(PsnetEdgeSync *s);
/* The next event into *ev, waiting at most timeout_ms (PSNET_WAIT_FOREVER:
 * no limit): 1, or 0 when none came. */
int psnet_edge_sync_next(PsnetEdgeSync *s, PsnetEdgeEvent *ev, unsigned timeout_ms);
int psnet_edge_sync_info(PsnetEdgeSync *s, unsigned client, PsnetEdgeSyncInfo *ret);
/* Tensor t's name, size and shape (ndim dims, PyTorch's layout); -ENOENT
 * past the last or before the job. */
int psnet_edge_sync_tensor(PsnetEdgeSync *s, unsigned client, size_t t, char *name, size_t n, uint64_t *numel,
                           uint32_t dims[4], unsigned *ndim);
int psnet_edge_sync_model_json(PsnetEdgeSync *s, unsigned client, char *buf, size_t n);
int psnet_edge_sync_set_examples(PsnetEdgeSync *s, unsigned client, uint64_t examples);
/* psnet_edge_pull, waited for; *rounds: the aggregated rounds in the model.
 * The buffers must stay until the next pull (a final report digests them). */
int psnet_edge_sync_pull(PsnetEdgeSync *s, unsigned client, uint64_t number, float *const *params, int64_t *rounds);
/* Copies update (one buffer per tensor) into the client's update buffers and
 * starts psnet_edge_push; its end is a PUSHED event. The caller's buffers
 * may go when this returns. */
int psnet_edge_sync_push(PsnetEdgeSync *s, unsigned client, uint64_t number, const float *const *update,
                         uint64_t examples, float loss);
/* psnet_edge_decline, waited for. */
int psnet_edge_sync_decline(PsnetEdgeSync *s, unsigned client, uint64_t number, const char *reason);
/* psnet_edge_report (or, rd->local, psnet_edge_report_local with examples),
 * waited for. -EINVAL for an accuracy outside [0, 1] (NaN is taken for a
 * final model's: one of tensors alone may have none), or a local test
 * without examples or a finite loss. */
int psnet_edge_sync_report(PsnetEdgeSync *s, unsigned client, const PsnetEdgeRound *rd, float accuracy, float loss,
                           uint64_t examples);
/* psnet_edge_leave, waited for (at most about a second). */
int psnet_edge_sync_leave(PsnetEdgeSync *s, unsigned client);
/* A strategy process: psnet_edge_round_update, and psnet_edge_pull_update waited for. */
int psnet_edge_sync_round_update(PsnetEdgeSync *s, unsigned client, uint64_t number, size_t i, uint32_t *id,
                                 uint64_t *examples, float *loss);
int psnet_edge_sync_pull_update(PsnetEdgeSync *s, unsigned client, uint64_t number, uint32_t id,
                                float *const *params);

#ifdef __cplusplus
}
#endif
