/* SPDX-License-Identifier: Apache-2.0 */
/* NumPy's .npy files; see npy.h. The format: "\x93NUMPY", major and minor
 * version, the header's length (2 bytes little-endian in 1.0, 4 in 2.0 and
 * 3.0), the header (a dict literal, ASCII in 1.0 and 2.0, UTF-8 in 3.0,
 * padded with spaces and ended by '\n'), then the data. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "macro.h"
#include "npy.h"

static const struct {
        const char *descr;
        NpyType type;
} types[] = {
        { "<f4", NPY_F32 }, { "|u1", NPY_U8 }, { "<u1", NPY_U8 }, { "<i4", NPY_I32 }, { "<i8", NPY_I64 },
};

size_t npy_item_size(NpyType t) {
        return t == NPY_U8 ? 1 : t == NPY_I64 ? 8 : 4;
}

const char *npy_type_name(NpyType t) {
        static const char *names[] = { "float32", "uint8", "int32", "int64" };
        return t <= NPY_I64 ? names[t] : "?";
}

/* The header's dict, one token at a time. */
typedef struct Lexer {
        const char *p, *end;
} Lexer;

static void skip_space(Lexer *l) {
        while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
                l->p++;
}

static bool take(Lexer *l, char c) {
        skip_space(l);
        if (l->p < l->end && *l->p == c) {
                l->p++;
                return true;
        }
        return false;
}

/* A quoted string (no escapes: none of the keys or values needs one) into out. */
static bool string(Lexer *l, char *out, size_t n) {
        skip_space(l);
        if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
                return false;
        char q = *l->p++;
        size_t k = 0;
        while (l->p < l->end && *l->p != q && *l->p != '\\') {
                if (k + 1 >= n)
                        return false;
                out[k++] = *l->p++;
        }
        if (l->p >= l->end || *l->p != q)
                return false;
        l->p++;
        out[k] = '\0';
        return true;
}

static bool word(Lexer *l, const char *w) {
        skip_space(l);
        size_t n = strlen(w);
        if ((size_t) (l->end - l->p) >= n && memcmp(l->p, w, n) == 0) {
                l->p += n;
                return true;
        }
        return false;
}

/* A shape: a tuple of non-negative integers, (), (n,) or (n, m, ...). */
static int shape(Lexer *l, NpyArray *a, char *err, size_t n) {
        if (!take(l, '(')) {
                snprintf(err, n, "'shape' is not a tuple");
                return -EBADMSG;
        }
        a->ndim = 0;
        while (!take(l, ')')) {
                skip_space(l);
                if (l->p >= l->end) {
                        snprintf(err, n, "'shape' is not a tuple");
                        return -EBADMSG;
                }
                uint64_t v = 0;
                const char *start = l->p;
                while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
                        if (v > (UINT64_MAX - 9) / 10) {
                                snprintf(err, n, "a dimension of 'shape' is too large");
                                return -EBADMSG;
                        }
                        v = v * 10 + (uint64_t) (*l->p++ - '0');
                }
                if (l->p == start) {
                        snprintf(err, n, "'shape' holds something other than non-negative integers");
                        return -EBADMSG;
                }
                if (a->ndim == NPY_MAX_DIMS) {
                        snprintf(err, n, "'shape' has more than %d dimensions", NPY_MAX_DIMS);
                        return -EBADMSG;
                }
                a->shape[a->ndim++] = v;
                if (!take(l, ',')) {
                        if (!take(l, ')')) {
                                snprintf(err, n, "'shape' is not a tuple");
                                return -EBADMSG;
                        }
                        break;
                }
        }
        if (a->ndim == 0) {
                snprintf(err, n, "'shape' is () (a scalar, not an array of examples)");
                return -EBADMSG;
        }
        return 0;
}

/* The header's dict: descr, fortran_order and shape, each once, nothing else. */
static int header(const char *h, size_t len, NpyArray *a, char *err, size_t n) {
        Lexer l = { .p = h, .end = h + len };
        bool has_descr = false, has_order = false, has_shape = false;
        if (!take(&l, '{')) {
                snprintf(err, n, "the header is not a dict");
                return -EBADMSG;
        }
        while (!take(&l, '}')) {
                char key[32], val[32];
                if (!string(&l, key, sizeof key) || !take(&l, ':')) {
                        snprintf(err, n, "the header is not a dict of 'descr', 'fortran_order' and 'shape'");
                        return -EBADMSG;
                }
                if (strcmp(key, "descr") == 0 && !has_descr) {
                        if (!string(&l, val, sizeof val)) {
                                snprintf(err, n, "'descr' is not a type string");
                                return -EBADMSG;
                        }
                        size_t t = 0;
                        while (t < ELEMENTSOF(types) && strcmp(types[t].descr, val) != 0)
                                t++;
                        if (t == ELEMENTSOF(types)) {
                                snprintf(err, n, "type '%s' is not one of float32, uint8, int32 or int64, "
                                         "little-endian ('<f4', '|u1', '<i4', '<i8')", val);
                                return -EBADMSG;
                        }
                        a->type = types[t].type;
                        has_descr = true;
                } else if (strcmp(key, "fortran_order") == 0 && !has_order) {
                        if (word(&l, "True")) {
                                snprintf(err, n, "the array is in Fortran order (save it with "
                                         "numpy.ascontiguousarray first)");
                                return -EBADMSG;
                        }
                        if (!word(&l, "False")) {
                                snprintf(err, n, "'fortran_order' is neither True nor False");
                                return -EBADMSG;
                        }
                        has_order = true;
                } else if (strcmp(key, "shape") == 0 && !has_shape) {
                        int r = shape(&l, a, err, n);
                        if (r < 0)
                                return r;
                        has_shape = true;
                } else {
                        snprintf(err, n, "the header has key '%s' %s", key,
                                 strcmp(key, "descr") && strcmp(key, "fortran_order") && strcmp(key, "shape")
                                         ? "(only 'descr', 'fortran_order' and 'shape' are known)" : "twice");
                        return -EBADMSG;
                }
                if (!take(&l, ',')) {
                        if (!take(&l, '}')) {
                                snprintf(err, n, "the header's dict does not end with '}'");
                                return -EBADMSG;
                        }
                        break;
                }
        }
        skip_space(&l);
        if (l.p != l.end) {
                snprintf(err, n, "the header has more after its dict");
                return -EBADMSG;
        }
        if (!has_descr || !has_order || !has_shape) {
                snprintf(err, n, "the header lacks '%s'", !has_descr ? "descr" : !has_order ? "fortran_order" : "shape");
                return -EBADMSG;
        }
        return 0;
}

int npy_parse(const uint8_t *buf, size_t len, uint64_t max_bytes, NpyArray *ret, char *err, size_t n) {
        static const uint8_t magic[6] = { 0x93, 'N', 'U', 'M', 'P', 'Y' };
        NpyArray a = { .type = NPY_F32 };
        *ret = a;
        if (len < 10 || memcmp(buf, magic, sizeof magic) != 0) {
                snprintf(err, n, "not an .npy file (no \\x93NUMPY magic)");
                return -EBADMSG;
        }
        uint8_t major = buf[6];
        if (major < 1 || major > 3) {
                snprintf(err, n, ".npy format version %u.%u is not known (1.0, 2.0, 3.0 are)", major, buf[7]);
                return -EBADMSG;
        }
        size_t pre = major == 1 ? 10 : 12;
        if (len < pre) {
                snprintf(err, n, "the file ends in its preamble");
                return -EBADMSG;
        }
        uint64_t hlen = major == 1 ? (uint64_t) buf[8] | (uint64_t) buf[9] << 8
                                   : (uint64_t) buf[8] | (uint64_t) buf[9] << 8 | (uint64_t) buf[10] << 16 |
                                             (uint64_t) buf[11] << 24;
        if (hlen > len - pre) {
                snprintf(err, n, "the header of %lu bytes runs past the file's end", (unsigned long) hlen);
                return -EBADMSG;
        }
        int r = header((const char *) buf + pre, (size_t) hlen, &a, err, n);
        if (r < 0)
                return r;
        uint64_t count = 1, item = npy_item_size(a.type);
        for (unsigned k = 0; k < a.ndim; k++) {
                if (a.shape[k] && count > UINT64_MAX / item / a.shape[k]) {
                        snprintf(err, n, "shape too large");
                        return -EBADMSG;
                }
                count *= a.shape[k];
        }
        uint64_t bytes = count * item, have = len - pre - hlen;
        if (bytes != have) {
                snprintf(err, n, "shape and type say %lu bytes of data, the file has %lu", (unsigned long) bytes,
                         (unsigned long) have);
                return -EBADMSG;
        }
        if (max_bytes && bytes > max_bytes) {
                snprintf(err, n, "%lu bytes of data, more than the %lu allowed", (unsigned long) bytes,
                         (unsigned long) max_bytes);
                return -EFBIG;
        }
        a.count = count;
        a.data = ps_malloc(bytes ? (size_t) bytes : 1);
        if (!a.data) {
                snprintf(err, n, "out of memory");
                return -ENOMEM;
        }
        memcpy(a.data, buf + pre + hlen, (size_t) bytes);
        *ret = a;
        return 0;
}

int npy_read(const char *path, uint64_t max_bytes, NpyArray *ret, char *err, size_t n) {
        *ret = (NpyArray) { .type = NPY_F32 };
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;
        /* The header takes at most 65535 + 12 bytes. */
        int r = ckpt_read_file(path, max_bytes ? max_bytes + 65536 + 12 : UINT64_MAX, &buf, &len, err, n);
        if (r < 0)
                return r;
        char why[256];
        r = npy_parse(buf, len, max_bytes, ret, why, sizeof why);
        if (r < 0)
                snprintf(err, n, "%s: %s", path, why);
        return r;
}

int npy_write(const char *path, NpyType t, unsigned ndim, const uint64_t *shape, const void *data, char *err,
              size_t n) {
        static const char *descr[] = { "<f4", "|u1", "<i4", "<i8" };
        char h[512], dims[NPY_MAX_DIMS * 24] = "";
        uint64_t count = 1;
        if (ndim == 0 || ndim > NPY_MAX_DIMS || t > NPY_I64) {
                snprintf(err, n, "%s: 1 to %d dimensions of a known type", path, NPY_MAX_DIMS);
                return -EINVAL;
        }
        for (unsigned i = 0; i < ndim; i++) {
                size_t at = strlen(dims);
                snprintf(dims + at, sizeof dims - at, "%lu,%s", (unsigned long) shape[i], i + 1 < ndim ? " " : "");
                count *= shape[i];
        }
        if (ndim > 1)
                dims[strlen(dims) - 1] = 0; /* (2, 3) but (5,) */
        /* Magic, version 1.0, the length, the dict padded with spaces to 64 bytes in all, '\n'. */
        int len = snprintf(h + 10, sizeof h - 10, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                           descr[t], dims);
        size_t total = (size_t) len + 10 + 1;
        size_t padded = (total + 63) / 64 * 64;
        memcpy(h, "\x93NUMPY\x01\x00", 8);
        h[8] = (char) ((padded - 10) & 0xff);
        h[9] = (char) ((padded - 10) >> 8);
        memset(h + 10 + len, ' ', padded - total);
        h[padded - 1] = '\n';
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
                int r = -errno;
                snprintf(err, n, "%s: %s", tmp, strerror(-r));
                return r;
        }
        const char *what = "write";
        int r = ckpt_pwrite_all(fd, h, padded, 0);
        if (r == 0)
                r = ckpt_pwrite_all(fd, data, count * npy_item_size(t), padded);
        if (r < 0) {
                (void) close(fd);
                (void) unlink(tmp);
        } else {
                char dir[4096];
                snprintf(dir, sizeof dir, "%s", path);
                char *slash = strrchr(dir, '/');
                if (slash)
                        *slash = 0;
                r = ckpt_commit(fd, tmp, path, slash ? dir : ".", &what);
        }
        if (r < 0)
                snprintf(err, n, "%s: %s failed: %s", path, what, strerror(-r));
        return r;
}

void npy_free(NpyArray *a) {
        if (!a)
                return;
        ps_free(a->data);
        a->data = NULL;
        a->count = 0;
}
