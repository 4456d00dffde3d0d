/* SPDX-License-Identifier: Apache-2.0 */
/* NumPy's .npy files (format versions 1.0, 2.0 and 3.0): one array, C order,
 * little-endian, of float32, uint8, int32 or int64 (what a data set of
 * features and labels holds). The header is a Python dict literal with
 * 'descr', 'fortran_order' and 'shape'; anything else is refused with the
 * reason: Fortran order, big-endian or other types, a shape whose size does
 * not match the bytes that follow. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 8

typedef enum { NPY_F32, NPY_U8, NPY_I32, NPY_I64 } NpyType;

typedef struct NpyArray {
        NpyType type;
        unsigned ndim;                  /* 1..NPY_MAX_DIMS */
        uint64_t shape[NPY_MAX_DIMS];
        uint64_t count;                 /* the product of the shape */
        void *data;                     /* count values of type, malloc'd */
} NpyArray;

/* The bytes of an item of t. */
size_t npy_item_size(NpyType t);
const char *npy_type_name(NpyType t);

/* Parses a whole .npy file held in buf (len bytes) into *ret (its data
 * copied). 0, or -EBADMSG (not an .npy file, or one refused; err says why),
 * -EFBIG (more than max_bytes of data; 0: no bound), -ENOMEM. */
int npy_parse(const uint8_t *buf, size_t len, uint64_t max_bytes, NpyArray *ret, char *err, size_t n);
/* Reads and parses the file at path; also -errno of opening or reading it. */
int npy_read(const char *path, uint64_t max_bytes, NpyArray *ret, char *err, size_t n);
void npy_free(NpyArray *a);
/* Writes an array of count = the product of shape[0..ndim) values of t at
 * data as a version 1.0 .npy file at path (through path.tmp, renamed when
 * whole). 0, or a negative errno with err naming the file and the step. */
int npy_write(const char *path, NpyType t, unsigned ndim, const uint64_t *shape, const void *data, char *err,
              size_t n);
