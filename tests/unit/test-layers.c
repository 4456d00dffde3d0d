/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the layers (worker/models/layers.c) on the CPU backend, and
 * on the CUDA backend where a GPU is: the gradient of every parameter tensor
 * of small models built from JSON descriptions, against central finite
 * differences of the model's own loss.
 * Each model chains layers so that a wrong input gradient of one layer shows
 * up in the parameter gradients of the layers before it (a conv before a
 * pool, a patch conv before a transformer block, ...).
 *
 * Tolerance: the loss is a float mean over the batch (rounding ~4e-7), so with
 * eps = 1e-3 the finite difference carries ~2e-4 of rounding and O(eps^2) of
 * truncation: |g - fd| <= 2e-3 + 3e-2 |fd|. Where a ReLU or a max flips
 * between p - eps and p + eps, a finite difference means nothing: such an
 * element shows as a disagreement between the differences at eps 1e-2, 3e-3
 * and 1e-3 (beyond 1e-3 + 1%) and is left out; the count is printed and must stay under a tenth of the elements
 * checked. Dropout masks are the same in every evaluation (model_set_seed
 * before each step). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "model.h"
#include "tap.h"

#define RNG_SEED 0x13198a2e03707344ull
#include "rng.h"

#define BATCH 3
#define PER_TENSOR 24

typedef struct {
        const char *what;
        const char *json;
        int vocab; /* > 0: the inputs are token ids below this */
} Case;

static const Case cases[] = {
        { "conv2d+relu (fused), maxpool, flatten of 3 channels, 2-channel NCHW input",
          "{\"input\":[2,6,6],\"layers\":[{\"type\":\"conv2d\",\"out\":3,\"kernel\":3,\"padding\":1},"
          "{\"type\":\"relu\"},{\"type\":\"maxpool\",\"kernel\":2},{\"type\":\"flatten\"},"
          "{\"type\":\"linear\",\"out\":4}]}", 0 },
        { "conv2d stride 2 padding 1, gelu, avgpool with padding, linear",
          "{\"input\":[1,7,7],\"layers\":[{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"stride\":2,\"padding\":1},"
          "{\"type\":\"gelu\"},{\"type\":\"avgpool\",\"kernel\":3,\"stride\":2,\"padding\":1},{\"type\":\"flatten\"},"
          "{\"type\":\"linear\",\"out\":3}]}", 0 },
        { "patch conv, tokens, posembed, transformer block, layernorm, mean, linear (a small ViT)",
          "{\"input\":[1,8,8],\"layers\":[{\"type\":\"conv2d\",\"out\":8,\"kernel\":4,\"stride\":4},"
          "{\"type\":\"tokens\"},{\"type\":\"posembed\"},{\"type\":\"transformer\",\"heads\":2,\"hidden\":12},"
          "{\"type\":\"layernorm\"},{\"type\":\"mean\"},{\"type\":\"linear\",\"out\":3}]}", 0 },
        { "embedding, causal transformer blocks (two), mean, linear",
          "{\"input\":[5],\"layers\":[{\"type\":\"embedding\",\"vocab\":7,\"out\":8},{\"type\":\"posembed\"},"
          "{\"type\":\"transformer\",\"heads\":2,\"hidden\":16,\"causal\":true},"
          "{\"type\":\"transformer\",\"heads\":4,\"hidden\":8,\"causal\":true},"
          "{\"type\":\"mean\"},{\"type\":\"linear\",\"out\":3}]}", 7 },
        { "linear, layernorm, gelu, dropout 0.3, linear",
          "{\"input\":[6],\"layers\":[{\"type\":\"linear\",\"out\":8},{\"type\":\"layernorm\"},{\"type\":\"gelu\"},"
          "{\"type\":\"dropout\",\"p\":0.3},{\"type\":\"linear\",\"out\":3}]}", 0 },
        { "linear on tokens, a relu of its own after layernorm, flatten of tokens, linear",
          "{\"input\":[3,4],\"layers\":[{\"type\":\"linear\",\"out\":5},{\"type\":\"layernorm\"},{\"type\":\"relu\"},"
          "{\"type\":\"flatten\"},{\"type\":\"linear\",\"out\":3}]}", 0 },
};

static float loss_at(Model *m, const float *x, const int32_t *y) {
        float loss = NAN;
        model_set_seed(m, 99);
        if (model_upload_params(m) < 0 || model_train_step(m, x, y, BATCH, &loss, NULL) < 0)
                return NAN;
        return loss;
}

static void run_case(KBackend *kb, const Case *c) {
        char err[256];
        Model *m = NULL;
        size_t in_n, checked = 0, kinks = 0, bad = 0;
        float *x, **grads;
        int32_t y[BATCH];
        double worst = 0;

        if (!CHECK(model_new_text(kb, c->json, BATCH, &m, err, sizeof err) == 0, "%s: %s: builds (%s)", kb->ops->name, c->what, err))
                return;
        in_n = model_input_numel(m);
        x = malloc(BATCH * in_n * sizeof *x);
        grads = calloc(model_ntensors(m), sizeof *grads);
        if (!x || !grads)
                abort();
        for (size_t i = 0; i < BATCH * in_n; i++)
                x[i] = c->vocab > 0 ? (float) (rng_next() % (uint64_t) c->vocab) : rng_uniform(-1, 1);
        for (int i = 0; i < BATCH; i++)
                y[i] = (int32_t) (rng_next() % model_classes(m));
        for (size_t t = 0; t < model_ntensors(m); t++) {
                float *p = model_param_host(m, t);
                size_t n = model_tensor_numel(m, t);
                for (size_t i = 0; i < n; i++)
                        p[i] = rng_uniform(-0.5f, 0.5f);
        }
        float base = loss_at(m, x, y);
        CHECK(isfinite(base), "%s: loss %g is finite", c->what, (double) base);
        for (size_t t = 0; t < model_ntensors(m); t++) {
                size_t n = model_tensor_numel(m, t);
                grads[t] = malloc(n * sizeof **grads);
                if (!grads[t])
                        abort();
                memcpy(grads[t], model_grad_host(m, t), n * sizeof **grads);
        }
        for (size_t t = 0; t < model_ntensors(m); t++) {
                float *p = model_param_host(m, t);
                size_t n = model_tensor_numel(m, t);
                for (int k = 0; k < PER_TENSOR && (size_t) k < n; k++) {
                        size_t i = n <= PER_TENSOR ? (size_t) k : (size_t) (rng_next() % n);
                        float keep = p[i], fd[3];
                        for (int e = 0; e < 3; e++) {
                                const float eps = (const float[]) { 1e-2f, 3e-3f, 1e-3f }[e];
                                p[i] = keep + eps;
                                float lp = loss_at(m, x, y);
                                p[i] = keep - eps;
                                float lm = loss_at(m, x, y);
                                fd[e] = (lp - lm) / (2 * eps);
                        }
                        p[i] = keep;
                        checked++;
                        /* Smooth: the three differences agree to their truncation and rounding. */
                        if (fabsf(fd[0] - fd[1]) > 1e-3f + 0.01f * fabsf(fd[1]) ||
                            fabsf(fd[1] - fd[2]) > 1e-3f + 0.01f * fabsf(fd[1])) {
                                kinks++;
                                continue;
                        }
                        double diff = fabs((double) grads[t][i] - fd[2]);
                        double tol = 2e-3 + 3e-2 * fabs(fd[2]);
                        worst = fmax(worst, diff / tol);
                        if (diff > tol) {
                                bad++;
                                fprintf(stderr, "# %s: tensor %zu element %zu: gradient %g, finite difference %g\n",
                                        c->what, t, i, (double) grads[t][i], (double) fd[2]);
                        }
                }
        }
        CHECK(bad == 0 && checked > 0, "%s: %s: %zu gradients of %zu tensors match finite differences (worst %.2f of the "
              "tolerance; %zu at a kink left out)", kb->ops->name, c->what, checked - kinks, model_ntensors(m), worst, kinks);
        CHECK(kinks * 10 <= checked, "%s: kinks %zu of %zu", c->what, kinks, checked);
        for (size_t t = 0; t < model_ntensors(m); t++)
                free(grads[t]);
        free(grads);
        free(x);
        model_free(m);
}

/* The same batch twice with the same seed gives the same dropout mask; another
 * seed another mask; evaluation uses none. */
static void test_dropout(KBackend *kb) {
        char err[256];
        Model *m = NULL;
        const char *json = "{\"input\":[32],\"layers\":[{\"type\":\"dropout\",\"p\":0.5},{\"type\":\"linear\",\"out\":4}]}";
        float x[2 * 32], l1, l2, l3;
        int32_t y[2] = { 1, 2 };
        double e1, e2;

        if (!CHECK(model_new_text(kb, json, 2, &m, err, sizeof err) == 0, "dropout model builds (%s)", err))
                return;
        for (size_t i = 0; i < 64; i++)
                x[i] = rng_uniform(-1, 1);
        for (size_t i = 0; i < model_tensor_numel(m, 0); i++)
                model_param_host(m, 0)[i] = rng_uniform(-1, 1);
        (void) model_upload_params(m);
        model_set_seed(m, 5);
        CHECK(model_train_step(m, x, y, 2, &l1, NULL) == 0, "step");
        model_set_seed(m, 5);
        CHECK(model_train_step(m, x, y, 2, &l2, NULL) == 0, "step again");
        model_set_seed(m, 6);
        CHECK(model_train_step(m, x, y, 2, &l3, NULL) == 0, "step with another seed");
        CHECK(l1 == l2 && l1 != l3, "same seed same mask (%g = %g), another seed another (%g)", (double) l1, (double) l2,
              (double) l3);
        int r1 = model_evaluate(m, x, y, 2, NULL, &e1), r2 = model_evaluate(m, x, y, 2, NULL, &e2);
        /* The mask zeroes about half of the inputs: the loss without it differs. */
        CHECK(r1 == 0 && r2 == 0 && e1 == e2 && e1 != (double) l1, "evaluation without dropout: %g twice, not %g", e1,
              (double) l1);
        model_free(m);
}

/* Bad token ids and labels are refused before anything runs. */
static void test_refusals(KBackend *kb) {
        char err[256];
        Model *m = NULL;
        const char *json = "{\"input\":[2],\"layers\":[{\"type\":\"embedding\",\"vocab\":4,\"out\":4},"
                           "{\"type\":\"mean\"},{\"type\":\"linear\",\"out\":3}]}";
        int32_t y[1] = { 0 };

        if (!CHECK(model_new_text(kb, json, 1, &m, err, sizeof err) == 0, "embedding model builds (%s)", err))
                return;
        CHECK(model_train_step(m, (float[]) { 1, 4 }, y, 1, NULL, NULL) == -EINVAL, "token id 4 of vocab 4 refused");
        CHECK(model_train_step(m, (float[]) { 1, 1.5f }, y, 1, NULL, NULL) == -EINVAL, "token id 1.5 refused");
        CHECK(model_train_step(m, (float[]) { -1, 0 }, y, 1, NULL, NULL) == -EINVAL, "token id -1 refused");
        CHECK(model_train_step(m, (float[]) { 3, 0 }, (int32_t[]) { 3 }, 1, NULL, NULL) == -EINVAL, "label 3 refused");
        CHECK(model_train_step(m, (float[]) { 3, 0 }, y, 1, NULL, NULL) == 0, "a good batch still trains");
        m = model_free(m);
        CHECK(model_new_text(kb, "{\"input\":[4096,4096],\"layers\":[{\"type\":\"flatten\"},{\"type\":\"linear\","
                             "\"out\":2}]}", 512, &m, err, sizeof err) < 0 && !m,
              "a batch overflowing the kernels' sizes refused: %s", err);
}

static void run_all(KBackend *kb) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                run_case(kb, &cases[i]);
        test_dropout(kb);
        test_refusals(kb);
}

int main(void) {
        char err[256];
        KBackend *kb = NULL;

        if (CHECK(kbackend_new("cpu", 1, &kb, err, sizeof err) == 0, "cpu backend (%s)", err))
                run_all(kb);
        kb = kbackend_free(kb);
        /* The same differences on the GPU: the CUDA layer ops' gradients. */
        if (kbackend_cuda_built() && kbackend_new("cuda", 0, &kb, err, sizeof err) == 0)
                run_all(kb);
        else
                printf("# skipped: cuda backend (%s)\n", kbackend_cuda_built() ? err : "not in this build");
        kbackend_free(kb);
        return tap_done();
}
