/* The shard's store: the chunks this shard owns, their optimizer state, and the
 * consistency gate that decides when a pushed gradient is applied.
 *
 * BSP: a push for clock c is parked (its ZeroMQ message kept, no copy) until
 * every member of the current membership has pushed that chunk for c; then the
 * gradients are summed in ascending worker-id order (deterministic whatever the
 * arrival order), averaged, applied once, and the chunk's clock becomes c+1.
 * The push is acknowledged when it is applied (or refused), never before.
 * ASP: a push is applied on arrival.
 * Either way a (worker, chunk, clock) is applied at most once.
 *
 * Values live in reference-counted buffers so that pull replies are sent
 * zero-copy: an update on a buffer that a reply still references copies it
 * first (copy-on-write), so a reply is always one consistent snapshot. */
#pragma once
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>
#include "job.h"
#include "psnet.pb-c.h"
#include "shardmap.h"

typedef struct ValBuf {
        atomic_int refs;
        uint32_t n;
        float *data;     /* 64-byte aligned, n floats */
} ValBuf;

/* One PUSH request: acknowledged once every key it carried is settled. The
 * status sent is OK unless some key was refused (first refusal wins). */
typedef struct PushReq {
        zmq_msg_t route;
        uint64_t seq;
        uint32_t worker;
        int64_t clock;
        int remaining;      /* keys not yet settled, +1 while the request is being read */
        int status;
} PushReq;

typedef struct Pending {
        PushReq *req;
        zmq_msg_t grad;     /* the received frame itself, no copy */
} Pending;

typedef struct Chunk {
        uint32_t tensor, chunk, len;
        ValBuf *val;
        float *state;           /* optimizer state, optim_state_per_value * len */
        uint64_t steps;         /* updates applied */
        int64_t clock;          /* BSP clocks closed (ASP/SSP updates leave it; steps counts them) */
        Pending *pending;       /* BSP: pushes parked for clock `clock` */
        size_t npending, cpending;
        int64_t *last_clock;    /* per worker id: last clock applied or parked, -1 none */
        size_t nlast;
} Chunk;

/* Called once per PUSH request when all its keys are settled; the store frees
 * the request afterwards. */
typedef void (*StoreAckFn)(void *userdata, PushReq *req);

/* A chunk leaves this shard (the map gave it to dest): the callback sends its
 * state; the store frees it afterwards. Pushes parked on it were refused
 * (MOVED) before the call, so the workers resend them to dest. */
typedef void (*StoreMoveFn)(void *userdata, Chunk *c, const ShardDesc *dest);

/* Who takes part and how, for a range of clocks. */
typedef struct StoreCfg {
        ConsistencyMode mode;
        uint32_t staleness;
        uint32_t *members;      /* ascending worker ids */
        size_t nmembers;
} StoreCfg;

typedef struct Store {
        Job job;
        bool has_job;
        uint32_t shard_id;
        ShardMap *map;
        Chunk ***chunks;        /* [tensor][chunk]: NULL when not owned */
        uint64_t nkeys, bytes;
        /* Clocks < switch_clock follow prev, the others cur (a change agreed at a
         * clock boundary); equal when no change is pending. */
        StoreCfg prev, cur;
        int64_t switch_clock;
        uint64_t members_epoch;
        int64_t *wclock;        /* per worker id: clocks completed (pushed), -1 unknown */
        size_t nwclock;
        bool fenced;            /* BSP clocks >= fence_limit do not close; */
        int64_t fence_limit;    /* ASP/SSP pulls for clocks > fence_pull_limit wait */
        int64_t fence_pull_limit;
        uint64_t pushes, pulls, applied;
        uint64_t copies;        /* values copied before an update because a pull reply still read them */
        StoreAckFn ack;
        StoreMoveFn move;
        void *ack_userdata;
        float *sum;             /* scratch for aggregation (chunk_floats) */
} Store;

int store_new(uint32_t shard_id, StoreAckFn ack, void *userdata, Store **ret);
Store *store_free(Store *s);

/* Installs a job and the map. The first map of a job initialises every chunk
 * this shard owns (deterministically). A later map moves chunks: those it no
 * longer owns go to the move callback; those it newly owns are awaited
 * (store_install) and answered MIGRATING until they arrive. A different job
 * drops everything. */
int store_configure(Store *s, const Job *job, const ShardMap *map);

/* Installs the state of a chunk that moved here. -EEXIST when it is already
 * here, -ENOENT when the map does not give it to this shard, -EINVAL when the
 * sizes do not match the job. */
int store_install(Store *s, uint32_t tensor, uint32_t chunk, const void *values, uint32_t len,
                  const void *state, size_t state_floats, uint64_t steps, int64_t clock,
                  const int64_t *last_clocks, size_t nlast);

/* Keys the map gives this shard that have not arrived yet. */
uint64_t store_incoming(const Store *s);

/* Replaces the membership (ids with the clocks they start at; start may be NULL)
 * for clocks >= from_clock; clocks before it keep prev (NULL: the same set).
 * mode/staleness likewise. Ends a fence. Under BSP this may close clocks. */
int store_set_config(Store *s, ConsistencyMode mode, uint32_t staleness, const uint32_t *workers,
                     const int64_t *start, size_t n, const uint32_t *prev, size_t nprev,
                     int64_t from_clock, uint64_t epoch);
/* Shorthand: the same set, mode and staleness for every clock. */
int store_set_members(Store *s, const uint32_t *workers, size_t n, uint64_t epoch);

/* Starts a fence until the next store_set_config: BSP clocks past the next one
 * stop closing, and ASP/SSP pulls past the fastest worker's next clock wait, so
 * that a boundary pscoord picks from the replies is still ahead of everyone.
 * Returns the highest chunk clock; the members' slowest and fastest completed
 * clocks go to ret_min_worker and ret_max_worker (0 when unknown). */
int64_t store_fence(Store *s, int64_t *ret_min_worker, int64_t *ret_max_worker);

/* Whether a pull of these chunks by a worker for clock may be answered now:
 * BSP waits until the chunks reached clock and every member completed clock-1;
 * SSP until the slowest member completed clock - staleness; ASP never waits.
 * ret_slowest (may be NULL) gets the slowest member's completed clocks. */
bool store_pull_ready(Store *s, Chunk *const *chunks, size_t n, int64_t clock, int64_t *ret_slowest);

/* The configuration that governs a clock. */
const StoreCfg *store_cfg(const Store *s, int64_t clock);

/* The chunk for a key or NULL. *ret_status says why not: UNKNOWN_KEY, SIZE,
 * MOVED (another shard's), MIGRATING (on its way here). */
Chunk *store_lookup(Store *s, uint32_t tensor, uint32_t chunk, uint32_t len, int *ret_status);

/* A new request (route copied) with remaining = 1 for the reader's hold. */
int pushreq_new(const zmq_msg_t *route, uint64_t seq, uint32_t worker, int64_t clock,
                PushReq **ret);
/* Settles one key (or the reader's hold) of req with status; acks and frees
 * req when nothing remains. */
void pushreq_settle(Store *s, PushReq *req, int status);

/* Offers one pushed gradient for chunk c. The frame is moved into the store when
 * parked. Settles the key in req now (ASP apply, DUPLICATE, STALE) or later
 * (BSP, when the clock closes). */
int store_push(Store *s, Chunk *c, PushReq *req, zmq_msg_t *grad);

/* Closes every BSP clock that can close now; acknowledges the pushes applied. */
int store_settle(Store *s);

/* A zero-copy message over the chunk's current values (takes a reference). */
int store_value_msg(Store *s, Chunk *c, zmq_msg_t *ret);

/* Smallest clock over owned chunks (0 when none). */
int64_t store_clock(const Store *s);
