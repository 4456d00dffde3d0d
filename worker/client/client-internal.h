/* SPDX-License-Identifier: Apache-2.0 */
/* The shards' data plane inside libpsnet, shared by its files: client.c (the
 * round's state machine: parts, windows, resends, replies), client-req.c
 * (what every request says: its header, where its keys lie in the caller's
 * tensors), and the transports a request goes by, each an ops table in front
 * of the state machine (Redis's ConnectionType and ps-lite's Van are the
 * model): client-frames.c (the values in ZeroMQ frames: f32, bf16, top-k, a
 * federated update's own encoding) and client-shm.c (same-host shared
 * memory: copied through the shard's own memory, or in place in the
 * caller's). Not installed. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "client.h"
#include "wire.h"

struct ClientTransport;

/* Requests of each kind (push, pull) in flight to one shard at a time. */
#define CLIENT_WINDOW 4
/* The most bytes of keys one push or pull carries in frames, unless
 * PSNET_PART_KIB says otherwise: a key each with the default chunk of 1 MiB
 * (measured best on one host: docs/bench-log.md). A shard's keys go in at
 * most WIRE_MAX_PARTS parts, bigger ones where they would be more. */
#define CLIENT_PART_BYTES (1u << 20)

/* One request of a round: a part's push or pull. */
typedef enum { REQ_NONE, REQ_TODO, REQ_SENT, REQ_RETRY, REQ_DONE } ReqState;

typedef struct PartReq {
        ReqState state;
        uint64_t seq;                  /* REQ_SENT: the request's */
        uint64_t at;                   /* REQ_RETRY: resend then (ms) */
        const struct ClientTransport *via; /* REQ_SENT: how it went (frames, shared memory, in place) */
} PartReq;

/* Keys [first, first + nkeys) of a shard's, pushed and pulled in requests of
 * their own; through the shard's own shared memory at before values from the
 * start of the gradients' and of the values' areas; in place (the client's
 * memory) where the keys lie in the caller's tensors. */
typedef struct Part {
        size_t first, nkeys;
        size_t before;                 /* values of the shard's keys before first */
        PartReq push, pull;
} Part;

typedef struct ShardConn {
        struct Client *client;
        uint32_t id;
        char *endpoint;
        NetSock *sock;
        Psnet__Key *keys;          /* the keys this shard owns */
        Psnet__Key **keyp;
        size_t nkeys;
        Part *parts;                   /* this round's (shard_plan), MIN(nkeys, WIRE_MAX_PARTS) of room */
        size_t nparts;
        /* Same-host shared memory (shm.h): the pushed gradients at 0, the
         * pulled values at area, each key after the other. */
        ShmRegion shm;
        size_t area;                   /* bytes of this shard's keys as f32 */
        bool shm_tried;                /* opened, or failed: frames until the next connection */
        /* A session over the client's memory (client_set_memory): rounds in
         * place name the caller's own tensors in it. */
        ShmRegion mem;
        bool mem_tried;
} ShardConn;

/* --sparsify's encoded frames (client-frames.c). */
typedef struct Sparse Sparse;
/* A rows exchange under way, and a table's hot-row cache (client-rows.c). */
typedef struct RowsOp RowsOp;
typedef struct RowCache RowCache;

struct Client {
        uv_loop_t *loop;
        void *zctx;
        uv_timer_t deadline, retry;
        unsigned timers;               /* timers not yet closed */
        uint64_t map_epoch, need_epoch;
        uint64_t members_epoch;        /* sent with every request (0: not yet known) */
        uint64_t examples;             /* sent with pushes (a federated update's example count; 0: none) */
        float progress;                /* sent with pushes (the job's progress; negative: none) */
        bool masked;                   /* pushes carry CODEC_MASKED (a --secagg update) */
        uint32_t update_of;            /* --strategy custom: pulls read this client's update (0: the values) */
        bool strategy_delta;           /* --strategy custom: pushes are the strategy's delta */
        bool pull_f32;                 /* --wire bf16: pulls ask for f32 all the same (the final weights) */
        int codec;                     /* with frame_fn: a --compress update's codec */
        ClientFrameFn frame_fn;
        void *frame_ud;
        Job job;
        uint32_t worker_id;
        NetKeyPair keys;
        bool has_keys;
        NetMux *via;                    /* through psgate (client_new) */
        ShardConn *shards;
        size_t nshards;
        uint64_t seq;
        unsigned timeout_ms;
        size_t part_bytes;             /* CLIENT_PART_BYTES or PSNET_PART_KIB */
        /* the round in progress */
        bool busy;
        const float *const *grads;
        int64_t push_clock, pull_clock, min_clock;
        float *const *params;
        ClientRoundFn cb;
        void *cb_ud;
        double t0;
        /* client_pull_begin's pull, completed by the next round */
        float *const *pf_params;
        int64_t pf_clock;
        bool prefetching;
        int prefetch_err;              /* an answer to the prefetched pull that ends the next round */
        bool freeing;
        Sparse *sparse;                /* --sparsify (NULL: dense pushes) */
        ShardMap *map;                 /* the map routed by: a table's rows go by shardmap_row_holder */
        RowsOp *rows;                  /* client_rows under way (NULL: none); never beside a round */
        RowCache *caches[JOB_MAX_TABLES]; /* tables with cache=S: the rows pulled, read again for S clocks */
        /* client_set_memory: the caller's tensors in memory every shard on
         * this host maps; sets of job_nfloats floats, tensor after tensor:
         * the gradients, then the values (one set or more). */
        const ShmMemory *mem;
        size_t *tensor_base;           /* per tensor: its first float's index in a set */
        size_t set_floats, nsets;
        bool inplace;                  /* the round's (or prefetch's) tensors are the memory's */
        uint64_t *offs;                /* job_nkeys: a request's places of keys (header_mem) */
        size_t pull_set;               /* in place: the set the values go to */
        ClientStats stats;
};

/* How a request goes to a shard and how its answer comes back. */
typedef struct ClientTransport {
        const char *name;
        /* Sends part's push (the round's grads) or pull to s: 0 or a negative errno. */
        int (*send_push)(Client *c, ShardConn *s, Part *part);
        int (*send_pull)(Client *c, ShardConn *s, Part *part);
        /* The values of part's pull reply h (m's frames, or shared memory)
         * into the round's params: 0, or -EPROTO (logged). */
        int (*take_values)(Client *c, ShardConn *s, Part *part, const Psnet__Header *h, const WireMsg *m);
        /* The shard no longer holds the session it went by (it restarted): the
         * next request opens another. NULL: none to lose. */
        void (*session_lost)(Client *c, ShardConn *s);
} ClientTransport;

/* --- a table's rows (client-rows.c) */
/* Whether reply m answers the rows exchange under way: then it is handled
 * (true), the exchange ended where it was the last. */
bool client_rows_reply(Client *c, ShardConn *s, WireMsg *m);
/* Frees the tables' hot-row caches. */
void client_rows_free(Client *c);
/* Ends the exchange under way without its callback (the sockets go). */
void client_rows_abort(Client *c);

/* --- what every request says (client-req.c) */
/* --wire bf16 for this client's pushes and pulls: a training job's, not a
 * federated update (which says its encoding with a codec). */
bool client_wire_bf16(const Client *c);
/* Whether pulls ask for bf16 values: --wire bf16, unless the caller wants
 * f32 (the final weights). */
bool client_pulls_bf16(const Client *c);
/* --sparsify for this client's pushes: a training job's. */
bool client_pushes_sparse(const Client *c);
/* The header of part's push (or pull) to s, for the round's push (pull)
 * clock, with a new seq that part's request keeps. */
void client_header(Client *c, ShardConn *s, Part *part, Psnet__Header *h, bool push);
/* Key k's first value in tensors (one buffer per tensor of the job). */
float *client_tensor_at(float *const *tensors, const Job *job, const Psnet__Key *k);
/* Key k's pulled values at src (bf16 or f32) into the round's params; counted. */
void client_take_key(Client *c, const Psnet__Key *k, const void *src, bool bf16);

/* --- the transports (client-frames.c, client-shm.c) */
extern const ClientTransport client_frames, client_shm, client_inplace;
/* --sparsify's frames go with the client. */
void client_frames_free(Client *c);
/* Whether shard s is reached through shared memory of its own (opened on
 * first use), or in place (the round's tensors are the client's memory and
 * the shard shares it). */
bool client_shm_reaches(Client *c, ShardConn *s);
bool client_inplace_reaches(Client *c, ShardConn *s);
/* Whether a round (or a prefetch: grads NULL, push false) with these tensors
 * runs in place; sets the set the values go to. */
bool client_round_in_place(Client *c, const float *const *grads, bool push, float *const *params);
/* Shards reached through shared memory of either kind now (stats). */
void client_shm_count(Client *c);
/* Ends every session over the client's memory and waits until each shard
 * ended its end (CLIENT_FENCE_MS at most). */
void client_mem_fence(Client *c);
/* After a failed round: the shards' own sessions closed (the next round opens
 * new ones), the client's memory fenced. */
void client_shm_reset(Client *c);
/* A shard's connection is gone: its sessions with it. */
void client_shm_close(ShardConn *s);
