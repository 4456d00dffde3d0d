/* The MLP model, written once against kernels/kernels.h: Linear+ReLU layers and a
 * final Linear with softmax cross-entropy. Parameters are laid out as the job's
 * tensors: W0 [D1 x D0], b0 [D1], W1 [D2 x D1], b1 [D2], ... Host staging
 * buffers hold what the client pulls (params) and pushes (grads). */
#pragma once
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

/* Forward + backward on a batch (x: batch x D0 floats, y: labels, both host).
 * Leaves the mean-over-batch gradients in the host grad buffers. */
int model_train_step(Model *m, const float *x_host, const int32_t *y_host, int batch,
                     float *ret_loss, int *ret_correct);

/* Forward only over n samples (in slices of max_batch); counts correct predictions. */
int model_evaluate(Model *m, const float *x_host, const int32_t *y_host, size_t n,
                   size_t *ret_correct, double *ret_loss);
