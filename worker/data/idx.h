/* IDX files (the MNIST format), gzip-compressed or raw, and the Fashion-MNIST
 * data set built from them. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Dataset {
        uint32_t n, rows, cols;   /* n images of rows x cols */
        float *x;                 /* n * rows * cols, scaled to [0, 1] */
        int32_t *y;               /* n labels */
} Dataset;

/* Reads an IDX file (gzip or raw, detected by content) into a malloc'd buffer.
 * Checks the magic (0x00000803 images / 0x00000801 labels), dimensions and that
 * the payload is complete. Returns -ENOENT, -EBADMSG (bad magic, truncated, ...),
 * -ENOMEM. dims gets up to 3 dimensions, *ret_ndim their count. */
int idx_read(const char *path, uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim);
/* idx_read keeping only the first max_items items (0: all); dims are the
 * file's, the whole file is still read and checked. */
int idx_read_first(const char *path, uint32_t max_items, uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim);

/* Loads "train" or "t10k" images+labels from dir, trying "<set>-images-idx3-ubyte.gz"
 * then without ".gz". limit > 0 keeps only the first limit samples. Only samples
 * with index % nparts == part are kept (nparts >= 1). On failure writes a reason
 * (for a missing file: how to install Debian's dataset-fashion-mnist) into err. */
int dataset_load(const char *dir, const char *set, uint32_t limit, uint32_t part,
                 uint32_t nparts, Dataset **ret, char *err, size_t errlen);
Dataset *dataset_free(Dataset *d);
/* Keeps only samples idx[0..n) (ascending, each < d->n) as samples 0..n-1,
 * and gives the rest of the memory back. -EINVAL for bad indices. */
int dataset_keep(Dataset *d, const uint32_t *idx, uint32_t n);
