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

Dataset *dataset_new(uint32_t count, const MdShape *shape, bool pixels) {
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
        size_t values = MAX((size_t) count * d->dim, (size_t) 1);
        if (pixels)
                d->px = ps_malloc(values);
        else
                d->x = ps_malloc(values * sizeof(float));
        d->y = ps_malloc(MAX((size_t) count, (size_t) 1) * sizeof(int32_t));
        if ((!d->x && !d->px) || !d->y)
                return dataset_free(d);
        return d;
}

Dataset *dataset_free(Dataset *d) {
        if (!d)
                return NULL;
        ps_free(d->x);
        ps_free(d->px);
        ps_free(d->y);
        ps_free(d);
        return NULL;
}

void dataset_sample(const Dataset *d, uint32_t i, float *dst) {
        size_t dim = d->dim;
        if (d->x) {
                memcpy(dst, d->x + (size_t) i * dim, dim * sizeof(float));
                return;
        }
        const uint8_t *p = d->px + (size_t) i * dim;
        for (size_t k = 0; k < dim; k++)
                dst[k] = (float) p[k] / 255.0f;
}

const float *dataset_samples(const void *set, size_t first, int count, float *scratch) {
        const Dataset *d = set;
        if (d->x)
                return d->x + first * d->dim;
        for (int k = 0; k < count; k++)
                dataset_sample(d, (uint32_t) (first + (size_t) k), scratch + (size_t) k * d->dim);
        return scratch;
}

Dataset dataset_slice(const Dataset *d, uint32_t first, uint32_t n) {
        Dataset s = *d;
        s.n = n;
        s.x = d->x ? d->x + (size_t) first * d->dim : NULL;
        s.px = d->px ? d->px + (size_t) first * d->dim : NULL;
        s.y = d->y + first;
        return s;
}

int dataset_keep(Dataset *d, const uint32_t *idx, uint32_t n) {
        size_t dim = d->dim, size = d->x ? sizeof(float) : 1;
        uint8_t *v = d->x ? (uint8_t *) d->x : d->px;
        if (n > d->n)
                return -EINVAL;
        for (uint32_t k = 0; k < n; k++)
                if (idx[k] >= d->n || (k > 0 && idx[k] <= idx[k - 1]))
                        return -EINVAL;
        /* Ascending, so idx[k] >= k: copying forward never overwrites a
         * sample still to be kept. */
        for (uint32_t k = 0; k < n; k++) {
                if (idx[k] != k)
                        memcpy(v + k * dim * size, v + (size_t) idx[k] * dim * size, dim * size);
                d->y[k] = d->y[idx[k]];
        }
        d->n = n;
        v = ps_realloc(v, MAX((size_t) n * dim, (size_t) 1) * size);
        int32_t *y = ps_realloc(d->y, MAX((size_t) n, (size_t) 1) * sizeof(int32_t));
        if (v) { /* a shrink that fails keeps the larger block */
                if (d->x)
                        d->x = (float *) v;
                else
                        d->px = v;
        }
        if (y)
                d->y = y;
        return 0;
}
