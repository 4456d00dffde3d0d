/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors files (the format of Hugging Face's safetensors library, which
 * PyTorch users load with safetensors.torch.load_file, or read with a few
 * lines of Python): an 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
 * ..., "__metadata__": {"key": "value"}}, then the tensors' bytes, C order,
 * little-endian. psnet reads float32 tensors only (a file of other types is
 * refused naming the tensor and its type) and writes float32 and, for a
 * table's ids, int64. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_NAME 128
#define ST_MAX_HEADER (100u << 20) /* the safetensors library's own bound */

typedef struct StTensor {
        char name[ST_MAX_NAME];
        unsigned ndim;
        uint64_t shape[ST_MAX_DIMS];
        uint64_t numel;
        const float *data;      /* into the file's buffer (may be unaligned: copy with memcpy) */
} StTensor;

typedef struct StFile {
        StTensor *tensors;      /* in the order of their data */
        size_t ntensors;
        char **meta;            /* key, value, key, value, ... (__metadata__) */
        size_t nmeta;
        uint8_t *buf;           /* the whole file (st_read), or NULL (st_parse: the caller's) */
        size_t len;             /* the file's bytes */
} StFile;

/* Parses a whole file held in buf (len bytes; kept by the caller as long as
 * *ret is used). 0, or -EBADMSG with why in err: a header that is not the
 * format's (length, JSON, fields), a dtype other than F32, offsets outside
 * the data, overlapping or leaving holes, a shape whose size does not match
 * its bytes, a name too long or twice; -ENOMEM. */
int st_parse(const uint8_t *buf, size_t len, StFile *ret, char *err, size_t n);
/* Reads the file at path (at most max_bytes, 0: no bound) and parses it; also
 * -errno of reading it, -EFBIG. err names the file. */
int st_read(const char *path, uint64_t max_bytes, StFile *ret, char *err, size_t n);
void st_free(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
/* A __metadata__ value, or NULL. */
const char *st_meta(const StFile *f, const char *key);

typedef struct StOut {
        const char *name;
        unsigned ndim;
        const uint64_t *shape;
        const void *data;       /* the product of shape values: float32, or int64 where i64 */
        bool i64;               /* written as I64 (a table's ids, psctl export), which st_parse refuses */
} StOut;

/* Writes n tensors and nmeta key/value pairs (meta[2i], meta[2i+1]) to path:
 * into path.tmp, fsync, rename. 0, or a negative errno with why in err. */
int st_write(const char *path, const StOut *t, size_t n, const char *const *meta, size_t nmeta, char *err,
             size_t errlen);
