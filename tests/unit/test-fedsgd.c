/* SPDX-License-Identifier: Apache-2.0 */
/* FedAvg with every client sampled and one local step of full-batch gradient
 * descent is one synchronous SGD step on the union of their data (issue
 * "Federated edge workers"): three clients of 5, 9 and 2 examples each take
 * one step of lr on their whole share from the same weights, with the edge
 * worker's step (fed_client_step) on the model's gradients (the CPU backend);
 * FedAvg (fed_aggregate, as the shards run it) over their deltas weighted by
 * examples must give the weights that one step of lr on all 16 examples
 * gives, to float rounding. Why it holds: the full-batch gradient is the mean
 * over examples, so sum_i n_i (-lr g_i) / N = -lr g_union. Also with FedProx
 * (mu changes nothing on the first step, w = w0) and, as a check that the
 * test can fail, not with unweighted averaging. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "fed.h"
#include "kernels.h"
#include "model.h"
#include "tap.h"

#define RNG_SEED 0x6a09e667f3bcc908ull
#include "rng.h"

#define NCLIENTS 3
#define NL 2
#define NT (2 * NL)
static const uint32_t dims[NL + 1] = { 20, 16, 10 };
static const int shares[NCLIENTS] = { 5, 9, 2 };
#define N 16
#define LR 0.5f
#define TOL 2e-6 /* relative to the largest change */

static float x[N * 20];
static int32_t y[N];

/* One full-batch step from w0 on examples [from, from + n): the delta. */
static int client_delta(Model *m, float *const *w0, int from, int n, float mu, float **delta) {
        float loss;
        int correct;
        for (size_t t = 0; t < NT; t++)
                memcpy(model_param_host(m, t), w0[t], model_tensor_numel(m, t) * sizeof(float));
        int r = model_upload_params(m);
        if (r == 0)
                r = model_train_step(m, x + (size_t) from * dims[0], y + from, n, &loss, &correct);
        if (r < 0)
                return r;
        for (size_t t = 0; t < NT; t++) {
                size_t len = model_tensor_numel(m, t);
                float *w = model_param_host(m, t);
                fed_client_step(w, w0[t], model_grad_host(m, t), len, LR, mu);
                for (size_t i = 0; i < len; i++)
                        delta[t][i] = w[i] - w0[t][i];
        }
        return 0;
}

/* The largest difference between FedAvg of the clients' deltas (weighted by
 * examples, or not) and the SGD step on the union, over the largest change. */
static double fedavg_vs_sgd(Model *m, float *const *w0, float mu, bool weighted) {
        float *delta[NCLIENTS][NT], *want[NT], *got[NT];
        uint64_t ex[NCLIENTS];
        double worst = 0, scale = 0;
        int from = 0, r = 0;
        for (int c = 0; c < NCLIENTS; c++) {
                for (size_t t = 0; t < NT; t++)
                        delta[c][t] = calloc(model_tensor_numel(m, t), sizeof(float));
                ex[c] = weighted ? (uint64_t) shares[c] : 1;
                r = r < 0 ? r : client_delta(m, w0, from, shares[c], mu, delta[c]);
                from += shares[c];
        }
        for (size_t t = 0; t < NT; t++) {
                want[t] = calloc(model_tensor_numel(m, t), sizeof(float));
                got[t] = calloc(model_tensor_numel(m, t), sizeof(float));
        }
        r = r < 0 ? r : client_delta(m, w0, 0, N, 0, want);
        for (size_t t = 0; t < NT && r == 0; t++) {
                size_t len = model_tensor_numel(m, t);
                const float *u[NCLIENTS] = { delta[0][t], delta[1][t], delta[2][t] };
                float scratch[2 * NCLIENTS + 16 * 20];
                FedParams p;
                fed_params_default(FED_AVG, &p);
                memcpy(got[t], w0[t], len * sizeof(float));
                r = fed_aggregate(&p, got[t], NULL, (uint32_t) len, u, ex, NCLIENTS, NULL, scratch);
                for (size_t i = 0; i < len; i++) {
                        worst = fmax(worst, fabs((double) got[t][i] - (w0[t][i] + want[t][i])));
                        scale = fmax(scale, fabs((double) want[t][i]));
                }
        }
        for (int c = 0; c < NCLIENTS; c++)
                for (size_t t = 0; t < NT; t++)
                        free(delta[c][t]);
        for (size_t t = 0; t < NT; t++) {
                free(want[t]);
                free(got[t]);
        }
        return r < 0 || scale == 0 ? INFINITY : worst / scale;
}

int main(void) {
        KBackend *kb = NULL;
        Model *m = NULL;
        char err[256];
        float *w0[NT];
        if (!CHECK(kbackend_new("cpu", 1, &kb, err, sizeof err) == 0 && model_new_mlp(kb, dims, NL + 1, N, &m) == 0,
                   "a 20-16-10 model on the cpu backend (%s)", err))
                return tap_done();
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
                x[i] = rng_uniform(-1, 1);
        for (int s = 0; s < N; s++)
                y[s] = (int32_t) (rng_next() % 10);
        for (size_t t = 0; t < NT; t++) {
                w0[t] = malloc(model_tensor_numel(m, t) * sizeof(float));
                for (size_t i = 0; i < model_tensor_numel(m, t); i++)
                        w0[t][i] = rng_uniform(-0.5f, 0.5f);
        }
        double d = fedavg_vs_sgd(m, w0, 0, true);
        CHECK(d <= TOL, "FedAvg of one full-batch step on 5, 9 and 2 examples = one SGD step on the 16 (%.2g)", d);
        d = fedavg_vs_sgd(m, w0, 0.3f, true);
        CHECK(d <= TOL, "with FedProx's mu 0.3 as well: w = w0 on the first step (%.2g)", d);
        d = fedavg_vs_sgd(m, w0, 0, false);
        CHECK(d > 100 * TOL, "unweighted, the clients' mean is not the union's step (%.2g): the check can fail", d);
        for (size_t t = 0; t < NT; t++)
                free(w0[t]);
        model_free(m);
        kbackend_free(kb);
        return tap_done();
}
