/* SPDX-License-Identifier: Apache-2.0 */
/* libpsnet's federated edge client (psnet.h, "Federated edge clients"): an
 * edge worker's pscoord session (role edge), the federated job and its shard
 * map as pscoord publishes them (psnet-follow.c), the rounds pscoord asks
 * for, and the way of an update to the shards:
 *
 *   HELD (the caller writes it) --push--> PREPARING (norm, clip, encode: the
 *   thread pool, edge-update.c) --> [--secagg: WAIT_PEERS until stage 3 of
 *   its round --> MASKING (the thread pool)] --> PUSHING (to every shard)
 *   --> ANSWERING (pscoord counts it, or not) --> NONE: done
 *
 * With --secagg this client also answers pscoord's key, share and unmask
 * exchanges (edge-secagg.c) whatever the caller is doing; the keys of a
 * round that asks before the caller said its example count wait for it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>
#include "alloc.h"
#include "client.h"
#include "edge-secagg.h"
#include "edge-update.h"
#include "keys.h"
#include "log.h"
#include "psnet-follow.h"
#include "psnet-internal.h"
#include "session.h"
#include "wire-job.h"

/* The ZeroMQ context and the key of a process's clients (PsnetEdgeOptions.share). */
typedef struct EdgeShared {
        void *zctx;
        NetIdentity id;
        unsigned refs;
} EdgeShared;

typedef enum { U_NONE, U_HELD, U_PREPARING, U_WAIT_PEERS, U_MASKING, U_PUSHING, U_ANSWERING } UpdateState;

struct PsnetEdge {
        uv_loop_t *loop;
        EdgeShared *sh;
        NetMux *mux;                    /* PsnetEdgeOptions.gateway: the one connection */
        Session *session;
        Client *client;
        char *coord;
        unsigned round_timeout_ms;
        PsnetEdgeEvents ev;
        void *ud;
        Follow fo;
        bool refused;                   /* the job is not one for an edge client: nothing more is taken */
        bool ended;                     /* the end event was given */
        bool leaving;
        bool strategy;                  /* PsnetEdgeOptions.strategy: the job's strategy process */
        /* a strategy: the updates of the round it was asked to aggregate last */
        uint64_t agg_number;
        uint32_t *agg_clients;
        uint64_t *agg_examples;
        float *agg_losses;
        size_t nagg;
        uint64_t stop_deadline;         /* psnet_edge_abandon's (uv_now; 0: none): requests end by it */
        uint64_t latest;                /* the newest round pscoord sampled this client to train for */
        uint64_t examples;              /* psnet_edge_set_examples */
        /* the pull */
        PsnetEdgePullFn pull_cb;
        void *pull_ud;
        float *const *params;           /* the last pull's, digested by a final report */
        int64_t pulled_rounds;
        /* the update */
        EdgeUpdate upd;
        UpdateState us;
        bool drop;                      /* dropped while in the thread pool: -ECANCELED once back */
        uint64_t unumber, uexamples;
        float uloss;
        PsnetEdgePushFn push_cb;
        void *push_ud;
        PsnetEdgePushInfo info;
        uv_work_t work;
        bool working, zombie;           /* zombie: freed while working, the work's end frees it */
        int work_r;
        /* a report, the leave */
        PsnetEdgeDoneFn report_cb, leave_cb;
        void *report_ud, *leave_ud;
        /* --secagg */
        EdgeSecAgg sa;
        uint64_t sa_keys_due;           /* a round whose keys wait for the example count */
        float sa_keys_clip;
};

/* Log lines name the client they are about (many share one loop). */
static void edge_fields(const PsnetEdge *e) {
        char f[32] = "";
        uint32_t id = e->session ? session_id(e->session) : 0;
        if (id)
                snprintf(f, sizeof f, "edge=%u", id);
        log_set_fields(f);
}

/* --- the shared context ------------------------------------------------------------- */

static EdgeShared *shared_new(const PsnetEdgeOptions *o) {
        EdgeShared *sh = ps_calloc(1, sizeof *sh);
        if (!sh)
                return NULL;
        sh->refs = 1;
        sh->zctx = zmq_ctx_new();
        if (!sh->zctx) {
                ps_free(sh);
                return NULL;
        }
        (void) zmq_ctx_set(sh->zctx, ZMQ_IO_THREADS, 1);
        if (o->clients > 256)
                (void) zmq_ctx_set(sh->zctx, ZMQ_MAX_SOCKETS, (int) MIN((uint64_t) o->clients * 4 + 64, 1u << 20));
        return sh;
}

static void shared_unref(EdgeShared *sh) {
        if (!sh || --sh->refs > 0)
                return;
        zmq_ctx_term(sh->zctx);
        sodium_memzero(&sh->id, sizeof sh->id);
        ps_free(sh);
}

/* --- the update --------------------------------------------------------------------- */

static const Job *job(const PsnetEdge *e) {
        return &e->fo.job;
}

static void update_release(PsnetEdge *e) {
        edge_update_release(&e->upd, job(e));
        e->us = U_NONE;
}

/* The push ends: its buffers go, and done hears r. */
static void push_end(PsnetEdge *e, int r) {
        PsnetEdgePushFn cb = e->push_cb;
        void *ud = e->push_ud;
        update_release(e);
        e->push_cb = NULL;
        if (cb)
                cb(e, r, &e->info, ud);
}

static void edge_destroy(PsnetEdge *e);

static int work_start(PsnetEdge *e, uv_work_cb work, uv_after_work_cb after) {
        e->work.data = e;
        int r = uv_queue_work(e->loop, &e->work, work, after);
        e->working = r == 0;
        return r;
}

/* Back from the thread pool: the status, or 1 when e was freed meanwhile. */
static int work_back(PsnetEdge *e, int status) {
        e->working = false;
        if (e->zombie) {
                edge_destroy(e);
                return 1;
        }
        edge_fields(e);
        return status < 0 ? status : e->work_r;
}

static void on_answer(Session *s, int r, WireMsg *m, void *ud) {
        PsnetEdge *e = ud;
        (void) s;
        edge_fields(e);
        if (r < 0 && m && m->hdr && m->hdr->status == PSNET__STATUS__STATUS_STALE) {
                snprintf(e->info.reason, sizeof e->info.reason, "%s", m->hdr->reason ? m->hdr->reason : "late");
                r = -ESTALE;
        } else if (r < 0)
                snprintf(e->info.reason, sizeof e->info.reason, "%s", follow_reason(m, r));
        push_end(e, r);
}

/* rd to pscoord (an update's answer, a secure aggregation stage, a test's
 * accuracy); cb gets pscoord's reply. */
static int round_answer(PsnetEdge *e, Psnet__Round *rd, unsigned timeout_ms, SessionReplyFn cb) {
        timeout_ms = client_ms_until(e->loop, e->stop_deadline, timeout_ms);
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROUND_REP);
        h.body_case = PSNET__HEADER__BODY_ROUND;
        h.round = rd;
        return session_request(e->session, &h, PSNET__MSG_TYPE__MSG_JOB_REP, timeout_ms, cb, e);
}

static void on_pushed(Client *c, int r, int64_t clock, void *ud) {
        PsnetEdge *e = ud;
        (void) c, (void) clock;
        edge_fields(e);
        if (r == 0 || r == -ESTALE) {
                e->info.bytes = e->upd.bytes;
                e->info.bytes_raw = job_nfloats(job(e)) * sizeof(float);
        }
        edge_update_release(&e->upd, job(e)); /* on every shard (or refused): not needed any more */
        if (r == -ESTALE)
                /* A shard closed the round first: pscoord says so too (and counts it late). */
                log_warning("round %lu closed before the update reached every shard", (unsigned long) e->unumber);
        else if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->unumber);
                push_end(e, r);
                return;
        }
        e->us = U_ANSWERING;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = e->unumber;
        rd.has_examples = rd.has_loss = rd.has_bytes = true;
        rd.bytes = e->info.bytes;
        rd.examples = e->uexamples;
        rd.loss = e->uloss;
        r = round_answer(e, &rd, 10000, on_answer);
        if (r < 0) {
                log_warning_errno(r, "Failed to answer round %lu: %m", (unsigned long) e->unumber);
                push_end(e, r);
        }
}

/* ClientFrameFn: each key's frame out of the update's block. */
static void update_frame(void *ud, uint32_t tensor, uint32_t chunk, const void **ret_data, size_t *ret_size,
                         zmq_free_fn **ret_free, void **ret_hint) {
        PsnetEdge *e = ud;
        edge_update_frame(&e->upd, job(e), tensor, chunk, ret_data, ret_size, ret_free, ret_hint);
}

/* The shards' client, under the newest map this client has. Not a member of
 * any membership: no membership epoch on its requests. */
static int client_ready(PsnetEdge *e) {
        int r = client_follow(&e->client, e->loop, e->sh->zctx, job(e), e->fo.map, session_id(e->session),
                              e->sh->id.enabled ? &e->sh->id.keys : NULL, e->mux, 0);
        if (r == 0)
                client_set_timeout(e->client, client_ms_until(e->loop, e->stop_deadline, e->round_timeout_ms));
        return r;
}

static void update_send(PsnetEdge *e) {
        const Job *jb = job(e);
        e->us = U_PUSHING;
        int r = client_ready(e);
        if (r == 0) {
                int codec = jb->fed.secagg ? PSNET__CODEC__CODEC_MASKED
                            : jb->fed.compress != COMPRESS_NONE
                                    ? PSNET__CODEC__CODEC_BF16 + (int) jb->fed.compress - COMPRESS_BF16
                                    : PSNET__CODEC__CODEC_RAW;
                client_set_examples(e->client, e->uexamples);
                client_set_masked(e->client, jb->fed.secagg);
                /* A strategy's delta goes as f32 (no --compress), from the buffers. */
                client_set_frames(e->client, e->strategy ? PSNET__CODEC__CODEC_RAW : codec,
                                  e->strategy ? NULL : update_frame, e);
                client_set_strategy_delta(e->client, e->strategy);
                r = client_round(e->client, (const float *const *) e->upd.t, (int64_t) e->unumber, NULL, 0, on_pushed,
                                 e);
        }
        if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->unumber);
                push_end(e, r);
        }
}

static void mask_work(uv_work_t *req) {
        PsnetEdge *e = req->data;
        for (uint32_t t = 0; t < job(e)->ntensors; t++)
                edge_secagg_mask(&e->sa, t, e->upd.t[t], (uint32_t *) e->upd.t[t], job(e)->tensors[t].numel);
        e->work_r = 0;
}

static void mask_done(uv_work_t *req, int status) {
        PsnetEdge *e = req->data;
        int r = work_back(e, status);
        if (r == 1)
                return;
        if (e->drop || e->leaving) {
                push_end(e, -ECANCELED);
                return;
        }
        if (r < 0) {
                log_warning("Failed to mask the update of round %lu: %s", (unsigned long) e->unumber, uv_strerror(r));
                push_end(e, r);
                return;
        }
        update_send(e);
}

static void mask_start(PsnetEdge *e) {
        e->us = U_MASKING;
        int r = work_start(e, mask_work, mask_done);
        if (r < 0) {
                log_warning("Failed to start masking: %s", uv_strerror(r));
                push_end(e, r);
        }
}

static void prepare_work(uv_work_t *req) {
        PsnetEdge *e = req->data;
        e->work_r = edge_update_prepare(&e->upd, job(e));
}

static void prepare_done(uv_work_t *req, int status) {
        PsnetEdge *e = req->data;
        int r = work_back(e, status);
        if (r == 1)
                return;
        e->info.norm = e->upd.norm;
        e->info.clipped = e->upd.clipped;
        if (e->drop || e->leaving) {
                push_end(e, -ECANCELED);
                return;
        }
        if (r < 0) {
                if (r == -ERANGE)
                        log_warning("the update of round %lu holds NaN or infinity: not sent",
                                    (unsigned long) e->unumber);
                else
                        log_warning_errno(r, "Failed to ready the update of round %lu: %m", (unsigned long) e->unumber);
                push_end(e, r);
                return;
        }
        if (!job(e)->fed.secagg) {
                update_send(e);
                return;
        }
        /* Masked with the pairwise seeds of the round's peers (stage 3). */
        e->us = U_WAIT_PEERS;
        if (e->sa.number == e->unumber && e->sa.stage == 3)
                mask_start(e);
        else
                log_info("trained number=%lu: waiting for the round's peers to mask", (unsigned long) e->unumber);
}

/* A --secagg update that waits for peers that will not come (its round went
 * on without it, the job ended): dropped now, or when back from the pool. */
static void sa_abandon(PsnetEdge *e) {
        if (!e->fo.has_job || !job(e)->fed.secagg)
                return;
        if (e->us == U_PREPARING || e->us == U_MASKING) {
                e->drop = true;
                return;
        }
        if (e->us != U_WAIT_PEERS)
                return;
        log_info("update of round %lu dropped: its round went on without it", (unsigned long) e->unumber);
        push_end(e, -ECANCELED);
}

int psnet_edge_update(PsnetEdge *e, float *const **ret) {
        if (!e || !ret)
                return -EINVAL;
        if (!e->fo.has_job || e->refused)
                return -EAGAIN;
        if (e->us > U_HELD)
                return -EBUSY;
        int r = edge_update_alloc(&e->upd, job(e));
        if (r < 0)
                return r;
        e->us = U_HELD;
        *ret = e->upd.t;
        return 0;
}

int psnet_edge_push(PsnetEdge *e, uint64_t number, uint64_t examples, float loss, PsnetEdgePushFn done, void *ud) {
        if (!e || e->us == U_NONE)
                return -EINVAL;
        if (e->us != U_HELD)
                return -EBUSY;
        if (job(e)->fed.secagg && e->latest > number) {
                /* Sampled again while it trained (stopped, slow): its round went
                 * on without it, and no peer will mask with it any more. */
                log_info("update of round %lu dropped: round %lu has started", (unsigned long) number,
                         (unsigned long) e->latest);
                update_release(e);
                return -ESTALE;
        }
        e->unumber = number;
        e->uexamples = examples;
        e->uloss = loss;
        e->push_cb = done;
        e->push_ud = ud;
        e->drop = false;
        memset(&e->info, 0, sizeof e->info);
        if (e->strategy) {
                /* The round's delta: no clip, no codec; finite, or nothing goes. */
                for (uint32_t t = 0; t < job(e)->ntensors; t++)
                        for (uint64_t i = 0; i < job(e)->tensors[t].numel; i++)
                                if (!isfinite(e->upd.t[t][i])) {
                                        e->push_cb = NULL;
                                        return -ERANGE;
                                }
                update_send(e);
                return 0;
        }
        e->us = U_PREPARING;
        int r = work_start(e, prepare_work, prepare_done);
        if (r < 0) {
                e->us = U_HELD;
                e->push_cb = NULL;
                return r;
        }
        return 0;
}

/* --- pulls and reports --------------------------------------------------------------- */

static void on_pulled(Client *c, int r, int64_t clock, void *ud) {
        PsnetEdge *e = ud;
        (void) c;
        edge_fields(e);
        PsnetEdgePullFn cb = e->pull_cb;
        e->pull_cb = NULL;
        if (r == 0)
                e->pulled_rounds = clock;
        if (cb)
                cb(e, r, clock, e->pull_ud);
}

/* Ends the pull in flight now with r, not at its time-out (the client free again). */
static void pull_give_up(PsnetEdge *e, int r) {
        if (!e->pull_cb)
                return;
        client_abort(e->client);
        on_pulled(e->client, r, 0, e);
}

void psnet_edge_abandon(PsnetEdge *e) {
        if (!e)
                return;
        sa_abandon(e);
        /* A caller that stops has no use for the model: a pull from a shard
         * that stopped too would hold it until the round's time-out. */
        pull_give_up(e, -ECANCELED);
        /* An update on its way, or sent once its training ends, may still
         * count: a few seconds for it, not the round's time-out. */
        if (!e->stop_deadline)
                e->stop_deadline = uv_now(e->loop) + PSNET_STOP_GRACE_MS;
        if (e->client)
                client_cut_deadline(e->client, client_ms_until(e->loop, e->stop_deadline, PSNET_STOP_GRACE_MS));
        if (e->us == U_PUSHING)
                log_info("stopping: the update of round %lu has %u s left to be counted", (unsigned long) e->unumber,
                         PSNET_STOP_GRACE_MS / 1000);
}

static int pull_start(PsnetEdge *e, uint64_t number, uint32_t update_of, float *const *params, PsnetEdgePullFn done,
                      void *ud) {
        if (!e || !params)
                return -EINVAL;
        if (!e->fo.has_job || e->refused)
                return -EAGAIN;
        if (e->pull_cb || (e->client && client_busy(e->client)))
                return -EBUSY;
        int r = client_ready(e);
        if (r < 0)
                return r;
        client_set_update_of(e->client, update_of);
        e->pull_cb = done;
        e->pull_ud = ud;
        e->params = params;
        r = client_round(e->client, NULL, 0, params, (int64_t) number, on_pulled, e);
        if (r < 0)
                e->pull_cb = NULL;
        return r;
}

int psnet_edge_pull(PsnetEdge *e, uint64_t number, float *const *params, PsnetEdgePullFn done, void *ud) {
        return pull_start(e, number, 0, params, done, ud);
}

int psnet_edge_pull_update(PsnetEdge *e, uint64_t number, uint32_t client, float *const *params,
                           PsnetEdgePullFn done, void *ud) {
        if (!e || !e->strategy || client == 0)
                return -EINVAL;
        return pull_start(e, number, client, params, done, ud);
}

int psnet_edge_round_update(const PsnetEdge *e, uint64_t number, size_t i, uint32_t *client, uint64_t *examples,
                            float *loss) {
        if (!e)
                return -EINVAL;
        if (!e->agg_number || number != e->agg_number)
                return -ESTALE;
        if (i >= e->nagg)
                return -ENOENT;
        if (client)
                *client = e->agg_clients[i];
        if (examples)
                *examples = e->agg_examples[i];
        if (loss)
                *loss = e->agg_losses[i];
        return 0;
}

static void agg_clear(PsnetEdge *e) {
        e->agg_clients = mfree(e->agg_clients);
        e->agg_examples = mfree(e->agg_examples);
        e->agg_losses = mfree(e->agg_losses);
        e->nagg = 0;
        e->agg_number = 0;
}

/* A strategy is asked to aggregate a round: its updates, kept for
 * psnet_edge_round_update. false: not such a request (or unusable). */
static bool agg_take(PsnetEdge *e, const Psnet__Round *rd) {
        agg_clear(e);
        size_t n = rd->n_clients;
        if (rd->n_client_examples != n || rd->n_client_losses != n) {
                log_warning("pscoord asked to aggregate round %lu with %zu clients, %zu example counts and %zu "
                            "losses; ignored", (unsigned long) rd->number, n, rd->n_client_examples,
                            rd->n_client_losses);
                return false;
        }
        e->agg_clients = ps_malloc(MAX(n, (size_t) 1) * sizeof *e->agg_clients);
        e->agg_examples = ps_malloc(MAX(n, (size_t) 1) * sizeof *e->agg_examples);
        e->agg_losses = ps_malloc(MAX(n, (size_t) 1) * sizeof *e->agg_losses);
        if (!e->agg_clients || !e->agg_examples || !e->agg_losses) {
                agg_clear(e);
                log_warning("out of memory taking round %lu's updates to aggregate", (unsigned long) rd->number);
                return false;
        }
        memcpy(e->agg_clients, rd->clients, n * sizeof *e->agg_clients);
        memcpy(e->agg_examples, rd->client_examples, n * sizeof *e->agg_examples);
        memcpy(e->agg_losses, rd->client_losses, n * sizeof *e->agg_losses);
        e->nagg = n;
        e->agg_number = rd->number;
        return true;
}

static void on_reported(Session *s, int r, WireMsg *m, void *ud) {
        PsnetEdge *e = ud;
        (void) s;
        edge_fields(e);
        if (r < 0)
                log_warning("pscoord did not take the answer reason=\"%s\"", follow_reason(m, r));
        PsnetEdgeDoneFn cb = e->report_cb;
        e->report_cb = NULL;
        if (cb)
                cb(e, r, e->report_ud);
}

/* a to pscoord as a report (one at a time: report_cb), done with its answer. */
static int report_answer(PsnetEdge *e, Psnet__Round *a, PsnetEdgeDoneFn done, void *ud) {
        int r = round_answer(e, a, 5000, on_reported);
        if (r == 0) {
                e->report_cb = done;
                e->report_ud = ud;
        }
        return r;
}

/* A test of a round's model (--eval-every; with examples, a federated
 * evaluation on the client's own data): the accuracy of the model after the
 * rounds the pull found in it. */
static int test_answer(PsnetEdge *e, const PsnetEdgeRound *rd, float accuracy, float loss, uint64_t examples,
                       PsnetEdgeDoneFn done, void *ud) {
        Psnet__Round a = PSNET__ROUND__INIT;
        a.number = rd->number;
        a.has_evaluate = a.evaluate = a.has_round = a.has_accuracy = a.has_loss = true;
        a.round = (uint32_t) MAX(e->pulled_rounds, (int64_t) 0);
        a.accuracy = accuracy;
        a.loss = loss;
        a.has_local = a.local = a.has_examples = examples > 0;
        a.examples = examples;
        return report_answer(e, &a, done, ud);
}

int psnet_edge_report(PsnetEdge *e, const PsnetEdgeRound *rd, float accuracy, float loss, PsnetEdgeDoneFn done,
                      void *ud) {
        if (!e || !rd || !rd->evaluate || rd->local)
                return -EINVAL;
        if (e->report_cb)
                return -EBUSY;
        if (rd->round)
                return test_answer(e, rd, accuracy, loss, 0, done, ud);
        /* The final model's: the job's result. */
        Psnet__WorkerInfo wi = PSNET__WORKER_INFO__INIT;
        wi.id = session_id(e->session);
        wi.has_accuracy = wi.has_done = wi.done = true;
        wi.accuracy = accuracy;
        int r = follow_result(e->session, job(e), &wi, e->params, 5000, on_reported, e);
        if (r == 0) {
                e->report_cb = done;
                e->report_ud = ud;
        }
        return r;
}

int psnet_edge_report_local(PsnetEdge *e, const PsnetEdgeRound *rd, float accuracy, float loss, uint64_t examples,
                            PsnetEdgeDoneFn done, void *ud) {
        if (!e || !rd || !rd->evaluate || !rd->local || examples == 0)
                return -EINVAL;
        if (e->report_cb)
                return -EBUSY;
        return test_answer(e, rd, accuracy, loss, examples, done, ud);
}

int psnet_edge_decline(PsnetEdge *e, uint64_t number, const char *reason, PsnetEdgeDoneFn done, void *ud) {
        if (!e || !number || !reason || !reason[0])
                return -EINVAL;
        if (e->report_cb)
                return -EBUSY;
        if (!psnet_edge_job(e))
                return -ENOENT;
        edge_fields(e);
        log_warning("declining round %lu reason=\"%s\"", (unsigned long) number, reason);
        char why[256];
        snprintf(why, sizeof why, "%s", reason); /* the wire carries at most this much of it */
        Psnet__Round a = PSNET__ROUND__INIT;
        a.number = number;
        a.decline = why;
        return report_answer(e, &a, done, ud);
}

/* --- secure aggregation (--secagg) ----------------------------------------------------- */

static void on_sa_answer(Session *s, int r, WireMsg *m, void *ud) {
        PsnetEdge *e = ud;
        (void) s;
        edge_fields(e);
        if (r < 0)
                log_warning("pscoord did not take this client's secure aggregation answer reason=\"%s\"",
                            follow_reason(m, r));
}

static void sa_send(PsnetEdge *e, EdgeSecAggOut *o) {
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = e->sa.number;
        rd.secagg = &o->sa;
        int r = round_answer(e, &rd, 10000, on_sa_answer);
        if (r < 0)
                log_warning_errno(r, "Failed to send secure aggregation stage %u: %m", o->sa.stage);
        edge_secagg_out_free(o);
}

/* Stages 1 to 4 from pscoord (edge-secagg.h). false: the round goes on to
 * the caller (stage 1, keys sent or waiting for the example count); true:
 * done here. */
static bool sa_round(PsnetEdge *e, const Psnet__Round *rd) {
        const Psnet__SecAgg *in = rd->secagg;
        EdgeSecAggOut o;
        memset(&o, 0, sizeof o);
        char err[160] = "";
        int r = 0;
        uint32_t stage = in->has_stage ? in->stage : 0;
        if (stage == 1) {
                if (e->us == U_WAIT_PEERS && e->unumber != rd->number)
                        sa_abandon(e);
                if (e->examples == 0) {
                        /* The data is not there yet: the keys go once it is (psnet_edge_set_examples). */
                        e->sa_keys_due = rd->number;
                        e->sa_keys_clip = in->has_clip ? in->clip : 0;
                        return false;
                }
                r = edge_secagg_keys(&e->sa, rd->number, session_id(e->session), in, e->examples,
                                     job(e)->fed.strategy.dp_clip > 0, &o);
                if (r == 0)
                        sa_send(e, &o);
                else
                        log_warning("round %lu: cannot take part in secure aggregation (%s)", (unsigned long) rd->number,
                                    strerror(-r));
                return r < 0; /* with keys sent, it trains */
        }
        if (stage == 2) {
                r = edge_secagg_shares(&e->sa, rd->number, in, &o, err, sizeof err);
                if (r == 0)
                        sa_send(e, &o);
        } else if (stage == 3) {
                r = edge_secagg_peers(&e->sa, rd->number, in, err, sizeof err);
                if (r == 0) {
                        log_info("secure aggregation peers number=%lu peers=%zu threshold=%u", (unsigned long) rd->number,
                                 e->sa.n2, e->sa.t);
                        if (e->us == U_WAIT_PEERS && e->unumber == rd->number)
                                mask_start(e);
                }
        } else if (stage == 4) {
                r = edge_secagg_reveal(&e->sa, rd->number, in, &o, err, sizeof err);
                if (r == 0) {
                        log_info("secure aggregation revealed number=%lu survivors=%zu", (unsigned long) rd->number,
                                 in->n_survivors);
                        sa_send(e, &o);
                        edge_secagg_clear(&e->sa);
                }
        } else {
                r = -EINVAL;
                snprintf(err, sizeof err, "unknown stage %u", stage);
        }
        if (r < 0) {
                edge_secagg_out_free(&o);
                log_warning("secure aggregation stage %u of round %lu refused reason=\"%s\"", stage,
                            (unsigned long) rd->number, err[0] ? err : strerror(-r));
        }
        return true;
}

void psnet_edge_set_examples(PsnetEdge *e, uint64_t examples) {
        e->examples = examples;
        if (!e->sa_keys_due || examples == 0)
                return;
        /* The keys of a round that asked for them before the data was there. */
        Psnet__SecAgg in = PSNET__SEC_AGG__INIT;
        Psnet__Round rd = PSNET__ROUND__INIT;
        in.has_stage = in.has_clip = true;
        in.stage = 1;
        in.clip = e->sa_keys_clip;
        rd.number = e->sa_keys_due;
        rd.secagg = &in;
        e->sa_keys_due = 0;
        if (sa_round(e, &rd))
                log_warning("round %lu: no keys sent, it trains without taking part", (unsigned long) rd.number);
}

/* --- pscoord ------------------------------------------------------------------------ */

static void tell_failed(PsnetEdge *e, int err, const char *reason) {
        log_error("cannot join reason=\"%s\"", reason);
        if (e->ev.failed)
                e->ev.failed(e, err, reason, e->ud);
}

static void apply_config(PsnetEdge *e, const Psnet__Config *ctl) {
        char why[192];
        if (e->refused)
                return;
        int r = follow_job(&e->fo, ctl);
        if (r < 0) {
                e->refused = true;
                tell_failed(e, -EPROTO, "pscoord sent a job or shard map that does not validate");
                return;
        }
        if (r > 0) {
                const Job *jb = job(e);
                if (jb->mode != MODE_FED) {
                        snprintf(why, sizeof why, "job %u is not federated (mode fed): an edge worker has nothing to do in it",
                                 jb->id);
                        e->refused = true;
                        follow_done(&e->fo);
                        tell_failed(e, -EINVAL, why);
                        return;
                }
                log_info("federated job job=%u model=%s strategy=%s local_epochs=%u batch=%u lr=%g prox_mu=%g", jb->id,
                         jb->model_name, fed_strategy_name(jb->fed.strategy.kind), jb->fed.local_epochs, jb->batch,
                         (double) jb->optim.lr, (double) jb->fed.prox_mu);
                if (e->ev.job)
                        e->ev.job(e, e->ud);
        } else
                (void) follow_map(&e->fo, ctl);
        if (follow_state(&e->fo, ctl) && e->fo.has_job && follow_ended(&e->fo) && !e->ended) {
                log_info("the job is %s", job_state_name(e->fo.state));
                e->ended = true;
                sa_abandon(e);
                if (e->ev.end)
                        e->ev.end(e, follow_public_state(&e->fo), e->ud);
        }
}

static void on_round(PsnetEdge *e, const Psnet__Round *rd) {
        if (!e->fo.has_job || e->refused) {
                log_warning("pscoord sent a round before the job; ignored");
                return;
        }
        if (rd->secagg && sa_round(e, rd))
                return;
        bool agg = rd->has_aggregate && rd->aggregate;
        if (agg != e->strategy) {
                log_warning("pscoord sent %s; ignored", agg ? "a strategy's request to a client" :
                            "a client's request to the strategy");
                return;
        }
        if (agg && !agg_take(e, rd))
                return;
        PsnetEdgeRound r = {
                .aggregate = agg, .nupdates = agg ? (uint32_t) e->nagg : 0,
                .number = rd->number, .round = rd->has_round ? rd->round : 0,
                .evaluate = rd->has_evaluate && rd->evaluate, .timeout_ms = rd->has_timeout_ms ? rd->timeout_ms : 0,
                .local = rd->has_evaluate && rd->evaluate && rd->has_local && rd->local,
        };
        if (r.evaluate) {
                sa_abandon(e);
                if (r.local)
                        log_info("pscoord asks this client to test the model of round %u on its own data", r.round);
                else if (r.round)
                        log_info("pscoord asks this edge worker to test the model of round %u", r.round);
                else
                        log_info("pscoord asks this edge worker to evaluate the final model");
        } else if (agg) {
                log_info("aggregate number=%lu round=%u updates=%u timeout_ms=%u", (unsigned long) r.number, r.round,
                         r.nupdates, r.timeout_ms);
        } else {
                log_info("sampled number=%lu round=%u timeout_ms=%u", (unsigned long) r.number, r.round, r.timeout_ms);
                e->latest = MAX(e->latest, r.number);
        }
        if (e->ev.round)
                e->ev.round(e, &r, e->ud);
}

static void on_message(Session *s, WireMsg *m, void *ud) {
        PsnetEdge *e = ud;
        (void) s;
        edge_fields(e);
        if (m->hdr->type == PSNET__MSG_TYPE__MSG_CONFIG)
                apply_config(e, m->hdr->config);
        else if (m->hdr->type == PSNET__MSG_TYPE__MSG_ROUND)
                on_round(e, m->hdr->round);
        else
                log_debug("ignoring message from pscoord type=%s", wire_type_name(m->hdr->type));
}

static void on_registered(Session *s, bool again, void *ud) {
        PsnetEdge *e = ud;
        edge_fields(e);
        log_info("registered%s coord=%s", again ? " again" : "", session_endpoint(s));
        if (again && e->mux && e->client && client_busy(e->client)) {
                /* Through psgate the session registers again when its
                 * connection moved (psgate restarted, or another one took
                 * it): what the shards were asked on the old one went with
                 * it. The pull or push in flight ends now, not at its
                 * time-out, and the next round finds the client free. */
                log_warning("the connection through psgate moved: the %s in flight is given up",
                            e->pull_cb ? "pull" : "push");
                if (e->pull_cb) {
                        pull_give_up(e, -ECONNRESET);
                } else if (e->us == U_PUSHING) {
                        client_abort(e->client);
                        on_pushed(e->client, -ECONNRESET, 0, e);
                }
        }
        if (e->ev.registered)
                e->ev.registered(e, again, e->ud);
}

static void on_failed(Session *s, int err, const char *reason, void *ud) {
        PsnetEdge *e = ud;
        (void) s;
        edge_fields(e);
        tell_failed(e, err, reason);
}

/* --- life -------------------------------------------------------------------------- */

int psnet_edge_new(uv_loop_t *loop, const PsnetEdgeOptions *opts, const PsnetEdgeEvents *events, void *ud,
                   PsnetEdge **ret) {
        if (!loop || !opts || (!opts->coord && !opts->gateway) || !events || !ret)
                return -EINVAL;
        PsnetEdge *e = ps_calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        e->loop = loop;
        e->ev = *events;
        e->ud = ud;
        e->round_timeout_ms = opts->round_timeout_ms ? opts->round_timeout_ms : 120000;
        e->strategy = opts->strategy;
        e->coord = ps_strdup(opts->coord ? opts->coord : opts->gateway);
        int r = e->coord ? 0 : -ENOMEM;
        if (r == 0 && opts->share) {
                e->sh = opts->share->sh;
                e->sh->refs++;
        } else if (r == 0) {
                e->sh = shared_new(opts);
                r = e->sh ? 0 : -ENOMEM;
        }
        /* The keys are loaded once, by the client that made the shared
         * context; the server key is psgate's when it goes through one. */
        if (r == 0 && !opts->share && opts->keys_dir)
                r = follow_identity(&e->sh->id, opts->keys_dir,
                                    opts->key_name ? opts->key_name : e->strategy ? "strategy" : "edge",
                                    opts->gateway ? (opts->gateway_key_name ? opts->gateway_key_name : "psgate")
                                                  : (opts->coord_key_name ? opts->coord_key_name : "pscoord"),
                                    e->strategy ? PSNET__ROLE__ROLE_STRATEGY : PSNET__ROLE__ROLE_EDGE);
        if (r == 0 && e->strategy && opts->gateway) {
                log_error("a strategy process reads the updates from the shards: it runs in the cluster, not "
                          "through psgate");
                r = -EINVAL;
        }
        if (r == 0 && opts->gateway) {
                /* Queues while psgate is not there, as a direct client's shard
                 * connections do: what leaves is the caller's own buffers. */
                const NetSockConf nc = { .type = ZMQ_DEALER, .name = "psgate", .linger_ms = 500,
                                         .keys = e->sh->id.enabled ? &e->sh->id.keys : NULL };
                r = netmux_new(loop, e->sh->zctx, &nc, opts->gateway, e->sh->id.enabled ? e->sh->id.coord_key : NULL,
                               &e->mux);
                if (r < 0)
                        log_error_errno(r, "Cannot connect to psgate at %s: %m", opts->gateway);
        }
        if (r == 0) {
                const SessionOps so = { .registered = on_registered, .failed = on_failed, .message = on_message };
                r = follow_session(loop, e->sh->zctx, opts->gateway ? opts->gateway : e->coord,
                                   e->strategy ? PSNET__ROLE__ROLE_STRATEGY : PSNET__ROLE__ROLE_EDGE,
                                   NULL, NULL, NULL, NULL, opts->connect_timeout_ms, &e->sh->id, e->mux, &so, e,
                                   &e->session);
        }
        if (r < 0) {
                psnet_edge_free(e);
                return r;
        }
        *ret = e;
        return 0;
}

static void edge_destroy(PsnetEdge *e) {
        /* The sockets first, then the context: the update's frames still
         * queued in ZeroMQ hold its block until then. */
        e->client = client_free(e->client);
        e->session = session_free(e->session);
        e->mux = netmux_close(e->mux);
        edge_update_free(&e->upd, job(e));
        edge_secagg_clear(&e->sa);
        agg_clear(e);
        follow_done(&e->fo);
        shared_unref(e->sh);
        ps_free(e->coord);
        ps_free(e);
}

PsnetEdge *psnet_edge_free(PsnetEdge *e) {
        if (!e)
                return NULL;
        e->push_cb = NULL;
        e->pull_cb = NULL;
        e->report_cb = e->leave_cb = NULL;
        if (e->working) {
                /* The thread pool has the update: the work's end frees the rest. */
                e->zombie = true;
                e->client = client_free(e->client);
                e->session = session_free(e->session);
                e->mux = netmux_close(e->mux);
                (void) uv_cancel((uv_req_t *) &e->work);
                return NULL;
        }
        edge_destroy(e);
        return NULL;
}

static void on_left(Session *s, int r, WireMsg *m, void *ud) {
        PsnetEdge *e = ud;
        (void) s, (void) m;
        edge_fields(e);
        if (r < 0)
                log_debug_errno(r, "pscoord did not answer the deregistration: %m");
        PsnetEdgeDoneFn cb = e->leave_cb;
        e->leave_cb = NULL;
        if (cb)
                cb(e, r, e->leave_ud);
}

int psnet_edge_leave(PsnetEdge *e, PsnetEdgeDoneFn done, void *ud) {
        if (!e)
                return -EINVAL;
        e->leaving = true;
        sa_abandon(e);
        e->leave_cb = done;
        e->leave_ud = ud;
        int r = session_deregister(e->session, NULL, 1000, on_left, e);
        if (r < 0)
                e->leave_cb = NULL;
        return r;
}

/* --- accessors --------------------------------------------------------------------- */

const Job *psnet_edge_job(const PsnetEdge *e) { return e->fo.has_job && !e->refused ? &e->fo.job : NULL; }
uint32_t psnet_edge_id(const PsnetEdge *e) { return e->session ? session_id(e->session) : 0; }
const char *psnet_edge_job_model(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.model : NULL; }
size_t psnet_edge_job_ntensors(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.ntensors : 0; }
const char *psnet_edge_job_tensor_name(const PsnetEdge *e, size_t t) {
        return psnet_edge_job(e) && t < e->fo.job.ntensors ? e->fo.job.tensors[t].name : NULL;
}
uint64_t psnet_edge_job_tensor_numel(const PsnetEdge *e, size_t t) {
        return psnet_edge_job(e) && t < e->fo.job.ntensors ? e->fo.job.tensors[t].numel : 0;
}
uint32_t psnet_edge_job_batch(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.batch : 0; }
uint32_t psnet_edge_job_local_epochs(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.fed.local_epochs : 0; }
float psnet_edge_job_lr(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.optim.lr : 0.0f; }
float psnet_edge_job_prox_mu(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.fed.prox_mu : 0.0f; }
uint64_t psnet_edge_job_seed(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.seed : 0; }
bool psnet_edge_job_async(const PsnetEdge *e) { return psnet_edge_job(e) && e->fo.job.fed.async; }
uint32_t psnet_edge_job_rounds(const PsnetEdge *e) { return psnet_edge_job(e) ? e->fo.job.fed.rounds : 0; }

int psnet_edge_job_model_json(const PsnetEdge *e, char *buf, size_t n) {
        return psnet_edge_job(e) ? follow_model_json(&e->fo, buf, n) : -ENOENT;
}
