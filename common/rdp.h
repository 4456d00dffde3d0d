/* SPDX-License-Identifier: Apache-2.0 */
/* The privacy a federated job with central Gaussian noise has spent: the
 * Rényi-DP accountant of the subsampled Gaussian mechanism (Mironov, Talwar,
 * Zhang 2019), as TF Privacy and Opacus compute it. Each round samples each
 * client with probability q and adds Gaussian noise of sigma times the clip
 * norm to the sum; after `steps` rounds the RDP at order a is steps x
 *   log( sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 sigma^2)) ) / (a - 1)
 * (integer orders; fractional ones by a series), and (eps, delta)-DP follows
 * from it by a conversion (RdpConversion), minimised over the orders.
 * test-rdp checks it against published figures: Opacus's example (60,000
 * examples, batch 256, sigma 1.12, 60 epochs, orders 10, 20, 100: 2.95 at
 * delta 1e-5) and Bu et al.'s moments-accountant figure (q = 256/60000,
 * sigma 1.3, 20 epochs: 1.34) with the classic conversion, and against
 * Google's dp-accounting (RdpAccountant's figures) with the tight one. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* What psctl says of the accountant (docs/federated.md). */
#define RDP_ACCOUNTANT_TEXT                                                                                \
        "RDP of the Poisson-subsampled Gaussian (Mironov et al. 2019; orders 1.1-10.9, 2-64, 128-1024), "  \
        "converted as Balle et al. 2020 (as Opacus and dp-accounting)"

/* How RDP becomes (eps, delta)-DP: RDP_TIGHT is Balle et al. 2020's
 * conversion, eps = RDP(a) + log(1 - 1/a) - log(delta a) / (a - 1), which
 * Opacus and Google's dp-accounting use (what a user publishes with);
 * RDP_CLASSIC is Mironov 2017's eps = RDP(a) + log(1/delta) / (a - 1),
 * larger by log(a) / (a - 1) - log(1 - 1/a). */
typedef enum { RDP_TIGHT, RDP_CLASSIC } RdpConversion;

/* The RDP of one round at integer order a >= 2 (q in (0, 1], sigma > 0); NaN
 * for bad arguments. */
double rdp_sampled_gaussian(double q, double sigma, unsigned a);
/* The same at any real order a > 1: fractional orders by the series of
 * Mironov, Talwar and Zhang 2019 (section 3.3); NaN for bad arguments or a
 * series that does not settle. */
double rdp_sampled_gaussian_at(double q, double sigma, double a);
/* eps at delta of rdp at order a (NaN for bad arguments). */
double rdp_to_epsilon(double rdp, double a, double delta, RdpConversion conv);

/* eps at delta after steps rounds, minimised over orders (n integer ones;
 * NULL: the account's RDP_NORDERS), and the order that gave it (may be
 * NULL). 0, or -EINVAL for bad arguments. No rounds: eps 0. */
int rdp_epsilon(double q, double sigma, uint64_t steps, double delta, const unsigned *orders, size_t n,
                RdpConversion conv, double *ret_eps, double *ret_order);

/* A running account over dp-accounting's default orders (rdp_order(i)), for
 * rounds whose sampling rate varies. RDP adds up over rounds order by
 * order. Its first RDP_NINT orders are the integer ones 2..64, 128, 256
 * that accounts saved before fractional orders held (a saved account of
 * those alone is restored with the others left out: +inf). */
#define RDP_NINT 65
#define RDP_NORDERS (RDP_NINT + 9 + 81 + 2)
typedef struct RdpAccount {
        double rdp[RDP_NORDERS];
        uint64_t steps;
} RdpAccount;

double rdp_order(size_t i);
void rdp_account_init(RdpAccount *a);
/* Adds one round of sampling rate q and noise multiplier sigma: 0, or -EINVAL
 * (nothing added) for bad arguments. */
int rdp_account_step(RdpAccount *a, double q, double sigma);
/* eps at delta for what the account holds (0 with no round): 0 or -EINVAL. */
int rdp_account_epsilon(const RdpAccount *a, double delta, RdpConversion conv, double *ret_eps, double *ret_order);
