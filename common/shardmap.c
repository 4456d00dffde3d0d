/* The shard map (see shardmap.h): a consistent-hashing ring. Every shard puts
 * `vnodes` points on a 64-bit ring at shardmap_hash(id | 1<<63, v); a key
 * (tensor, chunk) hashes to shardmap_hash(tensor, chunk) and belongs to the
 * shard of the first point at or after it, wrapping around. A shard's points
 * depend only on its own id, so adding or removing one shard moves only the
 * keys that land on (or leave) its arcs: about 1/N of them.
 *
 * The hash is part of the protocol in effect: every process must compute the
 * same placement, so it must never change without a protocol version bump. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "hash.h"
#include "shardmap.h"

#define SHARDMAP_MAX_VNODES 4096u
#define SHARDMAP_MAX_SHARDS 65536u

typedef struct RingPoint {
        uint64_t hash;
        uint32_t index;   /* into ShardMap.shards */
        uint32_t id;      /* shard id, to order equal hashes the same everywhere */
} RingPoint;

struct ShardMap {
        uint64_t epoch;
        unsigned vnodes;
        ShardDesc *shards;   /* ascending id */
        size_t nshards;
        RingPoint *ring;     /* ascending (hash, id) */
        size_t npoints;
};


uint64_t shardmap_hash(uint64_t a, uint64_t b) {
        return mix64(mix64(a + UINT64_C(0x9e3779b97f4a7c15)) ^ (b + UINT64_C(0x632be59bd9b4e019)));
}

static int cmp_shard(const void *a, const void *b) {
        const ShardDesc *x = a, *y = b;
        return (x->id > y->id) - (x->id < y->id);
}

static int cmp_point(const void *a, const void *b) {
        const RingPoint *x = a, *y = b;
        if (x->hash != y->hash)
                return (x->hash > y->hash) - (x->hash < y->hash);
        return (x->id > y->id) - (x->id < y->id);
}

ShardMap *shardmap_free(ShardMap *m) {
        if (!m)
                return NULL;
        if (m->shards)
                for (size_t i = 0; i < m->nshards; i++)
                        free(m->shards[i].endpoint);
        free(m->shards);
        free(m->ring);
        free(m);
        return NULL;
}

int shardmap_new(uint64_t epoch, unsigned vnodes, const ShardDesc *shards, size_t n,
                 ShardMap **ret) {
        ShardMap *m;

        if (!shards || !ret || n < 1 || n > SHARDMAP_MAX_SHARDS || vnodes < 1 ||
            vnodes > SHARDMAP_MAX_VNODES)
                return -EINVAL;

        m = calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->epoch = epoch;
        m->vnodes = vnodes;
        m->shards = calloc(n, sizeof *m->shards);
        m->ring = calloc(n * vnodes, sizeof *m->ring);
        if (!m->shards || !m->ring)
                goto nomem;
        for (size_t i = 0; i < n; i++) {
                m->shards[i] = shards[i];
                m->shards[i].endpoint = NULL;
                m->nshards = i + 1;
                if (shards[i].endpoint) {
                        m->shards[i].endpoint = strdup(shards[i].endpoint);
                        if (!m->shards[i].endpoint)
                                goto nomem;
                }
        }
        qsort(m->shards, n, sizeof *m->shards, cmp_shard);
        for (size_t i = 1; i < n; i++)
                if (m->shards[i].id == m->shards[i - 1].id) {
                        shardmap_free(m);
                        return -EINVAL;
                }

        for (size_t i = 0; i < n; i++)
                for (unsigned v = 0; v < vnodes; v++)
                        m->ring[m->npoints++] = (RingPoint) {
                                .hash = shardmap_hash(UINT64_C(1) << 63 | m->shards[i].id, v),
                                .index = (uint32_t) i,
                                .id = m->shards[i].id,
                        };
        qsort(m->ring, m->npoints, sizeof *m->ring, cmp_point);

        *ret = m;
        return 0;

nomem:
        shardmap_free(m);
        return -ENOMEM;
}

uint64_t shardmap_epoch(const ShardMap *m) { return m->epoch; }
unsigned shardmap_vnodes(const ShardMap *m) { return m->vnodes; }
size_t shardmap_size(const ShardMap *m) { return m->nshards; }

const ShardDesc *shardmap_shard(const ShardMap *m, size_t i) {
        return i < m->nshards ? &m->shards[i] : NULL;
}

int shardmap_find(const ShardMap *m, uint32_t id) {
        size_t lo = 0, hi = m->nshards;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (m->shards[mid].id < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo < m->nshards && m->shards[lo].id == id)
                return (int) lo;
        return -ENOENT;
}

size_t shardmap_lookup(const ShardMap *m, uint32_t tensor, uint32_t chunk) {
        uint64_t h = shardmap_hash(tensor, chunk);
        size_t lo = 0, hi = m->npoints;

        /* First point with hash >= h; past the end wraps to the first point. */
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (m->ring[mid].hash < h)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return m->ring[lo == m->npoints ? 0 : lo].index;
}
