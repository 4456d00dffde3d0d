/* SPDX-License-Identifier: Apache-2.0 */
/* Splitting a labelled training set among federated clients, the same way in
 * every process (a function of the labels, the seed and the client count
 * only), so that each edge worker started with --partition K/N keeps its own
 * share and never looks at the others'. Two ways:
 *   iid          the samples shuffled and dealt out evenly (sizes differ by
 *                at most one);
 *   Dirichlet(a) for each class, its samples (shuffled) cut among the clients
 *                in proportions drawn from Dirichlet(a, ..., a) (Hsu et al.,
 *                2019; the split Flower's and FedLab's benchmarks use): small
 *                a gives each client few classes, large a tends to iid.
 * Every sample goes to exactly one client. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* The indices (ascending) of client's share of n samples labelled labels[i]
 * in [0, nclasses): alpha <= 0 for iid, else Dirichlet(alpha). *ret (free
 * with free) may hold none (a small alpha can leave a client without data).
 * -EINVAL for bad arguments (client >= clients, a label out of range),
 * -ENOMEM. */
int partition_client(const int32_t *labels, uint32_t n, uint32_t nclasses, uint32_t clients, double alpha,
                     uint64_t seed, uint32_t client, uint32_t **ret, uint32_t *ret_n);

/* A Gamma(shape, 1) variate (Marsaglia and Tsang) from the splitmix64 stream
 * x; shape > 0. Exposed for the unit test. */
double partition_gamma(double shape, uint64_t *x);
