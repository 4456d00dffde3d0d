/* SPDX-License-Identifier: Apache-2.0 */
/* The dlrm:F:BOT:TOP model's step on a compute backend (kernels.h), the
 * same arithmetic as dlrm.c's (dlrm.h says what it computes) written with
 * the backend's ops alone, so that it runs on the CUDA backend as on the
 * CPU: the MLPs with gemm_ep and gemm, each sample's F + 1 vectors gathered
 * with embedding from one table (z, a zero row for a missing field, the
 * batch's rows), their dot products with gemm_batched and gathered into
 * the top's input with embedding again, the loss with softmax_xent over
 * (0, logit) (whose softmax is the sigmoid's), and the backward with the
 * same ops' backwards (embedding_backward sums each row's gradients over
 * the samples that hold it). Ids are whole floats for embedding: a shape
 * whose tables pass 2^24 entries is refused at init.
 *
 * It is checked against dlrm.c on the CPU backend, and on a GPU against the
 * CPU backend (tests/unit/test-dlrm-kb.c); until that has passed on a GPU,
 * workerd runs it there only when asked to (click-kb.h: CLICK_CUDA_CHECKED). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "click.h"
#include "click-kb.h"
#include "clickdata.h"
#include "dlrm.h"
#include "kernels.h"

#define DLRM_KB_TENSORS (2 * 2 * DLRM_MAX_LINEARS)


typedef struct DlrmKb {
        KBackend *kb;
        Dlrm shape;                     /* the widths (dlrm_init's; its host buffers unused) */
        size_t max_batch, max_rows;     /* samples a call; distinct rows a batch or the test set holds */
        size_t ntensors;
        size_t numel[DLRM_KB_TENSORS];
        float *param[DLRM_KB_TENSORS], *grad[DLRM_KB_TENSORS];
        float *bot_act[DLRM_MAX_LINEARS + 1], *top_act[DLRM_MAX_LINEARS + 1];
        float *tab, *dtab;              /* [z (max_batch rows) | a zero row | the rows (max_rows)] x E, its gradient */
        float *vid, *tid;               /* embedding's ids: the vectors', the top input's */
        float *vec, *dvec;              /* [n x (F + 1) x E] */
        float *zg, *dzg;                /* [z (max_batch x E) | each sample's (F + 1)^2 dot products] */
        ClickLoss ls;                   /* the logits at ls.lt + 1, their loss */
        float *delta[2];
        /* Host staging. */
        float *x_h, *vid_h;
        size_t rows_loaded;             /* the rows dlrm_kb_load_rows put in tab */
} DlrmKb;

/* For the model d on kb, batches of at most max_batch samples whose
 * distinct rows (and the test set's) number at most max_rows: 0, -ENOMEM,
 * -EINVAL (not a DLRM), or -E2BIG (a table of ids past 2^24 entries), the
 * reason in err. */
int dlrm_kb_init(DlrmKb *m, KBackend *kb, const ModelDesc *d, size_t max_batch, size_t max_rows, char *err,
                 size_t errlen);
void dlrm_kb_free(DlrmKb *m);
/* dlrm_step on the backend: the mean loss into *ret_loss, the tensors'
 * gradients into grads (host) and the rows' into b->rgrad. 0, or the
 * backend's error. */
int dlrm_kb_step(DlrmKb *m, ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, float *const *params,
                 float *const *grads, float *ret_loss);
/* Before dlrm_kb_logits: the tensors and every row of b (the test set's,
 * gathered with idx NULL) onto the backend. */
int dlrm_kb_load(DlrmKb *m, const ClickBatch *b, float *const *params);
/* dlrm_logits of samples first..first+n of d (n <= max_batch) from what
 * dlrm_kb_load put there. */
int dlrm_kb_logits(DlrmKb *m, const ClickBatch *b, const ClickData *d, size_t first, size_t n, float *logits);
