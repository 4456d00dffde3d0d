/* SPDX-License-Identifier: Apache-2.0 */
/* IDX files (the MNIST format), gzip-compressed or raw, and the Fashion-MNIST
 * data set built from them (dataset.h). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "dataset.h"

/* Reads an IDX file (gzip or raw, detected by content) into a malloc'd buffer.
 * Checks the magic (0x00000803 images / 0x00000801 labels), dimensions and that
 * the payload is complete. Returns -ENOENT, -EBADMSG (bad magic, truncated, ...),
 * -ENOMEM. dims gets up to 3 dimensions, *ret_ndim their count. */
int idx_read(const char *path, uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim);
/* idx_read keeping only the first max_items items (0: all); dims are the
 * file's, the whole file is still read and checked. */
int idx_read_first(const char *path, uint32_t max_items, uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim);

/* The same, keeping only the samples pick chooses from the labels (of the
 * first limit): the images are streamed, so only those are ever held. */
int idx_dataset_load_picked(const char *dir, const char *prefix, uint32_t limit, DatasetPickFn pick, void *ud,
                            Dataset **ret, char *err, size_t errlen);

/* Loads the IDX files dir/<prefix>-images-idx3-ubyte(.gz) and the labels
 * beside them into a data set (pixels scaled to [0, 1]); limit, part, nparts
 * and err as dataset_load's. -ENOENT when the images are not there. */
int idx_dataset_load(const char *dir, const char *prefix, uint32_t limit, uint32_t part, uint32_t nparts,
                     Dataset **ret, char *err, size_t errlen);
