/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors files; see safetensors.h. The header is JSON, read and written
 * with jansson; everything read is checked before it sizes or indexes
 * anything (a bad file is -EBADMSG with the reason, never a crash:
 * tests/fuzz/fuzz-safetensors.c). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "macro.h"
#include "safetensors.h"

static uint64_t le64(const uint8_t *p) {
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--)
                v = v << 8 | p[i];
        return v;
}

void st_free(StFile *f) {
        if (!f)
                return;
        for (size_t i = 0; i < f->nmeta * 2; i++)
                ps_free(f->meta[i]);
        ps_free(f->meta);
        ps_free(f->tensors);
        ps_free(f->buf);
        *f = (StFile) { 0 };
}

const StTensor *st_find(const StFile *f, const char *name) {
        for (size_t i = 0; i < f->ntensors; i++)
                if (strcmp(f->tensors[i].name, name) == 0)
                        return &f->tensors[i];
        return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
        for (size_t i = 0; i < f->nmeta; i++)
                if (strcmp(f->meta[2 * i], key) == 0)
                        return f->meta[2 * i + 1];
        return NULL;
}

/* An entry's data range and its place in the header, for the check that
 * the ranges tile the data. */
typedef struct Range {
        uint64_t begin, end;
        size_t i;
} Range;

static int by_begin(const void *a, const void *b) {
        const Range *x = a, *y = b;
        return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_meta(json_t *m, StFile *f, char *err, size_t n) {
        if (!json_is_object(m)) {
                snprintf(err, n, "__metadata__ is not an object");
                return -EBADMSG;
        }
        size_t k = json_object_size(m);
        f->meta = ps_calloc(MAX(k * 2, (size_t) 1), sizeof *f->meta);
        if (!f->meta)
                return -ENOMEM;
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
                if (!json_is_string(v)) {
                        snprintf(err, n, "__metadata__ '%.64s' is not a string", key);
                        return -EBADMSG;
                }
                f->meta[2 * f->nmeta] = strdup(key);
                f->meta[2 * f->nmeta + 1] = strdup(json_string_value(v));
                f->nmeta++;
                if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
                        return -ENOMEM;
        }
        return 0;
}

static int parse_entry(const char *name, json_t *e, uint64_t data_len, StTensor *t, Range *rg, char *err, size_t n) {
        if (strlen(name) >= ST_MAX_NAME) {
                snprintf(err, n, "tensor name '%.40s...' is longer than %d bytes", name, ST_MAX_NAME - 1);
                return -EBADMSG;
        }
        snprintf(t->name, sizeof t->name, "%s", name);
        json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
               *off = json_object_get(e, "data_offsets");
        if (!json_is_object(e) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) ||
            json_array_size(off) != 2) {
                snprintf(err, n, "tensor '%s': needs dtype, shape and data_offsets [begin, end]", name);
                return -EBADMSG;
        }
        if (strcmp(json_string_value(dt), "F32") != 0) {
                snprintf(err, n, "tensor '%s': dtype %.16s; psnet reads F32 (in PyTorch: save the state_dict's "
                         "tensors with .float())", name, json_string_value(dt));
                return -EBADMSG;
        }
        if (json_array_size(sh) > ST_MAX_DIMS) {
                snprintf(err, n, "tensor '%s': %zu dimensions, at most %d", name, json_array_size(sh), ST_MAX_DIMS);
                return -EBADMSG;
        }
        t->ndim = (unsigned) json_array_size(sh);
        t->numel = 1;
        for (unsigned d = 0; d < t->ndim; d++) {
                json_t *v = json_array_get(sh, d);
                json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
                if (x < 0 || (uint64_t) x > (1ull << 40) || (x > 0 && t->numel > (1ull << 40) / (uint64_t) x)) {
                        snprintf(err, n, "tensor '%s': dimension %u is not a size", name, d);
                        return -EBADMSG;
                }
                t->shape[d] = (uint64_t) x;
                t->numel *= (uint64_t) x;
        }
        json_int_t b = json_is_integer(json_array_get(off, 0)) ? json_integer_value(json_array_get(off, 0)) : -1;
        json_int_t en = json_is_integer(json_array_get(off, 1)) ? json_integer_value(json_array_get(off, 1)) : -1;
        if (b < 0 || en < b || (uint64_t) en > data_len) {
                snprintf(err, n, "tensor '%s': data_offsets [%lld, %lld] outside the %llu bytes of data", name,
                         (long long) b, (long long) en, (unsigned long long) data_len);
                return -EBADMSG;
        }
        if ((uint64_t) (en - b) != t->numel * sizeof(float)) {
                snprintf(err, n, "tensor '%s': %lld bytes for %llu values of F32", name, (long long) (en - b),
                         (unsigned long long) t->numel);
                return -EBADMSG;
        }
        rg->begin = (uint64_t) b;
        rg->end = (uint64_t) en;
        return 0;
}

int st_parse(const uint8_t *buf, size_t len, StFile *ret, char *err, size_t n) {
        StFile f = { 0 };
        Range *rg = NULL;
        json_t *root = NULL;
        int r = -EBADMSG;
        *ret = (StFile) { 0 };
        if (len < 8) {
                snprintf(err, n, "%zu bytes: not a safetensors file (it starts with an 8-byte header length)", len);
                return -EBADMSG;
        }
        uint64_t hl = le64(buf);
        if (hl < 2 || hl > ST_MAX_HEADER || hl > len - 8) {
                snprintf(err, n, "header length %llu does not fit the %zu bytes of the file (at most %u)",
                         (unsigned long long) hl, len, ST_MAX_HEADER);
                return -EBADMSG;
        }
        if (buf[8] != '{') {
                snprintf(err, n, "the header is not a JSON object");
                return -EBADMSG;
        }
        json_error_t je;
        root = json_loadb((const char *) buf + 8, hl, JSON_REJECT_DUPLICATES, &je);
        if (!root || !json_is_object(root)) {
                snprintf(err, n, "the header is not valid JSON: %s (column %d)", root ? "not an object" : je.text,
                         root ? 0 : je.column);
                goto out;
        }
        uint64_t data_len = len - 8 - hl;
        const uint8_t *data = buf + 8 + hl;
        size_t k = json_object_size(root);
        f.tensors = ps_calloc(MAX(k, (size_t) 1), sizeof *f.tensors);
        rg = ps_calloc(MAX(k, (size_t) 1), sizeof *rg);
        if (!f.tensors || !rg) {
                r = -ENOMEM;
                goto out;
        }
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
                if (strcmp(key, "__metadata__") == 0) {
                        r = parse_meta(v, &f, err, n);
                        if (r < 0)
                                goto out;
                        continue;
                }
                r = parse_entry(key, v, data_len, &f.tensors[f.ntensors], &rg[f.ntensors], err, n);
                if (r < 0)
                        goto out;
                f.ntensors++;
        }
        r = -EBADMSG;
        /* The ranges tile the data: sorted by start, each begins where the one
         * before ended, the last ends at the end. The tensors are listed in
         * their data's order. */
        for (size_t i = 0; i < f.ntensors; i++)
                rg[i].i = i;
        qsort(rg, f.ntensors, sizeof *rg, by_begin);
        StTensor *sorted = ps_calloc(MAX(f.ntensors, (size_t) 1), sizeof *sorted);
        if (!sorted) {
                r = -ENOMEM;
                goto out;
        }
        uint64_t at = 0;
        for (size_t i = 0; i < f.ntensors; i++) {
                if (rg[i].begin != at) {
                        snprintf(err, n, "tensor '%s': its data starts at %llu, %s", f.tensors[rg[i].i].name,
                                 (unsigned long long) rg[i].begin,
                                 rg[i].begin < at ? "inside another tensor's" : "leaving a hole");
                        ps_free(sorted);
                        goto out;
                }
                at = rg[i].end;
                sorted[i] = f.tensors[rg[i].i];
                sorted[i].data = (const float *) (data + rg[i].begin);
        }
        if (at != data_len) {
                snprintf(err, n, "%llu bytes of data after the last tensor", (unsigned long long) (data_len - at));
                ps_free(sorted);
                goto out;
        }
        ps_free(f.tensors);
        f.tensors = sorted;
        f.len = len;
        *ret = f;
        f = (StFile) { 0 };
        r = 0;
out:
        if (r == -ENOMEM)
                snprintf(err, n, "out of memory");
        json_decref(root);
        ps_free(rg);
        st_free(&f);
        return r;
}

int st_read(const char *path, uint64_t max_bytes, StFile *ret, char *err, size_t n) {
        *ret = (StFile) { 0 };
        uint8_t *buf;
        size_t len;
        int r = ckpt_read_file(path, max_bytes ? max_bytes : UINT64_MAX, &buf, &len, err, n);
        if (r < 0)
                return r;
        char why[256];
        r = st_parse(buf, len, ret, why, sizeof why);
        if (r < 0) {
                ps_free(buf);
                snprintf(err, n, "%s: %s", path, why);
                return r;
        }
        ret->buf = buf;
        return 0;
}

int st_write(const char *path, const StOut *t, size_t n, const char *const *meta, size_t nmeta, char *err,
             size_t errlen) {
        json_t *root = json_object(), *m = nmeta ? json_object() : NULL;
        uint64_t off = 0;
        int r = root && (!nmeta || m) ? 0 : -ENOMEM;
        for (size_t i = 0; r == 0 && i < nmeta; i++)
                if (json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1])) < 0)
                        r = -ENOMEM;
        if (r == 0 && m) {
                r = json_object_set_new(root, "__metadata__", m) < 0 ? -ENOMEM : 0;
                m = NULL;
        }
        for (size_t i = 0; r == 0 && i < n; i++) {
                json_t *shape = json_array();
                uint64_t numel = 1;
                for (unsigned d = 0; shape && d < t[i].ndim; d++) {
                        numel *= t[i].shape[d];
                        if (json_array_append_new(shape, json_integer((json_int_t) t[i].shape[d])) < 0) {
                                json_decref(shape);
                                shape = NULL;
                        }
                }
                uint64_t bytes = numel * (t[i].i64 ? sizeof(int64_t) : sizeof(float));
                json_t *e = shape ? json_pack("{s:s,s:o,s:[I,I]}", "dtype", t[i].i64 ? "I64" : "F32", "shape", shape,
                                              "data_offsets",
                                              (json_int_t) off, (json_int_t) (off + bytes))
                                  : NULL;
                if (!e || json_object_set_new(root, t[i].name, e) < 0)
                        r = -ENOMEM;
                off += bytes;
        }
        char *hdr = r == 0 ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(root);
        json_decref(m);
        if (!hdr) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        /* The data starts 8-byte aligned: the header padded with spaces. */
        size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
        uint8_t lenb[8];
        for (int i = 0; i < 8; i++)
                lenb[i] = (uint8_t) ((uint64_t) (hl + pad) >> (8 * i));
        char tmp[4096];
        if ((size_t) snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
                free(hdr);
                snprintf(err, errlen, "%s: path too long", path);
                return -ENAMETOOLONG;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
                r = -errno;
                free(hdr);
                snprintf(err, errlen, "%s: %s", tmp, strerror(-r));
                return r;
        }
        char spaces[8];
        memset(spaces, ' ', sizeof spaces);
        uint64_t at = 0;
        r = ckpt_pwrite_all(fd, lenb, 8, at);
        at += 8;
        if (r == 0)
                r = ckpt_pwrite_all(fd, hdr, hl, at);
        at += hl;
        if (r == 0)
                r = ckpt_pwrite_all(fd, spaces, pad, at);
        at += pad;
        for (size_t i = 0; r == 0 && i < n; i++) {
                uint64_t numel = 1;
                for (unsigned d = 0; d < t[i].ndim; d++)
                        numel *= t[i].shape[d];
                uint64_t bytes = numel * (t[i].i64 ? sizeof(int64_t) : sizeof(float));
                r = ckpt_pwrite_all(fd, t[i].data, bytes, at);
                at += bytes;
        }
        free(hdr);
        const char *what = "writing";
        if (r < 0)
                (void) close(fd);
        else {
                /* fsync, close, rename, fsync of the directory: a reader sees the whole file or none. */
                char dir[4096];
                snprintf(dir, sizeof dir, "%s", path);
                char *slash = strrchr(dir, '/');
                if (!slash)
                        snprintf(dir, sizeof dir, ".");
                else
                        slash[slash == dir ? 1 : 0] = '\0';
                r = ckpt_commit(fd, tmp, path, dir, &what);
        }
        if (r < 0) {
                (void) unlink(tmp);
                snprintf(err, errlen, "%s: %s %s", path, what, strerror(-r));
        }
        return r;
}
