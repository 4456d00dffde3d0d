/* SPDX-License-Identifier: Apache-2.0 */
/* The privacy a federated job with central Gaussian noise has spent: the
 * Rényi-DP accountant of the subsampled Gaussian mechanism (Mironov, Talwar,
 * Zhang 2019), as TF Privacy and Opacus compute it. Each round samples each
 * client with probability q and adds Gaussian noise of sigma times the clip
 * norm to the sum; after `steps` rounds the RDP at order a is steps x
 *   log( sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 sigma^2)) ) / (a - 1)
 * (integer orders), and (eps, delta)-DP follows from the classic conversion
 * eps = min_a RDP(a) + log(1/delta) / (a - 1).
 * test-rdp checks it against published figures: Opacus's example (60,000
 * examples, batch 256, sigma 1.12, 60 epochs, orders 10, 20, 100: 2.95 at
 * delta 1e-5) and Bu et al.'s moments-accountant figure (q = 256/60000,
 * sigma 1.3, 20 epochs: 1.34). Fractional orders, which TF Privacy adds, can
 * only lower the figure: the one reported here is never below theirs. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* The RDP of one round at integer order a >= 2 (q in (0, 1], sigma > 0); NaN
 * for bad arguments. */
double rdp_sampled_gaussian(double q, double sigma, unsigned a);

/* eps at delta after steps rounds, minimised over orders (n of them; NULL:
 * 2..64, 128, 256), and the order that gave it (may be NULL). 0, or -EINVAL
 * for bad arguments. No rounds: eps 0. */
int rdp_epsilon(double q, double sigma, uint64_t steps, double delta, const unsigned *orders, size_t n,
                double *ret_eps, unsigned *ret_order);

/* A running account over the default orders, for rounds whose sampling rate
 * varies (a federated job samples m of the n clients connected at each round:
 * q = m / n then). RDP adds up over rounds order by order. */
#define RDP_NORDERS 65
typedef struct RdpAccount {
        double rdp[RDP_NORDERS];
        uint64_t steps;
} RdpAccount;

void rdp_account_init(RdpAccount *a);
/* Adds one round of sampling rate q and noise multiplier sigma: 0, or -EINVAL
 * (nothing added) for bad arguments. */
int rdp_account_step(RdpAccount *a, double q, double sigma);
/* eps at delta for what the account holds (0 with no round): 0 or -EINVAL. */
int rdp_account_epsilon(const RdpAccount *a, double delta, double *ret_eps, unsigned *ret_order);
