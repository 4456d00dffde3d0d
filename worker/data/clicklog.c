/* SPDX-License-Identifier: Apache-2.0 */
/* See clicklog.h. Every draw is a hash of the seed and what it is for (the
 * row and field, an id's weight), so the data set does not depend on the
 * order things are made in. Zipf ranks are drawn by rejection-inversion
 * (Hörmann and Derflinger, "Rejection-inversion to generate variates from
 * monotone discrete distributions", 1996): O(1) per draw whatever the
 * vocabulary, no table. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "alloc.h"
#include "clicklog.h"
#include "hash.h"
#include "npy.h"

enum { SALT_ROW = 1, SALT_WEIGHT, SALT_DENSE_W, SALT_ID };

/* A uniform double in [0, 1) from the seed and three numbers. */
static double unit(uint64_t seed, uint64_t salt, uint64_t a, uint64_t b) {
        uint64_t x = mix64(seed ^ mix64(salt * UINT64_C(0x9e3779b97f4a7c15) ^ mix64(a) ^ mix64(b + 0x5bd1e995)));
        return (double) (x >> 11) * 0x1p-53;
}

/* A standard normal from two uniforms (Box-Muller). */
static double normal(uint64_t seed, uint64_t salt, uint64_t a, uint64_t b) {
        double u1 = unit(seed, salt, a, 2 * b), u2 = unit(seed, salt, a, 2 * b + 1);
        return sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2);
}

/* --- Zipf(s) over 1..n by rejection-inversion ------------------------------------ */

typedef struct Zipf {
        double s, n, hx1, hn, cut;
} Zipf;

/* log1p(x)/x and expm1(x)/x, with their series near 0. */
static double h1(double x) { return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
static double h2(double x) { return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x)); }
/* The hat function x^-s, its integral H and H's inverse. */
static double hat(const Zipf *z, double x) { return exp(-z->s * log(x)); }
static double hint(const Zipf *z, double x) {
        double lx = log(x);
        return h2((1 - z->s) * lx) * lx;
}
static double hinv(const Zipf *z, double x) {
        double t = x * (1 - z->s);
        if (t < -1)
                t = -1;
        return exp(h1(t) * x);
}

static void zipf_init(Zipf *z, double s, uint64_t n) {
        z->s = s;
        z->n = (double) n;
        z->hx1 = hint(z, 1.5) - 1;
        z->hn = hint(z, z->n + 0.5);
        z->cut = 2 - hinv(z, hint(z, 2.5) - hat(z, 2));
}

/* A rank in 1..n: the i-th try takes the i-th uniform of the row and field's stream. */
static uint64_t zipf_draw(const Zipf *z, uint64_t seed, uint64_t row, uint32_t f) {
        for (uint64_t i = 0;; i++) {
                double u = z->hn + unit(seed, SALT_ID, row * CLICKLOG_MAX_FIELDS + f, i) * (z->hx1 - z->hn);
                double x = hinv(z, u);
                double k = floor(x + 0.5);
                if (k < 1)
                        k = 1;
                else if (k > z->n)
                        k = z->n;
                if (k - x <= z->cut || u >= hint(z, k + 0.5) - hat(z, k))
                        return (uint64_t) k;
        }
}

int64_t clicklog_id(const ClickConf *c, uint32_t f, uint64_t rank) {
        return (int64_t) (mix64(c->seed ^ mix64(((uint64_t) f << 48) ^ rank)) >> 1);
}

double clicklog_weight(const ClickConf *c, uint32_t f, int64_t id) {
        return c->weight_sd * normal(c->seed, SALT_WEIGHT, f, (uint64_t) id);
}

/* --- metrics ----------------------------------------------------------------------- */

typedef struct Scored {
        float score;
        uint8_t label;
} Scored;

static int by_score(const void *a, const void *b) {
        float x = ((const Scored *) a)->score, y = ((const Scored *) b)->score;
        return (x > y) - (x < y);
}

double auc(const float *scores, const uint8_t *labels, size_t n) {
        Scored *v = ps_malloc((n ? n : 1) * sizeof *v);
        if (!v)
                return NAN;
        for (size_t i = 0; i < n; i++)
                v[i] = (Scored) { scores[i], labels[i] };
        qsort(v, n, sizeof *v, by_score);
        double pos = 0, rank_sum = 0;
        for (size_t i = 0; i < n;) {
                size_t j = i;
                while (j < n && v[j].score == v[i].score)
                        j++;
                double avg = (double) (i + 1 + j) / 2.0; /* ranks i+1..j */
                for (size_t k = i; k < j; k++)
                        if (v[k].label) {
                                pos++;
                                rank_sum += avg;
                        }
                i = j;
        }
        ps_free(v);
        double neg = (double) n - pos;
        if (pos == 0 || neg == 0)
                return NAN;
        return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

double logloss_of_logits(const float *logits, const uint8_t *labels, size_t n) {
        double s = 0;
        for (size_t i = 0; i < n; i++) {
                double l = labels[i] ? -logits[i] : logits[i]; /* the loss is softplus(l) */
                s += l > 0 ? l + log1p(exp(-l)) : log1p(exp(l));
        }
        return n ? s / (double) n : NAN;
}

/* --- writing ----------------------------------------------------------------------- */

static int check(const ClickConf *c, char *err, size_t n) {
        const char *bad = NULL;
        if (c->train_rows == 0 || c->test_rows == 0)
                bad = "train and test rows must be > 0";
        else if (c->fields == 0 || c->fields > CLICKLOG_MAX_FIELDS)
                bad = "fields must be 1 to 64";
        else if (c->dense > CLICKLOG_MAX_DENSE)
                bad = "dense features must be 0 to 64";
        else if (!(c->zipf > 0 && c->zipf < 10))
                bad = "the Zipf exponent must be in (0, 10)";
        else if (!(c->weight_sd >= 0 && isfinite(c->weight_sd) && isfinite(c->bias)))
                bad = "the planted weights' spread and bias must be finite (spread >= 0)";
        else if (!(c->missing >= 0 && c->missing < 1))
                bad = "the share of missing values must be in [0, 1)";
        for (uint32_t f = 0; !bad && f < c->fields; f++)
                if (c->vocab[f] == 0 || c->vocab[f] > (UINT64_C(1) << 40))
                        bad = "each field's vocabulary must be 1 to 2^40 ids";
        if (bad)
                snprintf(err, n, "%s", bad);
        return bad ? -EINVAL : 0;
}

/* One split: rows first..first+rows of the stream, into dir/name/. */
static int write_split(const ClickConf *c, const Zipf *z, const char *dir, const char *name, uint64_t first,
                       uint64_t rows, bool with_logit, uint64_t *clicks, double *ret_auc, double *ret_ll, char *err,
                       size_t n) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                int r = -errno;
                snprintf(err, n, "%s: %s", path, strerror(-r));
                return r;
        }
        size_t ndense = (size_t) rows * c->dense;
        float *dense = ps_malloc((ndense ? ndense : 1) * sizeof *dense);
        int64_t *sparse = ps_malloc((size_t) (rows * c->fields) * sizeof *sparse);
        uint8_t *label = ps_malloc((size_t) rows);
        float *logit = ps_malloc((size_t) rows * sizeof *logit);
        int r = dense && sparse && label && logit ? 0 : -ENOMEM;
        double dw[CLICKLOG_MAX_DENSE];
        for (uint32_t d = 0; d < c->dense; d++)
                dw[d] = 0.5 * normal(c->seed, SALT_DENSE_W, d, 0);
        for (uint64_t i = 0; r == 0 && i < rows; i++) {
                uint64_t row = first + i;
                double l = c->bias;
                for (uint32_t f = 0; f < c->fields; f++) {
                        int64_t id = -1;
                        if (unit(c->seed, SALT_ROW, row, 2u * f) >= c->missing) {
                                id = clicklog_id(c, f, zipf_draw(&z[f], c->seed, row, f));
                                l += clicklog_weight(c, f, id);
                        }
                        sparse[i * c->fields + f] = id;
                }
                for (uint32_t d = 0; d < c->dense; d++) {
                        double x = normal(c->seed, SALT_ROW, row, 1000 + d);
                        dense[i * c->dense + d] = (float) x;
                        l += dw[d] * x;
                }
                logit[i] = (float) l;
                label[i] = unit(c->seed, SALT_ROW, row, 2u * CLICKLOG_MAX_FIELDS + 1) < 1.0 / (1.0 + exp(-l));
                *clicks += label[i];
        }
        uint64_t shape[2] = { rows, c->fields };
        if (r == 0) {
                snprintf(path, sizeof path, "%s/%s/sparse.npy", dir, name);
                r = npy_write(path, NPY_I64, 2, shape, sparse, err, n);
        }
        if (r == 0 && c->dense) {
                shape[1] = c->dense;
                snprintf(path, sizeof path, "%s/%s/dense.npy", dir, name);
                r = npy_write(path, NPY_F32, 2, shape, dense, err, n);
        }
        if (r == 0) {
                snprintf(path, sizeof path, "%s/%s/label.npy", dir, name);
                r = npy_write(path, NPY_U8, 1, shape, label, err, n);
        }
        if (r == 0 && with_logit) {
                snprintf(path, sizeof path, "%s/%s/logit.npy", dir, name);
                r = npy_write(path, NPY_F32, 1, shape, logit, err, n);
                *ret_auc = auc(logit, label, (size_t) rows);
                *ret_ll = logloss_of_logits(logit, label, (size_t) rows);
        }
        if (r == -ENOMEM)
                snprintf(err, n, "out of memory for %lu rows", (unsigned long) rows);
        ps_free(dense);
        ps_free(sparse);
        ps_free(label);
        ps_free(logit);
        return r;
}

int clicklog_write(const ClickConf *c, const char *dir, ClickSummary *ret, char *err, size_t n) {
        int r = check(c, err, n);
        if (r < 0)
                return r;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                r = -errno;
                snprintf(err, n, "%s: %s", dir, strerror(-r));
                return r;
        }
        Zipf z[CLICKLOG_MAX_FIELDS];
        for (uint32_t f = 0; f < c->fields; f++)
                zipf_init(&z[f], c->zipf, c->vocab[f]);
        uint64_t clicks = 0;
        ClickSummary s = { 0 };
        r = write_split(c, z, dir, "train", 0, c->train_rows, false, &clicks, &s.best_auc, &s.best_logloss, err, n);
        if (r == 0)
                r = write_split(c, z, dir, "test", c->train_rows, c->test_rows, true, &clicks, &s.best_auc,
                                &s.best_logloss, err, n);
        s.click_rate = (double) clicks / (double) (c->train_rows + c->test_rows);
        if (r == 0 && ret)
                *ret = s;
        return r;
}
