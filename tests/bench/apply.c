/* SPDX-License-Identifier: Apache-2.0 */
/* bench-apply: how a shard's update scales with psd --threads. The step psd
 * runs for a push of a whole shard (--mib of values in 1 MiB chunks, one
 * optimizer step per chunk, as store_apply does), timed on 1, 2, 4, ...
 * threads up to --max-threads, beside single-thread memcpy of the same bytes
 * the step reads and writes, measured in the same run. Printed, never
 * pass/fail: one line per optimizer and thread count with the median of
 * --reps whole-shard steps, GB/s of memory traffic (momentum SGD reads w, g, v
 * and writes w, v: 20 B a value; Adam 28 B), the speedup over one thread and
 * the ratio to memcpy (which moves 8 B a value copied).
 *
 * With --dead F, a share F of the values are those of units that stopped
 * learning, as a long run leaves them (common/fpflush.h): gradient 0, first
 * moment (momentum's v, Adam's m) at the smallest denormal, where it stays
 * unless psd flushes it. One more line per optimizer, 1 thread, with the ratio
 * of its time to the live state's (1: denormals cost nothing).
 *
 *   bench-apply [--mib 64] [--max-threads 8] [--reps 15] [--chunk-kib 1024] [--dead F] */
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "alloc.h"
#include "config.h"
#include "pfor.h"
#include "psd-optim.h"

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Value i's gradient in the live state. */
static float live_grad(size_t i) {
        return (float) (i % 777) * 1e-4f - 0.03f;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
        qsort(v, n, sizeof *v, cmp_double);
        return v[n / 2];
}

int main(int argc, char **argv) {
        unsigned mib = 64, max_threads = 8, reps = 15, chunk_kib = 1024;
        float dead = 0.0f;
        const Option opts[] = {
                { "mib", OPT_UINT, &mib, "MIB", "values the shard holds (default 64)" },
                { "max-threads", OPT_UINT, &max_threads, "N", "largest thread count tried (default 8)" },
                { "reps", OPT_UINT, &reps, "N", "whole-shard steps timed per figure, median taken (default 15)" },
                { "chunk-kib", OPT_UINT, &chunk_kib, "KIB", "chunk (key) size (default 1024)" },
                { "dead", OPT_FLOAT, &dead, "F",
                  "also time a state where a share F of the values stopped learning (0 gradient, denormal first "
                  "moment) (default 0: not timed)" },
        };
        const ProgramInfo prog = { .name = "bench-apply", .summary = "psd's update step against --threads",
                                   .usage = "[OPTIONS]" };
        int optind_ = 0, r = config_parse(&prog, opts, sizeof opts / sizeof opts[0], argc, argv, &optind_);
        if (r != 0)
                return r > 0 ? 0 : 2;
        if (mib < 1 || chunk_kib < 1 || reps < 1 || max_threads < 1 || max_threads > PFOR_MAX_THREADS ||
            (uint64_t) chunk_kib > (uint64_t) mib * 1024 || !(dead >= 0.0f && dead <= 1.0f)) {
                fprintf(stderr, "bench-apply: --mib, --chunk-kib, --reps >= 1, --max-threads 1-%d, chunk <= shard, "
                        "--dead 0-1\n", PFOR_MAX_THREADS);
                return 2;
        }
        size_t n = (size_t) mib << 18, chunk = (size_t) chunk_kib << 8;
        float *w = ps_malloc_aligned(n * sizeof *w), *g = ps_malloc_aligned(n * sizeof *g);
        float *state = ps_malloc_aligned(2 * n * sizeof *state), *copy = ps_malloc_aligned(n * sizeof *copy);
        double *t = calloc(reps, sizeof *t);
        if (!w || !g || !state || !copy || !t) {
                fprintf(stderr, "bench-apply: out of memory\n");
                return 1;
        }
        for (size_t i = 0; i < n; i++) {
                w[i] = (float) (i % 1000) * 1e-3f;
                g[i] = live_grad(i);
        }
        memset(state, 0, 2 * n * sizeof *state);
        memcpy(copy, g, n * sizeof *g); /* every page touched before timing */

        for (unsigned k = 0; k < reps; k++) {
                double t0 = now_s();
                memcpy(copy, g, n * sizeof *g);
                t[k] = now_s() - t0;
        }
        double memcpy_gbps = 8.0 * (double) n / median(t, reps) / 1e9;
        printf("# bench-apply: %u MiB of values in %u KiB chunks, %ld CPUs; memcpy (1 thread) %.2f GB/s "
               "(read + written)\n", mib, chunk_kib, sysconf(_SC_NPROCESSORS_ONLN), memcpy_gbps);

        const OptimConf confs[] = {
                { .kind = OPTIM_SGD, .lr = 0.01f, .momentum = 0.9f },
                { .kind = OPTIM_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f },
        };
        const char *names[] = { "sgd-momentum", "adam" };
        const double bytes_per_value[] = { 20.0, 28.0 };
        for (size_t c = 0; c < 2; c++) {
                double one = 0.0;
                for (unsigned threads = 1; threads <= max_threads; threads *= 2) {
                        Pfor *pool = NULL;
                        if ((r = pfor_new(threads, &pool)) < 0) {
                                fprintf(stderr, "bench-apply: %u threads: %s\n", threads, strerror(-r));
                                return 1;
                        }
                        uint64_t step = 1;
                        for (unsigned k = 0; k <= reps; k++) {
                                double t0 = now_s();
                                for (size_t at = 0; at < n; at += chunk) {
                                        size_t len = n - at < chunk ? n - at : chunk;
                                        optim_apply_par(pool, &confs[c], step, w + at, g + at, 1.0f, state + 2 * at, len);
                                }
                                step++;
                                if (k > 0) /* the first is a warm-up */
                                        t[k - 1] = now_s() - t0;
                        }
                        pool = pfor_free(pool);
                        double s = median(t, reps), gbps = bytes_per_value[c] * (double) n / s / 1e9;
                        if (threads == 1)
                                one = s;
                        printf("apply optimizer=%s threads=%u ms=%.2f gbps=%.2f speedup=%.2f memcpy_gbps=%.2f "
                               "memcpy_ratio=%.2f\n", names[c], threads, s * 1e3, gbps, one / s, memcpy_gbps,
                               gbps / memcpy_gbps);
                        fflush(stdout);
                }
                if (dead > 0.0f) {
                        /* Every rep starts from the dead state again: a flushed
                         * moment would otherwise be 0 from the second on. */
                        for (unsigned k = 0; k <= reps; k++) {
                                for (size_t i = 0; i < n; i++) {
                                        bool d = (size_t) ((double) (i + 1) * dead) > (size_t) ((double) i * dead);
                                        g[i] = d ? 0.0f : live_grad(i);
                                        state[2 * (i / chunk * chunk) + i % chunk] = d ? FLT_TRUE_MIN : 1e-3f;
                                }
                                double t0 = now_s();
                                for (size_t at = 0; at < n; at += chunk) {
                                        size_t len = n - at < chunk ? n - at : chunk;
                                        optim_apply_par(NULL, &confs[c], 100, w + at, g + at, 1.0f, state + 2 * at, len);
                                }
                                if (k > 0)
                                        t[k - 1] = now_s() - t0;
                        }
                        double s = median(t, reps);
                        printf("apply optimizer=%s threads=1 dead=%.2f ms=%.2f dead_over_live=%.2f\n", names[c],
                               (double) dead, s * 1e3, s / one);
                        fflush(stdout);
                        for (size_t i = 0; i < n; i++) /* the next optimizer's live state as before */
                                g[i] = live_grad(i);
                        memset(state, 0, 2 * n * sizeof *state);
                }
        }
        ps_free(w);
        ps_free(g);
        ps_free(state);
        ps_free(copy);
        free(t);
        return 0;
}
