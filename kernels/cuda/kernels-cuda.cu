/* The CUDA backend: cuBLAS for gemm and small CUDA kernels for the rest, checked
 * against the CPU reference (kernels/cpu) by tests/unit/test-kernels.c.
 *
 * One backend owns one stream (non-blocking, so it never waits on the legacy
 * default stream) and one cuBLAS handle bound to it, on the device that is
 * current when it is created (device 0 of those CUDA_VISIBLE_DEVICES shows).
 * Every op is queued on that stream and returns at once; download and sync wait
 * for it. An error of an asynchronous kernel shows up as -EIO from the next call
 * that waits. Use a backend from one thread at a time.
 *
 * Uploads from pageable host memory (malloc) are staged by the runtime before
 * the call returns, so the caller may reuse the source at once; a pinned source
 * (cudaMallocHost, cudaHostRegister) must stay unchanged until the next sync or
 * download. gemm is plain fp32 (CUBLAS_DEFAULT_MATH: no TF32).
 *
 * softmax_xent is the one op that waits: the labels live on the device, and a
 * bad label must give -EINVAL like the CPU backend (and write nothing), so a
 * small kernel checks them into a flag the launcher reads back. The model
 * downloads the losses right after it anyway.
 *
 * The file has a kernels section and a launchers section (llm.c); a launcher
 * checks shapes, launches on the backend's stream, checks cudaGetLastError()
 * and returns a negative errno, never exits. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "kernels.h"
#include "kernels-check.h"
}

#define BLOCK 256          /* threads per block of the elementwise kernels */
#define MAX_BLOCKS 65535   /* grid-stride loops cover the rest */
#define ROW_WARPS 4        /* rows (one warp each) per block of the row kernels */
#define COLSUM_X 32        /* colsum block: 32 columns ... */
#define COLSUM_Y 8         /* ... by 8 row strips */
#define FULL_MASK 0xffffffffu

typedef struct CudaBackend {
        cudaStream_t stream;
        cublasHandle_t blas;
        int *flag_dev;     /* softmax_xent's bad-label flag */
        int *flag_host;    /* pinned copy of it */
} CudaBackend;

/* ---------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------- */

/* c[i][j] = beta * c[i][j] over an m x n block of a row-major matrix with
 * leading dimension ldc; beta == 0 writes zeros without reading (BLAS). */
static __global__ void scale_kernel(float *c, int m, int n, int ldc, float beta) {
        size_t total = (size_t) m * n;

        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
             i += (size_t) gridDim.x * blockDim.x) {
                size_t r = i / n, col = i % n;
                float *p = c + r * ldc + col;
                *p = beta == 0.0f ? 0.0f : beta * *p;
        }
}

/* y[r][c] = act(y[r][c] + bias[c]); bias may be NULL. */
static __global__ void bias_act_kernel(float *y, const float *bias, int cols, size_t total, int relu) {
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
             i += (size_t) gridDim.x * blockDim.x) {
                float v = y[i] + (bias ? bias[i % cols] : 0.0f);
                if (relu && !(v > 0.0f))
                        v = 0.0f;
                y[i] = v;
        }
}

/* ReLU': dy[i] = 0 where y[i] (the ReLU's output) is not positive. */
static __global__ void relu_backward_kernel(float *dy, const float *y, size_t n) {
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t) gridDim.x * blockDim.x)
                if (!(y[i] > 0.0f))
                        dy[i] = 0.0f;
}

/* out[c] = sum over rows of x[r][c]. A block of COLSUM_X x COLSUM_Y threads
 * owns COLSUM_X adjacent columns (so a warp reads one contiguous row segment);
 * each of the COLSUM_Y strips sums every COLSUM_Y-th row, then the strips are
 * added in shared memory. Deterministic: no atomics. */
static __global__ void colsum_kernel(const float *x, int rows, int cols, float *out) {
        __shared__ float part[COLSUM_Y][COLSUM_X];
        int c = blockIdx.x * COLSUM_X + threadIdx.x;
        float s = 0.0f;

        if (c < cols)
                for (int r = threadIdx.y; r < rows; r += COLSUM_Y)
                        s += x[(size_t) r * cols + c];
        part[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        for (int h = COLSUM_Y / 2; h > 0; h /= 2) {
                if (threadIdx.y < h)
                        part[threadIdx.y][threadIdx.x] += part[threadIdx.y + h][threadIdx.x];
                __syncthreads();
        }
        if (threadIdx.y == 0 && c < cols)
                out[c] = part[0][threadIdx.x];
}

/* Sets *flag when any label is outside [0, cols). *flag is zeroed before. */
static __global__ void check_labels_kernel(const int32_t *labels, int rows, int cols, int *flag) {
        for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
                if (labels[r] < 0 || labels[r] >= cols)
                        *flag = 1;
}

static __device__ float warp_max(float v) {
        for (int off = 16; off > 0; off /= 2)
                v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
        return v;
}

static __device__ float warp_sum(float v) {
        for (int off = 16; off > 0; off /= 2)
                v += __shfl_xor_sync(FULL_MASK, v, off);
        return v;
}

/* One warp per row, the same stable form as the CPU reference: with m = max x,
 * loss = log sum exp(x - m) - (x[label] - m), d = (softmax - onehot) * scale.
 * Does nothing when *flag says a label is bad. dlogits may alias logits:
 * element c is only ever read and written by lane c % 32, reads first. */
static __global__ void softmax_xent_kernel(const float *logits, const int32_t *labels, int rows,
                                    int cols, float scale, float *dlogits, float *loss,
                                    const int *flag) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        const float *x;
        float *d;
        float mx = -INFINITY, sum = 0.0f, logsum, inv;
        int32_t label;

        if (*flag || row >= rows) /* uniform per warp: the shuffles below see all 32 lanes */
                return;
        x = logits + (size_t) row * cols;
        d = dlogits + (size_t) row * cols;
        label = labels[row];

        for (int c = lane; c < cols; c += 32)
                mx = fmaxf(mx, x[c]);
        mx = warp_max(mx);
        for (int c = lane; c < cols; c += 32)
                sum += expf(x[c] - mx);
        sum = warp_sum(sum);
        logsum = logf(sum);
        inv = 1.0f / sum;
        for (int c = lane; c < cols; c += 32) {
                float xc = x[c], p = expf(xc - mx) * inv;
                if (c == label)
                        loss[row] = logsum - (xc - mx);
                d[c] = (p - (c == label ? 1.0f : 0.0f)) * scale;
        }
}

/* One warp per row; ties go to the lowest index, as in the CPU reference. */
static __global__ void argmax_kernel(const float *x, int rows, int cols, int32_t *out) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        float best = -INFINITY;
        int best_i = cols; /* "none": loses every tie */

        if (row >= rows)
                return;
        for (int c = lane; c < cols; c += 32) {
                float v = x[(size_t) row * cols + c];
                if (best_i == cols || v > best) {
                        best = v;
                        best_i = c;
                }
        }
        for (int off = 16; off > 0; off /= 2) {
                float ov = __shfl_xor_sync(FULL_MASK, best, off);
                int oi = __shfl_xor_sync(FULL_MASK, best_i, off);
                if (oi != cols && (best_i == cols || ov > best || (ov == best && oi < best_i))) {
                        best = ov;
                        best_i = oi;
                }
        }
        if (lane == 0)
                out[row] = best_i;
}

/* v = mu*v + g; w -= lr*v. */
static __global__ void sgd_step_kernel(float *w, const float *g, float *v, size_t n, float lr, float mu) {
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (size_t) gridDim.x * blockDim.x) {
                float vi = mu * v[i] + g[i];
                v[i] = vi;
                w[i] -= lr * vi;
        }
}

/* ---------------------------------------------------------------------------
 * Launchers
 * ------------------------------------------------------------------------- */

static CudaBackend *priv(KBackend *kb) {
        return (CudaBackend *) kb->priv;
}

static cudaStream_t stream(KBackend *kb) {
        return priv(kb)->stream;
}

static int cuda_errno(cudaError_t e) {
        if (e == cudaSuccess)
                return 0;
        return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static int blas_errno(cublasStatus_t s) {
        switch (s) {
        case CUBLAS_STATUS_SUCCESS:
                return 0;
        case CUBLAS_STATUS_ALLOC_FAILED:
                return -ENOMEM;
        case CUBLAS_STATUS_INVALID_VALUE:
                return -EINVAL;
        default:
                return -EIO;
        }
}

/* The launch status of the kernel just queued. */
static int launched(void) {
        return cuda_errno(cudaGetLastError());
}

/* Blocks for a grid-stride loop over n elements (n > 0). */
static unsigned blocks_for(size_t n) {
        size_t b = (n + BLOCK - 1) / BLOCK;
        return (unsigned) (b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* Blocks for one warp per row (rows > 0). */
static unsigned row_blocks(int rows) {
        return (unsigned) ((rows + ROW_WARPS - 1) / ROW_WARPS);
}


static void cuda_destroy(KBackend *kb) {
        CudaBackend *cb = priv(kb);

        /* Teardown errors have nowhere to go: the backend is gone either way. */
        if (cb) {
                if (cb->stream)
                        (void) cudaStreamSynchronize(cb->stream);
                if (cb->blas)
                        (void) cublasDestroy(cb->blas);
                if (cb->stream)
                        (void) cudaStreamDestroy(cb->stream);
                if (cb->flag_dev)
                        (void) cudaFree(cb->flag_dev);
                if (cb->flag_host)
                        (void) cudaFreeHost(cb->flag_host);
                free(cb);
        }
        free(kb);
}

static int cuda_alloc(KBackend *kb, size_t bytes, void **ret) {
        void *p = NULL;
        int r;

        (void) kb;
        if (!ret)
                return -EINVAL;
        /* Never hand out NULL for an empty buffer, as the CPU backend does not. */
        r = cuda_errno(cudaMalloc(&p, bytes > 0 ? bytes : 256));
        if (r < 0)
                return r;
        *ret = p;
        return 0;
}

/* cudaFree waits for the device, so pending work on p finishes first. */
static void cuda_free(KBackend *kb, void *p) {
        (void) kb;
        if (p)
                (void) cudaFree(p);
}

static int cuda_upload(KBackend *kb, void *dst, const void *src_host, size_t bytes) {
        if (bytes == 0)
                return 0;
        if (!dst || !src_host)
                return -EINVAL;
        return cuda_errno(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, stream(kb)));
}

static int cuda_download(KBackend *kb, void *dst_host, const void *src, size_t bytes) {
        int r;

        if (bytes == 0)
                return 0;
        if (!dst_host || !src)
                return -EINVAL;
        r = cuda_errno(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, stream(kb)));
        if (r < 0)
                return r;
        return cuda_errno(cudaStreamSynchronize(stream(kb)));
}

static int cuda_sync(KBackend *kb) {
        return cuda_errno(cudaStreamSynchronize(stream(kb)));
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
 * row-major matrix read as column-major is its transpose: so cuBLAS gets B
 * before A, n before m, and the same transpose flags. Shape rules as in the
 * CPU backend; k == 0 gives C = beta C (a kernel, not cuBLAS). */
static int cuda_gemm(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc) {
        int r = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
        if (r != 0)
                return r < 0 ? r : 0;

        if (k == 0) {
                scale_kernel<<<blocks_for(numel(m, n)), BLOCK, 0, stream(kb)>>>(c, m, n, ldc, beta);
                return launched();
        }
        return blas_errno(cublasSgemm(priv(kb)->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                      a, lda, &beta, c, ldc));
}

static int cuda_bias_act(KBackend *kb, float *y, const float *bias, int rows, int cols, KAct act) {
        size_t total = numel(rows, cols);

        if (rows < 0 || cols < 0 || !act_valid(act))
                return -EINVAL;
        if (total == 0)
                return 0;
        if (!y)
                return -EINVAL;
        if (!bias && act == KACT_NONE)
                return 0;

        bias_act_kernel<<<blocks_for(total), BLOCK, 0, stream(kb)>>>(y, bias, cols, total,
                                                                      act == KACT_RELU);
        return launched();
}

static int cuda_act_backward(KBackend *kb, float *dy, const float *y, size_t n, KAct act) {
        if (!act_valid(act))
                return -EINVAL;
        if (n == 0 || act == KACT_NONE)
                return 0;
        if (!dy || !y)
                return -EINVAL;

        relu_backward_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(dy, y, n);
        return launched();
}

static int cuda_colsum(KBackend *kb, const float *x, int rows, int cols, float *out) {
        if (rows < 0 || cols < 0)
                return -EINVAL;
        if (cols == 0)
                return 0;
        if (!out || (rows > 0 && !x))
                return -EINVAL;

        colsum_kernel<<<(unsigned) ((cols + COLSUM_X - 1) / COLSUM_X), dim3(COLSUM_X, COLSUM_Y), 0,
                        stream(kb)>>>(x, rows, cols, out);
        return launched();
}

/* Waits for the stream: see the top of the file. */
static int cuda_softmax_xent(KBackend *kb, const float *logits, const int32_t *labels, int rows,
                             int cols, float scale, float *dlogits, float *loss) {
        CudaBackend *cb = priv(kb);
        int r;

        if (rows < 0 || cols < 0 || (rows > 0 && cols == 0))
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!logits || !labels || !dlogits || !loss)
                return -EINVAL;

        r = cuda_errno(cudaMemsetAsync(cb->flag_dev, 0, sizeof *cb->flag_dev, cb->stream));
        if (r < 0)
                return r;
        check_labels_kernel<<<blocks_for((size_t) rows), BLOCK, 0, cb->stream>>>(labels, rows, cols,
                                                                                 cb->flag_dev);
        r = launched();
        if (r < 0)
                return r;
        softmax_xent_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, cb->stream>>>(
                logits, labels, rows, cols, scale, dlogits, loss, cb->flag_dev);
        r = launched();
        if (r < 0)
                return r;
        r = cuda_errno(cudaMemcpyAsync(cb->flag_host, cb->flag_dev, sizeof *cb->flag_host,
                                       cudaMemcpyDeviceToHost, cb->stream));
        if (r < 0)
                return r;
        r = cuda_errno(cudaStreamSynchronize(cb->stream));
        if (r < 0)
                return r;
        return *cb->flag_host ? -EINVAL : 0;
}

static int cuda_argmax(KBackend *kb, const float *x, int rows, int cols, int32_t *out) {
        if (rows < 0 || cols < 0 || (rows > 0 && cols == 0))
                return -EINVAL;
        if (rows == 0)
                return 0;
        if (!x || !out)
                return -EINVAL;

        argmax_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, stream(kb)>>>(x, rows, cols, out);
        return launched();
}

static int cuda_sgd_step(KBackend *kb, float *w, const float *g, float *v, size_t n, float lr,
                         float mu) {
        if (n == 0)
                return 0;
        if (!w || !g || !v)
                return -EINVAL;

        sgd_step_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(w, g, v, n, lr, mu);
        return launched();
}

/* In the order of KernelsOps (C++17 has no designated initialisers). */
static const KernelsOps cuda_ops = {
        /* name */ "cuda",
        /* destroy */ cuda_destroy,
        /* alloc */ cuda_alloc,
        /* free */ cuda_free,
        /* upload */ cuda_upload,
        /* download */ cuda_download,
        /* sync */ cuda_sync,
        /* gemm */ cuda_gemm,
        /* bias_act */ cuda_bias_act,
        /* act_backward */ cuda_act_backward,
        /* colsum */ cuda_colsum,
        /* softmax_xent */ cuda_softmax_xent,
        /* argmax */ cuda_argmax,
        /* sgd_step */ cuda_sgd_step,
};

/* Writes what the runtime's "insufficient driver" means here into hint: no
 * driver at all, or one older than this build's runtime ("" otherwise). */
static void driver_hint(cudaError_t e, char *hint, size_t len) {
        int drv = 0, rt = 0;

        hint[0] = '\0';
        if (e != cudaErrorInsufficientDriver || cudaDriverGetVersion(&drv) != cudaSuccess)
                return;
        if (drv == 0)
                snprintf(hint, len, "; no NVIDIA driver is loaded");
        else if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
                snprintf(hint, len, "; the driver supports CUDA %d.%d, this build needs %d.%d",
                         drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
}

/* -ENODEV (with the runtime's reason) when no device or driver can be used;
 * -ENOMEM/-EIO when one is there but the backend cannot be set up on it. */
int kbackend_cuda_new(KBackend **ret, char *err, size_t errlen) {
        KBackend *kb = NULL;
        CudaBackend *cb = NULL;
        cudaError_t e;
        cublasStatus_t s;
        int count = 0, dev = 0, r;

        if (err && errlen > 0)
                err[0] = '\0';
        if (!ret) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "no place to return the CUDA backend");
                return -EINVAL;
        }

        e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess || count == 0) {
                char hint[128];

                driver_hint(e, hint, sizeof hint);
                if (err && errlen > 0)
                        snprintf(err, errlen, "no CUDA device is visible (cudaGetDeviceCount: %s%s)",
                                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", hint);
                return -ENODEV;
        }
        /* Create the context now, so that an unusable device (exclusive mode,
         * out of memory) is reported here rather than by the first op. */
        e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
                e = cudaSetDevice(dev);
        if (e == cudaSuccess)
                e = cudaFree(NULL);
        if (e != cudaSuccess) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "CUDA device %d cannot be used (%s)", dev,
                                 cudaGetErrorString(e));
                return -ENODEV;
        }

        kb = (KBackend *) calloc(1, sizeof *kb);
        cb = (CudaBackend *) calloc(1, sizeof *cb);
        if (!kb || !cb) {
                free(kb);
                free(cb);
                if (err && errlen > 0)
                        snprintf(err, errlen, "out of memory creating the CUDA backend");
                return -ENOMEM;
        }
        kb->ops = &cuda_ops;
        kb->priv = cb;

        e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess)
                e = cudaMalloc((void **) &cb->flag_dev, sizeof *cb->flag_dev);
        if (e == cudaSuccess)
                e = cudaMallocHost((void **) &cb->flag_host, sizeof *cb->flag_host);
        if (e != cudaSuccess) {
                r = cuda_errno(e);
                if (err && errlen > 0)
                        snprintf(err, errlen, "cannot set up the CUDA backend on device %d (%s)", dev,
                                 cudaGetErrorString(e));
                goto fail;
        }

        s = cublasCreate(&cb->blas);
        if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasSetStream(cb->blas, cb->stream);
        if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH);
        if (s != CUBLAS_STATUS_SUCCESS) {
                r = blas_errno(s);
                if (r == -EINVAL)
                        r = -EIO;
                if (err && errlen > 0)
                        snprintf(err, errlen, "cannot start cuBLAS on device %d (%s)", dev,
                                 cublasGetStatusString(s));
                goto fail;
        }

        *ret = kb;
        return 0;

fail:
        cuda_destroy(kb);
        return r;
}

bool kbackend_cuda_built(void) {
        return true;
}
