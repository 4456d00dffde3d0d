/* SPDX-License-Identifier: Apache-2.0 */
/* Model descriptions (see modeldesc.h): the three spellings, shape inference,
 * the tensors of every layer, the canonical text. JSON is read by jansson. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "log.h"
#include "macro.h"
#include "modeldesc.h"

#define MLP_MIN_WIDTHS 2
#define MLP_MAX_WIDTHS 16

static const char *const kind_names[LK_COUNT] = {
        [LK_LINEAR] = "linear",       [LK_CONV2D] = "conv2d",       [LK_MAXPOOL] = "maxpool",
        [LK_AVGPOOL] = "avgpool",     [LK_FLATTEN] = "flatten",     [LK_TOKENS] = "tokens",
        [LK_RELU] = "relu",           [LK_GELU] = "gelu",           [LK_DROPOUT] = "dropout",
        [LK_LAYERNORM] = "layernorm", [LK_EMBEDDING] = "embedding", [LK_POSEMBED] = "posembed",
        [LK_TRANSFORMER] = "transformer", [LK_MEAN] = "mean",
};

/* The fields each kind takes besides "type"; R: required. */
typedef struct {
        const char *name;
        bool required;
} Field;

static const Field kind_fields[LK_COUNT][5] = {
        [LK_LINEAR] = { { "out", true }, { "init", false } },
        [LK_CONV2D] = { { "out", true }, { "kernel", true }, { "stride", false }, { "padding", false },
                        { "init", false } },
        [LK_MAXPOOL] = { { "kernel", true }, { "stride", false }, { "padding", false } },
        [LK_AVGPOOL] = { { "kernel", true }, { "stride", false }, { "padding", false } },
        [LK_DROPOUT] = { { "p", true } },
        [LK_LAYERNORM] = { { "eps", false } },
        [LK_EMBEDDING] = { { "vocab", true }, { "out", true } },
        [LK_TRANSFORMER] = { { "heads", true }, { "hidden", true }, { "causal", false } },
};

static const char *const init_names[] = {
        [INIT_ZEROS] = "zeros", [INIT_HE] = "he", [INIT_XAVIER] = "xavier", [INIT_ONES] = "ones",
        [INIT_NORMAL] = "normal",
};

const char *layer_kind_name(LayerKind k) {
        return (unsigned) k < LK_COUNT ? kind_names[k] : "?";
}

size_t md_shape_numel(const MdShape *s) {
        size_t n = 1;
        for (unsigned i = 0; i < s->rank; i++)
                n *= s->d[i];
        return n;
}

const char *md_dims_string(const uint64_t *d, unsigned ndim, char *buf, size_t n) {
        size_t o = (size_t) snprintf(buf, n, "[");
        for (unsigned k = 0; k < ndim && o < n; k++)
                o += (size_t) snprintf(buf + o, n - o, "%s%llu", k ? ", " : "", (unsigned long long) d[k]);
        if (o < n)
                snprintf(buf + o, n - o, "]");
        return buf;
}

const char *md_shape_string(const MdShape *s, char *buf, size_t n) {
        if (s->rank < 1 || s->rank > 3) {
                snprintf(buf, n, "[?]");
                return buf;
        }
        const uint64_t d[3] = { s->d[0], s->d[1], s->d[2] };
        return md_dims_string(d, s->rank, buf, n);
}

bool modeldesc_has_dropout(const ModelDesc *d) {
        for (size_t i = 0; i < d->nlayers; i++)
                if (d->layers[i].kind == LK_DROPOUT && d->layers[i].p > 0)
                        return true;
        return false;
}

/* "layer 3 (conv2d): " then the message. */
_printf_(5, 6) static int layer_err(char *err, size_t errlen, size_t i, const MdLayer *l, const char *fmt, ...) {
        char msg[256];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return reason_set(err, errlen, -EINVAL, "layer %zu (%s): %s", i, layer_kind_name(l->kind), msg);
}

static MdShape shape1(uint32_t a) { return (MdShape) { 1, { a, 0, 0 } }; }
static MdShape shape2(uint32_t a, uint32_t b) { return (MdShape) { 2, { a, b, 0 } }; }
static MdShape shape3(uint32_t a, uint32_t b, uint32_t c) { return (MdShape) { 3, { a, b, c } }; }

static int add_tensor(ModelDesc *d, size_t li, const char *suffix, unsigned ndim, const uint32_t *shape,
                      TensorInit init, uint32_t fan_in, uint32_t fan_out, char *err, size_t errlen) {
        MdTensor *t;
        MdLayer *l = &d->layers[li];
        uint64_t numel = 1;

        if (d->ntensors == MD_MAX_TENSORS)
                return layer_err(err, errlen, li, l, "more than %d parameter tensors in the model", MD_MAX_TENSORS);
        t = &d->tensors[d->ntensors];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%zu.%s", li, suffix);
        t->ndim = ndim;
        for (unsigned i = 0; i < ndim; i++) {
                t->shape[i] = shape[i];
                numel *= shape[i];
        }
        t->numel = numel;
        t->init = init;
        t->fan_in = fan_in;
        t->fan_out = fan_out;
        if (l->ntensors == 0)
                l->first_tensor = (uint32_t) d->ntensors;
        l->ntensors++;
        d->ntensors++;
        return 0;
}

#define T1(a) ((const uint32_t[]) { (a) })
#define T2(a, b) ((const uint32_t[]) { (a), (b) })

/* out = floor((in + 2 pad - k) / stride) + 1, or 0 when the window does not fit. */
static uint32_t window_out(uint32_t in, uint32_t k, uint32_t stride, uint32_t pad) {
        uint64_t span = (uint64_t) in + 2u * pad;
        return span < k ? 0 : (uint32_t) ((span - k) / stride + 1);
}

/* The layer's output shape from its input, and its tensors. */
static int infer_layer(ModelDesc *d, size_t li, char *err, size_t errlen) {
        MdLayer *l = &d->layers[li];
        const MdShape *in = &l->in;
        char sb[48];
        int r = 0;

        md_shape_string(in, sb, sizeof sb);
        l->ntensors = 0;
        switch (l->kind) {
        case LK_LINEAR: {
                if (in->rank == 3)
                        return layer_err(err, errlen, li, l, "takes features or tokens, its input is an image %s "
                                         "(add a flatten or tokens layer before it)", sb);
                uint32_t din = in->d[in->rank - 1];
                l->outs = in->rank == 1 ? shape1(l->out) : shape2(in->d[0], l->out);
                r = add_tensor(d, li, "weight", 2, T2(l->out, din), l->init, din, l->out, err, errlen);
                if (r == 0)
                        r = add_tensor(d, li, "bias", 1, T1(l->out), INIT_ZEROS, din, l->out, err, errlen);
                return r;
        }
        case LK_CONV2D:
        case LK_MAXPOOL:
        case LK_AVGPOOL: {
                if (in->rank != 3)
                        return layer_err(err, errlen, li, l, "takes an image [C, H, W], its input is %s", sb);
                if (l->kind != LK_CONV2D && l->padding > l->kernel / 2)
                        return layer_err(err, errlen, li, l, "field 'padding': %u is more than half the kernel %u",
                                         l->padding, l->kernel);
                uint32_t ho = window_out(in->d[1], l->kernel, l->stride, l->padding);
                uint32_t wo = window_out(in->d[2], l->kernel, l->stride, l->padding);
                if (ho == 0 || wo == 0)
                        return layer_err(err, errlen, li, l, "field 'kernel': %u (padding %u) does not fit the input %s",
                                         l->kernel, l->padding, sb);
                if (l->kind != LK_CONV2D) {
                        l->outs = shape3(in->d[0], ho, wo);
                        return 0;
                }
                l->outs = shape3(l->out, ho, wo);
                uint32_t c = in->d[0], kk = l->kernel * l->kernel;
                r = add_tensor(d, li, "weight", 4, ((const uint32_t[]) { l->out, c, l->kernel, l->kernel }), l->init,
                               c * kk, l->out * kk, err, errlen);
                if (r == 0)
                        r = add_tensor(d, li, "bias", 1, T1(l->out), INIT_ZEROS, c * kk, l->out * kk, err, errlen);
                return r;
        }
        case LK_FLATTEN:
                l->outs = shape1((uint32_t) md_shape_numel(in));
                return 0;
        case LK_TOKENS:
                if (in->rank != 3)
                        return layer_err(err, errlen, li, l, "takes an image [C, H, W], its input is %s", sb);
                l->outs = shape2(in->d[1] * in->d[2], in->d[0]);
                return 0;
        case LK_RELU:
        case LK_GELU:
        case LK_DROPOUT:
                l->outs = *in;
                return 0;
        case LK_LAYERNORM: {
                if (in->rank == 3)
                        return layer_err(err, errlen, li, l, "normalises features or tokens, its input is an image %s", sb);
                uint32_t dd = in->d[in->rank - 1];
                l->outs = *in;
                r = add_tensor(d, li, "weight", 1, T1(dd), INIT_ONES, dd, dd, err, errlen);
                if (r == 0)
                        r = add_tensor(d, li, "bias", 1, T1(dd), INIT_ZEROS, dd, dd, err, errlen);
                return r;
        }
        case LK_EMBEDDING:
                if (li != 0 || in->rank != 1)
                        return layer_err(err, errlen, li, l, "must be the first layer, on an input of token ids [T]");
                l->outs = shape2(in->d[0], l->out);
                return add_tensor(d, li, "weight", 2, T2(l->vocab, l->out), INIT_NORMAL, l->vocab, l->out, err, errlen);
        case LK_POSEMBED:
                if (in->rank != 2)
                        return layer_err(err, errlen, li, l, "takes tokens [T, D], its input is %s", sb);
                l->outs = *in;
                return add_tensor(d, li, "weight", 2, T2(in->d[0], in->d[1]), INIT_NORMAL, in->d[1], in->d[1], err,
                                  errlen);
        case LK_TRANSFORMER: {
                if (in->rank != 2)
                        return layer_err(err, errlen, li, l, "takes tokens [T, D], its input is %s", sb);
                uint32_t dm = in->d[1], h = l->hidden;
                if (dm % l->heads != 0)
                        return layer_err(err, errlen, li, l, "field 'heads': %u does not divide the width %u", l->heads, dm);
                if ((uint64_t) 3 * dm > MD_MAX_DIM)
                        return layer_err(err, errlen, li, l, "width %u: 3 x width is more than %u", dm, MD_MAX_DIM);
                l->outs = *in;
                /* torch.nn.TransformerEncoderLayer's state_dict, in its order. */
                const struct { const char *name; unsigned nd; uint32_t a, b; TensorInit init; uint32_t fi, fo; } ts[] = {
                        { "self_attn.in_proj_weight", 2, 3 * dm, dm, INIT_XAVIER, dm, 3 * dm },
                        { "self_attn.in_proj_bias", 1, 3 * dm, 0, INIT_ZEROS, dm, 3 * dm },
                        { "self_attn.out_proj.weight", 2, dm, dm, INIT_XAVIER, dm, dm },
                        { "self_attn.out_proj.bias", 1, dm, 0, INIT_ZEROS, dm, dm },
                        { "linear1.weight", 2, h, dm, INIT_XAVIER, dm, h },
                        { "linear1.bias", 1, h, 0, INIT_ZEROS, dm, h },
                        { "linear2.weight", 2, dm, h, INIT_XAVIER, h, dm },
                        { "linear2.bias", 1, dm, 0, INIT_ZEROS, h, dm },
                        { "norm1.weight", 1, dm, 0, INIT_ONES, dm, dm },
                        { "norm1.bias", 1, dm, 0, INIT_ZEROS, dm, dm },
                        { "norm2.weight", 1, dm, 0, INIT_ONES, dm, dm },
                        { "norm2.bias", 1, dm, 0, INIT_ZEROS, dm, dm },
                };
                for (size_t i = 0; i < ELEMENTSOF(ts) && r == 0; i++)
                        r = add_tensor(d, li, ts[i].name, ts[i].nd, T2(ts[i].a, ts[i].b), ts[i].init, ts[i].fi,
                                       ts[i].fo, err, errlen);
                return r;
        }
        case LK_MEAN:
                if (in->rank != 2)
                        return layer_err(err, errlen, li, l, "takes tokens [T, D], its input is %s", sb);
                l->outs = shape1(in->d[1]);
                return 0;
        case LK_COUNT:
                break;
        }
        return layer_err(err, errlen, li, l, "unknown layer kind");
}

/* Shapes and tensors of the whole model from d->input and d->layers[].kind and fields. */
static int infer(ModelDesc *d, char *err, size_t errlen) {
        MdShape cur = d->input;
        char sb[48];
        int r;

        d->ntensors = 0;
        if (d->input.rank < 1 || d->input.rank > 3)
                return reason_set(err, errlen, -EINVAL, "field 'input': expected 1 to 3 dimensions");
        for (unsigned i = 0; i < d->input.rank; i++)
                if (d->input.d[i] < 1 || d->input.d[i] > (d->input.rank == 1 ? MD_MAX_DIM : MD_MAX_SPATIAL))
                        return reason_set(err, errlen, -EINVAL, "field 'input': dimension %u is %u, expected 1..%u", i,
                                          d->input.d[i], d->input.rank == 1 ? MD_MAX_DIM : MD_MAX_SPATIAL);
        if (md_shape_numel(&d->input) > MD_MAX_SAMPLE_FLOATS)
                return reason_set(err, errlen, -EINVAL, "field 'input': more than %u values a sample",
                                  MD_MAX_SAMPLE_FLOATS);
        if (d->nlayers == 0)
                return reason_set(err, errlen, -EINVAL, "field 'layers': no layers");
        for (size_t i = 0; i < d->nlayers; i++) {
                MdLayer *l = &d->layers[i];
                l->in = cur;
                r = infer_layer(d, i, err, errlen);
                if (r < 0)
                        return r;
                for (unsigned k = 0; k < l->outs.rank; k++)
                        if (l->outs.d[k] < 1)
                                return layer_err(err, errlen, i, l, "output %s is empty",
                                                 md_shape_string(&l->outs, sb, sizeof sb));
                if (md_shape_numel(&l->outs) > MD_MAX_SAMPLE_FLOATS)
                        return layer_err(err, errlen, i, l, "output %s: more than %u values a sample",
                                         md_shape_string(&l->outs, sb, sizeof sb), MD_MAX_SAMPLE_FLOATS);
                cur = l->outs;
        }
        if (cur.rank != 1)
                return reason_set(err, errlen, -EINVAL,
                                  "the last layer's output %s is not a vector of class scores (add a flatten or mean)",
                                  md_shape_string(&cur, sb, sizeof sb));
        if (d->ntensors == 0)
                return reason_set(err, errlen, -EINVAL, "the model has no parameters to train");
        d->classes = cur.d[0];
        return 0;
}

static MdLayer layer_new(LayerKind kind) {
        return (MdLayer) { .kind = kind, .stride = 0, .init = INIT_HE, .eps = 1e-5f };
}

static void push(ModelDesc *d, MdLayer l) {
        if (d->nlayers < MD_MAX_LAYERS)
                d->layers[d->nlayers++] = l;
}

static MdLayer linear(uint32_t out) { MdLayer l = layer_new(LK_LINEAR); l.out = out; return l; }

static MdLayer conv(uint32_t out, uint32_t k, uint32_t stride, uint32_t pad) {
        MdLayer l = layer_new(LK_CONV2D);
        l.out = out;
        l.kernel = k;
        l.stride = stride;
        l.padding = pad;
        return l;
}

static MdLayer pool(LayerKind kind, uint32_t k) {
        MdLayer l = layer_new(kind);
        l.kernel = k;
        l.stride = k;
        return l;
}

static MdLayer block(uint32_t heads, uint32_t hidden) {
        MdLayer l = layer_new(LK_TRANSFORMER);
        l.heads = heads;
        l.hidden = hidden;
        return l;
}

/* Widths "D0-D1-...-Dn" from p, up to the first character that is not a
 * digit or '-' (*end): how many, or 0 when they are not min..16 widths of
 * 1..MD_MAX_DIM. */
static size_t parse_widths(const char *p, size_t min, uint32_t widths[MLP_MAX_WIDTHS], const char **end) {
        size_t n = 0;
        for (;;) {
                uint64_t v = 0;
                const char *start = p;
                while (*p >= '0' && *p <= '9') {
                        v = v * 10 + (uint64_t) (*p - '0');
                        if (v > MD_MAX_DIM)
                                return 0;
                        p++;
                }
                if (p == start || v < 1 || n == MLP_MAX_WIDTHS)
                        return 0;
                widths[n++] = (uint32_t) v;
                if (*p != '-')
                        break;
                p++;
        }
        *end = p;
        return n < min ? 0 : n;
}

static int append(char *buf, size_t n, size_t *off, const char *fmt, ...) _printf_(4, 5);

/* sep, then the widths' canonical spelling "W0-W1-...-Wn" (no leading
 * zeros), at *off of buf: 0, or -ENOSPC. */
static int widths_text(char *buf, size_t n, size_t *off, const char *sep, const uint32_t *widths, size_t count) {
        int r = 0;
        for (size_t i = 0; i < count && r == 0; i++)
                r = append(buf, n, off, "%s%u", i ? "-" : sep, widths[i]);
        return r;
}

/* Linear+ReLU layers of the widths, the last one's ReLU only with relu_last. */
static void push_mlp(ModelDesc *d, const uint32_t *widths, size_t n, bool relu_last) {
        d->input = shape1(widths[0]);
        for (size_t i = 1; i < n; i++) {
                push(d, linear(widths[i]));
                if (i + 1 < n || relu_last)
                        push(d, layer_new(LK_RELU));
        }
}

/* "mlp:D0-D1-...-Dn" */
static int parse_mlp(const char *text, ModelDesc *d, char *err, size_t errlen) {
        uint32_t widths[MLP_MAX_WIDTHS];
        const char *end = NULL;
        size_t n = parse_widths(text + 4, MLP_MIN_WIDTHS, widths, &end);
        if (n == 0 || *end)
                return reason_set(err, errlen, -EINVAL, "bad model '%.64s' (expected mlp:D0-D1-...-Dn, %d..%d widths "
                                  "of 1..%u)", text, MLP_MIN_WIDTHS, MLP_MAX_WIDTHS, MD_MAX_DIM);
        /* The name is the canonical text: 16 widths of 5 digits fit. */
        size_t off = 0;
        (void) widths_text(d->name, sizeof d->name, &off, "mlp:", widths, n);
        d->spelled = true;
        push_mlp(d, widths, n, false);
        return infer(d, err, errlen);
}

/* "lr:D": sparse logistic regression over a click log (docs/tables.md): a
 * weight per categorical id, in the job's first table (dim 1), and a
 * Linear(D, 1) over the D dense features; one logit, labels 0 and 1. */
static int parse_lr(const char *text, ModelDesc *d, char *err, size_t errlen) {
        char *end = NULL;
        errno = 0;
        unsigned long v = strtoul(text + 3, &end, 10);
        if (errno || end == text + 3 || *end || text[3] < '0' || text[3] > '9' || v < 1 || v > MD_MAX_DIM)
                return reason_set(err, errlen, -EINVAL, "bad model '%.64s' (expected lr:D, D the dense features of "
                                  "each sample, 1..%u)", text, MD_MAX_DIM);
        snprintf(d->name, sizeof d->name, "lr:%lu", v);
        d->spelled = true;
        d->input = shape1((uint32_t) v);
        MdLayer l = linear(1);
        l.init = INIT_ZEROS;
        push(d, l);
        d->click = true;
        d->click_dim = 1;
        return infer(d, err, errlen);
}

/* "dlrm:F:D-...-E:T1-...-1": DLRM (Naumov et al. 2019) over a click log
 * of F categorical fields and D dense features (docs/tables.md): a bottom
 * MLP (Linear+ReLU each) takes the dense features to E, each field's id is
 * looked up as a row of E floats in the job's table, the pairwise dot
 * products of those F + 1 vectors follow the bottom MLP's output into the
 * top MLP (ReLU between its layers), whose last width 1 is the logit. Its
 * tensors are those of two torch.nn.Sequential, "bot.0.weight", ...,
 * "top.0.weight", .... */
static int parse_dlrm(const char *text, ModelDesc *d, char *err, size_t errlen) {
        uint32_t bot[MLP_MAX_WIDTHS], top[MLP_MAX_WIDTHS + 1];
        const char *p = text + 5, *end = NULL;
        char *e = NULL;
        size_t nb = 0, nt = 0;
        errno = 0;
        unsigned long f = *p >= '0' && *p <= '9' ? strtoul(p, &e, 10) : 0;
        if (!errno && f >= 1 && f <= MD_MAX_FIELDS && *e == ':')
                nb = parse_widths(e + 1, 2, bot, &end);
        if (nb > 0 && *end == ':')
                nt = parse_widths(end + 1, 1, top + 1, &end);
        if (nt == 0 || *end || top[nt] != 1)
                return reason_set(err, errlen, -EINVAL, "bad model '%.64s' (expected dlrm:F:D-...-E:T1-...-1: F "
                                  "categorical fields 1..%u, the bottom MLP's widths from the D dense features to "
                                  "the embedding's E, the top MLP's widths ending in 1; 2..%d and 1..%d widths of "
                                  "1..%u)", text, MD_MAX_FIELDS, MLP_MAX_WIDTHS, MLP_MAX_WIDTHS, MD_MAX_DIM);
        /* The top MLP takes the bottom's output and one dot product for each
         * pair of the F + 1 vectors. */
        uint32_t emb = bot[nb - 1];
        top[0] = emb + (uint32_t) (f * (f + 1) / 2);
        ModelDesc *part = calloc(2, sizeof *part);
        if (!part)
                return -ENOMEM;
        push_mlp(&part[0], bot, nb, true);
        push_mlp(&part[1], top, nt + 1, false);
        int r = infer(&part[0], err, errlen);
        if (r == 0)
                r = infer(&part[1], err, errlen);
        for (int k = 0; k < 2 && r == 0; k++) {
                const ModelDesc *m = &part[k];
                if (d->nlayers + m->nlayers > MD_MAX_LAYERS) {
                        r = reason_set(err, errlen, -EINVAL, "bad model '%.64s': more than %d layers", text,
                                       MD_MAX_LAYERS);
                        break;
                }
                for (size_t i = 0; i < m->nlayers; i++) {
                        MdLayer l = m->layers[i];
                        l.first_tensor += (uint32_t) d->ntensors;
                        d->layers[d->nlayers++] = l;
                }
                for (size_t i = 0; i < m->ntensors; i++) {
                        MdTensor t = m->tensors[i];
                        snprintf(t.name, sizeof t.name, "%s.%.80s", k ? "top" : "bot", m->tensors[i].name);
                        d->tensors[d->ntensors++] = t;
                }
                if (k == 0)
                        d->dlrm_bottom = (uint32_t) d->ntensors;
        }
        free(part);
        if (r < 0)
                return r;
        /* The name is the canonical text, which the job carries. */
        size_t off = 0;
        r = append(d->name, sizeof d->name, &off, "dlrm:%lu", f);
        if (r == 0)
                r = widths_text(d->name, sizeof d->name, &off, ":", bot, nb);
        if (r == 0)
                r = widths_text(d->name, sizeof d->name, &off, ":", top + 1, nt);
        if (r < 0)
                return reason_set(err, errlen, -EINVAL, "bad model '%.64s...': longer than %zu characters written "
                                  "without leading zeros", text, sizeof d->name - 1);
        d->spelled = true;
        d->input = shape1(bot[0]);
        d->classes = 1;
        d->click = true;
        d->click_dim = emb;
        d->click_fields = (uint32_t) f;
        return 0;
}

/* The built-in models, for 28x28 single-channel images and 10 classes. */
static int builtin(const char *name, ModelDesc *d, char *err, size_t errlen) {
        if (strcmp(name, "cnn") == 0) {
                d->input = shape3(1, 28, 28);
                push(d, conv(32, 3, 1, 1));
                push(d, layer_new(LK_RELU));
                push(d, pool(LK_MAXPOOL, 2));
                push(d, conv(64, 3, 1, 1));
                push(d, layer_new(LK_RELU));
                push(d, pool(LK_MAXPOOL, 2));
                push(d, layer_new(LK_FLATTEN));
                push(d, linear(128));
                push(d, layer_new(LK_RELU));
                push(d, linear(10));
        } else if (strcmp(name, "vit") == 0) {
                d->input = shape3(1, 28, 28);
                push(d, conv(64, 7, 7, 0));
                push(d, layer_new(LK_TOKENS));
                push(d, layer_new(LK_POSEMBED));
                for (int i = 0; i < 3; i++)
                        push(d, block(4, 128));
                push(d, layer_new(LK_LAYERNORM));
                push(d, layer_new(LK_MEAN));
                push(d, linear(10));
        } else
                return 1;
        snprintf(d->name, sizeof d->name, "%s", name);
        d->spelled = true;
        return infer(d, err, errlen);
}

/* A JSON number that is a whole number in [lo, hi]. */
static int get_uint(json_t *v, uint32_t lo, uint32_t hi, uint32_t *ret) {
        double x;

        if (!json_is_number(v))
                return -EINVAL;
        x = json_number_value(v);
        if (!(x >= lo && x <= hi) || x != floor(x))
                return -EINVAL;
        *ret = (uint32_t) x;
        return 0;
}

static bool field_allowed(LayerKind k, const char *key, bool *ret_required) {
        for (size_t i = 0; i < ELEMENTSOF(kind_fields[k]) && kind_fields[k][i].name; i++)
                if (strcmp(kind_fields[k][i].name, key) == 0) {
                        if (ret_required)
                                *ret_required = kind_fields[k][i].required;
                        return true;
                }
        return false;
}

static int parse_json_layer(json_t *o, size_t li, MdLayer *l, char *err, size_t errlen) {
        const char *key, *type;
        json_t *v;
        LayerKind kind = LK_COUNT;

        if (!json_is_object(o))
                return reason_set(err, errlen, -EINVAL, "layer %zu: expected an object", li);
        v = json_object_get(o, "type");
        if (!json_is_string(v))
                return reason_set(err, errlen, -EINVAL, "layer %zu: field 'type' missing or not a string", li);
        type = json_string_value(v);
        for (int k = 0; k < LK_COUNT; k++)
                if (strcmp(kind_names[k], type) == 0)
                        kind = (LayerKind) k;
        if (kind == LK_COUNT)
                return reason_set(err, errlen, -EINVAL,
                                  "layer %zu: field 'type': unknown layer '%.32s' (linear, conv2d, maxpool, avgpool, "
                                  "flatten, tokens, relu, gelu, dropout, layernorm, embedding, posembed, transformer, "
                                  "mean)", li, type);
        *l = layer_new(kind);
        for (size_t i = 0; i < ELEMENTSOF(kind_fields[kind]) && kind_fields[kind][i].name; i++)
                if (kind_fields[kind][i].required && !json_object_get(o, kind_fields[kind][i].name))
                        return layer_err(err, errlen, li, l, "field '%s' missing", kind_fields[kind][i].name);

        json_object_foreach(o, key, v) {
                int r = 0;
                if (strcmp(key, "type") == 0)
                        continue;
                if (!field_allowed(kind, key, NULL))
                        return layer_err(err, errlen, li, l, "unknown field '%.32s'", key);
                if (strcmp(key, "out") == 0)
                        r = get_uint(v, 1, MD_MAX_DIM, &l->out);
                else if (strcmp(key, "kernel") == 0)
                        r = get_uint(v, 1, MD_MAX_KERNEL, &l->kernel);
                else if (strcmp(key, "stride") == 0)
                        r = get_uint(v, 1, MD_MAX_KERNEL, &l->stride);
                else if (strcmp(key, "padding") == 0)
                        r = get_uint(v, 0, MD_MAX_KERNEL, &l->padding);
                else if (strcmp(key, "heads") == 0)
                        r = get_uint(v, 1, 256, &l->heads);
                else if (strcmp(key, "hidden") == 0)
                        r = get_uint(v, 1, MD_MAX_DIM, &l->hidden);
                else if (strcmp(key, "vocab") == 0)
                        r = get_uint(v, 1, 1u << 24, &l->vocab);
                else if (strcmp(key, "causal") == 0) {
                        if (!json_is_boolean(v))
                                return layer_err(err, errlen, li, l, "field 'causal': expected true or false");
                        l->causal = json_is_true(v);
                } else if (strcmp(key, "p") == 0) {
                        /* Checked as the float it is kept as: 0.9999999995 is 1.0f. */
                        double p = json_is_number(v) ? json_number_value(v) : -1;
                        if (!(p >= 0 && (float) p < 1.0f))
                                return layer_err(err, errlen, li, l, "field 'p': expected a number in [0, 1)");
                        l->p = (float) p;
                } else if (strcmp(key, "eps") == 0) {
                        double e = json_is_number(v) ? json_number_value(v) : -1;
                        if (!((float) e > 0.0f && e <= 1))
                                return layer_err(err, errlen, li, l, "field 'eps': expected a number in (0, 1]");
                        l->eps = (float) e;
                } else if (strcmp(key, "init") == 0) {
                        const char *s = json_string_value(v);
                        size_t k;
                        for (k = 0; s && k < ELEMENTSOF(init_names); k++)
                                if (strcmp(s, init_names[k]) == 0 && k != INIT_ONES)
                                        break;
                        if (!s || k == ELEMENTSOF(init_names))
                                return layer_err(err, errlen, li, l,
                                                 "field 'init': expected \"he\", \"xavier\", \"normal\" or \"zeros\"");
                        l->init = (TensorInit) k;
                }
                if (r < 0) {
                        char *txt = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
                        r = layer_err(err, errlen, li, l, "field '%s': %.32s is not a whole number in range", key,
                                      txt ? txt : "?");
                        free(txt);
                        return r;
                }
        }
        if (kind == LK_MAXPOOL || kind == LK_AVGPOOL) {
                if (l->stride == 0)
                        l->stride = l->kernel;
        } else if (l->stride == 0)
                l->stride = 1;
        return 0;
}

/* A name of 1..MD_MAX_NAME-1 letters, digits, '-', '_' or '.'. */
static bool name_ok(const char *s, size_t max) {
        size_t n = s ? strlen(s) : 0;
        bool ok = n > 0 && n < max;
        for (size_t i = 0; ok && i < n; i++)
                ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                     s[i] == '-' || s[i] == '_' || s[i] == '.';
        return ok;
}

/* One entry of an external model's "tensors". */
static int parse_json_tensor(json_t *o, size_t i, ModelDesc *d, char *err, size_t errlen) {
        const char *key, *name = NULL;
        json_t *v;
        char why[160];

        if (!json_is_object(o))
                return reason_set(err, errlen, -EINVAL, "tensor %zu: expected an object with \"name\" and \"shape\"", i);
        v = json_object_get(o, "name");
        name = json_string_value(v);
        if (!name_ok(name, MD_MAX_NAME))
                return reason_set(err, errlen, -EINVAL,
                                  "tensor %zu: field 'name': 1..%d letters, digits, '-', '_' or '.'", i, MD_MAX_NAME - 1);
        for (size_t k = 0; k < i; k++)
                if (strcmp(d->tensors[k].name, name) == 0)
                        return reason_set(err, errlen, -EINVAL, "tensor %zu (%s): the name is used twice", i, name);
        MdTensor *t = &d->tensors[i];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        why[0] = '\0';
        json_object_foreach(o, key, v) {
                if (strcmp(key, "name") == 0)
                        continue;
                if (strcmp(key, "shape") == 0) {
                        if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > 4) {
                                snprintf(why, sizeof why, "field 'shape': expected 1 to 4 dimensions");
                                break;
                        }
                        t->ndim = (unsigned) json_array_size(v);
                        t->numel = 1;
                        for (unsigned k = 0; k < t->ndim; k++) {
                                if (get_uint(json_array_get(v, k), 1, INT32_MAX, &t->shape[k]) < 0) {
                                        snprintf(why, sizeof why, "field 'shape': dimension %u is not a whole number "
                                                 "1..%d", k, INT32_MAX);
                                        break;
                                }
                                if (t->numel > MD_MAX_TENSOR_FLOATS / t->shape[k]) {
                                        snprintf(why, sizeof why, "field 'shape': more than %llu values in a tensor",
                                                 (unsigned long long) MD_MAX_TENSOR_FLOATS);
                                        break;
                                }
                                t->numel *= t->shape[k];
                        }
                } else if (strcmp(key, "init") == 0) {
                        const char *s = json_string_value(v);
                        size_t k = 0;
                        while (s && k < ELEMENTSOF(init_names) && strcmp(init_names[k], s) != 0)
                                k++;
                        if (!s || k == ELEMENTSOF(init_names)) {
                                snprintf(why, sizeof why,
                                         "field 'init': expected \"zeros\", \"ones\", \"he\", \"xavier\" or \"normal\"");
                                break;
                        }
                        t->init = (TensorInit) k;
                } else if (strcmp(key, "buffer") == 0) {
                        if (!json_is_boolean(v)) {
                                snprintf(why, sizeof why, "field 'buffer': expected true or false");
                                break;
                        }
                        t->buffer = json_is_true(v);
                } else {
                        snprintf(why, sizeof why, "unknown field '%.32s' (name, shape, init, buffer)", key);
                        break;
                }
                if (why[0])
                        break;
        }
        if (!why[0] && t->ndim == 0)
                snprintf(why, sizeof why, "field 'shape' is required");
        if (!why[0] && (t->init == INIT_HE || t->init == INIT_XAVIER) && t->ndim < 2)
                snprintf(why, sizeof why, "init '%s' needs a weight of 2 dimensions or more (fan in and out)",
                         init_names[t->init]);
        if (why[0])
                return reason_set(err, errlen, -EINVAL, "tensor %zu (%s): %s", i, t->name, why);
        /* Fans as PyTorch's: in = dims 1.. , out = dim 0 x dims 2.. */
        uint64_t rest = 1;
        for (unsigned k = 2; k < t->ndim; k++)
                rest *= t->shape[k];
        uint64_t fan_in = t->ndim > 1 ? t->shape[1] * rest : t->shape[0];
        uint64_t fan_out = t->ndim > 1 ? t->shape[0] * rest : t->shape[0];
        t->fan_in = (uint32_t) MIN(fan_in, (uint64_t) UINT32_MAX);
        t->fan_out = (uint32_t) MIN(fan_out, (uint64_t) UINT32_MAX);
        return 0;
}

/* {"name": ..., "tensors": [...]}: an external model (ModelDesc.external). */
static int parse_json_tensors(json_t *list, ModelDesc *d, char *err, size_t errlen) {
        if (!json_is_array(list) || json_array_size(list) == 0 || json_array_size(list) > MD_MAX_TENSORS)
                return reason_set(err, errlen, -EINVAL, "field 'tensors': expected a list of 1..%d tensors",
                                  MD_MAX_TENSORS);
        d->external = true;
        d->ntensors = json_array_size(list);
        bool trained = false;
        for (size_t i = 0; i < d->ntensors; i++) {
                int r = parse_json_tensor(json_array_get(list, i), i, d, err, errlen);
                if (r < 0)
                        return r;
                trained |= !d->tensors[i].buffer;
        }
        if (!trained)
                return reason_set(err, errlen, -EINVAL, "the model has no parameters to train (every tensor is a buffer)");
        return 0;
}

static int parse_json(const char *text, ModelDesc *d, char *err, size_t errlen) {
        json_error_t jerr;
        json_t *root, *v, *layers;
        const char *key;
        int r = -EINVAL;

        root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        if (!root)
                return reason_set(err, errlen, -EINVAL, "not valid JSON: line %d column %d: %s", jerr.line, jerr.column,
                                  jerr.text);
        if (!json_is_object(root)) {
                reason_set(err, errlen, -EINVAL, "expected a JSON object with \"input\" and \"layers\"");
                goto out;
        }
        bool external = json_object_get(root, "tensors") != NULL;
        json_object_foreach(root, key, v)
                if (strcmp(key, "name") != 0 && strcmp(key, external ? "tensors" : "input") != 0 &&
                    (external || strcmp(key, "layers") != 0)) {
                        reason_set(err, errlen, -EINVAL, "unknown field '%.32s' (%s)", key,
                                   external ? "name, tensors; a model of layers has no 'tensors'" : "name, input, layers");
                        goto out;
                }
        v = json_object_get(root, "name");
        if (v) {
                const char *s = json_string_value(v);
                if (!name_ok(s, sizeof d->name)) {
                        reason_set(err, errlen, -EINVAL, "field 'name': 1..%zu letters, digits, '-', '_' or '.'",
                                   sizeof d->name - 1);
                        goto out;
                }
                snprintf(d->name, sizeof d->name, "%s", s);
        } else
                snprintf(d->name, sizeof d->name, "custom");
        if (external) {
                r = parse_json_tensors(json_object_get(root, "tensors"), d, err, errlen);
                goto out;
        }

        v = json_object_get(root, "input");
        if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > 3) {
                reason_set(err, errlen, -EINVAL, "field 'input': expected the shape of a sample, e.g. [784] or [1, 28, 28]");
                goto out;
        }
        d->input.rank = (unsigned) json_array_size(v);
        for (unsigned i = 0; i < d->input.rank; i++)
                if (get_uint(json_array_get(v, i), 1, MD_MAX_DIM, &d->input.d[i]) < 0) {
                        reason_set(err, errlen, -EINVAL, "field 'input': dimension %u is not a whole number 1..%u", i,
                                   MD_MAX_DIM);
                        goto out;
                }

        layers = json_object_get(root, "layers");
        if (!json_is_array(layers) || json_array_size(layers) == 0 || json_array_size(layers) > MD_MAX_LAYERS) {
                reason_set(err, errlen, -EINVAL, "field 'layers': expected a list of 1..%d layers", MD_MAX_LAYERS);
                goto out;
        }
        d->nlayers = json_array_size(layers);
        for (size_t i = 0; i < d->nlayers; i++) {
                r = parse_json_layer(json_array_get(layers, i), i, &d->layers[i], err, errlen);
                if (r < 0)
                        goto out;
        }
        r = infer(d, err, errlen);
out:
        json_decref(root);
        return r;
}

int modeldesc_parse(const char *text, ModelDesc *ret, char *err, size_t errlen) {
        ModelDesc d;
        const char *p;
        int r;

        if (err && errlen)
                err[0] = '\0';
        if (!text || !ret)
                return reason_set(err, errlen, -EINVAL, "no model");
        if (strlen(text) >= MD_MAX_TEXT)
                return reason_set(err, errlen, -EINVAL, "model text longer than %d bytes", MD_MAX_TEXT - 1);
        memset(&d, 0, sizeof d);
        for (p = text; *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'; p++)
                ;
        if (strncmp(text, "mlp:", 4) == 0)
                r = parse_mlp(text, &d, err, errlen);
        else if (strncmp(text, "lr:", 3) == 0)
                r = parse_lr(text, &d, err, errlen);
        else if (strncmp(text, "dlrm:", 5) == 0)
                r = parse_dlrm(text, &d, err, errlen);
        else if (*p == '{')
                r = parse_json(text, &d, err, errlen);
        else {
                r = builtin(text, &d, err, errlen);
                if (r > 0)
                        return reason_set(err, errlen, -EINVAL,
                                          "unknown model '%.64s' (mlp:D0-D1-...-Dn, cnn, vit, lr:D, dlrm:F:BOT:TOP, or a JSON "
                                          "description)",
                                          text);
        }
        if (r < 0)
                return r;
        *ret = d;
        return 0;
}

static int append(char *buf, size_t n, size_t *off, const char *fmt, ...) {
        va_list ap;
        int w;

        if (*off >= n)
                return -ENOSPC;
        va_start(ap, fmt);
        w = vsnprintf(buf + *off, n - *off, fmt, ap);
        va_end(ap);
        if (w < 0 || (size_t) w >= n - *off)
                return -ENOSPC;
        *off += (size_t) w;
        return 0;
}

int modeldesc_format(const ModelDesc *d, char *buf, size_t n) {
        size_t off = 0;
        if (d->spelled)
                return append(buf, n, &off, "%s", d->name);
        return modeldesc_json(d, buf, n);
}

static int tensors_json(const ModelDesc *d, char *buf, size_t n) {
        size_t off = 0;
        int r = append(buf, n, &off, "{\"name\":\"%s\",\"tensors\":[", d->name);
        for (size_t i = 0; i < d->ntensors && r == 0; i++) {
                const MdTensor *t = &d->tensors[i];
                r = append(buf, n, &off, "%s{\"name\":\"%s\",\"shape\":[", i ? "," : "", t->name);
                for (unsigned k = 0; k < t->ndim && r == 0; k++)
                        r = append(buf, n, &off, "%s%u", k ? "," : "", t->shape[k]);
                if (r == 0)
                        r = append(buf, n, &off, "],\"init\":\"%s\"%s}", init_names[t->init],
                                   t->buffer ? ",\"buffer\":true" : "");
        }
        return r == 0 ? append(buf, n, &off, "]}") : r;
}

int modeldesc_json(const ModelDesc *d, char *buf, size_t n) {
        size_t off = 0;
        int r;

        /* DLRM's two MLPs are no one sequence of layers: its tensors. */
        if (d->external || d->dlrm_bottom)
                return tensors_json(d, buf, n);

        r = append(buf, n, &off, "{\"name\":\"%s\",\"input\":[", d->name);
        for (unsigned i = 0; i < d->input.rank && r == 0; i++)
                r = append(buf, n, &off, "%s%u", i ? "," : "", d->input.d[i]);
        if (r == 0)
                r = append(buf, n, &off, "],\"layers\":[");
        for (size_t i = 0; i < d->nlayers && r == 0; i++) {
                const MdLayer *l = &d->layers[i];
                r = append(buf, n, &off, "%s{\"type\":\"%s\"", i ? "," : "", layer_kind_name(l->kind));
                switch (l->kind) {
                case LK_LINEAR:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"out\":%u,\"init\":\"%s\"", l->out, init_names[l->init]);
                        break;
                case LK_CONV2D:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"out\":%u,\"kernel\":%u,\"stride\":%u,\"padding\":%u,\"init\":\"%s\"",
                                           l->out, l->kernel, l->stride, l->padding, init_names[l->init]);
                        break;
                case LK_MAXPOOL:
                case LK_AVGPOOL:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"kernel\":%u,\"stride\":%u,\"padding\":%u", l->kernel,
                                           l->stride, l->padding);
                        break;
                case LK_DROPOUT:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"p\":%.9g", (double) l->p);
                        break;
                case LK_LAYERNORM:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"eps\":%.9g", (double) l->eps);
                        break;
                case LK_EMBEDDING:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"vocab\":%u,\"out\":%u", l->vocab, l->out);
                        break;
                case LK_TRANSFORMER:
                        if (r == 0)
                                r = append(buf, n, &off, ",\"heads\":%u,\"hidden\":%u,\"causal\":%s", l->heads,
                                           l->hidden, l->causal ? "true" : "false");
                        break;
                default:
                        break;
                }
                if (r == 0)
                        r = append(buf, n, &off, "}");
        }
        if (r == 0)
                r = append(buf, n, &off, "]}");
        return r;
}

int modeldesc_resolve(const char *spec, char *buf, size_t n, char *err, size_t errlen) {
        ModelDesc d;
        FILE *f;
        char *text;
        size_t len;
        int r;

        if (!spec || !buf)
                return reason_set(err, errlen, -EINVAL, "no model");
        if (strncmp(spec, "mlp:", 4) == 0 || strncmp(spec, "lr:", 3) == 0 || strncmp(spec, "dlrm:", 5) == 0 ||
            strcmp(spec, "cnn") == 0 ||
            strcmp(spec, "vit") == 0 || spec[0] == '{') {
                r = modeldesc_parse(spec, &d, err, errlen);
        } else {
                f = fopen(spec, "re");
                if (!f)
                        return reason_set(err, errlen, -EINVAL,
                                          "model '%.200s': not mlp:D0-...-Dn, cnn, vit, lr:D or dlrm:F:BOT:TOP, and not a "
                                          "readable file: %s",
                                          spec, strerror(errno));
                text = malloc(MD_MAX_FILE + 2);
                if (!text) {
                        fclose(f);
                        return -ENOMEM;
                }
                len = fread(text, 1, MD_MAX_FILE + 1, f);
                r = ferror(f) ? -EIO : 0;
                fclose(f);
                if (r == 0 && len > MD_MAX_FILE)
                        r = reason_set(err, errlen, -EINVAL, "%.200s: larger than %d bytes", spec, MD_MAX_FILE);
                else if (r < 0)
                        reason_set(err, errlen, r, "%.200s: read error", spec);
                if (r == 0) {
                        char why[300];
                        text[len] = '\0';
                        if (strlen(text) != len)
                                r = reason_set(err, errlen, -EINVAL, "%.200s: contains a NUL byte", spec);
                        else {
                                /* A file may be longer than a job's text (indentation): it is
                                 * parsed here, and its canonical form must fit. */
                                memset(&d, 0, sizeof d);
                                r = parse_json(text, &d, why, sizeof why);
                                if (r < 0)
                                        reason_set(err, errlen, r, "%.200s: %s", spec, why);
                        }
                }
                free(text);
        }
        if (r < 0)
                return r;
        r = modeldesc_format(&d, buf, n);
        if (r < 0)
                return reason_set(err, errlen, r, "model %s: its description is longer than %zu bytes", d.name, n - 1);
        return 0;
}
