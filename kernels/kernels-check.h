/* SPDX-License-Identifier: Apache-2.0 */
/* Argument checks shared by the backends, so every backend refuses the same
 * shapes the same way. */
#pragma once
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include "kernels.h"

/* The number of rows x cols elements, or 0 when either is not positive. */
static inline size_t numel(int rows, int cols) {
        if (rows <= 0 || cols <= 0)
                return 0;
        return (size_t) rows * (size_t) cols;
}

static inline bool act_valid(KAct act) {
        return act == KACT_NONE || act == KACT_RELU;
}

/* The checks every gemm applies before computing (see KernelsOps.gemm): returns
 * -EINVAL for bad shapes or pointers, 1 when there is nothing to compute (m or n
 * is 0), 0 to go on. */
static inline int gemm_check(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda,
                             const float *b, int ldb, const float *c, int ldc) {
        int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
        if (m < 0 || n < 0 || k < 0)
                return -EINVAL;
        if (lda < 1 || lda < a_cols || ldb < 1 || ldb < b_cols || ldc < 1 || ldc < n)
                return -EINVAL;
        if (m == 0 || n == 0)
                return 1;
        if (!c || (k > 0 && (!a || !b)))
                return -EINVAL;
        return 0;
}

/* gemm_ep's checks beyond gemm's: a known epilogue, a vector where it needs one,
 * and k > 0 where an epilogue reads the product. 1: nothing to compute. */
static inline int gemm_ep_check(int m, int n, int k, KEpilogue ep, const float *vec) {
        if (ep != KEPI_NONE && ep != KEPI_BIAS && ep != KEPI_BIAS_RELU && ep != KEPI_BGRAD)
                return -EINVAL;
        if (ep != KEPI_NONE && (k <= 0 || !vec))
                return m > 0 && n > 0 ? -EINVAL : (m < 0 || n < 0 ? -EINVAL : 1);
        return 0;
}

/* The checks of the other ops, with gemm_check's convention: -EINVAL for bad
 * shapes or pointers, 1 when there is nothing to compute, 0 to go on. */
static inline int bias_act_check(int rows, int cols, KAct act, const float *y) {
        if (rows < 0 || cols < 0 || !act_valid(act))
                return -EINVAL;
        if (numel(rows, cols) == 0)
                return 1;
        return y ? 0 : -EINVAL;
}

static inline int act_backward_check(size_t n, KAct act, const float *dy, const float *y) {
        if (!act_valid(act))
                return -EINVAL;
        if (n == 0 || act == KACT_NONE)
                return 1;
        return dy && y ? 0 : -EINVAL;
}

static inline int colsum_check(int rows, int cols, const float *x, const float *out) {
        if (rows < 0 || cols < 0)
                return -EINVAL;
        if (cols == 0)
                return 1;
        return out && (rows == 0 || x) ? 0 : -EINVAL;
}

/* softmax_xent and argmax: every row needs a column; have_ptrs says whether
 * every pointer the op takes is set. */
static inline int rows_check(int rows, int cols, bool have_ptrs) {
        if (rows < 0 || cols < 0 || (rows > 0 && cols == 0))
                return -EINVAL;
        if (rows == 0)
                return 1;
        return have_ptrs ? 0 : -EINVAL;
}

static inline int sgd_step_check(size_t n, const float *w, const float *g, const float *v) {
        if (n == 0)
                return 1;
        return w && g && v ? 0 : -EINVAL;
}

/* The layer ops' checks: a positive count, and the pointers set. */
static inline bool window_valid(const KWindow *w) {
        return w && w->n > 0 && w->h > 0 && w->w > 0 && w->c > 0 && w->k > 0 && w->stride > 0 && w->pad >= 0 &&
               w->ho > 0 && w->wo > 0 && w->ho == (w->h + 2 * w->pad - w->k) / w->stride + 1 &&
               w->wo == (w->w + 2 * w->pad - w->k) / w->stride + 1 && w->h + 2 * w->pad >= w->k &&
               w->w + 2 * w->pad >= w->k;
}

#ifdef __CUDACC__
#define KHD __host__ __device__
#else
#define KHD
#endif

/* Dropout's keep decision for element i: splitmix64's mixer over (seed, i),
 * its top 24 bits against p, so every backend draws the same mask. */
static inline KHD bool dropout_keep(uint64_t seed, uint64_t i, float p) {
        uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        return (float) (z >> 40) * (1.0f / 16777216.0f) >= p;
}
