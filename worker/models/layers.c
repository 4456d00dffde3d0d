/* SPDX-License-Identifier: Apache-2.0 */
/* The layers of a model (see model.c for how they are chained): each step's
 * buffers, forward and backward, in backend ops. Shapes: B the batch; a
 * rank-2 [T, D] layer works on R = B x T rows of D; images are NHWC. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "log.h"
#include "macro.h"
#include "model-internal.h"

#define NEED(op) \
        do { \
                if (!m->ops->op) \
                        return reason_set(err, errlen, -ENOTSUP, "layer %zu (%s) needs the op " #op \
                                          ", which backend %s lacks", s->index, layer_kind_name(s->l.kind), \
                                          m->ops->name); \
        } while (0)

/* Rows a rank-1 or rank-2 layer works on, and their width. */
static int rows_of(const MdShape *sh, int batch) {
        return sh->rank == 2 ? batch * (int) sh->d[0] : batch;
}

static int width_of(const MdShape *sh) {
        return (int) sh->d[sh->rank - 1];
}

static const float *P(const Model *m, const Step *s, unsigned i) {
        return m->param_dev[s->l.first_tensor + i];
}

static float *G(const Model *m, const Step *s, unsigned i) {
        return m->grad_dev[s->l.first_tensor + i];
}

static KWindow window(const Step *s, int batch) {
        KWindow w = s->win;
        w.n = batch;
        return w;
}

/* Scratch buffer i of at least n floats (shared by the blocks). */
static int scratch(Model *m, unsigned i, size_t n) {
        if (m->scr_n[i] >= n)
                return 0;
        int r = model_buf(m, n, &m->scr[i]);
        if (r == 0)
                m->scr_n[i] = n;
        return r;
}

static int setup_block(Model *m, Step *s, char *err, size_t errlen) {
        size_t mb = (size_t) m->max_batch, t = s->l.in.d[0], d = s->l.in.d[1], h = s->l.hidden;
        size_t r = mb * t, heads = s->l.heads;
        BlockBufs *b = &s->blk;
        int rc = 0;

        NEED(layernorm);
        NEED(layernorm_backward);
        NEED(permute0213);
        NEED(gemm_batched);
        NEED(softmax);
        NEED(softmax_backward);
        NEED(gelu);
        NEED(gelu_backward);
        NEED(axpy);
        float **bufs[] = { &b->h1, &b->mean1, &b->rstd1, &b->qkv, &b->heads, &b->p, &b->o_heads, &b->o,
                           &b->x1, &b->h2, &b->mean2, &b->rstd2, &b->u, &b->g };
        size_t sizes[] = { r * d, r, r, r * 3 * d, r * 3 * d, mb * heads * t * t, r * d, r * d,
                           r * d, r * d, r, r, r * h, r * h };
        for (size_t i = 0; i < ELEMENTSOF(bufs) && rc == 0; i++)
                rc = model_buf(m, sizes[i], bufs[i]);
        /* Backward scratch: a (R x max(D, hidden)), b, c (R x D), heads (3 R D),
         * qkv (3 R D), p (B H T T). */
        size_t need[] = { r * MAX(d, h), r * d, r * d, 3 * r * d, 3 * r * d, mb * heads * t * t };
        for (unsigned i = 0; i < ELEMENTSOF(need) && rc == 0; i++)
                rc = scratch(m, i, need[i]);
        return rc;
}

int step_setup(Model *m, Step *s, char *err, size_t errlen) {
        const MdLayer *l = &s->l;
        size_t mb = (size_t) m->max_batch, out_n = md_shape_numel(&l->outs);
        int r = 0;

        switch (l->kind) {
        case LK_LINEAR:
                break;
        case LK_CONV2D:
        case LK_MAXPOOL:
        case LK_AVGPOOL:
                s->win = (KWindow) { .n = m->max_batch, .h = (int) l->in.d[1], .w = (int) l->in.d[2],
                                     .c = (int) l->in.d[0], .k = (int) l->kernel, .stride = (int) l->stride,
                                     .pad = (int) l->padding, .ho = (int) l->outs.d[1], .wo = (int) l->outs.d[2] };
                if (l->kind == LK_CONV2D) {
                        NEED(im2col);
                        NEED(col2im);
                        r = model_buf(m, mb * l->outs.d[1] * l->outs.d[2] * l->in.d[0] * l->kernel * l->kernel, &s->col);
                } else {
                        NEED(pool);
                        NEED(pool_backward);
                        if (l->kind == LK_MAXPOOL)
                                r = model_buf(m, mb * out_n, (float **) &s->idx);
                }
                break;
        case LK_FLATTEN:
                /* Only an NHWC image with several channels and positions moves. */
                s->view = !(l->in.rank == 3 && l->in.d[0] > 1 && l->in.d[1] * l->in.d[2] > 1);
                if (!s->view)
                        NEED(permute0213);
                break;
        case LK_TOKENS:
                s->view = true;
                break;
        case LK_RELU:
                NEED(copy);
                s->in_place = true;
                break;
        case LK_GELU:
                NEED(gelu);
                NEED(gelu_backward);
                s->in_place = true;
                break;
        case LK_DROPOUT:
                s->view = l->p == 0.0f;
                s->in_place = true;
                if (!s->view) {
                        NEED(dropout);
                        NEED(mul);
                        NEED(copy);
                        r = model_buf(m, mb * out_n, &s->mask);
                }
                break;
        case LK_LAYERNORM:
                NEED(layernorm);
                NEED(layernorm_backward);
                r = model_buf(m, (size_t) rows_of(&l->in, m->max_batch), &s->mean);
                if (r == 0)
                        r = model_buf(m, (size_t) rows_of(&l->in, m->max_batch), &s->rstd);
                break;
        case LK_EMBEDDING:
                NEED(embedding);
                NEED(embedding_backward);
                break;
        case LK_POSEMBED:
                NEED(copy);
                s->in_place = true;
                break;
        case LK_TRANSFORMER:
                r = setup_block(m, s, err, errlen);
                break;
        case LK_MEAN: {
                NEED(gemm_batched);
                float *ones = NULL;
                size_t t = l->in.d[0];
                r = model_buf(m, t, &s->ones);
                if (r == 0 && !(ones = ps_malloc(t * sizeof *ones)))
                        r = -ENOMEM;
                if (r == 0) {
                        for (size_t i = 0; i < t; i++)
                                ones[i] = 1.0f;
                        r = m->ops->upload(m->kb, s->ones, ones, t * sizeof *ones);
                }
                ps_free(ones);
                break;
        }
        case LK_COUNT:
                return reason_set(err, errlen, -EINVAL, "layer %zu: unknown kind", s->index);
        }
        return r;
}

/* --- forward ------------------------------------------------------------------------------- */

static int block_forward(Model *m, Step *s, int batch, const float *x, float *y) {
        const KernelsOps *o = m->ops;
        KBackend *kb = m->kb;
        BlockBufs *b = &s->blk;
        int t = (int) s->l.in.d[0], d = (int) s->l.in.d[1], hid = (int) s->l.hidden, nh = (int) s->l.heads;
        int dh = d / nh, rows = batch * t, bh = batch * nh;
        long long rd = (long long) rows * d, hs = (long long) t * dh;
        float scale = 1.0f / sqrtf((float) dh), *qh = b->heads, *kh = qh + rd, *vh = kh + rd, *tmp = m->scr[4];
        int r;

        r = o->layernorm(kb, x, P(m, s, 8), P(m, s, 9), rows, d, 1e-5f, b->h1, b->mean1, b->rstd1);
        if (r >= 0)
                r = o->gemm_ep(kb, false, true, rows, 3 * d, d, b->h1, d, P(m, s, 0), d, b->qkv, 3 * d, KEPI_BIAS,
                               (float *) P(m, s, 1));
        /* [R, 3, D] -> [3, R, D], then each of q, k, v [B, T, H, Dh] -> [B, H, T, Dh]. */
        if (r >= 0)
                r = o->permute0213(kb, b->qkv, 1, rows, 3, d, tmp);
        for (int j = 0; j < 3 && r >= 0; j++)
                r = o->permute0213(kb, tmp + j * rd, batch, t, nh, dh, b->heads + j * rd);
        if (r >= 0)
                r = o->gemm_batched(kb, false, true, t, t, dh, scale, qh, dh, hs, kh, dh, hs, 0.0f, b->p, t,
                                    (long long) t * t, bh);
        if (r >= 0)
                r = o->softmax(kb, b->p, b->p, bh * t, t, s->l.causal ? t : 0);
        if (r >= 0)
                r = o->gemm_batched(kb, false, false, t, dh, t, 1.0f, b->p, t, (long long) t * t, vh, dh, hs, 0.0f,
                                    b->o_heads, dh, hs, bh);
        if (r >= 0)
                r = o->permute0213(kb, b->o_heads, batch, nh, t, dh, b->o);
        if (r >= 0)
                r = o->gemm_ep(kb, false, true, rows, d, d, b->o, d, P(m, s, 2), d, b->x1, d, KEPI_BIAS,
                               (float *) P(m, s, 3));
        if (r >= 0)
                r = o->axpy(kb, (size_t) rd, 1.0f, x, b->x1);
        if (r >= 0)
                r = o->layernorm(kb, b->x1, P(m, s, 10), P(m, s, 11), rows, d, 1e-5f, b->h2, b->mean2, b->rstd2);
        if (r >= 0)
                r = o->gemm_ep(kb, false, true, rows, hid, d, b->h2, d, P(m, s, 4), d, b->u, hid, KEPI_BIAS,
                               (float *) P(m, s, 5));
        if (r >= 0)
                r = o->gelu(kb, b->u, b->g, (size_t) rows * hid);
        if (r >= 0)
                r = o->gemm_ep(kb, false, true, rows, d, hid, b->g, hid, P(m, s, 6), hid, y, d, KEPI_BIAS,
                               (float *) P(m, s, 7));
        if (r >= 0)
                r = o->axpy(kb, (size_t) rd, 1.0f, b->x1, y);
        return r;
}

int step_forward(Model *m, Step *s, int batch, bool train, const float *x, float *y) {
        const KernelsOps *o = m->ops;
        KBackend *kb = m->kb;
        const MdLayer *l = &s->l;
        size_t n_in = (size_t) batch * md_shape_numel(&l->in);
        KWindow w;

        switch (l->kind) {
        case LK_LINEAR: {
                int rows = rows_of(&l->in, batch), in = width_of(&l->in), out = (int) l->out;
                return o->gemm_ep(kb, false, true, rows, out, in, x, in, P(m, s, 0), in, y, out,
                                  s->relu ? KEPI_BIAS_RELU : KEPI_BIAS, (float *) P(m, s, 1));
        }
        case LK_CONV2D: {
                w = window(s, batch);
                int rows = batch * w.ho * w.wo, ckk = w.c * w.k * w.k, out = (int) l->out;
                int r = o->im2col(kb, &w, x, s->col);
                if (r < 0)
                        return r;
                return o->gemm_ep(kb, false, true, rows, out, ckk, s->col, ckk, P(m, s, 0), ckk, y, out,
                                  s->relu ? KEPI_BIAS_RELU : KEPI_BIAS, (float *) P(m, s, 1));
        }
        case LK_MAXPOOL:
        case LK_AVGPOOL:
                w = window(s, batch);
                return o->pool(kb, &w, l->kind == LK_MAXPOOL, x, y, s->idx);
        case LK_FLATTEN:
                if (s->view)
                        return 0;
                /* NHWC [B, H*W, C] -> [B, C, H*W]: PyTorch's flatten order. */
                return o->permute0213(kb, x, batch, (int) (l->in.d[1] * l->in.d[2]), (int) l->in.d[0], 1, y);
        case LK_TOKENS:
                return 0;
        case LK_RELU: {
                int r = o->copy(kb, y, x, n_in * sizeof(float));
                return r < 0 ? r : o->bias_act(kb, y, NULL, batch, (int) md_shape_numel(&l->in), KACT_RELU);
        }
        case LK_GELU:
                return o->gelu(kb, x, y, n_in);
        case LK_DROPOUT:
                if (s->view)
                        return 0;
                if (!train)
                        return o->copy(kb, y, x, n_in * sizeof(float));
                return o->dropout(kb, x, y, s->mask, n_in, l->p, m->seed * 0x9e3779b97f4a7c15ull + m->trained * 1000003u +
                                                                     s->index);
        case LK_LAYERNORM:
                return o->layernorm(kb, x, P(m, s, 0), P(m, s, 1), rows_of(&l->in, batch), width_of(&l->in), l->eps,
                                    y, s->mean, s->rstd);
        case LK_EMBEDDING:
                return o->embedding(kb, x, P(m, s, 0), batch * (int) l->in.d[0], (int) l->out, (int) l->vocab, y);
        case LK_POSEMBED: {
                int r = o->copy(kb, y, x, n_in * sizeof(float));
                return r < 0 ? r : o->bias_act(kb, y, P(m, s, 0), batch, (int) md_shape_numel(&l->in), KACT_NONE);
        }
        case LK_TRANSFORMER:
                return block_forward(m, s, batch, x, y);
        case LK_MEAN: {
                int t = (int) l->in.d[0], d = (int) l->in.d[1];
                return o->gemm_batched(kb, false, false, 1, d, t, 1.0f / (float) t, s->ones, t, 0, x, d,
                                       (long long) t * d, 0.0f, y, d, d, batch);
        }
        case LK_COUNT:
                break;
        }
        return -EINVAL;
}

/* --- backward ------------------------------------------------------------------------------ */

static int block_backward(Model *m, Step *s, int batch, const float *x, float *dy, float *dx) {
        const KernelsOps *o = m->ops;
        KBackend *kb = m->kb;
        BlockBufs *b = &s->blk;
        int t = (int) s->l.in.d[0], d = (int) s->l.in.d[1], hid = (int) s->l.hidden, nh = (int) s->l.heads;
        int dh = d / nh, rows = batch * t, bh = batch * nh;
        long long rd = (long long) rows * d, hs = (long long) t * dh, tt = (long long) t * t;
        float scale = 1.0f / sqrtf((float) dh);
        float *sa = m->scr[0], *sb = m->scr[1], *sc = m->scr[2], *sh = m->scr[3], *sq = m->scr[4], *sp = m->scr[5];
        const float *qh = b->heads, *kh = qh + rd, *vh = kh + rd;
        int r;

        /* The MLP: y = x1 + W2 gelu(W1 ln2(x1) + b1) + b2. */
        r = o->gemm_ep(kb, true, false, d, hid, rows, dy, d, b->g, hid, G(m, s, 6), hid, KEPI_BGRAD, G(m, s, 7));
        if (r >= 0)
                r = o->gemm(kb, false, false, rows, hid, d, 1.0f, dy, d, P(m, s, 6), hid, 0.0f, sa, hid);
        if (r >= 0)
                r = o->gelu_backward(kb, b->u, sa, sa, (size_t) rows * hid);
        if (r >= 0)
                r = o->gemm_ep(kb, true, false, hid, d, rows, sa, hid, b->h2, d, G(m, s, 4), d, KEPI_BGRAD, G(m, s, 5));
        if (r >= 0)
                r = o->gemm(kb, false, false, rows, d, hid, 1.0f, sa, hid, P(m, s, 4), d, 0.0f, sb, d);
        if (r >= 0)
                r = o->layernorm_backward(kb, sb, b->x1, P(m, s, 10), b->mean2, b->rstd2, rows, d, sc, G(m, s, 10),
                                          G(m, s, 11));
        /* sc = dL/dx1: through the norm and the residual. */
        if (r >= 0)
                r = o->axpy(kb, (size_t) rd, 1.0f, dy, sc);

        /* Attention: x1 = x + Wout merge(softmax(q k^T / sqrt(Dh)) v) + bout. */
        if (r >= 0)
                r = o->gemm_ep(kb, true, false, d, d, rows, sc, d, b->o, d, G(m, s, 2), d, KEPI_BGRAD, G(m, s, 3));
        if (r >= 0)
                r = o->gemm(kb, false, false, rows, d, d, 1.0f, sc, d, P(m, s, 2), d, 0.0f, sb, d);
        if (r >= 0)
                r = o->permute0213(kb, sb, batch, t, nh, dh, sa); /* d o_heads [B, H, T, Dh] */
        if (r >= 0)
                r = o->gemm_batched(kb, false, true, t, t, dh, 1.0f, sa, dh, hs, vh, dh, hs, 0.0f, sp, t, tt, bh);
        if (r >= 0) /* dv = p^T do */
                r = o->gemm_batched(kb, true, false, t, dh, t, 1.0f, b->p, t, tt, sa, dh, hs, 0.0f, sh + 2 * rd, dh, hs,
                                    bh);
        if (r >= 0)
                r = o->softmax_backward(kb, b->p, sp, sp, bh * t, t);
        if (r >= 0) /* dq = scale ds k */
                r = o->gemm_batched(kb, false, false, t, dh, t, scale, sp, t, tt, kh, dh, hs, 0.0f, sh, dh, hs, bh);
        if (r >= 0) /* dk = scale ds^T q */
                r = o->gemm_batched(kb, true, false, t, dh, t, scale, sp, t, tt, qh, dh, hs, 0.0f, sh + rd, dh, hs, bh);
        for (int j = 0; j < 3 && r >= 0; j++)
                r = o->permute0213(kb, sh + j * rd, batch, nh, t, dh, sq + j * rd);
        if (r >= 0) /* [3, R, D] -> [R, 3D] */
                r = o->permute0213(kb, sq, 1, 3, rows, d, sh);
        if (r >= 0)
                r = o->gemm_ep(kb, true, false, 3 * d, d, rows, sh, 3 * d, b->h1, d, G(m, s, 0), d, KEPI_BGRAD,
                               G(m, s, 1));
        if (r >= 0)
                r = o->gemm(kb, false, false, rows, d, 3 * d, 1.0f, sh, 3 * d, P(m, s, 0), d, 0.0f, sb, d);
        if (r >= 0)
                r = o->layernorm_backward(kb, sb, x, P(m, s, 8), b->mean1, b->rstd1, rows, d, dx, G(m, s, 8),
                                          G(m, s, 9));
        if (r >= 0)
                r = o->axpy(kb, (size_t) rd, 1.0f, sc, dx);
        return r;
}

int step_backward(Model *m, Step *s, int batch, const float *x, const float *y, float *dy, float *dx, bool need_dx,
                  int *ret_moved) {
        const KernelsOps *o = m->ops;
        KBackend *kb = m->kb;
        const MdLayer *l = &s->l;
        size_t n_in = (size_t) batch * md_shape_numel(&l->in);
        KWindow w;
        int r;

        *ret_moved = !s->in_place && !s->view;
        switch (l->kind) {
        case LK_LINEAR: {
                int rows = rows_of(&l->in, batch), in = width_of(&l->in), out = (int) l->out;
                if (s->relu && (r = o->act_backward(kb, dy, y, (size_t) rows * out, KACT_RELU)) < 0)
                        return r;
                r = o->gemm_ep(kb, true, false, out, in, rows, dy, out, x, in, G(m, s, 0), in, KEPI_BGRAD, G(m, s, 1));
                if (r < 0 || !need_dx)
                        return r;
                return o->gemm(kb, false, false, rows, in, out, 1.0f, dy, out, P(m, s, 0), in, 0.0f, dx, in);
        }
        case LK_CONV2D: {
                w = window(s, batch);
                int rows = batch * w.ho * w.wo, ckk = w.c * w.k * w.k, out = (int) l->out;
                if (s->relu && (r = o->act_backward(kb, dy, y, (size_t) rows * out, KACT_RELU)) < 0)
                        return r;
                r = o->gemm_ep(kb, true, false, out, ckk, rows, dy, out, s->col, ckk, G(m, s, 0), ckk, KEPI_BGRAD,
                               G(m, s, 1));
                if (r < 0 || !need_dx)
                        return r;
                /* The window matrix is not needed any more: its gradient goes there. */
                r = o->gemm(kb, false, false, rows, ckk, out, 1.0f, dy, out, P(m, s, 0), ckk, 0.0f, s->col, ckk);
                return r < 0 ? r : o->col2im(kb, &w, s->col, dx);
        }
        case LK_MAXPOOL:
        case LK_AVGPOOL:
                if (!need_dx)
                        return 0;
                w = window(s, batch);
                return o->pool_backward(kb, &w, l->kind == LK_MAXPOOL, dy, s->idx, dx);
        case LK_FLATTEN:
                if (s->view || !need_dx)
                        return 0;
                return o->permute0213(kb, dy, batch, (int) l->in.d[0], (int) (l->in.d[1] * l->in.d[2]), 1, dx);
        case LK_TOKENS:
                return 0;
        case LK_RELU:
                return o->act_backward(kb, dy, y, n_in, KACT_RELU);
        case LK_GELU:
                return o->gelu_backward(kb, x, dy, dy, n_in);
        case LK_DROPOUT:
                return s->view ? 0 : o->mul(kb, dy, s->mask, dy, n_in);
        case LK_LAYERNORM:
                return o->layernorm_backward(kb, dy, x, P(m, s, 0), s->mean, s->rstd, rows_of(&l->in, batch),
                                             width_of(&l->in), dx, G(m, s, 0), G(m, s, 1));
        case LK_EMBEDDING:
                return o->embedding_backward(kb, x, dy, batch * (int) l->in.d[0], (int) l->out, (int) l->vocab,
                                             G(m, s, 0));
        case LK_POSEMBED:
                return o->colsum(kb, dy, batch, (int) md_shape_numel(&l->in), G(m, s, 0));
        case LK_TRANSFORMER:
                return block_backward(m, s, batch, x, dy, dx);
        case LK_MEAN: {
                if (!need_dx)
                        return 0;
                int t = (int) l->in.d[0], d = (int) l->in.d[1];
                return o->gemm_batched(kb, false, false, t, d, 1, 1.0f / (float) t, s->ones, 1, 0, dy, d, d, 0.0f, dx,
                                       d, (long long) t * d, batch);
        }
        case LK_COUNT:
                break;
        }
        return -EINVAL;
}
