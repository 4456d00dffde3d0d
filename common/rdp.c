/* SPDX-License-Identifier: Apache-2.0 */
/* The RDP accountant; see rdp.h. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include "rdp.h"

#define FRAC_MAX_TERMS 20000 /* a fractional order's series not below e^-30 by then: the order is left out */

static double log_add(double a, double b) {
        if (a == -INFINITY)
                return b;
        if (b == -INFINITY)
                return a;
        double m = fmax(a, b);
        return m + log1p(exp(fmin(a, b) - m));
}

/* A signed sum kept as sign x exp(l): adds sign_t x exp(t). */
static void signed_add(double *l, int *sign, double t, int sign_t) {
        if (t == -INFINITY)
                return;
        if (*l == -INFINITY || *sign == 0) {
                *l = t;
                *sign = sign_t;
                return;
        }
        if (*sign == sign_t) {
                *l = log_add(*l, t);
                return;
        }
        /* Opposite signs: the larger magnitude keeps its sign. */
        if (*l == t) {
                *l = -INFINITY;
                *sign = 0;
        } else if (*l > t)
                *l = *l + log1p(-exp(t - *l));
        else {
                *l = t + log1p(-exp(*l - t));
                *sign = sign_t;
        }
}

/* log(erfc(x)), also where erfc underflows (x > ~26): its asymptotic series. */
static double log_erfc(double x) {
        if (x < 25)
                return log(erfc(x));
        double x2 = x * x;
        return -x2 - log(x) - 0.5 * log(M_PI) + log1p(-1 / (2 * x2) + 3 / (4 * x2 * x2) - 15 / (8 * x2 * x2 * x2));
}

/* log A_a for a fractional order a > 1: the integral of mu0 (mu / mu0)^a,
 * mu0 = N(0, sigma^2), mu = (1-q) mu0 + q N(1, sigma^2), split where
 * q N(1) = (1-q) N(0), at z0, each side expanded by the binomial series in
 * the smaller of the two terms (Mironov, Talwar, Zhang 2019, section 3.3):
 * below z0 the k-th term is C(a,k) q^k (1-q)^(a-k) e^((k^2-k)/(2 sigma^2))
 * Phi((z0 - k) / sigma), above it the same with q and 1-q swapped and k
 * replaced by a - k, and 1 - Phi((z0 - (a-k)) / sigma). NaN when the
 * series does not settle. */
static double log_a_frac(double q, double sigma, double a) {
        double s2 = sigma * sigma, z0 = s2 * log(1 / q - 1) + 0.5;
        double l0 = -INFINITY, l1 = -INFINITY;
        int g0 = 0, g1 = 0, csign = 1;
        double lq = log(q), l1q = log1p(-q), lga = lgamma(a + 1);
        for (unsigned k = 0; k < FRAC_MAX_TERMS; k++) {
                if (k > 0 && a - (k - 1) < 0)
                        csign = -csign; /* C(a,k) = C(a,k-1) (a-k+1) / k */
                double j = a - k;
                double lc = lga - lgamma(k + 1.0) - lgamma(j + 1); /* log |C(a,k)| */
                double t0 = lc + k * lq + j * l1q + ((double) k * k - k) / (2 * s2) +
                            log(0.5) + log_erfc((k - z0) / (M_SQRT2 * sigma));
                double t1 = lc + j * lq + k * l1q + (j * j - j) / (2 * s2) +
                            log(0.5) + log_erfc((z0 - j) / (M_SQRT2 * sigma));
                signed_add(&l0, &g0, t0, csign);
                signed_add(&l1, &g1, t1, csign);
                if (fmax(t0, t1) < -30)
                        break;
                if (k + 1 == FRAC_MAX_TERMS)
                        return NAN;
        }
        double l = -INFINITY;
        int g = 0;
        signed_add(&l, &g, l0, g0);
        signed_add(&l, &g, l1, g1);
        return g > 0 && isfinite(l) ? l : NAN;
}

double rdp_sampled_gaussian_at(double q, double sigma, double a) {
        if (!(q > 0 && q <= 1) || !(sigma > 0) || !isfinite(sigma) || !(a > 1) || !isfinite(a))
                return NAN;
        if (q == 1) /* no sampling: the Gaussian mechanism's own a / (2 sigma^2) */
                return a / (2 * sigma * sigma);
        if (a != floor(a)) {
                double la = log_a_frac(q, sigma, a);
                return isnan(la) ? NAN : fmax(la, 0) / (a - 1);
        }
        /* log A_a = log sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2 sigma^2)), summed in logs. */
        unsigned n = (unsigned) a;
        double la = -INFINITY, lq = log(q), l1q = log1p(-q);
        for (unsigned k = 0; k <= n; k++) {
                double lc = lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0);
                double t = lc + (n - k) * l1q + (k ? k * lq : 0) + ((double) k * k - k) / (2 * sigma * sigma);
                la = log_add(la, t);
        }
        return la / (a - 1);
}

double rdp_sampled_gaussian(double q, double sigma, unsigned a) {
        return a < 2 ? NAN : rdp_sampled_gaussian_at(q, sigma, a);
}

double rdp_to_epsilon(double rdp, double a, double delta, RdpConversion conv) {
        if (!(a > 1) || !(delta > 0 && delta < 1) || !(rdp >= 0))
                return NAN;
        if (rdp == INFINITY)
                return INFINITY;
        if (conv == RDP_CLASSIC)
                return rdp + log(1 / delta) / (a - 1);
        /* Balle et al. 2020 (Hypothesis testing interpretations and Rényi DP,
         * proposition 12), as Opacus and dp-accounting convert; and where the
         * RDP is small enough that the KL bound (delta >= sqrt(1 - e^-RDP))
         * already gives (0, delta). */
        if (delta * delta + expm1(-rdp) > 0)
                return 0;
        if (a < 1.01)
                return INFINITY; /* the bound is not stable this close to 1 (and of no use) */
        return fmax(0, rdp + log1p(-1 / a) - log(delta * a) / (a - 1));
}

/* 2..64, 128, 256 (the first RDP_NINT, as the accountant kept them before
 * fractional orders), then dp-accounting's other default orders: 1.1 to 10.9
 * by tenths, 512 and 1024. */
static double order_at(size_t i) {
        if (i < 63)
                return 2.0 + (double) i;
        if (i == 63)
                return 128;
        if (i == 64)
                return 256;
        i -= RDP_NINT;
        if (i < 9)
                return 1.0 + (double) (i + 1) / 10.0;
        i -= 9;
        if (i < 9 * 9) /* x.1 .. x.9 for x = 2..10 */
                return 2.0 + (double) (i / 9) + (double) (i % 9 + 1) / 10.0;
        return i == 81 ? 512 : 1024;
}

double rdp_order(size_t i) { return i < RDP_NORDERS ? order_at(i) : NAN; }

int rdp_epsilon(double q, double sigma, uint64_t steps, double delta, const unsigned *orders, size_t n,
                RdpConversion conv, double *ret_eps, double *ret_order) {
        if (!(delta > 0 && delta < 1) || !(q > 0 && q <= 1) || !(sigma > 0) || !isfinite(sigma))
                return -EINVAL;
        size_t m = orders ? n : RDP_NORDERS;
        if (m == 0)
                return -EINVAL;
        double best = INFINITY, at = 0;
        for (size_t i = 0; i < m; i++) {
                double a = orders ? orders[i] : order_at(i);
                double r = rdp_sampled_gaussian_at(q, sigma, a);
                if (isnan(r)) {
                        if (orders || a == floor(a))
                                return -EINVAL;
                        continue; /* a fractional order whose series did not settle: left out */
                }
                double e = rdp_to_epsilon((double) steps * r, a, delta, conv);
                if (e < best) {
                        best = e;
                        at = a;
                }
        }
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
                double o = order_at(i);
                r[i] = rdp_sampled_gaussian_at(q, sigma, o);
                if (isnan(r[i]) && o == floor(o))
                        return -EINVAL;
                if (isnan(r[i]))
                        r[i] = INFINITY; /* did not settle: this order is out of the account from now on */
        }
        for (size_t i = 0; i < RDP_NORDERS; i++)
                a->rdp[i] += r[i];
        a->steps++;
        return 0;
}

int rdp_account_epsilon(const RdpAccount *a, double delta, RdpConversion conv, double *ret_eps, double *ret_order) {
        if (!(delta > 0 && delta < 1))
                return -EINVAL;
        double best = INFINITY, at = 0;
        for (size_t i = 0; i < RDP_NORDERS; i++) {
                double e = rdp_to_epsilon(a->rdp[i], order_at(i), delta, conv);
                if (e < best) {
                        best = e;
                        at = order_at(i);
                }
        }
        *ret_eps = a->steps ? best : 0;
        if (ret_order)
                *ret_order = at;
        return 0;
}
