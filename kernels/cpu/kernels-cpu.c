/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU backend: OpenBLAS for gemm and plain C loops for the rest. It is the
 * reference every other backend is tested against, so it favours being obviously
 * right over being fast. Buffers are ordinary host memory (64-byte aligned), so
 * upload and download are copies and sync has nothing to wait for. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "kernels-check.h"
#include "cpu/kernels-cpu-layers.h"


static void cpu_destroy(KBackend *kb) {
        free(kb);
}

static int cpu_alloc(KBackend *kb, size_t bytes, void **ret) {
        void *p = NULL;

        (void) kb;
        if (!ret)
                return -EINVAL;
        /* posix_memalign returns the error number instead of setting errno. */
        if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0)
                return -ENOMEM;
        *ret = p;
        return 0;
}

static void cpu_free(KBackend *kb, void *p) {
        (void) kb;
        free(p);
}

static int cpu_copy(KBackend *kb, void *dst, const void *src, size_t bytes) {
        (void) kb;
        if (bytes == 0)
                return 0;
        if (!dst || !src)
                return -EINVAL;
        memmove(dst, src, bytes);
        return 0;
}

static int cpu_sync(KBackend *kb) {
        (void) kb;
        return 0;
}

/* BLAS semantics: m, n or k may be zero; leading dimensions must cover the
 * stored row length (row-major) and be at least 1. k == 0 leaves C = beta * C. */
static int cpu_gemm(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c,
                    int ldc) {
        (void) kb;
        int r = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
        if (r != 0)
                return r < 0 ? r : 0;

        if (k == 0) {
                for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++)
                                c[(size_t) i * ldc + j] =
                                        beta == 0.0f ? 0.0f : beta * c[(size_t) i * ldc + j];
                return 0;
        }

        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                    ldc);
        return 0;
}

/* gemm on each of count (A, B, C) triples, strides in floats. */
static int cpu_gemm_batched(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, long long sa, const float *b, int ldb, long long sb, float beta,
                            float *c, int ldc, long long sc, int count) {
        int r = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);

        if (count < 0 || sa < 0 || sb < 0 || sc < 0)
                return -EINVAL;
        if (r != 0 || count == 0)
                return r < 0 ? r : 0;
        for (int i = 0; i < count && r == 0; i++)
                r = cpu_gemm(kb, trans_a, trans_b, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc,
                             ldc);
        return r;
}

static int cpu_bias_act(KBackend *kb, float *y, const float *bias, int rows, int cols, KAct act) {
        int rc = bias_act_check(rows, cols, act, y);

        (void) kb;
        if (rc != 0)
                return rc < 0 ? rc : 0;

        for (int r = 0; r < rows; r++) {
                float *row = y + (size_t) r * cols;
                for (int c = 0; c < cols; c++) {
                        float v = row[c] + (bias ? bias[c] : 0.0f);
                        if (act == KACT_RELU && !(v > 0.0f))
                                v = 0.0f;
                        row[c] = v;
                }
        }
        return 0;
}

/* ReLU' is taken as 0 at y == 0 (the output of a clamped unit). */
static int cpu_act_backward(KBackend *kb, float *dy, const float *y, size_t n, KAct act) {
        int rc = act_backward_check(n, act, dy, y);

        (void) kb;
        if (rc != 0)
                return rc < 0 ? rc : 0;

        for (size_t i = 0; i < n; i++)
                if (!(y[i] > 0.0f))
                        dy[i] = 0.0f;
        return 0;
}

/* rows == 0 gives zeros (the empty sum). */
static int cpu_colsum(KBackend *kb, const float *x, int rows, int cols, float *out) {
        int rc = colsum_check(rows, cols, x, out);

        (void) kb;
        if (rc != 0)
                return rc < 0 ? rc : 0;

        for (int c = 0; c < cols; c++)
                out[c] = 0.0f;
        for (int r = 0; r < rows; r++) {
                const float *row = x + (size_t) r * cols;
                for (int c = 0; c < cols; c++)
                        out[c] += row[c];
        }
        return 0;
}

/* Stable form: with m = max x[c], log softmax[c] = (x[c] - m) - log sum exp(x - m),
 * so no exp overflows and the loss stays finite even where softmax underflows.
 * Each row is read before it is written, which is what lets dlogits == logits. */
static int cpu_softmax_xent(KBackend *kb, const float *logits, const int32_t *labels, int rows,
                            int cols, float scale, float *dlogits, float *loss) {
        int rc = rows_check(rows, cols, logits && labels && dlogits && loss);

        (void) kb;
        if (rc != 0)
                return rc < 0 ? rc : 0;
        /* Check every label first so that a bad batch writes nothing. */
        for (int r = 0; r < rows; r++)
                if (labels[r] < 0 || labels[r] >= cols)
                        return -EINVAL;

        for (int r = 0; r < rows; r++) {
                const float *x = logits + (size_t) r * cols;
                float *d = dlogits + (size_t) r * cols;
                int32_t label = labels[r];
                float mx = x[0], sum = 0.0f, logsum, inv;

                for (int c = 1; c < cols; c++)
                        if (x[c] > mx)
                                mx = x[c];
                for (int c = 0; c < cols; c++)
                        sum += expf(x[c] - mx);
                logsum = logf(sum);
                inv = 1.0f / sum;
                loss[r] = logsum - (x[label] - mx);
                for (int c = 0; c < cols; c++) {
                        float p = expf(x[c] - mx) * inv;
                        d[c] = (p - (c == label ? 1.0f : 0.0f)) * scale;
                }
        }
        return 0;
}

/* Ties go to the lowest index. */
static int cpu_argmax(KBackend *kb, const float *x, int rows, int cols, int32_t *out) {
        int rc = rows_check(rows, cols, x && out);

        (void) kb;
        if (rc != 0)
                return rc < 0 ? rc : 0;

        for (int r = 0; r < rows; r++) {
                const float *row = x + (size_t) r * cols;
                int32_t best = 0;
                for (int c = 1; c < cols; c++)
                        if (row[c] > row[best])
                                best = c;
                out[r] = best;
        }
        return 0;
}

static int cpu_sgd_step(KBackend *kb, float *w, const float *g, float *v, size_t n, float lr,
                        float mu) {
        int rc = sgd_step_check(n, w, g, v);

        (void) kb;
        if (rc != 0)
                return rc < 0 ? rc : 0;

        for (size_t i = 0; i < n; i++) {
                v[i] = mu * v[i] + g[i];
                w[i] -= lr * v[i];
        }
        return 0;
}

static int cpu_gemm_ep(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                       int lda, const float *b, int ldb, float *c, int ldc, KEpilogue ep, float *vec) {
        int r = gemm_ep_check(m, n, k, ep, vec);
        if (r != 0)
                return r < 0 ? r : 0;
        r = cpu_gemm(kb, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
        if (r < 0 || ep == KEPI_NONE)
                return r;
        if (ep == KEPI_BGRAD) {
                for (int i = 0; i < m; i++) {
                        float s = 0.0f;
                        for (int j = 0; j < k; j++)
                                s += trans_a ? a[(size_t) j * lda + i] : a[(size_t) i * lda + j];
                        vec[i] = s;
                }
                return 0;
        }
        for (int i = 0; i < m; i++) {
                float *row = c + (size_t) i * ldc;
                for (int j = 0; j < n; j++) {
                        float v = row[j] + vec[j];
                        row[j] = ep == KEPI_BIAS_RELU && !(v > 0.0f) ? 0.0f : v;
                }
        }
        return 0;
}

static int cpu_host_alloc(KBackend *kb, size_t bytes, void **ret) {
        return cpu_alloc(kb, bytes, ret);
}

/* Copies at once: there is nothing to overlap with. */
static int cpu_download_async(KBackend *kb, void *dst_host, const void *src, size_t bytes, unsigned slot) {
        if (slot >= KB_SLOTS)
                return -EINVAL;
        return cpu_copy(kb, dst_host, src, bytes);
}

static int cpu_wait_slot(KBackend *kb, unsigned slot) {
        (void) kb;
        return slot < KB_SLOTS ? 0 : -EINVAL;
}

static int cpu_capture_begin(KBackend *kb) {
        (void) kb;
        return -ENOTSUP;
}

static int cpu_capture_end(KBackend *kb, KGraph **ret) {
        (void) kb;
        (void) ret;
        return -ENOTSUP;
}

static int cpu_graph_run(KBackend *kb, KGraph *g) {
        (void) kb;
        (void) g;
        return -ENOTSUP;
}

static void cpu_graph_free(KBackend *kb, KGraph *g) {
        (void) kb;
        (void) g;
}

static int cpu_set_tf32(KBackend *kb, bool on) {
        (void) kb;
        return on ? -ENOTSUP : 0;
}

static const KernelsOps cpu_ops = {
        .name = "cpu",
        .async = false,
        .host_memory = true,
        .destroy = cpu_destroy,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .upload = cpu_copy,
        .download = cpu_copy,
        .sync = cpu_sync,
        .gemm = cpu_gemm,
        .bias_act = cpu_bias_act,
        .act_backward = cpu_act_backward,
        .colsum = cpu_colsum,
        .softmax_xent = cpu_softmax_xent,
        .argmax = cpu_argmax,
        .sgd_step = cpu_sgd_step,
        .gemm_ep = cpu_gemm_ep,
        .host_alloc = cpu_host_alloc,
        .host_free = cpu_free,
        .download_async = cpu_download_async,
        .wait_slot = cpu_wait_slot,
        .capture_begin = cpu_capture_begin,
        .capture_end = cpu_capture_end,
        .graph_run = cpu_graph_run,
        .graph_free = cpu_graph_free,
        .set_tf32 = cpu_set_tf32,
        .copy = cpu_copy,
        .axpy = cpu_axpy,
        .gemm_batched = cpu_gemm_batched,
        .permute0213 = cpu_permute0213,
        .im2col = cpu_im2col,
        .col2im = cpu_col2im,
        .pool = cpu_pool,
        .pool_backward = cpu_pool_backward,
        .gelu = cpu_gelu,
        .gelu_backward = cpu_gelu_backward,
        .dropout = cpu_dropout,
        .mul = cpu_mul,
        .layernorm = cpu_layernorm,
        .layernorm_backward = cpu_layernorm_backward,
        .embedding = cpu_embedding,
        .embedding_backward = cpu_embedding_backward,
        .softmax = cpu_softmax,
        .softmax_backward = cpu_softmax_backward,
};

int kbackend_cpu_new(int threads, KBackend **ret, char *err, size_t errlen) {
        KBackend *kb;

        if (!ret || threads < 0) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "invalid CPU backend thread count %d", threads);
                return -EINVAL;
        }

        kb = calloc(1, sizeof *kb);
        if (!kb) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "out of memory creating the CPU backend");
                return -ENOMEM;
        }
        kb->ops = &cpu_ops;
        kb->priv = NULL;

        if (threads > 0)
                openblas_set_num_threads(threads);

        *ret = kb;
        return 0;
}
