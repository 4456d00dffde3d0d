/* SPDX-License-Identifier: Apache-2.0 */
/* A federated client's local work, pure (no sockets, no loop: edge.c runs it
 * in libuv's thread pool, tests/unit/test-edge.c against a reference): its
 * local epochs of plain SGD over its own examples from the pulled weights,
 * with FedProx's proximal term, leaving the update (weights after minus
 * pulled) for libpsnet to clip, encode and push; and a test of a model. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "dataset.h"
#include "model.h"

typedef struct EdgeTrain {
        uint32_t local_epochs, batch;
        float lr, mu;           /* mu: FedProx's proximal weight (0: FedAvg's plain SGD) */
        uint64_t seed;          /* the examples' order (edge_train_seed) */
} EdgeTrain;

/* The order of a round's examples follows the job's seed, the aggregated
 * round the update makes (not pscoord's number for the request, which a
 * retried round or a restore changes; fedasync: the task's number) and the
 * client: a job restored from a checkpoint trains as the uninterrupted one. */
uint64_t edge_train_seed(uint64_t job_seed, uint64_t round, uint32_t client);

/* Trains m, whose host params hold the pulled weights (w0 a copy of them):
 * c->local_epochs passes over train's examples mine[0..nmine) (put in
 * ascending order, then shuffled afresh each epoch), each batch one step of
 * w -= lr (g + mu (w - w0)). Then upd[t] = w[t] - w0[t] for every tensor
 * and *ret_loss the mean of the batches' losses. 0, or the model's error. */
int edge_train(Model *m, const Dataset *train, uint32_t *mine, uint32_t nmine, const EdgeTrain *c,
               float *const *w0, float *const *upd, double *ret_loss);
/* Tests m's host params on test: the share of correct predictions and the mean loss. */
int edge_test(Model *m, const Dataset *test, float *ret_accuracy, double *ret_loss);
