/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU backend's layer ops (kernels.h, "the layer ops"): the reference the
 * CUDA ones are compared with, so plain loops that are obviously right (the
 * batched product is gemm's loop, in kernels-cpu.c). */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "kernels-check.h"
#include "kernels-cpu-layers.h"

int cpu_axpy(KBackend *kb, size_t n, float alpha, const float *x, float *y) {
        (void) kb;
        if (n == 0)
                return 0;
        if (!x || !y)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                y[i] += alpha * x[i];
        return 0;
}

int cpu_permute0213(KBackend *kb, const float *x, int a, int b, int c, int d, float *y) {
        (void) kb;
        if (a < 0 || b < 0 || c < 0 || d < 0)
                return -EINVAL;
        if ((size_t) a * b * c * d == 0)
                return 0;
        if (!x || !y)
                return -EINVAL;
        for (int i = 0; i < a; i++)
                for (int j = 0; j < b; j++)
                        for (int l = 0; l < c; l++)
                                memcpy(y + (((size_t) i * c + l) * b + j) * d, x + (((size_t) i * b + j) * c + l) * d,
                                       (size_t) d * sizeof *x);
        return 0;
}

/* The input offset of (image i, row y, column x, channel ch), or -1 in the padding. */
static long long win_at(const KWindow *w, int i, int y, int x, int ch) {
        if (y < 0 || y >= w->h || x < 0 || x >= w->w)
                return -1;
        return (((long long) i * w->h + y) * w->w + x) * w->c + ch;
}

int cpu_im2col(KBackend *kb, const KWindow *w, const float *x, float *col) {
        (void) kb;
        if (!window_valid(w) || !x || !col)
                return -EINVAL;
        size_t kk = (size_t) w->k * w->k, ncol = (size_t) w->c * kk;
        for (int i = 0; i < w->n; i++)
                for (int oy = 0; oy < w->ho; oy++)
                        for (int ox = 0; ox < w->wo; ox++) {
                                float *row = col + (((size_t) i * w->ho + oy) * w->wo + ox) * ncol;
                                for (int ch = 0; ch < w->c; ch++)
                                        for (int ky = 0; ky < w->k; ky++)
                                                for (int kx = 0; kx < w->k; kx++) {
                                                        long long at = win_at(w, i, oy * w->stride - w->pad + ky,
                                                                              ox * w->stride - w->pad + kx, ch);
                                                        row[(size_t) ch * kk + (size_t) ky * w->k + kx] =
                                                                at < 0 ? 0.0f : x[at];
                                                }
                        }
        return 0;
}

int cpu_col2im(KBackend *kb, const KWindow *w, const float *col, float *dx) {
        (void) kb;
        if (!window_valid(w) || !col || !dx)
                return -EINVAL;
        size_t kk = (size_t) w->k * w->k, ncol = (size_t) w->c * kk;
        memset(dx, 0, (size_t) w->n * w->h * w->w * w->c * sizeof *dx);
        for (int i = 0; i < w->n; i++)
                for (int oy = 0; oy < w->ho; oy++)
                        for (int ox = 0; ox < w->wo; ox++) {
                                const float *row = col + (((size_t) i * w->ho + oy) * w->wo + ox) * ncol;
                                for (int ch = 0; ch < w->c; ch++)
                                        for (int ky = 0; ky < w->k; ky++)
                                                for (int kx = 0; kx < w->k; kx++) {
                                                        long long at = win_at(w, i, oy * w->stride - w->pad + ky,
                                                                              ox * w->stride - w->pad + kx, ch);
                                                        if (at >= 0)
                                                                dx[at] += row[(size_t) ch * kk + (size_t) ky * w->k + kx];
                                                }
                        }
        return 0;
}

int cpu_pool(KBackend *kb, const KWindow *w, bool max, const float *x, float *y, int32_t *idx) {
        (void) kb;
        if (!window_valid(w) || !x || !y || (max && !idx))
                return -EINVAL;
        size_t sample = (size_t) w->h * w->w * w->c;
        for (int i = 0; i < w->n; i++)
                for (int oy = 0; oy < w->ho; oy++)
                        for (int ox = 0; ox < w->wo; ox++)
                                for (int ch = 0; ch < w->c; ch++) {
                                        size_t o = (((size_t) i * w->ho + oy) * w->wo + ox) * w->c + ch;
                                        float best = -INFINITY, sum = 0.0f;
                                        long long arg = -1;
                                        for (int ky = 0; ky < w->k; ky++)
                                                for (int kx = 0; kx < w->k; kx++) {
                                                        long long at = win_at(w, i, oy * w->stride - w->pad + ky,
                                                                              ox * w->stride - w->pad + kx, ch);
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
                                                idx[o] = (int32_t) (arg - (long long) i * (long long) sample);
                                        } else
                                                y[o] = sum / (float) (w->k * w->k);
                                }
        return 0;
}

int cpu_pool_backward(KBackend *kb, const KWindow *w, bool max, const float *dy, const int32_t *idx, float *dx) {
        (void) kb;
        if (!window_valid(w) || !dy || !dx || (max && !idx))
                return -EINVAL;
        size_t sample = (size_t) w->h * w->w * w->c;
        memset(dx, 0, (size_t) w->n * sample * sizeof *dx);
        for (int i = 0; i < w->n; i++)
                for (int oy = 0; oy < w->ho; oy++)
                        for (int ox = 0; ox < w->wo; ox++)
                                for (int ch = 0; ch < w->c; ch++) {
                                        size_t o = (((size_t) i * w->ho + oy) * w->wo + ox) * w->c + ch;
                                        if (max) {
                                                if (idx[o] < 0 || (size_t) idx[o] >= sample)
                                                        return -EINVAL;
                                                dx[(size_t) i * sample + (size_t) idx[o]] += dy[o];
                                                continue;
                                        }
                                        float g = dy[o] / (float) (w->k * w->k);
                                        for (int ky = 0; ky < w->k; ky++)
                                                for (int kx = 0; kx < w->k; kx++) {
                                                        long long at = win_at(w, i, oy * w->stride - w->pad + ky,
                                                                              ox * w->stride - w->pad + kx, ch);
                                                        if (at >= 0)
                                                                dx[at] += g;
                                                }
                                }
        return 0;
}

int cpu_gelu(KBackend *kb, const float *x, float *y, size_t n) {
        (void) kb;
        if (n > 0 && (!x || !y))
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float) M_SQRT1_2));
        return 0;
}

/* gelu'(x) = Phi(x) + x phi(x). */
int cpu_gelu_backward(KBackend *kb, const float *x, const float *dy, float *dx, size_t n) {
        (void) kb;
        if (n > 0 && (!x || !dy || !dx))
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                float cdf = 0.5f * (1.0f + erff(x[i] * (float) M_SQRT1_2));
                float pdf = expf(-0.5f * x[i] * x[i]) * (float) (0.5 * M_2_SQRTPI * M_SQRT1_2);
                dx[i] = dy[i] * (cdf + x[i] * pdf);
        }
        return 0;
}

int cpu_dropout(KBackend *kb, const float *x, float *y, float *mask, size_t n, float p, uint64_t seed) {
        (void) kb;
        if (!(p >= 0.0f && p < 1.0f) || (n > 0 && (!x || !y || !mask)))
                return -EINVAL;
        float keep = 1.0f / (1.0f - p);
        for (size_t i = 0; i < n; i++) {
                mask[i] = dropout_keep(seed, i, p) ? keep : 0.0f;
                y[i] = x[i] * mask[i];
        }
        return 0;
}

int cpu_mul(KBackend *kb, const float *a, const float *b, float *out, size_t n) {
        (void) kb;
        if (n > 0 && (!a || !b || !out))
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                out[i] = a[i] * b[i];
        return 0;
}

int cpu_layernorm(KBackend *kb, const float *x, const float *g, const float *b, int rows, int cols, float eps, float *y,
                  float *mean, float *rstd) {
        (void) kb;
        if (rows < 0 || cols < 1 || !(eps > 0.0f))
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!x || !g || !b || !y || !mean || !rstd)
                return -EINVAL;
        for (int r = 0; r < rows; r++) {
                const float *xr = x + (size_t) r * cols;
                float *yr = y + (size_t) r * cols;
                double s = 0.0, v = 0.0;
                for (int c = 0; c < cols; c++)
                        s += xr[c];
                float mu = (float) (s / cols);
                for (int c = 0; c < cols; c++)
                        v += (double) (xr[c] - mu) * (xr[c] - mu);
                float rs = 1.0f / sqrtf((float) (v / cols) + eps);
                mean[r] = mu;
                rstd[r] = rs;
                for (int c = 0; c < cols; c++)
                        yr[c] = (xr[c] - mu) * rs * g[c] + b[c];
        }
        return 0;
}

/* With xh = (x - mean) rstd and gy = dy g: dx = rstd (gy - mean(gy) - xh mean(gy xh)). */
int cpu_layernorm_backward(KBackend *kb, const float *dy, const float *x, const float *g, const float *mean,
                           const float *rstd, int rows, int cols, float *dx, float *dg, float *db) {
        (void) kb;
        if (rows < 0 || cols < 1)
                return -EINVAL;
        if (!dg || !db)
                return -EINVAL;
        memset(dg, 0, (size_t) cols * sizeof *dg);
        memset(db, 0, (size_t) cols * sizeof *db);
        if (rows == 0)
                return 0;
        if (!dy || !x || !g || !mean || !rstd || !dx)
                return -EINVAL;
        for (int r = 0; r < rows; r++) {
                const float *xr = x + (size_t) r * cols, *dyr = dy + (size_t) r * cols;
                float *dxr = dx + (size_t) r * cols;
                double s1 = 0.0, s2 = 0.0;
                for (int c = 0; c < cols; c++) {
                        float xh = (xr[c] - mean[r]) * rstd[r], gy = dyr[c] * g[c];
                        dg[c] += dyr[c] * xh;
                        db[c] += dyr[c];
                        s1 += gy;
                        s2 += (double) gy * xh;
                }
                float m1 = (float) (s1 / cols), m2 = (float) (s2 / cols);
                for (int c = 0; c < cols; c++) {
                        float xh = (xr[c] - mean[r]) * rstd[r];
                        dxr[c] = rstd[r] * (dyr[c] * g[c] - m1 - xh * m2);
                }
        }
        return 0;
}

static bool ids_ok(const float *ids, int n, int vocab) {
        for (int i = 0; i < n; i++)
                if (!(ids[i] >= 0.0f && ids[i] < (float) vocab) || ids[i] != floorf(ids[i]))
                        return false;
        return true;
}

int cpu_embedding(KBackend *kb, const float *ids, const float *table, int n, int dim, int vocab, float *y) {
        (void) kb;
        if (n < 0 || dim < 1 || vocab < 1)
                return -EINVAL;
        if (n == 0)
                return 0;
        if (!ids || !table || !y || !ids_ok(ids, n, vocab))
                return -EINVAL;
        for (int i = 0; i < n; i++)
                memcpy(y + (size_t) i * dim, table + (size_t) ids[i] * dim, (size_t) dim * sizeof *y);
        return 0;
}

int cpu_embedding_backward(KBackend *kb, const float *ids, const float *dy, int n, int dim, int vocab, float *dtable) {
        (void) kb;
        if (n < 0 || dim < 1 || vocab < 1 || !dtable || (n > 0 && (!ids || !dy)))
                return -EINVAL;
        if (n > 0 && !ids_ok(ids, n, vocab))
                return -EINVAL;
        memset(dtable, 0, (size_t) vocab * dim * sizeof *dtable);
        for (int i = 0; i < n; i++) {
                float *row = dtable + (size_t) ids[i] * dim;
                for (int c = 0; c < dim; c++)
                        row[c] += dy[(size_t) i * dim + c];
        }
        return 0;
}

int cpu_softmax(KBackend *kb, const float *x, float *y, int rows, int cols, int causal_t) {
        (void) kb;
        if (rows < 0 || cols < 1 || causal_t < 0)
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!x || !y)
                return -EINVAL;
        for (int r = 0; r < rows; r++) {
                const float *xr = x + (size_t) r * cols;
                float *yr = y + (size_t) r * cols;
                int last = causal_t > 0 ? MIN_INT(r % causal_t, cols - 1) : cols - 1;
                float mx = xr[0], sum = 0.0f;
                for (int c = 1; c <= last; c++)
                        if (xr[c] > mx)
                                mx = xr[c];
                for (int c = 0; c <= last; c++) {
                        yr[c] = expf(xr[c] - mx);
                        sum += yr[c];
                }
                for (int c = 0; c <= last; c++)
                        yr[c] /= sum;
                for (int c = last + 1; c < cols; c++)
                        yr[c] = 0.0f;
        }
        return 0;
}

int cpu_softmax_backward(KBackend *kb, const float *y, const float *dy, float *dx, int rows, int cols) {
        (void) kb;
        if (rows < 0 || cols < 1)
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!y || !dy || !dx)
                return -EINVAL;
        for (int r = 0; r < rows; r++) {
                const float *yr = y + (size_t) r * cols, *dyr = dy + (size_t) r * cols;
                float *dxr = dx + (size_t) r * cols, dot = 0.0f;
                for (int c = 0; c < cols; c++)
                        dot += yr[c] * dyr[c];
                for (int c = 0; c < cols; c++)
                        dxr[c] = yr[c] * (dyr[c] - dot);
        }
        return 0;
}
