/* SPDX-License-Identifier: Apache-2.0 */
/* The RDP accountant; see rdp.h. */
#include <errno.h>
#include <math.h>
#include "rdp.h"

static double log_add(double a, double b) {
        if (a == -INFINITY)
                return b;
        if (b == -INFINITY)
                return a;
        double m = fmax(a, b);
        return m + log1p(exp(fmin(a, b) - m));
}

double rdp_sampled_gaussian(double q, double sigma, unsigned a) {
        if (!(q > 0 && q <= 1) || !(sigma > 0) || !isfinite(sigma) || a < 2)
                return NAN;
        if (q == 1) /* no sampling: the Gaussian mechanism's own a / (2 sigma^2) */
                return (double) a / (2 * sigma * sigma);
        /* log A_a = log sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2 sigma^2)), summed in logs. */
        double la = -INFINITY, lq = log(q), l1q = log1p(-q);
        for (unsigned k = 0; k <= a; k++) {
                double lc = lgamma(a + 1.0) - lgamma(k + 1.0) - lgamma(a - k + 1.0);
                double t = lc + (a - k) * l1q + (k ? k * lq : 0) + ((double) k * k - k) / (2 * sigma * sigma);
                la = log_add(la, t);
        }
        return la / (a - 1);
}

static const unsigned def[RDP_NORDERS] = { /* 2..64, 128, 256 */
        2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,
        34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
        50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 128,
        256
};

int rdp_epsilon(double q, double sigma, uint64_t steps, double delta, const unsigned *orders, size_t n,
                double *ret_eps, unsigned *ret_order) {
        if (!(delta > 0 && delta < 1) || !(q > 0 && q <= 1) || !(sigma > 0) || !isfinite(sigma))
                return -EINVAL;
        if (!orders) {
                orders = def;
                n = sizeof def / sizeof def[0];
        }
        double best = INFINITY;
        unsigned at = 0;
        for (size_t i = 0; i < n; i++) {
                double r = rdp_sampled_gaussian(q, sigma, orders[i]);
                if (isnan(r))
                        return -EINVAL;
                double e = (double) steps * r + log(1 / delta) / (orders[i] - 1);
                if (e < best) {
                        best = e;
                        at = orders[i];
                }
        }
        if (n == 0)
                return -EINVAL;
        *ret_eps = steps ? best : 0;
        if (ret_order)
                *ret_order = at;
        return 0;
}

void rdp_account_init(RdpAccount *a) {
        for (size_t i = 0; i < RDP_NORDERS; i++)
                a->rdp[i] = 0;
        a->steps = 0;
}

int rdp_account_step(RdpAccount *a, double q, double sigma) {
        double r[RDP_NORDERS];
        for (size_t i = 0; i < RDP_NORDERS; i++) {
                r[i] = rdp_sampled_gaussian(q, sigma, def[i]);
                if (isnan(r[i]))
                        return -EINVAL;
        }
        for (size_t i = 0; i < RDP_NORDERS; i++)
                a->rdp[i] += r[i];
        a->steps++;
        return 0;
}

int rdp_account_epsilon(const RdpAccount *a, double delta, double *ret_eps, unsigned *ret_order) {
        if (!(delta > 0 && delta < 1))
                return -EINVAL;
        double best = INFINITY;
        unsigned at = 0;
        for (size_t i = 0; i < RDP_NORDERS; i++) {
                double e = a->rdp[i] + log(1 / delta) / (def[i] - 1);
                if (e < best) {
                        best = e;
                        at = def[i];
                }
        }
        *ret_eps = a->steps ? best : 0;
        if (ret_order)
                *ret_order = at;
        return 0;
}
