/* Micro-benchmark of a compute backend: the time of one model_train_step of the
 * MLP 784-1024-1024-10 at batch 512, as workerd runs it (batch upload, forward,
 * loss, backward, gradient download into the host buffers). Prints the median,
 * min and max over the timed steps, after warm-up steps, and the GFLOP/s of the
 * three GEMMs per layer that dominate a step. Built, never run by the tests.
 *
 *   bench-kernels [cpu|cuda|auto] [STEPS] [THREADS]
 *
 * STEPS: timed steps (default 50); THREADS: OpenBLAS threads for cpu (default 0:
 * OpenBLAS's own choice). Every step ends with a sync of the backend, so device
 * time is counted in full. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"
#include "model.h"

#define BATCH 512
#define WARMUP 5
#define NDIMS 4
static const uint32_t dims[NDIMS] = { 784, 1024, 1024, 10 };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_next(void) {
        uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) {
        return lo + (hi - lo) * (float) ((double) (rng_next() >> 11) / 9007199254740992.0);
}

static double now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

/* Multiply-adds x 2 of one step: per layer, the forward GEMM and the weight
 * gradient; the input gradient for every layer but the first. */
static double step_flops(void) {
        double f = 0;
        for (int l = 0; l + 1 < NDIMS; l++) {
                double mnk = 2.0 * BATCH * dims[l] * dims[l + 1];
                f += (l > 0 ? 3 : 2) * mnk;
        }
        return f;
}

int main(int argc, char **argv) {
        const char *backend = argc > 1 ? argv[1] : "cpu";
        int steps = argc > 2 ? atoi(argv[2]) : 50, threads = argc > 3 ? atoi(argv[3]) : 0;
        KBackend *kb = NULL;
        Model *m = NULL;
        float *x = NULL, loss = 0;
        int32_t *y = NULL;
        double *ms = NULL, med;
        char err[256];
        int correct, r, status = 1;

        if (argc > 4 || steps < 1 || threads < 0) {
                fprintf(stderr, "usage: %s [cpu|cuda|auto] [STEPS >= 1] [THREADS >= 0]\n", argv[0]);
                return 2;
        }
        r = kbackend_new(backend, threads, &kb, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "bench-kernels: cannot start the %s backend: %s\n", backend, err);
                return 1;
        }
        r = model_new(kb, dims, NDIMS, BATCH, &m);
        if (r < 0) {
                fprintf(stderr, "bench-kernels: model_new: %s\n", strerror(-r));
                goto out;
        }

        /* Uniform(+-sqrt(6 / fan_in)) weights, zero biases: a realistic loss. */
        for (size_t t = 0; t < model_ntensors(m); t++) {
                float *p = model_param_host(m, t), a = 0;
                if (t % 2 == 0)
                        a = sqrtf(6.0f / (float) dims[t / 2]);
                for (size_t i = 0; i < model_tensor_numel(m, t); i++)
                        p[i] = t % 2 == 0 ? rng_uniform(-a, a) : 0.0f;
        }
        r = model_upload_params(m);
        if (r < 0) {
                fprintf(stderr, "bench-kernels: model_upload_params: %s\n", strerror(-r));
                goto out;
        }

        x = malloc((size_t) BATCH * dims[0] * sizeof *x);
        y = malloc(BATCH * sizeof *y);
        ms = malloc((size_t) steps * sizeof *ms);
        if (!x || !y || !ms) {
                fprintf(stderr, "bench-kernels: out of memory\n");
                goto out;
        }
        for (size_t i = 0; i < (size_t) BATCH * dims[0]; i++)
                x[i] = rng_uniform(0, 1);
        for (int i = 0; i < BATCH; i++)
                y[i] = (int32_t) (rng_next() % dims[NDIMS - 1]);

        for (int i = 0; i < WARMUP + steps; i++) {
                double t0 = now_ms();
                r = model_train_step(m, x, y, BATCH, &loss, &correct);
                if (r == 0)
                        r = kb->ops->sync(kb);
                if (r < 0) {
                        fprintf(stderr, "bench-kernels: step %d: %s\n", i, strerror(-r));
                        goto out;
                }
                if (i >= WARMUP)
                        ms[i - WARMUP] = now_ms() - t0;
        }

        qsort(ms, (size_t) steps, sizeof *ms, cmp_double);
        med = steps % 2 ? ms[steps / 2] : (ms[steps / 2 - 1] + ms[steps / 2]) / 2;
        printf("backend=%s model=%u-%u-%u-%u batch=%d steps=%d ms_per_step=%.3f min=%.3f max=%.3f "
               "gflops=%.1f loss=%.4f\n",
               kb->ops->name, dims[0], dims[1], dims[2], dims[3], BATCH, steps, med, ms[0],
               ms[steps - 1], step_flops() / (med * 1e6), loss);
        status = 0;

out:
        free(x);
        free(y);
        free(ms);
        model_free(m);
        kbackend_free(kb);
        return status;
}
