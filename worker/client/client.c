/* SPDX-License-Identifier: Apache-2.0 */
/* The shards' data plane; see client.h: the round's state machine, the
 * transports a request goes by being client-frames.c's and client-shm.c's
 * (client-internal.h). A round is a small state per part of each shard's
 * keys (push and pull: to send, sent, a resend scheduled, done) plus two
 * timers: one for the round's deadline, one for the earliest resend.
 * A shard's keys go in parts of at most part_bytes (in frames or through
 * shared memory alike), at most CLIENT_WINDOW of each kind in flight to one
 * shard, so that a shard holds a few parts of a worker's push or pull at a
 * time rather than all of it (docs/data-path.md, "Pushes and pulls in
 * parts"); a federated update goes whole. Replies arrive through each shard's
 * netsock callback; the round's callback runs once, when every part has been
 * answered or something failed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "alloc.h"
#include "client-internal.h"
#include "compress.h"
#include "config.h"
#include "endpoint.h"
#include "errors.h"
#include "log.h"
#include "shm.h"
#include "wire.h"

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void client_on_reply(NetSock *ns, WireMsg *m, int r, void *ud);

static void client_disconnect(Client *c) {
        client_mem_fence(c);
        for (size_t i = 0; c->shards && i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->sock = netsock_close(s->sock);
                client_shm_close(s);
                ps_free(s->endpoint);
                ps_free(s->keys);
                ps_free(s->keyp);
                ps_free(s->parts);
        }
        c->shards = mfree(c->shards);
        c->nshards = 0;
        c->map = shardmap_free(c->map);
}

/* Connects to every shard of map and routes every key to its owner. */
static int client_connect(Client *c, const ShardMap *map) {
        const Job *job = &c->job;
        if (!shardmap_fits_job(map, job))
                return log_error_errno(EINVAL, "the shard map holds other keys than the job's");
        c->nshards = shardmap_size(map);
        c->map_epoch = shardmap_epoch(map);
        c->map = shardmap_dup(map);
        if (!c->map)
                return -ENOMEM;
        c->shards = ps_calloc(c->nshards, sizeof *c->shards);
        if (!c->shards)
                return -ENOMEM;
        size_t nkeys = job_nkeys(job);
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                const ShardDesc *d = shardmap_shard(map, i);
                s->client = c;
                s->id = d->id;
                s->shm = s->mem = (ShmRegion) SHM_REGION_INIT;
                if (c->via) {
                        /* psgate knows where the shard is; this client never does. */
                        char name[32];
                        snprintf(name, sizeof name, "psgate/shard-%u", d->id);
                        s->endpoint = ps_strdup(name);
                } else
                        s->endpoint = d->endpoint ? ps_strdup(d->endpoint) : NULL;
                s->keys = ps_calloc(nkeys, sizeof *s->keys);
                s->keyp = ps_calloc(nkeys, sizeof *s->keyp);
                if (!c->via && !d->endpoint)
                        return log_error_errno(EINVAL, "the shard map has no address for shard %u", d->id);
                if (!s->endpoint || !s->keys || !s->keyp)
                        return -ENOMEM;
                /* No queue limits: a round's frames are the caller's own buffers. */
                const NetSockConf nc = { .type = ZMQ_DEALER, .name = s->endpoint, .keys = c->has_keys ? &c->keys : NULL,
                                         .via = c->via, .via_to = d->id };
                if (c->has_keys && !c->via && !d->has_public_key)
                        return log_error_errno(EINVAL, "the shard map has no key for shard %u at %s", s->id, s->endpoint);
                int r = netsock_new(c->loop, c->zctx, &nc, client_on_reply, s, &s->sock);
                if (r == 0)
                        r = netsock_connect(s->sock, s->endpoint, c->has_keys && d->has_public_key ? d->public_key : NULL);
                if (r < 0)
                        return log_error_errno(r, "Cannot connect to shard %u at %s: %m", s->id, s->endpoint);
        }
        for (uint32_t t = 0; t < job->ntensors; t++)
                for (uint32_t k = 0; k < job->tensors[t].nchunks; k++) {
                        ShardConn *s = &c->shards[(size_t) shardmap_lookup(map, t, k)];
                        Psnet__Key *key = &s->keys[s->nkeys];
                        psnet__key__init(key);
                        key->tensor = t;
                        key->chunk = k;
                        key->len = job_chunk_len(job, t, k);
                        s->keyp[s->nkeys++] = key;
                        s->area += (size_t) key->len * sizeof(float);
                }
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->parts = ps_calloc(MAX(MIN(s->nkeys, (size_t) WIRE_MAX_PARTS), (size_t) 1), sizeof *s->parts);
                if (!s->parts)
                        return -ENOMEM;
        }
        return 0;
}

static void client_timer_closed(uv_handle_t *h) {
        Client *c = h->data;
        if (--c->timers == 0)
                ps_free(c);
}

int client_new(uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
               const NetKeyPair *keys, NetMux *via, Client **ret) {
        Client *c = ps_calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->loop = loop;
        c->via = via;
        c->zctx = zctx;
        c->job = *job;
        c->worker_id = worker_id;
        c->timeout_ms = 120000;
        c->progress = -1.0f;
        c->part_bytes = CLIENT_PART_BYTES;
        const char *env = getenv("PSNET_PART_KIB");
        if (env) {
                unsigned long long kib = 0;
                if (config_parse_unsigned(env, 1ull << 22, &kib) < 0 || kib == 0)
                        log_warning("PSNET_PART_KIB=%s is no size in KiB (1 to 4194304): parts of %zu KiB", env,
                                    c->part_bytes >> 10);
                else
                        c->part_bytes = (size_t) kib << 10;
        }
        if (keys) {
                c->keys = *keys;
                c->has_keys = true;
        }
        int r = uv_timer_init(loop, &c->deadline);
        if (r == 0) {
                c->deadline.data = c;
                c->timers++;
                r = uv_timer_init(loop, &c->retry);
                if (r == 0) {
                        c->retry.data = c;
                        c->timers++;
                }
        }
        if (r == 0)
                r = client_connect(c, map);
        if (r < 0) {
                client_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

Client *client_free(Client *c) {
        if (!c)
                return NULL;
        client_rows_abort(c);
        client_rows_free(c);
        client_disconnect(c);
        client_frames_free(c);
        c->tensor_base = mfree(c->tensor_base);
        c->offs = mfree(c->offs);
        c->freeing = true;
        if (c->timers == 0) {
                ps_free(c);
                return NULL;
        }
        uv_close((uv_handle_t *) &c->deadline, client_timer_closed);
        if (c->timers == 2)
                uv_close((uv_handle_t *) &c->retry, client_timer_closed);
        return NULL;
}

void client_abort(Client *c) {
        client_rows_abort(c);
        if (!c->busy)
                return;
        c->busy = false;
        c->cb = NULL;
        (void) uv_timer_stop(&c->deadline);
        (void) uv_timer_stop(&c->retry);
}

int client_set_map(Client *c, const ShardMap *map) {
        if (c->busy || c->rows)
                return -EBUSY;
        client_disconnect(c);
        c->need_epoch = 0;
        c->prefetching = false; /* its requests went with the old sockets: the round pulls again */
        c->prefetch_err = 0;
        return client_connect(c, map);
}

int client_follow(Client **c, uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
                  const NetKeyPair *keys, NetMux *via, uint64_t members_epoch) {
        if (!*c) {
                int r = client_new(loop, zctx, job, map, worker_id, keys, via, c);
                if (r == 0)
                        client_set_members_epoch(*c, members_epoch);
                return r;
        }
        if (shardmap_epoch(map) > (*c)->map_epoch)
                return client_set_map(*c, map);
        return 0;
}

uint64_t client_map_epoch(const Client *c) { return c->map_epoch; }
uint64_t client_need_epoch(const Client *c) { return c->need_epoch; }
void client_set_timeout(Client *c, unsigned ms) { c->timeout_ms = ms; }
void client_set_members_epoch(Client *c, uint64_t epoch) { c->members_epoch = epoch; }
void client_set_examples(Client *c, uint64_t examples) { c->examples = examples; }
void client_set_progress(Client *c, float progress) { c->progress = progress; }
void client_set_pull_f32(Client *c, bool f32) { c->pull_f32 = f32; }
void client_set_masked(Client *c, bool masked) { c->masked = masked; }
void client_set_update_of(Client *c, uint32_t id) { c->update_of = id; }
void client_set_strategy_delta(Client *c, bool delta) { c->strategy_delta = delta; }
void client_set_frames(Client *c, int codec, ClientFrameFn fn, void *ud) {
        c->codec = codec;
        c->frame_fn = fn;
        c->frame_ud = ud;
}
const ClientStats *client_stats(const Client *c) { return &c->stats; }
bool client_busy(const Client *c) { return c->busy; }

/* Cuts shard s's keys into this round's parts, before any of its requests
 * leaves: parts of at most part_bytes of whole keys (as f32), at most
 * WIRE_MAX_PARTS of them; a federated update, which a shard takes whole, in
 * one. */
static void shard_plan(Client *c, ShardConn *s) {
        size_t per = s->nkeys;
        if (s->nkeys > 1 && c->job.mode != MODE_FED && !c->masked && !c->frame_fn) {
                size_t key_bytes = MAX((size_t) c->job.chunk_floats * sizeof(float), (size_t) 1);
                per = MAX(c->part_bytes / key_bytes, (size_t) 1);
                per = MAX(per, (s->nkeys + WIRE_MAX_PARTS - 1) / WIRE_MAX_PARTS);
        }
        s->nparts = 0;
        size_t before = 0;
        for (size_t first = 0; first < s->nkeys; first += per) {
                Part *part = &s->parts[s->nparts++];
                *part = (Part) { .first = first, .nkeys = MIN(per, s->nkeys - first), .before = before };
                for (size_t i = 0; i < part->nkeys; i++)
                        before += s->keyp[first + i]->len;
        }
}

/* How part's push and pull go to s this round: in place where the round's
 * tensors are the client's memory and the shard shares it; else through the
 * shard's own shared memory where it takes it (not a --sparsify push); else
 * in frames. */
static const ClientTransport *push_via(Client *c, ShardConn *s) {
        if (client_inplace_reaches(c, s))
                return &client_inplace;
        if (!client_pushes_sparse(c) && client_shm_reaches(c, s))
                return &client_shm;
        return &client_frames;
}

static const ClientTransport *pull_via(Client *c, ShardConn *s) {
        if (client_inplace_reaches(c, s))
                return &client_inplace;
        if (client_shm_reaches(c, s))
                return &client_shm;
        return &client_frames;
}

static int send_push(Client *c, ShardConn *s, Part *part) {
        part->push.via = push_via(c, s);
        return part->push.via->send_push(c, s, part);
}

static int send_pull(Client *c, ShardConn *s, Part *part) {
        part->pull.via = pull_via(c, s);
        return part->pull.via->send_pull(c, s, part);
}

/* Sends shard s's requests that are due, in order: of each kind (push,
 * pull) those among the CLIENT_WINDOW parts from the first one not answered
 * yet. A window that slides only past answered parts (not past one waiting
 * to be sent again) keeps workers in step under BSP, where a part is
 * answered once every worker pushed it: the lowest part not answered yet is
 * in every worker's window. A part's pull leaves only after the round's
 * push of that part: on the one pipe to the shard it then arrives after the
 * push, whose values it reads back (a worker reads its own update under ASP
 * and SSP too). The pulls' window would otherwise run ahead of the pushes'
 * wherever pushes are acknowledged late (a shard with backups acknowledges
 * once they hold the push), and a pull would read a key before its push. */
static int shard_pump(Client *c, ShardConn *s) {
        uint64_t now = now_ms();
        for (int pull = 0; pull < 2; pull++) {
                size_t first = 0;
                while (first < s->nparts) {
                        ReqState st = pull ? s->parts[first].pull.state : s->parts[first].push.state;
                        if (st != REQ_DONE && st != REQ_NONE)
                                break;
                        first++;
                }
                for (size_t i = first; i < s->nparts && i < first + CLIENT_WINDOW; i++) {
                        Part *part = &s->parts[i];
                        PartReq *q = pull ? &part->pull : &part->push;
                        if (q->state != REQ_TODO && !(q->state == REQ_RETRY && now >= q->at))
                                continue;
                        if (pull && (part->push.state == REQ_TODO || part->push.state == REQ_RETRY))
                                continue;
                        int r = pull ? send_pull(c, s, part) : send_push(c, s, part);
                        if (r < 0)
                                return log_error_errno(r, "Failed to %s shard %u at %s: %m",
                                                       pull ? "pull from" : "push to", s->id, s->endpoint);
                        q->state = REQ_SENT;
                }
        }
        return 0;
}

/* Whether any request of the round is still to send, sent or to send again. */
static bool part_open(const PartReq *q) {
        return q->state == REQ_TODO || q->state == REQ_SENT || q->state == REQ_RETRY;
}

static bool shard_open(const ShardConn *s) {
        for (size_t i = 0; i < s->nparts; i++)
                if (part_open(&s->parts[i].push) || part_open(&s->parts[i].pull))
                        return true;
        return false;
}

/* Ends the round in progress: timers stopped, the callback called once. */
static void round_end(Client *c, int r) {
        if (!c->busy)
                return;
        c->busy = false;
        (void) uv_timer_stop(&c->deadline);
        (void) uv_timer_stop(&c->retry);
        for (size_t i = 0; i < c->nshards; i++)
                for (size_t j = 0; j < c->shards[i].nparts; j++)
                        c->shards[i].parts[j].push = c->shards[i].parts[j].pull = (PartReq) { REQ_NONE, 0, 0 };
        int64_t clock = c->min_clock < 0 ? c->pull_clock : c->min_clock;
        if (r < 0)
                client_shm_reset(c);
        if (r == 0) {
                c->stats.wait_s += mono_s() - c->t0;
                c->stats.rounds++;
        }
        ClientRoundFn cb = c->cb;
        c->cb = NULL;
        if (cb)
                cb(c, r, clock, c->cb_ud);
}

static void round_check_done(Client *c) {
        for (size_t i = 0; i < c->nshards; i++)
                if (shard_open(&c->shards[i]))
                        return;
        round_end(c, 0);
}

static void retry_cb(uv_timer_t *t);

/* Sets the retry timer to the earliest scheduled resend (a resend is always
 * within its window: it was sent before, and windows only slide forward).
 * Never 0 ms from here: the timer is re-armed from its own callback, where a
 * timer already due would run again at once. */
static void retry_schedule(Client *c) {
        uint64_t next = UINT64_MAX, now = now_ms();
        for (size_t i = 0; i < c->nshards; i++)
                for (size_t j = 0; j < c->shards[i].nparts; j++) {
                        const Part *part = &c->shards[i].parts[j];
                        if (part->push.state == REQ_RETRY)
                                next = MIN(next, part->push.at);
                        if (part->pull.state == REQ_RETRY)
                                next = MIN(next, part->pull.at);
                }
        if (next == UINT64_MAX)
                (void) uv_timer_stop(&c->retry);
        else
                (void) uv_timer_start(&c->retry, retry_cb, next > now ? next - now : 1, 0);
}

/* Resends what is due and, first thing in every round, looks whether it is
 * already complete (the callback never runs inside client_round). */
static void retry_cb(uv_timer_t *t) {
        Client *c = t->data;
        if (!c->busy)
                return;
        if (c->prefetch_err) {
                int r = c->prefetch_err;
                c->prefetch_err = 0;
                round_end(c, r);
                return;
        }
        for (size_t i = 0; i < c->nshards && c->busy; i++) {
                int r = shard_pump(c, &c->shards[i]);
                if (r < 0) {
                        round_end(c, r);
                        return;
                }
        }
        round_check_done(c);
        if (c->busy)
                retry_schedule(c);
}

static void deadline_cb(uv_timer_t *t) {
        Client *c = t->data;
        for (size_t i = 0; i < c->nshards; i++)
                if (shard_open(&c->shards[i])) {
                        log_error_errno(ETIMEDOUT, "shard %u at %s did not answer within %u s", c->shards[i].id,
                                        c->shards[i].endpoint, c->timeout_ms / 1000);
                        break;
                }
        round_end(c, -ETIMEDOUT);
}

void client_cut_deadline(Client *c, unsigned ms) {
        if (c->timeout_ms > ms)
                c->timeout_ms = ms;
        if (c->busy && uv_is_active((uv_handle_t *) &c->deadline) && uv_timer_get_due_in(&c->deadline) > ms)
                (void) uv_timer_start(&c->deadline, deadline_cb, ms, 0);
}

unsigned client_ms_until(uv_loop_t *loop, uint64_t deadline, unsigned ms) {
        if (!deadline)
                return ms;
        uint64_t now = uv_now(loop);
        uint64_t left = deadline > now ? deadline - now : 1;
        return left < ms ? (unsigned) left : ms;
}

/* Sends request q again after delay_ms: for answers that applied nothing, so
 * the resend cannot apply anything twice. */
static void schedule_retry(Client *c, PartReq *q, unsigned delay_ms) {
        q->state = REQ_RETRY;
        q->at = now_ms() + delay_ms;
        retry_schedule(c);
}

/* Handles one reply from shard s. Returns 0, or a negative errno ending the round. */
static int handle_reply(Client *c, ShardConn *s, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        Part *part = NULL;
        PartReq *q = NULL;
        for (size_t i = 0; i < s->nparts && !q; i++) {
                part = &s->parts[i];
                if (part->push.state == REQ_SENT && part->push.seq == h->seq)
                        q = &part->push;
                else if (part->pull.state == REQ_SENT && part->pull.seq == h->seq)
                        q = &part->pull;
        }
        if (!q)
                return 0; /* a reply to a request given up on */
        bool moved = h->status == PSNET__STATUS__STATUS_MOVED &&
                     (h->type == PSNET__MSG_TYPE__MSG_ERROR || h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK);
        if (moved && h->has_epoch && h->epoch > c->map_epoch) {
                /* The shard map changed: the round is done again under the new map
                 * (pushes already applied come back DUPLICATE, so nothing twice). */
                c->need_epoch = MAX(c->need_epoch, h->epoch);
                log_debug("moved shard=%u epoch=%lu: waiting for the new map", s->id, (unsigned long) h->epoch);
                return -EAGAIN;
        }
        if (moved || h->status == PSNET__STATUS__STATUS_MIGRATING || h->status == PSNET__STATUS__STATUS_UNAVAILABLE) {
                /* The shard has not caught up with the map this worker routes by,
                 * the key is on its way there, or the shard may not acknowledge
                 * now (a fail-over under way): ask again shortly. A push resent
                 * comes back DUPLICATE where it was held already. */
                if (h->status == PSNET__STATUS__STATUS_UNAVAILABLE)
                        c->stats.unavailable++;
                schedule_retry(c, q, 20);
                return 0;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_ERROR) {
                if (h->status == PSNET__STATUS__STATUS_NO_JOB) {
                        /* The shard has not got the job from pscoord yet. Nothing was
                         * applied, so resending cannot apply anything twice. */
                        schedule_retry(c, q, 50);
                        return 0;
                }
                if (h->status == PSNET__STATUS__STATUS_INVALID && h->reason &&
                    strncmp(h->reason, SHM_NO_SESSION, strlen(SHM_NO_SESSION)) == 0 && q->via->session_lost) {
                        /* The shard no longer holds the session the request went
                         * by (it restarted): nothing was applied; another
                         * session, and the request again. */
                        q->via->session_lost(c, s);
                        schedule_retry(c, q, 20);
                        return 0;
                }
                if (h->status == PSNET__STATUS__STATUS_STALE) {
                        /* This worker is no member of that clock: it left the
                         * membership (its lease ran out) and must be admitted again. */
                        log_warning("shard refused request shard=%u status=stale reason=\"%s\"", s->id,
                                    h->reason ? h->reason : "");
                        return -ESTALE;
                }
                log_error("shard refused request shard=%u endpoint=%s status=%s reason=\"%s\"", s->id, s->endpoint,
                          status_name(h->status), h->reason ? h->reason : "");
                return -EPROTO;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK && q == &part->push) {
                q->state = REQ_DONE;
                if (h->status == PSNET__STATUS__STATUS_OK || h->status == PSNET__STATUS__STATUS_DUPLICATE)
                        return 0;
                log_warning("push not applied shard=%u status=%s clock=%ld", s->id, status_name(h->status),
                            (long) h->clock);
                if (h->status == PSNET__STATUS__STATUS_STALE) {
                        /* Its clock closed without it (this worker was not yet or no
                         * longer a member): the gradient is dropped, training goes on. */
                        c->stats.stale_pushes++;
                        return 0;
                }
                return -EPROTO;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PULL_REP && q == &part->pull) {
                if (h->n_keys != part->nkeys) {
                        log_error("shard %u answered %zu keys for %zu asked", s->id, h->n_keys, part->nkeys);
                        return -EPROTO;
                }
                for (size_t i = 0; i < h->n_keys; i++) {
                        const Psnet__Key *k = h->keys[i], *want = s->keyp[part->first + i];
                        if (k->tensor != want->tensor || k->chunk != want->chunk || k->len != want->len) {
                                log_error("shard %u answered key (%u,%u) for (%u,%u)", s->id, k->tensor, k->chunk,
                                          want->tensor, want->chunk);
                                return -EPROTO;
                        }
                }
                /* In frames, or in shared memory where the pull asked for it. */
                const ClientTransport *t = h->has_shm_session ? q->via : &client_frames;
                if (h->has_shm_session && t == &client_frames) {
                        log_error("shard %u answered in shared memory this client did not offer", s->id);
                        return -EPROTO;
                }
                int r = t->take_values(c, s, part, h, m);
                if (r < 0)
                        return r;
                if (c->min_clock < 0 || h->clock < c->min_clock)
                        c->min_clock = h->clock;
                q->state = REQ_DONE;
        }
        return 0;
}

static void client_on_reply(NetSock *ns, WireMsg *m, int r, void *ud) {
        ShardConn *s = ud;
        Client *c = s->client;
        (void) ns;
        if (client_rows_reply(c, s, m))
                return;
        if (!c->busy && !c->prefetching)
                return; /* nothing asked: a late answer */
        if (r < 0) {
                log_error("bad reply from shard %u reason=\"%s\"", s->id, m->reason);
                r = -EPROTO;
        } else
                r = handle_reply(c, s, m);
        /* What the answer leaves room for goes now (a prefetch's next part too). */
        if (r == 0)
                r = shard_pump(c, s);
        if (!c->busy) {
                /* A prefetched pull answered before its round started: the values are
                 * in params; a failure ends that round when it starts. */
                if (r < 0 && !c->prefetch_err)
                        c->prefetch_err = r;
                return;
        }
        if (r < 0)
                round_end(c, r);
        else
                round_check_done(c);
}

int client_pull_begin(Client *c, float *const *params, int64_t pull_clock) {
        if (!c || !params || c->prefetching || c->busy || c->rows)
                return -EINVAL;
        c->params = params;
        c->pull_clock = pull_clock;
        c->min_clock = -1;
        /* The push that completes the round is in place too, or not at all. */
        c->inplace = client_round_in_place(c, NULL, false, params);
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                shard_plan(c, s);
                for (size_t j = 0; j < s->nparts; j++) {
                        s->parts[j].push = (PartReq) { REQ_NONE, 0, 0 };
                        s->parts[j].pull = (PartReq) { REQ_TODO, 0, 0 };
                }
                int r = shard_pump(c, s);
                if (r < 0)
                        return r;
        }
        c->pf_params = params;
        c->pf_clock = pull_clock;
        c->prefetching = true;
        c->prefetch_err = 0;
        return 0;
}

int client_round(Client *c, const float *const *grads, int64_t push_clock, float *const *params,
                 int64_t pull_clock, ClientRoundFn cb, void *ud) {
        if (c->busy || c->rows)
                return -EBUSY;
        /* The pulls of client_pull_begin are in flight (or answered): do not send again. */
        bool pulled = c->prefetching;
        if (pulled && (params != c->pf_params || pull_clock != c->pf_clock))
                return -EINVAL;
        bool inplace = client_round_in_place(c, grads, grads != NULL, params);
        if (pulled && c->inplace && !inplace && grads)
                return -EINVAL; /* a prefetch in place, completed by a push that is not */
        c->prefetching = false;
        if (!pulled)
                c->inplace = inplace;
        c->grads = grads;
        c->push_clock = push_clock;
        c->params = params;
        c->pull_clock = pull_clock;
        c->cb = cb;
        c->cb_ud = ud;
        c->t0 = mono_s();
        if (!pulled)
                c->min_clock = -1;
        c->busy = true;
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                /* A prefetch cut the parts already, and its pulls stay as they are. */
                if (!pulled)
                        shard_plan(c, s);
                for (size_t j = 0; j < s->nparts; j++) {
                        s->parts[j].push = (PartReq) { grads ? REQ_TODO : REQ_NONE, 0, 0 };
                        if (!pulled)
                                s->parts[j].pull = (PartReq) { params ? REQ_TODO : REQ_NONE, 0, 0 };
                }
                int r = shard_pump(c, s);
                if (r < 0) {
                        c->busy = false;
                        return r;
                }
        }
        (void) uv_timer_start(&c->deadline, deadline_cb, c->timeout_ms, 0);
        /* Everything may already be in (a prefetch answered, or no keys at all):
         * the retry timer looks at once, on the next loop turn. */
        (void) uv_timer_start(&c->retry, retry_cb, 0, 0);
        return 0;
}
