/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/data/dataset.c: data sets from NumPy pairs written
 * here as numpy.save lays them out (x_train.npy, y_train.npy, x_test.npy,
 * y_test.npy): float32 features kept as they are, uint8 scaled to [0, 1],
 * labels of int64, int32 and uint8, a sample's shape and the classes; the
 * limit and part selection; each refusal naming the file and what is wrong
 * (feature and label types and shapes, counts that differ, NaN and infinite
 * features, negative labels, a missing labels file); and the check of a
 * model's input and classes against the data. */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dataset.h"
#include "tap.h"

static char tmpdir[] = "/tmp/psnet-test-dataset-XXXXXX";

static const char *path_in(const char *sub, const char *name) {
        static char buf[4][512];
        static int next;
        char *p = buf[next++ % 4];
        snprintf(p, sizeof buf[0], "%s/%s%s%s", tmpdir, sub, *name ? "/" : "", name);
        return p;
}

/* Writes sub/name as an .npy file (format 1.0) of type descr ('<f4', '|u1',
 * '<i8', ...) and shape text ("(4, 2, 3)") over len bytes of data. */
static bool write_npy(const char *sub, const char *name, const char *descr, const char *shape, const void *data,
                      size_t len) {
        char dir[512], h[256];
        snprintf(dir, sizeof dir, "%s", path_in(sub, ""));
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return false;
        int hl = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
        size_t pad = (64 - (10 + (size_t) hl + 1) % 64) % 64, hlen = (size_t) hl + 1 + pad;
        FILE *f = fopen(path_in(sub, name), "wb");
        if (!f)
                return false;
        uint8_t pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t) hlen, (uint8_t) (hlen >> 8) };
        bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(h, 1, (size_t) hl, f) == (size_t) hl;
        for (size_t i = 0; ok && i < pad; i++)
                ok = fputc(' ', f) != EOF;
        ok = ok && fputc('\n', f) != EOF && (len == 0 || fwrite(data, 1, len, f) == len);
        return fclose(f) == 0 && ok;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
        (void) sb, (void) flag, (void) ftw;
        return remove(p);
}

/* A directory whose train split is x (float32 [6, 2, 3], value i*10 + k) and
 * labels y (int64, (i * 3) % 5), and test split uint8 [2, 2, 3] with uint8
 * labels. */
static bool write_good(const char *sub) {
        float x[36];
        int64_t y[6];
        uint8_t xt[12], yt[2] = { 4, 1 };
        for (int i = 0; i < 6; i++) {
                y[i] = (i * 3) % 5;
                for (int k = 0; k < 6; k++)
                        x[i * 6 + k] = (float) (i * 10 + k) - 0.5f;
        }
        for (int k = 0; k < 12; k++)
                xt[k] = (uint8_t) (k * 20);
        return write_npy(sub, "x_train.npy", "<f4", "(6, 2, 3)", x, sizeof x) &&
               write_npy(sub, "y_train.npy", "<i8", "(6,)", y, sizeof y) &&
               write_npy(sub, "x_test.npy", "|u1", "(2, 2, 3)", xt, sizeof xt) &&
               write_npy(sub, "y_test.npy", "|u1", "(2,)", yt, sizeof yt);
}

/* Loads the train split of sub: the status; the reason in err. */
static int load(const char *sub, const char *set, Dataset **d, char *err, size_t n) {
        *d = NULL;
        return dataset_load(path_in(sub, ""), set, 0, 0, 1, d, err, n);
}

/* A train split of x (descr, shape, bytes) and labels (descr, shape, bytes)
 * is refused with -EBADMSG and a reason naming file and holding want. */
static void refused(const char *what, const char *xd, const char *xs, const void *x, size_t xl, const char *yd,
                    const char *ys, const void *y, size_t yl, const char *file, const char *want) {
        static int k;
        char sub[32], err[512];
        snprintf(sub, sizeof sub, "bad%d", k++);
        Dataset *d;
        if (!CHECK(write_npy(sub, "x_train.npy", xd, xs, x, xl) && write_npy(sub, "y_train.npy", yd, ys, y, yl),
                   "%s: files written", what))
                return;
        int r = load(sub, "train", &d, err, sizeof err);
        CHECK(r == -EBADMSG && d == NULL && strstr(err, file) && strstr(err, want), "%s: refused (%d) '%s'", what, r,
              err);
}

int main(void) {
        char err[512];
        Dataset *d = NULL;
        if (!mkdtemp(tmpdir)) {
                printf("Bail out! mkdtemp: %s\n", strerror(errno));
                return 1;
        }

        /* float32 features as they are, int64 labels, the sample's shape. */
        CHECK(write_good("good"), "a NumPy data set written");
        int r = load("good", "train", &d, err, sizeof err);
        bool exact = d != NULL;
        for (int i = 0; exact && i < 36; i++)
                exact = d->x[i] == (float) ((i / 6) * 10 + i % 6) - 0.5f;
        CHECK(r == 0 && d && d->n == 6 && d->shape.rank == 2 && d->shape.d[0] == 2 && d->shape.d[1] == 3 && d->dim == 6 &&
              exact && d->y[5] == 0 && d->y[3] == 4 && d->classes == 5,
              "train: 6 samples of [2, 3] float32 kept as they are, int64 labels, 5 classes (r=%d %s)", r, err);
        Dataset *test = NULL;
        r = load("good", "test", &test, err, sizeof err);
        float s0[6] = { 1 }, s1[6] = { 0 };
        if (r == 0 && test && test->n == 2 && test->dim == 6) {
                dataset_sample(test, 0, s0);
                dataset_sample(test, 1, s1);
        }
        CHECK(r == 0 && test && test->n == 2 && test->dim == 6 && !test->x && test->px && s1[5] == 220.0f / 255.0f &&
              s0[0] == 0.0f && test->y[0] == 4 && test->classes == 5,
              "test: uint8 features kept as bytes, read scaled to [0, 1], uint8 labels (r=%d %s)", r, err);
        Dataset half = test ? dataset_slice(test, 1, 1) : (Dataset) { 0 };
        float h0[6] = { 0 };
        if (half.n == 1)
                dataset_sample(&half, 0, h0);
        CHECK(half.n == 1 && half.y[0] == test->y[1] && memcmp(h0, s1, sizeof h0) == 0,
              "dataset_slice: sample 1 as a set of its own");
        float scratch[12];
        const float *both = test ? dataset_samples(test, 0, 2, scratch) : NULL;
        CHECK(both == scratch && memcmp(both, s0, sizeof s0) == 0 && memcmp(both + 6, s1, sizeof s1) == 0,
              "dataset_samples writes bytes as floats into the scratch buffer");
        CHECK(d && dataset_samples(d, 2, 1, scratch) == d->x + 12,
              "and hands floats over where they are kept");

        /* The model's input and classes against the data. */
        if (d && test) {
                CHECK(dataset_check_model(d, test, 6, 5, err, sizeof err) == 0, "a model of 6 values and 5 classes fits");
                CHECK(dataset_check_model(d, test, 6, 10, err, sizeof err) == 0, "one of 10 classes too");
                r = dataset_check_model(d, test, 6, 4, err, sizeof err);
                CHECK(r == -EINVAL && strstr(err, "4 classes") && strstr(err, "labels 0..4"),
                      "4 classes for labels up to 4: refused '%s'", err);
                r = dataset_check_model(d, test, 784, 10, err, sizeof err);
                CHECK(r == -EINVAL && strstr(err, "784 values") && strstr(err, "[2, 3] (6 values)"),
                      "784 values for samples of 6: refused '%s'", err);
                test->shape.d[0] = 3, test->shape.d[1] = 2;
                r = dataset_check_model(d, test, 6, 10, err, sizeof err);
                CHECK(r == -EINVAL && strstr(err, "[2, 3]") && strstr(err, "[3, 2]"),
                      "test samples of another shape: refused '%s'", err);
        }
        test = dataset_free(test);
        d = dataset_free(d);

        /* limit and part, as for IDX files. */
        r = dataset_load(path_in("good", ""), "train", 5, 1, 2, &d, err, sizeof err);
        CHECK(r == 0 && d && d->n == 2 && d->x[0] == 9.5f && d->x[6] == 29.5f && d->y[1] == 4,
              "limit 5, part 1 of 2: samples 1 and 3 (r=%d %s)", r, err);
        d = dataset_free(d);
        r = dataset_load(path_in("good", ""), "train", 1, 1, 2, &d, err, sizeof err);
        CHECK(r == -EINVAL && d == NULL && strstr(err, "none of the 1"), "a part with no samples: '%s'", err);
        r = dataset_load(path_in("good", ""), "validation", 0, 0, 1, &d, err, sizeof err);
        CHECK(r == -EINVAL && strstr(err, "validation"), "an unknown split: '%s'", err);

        /* Refusals, each naming the file and the reason. */
        float f6[6] = { 0, 1, 2, 3, 4, 5 }, fnan[6] = { 0, 1, 2, NAN, 4, 5 }, finf[6] = { 0, 1, 2, 3, INFINITY, 5 };
        int32_t i3[3] = { 0, 1, 2 }, ineg[3] = { 0, -1, 2 }, i6[6] = { 0 };
        refused("int32 features", "<i4", "(3, 2)", i6, sizeof i6, "<i4", "(3,)", i3, sizeof i3, "x_train.npy",
                "features are int32");
        refused("1-d features", "<f4", "(6,)", f6, sizeof f6, "<i4", "(6,)", i6, sizeof i6, "x_train.npy",
                "expected [N, D]");
        refused("5-d features", "<f4", "(3, 1, 1, 1, 2)", f6, sizeof f6, "<i4", "(3,)", i3, sizeof i3,
                "x_train.npy", "expected [N, D]");
        refused("float labels", "<f4", "(3, 2)", f6, sizeof f6, "<f4", "(3,)", f6, 12, "y_train.npy",
                "labels are float32");
        refused("2-d labels", "<f4", "(3, 2)", f6, sizeof f6, "<i4", "(3, 2)", i6, sizeof i6, "y_train.npy",
                "of shape [N]");
        refused("3 samples, 6 labels", "<f4", "(3, 2)", f6, sizeof f6, "<i4", "(6,)", i6, sizeof i6, "x_train.npy",
                "3 samples but");
        refused("a NaN feature", "<f4", "(3, 2)", fnan, sizeof fnan, "<i4", "(3,)", i3, sizeof i3, "x_train.npy",
                "value 1 of sample 1 is NaN");
        refused("an infinite feature", "<f4", "(3, 2)", finf, sizeof finf, "<i4", "(3,)", i3, sizeof i3,
                "x_train.npy", "value 0 of sample 2 is infinite");
        refused("a negative label", "<f4", "(3, 2)", f6, sizeof f6, "<i4", "(3,)", ineg, sizeof ineg, "y_train.npy",
                "label -1 of sample 1");
        refused("empty samples", "<f4", "(3, 0)", NULL, 0, "<i4", "(3,)", i3, sizeof i3, "x_train.npy",
                "hold 0 values");

        /* Features without labels: the missing file named. */
        CHECK(write_npy("nolabels", "x_train.npy", "<f4", "(3, 2)", f6, sizeof f6), "features alone written");
        r = load("nolabels", "train", &d, err, sizeof err);
        CHECK(r == -ENOENT && strstr(err, "y_train.npy"), "no labels file: -ENOENT naming it '%s'", err);
        /* x_train.npy decides the layout: a test split missing is named too. */
        r = load("nolabels", "test", &d, err, sizeof err);
        CHECK(r == -ENOENT && strstr(err, "x_test.npy"), "no test split: -ENOENT naming it '%s'", err);
        /* Neither layout: both are named. */
        r = load("nothing", "train", &d, err, sizeof err);
        CHECK(r == -ENOENT && strstr(err, "x_train.npy") && strstr(err, "train-images-idx3-ubyte.gz"),
              "no data: both layouts named '%s'", err);

        if (nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS) < 0)
                printf("# failed to remove %s\n", tmpdir);
        return tap_done();
}
