/* SPDX-License-Identifier: Apache-2.0 */
/* Federated aggregation strategies; see fed.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fed.h"

#define MIN_SZ(a, b) ((a) < (b) ? (a) : (b))

static const struct {
        const char *name;
        FedParams p;
} strategies[] = {
        [FED_AVG] = { "fedavg", { FED_AVG, 1.0f, 0, 0, 0, 0, 0 } },
        [FED_AVGM] = { "fedavgm", { FED_AVGM, 1.0f, 0.9f, 0, 0, 0, 0 } },
        [FED_ADAGRAD] = { "fedadagrad", { FED_ADAGRAD, 0.1f, 0, 0.0f, 0, 1e-9f, 0 } },
        [FED_ADAM] = { "fedadam", { FED_ADAM, 0.1f, 0, 0.9f, 0.99f, 1e-9f, 0 } },
        [FED_YOGI] = { "fedyogi", { FED_YOGI, 0.01f, 0, 0.9f, 0.99f, 1e-3f, 0 } },
        [FED_MEDIAN] = { "median", { FED_MEDIAN, 1.0f, 0, 0, 0, 0, 0 } },
        [FED_TRIMMED_MEAN] = { "trimmed-mean", { FED_TRIMMED_MEAN, 1.0f, 0, 0, 0, 0, 0.1f } },
        [FED_KRUM] = { "krum", { .kind = FED_KRUM, .eta = 1.0f, .byzantine = 0.2f } },
        [FED_MULTIKRUM] = { "multi-krum", { .kind = FED_MULTIKRUM, .eta = 1.0f, .byzantine = 0.2f } },
        [FED_CUSTOM] = { "custom", { .kind = FED_CUSTOM, .eta = 1.0f } },
};

void fed_params_default(FedStrategy kind, FedParams *ret) {
        *ret = strategies[kind <= FED_LAST ? kind : FED_AVG].p;
}

int fed_strategy_from_string(const char *s, FedStrategy *ret) {
        for (size_t i = 0; s && i < sizeof strategies / sizeof strategies[0]; i++)
                if (strcmp(s, strategies[i].name) == 0) {
                        *ret = (FedStrategy) i;
                        return 0;
                }
        return -EINVAL;
}

const char *fed_strategy_name(FedStrategy kind) {
        return kind <= FED_LAST ? strategies[kind].name : "?";
}

int fed_params_check(const FedParams *p, char *err, size_t errn) {
        const char *why = NULL;
        if (p->kind > FED_LAST)
                why = "unknown strategy";
        else if (!isfinite(p->eta) || p->eta <= 0)
                why = "the server lr must be > 0";
        else if (!(p->beta >= 0 && p->beta < 1))
                why = "the server momentum must be in [0, 1)";
        else if (!(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1))
                why = "beta1 and beta2 must be in [0, 1)";
        else if (!isfinite(p->tau) || p->tau < 0 || ((p->kind == FED_ADAM || p->kind == FED_YOGI ||
                                                      p->kind == FED_ADAGRAD) && p->tau == 0))
                why = "tau must be > 0 for the adaptive strategies";
        else if (!(p->trim >= 0 && p->trim < 0.5f))
                why = "trim must be in [0, 0.5)";
        else if (!isfinite(p->dp_clip) || p->dp_clip < 0 || !isfinite(p->dp_noise) || p->dp_noise < 0)
                why = "the clip norm and the noise multiplier must be finite and >= 0";
        else if (p->dp_noise > 0 && p->dp_clip == 0)
                why = "noise (--dp-noise) needs a clip norm (--dp-clip) to be scaled by";
        else if (!(p->byzantine >= 0 && p->byzantine < 0.5f))
                why = "the share of bad updates assumed (--byzantine) must be in [0, 0.5)";
        else if (p->dp_clip > 0 && (p->kind == FED_MEDIAN || p->kind == FED_TRIMMED_MEAN || fed_is_krum(p->kind)))
                why = "differential privacy (--dp-clip) works with the mean-based strategies, not a robust one";
        else if (p->dp_clip > 0 && p->kind == FED_CUSTOM)
                why = "differential privacy (--dp-clip) bounds a mean of clipped updates; a custom strategy's "
                      "delta has no such bound";
        if (!why)
                return 0;
        snprintf(err, errn, "%s: %s", fed_strategy_name(p->kind), why);
        return -EINVAL;
}

size_t fed_state_per_value(FedStrategy kind) {
        switch (kind) {
        case FED_AVGM:
                return 1;
        case FED_ADAGRAD:
        case FED_ADAM:
        case FED_YOGI:
                return 2;
        default:
                return 0;
        }
}

static int cmp_float(const void *a, const void *b) {
        float x = *(const float *) a, y = *(const float *) b;
        return (x > y) - (x < y);
}

/* The robust statistic of coordinate j over the n updates (col: n floats of scratch). */
static float robust(const FedParams *p, const float *const *updates, size_t n, uint32_t j, float *col) {
        for (size_t i = 0; i < n; i++)
                col[i] = updates[i][j];
        qsort(col, n, sizeof *col, cmp_float);
        if (p->kind == FED_MEDIAN)
                return n % 2 ? col[n / 2] : (col[n / 2 - 1] + col[n / 2]) * 0.5f;
        size_t k = (size_t) floorf(p->trim * (float) n), m = n - 2 * k;
        double sum = 0;
        for (size_t i = k; i < n - k; i++)
                sum += col[i];
        return (float) (sum / (double) m);
}

void fed_client_step(float *w, const float *w0, const float *g, size_t n, float lr, float mu) {
        for (size_t i = 0; i < n; i++)
                w[i] -= lr * (g[i] + mu * (w[i] - w0[i]));
}

double fed_norm2(const float *v, size_t len) {
        double s = 0;
        for (size_t j = 0; j < len; j++)
                s += (double) v[j] * v[j];
        return sqrt(s);
}

int fed_aggregate(const FedParams *p, float *w, float *state, uint32_t len, const float *const *updates,
                  const uint64_t *examples, size_t n, const float *noise, float *scratch) {
        if (n == 0 || !updates || p->kind > FED_LAST || p->kind == FED_CUSTOM)
                return -EINVAL; /* custom: the strategy process's delta, fed_server_step */
        for (size_t i = 0; i < n; i++)
                for (uint32_t j = 0; j < len; j++)
                        if (!isfinite(updates[i][j]))
                                return -EINVAL;
        float *d = scratch, *col = scratch + len;
        if (p->kind == FED_MEDIAN || p->kind == FED_TRIMMED_MEAN) {
                for (uint32_t j = 0; j < len; j++)
                        w[j] += p->eta * robust(p, updates, n, j, col);
                return 0;
        }
        if (fed_is_krum(p->kind)) {
                /* The updates pscoord kept: their unweighted mean. */
                for (uint32_t j = 0; j < len; j++) {
                        double s = 0;
                        for (size_t i = 0; i < n; i++)
                                s += updates[i][j];
                        d[j] = (float) (s / (double) n);
                }
        } else if (p->dp_clip > 0) {
                /* Private: the unweighted sum plus z C N(0, 1), over n. */
                double sd = noise ? (double) p->dp_noise * p->dp_clip : 0;
                for (uint32_t j = 0; j < len; j++) {
                        double s = sd * (noise ? noise[j] : 0);
                        for (size_t i = 0; i < n; i++)
                                s += updates[i][j];
                        d[j] = (float) (s / (double) n);
                }
        } else {
                /* The weighted mean, summed in client order in double (the same inputs, the same result). */
                double total = 0;
                for (size_t i = 0; i < n; i++)
                        total += (double) examples[i];
                if (total <= 0)
                        return -EINVAL;
                for (uint32_t j = 0; j < len; j++) {
                        double s = 0;
                        for (size_t i = 0; i < n; i++)
                                s += (double) examples[i] * updates[i][j];
                        d[j] = (float) (s / total);
                }
        }
        fed_server_step(p, w, state, len, d);
        return 0;
}

void fed_server_step(const FedParams *p, float *w, float *state, uint32_t len, const float *d) {
        float *m = state, *v = state ? state + len : NULL;
        switch (p->kind) {
        case FED_AVG:
        case FED_MEDIAN: /* d: the robust statistic */
        case FED_TRIMMED_MEAN:
        case FED_KRUM:
        case FED_MULTIKRUM:
        case FED_CUSTOM: /* d: the strategy process's delta */
                for (uint32_t j = 0; j < len; j++)
                        w[j] += p->eta * d[j];
                break;
        case FED_AVGM:
                for (uint32_t j = 0; j < len; j++) {
                        m[j] = p->beta * m[j] + d[j];
                        w[j] += p->eta * m[j];
                }
                break;
        default: /* the adaptive ones */
                for (uint32_t j = 0; j < len; j++) {
                        float d2 = d[j] * d[j];
                        m[j] = p->beta1 * m[j] + (1 - p->beta1) * d[j];
                        if (p->kind == FED_ADAGRAD)
                                v[j] += d2;
                        else if (p->kind == FED_ADAM)
                                v[j] = p->beta2 * v[j] + (1 - p->beta2) * d2;
                        else
                                v[j] -= (1 - p->beta2) * d2 * (float) ((v[j] > d2) - (v[j] < d2));
                        w[j] += p->eta * m[j] / (sqrtf(v[j]) + p->tau);
                }
        }
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

size_t fed_krum_select(const FedParams *p, const double *d2, size_t n, double *scratch, double *scores,
                       unsigned char *keep) {
        if (n == 0)
                return 0;
        size_t f = (size_t) floor((double) p->byzantine * (double) n + 1e-9);
        /* Each score sums the n - f - 2 nearest others (at least one, when there are others). */
        size_t near = MIN_SZ(n > f + 2 ? n - f - 2 : 1, n - 1);
        for (size_t i = 0; i < n; i++) {
                size_t k = 0;
                for (size_t j = 0; j < n; j++)
                        if (j != i)
                                scratch[k++] = d2[i * n + j];
                qsort(scratch, k, sizeof *scratch, cmp_double);
                double s = 0;
                for (size_t j = 0; j < near; j++)
                        s += scratch[j];
                scores[i] = s;
                keep[i] = 0;
        }
        /* Krum: the one of least score; Multi-Krum: the m = n - f of least
         * score. Ties go to the lower index. */
        size_t m = p->kind == FED_MULTIKRUM ? n - f : 1, kept = 0;
        for (; kept < m; kept++) {
                size_t a = n;
                for (size_t i = 0; i < n; i++)
                        if (!keep[i] && (a == n || scores[i] < scores[a]))
                                a = i;
                if (a == n)
                        break;
                keep[a] = 1;
        }
        return kept;
}
