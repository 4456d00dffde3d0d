/* SPDX-License-Identifier: Apache-2.0 */
/* See dlrm-kb.h. The layout, for B = max_batch samples, F fields, E floats
 * a row, P = F(F+1)/2 pairs and U distinct rows:
 *   tab  [B + 1 + U rows x E]: the bottom MLP writes z of sample s at row s,
 *        row B stays zero (a missing field), the batch's rows follow;
 *   vid  [n x (F + 1)]: sample s's vectors' rows in tab (s, then each
 *        field's row or B), gathered into vec;
 *   zg   [B x E | B x (F + 1)^2]: z again, then each sample's dot products;
 *   tid  [B x (E + P)]: where each of the top's inputs lies in zg (z, then
 *        the lower triangle in dlrm.c's order), gathered into top_act[0];
 *   the logits at ls.lt + 1 (click-kb.h's ClickLoss: the top's last layer
 *        writes them there). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "dlrm-kb.h"
#include "macro.h"


int dlrm_kb_init(DlrmKb *m, KBackend *kb, const ModelDesc *d, size_t max_batch, size_t max_rows, char *err,
                 size_t errlen) {
        memset(m, 0, sizeof *m);
        m->kb = kb;
        int r = dlrm_init(&m->shape, d, 1);
        if (r < 0) {
                snprintf(err, errlen, "not a DLRM this backend step knows");
                return r;
        }
        ps_free(m->shape.buf); /* its widths alone are used */
        m->shape.buf = NULL;
        const KernelsOps *o = kb->ops;
        if (!o->embedding || !o->embedding_backward || !o->gemm_batched || !o->copy || !o->axpy) {
                snprintf(err, errlen, "the %s backend lacks the ops a DLRM step takes", o->name);
                return -ENOTSUP;
        }
        const Dlrm *s = &m->shape;
        size_t B = MAX(max_batch, (size_t) 1), E = s->dim, F = s->fields, V = F + 1, P = s->pairs;
        m->max_batch = B;
        m->max_rows = max_rows;
        if (B + 1 + max_rows >= CLICK_KB_EXACT || B * (E + V * V) >= CLICK_KB_EXACT) {
                snprintf(err, errlen, "a batch of %zu samples with %zu distinct rows passes the 2^24 ids a step "
                         "gathers by", B, max_rows);
                return -E2BIG;
        }
        m->ntensors = d->ntensors;
        for (size_t t = 0; t < d->ntensors; t++)
                m->numel[t] = (size_t) d->tensors[t].numel;
        size_t maxw = 0;
        for (uint32_t l = 0; l <= s->nbot; l++)
                maxw = MAX(maxw, (size_t) s->bot[l]);
        for (uint32_t l = 0; l <= s->ntop; l++)
                maxw = MAX(maxw, (size_t) s->top[l]);
        r = click_loss_init(&m->ls, kb, B);
        for (size_t t = 0; r == 0 && t < m->ntensors; t++) {
                r = click_kb_alloc(kb, m->numel[t], &m->param[t]);
                if (r == 0)
                        r = click_kb_alloc(kb, m->numel[t], &m->grad[t]);
        }
        for (uint32_t l = 0; r == 0 && l < s->nbot; l++) /* the last one's output is tab's z */
                r = click_kb_alloc(kb, B * s->bot[l], &m->bot_act[l]);
        for (uint32_t l = 0; r == 0 && l < s->ntop; l++) /* the last one's output is lt's logits */
                r = click_kb_alloc(kb, B * s->top[l], &m->top_act[l]);
        size_t ntab = (B + 1 + max_rows) * E, nzg = B * (E + V * V);
        float **const bufs[] = { &m->tab, &m->dtab, &m->vid, &m->tid, &m->vec, &m->dvec, &m->zg, &m->dzg,
                                 &m->delta[0], &m->delta[1] };
        const size_t sizes[] = { ntab, ntab, B * V, B * (E + P), B * V * E, B * V * E, nzg, nzg, B * maxw, B * maxw };
        if (r == 0)
                r = click_kb_alloc_all(kb, bufs, sizes, sizeof sizes / sizeof *sizes);
        m->bot_act[s->nbot] = m->tab;
        m->top_act[s->ntop] = m->ls.lt ? m->ls.lt + 1 : NULL;
        /* The host's staging, and what never changes: where the top's
         * inputs lie in zg, and tab's zero row. */
        size_t stage = MAX(MAX(B * s->dense, B * V), MAX(B * (E + P), E));
        m->x_h = r == 0 ? ps_calloc(stage, sizeof(float)) : NULL;
        m->vid_h = r == 0 ? ps_calloc(B * V, sizeof(float)) : NULL;
        if (r == 0 && (!m->x_h || !m->vid_h))
                r = -ENOMEM;
        float *h = m->x_h;
        for (size_t i = 0; r == 0 && i < B; i++) {
                float *row = h + i * (E + P);
                for (size_t k = 0; k < E; k++)
                        row[k] = (float) (i * E + k);
                float *pair = row + E;
                for (size_t a = 1; a < V; a++)
                        for (size_t b = 0; b < a; b++)
                                *pair++ = (float) (B * E + i * V * V + a * V + b);
        }
        if (r == 0)
                r = o->upload(kb, m->tid, h, B * (E + P) * sizeof(float));
        if (h)
                memset(h, 0, stage * sizeof(float));
        if (r == 0)
                r = o->upload(kb, m->tab + B * E, h, E * sizeof(float));
        if (r < 0) {
                snprintf(err, errlen, "%s", r == -ENOMEM ? "out of memory for a DLRM step's buffers" : "the backend "
                         "failed setting a DLRM step's buffers up");
                dlrm_kb_free(m);
        }
        return r;
}

void dlrm_kb_free(DlrmKb *m) {
        if (!m->kb)
                return;
        KBackend *kb = m->kb;
        void (*fr)(KBackend *, void *) = kb->ops->free;
        for (size_t t = 0; t < m->ntensors; t++) {
                fr(kb, m->param[t]);
                fr(kb, m->grad[t]);
        }
        for (uint32_t l = 0; l < m->shape.nbot; l++)
                fr(kb, m->bot_act[l]);
        for (uint32_t l = 0; l < m->shape.ntop; l++)
                fr(kb, m->top_act[l]);
        void *bufs[] = { m->tab, m->dtab, m->vid, m->tid, m->vec, m->dvec, m->zg, m->dzg, m->delta[0], m->delta[1] };
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
                fr(kb, bufs[i]);
        click_loss_free(&m->ls, kb);
        ps_free(m->x_h);
        ps_free(m->vid_h);
        memset(m, 0, sizeof *m);
}

static int upload_params(DlrmKb *m, float *const *params) {
        int r = 0;
        for (size_t t = 0; r == 0 && t < m->ntensors; t++)
                r = m->kb->ops->upload(m->kb, m->param[t], params[t], m->numel[t] * sizeof(float));
        return r;
}

/* The batch's U rows (b->rows) into tab, after z and the zero row. */
static int load_rows(DlrmKb *m, const ClickBatch *b) {
        if (b->nuniq > m->max_rows)
                return -E2BIG;
        m->rows_loaded = b->nuniq;
        return b->nuniq ? m->kb->ops->upload(m->kb, m->tab + (m->max_batch + 1) * m->shape.dim, b->rows,
                                             b->nuniq * m->shape.dim * sizeof(float))
                        : 0;
}

/* The forward pass of n samples (idx[s], or first + s) whose rows are at
 * slot[s * F ..] of those load_rows put in tab: the logits at lt + 1. */
static int forward(DlrmKb *m, const ClickData *d, const uint32_t *idx, size_t first, size_t n, const uint32_t *slot) {
        const KernelsOps *o = m->kb->ops;
        KBackend *kb = m->kb;
        const Dlrm *s = &m->shape;
        size_t B = m->max_batch, E = s->dim, F = s->fields, V = F + 1, D = s->dense, P = s->pairs;
        if (n == 0 || n > B)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                memcpy(m->x_h + i * D, d->x + (size_t) (idx ? idx[i] : first + i) * D, D * sizeof(float));
        for (size_t i = 0; i < n; i++) {
                float *v = m->vid_h + i * V;
                v[0] = (float) i;
                for (size_t f = 0; f < F; f++) {
                        uint32_t u = slot[i * F + f];
                        v[f + 1] = u == CLICK_MISSING ? (float) B : (float) (B + 1 + u);
                }
        }
        int r = o->upload(kb, m->bot_act[0], m->x_h, n * D * sizeof(float));
        if (r == 0)
                r = o->upload(kb, m->vid, m->vid_h, n * V * sizeof(float));
        size_t t = 0;
        for (uint32_t l = 0; r == 0 && l < s->nbot; l++, t += 2)
                r = o->gemm_ep(kb, false, true, (int) n, (int) s->bot[l + 1], (int) s->bot[l], m->bot_act[l],
                               (int) s->bot[l], m->param[t], (int) s->bot[l], m->bot_act[l + 1], (int) s->bot[l + 1],
                               KEPI_BIAS_RELU, m->param[t + 1]);
        if (r == 0)
                r = o->copy(kb, m->zg, m->tab, n * E * sizeof(float));
        if (r == 0)
                r = o->embedding(kb, m->vid, m->tab, (int) (n * V), (int) E, (int) (B + 1 + m->rows_loaded), m->vec);
        float *gram = m->zg + B * E;
        if (r == 0)
                r = o->gemm_batched(kb, false, true, (int) V, (int) V, (int) E, 1.0f, m->vec, (int) E,
                                    (long long) (V * E), m->vec, (int) E, (long long) (V * E), 0.0f, gram, (int) V,
                                    (long long) (V * V), (int) n);
        if (r == 0)
                r = o->embedding(kb, m->tid, m->zg, (int) (n * (E + P)), 1, (int) (B * (E + V * V)), m->top_act[0]);
        for (uint32_t l = 0; r == 0 && l < s->ntop; l++, t += 2)
                r = o->gemm_ep(kb, false, true, (int) n, (int) s->top[l + 1], (int) s->top[l], m->top_act[l],
                               (int) s->top[l], m->param[t], (int) s->top[l], m->top_act[l + 1], (int) s->top[l + 1],
                               l + 1 < s->ntop ? KEPI_BIAS_RELU : KEPI_BIAS, m->param[t + 1]);
        return r;
}

/* A Linear's backward: dy [n x out] gives its weight's and bias's
 * gradients and, where dx, dy W. */
static int linear_back(DlrmKb *m, size_t n, uint32_t in, uint32_t out, const float *x, size_t t, const float *dy,
                       float *dx) {
        const KernelsOps *o = m->kb->ops;
        int r = o->gemm(m->kb, true, false, (int) out, (int) in, (int) n, 1.0f, dy, (int) out, x, (int) in, 0.0f,
                        m->grad[t], (int) in);
        if (r == 0)
                r = o->colsum(m->kb, dy, (int) n, (int) out, m->grad[t + 1]);
        if (r == 0 && dx)
                r = o->gemm(m->kb, false, false, (int) n, (int) in, (int) out, 1.0f, dy, (int) out, m->param[t],
                            (int) in, 0.0f, dx, (int) in);
        return r;
}

int dlrm_kb_step(DlrmKb *m, ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, float *const *params,
                 float *const *grads, float *ret_loss) {
        const KernelsOps *o = m->kb->ops;
        KBackend *kb = m->kb;
        const Dlrm *s = &m->shape;
        size_t B = m->max_batch, E = s->dim, F = s->fields, V = F + 1, P = s->pairs;
        int r = load_rows(m, b);
        if (r == 0)
                r = upload_params(m, params);
        if (r == 0)
                r = forward(m, d, idx, 0, n, b->slot);
        if (r == 0)
                r = click_loss_step(&m->ls, kb, d, idx, n, ret_loss);
        const float *dy = m->ls.dlt + 1;
        float *dx = m->delta[0];
        size_t t = 2 * (size_t) (s->nbot + s->ntop);
        for (uint32_t l = s->ntop; r == 0 && l-- > 0;) {
                t -= 2;
                r = linear_back(m, n, s->top[l], s->top[l + 1], m->top_act[l], t, dy, dx);
                if (r == 0 && l > 0)
                        r = o->act_backward(kb, dx, m->top_act[l], n * s->top[l], KACT_RELU);
                dy = dx;
                dx = dx == m->delta[0] ? m->delta[1] : m->delta[0];
        }
        /* dy: the top's input gradient [n x (E + P)], back into z and the dot
         * products, then into the vectors (a pair's gradient reaches both:
         * dv = (G + G^T) v with G its lower triangle), then into z and the rows. */
        float *dgram = m->dzg + B * E;
        if (r == 0)
                r = o->embedding_backward(kb, m->tid, dy, (int) (n * (E + P)), 1, (int) (B * (E + V * V)), m->dzg);
        if (r == 0)
                r = o->gemm_batched(kb, false, false, (int) V, (int) E, (int) V, 1.0f, dgram, (int) V,
                                    (long long) (V * V), m->vec, (int) E, (long long) (V * E), 0.0f, m->dvec, (int) E,
                                    (long long) (V * E), (int) n);
        if (r == 0)
                r = o->gemm_batched(kb, true, false, (int) V, (int) E, (int) V, 1.0f, dgram, (int) V,
                                    (long long) (V * V), m->vec, (int) E, (long long) (V * E), 1.0f, m->dvec, (int) E,
                                    (long long) (V * E), (int) n);
        if (r == 0)
                r = o->embedding_backward(kb, m->vid, m->dvec, (int) (n * V), (int) E, (int) (B + 1 + m->rows_loaded),
                                          m->dtab);
        if (r == 0)
                r = o->axpy(kb, n * E, 1.0f, m->dzg, m->dtab);
        if (r == 0)
                r = o->act_backward(kb, m->dtab, m->tab, n * E, KACT_RELU);
        dy = m->dtab;
        dx = m->delta[0];
        for (uint32_t l = s->nbot; r == 0 && l-- > 0;) {
                t -= 2;
                r = linear_back(m, n, s->bot[l], s->bot[l + 1], m->bot_act[l], t, dy, l > 0 ? dx : NULL);
                if (r == 0 && l > 0)
                        r = o->act_backward(kb, dx, m->bot_act[l], n * s->bot[l], KACT_RELU);
                dy = dx;
                dx = dx == m->delta[0] ? m->delta[1] : m->delta[0];
        }
        for (size_t k = 0; r == 0 && k < m->ntensors; k++)
                r = o->download(kb, grads[k], m->grad[k], m->numel[k] * sizeof(float));
        if (r == 0 && b->nuniq)
                r = o->download(kb, b->rgrad, m->dtab + (B + 1) * E, b->nuniq * E * sizeof(float));
        return r;
}

int dlrm_kb_load(DlrmKb *m, const ClickBatch *b, float *const *params) {
        int r = load_rows(m, b);
        return r == 0 ? upload_params(m, params) : r;
}

int dlrm_kb_logits(DlrmKb *m, const ClickBatch *b, const ClickData *d, size_t first, size_t n, float *logits) {
        int r = forward(m, d, NULL, first, n, b->slot + first * m->shape.fields);
        return r == 0 ? m->kb->ops->download(m->kb, logits, m->ls.lt + 1, n * sizeof(float)) : r;
}
