/* psd's event loop; see psd-server.h. One thread, one uv_loop: the data ROUTER,
 * the pscoord session, DEALERs to other shards (moving chunks) and signals.
 * Requests are pipelined: a BSP pull that must wait is parked and answered
 * when its clock closes, while other requests go on; while pscoord is away
 * (restart, registering again) the shard keeps serving. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "alloc.h"
#include "endpoint.h"
#include "errors.h"
#include "keys.h"
#include "netsock.h"
#include "service.h"
#include "session.h"
#include "wire-job.h"
#include "zap.h"
#include "log.h"
#include "psd-server.h"
#include "psd-optim.h"
#include "psd-store.h"

typedef struct ParkedPull {
        zmq_msg_t route;
        Psnet__Header *hdr;   /* the request, owned */
} ParkedPull;

/* A DEALER to another shard, for chunks that move there. */
typedef struct PeerShard {
        char *endpoint;
        NetSock *sock;
} PeerShard;

typedef struct Psd {
        const PsdConfig *cfg;
        PeerShard *peers;
        size_t npeers;
        WireMsg *stash;         /* chunk states that arrived before the map that sends them here */
        size_t nstash;
        uint64_t moved_out, moved_in;
        uv_loop_t loop;
        void *zctx;
        NetSock *data;
        Session *coord;
        Service *service;
        Store *store;
        ParkedPull *parked;
        size_t nparked, cparked;
        uint64_t errors;
        Psnet__ShardInfo hb;    /* the figures of the heartbeat being sent */
        NetIdentity id;
        Zap *zap;
        bool stopping;
        int exit_code;
} Psd;

static int psd_reply_error(Psd *p, const zmq_msg_t *route, const Psnet__Header *req, int status,
                           const char *reason) {
        if (status == PSNET__STATUS__STATUS_MOVED || status == PSNET__STATUS__STATUS_MIGRATING)
                log_debug("redirected request reason=\"%s\" status=%s", reason, status_name(status));
        else {
                p->errors++;
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
        if ((status == PSNET__STATUS__STATUS_MOVED || status == PSNET__STATUS__STATUS_MIGRATING) && p->store->map) {
                h.has_epoch = true;
                h.epoch = shardmap_epoch(p->store->map);
        }
        return netsock_send(p->data, route, &h, NULL, 0);
}

/* StoreAckFn: a PUSH request is settled. */
static void psd_ack(void *userdata, PushReq *req) {
        Psd *p = userdata;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH_ACK);
        h.has_seq = true;
        h.seq = req->seq;
        h.has_status = req->status != PSNET__STATUS__STATUS_OK;
        h.status = req->status;
        h.has_clock = true;
        h.clock = req->clock;
        h.has_sender = true;
        h.sender = p->cfg->id;
        if (p->store->map) {
                h.has_epoch = true;
                h.epoch = shardmap_epoch(p->store->map);
        }
        if (req->status != PSNET__STATUS__STATUS_OK && req->status != PSNET__STATUS__STATUS_DUPLICATE &&
            req->status != PSNET__STATUS__STATUS_MOVED)
                log_warning("push refused worker=%u clock=%ld status=%s", req->worker,
                            (long) req->clock, status_name(req->status));
        int r = netsock_send(p->data, &req->route, &h, NULL, 0);
        if (r < 0)
                log_warning_errno(r, "Failed to acknowledge push worker=%u: %m", req->worker);
}

/* Looks every key of a request up; on failure answers the error and returns false. */
static bool psd_check_keys(Psd *p, const zmq_msg_t *route, const Psnet__Header *h, Chunk **chunks) {
        char reason[192];
        if (h->job != p->store->job.id) {
                snprintf(reason, sizeof reason, "job %u is not served here (this shard serves job %u)",
                         h->job, p->store->job.id);
                psd_reply_error(p, route, h, PSNET__STATUS__STATUS_INVALID, reason);
                return false;
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                int st;
                const Psnet__Key *k = h->keys[i];
                chunks[i] = store_lookup(p->store, k->tensor, k->chunk, k->len, &st);
                if (chunks[i])
                        continue;
                if (st == PSNET__STATUS__STATUS_SIZE)
                        snprintf(reason, sizeof reason,
                                 "key (%u,%u) declares %u floats, the job's chunk has %u", k->tensor,
                                 k->chunk, k->len, job_chunk_len(&p->store->job, k->tensor, k->chunk));
                else if (st == PSNET__STATUS__STATUS_MOVED)
                        snprintf(reason, sizeof reason, "key (%u,%u) is owned by another shard",
                                 k->tensor, k->chunk);
                else if (st == PSNET__STATUS__STATUS_MIGRATING)
                        snprintf(reason, sizeof reason, "key (%u,%u) is moving here; retry", k->tensor, k->chunk);
                else
                        snprintf(reason, sizeof reason, "key (%u,%u) is not a key of job %u",
                                 k->tensor, k->chunk, p->store->job.id);
                psd_reply_error(p, route, h, st, reason);
                return false;
        }
        return true;
}

static bool pull_ready(Psd *p, const Psnet__Header *h, Chunk **chunks) {
        int64_t slowest;
        bool ready = store_pull_ready(p->store, chunks, h->n_keys, h->clock, &slowest);
        if (ready && store_cfg(p->store, h->clock)->mode == MODE_SSP)
                /* The SSP bound, observable by the tests: clock - slowest <= staleness. */
                log_debug("ssp pull worker=%u clock=%ld slowest=%ld staleness=%u", h->sender, (long) h->clock,
                          (long) slowest, store_cfg(p->store, h->clock)->staleness);
        return ready;
}

static int psd_send_values(Psd *p, const zmq_msg_t *route, const Psnet__Header *req, Chunk **chunks) {
        size_t n = req->n_keys;
        zmq_msg_t *frames = ps_malloc((n ? n : 1) * sizeof *frames);
        if (!frames)
                return -ENOMEM;
        int64_t clock = -1;
        for (size_t i = 0; i < n; i++) {
                int r = store_value_msg(p->store, chunks[i], &frames[i]);
                if (r < 0) {
                        for (size_t j = 0; j < i; j++)
                                zmq_msg_close(&frames[j]);
                        ps_free(frames);
                        return r;
                }
                if (clock < 0 || chunks[i]->clock < clock)
                        clock = chunks[i]->clock;
        }
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL_REP);
        h.has_seq = true;
        h.seq = req->seq;
        h.has_clock = true;
        h.clock = clock < 0 ? 0 : clock;
        h.has_sender = true;
        h.sender = p->cfg->id;
        h.has_job = true;
        h.job = p->store->job.id;
        h.n_keys = n;
        h.keys = req->keys;
        int r = netsock_send(p->data, route, &h, frames, n);
        ps_free(frames);
        return r;
}

static int psd_park(Psd *p, WireMsg *m) {
        if (p->nparked == p->cparked) {
                size_t n = p->cparked ? p->cparked * 2 : 8;
                ParkedPull *q = ps_realloc(p->parked, n * sizeof *q);
                if (!q)
                        return -ENOMEM;
                p->parked = q;
                p->cparked = n;
        }
        ParkedPull *pp = &p->parked[p->nparked++];
        zmq_msg_init(&pp->route);
        zmq_msg_move(&pp->route, &m->route);
        pp->hdr = m->hdr;
        m->hdr = NULL;
        return 0;
}

/* Answers every parked pull whose clock has closed (or that can no longer be served). */
static void psd_wake_parked(Psd *p) {
        size_t j = 0;
        for (size_t i = 0; i < p->nparked; i++) {
                ParkedPull *pp = &p->parked[i];
                Psnet__Header *h = pp->hdr;
                Chunk *stack[64], **chunks = h->n_keys <= 64 ? stack : ps_malloc(h->n_keys * sizeof *chunks);
                bool done = true;
                if (!chunks) {
                        p->parked[j++] = *pp;
                        continue;
                }
                if (!psd_check_keys(p, &pp->route, h, chunks))
                        done = true; /* answered with an error */
                else if (pull_ready(p, h, chunks)) {
                        int r = psd_send_values(p, &pp->route, h, chunks);
                        if (r < 0)
                                log_warning_errno(r, "Failed to answer pull: %m");
                } else
                        done = false;
                if (chunks != stack)
                        ps_free(chunks);
                if (done) {
                        zmq_msg_close(&pp->route);
                        psnet__header__free_unpacked(h, NULL);
                } else
                        p->parked[j++] = *pp;
        }
        p->nparked = j;
}

/* Answers from other shards to the chunk states we sent: only refusals come back. */
static void psd_on_peer_msg(NetSock *ns, WireMsg *m, int r, void *ud) {
        (void) ud;
        if (r == 0 && m->hdr->type == PSNET__MSG_TYPE__MSG_ERROR)
                log_error("shard at %s refused a chunk we sent status=%s reason=\"%s\"", netsock_name(ns),
                          status_name(m->hdr->status), m->hdr->reason ? m->hdr->reason : "");
        else if (r < 0)
                log_warning("bad answer from the shard at %s reason=\"%s\"", netsock_name(ns), m->reason);
}

static NetSock *psd_peer_socket(Psd *p, const ShardDesc *dest) {
        for (size_t i = 0; i < p->npeers; i++)
                if (strcmp(p->peers[i].endpoint, dest->endpoint) == 0)
                        return p->peers[i].sock;
        PeerShard *n = ps_realloc(p->peers, (p->npeers + 1) * sizeof *n);
        if (!n)
                return NULL;
        p->peers = n;
        char *ep = ps_strdup(dest->endpoint);
        NetSock *sock = NULL;
        /* A chunk state is values + optimizer state: unbounded queue, and up to
         * 5 s at close to deliver what is still queued. */
        const NetSockConf nc = { .type = ZMQ_DEALER, .name = dest->endpoint, .linger_ms = 5000,
                                 .keys = p->id.enabled ? &p->id.keys : NULL };
        if (p->id.enabled && !dest->has_public_key) {
                log_error("the map has no key for shard %u at %s", dest->id, dest->endpoint);
                ps_free(ep);
                return NULL;
        }
        int r = ep ? netsock_new(&p->loop, p->zctx, &nc, psd_on_peer_msg, p, &sock) : -ENOMEM;
        if (r == 0)
                r = netsock_connect(sock, dest->endpoint, p->id.enabled ? dest->public_key : NULL);
        if (r < 0) {
                sock = netsock_close(sock);
                ps_free(ep);
                return NULL;
        }
        p->peers[p->npeers++] = (PeerShard) { .endpoint = ep, .sock = sock };
        return sock;
}

/* StoreMoveFn: sends a chunk that the new map gives to another shard. */
static void psd_move_chunk(void *userdata, Chunk *c, const ShardDesc *dest) {
        Psd *p = userdata;
        size_t per = optim_state_per_value(&p->store->job.optim);
        zmq_msg_t frames[2];
        NetSock *sock = psd_peer_socket(p, dest);
        if (!sock) {
                log_error("cannot reach shard %u at %s: chunk (%u,%u) is lost", dest->id, dest->endpoint, c->tensor,
                          c->chunk);
                return;
        }
        if (store_value_msg(p->store, c, &frames[0]) < 0)
                return;
        if (zmq_msg_init_size(&frames[1], (size_t) c->len * per * sizeof(float)) < 0) {
                zmq_msg_close(&frames[0]);
                return;
        }
        if (per)
                memcpy(zmq_msg_data(&frames[1]), c->state, (size_t) c->len * per * sizeof(float));
        Psnet__Key key = PSNET__KEY__INIT, *keys[1] = { &key };
        key.tensor = c->tensor;
        key.chunk = c->chunk;
        key.len = c->len;
        Psnet__ChunkState cs = PSNET__CHUNK_STATE__INIT;
        cs.has_steps = true;
        cs.steps = c->steps;
        cs.n_last_clocks = c->nlast;
        cs.last_clocks = c->last_clock;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHUNK_STATE);
        h.has_job = h.has_epoch = h.has_clock = h.has_sender = true;
        h.job = p->store->job.id;
        h.epoch = shardmap_epoch(p->store->map);
        h.clock = c->clock;
        h.sender = p->cfg->id;
        h.n_keys = 1;
        h.keys = keys;
        h.body_case = PSNET__HEADER__BODY_CHUNK_STATE;
        h.chunk_state = &cs;
        int r = netsock_send(sock, NULL, &h, frames, 2);
        if (r < 0)
                log_error_errno(r, "Failed to send chunk (%u,%u) to shard %u: %m", c->tensor, c->chunk, dest->id);
        else {
                p->moved_out++;
                log_debug("chunk moved out key=(%u,%u) to=%u clock=%ld", c->tensor, c->chunk, dest->id, (long) c->clock);
        }
}

/* Installs a chunk state; returns a status for the acknowledgement. */
static int psd_install(Psd *p, WireMsg *m) {
        const Psnet__Header *h = m->hdr;
        const Psnet__Key *k = h->keys[0];
        const Psnet__ChunkState *cs = h->chunk_state;
        size_t sbytes = zmq_msg_size(&m->frames[1]);
        /* Copied straight from the received frames into the new chunk. */
        int r = store_install(p->store, k->tensor, k->chunk, zmq_msg_data(&m->frames[0]), k->len,
                              zmq_msg_data(&m->frames[1]), sbytes / sizeof(float),
                              cs->has_steps ? cs->steps : 0, h->clock, cs->last_clocks, cs->n_last_clocks);
        if (r == -EEXIST)
                return PSNET__STATUS__STATUS_DUPLICATE;
        if (r == -ENOENT)
                return PSNET__STATUS__STATUS_MOVED;
        if (r < 0)
                return PSNET__STATUS__STATUS_INVALID;
        p->moved_in++;
        log_debug("chunk moved in key=(%u,%u) clock=%ld", k->tensor, k->chunk, (long) h->clock);
        return PSNET__STATUS__STATUS_OK;
}

static void psd_handle_chunk_state(Psd *p, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        if (!p->store->has_job || h->job != p->store->job.id || !h->has_clock || h->clock < 0) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_INVALID, "chunk state for another job");
                return;
        }
        int st = psd_install(p, m);
        if (st == PSNET__STATUS__STATUS_MOVED && p->store->map && h->epoch > shardmap_epoch(p->store->map)) {
                /* Sent under a map this shard has not received yet: keep it for then. */
                WireMsg *n = ps_realloc(p->stash, (p->nstash + 1) * sizeof *n);
                if (n) {
                        p->stash = n;
                        p->stash[p->nstash++] = *m;
                        memset(m, 0, sizeof *m); /* ownership moved */
                        zmq_msg_init(&m->route);
                        return;
                }
        }
        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE) {
                char reason[96];
                snprintf(reason, sizeof reason, "chunk (%u,%u) not installed", h->keys[0]->tensor, h->keys[0]->chunk);
                psd_reply_error(p, &m->route, h, st, reason);
        }
        psd_wake_parked(p);
}

static void psd_try_stash(Psd *p) {
        size_t j = 0;
        for (size_t i = 0; i < p->nstash; i++) {
                WireMsg *m = &p->stash[i];
                int st = psd_install(p, m);
                if (st == PSNET__STATUS__STATUS_MOVED && p->store->map && m->hdr->epoch > shardmap_epoch(p->store->map))
                        p->stash[j++] = *m;
                else {
                        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE)
                                log_error("stashed chunk (%u,%u) could not be installed status=%s",
                                          m->hdr->keys[0]->tensor, m->hdr->keys[0]->chunk, status_name(st));
                        wire_msg_done(m);
                }
        }
        p->nstash = j;
}

static void psd_handle_data(Psd *p, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        char reason[160];

        if (h->type == PSNET__MSG_TYPE__MSG_CHUNK_STATE) {
                psd_handle_chunk_state(p, m);
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_CHUNK_ACK || h->type == PSNET__MSG_TYPE__MSG_ERROR)
                return; /* answers to our chunk states arrive on the peer sockets, not here */
        if (h->type != PSNET__MSG_TYPE__MSG_PULL && h->type != PSNET__MSG_TYPE__MSG_PUSH) {
                snprintf(reason, sizeof reason, "psd serves PULL and PUSH, not message type %d",
                         h->type);
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_UNKNOWN_TYPE, reason);
                return;
        }
        if (!p->store->has_job) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_NO_JOB,
                                "no job is configured on this shard yet");
                return;
        }
        if (h->n_keys == 0 || !h->has_clock || h->clock < 0 || !h->has_sender || !h->has_seq) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_MALFORMED,
                                "PULL/PUSH need keys, clock >= 0, sender and seq");
                return;
        }
        _cleanup_free_ Chunk **chunks = ps_malloc(h->n_keys * sizeof *chunks);
        if (!chunks) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        if (!psd_check_keys(p, &m->route, h, chunks))
                return;

        if (h->type == PSNET__MSG_TYPE__MSG_PULL) {
                if (!pull_ready(p, h, chunks)) {
                        if (psd_park(p, m) < 0)
                                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_RESOURCE,
                                                "out of memory");
                        return;
                }
                int r = psd_send_values(p, &m->route, h, chunks);
                if (r < 0)
                        log_warning_errno(r, "Failed to answer pull: %m");
                return;
        }

        /* PUSH: every key was checked above, so the request is applied whole or not at all. */
        PushReq *req;
        int r = pushreq_new(&m->route, h->seq, h->sender, h->clock, &req);
        if (r < 0) {
                psd_reply_error(p, &m->route, h, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                r = store_push(p->store, chunks[i], req, &m->frames[i]);
                if (r < 0) {
                        log_error_errno(r, "Failed to apply push: %m");
                        req->status = status_from_errno(r);
                }
        }
        pushreq_settle(p->store, req, PSNET__STATUS__STATUS_OK);
        psd_wake_parked(p);
}

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
                bool fresh = !p->store->has_job || p->store->job.id != job.id;
                r = store_configure(p->store, &job, map);
                shardmap_free(map);
                if (r < 0) {
                        log_error_errno(r, "Failed to configure the store: %m");
                        return;
                }
                psd_try_stash(p);
                if (!fresh && ctl->map->epoch != 0)
                        log_info("map epoch=%lu keys=%lu incoming=%lu moved_out=%lu", (unsigned long) ctl->map->epoch,
                                 (unsigned long) p->store->nkeys, (unsigned long) store_incoming(p->store),
                                 (unsigned long) p->moved_out);
                if (fresh)
                        log_info("job configured job=%u model=%s mode=%s keys=%lu bytes=%lu map_epoch=%lu",
                                 job.id, job.model, job_mode_string(&job, mode, sizeof mode),
                                 (unsigned long) p->store->nkeys, (unsigned long) p->store->bytes,
                                 (unsigned long) ctl->map->epoch);
        }
        if (ctl->members && p->store->has_job) {
                const Psnet__Membership *m = ctl->members, *pm = ctl->prev_members;
                Job j = p->store->job;
                if (ctl->job && job_from_proto(ctl->job, &j, err, sizeof err) < 0)
                        j = p->store->job;
                if (m->n_start_clocks && m->n_start_clocks != m->n_workers) {
                        log_error("pscoord sent %zu start clocks for %zu workers", m->n_start_clocks, m->n_workers);
                        return;
                }
                r = store_set_config(p->store, j.mode, j.staleness, m->workers,
                                     m->n_start_clocks ? m->start_clocks : NULL, m->n_workers,
                                     pm ? pm->workers : NULL, pm ? pm->n_workers : 0,
                                     m->has_from_clock ? m->from_clock : 0, m->epoch);
                if (r < 0)
                        log_error_errno(r, "Failed to set membership: %m");
                else {
                        log_info("membership epoch=%lu workers=%zu from_clock=%ld mode=%s", (unsigned long) m->epoch,
                                 m->n_workers, (long) (m->has_from_clock ? m->from_clock : 0),
                                 job_mode_string(&j, mode, sizeof mode));
                }
        }
        psd_wake_parked(p);
}

/* --- the pscoord session -------------------------------------------------------- */

static void psd_registered(Session *s, bool again, void *ud) {
        (void) ud;
        if (again)
                log_info("registered again coord=%s lease_ms=%u", session_endpoint(s), session_lease_ms(s));
        else
                log_info("registered coord=%s lease_ms=%u", session_endpoint(s), session_lease_ms(s));
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
        fr.max_clock = store_fence(p->store, &slowest, &fastest);
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
        default:
                log_debug("ignoring message from pscoord type=%s", wire_type_name(m->hdr->type));
        }
}

/* The figures every heartbeat carries (psctl status shows them). */
static void psd_heartbeat(Session *s, Psnet__Heartbeat *hb, void *ud) {
        Psd *p = ud;
        (void) s;
        Psnet__ShardInfo *si = &p->hb;
        psnet__shard_info__init(si);
        si->id = p->cfg->id;
        si->endpoint = p->cfg->advertise ? p->cfg->advertise : p->cfg->listen;
        si->has_keys = si->has_bytes = si->has_clock = si->has_pushes = si->has_pulls = si->has_errors = true;
        si->keys = p->store->nkeys;
        si->bytes = p->store->bytes;
        si->clock = store_clock(p->store);
        si->pushes = p->store->pushes;
        si->pulls = p->store->pulls;
        si->errors = p->errors;
        si->has_incoming = si->has_map_epoch = si->has_parked = true;
        si->incoming = store_incoming(p->store);
        si->map_epoch = p->store->map ? shardmap_epoch(p->store->map) : 0;
        si->parked = p->nparked;
        hb->shard = si;
}

/* --- the data socket ------------------------------------------------------------- */

static void psd_on_data(NetSock *ns, WireMsg *m, int r, void *ud) {
        Psd *p = ud;
        char reason[128];
        (void) ns;
        if (r == 0 && zap_authorize(&p->id, m, false, reason, sizeof reason) < 0) {
                p->errors++;
                log_warning("refused request reason=\"%s\" status=denied key=%s name=%s", reason,
                            m->peer.fingerprint[0] ? m->peer.fingerprint : "-", m->peer.name[0] ? m->peer.name : "-");
                (void) netsock_send_error(p->data, &m->route, PSNET__STATUS__STATUS_DENIED, m->hdr->seq, reason);
        } else if (r == 0)
                psd_handle_data(p, m);
        else if (m->has_route)
                psd_reply_error(p, &m->route, m->hdr, m->status, m->reason);
}

static void psd_left(Session *s, int r, WireMsg *m, void *ud) {
        Psd *p = ud;
        (void) s, (void) m;
        if (r < 0)
                log_debug_errno(r, "pscoord did not answer the deregistration: %m");
        uv_stop(&p->loop);
}

static void psd_reload(void *ud) {
        Psd *p = ud;
        char err[256];
        if (!p->zap) {
                log_info("SIGHUP: nothing to reload (no --keys; the job comes from pscoord)");
                return;
        }
        if (zap_reload(p->zap, err, sizeof err) < 0)
                log_error("SIGHUP: the allow-list did not load; the old one stays reason=\"%s\"", err);
        else
                log_info("SIGHUP: allow-list reloaded keys=%zu", zap_keys(p->zap));
}

static void psd_stop(void *ud, int signo) {
        Psd *p = ud;
        (void) signo;
        if (p->stopping)
                return;
        p->stopping = true;
        /* Leave the cluster, answered or not within half a second; serve meanwhile. */
        if (session_deregister(p->coord, 500, psd_left, p) < 0)
                uv_stop(&p->loop);
}

static void psd_free_parked(Psd *p) {
        for (size_t i = 0; i < p->nparked; i++) {
                zmq_msg_close(&p->parked[i].route);
                psnet__header__free_unpacked(p->parked[i].hdr, NULL);
        }
        p->parked = mfree(p->parked);
        p->nparked = 0;
}

int psd_run(const PsdConfig *cfg) {
        Psd p = { .cfg = cfg };
        int r;

        r = uv_loop_init(&p.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        const ServiceOps sops = { .stop = psd_stop, .reload = psd_reload };
        r = service_new(&p.loop, "psd", &sops, &p, &p.service);
        if (r < 0) {
                log_error_errno(r, "Failed to set up signals: %m");
                goto finish;
        }
        p.zctx = zmq_ctx_new();
        if (!p.zctx) {
                r = log_error_errno(errno, "Failed to create ZeroMQ context: %m");
                goto finish;
        }
        (void) zmq_ctx_set(p.zctx, ZMQ_IO_THREADS, 1);
        char err[512];
        if (cfg->keys) {
                r = keys_identity_load(&p.id, cfg->keys, cfg->key ? cfg->key : "psd",
                                       cfg->coord_key ? cfg->coord_key : "pscoord", PSNET__ROLE__ROLE_SERVER, err,
                                       sizeof err);
                if (r == 0)
                        r = zap_new(&p.loop, p.zctx, cfg->keys,
                                    ROLE_BIT(PSNET__ROLE__ROLE_SERVER) | ROLE_BIT(PSNET__ROLE__ROLE_WORKER), &p.zap,
                                    err, sizeof err);
                if (r < 0) {
                        log_error("cannot use the keys reason=\"%s\"", err);
                        r = -EINVAL;
                        goto finish;
                }
        }
        r = keys_check_listen(cfg->listen, &p.id, cfg->insecure, err, sizeof err);
        if (r < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto finish;
        }
        r = store_new(cfg->id, psd_ack, &p, &p.store);
        if (r < 0) {
                log_error_errno(r, "Failed to allocate the store: %m");
                goto finish;
        }
        p.store->move = psd_move_chunk;
        const NetSockConf dc = { .type = ZMQ_ROUTER, .name = "data", .max_msg = (int64_t) cfg->max_msg,
                                 .handover = true, .keys = p.id.enabled ? &p.id.keys : NULL, .curve_server = true,
                                 .zap_domain = p.id.enabled ? "psnet" : NULL };
        r = netsock_new(&p.loop, p.zctx, &dc, psd_on_data, &p, &p.data);
        if (r < 0) {
                log_error_errno(r, "Failed to create the data socket: %m");
                goto finish;
        }
        r = netsock_bind(p.data, cfg->listen);
        if (r < 0) {
                log_error_errno(r, "Failed to bind %s: %m", cfg->listen);
                goto finish;
        }
        const SessionConf sc = {
                .endpoint = cfg->coord, .role = PSNET__ROLE__ROLE_SERVER, .want_id = cfg->id,
                .advertise = cfg->advertise ? cfg->advertise : cfg->listen,
                .connect_timeout_ms = cfg->connect_timeout * 1000u,
                .keys = p.id.enabled ? &p.id.keys : NULL, .coord_key = p.id.enabled ? p.id.coord_key : NULL,
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
        log_info("listening endpoint=%s allocator=%s security=%s", cfg->listen, alloc_name(),
                 p.id.enabled ? "curve" : "none");
        (void) uv_run(&p.loop, UV_RUN_DEFAULT);
        r = p.exit_code;
        if (p.stopping)
                log_info("stopped pushes=%lu pulls=%lu applied=%lu copies=%lu errors=%lu",
                         (unsigned long) p.store->pushes, (unsigned long) p.store->pulls,
                         (unsigned long) p.store->applied, (unsigned long) p.store->copies,
                         (unsigned long) p.errors);
finish:
        psd_free_parked(&p);
        p.store = store_free(p.store); /* acks in flight go out before the socket closes */
        for (size_t i = 0; i < p.nstash; i++)
                wire_msg_done(&p.stash[i]);
        ps_free(p.stash);
        for (size_t i = 0; i < p.npeers; i++) {
                netsock_close(p.peers[i].sock);
                ps_free(p.peers[i].endpoint);
        }
        ps_free(p.peers);
        p.data = netsock_close(p.data);
        p.coord = session_free(p.coord);
        p.zap = zap_free(p.zap);
        p.service = service_free(p.service);
        uv_run(&p.loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
        if (uv_loop_close(&p.loop) < 0)
                log_debug("event loop closed with handles open");
        if (p.zctx)
                zmq_ctx_term(p.zctx);
        return r;
}
