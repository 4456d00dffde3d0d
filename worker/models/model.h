/* The MLP model, written once against kernels/kernels.h: Linear+ReLU layers and a
 * final Linear with softmax cross-entropy. Parameters are laid out as the job's
 * tensors: W0 [D1 x D0], b0 [D1], W1 [D2 x D1], b1 [D2], ... Host staging
 * buffers hold what the client pulls (params) and pushes (grads). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kernels.h"

typedef struct Model Model;

/* dims: layer widths (nd >= 2), e.g. {784, 256, 10}. max_batch bounds every call. */
int model_new(KBackend *kb, const uint32_t *dims, size_t nd, int max_batch, Model **ret);
Model *model_free(Model *m);

size_t model_ntensors(const Model *m);              /* 2 * (nd - 1) */
size_t model_tensor_numel(const Model *m, size_t t);
/* Host buffers, one per tensor: the caller writes params, reads grads. */
float *model_param_host(Model *m, size_t t);
float *model_grad_host(Model *m, size_t t);

/* Copies the host params into the backend. */
int model_upload_params(Model *m);
/* The same from other host buffers, one per tensor (from the backend's
 * host_alloc for an asynchronous copy; they must then stay unchanged until
 * model_step_end). */
int model_upload_params_from(Model *m, float *const *host);

/* The model's own batch buffers (max_batch samples and labels, in the backend's
 * fast host memory): a batch written here is not copied again. */
float *model_batch_x(Model *m);
int32_t *model_batch_y(Model *m);

/* Forward + backward on a batch (x: batch x D0 floats, y: labels, both host;
 * labels are checked, -EINVAL). Leaves the mean-over-batch gradients in the
 * host grad buffers. Equal to model_step_begin then model_step_end. */
int model_train_step(Model *m, const float *x_host, const int32_t *y_host, int batch,
                     float *ret_loss, int *ret_correct);
/* Queues a training step and returns while it computes. Then model_grad_wait(t)
 * returns once tensor t's gradient is in its host buffer (backward produces the
 * last layer's first), and model_step_end once everything is, with the mean loss
 * and the correct predictions of the batch. The params must not change between
 * model_upload_params and model_step_end. */
int model_step_begin(Model *m, const float *x_host, const int32_t *y_host, int batch);
int model_grad_wait(Model *m, size_t t);
int model_step_end(Model *m, float *ret_loss, int *ret_correct);

/* graphs (default true): capture a full-batch step once and replay it (where
 * the backend can). transfers (default true; false only to time the compute as
 * a framework benchmark does): when false, steps reuse the batch already on the
 * backend and leave losses and gradients there (loss NAN, correct 0). */
void model_set_options(Model *m, bool graphs, bool transfers);
/* True once a step runs as a captured graph. */
bool model_graph_active(const Model *m);

/* Forward only over n samples (in slices of max_batch); counts correct predictions. */
int model_evaluate(Model *m, const float *x_host, const int32_t *y_host, size_t n,
                   size_t *ret_correct, double *ret_loss);
