/* SPDX-License-Identifier: Apache-2.0 */
/* A click log as the lr:D model reads it (docs/tables.md, "Data"): under
 * DIR/SPLIT/, sparse.npy int64 [N, F] (one id per categorical field, -1 for
 * a missing value), label.npy uint8 or float32 [N] of 0 and 1, and
 * dense.npy float32 [N, D] (optional: D 0 without it). psnet-clicklog writes
 * such a directory. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct ClickData {
        uint64_t n;
        uint32_t fields, dense;
        int64_t *ids; /* n x fields */
        float *x;     /* n x dense (NULL when dense is 0) */
        uint8_t *y;   /* n labels, 0 or 1 */
} ClickData;

/* Loads DIR/SPLIT (at most limit samples, the first; 0: all). 0, or a negative
 * errno with err naming the file and what is wrong with it. */
int clickdata_load(const char *dir, const char *split, uint64_t limit, ClickData **ret, char *err, size_t n);
ClickData *clickdata_free(ClickData *d);
