/* SPDX-License-Identifier: Apache-2.0 */
/* Data sets in memory; see dataset.h. NumPy pairs are read whole with
 * npy.c, then checked (types, shapes, labels, finite features) before the
 * samples this process keeps are converted. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "alloc.h"
#include "dataset.h"
#include "idx.h"
#include "macro.h"
#include "npy.h"

/* An array's shape as text, "[60000, 1, 28, 28]". */
static void shape_text(const NpyArray *a, char *buf, size_t n) {
        size_t k = (size_t) snprintf(buf, n, "[");
        for (unsigned i = 0; i < a->ndim && k < n; i++)
                k += (size_t) snprintf(buf + k, n - k, "%s%lu", i ? ", " : "", (unsigned long) a->shape[i]);
        if (k < n)
                (void) snprintf(buf + k, n - k, "]");
}

static int64_t label_at(const NpyArray *y, uint64_t i) {
        switch (y->type) {
        case NPY_I32: return ((const int32_t *) y->data)[i];
        case NPY_I64: return ((const int64_t *) y->data)[i];
        case NPY_U8: return ((const uint8_t *) y->data)[i];
        default: return -1;
        }
}

static int npy_load(const char *dir, const char *set, uint32_t limit, uint32_t part, uint32_t nparts,
                    Dataset **ret, char *err, size_t errlen) {
        char xp[PATH_MAX], yp[PATH_MAX], shape[64];
        if ((size_t) snprintf(xp, sizeof xp, "%s/x_%s.npy", dir, set) >= sizeof xp ||
            (size_t) snprintf(yp, sizeof yp, "%s/y_%s.npy", dir, set) >= sizeof yp) {
                snprintf(err, errlen, "data directory path too long: %s", dir);
                return -ENAMETOOLONG;
        }
        NpyArray x = { 0 }, y = { 0 };
        Dataset *d = NULL;
        int r = npy_read(xp, 0, &x, err, errlen);
        if (r >= 0)
                r = npy_read(yp, 0, &y, err, errlen);
        if (r < 0)
                goto out;
        r = -EBADMSG;
        if (x.type != NPY_F32 && x.type != NPY_U8) {
                snprintf(err, errlen, "%s: features are %s; psnet reads float32 or uint8", xp, npy_type_name(x.type));
                goto out;
        }
        MdShape sshape = { .rank = x.ndim - 1 };
        if (x.ndim < 2 || sshape.rank > ELEMENTSOF(sshape.d)) {
                shape_text(&x, shape, sizeof shape);
                snprintf(err, errlen, "%s: features of shape %s; expected [N, D], [N, H, W] or [N, C, H, W]", xp,
                         shape);
                goto out;
        }
        if (y.type == NPY_F32 || y.ndim != 1) {
                shape_text(&y, shape, sizeof shape);
                snprintf(err, errlen, "%s: labels are %s of shape %s; expected int32, int64 or uint8 of shape [N]",
                         yp, npy_type_name(y.type), shape);
                goto out;
        }
        if (x.shape[0] != y.shape[0]) {
                snprintf(err, errlen, "%s holds %lu samples but %s %lu labels", xp, (unsigned long) x.shape[0], yp,
                         (unsigned long) y.shape[0]);
                goto out;
        }
        if (x.shape[0] > UINT32_MAX - 1) {
                snprintf(err, errlen, "%s: %lu samples, more than psnet handles (%u)", xp,
                         (unsigned long) x.shape[0], UINT32_MAX - 1);
                goto out;
        }
        uint64_t dim = 1;
        for (unsigned i = 1; i < x.ndim; i++) {
                dim *= x.shape[i];
                sshape.d[i - 1] = (uint32_t) MIN(x.shape[i], (uint64_t) UINT32_MAX);
        }
        if (dim == 0 || dim > DATASET_MAX_DIM) {
                shape_text(&x, shape, sizeof shape);
                snprintf(err, errlen, "%s: samples of shape %s hold %lu values each; psnet takes 1 to %u", xp, shape,
                         (unsigned long) dim, DATASET_MAX_DIM);
                goto out;
        }
        uint32_t total, count = dataset_part_count((uint32_t) x.shape[0], limit, part, nparts, &total);
        if (count == 0) {
                snprintf(err, errlen, "%s: part %u of %u gets none of the %u samples", xp, part, nparts, total);
                r = -EINVAL;
                goto out;
        }
        d = dataset_new(count, &sshape, x.type == NPY_U8);
        if (d)
                d->format = "npy";
        if (!d) {
                snprintf(err, errlen, "out of memory loading %s (%u samples of %lu values)", xp, count,
                         (unsigned long) dim);
                r = -ENOMEM;
                goto out;
        }
        for (uint32_t i = 0; i < count; i++) {
                uint64_t src = (uint64_t) part + (uint64_t) i * nparts;
                int64_t label = label_at(&y, src);
                if (label < 0 || label > INT32_MAX) {
                        snprintf(err, errlen, "%s: label %ld of sample %lu is not a class index (0 or more)", yp,
                                 (long) label, (unsigned long) src);
                        goto out;
                }
                d->y[i] = (int32_t) label;
                d->classes = MAX(d->classes, (uint32_t) label + 1);
                if (x.type == NPY_U8) {
                        memcpy(d->px + (size_t) i * d->dim, (const uint8_t *) x.data + src * dim, dim);
                        continue;
                }
                float *dst = d->x + (size_t) i * d->dim;
                memcpy(dst, (const float *) x.data + src * dim, dim * sizeof(float));
                for (uint64_t k = 0; k < dim; k++)
                        if (!isfinite(dst[k])) {
                                snprintf(err, errlen, "%s: value %lu of sample %lu is %s", xp, (unsigned long) k,
                                         (unsigned long) src, isnan(dst[k]) ? "NaN" : "infinite");
                                goto out;
                        }
        }
        *ret = d;
        d = NULL;
        r = 0;
out:
        dataset_free(d);
        npy_free(&x);
        npy_free(&y);
        return r;
}

int dataset_load_picked(const char *dir, const char *set, uint32_t limit, DatasetPickFn pick, void *ud,
                        Dataset **ret, char *err, size_t errlen) {
        char dummy[1], probe[PATH_MAX];
        if (!err || errlen == 0) {
                err = dummy;
                errlen = sizeof dummy;
        }
        err[0] = '\0';
        if (!dir || !set || (strcmp(set, "train") != 0 && strcmp(set, "test") != 0) || !ret || !pick) {
                snprintf(err, errlen, "invalid data set request (set %s)", set ? set : "(null)");
                return -EINVAL;
        }
        if ((size_t) snprintf(probe, sizeof probe, "%s/x_train.npy", dir) >= sizeof probe ||
            access(probe, F_OK) != 0)
                return idx_dataset_load_picked(dir, strcmp(set, "test") == 0 ? "t10k" : "train", limit, pick, ud, ret,
                                               err, errlen);
        Dataset *d = NULL;
        uint32_t *idx = NULL, n = 0;
        int r = npy_load(dir, set, limit, 0, 1, &d, err, errlen);
        if (r == 0 && (r = pick(d->y, d->n, ud, &idx, &n)) < 0)
                snprintf(err, errlen, "%s/x_%s.npy: choosing this client's samples: %s", dir, set, strerror(-r));
        if (r == 0 && n == 0) {
                snprintf(err, errlen, "%s/x_%s.npy: none of the %u samples is this client's", dir, set, d->n);
                r = -EINVAL;
        }
        if (r == 0 && (r = dataset_keep(d, idx, n)) < 0)
                snprintf(err, errlen, "%s/x_%s.npy: the samples chosen are not ascending indices below %u", dir, set,
                         d->n);
        ps_free(idx);
        if (r < 0) {
                dataset_free(d);
                return r;
        }
        *ret = d;
        return 0;
}

int dataset_load(const char *dir, const char *set, uint32_t limit, uint32_t part,
                 uint32_t nparts, Dataset **ret, char *err, size_t errlen) {
        char dummy[1], probe[PATH_MAX];

        if (!err || errlen == 0) {
                err = dummy;
                errlen = sizeof dummy;
        }
        err[0] = '\0';
        if (!dir || !set || (strcmp(set, "train") != 0 && strcmp(set, "test") != 0) || !ret || nparts == 0 ||
            part >= nparts) {
                snprintf(err, errlen, "invalid data set request (set %s, part %u of %u)",
                         set ? set : "(null)", part, nparts);
                return -EINVAL;
        }
        /* The train split's features decide the layout of both splits. */
        if ((size_t) snprintf(probe, sizeof probe, "%s/x_train.npy", dir) < sizeof probe && access(probe, F_OK) == 0)
                return npy_load(dir, set, limit, part, nparts, ret, err, errlen);
        return idx_dataset_load(dir, strcmp(set, "test") == 0 ? "t10k" : "train", limit, part, nparts, ret, err,
                                errlen);
}

int dataset_check_model(const Dataset *train, const Dataset *test, uint32_t in_numel, uint32_t classes, char *err,
                        size_t errlen) {
        char a[64], b[64];
        md_shape_string(&train->shape, a, sizeof a);
        if (test && (test->shape.rank != train->shape.rank ||
                     memcmp(test->shape.d, train->shape.d, train->shape.rank * sizeof(uint32_t)))) {
                md_shape_string(&test->shape, b, sizeof b);
                snprintf(err, errlen, "the training samples are %s but the test samples %s", a, b);
                return -EINVAL;
        }
        uint32_t have = MAX(train->classes, test ? test->classes : 0);
        if (train->dim != in_numel || have > classes) {
                snprintf(err, errlen, "it takes %u values a sample and gives %u classes; the data's samples are %s "
                         "(%u values) with labels 0..%u", in_numel, classes, a, train->dim, have ? have - 1 : 0);
                return -EINVAL;
        }
        return 0;
}
