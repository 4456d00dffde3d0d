/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-table.h. Ids are found by open addressing over the rows' numbers
 * (linear probing, at most 3/4 full, splitmix64 of the id); a row's values
 * and optimizer state sit side by side (values first, then the state, then
 * Adam's step count), so a touched row is one run of memory; rows and their
 * ids are kept in slabs of 4,096, so the table grows without copying (about
 * 13-19 bytes a row beside the row itself). A pull or push checks everything (distinct
 * ids, finite gradients, room for the new rows) before it changes anything. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "hash.h"
#include "psd-table.h"

#define TABLE_SLAB_SHIFT 12     /* 4,096 rows a slab: no copy when the table grows */
#define TABLE_SLAB ((size_t) 1 << TABLE_SLAB_SHIFT)

struct Table {
        TableConf c;
        size_t per;             /* floats per row: dim values, their state, then (adam) the step count */
        uint32_t *index;        /* [cap]: row + 1 of the id hashed there, linear probing; 0: empty */
        size_t cap;             /* a power of two: the rows fill at most 3/4 of it */
        float **slabs;          /* the rows, TABLE_SLAB a slab */
        int64_t **ids;          /* each row's id, TABLE_SLAB a slab */
        size_t nslabs, slabs_cap;
        size_t nrows;
};

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
        t->cap = 16;
        t->index = ps_calloc(t->cap, sizeof *t->index);
        if (!t->index) {
                table_free(t);
                return -ENOMEM;
        }
        *ret = t;
        return 0;
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
                ps_free(t);
        }
        return NULL;
}

size_t table_size(const Table *t) { return t->nrows; }

size_t table_memory(const Table *t) {
        return sizeof *t + t->cap * sizeof *t->index + t->slabs_cap * (sizeof *t->slabs + sizeof *t->ids) +
               t->nslabs * TABLE_SLAB * (t->per * sizeof(float) + sizeof(int64_t));
}

static inline float *row_at(const Table *t, size_t r) {
        return t->slabs[r >> TABLE_SLAB_SHIFT] + (r & (TABLE_SLAB - 1)) * t->per;
}

static inline int64_t id_at(const Table *t, size_t r) {
        return t->ids[r >> TABLE_SLAB_SHIFT][r & (TABLE_SLAB - 1)];
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

/* Room for `more` new rows: the index at most 3/4 full, slabs enough. */
static int reserve(Table *t, size_t more) {
        size_t need = t->nrows + more;
        if (need > UINT32_MAX - 1)
                return -ENOSPC;
        if (4 * need > 3 * t->cap) {
                size_t cap = t->cap;
                while (4 * need > 3 * cap)
                        cap *= 2;
                uint32_t *index = ps_calloc(cap, sizeof *index);
                if (!index)
                        return -ENOMEM;
                for (size_t r = 0; r < t->nrows; r++)
                        index[probe(t, index, cap, id_at(t, r))] = (uint32_t) r + 1;
                ps_free(t->index);
                t->index = index;
                t->cap = cap;
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
                int64_t *ids = ps_malloc(TABLE_SLAB * sizeof *ids);
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

/* The row of id, made (reserve() was called for it) where it has none. */
static float *row_of(Table *t, int64_t id) {
        size_t i = probe(t, t->index, t->cap, id);
        if (!t->index[i]) {
                size_t r = t->nrows++;
                t->ids[r >> TABLE_SLAB_SHIFT][r & (TABLE_SLAB - 1)] = id;
                t->index[i] = (uint32_t) r + 1;
                float *w = row_at(t, r);
                init_values(t, id, w);
                memset(w + t->c.dim, 0, (t->per - t->c.dim) * sizeof *w); /* state, and adam's step count 0 */
        }
        return row_at(t, t->index[i] - 1);
}

static int cmp_id(const void *a, const void *b) {
        int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;
        return (x > y) - (x < y);
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
        if (!t->c.max_rows || t->nrows + n <= t->c.max_rows)
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
        r = make_room(t, ids, n, why, whylen);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                apply_row(t, row_of(t, ids[i]), grads + i * t->c.dim);
        }
        return 0;
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

int table_import(Table *t, const int64_t *ids, size_t n, const float *in, char *why, size_t whylen) {
        int r = table_distinct(ids, n, why, whylen);
        if (r == 0)
                r = make_room(t, ids, n, why, whylen);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++)
                memcpy(row_of(t, ids[i]), in + i * t->per, t->per * sizeof *in);
        return 0;
}

const float *table_row(const Table *t, int64_t id, uint32_t *ret_steps) {
        long r = find(t, id);
        if (r < 0)
                return NULL;
        if (ret_steps)
                *ret_steps = steps_of(t, row_at(t, (size_t) r));
        return row_at(t, (size_t) r);
}
