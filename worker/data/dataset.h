/* SPDX-License-Identifier: Apache-2.0 */
/* A labelled data set in memory, whatever files it came from: Fashion-MNIST's
 * IDX files (Debian's dataset-fashion-mnist) or a pair of NumPy arrays per
 * split, the names Keras uses:
 *
 *   x_train.npy  features of shape [N, ...], float32 (used as they are) or
 *                uint8 (scaled to [0, 1], as IDX pixels are)
 *   y_train.npy  labels of shape [N], int32, int64 or uint8, each >= 0
 *   x_test.npy, y_test.npy  the same for the test split
 *
 * A directory holding x_train.npy is read as NumPy pairs, any other as IDX. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "modeldesc.h"

/* A sample's values, and the whole set's, stay within what the kernels index
 * with int and size_t. */
#define DATASET_MAX_DIM (1u << 28)

typedef struct Dataset {
        uint32_t n;                         /* samples */
        uint32_t dim;                       /* values per sample: the product of shape */
        MdShape shape;                      /* one sample's, as a model's input: [D], [H, W] or [C, H, W] */
        uint32_t classes;                   /* the largest label + 1 */
        const char *format;                 /* "npy" or "idx" (static) */
        /* The samples' values, kept one of two ways (the other pointer
         * NULL): floats, or pixels (bytes, a value being pixel / 255.0f) for
         * IDX images and uint8 NumPy arrays, a quarter of the floats' memory.
         * Read them with dataset_sample and dataset_samples. */
        float *x;                           /* n * dim values */
        uint8_t *px;                        /* n * dim pixels */
        int32_t *y;                         /* n labels */
} Dataset;

/* Loads split "train" or "test" from dir (see above). limit > 0 keeps only the
 * first limit samples; of those, only samples with index % nparts == part
 * (nparts >= 1). On failure writes a reason into err naming the file and what
 * is wrong with it (for a directory with no data: both layouts, and how to
 * install Fashion-MNIST). -ENOENT, -EBADMSG (a file refused), -EINVAL (a bad
 * request, or a part with no samples), -ENOMEM, or -errno of reading. */
int dataset_load(const char *dir, const char *set, uint32_t limit, uint32_t part,
                 uint32_t nparts, Dataset **ret, char *err, size_t errlen);
/* Chooses the samples a client keeps from the labels of a split (n of
 * them, its limit applied): *ret (malloc'd, ascending indices below n) and
 * *ret_n. 0 or a negative errno. */
typedef int (*DatasetPickFn)(const int32_t *labels, uint32_t n, void *ud, uint32_t **ret, uint32_t *ret_n);
/* dataset_load keeping only the samples pick chooses: for IDX files only
 * those are ever held in memory (an edge client of a large set loads its
 * share, not the set); NumPy pairs are read whole, then kept. */
int dataset_load_picked(const char *dir, const char *set, uint32_t limit, DatasetPickFn pick, void *ud,
                        Dataset **ret, char *err, size_t errlen);
/* The samples a loader keeps of a file's n: the first limit (0: all), and
 * of those the ones whose index % nparts == part. The count (0: none, the
 * caller says so naming its file) and, in *ret_total, the samples the limit
 * leaves. */
uint32_t dataset_part_count(uint32_t n, uint32_t limit, uint32_t part, uint32_t nparts, uint32_t *ret_total);
/* An empty data set of count samples of the given shape (y and x, or px
 * for pixels, allocated, uninitialised); NULL when out of memory or the
 * sizes overflow. */
Dataset *dataset_new(uint32_t count, const MdShape *shape, bool pixels);
/* Sample i's dim values, as floats, into dst. */
void dataset_sample(const Dataset *d, uint32_t i, float *dst);
/* Samples first..first+count-1 of data set d as floats: where they are
 * kept, for a set of floats, or else written into scratch (count * dim
 * floats). In the form of model_evaluate_from's ModelSamplesFn. */
const float *dataset_samples(const void *d, size_t first, int count, float *scratch);
/* Samples first..first+n-1 of d as a data set of their own, in d's memory
 * (nothing to free; valid while d is). */
Dataset dataset_slice(const Dataset *d, uint32_t first, uint32_t n);
Dataset *dataset_free(Dataset *d);
/* Keeps only samples idx[0..n) (ascending, each < d->n) as samples 0..n-1,
 * and gives the rest of the memory back. -EINVAL for bad indices. */
int dataset_keep(Dataset *d, const uint32_t *idx, uint32_t n);
/* Whether a model taking in_numel values and giving classes scores can train
 * on train and be evaluated on test (test may be NULL): same sample shape,
 * in_numel values a sample, every label below classes. 0, or -EINVAL with
 * both sides in err. */
int dataset_check_model(const Dataset *train, const Dataset *test, uint32_t in_numel, uint32_t classes, char *err,
                        size_t errlen);
