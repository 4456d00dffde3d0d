/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-table.h. Ids are found by open addressing over the rows' numbers
 * (linear probing, at most 3/4 full, splitmix64 of the id); a row's values
 * and optimizer state sit side by side (values first, then the state, then
 * Adam's step count), so a touched row is one run of memory; rows and their
 * ids are kept in slabs of 4,096, so the table grows without copying (about
 * 13-19 bytes a row beside the row itself: the index and the id, and 8 more
 * for the clock it was last pushed at where max_rows or ttl needs it). A
 * pull or push checks everything (distinct ids, finite
 * gradients, room for the new rows) before it changes anything.
 *
 * Bounds (TableConf): an id gets a row at its admit-th push, counted in a
 * count-min sketch of 4 x 2^16 saturating bytes (made when admit > 1); past
 * max_rows the least recently pushed rows (a sixteenth of the table at once,
 * so that the sort is paid seldom) make room; with ttl, each push looks over
 * a stretch of the rows (8 per row pushed, at least 64) for those unpushed
 * for ttl clocks and drops them (a push whose own new rows pass max_rows has
 * the last of them dropped and counted). A row goes by moving the last row into its
 * place and deleting its index slot by backward shift (linear probing keeps
 * no tombstones). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "fpflush.h"
#include "hash.h"
#include "macro.h"
#include "psd-table.h"

#define TABLE_SLAB_SHIFT 12     /* 4,096 rows a slab: no copy when the table grows */
#define TABLE_SLAB ((size_t) 1 << TABLE_SLAB_SHIFT)

struct Table {
        TableConf c;
        size_t per;             /* floats per row: dim values, their state, then (adam) the step count */
        uint32_t *index;        /* [cap]: row + 1 of the id hashed there, linear probing; 0: empty */
        size_t cap;             /* a power of two: the rows fill at most 3/4 of it */
        float **slabs;          /* the rows, TABLE_SLAB a slab */
        int64_t **ids;          /* each row's id, then each row's stamp (the clock last pushed), TABLE_SLAB each */
        size_t nslabs, slabs_cap;
        size_t nrows;
        int64_t now;            /* the clock pushes are stamped with (table_tick) */
        bool stamped;           /* max_rows or ttl: each row's stamp is kept (8 bytes a row more) */
        uint8_t *sketch;        /* admit > 1: count-min, TABLE_SKETCH_DEPTH x TABLE_SKETCH_WIDTH */
        size_t sweep;           /* ttl: the next row the sweep looks at */
        TableCounts counts;
        /* table_log_gone: the ids its bounds dropped since table_gone. */
        bool log_gone, gone_lost;
        bool held;              /* table_hold_bounds: max_rows and ttl drop nothing */
        int64_t *gone;
        size_t ngone, gone_cap;
};

#define TABLE_SKETCH_DEPTH 4
#define TABLE_SKETCH_WIDTH ((size_t) 1 << 16)

/* splitmix64 of x: the first value of the stream whose state is x. */
static inline uint64_t splitmix64(uint64_t x) {
        return splitmix64_next(&x);
}

int table_new(const TableConf *c, Table **ret, char *why, size_t n) {
        int r = table_conf_check(c, why, n);
        if (r < 0)
                return r;
        Table *t = ps_calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->c = *c;
        t->per = (size_t) c->dim * (1 + table_state_per_value(c->optim)) + (c->optim == TABLE_ADAM);
        t->stamped = c->max_rows || c->ttl;
        t->cap = 16;
        t->index = ps_calloc(t->cap, sizeof *t->index);
        if (c->admit > 1)
                t->sketch = ps_calloc(TABLE_SKETCH_DEPTH * TABLE_SKETCH_WIDTH, 1);
        if (!t->index || (c->admit > 1 && !t->sketch)) {
                table_free(t);
                return -ENOMEM;
        }
        *ret = t;
        return 0;
}

int table_new_copies(const TableConf *c, Table **ret, char *why, size_t n) {
        TableConf u = *c;
        u.max_rows = u.ttl = 0;
        u.admit = 1;
        int r = table_new(&u, ret, why, n);
        if (r == 0)
                (*ret)->stamped = c->max_rows || c->ttl;
        return r;
}

Table *table_free(Table *t) {
        if (t) {
                for (size_t i = 0; i < t->nslabs; i++) {
                        ps_free(t->slabs[i]);
                        ps_free(t->ids[i]);
                }
                ps_free(t->slabs);
                ps_free(t->ids);
                ps_free(t->index);
                ps_free(t->sketch);
                ps_free(t->gone);
                ps_free(t);
        }
        return NULL;
}

size_t table_size(const Table *t) { return t->nrows; }

size_t table_memory(const Table *t) {
        return sizeof *t + t->cap * sizeof *t->index + t->slabs_cap * (sizeof *t->slabs + sizeof *t->ids) +
               t->nslabs * TABLE_SLAB * (t->per * sizeof(float) + (t->stamped ? 2 : 1) * sizeof(int64_t)) +
               (t->sketch ? TABLE_SKETCH_DEPTH * TABLE_SKETCH_WIDTH : 0);
}

void table_counts(const Table *t, TableCounts *ret) { *ret = t->counts; }

void table_tick(Table *t, int64_t clock) { t->now = clock; }

bool table_stamped(const Table *t) { return t->stamped; }

void table_hold_bounds(Table *t, bool hold) { t->held = hold; }

void table_log_gone(Table *t, bool on) {
        t->log_gone = on;
        t->ngone = 0;
        t->gone_lost = false;
}

long table_gone(Table *t, int64_t **ret) {
        *ret = NULL;
        if (t->gone_lost) {
                t->gone_lost = false;
                t->ngone = 0;
                return -ENOMEM;
        }
        size_t n = t->ngone;
        if (n == 0)
                return 0;
        *ret = t->gone;
        t->gone = NULL;
        t->ngone = t->gone_cap = 0;
        return (long) n;
}

static inline float *row_at(const Table *t, size_t r) {
        return t->slabs[r >> TABLE_SLAB_SHIFT] + (r & (TABLE_SLAB - 1)) * t->per;
}

static inline int64_t id_at(const Table *t, size_t r) {
        return t->ids[r >> TABLE_SLAB_SHIFT][r & (TABLE_SLAB - 1)];
}

static inline int64_t *stamp_at(const Table *t, size_t r) {
        return &t->ids[r >> TABLE_SLAB_SHIFT][TABLE_SLAB + (r & (TABLE_SLAB - 1))];
}

/* The index slot of id, or of the empty place it would take. */
static size_t probe(const Table *t, const uint32_t *index, size_t cap, int64_t id) {
        size_t i = (size_t) splitmix64((uint64_t) id) & (cap - 1);
        while (index[i] && id_at(t, index[i] - 1) != id)
                i = (i + 1) & (cap - 1);
        return i;
}

static long find(const Table *t, int64_t id) {
        size_t i = probe(t, t->index, t->cap, id);
        return t->index[i] ? (long) t->index[i] - 1 : -1;
}

static void (*poll_fn)(void *ud);
static void *poll_ud;
static pthread_t poll_thread;

void table_set_poll(void (*fn)(void *ud), void *ud) {
        poll_fn = fn;
        poll_ud = ud;
        poll_thread = pthread_self();
}

/* Now and then in a long loop over rows (every 262,144, the first
 * included): the shard's heartbeat, if due (on its loop's thread only: a
 * restore builds tables in the pool). */
static inline void poll_now_and_then(size_t r) {
        if ((r & 0x3FFFF) == 0 && poll_fn && pthread_equal(pthread_self(), poll_thread))
                poll_fn(poll_ud);
}

/* Room for `more` new rows: the index at most 3/4 full, slabs enough. */
static int reserve(Table *t, size_t more) {
        size_t need = t->nrows + more;
        if (need > UINT32_MAX - 1)
                return -ENOSPC;
        if (4 * need > 3 * t->cap) {
                size_t cap = t->cap;
                while (4 * need > 3 * cap)
                        cap *= 2;
                uint32_t *index = ps_malloc(cap * sizeof *index);
                if (!index)
                        return -ENOMEM;
                /* Zeroed in order, a stretch at a time: its pages fault in
                 * here, not at random under the inserts (0.4 s at 2^25). */
                for (size_t at = 0; at < cap; at += 1u << 20) {
                        memset(index + at, 0, MIN((size_t) 1 << 20, cap - at) * sizeof *index);
                        poll_now_and_then(0);
                }
                for (size_t r = 0; r < t->nrows; r++) {
                        index[probe(t, index, cap, id_at(t, r))] = (uint32_t) r + 1;
                        poll_now_and_then(r);
                }
                ps_free(t->index);
                t->index = index;
                t->cap = cap;
                poll_now_and_then(0);
        }
        while (t->nslabs * TABLE_SLAB < need) {
                if (t->nslabs == t->slabs_cap) {
                        size_t sc = t->slabs_cap ? 2 * t->slabs_cap : 8;
                        float **slabs = ps_realloc(t->slabs, sc * sizeof *slabs);
                        if (!slabs)
                                return -ENOMEM;
                        t->slabs = slabs;
                        int64_t **ids = ps_realloc(t->ids, sc * sizeof *ids);
                        if (!ids)
                                return -ENOMEM;
                        t->ids = ids;
                        t->slabs_cap = sc;
                }
                float *rows = ps_malloc(TABLE_SLAB * t->per * sizeof *rows);
                int64_t *ids = ps_malloc((t->stamped ? 2 : 1) * TABLE_SLAB * sizeof *ids);
                if (!rows || !ids) {
                        ps_free(rows);
                        ps_free(ids);
                        return -ENOMEM;
                }
                t->slabs[t->nslabs] = rows;
                t->ids[t->nslabs++] = ids;
        }
        return 0;
}

/* Whether id gets a row now: at its admit-th push, by the count-min sketch
 * (which counts this one). */
static bool admitted(Table *t, int64_t id) {
        if (t->c.admit <= 1)
                return true;
        uint64_t h = splitmix64((uint64_t) id ^ t->c.seed);
        unsigned seen = 255;
        for (size_t d = 0; d < TABLE_SKETCH_DEPTH; d++) {
                uint8_t *c = &t->sketch[d * TABLE_SKETCH_WIDTH + ((h >> (16 * d)) & (TABLE_SKETCH_WIDTH - 1))];
                if (*c < 255)
                        (*c)++;
                seen = MIN(seen, (unsigned) *c);
        }
        return seen >= t->c.admit;
}

/* Removes row r: its index slot deleted by backward shift, the last row
 * moved into its place. */
static void remove_row(Table *t, size_t r) {
        size_t mask = t->cap - 1, i = probe(t, t->index, t->cap, id_at(t, r)), j = i;
        t->index[i] = 0;
        for (;;) {
                j = (j + 1) & mask;
                if (!t->index[j])
                        break;
                size_t home = (size_t) splitmix64((uint64_t) id_at(t, t->index[j] - 1)) & mask;
                if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
                        continue; /* still reachable from its home */
                t->index[i] = t->index[j];
                t->index[j] = 0;
                i = j;
        }
        size_t last = t->nrows - 1;
        if (r != last) {
                t->index[probe(t, t->index, t->cap, id_at(t, last))] = (uint32_t) r + 1;
                memcpy(row_at(t, r), row_at(t, last), t->per * sizeof(float));
                t->ids[r >> TABLE_SLAB_SHIFT][r & (TABLE_SLAB - 1)] = id_at(t, last);
                if (t->stamped)
                        *stamp_at(t, r) = *stamp_at(t, last);
        }
        t->nrows--;
}

static int cmp_id(const void *a, const void *b) {
        int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;
        return (x > y) - (x < y);
}

/* Notes id, dropped by the table's bounds (table_log_gone). */
static void note_gone(Table *t, int64_t id) {
        if (!t->log_gone || t->gone_lost)
                return;
        if (t->ngone == t->gone_cap) {
                size_t cap = t->gone_cap ? 2 * t->gone_cap : 256;
                int64_t *g = ps_realloc(t->gone, cap * sizeof *g);
                if (!g) {
                        t->gone_lost = true;
                        return;
                }
                t->gone = g;
                t->gone_cap = cap;
        }
        t->gone[t->ngone++] = id;
}

/* Drops the k least recently pushed rows of those not pushed at this clock. */
static void evict_oldest(Table *t, size_t k) {
        int64_t *s = ps_malloc((t->nrows ? t->nrows : 1) * sizeof *s);
        size_t n = 0;
        if (!s)
                return;
        for (size_t r = 0; r < t->nrows; r++)
                if (*stamp_at(t, r) < t->now)
                        s[n++] = *stamp_at(t, r);
        k = MIN(k, n);
        if (k == 0) {
                ps_free(s);
                return;
        }
        qsort(s, n, sizeof *s, cmp_id);
        int64_t cut = s[k - 1];
        size_t at_cut = k;
        for (size_t i = 0; i < k; i++)
                at_cut -= s[i] < cut;
        ps_free(s);
        for (size_t r = 0, removed = 0; r < t->nrows && removed < k;) {
                int64_t st = *stamp_at(t, r);
                if (st < cut || (st == cut && at_cut > 0)) {
                        at_cut -= st == cut;
                        note_gone(t, id_at(t, r));
                        remove_row(t, r);
                        removed++;
                        t->counts.evicted_full++;
                } else
                        r++;
        }
}

/* ttl: looks at up to budget rows from where the sweep stands, dropping
 * those not pushed for ttl clocks. */
static void sweep(Table *t, size_t budget) {
        if (!t->c.ttl || t->held)
                return;
        int64_t oldest = t->now - (int64_t) t->c.ttl;
        for (size_t v = 0; v < budget && t->nrows > 0; v++) {
                if (t->sweep >= t->nrows)
                        t->sweep = 0;
                if (*stamp_at(t, t->sweep) < oldest) {
                        note_gone(t, id_at(t, t->sweep));
                        remove_row(t, t->sweep);
                        t->counts.evicted_ttl++;
                } else
                        t->sweep++;
        }
}

/* A new row's values: uniform in [-s, s) from the seed and the id alone. */
static void init_values(const Table *t, int64_t id, float *w) {
        float s = t->c.optim == TABLE_FTRL ? 0.0f : t->c.init_scale;
        uint64_t base = splitmix64(t->c.seed ^ splitmix64((uint64_t) id));
        for (uint32_t j = 0; j < t->c.dim; j++) {
                if (s == 0) {
                        w[j] = 0;
                        continue;
                }
                double u = (double) (splitmix64(base + j) >> 40) * 0x1p-24; /* [0, 1) */
                w[j] = (float) ((2.0 * u - 1.0) * s);
        }
}

/* The number of id's row, made (reserve() was called for it) where it has
 * none. */
static size_t row_num_of(Table *t, int64_t id) {
        size_t i = probe(t, t->index, t->cap, id);
        if (!t->index[i]) {
                size_t r = t->nrows++;
                t->ids[r >> TABLE_SLAB_SHIFT][r & (TABLE_SLAB - 1)] = id;
                if (t->stamped)
                        *stamp_at(t, r) = t->now;
                t->counts.admitted++;
                t->index[i] = (uint32_t) r + 1;
                float *w = row_at(t, r);
                init_values(t, id, w);
                memset(w + t->c.dim, 0, (t->per - t->c.dim) * sizeof *w); /* state, and adam's step count 0 */
        }
        return t->index[i] - 1;
}

/* The row of id, made where it has none. */
static float *row_of(Table *t, int64_t id) {
        return row_at(t, row_num_of(t, id));
}

/* Sorted copy of ids[0..n) (NULL: out of memory). */
static int64_t *sorted_ids(const int64_t *ids, size_t n) {
        int64_t *s = ps_malloc((n ? n : 1) * sizeof *s);
        if (s) {
                memcpy(s, ids, n * sizeof *s);
                qsort(s, n, sizeof *s, cmp_id);
        }
        return s;
}

/* How many distinct ids of ids[0..n) have no row; -ENOMEM. */
static long count_missing(const Table *t, const int64_t *ids, size_t n) {
        int64_t *s = sorted_ids(ids, n);
        if (!s)
                return -ENOMEM;
        long missing = 0;
        for (size_t i = 0; i < n; i++)
                if ((i == 0 || s[i] != s[i - 1]) && find(t, s[i]) < 0)
                        missing++;
        ps_free(s);
        return missing;
}

/* Room for the rows ids[0..n) would create, within max_rows: counted
 * exactly only where n new rows could pass it (the common case reserves
 * room for n, a slab and an index doubling early at most). */
static int make_room(Table *t, const int64_t *ids, size_t n, char *why, size_t whylen) {
        if (!t->c.max_rows || t->held || t->nrows + n <= t->c.max_rows)
                return reserve(t, n);
        long missing = count_missing(t, ids, n);
        if (missing < 0)
                return (int) missing;
        if (t->c.max_rows && t->nrows + (size_t) missing > t->c.max_rows) {
                if (why && whylen)
                        snprintf(why, whylen, "the table holds %zu rows of at most %zu here: %ld new ones do not fit",
                                 t->nrows, t->c.max_rows, missing);
                return -ENOSPC;
        }
        return reserve(t, (size_t) missing);
}

int table_pull(Table *t, const int64_t *ids, size_t n, bool create, float *out, char *why, size_t whylen) {
        if (create) {
                int r = make_room(t, ids, n, why, whylen);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < n; i++) {
                float *dst = out + i * t->c.dim;
                long r = create ? -1 : find(t, ids[i]);
                if (create)
                        memcpy(dst, row_of(t, ids[i]), t->c.dim * sizeof *dst);
                else if (r >= 0)
                        memcpy(dst, row_at(t, (size_t) r), t->c.dim * sizeof *dst);
                else
                        init_values(t, ids[i], dst);
        }
        return 0;
}

/* Adam's step count, kept in the row's last float's bytes. */
static uint32_t steps_of(const Table *t, const float *w) {
        uint32_t s = 0;
        if (t->c.optim == TABLE_ADAM)
                memcpy(&s, w + t->per - 1, sizeof s);
        return s;
}

static void apply_row(Table *t, float *w, const float *g) {
        const TableConf *c = &t->c;
        uint32_t d = c->dim;
        float *s0 = w + d, *s1 = w + 2 * (size_t) d;
        switch (c->optim) {
        case TABLE_SGD:
                for (uint32_t j = 0; j < d; j++)
                        w[j] -= c->lr * g[j];
                break;
        case TABLE_ADAGRAD:
                for (uint32_t j = 0; j < d; j++) {
                        s0[j] += g[j] * g[j];
                        w[j] -= c->lr * g[j] / (sqrtf(s0[j]) + c->eps);
                }
                break;
        case TABLE_ADAM: {
                uint32_t t1 = steps_of(t, w) + 1;
                memcpy(w + t->per - 1, &t1, sizeof t1);
                double bc1 = 1.0 - pow(c->beta1, t1), bc2 = 1.0 - pow(c->beta2, t1);
                float a = (float) (c->lr / bc1), rb2 = (float) (1.0 / sqrt(bc2));
                for (uint32_t j = 0; j < d; j++) {
                        s0[j] = c->beta1 * s0[j] + (1 - c->beta1) * g[j];
                        s1[j] = c->beta2 * s1[j] + (1 - c->beta2) * g[j] * g[j];
                        w[j] -= a * s0[j] / (sqrtf(s1[j]) * rb2 + c->eps);
                }
                break;
        }
        case TABLE_FTRL:
                /* z in s0, n in s1; w follows from them (0 where |z| <= l1: exact zeros). */
                for (uint32_t j = 0; j < d; j++) {
                        double gj = g[j], n = s1[j], z = s0[j];
                        double sig = (sqrt(n + gj * gj) - sqrt(n)) / c->lr;
                        z += gj - sig * w[j];
                        n += gj * gj;
                        s0[j] = (float) z;
                        s1[j] = (float) n;
                        w[j] = fabs(z) <= c->l1 ? 0.0f
                                                : (float) (-(z - copysign(c->l1, z)) /
                                                           ((c->beta + sqrt(n)) / c->lr + c->l2));
                }
                break;
        }
}

/* 1 and *dup where an id comes twice in ids[0..n), 0 where none does
 * (a set of them, open addressing at most half full); -ENOMEM. */
static int first_duplicate(const int64_t *ids, size_t n, int64_t *dup) {
        size_t cap = 16;
        while (cap < 2 * n)
                cap *= 2;
        int64_t *keys = ps_malloc(cap * sizeof *keys);
        uint8_t *used = ps_calloc(cap, 1);
        int r = keys && used ? 0 : -ENOMEM;
        for (size_t i = 0; r == 0 && i < n; i++) {
                size_t j = (size_t) splitmix64((uint64_t) ids[i]) & (cap - 1);
                while (used[j] && keys[j] != ids[i])
                        j = (j + 1) & (cap - 1);
                if (used[j]) {
                        *dup = ids[i];
                        r = 1;
                }
                used[j] = 1;
                keys[j] = ids[i];
        }
        ps_free(keys);
        ps_free(used);
        return r;
}

int table_distinct(const int64_t *ids, size_t n, char *why, size_t whylen) {
        int64_t dup;
        int r = first_duplicate(ids, n, &dup);
        if (r > 0) {
                if (why && whylen)
                        snprintf(why, whylen, "id %lld comes twice in one push (one gradient per row)",
                                 (long long) dup);
                return -EINVAL;
        }
        return r;
}

int table_push(Table *t, const int64_t *ids, size_t n, const float *grads, char *why, size_t whylen) {
        /* A row's state decays into denormals as a chunk's does (common/fpflush.h). */
        _cleanup_(fpflush_end) _unused_ FpFlush fz = fpflush_begin();
        for (size_t i = 0; i < n * t->c.dim; i++)
                if (!isfinite(grads[i])) {
                        if (why && whylen)
                                snprintf(why, whylen, "the gradient of id %lld holds NaN or infinity",
                                         (long long) ids[i / t->c.dim]);
                        return -EINVAL;
                }
        int r = table_distinct(ids, n, why, whylen);
        if (r < 0)
                return r;
        if (!t->stamped && !t->sketch) { /* no bound: every row taken, made where missing */
                r = make_room(t, ids, n, why, whylen);
                for (size_t i = 0; r == 0 && i < n; i++)
                        apply_row(t, row_of(t, ids[i]), grads + i * t->c.dim);
                return r;
        }
        uint8_t *take = ps_malloc(n ? n : 1);
        if (!take)
                return -ENOMEM;
        /* The push's rows held already are stamped first: room is never
         * made by dropping one of them. */
        size_t fresh = 0;
        for (size_t i = 0; i < n; i++) {
                long row = find(t, ids[i]);
                if (row >= 0 && t->stamped)
                        *stamp_at(t, (size_t) row) = t->now;
                take[i] = row >= 0 || admitted(t, ids[i]);
                fresh += row < 0 && take[i];
                t->counts.filtered += !take[i];
        }
        if (t->c.max_rows && !t->held && t->nrows + fresh > t->c.max_rows) {
                size_t need = t->nrows + fresh - t->c.max_rows;
                evict_oldest(t, MAX(need, t->nrows / 16));
                /* Still full of rows pushed at this clock: the new rows past the
                 * bound are dropped (counted), the rest of the push applies. */
                for (size_t i = n; t->nrows + fresh > t->c.max_rows && i-- > 0;)
                        if (take[i] && find(t, ids[i]) < 0) {
                                take[i] = 0;
                                fresh--;
                                t->counts.refused++;
                        }
        }
        r = reserve(t, fresh);
        for (size_t i = 0; r == 0 && i < n; i++)
                if (take[i])
                        apply_row(t, row_of(t, ids[i]), grads + i * t->c.dim);
        ps_free(take);
        if (r == 0)
                sweep(t, 8 * n + 64);
        return r;
}

size_t table_row_floats(const Table *t) { return t->per; }

void table_export(const Table *t, const int64_t *ids, size_t n, float *out) {
        for (size_t i = 0; i < n; i++) {
                float *dst = out + i * t->per;
                long r = find(t, ids[i]);
                if (r >= 0)
                        memcpy(dst, row_at(t, (size_t) r), t->per * sizeof *dst);
                else {
                        init_values(t, ids[i], dst);
                        memset(dst + t->c.dim, 0, (t->per - t->c.dim) * sizeof *dst);
                }
        }
}

int table_import(Table *t, const int64_t *ids, size_t n, const float *in, const int64_t *stamps, char *why,
                 size_t whylen) {
        int r = table_distinct(ids, n, why, whylen);
        if (r == 0)
                r = make_room(t, ids, n, why, whylen);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                size_t r = row_num_of(t, ids[i]);
                memcpy(row_at(t, r), in + i * t->per, t->per * sizeof *in);
                if (stamps && t->stamped)
                        *stamp_at(t, r) = stamps[i];
        }
        return 0;
}

void table_stamps(const Table *t, const int64_t *ids, size_t n, int64_t *out) {
        for (size_t i = 0; i < n; i++) {
                long r = t->stamped ? find(t, ids[i]) : -1;
                out[i] = r >= 0 ? *stamp_at(t, (size_t) r) : t->now;
        }
}

size_t table_export_held(const Table *t, const int64_t *ids, size_t n, int64_t *ret_ids, float *out,
                         int64_t *ret_stamps) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
                long r = find(t, ids[i]);
                if (r < 0)
                        continue;
                ret_ids[k] = ids[i];
                memcpy(out + k * t->per, row_at(t, (size_t) r), t->per * sizeof *out);
                if (t->stamped)
                        ret_stamps[k] = *stamp_at(t, (size_t) r);
                k++;
        }
        return k;
}

size_t table_remove(Table *t, const int64_t *ids, size_t n) {
        size_t gone = 0;
        for (size_t i = 0; i < n; i++) {
                long r = find(t, ids[i]);
                if (r >= 0) {
                        remove_row(t, (size_t) r);
                        gone++;
                }
        }
        return gone;
}

const float *table_row(const Table *t, int64_t id, uint32_t *ret_steps) {
        long r = find(t, id);
        if (r < 0)
                return NULL;
        if (ret_steps)
                *ret_steps = steps_of(t, row_at(t, (size_t) r));
        return row_at(t, (size_t) r);
}

/* Rows from..from+max into ids and out, floats of each (dim or all). */
static size_t copy_rows(const Table *t, size_t from, size_t max, int64_t *ids, float *out, size_t floats) {
        size_t n = 0;
        for (size_t r = from; r < t->nrows && n < max; r++, n++) {
                ids[n] = id_at(t, r);
                memcpy(out + n * floats, row_at(t, r), floats * sizeof *out);
        }
        return n;
}

/* Row r of from into to (whole), and out of from: 0, or -ENOMEM (kept). */
static int move_row(Table *from, Table *to, size_t r) {
        if (reserve(to, 1) < 0)
                return -ENOMEM;
        uint64_t made = to->counts.admitted; /* a row moved, not made */
        size_t at = row_num_of(to, id_at(from, r));
        memcpy(row_at(to, at), row_at(from, r), from->per * sizeof(float));
        to->counts.admitted = made;
        if (from->stamped && to->stamped) /* when it was last pushed travels with it */
                *stamp_at(to, at) = *stamp_at(from, r);
        remove_row(from, r); /* the last row comes into r */
        return 0;
}

long table_move_if(Table *from, Table *to, size_t *at, size_t budget, bool (*take)(int64_t id, void *ud), void *ud) {
        long moved = 0;
        for (size_t seen = 0; *at < from->nrows && seen < budget; seen++) {
                if (!take(id_at(from, *at), ud)) {
                        (*at)++;
                        continue;
                }
                if (move_row(from, to, *at) < 0)
                        return -ENOMEM; /* the rest stay where they are */
                moved++; /* the row now at *at is looked at next */
        }
        return moved;
}

void table_trim(Table *t) {
        size_t keep = (t->nrows + TABLE_SLAB - 1) / TABLE_SLAB + 1; /* one spare: no churn at the edge */
        while (t->nslabs > keep) {
                t->nslabs--;
                ps_free(t->slabs[t->nslabs]);
                ps_free(t->ids[t->nslabs]);
        }
}

long table_sweep(Table *t, Table *to, size_t *at, size_t budget, TableSweepFn see, void *ud) {
        long gone = 0;
        for (size_t seen = 0; *at < t->nrows && seen < budget; seen++) {
                int what = see(id_at(t, *at), row_at(t, *at), ud);
                if (what == TABLE_KEEP) {
                        (*at)++;
                        continue;
                }
                if (what == TABLE_MOVE && move_row(t, to, *at) < 0)
                        return -ENOMEM; /* the rest stay where they are */
                if (what == TABLE_DROP)
                        remove_row(t, *at);
                gone++; /* the row now at *at is looked at next */
        }
        return gone;
}

int table_move_one(Table *from, Table *to, int64_t id) {
        long r = find(from, id);
        if (r < 0)
                return 0;
        return move_row(from, to, (size_t) r) < 0 ? -ENOMEM : 1;
}

size_t table_scan(const Table *t, size_t from, size_t max, int64_t *ids, float *values) {
        return copy_rows(t, from, max, ids, values, t->c.dim);
}

size_t table_dump(const Table *t, size_t from, size_t max, int64_t *ids, float *rows) {
        return copy_rows(t, from, max, ids, rows, t->per);
}
