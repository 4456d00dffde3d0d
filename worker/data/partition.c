/* SPDX-License-Identifier: Apache-2.0 */
/* Federated data splits; see partition.h. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hash.h"
#include "macro.h"
#include "partition.h"

/* Uniform in (0, 1). */
static double uniform(uint64_t *x) {
        return ((double) (splitmix64_next(x) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double normal(uint64_t *x) {
        return sqrt(-2.0 * log(uniform(x))) * cos(2.0 * M_PI * uniform(x));
}

double partition_gamma(double shape, uint64_t *x) {
        if (shape < 1.0) /* boosted: Gamma(a) = Gamma(a + 1) U^(1/a) */
                return partition_gamma(shape + 1.0, x) * pow(uniform(x), 1.0 / shape);
        double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
        for (;;) {
                double z = normal(x), v = 1.0 + c * z;
                if (v <= 0)
                        continue;
                v = v * v * v;
                double u = uniform(x);
                if (log(u) < 0.5 * z * z + d - d * v + d * log(v))
                        return d * v;
        }
}

int partition_client(const int32_t *labels, uint32_t n, uint32_t nclasses, uint32_t clients, double alpha,
                     uint64_t seed, uint32_t client, uint32_t **ret, uint32_t *ret_n) {
        if (!labels || clients == 0 || client >= clients || nclasses == 0 || !isfinite(alpha))
                return -EINVAL;
        for (uint32_t i = 0; i < n; i++)
                if (labels[i] < 0 || (uint32_t) labels[i] >= nclasses)
                        return -EINVAL;
        uint64_t x = seed ^ 0x5eed0f0edc1e4701ull;
        uint32_t *out = malloc(((size_t) n + 1) * sizeof *out), k = 0;
        if (!out)
                return -ENOMEM;
        if (alpha <= 0) {
                uint32_t *all = malloc(((size_t) n + 1) * sizeof *all);
                if (!all) {
                        free(out);
                        return -ENOMEM;
                }
                for (uint32_t i = 0; i < n; i++)
                        all[i] = i;
                shuffle_u32(all, n, &x);
                for (uint32_t i = client; i < n; i += clients)
                        out[k++] = all[i];
                free(all);
        } else {
                uint32_t *cls = malloc(((size_t) n + 1) * sizeof *cls);
                double *p = malloc((size_t) clients * sizeof *p);
                if (!cls || !p) {
                        free(cls);
                        free(p);
                        free(out);
                        return -ENOMEM;
                }
                for (uint32_t c = 0; c < nclasses; c++) {
                        uint32_t m = 0;
                        for (uint32_t i = 0; i < n; i++)
                                if ((uint32_t) labels[i] == c)
                                        cls[m++] = i;
                        shuffle_u32(cls, m, &x);
                        double sum = 0;
                        for (uint32_t j = 0; j < clients; j++)
                                sum += p[j] = partition_gamma(alpha, &x);
                        /* Client j gets [floor(m P_j), floor(m P_{j+1})) of the class, P the
                         * cumulative proportions: every sample exactly once. */
                        double cum = 0;
                        for (uint32_t j = 0; j < client; j++)
                                cum += p[j];
                        uint32_t lo = (uint32_t) floor((double) m * (cum / sum)),
                                 hi = client + 1 == clients ? m : (uint32_t) floor((double) m * ((cum + p[client]) / sum));
                        for (uint32_t i = lo; i < hi && i < m; i++)
                                out[k++] = cls[i];
                }
                free(cls);
                free(p);
        }
        qsort(out, k, sizeof *out, cmp_u32);
        *ret = out;
        *ret_n = k;
        return 0;
}
