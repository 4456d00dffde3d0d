/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU backend's layer ops (kernels-cpu-layers.c), for its ops table. */
#pragma once
#include "kernels.h"

#define MIN_INT(a, b) ((a) < (b) ? (a) : (b))

int cpu_axpy(KBackend *kb, size_t n, float alpha, const float *x, float *y);
int cpu_permute0213(KBackend *kb, const float *x, int a, int b, int c, int d, float *y);
int cpu_im2col(KBackend *kb, const KWindow *w, const float *x, float *col);
int cpu_col2im(KBackend *kb, const KWindow *w, const float *col, float *dx);
int cpu_pool(KBackend *kb, const KWindow *w, bool max, const float *x, float *y, int32_t *idx);
int cpu_pool_backward(KBackend *kb, const KWindow *w, bool max, const float *dy, const int32_t *idx, float *dx);
int cpu_gelu(KBackend *kb, const float *x, float *y, size_t n);
int cpu_gelu_backward(KBackend *kb, const float *x, const float *dy, float *dx, size_t n);
int cpu_dropout(KBackend *kb, const float *x, float *y, float *mask, size_t n, float p, uint64_t seed);
int cpu_mul(KBackend *kb, const float *a, const float *b, float *out, size_t n);
int cpu_layernorm(KBackend *kb, const float *x, const float *g, const float *b, int rows, int cols, float eps, float *y,
                  float *mean, float *rstd);
int cpu_layernorm_backward(KBackend *kb, const float *dy, const float *x, const float *g, const float *mean,
                           const float *rstd, int rows, int cols, float *dx, float *dg, float *db);
int cpu_embedding(KBackend *kb, const float *ids, const float *table, int n, int dim, int vocab, float *y);
int cpu_embedding_backward(KBackend *kb, const float *ids, const float *dy, int n, int dim, int vocab, float *dtable);
int cpu_softmax(KBackend *kb, const float *x, float *y, int rows, int cols, int causal_t);
int cpu_softmax_backward(KBackend *kb, const float *y, const float *dy, float *dx, int rows, int cols);
