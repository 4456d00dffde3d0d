/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/rdp.c, the privacy accountant, against figures
 * published by others (not computed with this code):
 *   Opacus, compute_dp_sgd_privacy: 60,000 examples, batch 256 (q = 256/60000),
 *   noise multiplier 1.12, 60 epochs (14,063 steps), orders 10, 20, 100,
 *   delta 1e-5: eps 2.95.
 *   Bu, Dong, Long, Su, "Deep learning with Gaussian differential privacy"
 *   (2020), Figure 4: q = 256/60000, sigma 1.3, the moments accountant at
 *   epoch 20 (4,687 steps), delta 1e-5: eps 1.34.
 * Both within 1% (the published ones are rounded; Bu et al.'s accountant had
 * fractional orders too, which can only lower eps). Plus the closed form
 * without sampling, monotonicity and the refusals. */
#include <errno.h>
#include <math.h>
#include "rdp.h"
#include "tap.h"

int main(void) {
        double eps = 0;
        unsigned order = 0;
        const unsigned three[3] = { 10, 20, 100 };
        int r = rdp_epsilon(256.0 / 60000, 1.12, 14063, 1e-5, three, 3, &eps, &order);
        CHECK(r == 0 && fabs(eps - 2.95) / 2.95 < 0.01, "Opacus's example: eps %.4f at order %u (published 2.95)", eps,
              order);
        r = rdp_epsilon(256.0 / 60000, 1.3, 4687, 1e-5, NULL, 0, &eps, &order);
        CHECK(r == 0 && fabs(eps - 1.34) / 1.34 < 0.01 && eps >= 1.335,
              "Bu et al.'s sigma 1.3, epoch 20: eps %.4f at order %u (published 1.34, never below it)", eps, order);

        /* Without sampling each round is the Gaussian mechanism: RDP a / (2 sigma^2). */
        CHECK(fabs(rdp_sampled_gaussian(1.0, 2.0, 8) - 1.0) < 1e-12, "q = 1: a / (2 sigma^2)");
        /* Sampling amplifies privacy; more noise and fewer rounds spend less. */
        CHECK(rdp_sampled_gaussian(0.01, 1.0, 8) < rdp_sampled_gaussian(1.0, 1.0, 8) / 50,
              "sampling 1%% lowers the RDP by far more than 50x at order 8 (%g vs %g)",
              rdp_sampled_gaussian(0.01, 1.0, 8), rdp_sampled_gaussian(1.0, 1.0, 8));
        double e1, e2, e3;
        rdp_epsilon(0.01, 1.0, 1000, 1e-5, NULL, 0, &e1, NULL);
        rdp_epsilon(0.01, 1.0, 2000, 1e-5, NULL, 0, &e2, NULL);
        rdp_epsilon(0.01, 2.0, 1000, 1e-5, NULL, 0, &e3, NULL);
        CHECK(e1 < e2 && e3 < e1, "twice the rounds spend more (%.3f > %.3f), twice the noise less (%.3f)", e2, e1,
              e3);
        CHECK(rdp_epsilon(0.01, 1.0, 0, 1e-5, NULL, 0, &eps, NULL) == 0 && eps == 0, "no round, no eps");
        {
                /* The running account: 1000 rounds of q 0.01 give rdp_epsilon's figure;
                 * rounds of another q add up order by order. */
                RdpAccount a;
                double ea, e0;
                rdp_account_init(&a);
                CHECK(rdp_account_epsilon(&a, 1e-5, &ea, NULL) == 0 && ea == 0, "an empty account: eps 0");
                for (int i = 0; i < 1000; i++)
                        (void) rdp_account_step(&a, 0.01, 1.0);
                (void) rdp_account_epsilon(&a, 1e-5, &ea, NULL);
                CHECK(fabs(ea - e1) < 1e-9 * e1, "1000 steps in the account = rdp_epsilon's (%g, %g)", ea, e1);
                RdpAccount b;
                rdp_account_init(&b);
                (void) rdp_account_step(&b, 0.5, 1.0);
                (void) rdp_account_step(&b, 0.25, 1.0);
                (void) rdp_account_epsilon(&b, 1e-5, &ea, NULL);
                double r05 = rdp_sampled_gaussian(0.5, 1.0, 8) + rdp_sampled_gaussian(0.25, 1.0, 8);
                (void) rdp_epsilon(0.5, 1.0, 2, 1e-5, NULL, 0, &e0, NULL);
                CHECK(ea < e0 && ea <= r05 + log(1e5) / 7 + 1e-12,
                      "mixed rates: below two rounds at the higher one, at most the order-8 bound (%g)", ea);
                CHECK(rdp_account_step(&b, 0, 1.0) == -EINVAL && b.steps == 2, "a bad round is refused, not added");
        }

        /* Refusals. */
        CHECK(rdp_epsilon(0, 1.0, 10, 1e-5, NULL, 0, &eps, NULL) == -EINVAL &&
              rdp_epsilon(0.1, 0, 10, 1e-5, NULL, 0, &eps, NULL) == -EINVAL &&
              rdp_epsilon(0.1, 1.0, 10, 0, NULL, 0, &eps, NULL) == -EINVAL &&
              rdp_epsilon(0.1, NAN, 10, 1e-5, NULL, 0, &eps, NULL) == -EINVAL &&
              isnan(rdp_sampled_gaussian(0.1, 1.0, 1)),
              "q outside (0, 1], sigma <= 0 or NaN, delta outside (0, 1), order < 2: refused");
        return tap_done();
}
