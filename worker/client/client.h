/* The worker's client library for the shards: one DEALER per shard, requests
 * pipelined (a round sends every shard its PUSH and PULL before waiting for
 * any reply), replies matched by sequence number. Tensor frames are sent
 * zero-copy from the caller's gradient buffers, which must stay untouched
 * until the call returns. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "job.h"
#include "shardmap.h"

typedef struct ClientHooks {
        void *coord_sock;          /* polled while waiting; on_coord called when readable */
        int signal_fd;             /* polled while waiting (-1: none); on_signal when readable */
        void (*on_coord)(void *ud);
        void (*on_signal)(void *ud);
        void (*on_tick)(void *ud); /* about every tick_ms while waiting */
        bool (*should_stop)(void *ud);
        unsigned tick_ms;
        void *ud;
} ClientHooks;

typedef struct ClientStats {
        uint64_t bytes_pushed, bytes_pulled, rounds;
        uint64_t stale_pushes;     /* refused as STALE: dropped, reported, not fatal */
        double wait_s;             /* time spent waiting for shards */
} ClientStats;

typedef struct Client Client;

/* Connects to every shard of map. hooks may be NULL. */
int client_new(void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
               const ClientHooks *hooks, Client **ret);
Client *client_free(Client *c);

/* Routes by a new shard map (reconnecting). */
int client_set_map(Client *c, const ShardMap *map);
uint64_t client_map_epoch(const Client *c);
/* After client_round returned -EAGAIN: the map epoch a shard said to use. */
uint64_t client_need_epoch(const Client *c);

/* Give up on a round after this long without completing (default 120 s). */
void client_set_timeout(Client *c, unsigned ms);

/* One round. When grads != NULL, pushes grads (one buffer per job tensor) for
 * push_clock; then pulls every tensor into params, for clock pull_clock (BSP:
 * the shard answers once that clock has closed). *ret_clock gets the smallest
 * clock the shards reported for the values. Returns 0, -ECANCELED when
 * should_stop said so, -EAGAIN when a shard answered MOVED under a newer map
 * (call again, same arguments, once client_set_map has the map of
 * client_need_epoch: pushes are de-duplicated), -ETIMEDOUT (logged with the
 * shard's address), or -EPROTO
 * after an error reply (logged). A push refused as STALE is counted in the
 * stats and not fatal. */
int client_round(Client *c, const float *const *grads, int64_t push_clock,
                 float *const *params, int64_t pull_clock, int64_t *ret_clock);

/* Prefetch: sends the pull of pull_clock into params now, without waiting; the
 * next client_round, called with the same params and pull_clock, sends its push
 * and completes both. The push always leaves before anything is awaited, so a
 * pull the shard can only answer after this worker's push (BSP, SSP at the
 * bound) costs time but cannot deadlock. A map change (client_set_map) drops
 * the prefetch; the round then pulls again. */
int client_pull_begin(Client *c, float *const *params, int64_t pull_clock);

const ClientStats *client_stats(const Client *c);
