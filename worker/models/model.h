/* SPDX-License-Identifier: Apache-2.0 */
/* A model described by common/modeldesc.h (layers: linear, conv2d, pooling,
 * flatten, tokens, ReLU, GELU, dropout, layer norm, embedding, positional
 * embedding, transformer blocks, mean over tokens) with softmax cross-entropy
 * on its last layer, written once against kernels/kernels.h. Its parameters
 * are the job's tensors, in the description's order and PyTorch's layouts
 * (linear weight [out x in], conv2d weight [out x C x k x k], ...). Host
 * staging buffers hold what the client pulls (params) and pushes (grads).
 *
 * Inside, images are NHWC (channels innermost, so a convolution is one product
 * over the batch); samples come in PyTorch's NCHW and flatten gives PyTorch's
 * (C, H, W) order, so the weights mean what they mean in torch. A linear layer
 * or convolution followed by a ReLU runs as one fused product. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kernels.h"
#include "modeldesc.h"

typedef struct Model Model;

/* max_batch bounds every call. A layer whose op the backend lacks, or shapes
 * that overflow the kernels' int sizes at max_batch: -ENOTSUP / -EINVAL with
 * the reason in err. */
int model_new(KBackend *kb, const ModelDesc *d, int max_batch, Model **ret, char *err, size_t errlen);
/* The model of a job's text (modeldesc_parse). */
int model_new_text(KBackend *kb, const char *text, int max_batch, Model **ret, char *err, size_t errlen);
/* The MLP of widths dims (nd >= 2), e.g. {784, 256, 10}: "mlp:784-256-10". */
int model_new_mlp(KBackend *kb, const uint32_t *dims, size_t nd, int max_batch, Model **ret);
Model *model_free(Model *m);

/* Values of one sample the model takes, and its classes. */
size_t model_input_numel(const Model *m);
uint32_t model_classes(const Model *m);
/* Dropout masks are drawn from (seed, steps trained since); this sets both. */
void model_set_seed(Model *m, uint64_t seed);

size_t model_ntensors(const Model *m);
size_t model_tensor_numel(const Model *m, size_t t);
/* Host buffers, one per tensor: the caller writes params, reads grads. */
float *model_param_host(Model *m, size_t t);
float *model_grad_host(Model *m, size_t t);

/* The model's host buffers become the caller's, one per tensor (memory the
 * backend copies from asynchronously: host_register'd on CUDA), which must
 * outlive the model; the model's own are freed, their params copied over.
 * Before the first step only (-EINVAL after, or twice). */
int model_lend_host(Model *m, float *const *params, float *const *grads);

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

/* Forward + backward on a batch (x: batch x input floats, y: labels, both
 * host; labels, and token ids of an embedding, are checked: -EINVAL). Leaves the mean-over-batch gradients in the
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
 * the backend can; not with dropout, whose mask changes every step). transfers (default true; false only to time the compute as
 * a framework benchmark does): when false, steps reuse the batch already on the
 * backend and leave losses and gradients there (loss NAN, correct 0). */
void model_set_options(Model *m, bool graphs, bool transfers);
/* True once a step runs as a captured graph. */
bool model_graph_active(const Model *m);

/* Forward only over n samples (in slices of max_batch); counts correct predictions. */
int model_evaluate(Model *m, const float *x_host, const int32_t *y_host, size_t n,
                   size_t *ret_correct, double *ret_loss);
/* The same over samples handed over a slice at a time: samples(ud, first,
 * count, scratch) returns samples first..first+count-1 as floats, in place
 * or written into scratch (model_batch_x: room for max_batch samples). */
typedef const float *(*ModelSamplesFn)(const void *ud, size_t first, int count, float *scratch);
int model_evaluate_from(Model *m, ModelSamplesFn samples, const void *ud, const int32_t *y_host, size_t n,
                        size_t *ret_correct, double *ret_loss);
