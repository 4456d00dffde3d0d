/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/data/npy.c: files laid out as numpy.save writes them
 * (format 1.0 and 2.0, its header text and padding), every type a data set
 * holds, and each refusal with its reason: not .npy, an unknown version,
 * Fortran order, big-endian or other types, a shape that does not match the
 * bytes, a header cut short or with unknown keys, a bound on the size. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "npy.h"
#include "tap.h"

/* An .npy file of header dict h (padded as numpy does: to a multiple of 64
 * with the preamble, ending '\n') and data d of dlen bytes. */
static uint8_t *make(unsigned major, const char *h, const void *d, size_t dlen, size_t *ret_len) {
        size_t pre = major == 1 ? 10 : 12, hl = strlen(h) + 1;
        size_t pad = (64 - (pre + hl) % 64) % 64;
        size_t hlen = hl + pad, len = pre + hlen + dlen;
        uint8_t *b = malloc(len);
        if (!b)
                abort();
        memcpy(b, "\x93NUMPY", 6);
        b[6] = (uint8_t) major;
        b[7] = 0;
        b[8] = (uint8_t) hlen;
        b[9] = (uint8_t) (hlen >> 8);
        if (major > 1)
                b[10] = b[11] = 0;
        memcpy(b + pre, h, hl - 1);
        memset(b + pre + hl - 1, ' ', pad);
        b[pre + hlen - 1] = '\n';
        if (dlen)
                memcpy(b + pre + hlen, d, dlen);
        *ret_len = len;
        return b;
}

/* Parses header h over dlen bytes of data d: the status, the reason in err. */
static int parse(unsigned major, const char *h, const void *d, size_t dlen, uint64_t max, NpyArray *a, char *err,
                 size_t n) {
        size_t len;
        uint8_t *b = make(major, h, d, dlen, &len);
        err[0] = '\0';
        int r = npy_parse(b, len, max, a, err, n);
        free(b);
        return r;
}

static void refused(const char *h, const void *d, size_t dlen, const char *want) {
        NpyArray a;
        char err[256];
        int r = parse(1, h, d, dlen, 0, &a, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, want), "%s refused: '%s' (%d)", h, err, r);
        CHECK(a.data == NULL, "nothing kept");
}

int main(void) {
        NpyArray a;
        char err[256];
        float x[6] = { 0, 1.5f, -2, 3, 4.25f, 1e-7f };
        int r = parse(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", x, sizeof x, 0, &a, err,
                      sizeof err);
        CHECK(r == 0 && a.type == NPY_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.count == 6,
              "float32 (2, 3), format 1.0: %s", err);
        CHECK(r == 0 && memcmp(a.data, x, sizeof x) == 0, "its values");
        npy_free(&a);
        CHECK(a.data == NULL, "npy_free");

        uint8_t img[2 * 2 * 2] = { 0, 255, 7, 9, 1, 2, 3, 4 };
        r = parse(2, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2), }", img, sizeof img, 0, &a, err,
                  sizeof err);
        CHECK(r == 0 && a.type == NPY_U8 && a.ndim == 3 && a.count == 8 && memcmp(a.data, img, 8) == 0,
              "uint8 (2, 2, 2), format 2.0: %s", err);
        npy_free(&a);

        int32_t l32[3] = { 9, 0, 4 };
        r = parse(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", l32, sizeof l32, 0, &a, err,
                  sizeof err);
        CHECK(r == 0 && a.type == NPY_I32 && a.ndim == 1 && a.shape[0] == 3 && ((int32_t *) a.data)[2] == 4,
              "int32 labels (3,): %s", err);
        npy_free(&a);
        int64_t l64[2] = { 1, -5 };
        r = parse(1, "{\"descr\":\"<i8\",\"fortran_order\":False,\"shape\":(2,)}", l64, sizeof l64, 0, &a, err,
                  sizeof err);
        CHECK(r == 0 && a.type == NPY_I64 && ((int64_t *) a.data)[1] == -5,
              "int64 labels, double quotes, no spaces, keys in any order: %s", err);
        npy_free(&a);
        r = parse(1, "{'shape': (0, 784), 'fortran_order': False, 'descr': '<f4'}", NULL, 0, 0, &a, err, sizeof err);
        CHECK(r == 0 && a.count == 0 && a.shape[1] == 784, "an empty array (0, 784): %s", err);
        npy_free(&a);

        r = parse(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", x, sizeof x, 16, &a, err,
                  sizeof err);
        CHECK(r == -EFBIG && strstr(err, "more than the 16 allowed"), "a bound on the bytes: '%s'", err);

        refused("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", x, sizeof x, "Fortran order");
        refused("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", x, sizeof x, "type '>f4'");
        refused("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", x, 24, "type '<f8'");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", x, sizeof x,
                "say 32 bytes of data, the file has 24");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", x, 4, "a scalar");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", x, sizeof x, "non-negative");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", x, sizeof x,
                "too large");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", x, sizeof x,
                "shape too large");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,6), }", x, sizeof x,
                "more than 8 dimensions");
        refused("{'descr': '<f4', 'shape': (6,), }", x, sizeof x, "lacks 'fortran_order'");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}", x, sizeof x, "key 'extra'");
        refused("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", x, sizeof x, "twice");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", x, sizeof x, "more after its dict");
        refused("['descr']", x, sizeof x, "not a dict");
        refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,", x, sizeof x, "not a tuple");

        /* The preamble. */
        size_t len;
        uint8_t *b = make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", x, sizeof x, &len);
        b[0] = 'X';
        r = npy_parse(b, len, 0, &a, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "magic"), "no magic: '%s'", err);
        b[0] = 0x93;
        b[6] = 4;
        r = npy_parse(b, len, 0, &a, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "version 4.0"), "an unknown version: '%s'", err);
        b[6] = 1;
        r = npy_parse(b, 60, 0, &a, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "runs past"), "a header cut short: '%s'", err);
        r = npy_parse(b, len - 1, 0, &a, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "the file has 23"), "data cut short: '%s'", err);
        r = npy_parse(b, 5, 0, &a, err, sizeof err);
        CHECK(r == -EBADMSG, "5 bytes: '%s'", err);

        /* npy_read: a file, and one that is not there. */
        char path[] = "/tmp/test-npy-XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0 && write(fd, b, len) == (ssize_t) len && close(fd) == 0, "a file written");
        r = npy_read(path, 0, &a, err, sizeof err);
        CHECK(r == 0 && a.count == 6 && ((float *) a.data)[4] == 4.25f, "npy_read: %s", err);
        npy_free(&a);
        unlink(path);
        r = npy_read(path, 0, &a, err, sizeof err);
        CHECK(r == -ENOENT && strstr(err, path), "a missing file: '%s'", err);
        free(b);
        return tap_done();
}
