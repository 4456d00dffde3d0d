/* The MLP, written once against kernels.h so that the CPU and CUDA backends run
 * the same code. Every buffer a step needs is allocated in model_new for
 * max_batch samples; a training step only uploads the batch, runs kernels and
 * downloads the gradients into the host buffers the client pushes.
 *
 * Shapes, with B the batch and L = nd - 1 layers:
 *   act[0] = x [B x D0], act[l+1] = act(act[l] W_l^T + b_l) [B x D(l+1)],
 *   the last layer without activation (its output are the logits), and
 *   loss = mean over the batch of softmax cross-entropy. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include "alloc.h"
#include "macro.h"
#include "model.h"

struct Model {
        KBackend *kb;
        const KernelsOps *ops;
        size_t nd, nlayers, ntensors;
        uint32_t *dims;
        int max_batch;
        int max_width;        /* largest of D1 .. DL */

        size_t *numel;        /* per tensor */
        float **param_host;   /* per tensor, what the client pulls into */
        float **grad_host;    /* per tensor, what the client pushes */
        float **param_dev;    /* per tensor, backend copies */
        float **grad_dev;

        float **act_dev;      /* nd buffers: act[l] is max_batch x D(l) */
        float *delta_dev[2];  /* ping-pong gradients w.r.t. activations, max_batch x max_width */
        int32_t *y_dev;       /* labels of the batch */
        int32_t *pred_dev;    /* argmax of the logits */
        float *loss_dev;      /* per-sample losses */
        int32_t *pred_host;
        float *loss_host;

        float *x_stage;       /* host_alloc'd batch (max_batch samples) and labels */
        int32_t *y_stage;
        bool graphs;          /* capture full-batch training steps */
        bool transfers;       /* upload the batch, download losses and gradients */
        bool graph_failed;    /* the backend cannot capture: run ops directly */
        KGraph *graph;        /* the captured full-batch step */
        int pending;          /* batch of the step model_step_begin queued (0: none) */
};

static int dev_alloc(Model *m, size_t bytes, void *ret) {
        return m->ops->alloc(m->kb, bytes, (void **) ret);
}

static void dev_free(Model *m, void *p) {
        if (p)
                m->ops->free(m->kb, p);
}

static int host_alloc(Model *m, size_t bytes, void *ret) {
        return m->ops->host_alloc(m->kb, bytes, (void **) ret);
}

static void host_free(Model *m, void *p) {
        if (p)
                m->ops->host_free(m->kb, p);
}

static size_t weight(size_t layer) { return 2 * layer; }
static size_t bias(size_t layer) { return 2 * layer + 1; }

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
                if (m->param_host)
                        host_free(m, m->param_host[t]);
                if (m->grad_host)
                        host_free(m, m->grad_host[t]);
                if (m->param_dev)
                        dev_free(m, m->param_dev[t]);
                if (m->grad_dev)
                        dev_free(m, m->grad_dev[t]);
        }
        for (size_t l = 0; m->act_dev && l < m->nd; l++)
                dev_free(m, m->act_dev[l]);
        dev_free(m, m->delta_dev[0]);
        dev_free(m, m->delta_dev[1]);
        dev_free(m, m->y_dev);
        dev_free(m, m->pred_dev);
        dev_free(m, m->loss_dev);
        host_free(m, m->pred_host);
        host_free(m, m->loss_host);
        host_free(m, m->x_stage);
        host_free(m, m->y_stage);
        ps_free(m->param_host);
        ps_free(m->grad_host);
        ps_free(m->param_dev);
        ps_free(m->grad_dev);
        ps_free(m->act_dev);
        ps_free(m->numel);
        ps_free(m->dims);
        ps_free(m);
        return NULL;
}

int model_new(KBackend *kb, const uint32_t *dims, size_t nd, int max_batch, Model **ret) {
        Model *m;
        size_t t, mb;
        int r;

        if (!kb || !kb->ops || !dims || nd < 2 || max_batch < 1 || !ret)
                return -EINVAL;
        /* Every width must fit the kernels' int shapes, also multiplied by the batch. */
        for (size_t l = 0; l < nd; l++)
                if (dims[l] == 0 || dims[l] > (uint32_t) (INT_MAX / max_batch))
                        return -EINVAL;

        m = ps_calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        m->kb = kb;
        m->ops = kb->ops;
        m->nd = nd;
        m->nlayers = nd - 1;
        m->ntensors = 2 * m->nlayers;
        m->max_batch = max_batch;
        m->graphs = true;
        m->transfers = true;
        mb = (size_t) max_batch;

        m->dims = ps_calloc(nd, sizeof *m->dims);
        m->numel = ps_calloc(m->ntensors, sizeof *m->numel);
        m->param_host = ps_calloc(m->ntensors, sizeof *m->param_host);
        m->grad_host = ps_calloc(m->ntensors, sizeof *m->grad_host);
        m->param_dev = ps_calloc(m->ntensors, sizeof *m->param_dev);
        m->grad_dev = ps_calloc(m->ntensors, sizeof *m->grad_dev);
        m->act_dev = ps_calloc(nd, sizeof *m->act_dev);
        if (!m->dims || !m->numel || !m->param_host || !m->grad_host || !m->param_dev ||
            !m->grad_dev || !m->act_dev) {
                r = -ENOMEM;
                goto fail;
        }
        memcpy(m->dims, dims, nd * sizeof *dims);
        for (size_t l = 1; l < nd; l++)
                m->max_width = MAX(m->max_width, (int) dims[l]);

        for (size_t l = 0; l < m->nlayers; l++) {
                m->numel[weight(l)] = (size_t) dims[l + 1] * dims[l];
                m->numel[bias(l)] = dims[l + 1];
        }
        for (t = 0; t < m->ntensors; t++) {
                size_t bytes = m->numel[t] * sizeof(float);
                r = host_alloc(m, bytes, &m->param_host[t]);
                if (r < 0)
                        goto fail;
                r = host_alloc(m, bytes, &m->grad_host[t]);
                if (r < 0)
                        goto fail;
                memset(m->param_host[t], 0, bytes);
                memset(m->grad_host[t], 0, bytes);
                r = dev_alloc(m, bytes, &m->param_dev[t]);
                if (r < 0)
                        goto fail;
                r = dev_alloc(m, bytes, &m->grad_dev[t]);
                if (r < 0)
                        goto fail;
        }

        for (size_t l = 0; l < nd; l++) {
                r = dev_alloc(m, mb * dims[l] * sizeof(float), &m->act_dev[l]);
                if (r < 0)
                        goto fail;
        }
        for (int i = 0; i < 2; i++) {
                r = dev_alloc(m, mb * (size_t) m->max_width * sizeof(float), &m->delta_dev[i]);
                if (r < 0)
                        goto fail;
        }
        r = dev_alloc(m, mb * sizeof(int32_t), &m->y_dev);
        if (r < 0)
                goto fail;
        r = dev_alloc(m, mb * sizeof(int32_t), &m->pred_dev);
        if (r < 0)
                goto fail;
        r = dev_alloc(m, mb * sizeof(float), &m->loss_dev);
        if (r < 0)
                goto fail;
        r = host_alloc(m, mb * sizeof(int32_t), &m->pred_host);
        if (r >= 0)
                r = host_alloc(m, mb * sizeof(float), &m->loss_host);
        if (r >= 0)
                r = host_alloc(m, mb * dims[0] * sizeof(float), &m->x_stage);
        if (r >= 0)
                r = host_alloc(m, mb * sizeof(int32_t), &m->y_stage);
        if (r < 0)
                goto fail;
        memset(m->x_stage, 0, mb * dims[0] * sizeof(float));
        memset(m->y_stage, 0, mb * sizeof(int32_t));

        /* The backend starts from the same (zero) parameters as the host. */
        r = model_upload_params(m);
        if (r < 0)
                goto fail;

        *ret = m;
        return 0;

fail:
        model_free(m);
        return r;
}

size_t model_ntensors(const Model *m) {
        return m ? m->ntensors : 0;
}

size_t model_tensor_numel(const Model *m, size_t t) {
        return m && t < m->ntensors ? m->numel[t] : 0;
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
        if (!m || (m->graphs == graphs && m->transfers == transfers))
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
                r = m->ops->upload(m->kb, m->param_dev[t], host[t], m->numel[t] * sizeof(float));
                if (r < 0)
                        return r;
        }
        return 0;
}

int model_upload_params(Model *m) {
        return m ? model_upload_params_from(m, m->param_host) : -EINVAL;
}

/* Uploads batch samples and their labels; labels are checked here so that every
 * backend rejects them the same way. */
/* Labels are checked on the host, before anything is queued, so that every
 * backend rejects a bad one the same way and at once. */
static bool labels_ok(const Model *m, const int32_t *y_host, int batch) {
        int32_t classes = (int32_t) m->dims[m->nd - 1];

        for (int i = 0; i < batch; i++)
                if (y_host[i] < 0 || y_host[i] >= classes)
                        return false;
        return true;
}

static int model_load_batch(Model *m, const float *x_host, const int32_t *y_host, int batch) {
        int r;

        if (!x_host || !y_host || batch < 1 || batch > m->max_batch || !labels_ok(m, y_host, batch))
                return -EINVAL;

        r = m->ops->upload(m->kb, m->act_dev[0], x_host,
                           (size_t) batch * m->dims[0] * sizeof(float));
        if (r < 0)
                return r;
        return m->ops->upload(m->kb, m->y_dev, y_host, (size_t) batch * sizeof(int32_t));
}

/* act[l+1] = act(act[l] W_l^T + b_l) for every layer; the last act[] holds logits. */
static int model_forward(Model *m, int batch) {
        int r;

        for (size_t l = 0; l < m->nlayers; l++) {
                int in = (int) m->dims[l], out = (int) m->dims[l + 1];
                KAct act = l + 1 < m->nlayers ? KACT_RELU : KACT_NONE;

                r = m->ops->gemm_ep(m->kb, false, true, batch, out, in, m->act_dev[l], in,
                                    m->param_dev[weight(l)], in, m->act_dev[l + 1], out,
                                    act == KACT_RELU ? KEPI_BIAS_RELU : KEPI_BIAS, m->param_dev[bias(l)]);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Argmax and per-sample losses of the logits; leaves the loss gradient scaled by
 * scale in delta_dev[0]. With download, the losses and predictions are copied to
 * the host buffers as well (read after a sync, by model_tally). */
static int model_queue_head(Model *m, int batch, float scale, bool download) {
        int classes = (int) m->dims[m->nd - 1], r;
        const float *logits = m->act_dev[m->nd - 1];

        r = m->ops->argmax(m->kb, logits, batch, classes, m->pred_dev);
        if (r < 0)
                return r;
        r = m->ops->softmax_xent(m->kb, logits, m->y_dev, batch, classes, scale, m->delta_dev[0],
                                 m->loss_dev);
        if (r < 0 || !download)
                return r;
        r = m->ops->download_async(m->kb, m->loss_host, m->loss_dev, (size_t) batch * sizeof(float),
                                   loss_slot(m));
        if (r < 0)
                return r;
        return m->ops->download_async(m->kb, m->pred_host, m->pred_dev, (size_t) batch * sizeof(int32_t),
                                      pred_slot(m));
}

/* The summed loss and the correct predictions of the head's last download. */
static void model_tally(const Model *m, const int32_t *y_host, int batch, double *ret_loss_sum,
                        int *ret_correct) {
        double sum = 0.0;
        int correct = 0;

        for (int i = 0; i < batch; i++) {
                sum += m->loss_host[i];
                correct += m->pred_host[i] == y_host[i];
        }
        *ret_loss_sum = sum;
        *ret_correct = correct;
}

static int download_tensor(Model *m, size_t t) {
        return m->ops->download_async(m->kb, m->grad_host[t], m->grad_dev[t], m->numel[t] * sizeof(float),
                                      grad_slot(t));
}

/* From delta_dev[0] = dloss/dlogits, the gradients of every tensor into grad_dev,
 * each downloaded (when transfers are on) as soon as it is computed. */
static int model_backward(Model *m, int batch) {
        int cur = 0, r;

        for (size_t l = m->nlayers; l-- > 0;) {
                int in = (int) m->dims[l], out = (int) m->dims[l + 1];
                float *delta = m->delta_dev[cur], *prev = m->delta_dev[1 - cur];

                /* dW_l [out x in] = delta^T [out x B] * act[l] [B x in], and the bias
                 * gradient db_l = sum over the batch of delta, in the same pass. */
                r = m->ops->gemm_ep(m->kb, true, false, out, in, batch, delta, out, m->act_dev[l], in,
                                    m->grad_dev[weight(l)], in, KEPI_BGRAD, m->grad_dev[bias(l)]);
                if (r < 0)
                        return r;
                if (m->transfers && ((r = download_tensor(m, weight(l))) < 0 ||
                                     (r = download_tensor(m, bias(l))) < 0))
                        return r;
                if (l == 0)
                        break;

                /* d act[l] [B x in] = delta [B x out] * W_l [out x in], then through ReLU. */
                r = m->ops->gemm(m->kb, false, false, batch, in, out, 1.0f, delta, out,
                                 m->param_dev[weight(l)], in, 0.0f, prev, in);
                if (r < 0)
                        return r;
                r = m->ops->act_backward(m->kb, prev, m->act_dev[l], (size_t) batch * in,
                                         KACT_RELU);
                if (r < 0)
                        return r;
                cur = 1 - cur;
        }
        return 0;
}

/* Every op of a training step on the staged batch, queued without waiting. */
static int model_queue_step(Model *m, int batch) {
        int r;

        if (m->transfers) {
                r = m->ops->upload(m->kb, m->act_dev[0], m->x_stage, (size_t) batch * m->dims[0] * sizeof(float));
                if (r >= 0)
                        r = m->ops->upload(m->kb, m->y_dev, m->y_stage, (size_t) batch * sizeof(int32_t));
                if (r < 0)
                        return r;
        }
        r = model_forward(m, batch);
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
            !labels_ok(m, y_host, batch))
                return -EINVAL;
        if (x_host != m->x_stage)
                memcpy(m->x_stage, x_host, (size_t) batch * m->dims[0] * sizeof(float));
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

int model_train_step(Model *m, const float *x_host, const int32_t *y_host, int batch,
                     float *ret_loss, int *ret_correct) {
        int r = model_step_begin(m, x_host, y_host, batch);
        if (r < 0)
                return r;
        return model_step_end(m, ret_loss, ret_correct);
}

int model_evaluate(Model *m, const float *x_host, const int32_t *y_host, size_t n,
                   size_t *ret_correct, double *ret_loss) {
        double loss_total = 0.0;
        size_t correct_total = 0;
        int r;

        if (!m || m->pending || (n > 0 && (!x_host || !y_host)))
                return -EINVAL;

        for (size_t off = 0; off < n; off += (size_t) m->max_batch) {
                int batch = (int) MIN(n - off, (size_t) m->max_batch), correct;
                double loss_sum;

                r = model_load_batch(m, x_host + off * m->dims[0], y_host + off, batch);
                if (r < 0)
                        return r;
                r = model_forward(m, batch);
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
