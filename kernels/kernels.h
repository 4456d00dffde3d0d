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

typedef struct KernelsOps {
        const char *name;
        /* Ops return before their work is done (a device backend), so the host
         * is free while a step computes. */
        bool async;
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
