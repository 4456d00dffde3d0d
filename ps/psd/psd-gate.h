/* The shard's consistency gate: when a pushed gradient is applied and when a
 * pull is answered. Pushes and pulls wait here, and only here.
 *
 * Admission (every push, before anything of it is applied): the sender must
 * be a member of the clock's membership (else STALE: not applied), with CURVE
 * its key must be that member's (else DENIED), the job's progress it carries
 * a share from 0 to 1 (else INVALID), and every value must be finite unless
 * the job allows otherwise (else NOT_FINITE). A push is applied whole
 * or not at all; a push in parts (Header.parts, docs/ARCHITECTURE.md) part by
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
 * switch_clock and cur from it on (see docs/ARCHITECTURE.md). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include "job.h"
#include "psnet.pb-c.h"
#include "wire.h"

typedef struct Store Store;
typedef struct Chunk Chunk;

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
} PushReq;

typedef struct Pending {
        PushReq *req;       /* acknowledged when applied; NULL: a copy held for the primary */
        uint32_t worker;
        int64_t clock;
        float progress;     /* as its PushReq's */
        zmq_msg_t grad;     /* the received frame itself, no copy */
} Pending;

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

typedef struct Gate {
        GateCfg prev, cur;
        int64_t switch_clock;
        uint64_t members_epoch;
        int64_t *wclock;        /* per worker id: clocks completed (pushed), -1 unknown */
        size_t nwclock;
        PartsIn *parts_in;      /* per worker id: its push in parts under way */
        size_t nparts_in;
        bool fenced;            /* BSP clocks >= fence_limit do not close; */
        int64_t fence_limit;    /* ASP/SSP pulls for clocks > fence_pull_limit wait */
        int64_t fence_pull_limit;
        ParkedPull *parked;
        size_t nparked, cparked;
        GateLimits limits;
        GateAckFn ack;
        GateAnswerFn answer;
        void *ud;
        uint64_t refused_stale, refused_denied, refused_nonfinite, refused_pulls, expired_pulls;
        uint64_t push_parts;    /* parts of pushes in parts taken */
} Gate;

#define GATE_DEFAULT_PARK_TIMEOUT_MS 300000u
/* A worker's pulls to one shard: CLIENT_WINDOW parts of a round, and those of
 * rounds it gave up on (under a new map, say) that still wait. */
#define GATE_PARKED_PER_WORKER 12u

/* A new request (route copied) with remaining = 1 for the reader's hold. */
int pushreq_new(const zmq_msg_t *route, uint64_t seq, uint32_t worker, int64_t clock, PushReq **ret);
/* Settles one key (or the reader's hold) of req with status; acknowledges and
 * frees req when nothing remains. */
void pushreq_settle(Store *s, PushReq *req, int status);

/* Replaces the membership (ids with the clocks they start at and, with CURVE,
 * their keys; start and keys may be NULL) for clocks >= from_clock; clocks
 * before it keep prev (NULL: the same set). mode/staleness likewise. Ends a
 * fence. Under BSP this may close clocks. */
int gate_set_config(Store *s, ConsistencyMode mode, uint32_t staleness, const uint32_t *workers,
                    const int64_t *start, const uint8_t (*keys)[32], size_t n, const uint32_t *prev, size_t nprev,
                    int64_t from_clock, uint64_t epoch);
/* Shorthand: the same set, mode and staleness for every clock. */
int gate_set_members(Store *s, const uint32_t *workers, size_t n, uint64_t epoch);
/* The configuration that governs a clock. */
const GateCfg *gate_cfg(const Store *s, int64_t clock);

/* Starts a fence until the next gate_set_config: BSP clocks past the next one
 * stop closing, and ASP/SSP pulls past the fastest worker's next clock wait, so
 * that a boundary pscoord picks from the replies is still ahead of everyone.
 * Returns the highest chunk clock; the members' slowest and fastest completed
 * clocks go to ret_min_worker and ret_max_worker (0 when unknown). */
int64_t gate_fence(Store *s, int64_t *ret_min_worker, int64_t *ret_max_worker);
/* The members' slowest and fastest completed clocks (members with no push
 * yet not counted; 0 when none has pushed), as gate_fence gives them. */
void gate_worker_clocks(const Store *s, int64_t *ret_min_worker, int64_t *ret_max_worker);

/* Admits a PUSH whose keys were looked up: 0, or a status (STALE, DENIED,
 * INVALID, NOT_FINITE) with the reason. sender_key: the sender's CURVE key, or
 * NULL. In two steps, so that psd spends nothing on a stranger's push: the
 * sender (a member of the push's clock, with its own key, a progress within
 * 0..1), then its f32 frames (finite unless the job allows otherwise). */
int gate_admit_push(Store *s, const Psnet__Header *h, const zmq_msg_t *frames, const uint8_t *sender_key,
                    char *reason, size_t n);
int gate_admit_sender(Store *s, const Psnet__Header *h, const uint8_t *sender_key, char *reason, size_t n);
int gate_admit_values(Store *s, const Psnet__Header *h, const zmq_msg_t *frames, char *reason, size_t n);
/* gate_admit_values over the keys' f32 values, key i's at at[i] (a push in
 * shared memory). */
int gate_admit_keys(Store *s, const Psnet__Header *h, uint8_t *const *at, char *reason, size_t n);
/* Sets the NaNs and infinities of g[0..n) to 0 (unless the job allows them):
 * how many there were. For a copy whose source was admitted and may have
 * changed since (shared memory a worker still writes). */
size_t gate_zero_nonfinite(Store *s, float *g, size_t n);
/* Offers one pushed gradient for chunk c. The frame is moved into the gate
 * when parked. Settles the key in req now (ASP apply, DUPLICATE, STALE) or
 * later (BSP, when the clock closes). */
int gate_push(Store *s, Chunk *c, PushReq *req, zmq_msg_t *grad);
/* A part of a worker's push in parts went through the gate (every key
 * offered): its worker's clock advances once every part of that clock and
 * map epoch is in. A part of an older clock or epoch than the newest seen
 * changes nothing. Nothing to do for a whole push or a backup's copy. */
int gate_push_part(Store *s, const PushReq *req);

/* The index of the first of the n floats at p (any alignment, as ZeroMQ
 * hands frames) that is NaN or infinity, or n. */
size_t gate_first_nonfinite(const unsigned char *p, size_t n);
/* Closes every BSP clock that can close now; acknowledges the pushes applied. */
int gate_settle(Store *s);
/* c leaves this shard: refuses the pushes parked on it (MOVED; their dedupe
 * entries rolled back, so the workers resend them to the new owner). */
void gate_chunk_leaving(Store *s, Chunk *c);
/* c stays as a backup: the pushes parked on it are refused (MOVED, so the
 * workers resend them to the new primary) but kept, as the copies a backup
 * holds. */
void gate_chunk_demoted(Store *s, Chunk *c);
/* Parks a gradient that came with a chunk's state (a backup being built),
 * with the progress its push carried. */
int gate_park_copy(Store *s, Chunk *c, uint32_t worker, float progress, const void *grad, size_t bytes);

/* Whether a pull of these chunks for clock may be answered now (see above).
 * ret_slowest (may be NULL) gets the slowest member's completed clocks. */
bool gate_pull_ready(Store *s, Chunk *const *chunks, size_t n, int64_t clock, int64_t *ret_slowest);
/* A PULL whose keys were looked up (chunks): answered at once (through the
 * answer callback), or parked (*hdr taken, now owned by the gate), or refused:
 * a status (INVALID: a clock too far ahead; DENIED: not a member; RESOURCE:
 * too many parked) with the reason, for the caller to answer. */
int gate_pull(Store *s, const zmq_msg_t *route, Psnet__Header **hdr, Chunk **chunks, uint64_t now, char *reason,
              size_t n);
/* Answers the parked pulls that can be answered now (or no longer at all). */
void gate_wake(Store *s);
/* Refuses the parked pulls older than the park time-out. */
void gate_expire(Store *s, uint64_t now);
/* The members others are waiting on (a BSP clock that cannot close without
 * them, or SSP pulls parked on the slowest), at most max ids, and since when
 * (*ret_ms, milliseconds). */
size_t gate_stragglers(Store *s, uint64_t now, uint32_t *ids, size_t max, uint64_t *ret_ms);
/* Frees what the gate holds (parked pulls answered SHUTTING_DOWN first). */
void gate_done(Store *s);
