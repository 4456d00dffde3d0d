/* SPDX-License-Identifier: Apache-2.0 */
/* See dlrm.h. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include "alloc.h"
#include "dlrm.h"
#include "macro.h"

int dlrm_init(Dlrm *m, const ModelDesc *d, size_t max_batch) {
        memset(m, 0, sizeof *m);
        if (!d->click || d->dlrm_bottom == 0 || d->ntensors % 2 || d->dlrm_bottom % 2 ||
            d->ntensors / 2 - d->dlrm_bottom / 2 > DLRM_MAX_LINEARS || d->dlrm_bottom / 2 > DLRM_MAX_LINEARS)
                return -EINVAL;
        m->fields = d->click_fields;
        m->dim = d->click_dim;
        m->pairs = m->fields * (m->fields + 1) / 2;
        m->max_batch = MAX(max_batch, (size_t) 1);
        /* Each Linear is a weight [out x in] and a bias. */
        for (size_t t = 0; t < d->ntensors; t += 2) {
                bool bottom = t < d->dlrm_bottom;
                uint32_t *w = bottom ? m->bot : m->top, *n = bottom ? &m->nbot : &m->ntop;
                if (*n == 0)
                        w[0] = d->tensors[t].shape[1];
                w[++*n] = d->tensors[t].shape[0];
        }
        m->dense = m->bot[0];
        if (m->bot[m->nbot] != m->dim || m->top[0] != m->dim + m->pairs || m->top[m->ntop] != 1)
                return -EINVAL;
        size_t floats = 0, maxw = 0, b = m->max_batch, nvec = (size_t) (m->fields + 1) * m->dim;
        for (uint32_t l = 0; l <= m->nbot; l++)
                floats += b * m->bot[l], maxw = MAX(maxw, (size_t) m->bot[l]);
        for (uint32_t l = 0; l <= m->ntop; l++)
                floats += b * m->top[l], maxw = MAX(maxw, (size_t) m->top[l]);
        size_t nv = (size_t) m->fields + 1;
        floats += b * nvec + nvec + 2 * b * maxw + nv * nv;
        m->buf = ps_calloc(floats, sizeof(float));
        if (!m->buf)
                return -ENOMEM;
        float *p = m->buf;
        for (uint32_t l = 0; l <= m->nbot; l++)
                m->bot_act[l] = p, p += b * m->bot[l];
        for (uint32_t l = 0; l <= m->ntop; l++)
                m->top_act[l] = p, p += b * m->top[l];
        m->vec = p, p += b * nvec;
        m->dvec = p, p += nvec;
        m->delta[0] = p, p += b * maxw;
        m->delta[1] = p, p += b * maxw;
        m->gram = p;
        return 0;
}

void dlrm_free(Dlrm *m) {
        ps_free(m->buf);
        memset(m, 0, sizeof *m);
}

/* out [n x w[l+1]] = in [n x w[l]] W^T + bias, then a ReLU where relu. */
static void linear(size_t n, uint32_t in, uint32_t out, const float *x, const float *w, const float *bias, float *y,
                   bool relu) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int) n, (int) out, (int) in, 1.0f, x, (int) in, w,
                    (int) in, 0.0f, y, (int) out);
        for (size_t s = 0; s < n; s++) {
                float *r = y + s * out;
                for (uint32_t k = 0; k < out; k++) {
                        float v = r[k] + bias[k];
                        r[k] = relu && v < 0 ? 0.0f : v;
                }
        }
}

/* The forward pass over n samples: sample s's dense features are x(s) and
 * its rows' places in b->rows slot[s * F ..]. The logits land in
 * top_act[ntop]. */
static void forward(Dlrm *m, const ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t first, size_t n,
                    const uint32_t *slot, float *const *params) {
        uint32_t E = m->dim, F = m->fields, D = m->dense;
        for (size_t s = 0; s < n; s++)
                memcpy(m->bot_act[0] + s * D, d->x + (size_t) (idx ? idx[s] : first + s) * D, D * sizeof(float));
        size_t t = 0;
        for (uint32_t l = 0; l < m->nbot; l++, t += 2)
                linear(n, m->bot[l], m->bot[l + 1], m->bot_act[l], params[t], params[t + 1], m->bot_act[l + 1], true);
        size_t nvec = (size_t) (F + 1) * E;
        uint32_t tin = m->top[0];
        for (size_t s = 0; s < n; s++) {
                float *v = m->vec + s * nvec, *r = m->top_act[0] + s * tin;
                memcpy(v, m->bot_act[m->nbot] + s * E, E * sizeof(float));
                for (uint32_t f = 0; f < F; f++) {
                        uint32_t u = slot[s * F + f];
                        if (u == CLICK_MISSING)
                                memset(v + (size_t) (f + 1) * E, 0, E * sizeof(float));
                        else
                                memcpy(v + (size_t) (f + 1) * E, b->rows + (size_t) u * E, E * sizeof(float));
                }
                memcpy(r, v, E * sizeof(float));
                /* The lower triangle of v v^T, one product a sample. */
                cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int) F + 1, (int) E, 1.0f, v, (int) E, 0.0f,
                            m->gram, (int) F + 1);
                float *z = r + E;
                for (uint32_t i = 1; i <= F; i++)
                        for (uint32_t j = 0; j < i; j++)
                                *z++ = m->gram[(size_t) i * (F + 1) + j];
        }
        for (uint32_t l = 0; l < m->ntop; l++, t += 2)
                linear(n, m->top[l], m->top[l + 1], m->top_act[l], params[t], params[t + 1], m->top_act[l + 1],
                       l + 1 < m->ntop);
}

void dlrm_logits(Dlrm *m, const ClickBatch *b, const ClickData *d, size_t first, size_t n, float *const *params,
                 float *logits) {
        forward(m, b, d, NULL, first, n, b->slot + first * m->fields, params);
        memcpy(logits, m->top_act[m->ntop], n * sizeof(float));
}

/* Linear l's backward: dy [n x out] (its ReLU's mask already applied) gives
 * gw = dy^T x, gb = the column sums of dy, and, where dx, dx = dy W. */
static void linear_back(size_t n, uint32_t in, uint32_t out, const float *x, const float *w, const float *dy,
                        float *gw, float *gb, float *dx) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int) out, (int) in, (int) n, 1.0f, dy, (int) out, x,
                    (int) in, 0.0f, gw, (int) in);
        memset(gb, 0, out * sizeof(float));
        for (size_t s = 0; s < n; s++)
                for (uint32_t k = 0; k < out; k++)
                        gb[k] += dy[s * out + k];
        if (dx)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int) n, (int) in, (int) out, 1.0f, dy,
                            (int) out, w, (int) in, 0.0f, dx, (int) in);
}

/* dx where the ReLU that made y let nothing through: zero. */
static void relu_mask(float *dx, const float *y, size_t count) {
        for (size_t i = 0; i < count; i++)
                if (y[i] <= 0)
                        dx[i] = 0;
}

float dlrm_step(Dlrm *m, ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, float *const *params,
                float *const *grads) {
        uint32_t E = m->dim, F = m->fields;
        forward(m, b, d, idx, 0, n, b->slot, params);
        const float *logit = m->top_act[m->ntop];
        float *dy = m->delta[0], *dx = m->delta[1];
        double loss = 0;
        for (size_t s = 0; s < n; s++) {
                double z = logit[s], y = d->y[idx ? idx[s] : s];
                /* log(1 + e^-|z|) + max(z, 0) - y z: stable for any z. */
                loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y * z;
                dy[s] = (float) ((1.0 / (1.0 + exp(-z)) - y) / (double) n);
        }
        size_t t = 2 * (size_t) (m->nbot + m->ntop);
        for (uint32_t l = m->ntop; l-- > 0;) {
                t -= 2;
                linear_back(n, m->top[l], m->top[l + 1], m->top_act[l], params[t], dy, grads[t], grads[t + 1], dx);
                if (l > 0)
                        relu_mask(dx, m->top_act[l], n * m->top[l]);
                float *tmp = dy;
                dy = dx, dx = tmp;
        }
        /* dy: the top's input gradient, [n x (E + pairs)]. Back through the
         * dot products into the vectors. */
        size_t nvec = (size_t) (F + 1) * E;
        uint32_t tin = m->top[0];
        memset(b->rgrad, 0, b->nuniq * E * sizeof(float));
        for (size_t s = 0; s < n; s++) {
                const float *v = m->vec + s * nvec, *dr = dy + s * tin, *dz = dr + E;
                float *dv = m->dvec, *g = m->gram;
                /* A pair's gradient g reaches both vectors: dv = G v with G
                 * symmetric, g at (i, j) and (j, i), zeros on its diagonal. */
                for (uint32_t i = 0; i <= F; i++) {
                        g[(size_t) i * (F + 1) + i] = 0;
                        for (uint32_t j = 0; j < i; j++, dz++)
                                g[(size_t) i * (F + 1) + j] = g[(size_t) j * (F + 1) + i] = *dz;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int) F + 1, (int) E, (int) F + 1, 1.0f, g,
                            (int) F + 1, v, (int) E, 0.0f, dv, (int) E);
                for (uint32_t k = 0; k < E; k++)
                        dv[k] += dr[k];
                for (uint32_t f = 0; f < F; f++) {
                        uint32_t u = b->slot[s * F + f];
                        if (u != CLICK_MISSING)
                                cblas_saxpy((int) E, 1.0f, dv + (size_t) (f + 1) * E, 1, b->rgrad + (size_t) u * E, 1);
                }
                memcpy(dx + s * E, dv, E * sizeof(float));
        }
        dy = dx, dx = dy == m->delta[0] ? m->delta[1] : m->delta[0];
        relu_mask(dy, m->bot_act[m->nbot], n * E);
        for (uint32_t l = m->nbot; l-- > 0;) {
                t -= 2;
                linear_back(n, m->bot[l], m->bot[l + 1], m->bot_act[l], params[t], dy, grads[t], grads[t + 1],
                            l > 0 ? dx : NULL);
                if (l > 0)
                        relu_mask(dx, m->bot_act[l], n * m->bot[l]);
                float *tmp = dy;
                dy = dx, dx = tmp;
        }
        return (float) (loss / (double) MAX(n, (size_t) 1));
}
