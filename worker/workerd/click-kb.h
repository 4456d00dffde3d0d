/* SPDX-License-Identifier: Apache-2.0 */
/* lr:D's step on a compute backend (kernels.h), click.c's arithmetic
 * (click.h) written with the backend's ops alone, as dlrm-kb.c does for
 * dlrm: each sample's rows (one float each) gathered with embedding from a
 * table of a zero row (a missing field) and the batch's rows, summed by a
 * product with ones, beside the dense features' product with w and the
 * bias; the loss with softmax_xent over (0, logit); each row's gradient the
 * sum of its samples' (embedding_backward). In float where click.c sums a
 * logit in double. Checked against click.c on the CPU backend and against
 * the CPU backend on a GPU (tests/unit/test-dlrm-kb.c). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "click.h"
#include "clickdata.h"
#include "kernels.h"

/* Ids below this are whole floats, which embedding reads exactly: a step's
 * tables of ids stay under it. */
#define CLICK_KB_EXACT (1u << 24)

/* A backend buffer of floats floats (at least one) into *ret: 0, or the
 * backend's error. */
int click_kb_alloc(KBackend *kb, size_t floats, void *ret);
/* Each bufs[i] of sizes[i] floats, until one fails: 0, or that error. */
int click_kb_alloc_all(KBackend *kb, float **const *bufs, const size_t *sizes, size_t n);

/* Whether test-dlrm-kb (lr:D's and dlrm's steps on a backend) has passed on
 * a GPU: until then workerd refuses --backend cuda for the click models,
 * and auto trains them on the CPU (no unchecked step computes a user's
 * gradient). The commit that records a passing GPU run sets it. */
#define CLICK_CUDA_CHECKED false

/* Both steps' loss, the mean binary cross-entropy of the logits: a
 * softmax cross-entropy over (0, logit) per sample, whose softmax is the
 * sigmoid's, and the logit's gradient that of its second column. For
 * batches of at most max_batch: lt [1 + max_batch] is a zero, then the
 * logits (where a step's forward writes them, at lt + 1); dlt their
 * gradients likewise. */
typedef struct ClickLoss {
        size_t max_batch;
        float *lt, *dlt, *lid, *l2, *dl2, *loss;
        int32_t *label;
        float *loss_h;
        int32_t *label_h;
} ClickLoss;

/* 0, or a negative errno (nothing held then). */
int click_loss_init(ClickLoss *l, KBackend *kb, size_t max_batch);
void click_loss_free(ClickLoss *l, KBackend *kb);
/* The loss of the logits at lt + 1 of samples idx[s] (or s) of d: their
 * gradients (scaled by 1 / n) at dlt + 1, the mean loss into *ret_loss. */
int click_loss_step(ClickLoss *l, KBackend *kb, const ClickData *d, const uint32_t *idx, size_t n, float *ret_loss);

typedef struct LrKb {
        KBackend *kb;
        uint32_t fields, dense;
        size_t max_batch, max_rows, rows_loaded;
        float *w, *bias, *gw, *gb;
        float *x, *tab, *dtab, *vid, *g, *gf, *ones;
        ClickLoss ls;
        float *x_h, *vid_h;
} LrKb;

/* For lr:dense on kb over logs of fields fields, batches of at most
 * max_batch samples whose distinct rows (and the test set's) number at
 * most max_rows: 0, -ENOMEM, -ENOTSUP (the backend lacks an op), -E2BIG
 * (ids past 2^24), the reason in err. */
int lr_kb_init(LrKb *m, KBackend *kb, uint32_t fields, uint32_t dense, size_t max_batch, size_t max_rows, char *err,
               size_t errlen);
void lr_kb_free(LrKb *m);
/* click_lr_step on the backend: the mean loss into *ret_loss, the
 * gradients into gw (dense floats), *gb and b->rgrad. 0, or the backend's
 * error. */
int lr_kb_step(LrKb *m, ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, const float *w, float bias,
               float *gw, float *gb, float *ret_loss);
/* Before lr_kb_logits: w, bias and every row of b (the test set's). */
int lr_kb_load(LrKb *m, const ClickBatch *b, const float *w, float bias);
/* click_lr_logits of samples first..first+n of d (n <= max_batch). */
int lr_kb_logits(LrKb *m, const ClickBatch *b, const ClickData *d, size_t first, size_t n, float *logits);
