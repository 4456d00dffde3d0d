/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's layer ops (kernels.h, "the layer ops"), each the CPU
 * reference's loop (kernels/cpu/kernels-cpu-layers.c) spread over threads and
 * checked against it by tests/gpu/test-cuda-layers.c.
 *
 * Where the CPU scatters (col2im, the poolings' backward), a thread here owns
 * one input element and gathers what every window over it gives, in the order
 * the CPU adds them: no atomics, and the same sums. The row ops (layer norm,
 * softmax) give a row to a warp; their sums are in another order than the
 * CPU's, so they agree within rounding. embedding_backward alone adds with
 * atomics (a real vocabulary is too large to gather): its sums may differ in
 * the last bits from run to run when an id repeats.
 *
 * Bad token ids (embedding) are found on the device, like softmax_xent's bad
 * labels: the op then writes nothing and the next sync or download returns
 * -EINVAL. Launchers as in kernels-cuda.cu: shapes checked as the CPU does,
 * a negative errno, never an exit. */
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels-check.h"
}
#include "kernels-cuda-internal.h"

#define SQRT1_2 0.70710678118654752440f   /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794f /* 1 / sqrt(2 pi) */
#define LN_X 32 /* layernorm_backward's column sums: 32 columns ... */
#define LN_Y 8  /* ... by 8 row strips, as colsum */

/* Grid-stride loop over i in [0, n). */
#define FOR_EACH(i, n) \
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t) gridDim.x * blockDim.x)

/* ---------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------- */

static __global__ void axpy_kernel(size_t n, float alpha, const float *x, float *y) {
        FOR_EACH(i, n)
        y[i] += alpha * x[i];
}

/* c_i = beta c_i over count m x n blocks (gemm_batched with k == 0). */
static __global__ void scale_batched_kernel(float *c, int m, int n, int ldc, long long sc, int count, float beta) {
        size_t per = (size_t) m * n;

        FOR_EACH(i, per * (size_t) count) {
                size_t b = i / per, r = (i % per) / n, col = i % n;
                float *p = c + (long long) b * sc + r * ldc + col;
                *p = beta == 0.0f ? 0.0f : beta * *p;
        }
}

/* y[i][l][j][e] = x[i][j][l][e] for x of shape [a][b][c][d]; one thread per
 * element of y, so writes are contiguous. */
static __global__ void permute0213_kernel(const float *x, int b, int c, int d, size_t total, float *y) {
        FOR_EACH(o, total) {
                size_t e = o % d, t = o / d;
                size_t j = t % b;
                t /= b;
                size_t l = t % c, i = t / c;
                y[o] = x[((i * b + j) * c + l) * d + e];
        }
}

/* The input offset of (image i, row y, column x, channel ch), or -1 in the padding. */
static __device__ __forceinline__ long long win_at(const KWindow w, int i, int y, int x, int ch) {
        if (y < 0 || y >= w.h || x < 0 || x >= w.w)
                return -1;
        return (((long long) i * w.h + y) * w.w + x) * w.c + ch;
}

/* col[row][ch*k*k + ky*k + kx] for row = (i, oy, ox); one thread per element. */
static __global__ void im2col_kernel(const KWindow w, const float *x, size_t total, float *col) {
        int kk = w.k * w.k, ncol = w.c * kk;

        FOR_EACH(o, total) {
                size_t row = o / ncol;
                int ci = (int) (o % ncol), ch = ci / kk, ky = ci % kk / w.k, kx = ci % w.k;
                int ox = (int) (row % w.wo), oy = (int) (row / w.wo % w.ho), i = (int) (row / w.wo / w.ho);
                long long at = win_at(w, i, oy * w.stride - w.pad + ky, ox * w.stride - w.pad + kx, ch);
                col[o] = at < 0 ? 0.0f : x[at];
        }
}

/* dx[i][y][x][ch] = the sum of the col elements that window position took
 * from it. The window at (oy, ox) reads it through ky = y + pad - oy*stride;
 * ky falling gives oy rising, the CPU's order of addition. */
static __global__ void col2im_kernel(const KWindow w, const float *col, size_t total, float *dx) {
        int kk = w.k * w.k, ncol = w.c * kk;

        FOR_EACH(o, total) {
                int ch = (int) (o % w.c), x = (int) (o / w.c % w.w), y = (int) (o / w.c / w.w % w.h),
                    i = (int) (o / w.c / w.w / w.h);
                float s = 0.0f;
                for (int ky = w.k - 1; ky >= 0; ky--) {
                        int ty = y + w.pad - ky;
                        if (ty < 0 || ty % w.stride != 0 || ty / w.stride >= w.ho)
                                continue;
                        for (int kx = w.k - 1; kx >= 0; kx--) {
                                int tx = x + w.pad - kx;
                                if (tx < 0 || tx % w.stride != 0 || tx / w.stride >= w.wo)
                                        continue;
                                size_t row = ((size_t) i * w.ho + ty / w.stride) * w.wo + tx / w.stride;
                                s += col[row * ncol + (size_t) ch * kk + (size_t) ky * w.k + kx];
                        }
                }
                dx[o] = s;
        }
}

/* One thread per output element, the CPU's loop: the first largest wins. */
static __global__ void pool_kernel(const KWindow w, bool max, const float *x, size_t total, float *y, int32_t *idx) {
        long long sample = (long long) w.h * w.w * w.c;

        FOR_EACH(o, total) {
                int ch = (int) (o % w.c), ox = (int) (o / w.c % w.wo), oy = (int) (o / w.c / w.wo % w.ho),
                    i = (int) (o / w.c / w.wo / w.ho);
                float best = -INFINITY, sum = 0.0f;
                long long arg = -1;
                for (int ky = 0; ky < w.k; ky++)
                        for (int kx = 0; kx < w.k; kx++) {
                                long long at = win_at(w, i, oy * w.stride - w.pad + ky, ox * w.stride - w.pad + kx, ch);
                                if (at < 0)
                                        continue;
                                sum += x[at];
                                if (arg < 0 || x[at] > best) {
                                        best = x[at];
                                        arg = at;
                                }
                        }
                if (max) {
                        y[o] = best;
                        idx[o] = (int32_t) (arg - (long long) i * sample);
                } else
                        y[o] = sum / (float) (w.k * w.k);
        }
}

/* dx[i][y][x][ch]: the sum over the windows over it of dy / (k*k) (average)
 * or of dy where that window's maximum came from here (max), gathered in the
 * CPU's order as col2im. An idx outside the sample matches no element. */
static __global__ void pool_backward_kernel(const KWindow w, bool max, const float *dy, const int32_t *idx,
                                            size_t total, float *dx) {
        float kk = (float) (w.k * w.k);
        long long sample = (long long) w.h * w.w * w.c;

        FOR_EACH(o, total) {
                int ch = (int) (o % w.c), x = (int) (o / w.c % w.w), y = (int) (o / w.c / w.w % w.h),
                    i = (int) (o / w.c / w.w / w.h);
                int32_t self = (int32_t) ((long long) o - (long long) i * sample);
                float s = 0.0f;
                for (int ky = w.k - 1; ky >= 0; ky--) {
                        int ty = y + w.pad - ky;
                        if (ty < 0 || ty % w.stride != 0 || ty / w.stride >= w.ho)
                                continue;
                        for (int kx = w.k - 1; kx >= 0; kx--) {
                                int tx = x + w.pad - kx;
                                if (tx < 0 || tx % w.stride != 0 || tx / w.stride >= w.wo)
                                        continue;
                                size_t at = (((size_t) i * w.ho + ty / w.stride) * w.wo + tx / w.stride) * w.c + ch;
                                if (!max)
                                        s += dy[at] / kk;
                                else if (idx[at] == self)
                                        s += dy[at];
                        }
                }
                dx[o] = s;
        }
}

static __global__ void gelu_kernel(const float *x, float *y, size_t n) {
        FOR_EACH(i, n)
        y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT1_2));
}

/* gelu'(x) = Phi(x) + x phi(x). */
static __global__ void gelu_backward_kernel(const float *x, const float *dy, float *dx, size_t n) {
        FOR_EACH(i, n) {
                float xi = x[i], cdf = 0.5f * (1.0f + erff(xi * SQRT1_2));
                float pdf = expf(-0.5f * xi * xi) * INV_SQRT_2PI;
                dx[i] = dy[i] * (cdf + xi * pdf);
        }
}

static __global__ void dropout_kernel(const float *x, float *y, float *mask, size_t n, float p, float keep,
                                      uint64_t seed) {
        FOR_EACH(i, n) {
                float m = dropout_keep(seed, i, p) ? keep : 0.0f;
                mask[i] = m;
                y[i] = x[i] * m;
        }
}

static __global__ void mul_kernel(const float *a, const float *b, float *out, size_t n) {
        FOR_EACH(i, n)
        out[i] = a[i] * b[i];
}

static __device__ __forceinline__ double warp_sum_d(double v) {
        for (int off = 16; off > 0; off /= 2)
                v += __shfl_xor_sync(FULL_MASK, v, off);
        return v;
}

/* One warp per row; the mean and variance summed in double, as the CPU. */
static __global__ void layernorm_kernel(const float *x, const float *g, const float *b, int rows, int cols,
                                        float eps, float *y, float *mean, float *rstd) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        double s = 0.0, v = 0.0;

        if (row >= rows)
                return;
        const float *xr = x + (size_t) row * cols;
        float *yr = y + (size_t) row * cols;
        for (int c = lane; c < cols; c += 32)
                s += xr[c];
        float mu = (float) (warp_sum_d(s) / cols);
        for (int c = lane; c < cols; c += 32)
                v += (double) (xr[c] - mu) * (xr[c] - mu);
        float rs = 1.0f / sqrtf((float) (warp_sum_d(v) / cols) + eps);
        if (lane == 0) {
                mean[row] = mu;
                rstd[row] = rs;
        }
        for (int c = lane; c < cols; c += 32)
                yr[c] = (xr[c] - mu) * rs * g[c] + b[c];
}

/* dx of one row per warp: with xh = (x - mean) rstd and gy = dy g,
 * dx = rstd (gy - mean(gy) - xh mean(gy xh)). */
static __global__ void layernorm_dx_kernel(const float *dy, const float *x, const float *g, const float *mean,
                                           const float *rstd, int rows, int cols, float *dx) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        double s1 = 0.0, s2 = 0.0;

        if (row >= rows)
                return;
        const float *xr = x + (size_t) row * cols, *dyr = dy + (size_t) row * cols;
        float *dxr = dx + (size_t) row * cols, mu = mean[row], rs = rstd[row];
        for (int c = lane; c < cols; c += 32) {
                float xh = (xr[c] - mu) * rs, gy = dyr[c] * g[c];
                s1 += gy;
                s2 += (double) gy * xh;
        }
        float m1 = (float) (warp_sum_d(s1) / cols), m2 = (float) (warp_sum_d(s2) / cols);
        for (int c = lane; c < cols; c += 32) {
                float xh = (xr[c] - mu) * rs;
                dxr[c] = rs * (dyr[c] * g[c] - m1 - xh * m2);
        }
}

/* dg[c] = sum over rows of dy xh, db[c] = sum of dy: colsum's blocks (LN_X
 * columns by LN_Y strips, added in shared memory; deterministic). */
static __global__ void layernorm_dgb_kernel(const float *dy, const float *x, const float *mean, const float *rstd,
                                            int rows, int cols, float *dg, float *db) {
        __shared__ float pg[LN_Y][LN_X], pb[LN_Y][LN_X];
        int c = blockIdx.x * LN_X + threadIdx.x;
        float sg = 0.0f, sb = 0.0f;

        if (c < cols)
                for (int r = threadIdx.y; r < rows; r += LN_Y) {
                        size_t at = (size_t) r * cols + c;
                        sg += dy[at] * ((x[at] - mean[r]) * rstd[r]);
                        sb += dy[at];
                }
        pg[threadIdx.y][threadIdx.x] = sg;
        pb[threadIdx.y][threadIdx.x] = sb;
        __syncthreads();
        for (int h = LN_Y / 2; h > 0; h /= 2) {
                if (threadIdx.y < h) {
                        pg[threadIdx.y][threadIdx.x] += pg[threadIdx.y + h][threadIdx.x];
                        pb[threadIdx.y][threadIdx.x] += pb[threadIdx.y + h][threadIdx.x];
                }
                __syncthreads();
        }
        if (threadIdx.y == 0 && c < cols) {
                dg[c] = pg[0][threadIdx.x];
                db[c] = pb[0][threadIdx.x];
        }
}

/* Sets *flag when an id is not a whole number in [0, vocab). */
static __global__ void check_ids_kernel(const float *ids, int n, int vocab, int *flag) {
        FOR_EACH(i, (size_t) n) {
                float v = ids[i];
                if (!(v >= 0.0f && v < (float) vocab) || v != floorf(v))
                        *flag = 1;
        }
}

static __global__ void embedding_kernel(const float *ids, const float *table, int dim, size_t total, float *y,
                                        const int *flag) {
        if (*flag)
                return;
        FOR_EACH(o, total)
        y[o] = table[(size_t) ids[o / dim] * dim + o % dim];
}

static __global__ void zero_kernel(float *p, size_t n, const int *flag) {
        if (*flag)
                return;
        FOR_EACH(i, n)
        p[i] = 0.0f;
}

static __global__ void embedding_backward_kernel(const float *ids, const float *dy, int dim, size_t total,
                                                 float *dtable, const int *flag) {
        if (*flag)
                return;
        FOR_EACH(o, total)
        atomicAdd(&dtable[(size_t) ids[o / dim] * dim + o % dim], dy[o]);
}

/* One warp per row, the CPU's form: columns past the row's query masked. */
static __global__ void softmax_kernel(const float *x, float *y, int rows, int cols, int causal_t) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        float mx = -INFINITY, sum = 0.0f;

        if (row >= rows)
                return;
        const float *xr = x + (size_t) row * cols;
        float *yr = y + (size_t) row * cols;
        int last = causal_t > 0 ? min(row % causal_t, cols - 1) : cols - 1;
        for (int c = lane; c <= last; c += 32)
                mx = fmaxf(mx, xr[c]);
        mx = warp_max(mx);
        for (int c = lane; c <= last; c += 32)
                sum += expf(xr[c] - mx);
        float inv = 1.0f / warp_sum(sum);
        for (int c = lane; c < cols; c += 32)
                yr[c] = c <= last ? expf(xr[c] - mx) * inv : 0.0f;
}

/* dx = y (dy - sum(dy y)) per row; dx may be dy: lane c % 32 alone reads and
 * then writes element c. */
static __global__ void softmax_backward_kernel(const float *y, const float *dy, float *dx, int rows, int cols) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        float dot = 0.0f;

        if (row >= rows)
                return;
        const float *yr = y + (size_t) row * cols, *dyr = dy + (size_t) row * cols;
        float *dxr = dx + (size_t) row * cols;
        for (int c = lane; c < cols; c += 32)
                dot += yr[c] * dyr[c];
        dot = warp_sum(dot);
        for (int c = lane; c < cols; c += 32)
                dxr[c] = yr[c] * (dyr[c] - dot);
}

/* ---------------------------------------------------------------------------
 * Launchers
 * ------------------------------------------------------------------------- */

/* Memory ranges [a, a+n) and [b, b+n) overlap. */
static bool overlap(const void *a, const void *b, size_t n) {
        uintptr_t x = (uintptr_t) a, y = (uintptr_t) b;
        return x < y + n && y < x + n;
}

int cuda_copy(KBackend *kb, void *dst, const void *src, size_t bytes) {
        if (bytes == 0 || dst == src)
                return dst || bytes == 0 ? 0 : -EINVAL;
        if (!dst || !src || overlap(dst, src, bytes))
                return -EINVAL;
        return cuda_errno(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(kb)));
}

int cuda_axpy(KBackend *kb, size_t n, float alpha, const float *x, float *y) {
        if (n == 0)
                return 0;
        if (!x || !y)
                return -EINVAL;
        axpy_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(n, alpha, x, y);
        return launched();
}

/* Row-major, as cuda_gemm: cuBLAS gets B before A, n before m. */
int cuda_gemm_batched(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                      int lda, long long sa, const float *b, int ldb, long long sb, float beta, float *c, int ldc,
                      long long sc, int count) {
        int r = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);

        if (count < 0 || sa < 0 || sb < 0 || sc < 0)
                return -EINVAL;
        if (r != 0 || count == 0)
                return r < 0 ? r : 0;
        if (k == 0) {
                scale_batched_kernel<<<blocks_for(numel(m, n) * (size_t) count), BLOCK, 0, stream(kb)>>>(
                        c, m, n, ldc, sc, count, beta);
                return launched();
        }
        return blas_errno(cublasSgemmStridedBatched(priv(kb)->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, sb,
                                                    a, lda, sa, &beta, c, ldc, sc, count));
}

int cuda_permute0213(KBackend *kb, const float *x, int a, int b, int c, int d, float *y) {
        if (a < 0 || b < 0 || c < 0 || d < 0)
                return -EINVAL;
        size_t total = (size_t) a * b * c * d;
        if (total == 0)
                return 0;
        if (!x || !y || overlap(x, y, total * sizeof *x))
                return -EINVAL;
        permute0213_kernel<<<blocks_for(total), BLOCK, 0, stream(kb)>>>(x, b, c, d, total, y);
        return launched();
}

static size_t image_numel(const KWindow *w) {
        return (size_t) w->n * w->h * w->w * w->c;
}

static size_t out_numel(const KWindow *w) {
        return (size_t) w->n * w->ho * w->wo * w->c;
}

int cuda_im2col(KBackend *kb, const KWindow *w, const float *x, float *col) {
        if (!window_valid(w) || !x || !col)
                return -EINVAL;
        size_t total = out_numel(w) * w->k * w->k;
        im2col_kernel<<<blocks_for(total), BLOCK, 0, stream(kb)>>>(*w, x, total, col);
        return launched();
}

int cuda_col2im(KBackend *kb, const KWindow *w, const float *col, float *dx) {
        if (!window_valid(w) || !col || !dx)
                return -EINVAL;
        col2im_kernel<<<blocks_for(image_numel(w)), BLOCK, 0, stream(kb)>>>(*w, col, image_numel(w), dx);
        return launched();
}

int cuda_pool(KBackend *kb, const KWindow *w, bool max, const float *x, float *y, int32_t *idx) {
        if (!window_valid(w) || !x || !y || (max && !idx))
                return -EINVAL;
        pool_kernel<<<blocks_for(out_numel(w)), BLOCK, 0, stream(kb)>>>(*w, max, x, out_numel(w), y, idx);
        return launched();
}

int cuda_pool_backward(KBackend *kb, const KWindow *w, bool max, const float *dy, const int32_t *idx, float *dx) {
        if (!window_valid(w) || !dy || !dx || (max && !idx))
                return -EINVAL;
        pool_backward_kernel<<<blocks_for(image_numel(w)), BLOCK, 0, stream(kb)>>>(*w, max, dy, idx, image_numel(w),
                                                                                   dx);
        return launched();
}

int cuda_gelu(KBackend *kb, const float *x, float *y, size_t n) {
        if (n == 0)
                return 0;
        if (!x || !y)
                return -EINVAL;
        gelu_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(x, y, n);
        return launched();
}

int cuda_gelu_backward(KBackend *kb, const float *x, const float *dy, float *dx, size_t n) {
        if (n == 0)
                return 0;
        if (!x || !dy || !dx)
                return -EINVAL;
        gelu_backward_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(x, dy, dx, n);
        return launched();
}

int cuda_dropout(KBackend *kb, const float *x, float *y, float *mask, size_t n, float p, uint64_t seed) {
        if (!(p >= 0.0f && p < 1.0f) || (n > 0 && (!x || !y || !mask)))
                return -EINVAL;
        if (n == 0)
                return 0;
        dropout_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(x, y, mask, n, p, 1.0f / (1.0f - p), seed);
        return launched();
}

int cuda_mul(KBackend *kb, const float *a, const float *b, float *out, size_t n) {
        if (n == 0)
                return 0;
        if (!a || !b || !out)
                return -EINVAL;
        mul_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(a, b, out, n);
        return launched();
}

int cuda_layernorm(KBackend *kb, const float *x, const float *g, const float *b, int rows, int cols, float eps,
                   float *y, float *mean, float *rstd) {
        if (rows < 0 || cols < 1 || !(eps > 0.0f))
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!x || !g || !b || !y || !mean || !rstd)
                return -EINVAL;
        layernorm_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, stream(kb)>>>(x, g, b, rows, cols, eps, y, mean, rstd);
        return launched();
}

int cuda_layernorm_backward(KBackend *kb, const float *dy, const float *x, const float *g, const float *mean,
                            const float *rstd, int rows, int cols, float *dx, float *dg, float *db) {
        int r;

        if (rows < 0 || cols < 1 || !dg || !db)
                return -EINVAL;
        if (rows > 0 && (!dy || !x || !g || !mean || !rstd || !dx))
                return -EINVAL;
        if (rows > 0) {
                layernorm_dx_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, stream(kb)>>>(dy, x, g, mean, rstd, rows,
                                                                                          cols, dx);
                if ((r = launched()) < 0)
                        return r;
        }
        /* rows == 0: the kernel's sums are empty, so it writes the zeros. */
        layernorm_dgb_kernel<<<(unsigned) ((cols + LN_X - 1) / LN_X), dim3(LN_X, LN_Y), 0, stream(kb)>>>(
                dy, x, mean, rstd, rows, cols, dg, db);
        return launched();
}

/* Zeroes the device flag and checks the ids into it (embedding's ops then
 * read it); or_flag_kernel after them carries it to the next wait. */
static int ids_check(KBackend *kb, const float *ids, int n, int vocab) {
        CudaBackend *cb = priv(kb);
        int r = cuda_errno(cudaMemsetAsync(cb->flag_dev, 0, sizeof *cb->flag_dev, cb->stream));

        if (r < 0)
                return r;
        check_ids_kernel<<<blocks_for((size_t) n), BLOCK, 0, cb->stream>>>(ids, n, vocab, cb->flag_dev);
        return launched();
}

static int flag_out(KBackend *kb) {
        or_flag_kernel<<<1, 1, 0, stream(kb)>>>(priv(kb)->flag_dev, priv(kb)->flag_host);
        return launched();
}

int cuda_embedding(KBackend *kb, const float *ids, const float *table, int n, int dim, int vocab, float *y) {
        int r;

        if (n < 0 || dim < 1 || vocab < 1)
                return -EINVAL;
        if (n == 0)
                return 0;
        if (!ids || !table || !y)
                return -EINVAL;
        if ((r = ids_check(kb, ids, n, vocab)) < 0)
                return r;
        size_t total = (size_t) n * dim;
        embedding_kernel<<<blocks_for(total), BLOCK, 0, stream(kb)>>>(ids, table, dim, total, y, priv(kb)->flag_dev);
        if ((r = launched()) < 0)
                return r;
        return flag_out(kb);
}

int cuda_embedding_backward(KBackend *kb, const float *ids, const float *dy, int n, int dim, int vocab,
                            float *dtable) {
        int r;

        if (n < 0 || dim < 1 || vocab < 1 || !dtable || (n > 0 && (!ids || !dy)))
                return -EINVAL;
        if (n == 0)
                return cuda_errno(cudaMemsetAsync(dtable, 0, (size_t) vocab * dim * sizeof *dtable, stream(kb)));
        if ((r = ids_check(kb, ids, n, vocab)) < 0)
                return r;
        zero_kernel<<<blocks_for((size_t) vocab * dim), BLOCK, 0, stream(kb)>>>(dtable, (size_t) vocab * dim,
                                                                                  priv(kb)->flag_dev);
        if ((r = launched()) < 0)
                return r;
        size_t total = (size_t) n * dim;
        embedding_backward_kernel<<<blocks_for(total), BLOCK, 0, stream(kb)>>>(ids, dy, dim, total, dtable,
                                                                                priv(kb)->flag_dev);
        if ((r = launched()) < 0)
                return r;
        return flag_out(kb);
}

int cuda_softmax(KBackend *kb, const float *x, float *y, int rows, int cols, int causal_t) {
        if (rows < 0 || cols < 1 || causal_t < 0)
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!x || !y)
                return -EINVAL;
        softmax_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, stream(kb)>>>(x, y, rows, cols, causal_t);
        return launched();
}

int cuda_softmax_backward(KBackend *kb, const float *y, const float *dy, float *dx, int rows, int cols) {
        if (rows < 0 || cols < 1)
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!y || !dy || !dx)
                return -EINVAL;
        softmax_backward_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, stream(kb)>>>(y, dy, dx, rows, cols);
        return launched();
}
