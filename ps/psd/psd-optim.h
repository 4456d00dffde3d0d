/* SPDX-License-Identifier: Apache-2.0 */
/* Optimizers that run on the shard, per chunk: SGD (momentum, Nesterov, weight
 * decay) and Adam. Applied to the mean gradient of a step. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "job.h"
#include "pfor.h"

/* Applies one step to n values. step is the 1-based count of updates this chunk
 * has had (Adam's bias correction). state has optim_state_per_value(c) * n floats,
 * zero-initialised before the first step; layout: sgd v[n]; adam m[n] then v[n].
 *   sgd:  g' = g + wd*w; v = mu*v + g'; w -= lr * (nesterov ? g' + mu*v : v)
 *         (mu = 0: w -= lr * g')
 *   adam: g' = g + wd*w; m = b1*m + (1-b1) g'; v = b2*v + (1-b2) g'^2;
 *         w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) */
void optim_apply(const OptimConf *c, uint64_t step, float *w, const float *g, float *state,
                 size_t n);
/* optim_apply of the gradient gscale * g (one multiply in the loop: gscale 1
 * gives optim_apply's bits, and any gscale those of optim_apply on a copy of
 * g scaled first), with the values cut into ranges run by pool's threads
 * (NULL or a short chunk: the caller alone). */
void optim_apply_par(Pfor *pool, const OptimConf *c, uint64_t step, float *w, const float *g, float gscale,
                     float *state, size_t n);
