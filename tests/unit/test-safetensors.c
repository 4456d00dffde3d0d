/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/safetensors.c: a file written by st_write reads back
 * (names, shapes, values, metadata; the header padded so the data starts
 * 8-byte aligned, as the format's own writer does), a file laid out as the
 * safetensors library writes it (its header text) is read, and each refusal
 * has its reason: too short, a header length past the end, not JSON, a
 * tensor without its fields, another dtype (named, with the fix), offsets
 * outside the data, overlapping, leaving a hole or bytes after the last,
 * sizes that do not match the shape, a name twice. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "safetensors.h"
#include "tap.h"

/* A file of header h (8-byte length + text) and dlen bytes of data. */
static uint8_t *make(const char *h, size_t dlen, size_t *ret_len) {
        size_t hl = strlen(h), len = 8 + hl + dlen;
        uint8_t *b = calloc(1, len);
        if (!b)
                abort();
        for (int i = 0; i < 8; i++)
                b[i] = (uint8_t) ((uint64_t) hl >> (8 * i));
        memcpy(b + 8, h, hl);
        for (size_t i = 0; i < dlen; i++)
                b[8 + hl + i] = (uint8_t) i;
        *ret_len = len;
        return b;
}

static void refused(const char *what, const char *h, size_t dlen, const char *want) {
        size_t len;
        uint8_t *b = make(h, dlen, &len);
        StFile f;
        char err[256] = "";
        int r = st_parse(b, len, &f, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, want) && f.tensors == NULL, "%s: refused '%s' (%d)", what, err, r);
        free(b);
}

int main(void) {
        char path[] = "/tmp/test-safetensors-XXXXXX", err[256];
        int fd = mkstemp(path);
        CHECK(fd >= 0 && close(fd) == 0, "a temporary file");

        /* Round trip. */
        float w[6] = { 1.5f, -2, 3.25f, 0, 1e-7f, -1e7f }, b[2] = { 0.5f, -0.5f }, s[1] = { 7 };
        const uint64_t ws[2] = { 2, 3 }, bs[1] = { 2 };
        const StOut out[3] = { { "0.weight", 2, ws, w }, { "0.bias", 1, bs, b }, { "scalar", 0, NULL, s } };
        const char *meta[4] = { "format", "pt", "psnet.model", "{\"name\":\"x\"}" };
        int r = st_write(path, out, 3, meta, 2, err, sizeof err);
        CHECK(r == 0, "st_write: %s", r ? err : "");
        StFile f;
        r = st_read(path, 0, &f, err, sizeof err);
        const StTensor *tw = r == 0 ? st_find(&f, "0.weight") : NULL, *tb = r == 0 ? st_find(&f, "0.bias") : NULL,
                       *ts = r == 0 ? st_find(&f, "scalar") : NULL;
        CHECK(r == 0 && f.ntensors == 3 && tw && tb && ts, "reads back three tensors (%s)", r ? err : "");
        if (tw && tb && ts) {
                float got[6];
                memcpy(got, tw->data, sizeof got);
                CHECK(tw->ndim == 2 && tw->shape[0] == 2 && tw->shape[1] == 3 && tw->numel == 6 &&
                      memcmp(got, w, sizeof w) == 0, "0.weight [2, 3] bit for bit");
                memcpy(got, tb->data, 2 * sizeof(float));
                CHECK(tb->ndim == 1 && tb->numel == 2 && got[0] == 0.5f && got[1] == -0.5f, "0.bias [2]");
                memcpy(got, ts->data, sizeof(float));
                CHECK(ts->ndim == 0 && ts->numel == 1 && got[0] == 7, "a scalar (shape [])");
                CHECK(f.tensors[0].data == tw->data && f.tensors[1].data == tb->data,
                      "listed in the order of their data");
                CHECK(((const uint8_t *) tw->data - f.buf) % 8 == 0, "the data starts 8-byte aligned");
                CHECK(st_meta(&f, "format") && strcmp(st_meta(&f, "format"), "pt") == 0 &&
                      strcmp(st_meta(&f, "psnet.model"), "{\"name\":\"x\"}") == 0 && !st_meta(&f, "other"),
                      "metadata read back");
        }
        st_free(&f);
        CHECK(f.buf == NULL && f.tensors == NULL, "st_free clears");
        r = st_read(path, 64, &f, err, sizeof err);
        CHECK(r == -EFBIG && strstr(err, path), "a bound on the size: '%s'", err);
        unlink(path);
        r = st_read(path, 0, &f, err, sizeof err);
        CHECK(r == -ENOENT && strstr(err, path), "a missing file: '%s'", err);

        /* As the safetensors library writes it: spaces, keys in any order. */
        size_t len;
        uint8_t *lib = make("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"__metadata__\":{\"format\":\"pt\"}}    ", 12, &len);
        r = st_parse(lib, len, &f, err, sizeof err);
        CHECK(r == 0 && f.ntensors == 2 && strcmp(f.tensors[0].name, "a") == 0 &&
              (const uint8_t *) st_find(&f, "b")->data == lib + len - 4, "the library's layout: %s", r ? err : "");
        st_free(&f);
        free(lib);

        const char *ok1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
        size_t l1;
        uint8_t *b1 = make(ok1, 8, &l1);
        r = st_parse(b1, 7, &f, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "7 bytes"), "7 bytes: '%s'", err);
        r = st_parse(b1, l1 - 1, &f, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "data_offsets"), "data cut short: '%s'", err);
        free(b1);
        refused("not JSON", "{\"a\": nope}", 0, "not valid JSON");
        refused("an array", "[1, 2]", 0, "not a JSON object");
        refused("no dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "needs dtype");
        refused("float16", "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                "tensor 'w': dtype F16; psnet reads F32");
        refused("past the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                "outside the 8 bytes");
        refused("size and shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                "8 bytes for 3 values");
        refused("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                "inside another tensor's");
        refused("a hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "leaving a hole");
        refused("bytes after", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                "4 bytes of data after");
        refused("a name twice", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                "not valid JSON");
        refused("a negative size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                "dimension 0 is not a size");
        refused("metadata not strings", "{\"__metadata__\":{\"k\":1}}", 0, "'k' is not a string");
        uint8_t huge[16] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}' };
        r = st_parse(huge, sizeof huge, &f, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "header length"), "a header length past the end: '%s'", err);
        return tap_done();
}
