/* SPDX-License-Identifier: Apache-2.0 */
/* Models of layers (see model.h), written once against kernels.h so that the
 * CPU and CUDA backends run the same code. Every buffer a step needs is
 * allocated in model_new for max_batch samples; a training step only uploads
 * the batch, runs kernels and downloads the gradients into the host buffers
 * the client pushes.
 *
 * The description's layers become steps (Step): a ReLU after a linear layer
 * or a convolution joins it (one product with a bias+ReLU epilogue, its
 * backward masking by the fused output); tokens, a flatten that moves nothing
 * and dropout 0 are views of their input. act[0] is the batch (NHWC), act[j+1]
 * step j's output; the backward runs from dlogits through two ping-pong delta
 * buffers, each step writing its input's gradient into the other one (or, for
 * elementwise steps, in place). Layers and their buffers are in layers.c. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "log.h"
#include "macro.h"
#include "model-internal.h"

static int dev_alloc(Model *m, size_t bytes, void *ret) {
        return m->ops->alloc(m->kb, bytes ? bytes : sizeof(float), (void **) ret);
}

static void dev_free(Model *m, void *p) {
        if (p)
                m->ops->free(m->kb, p);
}

static int host_alloc(Model *m, size_t bytes, void *ret) {
        return m->ops->host_alloc(m->kb, bytes ? bytes : sizeof(float), (void **) ret);
}

static void host_free(Model *m, void *p) {
        if (p)
                m->ops->host_free(m->kb, p);
}

/* download_async slots: one per tensor, then the losses and the predictions.
 * Slots are reused modulo KB_SLOTS, which only makes a wait longer. */
static unsigned grad_slot(size_t t) { return (unsigned) (t % KB_SLOTS); }
static unsigned loss_slot(const Model *m) { return grad_slot(m->ntensors); }
static unsigned pred_slot(const Model *m) { return grad_slot(m->ntensors + 1); }

static void drop_graph(Model *m) {
        if (m->graph)
                m->ops->graph_free(m->kb, m->graph);
        m->graph = NULL;
}

Model *model_free(Model *m) {
        if (!m)
                return NULL;
        /* Nothing may still be copying into the host buffers freed below. */
        if (m->pending)
                (void) m->ops->sync(m->kb);
        drop_graph(m);
        for (size_t t = 0; t < m->ntensors; t++) {
                if (m->param_host && !m->host_lent)
                        host_free(m, m->param_host[t]);
                if (m->grad_host && !m->host_lent)
                        host_free(m, m->grad_host[t]);
                if (m->param_dev && !m->ops->host_memory)
                        dev_free(m, m->param_dev[t]);
                if (m->grad_dev && !m->ops->host_memory)
                        dev_free(m, m->grad_dev[t]);
        }
        for (size_t i = 0; i < m->nbufs; i++)
                dev_free(m, m->bufs[i]);
        host_free(m, m->pred_host);
        host_free(m, m->loss_host);
        host_free(m, m->x_stage);
        host_free(m, m->y_stage);
        ps_free(m->param_host);
        ps_free(m->grad_host);
        ps_free(m->param_dev);
        ps_free(m->grad_dev);
        ps_free(m->numel);
        ps_free(m->steps);
        ps_free(m->act);
        ps_free(m->desc);
        ps_free(m);
        return NULL;
}

/* The steps of the description (see the top of this file). */
static int plan_steps(Model *m) {
        const ModelDesc *d = m->desc;

        m->steps = ps_calloc(d->nlayers, sizeof *m->steps);
        if (!m->steps)
                return -ENOMEM;
        for (size_t i = 0; i < d->nlayers; i++) {
                const MdLayer *l = &d->layers[i];
                Step *s = &m->steps[m->nsteps];

                if (l->kind == LK_RELU && m->nsteps > 0) {
                        Step *prev = &m->steps[m->nsteps - 1];
                        if ((prev->l.kind == LK_LINEAR || prev->l.kind == LK_CONV2D) && !prev->relu) {
                                prev->relu = true;
                                continue;
                        }
                }
                memset(s, 0, sizeof *s);
                s->l = *l;
                s->index = i;
                m->nsteps++;
        }
        return 0;
}

/* Buffers of the batch and the activations, each step's own, the deltas. */
static int alloc_buffers(Model *m, char *err, size_t errlen) {
        size_t mb = (size_t) m->max_batch, in_n = md_shape_numel(&m->desc->input), maxn = in_n;
        int r;

        m->act = ps_calloc(m->nsteps + 1, sizeof *m->act);
        if (!m->act)
                return -ENOMEM;
        /* The batch as it comes (NCHW), and act[0] in NHWC when that differs. */
        r = model_buf(m, mb * in_n, &m->x_dev);
        if (r < 0)
                return r;
        m->permute_input = m->desc->input.rank == 3 && m->desc->input.d[0] > 1 &&
                           m->desc->input.d[1] * m->desc->input.d[2] > 1;
        if (m->permute_input) {
                if (!m->ops->permute0213)
                        return reason_set(err, errlen, -ENOTSUP, "a %u-channel image input needs the op permute0213, "
                                          "which backend %s lacks", m->desc->input.d[0], m->ops->name);
                r = model_buf(m, mb * in_n, &m->act[0]);
                if (r < 0)
                        return r;
        } else
                m->act[0] = m->x_dev;

        for (size_t j = 0; j < m->nsteps; j++) {
                Step *s = &m->steps[j];
                size_t out_n = md_shape_numel(&s->l.outs);

                /* A step's input is the model's (checked in model_new) or the step before's output. */
                if ((uint64_t) mb * out_n > INT_MAX)
                        return reason_set(err, errlen, -EINVAL, "layer %zu (%s): a batch of %d does not fit the "
                                          "kernels' sizes", s->index, layer_kind_name(s->l.kind), m->max_batch);
                r = step_setup(m, s, err, errlen);
                if (r < 0)
                        return r;
                if (s->view)
                        m->act[j + 1] = m->act[j];
                else {
                        r = model_buf(m, mb * out_n, &m->act[j + 1]);
                        if (r < 0)
                                return r;
                }
                maxn = MAX(maxn, out_n);
        }
        for (int i = 0; i < 2; i++) {
                r = model_buf(m, mb * maxn, &m->delta[i]);
                if (r < 0)
                        return r;
        }
        r = model_buf(m, mb, (float **) &m->y_dev);
        if (r >= 0)
                r = model_buf(m, mb, (float **) &m->pred_dev);
        if (r >= 0)
                r = model_buf(m, mb, &m->loss_dev);
        return r;
}

int model_new(KBackend *kb, const ModelDesc *d, int max_batch, Model **ret, char *err, size_t errlen) {
        Model *m;
        size_t mb, in_n;
        int r;

        if (err && errlen)
                err[0] = '\0';
        if (!kb || !kb->ops || !d || d->nlayers == 0 || d->ntensors == 0 || max_batch < 1 || !ret)
                return reason_set(err, errlen, -EINVAL, "bad model arguments");
        in_n = md_shape_numel(&d->input);
        if ((uint64_t) max_batch * in_n > INT_MAX)
                return reason_set(err, errlen, -EINVAL, "a batch of %d samples of %zu values is too large", max_batch,
                                  in_n);

        m = ps_calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->kb = kb;
        m->ops = kb->ops;
        m->max_batch = max_batch;
        m->graphs = true;
        m->transfers = true;
        m->seed = 0x5eed;
        mb = (size_t) max_batch;
        m->desc = ps_malloc(sizeof *m->desc);
        if (!m->desc) {
                r = -ENOMEM;
                goto fail;
        }
        *m->desc = *d;
        m->ntensors = d->ntensors;
        m->classes = d->classes;
        m->in_n = in_n;

        m->numel = ps_calloc(m->ntensors, sizeof *m->numel);
        m->param_host = ps_calloc(m->ntensors, sizeof *m->param_host);
        m->grad_host = ps_calloc(m->ntensors, sizeof *m->grad_host);
        m->param_dev = ps_calloc(m->ntensors, sizeof *m->param_dev);
        m->grad_dev = ps_calloc(m->ntensors, sizeof *m->grad_dev);
        if (!m->numel || !m->param_host || !m->grad_host || !m->param_dev || !m->grad_dev) {
                r = -ENOMEM;
                goto fail;
        }
        for (size_t t = 0; t < m->ntensors; t++) {
                size_t bytes;
                m->numel[t] = d->tensors[t].numel;
                bytes = m->numel[t] * sizeof(float);
                r = host_alloc(m, bytes, &m->param_host[t]);
                if (r >= 0)
                        r = host_alloc(m, bytes, &m->grad_host[t]);
                if (r >= 0 && !m->ops->host_memory)
                        r = dev_alloc(m, bytes, &m->param_dev[t]);
                if (r >= 0 && !m->ops->host_memory)
                        r = dev_alloc(m, bytes, &m->grad_dev[t]);
                if (r < 0)
                        goto fail;
                if (m->ops->host_memory) {
                        m->param_dev[t] = m->param_host[t];
                        m->grad_dev[t] = m->grad_host[t];
                }
                memset(m->param_host[t], 0, bytes);
                memset(m->grad_host[t], 0, bytes);
        }

        r = plan_steps(m);
        if (r >= 0)
                r = alloc_buffers(m, err, errlen);
        if (r >= 0)
                r = host_alloc(m, mb * sizeof(int32_t), &m->pred_host);
        if (r >= 0)
                r = host_alloc(m, mb * sizeof(float), &m->loss_host);
        if (r >= 0)
                r = host_alloc(m, mb * in_n * sizeof(float), &m->x_stage);
        if (r >= 0)
                r = host_alloc(m, mb * sizeof(int32_t), &m->y_stage);
        if (r < 0)
                goto fail;
        memset(m->x_stage, 0, mb * in_n * sizeof(float));
        memset(m->y_stage, 0, mb * sizeof(int32_t));
        /* A captured step would replay its dropout masks. */
        if (modeldesc_has_dropout(d))
                m->graphs = false;

        /* The backend starts from the same (zero) parameters as the host. */
        r = model_upload_params(m);
        if (r < 0)
                goto fail;
        *ret = m;
        return 0;

fail:
        if (r < 0 && err && errlen && !err[0])
                snprintf(err, errlen, "%s", strerror(-r));
        model_free(m);
        return r;
}

int model_new_text(KBackend *kb, const char *text, int max_batch, Model **ret, char *err, size_t errlen) {
        ModelDesc *d = ps_malloc(sizeof *d);
        int r;

        if (!d)
                return reason_set(err, errlen, -ENOMEM, "out of memory");
        r = modeldesc_parse(text, d, err, errlen);
        if (r >= 0 && d->external)
                r = reason_set(err, errlen, -EOPNOTSUPP,
                               "model %s lists tensors only: its client computes it (psnet.torch, "
                               "docs/python.md); workerd builds models of layers", d->name);
        if (r >= 0)
                r = model_new(kb, d, max_batch, ret, err, errlen);
        ps_free(d);
        return r;
}

int model_new_mlp(KBackend *kb, const uint32_t *dims, size_t nd, int max_batch, Model **ret) {
        char text[256], why[256];
        size_t off;

        if (!dims || nd < 2 || nd > 16)
                return -EINVAL;
        off = (size_t) snprintf(text, sizeof text, "mlp:");
        for (size_t i = 0; i < nd; i++)
                off += (size_t) snprintf(text + off, sizeof text - off, "%s%u", i ? "-" : "", dims[i]);
        return model_new_text(kb, text, max_batch, ret, why, sizeof why);
}

size_t model_ntensors(const Model *m) {
        return m ? m->ntensors : 0;
}

size_t model_tensor_numel(const Model *m, size_t t) {
        return m && t < m->ntensors ? m->numel[t] : 0;
}

size_t model_input_numel(const Model *m) {
        return m ? m->in_n : 0;
}

uint32_t model_classes(const Model *m) {
        return m ? m->classes : 0;
}

void model_set_seed(Model *m, uint64_t seed) {
        if (m) {
                m->seed = seed;
                m->trained = 0;
        }
}

int model_lend_host(Model *m, float *const *params, float *const *grads) {
        if (!m || !params || !grads || m->pending || m->graph || m->host_lent)
                return -EINVAL;
        for (size_t t = 0; t < m->ntensors; t++)
                if (!params[t] || !grads[t])
                        return -EINVAL;
        for (size_t t = 0; t < m->ntensors; t++) {
                memcpy(params[t], m->param_host[t], m->numel[t] * sizeof(float));
                host_free(m, m->param_host[t]);
                host_free(m, m->grad_host[t]);
                m->param_host[t] = params[t];
                m->grad_host[t] = grads[t];
                if (m->ops->host_memory) {
                        m->param_dev[t] = params[t];
                        m->grad_dev[t] = grads[t];
                }
        }
        m->host_lent = true;
        return 0;
}

float *model_param_host(Model *m, size_t t) {
        return m && t < m->ntensors ? m->param_host[t] : NULL;
}

float *model_grad_host(Model *m, size_t t) {
        return m && t < m->ntensors ? m->grad_host[t] : NULL;
}

float *model_batch_x(Model *m) {
        return m ? m->x_stage : NULL;
}

int32_t *model_batch_y(Model *m) {
        return m ? m->y_stage : NULL;
}

void model_set_options(Model *m, bool graphs, bool transfers) {
        if (!m)
                return;
        if (modeldesc_has_dropout(m->desc))
                graphs = false;
        if (m->graphs == graphs && m->transfers == transfers)
                return;
        if (m->pending) /* the graph may be running: let it finish first */
                (void) m->ops->sync(m->kb);
        drop_graph(m);
        m->graphs = graphs;
        m->transfers = transfers;
}

bool model_graph_active(const Model *m) {
        return m && m->graph;
}

int model_upload_params_from(Model *m, float *const *host) {
        int r;

        if (!m || !host)
                return -EINVAL;
        for (size_t t = 0; t < m->ntensors; t++) {
                if (m->ops->host_memory) {
                        /* The step computes on them where they lie (they stay
                         * unchanged until model_step_end all the same). */
                        m->param_dev[t] = host[t];
                        continue;
                }
                r = m->ops->upload(m->kb, m->param_dev[t], host[t], m->numel[t] * sizeof(float));
                if (r < 0)
                        return r;
        }
        return 0;
}

int model_upload_params(Model *m) {
        return m ? model_upload_params_from(m, m->param_host) : -EINVAL;
}

/* Labels (and the token ids of an embedding) are checked on the host, before
 * anything is queued, so that every backend rejects a bad batch the same way
 * and at once. */
static bool batch_ok(const Model *m, const float *x_host, const int32_t *y_host, int batch) {
        for (int i = 0; i < batch; i++)
                if (y_host[i] < 0 || (uint32_t) y_host[i] >= m->classes)
                        return false;
        if (m->steps[0].l.kind == LK_EMBEDDING) {
                float vocab = (float) m->steps[0].l.vocab;
                for (size_t i = 0; i < (size_t) batch * m->in_n; i++)
                        if (!(x_host[i] >= 0.0f && x_host[i] < vocab) || x_host[i] != floorf(x_host[i]))
                                return false;
        }
        return true;
}

static int upload_batch(Model *m, const float *x_host, const int32_t *y_host, int batch) {
        int r = m->ops->upload(m->kb, m->x_dev, x_host, (size_t) batch * m->in_n * sizeof(float));
        if (r < 0)
                return r;
        return m->ops->upload(m->kb, m->y_dev, y_host, (size_t) batch * sizeof(int32_t));
}

/* Every step's output from act[0] on; the last act[] holds the logits. */
static int model_forward(Model *m, int batch, bool train) {
        int r;

        if (m->permute_input) {
                const MdShape *in = &m->desc->input;
                r = m->ops->permute0213(m->kb, m->x_dev, batch, (int) in->d[0], (int) (in->d[1] * in->d[2]), 1,
                                        m->act[0]);
                if (r < 0)
                        return r;
        }
        for (size_t j = 0; j < m->nsteps; j++) {
                r = step_forward(m, &m->steps[j], batch, train, m->act[j], m->act[j + 1]);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Argmax and per-sample losses of the logits; leaves the loss gradient scaled by
 * scale in delta[0]. With download, the losses and predictions are copied to
 * the host buffers as well (read after a sync, by model_tally). */
static int model_queue_head(Model *m, int batch, float scale, bool download) {
        int classes = (int) m->classes, r;
        const float *logits = m->act[m->nsteps];

        r = m->ops->argmax(m->kb, logits, batch, classes, m->pred_dev);
        if (r < 0)
                return r;
        r = m->ops->softmax_xent(m->kb, logits, m->y_dev, batch, classes, scale, m->delta[0], m->loss_dev);
        if (r < 0 || !download)
                return r;
        r = m->ops->download_async(m->kb, m->loss_host, m->loss_dev, (size_t) batch * sizeof(float), loss_slot(m));
        if (r < 0)
                return r;
        return m->ops->download_async(m->kb, m->pred_host, m->pred_dev, (size_t) batch * sizeof(int32_t),
                                      pred_slot(m));
}

/* The summed loss and the correct predictions of the head's last download. */
static void model_tally(const Model *m, const int32_t *y_host, int batch, double *ret_loss_sum, int *ret_correct) {
        double sum = 0.0;
        int correct = 0;

        for (int i = 0; i < batch; i++) {
                sum += m->loss_host[i];
                correct += m->pred_host[i] == y_host[i];
        }
        *ret_loss_sum = sum;
        *ret_correct = correct;
}

/* From delta[0] = dloss/dlogits, every step's parameter gradients into
 * grad_dev, each tensor downloaded (when transfers are on) as soon as its
 * step is done. */
static int model_backward(Model *m, int batch) {
        int cur = 0, r;

        for (size_t j = m->nsteps; j-- > 0;) {
                Step *s = &m->steps[j];
                float *dy = m->delta[cur], *dx = m->delta[1 - cur];
                bool need_dx = j > 0;
                int moved;

                r = step_backward(m, s, batch, m->act[j], m->act[j + 1], dy, dx, need_dx, &moved);
                if (r < 0)
                        return r;
                for (uint32_t t = s->l.first_tensor;
                     m->transfers && !m->ops->host_memory && t < s->l.first_tensor + s->l.ntensors; t++) {
                        r = m->ops->download_async(m->kb, m->grad_host[t], m->grad_dev[t], m->numel[t] * sizeof(float),
                                                   grad_slot(t));
                        if (r < 0)
                                return r;
                }
                if (moved)
                        cur = 1 - cur;
        }
        return 0;
}

/* Every op of a training step on the staged batch, queued without waiting. */
static int model_queue_step(Model *m, int batch) {
        int r;

        if (m->transfers) {
                r = upload_batch(m, m->x_stage, m->y_stage, batch);
                if (r < 0)
                        return r;
        }
        r = model_forward(m, batch, true);
        if (r < 0)
                return r;
        /* The 1/B of the mean enters once, in the loss gradient. */
        r = model_queue_head(m, batch, 1.0f / (float) batch, m->transfers);
        if (r < 0)
                return r;
        return model_backward(m, batch);
}

/* Captures the full-batch step into m->graph. 1: the backend cannot capture. */
static int model_capture(Model *m) {
        KGraph *g = NULL;
        int r = m->ops->capture_begin(m->kb), r2;

        if (r == -ENOTSUP)
                return 1;
        if (r < 0)
                return r;
        r = model_queue_step(m, m->max_batch);
        r2 = m->ops->capture_end(m->kb, &g);
        if (r < 0) {
                if (r2 == 0)
                        m->ops->graph_free(m->kb, g);
                return r;
        }
        if (r2 < 0)
                return 1; /* the ops are fine but do not capture: run them directly */
        m->graph = g;
        return 0;
}

int model_step_begin(Model *m, const float *x_host, const int32_t *y_host, int batch) {
        int r;

        if (!m || !x_host || !y_host || batch < 1 || batch > m->max_batch || m->pending ||
            !batch_ok(m, x_host, y_host, batch))
                return -EINVAL;
        if (x_host != m->x_stage)
                memcpy(m->x_stage, x_host, (size_t) batch * m->in_n * sizeof(float));
        if (y_host != m->y_stage)
                memcpy(m->y_stage, y_host, (size_t) batch * sizeof(int32_t));

        if (m->graphs && !m->graph_failed && batch == m->max_batch && !m->graph) {
                r = model_capture(m);
                if (r < 0)
                        return r;
                m->graph_failed = r > 0;
        }
        if (m->graph && batch == m->max_batch)
                r = m->ops->graph_run(m->kb, m->graph);
        else
                r = model_queue_step(m, batch);
        m->trained++;
        if (r < 0) {
                (void) m->ops->sync(m->kb);
                return r;
        }
        m->pending = batch;
        return 0;
}

int model_grad_wait(Model *m, size_t t) {
        if (!m || t >= m->ntensors || !m->pending)
                return -EINVAL;
        return m->transfers ? m->ops->wait_slot(m->kb, grad_slot(t)) : 0;
}

int model_step_end(Model *m, float *ret_loss, int *ret_correct) {
        double sum = 0;
        int batch, correct = 0, r;

        if (!m || !m->pending)
                return -EINVAL;
        batch = m->pending;
        m->pending = 0;
        r = m->ops->sync(m->kb);
        if (r < 0)
                return r;
        if (m->transfers)
                model_tally(m, m->y_stage, batch, &sum, &correct);
        if (ret_loss)
                *ret_loss = m->transfers ? (float) (sum / batch) : NAN;
        if (ret_correct)
                *ret_correct = correct;
        return 0;
}

int model_train_step(Model *m, const float *x_host, const int32_t *y_host, int batch, float *ret_loss,
                     int *ret_correct) {
        int r = model_step_begin(m, x_host, y_host, batch);
        if (r < 0)
                return r;
        return model_step_end(m, ret_loss, ret_correct);
}

typedef struct HostSamples {
        const float *x;
        size_t in_n;
} HostSamples;

static const float *host_samples(const void *ud, size_t first, int count, float *scratch) {
        const HostSamples *h = ud;
        (void) count, (void) scratch;
        return h->x + first * h->in_n;
}

int model_evaluate(Model *m, const float *x_host, const int32_t *y_host, size_t n, size_t *ret_correct,
                   double *ret_loss) {
        if (!m || (n > 0 && !x_host))
                return -EINVAL;
        HostSamples h = { .x = x_host, .in_n = m->in_n };
        return model_evaluate_from(m, host_samples, &h, y_host, n, ret_correct, ret_loss);
}

int model_evaluate_from(Model *m, ModelSamplesFn samples, const void *ud, const int32_t *y_host, size_t n,
                        size_t *ret_correct, double *ret_loss) {
        double loss_total = 0.0;
        size_t correct_total = 0;
        int r;

        if (!m || m->pending || (n > 0 && !y_host))
                return -EINVAL;

        for (size_t off = 0; off < n; off += (size_t) m->max_batch) {
                int batch = (int) MIN(n - off, (size_t) m->max_batch), correct;
                const float *x = samples(ud, off, batch, m->x_stage);
                double loss_sum;

                if (!batch_ok(m, x, y_host + off, batch))
                        return -EINVAL;
                r = upload_batch(m, x, y_host + off, batch);
                if (r < 0)
                        return r;
                r = model_forward(m, batch, false);
                if (r < 0)
                        return r;
                r = model_queue_head(m, batch, 1.0f, true);
                if (r >= 0)
                        r = m->ops->sync(m->kb);
                if (r < 0)
                        return r;
                model_tally(m, y_host + off, batch, &loss_sum, &correct);
                loss_total += loss_sum;
                correct_total += (size_t) correct;
        }

        if (ret_correct)
                *ret_correct = correct_total;
        if (ret_loss)
                *ret_loss = n > 0 ? loss_total / (double) n : 0.0;
        return 0;
}
