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
};

static int dev_alloc(Model *m, size_t bytes, void *ret) {
        return m->ops->alloc(m->kb, bytes, (void **) ret);
}

static void dev_free(Model *m, void *p) {
        if (p)
                m->ops->free(m->kb, p);
}

static size_t weight(size_t layer) { return 2 * layer; }
static size_t bias(size_t layer) { return 2 * layer + 1; }

Model *model_free(Model *m) {
        if (!m)
                return NULL;
        for (size_t t = 0; t < m->ntensors; t++) {
                if (m->param_host)
                        ps_free(m->param_host[t]);
                if (m->grad_host)
                        ps_free(m->grad_host[t]);
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
        ps_free(m->pred_host);
        ps_free(m->loss_host);
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
                m->param_host[t] = ps_malloc_aligned(bytes);
                m->grad_host[t] = ps_malloc_aligned(bytes);
                if (!m->param_host[t] || !m->grad_host[t]) {
                        r = -ENOMEM;
                        goto fail;
                }
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
        m->pred_host = ps_malloc(mb * sizeof(int32_t));
        m->loss_host = ps_malloc(mb * sizeof(float));
        if (!m->pred_host || !m->loss_host) {
                r = -ENOMEM;
                goto fail;
        }

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

int model_upload_params(Model *m) {
        int r;

        if (!m)
                return -EINVAL;
        for (size_t t = 0; t < m->ntensors; t++) {
                r = m->ops->upload(m->kb, m->param_dev[t], m->param_host[t],
                                   m->numel[t] * sizeof(float));
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Uploads batch samples and their labels; labels are checked here so that every
 * backend rejects them the same way. */
static int model_load_batch(Model *m, const float *x_host, const int32_t *y_host, int batch) {
        int32_t classes = (int32_t) m->dims[m->nd - 1];
        int r;

        if (!x_host || !y_host || batch < 1 || batch > m->max_batch)
                return -EINVAL;
        for (int i = 0; i < batch; i++)
                if (y_host[i] < 0 || y_host[i] >= classes)
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

                r = m->ops->gemm(m->kb, false, true, batch, out, in, 1.0f, m->act_dev[l], in,
                                 m->param_dev[weight(l)], in, 0.0f, m->act_dev[l + 1], out);
                if (r < 0)
                        return r;
                r = m->ops->bias_act(m->kb, m->act_dev[l + 1], m->param_dev[bias(l)], batch, out,
                                     act);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Argmax and per-sample losses of the logits; leaves the loss gradient scaled by
 * scale in delta_dev[0]. Downloads losses and predictions and sums them up. */
static int model_head(Model *m, const int32_t *y_host, int batch, float scale, double *ret_loss_sum,
                      int *ret_correct) {
        int classes = (int) m->dims[m->nd - 1], correct = 0, r;
        const float *logits = m->act_dev[m->nd - 1];
        double sum = 0.0;

        r = m->ops->argmax(m->kb, logits, batch, classes, m->pred_dev);
        if (r < 0)
                return r;
        r = m->ops->softmax_xent(m->kb, logits, m->y_dev, batch, classes, scale, m->delta_dev[0],
                                 m->loss_dev);
        if (r < 0)
                return r;
        r = m->ops->download(m->kb, m->loss_host, m->loss_dev, (size_t) batch * sizeof(float));
        if (r < 0)
                return r;
        r = m->ops->download(m->kb, m->pred_host, m->pred_dev, (size_t) batch * sizeof(int32_t));
        if (r < 0)
                return r;

        for (int i = 0; i < batch; i++) {
                sum += m->loss_host[i];
                correct += m->pred_host[i] == y_host[i];
        }
        *ret_loss_sum = sum;
        *ret_correct = correct;
        return 0;
}

/* From delta_dev[0] = dloss/dlogits, the gradients of every tensor into grad_dev. */
static int model_backward(Model *m, int batch) {
        int cur = 0, r;

        for (size_t l = m->nlayers; l-- > 0;) {
                int in = (int) m->dims[l], out = (int) m->dims[l + 1];
                float *delta = m->delta_dev[cur], *prev = m->delta_dev[1 - cur];

                /* dW_l [out x in] = delta^T [out x B] * act[l] [B x in] */
                r = m->ops->gemm(m->kb, true, false, out, in, batch, 1.0f, delta, out,
                                 m->act_dev[l], in, 0.0f, m->grad_dev[weight(l)], in);
                if (r < 0)
                        return r;
                r = m->ops->colsum(m->kb, delta, batch, out, m->grad_dev[bias(l)]);
                if (r < 0)
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

int model_train_step(Model *m, const float *x_host, const int32_t *y_host, int batch,
                     float *ret_loss, int *ret_correct) {
        double loss_sum;
        int correct, r;

        if (!m)
                return -EINVAL;
        r = model_load_batch(m, x_host, y_host, batch);
        if (r < 0)
                return r;
        r = model_forward(m, batch);
        if (r < 0)
                return r;
        /* The 1/B of the mean enters once, in the loss gradient. */
        r = model_head(m, y_host, batch, 1.0f / (float) batch, &loss_sum, &correct);
        if (r < 0)
                return r;
        r = model_backward(m, batch);
        if (r < 0)
                return r;
        for (size_t t = 0; t < m->ntensors; t++) {
                r = m->ops->download(m->kb, m->grad_host[t], m->grad_dev[t],
                                     m->numel[t] * sizeof(float));
                if (r < 0)
                        return r;
        }

        if (ret_loss)
                *ret_loss = (float) (loss_sum / batch);
        if (ret_correct)
                *ret_correct = correct;
        return 0;
}

int model_evaluate(Model *m, const float *x_host, const int32_t *y_host, size_t n,
                   size_t *ret_correct, double *ret_loss) {
        double loss_total = 0.0;
        size_t correct_total = 0;
        int r;

        if (!m || (n > 0 && (!x_host || !y_host)))
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
                r = model_head(m, y_host + off, batch, 1.0f, &loss_sum, &correct);
                if (r < 0)
                        return r;
                loss_total += loss_sum;
                correct_total += (size_t) correct;
        }

        if (ret_correct)
                *ret_correct = correct_total;
        if (ret_loss)
                *ret_loss = n > 0 ? loss_total / (double) n : 0.0;
        return 0;
}
