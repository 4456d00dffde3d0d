/* SPDX-License-Identifier: Apache-2.0 */
/* libpsnet's worker (see psnet.h): the worker's pscoord session (registration,
 * heartbeats with its progress, the job, map and membership pushed by
 * pscoord, drain and stop) joined to the shards' data plane (client.c). When
 * a shard answers MOVED under a newer map, the round waits here for that map
 * from pscoord (bounded: 30 s) and runs again; the caller never sees it. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "client.h"
#include "endpoint.h"
#include "hash.h"
#include "keys.h"
#include "log.h"
#include "psnet-follow.h"
#include "psnet-internal.h"
#include "schedule.h"
#include "session.h"
#include "wire-job.h"

#define PSNET_MAP_WAIT_MS 30000
#define PSNET_MEMBER_WAIT_MS 60000

/* psnet_worker_memory's, mapped until its last reference goes (the worker's,
 * and the callers' of psnet_worker_memory_ref). */
struct PsnetMemory {
        ShmMemory m;
        atomic_uint refs;
};

struct PsnetWorker {
        uv_loop_t *loop;
        void *zctx;
        Session *session;
        Client *client;
        PsnetMemory *mem;               /* psnet_worker_memory's (NULL: none) */
        PsnetWorkerOptions opts;
        char *coord;
        NetIdentity id;
        PsnetWorkerEvents ev;
        void *ud;
        Follow fo;                      /* the job, its map and state as pscoord publishes them */
        bool job_announced, stop_announced;
        uint32_t rank, nworkers;
        int64_t start_clock;
        uint64_t members_epoch;         /* of the latest membership this worker is in */
        Schedule sched;                 /* the job's epochs in clocks, from the membership */
        uint64_t total;                 /* the job's samples (psnet_job_end_clock's; 0: not known) */
        bool evaluating;                /* asked to evaluate the final weights: pulls come as f32 */
        uint64_t stop_deadline;         /* psnet_worker_stopping's (uv_now; 0: none) */
        PsnetProgress progress;
        double hb_loss_sum;                /* the losses reported with new clocks since the last heartbeat */
        uint64_t hb_loss_n;
        uint64_t hb_ms, hb_samples, hb_step;  /* at the last heartbeat */
        PsnetEval evals[PSNET_EVALS_KEPT]; /* a ring: the newest nevals end at evals_end */
        size_t nevals, evals_end;
        Psnet__EpochRecord eval_recs[PSNET_EVALS_KEPT], *eval_recp[PSNET_EVALS_KEPT];
        Psnet__WorkerInfo hb;
        /* the round in progress */
        const float *const *grads;
        float *const *params;
        int64_t push_clock, pull_clock;
        PsnetRoundFn round_cb;
        void *round_ud;
        PsnetRowsFn rows_cb;            /* psnet_worker_rows under way */
        void *rows_ud;
        /* its arguments, kept to send it again under a newer map (ids and
         * gradients copies) */
        ClientRowsTable rows_tabs[JOB_MAX_TABLES];
        size_t rows_ntabs;
        bool rows_push;
        int64_t rows_clock;
        bool rows_waiting_map;
        int64_t round_clock;
        bool waiting_map;
        bool waiting_member;            /* a shard said it is no member: waiting to be admitted again */
        bool readmitted;                /* admitted again at a new start clock: the next round says so */
        uint64_t map_wait_deadline;
        uv_timer_t map_timer;
        bool map_timer_init;
        /* a result or leave in progress */
        PsnetResultFn result_cb;
        bool result_has_accuracy;
        float result_accuracy;
        unsigned result_tries;
        PsnetDoneFn leave_cb;
        void *result_ud, *leave_ud;
};

static void round_done(PsnetWorker *w, int r);
static void readmitted(PsnetWorker *w);

static bool is_member(const PsnetWorker *w, const Psnet__Membership *m) {
        for (size_t i = 0; m && i < m->n_workers; i++)
                if (m->workers[i] == session_id(w->session))
                        return true;
        return false;
}

static void announce_stop(PsnetWorker *w, const char *why) {
        if (w->stop_announced)
                return;
        w->stop_announced = true;
        if (w->ev.stop)
                w->ev.stop(w, why, w->ud);
}

static void round_resume(PsnetWorker *w);
static int round_start(PsnetWorker *w);
static void round_done(PsnetWorker *w, int r);
static void rows_again(PsnetWorker *w);
static void rows_done(PsnetWorker *w, int r);

/* The copies psnet_worker_rows_many kept of its ids and gradients. */
static void rows_free_args(PsnetWorker *w) {
        for (size_t k = 0; k < w->rows_ntabs; k++) {
                ps_free((void *) w->rows_tabs[k].ids);
                ps_free((void *) w->rows_tabs[k].grads);
        }
        w->rows_ntabs = 0;
}
static void map_timer_cb(uv_timer_t *t);

static void apply_config(PsnetWorker *w, const Psnet__Config *ctl) {
        (void) follow_state(&w->fo, ctl);
        bool changed = false;
        if (ctl->has_rank && ctl->rank != w->rank) {
                w->rank = ctl->rank;
                changed = true;
        }
        if (ctl->has_nworkers && ctl->nworkers != w->nworkers) {
                w->nworkers = ctl->nworkers;
                changed = true;
        }
        /* The latest membership it is in (a pscoord restarted without its
         * state numbers them again from 1, so the latest, not the highest). */
        if (ctl->members && is_member(w, ctl->members) && ctl->members->epoch != w->members_epoch) {
                w->members_epoch = ctl->members->epoch;
                if (w->client)
                        client_set_members_epoch(w->client, w->members_epoch);
        }
        if (ctl->members && ctl->members->has_base_clock && is_member(w, ctl->members)) {
                w->sched.base_clock = ctl->members->base_clock;
                w->sched.samples_before = ctl->members->samples_before;
                w->sched.workers = (uint32_t) ctl->members->n_workers;
        }
        if (ctl->has_drain && ctl->drain) {
                log_info("drain requested: leaving after this step");
                announce_stop(w, "drained by the operator");
        }
        /* The job is taken once this worker is a member: a worker that joins a
         * running job waits for the clock boundary pscoord picks for it. */
        if (ctl->job && ctl->map && !w->fo.has_job && is_member(w, ctl->members)) {
                if (follow_job(&w->fo, ctl) < 0)
                        return;
                w->start_clock = ctl->has_start_clock ? ctl->start_clock : 0;
                w->sched.batch = w->fo.job.batch;
        } else if (w->fo.has_job) {
                if (follow_map(&w->fo, ctl) > 0) {
                        log_info("shard map epoch=%lu shards=%zu", (unsigned long) shardmap_epoch(w->fo.map),
                                 shardmap_size(w->fo.map));
                        if (w->waiting_map)
                                round_resume(w);
                        else if (w->rows_cb)
                                rows_again(w);
                        else if (w->round_cb && w->client && client_busy(w->client)) {
                                /* A round in flight under the old map may wait on a shard
                                 * that is gone (a fail-over): run it again under the new
                                 * one. What was held already comes back DUPLICATE. */
                                client_abort(w->client);
                                int r = round_start(w);
                                if (r < 0)
                                        round_done(w, r);
                        }
                }
        }
        if (ctl->job && w->fo.has_job && ctl->job->id != w->fo.job.id) {
                log_warning("pscoord moved to job %u; this worker trains job %u and stops", ctl->job->id, w->fo.job.id);
                announce_stop(w, "pscoord moved to another job");
        }
        /* A member told another start clock has been admitted again (its lease
         * ran out, e.g. it was stopped, and it registered again): it goes on
         * from that clock, not from its own. */
        if (w->fo.has_job && w->job_announced && ctl->has_start_clock && is_member(w, ctl->members) &&
            ctl->start_clock != w->start_clock) {
                log_info("admitted again start_clock=%ld was=%ld", (long) ctl->start_clock, (long) w->start_clock);
                w->start_clock = ctl->start_clock;
                readmitted(w);
        }
        if (w->fo.has_state && w->fo.state == JOB_STOPPED) {
                log_info("job stopped by the operator");
                announce_stop(w, "the operator stopped the job");
        }
        if (w->fo.has_state && w->fo.state == JOB_FAILED)
                announce_stop(w, "the job failed (psctl status says why)");
        if (w->fo.has_state && w->fo.state == JOB_DONE)
                announce_stop(w, "the job is done");
        if (ctl->has_evaluate && ctl->evaluate && w->fo.has_job) {
                log_info("pscoord asks this worker to evaluate the final weights");
                w->evaluating = true;
                if (w->ev.evaluate)
                        w->ev.evaluate(w, w->ud);
        }
        if (w->fo.has_job && w->fo.has_state && w->fo.state == JOB_RUNNING && !w->job_announced) {
                w->job_announced = true;
                if (w->ev.job)
                        w->ev.job(w, w->ud);
        } else if (changed && w->job_announced && w->ev.membership)
                w->ev.membership(w, w->ud);
}

/* --- session ------------------------------------------------------------------- */

static void on_registered(Session *s, bool again, void *ud) {
        PsnetWorker *w = ud;
        char f[32];
        snprintf(f, sizeof f, "worker=%u", session_id(s));
        log_set_fields(f);
        log_info("registered%s coord=%s lease_ms=%u", again ? " again" : "", session_endpoint(s),
                 session_lease_ms(s));
        if (w->ev.registered)
                w->ev.registered(w, w->ud);
}

static void on_failed(Session *s, int err, const char *reason, void *ud) {
        PsnetWorker *w = ud;
        (void) s;
        if (w->ev.failed)
                w->ev.failed(w, err, reason, w->ud);
}

static void on_message(Session *s, WireMsg *m, void *ud) {
        PsnetWorker *w = ud;
        (void) s;
        if (m->hdr->type == PSNET__MSG_TYPE__MSG_CONFIG)
                apply_config(w, m->hdr->config);
        else
                log_debug("ignoring message from pscoord type=%s", wire_type_name(m->hdr->type));
}

/* The figures every report of this worker carries (heartbeats, results). */
static void worker_info(PsnetWorker *w, Psnet__WorkerInfo *wi) {
        psnet__worker_info__init(wi);
        wi->id = session_id(w->session);
        wi->has_rank = wi->has_clock = wi->has_loss = wi->has_epoch = wi->has_step = wi->has_samples = true;
        wi->has_progress = wi->has_end_clock = true;
        wi->progress = w->progress.progress;
        wi->end_clock = w->progress.end_clock;
        wi->rank = w->rank;
        wi->clock = w->progress.clock;
        wi->loss = w->progress.loss;
        wi->epoch = w->progress.epoch;
        wi->step = w->progress.step;
        wi->samples = w->progress.samples;
        /* The kept evaluations, oldest first. */
        for (size_t k = 0; k < w->nevals; k++) {
                const PsnetEval *e = &w->evals[(w->evals_end + PSNET_EVALS_KEPT - w->nevals + k) % PSNET_EVALS_KEPT];
                Psnet__EpochRecord *o = &w->eval_recs[k];
                psnet__epoch_record__init(o);
                o->epoch = e->epoch;
                o->has_accuracy = o->has_test_loss = o->has_train_loss = o->has_clock = true;
                o->accuracy = e->accuracy;
                o->test_loss = e->test_loss;
                o->train_loss = e->train_loss;
                o->clock = e->clock;
                o->has_auc = e->auc > 0 && e->auc <= 1;
                o->auc = o->has_auc ? e->auc : 0;
                w->eval_recp[k] = o;
        }
        wi->n_evals = w->nevals;
        wi->evals = w->nevals ? w->eval_recp : NULL;
}

static void on_heartbeat(Session *s, Psnet__Heartbeat *hb, void *ud) {
        PsnetWorker *w = ud;
        Psnet__WorkerInfo *wi = &w->hb;
        (void) s;
        worker_info(w, wi);
        wi->has_steps_per_s = wi->has_samples_per_s = true;
        wi->steps_per_s = w->progress.steps_per_s;
        wi->samples_per_s = w->progress.samples_per_s;
        /* The speed since the last heartbeat, where this worker's counts say. */
        uint64_t now = now_ms();
        if (w->hb_ms && now > w->hb_ms && w->progress.samples >= w->hb_samples && w->progress.step >= w->hb_step) {
                double dt = (double) (now - w->hb_ms) / 1000.0;
                wi->samples_per_s = (float) ((double) (w->progress.samples - w->hb_samples) / dt);
                wi->steps_per_s = (float) ((double) (w->progress.step - w->hb_step) / dt);
        }
        w->hb_ms = now;
        w->hb_samples = w->progress.samples;
        w->hb_step = w->progress.step;
        /* The mean of the steps' losses since the last heartbeat: pscoord
         * keeps them as the job's loss by clock (psctl report). */
        if (w->hb_loss_n)
                wi->loss = (float) (w->hb_loss_sum / (double) w->hb_loss_n);
        w->hb_loss_sum = 0;
        w->hb_loss_n = 0;
        hb->worker = wi;
}

/* --- life -------------------------------------------------------------------------- */

int psnet_worker_new(uv_loop_t *loop, const PsnetWorkerOptions *opts, const PsnetWorkerEvents *events, void *ud,
                     PsnetWorker **ret) {
        if (!loop || !opts || !opts->coord || !events)
                return -EINVAL;
        PsnetWorker *w = ps_calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->loop = loop;
        w->opts = *opts;
        w->ev = *events;
        w->ud = ud;
        w->coord = ps_strdup(opts->coord);
        w->zctx = zmq_ctx_new();
        int r = !w->coord || !w->zctx ? -ENOMEM : 0;
        if (r == 0) {
                (void) zmq_ctx_set(w->zctx, ZMQ_IO_THREADS, 1);
                r = uv_timer_init(loop, &w->map_timer);
        }
        if (r == 0) {
                w->map_timer.data = w;
                w->map_timer_init = true;
                const SessionOps so = { .registered = on_registered, .failed = on_failed, .message = on_message,
                                        .heartbeat = on_heartbeat };
                r = follow_session(loop, w->zctx, w->coord, PSNET__ROLE__ROLE_WORKER, opts->keys_dir, opts->key_name,
                                   "worker", opts->coord_key_name, opts->connect_timeout_ms, &w->id, NULL, &so, w,
                                   &w->session);
        }
        if (r < 0) {
                psnet_worker_free(w);
                return r;
        }
        *ret = w;
        return 0;
}

static void map_timer_closed(uv_handle_t *h) {
        ps_free(h->data);
}

PsnetWorker *psnet_worker_free(PsnetWorker *w) {
        if (!w)
                return NULL;
        if (w->round_cb) {
                PsnetRoundFn cb = w->round_cb;
                w->round_cb = NULL;
                cb(w, -ECANCELED, w->round_ud);
        }
        if (w->rows_cb) {
                PsnetRowsFn cb = w->rows_cb;
                w->rows_cb = NULL;
                cb(w, -ECANCELED, w->rows_ud);
        }
        rows_free_args(w);
        w->client = client_free(w->client);
        psnet_memory_unref(w->mem);
        w->mem = NULL;
        w->session = session_free(w->session);
        follow_done(&w->fo);
        if (w->zctx)
                zmq_ctx_term(w->zctx);
        ps_free(w->coord);
        if (w->map_timer_init)
                uv_close((uv_handle_t *) &w->map_timer, map_timer_closed);
        else
                ps_free(w);
        return NULL;
}

/* --- rounds -------------------------------------------------------------------------- */

static void round_done(PsnetWorker *w, int r) {
        PsnetRoundFn cb = w->round_cb;
        w->round_cb = NULL;
        w->waiting_map = false;
        w->waiting_member = false;
        (void) uv_timer_stop(&w->map_timer);
        if (cb)
                cb(w, r, w->round_ud);
}

static void on_client_round(Client *c, int r, int64_t clock, void *ud);

/* The shards' client, connected under the newest map this worker has. */
static int client_ready(PsnetWorker *w) {
        bool fresh = !w->client;
        int r = client_follow(&w->client, w->loop, w->zctx, &w->fo.job, w->fo.map, session_id(w->session),
                              w->id.enabled ? &w->id.keys : NULL, NULL, w->members_epoch);
        if (r == 0 && fresh && w->mem)
                r = client_set_memory(w->client, &w->mem->m);
        return r;
}

int psnet_worker_memory(PsnetWorker *w, size_t nsets, float **ret) {
        if (!w || !ret || nsets < 2 || nsets > PSNET_MEMORY_MAX_SETS)
                return -EINVAL;
        if (client_shm_mode() != CLIENT_SHM_ON)
                return -ENOTSUP;
        if (!w->fo.has_job)
                return -EAGAIN;
        if (!w->mem) {
                char reason[256];
                size_t size = client_memory_size(&w->fo.job, nsets);
                PsnetMemory *m = ps_calloc(1, sizeof *m);
                if (!m)
                        return -ENOMEM;
                int r = shm_memory_new(&m->m, size, reason, sizeof reason);
                if (r < 0) {
                        ps_free(m);
                        return log_warning_errno(r, "No shared memory for the model's tensors (%s)", reason);
                }
                atomic_init(&m->refs, 1);
                if (w->client && (r = client_set_memory(w->client, &m->m)) < 0) {
                        psnet_memory_unref(m);
                        return r;
                }
                w->mem = m;
        } else if (client_memory_size(&w->fo.job, nsets) != w->mem->m.size)
                return -EEXIST;
        for (size_t k = 0; k < nsets; k++)
                for (uint32_t t = 0; t < w->fo.job.ntensors; t++)
                        ret[k * w->fo.job.ntensors + t] = client_memory_tensor(&w->fo.job, &w->mem->m, k, t);
        return 0;
}

PsnetMemory *psnet_worker_memory_ref(PsnetWorker *w) {
        if (!w || !w->mem)
                return NULL;
        atomic_fetch_add(&w->mem->refs, 1);
        return w->mem;
}

void psnet_memory_unref(PsnetMemory *m) {
        if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
                shm_memory_free(&m->m);
                ps_free(m);
        }
}

/* The round's time-out: --round-timeout, or what is left before
 * psnet_worker_stopping's deadline when shorter (at least 1 ms). */
static unsigned round_timeout(PsnetWorker *w) {
        return client_ms_until(w->loop, w->stop_deadline, w->opts.round_timeout_ms ? w->opts.round_timeout_ms : 120000);
}

void psnet_worker_stopping(PsnetWorker *w, unsigned ms) {
        if (!w)
                return;
        uint64_t d = uv_now(w->loop) + ms;
        if (!w->stop_deadline || d < w->stop_deadline)
                w->stop_deadline = d;
        if (w->client)
                client_cut_deadline(w->client, round_timeout(w));
}

/* (Re)starts the client's round under the newest map this worker has. */
static int round_start(PsnetWorker *w) {
        int r = client_ready(w);
        if (r < 0)
                return log_error_errno(r, "Failed to connect to the shards: %m");
        client_set_timeout(w->client, round_timeout(w));
        /* The job's progress at the pushed clock, for the shards' --lr-schedule:
         * the same on every member, as the schedule it comes from. */
        float progress = -1.0f;
        if (w->grads && w->total)
                progress = (float) MIN((double) schedule_samples_at(&w->sched, w->push_clock) / (double) w->total, 1.0);
        client_set_progress(w->client, progress);
        client_set_pull_f32(w->client, w->evaluating);
        return client_round(w->client, w->grads, w->push_clock, w->params, w->pull_clock, on_client_round, w);
}

/* The round or rows exchange waiting for a newer map (never both) ends. */
static void map_timer_cb(uv_timer_t *t) {
        PsnetWorker *w = t->data;
        log_error_errno(ETIMEDOUT, "no shard map epoch %lu from pscoord within %u s",
                        (unsigned long) client_need_epoch(w->client), PSNET_MAP_WAIT_MS / 1000);
        if (w->rows_cb)
                rows_done(w, -ETIMEDOUT);
        else
                round_done(w, -ETIMEDOUT);
}

/* The map a shard sent us to has arrived (or was here already): run the round again. */
static void round_resume(PsnetWorker *w) {
        if (!w->waiting_map || shardmap_epoch(w->fo.map) < client_need_epoch(w->client))
                return;
        w->waiting_map = false;
        (void) uv_timer_stop(&w->map_timer);
        int r = round_start(w);
        if (r < 0)
                round_done(w, r);
}

/* The round this worker had under way (or its next one) ends with -ESTALE:
 * the caller starts again from psnet_worker_start_clock. */
static void readmitted(PsnetWorker *w) {
        w->waiting_member = false;
        if (!w->round_cb) {
                w->readmitted = true;
                return;
        }
        (void) uv_timer_stop(&w->map_timer);
        if (w->client && client_busy(w->client))
                client_abort(w->client);
        round_done(w, -ESTALE);
}

static void member_timer_cb(uv_timer_t *t) {
        PsnetWorker *w = t->data;
        if (w->readmitted) { /* a round asked for after the admission */
                w->readmitted = false;
                round_done(w, -ESTALE);
                return;
        }
        log_error("not admitted again within %u s of leaving the membership", PSNET_MEMBER_WAIT_MS / 1000);
        w->waiting_member = false;
        round_done(w, -ETIMEDOUT);
}

static void on_client_round(Client *c, int r, int64_t clock, void *ud) {
        PsnetWorker *w = ud;
        if (r == -ESTALE) {
                /* No longer a member (its lease ran out): its session registers
                 * again and pscoord admits it at a boundary; wait for that. */
                log_warning("not a member any more (its lease ran out?): waiting to be admitted again");
                w->waiting_member = true;
                (void) uv_timer_start(&w->map_timer, member_timer_cb, PSNET_MEMBER_WAIT_MS, 0);
                return;
        }
        if (r == 0)
                w->round_clock = clock;
        if (r != -EAGAIN) {
                round_done(w, r);
                return;
        }
        /* A shard moved on to a newer map: wait for it from pscoord, then again. */
        w->waiting_map = true;
        if (shardmap_epoch(w->fo.map) >= client_need_epoch(c)) {
                round_resume(w);
                return;
        }
        (void) uv_timer_start(&w->map_timer, map_timer_cb, PSNET_MAP_WAIT_MS, 0);
}

int psnet_worker_round(PsnetWorker *w, const float *const *grads, int64_t push_clock, float *const *params,
                       int64_t pull_clock, PsnetRoundFn done, void *ud) {
        if (!w->fo.has_job || !params)
                return -EINVAL;
        if (w->round_cb)
                return -EBUSY;
        w->grads = grads;
        w->params = params;
        w->push_clock = push_clock;
        w->pull_clock = pull_clock;
        w->round_cb = done;
        w->round_ud = ud;
        if (w->readmitted) /* said from the loop, never inside this call */
                return uv_timer_start(&w->map_timer, member_timer_cb, 0, 0);
        int r = round_start(w);
        if (r < 0)
                w->round_cb = NULL;
        return r;
}

static void rows_done(PsnetWorker *w, int r) {
        PsnetRowsFn cb = w->rows_cb;
        w->rows_cb = NULL;
        w->rows_waiting_map = false;
        (void) uv_timer_stop(&w->map_timer);
        rows_free_args(w);
        if (cb)
                cb(w, r, w->rows_ud);
}

static void on_client_rows(Client *c, int r, void *ud) {
        PsnetWorker *w = ud;
        if (r != -EAGAIN) {
                rows_done(w, r);
                return;
        }
        /* A shard acts on a newer map (a fail-over): sent again under it
         * once it is here (rows_again). */
        w->rows_waiting_map = true;
        if (shardmap_epoch(w->fo.map) >= client_need_epoch(c)) {
                rows_again(w);
                return;
        }
        (void) uv_timer_start(&w->map_timer, map_timer_cb, PSNET_MAP_WAIT_MS, 0);
}

static int rows_send(PsnetWorker *w) {
        int r = client_ready(w);
        if (r < 0)
                return log_error_errno(r, "Failed to connect to the shards: %m");
        client_set_timeout(w->client, round_timeout(w));
        return client_rows_many(w->client, w->rows_tabs, w->rows_ntabs, w->rows_push, w->rows_clock, on_client_rows,
                                w);
}

/* A newer map is here while a rows exchange is under way (it may wait on
 * a shard that is gone) or waits for it: the exchange again, under it.
 * What a shard applied already is not applied again (docs/tables.md). */
static void rows_again(PsnetWorker *w) {
        if (!w->rows_cb || (w->rows_waiting_map && shardmap_epoch(w->fo.map) < client_need_epoch(w->client)))
                return;
        log_info("table rows sent again map_epoch=%lu table=%u tables=%zu clock=%ld",
                 (unsigned long) shardmap_epoch(w->fo.map), w->rows_tabs[0].table, w->rows_ntabs, (long) w->rows_clock);
        w->rows_waiting_map = false;
        (void) uv_timer_stop(&w->map_timer);
        if (w->client)
                client_abort(w->client);
        int r = rows_send(w);
        if (r < 0)
                rows_done(w, r);
}

int psnet_worker_rows_many(PsnetWorker *w, const PsnetRowsTable *tabs, size_t ntabs, bool push, int64_t clock,
                           PsnetRowsFn done, void *ud) {
        if (!w || !w->fo.has_job || !tabs || ntabs == 0 || ntabs > w->fo.job.ntables || !done)
                return -EINVAL;
        for (size_t k = 0; k < ntabs; k++)
                if (tabs[k].table >= w->fo.job.ntables || (push ? !tabs[k].grads : !tabs[k].out) ||
                    (tabs[k].n && !tabs[k].ids))
                        return -EINVAL;
        if (w->round_cb || w->rows_cb)
                return -EBUSY;
        int r = 0;
        w->rows_ntabs = 0;
        for (size_t k = 0; k < ntabs; k++) {
                size_t n = tabs[k].n, dim = w->fo.job.tables[tabs[k].table].dim;
                int64_t *ids = ps_malloc(MAX(n, (size_t) 1) * sizeof *ids);
                float *grads = push ? ps_malloc(MAX(n * dim, (size_t) 1) * sizeof *grads) : NULL;
                w->rows_tabs[w->rows_ntabs++] = (ClientRowsTable) { .table = (uint32_t) tabs[k].table, .ids = ids,
                                                                   .n = n, .grads = grads, .out = tabs[k].out };
                if (!ids || (push && !grads)) {
                        r = -ENOMEM;
                        break;
                }
                memcpy(ids, tabs[k].ids, n * sizeof *ids);
                if (push)
                        memcpy(grads, tabs[k].grads, n * dim * sizeof *grads);
        }
        w->rows_push = push;
        w->rows_clock = clock;
        w->rows_cb = done;
        w->rows_ud = ud;
        if (r == 0)
                r = rows_send(w);
        if (r < 0) {
                w->rows_cb = NULL;
                rows_free_args(w);
        }
        return r;
}

int psnet_worker_rows(PsnetWorker *w, size_t table, const int64_t *ids, size_t n, const float *grads, int64_t clock,
                      float *out, PsnetRowsFn done, void *ud) {
        if (!w || (!grads && !out))
                return -EINVAL;
        const PsnetRowsTable t = { .table = table, .ids = ids, .n = n, .grads = grads, .out = out };
        return psnet_worker_rows_many(w, &t, 1, grads != NULL, clock, done, ud);
}

void psnet_worker_rows_cache(const PsnetWorker *w, uint64_t *hits, uint64_t *misses, uint64_t *pulled_bytes) {
        const ClientStats *s = w->client ? client_stats(w->client) : NULL;
        *hits = s ? s->cache_hits : 0;
        *misses = s ? s->cache_misses : 0;
        *pulled_bytes = s ? s->bytes_pulled : 0;
}

size_t psnet_job_ntables(const PsnetWorker *w) { return w->fo.has_job ? w->fo.job.ntables : 0; }

const char *psnet_job_table_name(const PsnetWorker *w, size_t i) {
        return i < psnet_job_ntables(w) ? w->fo.job.tables[i].name : NULL;
}

uint32_t psnet_job_table_dim(const PsnetWorker *w, size_t i) {
        return i < psnet_job_ntables(w) ? w->fo.job.tables[i].dim : 0;
}

int psnet_worker_prefetch(PsnetWorker *w, float *const *params, int64_t pull_clock) {
        if (!w->fo.has_job || w->round_cb)
                return -EINVAL;
        int r = client_ready(w);
        if (r == 0)
                r = client_pull_begin(w->client, params, pull_clock);
        return r;
}

void psnet_worker_traffic(const PsnetWorker *w, uint64_t *pushed, uint64_t *pulled, uint64_t *rounds,
                          double *wait_s) {
        const ClientStats *s = w->client ? client_stats(w->client) : NULL;
        *pushed = s ? s->bytes_pushed : 0;
        *pulled = s ? s->bytes_pulled : 0;
        *rounds = s ? s->rounds : 0;
        *wait_s = s ? s->wait_s : 0;
}

void psnet_worker_progress(PsnetWorker *w, const PsnetProgress *p) {
        if (p->clock != w->progress.clock) {
                w->hb_loss_sum += p->loss;
                w->hb_loss_n++;
        }
        w->progress = *p;
}

int psnet_worker_evaluated(PsnetWorker *w, const PsnetEval *e) {
        if (!w || !e || e->epoch == 0 ||
            (w->nevals && e->epoch <= w->evals[(w->evals_end + PSNET_EVALS_KEPT - 1) % PSNET_EVALS_KEPT].epoch))
                return -EINVAL;
        w->evals[w->evals_end] = *e;
        w->evals_end = (w->evals_end + 1) % PSNET_EVALS_KEPT;
        w->nevals = MIN(w->nevals + 1, (size_t) PSNET_EVALS_KEPT);
        return 0;
}

/* --- the end ------------------------------------------------------------------------ */

static int result_send(PsnetWorker *w);

static void on_result_rep(Session *s, int r, WireMsg *m, void *ud) {
        PsnetWorker *w = ud;
        (void) s;
        /* No answer (pscoord down, or restarting for longer than the request's
         * deadline): the result is sent again, a few times; it is what lets
         * the job end, and pscoord counts it once (a repeated one is heard
         * as the same). */
        if (r == -ETIMEDOUT && ++w->result_tries < PSNET_RESULT_TRIES) {
                log_warning("pscoord did not answer the result within %u ms; sending it again (try %u of %u)",
                            PSNET_RESULT_TIMEOUT_MS, w->result_tries + 1, PSNET_RESULT_TRIES);
                int rs = result_send(w);
                if (rs == 0)
                        return;
                r = rs;
        }
        bool evaluate = r == 0 && m->hdr->result_rep->has_evaluate && m->hdr->result_rep->evaluate;
        /* The final weights come as f32 whichever way this worker was asked
         * (the last to finish, or taking over): under --wire bf16 a bf16 pull
         * would evaluate, and digest, rounded weights. */
        if (evaluate)
                w->evaluating = true;
        PsnetResultFn cb = w->result_cb;
        w->result_cb = NULL;
        if (cb)
                cb(w, r, evaluate, w->result_ud);
}

static int result_send(PsnetWorker *w) {
        Psnet__WorkerInfo wi;
        worker_info(w, &wi);
        wi.has_done = true;
        wi.done = true;
        wi.has_accuracy = w->result_has_accuracy;
        wi.accuracy = w->result_accuracy;
        /* The weights evaluated: the last round's. */
        return follow_result(w->session, &w->fo.job, &wi, w->params, PSNET_RESULT_TIMEOUT_MS, on_result_rep, w);
}

int psnet_worker_result(PsnetWorker *w, bool has_accuracy, float accuracy, PsnetResultFn done, void *ud) {
        if (w->result_cb)
                return -EBUSY;
        w->result_has_accuracy = has_accuracy;
        w->result_accuracy = accuracy;
        w->result_tries = 0;
        w->result_cb = done;
        w->result_ud = ud;
        int r = result_send(w);
        if (r < 0)
                w->result_cb = NULL;
        return r;
}

static void on_left(Session *s, int r, WireMsg *m, void *ud) {
        PsnetWorker *w = ud;
        (void) s, (void) m;
        if (r < 0)
                log_debug_errno(r, "pscoord did not answer the deregistration: %m");
        PsnetDoneFn cb = w->leave_cb;
        w->leave_cb = NULL;
        if (cb)
                cb(w, w->leave_ud);
}

int psnet_worker_leave_because(PsnetWorker *w, const char *reason, PsnetDoneFn done, void *ud) {
        w->leave_cb = done;
        w->leave_ud = ud;
        log_info("left the job");
        return session_deregister(w->session, reason, 1000, on_left, w);
}

int psnet_worker_leave(PsnetWorker *w, PsnetDoneFn done, void *ud) {
        return psnet_worker_leave_because(w, NULL, done, ud);
}

/* --- accessors ------------------------------------------------------------------------ */

const Job *psnet_worker_job(const PsnetWorker *w) { return w->fo.has_job ? &w->fo.job : NULL; }
const ShardMap *psnet_worker_map(const PsnetWorker *w) { return w->fo.map; }
int64_t psnet_worker_round_clock(const PsnetWorker *w) { return w->round_clock; }

uint64_t psnet_worker_stale_pushes(const PsnetWorker *w) {
        return w->client ? client_stats(w->client)->stale_pushes : 0;
}
size_t psnet_worker_shm_shards(const PsnetWorker *w) {
        return w->client ? (size_t) client_stats(w->client)->shm_shards : 0;
}
uint32_t psnet_worker_id(const PsnetWorker *w) { return session_id(w->session); }
uint32_t psnet_worker_rank(const PsnetWorker *w) { return w->rank; }

PsnetJobState psnet_worker_job_state(const PsnetWorker *w) { return follow_public_state(&w->fo); }
uint32_t psnet_worker_count(const PsnetWorker *w) { return w->nworkers; }
int64_t psnet_worker_start_clock(const PsnetWorker *w) { return w->start_clock; }
int64_t psnet_worker_base_clock(const PsnetWorker *w) { return w->sched.base_clock; }
const char *psnet_job_model(const PsnetWorker *w) { return w->fo.has_job ? w->fo.job.model : NULL; }
size_t psnet_job_ntensors(const PsnetWorker *w) { return w->fo.has_job ? w->fo.job.ntensors : 0; }
uint32_t psnet_job_batch(const PsnetWorker *w) { return w->fo.job.batch; }
uint32_t psnet_job_epochs(const PsnetWorker *w) { return w->fo.job.epochs; }
const char *psnet_job_dataset(const PsnetWorker *w) { return w->fo.has_job ? w->fo.job.dataset : NULL; }
uint64_t psnet_job_samples_at(const PsnetWorker *w, int64_t clock) { return schedule_samples_at(&w->sched, clock); }
int64_t psnet_job_end_clock(PsnetWorker *w, uint64_t total) {
        w->total = total;
        return schedule_end_clock(&w->sched, total);
}

int psnet_job_model_json(const PsnetWorker *w, char *buf, size_t n) { return follow_model_json(&w->fo, buf, n); }

const char *psnet_job_tensor_name(const PsnetWorker *w, size_t t) {
        return w->fo.has_job && t < w->fo.job.ntensors ? w->fo.job.tensors[t].name : NULL;
}

uint64_t psnet_job_tensor_numel(const PsnetWorker *w, size_t t) {
        return w->fo.has_job && t < w->fo.job.ntensors ? w->fo.job.tensors[t].numel : 0;
}
