/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/model.c on every backend this machine can run: the loss,
 * predictions and gradients of a small MLP (7-5-4-3, batch 6) against an
 * independent double-precision forward pass and central finite differences of
 * it, then finite differences of the model's own float loss; model_evaluate in
 * slices; a few SGD steps on a separable problem; rejected arguments; steps on
 * the caller's host buffers (two sets of params in turn) as on the model's own.
 *
 * Tolerances: float forward passes of this size are good to ~1e-6, so losses are
 * compared at 1e-5 relative. Gradients against double central differences with
 * eps = 1e-3 (truncation ~eps^2 ~ 1e-6): |g - fd| <= 1e-2 |fd| + 1e-5. Against
 * central differences of the float loss with eps = 1e-2 (float rounding of the
 * loss ~1e-7 / eps = 1e-5, truncation ~1e-4): |g - fd| <= 2e-2 |fd| + 3e-4.
 * Finite differences are only meaningful where no ReLU flips between p - eps
 * and p + eps; the reference detects such parameters and they are left out
 * (the count is printed and must stay small). */
#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "model.h"
#include "tap.h"

#define NL 3
#define NT (2 * NL)
#define BATCH 6
#define MAXB 8
#define WMAX 7
static const uint32_t dims[NL + 1] = { 7, 5, 4, 3 };

#define RNG_SEED 0x243f6a8885a308d3ull
#include "rng.h"

static size_t tensor_numel(size_t t) {
        size_t l = t / 2;
        return t % 2 == 0 ? (size_t) dims[l + 1] * dims[l] : dims[l + 1];
}

/* The reference: mean softmax cross-entropy of the MLP in double, written from
 * the definition (y = x W^T + b, ReLU between layers). pattern, if given, gets
 * the on/off state of every hidden unit of every sample. */
static double ref_forward(double *const p[NT], const float *x, const int32_t *y, int n,
                          int *ret_correct, unsigned char *pattern) {
        double total = 0;
        int correct = 0, np = 0;

        for (int s = 0; s < n; s++) {
                double a[WMAX], z[WMAX], mx, sum = 0;
                int best = 0;

                for (uint32_t i = 0; i < dims[0]; i++)
                        a[i] = x[(size_t) s * dims[0] + i];
                for (int l = 0; l < NL; l++) {
                        const double *w = p[2 * l], *b = p[2 * l + 1];
                        for (uint32_t o = 0; o < dims[l + 1]; o++) {
                                z[o] = b[o];
                                for (uint32_t i = 0; i < dims[l]; i++)
                                        z[o] += a[i] * w[(size_t) o * dims[l] + i];
                        }
                        for (uint32_t o = 0; o < dims[l + 1]; o++) {
                                if (l + 1 < NL) {
                                        if (pattern)
                                                pattern[np++] = z[o] > 0;
                                        a[o] = z[o] > 0 ? z[o] : 0;
                                } else {
                                        a[o] = z[o];
                                }
                        }
                }
                mx = a[0];
                for (uint32_t c = 1; c < dims[NL]; c++) {
                        mx = fmax(mx, a[c]);
                        if (a[c] > a[best])
                                best = (int) c;
                }
                for (uint32_t c = 0; c < dims[NL]; c++)
                        sum += exp(a[c] - mx);
                total += mx + log(sum) - a[y[s]];
                correct += best == y[s];
        }
        if (ret_correct)
                *ret_correct = correct;
        return total / n;
}

/* Double copies of the model's host params. */
static void params_to_double(Model *m, double *p[NT]) {
        for (size_t t = 0; t < NT; t++)
                for (size_t i = 0; i < tensor_numel(t); i++)
                        p[t][i] = model_param_host(m, t)[i];
}

static void init_params(Model *m) {
        for (size_t t = 0; t < NT; t++) {
                float r = t % 2 == 0 ? 0.9f : 0.3f;
                for (size_t i = 0; i < model_tensor_numel(m, t); i++)
                        model_param_host(m, t)[i] = rng_uniform(-r, r);
        }
}

static void test_shapes(Model *m) {
        bool ok = model_ntensors(m) == NT;
        for (size_t t = 0; t < NT; t++)
                ok = ok && model_tensor_numel(m, t) == tensor_numel(t) && model_param_host(m, t) &&
                     model_grad_host(m, t);
        CHECK(ok, "6 tensors of 35, 5, 20, 4, 12, 3 floats");
        CHECK(model_tensor_numel(m, NT) == 0 && model_param_host(m, NT) == NULL &&
              model_grad_host(m, NT) == NULL, "tensor index out of range gives 0 / NULL");
}

static void test_gradients(KBackend *kb) {
        const char *name = kb->ops->name;
        static float x[BATCH * 7];
        int32_t y[BATCH];
        double pd[NT][35], *p[NT];
        unsigned char pat0[BATCH * 9], pat1[BATCH * 9], pat2[BATCH * 9];
        Model *m = NULL;
        float loss = 0;
        int correct = -1, ref_correct, r;
        double ref;

        for (size_t t = 0; t < NT; t++)
                p[t] = pd[t];
        if (!CHECK(model_new_mlp(kb, dims, NL + 1, MAXB, &m) == 0, "%s: model_new 7-5-4-3", name))
                return;
        test_shapes(m);
        init_params(m);
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
                x[i] = rng_uniform(-1, 1);
        for (int s = 0; s < BATCH; s++)
                y[s] = (int32_t) (rng_next() % 3);
        params_to_double(m, p);
        ref = ref_forward(p, x, y, BATCH, &ref_correct, pat0);

        r = model_upload_params(m);
        r = r < 0 ? r : model_train_step(m, x, y, BATCH, &loss, &correct);
        CHECK(r == 0, "%s: model_train_step (r=%d)", name, r);
        CHECK_CLOSE(loss, ref, 1e-5, "%s: train_step loss %.7f vs reference %.7f", name, loss, ref);
        CHECK(correct == ref_correct, "%s: train_step correct %d vs reference %d", name, correct,
              ref_correct);

        /* Against double central differences. */
        for (size_t t = 0; t < NT; t++) {
                const double eps = 1e-3;
                double worst = 0;
                int skipped = 0;
                bool ok = true;
                for (size_t i = 0; i < tensor_numel(t); i++) {
                        double save = p[t][i], lp, lm, fd, g = model_grad_host(m, t)[i];
                        p[t][i] = save + eps;
                        lp = ref_forward(p, x, y, BATCH, NULL, pat1);
                        p[t][i] = save - eps;
                        lm = ref_forward(p, x, y, BATCH, NULL, pat2);
                        p[t][i] = save;
                        if (memcmp(pat0, pat1, sizeof pat0) || memcmp(pat0, pat2, sizeof pat0)) {
                                skipped++;
                                continue;
                        }
                        fd = (lp - lm) / (2 * eps);
                        if (!(fabs(g - fd) <= 1e-2 * fabs(fd) + 1e-5))
                                ok = false;
                        worst = fmax(worst, fabs(g - fd) / (fabs(fd) + 1e-5));
                }
                CHECK(ok && skipped <= (int) tensor_numel(t) / 4,
                      "%s: grad of tensor %zu vs double finite differences (worst rel %.1e, %d at a ReLU kink)",
                      name, t, worst, skipped);
        }

        /* Against central differences of the model's own float loss. */
        for (size_t t = 0; t < NT; t++) {
                const float eps = 1e-2f;
                float *ph = model_param_host(m, t);
                double worst = 0;
                int skipped = 0;
                bool ok = true;
                for (size_t i = 0; i < tensor_numel(t); i++) {
                        float save = ph[i];
                        double lp = 0, lm = 0, fd, g = model_grad_host(m, t)[i];
                        ph[i] = save + eps;
                        r = model_upload_params(m);
                        r = r < 0 ? r : model_evaluate(m, x, y, BATCH, NULL, &lp);
                        p[t][i] = ph[i];
                        (void) ref_forward(p, x, y, BATCH, NULL, pat1);
                        ph[i] = save - eps;
                        r = r < 0 ? r : model_upload_params(m);
                        r = r < 0 ? r : model_evaluate(m, x, y, BATCH, NULL, &lm);
                        p[t][i] = ph[i];
                        (void) ref_forward(p, x, y, BATCH, NULL, pat2);
                        ph[i] = save;
                        p[t][i] = save;
                        if (r < 0) {
                                ok = false;
                                break;
                        }
                        if (memcmp(pat0, pat1, sizeof pat0) || memcmp(pat0, pat2, sizeof pat0)) {
                                skipped++;
                                continue;
                        }
                        fd = (lp - lm) / (2.0 * (double) eps);
                        if (!(fabs(g - fd) <= 2e-2 * fabs(fd) + 3e-4))
                                ok = false;
                        worst = fmax(worst, fabs(g - fd) / (fabs(fd) + 3e-4));
                }
                CHECK(ok && skipped <= (int) tensor_numel(t) / 4,
                      "%s: grad of tensor %zu vs float finite differences (worst rel %.1e, %d at a ReLU kink)",
                      name, t, worst, skipped);
        }
        CHECK(model_upload_params(m) == 0, "%s: restore params", name);

        /* Rejected arguments; the int labels must lie in [0, classes). */
        CHECK(model_train_step(m, x, y, 0, &loss, &correct) == -EINVAL, "%s: batch 0 rejected", name);
        CHECK(model_train_step(m, x, y, MAXB + 1, &loss, &correct) == -EINVAL,
              "%s: batch > max_batch rejected", name);
        y[2] = 3;
        CHECK(model_train_step(m, x, y, BATCH, &loss, &correct) == -EINVAL, "%s: label 3 of 3 classes rejected", name);
        y[2] = -1;
        CHECK(model_evaluate(m, x, y, BATCH, NULL, NULL) == -EINVAL, "%s: evaluate label -1 rejected", name);
        model_free(m);
}

static void test_evaluate(KBackend *kb) {
        enum { N = 13 };
        const char *name = kb->ops->name;
        float x[N * 7];
        int32_t y[N];
        double pd[NT][35], *p[NT], ref, loss8 = -1, loss4 = -1, loss0 = -1;
        size_t correct8 = 0, correct4 = 0, correct0 = 1;
        Model *m8 = NULL, *m4 = NULL;
        int ref_correct, r8, r4;

        for (size_t t = 0; t < NT; t++)
                p[t] = pd[t];
        if (!CHECK(model_new_mlp(kb, dims, NL + 1, 8, &m8) == 0 && model_new_mlp(kb, dims, NL + 1, 4, &m4) == 0,
                   "%s: two models, max_batch 8 and 4", name)) {
                model_free(m8);
                model_free(m4);
                return;
        }
        init_params(m8);
        for (size_t t = 0; t < NT; t++)
                memcpy(model_param_host(m4, t), model_param_host(m8, t), tensor_numel(t) * sizeof(float));
        for (size_t i = 0; i < N * 7; i++)
                x[i] = rng_uniform(-1, 1);
        for (int s = 0; s < N; s++)
                y[s] = (int32_t) (rng_next() % 3);
        params_to_double(m8, p);
        ref = ref_forward(p, x, y, N, &ref_correct, NULL);

        r8 = model_upload_params(m8);
        r8 = r8 < 0 ? r8 : model_evaluate(m8, x, y, N, &correct8, &loss8);
        r4 = model_upload_params(m4);
        r4 = r4 < 0 ? r4 : model_evaluate(m4, x, y, N, &correct4, &loss4);
        CHECK(r8 == 0 && correct8 == (size_t) ref_correct && fabs(loss8 - ref) <= 1e-5 * fmax(1, ref),
              "%s: evaluate 13 samples in slices of 8: %zu correct (ref %d), loss %.6f (ref %.6f)", name,
              correct8, ref_correct, loss8, ref);
        CHECK(r4 == 0 && correct4 == (size_t) ref_correct && fabs(loss4 - ref) <= 1e-5 * fmax(1, ref),
              "%s: evaluate 13 samples in slices of 4: %zu correct (ref %d), loss %.6f (ref %.6f)", name,
              correct4, ref_correct, loss4, ref);
        CHECK(model_evaluate(m4, x, y, 0, &correct0, &loss0) == 0 && correct0 == 0 && loss0 == 0.0,
              "%s: evaluate 0 samples: 0 correct, loss 0", name);
        model_free(m8);
        model_free(m4);
}

/* Three well separated classes: plain SGD on the host (as a worker applies
 * pulled params) must drive the loss down and classify all of them. */
static void test_sgd(KBackend *kb) {
        const char *name = kb->ops->name;
        float x[MAXB * 7];
        int32_t y[MAXB];
        float loss0 = 0, loss5 = 0, loss = 0;
        int correct = 0, r = 0;
        Model *m = NULL;

        if (!CHECK(model_new_mlp(kb, dims, NL + 1, MAXB, &m) == 0, "%s: model for SGD", name))
                return;
        for (size_t t = 0; t < NT; t++)
                for (size_t i = 0; i < tensor_numel(t); i++)
                        model_param_host(m, t)[i] = t % 2 ? 0.1f : rng_uniform(-0.6f, 0.6f);
        for (int s = 0; s < MAXB; s++) {
                y[s] = s % 3;
                for (int i = 0; i < 7; i++)
                        x[s * 7 + i] = (i == 2 * y[s] ? 2.0f : 0.0f) + rng_uniform(-0.1f, 0.1f);
        }
        for (int step = 0; step <= 60 && r == 0; step++) {
                r = model_upload_params(m);
                r = r < 0 ? r : model_train_step(m, x, y, MAXB, &loss, &correct);
                if (step == 0)
                        loss0 = loss;
                if (step == 5)
                        loss5 = loss;
                for (size_t t = 0; t < NT && r == 0; t++)
                        for (size_t i = 0; i < tensor_numel(t); i++)
                                model_param_host(m, t)[i] -= 0.3f * model_grad_host(m, t)[i];
        }
        CHECK(r == 0 && loss5 < loss0, "%s: loss falls in 5 SGD steps: %.4f -> %.4f", name, loss0, loss5);
        CHECK(r == 0 && loss < 0.25f * loss0 && correct == MAXB,
              "%s: after 60 steps loss %.4f (from %.4f), %d of %d correct", name, loss, loss0, correct,
              MAXB);
        model_free(m);
}

static void test_new_rejects(KBackend *kb) {
        Model *m = NULL;
        CHECK(model_new_mlp(kb, dims, 1, 4, &m) == -EINVAL && !m, "model_new with one width rejected");
        CHECK(model_new_mlp(kb, (uint32_t[]) { 7, 0, 3 }, 3, 4, &m) == -EINVAL && !m,
              "model_new with a zero width rejected");
        CHECK(model_new_mlp(kb, dims, NL + 1, 0, &m) == -EINVAL && !m, "model_new max_batch 0 rejected");
        CHECK(model_new_mlp(NULL, dims, NL + 1, 4, &m) == -EINVAL && !m, "model_new without backend rejected");
        CHECK(model_free(NULL) == NULL, "model_free(NULL) is safe");
}

/* Relative 2-norm difference of every gradient of a and b. */
/* ||a - b|| / ||b|| over tensors [from, to) of the two models' gradients. */
static double grad_diff_of(Model *a, Model *b, size_t from, size_t to) {
        double num = 0, den = 0;
        for (size_t t = from; t < to; t++)
                for (size_t i = 0; i < model_tensor_numel(a, t); i++) {
                        double d = (double) model_grad_host(a, t)[i] - model_grad_host(b, t)[i];
                        num += d * d;
                        den += (double) model_grad_host(b, t)[i] * model_grad_host(b, t)[i];
                }
        return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double grad_diff(Model *a, Model *b) {
        return grad_diff_of(a, b, 0, model_ntensors(a));
}

/* A model stepped as a captured graph (where the backend captures) against the
 * same model run op by op: new batches and new params every step must reach the
 * replayed graph. Both run the same kernels, so they agree to the last bit;
 * the check allows 1e-6 so that a backend may pick another algorithm per call.
 * Then the split step (begin, wait per tensor in backward order, end), and TF32
 * (where the backend has it) against fp32: the loss and the last layer's
 * gradients within 5e-3 (TF32 products round at 2^-11), every gradient within
 * 0.15. The earlier layers' gradients pass ReLUs whose inputs TF32 moves by
 * ~1e-2: a unit near 0 switches on or off, which changes its gradient whole
 * (the H100 measured 8.5e-2 over all tensors for this model, 5e-4 for the last
 * layer's). */
static void test_graph(KBackend *kb) {
        static const uint32_t wide[] = { 784, 64, 32, 10 };
        enum { B = 32 };
        const char *name = kb->ops->name;
        Model *g = NULL, *d = NULL;
        float *x = malloc(B * 784 * sizeof(float)), loss_g = 0, loss_d = 0;
        int32_t y[B];
        int cg = 0, cd = 0, r = 0;
        double worst = 0;

        if (!x || !CHECK(model_new_mlp(kb, wide, 4, B, &g) == 0 && model_new_mlp(kb, wide, 4, B, &d) == 0,
                         "%s: two 784-64-32-10 models", name))
                goto out;
        model_set_options(d, false, true);
        for (int step = 0; step < 4 && r == 0; step++) {
                for (size_t t = 0; t < model_ntensors(g); t++)
                        for (size_t i = 0; i < model_tensor_numel(g, t); i++)
                                model_param_host(g, t)[i] = model_param_host(d, t)[i] = rng_uniform(-0.2f, 0.2f);
                for (int i = 0; i < B * 784; i++)
                        x[i] = rng_uniform(0, 1);
                for (int i = 0; i < B; i++)
                        y[i] = (int32_t) (rng_next() % 10);
                /* g is fed through its own batch buffers, d from the caller's. */
                memcpy(model_batch_x(g), x, B * 784 * sizeof(float));
                memcpy(model_batch_y(g), y, sizeof y);
                r = model_upload_params(g);
                r = r < 0 ? r : model_upload_params(d);
                r = r < 0 ? r : model_train_step(g, model_batch_x(g), model_batch_y(g), B, &loss_g, &cg);
                r = r < 0 ? r : model_train_step(d, x, y, B, &loss_d, &cd);
                worst = fmax(worst, grad_diff(g, d));
                if (r == 0 && (fabs(loss_g - loss_d) > 1e-6 * fabs(loss_d) || cg != cd))
                        r = -EDOM;
        }
        CHECK(r == 0 && worst <= 1e-6, "%s: 4 graph steps (new params, new batch) = direct steps "
              "(r=%d, loss %.6f/%.6f, worst rel grad diff %.1e)", name, r, loss_g, loss_d, worst);
        CHECK(model_graph_active(g) == (strcmp(name, "cpu") != 0) && !model_graph_active(d),
              "%s: graph in use: %d (only where the backend captures), op-by-op model: %d", name,
              model_graph_active(g), model_graph_active(d));

        /* The split step gives the same gradients, each ready when waited for. */
        r = model_step_begin(g, x, y, B);
        CHECK(r == 0 && model_step_begin(g, x, y, B) == -EINVAL, "%s: step_begin, and a second one refused", name);
        for (size_t t = model_ntensors(g); r == 0 && t-- > 0;)
                r = model_grad_wait(g, t);
        r = r < 0 ? r : model_step_end(g, &loss_g, &cg);
        CHECK(r == 0 && grad_diff(g, d) <= 1e-6 && model_step_end(g, NULL, NULL) == -EINVAL,
              "%s: step_begin, grad_wait per tensor, step_end: same gradients; end without begin refused", name);

        if (kb->ops->set_tf32(kb, true) == 0) {
                Model *t = NULL;
                if (CHECK(model_new_mlp(kb, wide, 4, B, &t) == 0, "%s: tf32 model", name)) {
                        float loss_t = 0;
                        int ct = 0;
                        for (size_t k = 0; k < model_ntensors(t); k++)
                                memcpy(model_param_host(t, k), model_param_host(d, k),
                                       model_tensor_numel(t, k) * sizeof(float));
                        r = model_upload_params(t);
                        r = r < 0 ? r : model_train_step(t, x, y, B, &loss_t, &ct);
                        double diff = grad_diff(t, d), last = grad_diff_of(t, d, model_ntensors(t) - 2,
                                                                          model_ntensors(t));
                        CHECK(r == 0 && last <= 5e-3 && diff <= 0.15 && fabs(loss_t - loss_d) <= 5e-3 * fabs(loss_d),
                              "%s: tf32 step against fp32: loss %.6f vs %.6f, last layer's gradients %.1e <= 5e-3, "
                              "all %.1e <= 0.15", name, loss_t, loss_d, last, diff);
                }
                model_free(t);
                CHECK(kb->ops->set_tf32(kb, false) == 0, "%s: tf32 off", name);
        }
out:
        model_free(g);
        model_free(d);
        free(x);
}

/* A model on the caller's host buffers (model_lend_host), stepped on two sets
 * of params in turn as workerd does with --prefetch on (model_upload_params_from
 * each), against a model on its own buffers given the same values: the same
 * gradients, in the caller's buffers, and the same evaluation, to the last bit
 * (the same kernels on the same values). On the CPU backend the lent model
 * computes where the caller's buffers lie (host_memory): a set it was not
 * pointed at last must not be what it computes on. */
static void test_lent(KBackend *kb) {
        enum { B = 8, SETS = 2 };
        const char *name = kb->ops->name;
        Model *a = NULL, *b = NULL;
        float *par[SETS][NT] = { { NULL } }, *grd[NT] = { NULL };
        float x[B * 7], la = 0, lb = 0;
        double ea = 0, eb = 0;
        int32_t y[B];
        int ca = 0, cb = 0, r = 0, bad = 0;
        bool ok = CHECK(model_new_mlp(kb, dims, NL + 1, B, &a) == 0 && model_new_mlp(kb, dims, NL + 1, B, &b) == 0,
                        "%s: two models for lent buffers", name);
        for (size_t t = 0; ok && t < NT; t++) {
                size_t bytes = tensor_numel(t) * sizeof(float);
                ok = kb->ops->host_alloc(kb, bytes, (void **) &par[0][t]) == 0 &&
                     kb->ops->host_alloc(kb, bytes, (void **) &par[1][t]) == 0 &&
                     kb->ops->host_alloc(kb, bytes, (void **) &grd[t]) == 0;
        }
        if (!ok || !CHECK(model_lend_host(a, par[0], grd) == 0, "%s: model_lend_host", name))
                goto out;
        for (int step = 0; step < 4 && r == 0; step++) {
                float *const *set = par[step % SETS];
                for (size_t t = 0; t < NT; t++)
                        for (size_t i = 0; i < tensor_numel(t); i++)
                                set[t][i] = model_param_host(b, t)[i] = rng_uniform(-0.6f, 0.6f);
                for (int i = 0; i < B * 7; i++)
                        x[i] = rng_uniform(-1, 1);
                for (int i = 0; i < B; i++)
                        y[i] = (int32_t) (rng_next() % 3);
                r = model_upload_params_from(a, set);
                r = r < 0 ? r : model_upload_params(b);
                r = r < 0 ? r : model_train_step(a, x, y, B, &la, &ca);
                r = r < 0 ? r : model_train_step(b, x, y, B, &lb, &cb);
                for (size_t t = 0; r == 0 && t < NT; t++)
                        bad += model_grad_host(a, t) != grd[t] ||
                               memcmp(grd[t], model_grad_host(b, t), tensor_numel(t) * sizeof(float)) != 0;
                bad += la != lb || ca != cb;
        }
        r = r < 0 ? r : model_evaluate(a, x, y, B, NULL, &ea);
        r = r < 0 ? r : model_evaluate(b, x, y, B, NULL, &eb);
        CHECK(r == 0 && bad == 0 && ea == eb,
              "%s: 4 steps on two lent sets of params in turn = steps on the model's own buffers, gradients in "
              "the lent ones; the same evaluation (r=%d, %d differences, %.6f/%.6f)", name, r, bad, ea, eb);
out:
        model_free(a);
        model_free(b);
        for (size_t t = 0; t < NT; t++) {
                if (par[0][t])
                        kb->ops->host_free(kb, par[0][t]);
                if (par[1][t])
                        kb->ops->host_free(kb, par[1][t]);
                if (grd[t])
                        kb->ops->host_free(kb, grd[t]);
        }
}

static void test_backend(KBackend *kb) {
        test_gradients(kb);
        test_evaluate(kb);
        test_sgd(kb);
        test_graph(kb);
        test_lent(kb);
}

int main(void) {
        KBackend *kb = NULL;
        char err[256];

        if (CHECK(kbackend_new("cpu", 1, &kb, err, sizeof err) == 0, "cpu backend: %s", err)) {
                test_new_rejects(kb);
                test_backend(kb);
        }
        kb = kbackend_free(kb);

        if (kbackend_cuda_built() && kbackend_new("cuda", 0, &kb, err, sizeof err) == 0)
                test_backend(kb);
        else
                printf("# skipped: cuda backend (%s)\n", kbackend_cuda_built() ? err : "not in this build");
        kb = kbackend_free(kb);

        return tap_done();
}
