/* SPDX-License-Identifier: Apache-2.0 */
/* Benchmark of a compute backend: the time of one training step of an MLP as
 * workerd runs it (batch upload from page-locked memory, forward, loss, backward,
 * every gradient downloaded into the host buffers the client pushes), or, with
 * --compute-only, as a framework benchmark times it (batch and gradients stay on
 * the device). Prints one line: the median, min and max over the timed steps
 * after warm-up steps, each step ended by a wait for the device, and TFLOP/s
 * counted as 6 x batch x sum(in x out), the count PyTorch's reference script
 * uses (it includes the first layer's input gradient, which neither computes).
 *
 * --model takes widths (784-1024-1024-10) or any model text workerd takes
 * (cnn, vit, mlp:..., a JSON description; common/modeldesc.h); TFLOP/s is
 * printed for the widths only.
 *
 *   bench-kernels [--backend cpu|cuda|auto] [--model 784-1024-1024-10|cnn|vit]
 *                 [--batch 512] [--steps 200] [--tf32] [--no-graphs]
 *                 [--compute-only] [--threads N]
 *
 * The CUDA backend reads PSNET_CUDA_LT=0 to use plain cuBLAS and separate
 * epilogue kernels instead of cuBLASLt's fused epilogues. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"
#include "model.h"

#define WARMUP 10
#define MAX_DIMS 16

#define RNG_SEED 0x2545f4914f6cdd1dull
#include "rng.h"

static double now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

static int parse_dims(const char *s, uint32_t *dims, size_t *nd) {
        char *end;
        *nd = 0;
        for (;;) {
                unsigned long v = strtoul(s, &end, 10);
                if (end == s || v == 0 || v > 1u << 20 || *nd == MAX_DIMS)
                        return -EINVAL;
                dims[(*nd)++] = (uint32_t) v;
                if (*end == '\0')
                        return *nd >= 2 ? 0 : -EINVAL;
                if (*end != '-')
                        return -EINVAL;
                s = end + 1;
        }
}

static void usage(const char *argv0) {
        fprintf(stderr,
                "usage: %s [--backend cpu|cuda|auto] [--model D0-D1-...] [--batch N] [--steps N]\n"
                "       [--tf32] [--no-graphs] [--compute-only] [--threads N]\n",
                argv0);
}

int main(int argc, char **argv) {
        const char *backend = "auto", *model_spec = "784-1024-1024-10";
        int steps = 200, threads = 0, batch = 512;
        bool tf32 = false, graphs = true, transfers = true;
        uint32_t dims[MAX_DIMS];
        size_t nd;
        KBackend *kb = NULL;
        Model *m = NULL;
        float loss = 0;
        double *ms = NULL, med, flops = 0;
        char err[256];
        int correct, r, status = 1;

        for (int i = 1; i < argc; i++) {
                const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (strcmp(a, "--tf32") == 0)
                        tf32 = true;
                else if (strcmp(a, "--no-graphs") == 0)
                        graphs = false;
                else if (strcmp(a, "--compute-only") == 0)
                        transfers = false;
                else if (v && strcmp(a, "--backend") == 0)
                        backend = argv[++i];
                else if (v && strcmp(a, "--model") == 0)
                        model_spec = argv[++i];
                else if (v && strcmp(a, "--batch") == 0)
                        batch = atoi(argv[++i]);
                else if (v && strcmp(a, "--steps") == 0)
                        steps = atoi(argv[++i]);
                else if (v && strcmp(a, "--threads") == 0)
                        threads = atoi(argv[++i]);
                else {
                        usage(argv[0]);
                        return strcmp(a, "--help") == 0 ? 0 : 2;
                }
        }
        bool widths = parse_dims(model_spec, dims, &nd) == 0;
        if (steps < 1 || batch < 1 || threads < 0) {
                usage(argv[0]);
                return 2;
        }
        for (size_t l = 0; widths && l + 1 < nd; l++)
                flops += 6.0 * batch * dims[l] * dims[l + 1];

        r = kbackend_new(backend, threads, &kb, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "bench-kernels: cannot start the %s backend: %s\n", backend, err);
                return 1;
        }
        if (tf32 && (r = kb->ops->set_tf32(kb, true)) < 0) {
                fprintf(stderr, "bench-kernels: --tf32: %s\n", strerror(-r));
                goto out;
        }
        r = widths ? model_new_mlp(kb, dims, nd, batch, &m)
                   : model_new_text(kb, model_spec, batch, &m, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "bench-kernels: model %s: %s\n", model_spec, widths ? strerror(-r) : err);
                goto out;
        }

        /* Uniform(+-sqrt(6 / fan_in)) weights, zero biases (MLP): a realistic
         * loss; other models get small uniform values. */
        for (size_t t = 0; t < model_ntensors(m); t++) {
                float *p = model_param_host(m, t), a = 0.05f;
                if (widths)
                        a = t % 2 == 0 ? sqrtf(6.0f / (float) dims[t / 2]) : 0.0f;
                for (size_t i = 0; i < model_tensor_numel(m, t); i++)
                        p[i] = rng_uniform(-a, a);
        }
        r = model_upload_params(m);
        if (r < 0) {
                fprintf(stderr, "bench-kernels: model_upload_params: %s\n", strerror(-r));
                goto out;
        }
        ms = malloc((size_t) steps * sizeof *ms);
        if (!ms) {
                fprintf(stderr, "bench-kernels: out of memory\n");
                goto out;
        }
        for (size_t i = 0; i < (size_t) batch * model_input_numel(m); i++)
                model_batch_x(m)[i] = rng_uniform(0, 1);
        for (int i = 0; i < batch; i++)
                model_batch_y(m)[i] = (int32_t) (rng_next() % model_classes(m));

        /* One step with transfers puts the batch on the device for --compute-only. */
        r = model_train_step(m, model_batch_x(m), model_batch_y(m), batch, &loss, &correct);
        model_set_options(m, graphs, transfers);
        for (int i = 0; r == 0 && i < WARMUP + steps; i++) {
                double t0 = now_ms();
                float l;
                r = model_train_step(m, model_batch_x(m), model_batch_y(m), batch, &l, &correct);
                if (i >= WARMUP)
                        ms[i - WARMUP] = now_ms() - t0;
                if (transfers)
                        loss = l;
        }
        if (r < 0) {
                fprintf(stderr, "bench-kernels: step: %s\n", strerror(-r));
                goto out;
        }

        qsort(ms, (size_t) steps, sizeof *ms, cmp_double);
        med = steps % 2 ? ms[steps / 2] : (ms[steps / 2 - 1] + ms[steps / 2]) / 2;
        printf("backend=%s model=%s batch=%d tf32=%d graphs=%d transfers=%d lt=%s steps=%d "
               "ms_per_step=%.4f min=%.4f max=%.4f tflops=%.1f loss=%.4f\n",
               kb->ops->name, model_spec, batch, tf32, model_graph_active(m), transfers,
               getenv("PSNET_CUDA_LT") ? getenv("PSNET_CUDA_LT") : "1", steps, med, ms[0],
               ms[steps - 1], flops / (med * 1e9), loss);
        status = 0;

out:
        free(ms);
        model_free(m);
        kbackend_free(kb);
        return status;
}
