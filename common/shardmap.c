/* SPDX-License-Identifier: Apache-2.0 */
/* The shard map (see shardmap.h): every key's owner, explicitly.
 *
 * Placing keys: the keys without an owner (all of them for a new map, a
 * removed shard's after a change) go largest first, each to the least loaded
 * shard (a min-heap of loads; ties to the lower index, so the result depends
 * only on the job and the shard ids). Then every shard loaded beyond an even
 * share gives keys, largest first, to the least loaded shard while that
 * brings it closer to the share: adding a shard moves about its share of the
 * bytes to it and nothing else. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "hash.h"
#include "macro.h"
#include "shardmap.h"

struct ShardMap {
        uint64_t epoch;
        ShardDesc *shards;   /* ascending id */
        size_t nshards;
        uint32_t *chunks;    /* per tensor */
        uint32_t *first;     /* ntensors + 1: the index of key (t, 0) */
        size_t ntensors;
        uint32_t *owner;     /* per key: index into shards */
        size_t nkeys;
        uint32_t replicas;   /* copies of every key, 1..nshards */
};

static int cmp_shard(const void *a, const void *b) {
        const ShardDesc *x = a, *y = b;
        return (x->id > y->id) - (x->id < y->id);
}

ShardMap *shardmap_free(ShardMap *m) {
        if (!m)
                return NULL;
        for (size_t i = 0; m->shards && i < m->nshards; i++)
                free(m->shards[i].endpoint);
        free(m->shards);
        free(m->chunks);
        free(m->first);
        free(m->owner);
        free(m);
        return NULL;
}

/* A map with its shards (copied, sorted, checked distinct) and its key layout;
 * owners unset. */
static int map_new(uint64_t epoch, const ShardDesc *shards, size_t n, const uint32_t *chunks, size_t ntensors,
                   ShardMap **ret) {
        if (!shards || !ret || n < 1 || n > SHARDMAP_MAX_SHARDS || ntensors > JOB_MAX_TENSORS)
                return -EINVAL;
        uint64_t nkeys = 0;
        for (size_t t = 0; t < ntensors; t++)
                nkeys += chunks[t];
        if (nkeys > SHARDMAP_MAX_KEYS)
                return -EINVAL;
        ShardMap *m = calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->epoch = epoch;
        m->replicas = 1;
        m->shards = calloc(n, sizeof *m->shards);
        m->chunks = calloc(ntensors ? ntensors : 1, sizeof *m->chunks);
        m->first = calloc(ntensors + 1, sizeof *m->first);
        m->owner = calloc(nkeys ? nkeys : 1, sizeof *m->owner);
        if (!m->shards || !m->chunks || !m->first || !m->owner)
                goto nomem;
        for (size_t i = 0; i < n; i++) {
                m->shards[i] = shards[i];
                m->shards[i].endpoint = NULL;
                m->nshards = i + 1;
                if (shards[i].endpoint && !(m->shards[i].endpoint = strdup(shards[i].endpoint)))
                        goto nomem;
        }
        qsort(m->shards, n, sizeof *m->shards, cmp_shard);
        for (size_t i = 1; i < n; i++)
                if (m->shards[i].id == m->shards[i - 1].id) {
                        shardmap_free(m);
                        return -EINVAL;
                }
        m->ntensors = ntensors;
        for (size_t t = 0; t < ntensors; t++) {
                m->chunks[t] = chunks[t];
                m->first[t + 1] = m->first[t] + chunks[t];
        }
        m->nkeys = (size_t) nkeys;
        *ret = m;
        return 0;
nomem:
        shardmap_free(m);
        return -ENOMEM;
}

/* --- placement -------------------------------------------------------------------- */

/* A min-heap of shard indices by (load, index). */
typedef struct Heap {
        uint32_t *v;
        size_t n;
        const uint64_t *load;
} Heap;

static bool heap_less(const Heap *h, uint32_t a, uint32_t b) {
        return h->load[a] != h->load[b] ? h->load[a] < h->load[b] : a < b;
}

static void heap_down(Heap *h, size_t i) {
        for (;;) {
                size_t l = 2 * i + 1, r = l + 1, m = i;
                if (l < h->n && heap_less(h, h->v[l], h->v[m]))
                        m = l;
                if (r < h->n && heap_less(h, h->v[r], h->v[m]))
                        m = r;
                if (m == i)
                        return;
                uint32_t t = h->v[i];
                h->v[i] = h->v[m];
                h->v[m] = t;
                i = m;
        }
}

static void heap_init(Heap *h, uint32_t *v, size_t n, const uint64_t *load) {
        *h = (Heap) { .v = v, .n = n, .load = load };
        for (size_t i = 0; i < n; i++)
                v[i] = (uint32_t) i;
        for (size_t i = n / 2; i-- > 0;)
                heap_down(h, i);
}

/* The least loaded shard's index; after its load changed, heap_down(h, 0). */
static uint32_t heap_top(const Heap *h) {
        return h->v[0];
}

typedef struct KeySize {
        uint64_t bytes;
        uint32_t key;
} KeySize;

static int cmp_keysize(const void *a, const void *b) {
        const KeySize *x = a, *y = b;
        if (x->bytes != y->bytes)
                return x->bytes < y->bytes ? 1 : -1; /* largest first */
        return (x->key > y->key) - (x->key < y->key);
}

#define NO_OWNER UINT32_MAX

/* Gives the keys without an owner to the least loaded shards, then evens out
 * the shards above an even share (see the top of the file). */
static int place(ShardMap *m, const uint64_t *bytes) {
        size_t n = m->nshards;
        uint64_t *load = calloc(n, sizeof *load), total = 0;
        uint32_t *hv = calloc(n, sizeof *hv);
        KeySize *ks = calloc(m->nkeys ? m->nkeys : 1, sizeof *ks);
        if (!load || !hv || !ks) {
                free(load);
                free(hv);
                free(ks);
                return -ENOMEM;
        }
        size_t norphans = 0;
        for (size_t k = 0; k < m->nkeys; k++) {
                total += bytes[k];
                if (m->owner[k] == NO_OWNER)
                        ks[norphans++] = (KeySize) { bytes[k], (uint32_t) k };
                else
                        load[m->owner[k]] += bytes[k];
        }
        Heap h;
        heap_init(&h, hv, n, load);
        qsort(ks, norphans, sizeof *ks, cmp_keysize);
        for (size_t i = 0; i < norphans; i++) {
                uint32_t s = heap_top(&h);
                m->owner[ks[i].key] = s;
                load[s] += ks[i].bytes;
                heap_down(&h, 0);
        }
        /* Shards above an even share give their keys, largest first, to the
         * least loaded shard while the move brings the giver no further
         * below the share than half that key. */
        uint64_t share = total / n;
        size_t nk = 0;
        for (size_t k = 0; k < m->nkeys; k++)
                ks[nk++] = (KeySize) { bytes[k], (uint32_t) k };
        qsort(ks, nk, sizeof *ks, cmp_keysize);
        for (uint32_t d = 0; d < n; d++) {
                for (size_t i = 0; i < nk && load[d] > share; i++) {
                        const KeySize *key = &ks[i];
                        if (m->owner[key->key] != d || key->bytes == 0)
                                continue;
                        uint32_t r = heap_top(&h);
                        /* Only while it evens the pair out and keeps d near the share. */
                        if (r == d || load[r] + key->bytes >= load[d] || load[d] - key->bytes / 2 < share)
                                continue;
                        m->owner[key->key] = r;
                        load[d] -= key->bytes;
                        load[r] += key->bytes;
                        /* d's load fell: rebuild (n is small next to the keys moved). */
                        heap_init(&h, hv, n, load);
                }
        }
        free(load);
        free(hv);
        free(ks);
        return 0;
}

/* Every key's size in bytes, in (tensor, chunk) order. */
static uint64_t *key_bytes(const ShardMap *m, const Job *job) {
        uint64_t *b = calloc(m->nkeys ? m->nkeys : 1, sizeof *b);
        if (!b)
                return NULL;
        for (size_t t = 0; t < m->ntensors; t++)
                for (uint32_t c = 0; c < m->chunks[t]; c++)
                        b[m->first[t] + c] = (uint64_t) job_chunk_len(job, (uint32_t) t, c) * sizeof(float);
        return b;
}

static int job_chunks(const Job *job, uint32_t chunks[JOB_MAX_TENSORS]) {
        if (!job || job->ntensors > JOB_MAX_TENSORS)
                return -EINVAL;
        for (size_t t = 0; t < job->ntensors; t++)
                chunks[t] = job->tensors[t].nchunks;
        return 0;
}

int shardmap_change(const ShardMap *old, uint64_t epoch, const ShardDesc *shards, size_t n, const Job *job,
                    ShardMap **ret) {
        uint32_t chunks[JOB_MAX_TENSORS];
        ShardMap *m;
        int r = job_chunks(job, chunks);
        if (r < 0 || (old && !shardmap_fits_job(old, job)))
                return -EINVAL;
        r = map_new(epoch, shards, n, chunks, job->ntensors, &m);
        if (r < 0)
                return r;
        for (size_t k = 0; k < m->nkeys; k++) {
                int i = old ? shardmap_find(m, old->shards[old->owner[k]].id) : -ENOENT;
                m->owner[k] = i < 0 ? NO_OWNER : (uint32_t) i;
        }
        uint64_t *bytes = key_bytes(m, job);
        r = bytes ? place(m, bytes) : -ENOMEM;
        free(bytes);
        if (r < 0) {
                shardmap_free(m);
                return r;
        }
        *ret = m;
        return 0;
}

int shardmap_place(uint64_t epoch, const ShardDesc *shards, size_t n, const Job *job, ShardMap **ret) {
        return shardmap_change(NULL, epoch, shards, n, job, ret);
}

int shardmap_from_owners(uint64_t epoch, const ShardDesc *shards, size_t n, const uint32_t *tensor_chunks,
                         size_t ntensors, const uint32_t *owners, size_t nkeys, ShardMap **ret) {
        ShardMap *m;
        if (ntensors && !tensor_chunks)
                return -EINVAL;
        for (size_t i = 1; shards && i < n; i++)
                if (shards[i].id <= shards[i - 1].id)
                        return -EINVAL; /* owners index shards in ascending id */
        int r = map_new(epoch, shards, n, tensor_chunks, ntensors, &m);
        if (r < 0)
                return r;
        if (nkeys != m->nkeys || (nkeys && !owners)) {
                shardmap_free(m);
                return -EINVAL;
        }
        for (size_t k = 0; k < nkeys; k++) {
                if (owners[k] >= n) {
                        shardmap_free(m);
                        return -EINVAL;
                }
                m->owner[k] = owners[k];
        }
        *ret = m;
        return 0;
}

ShardMap *shardmap_dup(const ShardMap *m) {
        ShardMap *c;
        if (shardmap_from_owners(m->epoch, m->shards, m->nshards, m->chunks, m->ntensors, m->owner, m->nkeys, &c) < 0)
                return NULL;
        c->replicas = m->replicas;
        return c;
}

int shardmap_failover(const ShardMap *old, uint64_t epoch, const uint32_t *dead, size_t ndead, ShardMap **ret,
                      uint32_t *ret_lost_tensor, uint32_t *ret_lost_chunk) {
        size_t n = old->nshards, j = 0;
        bool *gone = calloc(n, sizeof *gone);
        ShardDesc *live = calloc(n, sizeof *live);
        if (!gone || !live) {
                free(gone);
                free(live);
                return -ENOMEM;
        }
        for (size_t d = 0; d < ndead; d++) {
                int i = shardmap_find(old, dead[d]);
                if (i >= 0)
                        gone[i] = true;
        }
        for (size_t i = 0; i < n; i++)
                if (!gone[i])
                        live[j++] = old->shards[i];
        ShardMap *m = NULL;
        int r = j == 0 ? -ENODATA : map_new(epoch, live, j, old->chunks, old->ntensors, &m);
        for (size_t t = 0; r == 0 && t < old->ntensors; t++)
                for (uint32_t c = 0; r == 0 && c < old->chunks[t]; c++) {
                        size_t k = old->first[t] + c;
                        int to = -1;
                        for (uint32_t i = 0; to < 0 && i < old->replicas; i++) {
                                size_t h = (old->owner[k] + i) % n;
                                if (!gone[h])
                                        to = shardmap_find(m, old->shards[h].id);
                        }
                        if (to < 0) {
                                if (ret_lost_tensor)
                                        *ret_lost_tensor = (uint32_t) t;
                                if (ret_lost_chunk)
                                        *ret_lost_chunk = c;
                                r = -ENODATA;
                        } else
                                m->owner[k] = (uint32_t) to;
                }
        free(gone);
        free(live);
        if (r < 0) {
                shardmap_free(m);
                return r;
        }
        shardmap_set_replicas(m, old->replicas);
        *ret = m;
        return 0;
}

void shardmap_set_replicas(ShardMap *m, uint32_t replicas) {
        m->replicas = replicas == 0 ? 1 : replicas > m->nshards ? (uint32_t) m->nshards : replicas;
}

uint32_t shardmap_replicas(const ShardMap *m) { return m->replicas; }

int shardmap_holder(const ShardMap *m, uint32_t tensor, uint32_t chunk, uint32_t i) {
        int o = shardmap_lookup(m, tensor, chunk);
        if (o < 0 || i >= m->replicas)
                return -ENOENT;
        return (int) (((size_t) o + i) % m->nshards);
}

int shardmap_holder_rank(const ShardMap *m, uint32_t tensor, uint32_t chunk, uint32_t id) {
        int o = shardmap_lookup(m, tensor, chunk), me = shardmap_find(m, id);
        if (o < 0 || me < 0)
                return -1;
        size_t rank = ((size_t) me + m->nshards - (size_t) o) % m->nshards;
        return rank < m->replicas ? (int) rank : -1;
}

/* --- lookups ---------------------------------------------------------------------- */

uint64_t shardmap_epoch(const ShardMap *m) { return m->epoch; }
size_t shardmap_size(const ShardMap *m) { return m->nshards; }
size_t shardmap_ntensors(const ShardMap *m) { return m->ntensors; }
uint32_t shardmap_tensor_chunks(const ShardMap *m, size_t t) { return t < m->ntensors ? m->chunks[t] : 0; }
size_t shardmap_nkeys(const ShardMap *m) { return m->nkeys; }
const uint32_t *shardmap_owners(const ShardMap *m) { return m->owner; }
const uint32_t *shardmap_tensor_chunks_array(const ShardMap *m) { return m->chunks; }

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

int shardmap_lookup(const ShardMap *m, uint32_t tensor, uint32_t chunk) {
        if (tensor >= m->ntensors || chunk >= m->chunks[tensor])
                return -ENOENT;
        return (int) m->owner[m->first[tensor] + chunk];
}

uint32_t shardmap_owner_id(const ShardMap *m, uint32_t tensor, uint32_t chunk) {
        int i = shardmap_lookup(m, tensor, chunk);
        return i < 0 ? 0 : m->shards[i].id;
}

void shardmap_bytes(const ShardMap *m, const Job *job, uint64_t *bytes) {
        memset(bytes, 0, m->nshards * sizeof *bytes);
        for (size_t t = 0; t < m->ntensors; t++)
                for (uint32_t c = 0; c < m->chunks[t]; c++)
                        for (uint32_t i = 0; i < m->replicas; i++)
                                bytes[(m->owner[m->first[t] + c] + i) % m->nshards] +=
                                        job_chunk_bytes(job, (uint32_t) t, c);
}

bool shardmap_fits_job(const ShardMap *m, const Job *job) {
        if (!job || m->ntensors != job->ntensors)
                return false;
        for (size_t t = 0; t < m->ntensors; t++)
                if (m->chunks[t] != job->tensors[t].nchunks)
                        return false;
        return true;
}

/* A row's weight on shard id: splitmix64 of the row's hash and the id. */
static uint64_t row_weight(uint64_t row, uint32_t id) {
        uint64_t x = row ^ ((uint64_t) id * 0x9e3779b97f4a7c15ull);
        return splitmix64_next(&x);
}

int shardmap_row_rank(const ShardMap *m, uint32_t table, int64_t id, uint32_t shard) {
        int me = shardmap_find(m, shard);
        if (me < 0)
                return -1;
        uint64_t x = (uint64_t) id ^ ((uint64_t) table << 56), row = splitmix64_next(&x);
        uint64_t w = row_weight(row, shard);
        /* Shards above it: a higher weight, or the same at a lower index (as shardmap_row_holder orders them). */
        size_t rank = 0;
        for (size_t s = 0; s < m->nshards; s++) {
                uint64_t ws = row_weight(row, m->shards[s].id);
                rank += ws > w || (ws == w && s < (size_t) me);
        }
        return rank < m->replicas && rank < m->nshards ? (int) rank : -1;
}

int shardmap_row_holder(const ShardMap *m, uint32_t table, int64_t id, uint32_t i) {
        if (i >= m->replicas || i >= m->nshards)
                return -ENOENT;
        uint64_t x = (uint64_t) id ^ ((uint64_t) table << 56), row = splitmix64_next(&x);
        /* The i-th highest weight: the highest below the (i-1)-th's (ties by index). */
        uint64_t above = UINT64_MAX;
        size_t above_at = SIZE_MAX;
        int best = -ENOENT;
        for (uint32_t k = 0; k <= i; k++) {
                uint64_t top = 0;
                best = -ENOENT;
                for (size_t s = 0; s < m->nshards; s++) {
                        uint64_t w = row_weight(row, m->shards[s].id);
                        bool below = w < above || (w == above && s > above_at);
                        if (below && (best < 0 || w > top || (w == top && s < (size_t) best))) {
                                top = w;
                                best = (int) s;
                        }
                }
                if (best < 0)
                        return -ENOENT;
                above = top;
                above_at = (size_t) best;
        }
        return best;
}
