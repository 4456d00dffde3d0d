/* SPDX-License-Identifier: Apache-2.0 */
/* A sparse table's store on one shard (ps/psd/psd-table.c), printed, never
 * pass/fail, each figure beside its baseline from the same run:
 *   memory: bytes held per row against the row's own bytes (values and
 *     Adagrad's state) once 2 million rows are in (target: <= 1.15);
 *   speed: rows per second of a pull (create on first touch) and of a push
 *     (Adagrad) of batches of 4,096 x 26 ids drawn Zipf(1.1) over 10^5 ids per
 *     field, deduplicated, against the same gather and the same Adagrad
 *     scatter on a dense array indexed by rank (the limit: no lookup at all).
 *   build-dir/tests/bench-table [--dim D] [--batches N] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "psd-table.h"

#define FIELDS 26
#define BATCH 4096
#define VOCAB 100000

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static double uniform(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return (double) (rng >> 11) * 0x1p-53;
}

static int cmp_i64(const void *a, const void *b) {
        int64_t x = *(const int64_t *) a, y = *(const int64_t *) b;
        return (x > y) - (x < y);
}

int main(int argc, char **argv) {
        unsigned dim = 16, batches = 40;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--dim") && i + 1 < argc)
                        dim = (unsigned) atoi(argv[++i]);
                else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
                        batches = (unsigned) atoi(argv[++i]);
                else {
                        fprintf(stderr, "usage: bench-table [--dim D] [--batches N]\n");
                        return 2;
                }
        }
        TableConf c = { .name = "bench", .dim = dim, .optim = TABLE_ADAGRAD, .lr = 0.01f, .eps = 1e-8f, .init_scale = 0.01f, .seed = 1 };
        char why[160];
        Table *t = NULL;
        if (table_new(&c, &t, why, sizeof why) < 0) {
                fprintf(stderr, "bench-table: %s\n", why);
                return 1;
        }
        /* Memory: 2 million rows. */
        enum { FILL = 2000000 };
        int64_t *ids = malloc(BATCH * FIELDS * sizeof *ids);
        float *rows = malloc((size_t) BATCH * FIELDS * dim * sizeof *rows);
        double *cdf = malloc(VOCAB * sizeof *cdf);
        float *dense = calloc((size_t) VOCAB * FIELDS * dim * 2, sizeof *dense); /* values and sums, by rank */
        if (!ids || !rows || !cdf || !dense) {
                fprintf(stderr, "bench-table: out of memory\n");
                return 1;
        }
        for (int64_t s = 0; s < FILL; s += BATCH) {
                for (int i = 0; i < BATCH; i++)
                        ids[i] = (s + i) * 2654435761ll;
                if (table_pull(t, ids, BATCH, true, rows, why, sizeof why) < 0) {
                        fprintf(stderr, "bench-table: %s\n", why);
                        return 1;
                }
        }
        double row_bytes = (double) dim * 2 * sizeof(float);
        double per_row = (double) table_memory(t) / (double) table_size(t);
        printf("memory: dim %u, %zu rows, %.1f bytes a row against its own %.0f: %.3f (target <= 1.15)\n", dim,
               table_size(t), per_row, row_bytes, per_row / row_bytes);
        t = table_free(t);

        /* Speed: Zipf(1.1) ranks by the inverse of the cumulative weights. */
        double h = 0;
        for (int k = 0; k < VOCAB; k++)
                cdf[k] = (h += pow(k + 1, -1.1));
        if (table_new(&c, &t, why, sizeof why) < 0)
                return 1;
        double t_pull = 0, t_push = 0, t_gather = 0, t_scatter = 0, nrows = 0;
        int64_t *rank = malloc(BATCH * FIELDS * sizeof *rank);
        for (unsigned b = 0; b < batches && rank; b++) {
                for (int i = 0; i < BATCH * FIELDS; i++) {
                        double u = uniform() * h;
                        size_t lo = 0, hi = VOCAB - 1;
                        while (lo < hi) {
                                size_t mid = (lo + hi) / 2;
                                if (cdf[mid] < u)
                                        lo = mid + 1;
                                else
                                        hi = mid;
                        }
                        rank[i] = (int64_t) (i % FIELDS) * VOCAB + (int64_t) lo; /* field, rank */
                }
                qsort(rank, BATCH * FIELDS, sizeof *rank, cmp_i64);
                size_t n = 0;
                for (size_t i = 0; i < BATCH * FIELDS; i++)
                        if (i == 0 || rank[i] != rank[i - 1])
                                rank[n++] = rank[i];
                for (size_t i = 0; i < n; i++)
                        ids[i] = rank[i] * 2654435761ll + 12345; /* ids spread as real ones are */
                nrows += (double) n;
                double s = now_s();
                if (table_pull(t, ids, n, true, rows, why, sizeof why) < 0)
                        return 1;
                t_pull += now_s() - s;
                for (size_t i = 0; i < n * dim; i++)
                        rows[i] *= 0.5f; /* a gradient */
                s = now_s();
                if (table_push(t, ids, n, rows, why, sizeof why) < 0)
                        return 1;
                t_push += now_s() - s;
                /* The limit: the same rows by rank in a dense array. */
                s = now_s();
                for (size_t i = 0; i < n; i++)
                        memcpy(rows + i * dim, dense + (size_t) rank[i] * dim * 2, dim * sizeof *rows);
                t_gather += now_s() - s;
                s = now_s();
                for (size_t i = 0; i < n; i++) {
                        float *w = dense + (size_t) rank[i] * dim * 2, *a = w + dim;
                        const float *g = rows + i * dim;
                        for (unsigned j = 0; j < dim; j++) {
                                a[j] += g[j] * g[j];
                                w[j] -= c.lr * g[j] / (sqrtf(a[j]) + c.eps);
                        }
                }
                t_scatter += now_s() - s;
        }
        printf("speed: dim %u, %u batches of %d x %d Zipf(1.1) ids, %.0f distinct rows a batch, %zu rows in the end\n",
               dim, batches, BATCH, FIELDS, nrows / batches, table_size(t));
        printf("  pull: %.2f M rows/s (the dense gather: %.2f M rows/s): %.3f of the limit\n", nrows / t_pull / 1e6,
               nrows / t_gather / 1e6, t_gather / t_pull);
        printf("  push: %.2f M rows/s (the dense Adagrad scatter: %.2f M rows/s): %.3f of the limit\n",
               nrows / t_push / 1e6, nrows / t_scatter / 1e6, t_scatter / t_push);
        table_free(t);
        free(ids);
        free(rows);
        free(cdf);
        free(dense);
        free(rank);
        return 0;
}
