/* SPDX-License-Identifier: Apache-2.0 */
/* IDX reader and the Fashion-MNIST data set. zlib's gz* functions read both
 * gzip and raw files, so one code path serves Debian's .gz files and unpacked
 * copies. Everything read from a file is checked before it sizes an allocation:
 * a bad or truncated file is -EBADMSG, never a crash. See idx.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "alloc.h"
#include "idx.h"
#include "macro.h"

#define IDX_MAGIC_LABELS 0x00000801u
#define IDX_MAGIC_IMAGES 0x00000803u
/* Far beyond any MNIST-like set (train images are 47M); rejects garbage dims. */
#define IDX_MAX_ELEMENTS 100000000ull

static void gz_closep(gzFile *f) {
        if (*f)
                (void) gzclose(*f);
}

static uint32_t be32(const uint8_t b[4]) {
        return (uint32_t) b[0] << 24 | (uint32_t) b[1] << 16 | (uint32_t) b[2] << 8 | b[3];
}

/* Reads exactly len bytes; a short read (end of file) or a corrupt gzip stream
 * is -EBADMSG, a failing read(2) its errno. */
static int gz_read_full(gzFile f, void *buf, size_t len) {
        uint8_t *p = buf;

        while (len > 0) {
                unsigned chunk = (unsigned) MIN(len, (size_t) (INT_MAX / 2));
                int n = gzread(f, p, chunk);
                if (n < 0) {
                        int zerr;
                        (void) gzerror(f, &zerr);
                        if (zerr == Z_ERRNO)
                                return errno > 0 ? -errno : -EIO;
                        if (zerr == Z_MEM_ERROR)
                                return -ENOMEM;
                        return -EBADMSG;
                }
                if (n == 0)
                        return -EBADMSG;
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

int idx_read(const char *path, uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim) {
        return idx_read_first(path, 0, ret_data, dims, ret_ndim);
}

int idx_read_first(const char *path, uint32_t max_items, uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim) {
        _cleanup_(gz_closep) gzFile f = NULL;
        _cleanup_free_ uint8_t *data = NULL;
        uint8_t hdr[4], raw[3][4];
        uint32_t d[3] = { 0, 0, 0 };
        unsigned ndim;
        uint64_t total = 1;
        int fd, r, zerr;

        if (!path || !ret_data || !dims || !ret_ndim)
                return -EINVAL;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        f = gzdopen(fd, "rb");
        if (!f) {
                (void) close(fd);
                return -ENOMEM;
        }
        (void) gzbuffer(f, 1 << 17);

        r = gz_read_full(f, hdr, sizeof hdr);
        if (r < 0)
                return r;
        if (be32(hdr) != IDX_MAGIC_LABELS && be32(hdr) != IDX_MAGIC_IMAGES)
                return -EBADMSG;
        ndim = hdr[3];

        r = gz_read_full(f, raw, 4 * ndim);
        if (r < 0)
                return r;
        for (unsigned i = 0; i < ndim; i++) {
                d[i] = be32(raw[i]);
                if (d[i] == 0)
                        return -EBADMSG;
                total *= d[i];
                if (total > IDX_MAX_ELEMENTS)
                        return -EBADMSG;
        }

        /* The first max_items items are kept; the rest is read through a small
         * buffer, so the trailer is still checked. */
        uint64_t keep = total;
        if (max_items > 0 && max_items < d[0])
                keep = total / d[0] * max_items;
        data = ps_malloc((size_t) keep);
        if (!data)
                return -ENOMEM;
        r = gz_read_full(f, data, (size_t) keep);
        if (r < 0)
                return r;
        uint8_t skip[1 << 16];
        for (uint64_t left = total - keep; left > 0;) {
                size_t n = (size_t) MIN(left, (uint64_t) sizeof skip);
                r = gz_read_full(f, skip, n);
                if (r < 0)
                        return r;
                left -= n;
        }

        /* The header sized the payload: anything after it means the header is
         * wrong. Reading on also makes zlib check the gzip trailer (CRC, size). */
        if (gzgetc(f) != -1)
                return -EBADMSG;
        (void) gzerror(f, &zerr);
        if (zerr == Z_ERRNO)
                return errno > 0 ? -errno : -EIO;
        if (zerr != Z_OK)
                return -EBADMSG;

        r = gzclose(f);
        f = NULL;
        if (r != Z_OK)
                return r == Z_ERRNO ? -EIO : -EBADMSG;

        for (unsigned i = 0; i < 3; i++)
                dims[i] = d[i];
        *ret_ndim = ndim;
        *ret_data = data;
        data = NULL;
        return 0;
}

/* Reads dir/<set>-<kind>.gz, else dir/<set>-<kind>; on failure explains in err. */
static int dataset_read_file(const char *dir, const char *set, const char *kind, uint32_t max_items,
                             uint8_t **ret_data, uint32_t dims[3], unsigned *ret_ndim, char *err, size_t errlen) {
        char path[PATH_MAX];
        int r, n;

        n = snprintf(path, sizeof path, "%s/%s-%s.gz", dir, set, kind);
        if (n < 0 || (size_t) n >= sizeof path) {
                snprintf(err, errlen, "data directory path too long: %s", dir);
                return -ENAMETOOLONG;
        }
        r = idx_read_first(path, max_items, ret_data, dims, ret_ndim);
        if (r == -ENOENT) {
                path[n - 3] = '\0';
                r = idx_read_first(path, max_items, ret_data, dims, ret_ndim);
                if (r == -ENOENT) {
                        snprintf(err, errlen,
                                 "Fashion-MNIST not found in %s (looked for %s-%s.gz, and for NumPy "
                                 "arrays x_train.npy and y_train.npy): install it with 'apt-get "
                                 "install dataset-fashion-mnist' or pass --data DIR",
                                 dir, set, kind);
                        return r;
                }
        }
        if (r == -EBADMSG)
                snprintf(err, errlen, "%s is not a valid IDX file (bad magic, dimensions or truncated)",
                         path);
        else if (r < 0)
                snprintf(err, errlen, "failed to read %s: %s", path, strerror(-r));
        return r;
}

int idx_dataset_load(const char *dir, const char *set, uint32_t limit, uint32_t part, uint32_t nparts,
                     Dataset **ret, char *err, size_t errlen) {
        _cleanup_free_ uint8_t *images = NULL, *labels = NULL;
        uint32_t idims[3], ldims[3], total, count, pixels;
        unsigned indim, lndim;
        int r;

        r = dataset_read_file(dir, set, "images-idx3-ubyte", limit, &images, idims, &indim, err, errlen);
        if (r < 0)
                return r;
        r = dataset_read_file(dir, set, "labels-idx1-ubyte", limit, &labels, ldims, &lndim, err, errlen);
        if (r < 0)
                return r;

        if (indim != 3 || lndim != 1) {
                snprintf(err, errlen,
                         "%s/%s: expected 3-d images and 1-d labels, found %u-d and %u-d", dir,
                         set, indim, lndim);
                return -EBADMSG;
        }
        if (idims[0] != ldims[0]) {
                snprintf(err, errlen, "%s/%s: %u images but %u labels", dir, set, idims[0],
                         ldims[0]);
                return -EBADMSG;
        }

        count = dataset_part_count(idims[0], limit, part, nparts, &total);
        if (count == 0) {
                snprintf(err, errlen, "%s/%s: part %u of %u gets none of the %u samples", dir, set,
                         part, nparts, total);
                return -EINVAL;
        }
        pixels = idims[1] * idims[2]; /* idx_read bounds the product */

        Dataset *d = dataset_new(count, &(MdShape) { .rank = 2, .d = { idims[1], idims[2] } }, true);
        if (!d) {
                snprintf(err, errlen, "out of memory loading %s/%s", dir, set);
                return -ENOMEM;
        }
        d->format = "idx";
        if (nparts == 1) { /* the images read are the set's pixels: kept, not copied */
                ps_free(d->px);
                d->px = images;
                images = NULL;
        }
        for (uint32_t i = 0; i < count; i++) {
                size_t src = (size_t) part + (size_t) i * nparts;
                if (nparts > 1)
                        memcpy(d->px + (size_t) i * pixels, images + src * pixels, pixels);
                d->y[i] = labels[src];
                d->classes = MAX(d->classes, (uint32_t) labels[src] + 1);
        }

        *ret = d;
        return 0;
}

/* Opens dir/<prefix>-<kind>(.gz) for streaming; path gets its name. */
static int open_idx(const char *dir, const char *prefix, const char *kind, gzFile *ret, char *path, size_t pn) {
        int fd = -1;
        for (int gz = 1; gz >= 0 && fd < 0; gz--) {
                if ((size_t) snprintf(path, pn, "%s/%s-%s%s", dir, prefix, kind, gz ? ".gz" : "") >= pn)
                        return -ENAMETOOLONG;
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0 && errno != ENOENT)
                        return -errno;
        }
        if (fd < 0)
                return -ENOENT;
        *ret = gzdopen(fd, "rb");
        if (!*ret) {
                (void) close(fd);
                return -ENOMEM;
        }
        (void) gzbuffer(*ret, 1 << 17);
        return 0;
}

int idx_dataset_load_picked(const char *dir, const char *prefix, uint32_t limit, DatasetPickFn pick, void *ud,
                            Dataset **ret, char *err, size_t errlen) {
        _cleanup_free_ uint8_t *labels = NULL;
        _cleanup_free_ int32_t *y = NULL;
        _cleanup_free_ uint32_t *idx = NULL;
        _cleanup_free_ uint8_t *row = NULL;
        _cleanup_(gz_closep) gzFile f = NULL;
        uint32_t ldims[3], nidx = 0;
        unsigned lndim;
        char path[PATH_MAX];
        /* The labels whole (small), so that pick sees them all. */
        int r = dataset_read_file(dir, prefix, "labels-idx1-ubyte", limit, &labels, ldims, &lndim, err, errlen);
        if (r < 0)
                return r;
        if (lndim != 1) {
                snprintf(err, errlen, "%s/%s: expected 1-d labels, found %u-d", dir, prefix, lndim);
                return -EBADMSG;
        }
        uint32_t n = limit && limit < ldims[0] ? limit : ldims[0];
        y = ps_malloc(MAX(n, 1u) * sizeof *y);
        if (!y) {
                snprintf(err, errlen, "out of memory loading %s/%s", dir, prefix);
                return -ENOMEM;
        }
        for (uint32_t i = 0; i < n; i++)
                y[i] = labels[i];
        r = pick(y, n, ud, &idx, &nidx);
        if (r < 0) {
                snprintf(err, errlen, "%s/%s: choosing this client's samples: %s", dir, prefix, strerror(-r));
                return r;
        }
        for (uint32_t k = 0; k < nidx; k++)
                if (idx[k] >= n || (k && idx[k] <= idx[k - 1])) {
                        snprintf(err, errlen, "%s/%s: the samples chosen are not ascending indices below %u", dir,
                                 prefix, n);
                        return -EINVAL;
                }
        if (nidx == 0) {
                snprintf(err, errlen, "%s/%s: none of the %u samples is this client's", dir, prefix, n);
                return -EINVAL;
        }
        /* The images streamed: only the rows chosen are kept (as floats), the
         * rest read through, so that the whole file is still checked. */
        r = open_idx(dir, prefix, "images-idx3-ubyte", &f, path, sizeof path);
        if (r < 0) {
                snprintf(err, errlen, "failed to open %s/%s-images-idx3-ubyte(.gz): %s", dir, prefix, strerror(-r));
                return r;
        }
        uint8_t hdr[4], raw[3][4];
        r = gz_read_full(f, hdr, sizeof hdr);
        if (r == 0 && (be32(hdr) != IDX_MAGIC_IMAGES || hdr[3] != 3))
                r = -EBADMSG;
        if (r == 0)
                r = gz_read_full(f, raw, sizeof raw);
        uint32_t d0 = r == 0 ? be32(raw[0]) : 0, h = r == 0 ? be32(raw[1]) : 0, w = r == 0 ? be32(raw[2]) : 0;
        if (r == 0 && (d0 != ldims[0] || h == 0 || w == 0 || (uint64_t) d0 * h * w > IDX_MAX_ELEMENTS))
                r = -EBADMSG;
        if (r < 0) {
                snprintf(err, errlen, "%s is not a valid IDX file of %u images (bad magic, dimensions or truncated)",
                         path, ldims[0]);
                return r;
        }
        uint32_t pixels = h * w;
        Dataset *d = dataset_new(nidx, &(MdShape) { .rank = 2, .d = { h, w } }, true);
        row = ps_malloc(pixels);
        if (!d || !row) {
                dataset_free(d);
                snprintf(err, errlen, "out of memory loading %s/%s", dir, prefix);
                return -ENOMEM;
        }
        d->format = "idx";
        uint32_t k = 0;
        for (uint32_t i = 0; r == 0 && i < d0; i++) {
                r = gz_read_full(f, row, pixels);
                if (r < 0 || k == nidx || idx[k] != i)
                        continue;
                memcpy(d->px + (size_t) k * pixels, row, pixels);
                d->y[k] = y[i];
                d->classes = MAX(d->classes, (uint32_t) y[i] + 1);
                k++;
        }
        int zerr;
        if (r == 0 && gzgetc(f) != -1)
                r = -EBADMSG; /* more than the header said */
        if (r == 0) {
                (void) gzerror(f, &zerr);
                if (zerr != Z_OK)
                        r = zerr == Z_ERRNO ? -EIO : -EBADMSG;
        }
        if (r < 0) {
                dataset_free(d);
                snprintf(err, errlen, "%s is not a valid IDX file (truncated, or a corrupt stream): %s", path,
                         strerror(-r));
                return r;
        }
        *ret = d;
        return 0;
}
