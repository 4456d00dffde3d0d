/* The shard map: which shard owns which key (tensor, chunk). Consistent hashing
 * with virtual nodes, so adding or removing one of N shards moves about 1/N of
 * the keys. Every map carries an epoch; a newer epoch replaces an older one. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define SHARDMAP_DEFAULT_VNODES 64

#include <stdbool.h>

typedef struct ShardDesc {
        uint32_t id;       /* stable shard id (chosen by the operator or pscoord) */
        char *endpoint;    /* where workers reach it, e.g. "ipc:///run/psnet/psd-0.sock" */
        uint8_t public_key[32]; /* its CURVE public key, when has_public_key */
        bool has_public_key;
} ShardDesc;

typedef struct ShardMap ShardMap;

/* Builds a map over n shards (ids must be distinct; n >= 1; vnodes 1..4096).
 * Copies the descriptors. Returns -EINVAL on bad arguments, -ENOMEM. */
int shardmap_new(uint64_t epoch, unsigned vnodes, const ShardDesc *shards, size_t n,
                 ShardMap **ret);
ShardMap *shardmap_free(ShardMap *m);

uint64_t shardmap_epoch(const ShardMap *m);
unsigned shardmap_vnodes(const ShardMap *m);
size_t shardmap_size(const ShardMap *m);
/* The i-th shard, in ascending id order (0 <= i < shardmap_size). */
const ShardDesc *shardmap_shard(const ShardMap *m, size_t i);
/* Index (as for shardmap_shard) of the shard with this id, or -ENOENT. */
int shardmap_find(const ShardMap *m, uint32_t id);

/* Index of the shard that owns key (tensor, chunk). Always >= 0. */
size_t shardmap_lookup(const ShardMap *m, uint32_t tensor, uint32_t chunk);

/* 64-bit mixing hash used for keys and ring points (exposed for tests). */
uint64_t shardmap_hash(uint64_t a, uint64_t b);
