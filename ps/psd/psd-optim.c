/* SPDX-License-Identifier: Apache-2.0 */
/* Optimizers applied by psd to a chunk: SGD (plain, momentum, Nesterov, weight
 * decay) and Adam, following the formulas in psd-optim.h.
 *
 * Each variant is a per-value step (the *_at functions) run by a loop over
 * restrict pointers in fixed blocks of OPTIM_BLOCK values plus a scalar tail:
 * at -O2 GCC vectorises only loops whose trip count it knows, so the blocks are
 * what makes these loops SIMD in a debugoptimized build. Adam's sqrtf has its
 * own pass over a block, because with math-errno on (GCC's default) GCC will
 * not vectorise it; the passes around it still are, and with -fno-math-errno,
 * which psd's meson.build sets, all three are. Per-call scalars (Adam's bias
 * corrections) are computed once, in double. With psd --threads, a chunk's
 * step is cut into ranges run in parallel (pfor.h): each value is computed by
 * the same code either way, so the result is the same bits. Denormals are flushed to zero, in the state
 * and in the gradients (common/fpflush.h): the state of a unit that stopped
 * learning would otherwise stay denormal and slow every step down. */
#include <assert.h>
#include <math.h>
#include <string.h>
#include "fpflush.h"
#include "macro.h"
#include "psd-optim.h"

#define OPTIM_BLOCK 16
/* Values per thread below which a step stays on one thread (a wake-up costs
 * about what 16 Ki values of SGD do). */
#define OPTIM_MIN_PART (32u << 10)

static bool optim_is_adam(const OptimConf *c) {
        return c->kind == OPTIM_ADAM;
}

/* mu = 0: w -= lr * (k*g + wd*w), k the gradient's scale (1: exactly g). */
static inline void sgd_plain_at(float lr, float k, float wd, float *restrict w, const float *restrict g,
                                size_t i) {
        w[i] -= lr * (g[i] * k + wd * w[i]);
}

/* v = mu*v + g'; w -= lr * (nesterov ? g' + mu*v : v). nesterov is a constant
 * at every call, so each caller compiles to a branch-free loop. */
static inline void sgd_momentum_at(float lr, float k, float mu, float wd, bool nesterov, float *restrict w,
                                   const float *restrict g, float *restrict v, size_t i) {
        float gp = g[i] * k + wd * w[i];
        float vi = mu * v[i] + gp;
        v[i] = vi;
        w[i] -= lr * (nesterov ? gp + mu * vi : vi);
}

/* The loops below are kept out of line: GCC honours restrict on the parameters
 * of a function it compiles on its own, and loses it once inlined into
 * optim_apply, whose parameters may alias as far as it knows. */
__attribute__((noinline))
static void sgd_plain(float lr, float k, float wd, float *restrict w, const float *restrict g, size_t n) {
        size_t i = 0;
        for (; i + OPTIM_BLOCK <= n; i += OPTIM_BLOCK)
                for (size_t j = i; j < i + OPTIM_BLOCK; j++)
                        sgd_plain_at(lr, k, wd, w, g, j);
        for (; i < n; i++)
                sgd_plain_at(lr, k, wd, w, g, i);
}

__attribute__((noinline))
static void sgd_momentum(float lr, float k, float mu, float wd, float *restrict w, const float *restrict g,
                         float *restrict v, size_t n) {
        size_t i = 0;
        for (; i + OPTIM_BLOCK <= n; i += OPTIM_BLOCK)
                for (size_t j = i; j < i + OPTIM_BLOCK; j++)
                        sgd_momentum_at(lr, k, mu, wd, false, w, g, v, j);
        for (; i < n; i++)
                sgd_momentum_at(lr, k, mu, wd, false, w, g, v, i);
}

__attribute__((noinline))
static void sgd_nesterov(float lr, float k, float mu, float wd, float *restrict w, const float *restrict g,
                         float *restrict v, size_t n) {
        size_t i = 0;
        for (; i + OPTIM_BLOCK <= n; i += OPTIM_BLOCK)
                for (size_t j = i; j < i + OPTIM_BLOCK; j++)
                        sgd_momentum_at(lr, k, mu, wd, true, w, g, v, j);
        for (; i < n; i++)
                sgd_momentum_at(lr, k, mu, wd, true, w, g, v, i);
}

typedef struct AdamScalars {
        float lr, k, b1, b2, eps, wd;
        float c1, c2; /* 1/(1-b1^t), 1/(1-b2^t) */
} AdamScalars;

/* Updates the moments of value i and returns v/(1-b2^t), the argument of sqrt. */
static inline float adam_moments_at(AdamScalars s, const float *restrict w,
                                    const float *restrict g, float *restrict m, float *restrict v,
                                    size_t i) {
        float gp = g[i] * s.k + s.wd * w[i];
        m[i] = s.b1 * m[i] + (1.0f - s.b1) * gp;
        v[i] = s.b2 * v[i] + (1.0f - s.b2) * gp * gp;
        return v[i] * s.c2;
}

/* w -= lr * (m/(1-b1^t)) / (sqrt_vhat + eps), m already updated. */
static inline void adam_update_at(AdamScalars s, float *restrict w, const float *restrict m,
                                  float sqrt_vhat, size_t i) {
        w[i] -= s.lr * (m[i] * s.c1) / (sqrt_vhat + s.eps);
}

/* Scalars come by value: through a pointer, GCC could not tell them from the
 * arrays being written. */
__attribute__((noinline))
static void adam(AdamScalars s, float *restrict w, const float *restrict g, float *restrict m,
                 float *restrict v, size_t n) {
        float d[OPTIM_BLOCK];
        size_t i = 0;

        for (; i + OPTIM_BLOCK <= n; i += OPTIM_BLOCK) {
                for (size_t j = 0; j < OPTIM_BLOCK; j++)
                        d[j] = adam_moments_at(s, w, g, m, v, i + j);
                for (size_t j = 0; j < OPTIM_BLOCK; j++)
                        d[j] = sqrtf(d[j]);
                for (size_t j = 0; j < OPTIM_BLOCK; j++)
                        adam_update_at(s, w, m, d[j], i + j);
        }
        for (; i < n; i++)
                adam_update_at(s, w, m, sqrtf(adam_moments_at(s, w, g, m, v, i)), i);
}

/* One step's loop over values [lo, hi) of a chunk (pfor.h). */
typedef struct OptimLoop {
        const OptimConf *c;
        AdamScalars adam;
        float *w, *state;
        const float *g;
        float k;
        size_t n;
} OptimLoop;

static void optim_range(void *arg, size_t lo, size_t hi) {
        /* On whichever thread runs the range (common/fpflush.h). */
        _cleanup_(fpflush_end) _unused_ FpFlush fz = fpflush_begin();
        const OptimLoop *l = arg;
        const OptimConf *c = l->c;
        size_t k = hi - lo;
        float *w = l->w + lo;
        const float *g = l->g + lo;

        if (optim_is_adam(c))
                adam(l->adam, w, g, l->state + lo, l->state + l->n + lo, k);
        else if (c->momentum == 0.0f)
                sgd_plain(c->lr, l->k, c->weight_decay, w, g, k);
        else if (c->nesterov)
                sgd_nesterov(c->lr, l->k, c->momentum, c->weight_decay, w, g, l->state + lo, k);
        else
                sgd_momentum(c->lr, l->k, c->momentum, c->weight_decay, w, g, l->state + lo, k);
}

void optim_apply_par(Pfor *pool, const OptimConf *c, uint64_t step, float *w, const float *g, float gscale,
                     float *state, size_t n) {
        assert(c);
        assert(n == 0 || (w && g));
        assert(n == 0 || optim_state_per_value(c) == 0 || state);

        if (n == 0)
                return;
        OptimLoop l = { .c = c, .w = w, .g = g, .k = gscale, .state = state, .n = n };
        if (optim_is_adam(c)) {
                /* step is 1-based; 0 would divide by zero, so it counts as the first. */
                double t = step > 0 ? (double) step : 1.0;
                l.adam = (AdamScalars) {
                        .lr = c->lr, .k = gscale, .b1 = c->beta1, .b2 = c->beta2, .eps = c->eps,
                        .wd = c->weight_decay,
                        .c1 = (float) (1.0 / (1.0 - pow((double) c->beta1, t))),
                        .c2 = (float) (1.0 / (1.0 - pow((double) c->beta2, t))),
                };
        }
        pfor_run(pool, n, OPTIM_MIN_PART, optim_range, &l);
}

void optim_apply(const OptimConf *c, uint64_t step, float *w, const float *g, float *state,
                 size_t n) {
        optim_apply_par(NULL, c, step, w, g, 1.0f, state, n);
}
