/* SPDX-License-Identifier: Apache-2.0 */
/* The compute backend interface. Models are written once against it; kernels/cpu
 * implements it with OpenBLAS and plain C (the reference), kernels/cuda with
 * cuBLAS and CUDA kernels. It knows nothing of ZeroMQ, libuv or protobuf: it
 * computes on buffers.
 *
 * Conventions: matrices are row-major; every pointer passed to an op is a
 * backend buffer from kb_alloc (device memory on CUDA) unless named *_host;
 * ops may be asynchronous until sync or a download; every op returns 0 or a
 * negative errno (-EINVAL for bad shapes, -EIO for a device failure). An error
 * found on the device after an op returned (a CUDA fault, a label out of range
 * in softmax_xent) is returned by the next sync or download. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { KACT_NONE = 0, KACT_RELU = 1 } KAct;

/* What gemm_ep fuses after the product (see there). */
typedef enum { KEPI_NONE = 0, KEPI_BIAS = 1, KEPI_BIAS_RELU = 2, KEPI_BGRAD = 3 } KEpilogue;

/* Slots of download_async / wait_slot. */
#define KB_SLOTS 64

typedef struct KBackend KBackend;
typedef struct KGraph KGraph;

/* A 2-D window (convolution, pooling) over n images stored NHWC (each sample
 * h x w x c, channels innermost): a k x k kernel moved by stride over the
 * image padded with pad zeros on each side, giving ho x wo positions. */
typedef struct KWindow {
        int n, h, w, c, k, stride, pad, ho, wo;
} KWindow;

typedef struct KernelsOps {
        const char *name;
        /* Ops return before their work is done (a device backend), so the host
         * is free while a step computes. */
        bool async;
        /* Backend buffers are host memory (the CPU backend): a host buffer may
         * stand in for one, and a model then computes on its caller's
         * parameters and writes its gradients where the caller reads them,
         * with no copy either way. */
        bool host_memory;
        void (*destroy)(KBackend *kb);
        int (*alloc)(KBackend *kb, size_t bytes, void **ret);
        void (*free)(KBackend *kb, void *p);
        int (*upload)(KBackend *kb, void *dst, const void *src_host, size_t bytes);
        int (*download)(KBackend *kb, void *dst_host, const void *src, size_t bytes);
        int (*sync)(KBackend *kb);
        /* C[M x N] = alpha * op(A) * op(B) + beta * C; op(A) is M x K, op(B) is K x N. */
        int (*gemm)(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
        /* y[r][c] = act(y[r][c] + bias[c]) in place; bias may be NULL. */
        int (*bias_act)(KBackend *kb, float *y, const float *bias, int rows, int cols, KAct act);
        /* dy[i] *= act'(y[i]) where y is the activation's output. */
        int (*act_backward)(KBackend *kb, float *dy, const float *y, size_t n, KAct act);
        /* out[c] = sum over rows of x[r][c] (bias gradient). */
        int (*colsum)(KBackend *kb, const float *x, int rows, int cols, float *out);
        /* Row-wise softmax cross-entropy with integer labels. Writes
         * dlogits = (softmax - onehot) * scale and loss[r] = -log softmax[r][label[r]].
         * dlogits may alias logits. A label outside [0, cols) writes nothing and gives
         * -EINVAL, from this call (CPU) or from the next sync or download (CUDA). */
        int (*softmax_xent)(KBackend *kb, const float *logits, const int32_t *labels, int rows,
                            int cols, float scale, float *dlogits, float *loss);
        /* out[r] = index of the largest x[r][c]. */
        int (*argmax)(KBackend *kb, const float *x, int rows, int cols, int32_t *out);
        /* Local SGD step with momentum (edge training): v = mu*v + g; w -= lr*v. */
        int (*sgd_step)(KBackend *kb, float *w, const float *g, float *v, size_t n, float lr,
                        float mu);
        /* C[M x N] = op(A) op(B) (alpha 1, beta 0) with a fused epilogue:
         *   KEPI_NONE:      nothing more (vec unused, may be NULL);
         *   KEPI_BIAS:      C[i][j] += vec[j] (vec: N biases);
         *   KEPI_BIAS_RELU: C[i][j] = relu(C[i][j] + vec[j]);
         *   KEPI_BGRAD:     also vec[i] = sum over k of op(A)[i][k] (M floats): the bias
         *                   gradient of a layer when op(A) is its output gradient transposed.
         * Shape rules as gemm's; k == 0 is refused (-EINVAL) for the epilogues. */
        int (*gemm_ep)(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                       int lda, const float *b, int ldb, float *c, int ldc, KEpilogue ep, float *vec);
        /* Host memory the backend copies fastest from and to (page-locked on CUDA,
         * so copies are asynchronous and graph capture may use it); aligned plain
         * memory on the CPU. Every host buffer of download_async and of a capture
         * must come from here. */
        int (*host_alloc)(KBackend *kb, size_t bytes, void **ret);
        void (*host_free)(KBackend *kb, void *p);
        /* Makes host memory the caller mapped (bytes from p, e.g. memory shared
         * with the shards) as good for download_async and captures as
         * host_alloc's, until host_unregister(p). NULL where any host memory
         * will do (the CPU). */
        int (*host_register)(KBackend *kb, void *p, size_t bytes);
        void (*host_unregister)(KBackend *kb, void *p);
        /* Queues a download after every op queued so far and returns at once;
         * wait_slot(slot) (slot < KB_SLOTS) waits for it. It may run while later ops
         * compute (CUDA: on a second stream), so src must stay unchanged until then. */
        int (*download_async)(KBackend *kb, void *dst_host, const void *src, size_t bytes,
                              unsigned slot);
        int (*wait_slot)(KBackend *kb, unsigned slot);
        /* Records the ops queued between capture_begin and capture_end into a graph
         * that graph_run queues again, in one launch, with the same buffers and shapes.
         * -ENOTSUP from capture_begin: run the ops directly. While capturing no op may
         * wait (download, sync), and an op's error is returned by capture_end too. */
        int (*capture_begin)(KBackend *kb);
        int (*capture_end)(KBackend *kb, KGraph **ret);
        int (*graph_run)(KBackend *kb, KGraph *g);
        void (*graph_free)(KBackend *kb, KGraph *g);
        /* Lets gemm use reduced-precision tensor-core math (TF32: 10-bit mantissa
         * products, fp32 accumulation). -ENOTSUP where the backend has none. */
        int (*set_tf32)(KBackend *kb, bool on);

        /* The layer ops (worker/models/layers.c). A backend may leave some NULL:
         * a model whose layers need one is then refused with the op's name. */
        /* Device-to-device copy of bytes; dst and src are the same buffer or do not
         * overlap (CUDA refuses a partial overlap: -EINVAL). */
        int (*copy)(KBackend *kb, void *dst, const void *src, size_t bytes);
        /* y[i] += alpha * x[i]. */
        int (*axpy)(KBackend *kb, size_t n, float alpha, const float *x, float *y);
        /* count products C_i = alpha op(A_i) op(B_i) + beta C_i, with A_i = a + i * sa
         * (strides in floats), the same for B and C; shapes as gemm's. */
        int (*gemm_batched)(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                            float beta, float *c, int ldc, long long sc, int count);
        /* [a, b, c, d] -> [a, c, b, d] (row-major); x and y must not overlap. */
        int (*permute0213)(KBackend *kb, const float *x, int a, int b, int c, int d, float *y);
        /* Convolution as a product: col [n*ho*wo x c*k*k] holds each output
         * position's window, columns in PyTorch's weight order (c, ky, kx);
         * col2im sums such a matrix back into dx (overwritten), the input gradient. */
        int (*im2col)(KBackend *kb, const KWindow *win, const float *x, float *col);
        int (*col2im)(KBackend *kb, const KWindow *win, const float *col, float *dx);
        /* Max (max true) or average pooling, NHWC in and out (y: n x ho x wo x c).
         * Max keeps in idx (n*ho*wo*c int32) where each maximum came from (its
         * offset in the sample); average divides by k*k, padding counting as zeros.
         * pool_backward overwrites dx. */
        int (*pool)(KBackend *kb, const KWindow *win, bool max, const float *x, float *y, int32_t *idx);
        int (*pool_backward)(KBackend *kb, const KWindow *win, bool max, const float *dy, const int32_t *idx,
                             float *dx);
        /* GELU, exact: y = x * Phi(x); gelu_backward: dx = dy * gelu'(x) (dx may be dy). */
        int (*gelu)(KBackend *kb, const float *x, float *y, size_t n);
        int (*gelu_backward)(KBackend *kb, const float *x, const float *dy, float *dx, size_t n);
        /* Inverted dropout: mask[i] = 0 with probability p, else 1 / (1 - p), from a
         * counter-based hash of (seed, i), so every backend draws the same mask;
         * y = x * mask. mul: out = a * b elementwise (out may be a or b). */
        int (*dropout)(KBackend *kb, const float *x, float *y, float *mask, size_t n, float p, uint64_t seed);
        int (*mul)(KBackend *kb, const float *a, const float *b, float *out, size_t n);
        /* Layer norm of each row over its cols: y = (x - mean) * rstd * g + b,
         * keeping mean and rstd (rows floats each) for the backward, which
         * overwrites dx, dg and db (dg, db: cols floats). */
        int (*layernorm)(KBackend *kb, const float *x, const float *g, const float *b, int rows, int cols,
                         float eps, float *y, float *mean, float *rstd);
        int (*layernorm_backward)(KBackend *kb, const float *dy, const float *x, const float *g,
                                  const float *mean, const float *rstd, int rows, int cols, float *dx, float *dg,
                                  float *db);
        /* Row ids[i] (a whole number stored as float, in [0, vocab)) of table
         * [vocab x dim] into y[i]; the backward overwrites dtable with the sums of
         * the rows of dy each id took. An id out of range: -EINVAL, as softmax_xent. */
        int (*embedding)(KBackend *kb, const float *ids, const float *table, int n, int dim, int vocab, float *y);
        int (*embedding_backward)(KBackend *kb, const float *ids, const float *dy, int n, int dim, int vocab,
                                  float *dtable);
        /* Row-wise softmax. causal_t > 0: row r is query r % causal_t of a block of
         * causal_t rows, and its columns past that query are masked (0).
         * softmax_backward: dx = y * (dy - sum(dy * y)) per row (dx may be dy). */
        int (*softmax)(KBackend *kb, const float *x, float *y, int rows, int cols, int causal_t);
        int (*softmax_backward)(KBackend *kb, const float *y, const float *dy, float *dx, int rows, int cols);
} KernelsOps;

struct KBackend {
        const KernelsOps *ops;
        void *priv;
};

/* Creates a backend by name: "cpu", "cuda", or "auto" (cuda when a device is
 * usable, else cpu). threads (cpu: OpenBLAS threads; 0 = leave as is).
 * On failure returns -ENODEV/-ENOTSUP/... and writes a clear reason into err. */
int kbackend_new(const char *name, int threads, KBackend **ret, char *err, size_t errlen);
KBackend *kbackend_free(KBackend *kb);

/* Backend constructors (kernels/cpu, kernels/cuda). */
int kbackend_cpu_new(int threads, KBackend **ret, char *err, size_t errlen);
int kbackend_cuda_new(KBackend **ret, char *err, size_t errlen);
/* True when this build has the CUDA backend compiled in. */
bool kbackend_cuda_built(void);
