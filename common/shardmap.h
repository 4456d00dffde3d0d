/* SPDX-License-Identifier: Apache-2.0 */
/* The shard map: which shard owns which key (tensor, chunk) of a job. The
 * placement is explicit: pscoord computes it (balanced by bytes) and sends
 * every key's owner with the map, so every process agrees without hashing.
 *
 * shardmap_place gives each key, largest first, to the least loaded shard:
 * every shard ends within one chunk of an even share, so with chunks of at
 * most a tenth of a share (job_fair_chunk) every shard holds its 1/S of the
 * bytes within 10%. shardmap_change follows a change of the shard set with
 * as little movement as it can: the keys of a removed shard go to the least
 * loaded, then keys move from the most to the least loaded shard only while
 * a shard is outside 10% of an even share. Every map carries an epoch; a
 * newer epoch replaces an older one. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "job.h"

#define SHARDMAP_MAX_SHARDS 65536u
#define SHARDMAP_MAX_KEYS (16u * 1024u * 1024u)

typedef struct ShardDesc {
        uint32_t id;       /* stable shard id (chosen by the operator or pscoord) */
        char *endpoint;    /* where workers reach it, e.g. "ipc:///run/psnet/psd-0.sock" */
        uint8_t public_key[32]; /* its CURVE public key, when has_public_key */
        bool has_public_key;
} ShardDesc;

typedef struct ShardMap ShardMap;

/* A balanced placement of job's keys over n shards (ids distinct, n >= 1).
 * Deterministic: the same job and shard ids give the same map whatever the
 * order of shards. Copies the descriptors. -EINVAL on bad arguments, -ENOMEM. */
int shardmap_place(uint64_t epoch, const ShardDesc *shards, size_t n, const Job *job, ShardMap **ret);
/* old's placement over a new set of shards (some added, some removed), moving
 * as few keys as it can (see above). old must be a map of job's keys. */
int shardmap_change(const ShardMap *old, uint64_t epoch, const ShardDesc *shards, size_t n, const Job *job,
                    ShardMap **ret);
/* A map as it travels: the shards, each tensor's chunk count, and every key's
 * owner as an index into shards (ascending id), key by key in (tensor, chunk)
 * order. Checks everything: -EINVAL when anything is out of range. */
int shardmap_from_owners(uint64_t epoch, const ShardDesc *shards, size_t n, const uint32_t *tensor_chunks,
                         size_t ntensors, const uint32_t *owners, size_t nkeys, ShardMap **ret);
/* A copy, or NULL when out of memory. */
ShardMap *shardmap_dup(const ShardMap *m);
ShardMap *shardmap_free(ShardMap *m);

/* Keys of dead shards (ids) go to their first live backup; the dead shards
 * leave the map; every other key stays. -ENODATA when a key has no live
 * copy left (its tensor and chunk in *ret_lost_tensor/_chunk, may be NULL). */
int shardmap_failover(const ShardMap *old, uint64_t epoch, const uint32_t *dead, size_t ndead, ShardMap **ret,
                      uint32_t *ret_lost_tensor, uint32_t *ret_lost_chunk);

/* Copies of every key, 1..shardmap_size (set clamps: 0 means 1). */
void shardmap_set_replicas(ShardMap *m, uint32_t replicas);
uint32_t shardmap_replicas(const ShardMap *m);
/* The index of the i-th copy of key (tensor, chunk): 0 the primary (as
 * shardmap_lookup), 1.. its backups; -ENOENT for a key the map does not have
 * or i >= shardmap_replicas. */
int shardmap_holder(const ShardMap *m, uint32_t tensor, uint32_t chunk, uint32_t i);
/* Which copy of the key shard id holds: 0 primary, 1.. a backup, -1 none. */
int shardmap_holder_rank(const ShardMap *m, uint32_t tensor, uint32_t chunk, uint32_t id);

uint64_t shardmap_epoch(const ShardMap *m);
size_t shardmap_size(const ShardMap *m);
/* The i-th shard, in ascending id order (0 <= i < shardmap_size). */
const ShardDesc *shardmap_shard(const ShardMap *m, size_t i);
/* Index (as for shardmap_shard) of the shard with this id, or -ENOENT. */
int shardmap_find(const ShardMap *m, uint32_t id);

/* Index of the shard that owns key (tensor, chunk), or -ENOENT for a key the
 * map does not have. */
int shardmap_lookup(const ShardMap *m, uint32_t tensor, uint32_t chunk);
/* The id of the shard that owns key (tensor, chunk); 0 for a key the map does
 * not have (shard ids are >= 1). */
uint32_t shardmap_owner_id(const ShardMap *m, uint32_t tensor, uint32_t chunk);
/* Each shard's bytes (job_chunk_bytes: values and optimizer state, of every
 * copy it holds) into bytes[i], indexed as shardmap_shard; m must fit job. */
void shardmap_bytes(const ShardMap *m, const Job *job, uint64_t *bytes);
/* Rows of a sparse table (common/table-spec.h) are placed by rendezvous
 * (highest random weight) hashing of (table, id) over the map's shard ids, not
 * by the owners above: a row's copies are the `replicas` shards with the
 * highest weights for it, so every shard holds a similar share, a shard
 * added takes only the rows it now weighs highest for, a shard removed hands
 * each of its rows to that row's next copy (its backup with replicas >= 2),
 * and nothing of the placement travels. The index (as shardmap_shard) of
 * the i-th copy of the row: 0 the primary; -ENOENT for i >= replicas. */
int shardmap_row_holder(const ShardMap *m, uint32_t table, int64_t id, uint32_t i);
/* Which copy of the row shard id holds: 0 primary, 1.. a backup, -1 none
 * (as shardmap_holder_rank for a key). */
int shardmap_row_rank(const ShardMap *m, uint32_t table, int64_t id, uint32_t shard);

/* Whether the map's keys are job's (the same tensors and chunks). */
bool shardmap_fits_job(const ShardMap *m, const Job *job);

/* The layout as it travels (see shardmap_from_owners); owned by m. */
size_t shardmap_ntensors(const ShardMap *m);
uint32_t shardmap_tensor_chunks(const ShardMap *m, size_t t);
const uint32_t *shardmap_tensor_chunks_array(const ShardMap *m);
size_t shardmap_nkeys(const ShardMap *m);
const uint32_t *shardmap_owners(const ShardMap *m);
