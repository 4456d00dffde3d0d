/* SPDX-License-Identifier: Apache-2.0 */
/* The shards' data plane, inside libpsnet (internal header): one DEALER per
 * shard on the caller's libuv loop, requests pipelined (a round sends every
 * shard its PUSH and PULL before any reply is awaited), replies matched by
 * sequence number, completion reported by a callback. Tensor frames are sent
 * zero-copy from the caller's gradient buffers, which must stay untouched
 * until the round's callback. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "job.h"
#include "netsock.h"
#include "shardmap.h"
#include "shm.h"

typedef struct ClientStats {
        uint64_t bytes_pushed, bytes_pulled, rounds;
        uint64_t stale_pushes;     /* refused as STALE: dropped, reported, not fatal */
        uint64_t unavailable;      /* answered UNAVAILABLE (a fail-over under way): asked again */
        double wait_s;             /* time spent waiting for shards */
        uint64_t shm_shards;       /* shards this client reaches through shared memory now */
        uint64_t cache_hits, cache_misses; /* rows a pull read from the hot-row caches, and fetched */
} ClientStats;

typedef struct Client Client;

/* A round ended: r = 0 (clock: the smallest clock the shards reported for the
 * values), -EAGAIN (a shard answered MOVED under a newer map: call
 * client_set_map with the map of client_need_epoch, then run the round again
 * with the same arguments; what was applied answers DUPLICATE), -ETIMEDOUT
 * (logged with the shard's address), -EPROTO after an error reply (logged). */
typedef void (*ClientRoundFn)(Client *c, int r, int64_t clock, void *ud);

/* A rows exchange ended: r = 0, -EAGAIN (a shard answered MOVED under a
 * newer map: client_set_map with the map of client_need_epoch, then the same
 * exchange again; a push applied before answers DUPLICATE), -ETIMEDOUT,
 * -ESTALE (not a member), -EPROTO (an error reply, logged). */
typedef void (*ClientRowsFn)(Client *c, int r, void *ud);
/* Pulls (grads NULL: rows into out, n x dim floats) or pushes (one gradient
 * row per id, n x dim floats, for clock) the rows of ids[0..n) of the job's
 * table, each to the shard holding it (shardmap_row_holder): one ROWS_PULL or
 * ROWS_PUSH per shard, all in flight at once. ids must be distinct. The
 * arrays are copied: they may change as soon as this returns. -EBUSY while a
 * round or another exchange is under way, -EINVAL for a table the job lacks. */
int client_rows(Client *c, uint32_t table, const int64_t *ids, size_t n, const float *grads, int64_t clock,
                float *out, ClientRowsFn cb, void *ud);
/* One table of client_rows_many: as client_rows' arguments. */
typedef struct ClientRowsTable {
        uint32_t table;
        const int64_t *ids;
        size_t n;
        const float *grads;     /* a push's */
        float *out;             /* a pull's */
} ClientRowsTable;
/* client_rows of ntabs distinct tables at once (all pulled, or all
 * pushed: push), every table's requests in flight together; cb once all
 * are answered (or the first error). */
int client_rows_many(Client *c, const ClientRowsTable *tabs, size_t ntabs, bool push, int64_t clock, ClientRowsFn cb,
                     void *ud);

/* One page of a scan: n rows, their ids (int64 at any alignment) and values
 * (n x dim f32, likewise): 0, or a negative errno ending the scan. */
typedef int (*ClientRowsPageFn)(Client *c, const void *ids, const void *values, size_t n, void *ud);
/* Every row of the job's table the shards hold (psctl export), page by page
 * into page, the shards in parallel; then cb as client_rows'. A scan of a
 * table whose rows are dropped meanwhile (ttl, max-rows) may miss a row that
 * moved. -EBUSY, -EINVAL as client_rows. */
int client_rows_scan(Client *c, uint32_t table, ClientRowsPageFn page, ClientRowsFn cb, void *ud);

/* Connects to every shard of map. keys: CURVE keys of this worker, NULL for
 * none. via: through psgate (an edge client's one connection; the map's
 * addresses unused), NULL: each shard directly. */
int client_new(uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
               const NetKeyPair *keys, NetMux *via, Client **ret);
Client *client_free(Client *c);

/* *c ready under map: made (with members_epoch) when *c is NULL, else routed
 * by map when it is newer than the one *c follows. */
int client_follow(Client **c, uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
                  const NetKeyPair *keys, NetMux *via, uint64_t members_epoch);
/* Routes by a new shard map (reconnecting). Drops a prefetch in flight. */
int client_set_map(Client *c, const ShardMap *map);
/* Gives up the round or rows exchange in progress without calling its
 * callback (a newer map arrived: the caller runs it again under it). */
void client_abort(Client *c);
uint64_t client_map_epoch(const Client *c);
uint64_t client_need_epoch(const Client *c);
/* Gives up on a round after this long without completing (default 120 s). */
void client_set_timeout(Client *c, unsigned ms);
/* The round in progress, if any, ends within ms at the latest (-ETIMEDOUT,
 * its log naming ms): for a caller that stops. Later rounds keep the time-out
 * client_set_timeout gives them (capped by the caller: client_ms_until). */
void client_cut_deadline(Client *c, unsigned ms);
/* ms, or what is left until deadline (uv_now's clock; 0: none) when that is
 * shorter, 1 at least: a time-out for a caller that stops by deadline. */
unsigned client_ms_until(uv_loop_t *loop, uint64_t deadline, unsigned ms);
/* The membership epoch this worker acts on, sent with its requests: a shard
 * that has not heard of it yet answers UNAVAILABLE (asked again shortly). */
void client_set_members_epoch(Client *c, uint64_t epoch);

/* Pushes carry this example count (a federated update's; 0: none). */
void client_set_examples(Client *c, uint64_t examples);
/* Pushes carry this share of the job's samples trained before their clock
 * (0..1, which the shards' --lr-schedule follows; negative: none, the default). */
void client_set_progress(Client *c, float progress);
/* Pushes say their frames are masked uint32 (true: a --secagg update, whose
 * buffers the caller passes as the grads) or f32 (false, the default). */
void client_set_masked(Client *c, bool masked);
/* --strategy custom, the strategy process's client: pulls read client id's
 * update of the open round (0, the default: the values), and pushes are the
 * round's delta (true) rather than an update. */
void client_set_update_of(Client *c, uint32_t id);
void client_set_strategy_delta(Client *c, bool delta);
/* A federated update: each pushed key's frame is what fn gives for it, under
 * codec (PSNET__CODEC__CODEC_RAW, _MASKED, _BF16 ...): bytes that stay put
 * until ZeroMQ calls *ret_free(data, *ret_hint) (NULL: until the round's
 * callback), sent zero-copy; fn NULL: the grads as f32 again. */
typedef void (*ClientFrameFn)(void *ud, uint32_t tensor, uint32_t chunk, const void **ret_data, size_t *ret_size,
                              zmq_free_fn **ret_free, void **ret_hint);
void client_set_frames(Client *c, int codec, ClientFrameFn fn, void *ud);
/* A job's --wire bf16 sends the gradients and asks for the values as bf16;
 * with f32 set, pulls ask for f32 all the same (the final weights, which the
 * evaluator tests exactly as they are exported). */
void client_set_pull_f32(Client *c, bool f32);
/* Starts one round: when grads != NULL, pushes grads (one buffer per job
 * tensor) for push_clock; when params != NULL, pulls every tensor into params
 * for pull_clock (BSP: the shard answers once that clock has closed). -EBUSY
 * while a round runs. */
int client_round(Client *c, const float *const *grads, int64_t push_clock, float *const *params,
                 int64_t pull_clock, ClientRoundFn cb, void *ud);
/* Prefetch: sends the pull of pull_clock into params now; the next
 * client_round, called with the same params and pull_clock, sends its push
 * and completes both. The push always leaves before anything is awaited, so
 * a pull the shard can only answer after this worker's push cannot deadlock. */
int client_pull_begin(Client *c, float *const *params, int64_t pull_clock);
bool client_busy(const Client *c);

/* Rounds in place: the caller's tensors live in memory m (shm.h), which the
 * client shares with every shard on this host, so that a push is read and a
 * pull written where the tensors lie, without a copy on the worker's side.
 * m holds sets of job_nfloats floats, tensor after tensor
 * (client_memory_tensor): set 0 the gradients, sets 1.. values. A round whose
 * grads are set 0 (or NULL) and whose params a set from 1 (or NULL) runs in
 * place; any other round as before. m must outlive the client or the next
 * client_set_memory (NULL: none); a round that fails ends the sessions over
 * it and waits until the shards have (CLIENT_FENCE_MS at most), so that no
 * request given up on touches the tensors once the caller has them back.
 * -EBUSY during a round or prefetch, -EINVAL when m holds fewer than 2 sets. */
int client_set_memory(Client *c, const ShmMemory *m);
/* What PSNET_SHM asks of shared memory: on (the default: the caller's tensors
 * in it where the caller takes them), copy (the caller's own buffers, copied
 * through memory of each shard's), off (frames). */
typedef enum { CLIENT_SHM_ON, CLIENT_SHM_COPY, CLIENT_SHM_OFF } ClientShm;
ClientShm client_shm_mode(void);
size_t client_memory_size(const Job *job, size_t nsets);
/* Tensor t of set in m laid out for job, or NULL past m. */
float *client_memory_tensor(const Job *job, const ShmMemory *m, size_t set, uint32_t t);

const ClientStats *client_stats(const Client *c);
