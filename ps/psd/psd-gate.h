/* SPDX-License-Identifier: Apache-2.0 */
/* The shard's consistency gate: when a pushed gradient is applied and when a
 * pull is answered. Pushes and pulls wait here, and only here.
 *
 * Admission (every push, before anything of it is applied): the sender must
 * be a member of the clock's membership (else STALE: not applied), with CURVE
 * its key must be that member's (else DENIED), the job's progress it carries
 * a share from 0 to 1 (else INVALID), and every value must be finite unless
 * the job allows otherwise (else NOT_FINITE). A push is applied whole
 * or not at all; a push in parts (Header.parts, docs/data-path.md) part by
 * part, and its worker's clock here counts it pushed once every part is in.
 *
 * BSP: a push for clock c is parked (its ZeroMQ frame kept, no copy) until
 * every member has pushed that chunk for c; the gradients are summed in
 * ascending worker-id order (deterministic whatever the arrival order),
 * averaged, applied once, and the chunk's clock becomes c+1. The push is
 * acknowledged when it is applied (or refused), never before. ASP and SSP
 * apply a push on arrival as 1/W of a step. A (worker, chunk, clock) is applied
 * at most once.
 *
 * Pulls: BSP answers a pull for c once the chunks reached c; SSP once the
 * slowest member completed c - s; ASP at once. A pull that must wait is parked
 * — bounded: at most max_parked_per_worker per worker and max_parked in all, a
 * clock at most 2 ahead of the worker's own, a member only, and refused after
 * park_timeout_ms.
 *
 * Changes at a clock boundary: two configurations, prev for clocks below
 * switch_clock and cur from it on (see docs/consistency.md). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include "job.h"
#include "psd-store.h"
#include "psnet.pb-c.h"
#include "wire.h"

typedef struct Gate Gate;

/* One PUSH request: acknowledged once every key it carried is settled. The
 * status sent is OK unless some key was refused (first refusal wins). */
typedef struct PushReq {
        zmq_msg_t route;
        uint64_t seq;
        uint32_t worker;
        int64_t clock;
        float progress;     /* the job's progress the push carried (negative: none), for --lr-schedule */
        int remaining;      /* keys not yet settled, +1 while the request is being read */
        int status;
        uint64_t arrived;   /* ms, for the latency of its acknowledgement */
        bool replica;       /* forwarded by the primary: held when parked, its parked copies acknowledge nothing */
        int forwards;       /* forwards to backups not answered yet: a BSP clock does not close on it before */
        uint32_t part, parts; /* a push in parts: this one of so many (parts 0: whole) */
        uint64_t epoch;     /* the shard-map epoch a push in parts was cut for */
        bool fed_round;     /* not a push: a federated round's close, answered to pscoord (seq: its
                             * request's) once the backups hold the chunks it changed */
        uint64_t fed_number;
        size_t fed_states;  /* the chunk states sent to backups for it */
        bool rows_copy;     /* a table clock's push, waiting for the clock's copies (ROWS_COPY) */
} PushReq;

struct Pending {
        PushReq *req;       /* acknowledged when applied; NULL: a copy held for the primary */
        uint32_t worker;
        int64_t clock;
        float progress;     /* as its PushReq's */
        zmq_msg_t grad;     /* the received frame itself, no copy */
};

/* Who takes part and how, for a range of clocks. */
typedef struct GateCfg {
        ConsistencyMode mode;
        uint32_t staleness;
        uint32_t *members;      /* ascending worker ids */
        uint8_t (*keys)[32];    /* with CURVE: each member's public key, parallel (else NULL) */
        size_t nmembers;
} GateCfg;

typedef struct ParkedPull {
        zmq_msg_t route;
        Psnet__Header *hdr;     /* the request, owned */
        uint64_t since;         /* ms */
} ParkedPull;

/* A PUSH request is settled (req->status says how): acknowledge it. */
typedef void (*GateAckFn)(void *ud, PushReq *req);
/* A pull is answered: status OK with chunks its keys' chunks (answer with
 * their values), or another status and a reason (answer with an error).
 * arrived: when the pull arrived (ms, for its latency). */
typedef void (*GateAnswerFn)(void *ud, const zmq_msg_t *route, const Psnet__Header *req, Chunk **chunks,
                             int status, const char *reason, uint64_t arrived);

typedef struct GateLimits {
        size_t max_parked;              /* pulls parked at once, all workers */
        size_t max_parked_per_worker;
        uint64_t park_timeout_ms;
} GateLimits;

/* The parts of one worker's push in parts that are in (bit i: part i), for
 * the newest (clock, epoch) seen. */
typedef struct PartsIn {
        int64_t clock;
        uint64_t epoch;
        uint32_t parts, nin;
        uint64_t in[WIRE_MAX_PARTS / 64];
} PartsIn;

/* A push's frames to this shard's backups (psd-migrate.c's migrate_forward):
 * frames as the worker sent them (bf16: half the bytes) or its f32 ones; a
 * status (OK: each backup's answer settles one forward of req). */
typedef int (*GateForwardFn)(void *ud, PushReq *req, const Psnet__Header *h, const zmq_msg_t *frames, bool bf16);

/* What the gate tells its owner (psd-server.c). */
typedef struct GateHooks {
        GateAckFn ack;
        GateAnswerFn answer;
        GateForwardFn forward;  /* NULL: no backups */
        void *ud;
} GateHooks;

/* Public fields are the owner's to read (metrics, status) and, for limits,
 * to set; the rest are the gate's. */
struct Gate {
        /* public */
        GateLimits limits;
        uint64_t members_epoch;
        GateCfg prev, cur;
        size_t nparked;
        uint64_t refused_stale, refused_denied, refused_nonfinite, refused_pulls, expired_pulls, refused_clock;
        uint64_t refused_norm;      /* pushes above the job's --max-grad-norm */
        uint64_t duplicates;            /* pushes of a key for a clock the worker had pushed it for */
        uint64_t push_parts;    /* parts of pushes in parts taken */
        bool fenced;            /* BSP clocks >= fence_limit do not close; */
        int64_t fence_limit;    /* ASP/SSP pulls for clocks > fence_pull_limit wait */
        int64_t fence_pull_limit;
        /* private */
        Store *store;
        GateHooks hooks;
        int64_t switch_clock;
        int64_t *wclock;        /* per worker id: clocks completed (pushed), -1 unknown */
        size_t nwclock;
        PartsIn *parts_in;      /* per worker id: its push in parts under way */
        size_t nparts_in;
        ParkedPull *parked;
        size_t cparked;
};

#define GATE_DEFAULT_PARK_TIMEOUT_MS 300000u
/* A worker's pulls to one shard: CLIENT_WINDOW parts of a round, and those of
 * rounds it gave up on (under a new map, say) that still wait. */
#define GATE_PARKED_PER_WORKER 12u

/* The gate over store s (which it holds from now on: the gate empties the
 * parked pushes of the chunks the store lets go). */
int gate_new(Store *s, const GateHooks *hooks, Gate **ret);
/* Answers the parked pulls (SHUTTING_DOWN) and refuses the parked pushes,
 * then frees the gate (not the store). NULL is fine. */
Gate *gate_free(Gate *g);
Store *gate_store(const Gate *g);

/* store_configure, and the clocks that can close then: 1 for a fresh job
 * (its mode and staleness the gate's from then on), 0, or a negative errno. */
int gate_configure(Gate *g, const Job *job, const ShardMap *map);
/* store_install_image, the pushes parked on the image parked here, and the
 * clocks that can close then. */
int gate_install_image(Gate *g, const ChunkImage *im);
/* The shard's clock: under BSP the slowest chunk's, under ASP/SSP the
 * fastest member's progress. */
int64_t gate_clock(const Gate *g);
/* The clocks worker completed here (pushed to this shard's chunks), -1 for
 * a worker it has not heard of. */
int64_t gate_worker_clock(const Gate *g, uint32_t worker);

/* A new request (route copied) with remaining = 1 for the reader's hold. */
int pushreq_new(const zmq_msg_t *route, uint64_t seq, uint32_t worker, int64_t clock, PushReq **ret);
/* Settles one key (or the reader's hold) of req with status; acknowledges and
 * frees req when nothing remains. */
void pushreq_settle(Gate *g, PushReq *req, int status);

/* Replaces the membership (ids with the clocks they start at and, with CURVE,
 * their keys; start and keys may be NULL) for clocks >= from_clock; clocks
 * before it keep prev (NULL: the same set). mode/staleness likewise. Ends a
 * fence. Under BSP this may close clocks. */
int gate_set_config(Gate *g, ConsistencyMode mode, uint32_t staleness, const uint32_t *workers,
                    const int64_t *start, const uint8_t (*keys)[32], size_t n, const uint32_t *prev, size_t nprev,
                    int64_t from_clock, uint64_t epoch);
/* Shorthand: the same set, mode and staleness for every clock. */
int gate_set_members(Gate *g, const uint32_t *workers, size_t n, uint64_t epoch);
/* The configuration that governs a clock. */
const GateCfg *gate_cfg(const Gate *g, int64_t clock);

/* Starts a fence until the next gate_set_config: BSP clocks past the next one
 * stop closing, and ASP/SSP pulls past the fastest worker's next clock wait, so
 * that a boundary pscoord picks from the replies is still ahead of everyone.
 * Returns the highest chunk clock; the members' slowest and fastest completed
 * clocks go to ret_min_worker and ret_max_worker (0 when unknown). */
int64_t gate_fence(Gate *g, int64_t *ret_min_worker, int64_t *ret_max_worker);
/* The members' slowest and fastest completed clocks (members with no push
 * yet not counted; 0 when none has pushed), as gate_fence gives them. */
void gate_worker_clocks(const Gate *g, int64_t *ret_min_worker, int64_t *ret_max_worker);

/* Admits a PUSH whose keys were looked up: 0, or a status (STALE, DENIED,
 * INVALID, NOT_FINITE) with the reason. sender_key: the sender's CURVE key, or
 * NULL. In two steps, so that psd spends nothing on a stranger's push: the
 * sender (a member of the push's clock, with its own key, a progress within
 * 0..1), then its f32 frames (finite unless the job allows otherwise). */
int gate_admit_push(Gate *g, const Psnet__Header *h, const zmq_msg_t *frames, const uint8_t *sender_key,
                    char *reason, size_t n);
int gate_admit_sender(Gate *g, const Psnet__Header *h, const uint8_t *sender_key, char *reason, size_t n);
int gate_admit_values(Gate *g, const Psnet__Header *h, const zmq_msg_t *frames, char *reason, size_t n);
/* gate_admit_values over the keys' f32 values, key i's at at[i] (a push in
 * shared memory). */
int gate_admit_keys(Gate *g, const Psnet__Header *h, uint8_t *const *at, char *reason, size_t n);
/* Sets the NaNs and infinities of g[0..n) to 0 (unless the job allows them):
 * how many there were. For a copy whose source was admitted and may have
 * changed since (shared memory a worker still writes). */
size_t gate_zero_nonfinite(Gate *g, float *v, size_t n);
/* Offers one pushed gradient for chunk c. The frame is moved into the gate
 * when parked. Settles the key in req now (ASP apply, DUPLICATE, STALE) or
 * later (BSP, when the clock closes). */
int gate_push(Gate *g, Chunk *c, PushReq *req, zmq_msg_t *grad);
/* A part of a worker's push in parts went through the gate (every key
 * offered): its worker's clock advances once every part of that clock and
 * map epoch is in. A part of an older clock or epoch than the newest seen
 * changes nothing. Nothing to do for a whole push or a backup's copy. */
int gate_push_part(Gate *g, const PushReq *req);

/* The index of the first of the n floats at p (any alignment, as ZeroMQ
 * hands frames) that is NaN or infinity, or n. */
size_t gate_first_nonfinite(const unsigned char *p, size_t n);
/* One worker's push on its way into the gate, whatever it came as (frames of
 * f32, bf16 or top-k, shared memory, in place): its values f32, one frame per
 * key, or, from shared memory a worker owns with no backup to forward to,
 * read key by key where they lie (the shard then holds one key of the push
 * at a time). decode, when set, turns what came into that once the sender
 * is admitted, so that nothing is widened or copied for a stranger
 * (psd-push.c); it also says what the backups get. */
typedef struct Push {
        const Psnet__Header *h;         /* sender, seq, clock, keys, progress, parts */
        const zmq_msg_t *route;
        const uint8_t *sender_key;      /* with CURVE: the connection's key (NULL: none) */
        Chunk **chunks;                 /* the keys' chunks, looked up */
        zmq_msg_t *frames;              /* f32, one per key (NULL: read from at) */
        uint8_t *const *at;             /* without frames: key i's f32 values */
        const zmq_msg_t *forward;       /* what the backups get (NULL: frames) */
        bool forward_bf16;
        int (*decode)(struct Push *p, void *ud, char *reason, size_t n);
        void *decode_ud;
        uint64_t bytes;                 /* as they came (after decode) */
        size_t zeroed;                  /* values read from at that had turned NaN or infinite: applied as 0 */
} Push;

/* The one way a worker's push enters the shard: its sender admitted (a member
 * of the clock's membership, with its own key, a progress within 0..1), its
 * values decoded and admitted (finite unless the job allows otherwise), the
 * push forwarded to the backups, then every key applied (ASP, SSP) or parked
 * (BSP), and a push in parts counted. OK once it is taken (the ack hook
 * answers it when it is settled), or the status why not, with the reason:
 * nothing of it taken. */
int gate_push_request(Gate *g, Push *p, char *reason, size_t n);

/* Closes every BSP clock that can close now; acknowledges the pushes applied. */
int gate_settle(Gate *g);
/* Parks a gradient that came with a chunk's state (a backup being built),
 * with the progress its push carried. */
int gate_park_copy(Gate *g, Chunk *c, uint32_t worker, float progress, const void *grad, size_t bytes);

/* Whether a pull of these chunks for clock may be answered now (see above).
 * ret_slowest (may be NULL) gets the slowest member's completed clocks. */
bool gate_pull_ready(Gate *g, Chunk *const *chunks, size_t n, int64_t clock, int64_t *ret_slowest);
/* A PULL whose keys were looked up (chunks): answered at once (through the
 * answer callback), or parked (*hdr taken, now owned by the gate), or refused:
 * a status (INVALID: a clock too far ahead; DENIED: not a member; RESOURCE:
 * too many parked) with the reason, for the caller to answer. */
int gate_pull(Gate *g, const zmq_msg_t *route, Psnet__Header **hdr, Chunk **chunks, uint64_t now, char *reason,
              size_t n);
/* Answers the parked pulls that can be answered now (or no longer at all). */
void gate_wake(Gate *g);
/* Refuses the parked pulls older than the park time-out. */
void gate_expire(Gate *g, uint64_t now);
/* The members others are waiting on (a BSP clock that cannot close without
 * them, or SSP pulls parked on the slowest), at most max ids, and since when
 * (*ret_ms, milliseconds). */
size_t gate_stragglers(Gate *g, uint64_t now, uint32_t *ids, size_t max, uint64_t *ret_ms);

