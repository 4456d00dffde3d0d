/* SPDX-License-Identifier: Apache-2.0 */
/* A Dataset in memory (dataset.h): made for so many samples of a shape, a
 * loader's share of a file counted, cut to some samples, freed. Below the
 * loaders (idx.c, npy.c) and dataset.c, which picks one of them. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "dataset.h"
#include "macro.h"

uint32_t dataset_part_count(uint32_t n, uint32_t limit, uint32_t part, uint32_t nparts, uint32_t *ret_total) {
        uint32_t total = limit > 0 && limit < n ? limit : n;
        *ret_total = total;
        return total > part ? (total - part - 1) / nparts + 1 : 0;
}

Dataset *dataset_new(uint32_t count, const MdShape *shape) {
        if (shape->rank == 0 || shape->rank > ELEMENTSOF(shape->d))
                return NULL;
        uint64_t dim = 1;
        for (unsigned i = 0; i < shape->rank; i++)
                dim *= shape->d[i] ? shape->d[i] : (uint64_t) DATASET_MAX_DIM + 1;
        if (dim > DATASET_MAX_DIM || (uint64_t) count * dim > SIZE_MAX / sizeof(float))
                return NULL;
        Dataset *d = ps_calloc(1, sizeof *d);
        if (!d)
                return NULL;
        d->n = count;
        d->dim = (uint32_t) dim;
        d->shape = *shape;
        d->x = ps_malloc(MAX((size_t) count * d->dim, (size_t) 1) * sizeof(float));
        d->y = ps_malloc(MAX((size_t) count, (size_t) 1) * sizeof(int32_t));
        if (!d->x || !d->y)
                return dataset_free(d);
        return d;
}

Dataset *dataset_free(Dataset *d) {
        if (!d)
                return NULL;
        ps_free(d->x);
        ps_free(d->y);
        ps_free(d);
        return NULL;
}

int dataset_keep(Dataset *d, const uint32_t *idx, uint32_t n) {
        size_t dim = d->dim;
        if (n > d->n)
                return -EINVAL;
        for (uint32_t k = 0; k < n; k++)
                if (idx[k] >= d->n || (k > 0 && idx[k] <= idx[k - 1]))
                        return -EINVAL;
        /* Ascending, so idx[k] >= k: copying forward never overwrites a
         * sample still to be kept. */
        for (uint32_t k = 0; k < n; k++) {
                if (idx[k] != k)
                        memcpy(d->x + k * dim, d->x + (size_t) idx[k] * dim, dim * sizeof(float));
                d->y[k] = d->y[idx[k]];
        }
        d->n = n;
        float *x = ps_realloc(d->x, MAX((size_t) n * dim, (size_t) 1) * sizeof(float));
        int32_t *y = ps_realloc(d->y, MAX((size_t) n, (size_t) 1) * sizeof(int32_t));
        if (x) /* a shrink that fails keeps the larger block */
                d->x = x;
        if (y)
                d->y = y;
        return 0;
}

