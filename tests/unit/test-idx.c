/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/idx.c: IDX files written here (raw, and gzip through
 * zlib) are read back byte for byte; broken ones (bad magic, short header,
 * truncated payload or gzip stream, bad CRC, trailing bytes, zero or absurd
 * dimensions) are refused with -EBADMSG; dataset_load's scaling, partitioning,
 * limit, fallback to unpacked files and its error messages. The real Fashion-MNIST
 * test set is checked too when it is installed. */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include "alloc.h"
#include "idx.h"
#include "macro.h"
#include "psnet-config.h"
#include "tap.h"

static char tmpdir[] = "/tmp/psnet-test-idx-XXXXXX";

static const char *path_in(const char *sub, const char *name) {
        static char buf[4][512];
        static int next;
        char *p = buf[next++ % 4];
        snprintf(p, sizeof buf[0], "%s%s%s%s%s", tmpdir, *sub ? "/" : "", sub, *name ? "/" : "", name);
        return p;
}

static void make_subdir(const char *sub) {
        const char *p = path_in(sub, "");
        if (mkdir(p, 0700) < 0 && errno != EEXIST) {
                printf("Bail out! mkdir %s: %s\n", p, strerror(errno));
                exit(1);
        }
}

static void put_be32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t) (v >> 24);
        p[1] = (uint8_t) (v >> 16);
        p[2] = (uint8_t) (v >> 8);
        p[3] = (uint8_t) v;
}

/* Header (magic, dims) followed by payload, written raw or gzip'd. Only the first
 * keep bytes of the whole are written (to make truncated files); -1 keeps all. */
static bool write_idx(const char *path, bool gz, uint32_t magic, unsigned ndim, const uint32_t *dims,
                      const uint8_t *payload, size_t payload_len, long keep) {
        size_t len = 4 + 4 * ndim + payload_len;
        uint8_t *buf = malloc(len);
        bool ok = false;

        if (!buf)
                return false;
        put_be32(buf, magic);
        for (unsigned i = 0; i < ndim; i++)
                put_be32(buf + 4 + 4 * i, dims[i]);
        if (payload_len)
                memcpy(buf + 4 + 4 * ndim, payload, payload_len);
        if (keep >= 0 && (size_t) keep < len)
                len = (size_t) keep;

        if (gz) {
                gzFile f = gzopen(path, "wb");
                if (f) {
                        ok = len == 0 || gzwrite(f, buf, (unsigned) len) == (int) len;
                        ok = gzclose(f) == Z_OK && ok;
                }
        } else {
                FILE *f = fopen(path, "wb");
                if (f) {
                        ok = fwrite(buf, 1, len, f) == len;
                        ok = fclose(f) == 0 && ok;
                }
        }
        free(buf);
        if (!ok)
                printf("# could not write %s\n", path);
        return ok;
}

/* Whole file into memory, to corrupt or cut it. */
static uint8_t *slurp(const char *path, size_t *ret_len) {
        FILE *f = fopen(path, "rb");
        uint8_t *buf = NULL;
        long n;

        if (!f)
                return NULL;
        if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t) n)) && fread(buf, 1, (size_t) n, f) == (size_t) n)
                *ret_len = (size_t) n;
        else
                buf = (free(buf), NULL);
        fclose(f);
        return buf;
}

static bool spit(const char *path, const uint8_t *buf, size_t len) {
        FILE *f = fopen(path, "wb");
        bool ok;
        if (!f)
                return false;
        ok = fwrite(buf, 1, len, f) == len;
        return fclose(f) == 0 && ok;
}

static uint8_t pixel(uint32_t i, uint32_t p) {
        return (uint8_t) ((i * 37 + p * 11) % 256);
}

static int idx_read_code(const char *path) {
        uint8_t *data = NULL;
        uint32_t dims[3];
        unsigned ndim;
        int r = idx_read(path, &data, dims, &ndim);
        free(data);
        return r;
}

static void test_round_trip(void) {
        const uint32_t dims[3] = { 7, 4, 5 };
        uint8_t payload[7 * 4 * 5], labels[12];
        uint8_t *data;
        uint32_t got[3];
        unsigned ndim;
        int r;

        for (size_t i = 0; i < sizeof payload; i++)
                payload[i] = (uint8_t) (i * 13 + 5);
        for (size_t i = 0; i < sizeof labels; i++)
                labels[i] = (uint8_t) (i % 10);

        for (int gz = 0; gz < 2; gz++) {
                const char *p = path_in("", gz ? "images.gz" : "images");
                data = NULL;
                ndim = 0;
                r = write_idx(p, gz, 0x803, 3, dims, payload, sizeof payload, -1) ?
                            idx_read(p, &data, got, &ndim) : -1;
                CHECK(r == 0 && ndim == 3 && got[0] == 7 && got[1] == 4 && got[2] == 5 && data &&
                      memcmp(data, payload, sizeof payload) == 0,
                      "idx_read %s images: r=%d ndim=%u, dims and bytes as written", gz ? "gzip" : "raw",
                      r, ndim);
                free(data);
                data = NULL;
                r = idx_read_first(p, 3, &data, got, &ndim);
                CHECK(r == 0 && ndim == 3 && got[0] == 7 && data && memcmp(data, payload, 3 * 4 * 5) == 0,
                      "idx_read_first 3 of 7 %s images: the file's dims, the first 3 images", gz ? "gzip" : "raw");
                free(data);
                data = NULL;
                r = write_idx(p, gz, 0x803, 3, dims, payload, sizeof payload - 1, -1) ?
                            idx_read_first(p, 3, &data, got, &ndim) : -1;
                CHECK(r == -EBADMSG && !data, "idx_read_first still reads the whole file: a short one is refused");

                p = path_in("", gz ? "labels.gz" : "labels");
                data = NULL;
                ndim = 0;
                r = write_idx(p, gz, 0x801, 1, (uint32_t[]) { 12 }, labels, sizeof labels, -1) ?
                            idx_read(p, &data, got, &ndim) : -1;
                CHECK(r == 0 && ndim == 1 && got[0] == 12 && data &&
                      memcmp(data, labels, sizeof labels) == 0,
                      "idx_read %s labels: r=%d ndim=%u, count and bytes as written",
                      gz ? "gzip" : "raw", r, ndim);
                free(data);
        }

        CHECK(idx_read_code(path_in("", "does-not-exist")) == -ENOENT, "idx_read missing file: -ENOENT");
}

static void test_broken(void) {
        const uint32_t dims[3] = { 3, 2, 2 };
        uint8_t payload[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, *buf;
        const char *p;
        size_t len = 0;

        static const uint32_t bad_magic[] = { 0x00000804, 0x00000903, 0x03080000, 0x01000803 };
        for (size_t i = 0; i < sizeof bad_magic / sizeof bad_magic[0]; i++) {
                p = path_in("", "bad-magic");
                if (write_idx(p, false, bad_magic[i], 3, dims, payload, sizeof payload, -1))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read magic 0x%08x: -EBADMSG",
                              bad_magic[i]);
        }

        for (int gz = 0; gz < 2; gz++) {
                const char *kind = gz ? "gzip" : "raw";
                p = path_in("", "broken");
                if (write_idx(p, gz, 0x803, 3, dims, payload, sizeof payload, 16 + 11))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s payload one byte short: -EBADMSG",
                              kind);
                if (write_idx(p, gz, 0x803, 3, dims, payload, sizeof payload, 10))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s header cut: -EBADMSG", kind);
                if (write_idx(p, gz, 0x803, 3, dims, payload, sizeof payload, 0))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s empty file: -EBADMSG", kind);
                /* 11 bytes after a header announcing 1 x 2 x 5. */
                if (write_idx(p, gz, 0x803, 3, (uint32_t[]) { 1, 2, 5 }, payload, 11, -1))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s trailing byte: -EBADMSG", kind);
                if (write_idx(p, gz, 0x803, 3, (uint32_t[]) { 0, 2, 2 }, NULL, 0, -1))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s zero dimension: -EBADMSG", kind);
                /* 2^32 and 2^36 elements: a 32-bit product would wrap to 0 and
                 * "match" the empty payload. 10001*100*100 is just over the 100M cap. */
                if (write_idx(p, gz, 0x803, 3, (uint32_t[]) { 65536, 65536, 1 }, NULL, 0, -1))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s 2^32 elements: -EBADMSG", kind);
                if (write_idx(p, gz, 0x803, 3, (uint32_t[]) { 4096, 4096, 4096 }, NULL, 0, -1))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s 2^36 elements: -EBADMSG", kind);
                if (write_idx(p, gz, 0x803, 3, (uint32_t[]) { 10001, 100, 100 }, NULL, 0, -1))
                        CHECK(idx_read_code(p) == -EBADMSG, "idx_read %s 100.01M elements: -EBADMSG",
                              kind);
        }

        /* Just over the cap with the whole payload present: refused for its size,
         * not for being short (100 MB of zeros gzip to ~100 kB). */
        p = path_in("", "huge.gz");
        buf = calloc(10001 * 100 * 100, 1);
        if (buf && write_idx(p, true, 0x803, 3, (uint32_t[]) { 10001, 100, 100 }, buf,
                             10001 * 100 * 100, -1))
                CHECK(idx_read_code(p) == -EBADMSG, "idx_read complete file of 100.01M elements: -EBADMSG");
        free(buf);
        (void) remove(p);

        /* A gzip stream cut short, and one whose CRC does not match its content:
         * both must fail even though zlib hands out the bytes it has. */
        p = path_in("", "whole.gz");
        if (write_idx(p, true, 0x803, 3, dims, payload, sizeof payload, -1) && (buf = slurp(p, &len))) {
                CHECK(spit(path_in("", "cut.gz"), buf, len - 6) &&
                      idx_read_code(path_in("", "cut.gz")) == -EBADMSG,
                      "idx_read gzip without its trailer: -EBADMSG");
                buf[len - 8] ^= 0x55;
                CHECK(spit(path_in("", "crc.gz"), buf, len) &&
                      idx_read_code(path_in("", "crc.gz")) == -EBADMSG,
                      "idx_read gzip with a bad CRC: -EBADMSG");
                free(buf);
        } else {
                CHECK(false, "could not write and read back %s", p);
        }
}

/* n samples of rows x cols under sub/<set>-*-idx*-ubyte[.gz]; label of i is (3i+1) % 10. */
static bool write_set(const char *sub, const char *set, bool gz, uint32_t n, uint32_t nlabels,
                      uint32_t rows, uint32_t cols) {
        size_t pixels = (size_t) rows * cols;
        uint8_t *img = malloc(n * pixels + 1), *lab = malloc(nlabels + 1);
        char name[128];
        bool ok;

        if (!img || !lab) {
                free(img);
                free(lab);
                return false;
        }
        for (uint32_t i = 0; i < n; i++)
                for (size_t p = 0; p < pixels; p++)
                        img[i * pixels + p] = pixel(i, (uint32_t) p);
        img[0] = 0;
        img[pixels] = 255;
        for (uint32_t i = 0; i < nlabels; i++)
                lab[i] = (uint8_t) ((3 * i + 1) % 10);

        snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", set, gz ? ".gz" : "");
        ok = write_idx(path_in(sub, name), gz, 0x803, 3, (uint32_t[]) { n, rows, cols }, img,
                       n * pixels, -1);
        snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", set, gz ? ".gz" : "");
        ok = ok && write_idx(path_in(sub, name), gz, 0x801, 1, &nlabels, lab, nlabels, -1);
        free(img);
        free(lab);
        return ok;
}

/* Does d hold samples first, first + step, ... of the set write_set made? */
static bool dataset_matches(const Dataset *d, uint32_t n, uint32_t first, uint32_t step,
                            uint32_t pixels) {
        if (!d || d->n != n || d->dim != pixels)
                return false;
        float v[64];
        if (pixels > ELEMENTSOF(v) || d->x || !d->px) /* IDX images are kept as bytes */
                return false;
        for (uint32_t k = 0; k < n; k++) {
                uint32_t i = first + k * step;
                if (d->y[k] != (int32_t) ((3 * i + 1) % 10))
                        return false;
                dataset_sample(d, k, v);
                for (uint32_t p = 0; p < pixels; p++) {
                        double want = (i == 0 && p == 0) ? 0.0 : (i == 1 && p == 0) ? 1.0 : pixel(i, p) / 255.0;
                        if (!(fabs(v[p] - want) <= 1e-7))
                                return false;
                }
        }
        return true;
}

static void test_dataset(void) {
        Dataset *d = NULL;
        char err[512];
        int r;

        make_subdir("fm");
        if (!CHECK(write_set("fm", "t10k", true, 10, 10, 3, 2) && write_set("fm", "train", false, 4, 4, 2, 2),
                   "wrote a small data set"))
                return;

        r = dataset_load(path_in("fm", ""), "test", 0, 0, 1, &d, err, sizeof err);
        CHECK(r == 0 && d && d->shape.rank == 2 && d->shape.d[0] == 3 && d->shape.d[1] == 2 && d->dim == 6 && dataset_matches(d, 10, 0, 1, 6) &&
              d->px[0] == 0 && d->px[6] == 255,
              "dataset_load t10k (gzip): all 10 samples, pixels scaled to [0,1]: r=%d %s", r, err);
        d = dataset_free(d);
        CHECK(d == NULL && dataset_free(NULL) == NULL, "dataset_free returns NULL, takes NULL");

        r = dataset_load(path_in("fm", ""), "test", 0, 1, 3, &d, err, sizeof err);
        CHECK(r == 0 && dataset_matches(d, 3, 1, 3, 6), "part 1 of 3: samples 1, 4, 7 (r=%d)", r);
        d = dataset_free(d);
        r = dataset_load(path_in("fm", ""), "test", 0, 0, 3, &d, err, sizeof err);
        CHECK(r == 0 && dataset_matches(d, 4, 0, 3, 6), "part 0 of 3: samples 0, 3, 6, 9 (r=%d)", r);
        d = dataset_free(d);
        r = dataset_load(path_in("fm", ""), "test", 5, 1, 2, &d, err, sizeof err);
        CHECK(r == 0 && dataset_matches(d, 2, 1, 2, 6), "limit 5, part 1 of 2: samples 1, 3 (r=%d)", r);
        d = dataset_free(d);
        r = dataset_load(path_in("fm", ""), "test", 3, 0, 1, &d, err, sizeof err);
        CHECK(r == 0 && dataset_matches(d, 3, 0, 1, 6), "limit 3: samples 0, 1, 2 (r=%d)", r);
        d = dataset_free(d);
        r = dataset_load(path_in("fm", ""), "test", 1, 1, 2, &d, err, sizeof err);
        CHECK(r < 0 && d == NULL && err[0], "a part with no samples is an error: %s", err);
        r = dataset_load(path_in("fm", ""), "test", 0, 0, 0, &d, err, sizeof err);
        CHECK(r == -EINVAL && d == NULL, "nparts 0 rejected");
        r = dataset_load(path_in("fm", ""), "test", 0, 3, 3, &d, err, sizeof err);
        CHECK(r == -EINVAL && d == NULL, "part >= nparts rejected");

        r = dataset_load(path_in("fm", ""), "train", 0, 0, 1, &d, err, sizeof err);
        CHECK(r == 0 && d && d->shape.d[0] == 2 && d->shape.d[1] == 2 && d->n == 4 && d->y[3] == 0,
              "dataset_load falls back to unpacked files (r=%d %s)", r, err);
        d = dataset_free(d);

        r = dataset_load(path_in("nowhere", ""), "test", 0, 0, 1, &d, err, sizeof err);
        CHECK(r == -ENOENT && d == NULL && strstr(err, "dataset-fashion-mnist") &&
              strstr(err, "nowhere") && strstr(err, "t10k-images-idx3-ubyte.gz") &&
              strstr(err, "--data"),
              "missing directory: -ENOENT and how to install: %s", err);

        make_subdir("nolabels");
        if (write_idx(path_in("nolabels", "t10k-images-idx3-ubyte.gz"), true, 0x803, 3,
                      (uint32_t[]) { 1, 1, 1 }, (uint8_t[]) { 9 }, 1, -1)) {
                r = dataset_load(path_in("nolabels", ""), "test", 0, 0, 1, &d, err, sizeof err);
                CHECK(r == -ENOENT && strstr(err, "t10k-labels-idx1-ubyte.gz") &&
                      strstr(err, "dataset-fashion-mnist"),
                      "missing labels: -ENOENT naming the file: %s", err);
        }

        make_subdir("count");
        if (write_set("count", "t10k", true, 10, 9, 3, 2)) {
                r = dataset_load(path_in("count", ""), "test", 0, 0, 1, &d, err, sizeof err);
                CHECK(r == -EBADMSG && d == NULL && strstr(err, "10 images") && strstr(err, "9 labels"),
                      "10 images but 9 labels: -EBADMSG: %s", err);
        }

        /* Labels in an images file (and the other way round) are not a data set. */
        make_subdir("swapped");
        if (write_set("swapped", "t10k", false, 2, 2, 1, 1) &&
            write_idx(path_in("swapped", "t10k-labels-idx1-ubyte"), false, 0x803, 3,
                      (uint32_t[]) { 2, 1, 1 }, (uint8_t[]) { 1, 2 }, 2, -1)) {
                r = dataset_load(path_in("swapped", ""), "test", 0, 0, 1, &d, err, sizeof err);
                CHECK(r == -EBADMSG && d == NULL, "3-d labels file: -EBADMSG: %s", err);
        }

        make_subdir("corrupt");
        if (write_set("corrupt", "t10k", true, 4, 4, 2, 2) &&
            write_idx(path_in("corrupt", "t10k-images-idx3-ubyte.gz"), true, 0x803, 3,
                      (uint32_t[]) { 4, 2, 2 }, (uint8_t[]) { 1, 2, 3 }, 3, -1)) {
                r = dataset_load(path_in("corrupt", ""), "test", 0, 0, 1, &d, err, sizeof err);
                CHECK(r == -EBADMSG && d == NULL && strstr(err, "t10k-images-idx3-ubyte.gz"),
                      "truncated images: -EBADMSG naming the file: %s", err);
        }
}

/* The installed Fashion-MNIST test set: 10000 images of 28x28, 1000 per class. */
/* dataset_keep: an edge process of one client keeps its share only. */
static void test_keep(bool pixels) {
        const char *kind = pixels ? "bytes" : "floats";
        Dataset *d = dataset_new(6, &(MdShape) { .rank = 1, .d = { 3 } }, pixels);
        if (!CHECK(d != NULL && !d->x == pixels && !d->px == !pixels, "dataset_keep: a data set of %s", kind))
                return;
        for (int i = 0; i < 18; i++) {
                if (pixels)
                        d->px[i] = (uint8_t) i;
                else
                        d->x[i] = (float) i / 255.0f;
        }
        for (int i = 0; i < 6; i++)
                d->y[i] = 10 + i;
        const uint32_t bad1[] = { 2, 1 }, bad2[] = { 1, 6 };
        CHECK(dataset_keep(d, bad1, 2) == -EINVAL && dataset_keep(d, bad2, 2) == -EINVAL && d->n == 6,
              "dataset_keep refuses indices out of order or out of range, and keeps the set (%s)", kind);
        const uint32_t keep[] = { 0, 2, 5 };
        int r = dataset_keep(d, keep, 3);
        bool same = r == 0 && d->n == 3;
        for (uint32_t k = 0; same && k < 3; k++) {
                float v[3];
                dataset_sample(d, k, v);
                for (uint32_t p = 0; p < 3; p++)
                        same &= v[p] == (float) (keep[k] * 3 + p) / 255.0f && d->y[k] == 10 + (int32_t) keep[k];
        }
        CHECK(same, "dataset_keep keeps samples 0, 2, 5 of 6, values and labels, in order (%s)", kind);
        dataset_free(d);
}

static int pick_class7(const int32_t *labels, uint32_t n, void *ud, uint32_t **ret, uint32_t *ret_n) {
        (void) ud;
        uint32_t *idx = malloc((size_t) n * sizeof *idx), k = 0;
        if (!idx)
                return -ENOMEM;
        for (uint32_t i = 0; i < n; i++)
                if (labels[i] == 7)
                        idx[k++] = i;
        *ret = idx;
        *ret_n = k;
        return 0;
}

static int pick_bad(const int32_t *labels, uint32_t n, void *ud, uint32_t **ret, uint32_t *ret_n) {
        (void) labels, (void) ud;
        uint32_t *idx = malloc(2 * sizeof *idx);
        if (!idx || n < 5) {
                free(idx);
                return -ENOMEM;
        }
        idx[0] = 4;
        idx[1] = 2;
        *ret = idx;
        *ret_n = 2;
        return 0;
}

static void test_real(void) {
        const char *cands[] = { getenv("PSNET_DATA"), PSNET_DEFAULT_DATA };
        const char *dir = NULL;
        Dataset *d = NULL, *part = NULL;
        unsigned per_class[10] = { 0 };
        bool labels_ok = true, range_ok = true, part_ok;
        float lo = 1, hi = 0;
        char err[512];
        struct stat st;
        int r;

        for (size_t i = 0; i < 2 && !dir; i++)
                if (cands[i] && stat(cands[i], &st) == 0 && S_ISDIR(st.st_mode))
                        dir = cands[i];
        if (!dir) {
                printf("# skipped: real Fashion-MNIST checks (no %s; apt-get install dataset-fashion-mnist)\n",
                       PSNET_DEFAULT_DATA);
                return;
        }

        r = dataset_load(dir, "test", 0, 0, 1, &d, err, sizeof err);
        if (!CHECK(r == 0 && d, "load the real t10k set from %s: %s", dir, r == 0 ? "ok" : err))
                return;
        CHECK(d->n == 10000 && d->shape.d[0] == 28 && d->shape.d[1] == 28 && d->classes == 10,
              "t10k is 10000 x 28 x 28 of 10 classes (%u x %u x %u, %u)", d->n, d->shape.d[0], d->shape.d[1], d->classes);
        for (uint32_t i = 0; i < d->n; i++) {
                if (d->y[i] < 0 || d->y[i] > 9)
                        labels_ok = false;
                else
                        per_class[d->y[i]]++;
        }
        for (int c = 0; c < 10; c++)
                labels_ok = labels_ok && per_class[c] == 1000;
        CHECK(labels_ok, "t10k labels in 0..9, 1000 of each");
        float v[28 * 28];
        range_ok = d->dim == ELEMENTSOF(v);
        for (uint32_t i = 0; range_ok && i < d->n; i++) {
                dataset_sample(d, i, v);
                for (size_t p = 0; p < ELEMENTSOF(v); p++) {
                        if (!(v[p] >= 0.0f && v[p] <= 1.0f))
                                range_ok = false;
                        lo = fminf(lo, v[p]);
                        hi = fmaxf(hi, v[p]);
                }
        }
        CHECK(range_ok && lo == 0.0f && hi == 1.0f, "t10k pixels span [0, 1] (%g .. %g)", lo, hi);

        r = dataset_load(dir, "test", 100, 3, 4, &part, err, sizeof err);
        part_ok = r == 0 && part && part->n == 25;
        for (uint32_t k = 0; part_ok && k < part->n; k++) {
                size_t src = 3 + 4 * (size_t) k, px = (size_t) 28 * 28;
                part_ok = part->y[k] == d->y[src] &&
                          memcmp(part->px + k * px, d->px + src * px, px) == 0;
        }
        CHECK(part_ok, "t10k limit 100, part 3 of 4: the 25 samples 3, 7, ..., 99");
        dataset_free(part);
        /* Picked: only the samples of class 7 among the first 5000, streamed. */
        Dataset *picked = NULL;
        r = dataset_load_picked(dir, "test", 5000, pick_class7, NULL, &picked, err, sizeof err);
        bool pick_ok = r == 0 && picked && picked->n > 0 && picked->n < 5000;
        uint32_t k = 0;
        for (uint32_t i = 0; pick_ok && i < 5000; i++) {
                if (d->y[i] != 7)
                        continue;
                size_t px = (size_t) 28 * 28;
                pick_ok = k < picked->n && picked->y[k] == 7 &&
                          memcmp(picked->px + k * px, d->px + i * px, px) == 0;
                k++;
        }
        CHECK(pick_ok && k == picked->n, "dataset_load_picked keeps exactly the samples chosen, as the whole set "
              "has them (%u of class 7 in the first 5000): %s", picked ? picked->n : 0, r == 0 ? "ok" : err);
        picked = dataset_free(picked);
        r = dataset_load_picked(dir, "test", 5000, pick_bad, NULL, &picked, err, sizeof err);
        CHECK(r == -EINVAL && !picked && strstr(err, "ascending"), "a pick that is not ascending is refused (%s)",
              err);
        dataset_free(d);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
        (void) st;
        (void) flag;
        (void) ftw;
        return remove(p);
}

int main(void) {
        if (!mkdtemp(tmpdir)) {
                printf("Bail out! mkdtemp: %s\n", strerror(errno));
                return 1;
        }

        test_round_trip();
        test_broken();
        test_dataset();
        test_keep(false);
        test_keep(true);
        test_real();

        if (nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
                printf("# could not remove %s\n", tmpdir);
        return tap_done();
}
