/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend: cuBLAS for gemm and small CUDA kernels for the rest (the
 * layer ops: kernels-cuda-layers.cu), checked against the CPU reference
 * (kernels/cpu) by tests/unit/test-kernels.c and tests/gpu/test-cuda-layers.c.
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
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels.h"
#include "kernels-check.h"
}
#include "kernels-cuda-internal.h"


struct KGraph {
        cudaGraphExec_t exec;
};

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

/* y[r][c] = act(y[r][c] + bias[c]) over rows of cols elements, ld apart; bias
 * may be NULL. */
static __global__ void bias_act_kernel(float *y, const float *bias, int cols, int ld, size_t total,
                                       int relu) {
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
             i += (size_t) gridDim.x * blockDim.x) {
                size_t c = i % cols;
                float *p = y + (i / cols) * ld + c;
                float v = *p + (bias ? bias[c] : 0.0f);
                if (relu && !(v > 0.0f))
                        v = 0.0f;
                *p = v;
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
static __global__ void colsum_kernel(const float *x, int rows, int cols, int ld, float *out) {
        __shared__ float part[COLSUM_Y][COLSUM_X];
        int c = blockIdx.x * COLSUM_X + threadIdx.x;
        float s = 0.0f;

        if (c < cols)
                for (int r = threadIdx.y; r < rows; r += COLSUM_Y)
                        s += x[(size_t) r * ld + c];
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

/* out[r] = sum of the cols elements of row r (leading dimension ld); one warp per
 * row, lanes in a fixed order: deterministic. */
static __global__ void rowsum_kernel(const float *x, int rows, int cols, int ld, float *out) {
        int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
        float s = 0.0f;

        if (row >= rows)
                return;
        for (int c = lane; c < cols; c += 32)
                s += x[(size_t) row * ld + c];
        for (int off = 16; off > 0; off /= 2)
                s += __shfl_xor_sync(FULL_MASK, s, off);
        if (lane == 0)
                out[row] = s;
}


/* Sets *flag when any label is outside [0, cols). *flag is zeroed before. */
static __global__ void check_labels_kernel(const int32_t *labels, int rows, int cols, int *flag) {
        for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
                if (labels[r] < 0 || labels[r] >= cols)
                        *flag = 1;
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



static void cuda_destroy(KBackend *kb) {
        CudaBackend *cb = priv(kb);

        /* Teardown errors have nowhere to go: the backend is gone either way. */
        if (cb) {
                if (cb->capturing) {
                        cudaGraph_t g = NULL;
                        if (cudaStreamEndCapture(cb->stream, &g) == cudaSuccess && g)
                                (void) cudaGraphDestroy(g);
                }
                if (cb->copy)
                        (void) cudaStreamSynchronize(cb->copy);
                if (cb->stream)
                        (void) cudaStreamSynchronize(cb->stream);
                if (cb->blas)
                        (void) cublasDestroy(cb->blas);
                if (cb->lt)
                        (void) cublasLtDestroy(cb->lt);
                if (cb->workspace)
                        (void) cudaFree(cb->workspace);
                for (int i = 0; i < KB_SLOTS; i++)
                        if (cb->slot[i])
                                (void) cudaEventDestroy(cb->slot[i]);
                if (cb->fork)
                        (void) cudaEventDestroy(cb->fork);
                if (cb->join)
                        (void) cudaEventDestroy(cb->join);
                if (cb->copy)
                        (void) cudaStreamDestroy(cb->copy);
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

/* Waits for the stream, then reports a bad label softmax_xent found since the
 * last wait (once). */
static int wait_stream(CudaBackend *cb) {
        int r;

        if (cb->capturing)
                return -EBUSY;
        r = cuda_errno(cudaStreamSynchronize(cb->stream));
        if (r < 0)
                return r;
        if (*cb->flag_host) {
                *cb->flag_host = 0;
                return -EINVAL;
        }
        return 0;
}

static int cuda_download(KBackend *kb, void *dst_host, const void *src, size_t bytes) {
        int r;

        if (bytes == 0)
                return 0;
        if (!dst_host || !src)
                return -EINVAL;
        if (priv(kb)->capturing)
                return -EBUSY;
        r = cuda_errno(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, stream(kb)));
        if (r < 0)
                return r;
        return wait_stream(priv(kb));
}

static int cuda_sync(KBackend *kb) {
        CudaBackend *cb = priv(kb);
        int r;

        if (cb->capturing)
                return -EBUSY;
        r = cuda_errno(cudaStreamSynchronize(cb->copy));
        if (r < 0)
                return r;
        return wait_stream(cb);
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
        int r = bias_act_check(rows, cols, act, y);

        if (r != 0)
                return r < 0 ? r : 0;
        if (!bias && act == KACT_NONE)
                return 0;

        bias_act_kernel<<<blocks_for(total), BLOCK, 0, stream(kb)>>>(y, bias, cols, cols, total,
                                                                      act == KACT_RELU);
        return launched();
}

static int cuda_act_backward(KBackend *kb, float *dy, const float *y, size_t n, KAct act) {
        int r = act_backward_check(n, act, dy, y);

        if (r != 0)
                return r < 0 ? r : 0;

        relu_backward_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(dy, y, n);
        return launched();
}

static int cuda_colsum(KBackend *kb, const float *x, int rows, int cols, float *out) {
        int r = colsum_check(rows, cols, x, out);

        if (r != 0)
                return r < 0 ? r : 0;

        colsum_kernel<<<(unsigned) ((cols + COLSUM_X - 1) / COLSUM_X), dim3(COLSUM_X, COLSUM_Y), 0,
                        stream(kb)>>>(x, rows, cols, cols, out);
        return launched();
}

/* Does not wait: a bad label is reported by the next wait (see the top of the file). */
static int cuda_softmax_xent(KBackend *kb, const float *logits, const int32_t *labels, int rows,
                             int cols, float scale, float *dlogits, float *loss) {
        CudaBackend *cb = priv(kb);
        int r = rows_check(rows, cols, logits && labels && dlogits && loss);

        if (r != 0)
                return r < 0 ? r : 0;

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
        /* An OR into the host copy, so a later good batch cannot clear it before the wait. */
        or_flag_kernel<<<1, 1, 0, cb->stream>>>(cb->flag_dev, cb->flag_host);
        return launched();
}

static int cuda_argmax(KBackend *kb, const float *x, int rows, int cols, int32_t *out) {
        int r = rows_check(rows, cols, x && out);

        if (r != 0)
                return r < 0 ? r : 0;

        argmax_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, stream(kb)>>>(x, rows, cols, out);
        return launched();
}

static int cuda_sgd_step(KBackend *kb, float *w, const float *g, float *v, size_t n, float lr,
                         float mu) {
        int r = sgd_step_check(n, w, g, v);

        if (r != 0)
                return r < 0 ? r : 0;

        sgd_step_kernel<<<blocks_for(n), BLOCK, 0, stream(kb)>>>(w, g, v, n, lr, mu);
        return launched();
}

/* vec[i] = sum over k of op(A)[i][k]: the fallback of KEPI_BGRAD. */
static int bgrad(CudaBackend *cb, bool trans_a, int m, int k, const float *a, int lda, float *vec) {
        if (trans_a) /* op(A)[i][j] = a[j][i]: column sums of the k x m matrix a */
                colsum_kernel<<<(unsigned) ((m + COLSUM_X - 1) / COLSUM_X), dim3(COLSUM_X, COLSUM_Y), 0,
                                cb->stream>>>(a, k, m, lda, vec);
        else
                rowsum_kernel<<<row_blocks(m), ROW_WARPS * 32, 0, cb->stream>>>(a, m, k, lda, vec);
        return launched();
}

static cublasLtEpilogue_t lt_epilogue(KEpilogue ep) {
        switch (ep) {
        case KEPI_BIAS:
                return CUBLASLT_EPILOGUE_BIAS;
        case KEPI_BIAS_RELU:
                return CUBLASLT_EPILOGUE_RELU_BIAS;
        case KEPI_BGRAD:
                return CUBLASLT_EPILOGUE_BGRADB;
        default:
                return CUBLASLT_EPILOGUE_DEFAULT;
        }
}

/* gemm_ep through cuBLASLt, with the row-major swap of cuda_gemm: Lt computes
 * the column-major D[n x m] = op(b) op(a), so "Lt's A" is b, "Lt's B" is a; the
 * bias runs along D's rows (our columns, N of them) and BGRADB reduces Lt's B
 * (our op(A)) over k. 1 when Lt has no algorithm for it (the caller falls back). */
static int lt_gemm(CudaBackend *cb, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                   int lda, const float *b, int ldb, float *c, int ldc, KEpilogue ep, float *vec) {
        cublasLtMatmulDesc_t op = NULL;
        cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulHeuristicResult_t heur;
        cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasLtEpilogue_t epi = lt_epilogue(ep);
        size_t ws = LT_WORKSPACE;
        const float one = 1.0f, zero = 0.0f;
        int found = 0, r;
        cublasStatus_t st;

        st = cublasLtMatmulDescCreate(&op, cb->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                      CUDA_R_32F);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS && ep != KEPI_NONE)
                st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec);
        /* Stored (column-major) shapes: Lt's A is n x k (k x n when transposed), B k x m (m x k). */
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, trans_b ? k : n, trans_b ? n : k, ldb);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, trans_a ? m : k, trans_a ? k : m, lda);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, ldc);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulPreferenceCreate(&pref);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                          sizeof ws);
        if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulAlgoGetHeuristic(cb->lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
        /* Any refusal up to here (an epilogue or layout this cuBLASLt does not
         * have) means "no algorithm": the caller falls back. Only the product's
         * own failure is an error. */
        r = 1;
        if (st == CUBLAS_STATUS_SUCCESS && found > 0)
                r = blas_errno(cublasLtMatmul(cb->lt, op, &one, b, la, a, lb, &zero, c, lc, c, lc, &heur.algo,
                                              cb->workspace, ws, cb->stream));

        if (pref)
                (void) cublasLtMatmulPreferenceDestroy(pref);
        if (lc)
                (void) cublasLtMatrixLayoutDestroy(lc);
        if (lb)
                (void) cublasLtMatrixLayoutDestroy(lb);
        if (la)
                (void) cublasLtMatrixLayoutDestroy(la);
        if (op)
                (void) cublasLtMatmulDescDestroy(op);
        return r;
}

static int cuda_gemm_ep(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
                        int lda, const float *b, int ldb, float *c, int ldc, KEpilogue ep, float *vec) {
        CudaBackend *cb = priv(kb);
        int r = gemm_ep_check(m, n, k, ep, vec);

        if (r != 0)
                return r < 0 ? r : 0;
        r = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
        if (r != 0)
                return r < 0 ? r : 0;
        if (!cb->no_lt && k > 0) {
                r = lt_gemm(cb, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, ep, vec);
                if (r <= 0)
                        return r;
        }
        /* No Lt algorithm (or Lt turned off): the product, then the epilogue's kernel. */
        r = cuda_gemm(kb, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
        if (r < 0 || ep == KEPI_NONE)
                return r;
        if (ep == KEPI_BGRAD)
                return bgrad(cb, trans_a, m, k, a, lda, vec);
        bias_act_kernel<<<blocks_for(numel(m, n)), BLOCK, 0, cb->stream>>>(c, vec, n, ldc, numel(m, n),
                                                                           ep == KEPI_BIAS_RELU);
        return launched();
}

static int cuda_host_alloc(KBackend *kb, size_t bytes, void **ret) {
        void *p = NULL;
        int r;

        (void) kb;
        if (!ret)
                return -EINVAL;
        r = cuda_errno(cudaMallocHost(&p, bytes > 0 ? bytes : 64));
        if (r < 0)
                return r;
        *ret = p;
        return 0;
}

static void cuda_host_free(KBackend *kb, void *p) {
        (void) kb;
        if (p)
                (void) cudaFreeHost(p);
}

/* Page-locks memory mapped elsewhere (a memfd shared with the shards), so
 * copies to and from it are asynchronous as from cudaMallocHost's. */
static int cuda_host_register(KBackend *kb, void *p, size_t bytes) {
        (void) kb;
        if (!p || bytes == 0)
                return -EINVAL;
        return cuda_errno(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
}

static void cuda_host_unregister(KBackend *kb, void *p) {
        (void) kb;
        if (p)
                (void) cudaHostUnregister(p);
}

/* The copy stream waits for everything queued on the stream so far (fork), copies,
 * and records the slot's event. Captured, the event is an external record node,
 * so wait_slot works on each replay of the graph. */
static int cuda_download_async(KBackend *kb, void *dst_host, const void *src, size_t bytes,
                               unsigned slot) {
        CudaBackend *cb = priv(kb);
        cudaError_t e;

        if (slot >= KB_SLOTS || (bytes > 0 && (!dst_host || !src)))
                return -EINVAL;
        e = cudaEventRecord(cb->fork, cb->stream);
        if (e == cudaSuccess)
                e = cudaStreamWaitEvent(cb->copy, cb->fork, 0);
        if (e == cudaSuccess && bytes > 0)
                e = cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, cb->copy);
        if (e == cudaSuccess)
                e = cudaEventRecordWithFlags(cb->slot[slot], cb->copy,
                                             cb->capturing ? cudaEventRecordExternal : cudaEventRecordDefault);
        cb->copy_used = true;
        return cuda_errno(e);
}

static int cuda_wait_slot(KBackend *kb, unsigned slot) {
        CudaBackend *cb = priv(kb);

        if (slot >= KB_SLOTS)
                return -EINVAL;
        if (cb->capturing)
                return -EBUSY;
        return cuda_errno(cudaEventSynchronize(cb->slot[slot]));
}

/* The stream waits for the copy stream's work so far (ends a capture's fork). */
static cudaError_t join_copy(CudaBackend *cb) {
        cudaError_t e = cudaSuccess;

        if (cb->copy_used) {
                e = cudaEventRecord(cb->join, cb->copy);
                if (e == cudaSuccess)
                        e = cudaStreamWaitEvent(cb->stream, cb->join, 0);
                cb->copy_used = false;
        }
        return e;
}

static int cuda_capture_begin(KBackend *kb) {
        CudaBackend *cb = priv(kb);
        int r;

        if (cb->capturing)
                return -EBUSY;
        /* Work already queued on the copy stream stays outside the graph. */
        r = cuda_errno(join_copy(cb));
        if (r < 0)
                return r;
        r = cuda_errno(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
        if (r < 0)
                return r;
        cb->capturing = true;
        return 0;
}

static int cuda_capture_end(KBackend *kb, KGraph **ret) {
        CudaBackend *cb = priv(kb);
        cudaGraph_t graph = NULL;
        KGraph *g = NULL;
        cudaError_t e, e2;

        if (!cb->capturing)
                return -EINVAL;
        e = join_copy(cb);
        e2 = cudaStreamEndCapture(cb->stream, &graph);
        cb->capturing = false;
        if (e == cudaSuccess)
                e = e2;
        if (e == cudaSuccess && !ret)
                e = cudaErrorInvalidValue;
        if (e == cudaSuccess) {
                g = (KGraph *) calloc(1, sizeof *g);
                if (!g)
                        e = cudaErrorMemoryAllocation;
        }
        if (e == cudaSuccess)
                e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (graph)
                (void) cudaGraphDestroy(graph);
        /* A failed capture leaves an error behind for cudaGetLastError: take it. */
        (void) cudaGetLastError();
        if (e != cudaSuccess) {
                free(g);
                return cuda_errno(e);
        }
        *ret = g;
        return 0;
}

static int cuda_graph_run(KBackend *kb, KGraph *g) {
        CudaBackend *cb = priv(kb);
        int r;

        if (!g)
                return -EINVAL;
        if (cb->capturing)
                return -EBUSY;
        r = cuda_errno(join_copy(cb));
        if (r < 0)
                return r;
        return cuda_errno(cudaGraphLaunch(g->exec, cb->stream));
}

static void cuda_graph_free(KBackend *kb, KGraph *g) {
        (void) kb;
        if (g) {
                (void) cudaGraphExecDestroy(g->exec);
                free(g);
        }
}

static int cuda_set_tf32(KBackend *kb, bool on) {
        CudaBackend *cb = priv(kb);
        cublasStatus_t s = cublasSetMathMode(cb->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);

        if (s != CUBLAS_STATUS_SUCCESS)
                return blas_errno(s);
        cb->tf32 = on;
        return 0;
}

/* In the order of KernelsOps (C++17 has no designated initialisers). */
static const KernelsOps cuda_ops = {
        /* name */ "cuda",
        /* async */ true,
        /* host_memory */ false,
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
        /* gemm_ep */ cuda_gemm_ep,
        /* host_alloc */ cuda_host_alloc,
        /* host_free */ cuda_host_free,
        /* host_register */ cuda_host_register,
        /* host_unregister */ cuda_host_unregister,
        /* download_async */ cuda_download_async,
        /* wait_slot */ cuda_wait_slot,
        /* capture_begin */ cuda_capture_begin,
        /* capture_end */ cuda_capture_end,
        /* graph_run */ cuda_graph_run,
        /* graph_free */ cuda_graph_free,
        /* set_tf32 */ cuda_set_tf32,
        /* The layer ops: kernels-cuda-layers.cu. */
        /* copy */ cuda_copy,
        /* axpy */ cuda_axpy,
        /* gemm_batched */ cuda_gemm_batched,
        /* permute0213 */ cuda_permute0213,
        /* im2col */ cuda_im2col,
        /* col2im */ cuda_col2im,
        /* pool */ cuda_pool,
        /* pool_backward */ cuda_pool_backward,
        /* gelu */ cuda_gelu,
        /* gelu_backward */ cuda_gelu_backward,
        /* dropout */ cuda_dropout,
        /* mul */ cuda_mul,
        /* layernorm */ cuda_layernorm,
        /* layernorm_backward */ cuda_layernorm_backward,
        /* embedding */ cuda_embedding,
        /* embedding_backward */ cuda_embedding_backward,
        /* softmax */ cuda_softmax,
        /* softmax_backward */ cuda_softmax_backward,
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
                e = cudaStreamCreateWithFlags(&cb->copy, cudaStreamNonBlocking);
        if (e == cudaSuccess)
                e = cudaEventCreateWithFlags(&cb->fork, cudaEventDisableTiming);
        if (e == cudaSuccess)
                e = cudaEventCreateWithFlags(&cb->join, cudaEventDisableTiming);
        for (int i = 0; i < KB_SLOTS && e == cudaSuccess; i++)
                e = cudaEventCreateWithFlags(&cb->slot[i], cudaEventDisableTiming);
        if (e == cudaSuccess)
                e = cudaMalloc((void **) &cb->flag_dev, sizeof *cb->flag_dev);
        if (e == cudaSuccess)
                e = cudaMallocHost((void **) &cb->flag_host, sizeof *cb->flag_host);
        if (e == cudaSuccess)
                e = cudaMalloc(&cb->workspace, LT_WORKSPACE);
        if (e == cudaSuccess)
                *cb->flag_host = 0;
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
        /* A workspace of our own: cuBLAS then allocates nothing while a graph is captured. */
        if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasSetWorkspace(cb->blas, cb->workspace, LT_WORKSPACE);
        if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH);
        if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasLtCreate(&cb->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
                r = blas_errno(s);
                if (r == -EINVAL)
                        r = -EIO;
                if (err && errlen > 0)
                        snprintf(err, errlen, "cannot start cuBLAS on device %d (%s)", dev,
                                 cublasGetStatusString(s));
                goto fail;
        }

        {
                const char *lt = getenv("PSNET_CUDA_LT");
                cb->no_lt = lt && strcmp(lt, "0") == 0;
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
