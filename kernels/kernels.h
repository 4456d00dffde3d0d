/* The compute backend interface. Models are written once against it; kernels/cpu
 * implements it with OpenBLAS and plain C (the reference), kernels/cuda with
 * cuBLAS and CUDA kernels. It knows nothing of ZeroMQ, libuv or protobuf: it
 * computes on buffers.
 *
 * Conventions: matrices are row-major; every pointer passed to an op is a
 * backend buffer from kb_alloc (device memory on CUDA) unless named *_host;
 * ops may be asynchronous until kb_sync or a download; every op returns 0 or a
 * negative errno (-EINVAL for bad shapes, -EIO for a device failure). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { KACT_NONE = 0, KACT_RELU = 1 } KAct;

typedef struct KBackend KBackend;

typedef struct KernelsOps {
        const char *name;
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
         * dlogits may alias logits. */
        int (*softmax_xent)(KBackend *kb, const float *logits, const int32_t *labels, int rows,
                            int cols, float scale, float *dlogits, float *loss);
        /* out[r] = index of the largest x[r][c]. */
        int (*argmax)(KBackend *kb, const float *x, int rows, int cols, int32_t *out);
        /* Local SGD step with momentum (edge training): v = mu*v + g; w -= lr*v. */
        int (*sgd_step)(KBackend *kb, float *w, const float *g, float *v, size_t n, float lr,
                        float mu);
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
