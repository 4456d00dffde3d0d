/* SPDX-License-Identifier: Apache-2.0 */
/* A federated client's local work; see edge-train.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "edge-train.h"
#include "fed.h"
#include "hash.h"
#include "macro.h"

uint64_t edge_train_seed(uint64_t job_seed, uint64_t round, uint32_t client) {
        return job_seed * 1000003u + round * 7919u + client;
}

int edge_train(Model *m, const Dataset *train, uint32_t *mine, uint32_t nmine, const EdgeTrain *c,
               float *const *w0, float *const *upd, double *ret_loss) {
        size_t nt = model_ntensors(m);
        uint32_t batch = MAX(c->batch, 1u);
        float *xb = model_batch_x(m);
        int32_t *yb = model_batch_y(m);
        double loss_sum = 0;
        uint64_t nb = 0, x = c->seed;
        int r = 0;
        qsort(mine, nmine, sizeof *mine, cmp_u32); /* from the same order in every process */
        for (uint32_t ep = 0; ep < c->local_epochs && r == 0; ep++) {
                shuffle_u32(mine, nmine, &x); /* a fresh order each epoch */
                for (uint32_t s = 0; s < nmine && r == 0; s += batch) {
                        uint32_t b = MIN(batch, nmine - s);
                        for (uint32_t k = 0; k < b; k++) {
                                uint32_t i = mine[s + k];
                                dataset_sample(train, i, xb + (size_t) k * train->dim);
                                yb[k] = train->y[i];
                        }
                        float loss;
                        int correct;
                        r = model_upload_params(m);
                        if (r == 0)
                                r = model_train_step(m, xb, yb, (int) b, &loss, &correct);
                        if (r < 0)
                                break;
                        for (size_t t = 0; t < nt; t++)
                                fed_client_step(model_param_host(m, t), w0[t], model_grad_host(m, t),
                                                model_tensor_numel(m, t), c->lr, c->mu);
                        loss_sum += loss;
                        nb++;
                }
        }
        for (size_t t = 0; t < nt && r == 0; t++) {
                const float *w = model_param_host(m, t);
                for (size_t i = 0; i < model_tensor_numel(m, t); i++)
                        upd[t][i] = w[i] - w0[t][i];
        }
        *ret_loss = nb ? loss_sum / (double) nb : 0.0;
        return r;
}

int edge_test(Model *m, const Dataset *test, float *ret_accuracy, double *ret_loss) {
        size_t correct = 0;
        int r = model_upload_params(m);
        if (r == 0)
                r = model_evaluate_from(m, dataset_samples, test, test->y, test->n, &correct, ret_loss);
        if (r == 0)
                *ret_accuracy = test->n ? (float) correct / (float) test->n : 0.0f;
        return r;
}
