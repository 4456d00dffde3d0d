/* SPDX-License-Identifier: Apache-2.0 */
/* psd's event loop; see psd-server.h. One thread, one uv_loop: the data
 * ROUTER, the pscoord session, DEALERs to other shards (psd-migrate.c),
 * signals, and a timer that expires parked pulls. Requests are pipelined: a
 * pull that must wait is parked by the gate and answered when its clock
 * closes, while other requests go on; while pscoord is away (restart,
 * registering again) the shard keeps serving. Every message is checked where
 * it arrives: its sender's role (with --keys), its keys against the job, a
 * push's membership, key and values (psd-gate.c). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>
#include "alloc.h"
#include "compress.h"
#include "dispatch.h"
#include "endpoint.h"
#include "errors.h"
#include "fdguard.h"
#include "keys.h"
#include "metrics.h"
#include "log.h"
#include "netsock.h"
#include "pfor.h"
#include "psd-checkpoint.h"
#include "psd-fedround.h"
#include "psd-migrate.h"
#include "psd-optim.h"
#include "psd-push.h"
#include "psd-rows.h"
#include "psd-server.h"
#include "psd-shm.h"
#include "psd-store.h"
#include "service.h"
#include "shm.h"
#include "session.h"
#include "wire-job.h"
#include "zap.h"

#define PSD_MAX_STRAGGLERS 64
#define PSD_REBUILD_ROWS 8192u  /* rows a step of a rebuild after a fail-over reads and sends (about 4 ms) */
#define PSD_PROMOTE_ROWS 4096u  /* copies a step of the promotion after a fail-over looks at (about 1.5 us each) */
#define PSD_REBUILD_MS 30       /* of each tick (100 ms) */
#define PSD_MOVE_WINDOW 16u     /* messages a link may have unanswered before a move's next step (at most 4 MiB each) */

typedef struct Psd {
        const PsdConfig *cfg;
        uv_loop_t loop;
        uv_timer_t tick;
        void *zctx;
        NetSock *data;
        Session *coord;
        Service *service;
        Store *store;
        Gate *gate;             /* holds the store: every push and pull goes through it */
        Migrate *migrate;
        Checkpointer *ckpt;
        FedShard *fed;
        Rows *rows;             /* the job's sparse tables (--tables) */
        ShmServer *shm;         /* same-host shared memory beside an ipc:// endpoint (NULL: none) */
        Pfor *pool;             /* --threads (the store's too) */
        uint64_t shm_changed;   /* values a worker made non-finite in shared memory during its push */
        uint64_t shm_changed_logged_ms; /* when that was last logged (once a second at most) */
        NetIdentity id;
        Zap *zap;
        uint64_t memory_limit;
        uint64_t errors, dropped;
        LogLimitBy refusals;    /* the "refused request" lines a flood would repeat, by peer and reason */
        uint64_t bytes_in, bytes_out;
        Histogram push_latency, pull_latency;
        LogWindow drop_lines;   /* the lines of refused and closed connections */
        AllocPurge purge;           /* freed memory given back after connections closed, messages refused */
        Psnet__ShardInfo hb;    /* the figures of the heartbeat being sent */
        bool acknowledging;     /* as last seen by psd_may_acknowledge (for its log lines) */
        uint32_t stragglers[PSD_MAX_STRAGGLERS];
        bool stopping;
        int exit_code;
        /* A rebuild's copies sent and not all answered yet: the heartbeat
         * still says rows_whole_from (pscoord: a row may be on one copy). */
        uint64_t rebuilds_seen, rows_whole_from;
        bool rows_await;
        bool move_marked;       /* a move's last words sent: its answers awaited (psd_rows_moved) */
        uint64_t moves_seen;    /* rows_moves when last looked at */
        uint64_t copies_refused_seen; /* migrate_copies_refused when last looked at */
} Psd;

static bool redirect_status(int status) {
        return status == PSNET__STATUS__STATUS_MOVED || status == PSNET__STATUS__STATUS_MIGRATING ||
               status == PSNET__STATUS__STATUS_UNAVAILABLE;
}

/* Whether this shard may acknowledge: always with a single copy of each key;
 * with backups, only while it holds its lease, since pscoord promotes them
 * once the lease has run out. */
static bool psd_may_acknowledge(Psd *p) {
        const ShardMap *m = store_map(p->store);
        if (!m || shardmap_replicas(m) < 2)
                return true;
        /* Stopping: it deregisters, and pscoord promotes its backups at once. */
        bool ok = !p->stopping && p->coord && session_lease_valid(p->coord, now_ms());
        if (ok != p->acknowledging) {
                p->acknowledging = ok;
                if (ok)
                        log_info("lease held again: acknowledging");
                else if (!p->stopping)
                        log_warning("lease with pscoord ran out: not acknowledging until it is renewed (its backups "
                                    "take over if pscoord saw it go)");
        }
        return ok;
}

#define PSD_NO_LEASE "this shard's lease with pscoord ran out (its backups may be taking over): retry"


static int psd_reply_error(Psd *p, const zmq_msg_t *route, const Psnet__Header *req, int status,
                           const char *reason) {
        if (redirect_status(status))
                log_debug("redirected request reason=\"%s\" status=%s", reason, status_name(status));
        else if (status == PSNET__STATUS__STATUS_INVALID && strncmp(reason, SHM_NO_SESSION, strlen(SHM_NO_SESSION)) == 0)
                /* A worker whose session ended (it reconnected, or this shard
                 * restarted) opens another and asks again: not an error. */
                log_info("request names no shared-memory session sender=%u reason=\"%s\"", req ? req->sender : 0,
                         reason);
        else {
                p->errors++;
                if (log_limit_by(&p->refusals, wire_refusal_key(route, status), "refused requests"))
                        log_warning("refused request reason=\"%s\" status=%s", reason, status_name(status));
        }
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ERROR);
        h.has_status = true;
        h.status = status;
        h.reason = (char *) reason;
        h.has_sender = true;
        h.sender = p->cfg->id;
        if (req && req->has_seq) {
                h.has_seq = true;
                h.seq = req->seq;
        }
        if (redirect_status(status) && store_map(p->store)) {
                h.has_epoch = true;
                h.epoch = shardmap_epoch(store_map(p->store));
        }
        return netsock_send(p->data, route, &h, NULL, 0);
}

static void psd_round_copied(Psd *p, PushReq *req);

/* GateAckFn: a PUSH request is settled (or a round's close copied). */
static void psd_ack(void *userdata, PushReq *req) {
        Psd *p = userdata;
        if (req->fed_round) {
                psd_round_copied(p, req);
                return;
        }
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH_ACK);
        h.has_seq = true;
        h.seq = req->seq;
        h.has_status = req->status != PSNET__STATUS__STATUS_OK;
        h.status = req->status;
        if ((req->status == PSNET__STATUS__STATUS_OK || req->status == PSNET__STATUS__STATUS_DUPLICATE) &&
            !psd_may_acknowledge(p)) {
                /* Held or applied here, but not acknowledged: sent again, it comes
                 * back DUPLICATE from whichever copy leads then. */
                h.type = PSNET__MSG_TYPE__MSG_ERROR;
                h.has_status = true;
                h.status = PSNET__STATUS__STATUS_UNAVAILABLE;
                h.reason = (char *) PSD_NO_LEASE;
        }
        h.has_clock = true;
        h.clock = req->clock;
        h.has_sender = true;
        h.sender = p->cfg->id;
        if (store_map(p->store)) {
                h.has_epoch = true;
                h.epoch = shardmap_epoch(store_map(p->store));
        }
        if (req->status != PSNET__STATUS__STATUS_OK && req->status != PSNET__STATUS__STATUS_DUPLICATE &&
            req->status != PSNET__STATUS__STATUS_MOVED)
                log_warning("push refused worker=%u clock=%ld status=%s", req->worker,
                            (long) req->clock, status_name(req->status));
        int r = netsock_send(p->data, &req->route, &h, NULL, 0);
        if (r < 0)
                log_warning_errno(r, "Failed to acknowledge push worker=%u: %m", req->worker);
        histogram_observe(&p->push_latency, (double) (now_ms() - req->arrived) / 1e3);
}

/* A pull in shared memory: the values written where the worker said, then
 * an answer without frames. */
static int psd_write_values(Psd *p, const Psnet__Header *req, Chunk **chunks, bool bf16, char *reason, size_t n) {
        _cleanup_free_ uint8_t **at = shm_server_keys(p->shm, req, bf16 ? 2 : sizeof(float), reason, n);
        if (!at)
                return -EINVAL;
        for (size_t i = 0; i < req->n_keys; i++) {
                const Chunk *c = chunks[i];
                if (bf16)
                        store_bf16(p->store, at[i], c->val->data, c->len, true);
                else
                        pfor_copy(p->pool, at[i], c->val->data, (size_t) c->len * sizeof(float), STORE_MIN_COPY);
        }
        store_pulled(p->store, req->n_keys);
        return 0;
}

static int psd_send_values(Psd *p, const zmq_msg_t *route, const Psnet__Header *req, Chunk **chunks) {
        size_t n = req->n_keys;
        zmq_msg_t *frames = ps_malloc((n ? n : 1) * sizeof *frames);
        if (!frames)
                return -ENOMEM;
        int64_t clock = -1;
        bool bf16 = req->dtype == PSNET__DTYPE__DTYPE_BF16, shm = req->has_shm_session;
        char reason[192];
        if (shm && psd_write_values(p, req, chunks, bf16, reason, sizeof reason) < 0) {
                ps_free(frames);
                return psd_reply_error(p, route, req, PSNET__STATUS__STATUS_INVALID, reason);
        }
        for (size_t i = 0; i < n; i++) {
                int r = shm ? 0
                            : bf16 ? store_value_bf16(p->store, chunks[i], &frames[i])
                                   : store_value_msg(p->store, chunks[i], &frames[i]);
                if (r < 0) {
                        for (size_t j = 0; j < i; j++)
                                zmq_msg_close(&frames[j]);
                        ps_free(frames);
                        return r;
                }
                if (clock < 0 || chunks[i]->clock < clock)
                        clock = chunks[i]->clock;
                p->bytes_out += (uint64_t) chunks[i]->len * (bf16 ? 2 : sizeof(float));
        }
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL_REP);
        h.has_dtype = bf16;
        h.dtype = req->dtype;
        h.has_seq = true;
        h.seq = req->seq;
        h.has_clock = true;
        h.clock = clock < 0 ? 0 : clock;
        h.has_sender = true;
        h.sender = p->cfg->id;
        h.has_job = true;
        h.job = store_job(p->store)->id;
        h.n_keys = n;
        h.keys = req->keys;
        h.has_shm_session = h.has_shm_offset = shm;
        h.shm_session = req->shm_session;
        h.shm_offset = req->shm_offset;
        int r = netsock_send(p->data, route, &h, frames, shm ? 0 : n);
        ps_free(frames);
        return r;
}

/* GateAnswerFn: a pull is answered (values) or refused. */
static void psd_answer(void *userdata, const zmq_msg_t *route, const Psnet__Header *req, Chunk **chunks, int status,
                       const char *reason, uint64_t arrived) {
        Psd *p = userdata;
        histogram_observe(&p->pull_latency, (double) (now_ms() - arrived) / 1e3);
        if (status != PSNET__STATUS__STATUS_OK) {
                psd_reply_error(p, route, req, status, reason);
                return;
        }
        int r = psd_send_values(p, route, req, chunks);
        if (r < 0)
                log_warning_errno(r, "Failed to answer pull: %m");
}

/* GateForwardFn: a push to this shard's backups. */
static int psd_forward(void *userdata, PushReq *req, const Psnet__Header *h, const zmq_msg_t *frames, bool bf16) {
        Psd *p = userdata;
        return migrate_forward(p->migrate, req, h, frames, bf16);
}

/* --- the data plane ------------------------------------------------------------------ */

static void psd_pull(Psd *p, WireMsg *m, Chunk **chunks) {
        char reason[192];
        if (!psd_may_acknowledge(p)) {
                psd_reply_error(p, &m->route, m->hdr, PSNET__STATUS__STATUS_UNAVAILABLE, PSD_NO_LEASE);
                return;
        }
        int st = gate_pull(p->gate, &m->route, &m->hdr, chunks, now_ms(), reason, sizeof reason);
        if (st != 0)
                psd_reply_error(p, &m->route, m->hdr, st, reason);
}

/* A worker's push: made into the gate's Push whatever it came as
 * (psd-push.c), and through the gate's one way in. */
static void psd_push(Psd *p, WireMsg *m, Chunk **chunks) {
        char reason[192];
        if (!psd_may_acknowledge(p)) {
                psd_reply_error(p, &m->route, m->hdr, PSNET__STATUS__STATUS_UNAVAILABLE, PSD_NO_LEASE);
                return;
        }
        Push push;
        PushSource src;
        push_from_message(&push, &src, p->store, p->shm, m, chunks, p->id.enabled ? m->peer.key : NULL);
        int st = gate_push_request(p->gate, &push, reason, sizeof reason);
        push_source_done(&src);
        if (st != PSNET__STATUS__STATUS_OK) {
                psd_reply_error(p, &m->route, m->hdr, st, reason);
                return;
        }
        p->bytes_in += push.bytes;
        if (push.zeroed > 0) {
                p->shm_changed += push.zeroed;
                uint64_t now = uv_now(&p->loop);
                if (now - p->shm_changed_logged_ms >= 1000 || p->shm_changed == push.zeroed) {
                        p->shm_changed_logged_ms = now;
                        log_warning("worker %u wrote %zu non-finite values into its shared memory while its push was "
                                    "applied: applied as 0 (psnet_psd_shm_zeroed_total)", m->hdr->sender, push.zeroed);
                }
        }
}

/* The PUSH_ACK of a push settled at once (a federated update, a table's rows):
 * status OK or DUPLICATE. */
static void psd_push_ack(Psd *p, const zmq_msg_t *route, const Psnet__Header *h, int status) {
        Psnet__Header a;
        wire_header_init(&a, PSNET__MSG_TYPE__MSG_PUSH_ACK);
        a.has_seq = a.has_clock = a.has_sender = true;
        a.seq = h->seq;
        a.clock = h->clock;
        a.sender = p->cfg->id;
        a.has_status = status != PSNET__STATUS__STATUS_OK;
        a.status = status;
        int r = netsock_send(p->data, route, &a, NULL, 0);
        if (r < 0)
                log_warning_errno(r, "Failed to acknowledge a push sender=%u: %m", h->sender);
}

/* Mode fed: a pull answers the values as they are (they change only when a
 * round closes); a push is one client's update, kept until the round closes
 * (psd-fedround.h). */
static void psd_fed_data(Psd *p, WireMsg *m, Chunk **chunks) {
        Psnet__Header *h = m->hdr;
        char reason[256];
        bool strategy = (h->type == PSNET__MSG_TYPE__MSG_PULL && h->has_update_of) ||
                        (h->type == PSNET__MSG_TYPE__MSG_PUSH && h->has_strategy_delta && h->strategy_delta);
        /* Edge workers pull and push; operators and the strategy process read
         * the values; the strategy alone reads updates and pushes deltas. */
        bool reader = m->peer.role == PSNET__ROLE__ROLE_ADMIN || m->peer.role == PSNET__ROLE__ROLE_STRATEGY;
        if (p->id.enabled && (strategy ? m->peer.role != PSNET__ROLE__ROLE_STRATEGY
                                       : m->peer.role != PSNET__ROLE__ROLE_EDGE &&
                                                 !(reader && h->type == PSNET__MSG_TYPE__MSG_PULL))) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_DENIED,
                                strategy ? "a client's update is read, and a round's delta pushed, by the job's "
                                           "strategy process only (a key of role strategy)"
                                         : "a federated job is served to edge workers only (and read by operators "
                                           "and its strategy process)");
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PULL && strategy) {
                _cleanup_free_ zmq_msg_t *frames = ps_malloc(MAX(h->n_keys, (size_t) 1) * sizeof *frames);
                int st = frames ? fedshard_update_frames(p->fed, p->store, h, chunks, frames, reason, sizeof reason)
                                : PSNET__STATUS__STATUS_RESOURCE;
                if (st != PSNET__STATUS__STATUS_OK) {
                        log_warning("update not read client=%u round=%ld status=%s reason=\"%s\"", h->update_of,
                                    (long) h->clock, status_name(st), frames ? reason : "out of memory");
                        psd_reply_error(p, &m->route, h, st, frames ? reason : "out of memory");
                        return;
                }
                Psnet__Header a;
                wire_header_init(&a, PSNET__MSG_TYPE__MSG_PULL_REP);
                a.has_seq = a.has_clock = a.has_sender = a.has_job = true;
                a.seq = h->seq;
                a.clock = h->clock;
                a.sender = p->cfg->id;
                a.job = store_job(p->store)->id;
                a.n_keys = h->n_keys;
                a.keys = h->keys;
                for (size_t i = 0; i < h->n_keys; i++)
                        p->bytes_out += zmq_msg_size(&frames[i]);
                int r = netsock_send(p->data, &m->route, &a, frames, h->n_keys);
                if (r < 0)
                        log_warning_errno(r, "Failed to answer the strategy's pull: %m");
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PULL) {
                int r = psd_send_values(p, &m->route, h, chunks);
                if (r < 0)
                        log_warning_errno(r, "Failed to answer pull: %m");
                return;
        }
        int st = fedshard_push(p->fed, p->store, h, chunks, m->frames, p->id.enabled ? m->peer.key : NULL,
                               p->memory_limit, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE) {
                p->errors++;
                log_warning("update refused client=%u round=%ld status=%s reason=\"%s\"", h->sender, (long) h->clock,
                            status_name(st), reason);
                psd_reply_error(p, &m->route, h, st, reason);
                return;
        }
        for (size_t i = 0; i < h->n_keys; i++)
                p->bytes_in += zmq_msg_size(&m->frames[i]);
        psd_push_ack(p, &m->route, h, st);
}

/* CHUNK_STATE and REPLICATE from another shard (psd-migrate.c). */
static void psd_handle_link(void *d, WireMsg *m, void *peer) {
        Psd *p = d;
        (void) peer;
        migrate_in(p->migrate, p->data, m);
        gate_wake(p->gate);
}

/* A worker's (or an edge's, or an operator's) PULL or PUSH. */
static void psd_handle_data(void *d, WireMsg *m, void *peer) {
        Psd *p = d;
        Psnet__Header *h = m->hdr;
        char reason[192];
        (void) peer;
        if (!store_job(p->store)) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_NO_JOB, "no job is configured on this shard yet");
                return;
        }
        if (h->n_keys == 0 || !h->has_clock || h->clock < 0 || !h->has_sender || !h->has_seq) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_MALFORMED,
                                "PULL/PUSH need keys, clock >= 0, sender and seq");
                return;
        }
        if (h->has_members_epoch && h->members_epoch > p->gate->members_epoch) {
                /* The worker heard of a membership (its own admission, say)
                 * that has not reached this shard yet: it asks again shortly. */
                snprintf(reason, sizeof reason, "membership epoch %lu has not reached this shard (it acts on %lu)",
                         (unsigned long) h->members_epoch, (unsigned long) p->gate->members_epoch);
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_UNAVAILABLE, reason);
                return;
        }
        _cleanup_free_ Chunk **chunks = ps_malloc(h->n_keys * sizeof *chunks);
        if (!chunks) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        int st = store_lookup_keys(p->store, h, chunks, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK) {
                psd_reply_error(p, &m->route, h, st, reason);
                return;
        }
        if (store_job(p->store)->mode == MODE_FED) {
                if (h->has_shm_session) {
                        psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_INVALID,
                                        "shared memory serves training jobs, not federated rounds");
                        return;
                }
                psd_fed_data(p, m, chunks);
                return;
        }
        if (p->id.enabled && m->peer.role == PSNET__ROLE__ROLE_EDGE) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_DENIED,
                                "edge workers take part in federated jobs only; this job is not one");
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PULL)
                psd_pull(p, m, chunks);
        else {
                psd_push(p, m, chunks);
                gate_wake(p->gate);
        }
}

static void shardmap_freep(ShardMap **m) { shardmap_free(*m); }

/* A table's long rehash: the heartbeat goes if due (psd-table.h). */
static void psd_poll_session(void *ud) {
        Psd *p = ud;
        (void) session_poll(p->coord);
}

/* RowsHooks: the members of a clock, as the gate has them. */
static void psd_rows_members(void *ud, int64_t clock, const uint32_t **ret, size_t *n) {
        Psd *p = ud;
        const GateCfg *cfg = gate_cfg(p->gate, clock);
        *ret = cfg->members;
        *n = cfg->nmembers;
}

/* RowsRebuildFn: rows led here, to their backups (nothing waits on them). */
static int psd_rows_rebuild(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n) {
        Psd *p = ud;
        int st = migrate_rows_copy(p->migrate, NULL, 0, table, clock, -1, ids, n, NULL, 0);
        if (st == PSNET__STATUS__STATUS_OK)
                return 0;
        if (log_window(&p->drop_lines, now_ms()))
                log_warning("%zu rows of table %u not sent to their backups again (status=%s): again at the next "
                            "tick", n, table, status_name(st));
        return -EAGAIN;
}

/* RowsMoveFn: rows moved to a receiver after a map change. */
static int psd_rows_move(void *ud, uint32_t shard, uint32_t table, int64_t clock, const int64_t *ids,
                         const float *rows, const int64_t *stamps, size_t n, bool last) {
        Psd *p = ud;
        return migrate_rows_move(p->migrate, shard, table, clock, ids, rows, stamps, n, last);
}

/* RowsMoveHooks.record: what a worker's pushes left here, to a receiver. */
static int psd_rows_record(void *ud, uint32_t shard, uint32_t table, uint32_t worker, int64_t clock, int64_t done,
                           const int64_t *ids, size_t n) {
        Psd *p = ud;
        return migrate_rows_record(p->migrate, shard, table, worker, clock, done, ids, n);
}

/* RowsHooks: rows a request touches, not moved here yet: asked for. */
static void psd_rows_want(void *ud, uint32_t shard, uint32_t table, const int64_t *ids, size_t n) {
        Psd *p = ud;
        migrate_rows_want(p->migrate, shard, table, ids, n);
}

/* Whether the links to other shards are behind: more than
 * PSD_MOVE_WINDOW messages on one unanswered (a move's steps wait). */
static bool psd_rows_busy(void *ud) {
        Psd *p = ud;
        return migrate_unanswered(p->migrate) > PSD_MOVE_WINDOW;
}

/* Whether every receiver answered all that a move sent it (1), not yet
 * (0), or refused some of it (-1). */
static int psd_rows_moved(void *ud) {
        Psd *p = ud;
        if (!p->move_marked) {
                migrate_mark(p->migrate);
                p->move_marked = true;
        }
        int a = migrate_moves_refused(p->migrate) > 0 ? -1 : migrate_marked_answered(p->migrate) ? 1 : 0;
        if (a != 0) {
                migrate_moves_end(p->migrate);
                p->move_marked = false;
        }
        return a;
}

/* Whether a rows push answered st is copied to its rows' backups before it
 * is acknowledged, with two copies or more: applied under ASP and SSP (under
 * BSP a clock's close copies it), or sent again under a newer map in any
 * mode (rows_last_applied). */
static bool psd_rows_copies_push(const Psd *p, int st) {
        const Job *job = store_job(p->store);
        const ShardMap *m = store_map(p->store);
        const int64_t *ids, *gone;
        size_t n, ngone;
        rows_last_applied(p->rows, &ids, &n, &gone, &ngone);
        if (!job || !m || shardmap_replicas(m) < 2)
                return false;
        return st == PSNET__STATUS__STATUS_OK ? job->mode != MODE_BSP : n > 0;
}

/* ASP/SSP: worker h->sender's push of h's clock applied here: its rows go
 * whole to their backups, each copy naming the worker (a push sent again
 * after a fail-over is cut by what reached them), and the push is
 * acknowledged once every copy was answered. */
static void psd_rows_copy_push(Psd *p, const zmq_msg_t *route, const Psnet__Header *h) {
        const int64_t *ids, *gone;
        size_t n, ngone;
        rows_last_applied(p->rows, &ids, &n, &gone, &ngone);
        PushReq *req = NULL;
        if (pushreq_new(route, h->seq, h->sender, h->clock, &req) < 0) {
                log_warning("out of memory acknowledging a rows push of worker %u clock %ld: it asks again", h->sender,
                            (long) h->clock);
                return;
        }
        req->rows_copy = true;
        const Job *job = store_job(p->store);
        int64_t origin = job && job->mode != MODE_BSP ? (int64_t) h->sender : -1;
        int st = migrate_rows_copy(p->migrate, &req, 1, h->table, h->clock, origin, ids, n, gone, ngone);
        if (st != PSNET__STATUS__STATUS_OK) /* applied here: its rows go to the backups again */
                rows_copies_lost(p->rows, shardmap_epoch(store_map(p->store)));
        pushreq_settle(p->gate, req, st);
}

/* RowsHooks: a clock of a table closed. Its rows go to their backups
 * first; each parked push is acknowledged (psd_ack) once every copy was
 * answered. */
static void psd_rows_closed(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n,
                            const int64_t *gone, size_t ngone, const RowsAck *acks, size_t nacks, int status,
                            const char *reason) {
        Psd *p = ud;
        if (status != PSNET__STATUS__STATUS_OK) {
                for (size_t k = 0; k < nacks; k++) {
                        Psnet__Header a;
                        wire_header_init(&a, PSNET__MSG_TYPE__MSG_PUSH_ACK);
                        a.has_seq = true;
                        a.seq = acks[k].seq;
                        psd_reply_error(p, acks[k].route, &a, status, reason);
                }
                return;
        }
        _cleanup_free_ PushReq **reqs = ps_calloc(MAX(nacks, (size_t) 1), sizeof *reqs);
        size_t nreqs = 0;
        for (size_t k = 0; reqs && k < nacks; k++)
                if (pushreq_new(acks[k].route, acks[k].seq, acks[k].worker, clock, &reqs[nreqs]) == 0)
                        reqs[nreqs++]->rows_copy = true;
        if (!reqs || nreqs < nacks)
                log_warning("out of memory acknowledging the pushes of clock %ld of table %u: their workers ask "
                            "again", (long) clock, table);
        int st = migrate_rows_copy(p->migrate, reqs, nreqs, table, clock, -1, ids, n, gone, ngone);
        if (st != PSNET__STATUS__STATUS_OK) /* the clock is closed here: its rows go to the backups again */
                rows_copies_lost(p->rows, shardmap_epoch(store_map(p->store)));
        log_debug("table clock closed table=%u clock=%ld rows=%zu pushes=%zu copies=%s", table, (long) clock, n, nacks,
                  status_name(st));
        for (size_t k = 0; k < nreqs; k++)
                pushreq_settle(p->gate, reqs[k], st);
}

/* A ROWS_PULL_REP: out[0] the ids, out[1] their rows (both moved); a scan's
 * cursor to go on from where more rows remain. */
static void psd_send_rows(Psd *p, const zmq_msg_t *route, const Psnet__Header *h, zmq_msg_t *out, bool more,
                          uint64_t cursor) {
        Psnet__Header a;
        wire_header_init(&a, PSNET__MSG_TYPE__MSG_ROWS_PULL_REP);
        a.has_seq = a.has_clock = a.has_sender = a.has_job = a.has_table = true;
        a.seq = h->seq;
        a.clock = gate_clock(p->gate);
        a.sender = p->cfg->id;
        a.job = store_job(p->store)->id;
        a.table = h->table;
        a.has_cursor = more;
        a.cursor = cursor;
        p->bytes_out += zmq_msg_size(&out[1]);
        int r = netsock_send(p->data, route, &a, out, 2);
        if (r < 0)
                log_warning_errno(r, "Failed to answer a rows request: %m");
}

/* BSP: the tables' clocks that can close now (not past a fence's). */
static void psd_rows_settle(Psd *p) {
        rows_settle(p->rows, p->gate->fenced ? p->gate->fence_limit : INT64_MAX);
}

/* ASP/SSP: whether a rows pull of clock may be answered: no fence holds
 * the clock, and under SSP the slowest member completed at least clock -
 * staleness clocks here, counted by its chunks' pushes or by its tables'
 * (a worker pushes every table to every shard each clock, before its
 * chunks: a shard that holds rows and no chunk sees only those). */
static bool psd_rows_pull_ready(Psd *p, int64_t clock, int64_t *ret_slowest) {
        const Gate *g = p->gate;
        const GateCfg *cfg = gate_cfg(g, clock);
        int64_t slowest = -1;
        for (size_t i = 0; i < cfg->nmembers; i++) {
                uint32_t w = cfg->members[i];
                int64_t lo, hi, wc = gate_worker_clock(g, w);
                rows_worker_clocks(p->rows, w, &lo, &hi);
                int64_t done = MAX(MAX(wc, (int64_t) 0), lo + 1);
                if (slowest < 0 || done < slowest)
                        slowest = done;
        }
        *ret_slowest = MAX(slowest, (int64_t) 0);
        if (g->fenced && clock > g->fence_pull_limit)
                return false;
        return cfg->mode != MODE_SSP || cfg->nmembers == 0 || *ret_slowest >= clock - (int64_t) cfg->staleness;
}

/* A worker's ROWS_PULL or ROWS_PUSH, or an operator's ROWS_PULL: the job's
 * tables (psd-rows.h): under ASP applied as they come, under BSP once every
 * member pushed the clock. */
static void psd_handle_rows(void *d, WireMsg *m, void *peer) {
        Psd *p = d;
        Psnet__Header *h = m->hdr;
        char reason[256];
        (void) peer;
        const Job *job = store_job(p->store);
        if (!job || h->table >= job->ntables) {
                psd_reply_error(p, &m->route, h, job ? PSNET__STATUS__STATUS_UNKNOWN_KEY : PSNET__STATUS__STATUS_NO_JOB,
                                job ? "the job has no such table" : "no job is configured on this shard yet");
                return;
        }
        if (!h->has_clock || h->clock < 0 || !h->has_sender || !h->has_seq) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_MALFORMED,
                                "ROWS_PULL/ROWS_PUSH/ROWS_SCAN need a clock >= 0, sender and seq");
                return;
        }
        if (!psd_may_acknowledge(p)) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_UNAVAILABLE, PSD_NO_LEASE);
                return;
        }
        if (checkpoint_loading(p->ckpt)) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_UNAVAILABLE,
                                "the shard is loading the job's rows and chunks: ask again");
                return;
        }
        int st;
        if (h->type == PSNET__MSG_TYPE__MSG_ROWS_SCAN) {
                /* An operator's read of the rows held here (psctl export; with
                 * keys, an admin key's only: the wire's roles). */
                zmq_msg_t out[2];
                bool more = false;
                uint64_t next = 0;
                st = rows_scan(p->rows, h, out, &more, &next, reason, sizeof reason);
                if (st != PSNET__STATUS__STATUS_OK) {
                        psd_reply_error(p, &m->route, h, st, reason);
                        return;
                }
                psd_send_rows(p, &m->route, h, out, more, next);
                return;
        }
        bool admin = p->id.enabled && m->peer.role == PSNET__ROLE__ROLE_ADMIN;
        st = admin ? PSNET__STATUS__STATUS_OK
                   : gate_admit_sender(p->gate, h, p->id.enabled ? m->peer.key : NULL, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK) {
                psd_reply_error(p, &m->route, h, st, reason);
                return;
        }
        const GateCfg *cfg = gate_cfg(p->gate, h->clock);
        int64_t slowest = 0;
        if (h->type == PSNET__MSG_TYPE__MSG_ROWS_PULL && cfg->mode != MODE_BSP &&
            !psd_rows_pull_ready(p, h->clock, &slowest)) {
                /* SSP: the slowest member is more than the staleness behind
                 * (or a fence holds the clock): asked again shortly. */
                snprintf(reason, sizeof reason, "rows of clock %ld wait: the slowest member completed %ld clocks "
                         "(staleness %u)%s", (long) h->clock, (long) slowest, cfg->staleness,
                         p->gate->fenced ? ", or a fence holds the clock" : "");
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_UNAVAILABLE, reason);
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_ROWS_PULL) {
                zmq_msg_t out[2];
                st = rows_pull(p->rows, store_map(p->store), p->cfg->id, h, &m->frames[0], &out[1], reason,
                               sizeof reason);
                if (st != PSNET__STATUS__STATUS_OK) {
                        psd_reply_error(p, &m->route, h, st, reason);
                        return;
                }
                zmq_msg_init(&out[0]);
                zmq_msg_copy(&out[0], &m->frames[0]);
                psd_send_rows(p, &m->route, h, out, false, 0);
                return;
        }
        uint64_t used = store_stats(p->store)->bytes;
        RowsStats rs;
        rows_stats(p->rows, &rs);
        used += rs.bytes;
        uint64_t room = !p->memory_limit ? UINT64_MAX : used >= p->memory_limit ? 0 : p->memory_limit - used;
        st = rows_push(p->rows, store_map(p->store), p->cfg->id, h, m->frames, &m->route, room, reason,
                       sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE && st != ROWS_PARKED) {
                psd_reply_error(p, &m->route, h, st, reason);
                return;
        }
        p->bytes_in += zmq_msg_size(&m->frames[1]);
        if (st == ROWS_PARKED)
                psd_rows_settle(p); /* acknowledged when its clock closes */
        else if ((st == PSNET__STATUS__STATUS_OK || st == PSNET__STATUS__STATUS_DUPLICATE) && psd_rows_copies_push(p, st))
                psd_rows_copy_push(p, &m->route, h);
        else
                psd_push_ack(p, &m->route, h, st);
}

/* The messages a shard's data socket serves: its handler table (dispatch.h).
 * Answers to what it sends other shards arrive on its links, not here. */
#define T(x) [PSNET__MSG_TYPE__MSG_##x]
static const DispatchRow rows[] = {
        T(PULL) = { psd_handle_data },
        T(PUSH) = { psd_handle_data },
        T(ROWS_PULL) = { psd_handle_rows },
        T(ROWS_PUSH) = { psd_handle_rows },
        T(ROWS_SCAN) = { psd_handle_rows },
        T(ROWS_COPY) = { psd_handle_link },
        T(ROWS_MOVE) = { psd_handle_link },
        T(ROWS_WANT) = { psd_handle_link },
        T(CHUNK_STATE) = { psd_handle_link },
        T(REPLICATE) = { psd_handle_link },
        T(CHUNK_ACK) = { .ignore = true },
        T(REPLICATE_ACK) = { .ignore = true },
        T(ERROR) = { .ignore = true },
};
#undef T

const DispatchTable psd_dispatch = { .daemon = "psd", .at_coord = false, .rows = rows, .nrows = ELEMENTSOF(rows) };

static void psd_on_data(NetSock *ns, WireMsg *m, int r, void *ud) {
        Psd *p = ud;
        char reason[160];
        (void) ns;
        if (r == 0) {
                int st = dispatch_message(&psd_dispatch, &p->id, p, m, reason, sizeof reason);
                if (st == PSNET__STATUS__STATUS_DENIED) {
                        p->errors++;
                        if (log_limit_by(&p->refusals, wire_refusal_key(&m->route, st), "refused requests"))
                                log_warning("refused request reason=\"%s\" status=denied key=%s name=%s", reason,
                                            m->peer.fingerprint[0] ? m->peer.fingerprint : "-",
                                            m->peer.name[0] ? m->peer.name : "-");
                        (void) netsock_send_error(p->data, &m->route, st, m->hdr->seq, reason);
                } else if (st != PSNET__STATUS__STATUS_OK)
                        psd_reply_error(p, &m->route, m->hdr, st, reason);
        } else {
                alloc_purge_soon(&p->purge, now_ms()); /* what the refused message held */
                if (m->has_route)
                        psd_reply_error(p, &m->route, m->hdr, m->status, m->reason);
        }
        /* The heartbeat goes between messages when due: a turn that applies
         * many large pushes would otherwise hold it past the lease. */
        (void) session_poll(p->coord);
        checkpoint_poll(p->ckpt);
}

/* A connection to the data socket closed. libzmq drops a connection that
 * sends a frame over the limit the same way a peer leaves, so both are
 * counted and logged (at most 10 lines per 10 s) with the limit. */
static void psd_on_data_event(NetSock *ns, int event, int value, const char *why, void *ud) {
        Psd *p = ud;
        (void) ns, (void) value;
        uint64_t now = now_ms();
        if (why) {
                if (log_window(&p->drop_lines, now))
                        log_warning("refused a connection reason=\"%s\"", why);
                return;
        }
        if (event != ZMQ_EVENT_DISCONNECTED)
                return;
        p->dropped++;
        /* What the connection held (a message begun, a frame over the limit)
         * is freed by libzmq's I/O thread about now: looked at once the
         * closing is over. */
        alloc_purge_soon(&p->purge, now);
        if (log_window(&p->drop_lines, now))
                log_info("connection closed (the peer left, or sent a frame over the limit of %ld bytes)",
                         (long) p->cfg->max_msg);
}

/* --- the job ---------------------------------------------------------------------------- */

/* What the job asks of this shard before it is installed: frames within the
 * limit, this shard's share of the model within its memory. */
static int psd_check_job(Psd *p, const Job *job, const ShardMap *map, char *reason, size_t n) {
        int64_t need = job_max_frame(job);
        if (need > (int64_t) p->cfg->max_msg) {
                snprintf(reason, n, "the job's chunks need frames of %ld bytes, over --max-msg %lu", (long) need,
                         (unsigned long) p->cfg->max_msg);
                return -EMSGSIZE;
        }
        int me = shardmap_find(map, p->cfg->id);
        uint64_t *bytes = ps_calloc(shardmap_size(map), sizeof *bytes);
        if (!bytes) {
                snprintf(reason, n, "out of memory");
                return -ENOMEM;
        }
        shardmap_bytes(map, job, bytes);
        uint64_t mine = me < 0 ? 0 : bytes[me];
        ps_free(bytes);
        if (p->memory_limit && mine > p->memory_limit) {
                snprintf(reason, n, "this shard's share of the model is %lu bytes, over its memory limit of %lu",
                         (unsigned long) mine, (unsigned long) p->memory_limit);
                return -ENOMEM;
        }
        return 0;
}

/* The largest message a peer may send this shard: every value of the job
 * and its optimizer state twice over (a migration carries state, a top-k
 * push pairs of index and value), a frame of --max-msg twice (rows in
 * parts, a header), and each of the most frames a message may have. Before
 * a job (job NULL), the frames alone. */
static uint64_t psd_message_bound(const Psd *p, const Job *job) {
        uint64_t model = job ? job_model_bytes(job) : 0;
        return 2 * model + 2 * (uint64_t) p->cfg->max_msg + WIRE_MAX_HEADER +
               (uint64_t) (WIRE_MAX_KEYS + 8) * FDGUARD_FRAME_COST;
}

static void psd_checkpoint_failed(Psd *p, const char *name, int err);

static void psd_apply_config(Psd *p, const Psnet__Config *ctl) {
        char err[192], mode[32];
        int r;
        if (ctl->job && ctl->map) {
                Job job;
                ShardMap *map = NULL;
                r = job_from_proto(ctl->job, &job, err, sizeof err);
                if (r < 0) {
                        log_error("pscoord sent a job that does not validate reason=\"%s\"", err);
                        return;
                }
                r = shardmap_from_proto(ctl->map, &map);
                if (r < 0) {
                        log_error_errno(r, "pscoord sent a shard map that does not validate: %m");
                        return;
                }
                if (!shardmap_fits_job(map, &job)) {
                        log_error("pscoord sent a shard map of other keys than its job's");
                        shardmap_free(map);
                        return;
                }
                r = psd_check_job(p, &job, map, err, sizeof err);
                if (r < 0) {
                        log_error("cannot serve the job reason=\"%s\"", err);
                        shardmap_free(map);
                        return;
                }
                bool fresh = !store_job(p->store) || store_job(p->store)->id != job.id;
                const Psnet__Checkpoint *rs = ctl->restore;
                bool restore = fresh && rs && rs->name && rs->dir && rs->has_clock;
                /* A fresh job's chunks are never built in the loop: they come from
                 * the checkpoint, from the seed built in the thread pool
                 * (checkpoint_seed, under the job's first map only), or, for a
                 * shard that first hears of the job under a later map (it takes a
                 * lost shard's place), from their primaries. */
                bool first = !ctl->has_first_map || ctl->first_map;
                bool seed = fresh && !restore && first;
                if (fresh)
                        store_set_restoring(p->store, true);
                uint64_t was_epoch = store_map(p->store) ? shardmap_epoch(store_map(p->store)) : 0;
                _cleanup_(shardmap_freep) ShardMap *was =
                        !fresh && store_map(p->store) ? shardmap_dup(store_map(p->store)) : NULL;
                r = gate_configure(p->gate, &job, map);
                shardmap_free(map);
                if (fresh || (store_map(p->store) && shardmap_epoch(store_map(p->store)) != was_epoch))
                        fedshard_reset(p->fed); /* a round open under another job or map is gone */
                if (r < 0) {
                        log_error_errno(r, "Failed to configure the store: %m");
                        return;
                }
                fdguard_message_bound(psd_message_bound(p, &job));
                r = rows_configure(p->rows, &job, err, sizeof err);
                if (r < 0)
                        log_error("cannot hold the job's tables reason=\"%s\"", err); /* their requests: NO_JOB */
                else
                        rows_map_changed(p->rows, was, store_map(p->store), p->cfg->id);
                /* The frame limit stays --max-msg: libzmq copies a listener's
                 * options when it binds, so a limit set now would reach no
                 * connection (and a codec's frame, top-k's pairs, may be
                 * larger than a chunk's values). */
                if (!fresh && ctl->map->epoch != 0)
                        log_info("map epoch=%lu keys=%lu backup_keys=%lu incoming=%lu moved_out=%lu replicas=%u",
                                 (unsigned long) ctl->map->epoch, (unsigned long) store_stats(p->store)->nkeys,
                                 (unsigned long) store_stats(p->store)->backup_keys, (unsigned long) store_incoming(p->store),
                                 (unsigned long) migrate_moved_out(p->migrate), shardmap_replicas(store_map(p->store)));
                if (fresh)
                        log_info("job configured job=%u model=%s mode=%s keys=%lu bytes=%lu message_bound=%lu "
                                 "map_epoch=%lu%s%s",
                                 job.id, job.model_name, job_mode_string(&job, mode, sizeof mode),
                                 (unsigned long) store_stats(p->store)->nkeys, (unsigned long) store_stats(p->store)->bytes,
                                 (unsigned long) fdguard_bound(), (unsigned long) ctl->map->epoch, restore ? " restore=" : "", restore ? rs->name : "");
                if (seed && (r = checkpoint_seed(p->ckpt)) < 0 && job.init[0]) {
                        store_set_restoring(p->store, false);
                        checkpoint_init_failed(p->ckpt, &job, r);
                } else if (seed && r < 0) {
                        log_warning_errno(r, "Failed to build the initial values in the background (%m): building "
                                          "them here");
                        store_set_restoring(p->store, false);
                        r = store_create_missing(p->store);
                        if (r == 0)
                                r = gate_settle(p->gate);
                        if (r < 0)
                                log_error_errno(r, "Failed to build the initial values: %m");
                }
                if (restore) {
                        r = checkpoint_restore(p->ckpt, rs->name, rs->dir, rs->clock);
                        if (r < 0) {
                                store_set_restoring(p->store, false);
                                psd_checkpoint_failed(p, rs->name, r);
                        }
                }
        }
        if (ctl->members && store_job(p->store)) {
                const Psnet__Membership *m = ctl->members, *pm = ctl->prev_members;
                Job j = *store_job(p->store);
                if (ctl->job && job_from_proto(ctl->job, &j, err, sizeof err) < 0)
                        j = *store_job(p->store);
                if (m->n_start_clocks && m->n_start_clocks != m->n_workers) {
                        log_error("pscoord sent %zu start clocks for %zu workers", m->n_start_clocks, m->n_workers);
                        return;
                }
                _cleanup_free_ uint8_t (*keys)[32] = NULL;
                if (m->n_keys) {
                        keys = ps_malloc(m->n_keys * sizeof *keys);
                        bool ok = keys && m->n_keys == m->n_workers;
                        for (size_t i = 0; ok && i < m->n_keys; i++) {
                                ok = m->keys[i].len == 32;
                                if (ok)
                                        memcpy(keys[i], m->keys[i].data, 32);
                        }
                        if (!ok) {
                                log_error("pscoord sent %zu member keys for %zu workers", m->n_keys, m->n_workers);
                                return;
                        }
                }
                r = gate_set_config(p->gate, j.mode, j.staleness, m->workers,
                                    m->n_start_clocks ? m->start_clocks : NULL, (const uint8_t(*)[32]) keys,
                                    m->n_workers, pm ? pm->workers : NULL, pm ? pm->n_workers : 0,
                                    m->has_from_clock ? m->from_clock : 0, m->epoch);
                if (r < 0)
                        log_error_errno(r, "Failed to set membership: %m");
                else {
                        psd_rows_settle(p); /* a clock the leavers held, or a fence that ended */
                        /* Room for every member's pulls, and a little more. */
                        p->gate->limits.max_parked = 64 + GATE_PARKED_PER_WORKER * m->n_workers;
                        log_info("membership epoch=%lu workers=%zu from_clock=%ld mode=%s", (unsigned long) m->epoch,
                                 m->n_workers, (long) (m->has_from_clock ? m->from_clock : 0),
                                 job_mode_string(&j, mode, sizeof mode));
                }
        }
        /* Pushes waiting on shards that left are released; what other shards
         * sent under this map or membership is handled now. */
        migrate_map_changed(p->migrate, p->data);
        gate_wake(p->gate);
}

/* --- the pscoord session -------------------------------------------------------------- */

static void psd_registered(Session *s, bool again, void *ud) {
        Psd *p = ud;
        service_ready(p->service);
        log_info("registered%s coord=%s lease_ms=%u", again ? " again" : "", session_endpoint(s),
                 session_lease_ms(s));
}

static void psd_registration_failed(Session *s, int err, const char *reason, void *ud) {
        Psd *p = ud;
        if (err == -ETIMEDOUT && session_handshake_error(s)[0])
                log_error("cannot talk to pscoord at %s reason=\"%s\"", session_endpoint(s), reason);
        else if (err == -ETIMEDOUT)
                log_error_errno(err, "pscoord at %s did not answer within %u s (is it running?)", session_endpoint(s),
                                p->cfg->connect_timeout);
        else
                log_error("pscoord refused registration reason=\"%s\"", reason);
        p->exit_code = err;
        uv_stop(&p->loop);
}

static void psd_fence(Psd *p, const Psnet__Header *h) {
        Psnet__FenceRep fr = PSNET__FENCE_REP__INIT;
        Psnet__Header r;
        int64_t slowest, fastest;
        fr.max_clock = gate_fence(p->gate, &slowest, &fastest);
        /* ASP/SSP: a member's clocks completed here count its tables'
         * pushes too (a shard may hold rows and no chunk; a worker may push
         * rows of a clock before its chunks): the boundary comes past them,
         * and no pull past them is answered meanwhile. */
        const GateCfg *cfg = &p->gate->cur;
        for (size_t i = 0; cfg->mode != MODE_BSP && i < cfg->nmembers; i++) {
                int64_t lo, hi;
                rows_worker_clocks(p->rows, cfg->members[i], &lo, &hi);
                if (hi + 1 > fastest) {
                        fastest = hi + 1;
                        p->gate->fence_pull_limit = fastest + 1;
                }
        }
        fr.min_worker_clock = slowest;
        fr.max_worker_clock = fastest;
        wire_header_init(&r, PSNET__MSG_TYPE__MSG_FENCE_REP);
        r.body_case = PSNET__HEADER__BODY_FENCE_REP;
        r.fence_rep = &fr;
        int e = session_reply(p->coord, &r, h->seq);
        if (e < 0)
                log_warning_errno(e, "Failed to answer fence: %m");
        log_info("fence max_clock=%ld slowest=%ld fastest=%ld", (long) fr.max_clock, (long) slowest, (long) fastest);
}

/* A checkpoint's answer to pscoord (a save's, seq echoed; a restore's, seq 0). */
static void psd_checkpoint_done(void *ud, uint64_t seq, const Psnet__CheckpointRep *rep, int status,
                                const char *reason) {
        Psd *p = ud;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT_REP);
        h.body_case = PSNET__HEADER__BODY_CHECKPOINT_REP;
        h.checkpoint_rep = (Psnet__CheckpointRep *) rep;
        h.has_sender = true;
        h.sender = p->cfg->id;
        if (status != PSNET__STATUS__STATUS_OK) {
                h.has_status = true;
                h.status = status;
                h.reason = (char *) reason;
        }
        int r = p->coord ? session_reply(p->coord, &h, seq) : -ENOTCONN;
        if (r < 0)
                log_warning_errno(r, "Failed to tell pscoord about checkpoint %s: %m", rep->name);
}

static void psd_checkpoint_failed(Psd *p, const char *name, int err) {
        char reason[160];
        Psnet__CheckpointRep rep = PSNET__CHECKPOINT_REP__INIT;
        rep.name = (char *) name;
        rep.has_restore = true;
        rep.restore = true;
        snprintf(reason, sizeof reason, "cannot start loading checkpoint %s: %s", name, strerror(-err));
        log_error("%s", reason);
        psd_checkpoint_done(p, 0, &rep, status_from_errno(err), reason);
}

static void psd_checkpoint(Psd *p, const Psnet__Header *h) {
        char reason[256];
        const Psnet__Checkpoint *c = h->checkpoint;
        int st = PSNET__STATUS__STATUS_UNAVAILABLE;
        if (fedshard_number(p->fed))
                snprintf(reason, sizeof reason, "round %lu is open here: a federated job is cut between rounds",
                         (unsigned long) fedshard_number(p->fed));
        else
                st = checkpoint_save(p->ckpt, h->seq, c->name ? c->name : "", c->dir, c->has_clock ? c->clock : -1,
                                 reason, sizeof reason);
        if (st == PSNET__STATUS__STATUS_OK)
                return;
        Psnet__CheckpointRep rep = PSNET__CHECKPOINT_REP__INIT;
        rep.name = c->name ? c->name : (char *) "";
        log_warning("checkpoint refused name=%s reason=\"%s\"", rep.name, reason);
        psd_checkpoint_done(p, h->seq, &rep, st, reason);
}

/* pscoord opens or closes a federated round. */
/* Answers pscoord's ROUND (request seq) with rd and status st. */
static void psd_round_answer(Psd *p, uint64_t seq, Psnet__Round *rd, int st, const char *reason) {
        Psnet__Header r;
        wire_header_init(&r, PSNET__MSG_TYPE__MSG_ROUND_REP);
        r.body_case = PSNET__HEADER__BODY_ROUND;
        r.round = rd;
        r.has_sender = true;
        r.sender = p->cfg->id;
        if (st != PSNET__STATUS__STATUS_OK) {
                r.has_status = true;
                r.status = st;
                r.reason = (char *) reason;
        }
        int e = session_reply(p->coord, &r, seq);
        if (e < 0)
                log_warning_errno(e, "Failed to answer round %lu: %m", (unsigned long) rd->number);
}

/* GateAckFn's other half: a round's close whose chunks the backups now hold
 * (or that left the map) is answered. What a backup did not take is
 * rebuilt from here when the map changes; the round stands. */
static void psd_round_copied(Psd *p, PushReq *req) {
        if (req->status != PSNET__STATUS__STATUS_OK)
                log_warning("round %lu: a backup did not take its copy (status=%s); it is sent again with the next "
                            "round or map", (unsigned long) req->fed_number, status_name(req->status));
        else
                log_info("round copied to the backups number=%lu states=%zu", (unsigned long) req->fed_number,
                         req->fed_states);
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = req->fed_number;
        rd.has_close = rd.close = true;
        psd_round_answer(p, req->seq, &rd, PSNET__STATUS__STATUS_OK, NULL);
}

static void psd_round(Psd *p, const Psnet__Header *h) {
        char reason[320] = "";
        _cleanup_free_ double *dist = NULL;
        size_t ndist = 0;
        bool score = h->round->has_score && h->round->score;
        bool close = h->round->has_close && h->round->close;
        int st = score ? fedshard_score(p->fed, p->store, h->round, &dist, &ndist, reason, sizeof reason)
                       : fedshard_round(p->fed, p->store, h->round, p->memory_limit, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK)
                log_warning("round refused number=%lu status=%s reason=\"%s\"", (unsigned long) h->round->number,
                            status_name(st), reason);
        uint32_t backups[JOB_MAX_REPLICAS];
        if (st == PSNET__STATUS__STATUS_OK && close && h->round->n_clients > 0 && !store_job(p->store)->fed.async &&
            store_backups(p->store, backups, JOB_MAX_REPLICAS) > 0) {
                /* A replicated job: the close is answered once the backups hold
                 * the chunks it changed (psd_round_copied), so that a primary
                 * lost after pscoord counted the round leaves it in the copies. */
                PushReq *req;
                if (pushreq_new(NULL, h->seq, 0, (int64_t) h->round->number, &req) == 0) {
                        req->fed_round = true;
                        req->fed_number = h->round->number;
                        req->fed_states = migrate_replicate_led(p->migrate, req);
                        pushreq_settle(p->gate, req, PSNET__STATUS__STATUS_OK); /* the reader's hold */
                        return;
                }
                log_warning("out of memory: round %lu answered before its copies", (unsigned long) h->round->number);
        }
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = h->round->number;
        rd.has_close = h->round->has_close;
        rd.close = h->round->close;
        rd.has_score = score;
        rd.score = score;
        rd.n_distances = ndist;
        rd.distances = dist;
        psd_round_answer(p, h->seq, &rd, st, reason);
}

static void psd_on_coord(Session *s, WireMsg *m, void *ud) {
        Psd *p = ud;
        (void) s;
        switch (m->hdr->type) {
        case PSNET__MSG_TYPE__MSG_CONFIG:
                psd_apply_config(p, m->hdr->config);
                break;
        case PSNET__MSG_TYPE__MSG_FENCE:
                psd_fence(p, m->hdr);
                break;
        case PSNET__MSG_TYPE__MSG_CHECKPOINT:
                psd_checkpoint(p, m->hdr);
                break;
        case PSNET__MSG_TYPE__MSG_ROUND:
                psd_round(p, m->hdr);
                break;
        default:
                log_debug("ignoring message from pscoord type=%s", wire_type_name(m->hdr->type));
        }
        checkpoint_poll(p->ckpt);
}

/* The figures every heartbeat carries (psctl status shows them; pscoord acts on stragglers). */
static void psd_heartbeat(Session *s, Psnet__Heartbeat *hb, void *ud) {
        Psd *p = ud;
        (void) s;
        Psnet__ShardInfo *si = &p->hb;
        psnet__shard_info__init(si);
        si->id = p->cfg->id;
        si->endpoint = p->cfg->advertise ? p->cfg->advertise : p->cfg->listen;
        si->has_keys = si->has_bytes = si->has_clock = si->has_pushes = si->has_pulls = si->has_errors = true;
        si->keys = store_stats(p->store)->nkeys;
        si->bytes = store_stats(p->store)->bytes;
        si->clock = gate_clock(p->gate);
        si->pushes = store_stats(p->store)->pushes;
        si->pulls = store_stats(p->store)->pulls;
        si->errors = p->errors;
        si->has_incoming = si->has_map_epoch = si->has_parked = si->has_memory_limit = true;
        si->incoming = store_incoming(p->store);
        si->map_epoch = store_map(p->store) ? shardmap_epoch(store_map(p->store)) : 0;
        si->parked = p->gate->nparked;
        si->memory_limit = p->memory_limit;
        uint64_t ms = 0;
        si->n_stragglers = gate_stragglers(p->gate, now_ms(), p->stragglers, PSD_MAX_STRAGGLERS, &ms);
        si->stragglers = p->stragglers;
        si->has_stalled_ms = si->n_stragglers > 0;
        si->stalled_ms = ms;
        si->has_min_steps = si->has_max_steps = true;
        store_steps(p->store, &si->min_steps, &si->max_steps);
        si->has_min_worker_clock = si->has_max_worker_clock = true;
        gate_worker_clocks(p->gate, &si->min_worker_clock, &si->max_worker_clock);
        si->has_backup_keys = si->has_acknowledging = true;
        si->has_lr = store_stats(p->store)->applied > 0;
        si->lr = store_stats(p->store)->last_lr;
        si->backup_keys = store_stats(p->store)->backup_keys;
        si->acknowledging = psd_may_acknowledge(p);
        const Job *job = store_job(p->store);
        si->has_rows = si->has_rows_bytes = si->has_rows_admitted = si->has_rows_filtered = si->has_rows_refused =
                si->has_rows_evicted = job && job->ntables > 0;
        for (size_t i = 0; si->has_rows && i < job->ntables; i++) {
                uint64_t nrows, nbytes;
                TableCounts k;
                rows_table_stats(p->rows, i, &nrows, &nbytes, &k);
                si->rows += nrows;
                si->rows_bytes += nbytes;
                si->rows_admitted += k.admitted;
                si->rows_filtered += k.filtered;
                si->rows_refused += k.refused;
                si->rows_evicted += k.evicted_ttl + k.evicted_full;
        }
        si->has_rows_whole_epoch = si->has_rows && store_map(p->store);
        if (si->has_rows_whole_epoch)
                si->rows_whole_epoch = p->rows_await ? p->rows_whole_from
                                                     : rows_whole_epoch(p->rows, shardmap_epoch(store_map(p->store)));
        hb->shard = si;
}

/* --- the service: /metrics, /readyz, systemd's status line ---------------------------- */

static void psd_metrics(void *ud, MetricsBuf *b) {
        Psd *p = ud;
        const Store *s = p->store;
        const StoreStats *st = store_stats(s);
        const Gate *g = p->gate;
        metrics_one(b, "psnet_psd_shard_id", "gauge", "This shard's id.", p->cfg->id);
        metrics_one(b, "psnet_psd_pushes_total", "counter", "Pushed keys received (applied or refused).",
                    (double) st->pushes);
        metrics_one(b, "psnet_psd_pulls_total", "counter", "Keys sent in pull replies.", (double) st->pulls);
        metrics_one(b, "psnet_psd_updates_total", "counter", "Optimizer steps applied to chunks.", (double) st->applied);
        metrics_one(b, "psnet_psd_copies_total", "counter",
                    "Chunks copied before an update because a pull reply still read them.", (double) st->copies);
        metrics_one(b, "psnet_psd_received_bytes_total", "counter", "Gradient bytes received.", (double) p->bytes_in);
        metrics_one(b, "psnet_psd_sent_bytes_total", "counter", "Value bytes sent in pull replies.",
                    (double) p->bytes_out);
        metrics_one(b, "psnet_psd_errors_total", "counter", "Requests answered with an error.", (double) p->errors);
        metrics_family(b, "psnet_psd_refused_total", "counter", "Pushes and pulls refused, by reason.");
        metrics_sample(b, "psnet_psd_refused_total", (double) g->refused_stale, "reason", "not_member", NULL);
        metrics_sample(b, "psnet_psd_refused_total", (double) g->refused_denied, "reason", "key", NULL);
        metrics_sample(b, "psnet_psd_refused_total", (double) g->refused_nonfinite, "reason", "not_finite", NULL);
        metrics_sample(b, "psnet_psd_refused_total", (double) g->refused_norm, "reason", "grad_norm", NULL);
        metrics_sample(b, "psnet_psd_refused_total", (double) g->refused_pulls, "reason", "pull", NULL);
        metrics_sample(b, "psnet_psd_refused_total", (double) g->refused_clock, "reason", "clock", NULL);
        metrics_sample(b, "psnet_psd_refused_total", (double) g->expired_pulls, "reason", "pull_expired", NULL);
        metrics_one(b, "psnet_psd_duplicate_pushes_total", "counter",
                    "Pushes of a key for a clock its worker had pushed it for: acknowledged, not applied again.",
                    (double) g->duplicates);
        metrics_one(b, "psnet_psd_connections_closed_total", "counter",
                    "Data connections closed (peers leaving, or frames over the limit).", (double) p->dropped);
        metrics_one(b, "psnet_psd_memory_purged_bytes_total", "counter",
                    "Freed memory given back to the system after connections closed or messages were refused.",
                    (double) p->purge.purged);
        metrics_one(b, "psnet_psd_shm_sessions", "gauge",
                    "Same-host shared-memory sessions open (workers whose tensors travel through shared memory).",
                    (double) shm_server_sessions(p->shm));
        metrics_one(b, "psnet_psd_shm_refused_total", "counter", "Shared-memory handovers refused.",
                    (double) shm_server_refused(p->shm));
        metrics_one(b, "psnet_psd_shm_zeroed_total", "counter",
                    "Values a worker made NaN or infinite in its shared memory while its push was applied (applied "
                    "as 0).", (double) p->shm_changed);
        metrics_one(b, "psnet_psd_push_parts_total", "counter",
                    "Parts of workers' pushes sent in several messages (frames) taken.", (double) g->push_parts);
        metrics_one(b, "psnet_psd_threads", "gauge", "Threads that apply an update (--threads).",
                    (double) pfor_threads(p->pool));
        metrics_one(b, "psnet_psd_parallel_loops_total", "counter",
                    "Loops over a chunk's values (optimizer steps, checks, copies) cut between the threads.",
                    (double) pfor_loops(p->pool));
        metrics_one(b, "psnet_psd_keys", "gauge", "Keys (chunks) this shard holds.", (double) st->nkeys);
        metrics_one(b, "psnet_psd_model_bytes", "gauge", "Bytes of values and optimizer state held.", (double) st->bytes);
        metrics_one(b, "psnet_psd_memory_limit_bytes", "gauge", "Model state this shard may hold.",
                    (double) p->memory_limit);
        RowsStats rs;
        rows_stats(p->rows, &rs);
        metrics_one(b, "psnet_psd_memory_used_bytes", "gauge",
                    "Model state held, as --memory-limit counts it: values, optimizer state and table rows.",
                    (double) (st->bytes + rs.bytes));
        const Job *job = store_job(s);
        /* Each family's samples together, as the text format wants them. */
        static const struct {
                const char *name, *type, *help;
        } fam[] = {
                { "psnet_psd_table_rows", "gauge", "Rows of each sparse table this shard holds (--tables)." },
                { "psnet_psd_table_bytes", "gauge", "Bytes each sparse table's rows take here." },
                { "psnet_psd_table_rows_admitted_total", "counter", "Rows made (at an id's admit-th push)." },
                { "psnet_psd_table_pushes_filtered_total", "counter",
                  "Pushed rows of ids not admitted yet (admit > 1): counted, their gradients dropped." },
                { "psnet_psd_table_pushes_refused_total", "counter",
                  "Pushed rows of new ids dropped: the table at max-rows with rows all pushed at that clock." },
                { "psnet_psd_table_rows_evicted_total", "counter",
                  "Rows dropped: reason ttl (unpushed for ttl clocks) or full (the least recently pushed, at "
                  "max-rows)." },
        };
        for (size_t f = 0; job && job->ntables > 0 && f < ELEMENTSOF(fam); f++) {
                metrics_family(b, fam[f].name, fam[f].type, fam[f].help);
                for (size_t i = 0; i < job->ntables; i++) {
                        uint64_t nrows, nbytes;
                        TableCounts k;
                        rows_table_stats(p->rows, i, &nrows, &nbytes, &k);
                        const char *t = job->tables[i].name;
                        double v[] = { (double) nrows, (double) nbytes, (double) k.admitted, (double) k.filtered,
                                       (double) k.refused };
                        if (f < ELEMENTSOF(v))
                                metrics_sample(b, fam[f].name, v[f], "table", t, NULL);
                        else {
                                metrics_sample(b, fam[f].name, (double) k.evicted_ttl, "table", t, "reason", "ttl",
                                               NULL);
                                metrics_sample(b, fam[f].name, (double) k.evicted_full, "table", t, "reason", "full",
                                               NULL);
                        }
                }
        }
        metrics_one(b, "psnet_psd_rows_pulled_total", "counter", "Table rows sent in ROWS_PULL answers.",
                    (double) rs.pulled);
        metrics_one(b, "psnet_psd_rows_pushed_total", "counter", "Table rows a ROWS_PUSH applied.", (double) rs.pushed);
        metrics_one(b, "psnet_psd_rows_refused_total", "counter",
                    "ROWS_PULL and ROWS_PUSH requests refused by the tables (another shard's row, a duplicate id, a "
                    "non-finite value, the norm or memory bound, a wrong row width).", (double) rs.refused);
        metrics_one(b, "psnet_psd_table_backup_rows", "gauge",
                    "Copies this shard holds of table rows other shards lead (--replicas 2 or more), all tables.",
                    (double) rs.backup_rows);
        metrics_one(b, "psnet_psd_rows_copied_total", "counter",
                    "Table rows sent whole to their backups (after each BSP clock, and again after a fail-over).",
                    (double) migrate_rows_copied(p->migrate));
        metrics_one(b, "psnet_psd_rows_copies_received_total", "counter",
                    "Copies of a clock of a table received whole from a primary and installed.",
                    (double) rs.copies_in);
        metrics_one(b, "psnet_psd_rows_moved_total", "counter",
                    "Table rows sent whole to a new holder after a shard was added or removed.",
                    (double) migrate_rows_moved(p->migrate));
        metrics_one(b, "psnet_psd_rows_moved_in_total", "counter",
                    "Table rows received whole from their old primary after a shard was added or removed.",
                    (double) rs.moved_in);
        metrics_one(b, "psnet_psd_incoming_keys", "gauge", "Keys the map gives this shard that have not arrived.",
                    (double) store_incoming(s));
        metrics_one(b, "psnet_psd_clock", "gauge", "The shard's clock (BSP: slowest chunk; ASP/SSP: fastest worker).",
                    (double) gate_clock(g));
        metrics_one(b, "psnet_psd_lr", "gauge",
                    "The learning rate of the last update applied (with --lr-scaling and --lr-schedule).",
                    (double) st->last_lr);
        metrics_one(b, "psnet_psd_parked_pulls", "gauge", "Pulls waiting for their clock.", (double) g->nparked);
        metrics_one(b, "psnet_psd_members", "gauge", "Workers in the current membership.", (double) g->cur.nmembers);
        metrics_one(b, "psnet_psd_map_epoch", "gauge", "The shard map epoch this shard acts on.",
                    store_map(s) ? (double) shardmap_epoch(store_map(s)) : 0);
        metrics_one(b, "psnet_psd_moved_out_total", "counter", "Chunks sent to other shards.",
                    (double) migrate_moved_out(p->migrate));
        metrics_one(b, "psnet_psd_moved_in_total", "counter", "Chunks installed from other shards.",
                    (double) migrate_moved_in(p->migrate));
        metrics_one(b, "psnet_psd_backup_keys", "gauge", "Keys held as a backup (counted in psnet_psd_keys too).",
                    (double) st->backup_keys);
        metrics_one(b, "psnet_psd_forwarded_total", "counter", "Pushes forwarded to backups (one per backup).",
                    (double) migrate_forwarded(p->migrate));
        metrics_one(b, "psnet_psd_forwarded_bytes_total", "counter",
                    "Gradient bytes forwarded to backups (bf16 where the worker pushed bf16).",
                    (double) migrate_forwarded_bytes(p->migrate));
        metrics_one(b, "psnet_psd_replication_waiting", "gauge", "Pushes waiting for a backup's answer.",
                    (double) migrate_waiting(p->migrate));
        metrics_one(b, "psnet_psd_acknowledging", "gauge",
                    "1 while this shard may acknowledge (0: its lease ran out and it has backups).",
                    psd_may_acknowledge(p) ? 1 : 0);
        metrics_histogram(b, "psnet_psd_push_latency_seconds",
                          "From a push's arrival to its acknowledgement (BSP: includes waiting for the others).",
                          &p->push_latency);
        metrics_histogram(b, "psnet_psd_pull_latency_seconds",
                          "From a pull's arrival to its answer (includes waiting for the clock).", &p->pull_latency);
}

static bool psd_ready(void *ud, char *why, size_t n) {
        Psd *p = ud;
        if (!p->coord || !session_registered(p->coord)) {
                snprintf(why, n, "registering with pscoord");
                return false;
        }
        return true;
}

static void psd_status(void *ud, char *buf, size_t n) {
        Psd *p = ud;
        if (!store_job(p->store))
                snprintf(buf, n, "shard %u: %s", p->cfg->id, p->coord && session_registered(p->coord)
                                                                   ? "waiting for a job" : "registering with pscoord");
        else
                snprintf(buf, n, "shard %u: job %u, %lu keys, clock %ld, %zu members", p->cfg->id, store_job(p->store)->id,
                         (unsigned long) store_stats(p->store)->nkeys, (long) gate_clock(p->gate), p->gate->cur.nmembers);
}

/* --- life ------------------------------------------------------------------------------ */

static void psd_tick(uv_timer_t *t) {
        Psd *p = t->data;
        /* jemalloc keeps freed pages (common/jemalloc-conf.c: no decay, for
         * the speed of large messages): what closed connections and refused
         * messages held would stay resident for good. */
        (void) alloc_purge_due(&p->purge, now_ms(), "connections closed, messages refused or table rows moved");
        gate_expire(p->gate, now_ms());
        (void) psd_may_acknowledge(p); /* logs a lease lost while no request came */
        checkpoint_poll(p->ckpt);
        shm_server_tick(p->shm, now_ms());
        /* After a fail-over, the copies of the rows led here join their
         * tables, PSD_PROMOTE_ROWS looked at a step (a row touched meanwhile
         * joins at once), then the rows led here go to their backups again,
         * PSD_REBUILD_ROWS a step: steps for PSD_REBUILD_MS of each tick, so
         * that requests still get most of the loop. */
        for (uint64_t t0 = now_ms(); now_ms() - t0 < PSD_REBUILD_MS;) {
                /* After a map change that moves rows: this shard's part in
                 * it, PSD_REBUILD_ROWS a step (psd-rows.h, "rows moved"). */
                const RowsMoveHooks mh = { psd_rows_move, psd_rows_record, psd_rows_moved, psd_rows_busy, p };
                if (rows_move_step(p->rows, PSD_REBUILD_ROWS, &mh))
                        continue;
                size_t budget = rows_promoting(p->rows) ? PSD_PROMOTE_ROWS : PSD_REBUILD_ROWS;
                if (!rows_rebuild_step(p->rows, budget, psd_rows_rebuild, p))
                        break;
        }
        if (migrate_copies_refused(p->migrate) != p->copies_refused_seen) {
                p->copies_refused_seen = migrate_copies_refused(p->migrate);
                if (store_map(p->store))
                        rows_copies_lost(p->rows, shardmap_epoch(store_map(p->store)));
        }
        if (rows_moves(p->rows) != p->moves_seen) {
                /* Rows that left the tables: their pages go back to the system. */
                p->moves_seen = rows_moves(p->rows);
                alloc_purge_soon(&p->purge, now_ms());
        }
        uint64_t from, done = rows_rebuilds(p->rows, &from);
        if (done != p->rebuilds_seen) {
                p->rebuilds_seen = done;
                p->rows_whole_from = from;
                p->rows_await = true;
                migrate_mark(p->migrate);
        }
        if (p->rows_await && migrate_marked_answered(p->migrate)) {
                p->rows_await = false;
                log_info("table rows whole again: every copy of the rebuild answered");
        }
}

static void psd_left(Session *s, int r, WireMsg *m, void *ud) {
        Psd *p = ud;
        (void) s, (void) m;
        if (r < 0)
                log_debug_errno(r, "pscoord did not answer the deregistration: %m");
        uv_stop(&p->loop);
}

static void psd_stop(void *ud, int signo) {
        Psd *p = ud;
        (void) signo;
        if (p->stopping)
                return;
        p->stopping = true;
        service_stopping(p->service);
        /* Leave the cluster, answered or not within half a second; serve meanwhile. */
        if (session_deregister(p->coord, NULL, 500, psd_left, p) < 0)
                uv_stop(&p->loop);
}

static void psd_reload(void *ud) {
        zap_sighup(((Psd *) ud)->zap); /* the job comes from pscoord: nothing else to read again */
}

/* Memory available to this process: MemAvailable, or the cgroup's limit when
 * lower: cgroup v2's memory.max, or v1's memory.limit_in_bytes (a container's
 * limit under cgroup v1, where v2's file is absent; "no limit" there is a
 * huge number, which MemAvailable then undercuts). */
static uint64_t memory_available(void) {
        static const char *const limits[] = { "/sys/fs/cgroup/memory.max",
                                               "/sys/fs/cgroup/memory/memory.limit_in_bytes" };
        uint64_t avail = 0, v;
        char line[256];
        FILE *f = fopen("/proc/meminfo", "re");
        while (f && fgets(line, sizeof line, f))
                if (sscanf(line, "MemAvailable: %lu kB", &v) == 1)
                        avail = v * 1024;
        if (f)
                fclose(f);
        for (size_t i = 0; i < ELEMENTSOF(limits); i++) {
                f = fopen(limits[i], "re");
                if (f && fgets(line, sizeof line, f) && sscanf(line, "%lu", &v) == 1 && (!avail || v < avail))
                        avail = v;
                if (f)
                        fclose(f);
        }
        return avail;
}

/* Keys and ZAP, and whether it may listen where it is told to. */
static int psd_security(Psd *p) {
        const PsdConfig *cfg = p->cfg;
        return zap_daemon_keys(&p->loop, p->zctx, cfg->keys, cfg->key ? cfg->key : "psd",
                               cfg->coord_key ? cfg->coord_key : "pscoord", PSNET__ROLE__ROLE_SERVER,
                               wire_roles_at(true), cfg->listen, cfg->insecure, &p->id, &p->zap);
}

int psd_run(const PsdConfig *cfg) {
        Psd p = { .cfg = cfg, .acknowledging = true };
        int r;

        r = uv_loop_init(&p.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        const ServiceOps sops = { .stop = psd_stop, .reload = psd_reload, .metrics = psd_metrics,
                                  .ready = psd_ready, .status = psd_status };
        r = service_new(&p.loop, "psd", &sops, &p, &p.service);
        if (r < 0) {
                log_error_errno(r, "Failed to set up signals: %m");
                goto finish;
        }
        fdguard_message_bound(psd_message_bound(&p, NULL));
        fdguard_message_time(cfg->idle_timeout * 1000ull);
        char herr[256];
        if (cfg->http && (r = service_http(p.service, cfg->http, herr, sizeof herr)) < 0) {
                log_error("%s", herr);
                r = -EINVAL;
                goto finish;
        }
        p.zctx = zmq_ctx_new();
        if (!p.zctx) {
                r = log_error_errno(errno, "Failed to create ZeroMQ context: %m");
                goto finish;
        }
        (void) zmq_ctx_set(p.zctx, ZMQ_IO_THREADS, 1);
        r = psd_security(&p);
        if (r < 0)
                goto finish;
        p.memory_limit = cfg->memory_limit ? cfg->memory_limit : memory_available();
        r = pfor_new(cfg->threads ? cfg->threads : 1, &p.pool);
        if (r < 0) {
                log_error_errno(r, "Failed to start %u threads: %m", cfg->threads);
                goto finish;
        }
        cpu_set_t cpus;
        if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && (unsigned) CPU_COUNT(&cpus) < cfg->threads)
                log_warning("--threads %u is more than the %d CPUs this shard may run on: its threads will take "
                            "CPU from each other and from their neighbours", cfg->threads, CPU_COUNT(&cpus));
        /* The links to other shards, the store (its chunks move over the
         * links), the gate over the store (it forwards pushes over them). */
        r = migrate_new(&p.loop, p.zctx, &p.id, cfg->id, &p.migrate);
        if (r == 0) {
                const StoreConf sc = { .shard_id = cfg->id, .pool = p.pool, .move = migrate_out,
                                       .move_userdata = p.migrate };
                r = store_new(&sc, &p.store);
        }
        if (r == 0) {
                const GateHooks gh = { .ack = psd_ack, .answer = psd_answer, .forward = psd_forward, .ud = &p };
                r = gate_new(p.store, &gh, &p.gate);
        }
        if (r == 0) {
                migrate_attach(p.migrate, p.gate);
                p.gate->limits.park_timeout_ms = (uint64_t) cfg->park_timeout * 1000u;
                r = checkpointer_new(p.gate, &p.loop, cfg->id, psd_checkpoint_done, &p, &p.ckpt);
        }
        if (r == 0)
                r = fedshard_new(&p.fed);
        if (r == 0)
                r = rows_new(&p.rows);
        if (r == 0) {
                const RowsHooks rh = { .members = psd_rows_members, .closed = psd_rows_closed, .want = psd_rows_want,
                                       .ud = &p };
                table_set_poll(psd_poll_session, &p);
                rows_set_hooks(p.rows, &rh);
                migrate_attach_rows(p.migrate, p.rows);
                checkpointer_set_rows(p.ckpt, p.rows);
        }
        if (r < 0) {
                log_error_errno(r, "Failed to allocate the store: %m");
                goto finish;
        }
        /* Per connection: a worker has a few requests in flight, and no queue
         * holds more than a few dozen messages. */
        const NetSockConf dc = { .type = ZMQ_ROUTER, .name = "data", .max_msg = (int64_t) cfg->max_msg,
                                 .sndhwm = 64, .rcvhwm = 64, .handover = true,
                                 .heartbeat_ms = cfg->idle_timeout * 1000u / 3u,
                                 .keys = p.id.enabled ? &p.id.keys : NULL, .curve_server = true,
                                 .zap_domain = p.id.enabled ? "psnet" : NULL };
        r = netsock_new(&p.loop, p.zctx, &dc, psd_on_data, &p, &p.data);
        if (r == 0)
                r = netsock_monitor(p.data, ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                                    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                    psd_on_data_event);
        if (r < 0) {
                log_error_errno(r, "Failed to create the data socket: %m");
                goto finish;
        }
        r = netsock_bind(p.data, cfg->listen);
        if (r < 0) {
                log_error_errno(r, "Failed to bind %s: %m", cfg->listen);
                goto finish;
        }
        if (!cfg->no_shm && (r = shm_server_new(&p.loop, cfg->listen, &p.shm)) < 0)
                goto finish;
        r = uv_timer_init(&p.loop, &p.tick);
        if (r == 0) {
                p.tick.data = &p;
                r = uv_timer_start(&p.tick, psd_tick, 100, 100);
        }
        if (r < 0) {
                log_error_errno(r, "Failed to start a timer: %s", uv_strerror(r));
                goto finish;
        }
        const SessionConf sc = {
                .endpoint = cfg->coord, .role = PSNET__ROLE__ROLE_SERVER, .want_id = cfg->id,
                .advertise = cfg->advertise ? cfg->advertise : cfg->listen,
                .connect_timeout_ms = cfg->connect_timeout * 1000u, .memory_limit = p.memory_limit,
                .max_msg = cfg->max_msg,
                .keys = p.id.enabled ? &p.id.keys : NULL, .coord_key = p.id.enabled ? p.id.coord_key : NULL,
                .own_context = true, /* its lease apart from its links to workers and shards */
        };
        const SessionOps so = { .registered = psd_registered, .failed = psd_registration_failed,
                                .message = psd_on_coord, .heartbeat = psd_heartbeat };
        r = session_new(&p.loop, p.zctx, &sc, &so, &p, &p.coord);
        if (r == 0)
                r = session_start(p.coord);
        if (r < 0) {
                log_error_errno(r, "Bad pscoord endpoint %s: %m", cfg->coord);
                goto finish;
        }
        log_info("listening endpoint=%s allocator=%s security=%s memory_limit=%lu http=%s shm=%s threads=%u",
                 cfg->listen, alloc_name(), p.id.enabled ? "curve" : "none", (unsigned long) p.memory_limit,
                 cfg->http && *cfg->http ? cfg->http : "-", p.shm ? "on" : "off", pfor_threads(p.pool));
        (void) uv_run(&p.loop, UV_RUN_DEFAULT);
        r = p.exit_code;
        if (p.stopping)
                log_info("stopped pushes=%lu pulls=%lu applied=%lu copies=%lu push_parts=%lu errors=%lu",
                         (unsigned long) store_stats(p.store)->pushes, (unsigned long) store_stats(p.store)->pulls,
                         (unsigned long) store_stats(p.store)->applied, (unsigned long) store_stats(p.store)->copies,
                         (unsigned long) p.gate->push_parts, (unsigned long) p.errors);
finish:
        /* Pushes waiting on backups, parked pulls and acks in flight are answered
         * before the socket closes; the links go first, while the store lives. */
        if (p.ckpt)
                checkpointer_free(p.ckpt);
        p.fed = fedshard_free(p.fed);
        p.rows = rows_free(p.rows);
        p.migrate = migrate_free(p.migrate);
        p.gate = gate_free(p.gate);
        p.store = store_free(p.store);
        p.pool = pfor_free(p.pool);
        p.data = netsock_close(p.data);
        p.shm = shm_server_free(p.shm);
        p.coord = session_free(p.coord);
        p.zap = zap_free(p.zap);
        p.service = service_free(p.service);
        if (p.tick.data)
                uv_close((uv_handle_t *) &p.tick, NULL);
        uv_run(&p.loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
        if (uv_loop_close(&p.loop) < 0)
                log_debug("event loop closed with handles open");
        if (p.zctx)
                zmq_ctx_term(p.zctx);
        return r;
}
