/* SPDX-License-Identifier: Apache-2.0 */
/* See click-kb.h. For B = max_batch samples, F fields, D dense features,
 * U distinct rows: tab [1 + U] (row 0 zero, then the rows), vid [n x F]
 * (each field's row in tab, 0 where missing), g [n x F] the rows gathered;
 * the logits at ls.lt + 1 (ClickLoss). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "click-kb.h"
#include "macro.h"

int click_kb_alloc(KBackend *kb, size_t floats, void *ret) {
        return kb->ops->alloc(kb, MAX(floats, (size_t) 1) * sizeof(float), (void **) ret);
}

int click_kb_alloc_all(KBackend *kb, float **const *bufs, const size_t *sizes, size_t n) {
        int r = 0;
        for (size_t i = 0; r == 0 && i < n; i++)
                r = click_kb_alloc(kb, sizes[i], bufs[i]);
        return r;
}

int click_loss_init(ClickLoss *l, KBackend *kb, size_t max_batch) {
        memset(l, 0, sizeof *l);
        size_t B = MAX(max_batch, (size_t) 1);
        l->max_batch = B;
        float **const bufs[] = { &l->lt, &l->dlt, &l->lid, &l->l2, &l->dl2, &l->loss, (float **) &l->label };
        const size_t sizes[] = { 1 + B, 1 + B, 2 * B, 2 * B, 2 * B, B, B };
        int r = click_kb_alloc_all(kb, bufs, sizes, sizeof sizes / sizeof *sizes);
        float *h = r == 0 ? ps_calloc(2 * B, sizeof(float)) : NULL;
        l->loss_h = r == 0 ? ps_calloc(B, sizeof(float)) : NULL;
        l->label_h = r == 0 ? ps_calloc(B, sizeof(int32_t)) : NULL;
        if (r == 0 && (!h || !l->loss_h || !l->label_h))
                r = -ENOMEM;
        for (size_t i = 0; r == 0 && i < B; i++) {
                h[2 * i] = 0.0f;
                h[2 * i + 1] = (float) (1 + i);
        }
        if (r == 0) /* (0, logit) of sample i: lt[0], lt[1 + i] */
                r = kb->ops->upload(kb, l->lid, h, 2 * B * sizeof(float));
        if (r == 0) {
                h[0] = 0.0f;
                r = kb->ops->upload(kb, l->lt, h, sizeof(float));
        }
        ps_free(h);
        if (r < 0)
                click_loss_free(l, kb);
        return r;
}

void click_loss_free(ClickLoss *l, KBackend *kb) {
        void *bufs[] = { l->lt, l->dlt, l->lid, l->l2, l->dl2, l->loss, l->label };
        for (size_t i = 0; kb && i < sizeof bufs / sizeof *bufs; i++)
                kb->ops->free(kb, bufs[i]);
        ps_free(l->loss_h);
        ps_free(l->label_h);
        memset(l, 0, sizeof *l);
}

int click_loss_step(ClickLoss *l, KBackend *kb, const ClickData *d, const uint32_t *idx, size_t n, float *ret_loss) {
        const KernelsOps *o = kb->ops;
        int B = (int) l->max_batch;
        for (size_t i = 0; i < n; i++)
                l->label_h[i] = d->y[idx ? idx[i] : i] ? 1 : 0;
        int r = o->upload(kb, l->label, l->label_h, n * sizeof(int32_t));
        if (r == 0)
                r = o->embedding(kb, l->lid, l->lt, (int) (2 * n), 1, 1 + B, l->l2);
        if (r == 0)
                r = o->softmax_xent(kb, l->l2, l->label, (int) n, 2, 1.0f / (float) n, l->dl2, l->loss);
        if (r == 0)
                r = o->embedding_backward(kb, l->lid, l->dl2, (int) (2 * n), 1, 1 + B, l->dlt);
        if (r == 0)
                r = o->download(kb, l->loss_h, l->loss, n * sizeof(float));
        double sum = 0;
        for (size_t i = 0; r == 0 && i < n; i++)
                sum += l->loss_h[i];
        *ret_loss = (float) (sum / (double) MAX(n, (size_t) 1));
        return r;
}

int lr_kb_init(LrKb *m, KBackend *kb, uint32_t fields, uint32_t dense, size_t max_batch, size_t max_rows, char *err,
               size_t errlen) {
        memset(m, 0, sizeof *m);
        m->kb = kb;
        const KernelsOps *o = kb->ops;
        if (!o->embedding || !o->embedding_backward) {
                snprintf(err, errlen, "the %s backend lacks the ops an lr:D step takes", o->name);
                return -ENOTSUP;
        }
        size_t B = MAX(max_batch, (size_t) 1), F = MAX(fields, 1u);
        m->fields = fields;
        m->dense = dense;
        m->max_batch = B;
        m->max_rows = max_rows;
        if (1 + max_rows >= CLICK_KB_EXACT || 1 + B >= CLICK_KB_EXACT) {
                snprintf(err, errlen, "%zu distinct rows pass the 2^24 ids a step gathers by", max_rows);
                return -E2BIG;
        }
        float **const bufs[] = { &m->w, &m->bias, &m->gw, &m->gb, &m->x, &m->tab, &m->dtab, &m->vid, &m->g, &m->gf,
                                 &m->ones };
        const size_t sizes[] = { dense, 1, dense, 1, B * dense, 1 + max_rows, 1 + max_rows, B * F, B * F, B * F, F };
        int r = click_loss_init(&m->ls, kb, B);
        if (r == 0)
                r = click_kb_alloc_all(kb, bufs, sizes, sizeof sizes / sizeof *sizes);
        m->x_h = r == 0 ? ps_calloc(MAX(MAX(B * dense, F), (size_t) 1), sizeof(float)) : NULL;
        m->vid_h = r == 0 ? ps_calloc(B * F, sizeof(float)) : NULL;
        if (r == 0 && (!m->x_h || !m->vid_h))
                r = -ENOMEM;
        /* What never changes: ones, and tab's zero row. */
        float *h = m->x_h;
        for (size_t i = 0; r == 0 && i < F; i++)
                h[i] = 1.0f;
        if (r == 0)
                r = o->upload(kb, m->ones, h, F * sizeof(float));
        if (r == 0) {
                h[0] = 0.0f;
                r = o->upload(kb, m->tab, h, sizeof(float));
        }
        if (r < 0) {
                snprintf(err, errlen, "%s", r == -ENOMEM ? "out of memory for an lr:D step's buffers" : "the backend "
                         "failed setting an lr:D step's buffers up");
                lr_kb_free(m);
        }
        return r;
}

void lr_kb_free(LrKb *m) {
        if (!m->kb)
                return;
        void *bufs[] = { m->w, m->bias, m->gw, m->gb, m->x, m->tab, m->dtab, m->vid, m->g, m->gf, m->ones };
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
                m->kb->ops->free(m->kb, bufs[i]);
        click_loss_free(&m->ls, m->kb);
        ps_free(m->x_h);
        ps_free(m->vid_h);
        memset(m, 0, sizeof *m);
}

static int load(LrKb *m, const ClickBatch *b, const float *w, float bias) {
        if (b->nuniq > m->max_rows)
                return -E2BIG;
        const KernelsOps *o = m->kb->ops;
        m->rows_loaded = b->nuniq;
        int r = b->nuniq ? o->upload(m->kb, m->tab + 1, b->rows, b->nuniq * sizeof(float)) : 0;
        if (r == 0 && m->dense)
                r = o->upload(m->kb, m->w, w, m->dense * sizeof(float));
        if (r == 0)
                r = o->upload(m->kb, m->bias, &bias, sizeof(float));
        return r;
}

/* The logits of n samples (idx[s], or first + s), their rows at slot[s * F ..]: at lt + 1. */
static int forward(LrKb *m, const ClickData *d, const uint32_t *idx, size_t first, size_t n, const uint32_t *slot) {
        const KernelsOps *o = m->kb->ops;
        KBackend *kb = m->kb;
        size_t F = m->fields, D = m->dense;
        if (n == 0 || n > m->max_batch || F == 0)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                if (D)
                        memcpy(m->x_h + i * D, d->x + (size_t) (idx ? idx[i] : first + i) * D, D * sizeof(float));
                for (size_t f = 0; f < F; f++) {
                        uint32_t u = slot[i * F + f];
                        m->vid_h[i * F + f] = u == CLICK_MISSING ? 0.0f : (float) (1 + u);
                }
        }
        float *z = m->ls.lt + 1;
        int r = D ? o->upload(kb, m->x, m->x_h, n * D * sizeof(float)) : 0;
        if (r == 0)
                r = o->upload(kb, m->vid, m->vid_h, n * F * sizeof(float));
        if (r == 0)
                r = o->embedding(kb, m->vid, m->tab, (int) (n * F), 1, (int) (1 + m->rows_loaded), m->g);
        if (r == 0) /* each sample's rows summed */
                r = o->gemm(kb, false, false, (int) n, 1, (int) F, 1.0f, m->g, (int) F, m->ones, 1, 0.0f, z, 1);
        if (r == 0)
                r = o->bias_act(kb, z, m->bias, (int) n, 1, KACT_NONE);
        if (r == 0 && D) /* + x w */
                r = o->gemm(kb, false, false, (int) n, 1, (int) D, 1.0f, m->x, (int) D, m->w, 1, 1.0f, z, 1);
        return r;
}

int lr_kb_step(LrKb *m, ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, const float *w, float bias,
               float *gw, float *gb, float *ret_loss) {
        const KernelsOps *o = m->kb->ops;
        KBackend *kb = m->kb;
        size_t F = m->fields, D = m->dense;
        int r = load(m, b, w, bias);
        if (r == 0)
                r = forward(m, d, idx, 0, n, b->slot);
        if (r == 0)
                r = click_loss_step(&m->ls, kb, d, idx, n, ret_loss);
        const float *dz = m->ls.dlt + 1;
        if (r == 0 && D) /* x^T dz */
                r = o->gemm(kb, true, false, (int) D, 1, (int) n, 1.0f, m->x, (int) D, dz, 1, 0.0f, m->gw, 1);
        if (r == 0)
                r = o->colsum(kb, dz, (int) n, 1, m->gb);
        if (r == 0) /* each field's row takes its sample's dz */
                r = o->gemm(kb, false, false, (int) n, (int) F, 1, 1.0f, dz, 1, m->ones, (int) F, 0.0f, m->gf, (int) F);
        if (r == 0)
                r = o->embedding_backward(kb, m->vid, m->gf, (int) (n * F), 1, (int) (1 + m->rows_loaded), m->dtab);
        if (r == 0 && D)
                r = o->download(kb, gw, m->gw, D * sizeof(float));
        if (r == 0)
                r = o->download(kb, gb, m->gb, sizeof(float));
        if (r == 0 && b->nuniq)
                r = o->download(kb, b->rgrad, m->dtab + 1, b->nuniq * sizeof(float));
        return r;
}

int lr_kb_load(LrKb *m, const ClickBatch *b, const float *w, float bias) {
        return load(m, b, w, bias);
}

int lr_kb_logits(LrKb *m, const ClickBatch *b, const ClickData *d, size_t first, size_t n, float *logits) {
        int r = forward(m, d, NULL, first, n, b->slot + first * m->fields);
        return r == 0 ? m->kb->ops->download(m->kb, logits, m->ls.lt + 1, n * sizeof(float)) : r;
}
