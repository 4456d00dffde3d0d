/* SPDX-License-Identifier: Apache-2.0 */
/* What the CUDA backend's two files share (kernels-cuda.cu: the backend, gemm
 * and the MLP's kernels; kernels-cuda-layers.cu: the layer ops): the backend's
 * state, the launch helpers and the warp reductions. CUDA C++ only. */
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>

extern "C" {
#include "kernels.h"
}

#define BLOCK 256          /* threads per block of the elementwise kernels */
#define MAX_BLOCKS 65535   /* grid-stride loops cover the rest */
#define ROW_WARPS 4        /* rows (one warp each) per block of the row kernels */
#define COLSUM_X 32        /* colsum block: 32 columns ... */
#define COLSUM_Y 8         /* ... by 8 row strips */
#define FULL_MASK 0xffffffffu

#define LT_WORKSPACE (32u << 20) /* cuBLAS's advice for Hopper */

typedef struct CudaBackend {
        cudaStream_t stream;
        cudaStream_t copy;         /* download_async's stream */
        cudaEvent_t fork, join;    /* copy waits for stream (fork); stream for copy (join) */
        cudaEvent_t slot[KB_SLOTS];
        bool copy_used;            /* copy has work stream has not joined */
        bool capturing;
        bool tf32;
        bool no_lt;                /* PSNET_CUDA_LT=0: plain cuBLAS + kernels for gemm_ep */
        cublasHandle_t blas;
        cublasLtHandle_t lt;
        void *workspace;           /* shared by blas and lt: both run on stream */
        int *flag_dev;             /* softmax_xent's bad-label flag */
        int *flag_host;            /* pinned copy of it, read at the next wait */
} CudaBackend;

/* *host |= *flag: the bad-label flag into page-locked host memory (mapped). */
static __global__ void or_flag_kernel(const int *flag, int *host) {
        if (*flag)
                *host = 1;
}

static __device__ __forceinline__ float warp_max(float v) {
        for (int off = 16; off > 0; off /= 2)
                v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
        return v;
}

static __device__ __forceinline__ float warp_sum(float v) {
        for (int off = 16; off > 0; off /= 2)
                v += __shfl_xor_sync(FULL_MASK, v, off);
        return v;
}

static inline CudaBackend *priv(KBackend *kb) {
        return (CudaBackend *) kb->priv;
}

static inline cudaStream_t stream(KBackend *kb) {
        return priv(kb)->stream;
}

static inline int cuda_errno(cudaError_t e) {
        if (e == cudaSuccess)
                return 0;
        return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static inline int blas_errno(cublasStatus_t s) {
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
static inline int launched(void) {
        return cuda_errno(cudaGetLastError());
}

/* Blocks for a grid-stride loop over n elements (n > 0). */
static inline unsigned blocks_for(size_t n) {
        size_t b = (n + BLOCK - 1) / BLOCK;
        return (unsigned) (b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* Blocks for one warp per row (rows > 0). */
static inline unsigned row_blocks(int rows) {
        return (unsigned) ((rows + ROW_WARPS - 1) / ROW_WARPS);
}

/* The layer ops (kernels-cuda-layers.cu), in KernelsOps' order. */
int cuda_copy(KBackend *kb, void *dst, const void *src, size_t bytes);
int cuda_axpy(KBackend *kb, size_t n, float alpha, const float *x, float *y);
int cuda_gemm_batched(KBackend *kb, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                      int lda, long long sa, const float *b, int ldb, long long sb, float beta, float *c, int ldc,
                      long long sc, int count);
int cuda_permute0213(KBackend *kb, const float *x, int a, int b, int c, int d, float *y);
int cuda_im2col(KBackend *kb, const KWindow *w, const float *x, float *col);
int cuda_col2im(KBackend *kb, const KWindow *w, const float *col, float *dx);
int cuda_pool(KBackend *kb, const KWindow *w, bool max, const float *x, float *y, int32_t *idx);
int cuda_pool_backward(KBackend *kb, const KWindow *w, bool max, const float *dy, const int32_t *idx, float *dx);
int cuda_gelu(KBackend *kb, const float *x, float *y, size_t n);
int cuda_gelu_backward(KBackend *kb, const float *x, const float *dy, float *dx, size_t n);
int cuda_dropout(KBackend *kb, const float *x, float *y, float *mask, size_t n, float p, uint64_t seed);
int cuda_mul(KBackend *kb, const float *a, const float *b, float *out, size_t n);
int cuda_layernorm(KBackend *kb, const float *x, const float *g, const float *b, int rows, int cols, float eps,
                   float *y, float *mean, float *rstd);
int cuda_layernorm_backward(KBackend *kb, const float *dy, const float *x, const float *g, const float *mean,
                            const float *rstd, int rows, int cols, float *dx, float *dg, float *db);
int cuda_embedding(KBackend *kb, const float *ids, const float *table, int n, int dim, int vocab, float *y);
int cuda_embedding_backward(KBackend *kb, const float *ids, const float *dy, int n, int dim, int vocab,
                            float *dtable);
int cuda_softmax(KBackend *kb, const float *x, float *y, int rows, int cols, int causal_t);
int cuda_softmax_backward(KBackend *kb, const float *y, const float *dy, float *dx, int rows, int cols);
