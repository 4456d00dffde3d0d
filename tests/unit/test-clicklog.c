/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/data/clicklog.c, synthetic click logs with a planted
 * model: AUC against its definition (every positive-negative pair, ties a
 * half) on data with ties, log loss at known points; Zipf frequencies of the
 * written ids against the distribution's own (rank 1's share 1/H(n, s)),
 * within five standard deviations; the test set's logit.npy equal to the
 * planted model recomputed from sparse.npy and the per-id weights, the printed
 * best AUC that of those logits; the same files for the same seed, other ones
 * for another; ids of a 10^8 vocabulary; refusals with the field named. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "clicklog.h"
#include "npy.h"
#include "tap.h"

static char dir[64];

static void check_metrics(void) {
        enum { N = 500 };
        float s[N];
        uint8_t y[N];
        unsigned x = 12345;
        for (int i = 0; i < N; i++) {
                x = x * 1103515245u + 12345u;
                s[i] = (float) ((x >> 16) % 40); /* many ties */
                x = x * 1103515245u + 12345u;
                y[i] = (x >> 16) % 3 == 0 || s[i] > 30;
        }
        double pairs = 0, wins = 0;
        for (int i = 0; i < N; i++)
                for (int j = 0; j < N; j++)
                        if (y[i] && !y[j]) {
                                pairs++;
                                wins += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
                        }
        double want = wins / pairs, got = auc(s, y, N);
        CHECK(fabs(got - want) < 1e-12, "auc %.12f against every pair counted %.12f (ties a half)", got, want);
        float a[4] = { 0.1f, 0.2f, 0.3f, 0.4f };
        uint8_t up[4] = { 0, 0, 1, 1 }, down[4] = { 1, 1, 0, 0 }, one[4] = { 1, 1, 1, 1 };
        CHECK(auc(a, up, 4) == 1.0 && auc(a, down, 4) == 0.0 && isnan(auc(a, one, 4)),
              "auc: 1 when separated, 0 reversed, NaN with one class");
        float z[2] = { 0, 0 };
        CHECK(fabs(logloss_of_logits(z, up, 2) - log(2.0)) < 1e-12, "log loss at logit 0: ln 2");
        float big[2] = { 40, -40 };
        uint8_t right[2] = { 1, 0 };
        CHECK(logloss_of_logits(big, right, 2) < 1e-15 && isfinite(logloss_of_logits(big, down, 2)),
              "log loss: ~0 when sure and right, finite when sure and wrong (%g)", logloss_of_logits(big, down, 2));
}

static ClickConf small(uint64_t seed) {
        ClickConf c = { .train_rows = 20000, .test_rows = 5000, .fields = 3, .vocab = { 1000, 50, 100000000 },
                        .dense = 0, .zipf = 1.1, .weight_sd = 0.7, .bias = -1.5, .missing = 0.05, .seed = seed };
        return c;
}

static bool read_npy(const char *split, const char *name, NpyArray *a) {
        char path[160], err[256];
        snprintf(path, sizeof path, "%s/%s/%s.npy", dir, split, name);
        int r = npy_read(path, 0, a, err, sizeof err);
        if (r < 0)
                CHECK(false, "read %s (%s)", path, err);
        return r == 0;
}

static void check_data(void) {
        ClickConf c = small(7);
        ClickSummary s;
        char err[256] = "";
        int r = clicklog_write(&c, dir, &s, err, sizeof err);
        CHECK(r == 0, "a click log written (%s)", err);
        NpyArray sp = { 0 }, lab = { 0 }, tsp = { 0 }, tlab = { 0 }, lg = { 0 };
        if (r < 0 || !read_npy("train", "sparse", &sp) || !read_npy("train", "label", &lab) ||
            !read_npy("test", "sparse", &tsp) || !read_npy("test", "label", &tlab) || !read_npy("test", "logit", &lg))
                return;
        CHECK(sp.type == NPY_I64 && sp.ndim == 2 && sp.shape[0] == 20000 && sp.shape[1] == 3 && lab.type == NPY_U8 &&
                      lab.shape[0] == 20000 && tsp.shape[0] == 5000 && lg.type == NPY_F32 && lg.shape[0] == 5000,
              "files of the stated types and shapes");

        /* Field 0 (1,000 ids, s = 1.1): rank 1's share of the present values is 1/H. */
        double h = 0;
        for (int k = 1; k <= 1000; k++)
                h += pow(k, -1.1);
        const int64_t *ids = sp.data;
        int64_t top = clicklog_id(&c, 0, 1);
        double present = 0, hits = 0, missing = 0;
        bool in_range = true;
        for (uint64_t i = 0; i < 20000; i++) {
                for (int f = 0; f < 3; f++) {
                        int64_t id = ids[i * 3 + f];
                        missing += id == -1;
                        in_range = in_range && id >= -1;
                }
                present += ids[i * 3] != -1;
                hits += ids[i * 3] == top;
        }
        double p = 1.0 / h, sd = sqrt(present * p * (1 - p));
        CHECK(fabs(hits - present * p) < 5 * sd, "Zipf(1.1) over 1,000 ids: rank 1 in %.0f of %.0f rows (expected %.0f)",
              hits, present, present * p);
        CHECK(fabs(missing / 60000 - 0.05) < 0.005, "5%% of values missing, written -1 (%.4f)", missing / 60000);
        CHECK(in_range, "ids are >= 0 (or -1), a 10^8 vocabulary's too");

        /* The planted model, recomputed from the ids alone. */
        const int64_t *t = tsp.data;
        const float *l = lg.data;
        double worst = 0;
        for (uint64_t i = 0; i < 5000; i++) {
                double want = c.bias;
                for (int f = 0; f < 3; f++)
                        if (t[i * 3 + f] != -1)
                                want += clicklog_weight(&c, (uint32_t) f, t[i * 3 + f]);
                worst = fmax(worst, fabs(want - l[i]));
        }
        CHECK(worst < 1e-5, "logit.npy is the planted model of the ids (at most %g off)", worst);
        double a = auc(l, tlab.data, 5000);
        CHECK(fabs(a - s.best_auc) < 1e-12 && s.best_auc > 0.6 && s.best_auc < 0.95,
              "the best AUC printed is the planted logits' (%.4f)", s.best_auc);
        CHECK(s.click_rate > 0.1 && s.click_rate < 0.4, "a click rate of %.3f", s.click_rate);
        const uint8_t *y = lab.data;
        double ones = 0;
        for (int i = 0; i < 20000; i++)
                ones += y[i];
        CHECK(fabs(ones / 20000 - s.click_rate) < 0.02, "labels are 0 and 1 at that rate");

        /* The same seed, the same bytes; another seed, other ones. */
        char dir2[80];
        snprintf(dir2, sizeof dir2, "%s-again", dir);
        NpyArray again = { 0 };
        ClickSummary s2;
        char path[160];
        snprintf(path, sizeof path, "%s/train/sparse.npy", dir2);
        bool same = clicklog_write(&c, dir2, &s2, err, sizeof err) == 0 && npy_read(path, 0, &again, err, sizeof err) == 0 &&
                    memcmp(again.data, sp.data, 20000 * 3 * 8) == 0 && s2.best_auc == s.best_auc;
        CHECK(same, "the same seed writes the same data");
        npy_free(&again);
        c.seed = 8;
        bool other = clicklog_write(&c, dir2, &s2, err, sizeof err) == 0 && npy_read(path, 0, &again, err, sizeof err) == 0 &&
                     memcmp(again.data, sp.data, 20000 * 3 * 8) != 0;
        CHECK(other, "another seed, other data");
        npy_free(&again);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, dir2);
        CHECK(system(cmd) == 0, "cleaned up");
        npy_free(&sp);
        npy_free(&lab);
        npy_free(&tsp);
        npy_free(&tlab);
        npy_free(&lg);
}

static void check_refusals(void) {
        char err[256] = "";
        ClickConf c = small(1);
        c.fields = 0;
        CHECK(clicklog_write(&c, dir, NULL, err, sizeof err) == -EINVAL && strstr(err, "fields"),
              "no fields: refused (%s)", err);
        c = small(1);
        c.vocab[2] = 0;
        CHECK(clicklog_write(&c, dir, NULL, err, sizeof err) == -EINVAL && strstr(err, "vocabulary"),
              "an empty vocabulary: refused (%s)", err);
        c = small(1);
        c.zipf = 0;
        CHECK(clicklog_write(&c, dir, NULL, err, sizeof err) == -EINVAL && strstr(err, "Zipf"),
              "a Zipf exponent of 0: refused (%s)", err);
}

int main(void) {
        snprintf(dir, sizeof dir, "/tmp/psnet-test-clicklog.%d", (int) getpid());
        check_metrics();
        check_data();
        check_refusals();
        return tap_done();
}
