/* SPDX-License-Identifier: Apache-2.0 */
/* libpsnet's blocking federated clients (psnet.h, "Blocking federated
 * clients"): one or more PsnetEdge on a loop of their own, run by a thread of
 * their own, for callers without a libuv loop (Python's psnet.fed through
 * ctypes). As in psnet-sync.c, every call into a PsnetEdge is made on the
 * loop's thread: the caller posts one command under the mutex, wakes the
 * loop and waits until the command, or the callback it started, completes
 * it. What the clients are told (registered, the job, a round, a push's end,
 * the job's end) is queued as events, in order, for psnet_edge_sync_next. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "log.h"
#include "modeldesc.h"
#include "psnet-internal.h"
#include "psnet.h"

#define PENDING 1                 /* a command's function started something whose callback completes it */
#define MAX_QUEUED (1u << 16)     /* events not yet taken: beyond, the oldest rounds go (logged) */

typedef struct EdgeSyncClient EdgeSyncClient;
typedef int (*SyncFn)(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg);

struct EdgeSyncClient {
        PsnetEdgeSync *s;
        unsigned index;
        PsnetEdge *e;
        float **params;         /* the last pull's array (a final report digests those weights) */
        ModelDesc *desc;        /* the job's model, parsed once for the tensors' shapes */
        uint64_t pushing;       /* the round of the push under way (0: none) */
};

struct PsnetEdgeSync {
        uv_loop_t loop;
        uv_async_t wake;
        uv_thread_t thread;
        uv_mutex_t mu;
        uv_cond_t cv;
        bool thread_started, locks;
        EdgeSyncClient *clients;
        unsigned nclients;
        /* the command in hand (one at a time) */
        SyncFn fn;
        EdgeSyncClient *fc;
        void *arg;
        bool posted, done, busy;
        int result;
        /* events not yet taken: a ring */
        PsnetEdgeEvent *q;
        size_t qhead, qlen, qcap;
        uint64_t lost;
};

/* --- the loop's thread --------------------------------------------------------------- */

static void complete(PsnetEdgeSync *s, int r) {
        uv_mutex_lock(&s->mu);
        s->result = r;
        s->done = true;
        uv_cond_broadcast(&s->cv);
        uv_mutex_unlock(&s->mu);
}

static void on_wake(uv_async_t *h) {
        PsnetEdgeSync *s = h->data;
        uv_mutex_lock(&s->mu);
        SyncFn fn = s->posted ? s->fn : NULL;
        EdgeSyncClient *c = s->fc;
        void *arg = s->arg;
        s->posted = false;
        uv_mutex_unlock(&s->mu);
        if (!fn)
                return;
        int r = fn(s, c, arg);
        if (r != PENDING)
                complete(s, r);
}

/* Queues ev (its kind and client set by the caller). */
static void enqueue(PsnetEdgeSync *s, const PsnetEdgeEvent *ev) {
        uv_mutex_lock(&s->mu);
        if (s->qlen == s->qcap) {
                size_t cap = s->qcap ? 2 * s->qcap : 64;
                PsnetEdgeEvent *q = cap <= MAX_QUEUED ? ps_malloc(cap * sizeof *q) : NULL;
                if (!q) {
                        /* Nobody takes them: the oldest goes. A round lost this way
                         * closes without this client, as if it were slow. */
                        s->qhead = (s->qhead + 1) % s->qcap;
                        s->qlen--;
                        if (s->lost++ == 0)
                                log_warning("libpsnet: federated events are not being taken; the oldest are dropped");
                } else {
                        for (size_t i = 0; i < s->qlen; i++)
                                q[i] = s->q[(s->qhead + i) % s->qcap];
                        ps_free(s->q);
                        s->q = q;
                        s->qcap = cap;
                        s->qhead = 0;
                }
        }
        s->q[(s->qhead + s->qlen) % s->qcap] = *ev;
        s->qlen++;
        uv_cond_broadcast(&s->cv);
        uv_mutex_unlock(&s->mu);
}

static EdgeSyncClient *of(PsnetEdge *e, void *ud) {
        (void) e;
        return ud;
}

static void post(EdgeSyncClient *c, PsnetEdgeEvent *ev) {
        ev->client = c->index;
        enqueue(c->s, ev);
}

static void ev_registered(PsnetEdge *e, bool again, void *ud) {
        PsnetEdgeEvent ev = { .kind = PSNET_EDGE_EV_REGISTERED, .r = again };
        post(of(e, ud), &ev);
}

static void ev_failed(PsnetEdge *e, int err, const char *reason, void *ud) {
        PsnetEdgeEvent ev = { .kind = PSNET_EDGE_EV_FAILED, .r = err };
        snprintf(ev.reason, sizeof ev.reason, "%s", reason ? reason : "no reason");
        post(of(e, ud), &ev);
}

static void ev_job(PsnetEdge *e, void *ud) {
        PsnetEdgeEvent ev = { .kind = PSNET_EDGE_EV_JOB };
        post(of(e, ud), &ev);
}

static void ev_round(PsnetEdge *e, const PsnetEdgeRound *rd, void *ud) {
        PsnetEdgeEvent ev = { .kind = PSNET_EDGE_EV_ROUND, .round = *rd };
        post(of(e, ud), &ev);
}

static void ev_end(PsnetEdge *e, PsnetJobState state, void *ud) {
        PsnetEdgeEvent ev = { .kind = PSNET_EDGE_EV_END, .r = (int) state };
        post(of(e, ud), &ev);
}

static void thread_main(void *arg) {
        PsnetEdgeSync *s = arg;
        (void) uv_run(&s->loop, UV_RUN_DEFAULT);
}

/* --- the caller's thread ------------------------------------------------------------- */

/* Runs fn(s, client, arg) on the loop's thread and waits for it to complete. */
static int call(PsnetEdgeSync *s, unsigned client, SyncFn fn, void *arg) {
        if (client >= s->nclients)
                return -ENOENT;
        uv_mutex_lock(&s->mu);
        if (s->busy) {
                uv_mutex_unlock(&s->mu);
                return -EBUSY; /* another thread's call is running: one at a time */
        }
        s->busy = true;
        s->fn = fn;
        s->fc = &s->clients[client];
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

int psnet_edge_sync_new(const PsnetEdgeOptions *opts, unsigned clients, PsnetEdgeSync **ret) {
        *ret = NULL;
        if (!opts || clients < 1 || clients > PSNET_EDGE_SYNC_MAX_CLIENTS)
                return -EINVAL;
        PsnetEdgeSync *s = ps_calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        int r = uv_loop_init(&s->loop);
        if (r < 0) {
                ps_free(s);
                return r;
        }
        s->wake.data = s;
        r = uv_async_init(&s->loop, &s->wake, on_wake);
        if (r == 0 && (r = uv_mutex_init(&s->mu)) == 0 && (r = uv_cond_init(&s->cv)) < 0)
                uv_mutex_destroy(&s->mu);
        s->locks = r == 0;
        if (r == 0 && !(s->clients = ps_calloc(clients, sizeof *s->clients)))
                r = -ENOMEM;
        static const PsnetEdgeEvents ev = { .registered = ev_registered, .failed = ev_failed, .job = ev_job,
                                            .round = ev_round, .end = ev_end };
        PsnetEdgeOptions o = *opts;
        o.clients = clients;
        o.share = NULL;
        for (unsigned i = 0; r == 0 && i < clients; i++) {
                EdgeSyncClient *c = &s->clients[i];
                c->s = s;
                c->index = i;
                r = psnet_edge_new(&s->loop, &o, &ev, c, &c->e);
                if (r == 0) {
                        s->nclients = i + 1;
                        o.share = s->clients[0].e; /* one context and one key for all */
                }
        }
        if (r == 0) {
                r = uv_thread_create(&s->thread, thread_main, s);
                s->thread_started = r == 0;
        }
        if (r < 0) {
                psnet_edge_sync_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

static int do_quit(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) c, (void) arg;
        for (unsigned i = 0; i < s->nclients; i++)
                s->clients[i].e = psnet_edge_free(s->clients[i].e);
        uv_stop(&s->loop);
        return 0;
}

static void close_cb(uv_handle_t *h, void *arg) {
        (void) arg;
        if (!uv_is_closing(h))
                uv_close(h, NULL);
}

void psnet_edge_sync_free(PsnetEdgeSync *s) {
        if (!s)
                return;
        if (s->thread_started) {
                (void) call(s, 0, do_quit, NULL);
                (void) uv_thread_join(&s->thread);
        } else
                for (unsigned i = 0; i < s->nclients; i++)
                        s->clients[i].e = psnet_edge_free(s->clients[i].e);
        if (s->locks) {
                uv_mutex_destroy(&s->mu);
                uv_cond_destroy(&s->cv);
        }
        /* Whatever is left open (the wake handle, the clients' closing handles). */
        uv_walk(&s->loop, close_cb, NULL);
        (void) uv_run(&s->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&s->loop) < 0)
                log_warning("libpsnet: a loop closed with handles still open");
        for (unsigned i = 0; s->clients && i < s->nclients; i++) {
                ps_free(s->clients[i].params);
                ps_free(s->clients[i].desc);
        }
        ps_free(s->clients);
        ps_free(s->q);
        ps_free(s);
}

int psnet_edge_sync_next(PsnetEdgeSync *s, PsnetEdgeEvent *ev, unsigned timeout_ms) {
        bool forever = timeout_ms == PSNET_WAIT_FOREVER;
        uint64_t deadline = uv_hrtime() + (uint64_t) timeout_ms * 1000000u;
        uv_mutex_lock(&s->mu);
        while (s->qlen == 0) {
                uint64_t now = uv_hrtime();
                if (forever)
                        uv_cond_wait(&s->cv, &s->mu);
                else if (now >= deadline)
                        break;
                else
                        (void) uv_cond_timedwait(&s->cv, &s->mu, deadline - now);
        }
        int got = s->qlen > 0;
        if (got) {
                *ev = s->q[s->qhead];
                s->qhead = (s->qhead + 1) % s->qcap;
                s->qlen--;
        }
        uv_mutex_unlock(&s->mu);
        return got;
}

/* --- the job ------------------------------------------------------------------------- */

static int do_info(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        PsnetEdgeSyncInfo *i = arg;
        const PsnetEdge *e = c->e;
        *i = (PsnetEdgeSyncInfo) { .id = psnet_edge_id(e) };
        if (!psnet_edge_job(e))
                return 0;
        i->has_job = true;
        i->ntensors = psnet_edge_job_ntensors(e);
        i->batch = psnet_edge_job_batch(e);
        i->local_epochs = psnet_edge_job_local_epochs(e);
        i->rounds = psnet_edge_job_rounds(e);
        i->lr = psnet_edge_job_lr(e);
        i->prox_mu = psnet_edge_job_prox_mu(e);
        i->seed = psnet_edge_job_seed(e);
        i->async = psnet_edge_job_async(e);
        snprintf(i->model_name, sizeof i->model_name, "%s", psnet_edge_job(e)->model_name);
        return 0;
}

int psnet_edge_sync_info(PsnetEdgeSync *s, unsigned client, PsnetEdgeSyncInfo *ret) {
        return call(s, client, do_info, ret);
}

typedef struct TensorArg {
        size_t t;
        char *name;
        size_t n;
        uint64_t numel;
        uint32_t *dims;
        unsigned ndim;
} TensorArg;

static int do_tensor(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        TensorArg *a = arg;
        const Job *job = psnet_edge_job(c->e);
        if (!job || a->t >= job->ntensors)
                return -ENOENT;
        /* The shape is the model description's (the job keeps sizes alone),
         * parsed at the first call: a client's job does not change. */
        if (!c->desc) {
                char err[256];
                if (!(c->desc = ps_calloc(1, sizeof *c->desc)))
                        return -ENOMEM;
                if (modeldesc_parse(job->model, c->desc, err, sizeof err) < 0) {
                        ps_free(c->desc);
                        c->desc = NULL;
                        return -EPROTO; /* cannot be: the job was made from it */
                }
        }
        const MdTensor *d = a->t < c->desc->ntensors ? &c->desc->tensors[a->t] : NULL;
        if (!d || d->numel != job->tensors[a->t].numel)
                return -EPROTO;
        snprintf(a->name, a->n, "%s", job->tensors[a->t].name);
        a->numel = job->tensors[a->t].numel;
        a->ndim = d->ndim;
        memcpy(a->dims, d->shape, sizeof d->shape);
        return 0;
}

int psnet_edge_sync_tensor(PsnetEdgeSync *s, unsigned client, size_t t, char *name, size_t n, uint64_t *numel,
                           uint32_t dims[4], unsigned *ndim) {
        TensorArg a = { .t = t, .name = name, .n = n, .dims = dims };
        int r = call(s, client, do_tensor, &a);
        if (r == 0) {
                *numel = a.numel;
                *ndim = a.ndim;
        }
        return r;
}

typedef struct TextArg {
        char *buf;
        size_t n;
} TextArg;

static int do_model_json(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        TextArg *a = arg;
        return psnet_edge_job_model_json(c->e, a->buf, a->n);
}

int psnet_edge_sync_model_json(PsnetEdgeSync *s, unsigned client, char *buf, size_t n) {
        TextArg a = { buf, n };
        return call(s, client, do_model_json, &a);
}

static int do_examples(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        psnet_edge_set_examples(c->e, *(const uint64_t *) arg);
        return 0;
}

int psnet_edge_sync_set_examples(PsnetEdgeSync *s, unsigned client, uint64_t examples) {
        return call(s, client, do_examples, &examples);
}

/* --- rounds -------------------------------------------------------------------------- */

typedef struct PullArg {
        uint64_t number;
        float *const *params;
        int64_t rounds;
} PullArg;

static void pulled(PsnetEdge *e, int r, int64_t rounds, void *ud) {
        EdgeSyncClient *c = ud;
        (void) e;
        PullArg *a = c->s->arg;
        a->rounds = rounds;
        complete(c->s, r);
}

static int do_pull(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        PullArg *a = arg;
        /* libpsnet keeps the params array (a final report digests the last
         * pull's weights): a copy of it, so that the caller's may go. */
        size_t n = psnet_edge_job_ntensors(c->e);
        if (!n)
                return -ENOENT;
        if (!c->params && !(c->params = ps_calloc(n, sizeof *c->params)))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                c->params[i] = a->params[i];
        int r = psnet_edge_pull(c->e, a->number, c->params, pulled, c);
        return r < 0 ? r : PENDING;
}

int psnet_edge_sync_pull(PsnetEdgeSync *s, unsigned client, uint64_t number, float *const *params, int64_t *rounds) {
        PullArg a = { .number = number, .params = params };
        int r = call(s, client, do_pull, &a);
        if (rounds)
                *rounds = r == 0 ? a.rounds : 0;
        return r;
}

typedef struct PushArg {
        uint64_t number, examples;
        float loss;
        const float *const *update;
} PushArg;

static void pushed(PsnetEdge *e, int r, const PsnetEdgePushInfo *info, void *ud) {
        EdgeSyncClient *c = ud;
        (void) e;
        PsnetEdgeEvent ev = { .kind = PSNET_EDGE_EV_PUSHED, .r = r, .round = { .number = c->pushing } };
        if (info)
                ev.push = *info;
        c->pushing = 0;
        post(c, &ev);
}

static int do_push(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        PushArg *a = arg;
        float *const *upd;
        int r = psnet_edge_update(c->e, &upd);
        if (r < 0)
                return r;
        for (size_t t = 0; t < psnet_edge_job_ntensors(c->e); t++)
                memcpy(upd[t], a->update[t], psnet_edge_job_tensor_numel(c->e, t) * sizeof(float));
        c->pushing = a->number;
        r = psnet_edge_push(c->e, a->number, a->examples, a->loss, pushed, c);
        if (r < 0)
                c->pushing = 0;
        return r;
}

int psnet_edge_sync_push(PsnetEdgeSync *s, unsigned client, uint64_t number, const float *const *update,
                         uint64_t examples, float loss) {
        PushArg a = { .number = number, .examples = examples, .loss = loss, .update = update };
        return call(s, client, do_push, &a);
}

typedef struct DoneArg {
        const PsnetEdgeRound *rd;
        uint64_t number, examples;
        const char *reason;
        float accuracy, loss;
} DoneArg;

static void done_cb(PsnetEdge *e, int r, void *ud) {
        EdgeSyncClient *c = ud;
        (void) e;
        complete(c->s, r);
}

static int do_decline(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        DoneArg *a = arg;
        int r = psnet_edge_decline(c->e, a->number, a->reason, done_cb, c);
        return r < 0 ? r : PENDING;
}

int psnet_edge_sync_decline(PsnetEdgeSync *s, unsigned client, uint64_t number, const char *reason) {
        DoneArg a = { .number = number, .reason = reason };
        return call(s, client, do_decline, &a);
}

static int do_report(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        DoneArg *a = arg;
        int r = a->rd->local ? psnet_edge_report_local(c->e, a->rd, a->accuracy, a->loss, a->examples, done_cb, c)
                             : psnet_edge_report(c->e, a->rd, a->accuracy, a->loss, done_cb, c);
        return r < 0 ? r : PENDING;
}

int psnet_edge_sync_report(PsnetEdgeSync *s, unsigned client, const PsnetEdgeRound *rd, float accuracy, float loss,
                           uint64_t examples) {
        /* A final model's test may have no accuracy (a model of tensors alone): NaN. */
        if (!(accuracy >= 0.0f && accuracy <= 1.0f) && !(isnan(accuracy) && !rd->round && !rd->local))
                return -EINVAL;
        if (rd->local && (examples == 0 || !(isfinite(loss) && loss >= 0)))
                return -EINVAL;
        DoneArg a = { .rd = rd, .accuracy = accuracy, .loss = isfinite(loss) ? loss : 0.0f, .examples = examples };
        return call(s, client, do_report, &a);
}

static int do_leave(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s, (void) arg;
        if (!psnet_edge_id(c->e))
                return 0; /* never registered: nothing to leave */
        int r = psnet_edge_leave(c->e, done_cb, c);
        return r < 0 ? r : PENDING;
}

int psnet_edge_sync_leave(PsnetEdgeSync *s, unsigned client) { return call(s, client, do_leave, NULL); }

typedef struct UpdateArg {
        uint64_t number;
        size_t i;
        uint32_t id;
        uint64_t examples;
        float loss;
} UpdateArg;

static int do_round_update(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        UpdateArg *a = arg;
        return psnet_edge_round_update(c->e, a->number, a->i, &a->id, &a->examples, &a->loss);
}

int psnet_edge_sync_round_update(PsnetEdgeSync *s, unsigned client, uint64_t number, size_t i, uint32_t *id,
                                 uint64_t *examples, float *loss) {
        UpdateArg a = { .number = number, .i = i };
        int r = call(s, client, do_round_update, &a);
        if (r == 0) {
                if (id)
                        *id = a.id;
                if (examples)
                        *examples = a.examples;
                if (loss)
                        *loss = a.loss;
        }
        return r;
}

typedef struct PullUpdateArg {
        PullArg pull;           /* first: pulled() takes the arg as a PullArg */
        uint32_t id;
} PullUpdateArg;

static int do_pull_update(PsnetEdgeSync *s, EdgeSyncClient *c, void *arg) {
        (void) s;
        PullUpdateArg *a = arg;
        /* The caller's buffers: an update is not digested by any report. */
        int r = psnet_edge_pull_update(c->e, a->pull.number, a->id, a->pull.params, pulled, c);
        return r < 0 ? r : PENDING;
}

int psnet_edge_sync_pull_update(PsnetEdgeSync *s, unsigned client, uint64_t number, uint32_t id,
                                float *const *params) {
        PullUpdateArg a = { .pull = { .number = number, .params = params }, .id = id };
        return call(s, client, do_pull_update, &a);
}
