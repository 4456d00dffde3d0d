/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-table.h. Ids are found by open addressing (linear probing, at most
 * half full, splitmix64 of the id); a row's values and optimizer state sit
 * side by side in one array of rows (values first), so a touched row is one
 * cache-friendly run of memory. A pull or push checks everything (distinct
 * ids, finite gradients, room for the new rows) before it changes anything. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "hash.h"
#include "psd-table.h"

#define TABLE_MAX_DIM 4096

struct Table {
        TableConf c;
        size_t per;             /* floats per row: dim values, then their state */
        int64_t *keys;          /* [cap] */
        uint32_t *slot;         /* [cap]: row index + 1; 0: empty */
        size_t cap;             /* a power of two, >= 2 * nrows */
        float *rows;            /* [rows_cap * per] */
        uint32_t *steps;        /* adam: [rows_cap], each row's own step count */
        size_t nrows, rows_cap;
};

/* splitmix64 of x: the first value of the stream whose state is x. */
static inline uint64_t splitmix64(uint64_t x) {
        return splitmix64_next(&x);
}

unsigned table_state_per_value(TableOptim o) {
        return o == TABLE_SGD ? 0 : o == TABLE_ADAGRAD ? 1 : 2;
}

static bool finite_pos(float x) { return isfinite(x) && x > 0; }

static int conf_check(const TableConf *c, char *why, size_t n) {
        const char *bad = NULL;
        if (c->dim == 0 || c->dim > TABLE_MAX_DIM)
                bad = "dim must be 1 to 4096";
        else if (c->optim > TABLE_FTRL)
                bad = "unknown optimizer";
        else if (!finite_pos(c->lr))
                bad = "lr must be positive";
        else if ((c->optim == TABLE_ADAGRAD || c->optim == TABLE_ADAM) && !finite_pos(c->eps))
                bad = "eps must be positive";
        else if (c->optim == TABLE_ADAM && !(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
                bad = "adam's beta1 and beta2 must be in [0, 1)";
        else if (c->optim == TABLE_FTRL && !(c->beta >= 0 && c->l1 >= 0 && c->l2 >= 0 && isfinite(c->beta) &&
                                             isfinite(c->l1) && isfinite(c->l2)))
                bad = "ftrl's beta, l1 and l2 must be finite and >= 0";
        else if (!(c->init_scale >= 0 && isfinite(c->init_scale)))
                bad = "init_scale must be finite and >= 0";
        if (bad && why && n)
                snprintf(why, n, "%s", bad);
        return bad ? -EINVAL : 0;
}

int table_new(const TableConf *c, Table **ret, char *why, size_t n) {
        int r = conf_check(c, why, n);
        if (r < 0)
                return r;
        Table *t = ps_calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->c = *c;
        t->per = (size_t) c->dim * (1 + table_state_per_value(c->optim));
        t->cap = 16;
        t->keys = ps_calloc(t->cap, sizeof *t->keys);
        t->slot = ps_calloc(t->cap, sizeof *t->slot);
        if (!t->keys || !t->slot) {
                table_free(t);
                return -ENOMEM;
        }
        *ret = t;
        return 0;
}

Table *table_free(Table *t) {
        if (t) {
                ps_free(t->keys);
                ps_free(t->slot);
                ps_free(t->rows);
                ps_free(t->steps);
                ps_free(t);
        }
        return NULL;
}

size_t table_size(const Table *t) { return t->nrows; }

/* The slot of id, or of the empty place it would take. */
static size_t probe(const int64_t *keys, const uint32_t *slot, size_t cap, int64_t id) {
        size_t i = (size_t) splitmix64((uint64_t) id) & (cap - 1);
        while (slot[i] && keys[i] != id)
                i = (i + 1) & (cap - 1);
        return i;
}

static long find(const Table *t, int64_t id) {
        size_t i = probe(t->keys, t->slot, t->cap, id);
        return t->slot[i] ? (long) t->slot[i] - 1 : -1;
}

/* Room for `more` new rows: the index at most half full, the rows' arrays large enough. */
static int reserve(Table *t, size_t more) {
        size_t need = t->nrows + more;
        if (need > UINT32_MAX - 1)
                return -ENOSPC;
        if (2 * need > t->cap) {
                size_t cap = t->cap;
                while (2 * need > cap)
                        cap *= 2;
                int64_t *keys = ps_calloc(cap, sizeof *keys);
                uint32_t *slot = ps_calloc(cap, sizeof *slot);
                if (!keys || !slot) {
                        ps_free(keys);
                        ps_free(slot);
                        return -ENOMEM;
                }
                for (size_t i = 0; i < t->cap; i++)
                        if (t->slot[i]) {
                                size_t j = probe(keys, slot, cap, t->keys[i]);
                                keys[j] = t->keys[i];
                                slot[j] = t->slot[i];
                        }
                ps_free(t->keys);
                ps_free(t->slot);
                t->keys = keys;
                t->slot = slot;
                t->cap = cap;
        }
        if (need > t->rows_cap) {
                size_t rc = t->rows_cap ? t->rows_cap : 64;
                while (rc < need)
                        rc *= 2;
                float *rows = ps_realloc(t->rows, rc * t->per * sizeof *rows);
                if (!rows)
                        return -ENOMEM;
                t->rows = rows;
                if (t->c.optim == TABLE_ADAM) {
                        uint32_t *steps = ps_realloc(t->steps, rc * sizeof *steps);
                        if (!steps)
                                return -ENOMEM;
                        t->steps = steps;
                }
                t->rows_cap = rc;
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
        size_t i = probe(t->keys, t->slot, t->cap, id);
        if (!t->slot[i]) {
                size_t r = t->nrows++;
                t->keys[i] = id;
                t->slot[i] = (uint32_t) r + 1;
                float *w = t->rows + r * t->per;
                init_values(t, id, w);
                memset(w + t->c.dim, 0, (t->per - t->c.dim) * sizeof *w);
                if (t->steps)
                        t->steps[r] = 0;
        }
        return t->rows + (size_t) (t->slot[i] - 1) * t->per;
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

/* Room for the rows ids[0..n) would create, within max_rows. */
static int make_room(Table *t, const int64_t *ids, size_t n, char *why, size_t whylen) {
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
                        memcpy(dst, t->rows + (size_t) r * t->per, t->c.dim * sizeof *dst);
                else
                        init_values(t, ids[i], dst);
        }
        return 0;
}

static void apply_row(Table *t, float *w, uint32_t *step, const float *g) {
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
                uint32_t t1 = ++*step;
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

int table_push(Table *t, const int64_t *ids, size_t n, const float *grads, char *why, size_t whylen) {
        for (size_t i = 0; i < n * t->c.dim; i++)
                if (!isfinite(grads[i])) {
                        if (why && whylen)
                                snprintf(why, whylen, "the gradient of id %lld holds NaN or infinity",
                                         (long long) ids[i / t->c.dim]);
                        return -EINVAL;
                }
        int64_t *s = sorted_ids(ids, n);
        if (!s)
                return -ENOMEM;
        for (size_t i = 1; i < n; i++)
                if (s[i] == s[i - 1]) {
                        if (why && whylen)
                                snprintf(why, whylen, "id %lld comes twice in one push (one gradient per row)",
                                         (long long) s[i]);
                        ps_free(s);
                        return -EINVAL;
                }
        ps_free(s);
        int r = make_room(t, ids, n, why, whylen);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                float *w = row_of(t, ids[i]);
                size_t row = (size_t) (w - t->rows) / t->per;
                apply_row(t, w, t->steps ? &t->steps[row] : NULL, grads + i * t->c.dim);
        }
        return 0;
}

const float *table_row(const Table *t, int64_t id, uint32_t *ret_steps) {
        long r = find(t, id);
        if (r < 0)
                return NULL;
        if (ret_steps)
                *ret_steps = t->steps ? t->steps[r] : 0;
        return t->rows + (size_t) r * t->per;
}
