/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/psd/psd-optim.c: each optimizer against values derived by hand
 * in the comments (plain SGD, momentum, Nesterov, weight decay, Adam with its
 * bias correction), the state layout, and optim_state_per_value. Every update
 * runs on N values at once so that both the blocked loop and its scalar tail
 * are exercised, and every value must match the hand-computed one. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "psd-optim.h"
#include "tap.h"
#define RNG_SEED 0x0971u
#include "rng.h"

#define ELEMS(a) (sizeof(a) / sizeof((a)[0]))

#define N 37   /* two blocks of 16 plus a tail of 5 */
#define TOL 1e-6

static OptimConf sgd_conf(float lr, float mu, float wd, bool nesterov) {
        OptimConf c = { .kind = OPTIM_SGD, .lr = lr, .momentum = mu, .weight_decay = wd,
                        .nesterov = nesterov };
        return c;
}

static OptimConf adam_conf(float lr, float wd) {
        OptimConf c = { .kind = OPTIM_ADAM, .lr = lr, .weight_decay = wd, .beta1 = 0.9f,
                        .beta2 = 0.999f, .eps = 1e-8f };
        return c;
}

/* The value of a[0..n) farthest from expect. */
static double worst(const float *a, size_t n, double expect) {
        double r = a[0];
        for (size_t i = 1; i < n; i++)
                if (fabs(a[i] - expect) > fabs(r - expect))
                        r = a[i];
        return r;
}

/* Starts all N values at w0 with zeroed state, applies nsteps steps whose
 * gradient is gs[t-1] in every value, and checks w after each step against
 * want_w[t-1] and, where want_v is given, the first state array (SGD's v,
 * Adam's m) against want_v[t-1]. */
static void run_steps(const char *name, const OptimConf *c, float w0, const float *gs,
                      const double *want_w, const double *want_v, int nsteps) {
        float w[N], g[N], state[2 * N];

        for (size_t i = 0; i < N; i++)
                w[i] = w0;
        memset(state, 0, sizeof(state));
        for (int t = 1; t <= nsteps; t++) {
                for (size_t i = 0; i < N; i++)
                        g[i] = gs[t - 1];
                optim_apply(c, (uint64_t) t, w, g, state, N);
                CHECK_CLOSE(worst(w, N, want_w[t - 1]), want_w[t - 1], TOL,
                            "%s: step %d w = %.7g", name, t, want_w[t - 1]);
                if (want_v)
                        CHECK_CLOSE(worst(state, N, want_v[t - 1]), want_v[t - 1], TOL,
                                    "%s: step %d state = %.7g", name, t, want_v[t - 1]);
        }
}

static void test_state_per_value(void) {
        OptimConf c;

        c = sgd_conf(0.1f, 0.0f, 0.0f, false);
        CHECK(optim_state_per_value(&c) == 0, "plain sgd keeps no state");
        c = sgd_conf(0.1f, 0.0f, 0.0f, true);
        CHECK(optim_state_per_value(&c) == 0, "nesterov with mu = 0 keeps no state");
        c = sgd_conf(0.1f, 0.9f, 0.0f, false);
        CHECK(optim_state_per_value(&c) == 1, "sgd with momentum keeps v");
        c = sgd_conf(0.1f, 0.9f, 0.0f, true);
        CHECK(optim_state_per_value(&c) == 1, "nesterov keeps v");
        c = adam_conf(0.1f, 0.0f);
        CHECK(optim_state_per_value(&c) == 2, "adam keeps m and v");
        c.momentum = 0.9f;
        CHECK(optim_state_per_value(&c) == 2, "adam ignores momentum");
}

/* w = 1, g = 0.5, lr = 0.1: each step takes away lr*g = 0.05.
 *   t=1: 1    - 0.05 = 0.95
 *   t=2: 0.95 - 0.05 = 0.90
 *   t=3: 0.90 - 0.05 = 0.85 */
static void test_sgd_plain(void) {
        OptimConf c = sgd_conf(0.1f, 0.0f, 0.0f, false);
        const float gs[] = { 0.5f, 0.5f, 0.5f };
        const double want_w[] = { 0.95, 0.90, 0.85 };
        float w = 2.0f, g = -1.0f;

        run_steps("sgd", &c, 1.0f, gs, want_w, NULL, 3);

        /* Plain SGD needs no state: NULL must do. w = 2, g = -1: 2 + 0.1 = 2.1 */
        optim_apply(&c, 1, &w, &g, NULL, 1);
        CHECK_CLOSE(w, 2.1, TOL, "sgd: runs without state, w = 2.1");
}

/* w = 1, g = 0.5, lr = 0.1, mu = 0.9:
 *   t=1: v = 0.9*0     + 0.5 = 0.5;   w = 1     - 0.1*0.5   = 0.95
 *   t=2: v = 0.9*0.5   + 0.5 = 0.95;  w = 0.95  - 0.1*0.95  = 0.855
 *   t=3: v = 0.9*0.95  + 0.5 = 1.355; w = 0.855 - 0.1*1.355 = 0.7195 */
static void test_sgd_momentum(void) {
        OptimConf c = sgd_conf(0.1f, 0.9f, 0.0f, false);
        const float gs[] = { 0.5f, 0.5f, 0.5f };
        const double want_w[] = { 0.95, 0.855, 0.7195 };
        const double want_v[] = { 0.5, 0.95, 1.355 };

        run_steps("momentum", &c, 1.0f, gs, want_w, want_v, 3);
}

/* Same as momentum, but w -= lr * (g + mu*v) with the new v:
 *   t=1: v = 0.5;   w = 1     - 0.1*(0.5 + 0.9*0.5)   = 1     - 0.095   = 0.905
 *   t=2: v = 0.95;  w = 0.905 - 0.1*(0.5 + 0.9*0.95)  = 0.905 - 0.1355  = 0.7695
 *   t=3: v = 1.355; w = 0.7695 - 0.1*(0.5 + 0.9*1.355) = 0.7695 - 0.17195 = 0.59755 */
static void test_sgd_nesterov(void) {
        OptimConf c = sgd_conf(0.1f, 0.9f, 0.0f, true);
        const float gs[] = { 0.5f, 0.5f, 0.5f };
        const double want_w[] = { 0.905, 0.7695, 0.59755 };
        const double want_v[] = { 0.5, 0.95, 1.355 };

        run_steps("nesterov", &c, 1.0f, gs, want_w, want_v, 3);
}

/* Weight decay adds wd*w (the w before the step) to g. w = 1, g = 0.5,
 * lr = 0.1, wd = 0.1, plain:
 *   t=1: g' = 0.5 + 0.1*1      = 0.6;     w = 1      - 0.06     = 0.94
 *   t=2: g' = 0.5 + 0.1*0.94   = 0.594;   w = 0.94   - 0.0594   = 0.8806
 *   t=3: g' = 0.5 + 0.1*0.8806 = 0.58806; w = 0.8806 - 0.058806 = 0.821794
 * and with mu = 0.9:
 *   t=1: g' = 0.6;                  v = 0.6;                       w = 1 - 0.06 = 0.94
 *   t=2: g' = 0.594;                v = 0.9*0.6 + 0.594 = 1.134;   w = 0.94 - 0.1134 = 0.8266
 *   t=3: g' = 0.5 + 0.08266 = 0.58266; v = 0.9*1.134 + 0.58266 = 1.60326;
 *        w = 0.8266 - 0.160326 = 0.666274 */
static void test_sgd_weight_decay(void) {
        OptimConf plain = sgd_conf(0.1f, 0.0f, 0.1f, false);
        OptimConf mom = sgd_conf(0.1f, 0.9f, 0.1f, false);
        const float gs[] = { 0.5f, 0.5f, 0.5f };
        const double want_plain[] = { 0.94, 0.8806, 0.821794 };
        const double want_mom_w[] = { 0.94, 0.8266, 0.666274 };
        const double want_mom_v[] = { 0.6, 1.134, 1.60326 };

        run_steps("sgd wd", &plain, 1.0f, gs, want_plain, NULL, 3);
        run_steps("momentum wd", &mom, 1.0f, gs, want_mom_w, want_mom_v, 3);
}

/* w = 1, lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, g = 0.5, -0.25, 1:
 *   t=1: m = 0.1*0.5 = 0.05;  v = 0.001*0.25 = 0.00025
 *        m^ = 0.05/(1-0.9) = 0.5;  v^ = 0.00025/(1-0.999) = 0.25;  sqrt = 0.5
 *        w = 1 - 0.1*0.5/0.5 = 0.9  (without bias correction it would be
 *        1 - 0.1*0.05/sqrt(0.00025) = 0.6838)
 *   t=2: m = 0.9*0.05 + 0.1*(-0.25) = 0.02
 *        v = 0.999*0.00025 + 0.001*0.0625 = 0.00031225
 *        m^ = 0.02/(1-0.81) = 0.02/0.19 = 0.1052632
 *        v^ = 0.00031225/(1-0.998001) = 0.00031225/0.001999 = 0.1562031; sqrt = 0.3952254
 *        w = 0.9 - 0.1*0.1052632/0.3952254 = 0.9 - 0.0266337 = 0.8733663
 *   t=3: m = 0.9*0.02 + 0.1*1 = 0.118
 *        v = 0.999*0.00031225 + 0.001*1 = 0.00131193775
 *        m^ = 0.118/(1-0.729) = 0.118/0.271 = 0.4354244
 *        v^ = 0.00131193775/(1-0.997002999) = 0.00131193775/0.002997001 = 0.4377502;
 *        sqrt = 0.6616269
 *        w = 0.8733663 - 0.1*0.4354244/0.6616269 = 0.8733663 - 0.0658112 = 0.8075551 */
static void test_adam(void) {
        OptimConf c = adam_conf(0.1f, 0.0f);
        const float gs[] = { 0.5f, -0.25f, 1.0f };
        const double want_w[] = { 0.9, 0.8733663, 0.8075551 };
        const double want_m[] = { 0.05, 0.02, 0.118 };
        float w[2] = { 1.0f, 1.0f }, g[2] = { 0.5f, 0.5f }, state[4] = { 0 };

        run_steps("adam", &c, 1.0f, gs, want_w, want_m, 3);

        /* Layout: m[n] then v[n]. After t=1 above, m = 0.05 and v = 0.00025
         * (to 1e-4 relative: 1 - 0.999f is 0.00099998713 in float). */
        optim_apply(&c, 1, w, g, state, 2);
        CHECK_CLOSE(state[0], 0.05, TOL, "adam layout: state[0] is m[0] = 0.05");
        CHECK_CLOSE(state[1], 0.05, TOL, "adam layout: state[1] is m[1] = 0.05");
        CHECK(fabs(state[2] - 0.00025) < 0.00025 * 1e-4,
              "adam layout: state[n] is v[0] = 0.00025 (%g)", state[2]);
        CHECK(fabs(state[3] - 0.00025) < 0.00025 * 1e-4,
              "adam layout: state[n+1] is v[1] = 0.00025 (%g)", state[3]);
}

/* Weight decay in Adam: w = -1, g = 0.5, wd = 1: g' = 0.5 - 1 = -0.5, so at
 * t=1 m^ = -0.5, sqrt(v^) = 0.5, w = -1 + 0.1 = -0.9 (without wd: -1.1).
 * A zero gradient at t=1 gives m = v = 0: the step is 0/(0 + eps) = 0 and w
 * stays 1, finite. */
static void test_adam_edges(void) {
        OptimConf wd = adam_conf(0.1f, 1.0f);
        OptimConf c = adam_conf(0.1f, 0.0f);
        const float g_wd[] = { 0.5f }, g_zero[] = { 0.0f };
        const double want_wd[] = { -0.9 }, want_zero[] = { 1.0 };

        run_steps("adam wd", &wd, -1.0f, g_wd, want_wd, NULL, 1);
        run_steps("adam zero gradient", &c, 1.0f, g_zero, want_zero, NULL, 1);
}

/* Values are independent: value i with g_i = 0.01*(i+1), plain SGD lr = 0.1,
 * w = 1, gives w_i = 1 - 0.001*(i+1). */
static void test_values_independent(void) {
        OptimConf c = sgd_conf(0.1f, 0.0f, 0.0f, false);
        float w[N], g[N];
        double err = 0;

        for (size_t i = 0; i < N; i++) {
                w[i] = 1.0f;
                g[i] = 0.01f * (float) (i + 1);
        }
        optim_apply(&c, 1, w, g, NULL, N);
        for (size_t i = 0; i < N; i++)
                err = fmax(err, fabs(w[i] - (1.0 - 0.001 * (double) (i + 1))));
        CHECK(err < TOL, "each value gets its own gradient (max error %g)", err);
}

/* With a pool, a chunk's step is cut into ranges run by its threads: each
 * optimizer over 5 steps of random gradients must give the same bits as on
 * one thread, for lengths that split into unequal parts and end in a tail. */
static void test_threads_same_bits(void) {
        const size_t n = (1u << 18) + 37;
        const OptimConf confs[] = { sgd_conf(0.05f, 0.0f, 0.0f, false), sgd_conf(0.05f, 0.9f, 1e-4f, false),
                                    sgd_conf(0.05f, 0.9f, 0.0f, true), adam_conf(0.001f, 1e-4f) };
        const char *names[] = { "sgd", "momentum", "nesterov", "adam" };
        float *w1 = malloc(n * sizeof *w1), *wp = malloc(n * sizeof *wp), *g = malloc(n * sizeof *g);
        float *s1 = calloc(2 * n, sizeof *s1), *sp = calloc(2 * n, sizeof *sp);
        if (!CHECK(w1 && wp && g && s1 && sp, "allocated"))
                goto out;
        for (unsigned threads = 2; threads <= 7; threads += 5) {
                Pfor *pool = NULL;
                if (!CHECK(pfor_new(threads, &pool) == 0, "a pool of %u threads", threads))
                        break;
                for (size_t k = 0; k < ELEMS(confs); k++) {
                        for (size_t i = 0; i < n; i++)
                                w1[i] = wp[i] = rng_uniform(-1.0f, 1.0f);
                        memset(s1, 0, 2 * n * sizeof *s1);
                        memset(sp, 0, 2 * n * sizeof *sp);
                        for (uint64_t t = 1; t <= 5; t++) {
                                for (size_t i = 0; i < n; i++)
                                        g[i] = rng_uniform(-0.5f, 0.5f);
                                optim_apply(&confs[k], t, w1, g, s1, n);
                                optim_apply_par(pool, &confs[k], t, wp, g, 1.0f, sp, n);
                        }
                        CHECK(memcmp(w1, wp, n * sizeof *w1) == 0 && memcmp(s1, sp, 2 * n * sizeof *s1) == 0,
                              "%s on %u threads: the same values and state, bit for bit", names[k], threads);
                }
                pool = pfor_free(pool);
        }
out:
        free(w1);
        free(wp);
        free(g);
        free(s1);
        free(sp);
}

/* A push's 1/W share is scaled in the optimizer's loop: the same bits as the
 * optimizer run on a copy of the gradient scaled first (what psd did before),
 * for each optimizer and a scale of 1/3 (not a power of two: rounding shows). */
static void test_scaled_same_bits(void) {
        const size_t n = 1000;
        const OptimConf confs[] = { sgd_conf(0.05f, 0.0f, 1e-4f, false), sgd_conf(0.05f, 0.9f, 1e-4f, false),
                                    sgd_conf(0.05f, 0.9f, 0.0f, true), adam_conf(0.001f, 1e-4f) };
        const char *names[] = { "sgd", "momentum", "nesterov", "adam" };
        float w1[1000], w2[1000], g[1000], gs[1000], s1[2000], s2[2000];
        const float k = 1.0f / 3.0f;
        for (size_t c = 0; c < ELEMS(confs); c++) {
                for (size_t i = 0; i < n; i++)
                        w1[i] = w2[i] = rng_uniform(-1.0f, 1.0f);
                memset(s1, 0, sizeof s1);
                memset(s2, 0, sizeof s2);
                for (uint64_t t = 1; t <= 3; t++) {
                        for (size_t i = 0; i < n; i++) {
                                g[i] = rng_uniform(-0.5f, 0.5f);
                                gs[i] = g[i] * k;
                        }
                        optim_apply(&confs[c], t, w1, gs, s1, n);
                        optim_apply_par(NULL, &confs[c], t, w2, g, k, s2, n);
                }
                CHECK(memcmp(w1, w2, sizeof w1) == 0 && memcmp(s1, s2, sizeof s1) == 0,
                      "%s: gscale 1/3 in the loop gives the bits of a gradient scaled first", names[c]);
        }
}

/* The caller's floating-point mode: a result under FLT_MIN kept as a denormal. */
static bool keeps_denormals(void) {
        volatile float x = FLT_MIN;
        return x / 4.0f > 0.0f;
}

/* A unit that stopped learning: gradient 0 and first moment at the smallest
 * denormal, where IEEE arithmetic keeps it (0.9 times it rounds back to it)
 * and every step pays the CPU's slow path. psd flushes it to 0
 * (common/fpflush.h), on one thread and on a pool's, and hands the caller's
 * mode back as it was. */
static void test_denormals_flushed(void) {
        volatile float b = 0.9f, tiny = FLT_TRUE_MIN;
        CHECK(keeps_denormals() && b * tiny == FLT_TRUE_MIN,
              "without a flush, 0.9 times the smallest denormal stays that denormal");
        const size_t n = (1u << 17) + 5;
        const OptimConf confs[] = { sgd_conf(0.05f, 0.9f, 0.0f, false), sgd_conf(0.05f, 0.9f, 0.0f, true),
                                    adam_conf(0.001f, 0.0f) };
        const char *names[] = { "momentum", "nesterov", "adam" };
        float *w = malloc(n * sizeof *w), *g = malloc(n * sizeof *g), *st = malloc(2 * n * sizeof *st);
        Pfor *pool = NULL;
        if (!CHECK(w && g && st && pfor_new(4, &pool) == 0, "allocated, a pool of 4 threads"))
                goto out;
        for (size_t k = 0; k < ELEMS(confs); k++)
                for (int par = 0; par < 2; par++) {
                        for (size_t i = 0; i < n; i++) {
                                w[i] = 0.5f;
                                g[i] = i % 2 ? 0.0f : FLT_TRUE_MIN; /* a denormal gradient counts as 0 */
                                st[i] = FLT_TRUE_MIN;
                                st[n + i] = 1e-6f;
                        }
                        optim_apply_par(par ? pool : NULL, &confs[k], 100, w, g, 1.0f, st, n);
                        size_t left = 0, moved = 0;
                        for (size_t i = 0; i < n; i++) {
                                left += st[i] != 0.0f;
                                moved += w[i] != 0.5f;
                        }
                        CHECK(left == 0 && moved == 0 && keeps_denormals(),
                              "%s%s: denormal moments flushed to 0 (%zu left), no value moved (%zu), the caller's "
                              "mode kept", names[k], par ? " on 4 threads" : "", left, moved);
                }
out:
        pool = pfor_free(pool);
        free(w);
        free(g);
        free(st);
}

int main(void) {
        test_state_per_value();
        test_sgd_plain();
        test_sgd_momentum();
        test_sgd_nesterov();
        test_sgd_weight_decay();
        test_adam();
        test_adam_edges();
        test_values_independent();
        test_threads_same_bits();
        test_scaled_same_bits();
        test_denormals_flushed();
        return tap_done();
}
