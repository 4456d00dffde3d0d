/* pscoord: membership, leases, shard map, job lifecycle, status; see coord.h.
 * One thread, one uv_loop: the control ROUTER, signals and a timer for leases
 * and fences. Every change of
 * job, map or membership is pushed to the peers as MSG_CONFIG. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include "alloc.h"
#include "coord.h"
#include "endpoint.h"
#include "keys.h"
#include "metrics.h"
#include "netsock.h"
#include "service.h"
#include "errors.h"
#include "log.h"
#include "shardmap.h"
#include "wire.h"
#include "wire-job.h"
#include "zap.h"

#define COORD_MAX_PEERS 4096
#define COORD_MAX_STRAGGLERS 64

typedef struct Peer {
        uint32_t id;
        Psnet__Role role;
        zmq_msg_t route;
        char *endpoint;
        uint8_t public_key[32];     /* shards with --keys: the key workers expect */
        bool has_key;
        uint64_t last_seen;
        uint32_t pid;
        char host[64];              /* the peer's host name, as it registered */
        uint32_t rank;
        Psnet__ShardInfo shard;     /* last reported stats (endpoint and stragglers not owned: NULL) */
        uint32_t stragglers[COORD_MAX_STRAGGLERS];  /* shards: members the others wait on */
        size_t nstragglers;
        uint64_t stalled_ms;
        uint64_t memory_limit, max_msg; /* shards: from their registration */
        Psnet__WorkerInfo worker;
        bool done;
        bool member;                /* counted by the shards' gates */
        int64_t start_clock;        /* clock it started at */
        bool drain;
} Peer;

/* A change agreed at a clock boundary: pscoord fences the shards, learns their
 * clocks, picks the boundary and publishes the change with it. */
typedef struct Fence {
        bool active;
        uint64_t seq, deadline, retry_at;
        size_t replies, expected;
        int64_t max_clock, max_wclock, min_wclock;
        bool mode_change;
        ConsistencyMode mode;
        uint32_t staleness;
} Fence;

typedef struct Coord {
        const CoordConfig *cfg;
        void *zctx;
        Job job;
        JobState state;
        Peer *peers;
        size_t npeers;
        uint32_t next_worker_id;
        ShardMap *map;
        uint64_t map_epoch, members_epoch;
        uint32_t *prev_ids;         /* membership before the pending boundary */
        size_t nprev;
        int64_t switch_clock;       /* 0: no boundary pending */
        Fence fence;
        uint64_t fence_seq;
        float accuracy;
        bool has_accuracy;
        char fail_reason[256];      /* why the job failed (state FAILED) */
        struct { uint32_t pid; char host[64]; } evicted[COORD_MAX_STRAGGLERS]; /* not admitted again this job */
        size_t nevicted;
        uint64_t registrations, expiries, evictions, requests, refused;
        Histogram latency;          /* handling a control request */
        uint64_t start_ms, job_start_ms, job_end_ms, migrate_start_ms;
        uint64_t errors;
        uv_loop_t loop;
        uv_timer_t tick;
        NetSock *ctl;
        Service *service;
        NetIdentity id;
        Zap *zap;
} Coord;

static size_t count_role(const Coord *c, Psnet__Role role) {
        size_t n = 0;
        for (size_t i = 0; i < c->npeers; i++)
                n += c->peers[i].role == role;
        return n;
}

static Peer *find_peer(Coord *c, Psnet__Role role, uint32_t id) {
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == role && c->peers[i].id == id)
                        return &c->peers[i];
        return NULL;
}

/* The peer that sent a message: matched by its ZeroMQ identity. */
static Peer *find_route(Coord *c, const zmq_msg_t *route) {
        size_t n = zmq_msg_size((zmq_msg_t *) route);
        for (size_t i = 0; i < c->npeers; i++) {
                zmq_msg_t *r = &c->peers[i].route;
                if (zmq_msg_size(r) == n && memcmp(zmq_msg_data(r), zmq_msg_data((zmq_msg_t *) route), n) == 0)
                        return &c->peers[i];
        }
        return NULL;
}

static void peer_done(Peer *p) {
        zmq_msg_close(&p->route);
        ps_free(p->endpoint);
}

static void remove_peer(Coord *c, Peer *p) {
        size_t i = (size_t) (p - c->peers);
        if (p->role == PSNET__ROLE__ROLE_WORKER)
                for (size_t j = 0; j < c->nprev; j++)
                        if (c->prev_ids[j] == p->id) {
                                memmove(&c->prev_ids[j], &c->prev_ids[j + 1], (c->nprev - j - 1) * sizeof *c->prev_ids);
                                c->nprev--;
                                break;
                        }
        peer_done(p);
        memmove(&c->peers[i], &c->peers[i + 1], (c->npeers - i - 1) * sizeof *p);
        c->npeers--;
}

/* Sends h (type and body set by the caller) to route, echoing seq. */
static int reply_hdr(Coord *c, const zmq_msg_t *route, Psnet__Header *h, uint64_t seq) {
        h->has_seq = true;
        h->seq = seq;
        h->has_job = true;
        h->job = c->job.id;
        return netsock_send(c->ctl, route, h, NULL, 0);
}

/* A reply of this type without a body. */
static int reply(Coord *c, const zmq_msg_t *route, Psnet__MsgType type, uint64_t seq) {
        Psnet__Header h;
        wire_header_init(&h, type);
        return reply_hdr(c, route, &h, seq);
}

/* MSG_JOB_REP with the job's state and, optionally, a message. */
static int reply_job(Coord *c, const zmq_msg_t *route, uint64_t seq, const char *message) {
        Psnet__Header h;
        Psnet__JobRep jr = PSNET__JOB_REP__INIT;
        jr.job_state = job_state_to_proto(c->state);
        jr.message = (char *) message;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_JOB_REP);
        h.body_case = PSNET__HEADER__BODY_JOB_REP;
        h.job_rep = &jr;
        return reply_hdr(c, route, &h, seq);
}

static int reply_error(Coord *c, const zmq_msg_t *route, uint64_t seq, int status, const char *reason) {
        c->errors++;
        log_warning("refused request reason=\"%s\" status=%s", reason, status_name(status));
        return netsock_send_error(c->ctl, route, status, seq, reason);
}

static int cmp_peer_id(const void *a, const void *b) {
        const Peer *const *x = a, *const *y = b;
        return (*x)->id < (*y)->id ? -1 : (*x)->id > (*y)->id;
}

/* Workers in id order (ranks follow this order); only members when
 * members_only. Caller frees. */
static Peer **sorted_workers_sel(Coord *c, bool members_only, size_t *ret_n) {
        size_t n = count_role(c, PSNET__ROLE__ROLE_WORKER), j = 0;
        Peer **v = ps_malloc((n ? n : 1) * sizeof *v);
        if (!v)
                return NULL;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER && (!members_only || c->peers[i].member))
                        v[j++] = &c->peers[i];
        qsort(v, j, sizeof *v, cmp_peer_id);
        *ret_n = j;
        return v;
}

static Peer **sorted_workers(Coord *c, size_t *ret_n) {
        return sorted_workers_sel(c, true, ret_n);
}

/* Sends job, map, membership and state to one peer. */
static int send_config(Coord *c, Peer *p, Psnet__JobSpec *spec, Psnet__ShardMap *pm,
                       Psnet__Membership *mem, uint32_t nworkers) {
        Psnet__Header h;
        Psnet__Config ctl = PSNET__CONFIG__INIT;
        Psnet__Membership prev = PSNET__MEMBERSHIP__INIT;
        ctl.job = spec;
        ctl.map = pm;
        ctl.members = mem;
        ctl.job_state = job_state_to_proto(c->state);
        if (p->role == PSNET__ROLE__ROLE_WORKER) {
                ctl.has_rank = ctl.has_nworkers = ctl.has_start_clock = true;
                ctl.rank = p->rank;
                ctl.nworkers = nworkers;
                ctl.start_clock = p->start_clock;
                ctl.has_drain = p->drain;
                ctl.drain = p->drain;
        }
        if (c->switch_clock > 0 && p->role == PSNET__ROLE__ROLE_SERVER) {
                prev.epoch = mem->epoch;
                prev.n_workers = c->nprev;
                prev.workers = c->prev_ids;
                ctl.prev_members = &prev;
        }
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &ctl;
        return reply_hdr(c, &p->route, &h, 0);
}

/* Publishes the current job, map and membership to every shard and worker. */
static void publish(Coord *c) {
        Psnet__JobSpec *spec = NULL;
        size_t nw = 0;
        _cleanup_free_ Peer **workers = sorted_workers(c, &nw);
        _cleanup_free_ uint32_t *ids = ps_malloc((nw ? nw : 1) * sizeof *ids);
        _cleanup_free_ int64_t *starts = ps_malloc((nw ? nw : 1) * sizeof *starts);
        _cleanup_free_ ProtobufCBinaryData *keys = ps_calloc(nw ? nw : 1, sizeof *keys);
        Psnet__ShardMap *pm = NULL;
        Psnet__Membership mem = PSNET__MEMBERSHIP__INIT;

        if (!workers || !ids || !starts || !keys || job_to_proto(&c->job, &spec) < 0) {
                log_error("out of memory while publishing the configuration");
                return;
        }
        for (size_t i = 0; i < nw; i++) {
                ids[i] = workers[i]->id;
                starts[i] = workers[i]->start_clock;
                keys[i] = (ProtobufCBinaryData) { .len = 32, .data = workers[i]->public_key };
                workers[i]->rank = (uint32_t) i;
        }
        mem.epoch = c->members_epoch;
        mem.n_workers = nw;
        mem.workers = ids;
        mem.n_start_clocks = nw;
        mem.start_clocks = starts;
        /* With CURVE the shards check that a push comes from the member's own key. */
        mem.n_keys = c->id.enabled ? nw : 0;
        mem.keys = keys;
        mem.has_from_clock = true;
        mem.from_clock = c->switch_clock;
        if (c->map && shardmap_to_proto(c->map, &pm) < 0) {
                log_error("out of memory while publishing the configuration");
                job_proto_free(spec);
                return;
        }
        /* Shards first, so a worker's first request finds its shard configured. */
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < c->npeers; i++) {
                        Peer *p = &c->peers[i];
                        if (p->role != (pass == 0 ? PSNET__ROLE__ROLE_SERVER : PSNET__ROLE__ROLE_WORKER))
                                continue;
                        if (p->role == PSNET__ROLE__ROLE_WORKER && !p->member)
                                continue; /* joins at the next boundary */
                        int r = send_config(c, p, c->map ? spec : NULL, pm, &mem, (uint32_t) nw);
                        if (r < 0)
                                log_warning_errno(r, "Failed to send configuration to peer=%u: %m", p->id);
                }
        job_proto_free(spec);
        shardmap_proto_free(pm);
}

static int build_map(Coord *c) {
        size_t n = count_role(c, PSNET__ROLE__ROLE_SERVER), j = 0;
        _cleanup_free_ ShardDesc *d = ps_calloc(n ? n : 1, sizeof *d);
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER) {
                        d[j].id = c->peers[i].id;
                        d[j].endpoint = c->peers[i].endpoint;
                        memcpy(d[j].public_key, c->peers[i].public_key, 32);
                        d[j].has_public_key = c->peers[i].has_key;
                        j++;
                }
        ShardMap *m;
        int r = shardmap_new(++c->map_epoch, c->cfg->vnodes, d, n, &m);
        if (r < 0)
                return r;
        shardmap_free(c->map);
        c->map = m;
        return 0;
}

/* A new map epoch over the current map's shards plus add (0: none) minus
 * remove (0: none); endpoints come from the registered peers, else the old map. */
static int remap(Coord *c, uint32_t add, uint32_t remove) {
        size_t n = c->map ? shardmap_size(c->map) : 0, j = 0;
        _cleanup_free_ ShardDesc *d = ps_calloc(n + 1, sizeof *d);
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const ShardDesc *sd = shardmap_shard(c->map, i);
                if (sd->id == remove)
                        continue;
                Peer *p = find_peer(c, PSNET__ROLE__ROLE_SERVER, sd->id);
                d[j] = *sd;
                if (p) {
                        d[j].endpoint = p->endpoint;
                        memcpy(d[j].public_key, p->public_key, 32);
                        d[j].has_public_key = p->has_key;
                }
                j++;
        }
        if (add) {
                Peer *p = find_peer(c, PSNET__ROLE__ROLE_SERVER, add);
                if (!p)
                        return -ENOENT;
                d[j].id = add;
                d[j].endpoint = p->endpoint;
                memcpy(d[j].public_key, p->public_key, 32);
                d[j].has_public_key = p->has_key;
                j++;
        }
        ShardMap *m;
        int r = shardmap_new(c->map_epoch + 1, c->cfg->vnodes, d, j, &m);
        if (r < 0)
                return r;
        c->map_epoch++;
        shardmap_free(c->map);
        c->map = m;
        return 0;
}

static void handle_shard_change(Coord *c, WireMsg *m, bool add) {
        char reason[128];
        const Psnet__ShardRef *ctl = m->hdr->shard;
        uint32_t id = ctl->has_id ? ctl->id : 0;
        if (ctl->endpoint) /* named by address: the registered shard advertising it */
                for (size_t i = 0; i < c->npeers; i++)
                        if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER && c->peers[i].endpoint &&
                            strcmp(c->peers[i].endpoint, ctl->endpoint) == 0)
                                id = c->peers[i].id;
        if (id == 0) {
                snprintf(reason, sizeof reason, "no registered shard %s%.64s",
                         ctl->endpoint ? "at " : "", ctl->endpoint ? ctl->endpoint : "(give an id or address)");
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        bool in_map = c->map && shardmap_find(c->map, id) >= 0;
        const char *why = NULL;
        if (c->state != JOB_RUNNING && c->state != JOB_WAITING)
                why = "no job is running";
        else if (!c->map)
                why = "the job has not started yet (no shard map)";
        else if (add && in_map)
                why = "that shard is already in the map";
        else if (add && !find_peer(c, PSNET__ROLE__ROLE_SERVER, id))
                why = "no such shard is registered (start psd with that --id first)";
        else if (!add && !in_map)
                why = "that shard is not in the map";
        else if (!add && shardmap_size(c->map) < 2)
                why = "the last shard of the map cannot be removed";
        if (why) {
                snprintf(reason, sizeof reason, "shard %u: %s", id, why);
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        int r = remap(c, add ? id : 0, add ? 0 : id);
        if (r < 0) {
                snprintf(reason, sizeof reason, "cannot build the new map: %s", strerror(-r));
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        c->migrate_start_ms = now_ms();
        log_info("shard %s shard_id=%u map_epoch=%lu shards=%zu", add ? "added" : "removed", id,
                 (unsigned long) c->map_epoch, shardmap_size(c->map));
        publish(c);
        (void) reply_job(c, &m->route, m->hdr->seq, "migrating");
}

/* Starts the job once the expected shards and workers are there. */
/* The job ends as failed: says why to the log, psctl and every peer. */
static void job_fail(Coord *c, const char *reason) {
        c->state = JOB_FAILED;
        c->job_end_ms = now_ms();
        snprintf(c->fail_reason, sizeof c->fail_reason, "%s", reason);
        log_error("job failed job=%u reason=\"%s\"", c->job.id, reason);
        /* Workers not yet members of anything hear it too (publish reaches members only). */
        Psnet__Header h;
        Psnet__Config cfg = PSNET__CONFIG__INIT;
        cfg.job_state = job_state_to_proto(c->state);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &cfg;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER && !c->peers[i].member)
                        (void) reply_hdr(c, &c->peers[i].route, &h, 0);
}

/* Whether the shards can hold the job under c->map: each shard's share of the
 * values and optimizer state within its memory, the largest frame within its
 * limit. On failure writes why into reason. */
static bool job_fits(Coord *c, char *reason, size_t n) {
        size_t ns = shardmap_size(c->map);
        _cleanup_free_ uint64_t *share = ps_calloc(ns, sizeof *share);
        if (!share) {
                snprintf(reason, n, "out of memory");
                return false;
        }
        uint64_t per = c->job.optim.kind == OPTIM_ADAM ? 2 : c->job.optim.momentum != 0.0f ? 1 : 0;
        for (uint32_t t = 0; t < c->job.ntensors; t++)
                for (uint32_t k = 0; k < c->job.tensors[t].nchunks; k++)
                        share[shardmap_lookup(c->map, t, k)] += (uint64_t) job_chunk_len(&c->job, t, k) * 4u * (1 + per);
        uint64_t frame = (uint64_t) c->job.chunk_floats * 4u * MAX(per, (uint64_t) 1);
        for (size_t i = 0; i < ns; i++) {
                Peer *p = find_peer(c, PSNET__ROLE__ROLE_SERVER, shardmap_shard(c->map, i)->id);
                if (!p)
                        continue;
                if (p->memory_limit && share[i] > p->memory_limit) {
                        uint64_t total = 0;
                        for (size_t j = 0; j < ns; j++)
                                total += share[j];
                        snprintf(reason, n, "the model needs %.1f GiB of values and optimizer state; shard %u would "
                                 "hold %.1f GiB but has %.1f GiB (add shards or use a smaller model)",
                                 (double) total / (1u << 30), p->id, (double) share[i] / (1u << 30),
                                 (double) p->memory_limit / (1u << 30));
                        return false;
                }
                if (p->max_msg && frame > p->max_msg) {
                        snprintf(reason, n, "the job's chunks need frames of %lu bytes; shard %u accepts %lu "
                                 "(lower --chunk-kb or raise psd --max-msg)", (unsigned long) frame, p->id,
                                 (unsigned long) p->max_msg);
                        return false;
                }
        }
        return true;
}

static void maybe_start(Coord *c) {
        char mode[32], reason[256];
        if (c->state != JOB_WAITING)
                return;
        size_t ns = count_role(c, PSNET__ROLE__ROLE_SERVER), nw = count_role(c, PSNET__ROLE__ROLE_WORKER);
        if (ns == 0 || ns < MAX(c->job.expect_shards, 1u) || nw < MAX(c->job.expect_workers, 1u))
                return;
        int r = build_map(c);
        if (r < 0) {
                log_error_errno(r, "Failed to build the shard map: %m");
                return;
        }
        if (!job_fits(c, reason, sizeof reason)) {
                job_fail(c, reason);
                return;
        }
        c->state = JOB_RUNNING;
        c->members_epoch++;
        c->switch_clock = 0;
        c->nprev = 0;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER) {
                        c->peers[i].member = true;
                        c->peers[i].start_clock = 0;
                }
        c->job_start_ms = now_ms();
        c->has_accuracy = false;
        log_info("job started job=%u model=%s mode=%s shards=%zu workers=%zu map_epoch=%lu",
                 c->job.id, c->job.model, job_mode_string(&c->job, mode, sizeof mode), ns, nw,
                 (unsigned long) c->map_epoch);
        publish(c);
}

static void membership_changed(Coord *c) {
        if (c->state != JOB_RUNNING) {
                maybe_start(c);
                return;
        }
        c->members_epoch++;
        size_t nw = 0;
        _cleanup_free_ Peer **members = sorted_workers(c, &nw);
        bool any_done = false, joining = false;
        for (size_t i = 0; i < c->npeers; i++) {
                any_done |= c->peers[i].role == PSNET__ROLE__ROLE_WORKER && c->peers[i].done;
                joining |= c->peers[i].role == PSNET__ROLE__ROLE_WORKER && !c->peers[i].member;
        }
        if (nw == 0 && !joining && c->has_accuracy) {
                c->state = JOB_DONE;
                c->job_end_ms = now_ms();
                log_info("job done job=%u accuracy=%.4f seconds=%.1f", c->job.id, c->accuracy,
                         (double) (c->job_end_ms - c->job_start_ms) / 1000.0);
        } else if (nw == 0 && !joining) {
                /* Every worker left without an evaluation: the job cannot finish by
                 * itself (workers failed, were killed, or stopped). */
                job_fail(c, any_done ? "every worker left without a result (some finished training)"
                                     : "every worker left without a result");
        }
        log_info("membership epoch=%lu workers=%zu", (unsigned long) c->members_epoch, nw);
        publish(c);
}

/* Asks every shard of the map for its clocks and to hold still past the next
 * one; fence_done picks the boundary when all have answered. */
static void fence_start(Coord *c, bool mode_change, ConsistencyMode mode, uint32_t staleness) {
        Fence *f = &c->fence;
        if (f->active) {
                if (mode_change) {
                        f->mode_change = true;
                        f->mode = mode;
                        f->staleness = staleness;
                }
                return;
        }
        *f = (Fence) { .active = true, .seq = ++c->fence_seq, .deadline = now_ms() + 2000,
                       .mode_change = mode_change, .mode = mode, .staleness = staleness, .min_wclock = -1 };
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role != PSNET__ROLE__ROLE_SERVER || !c->map || shardmap_find(c->map, p->id) < 0)
                        continue;
                int r = reply(c, &p->route, PSNET__MSG_TYPE__MSG_FENCE, f->seq);
                if (r < 0)
                        log_warning_errno(r, "Failed to send a fence to shard=%u: %m", p->id);
                else
                        f->expected++;
        }
        log_info("fence seq=%lu shards=%zu", (unsigned long) f->seq, f->expected);
}

/* All shards answered: pick the boundary, admit the joiners, switch the mode. */
static void fence_commit(Coord *c) {
        Fence *f = &c->fence;
        ConsistencyMode old = c->job.mode, next = f->mode_change ? f->mode : c->job.mode;
        int64_t from;
        if (old == MODE_BSP)
                from = f->max_clock + 1;          /* no chunk has passed it (fenced) */
        else if (next == MODE_BSP)
                from = f->max_wclock + 2;         /* no worker can push past max+1 (fenced) */
        else
                from = 0;                         /* ASP/SSP to ASP/SSP: applies at once */
        int64_t start = from > 0 ? from : MAX(f->min_wclock, (int64_t) 0);

        size_t nw = 0;
        _cleanup_free_ Peer **members = sorted_workers(c, &nw);
        uint32_t *prev = ps_realloc(c->prev_ids, (nw ? nw : 1) * sizeof *prev);
        if (!prev || !members) {
                log_error("out of memory at a fence commit");
                return;
        }
        c->prev_ids = prev;
        c->nprev = nw;
        for (size_t i = 0; i < nw; i++)
                prev[i] = members[i]->id;
        size_t joined = 0;
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role == PSNET__ROLE__ROLE_WORKER && !p->member) {
                        p->member = true;
                        p->start_clock = start;
                        joined++;
                }
        }
        if (f->mode_change) {
                c->job.mode = next;
                c->job.staleness = f->staleness;
        }
        c->switch_clock = from;
        f->active = false;
        char mode[32];
        log_info("boundary from_clock=%ld joined=%zu start_clock=%ld mode=%s", (long) from, joined, (long) start,
                 job_mode_string(&c->job, mode, sizeof mode));
        c->members_epoch++;
        publish(c);
}

static void handle_fence_rep(Coord *c, WireMsg *m) {
        Fence *f = &c->fence;
        const Psnet__FenceRep *si = m->hdr->fence_rep;
        if (!f->active || m->hdr->seq != f->seq)
                return;
        f->max_clock = MAX(f->max_clock, si->max_clock);
        f->max_wclock = MAX(f->max_wclock, si->max_worker_clock);
        f->min_wclock = MAX(f->min_wclock, si->min_worker_clock);
        if (++f->replies >= f->expected)
                fence_commit(c);
}

/* Called on every loop turn: gives up on a fence a shard did not answer (the
 * shards are released by republishing) and starts one for waiting joiners. */
static void fence_tick(Coord *c) {
        Fence *f = &c->fence;
        uint64_t now = now_ms();
        if (f->active && now > f->deadline) {
                log_warning("fence seq=%lu got %zu of %zu answers; released, will retry", (unsigned long) f->seq,
                            f->replies, f->expected);
                f->active = false;
                f->retry_at = now + 1000;
                publish(c);
                return;
        }
        if (f->active || now < f->retry_at || c->state != JOB_RUNNING)
                return;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER && !c->peers[i].member) {
                        fence_start(c, false, c->job.mode, c->job.staleness);
                        return;
                }
}

static void handle_register(Coord *c, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        const Psnet__Register *reg = h->reg;
        char reason[320];
        if (reg->role != PSNET__ROLE__ROLE_SERVER && reg->role != PSNET__ROLE__ROLE_WORKER) {
                snprintf(reason, sizeof reason, "role %d cannot register (servers and workers can)", reg->role);
                reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        if (c->id.enabled && m->peer.role != reg->role) {
                snprintf(reason, sizeof reason, "a key of role %s cannot register as a %s", role_name(m->peer.role),
                         reg->role == PSNET__ROLE__ROLE_SERVER ? "shard" : "worker");
                log_warning("refused registration reason=\"%s\" key=%s name=%s", reason, m->peer.fingerprint,
                            m->peer.name);
                c->errors++;
                (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_DENIED, h->seq, reason);
                return;
        }
        if (reg->role == PSNET__ROLE__ROLE_SERVER &&
            (!reg->has_want_id || reg->want_id == 0 || !reg->endpoint || !reg->endpoint[0] ||
             strlen(reg->endpoint) > 255)) {
                reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID,
                            "a shard registers with its id (>= 1) and endpoint");
                return;
        }
        if (c->npeers >= COORD_MAX_PEERS) {
                reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID, "too many peers");
                return;
        }
        for (size_t i = 0; reg->role == PSNET__ROLE__ROLE_WORKER && i < c->nevicted; i++)
                if (reg->has_pid && c->evicted[i].pid == reg->pid && strcmp(c->evicted[i].host, reg->name ? reg->name : "") == 0) {
                        snprintf(reason, sizeof reason, "this worker (pid %u) was evicted from job %u: the others waited "
                                 "on it too long; a restarted worker may join", reg->pid, c->job.id);
                        log_warning("refused registration reason=\"%s\"", reason);
                        (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_DENIED, h->seq, reason);
                        return;
                }
        Peer *p = find_route(c, &m->route);
        if (p) /* the same connection registers again: start over */
                remove_peer(c, p);
        uint32_t id;
        if (reg->role == PSNET__ROLE__ROLE_SERVER) {
                id = reg->want_id;
                Peer *old = find_peer(c, PSNET__ROLE__ROLE_SERVER, id);
                uint64_t silent = old ? now_ms() - old->last_seen : 0;
                if (old && silent <= c->cfg->lease_ms) {
                        /* Another process holds the id and keeps its lease: taking it over
                         * would make the two flap. A restarted shard gets in once the old
                         * lease runs out (it registers again meanwhile). */
                        snprintf(reason, sizeof reason,
                                 "shard id %u is held by a live shard at %.64s (pid %u, heard %lu ms ago); stop it "
                                 "or choose another --id", id, old->endpoint ? old->endpoint : "?", old->pid,
                                 (unsigned long) silent);
                        log_warning("refused registration reason=\"%s\"", reason);
                        c->errors++;
                        (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_RESOURCE, h->seq, reason);
                        return;
                }
                if (old) {
                        log_warning("shard re-registered (restart?) shard_id=%u", id);
                        remove_peer(c, old);
                }
        } else {
                id = reg->has_want_id && reg->want_id && !find_peer(c, PSNET__ROLE__ROLE_WORKER, reg->want_id)
                             ? reg->want_id
                             : ++c->next_worker_id;
                c->next_worker_id = MAX(c->next_worker_id, id);
        }
        Peer *np = ps_realloc(c->peers, (c->npeers + 1) * sizeof *np);
        if (!np) {
                reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        c->peers = np;
        p = &c->peers[c->npeers++];
        memset(p, 0, sizeof *p);
        p->id = id;
        p->role = reg->role;
        zmq_msg_init(&p->route);
        (void) zmq_msg_copy(&p->route, &m->route);
        p->endpoint = ps_strdup(reg->endpoint);
        p->pid = reg->has_pid ? reg->pid : 0;
        snprintf(p->host, sizeof p->host, "%s", reg->name ? reg->name : "");
        p->memory_limit = reg->has_memory_limit ? reg->memory_limit : 0;
        p->max_msg = reg->has_max_msg ? reg->max_msg : 0;
        if (c->id.enabled) {
                memcpy(p->public_key, m->peer.key, 32);
                p->has_key = true;
        }
        p->last_seen = now_ms();
        psnet__shard_info__init(&p->shard);
        psnet__worker_info__init(&p->worker);

        Psnet__Header rh;
        Psnet__RegisterRep rep = PSNET__REGISTER_REP__INIT;
        rep.assigned_id = id;
        rep.lease_ms = c->cfg->lease_ms;
        rep.job_state = job_state_to_proto(c->state);
        wire_header_init(&rh, PSNET__MSG_TYPE__MSG_REGISTER_REP);
        rh.body_case = PSNET__HEADER__BODY_REG_REP;
        rh.reg_rep = &rep;
        int r = reply_hdr(c, &m->route, &rh, h->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer registration: %m");
        c->registrations++;
        log_info("registered role=%s id=%u pid=%u endpoint=%s",
                 reg->role == PSNET__ROLE__ROLE_SERVER ? "shard" : "worker", id, p->pid,
                 reg->endpoint ? reg->endpoint : "-");
        if (reg->role == PSNET__ROLE__ROLE_SERVER && c->map && shardmap_find(c->map, id) >= 0) {
                /* A shard of the current map came back: give it the job again. */
                publish(c);
                return;
        }
        if (reg->role == PSNET__ROLE__ROLE_WORKER && c->state == JOB_RUNNING) {
                /* Joins at the next clock boundary. */
                fence_start(c, false, c->job.mode, c->job.staleness);
                return;
        }
        membership_changed(c);
}

static void handle_heartbeat(Coord *c, WireMsg *m, Peer *p) {
        Psnet__Header *h = m->hdr;
        p->last_seen = now_ms();
        if (h->heartbeat->shard && p->role == PSNET__ROLE__ROLE_SERVER) {
                const Psnet__ShardInfo *s = h->heartbeat->shard;
                p->shard = *s;
                p->shard.base = (ProtobufCMessage) PROTOBUF_C_MESSAGE_INIT(&psnet__shard_info__descriptor);
                p->shard.endpoint = NULL;
                p->shard.n_stragglers = 0;
                p->shard.stragglers = NULL;
                p->nstragglers = MIN(s->n_stragglers, (size_t) COORD_MAX_STRAGGLERS);
                if (p->nstragglers)
                        memcpy(p->stragglers, s->stragglers, p->nstragglers * sizeof *p->stragglers);
                p->stalled_ms = s->has_stalled_ms ? s->stalled_ms : 0;
        }
        if (h->heartbeat->worker && p->role == PSNET__ROLE__ROLE_WORKER) {
                p->worker = *h->heartbeat->worker;
                p->worker.base = (ProtobufCMessage) PROTOBUF_C_MESSAGE_INIT(&psnet__worker_info__descriptor);
        }
        int r = reply(c, &m->route, PSNET__MSG_TYPE__MSG_HEARTBEAT_REP, h->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer heartbeat: %m");
}

static void handle_status(Coord *c, WireMsg *m) {
        size_t ns = count_role(c, PSNET__ROLE__ROLE_SERVER), nw = 0, j = 0;
        _cleanup_free_ Psnet__ShardInfo *si = ps_calloc(ns ? ns : 1, sizeof *si);
        _cleanup_free_ Psnet__ShardInfo **sip = ps_calloc(ns ? ns : 1, sizeof *sip);
        _cleanup_free_ Peer **workers = sorted_workers(c, &nw);
        _cleanup_free_ Psnet__WorkerInfo *wi = ps_calloc(nw ? nw : 1, sizeof *wi);
        _cleanup_free_ Psnet__WorkerInfo **wip = ps_calloc(nw ? nw : 1, sizeof *wip);
        Psnet__JobSpec *spec = NULL;
        Psnet__StatusRep ctl = PSNET__STATUS_REP__INIT;
        Psnet__Header h;

        if (!si || !sip || !workers || !wi || !wip || job_to_proto(&c->job, &spec) < 0) {
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role != PSNET__ROLE__ROLE_SERVER)
                        continue;
                si[j] = p->shard;
                si[j].id = p->id;
                si[j].endpoint = p->endpoint;
                si[j].has_in_map = true;
                si[j].in_map = c->map && shardmap_find(c->map, p->id) >= 0;
                sip[j] = &si[j];
                j++;
        }
        for (size_t i = 0; i < nw; i++) {
                wi[i] = workers[i]->worker;
                wi[i].id = workers[i]->id;
                wi[i].has_rank = wi[i].has_pid = wi[i].has_done = true;
                wi[i].rank = workers[i]->rank;
                wi[i].pid = workers[i]->pid;
                wi[i].done = workers[i]->done;
                wip[i] = &wi[i];
        }
        ctl.job = spec;
        ctl.has_map_epoch = ctl.has_members_epoch = true;
        ctl.map_epoch = c->map_epoch;
        ctl.members_epoch = c->members_epoch;
        ctl.n_shards = j;
        ctl.shards = sip;
        ctl.n_workers = nw;
        ctl.workers = wip;
        ctl.job_state = job_state_to_proto(c->state);
        ctl.coord_endpoint = c->cfg->listen;
        ctl.has_uptime_ms = true;
        ctl.uptime_ms = now_ms() - c->start_ms;
        ctl.has_accuracy = c->has_accuracy;
        ctl.accuracy = c->accuracy;
        ctl.reason = c->state == JOB_FAILED && c->fail_reason[0] ? c->fail_reason : NULL;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS_REP);
        h.body_case = PSNET__HEADER__BODY_STATUS_REP;
        h.status_rep = &ctl;
        int r = reply_hdr(c, &m->route, &h, m->hdr->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer status: %m");
        job_proto_free(spec);
}

static void handle_job_submit(Coord *c, WireMsg *m) {
        char err[192];
        Job job;
        if (c->state == JOB_RUNNING) {
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                            "a job is running: stop it first (psctl job stop)");
                return;
        }
        if (job_from_proto(m->hdr->submit, &job, err, sizeof err) < 0) {
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, err);
                return;
        }
        /* A model the registered shards cannot hold between them is refused now. */
        uint64_t limit = 0, per = job.optim.kind == OPTIM_ADAM ? 2 : job.optim.momentum != 0.0f ? 1 : 0;
        uint64_t need = job_nfloats(&job) * 4u * (1 + per);
        size_t shards = 0;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER && c->peers[i].memory_limit) {
                        limit += c->peers[i].memory_limit;
                        shards++;
                }
        if (shards && shards >= MAX(job.expect_shards, 1u) && need > limit) {
                snprintf(err, sizeof err, "the model needs %.1f GiB of values and optimizer state; the %zu shards "
                         "hold %.1f GiB between them", (double) need / (1u << 30), shards, (double) limit / (1u << 30));
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, err);
                return;
        }
        job.id = c->job.id + 1;
        c->job = job;
        c->fail_reason[0] = '\0';
        c->nevicted = 0;
        c->state = JOB_WAITING;
        c->has_accuracy = false;
        char mode[32];
        log_info("job submitted job=%u model=%s mode=%s", job.id, job.model, job_mode_string(&job, mode, sizeof mode));
        (void) reply_job(c, &m->route, m->hdr->seq, NULL);
        maybe_start(c);
}

static void handle_job_stop(Coord *c, WireMsg *m) {
        if (c->state != JOB_RUNNING && c->state != JOB_WAITING) {
                char reason[96];
                snprintf(reason, sizeof reason, "job %u is not running (it is %s)", c->job.id,
                         job_state_name(c->state));
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        c->state = JOB_STOPPED;
        c->job_end_ms = now_ms();
        log_info("job stopped job=%u", c->job.id);
        (void) reply_job(c, &m->route, m->hdr->seq, NULL);
        publish(c);
}

static void handle_result(Coord *c, WireMsg *m, Peer *p) {
        const Psnet__WorkerInfo *wi = m->hdr->result->worker;
        if (p->role != PSNET__ROLE__ROLE_WORKER) {
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, "RESULT comes from workers only");
                return;
        }
        p->worker = *wi;
        p->worker.base = (ProtobufCMessage) PROTOBUF_C_MESSAGE_INIT(&psnet__worker_info__descriptor);
        p->done = true;
        if (wi->has_accuracy) {
                c->accuracy = wi->accuracy;
                c->has_accuracy = true;
                log_info("result worker=%u accuracy=%.4f", p->id, wi->accuracy);
        }
        Psnet__Header h;
        Psnet__ResultRep rr = PSNET__RESULT_REP__INIT;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_RESULT_REP);
        h.body_case = PSNET__HEADER__BODY_RESULT_REP;
        h.result_rep = &rr;
        (void) reply_hdr(c, &m->route, &h, m->hdr->seq);
}

static void handle_drain(Coord *c, WireMsg *m) {
        char reason[96];
        uint32_t wid = m->hdr->worker->id;
        Peer *p = find_peer(c, PSNET__ROLE__ROLE_WORKER, wid);
        if (!p) {
                snprintf(reason, sizeof reason, "no worker %u", wid);
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        p->drain = true;
        log_info("draining worker=%u", p->id);
        Psnet__Header h;
        Psnet__Config c2 = PSNET__CONFIG__INIT;
        c2.has_drain = c2.drain = true;
        c2.job_state = job_state_to_proto(c->state);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &c2;
        int r = reply_hdr(c, &p->route, &h, 0);
        if (r < 0)
                log_warning_errno(r, "Failed to tell worker=%u to drain: %m", p->id);
        (void) reply_job(c, &m->route, m->hdr->seq, "draining");
}

static void handle_job_mode(Coord *c, WireMsg *m) {
        char reason[128];
        Job j = c->job;
        char mode[32];
        if (mode_from_proto(m->hdr->mode, &j.mode, &j.staleness) < 0) {
                snprintf(reason, sizeof reason, "bad mode %d, staleness %u (expected bsp, asp or ssp:0..%u)",
                         (int) m->hdr->mode->mode, m->hdr->mode->staleness, JOB_MAX_STALENESS);
                reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        const char *msg = NULL;
        if (c->state == JOB_RUNNING) {
                fence_start(c, true, j.mode, j.staleness);
                msg = "switching at the next clock boundary";
        } else {
                c->job.mode = j.mode;
                c->job.staleness = j.staleness;
        }
        log_info("mode change requested mode=%s", job_mode_string(&j, mode, sizeof mode));
        (void) reply_job(c, &m->route, m->hdr->seq, msg);
}

static void handle_message(Coord *c, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        char reason[128];
        if (zap_authorize(&c->id, m, true, reason, sizeof reason) < 0) {
                c->errors++;
                log_warning("refused request reason=\"%s\" status=denied key=%s name=%s", reason,
                            m->peer.fingerprint[0] ? m->peer.fingerprint : "-", m->peer.name[0] ? m->peer.name : "-");
                (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_DENIED, h->seq, reason);
                return;
        }
        switch (h->type) {
        case PSNET__MSG_TYPE__MSG_REGISTER:
                handle_register(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_STATUS:
                handle_status(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_JOB_SUBMIT:
                handle_job_submit(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_JOB_STOP:
                handle_job_stop(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_DRAIN:
                handle_drain(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_JOB_MODE:
                handle_job_mode(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_FENCE_REP:
                handle_fence_rep(c, m);
                return;
        case PSNET__MSG_TYPE__MSG_SHARD_ADD:
        case PSNET__MSG_TYPE__MSG_SHARD_REMOVE:
                handle_shard_change(c, m, h->type == PSNET__MSG_TYPE__MSG_SHARD_ADD);
                return;
        case PSNET__MSG_TYPE__MSG_HEARTBEAT:
        case PSNET__MSG_TYPE__MSG_DEREGISTER:
        case PSNET__MSG_TYPE__MSG_RESULT:
                break;
        default:
                snprintf(reason, sizeof reason, "pscoord does not serve message type %d", h->type);
                reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_UNKNOWN_TYPE, reason);
                return;
        }
        Peer *p = find_route(c, &m->route);
        if (!p) {
                reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_UNKNOWN_PEER,
                            "not registered (or the lease expired): register first");
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_HEARTBEAT)
                handle_heartbeat(c, m, p);
        else if (h->type == PSNET__MSG_TYPE__MSG_RESULT)
                handle_result(c, m, p);
        else {
                bool worker = p->role == PSNET__ROLE__ROLE_WORKER;
                log_info("deregistered role=%s id=%u", worker ? "worker" : "shard", p->id);
                (void) reply(c, &m->route, PSNET__MSG_TYPE__MSG_DEREGISTER_REP, h->seq);
                remove_peer(c, p);
                if (worker)
                        membership_changed(c);
        }
}

static void expire_leases(Coord *c) {
        uint64_t now = now_ms();
        bool changed = false;
        for (size_t i = 0; i < c->npeers;) {
                Peer *p = &c->peers[i];
                if (now - p->last_seen <= c->cfg->lease_ms) {
                        i++;
                        continue;
                }
                bool worker = p->role == PSNET__ROLE__ROLE_WORKER;
                c->expiries++;
                log_warning("lease expired role=%s id=%u silent_ms=%lu", worker ? "worker" : "shard", p->id,
                            (unsigned long) (now - p->last_seen));
                remove_peer(c, p);
                changed |= worker;
        }
        if (changed)
                membership_changed(c);
}

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void coord_on_msg(NetSock *ns, WireMsg *m, int r, void *ud) {
        Coord *c = ud;
        (void) ns;
        c->requests++;
        if (r == 0) {
                uint64_t errors = c->errors;
                double t0 = mono_s();
                handle_message(c, m);
                histogram_observe(&c->latency, mono_s() - t0);
                c->refused += c->errors != errors;
        }
        else if (m->has_route) {
                c->refused++;
                reply_error(c, &m->route, m->hdr ? m->hdr->seq : 0, m->status, m->reason);
        }
}

/* --- the service: /metrics, systemd's status line ----------------------------------- */

static void coord_metrics(void *ud, MetricsBuf *b) {
        Coord *c = ud;
        char mode[32], id[16];
        metrics_family(b, "psnet_pscoord_job_state", "gauge", "The job's state (1 for the current one).");
        static const JobState states[] = { JOB_WAITING, JOB_RUNNING, JOB_DONE, JOB_STOPPED, JOB_FAILED };
        for (size_t i = 0; i < ELEMENTSOF(states); i++)
                metrics_sample(b, "psnet_pscoord_job_state", c->state == states[i] ? 1 : 0, "state",
                               job_state_name(states[i]), NULL);
        metrics_family(b, "psnet_pscoord_job_info", "gauge", "The job (always 1).");
        snprintf(id, sizeof id, "%u", c->job.id);
        metrics_sample(b, "psnet_pscoord_job_info", 1, "job", id, "model", c->job.model, "mode",
                       job_mode_string(&c->job, mode, sizeof mode), NULL);
        size_t members = 0, shards_in_map = c->map ? shardmap_size(c->map) : 0;
        for (size_t i = 0; i < c->npeers; i++)
                members += c->peers[i].role == PSNET__ROLE__ROLE_WORKER && c->peers[i].member;
        metrics_one(b, "psnet_pscoord_shards", "gauge", "Shards registered.", (double) count_role(c, PSNET__ROLE__ROLE_SERVER));
        metrics_one(b, "psnet_pscoord_shards_in_map", "gauge", "Shards in the current map.", (double) shards_in_map);
        metrics_one(b, "psnet_pscoord_workers", "gauge", "Workers registered.", (double) count_role(c, PSNET__ROLE__ROLE_WORKER));
        metrics_one(b, "psnet_pscoord_members", "gauge", "Workers in the membership.", (double) members);
        metrics_one(b, "psnet_pscoord_map_epoch", "gauge", "The shard map's epoch.", (double) c->map_epoch);
        metrics_one(b, "psnet_pscoord_members_epoch", "gauge", "The membership's epoch.", (double) c->members_epoch);
        metrics_one(b, "psnet_pscoord_accuracy", "gauge", "The job's test accuracy (NaN before it is known).",
                    c->has_accuracy ? c->accuracy : NAN);
        metrics_one(b, "psnet_pscoord_registrations_total", "counter", "Registrations accepted.", (double) c->registrations);
        metrics_one(b, "psnet_pscoord_lease_expiries_total", "counter", "Peers dropped for silence.", (double) c->expiries);
        metrics_one(b, "psnet_pscoord_evictions_total", "counter", "Workers evicted for stalling the others.",
                    (double) c->evictions);
        metrics_one(b, "psnet_pscoord_requests_total", "counter", "Control messages received.", (double) c->requests);
        metrics_one(b, "psnet_pscoord_refused_total", "counter", "Control messages refused.", (double) c->refused);
        metrics_histogram(b, "psnet_pscoord_request_seconds", "Time to handle a control message.", &c->latency);
        /* Per worker, from its heartbeats. */
        static const struct { const char *name, *help; } wm[] = {
                { "psnet_pscoord_worker_clock", "A worker's clock (steps completed)." },
                { "psnet_pscoord_worker_steps_per_second", "A worker's steps per second." },
                { "psnet_pscoord_worker_samples_per_second", "A worker's samples per second." },
                { "psnet_pscoord_worker_loss", "A worker's recent training loss." },
                { "psnet_pscoord_worker_epoch", "The epoch a worker is in." },
        };
        for (size_t k = 0; k < ELEMENTSOF(wm); k++) {
                metrics_family(b, wm[k].name, "gauge", wm[k].help);
                for (size_t i = 0; i < c->npeers; i++) {
                        const Peer *p = &c->peers[i];
                        if (p->role != PSNET__ROLE__ROLE_WORKER)
                                continue;
                        double v = k == 0 ? (double) p->worker.clock : k == 1 ? p->worker.steps_per_s
                                   : k == 2 ? p->worker.samples_per_s : k == 3 ? p->worker.loss : (double) p->worker.epoch;
                        snprintf(id, sizeof id, "%u", p->id);
                        metrics_sample(b, wm[k].name, v, "worker", id, NULL);
                }
        }
}

static void coord_status(void *ud, char *buf, size_t n) {
        Coord *c = ud;
        snprintf(buf, n, "job %u %s: %zu shards, %zu workers", c->job.id, job_state_name(c->state),
                 count_role(c, PSNET__ROLE__ROLE_SERVER), count_role(c, PSNET__ROLE__ROLE_WORKER));
}

/* A member the others have waited on for --stall-timeout leaves the
 * membership as if its lease had run out: it still heartbeats (a fake or a
 * stuck worker), but holds the BSP barrier or the SSP bound. */
static void evict_stragglers(Coord *c) {
        if (!c->cfg->stall_timeout || c->state != JOB_RUNNING)
                return;
        uint32_t evict[COORD_MAX_STRAGGLERS];
        uint64_t waited[COORD_MAX_STRAGGLERS];
        size_t n = 0;
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *s = &c->peers[i];
                if (s->role != PSNET__ROLE__ROLE_SERVER || s->stalled_ms < 1000ull * c->cfg->stall_timeout)
                        continue;
                for (size_t k = 0; k < s->nstragglers && n < COORD_MAX_STRAGGLERS; k++) {
                        waited[n] = s->stalled_ms;
                        evict[n++] = s->stragglers[k];
                }
                s->nstragglers = 0;
                s->stalled_ms = 0;
        }
        bool changed = false;
        for (size_t k = 0; k < n; k++) {
                Peer *w = find_peer(c, PSNET__ROLE__ROLE_WORKER, evict[k]);
                if (!w || !w->member)
                        continue; /* gone already, or reported by two shards */
                log_warning("evicted a worker the others waited on for %lu s (--stall-timeout %u s) worker=%u",
                            (unsigned long) (waited[k] / 1000), c->cfg->stall_timeout, w->id);
                if (c->nevicted < COORD_MAX_STRAGGLERS) {
                        c->evicted[c->nevicted].pid = w->pid;
                        snprintf(c->evicted[c->nevicted].host, sizeof c->evicted[0].host, "%s", w->host);
                        c->nevicted++;
                }
                remove_peer(c, w);
                c->evictions++;
                changed = true;
        }
        if (changed)
                membership_changed(c);
}

static void coord_on_tick(uv_timer_t *t) {
        Coord *c = t->data;
        expire_leases(c);
        evict_stragglers(c);
        fence_tick(c);
}

static void coord_stop(void *ud, int signo) {
        Coord *c = ud;
        (void) signo;
        service_stopping(c->service);
        uv_stop(&c->loop);
}

/* SIGHUP: the allow-list is read again (a key added or withdrawn). */
static void coord_reload(void *ud) {
        Coord *c = ud;
        char err[256];
        if (!c->zap) {
                log_info("SIGHUP: nothing to reload (no --keys)");
                return;
        }
        if (zap_reload(c->zap, err, sizeof err) < 0)
                log_error("SIGHUP: the allow-list did not load; the old one stays reason=\"%s\"", err);
        else
                log_info("SIGHUP: allow-list reloaded keys=%zu", zap_keys(c->zap));
}

int coord_run(const CoordConfig *cfg) {
        Coord c = { .cfg = cfg, .job = cfg->job, .state = JOB_WAITING };
        char mode[32];
        int r;

        c.start_ms = now_ms();
        r = uv_loop_init(&c.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        const ServiceOps sops = { .stop = coord_stop, .reload = coord_reload, .metrics = coord_metrics,
                                  .status = coord_status };
        r = service_new(&c.loop, "pscoord", &sops, &c, &c.service);
        if (r < 0) {
                log_error_errno(r, "Failed to set up signals: %m");
                goto finish;
        }
        c.zctx = zmq_ctx_new();
        if (!c.zctx) {
                r = log_error_errno(errno, "Failed to create ZeroMQ context: %m");
                goto finish;
        }
        (void) zmq_ctx_set(c.zctx, ZMQ_IO_THREADS, 1);
        char err[512];
        if (cfg->keys) {
                r = keys_identity_load(&c.id, cfg->keys, cfg->key ? cfg->key : "pscoord", NULL,
                                       PSNET__ROLE__ROLE_SERVER, err, sizeof err);
                if (r == 0)
                        r = zap_new(&c.loop, c.zctx, cfg->keys,
                                    ROLE_BIT(PSNET__ROLE__ROLE_ADMIN) | ROLE_BIT(PSNET__ROLE__ROLE_SERVER) |
                                            ROLE_BIT(PSNET__ROLE__ROLE_WORKER) | ROLE_BIT(PSNET__ROLE__ROLE_EDGE),
                                    &c.zap, err, sizeof err);
                if (r < 0) {
                        log_error("cannot use the keys reason=\"%s\"", err);
                        r = -EINVAL; /* a configuration error: exit status 2 */
                        goto finish;
                }
        }
        r = keys_check_listen(cfg->listen, &c.id, cfg->insecure, err, sizeof err);
        if (r < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto finish;
        }
        /* Control messages are small (a job spec is a few KiB) and few per peer. */
        const NetSockConf nc = { .type = ZMQ_ROUTER, .name = "control", .max_msg = 256 << 10, .sndhwm = 64,
                                 .rcvhwm = 64, .keys = c.id.enabled ? &c.id.keys : NULL, .curve_server = true,
                                 .zap_domain = c.id.enabled ? "psnet" : NULL };
        r = netsock_new(&c.loop, c.zctx, &nc, coord_on_msg, &c, &c.ctl);
        if (r < 0) {
                log_error_errno(r, "Failed to create the control socket: %m");
                goto finish;
        }
        r = netsock_bind(c.ctl, cfg->listen);
        if (r < 0) {
                log_error_errno(r, "Failed to bind %s: %m", cfg->listen);
                goto finish;
        }
        if (cfg->http && (r = service_http(c.service, cfg->http, err, sizeof err)) < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto finish;
        }
        r = uv_timer_init(&c.loop, &c.tick);
        if (r == 0) {
                c.tick.data = &c;
                r = uv_timer_start(&c.tick, coord_on_tick, MAX(cfg->lease_ms / 4, 20u), MAX(cfg->lease_ms / 4, 20u));
        }
        if (r < 0) {
                log_error_errno(r, "Failed to start the lease timer: %m");
                goto finish;
        }
        service_ready(c.service);
        log_info("listening endpoint=%s job=%u model=%s mode=%s expect_shards=%u expect_workers=%u security=%s",
                 cfg->listen, c.job.id, c.job.model, job_mode_string(&c.job, mode, sizeof mode),
                 c.job.expect_shards, c.job.expect_workers, c.id.enabled ? "curve" : "none");
        r = uv_run(&c.loop, UV_RUN_DEFAULT);
        r = r < 0 ? r : 0;
finish:
        for (size_t i = 0; i < c.npeers; i++)
                peer_done(&c.peers[i]);
        ps_free(c.peers);
        ps_free(c.prev_ids);
        shardmap_free(c.map);
        c.ctl = netsock_close(c.ctl);
        c.zap = zap_free(c.zap);
        c.service = service_free(c.service);
        if (uv_is_active((uv_handle_t *) &c.tick) || c.tick.data)
                uv_close((uv_handle_t *) &c.tick, NULL);
        uv_run(&c.loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
        if (uv_loop_close(&c.loop) < 0)
                log_debug("event loop closed with handles open");
        if (c.zctx)
                zmq_ctx_term(c.zctx);
        return r;
}
