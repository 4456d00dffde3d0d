/* Worker-side client for the shards; see client.h. */
#include <errno.h>
#include <string.h>
#include <time.h>
#include "alloc.h"
#include "client.h"
#include "coordlink.h"
#include "errors.h"
#include "log.h"
#include "wire.h"

typedef struct ShardConn {
        uint32_t id;
        const char *endpoint;
        void *sock;
        Psnet__Key *keys;          /* the keys this shard owns */
        Psnet__Key **keyp;
        size_t nkeys;
        uint64_t push_seq, pull_seq;   /* outstanding request seqs (0: none) */
        uint64_t retry_at;             /* ms; resend after NO_JOB */
        bool push_wait, pull_wait, retry_push, retry_pull;
} ShardConn;

struct Client {
        void *zctx;
        uint64_t map_epoch, need_epoch;
        Job job;
        uint32_t worker_id;
        ClientHooks hooks;
        ShardConn *shards;
        size_t nshards;
        uint64_t seq;
        unsigned timeout_ms;
        const float *const *grads;     /* of the round in progress, for resends */
        int64_t push_clock;
        float *const *pf_params;       /* client_pull_begin's pull, completed by the next round */
        int64_t pf_clock;
        bool prefetching;
        ClientStats stats;
};

static void client_disconnect(Client *c) {
        for (size_t i = 0; c->shards && i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                if (s->sock)
                        zmq_close(s->sock);
                ps_free((char *) s->endpoint);
                ps_free(s->keys);
                ps_free(s->keyp);
        }
        c->shards = mfree(c->shards);
        c->nshards = 0;
}

/* Connects to every shard of map and routes every key to its owner. */
static int client_connect(Client *c, const ShardMap *map) {
        const Job *job = &c->job;
        c->nshards = shardmap_size(map);
        c->map_epoch = shardmap_epoch(map);
        c->shards = ps_calloc(c->nshards, sizeof *c->shards);
        if (!c->shards)
                return -ENOMEM;
        size_t nkeys = job_nkeys(job);
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->id = shardmap_shard(map, i)->id;
                s->endpoint = ps_strdup(shardmap_shard(map, i)->endpoint);
                s->keys = ps_calloc(nkeys, sizeof *s->keys);
                s->keyp = ps_calloc(nkeys, sizeof *s->keyp);
                s->sock = zmq_socket(c->zctx, ZMQ_DEALER);
                if (!s->endpoint || !s->keys || !s->keyp || !s->sock)
                        return -ENOMEM;
                int zero = 0;
                (void) zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
                (void) zmq_setsockopt(s->sock, ZMQ_SNDHWM, &zero, sizeof zero);
                (void) zmq_setsockopt(s->sock, ZMQ_RCVHWM, &zero, sizeof zero);
                if (zmq_connect(s->sock, s->endpoint) < 0) {
                        int r = -errno;
                        log_error_errno(r, "Bad shard endpoint %s: %m", s->endpoint);
                        return r;
                }
        }
        for (uint32_t t = 0; t < job->ntensors; t++)
                for (uint32_t k = 0; k < job->tensors[t].nchunks; k++) {
                        ShardConn *s = &c->shards[shardmap_lookup(map, t, k)];
                        Psnet__Key *key = &s->keys[s->nkeys];
                        psnet__key__init(key);
                        key->tensor = t;
                        key->chunk = k;
                        key->len = job_chunk_len(job, t, k);
                        s->keyp[s->nkeys++] = key;
                }
        return 0;
}

int client_new(void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
               const ClientHooks *hooks, Client **ret) {
        Client *c = ps_calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->zctx = zctx;
        c->job = *job;
        c->worker_id = worker_id;
        c->timeout_ms = 120000;
        if (hooks)
                c->hooks = *hooks;
        else
                c->hooks.signal_fd = -1;
        int r = client_connect(c, map);
        if (r < 0) {
                client_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

int client_set_map(Client *c, const ShardMap *map) {
        client_disconnect(c);
        c->need_epoch = 0;
        c->prefetching = false; /* its requests went with the old sockets: the round pulls again */
        return client_connect(c, map);
}

uint64_t client_map_epoch(const Client *c) { return c->map_epoch; }
uint64_t client_need_epoch(const Client *c) { return c->need_epoch; }

Client *client_free(Client *c) {
        if (!c)
                return NULL;
        client_disconnect(c);
        ps_free(c);
        return NULL;
}

void client_set_timeout(Client *c, unsigned ms) { c->timeout_ms = ms; }
const ClientStats *client_stats(const Client *c) { return &c->stats; }

static void header_for(Client *c, ShardConn *s, Psnet__Header *h, Psnet__MsgType type, int64_t clock,
                       uint64_t seq) {
        wire_header_init(h, type);
        h->has_job = h->has_sender = h->has_seq = h->has_clock = true;
        h->job = c->job.id;
        h->sender = c->worker_id;
        h->seq = seq;
        h->clock = clock;
        h->n_keys = s->nkeys;
        h->keys = s->keyp;
}

static float *tensor_at(float *const *tensors, const Job *job, const Psnet__Key *k) {
        return tensors[k->tensor] + (size_t) k->chunk * job->chunk_floats;
}

static int send_push(Client *c, ShardConn *s, const float *const *grads, int64_t clock) {
        zmq_msg_t *frames = ps_malloc(s->nkeys * sizeof *frames);
        if (!frames)
                return -ENOMEM;
        for (size_t i = 0; i < s->nkeys; i++) {
                const Psnet__Key *k = s->keyp[i];
                float *p = tensor_at((float *const *) grads, &c->job, k);
                /* No free function: the buffer is ours and outlives the round. */
                if (zmq_msg_init_data(&frames[i], p, (size_t) k->len * sizeof(float), NULL, NULL) < 0) {
                        int r = -errno;
                        for (size_t j = 0; j < i; j++)
                                zmq_msg_close(&frames[j]);
                        ps_free(frames);
                        return r;
                }
                c->stats.bytes_pushed += (uint64_t) k->len * sizeof(float);
        }
        Psnet__Header h;
        s->push_seq = ++c->seq;
        header_for(c, s, &h, PSNET__MSG_TYPE__MSG_PUSH, clock, s->push_seq);
        int r = wire_send(s->sock, NULL, &h, frames, s->nkeys);
        ps_free(frames);
        s->push_wait = r == 0;
        return r;
}

static int send_pull(Client *c, ShardConn *s, int64_t clock) {
        Psnet__Header h;
        s->pull_seq = ++c->seq;
        header_for(c, s, &h, PSNET__MSG_TYPE__MSG_PULL, clock, s->pull_seq);
        int r = wire_send(s->sock, NULL, &h, NULL, 0);
        s->pull_wait = r == 0;
        return r;
}

/* Resends the request seq answered (push or pull) after delay_ms: used for
 * answers that applied nothing, so the resend cannot apply anything twice. */
static int schedule_retry(ShardConn *s, uint64_t seq, unsigned delay_ms) {
        if (seq == s->push_seq)
                s->retry_push = true;
        else
                s->retry_pull = true;
        s->retry_at = now_ms() + delay_ms;
        return 0;
}

/* Handles one reply from shard s. Returns 0, or a negative errno ending the round. */
static int handle_reply(Client *c, ShardConn *s, WireMsg *m, float *const *params, int64_t pull_clock,
                        int64_t *min_clock) {
        Psnet__Header *h = m->hdr;
        if (h->seq != s->push_seq && h->seq != s->pull_seq)
                return 0; /* a reply to a request we gave up on */
        bool moved = h->status == PSNET__STATUS__STATUS_MOVED &&
                     (h->type == PSNET__MSG_TYPE__MSG_ERROR || h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK);
        if (moved && h->has_epoch && h->epoch > c->map_epoch) {
                /* The shard map changed: finish this round again under the new map
                 * (pushes already applied come back DUPLICATE, so nothing twice). */
                c->need_epoch = MAX(c->need_epoch, h->epoch);
                log_debug("moved shard=%u epoch=%lu: waiting for the new map", s->id, (unsigned long) h->epoch);
                return -EXDEV;
        }
        if (moved || (h->type == PSNET__MSG_TYPE__MSG_ERROR && h->status == PSNET__STATUS__STATUS_MIGRATING)) {
                /* The shard has not caught up with the map this worker routes by, or
                 * the key is on its way there: ask again shortly. */
                return schedule_retry(s, h->seq, 20);
        }
        if (h->type == PSNET__MSG_TYPE__MSG_ERROR) {
                if (h->status == PSNET__STATUS__STATUS_NO_JOB) {
                        /* The shard has not got the job from pscoord yet: ask again shortly.
                         * Nothing was applied, so resending cannot apply anything twice. */
                        return schedule_retry(s, h->seq, 50);
                }
                log_error("shard refused request shard=%u endpoint=%s status=%s reason=\"%s\"", s->id,
                          s->endpoint, status_name(h->status), h->reason ? h->reason : "");
                return -EPROTO;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK && h->seq == s->push_seq) {
                s->push_wait = false;
                s->push_seq = 0;
                if (h->status == PSNET__STATUS__STATUS_OK || h->status == PSNET__STATUS__STATUS_DUPLICATE)
                        return 0;
                log_warning("push not applied shard=%u status=%s clock=%ld", s->id, status_name(h->status),
                            (long) h->clock);
                if (h->status == PSNET__STATUS__STATUS_STALE) {
                        /* Its clock closed without it (e.g. this worker was not yet or no
                         * longer a member): the gradient is dropped, training goes on. */
                        c->stats.stale_pushes++;
                        return 0;
                }
                return -EPROTO;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PULL_REP && h->seq == s->pull_seq) {
                if (h->n_keys != s->nkeys) {
                        log_error("shard %u answered %zu keys for %zu asked", s->id, h->n_keys, s->nkeys);
                        return -EPROTO;
                }
                for (size_t i = 0; i < h->n_keys; i++) {
                        const Psnet__Key *k = h->keys[i], *want = s->keyp[i];
                        if (k->tensor != want->tensor || k->chunk != want->chunk || k->len != want->len) {
                                log_error("shard %u answered key (%u,%u) for (%u,%u)", s->id, k->tensor,
                                          k->chunk, want->tensor, want->chunk);
                                return -EPROTO;
                        }
                        memcpy(tensor_at(params, &c->job, k), zmq_msg_data(&m->frames[i]),
                               (size_t) k->len * sizeof(float));
                        c->stats.bytes_pulled += (uint64_t) k->len * sizeof(float);
                }
                if (*min_clock < 0 || h->clock < *min_clock)
                        *min_clock = h->clock;
                (void) pull_clock;
                s->pull_wait = false;
                s->pull_seq = 0;
                return 0;
        }
        return 0;
}

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

int client_pull_begin(Client *c, float *const *params, int64_t pull_clock) {
        int r;

        if (!c || !params || c->prefetching)
                return -EINVAL;
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->pull_wait = s->retry_pull = false;
                s->pull_seq = s->retry_at = 0;
                if (s->nkeys > 0 && (r = send_pull(c, s, pull_clock)) < 0)
                        return log_error_errno(r, "Failed to pull from shard %u at %s: %m", s->id, s->endpoint);
        }
        c->pf_params = params;
        c->pf_clock = pull_clock;
        c->prefetching = true;
        return 0;
}

int client_round(Client *c, const float *const *grads, int64_t push_clock,
                 float *const *params, int64_t pull_clock, int64_t *ret_clock) {
        int r;
        int64_t min_clock = -1;
        size_t n = c->nshards;
        /* The pulls of client_pull_begin are in flight: wait for them, do not send again. */
        bool pulled = c->prefetching;
        if (pulled && (params != c->pf_params || pull_clock != c->pf_clock))
                return -EINVAL;
        c->prefetching = false;
        _cleanup_free_ zmq_pollitem_t *items = ps_calloc(n + 2, sizeof *items);
        if (!items)
                return -ENOMEM;
        c->grads = grads;
        c->push_clock = push_clock;

        for (size_t i = 0; i < n; i++) {
                ShardConn *s = &c->shards[i];
                s->push_wait = s->retry_push = false;
                s->push_seq = 0;
                if (!pulled) {
                        s->pull_wait = s->retry_pull = false;
                        s->pull_seq = s->retry_at = 0;
                }
                if (s->nkeys == 0)
                        continue;
                if (grads && (r = send_push(c, s, grads, push_clock)) < 0)
                        return log_error_errno(r, "Failed to push to shard %u at %s: %m", s->id, s->endpoint);
                if (!pulled && (r = send_pull(c, s, pull_clock)) < 0)
                        return log_error_errno(r, "Failed to pull from shard %u at %s: %m", s->id, s->endpoint);
        }
        double t0 = mono_s();
        uint64_t start = now_ms(), last_tick = start;
        for (;;) {
                bool waiting = false;
                uint64_t now = now_ms();
                for (size_t i = 0; i < n; i++) {
                        ShardConn *s = &c->shards[i];
                        waiting |= s->push_wait || s->pull_wait;
                        if (s->retry_at && now >= s->retry_at) {
                                s->retry_at = 0;
                                if (s->retry_push && (r = send_push(c, s, c->grads, c->push_clock)) < 0)
                                        return log_error_errno(r, "Failed to push to shard %u: %m", s->id);
                                if (s->retry_pull && (r = send_pull(c, s, pull_clock)) < 0)
                                        return log_error_errno(r, "Failed to pull from shard %u: %m", s->id);
                                s->retry_push = s->retry_pull = false;
                        }
                }
                if (!waiting)
                        break;
                if (now - start > c->timeout_ms) {
                        for (size_t i = 0; i < n; i++)
                                if (c->shards[i].push_wait || c->shards[i].pull_wait)
                                        return log_error_errno(ETIMEDOUT,
                                                "shard %u at %s did not answer within %u s",
                                                c->shards[i].id, c->shards[i].endpoint, c->timeout_ms / 1000);
                        return -ETIMEDOUT;
                }
                size_t ni = 0;
                for (size_t i = 0; i < n; i++)
                        items[ni++] = (zmq_pollitem_t) { .socket = c->shards[i].sock, .events = ZMQ_POLLIN };
                size_t ci = ni, si = ni;
                if (c->hooks.coord_sock)
                        items[ci = ni++] = (zmq_pollitem_t) { .socket = c->hooks.coord_sock, .events = ZMQ_POLLIN };
                if (c->hooks.signal_fd >= 0)
                        items[si = ni++] = (zmq_pollitem_t) { .fd = c->hooks.signal_fd, .events = ZMQ_POLLIN };
                unsigned tick = c->hooks.tick_ms ? c->hooks.tick_ms : 200;
                long timeout = (long) MIN(tick, 50u);
                r = zmq_poll(items, (int) ni, timeout);
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (ci < ni && c->hooks.coord_sock && (items[ci].revents & ZMQ_POLLIN) && c->hooks.on_coord)
                        c->hooks.on_coord(c->hooks.ud);
                if (si < ni && c->hooks.signal_fd >= 0 && (items[si].revents & ZMQ_POLLIN) && c->hooks.on_signal)
                        c->hooks.on_signal(c->hooks.ud);
                if (now_ms() - last_tick >= tick && c->hooks.on_tick) {
                        c->hooks.on_tick(c->hooks.ud);
                        last_tick = now_ms();
                }
                if (c->hooks.should_stop && c->hooks.should_stop(c->hooks.ud))
                        return -ECANCELED;
                for (size_t i = 0; i < n; i++) {
                        if (!(items[i].revents & ZMQ_POLLIN))
                                continue;
                        for (;;) {
                                WireMsg m;
                                r = wire_recv(c->shards[i].sock, false, ZMQ_DONTWAIT, &m);
                                if (r == 0)
                                        r = handle_reply(c, &c->shards[i], &m, params, pull_clock, &min_clock);
                                else if (r == -EBADMSG) {
                                        log_error("bad reply from shard %u reason=\"%s\"", c->shards[i].id, m.reason);
                                        r = -EPROTO;
                                }
                                wire_msg_done(&m);
                                if (r == -EXDEV)
                                        return -EAGAIN; /* moved: see client_need_epoch */
                                if (r == -EAGAIN)
                                        break;
                                if (r < 0)
                                        return r;
                        }
                }
        }
        c->stats.wait_s += mono_s() - t0;
        c->stats.rounds++;
        *ret_clock = min_clock < 0 ? pull_clock : min_clock;
        return 0;
}
