/* SPDX-License-Identifier: Apache-2.0 */
/* See clickdata.h. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "clickdata.h"
#include "macro.h"
#include "npy.h"

#define CLICK_MAX_FIELDS 1024u
#define CLICK_MAX_DENSE 65536u

ClickData *clickdata_free(ClickData *d) {
        if (d) {
                free(d->ids);
                free(d->x);
                free(d->y);
                free(d);
        }
        return NULL;
}

static int load_array(const char *dir, const char *split, const char *name, NpyArray *a, char *path, size_t plen,
                      char *err, size_t n) {
        if ((size_t) snprintf(path, plen, "%s/%s/%s", dir, split, name) >= plen) {
                snprintf(err, n, "path %s/%s/%s too long", dir, split, name);
                return -ENAMETOOLONG;
        }
        char why[256];
        int r = npy_read(path, 0, a, why, sizeof why);
        if (r < 0)
                snprintf(err, n, "%s: %s", path, why[0] ? why : strerror(-r));
        return r;
}

int clickdata_load(const char *dir, const char *split, uint64_t limit, ClickData **ret, char *err, size_t n) {
        char path[PATH_MAX];
        NpyArray ids = { 0 }, label = { 0 }, dense = { 0 };
        bool has_dense = false;
        ClickData *d = NULL;
        int r = load_array(dir, split, "sparse.npy", &ids, path, sizeof path, err, n);
        if (r < 0)
                goto out;
        if (ids.type != NPY_I64 || ids.ndim != 2 || ids.shape[1] < 1 || ids.shape[1] > CLICK_MAX_FIELDS) {
                snprintf(err, n, "%s: want int64 [N, F] with 1 <= F <= %u (one id per categorical field, -1 for a "
                         "missing value), have %s of %u dimensions", path, CLICK_MAX_FIELDS, npy_type_name(ids.type),
                         ids.ndim);
                r = -EINVAL;
                goto out;
        }
        uint64_t rows = ids.shape[0];
        if ((r = load_array(dir, split, "label.npy", &label, path, sizeof path, err, n)) < 0)
                goto out;
        if ((label.type != NPY_U8 && label.type != NPY_F32) || label.ndim != 1 || label.shape[0] != rows) {
                snprintf(err, n, "%s: want uint8 or float32 [%llu] (one 0/1 label per row of sparse.npy), have %s "
                         "of %u dimensions", path, (unsigned long long) rows, npy_type_name(label.type), label.ndim);
                r = -EINVAL;
                goto out;
        }
        snprintf(path, sizeof path, "%s/%s/dense.npy", dir, split);
        if (access(path, F_OK) == 0) {
                if ((r = load_array(dir, split, "dense.npy", &dense, path, sizeof path, err, n)) < 0)
                        goto out;
                has_dense = true;
                if (dense.type != NPY_F32 || dense.ndim != 2 || dense.shape[0] != rows || dense.shape[1] < 1 ||
                    dense.shape[1] > CLICK_MAX_DENSE) {
                        snprintf(err, n, "%s: want float32 [%llu, D] with 1 <= D <= %u, have %s of %u dimensions",
                                 path, (unsigned long long) rows, CLICK_MAX_DENSE, npy_type_name(dense.type),
                                 dense.ndim);
                        r = -EINVAL;
                        goto out;
                }
        }
        uint64_t keep = limit ? MIN(limit, rows) : rows;
        if (keep == 0) {
                snprintf(err, n, "%s/%s: no samples", dir, split);
                r = -EINVAL;
                goto out;
        }
        d = calloc(1, sizeof *d);
        if (!d) {
                r = -ENOMEM;
                goto out;
        }
        d->n = keep;
        d->fields = (uint32_t) ids.shape[1];
        d->dense = has_dense ? (uint32_t) dense.shape[1] : 0;
        d->ids = ids.data;
        ids.data = NULL;
        if (has_dense) {
                d->x = dense.data;
                dense.data = NULL;
        }
        d->y = malloc(keep);
        if (!d->y) {
                r = -ENOMEM;
                goto out;
        }
        for (uint64_t i = 0; i < keep; i++) {
                double v = label.type == NPY_U8 ? ((const uint8_t *) label.data)[i] : ((const float *) label.data)[i];
                if (v != 0.0 && v != 1.0) {
                        snprintf(err, n, "%s/%s/label.npy: label %llu is %g, not 0 or 1", dir, split,
                                 (unsigned long long) i, v);
                        r = -EINVAL;
                        goto out;
                }
                d->y[i] = (uint8_t) v;
        }
        for (uint64_t i = 0; d->x && i < keep * d->dense; i++)
                if (!isfinite(d->x[i])) {
                        snprintf(err, n, "%s/%s/dense.npy: feature %llu of row %llu is %g (a dense feature must be "
                                 "finite)", dir, split, (unsigned long long) (i % d->dense),
                                 (unsigned long long) (i / d->dense), (double) d->x[i]);
                        r = -EINVAL;
                        goto out;
                }
        for (uint64_t i = 0; i < keep * d->fields; i++)
                if (d->ids[i] < -1) {
                        snprintf(err, n, "%s/%s/sparse.npy: id %lld at row %llu is negative (only -1, missing, is)",
                                 dir, split, (long long) d->ids[i], (unsigned long long) (i / d->fields));
                        r = -EINVAL;
                        goto out;
                }
        *ret = d;
        d = NULL;
        r = 0;
out:
        clickdata_free(d);
        npy_free(&ids);
        npy_free(&label);
        npy_free(&dense);
        return r;
}
