/* SPDX-License-Identifier: Apache-2.0 */
/* The dlrm:F:BOT:TOP model's arithmetic on the CPU (docs/tables.md, "The
 * built-in click models"), as the DLRM paper's reference (Naumov et al.
 * 2019, dlrm_s_pytorch.py with dot interactions) computes it: the bottom MLP
 * (Linear+ReLU each) takes a sample's D dense features to z of E floats; its
 * F fields' rows e_1..e_F (E floats each, zeros for a missing field) and z
 * are the F + 1 vectors whose pairwise dot products, in the order (1,0),
 * (2,0), (2,1), (3,0), ..., follow z into the top MLP (ReLU between its
 * layers); its last output is the logit, and the loss the mean binary
 * cross-entropy of its sigmoid (torch.nn.BCEWithLogitsLoss). The tensors are
 * the job's, bottom then top, each Linear's weight [out x in] and bias. The
 * rows come from a ClickBatch (click.h); their gradients go back into it. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "click.h"
#include "clickdata.h"
#include "modeldesc.h"

#define DLRM_MAX_LINEARS 16

typedef struct Dlrm {
        uint32_t fields, dense, dim;  /* F, D, E */
        uint32_t pairs;               /* dot products: F(F+1)/2 */
        uint32_t nbot, ntop;          /* Linear layers in each MLP */
        uint32_t bot[DLRM_MAX_LINEARS + 1], top[DLRM_MAX_LINEARS + 1]; /* widths, the input's first */
        size_t max_batch;
        float *bot_act[DLRM_MAX_LINEARS + 1]; /* [0] the batch's dense features, [l] layer l's output after its ReLU */
        float *top_act[DLRM_MAX_LINEARS + 1]; /* [0] the top's input (z and the dot products), [ntop] the logits */
        float *vec;                   /* per sample the F + 1 vectors z, e_1..e_F */
        float *dvec;                  /* one sample's gradients of them, used up before the next's */
        float *delta[2];              /* a layer's output gradient and its input's */
        float *gram;                  /* one sample's (F + 1) x (F + 1) dot products, or their gradients */
        float *buf;                   /* all of the above */
} Dlrm;

/* For the model d (a dlrm: description) and batches of at most max_batch
 * samples: 0, or -ENOMEM / -EINVAL (not a DLRM). */
int dlrm_init(Dlrm *m, const ModelDesc *d, size_t max_batch);
void dlrm_free(Dlrm *m);
/* One step over samples idx[0..n) of d (n <= max_batch), their rows pulled
 * into b (click_batch_gather over the same samples): the mean loss, the
 * tensors' gradients in grads (one per tensor, in the job's order) and the
 * rows' in b->rgrad (the sum over the samples that hold each id). */
float dlrm_step(Dlrm *m, ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, float *const *params,
                float *const *grads);
/* The logits of samples first..first+n of d (n <= max_batch), b holding the
 * rows of all of d's samples (gathered with idx NULL). */
void dlrm_logits(Dlrm *m, const ClickBatch *b, const ClickData *d, size_t first, size_t n, float *const *params,
                 float *logits);
