/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/fed.c: every federated aggregation strategy
 * against values worked out by hand in the comments, for three clients with
 * 1, 2 and 1 examples:
 *   d1 = [1, -2], d2 = [3, 0], d3 = [-1, 4], w = [10, 20]
 *   D (the weighted mean) = ([1,-2] + 2[3,0] + [-1,4]) / 4 = [1.5, 0.5]
 * plus the robust strategies against an outlier, and the refusals. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "fed.h"
#include "tap.h"

#define TOL 1e-5

static const float d1[2] = { 1, -2 }, d2[2] = { 3, 0 }, d3[2] = { -1, 4 };
static const float *const three[3] = { d1, d2, d3 };
static const uint64_t ex3[3] = { 1, 2, 1 };
static float scratch[64];

static bool near2(const float *w, double a, double b) { return fabs(w[0] - a) < TOL && fabs(w[1] - b) < TOL; }

/* One or more rounds of kind (default parameters but those given) from w = [10, 20]. */
static void run(FedParams p, int rounds, const float *const *u, const uint64_t *ex, size_t n, float *w) {
        float state[4] = { 0 };
        w[0] = 10, w[1] = 20;
        for (int r = 0; r < rounds; r++)
                (void) fed_aggregate(&p, w, state, 2, u, ex, n, NULL, scratch);
}

int main(void) {
        FedParams p;
        float w[2];

        /* FedAvg, eta 1: w + D = [11.5, 20.5]. */
        fed_params_default(FED_AVG, &p);
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 11.5, 20.5), "FedAvg: w + the example-weighted mean (%g, %g)", w[0], w[1]);

        /* FedAvgM, beta 0.9: m1 = D, w1 = [11.5, 20.5]; m2 = 0.9 D + D = [2.85, 0.95], w2 = [14.35, 21.45]. */
        fed_params_default(FED_AVGM, &p);
        run(p, 2, three, ex3, 3, w);
        CHECK(near2(w, 14.35, 21.45), "FedAvgM: server momentum over two rounds (%g, %g)", w[0], w[1]);

        /* FedAdam, eta 0.1, b1 0.9, b2 0.99: m = 0.1 D = [0.15, 0.05], v = 0.01 D^2 =
         * [0.0225, 0.0025], sqrt(v) = [0.15, 0.05]: w += 0.1 m / sqrt(v) = [0.1, 0.1]. */
        fed_params_default(FED_ADAM, &p);
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 10.1, 20.1), "FedAdam: one normalised step of eta (%g, %g)", w[0], w[1]);

        /* FedYogi, eta 0.01, tau 1e-3: m as Adam's; v = 0 - 0.01 D^2 sign(0 - D^2) = [0.0225, 0.0025];
         * w += 0.01 [0.15 / 0.151, 0.05 / 0.051] = [0.009933775, 0.009803922]. */
        fed_params_default(FED_YOGI, &p);
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 10.009933775, 20.009803922), "FedYogi: its sign rule and tau (%g, %g)", w[0], w[1]);
        /* Round 2, an update of D/2: where D^2 > v Yogi adds (1 - b2) D^2 to v without decaying it. */
        {
                float state[4] = { 0 }, h1[2] = { 0.5f, -1 }, h2[2] = { 1.5f, 0 }, h3[2] = { -0.5f, 2 };
                const float *const half[3] = { h1, h2, h3 };
                w[0] = 10, w[1] = 20;
                (void) fed_aggregate(&p, w, state, 2, three, ex3, 3, NULL, scratch);
                (void) fed_aggregate(&p, w, state, 2, half, ex3, 3, NULL, scratch);
                /* v after round 1 [0.0225, 0.0025]; round 2 D = [0.75, 0.25], D^2 = [0.5625, 0.0625] > v:
                 * sign -1, v += 0.01 D^2 = [0.028125, 0.003125]. */
                CHECK(fabs(state[2] - 0.028125) < 1e-7 && fabs(state[3] - 0.003125) < 1e-7,
                      "FedYogi: v grows by (1 - b2) D^2 where D^2 > v (%g, %g)", state[2], state[3]);
        }

        /* FedAdagrad, eta 0.1, b1 0: m = D, v = D^2, w += 0.1 D / |D| = [0.1, 0.1]. */
        fed_params_default(FED_ADAGRAD, &p);
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 10.1, 20.1), "FedAdagrad: one normalised step (%g, %g)", w[0], w[1]);

        /* Median, unweighted: [-1, 1, 3] -> 1 and [-2, 0, 4] -> 0; of two clients the mean of both. */
        fed_params_default(FED_MEDIAN, &p);
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 11, 20), "median: coordinate by coordinate (%g, %g)", w[0], w[1]);
        run(p, 1, three, ex3, 2, w);
        CHECK(near2(w, 12, 19), "median of an even count: the mean of the middle two (%g, %g)", w[0], w[1]);

        /* One bad client among five: d4 = [1000, -1000], d5 = [2, 2]. Trimmed mean, trim 0.2 (k = 1):
         * [-1, 1, 2, 3, 1000] -> mean(1, 2, 3) = 2; [-1000, -2, 0, 2, 4] -> mean(-2, 0, 2) = 0. */
        const float d4[2] = { 1000, -1000 }, d5[2] = { 2, 2 };
        const float *const five[5] = { d1, d2, d3, d4, d5 };
        const uint64_t ex5[5] = { 1, 1, 1, 1, 1 };
        fed_params_default(FED_TRIMMED_MEAN, &p);
        p.trim = 0.2f;
        run(p, 1, five, ex5, 5, w);
        CHECK(near2(w, 12, 20), "trimmed mean drops the outlier at both ends (%g, %g)", w[0], w[1]);
        fed_params_default(FED_MEDIAN, &p);
        run(p, 1, five, ex5, 5, w);
        CHECK(near2(w, 12, 20), "median ignores it too (%g, %g)", w[0], w[1]);
        fed_params_default(FED_AVG, &p);
        run(p, 1, five, ex5, 5, w);
        CHECK(w[0] > 200 && w[1] < -150, "while FedAvg is dragged away by it (%g, %g)", w[0], w[1]);
        fed_params_default(FED_TRIMMED_MEAN, &p);
        p.trim = 0;
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 11, 20.6666667), "trim 0 is the plain unweighted mean (%g, %g)", w[0], w[1]);

        /* Private rounds: unweighted mean plus z C noise over n. With C 5 (no
         * update is above it: |d3| = 4.12), no noise: ([1,-2] + [3,0] + [-1,4]) / 3
         * = [1, 2/3]; with z 0.5 and draws [2, -1]: + 0.5 x 5 x [2, -1] / 3
         * = [1 + 5/3, 2/3 - 2.5/3] = [2.6667, -0.1667]. */
        fed_params_default(FED_AVG, &p);
        p.dp_clip = 5;
        run(p, 1, three, ex3, 3, w);
        CHECK(near2(w, 11, 20 + 2.0 / 3), "dp, no noise: the unweighted mean, examples ignored (%g, %g)", w[0], w[1]);
        {
                const float draws[2] = { 2, -1 };
                float st[4] = { 0 };
                p.dp_noise = 0.5f;
                w[0] = 10, w[1] = 20;
                (void) fed_aggregate(&p, w, st, 2, three, ex3, 3, draws, scratch);
                CHECK(near2(w, 10 + 1 + 5.0 / 3, 20 + 2.0 / 3 - 2.5 / 3), "dp: noise z C N / n on the mean (%g, %g)",
                      w[0], w[1]);
                /* FedAdam on a private round takes the noised D like any other. */
                fed_params_default(FED_ADAM, &p);
                p.dp_clip = 5, p.dp_noise = 0.5f;
                memset(st, 0, sizeof st);
                w[0] = 10, w[1] = 20;
                (void) fed_aggregate(&p, w, st, 2, three, ex3, 3, draws, scratch);
                /* m = 0.1 D, v = 0.01 D^2: step 0.1 x 0.1 D / (0.1 |D|) = 0.1 sign(D). */
                CHECK(near2(w, 10.1, 19.9), "dp + fedadam: the step follows the noised mean (%g, %g)", w[0], w[1]);
        }
        CHECK(fabs(fed_norm2(d3, 2) - sqrt(17.0)) < 1e-9, "fed_norm2: |[-1, 4]| = sqrt 17");

        /* Refusals: nothing changes. */
        float bad[2] = { 1, NAN };
        const float *const withnan[2] = { d1, bad };
        const uint64_t ex2[2] = { 1, 1 }, none[3] = { 0, 0, 0 };
        float state[4] = { 0 };
        fed_params_default(FED_ADAM, &p);
        w[0] = 10, w[1] = 20;
        CHECK(fed_aggregate(&p, w, state, 2, withnan, ex2, 2, NULL, scratch) == -EINVAL && near2(w, 10, 20) &&
              state[0] == 0 && state[2] == 0, "an update with NaN is refused and changes nothing");
        fed_params_default(FED_AVG, &p);
        CHECK(fed_aggregate(&p, w, NULL, 2, three, none, 3, NULL, scratch) == -EINVAL && near2(w, 10, 20),
              "no examples at all: refused");
        CHECK(fed_aggregate(&p, w, NULL, 2, three, ex3, 0, NULL, scratch) == -EINVAL, "no update: refused");

        /* Names, state sizes, parameter checks. */
        bool names = true;
        for (int k = FED_AVG; k <= FED_LAST; k++) {
                FedStrategy back;
                names &= fed_strategy_from_string(fed_strategy_name((FedStrategy) k), &back) == 0 &&
                         back == (FedStrategy) k;
        }
        FedStrategy x;
        CHECK(names && fed_strategy_from_string("fedsgd", &x) == -EINVAL, "every strategy's name reads back");
        CHECK(fed_state_per_value(FED_AVG) == 0 && fed_state_per_value(FED_AVGM) == 1 &&
              fed_state_per_value(FED_ADAM) == 2 && fed_state_per_value(FED_MEDIAN) == 0,
              "server state per value: 0, 1 (momentum), 2 (m and v)");
        char err[128];
        bool ok = true;
        for (int k = FED_AVG; k <= FED_TRIMMED_MEAN; k++) {
                fed_params_default((FedStrategy) k, &p);
                ok &= fed_params_check(&p, err, sizeof err) == 0;
        }
        CHECK(ok, "every default passes its own check");
        fed_params_default(FED_TRIMMED_MEAN, &p);
        p.trim = 0.5f;
        CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL && strstr(err, "trim"), "trim 0.5 refused (%s)", err);
        fed_params_default(FED_ADAM, &p);
        p.tau = 0;
        CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL && strstr(err, "tau"), "tau 0 refused (%s)", err);
        p.tau = 1e-9f;
        p.eta = NAN;
        CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL, "a NaN server lr refused (%s)", err);
        fed_params_default(FED_AVG, &p);
        p.dp_noise = 1;
        CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL && strstr(err, "--dp-clip"),
              "noise without a clip norm refused (%s)", err);
        fed_params_default(FED_MEDIAN, &p);
        p.dp_clip = 1;
        CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL && strstr(err, "robust"),
              "dp with a robust strategy refused (%s)", err);
        fed_params_default(FED_AVG, &p);
        p.dp_clip = -1;
        CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL, "a negative clip norm refused (%s)", err);
        {
                /* Krum by hand: five updates on a line, 0, 1, 2, 3 and 100; byzantine
                 * 0.2 -> f = 1, each score sums the n - f - 2 = 2 nearest squared
                 * distances: 0: 1 + 4 = 5, 1: 1 + 1 = 2, 2: 1 + 1 = 2, 3: 1 + 4 = 5,
                 * 100: 97^2 + 98^2 = 19013. Krum keeps update 1 (the lower of the
                 * tie), Multi-Krum the m = 4 best: all but 100. */
                const double x[5] = { 0, 1, 2, 3, 100 };
                double d2[25], scratch[5], scores[5];
                unsigned char keep[5];
                for (int i = 0; i < 5; i++)
                        for (int j = 0; j < 5; j++)
                                d2[i * 5 + j] = (x[i] - x[j]) * (x[i] - x[j]);
                fed_params_default(FED_KRUM, &p);
                size_t kept = fed_krum_select(&p, d2, 5, scratch, scores, keep);
                CHECK(kept == 1 && keep[1] && !keep[0] && !keep[2] && !keep[3] && !keep[4] && scores[0] == 5 &&
                              scores[1] == 2 && scores[2] == 2 && scores[3] == 5 && scores[4] == 19013,
                      "krum: scores 5 2 2 5 19013 by hand, keeps update 1 (%g %g %g %g %g)", scores[0], scores[1],
                      scores[2], scores[3], scores[4]);
                fed_params_default(FED_MULTIKRUM, &p);
                kept = fed_krum_select(&p, d2, 5, scratch, scores, keep);
                CHECK(kept == 4 && keep[0] && keep[1] && keep[2] && keep[3] && !keep[4],
                      "multi-krum keeps n - f = 4, all but the outlier");
                p.byzantine = 0;
                kept = fed_krum_select(&p, d2, 5, scratch, scores, keep);
                CHECK(kept == 5, "multi-krum with byzantine 0 keeps every update (%zu)", kept);
                CHECK(fed_krum_select(&p, d2, 1, scratch, scores, keep) == 1 && keep[0], "one update is kept");
                /* The shards take the mean of what pscoord kept: unweighted. */
                float w[1] = { 0 }, u0[1] = { 1 }, u1[1] = { 3 }, sc[5];
                const float *ups[2] = { u0, u1 };
                const uint64_t ex[2] = { 1, 100 };
                fed_params_default(FED_MULTIKRUM, &p);
                int ra = fed_aggregate(&p, w, NULL, 1, ups, ex, 2, NULL, sc);
                CHECK(ra == 0 && w[0] == 2.0f, "multi-krum's step: the unweighted mean of the updates kept (%g)",
                      (double) w[0]);
                p.byzantine = 0.5f;
                CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL && strstr(err, "--byzantine"),
                      "byzantine 0.5 refused (%s)", err);
                fed_params_default(FED_KRUM, &p);
                p.dp_clip = 1;
                CHECK(fed_params_check(&p, err, sizeof err) == -EINVAL, "dp with krum refused (%s)", err);
        }
        return tap_done();
}
