/* SPDX-License-Identifier: Apache-2.0 */
/* libpsnet's blocking client (psnet.h, "Blocking"): a PsnetWorker on a loop
 * of its own, run by a thread of its own, so that the lease is kept while the
 * caller computes and the caller's language needs no event loop (the Python
 * bindings call it through ctypes). Every call into the PsnetWorker is made
 * on the loop's thread: the caller posts one command (a function and its
 * argument) under the mutex, wakes the loop (uv_async_t) and waits on the
 * condition until the command, or the callback it started, completes it.
 * libpsnet's events are recorded as bits the caller collects with
 * psnet_sync_wait. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "log.h"
#include "modeldesc.h"
#include "psnet-internal.h"
#include "psnet.h"

#define PENDING 1 /* a command's function started something whose callback completes it */

typedef int (*SyncFn)(PsnetSync *s, void *arg);

struct PsnetSync {
        uv_loop_t loop;
        uv_async_t wake;
        uv_thread_t thread;
        uv_mutex_t mu;
        uv_cond_t cv;
        bool thread_started, locks;
        PsnetWorker *w;
        /* the command in hand (one at a time) */
        SyncFn fn;
        void *arg;
        bool posted, done, busy;
        int result;
        float **params;         /* the last round's params array (libpsnet keeps it) */
        size_t nparams;
        /* events (PSNET_EV_*) not yet collected, and the last reason */
        unsigned events;
        char reason[256];
};

/* --- the loop's thread --------------------------------------------------------------- */

static void complete(PsnetSync *s, int r) {
        uv_mutex_lock(&s->mu);
        s->result = r;
        s->done = true;
        uv_cond_broadcast(&s->cv);
        uv_mutex_unlock(&s->mu);
}

static void on_wake(uv_async_t *h) {
        PsnetSync *s = h->data;
        uv_mutex_lock(&s->mu);
        SyncFn fn = s->posted ? s->fn : NULL;
        void *arg = s->arg;
        s->posted = false;
        uv_mutex_unlock(&s->mu);
        if (!fn)
                return;
        int r = fn(s, arg);
        if (r != PENDING)
                complete(s, r);
}

static void event(PsnetSync *s, unsigned ev, const char *reason) {
        uv_mutex_lock(&s->mu);
        s->events |= ev;
        if (reason)
                snprintf(s->reason, sizeof s->reason, "%s", reason);
        uv_cond_broadcast(&s->cv);
        uv_mutex_unlock(&s->mu);
}

static void ev_registered(PsnetWorker *w, void *ud) { (void) w, event(ud, PSNET_EV_REGISTERED, NULL); }
static void ev_job(PsnetWorker *w, void *ud) { (void) w, event(ud, PSNET_EV_JOB, NULL); }
static void ev_membership(PsnetWorker *w, void *ud) { (void) w, event(ud, PSNET_EV_MEMBERSHIP, NULL); }
static void ev_stop(PsnetWorker *w, const char *why, void *ud) { (void) w, event(ud, PSNET_EV_STOP, why); }
static void ev_evaluate(PsnetWorker *w, void *ud) { (void) w, event(ud, PSNET_EV_EVALUATE, NULL); }
static void ev_failed(PsnetWorker *w, int err, const char *reason, void *ud) {
        (void) w;
        char why[256];
        snprintf(why, sizeof why, "%s (%s)", reason ? reason : "no reason", strerror(-err));
        event(ud, PSNET_EV_FAILED, why);
}

static void thread_main(void *arg) {
        PsnetSync *s = arg;
        (void) uv_run(&s->loop, UV_RUN_DEFAULT);
}

/* --- the caller's thread ------------------------------------------------------------- */

/* Runs fn(s, arg) on the loop's thread and waits for it to complete. */
static int call(PsnetSync *s, SyncFn fn, void *arg) {
        uv_mutex_lock(&s->mu);
        if (s->busy) {
                uv_mutex_unlock(&s->mu);
                return -EBUSY; /* another thread's call is running: one at a time */
        }
        s->busy = true;
        s->fn = fn;
        s->arg = arg;
        s->posted = true;
        s->done = false;
        uv_mutex_unlock(&s->mu);
        int r = uv_async_send(&s->wake);
        uv_mutex_lock(&s->mu);
        while (r == 0 && !s->done)
                uv_cond_wait(&s->cv, &s->mu);
        if (r == 0)
                r = s->result;
        s->posted = false;
        s->busy = false;
        uv_mutex_unlock(&s->mu);
        return r;
}

int psnet_sync_new(const PsnetWorkerOptions *opts, PsnetSync **ret) {
        *ret = NULL;
        PsnetSync *s = ps_calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        int r = uv_loop_init(&s->loop);
        if (r < 0) {
                ps_free(s);
                return r;
        }
        static const PsnetWorkerEvents ev = { .registered = ev_registered, .job = ev_job,
                                              .membership = ev_membership, .stop = ev_stop,
                                              .evaluate = ev_evaluate, .failed = ev_failed };
        s->wake.data = s;
        r = uv_async_init(&s->loop, &s->wake, on_wake);
        if (r == 0 && (r = uv_mutex_init(&s->mu)) == 0 && (r = uv_cond_init(&s->cv)) < 0)
                uv_mutex_destroy(&s->mu);
        s->locks = r == 0;
        if (r == 0)
                r = psnet_worker_new(&s->loop, opts, &ev, s, &s->w);
        if (r == 0) {
                r = uv_thread_create(&s->thread, thread_main, s);
                s->thread_started = r == 0;
        }
        if (r < 0) {
                psnet_sync_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

static int do_quit(PsnetSync *s, void *arg) {
        (void) arg;
        s->w = psnet_worker_free(s->w);
        uv_stop(&s->loop);
        return 0;
}

static void close_cb(uv_handle_t *h, void *arg) {
        (void) arg;
        if (!uv_is_closing(h))
                uv_close(h, NULL);
}

void psnet_sync_free(PsnetSync *s) {
        if (!s)
                return;
        if (s->thread_started) {
                (void) call(s, do_quit, NULL);
                (void) uv_thread_join(&s->thread);
        } else
                s->w = psnet_worker_free(s->w);
        if (s->locks) {
                uv_mutex_destroy(&s->mu);
                uv_cond_destroy(&s->cv);
        }
        /* Whatever is left open (the wake handle, the worker's closing handles). */
        uv_walk(&s->loop, close_cb, NULL);
        (void) uv_run(&s->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&s->loop) < 0)
                log_warning("libpsnet: a loop closed with handles still open");
        ps_free(s->params);
        ps_free(s);
}

int psnet_sync_wait(PsnetSync *s, unsigned mask, unsigned timeout_ms) {
        bool forever = timeout_ms == PSNET_WAIT_FOREVER;
        uint64_t deadline = uv_hrtime() + (uint64_t) timeout_ms * 1000000u;
        uv_mutex_lock(&s->mu);
        while (!(s->events & mask)) {
                uint64_t now = uv_hrtime();
                if (forever)
                        uv_cond_wait(&s->cv, &s->mu);
                else if (now >= deadline)
                        break;
                else
                        (void) uv_cond_timedwait(&s->cv, &s->mu, deadline - now);
        }
        unsigned got = s->events & mask;
        s->events &= ~got;
        uv_mutex_unlock(&s->mu);
        return (int) got;
}

void psnet_sync_reason(PsnetSync *s, char *buf, size_t n) {
        uv_mutex_lock(&s->mu);
        snprintf(buf, n, "%s", s->reason);
        uv_mutex_unlock(&s->mu);
}

/* --- the worker's state, read on the loop's thread --------------------------------- */

static int do_info(PsnetSync *s, void *arg) {
        PsnetSyncInfo *i = arg;
        const PsnetWorker *w = s->w;
        *i = (PsnetSyncInfo) { .id = psnet_worker_id(w), .state = psnet_worker_job_state(w),
                               .rank = psnet_worker_rank(w), .workers = psnet_worker_count(w),
                               .start_clock = psnet_worker_start_clock(w), .base_clock = psnet_worker_base_clock(w),
                               .round_clock = psnet_worker_round_clock(w) };
        const Job *job = psnet_worker_job(w);
        if (job) {
                i->has_job = true;
                i->ntensors = job->ntensors;
                i->batch = job->batch;
                i->epochs = job->epochs;
                i->seed = job->seed;
                i->train_limit = job->train_limit;
                i->test_limit = job->test_limit;
                snprintf(i->dataset, sizeof i->dataset, "%s", job->dataset);
                snprintf(i->model_name, sizeof i->model_name, "%s", job->model_name);
        }
        return 0;
}

int psnet_sync_info(PsnetSync *s, PsnetSyncInfo *ret) { return call(s, do_info, ret); }

typedef struct TensorArg {
        size_t t;
        char *name;
        size_t n;
        uint64_t numel;
} TensorArg;

static int do_tensor(PsnetSync *s, void *arg) {
        TensorArg *a = arg;
        const char *name = psnet_job_tensor_name(s->w, a->t);
        if (!name)
                return -ENOENT;
        snprintf(a->name, a->n, "%s", name);
        a->numel = psnet_job_tensor_numel(s->w, a->t);
        return 0;
}

int psnet_sync_tensor(PsnetSync *s, size_t t, char *name, size_t n, uint64_t *numel) {
        TensorArg a = { .t = t, .name = name, .n = n };
        int r = call(s, do_tensor, &a);
        if (r == 0)
                *numel = a.numel;
        return r;
}

typedef struct TextArg {
        char *buf;
        size_t n;
} TextArg;

static int do_model_json(PsnetSync *s, void *arg) {
        TextArg *a = arg;
        return psnet_job_model_json(s->w, a->buf, a->n);
}

int psnet_sync_model_json(PsnetSync *s, char *buf, size_t n) {
        TextArg a = { buf, n };
        return call(s, do_model_json, &a);
}

typedef struct ScheduleArg {
        int64_t clock, end_clock;
        uint64_t total, samples;
} ScheduleArg;

static int do_schedule(PsnetSync *s, void *arg) {
        ScheduleArg *a = arg;
        a->samples = psnet_job_samples_at(s->w, a->clock);
        a->end_clock = psnet_job_end_clock(s->w, a->total);
        return 0;
}

int psnet_sync_schedule(PsnetSync *s, int64_t clock, uint64_t total, uint64_t *samples, int64_t *end_clock) {
        ScheduleArg a = { .clock = clock, .total = total };
        int r = call(s, do_schedule, &a);
        *samples = a.samples;
        *end_clock = a.end_clock;
        return r;
}

/* --- rounds and reports -------------------------------------------------------------- */

typedef struct RoundArg {
        const float *const *grads;
        int64_t push_clock, pull_clock;
        float *const *params;
} RoundArg;

static void round_cb(PsnetWorker *w, int r, void *ud) {
        (void) w;
        complete(ud, r);
}

static int do_round(PsnetSync *s, void *arg) {
        RoundArg *a = arg;
        /* libpsnet keeps the params array (the final result's digest reads the
         * last one): a copy of it, so that the caller's may go. */
        size_t n = psnet_job_ntensors(s->w);
        if (n > s->nparams) {
                float **p = ps_realloc(s->params, n * sizeof *p);
                if (!p)
                        return -ENOMEM;
                s->params = p;
                s->nparams = n;
        }
        for (size_t i = 0; i < n; i++)
                s->params[i] = a->params[i];
        int r = psnet_worker_round(s->w, a->grads, a->push_clock, s->params, a->pull_clock, round_cb, s);
        return r < 0 ? r : PENDING;
}

typedef struct RowsArg {
        size_t table, n;
        const int64_t *ids;
        const float *grads;
        int64_t clock;
        float *out;
} RowsArg;

static void rows_cb(PsnetWorker *w, int r, void *ud) {
        (void) w;
        complete(ud, r);
}

static int do_rows(PsnetSync *s, void *arg) {
        RowsArg *a = arg;
        int r = psnet_worker_rows(s->w, a->table, a->ids, a->n, a->grads, a->clock, a->out, rows_cb, s);
        return r < 0 ? r : PENDING;
}

int psnet_sync_rows(PsnetSync *s, size_t table, const int64_t *ids, size_t n, const float *grads, int64_t clock,
                    float *out) {
        RowsArg a = { table, n, ids, grads, clock, out };
        return call(s, do_rows, &a);
}

typedef struct RowsManyArg {
        const PsnetRowsTable *tabs;
        size_t n;
        bool push;
        int64_t clock;
} RowsManyArg;

static int do_rows_many(PsnetSync *s, void *arg) {
        RowsManyArg *a = arg;
        int r = psnet_worker_rows_many(s->w, a->tabs, a->n, a->push, a->clock, rows_cb, s);
        return r < 0 ? r : PENDING;
}

int psnet_sync_rows_many(PsnetSync *s, const PsnetRowsTable *tabs, size_t ntabs, bool push, int64_t clock) {
        RowsManyArg a = { tabs, ntabs, push, clock };
        return call(s, do_rows_many, &a);
}

typedef struct CacheArg {
        uint64_t hits, misses, pulled;
} CacheArg;

static int do_rows_cache(PsnetSync *s, void *arg) {
        CacheArg *a = arg;
        psnet_worker_rows_cache(s->w, &a->hits, &a->misses, &a->pulled);
        return 0;
}

int psnet_sync_rows_cache(PsnetSync *s, uint64_t *hits, uint64_t *misses, uint64_t *pulled_bytes) {
        CacheArg a = { 0 };
        int r = call(s, do_rows_cache, &a);
        *hits = a.hits;
        *misses = a.misses;
        *pulled_bytes = a.pulled;
        return r;
}

typedef struct TableArg {
        size_t i;
        char *name;
        size_t n;
        uint32_t dim;
} TableArg;

static int do_table(PsnetSync *s, void *arg) {
        TableArg *a = arg;
        const char *name = psnet_job_table_name(s->w, a->i);
        if (!name)
                return -ENOENT;
        snprintf(a->name, a->n, "%s", name);
        a->dim = psnet_job_table_dim(s->w, a->i);
        return 0;
}

int psnet_sync_table(PsnetSync *s, size_t i, char *name, size_t n, uint32_t *dim) {
        TableArg a = { .i = i, .name = name, .n = n };
        int r = call(s, do_table, &a);
        if (r == 0)
                *dim = a.dim;
        return r;
}

int psnet_sync_round(PsnetSync *s, const float *const *grads, int64_t push_clock, float *const *params,
                     int64_t pull_clock) {
        RoundArg a = { grads, push_clock, pull_clock, params };
        return call(s, do_round, &a);
}

typedef struct MemoryArg {
        size_t nsets;
        float **ret;
        PsnetMemory *ref;
} MemoryArg;

static int do_memory(PsnetSync *s, void *arg) {
        MemoryArg *a = arg;
        int r = psnet_worker_memory(s->w, a->nsets, a->ret);
        if (r == 0 && !(a->ref = psnet_worker_memory_ref(s->w)))
                r = -ENOMEM;
        return r;
}

int psnet_sync_memory(PsnetSync *s, size_t nsets, float **ret, PsnetMemory **ref) {
        MemoryArg a = { nsets, ret, NULL };
        int r = call(s, do_memory, &a);
        if (r == 0)
                *ref = a.ref;
        return r;
}

static int do_progress(PsnetSync *s, void *arg) {
        psnet_worker_progress(s->w, arg);
        return 0;
}

int psnet_sync_progress(PsnetSync *s, const PsnetProgress *p) { return call(s, do_progress, (void *) p); }

static int do_evaluated(PsnetSync *s, void *arg) { return psnet_worker_evaluated(s->w, arg); }

int psnet_sync_evaluated(PsnetSync *s, const PsnetEval *e) { return call(s, do_evaluated, (void *) e); }

typedef struct ResultArg {
        PsnetSync *s;
        bool has_accuracy, evaluate;
        float accuracy;
} ResultArg;

static void result_cb(PsnetWorker *w, int r, bool evaluate, void *ud) {
        ResultArg *a = ud;
        (void) w;
        a->evaluate = evaluate; /* read by the caller after complete's mutex */
        complete(a->s, r);
}

static int do_result(PsnetSync *s, void *arg) {
        ResultArg *a = arg;
        int r = psnet_worker_result(s->w, a->has_accuracy, a->accuracy, result_cb, a);
        return r < 0 ? r : PENDING;
}

int psnet_sync_result(PsnetSync *s, bool has_accuracy, float accuracy, bool *evaluate) {
        ResultArg a = { .s = s, .has_accuracy = has_accuracy, .accuracy = accuracy };
        int r = call(s, do_result, &a);
        if (evaluate)
                *evaluate = r == 0 && a.evaluate;
        return r;
}

static void left_cb(PsnetWorker *w, void *ud) {
        (void) w;
        complete(ud, 0);
}

static int do_leave(PsnetSync *s, void *arg) {
        (void) arg;
        int r = psnet_worker_leave(s->w, left_cb, s);
        return r < 0 ? r : PENDING;
}

int psnet_sync_leave(PsnetSync *s) { return call(s, do_leave, NULL); }
