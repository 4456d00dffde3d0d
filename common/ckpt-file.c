/* SPDX-License-Identifier: Apache-2.0 */
/* A shard's checkpoint file; see ckpt-file.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "alloc.h"
#include "ckpt-file.h"

struct CkptReader {
        int fd;
        char path[PATH_MAX];
        uint64_t size;
        CkptHeader h;
        CkptEntry *e;
};

uint64_t ckpt_record_bytes(uint32_t len, uint32_t nlast, uint32_t per) {
        if (len > CKPT_MAX_LEN || nlast > CKPT_MAX_NLAST || per > CKPT_MAX_PER)
                return 0;
        return (uint64_t) nlast * 8u + (uint64_t) len * 4u * (1u + per);
}

static uint32_t crc_update(uint32_t crc, const void *p, uint64_t n) {
        const Bytef *b = p;
        while (n > 0) {
                uInt k = n > (1u << 30) ? (1u << 30) : (uInt) n;
                crc = (uint32_t) crc32(crc, b, k);
                b += k;
                n -= k;
        }
        return crc;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

int ckpt_pwrite_all(int fd, const void *p, uint64_t n, uint64_t at) {
        const char *b = p;
        while (n > 0) {
                ssize_t k = pwrite(fd, b, n > (1u << 30) ? (1u << 30) : (size_t) n, (off_t) at);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                b += k;
                n -= (uint64_t) k;
                at += (uint64_t) k;
        }
        return 0;
}

int ckpt_commit(int fd, const char *tmp, const char *path, const char *dir, const char **what) {
        int r = 0;
        if (fsync(fd) < 0) {
                r = -errno;
                *what = "syncing";
        }
        if (close(fd) < 0 && r == 0) {
                r = -errno;
                *what = "closing";
        }
        if (r == 0 && rename(tmp, path) < 0) {
                r = -errno;
                *what = "renaming";
        }
        if (r < 0)
                return r;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0) {
                r = -errno;
                *what = "syncing the directory of";
                (void) unlink(path);
        }
        if (dfd >= 0)
                (void) close(dfd);
        return r;
}

void ckpt_sealed_head(const char *magic, const void *payload, size_t len, uint8_t head[CKPT_SEALED_HEAD]) {
        memcpy(head, magic, 8);
        put32(head + 8, crc_update((uint32_t) crc32(0L, Z_NULL, 0), payload, len));
        put32(head + 12, (uint32_t) len);
}

int ckpt_sealed_write(const char *dir, const char *file, const char *magic, const void *payload, size_t len,
                      char *err, size_t errn) {
        char path[PATH_MAX], tmp[PATH_MAX + 8];
        const char *what = "writing";
        uint8_t head[CKPT_SEALED_HEAD];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (len > UINT32_MAX) {
                snprintf(err, errn, "%s: %zu bytes, over the limit", path, len);
                return -EFBIG;
        }
        ckpt_sealed_head(magic, payload, len, head);
        int r = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
                r = -errno;
                what = "creating";
        } else {
                r = ckpt_pwrite_all(fd, head, sizeof head, 0);
                if (r == 0)
                        r = ckpt_pwrite_all(fd, payload, len, sizeof head);
                if (r < 0)
                        (void) close(fd);
                else
                        r = ckpt_commit(fd, tmp, path, dir, &what);
        }
        if (r < 0) {
                snprintf(err, errn, "%s %s: %s", what, tmp, strerror(-r));
                (void) unlink(tmp);
        }
        return r;
}

int ckpt_sealed_read(const char *path, size_t max, uint8_t **ret, size_t *ret_n, char *err, size_t errn) {
        int r = ckpt_read_file(path, (uint64_t) max + CKPT_SEALED_HEAD, ret, ret_n, err, errn);
        return r == -EFBIG ? -EBADMSG : r;
}

int ckpt_read_file(const char *path, uint64_t max, uint8_t **ret, size_t *ret_n, char *err, size_t errn) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
                int e = -errno;
                snprintf(err, errn, "%s: %s", path, strerror(-e));
                if (fd >= 0)
                        (void) close(fd);
                return e;
        }
        if ((uint64_t) st.st_size > max || (uint64_t) st.st_size > SIZE_MAX) {
                (void) close(fd);
                snprintf(err, errn, "%s: %lld bytes, more than the %llu allowed", path, (long long) st.st_size,
                         (unsigned long long) max);
                return -EFBIG;
        }
        size_t n = (size_t) st.st_size, done = 0;
        uint8_t *buf = ps_malloc(n ? n : 1);
        int r = buf ? 0 : -ENOMEM;
        while (r == 0 && done < n) {
                ssize_t k = read(fd, buf + done, n - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        r = k < 0 ? -errno : -EIO;
                else
                        done += (size_t) k;
        }
        (void) close(fd);
        if (r < 0) {
                snprintf(err, errn, "%s: %s", path, strerror(-r));
                ps_free(buf);
                return r;
        }
        *ret = buf;
        *ret_n = n;
        return 0;
}

int ckpt_sealed_open(const uint8_t *buf, size_t n, const char *magic, const char *what, const uint8_t **payload,
                     size_t *len, char *err, size_t errn) {
        if (n < CKPT_SEALED_HEAD || memcmp(buf, magic, 8) != 0) {
                snprintf(err, errn, "not a psnet %s", what);
                return -EBADMSG;
        }
        uint32_t crc = get32(buf + 8), l = get32(buf + 12);
        if (l != n - CKPT_SEALED_HEAD) {
                snprintf(err, errn, "%s length %u, file holds %zu", what, l, n - CKPT_SEALED_HEAD);
                return -EBADMSG;
        }
        uint32_t have = (uint32_t) crc32(crc32(0L, Z_NULL, 0), buf + CKPT_SEALED_HEAD, l);
        if (have != crc) {
                snprintf(err, errn, "%s checksum mismatch (stored %08x, computed %08x)", what, crc, have);
                return -EBADMSG;
        }
        *payload = buf + CKPT_SEALED_HEAD;
        *len = l;
        return 0;
}

static void encode_header(uint8_t *h, uint32_t shard, uint32_t job, uint32_t nrec, int64_t clock, uint32_t per) {
        memset(h, 0, CKPT_HEADER_BYTES);
        memcpy(h, CKPT_MAGIC, 8);
        put32(h + 8, CKPT_VERSION);
        put32(h + 12, shard);
        put32(h + 16, job);
        put32(h + 20, nrec);
        put64(h + 24, (uint64_t) clock);
        put32(h + 32, per);
        put64(h + 40, (uint64_t) nrec * CKPT_ENTRY_BYTES);
        /* 48..59 reserved, 60: the CRC */
}

static void encode_entry(uint8_t *p, const CkptEntry *e) {
        put32(p, e->tensor);
        put32(p + 4, e->chunk);
        put32(p + 8, e->len);
        put32(p + 12, e->nlast);
        put64(p + 16, e->steps);
        put64(p + 24, (uint64_t) e->clock);
        put64(p + 32, e->offset);
        put64(p + 40, e->bytes);
        put32(p + 48, e->crc);
        put32(p + 52, 0);
}

int ckpt_write(const char *dir, const char *name, uint32_t shard, uint32_t job, int64_t clock, uint32_t per,
               const CkptRecord *recs, size_t n, CkptFileInfo *ret, char *err, size_t errn) {
        return ckpt_write_fill(dir, name, shard, job, clock, per, recs, n, NULL, NULL, ret, err, errn);
}

int ckpt_write_fill(const char *dir, const char *name, uint32_t shard, uint32_t job, int64_t clock, uint32_t per,
                    const CkptRecord *recs, size_t n, CkptFillFn fill, void *ud, CkptFileInfo *ret, char *err,
                    size_t errn) {
        char path[PATH_MAX], tmp[PATH_MAX];
        uint8_t *scratch = NULL;        /* records filled as they are written: the largest one's */
        uint64_t scratch_bytes = 0;
        const char *what = "writing";
        if (n > CKPT_MAX_RECORDS || per > CKPT_MAX_PER || snprintf(path, sizeof path, "%s/%s", dir, name) >= PATH_MAX ||
            snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name) >= PATH_MAX) {
                snprintf(err, errn, "%s/%s: name too long or too many chunks", dir, name);
                return -EINVAL;
        }
        size_t index_bytes = n * CKPT_ENTRY_BYTES;
        uint8_t *head = ps_calloc(1, CKPT_HEADER_BYTES + index_bytes);
        if (!head) {
                snprintf(err, errn, "%s: out of memory", tmp);
                return -ENOMEM;
        }
        int r = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
                r = -errno;
                what = "creating";
                goto out;
        }
        /* Header and index last, once the records' offsets and CRCs are known. */
        uint64_t off = CKPT_HEADER_BYTES + index_bytes;
        for (size_t i = 0; i < n && r == 0; i++) {
                CkptRecord filled;
                const CkptRecord *c = &recs[i];
                if (!c->values) {
                        uint64_t need = (uint64_t) c->nlast * 8u + (uint64_t) c->len * 4u;
                        if (!fill || c->len > CKPT_MAX_LEN || c->nlast > CKPT_MAX_NLAST) {
                                r = -EINVAL;
                                break;
                        }
                        if (need > scratch_bytes) {
                                ps_free(scratch);
                                scratch_bytes = 0;
                                if (!(scratch = ps_malloc(need ? need : 1))) {
                                        r = -ENOMEM;
                                        what = "filling";
                                        break;
                                }
                                scratch_bytes = need;
                        }
                        filled = *c;
                        filled.last_clocks = (const int64_t *) scratch;
                        filled.values = (const float *) (scratch + (uint64_t) c->nlast * 8u);
                        r = fill(ud, c, (int64_t *) scratch, (float *) (scratch + (uint64_t) c->nlast * 8u));
                        if (r < 0) {
                                what = "filling";
                                break;
                        }
                        c = &filled;
                }
                CkptEntry e = { .tensor = c->tensor, .chunk = c->chunk, .len = c->len, .nlast = c->nlast,
                                .steps = c->steps, .clock = c->clock, .offset = off,
                                .bytes = ckpt_record_bytes(c->len, c->nlast, ckpt_record_per(c->tensor, per)) };
                uint32_t rper = ckpt_record_per(c->tensor, per);
                if (e.bytes == 0 || (rper && !c->state)) {
                        r = -EINVAL;
                        break;
                }
                uint32_t crc = (uint32_t) crc32(0L, Z_NULL, 0);
                crc = crc_update(crc, c->last_clocks, (uint64_t) c->nlast * 8u);
                crc = crc_update(crc, c->values, (uint64_t) c->len * 4u);
                if (rper)
                        crc = crc_update(crc, c->state, (uint64_t) c->len * 4u * rper);
                e.crc = crc;
                uint64_t at = off, nb = (uint64_t) c->nlast * 8u, vb = (uint64_t) c->len * 4u;
                r = ckpt_pwrite_all(fd, c->last_clocks, nb, at);
                if (r == 0)
                        r = ckpt_pwrite_all(fd, c->values, vb, at + nb);
                if (r == 0 && rper)
                        r = ckpt_pwrite_all(fd, c->state, vb * rper, at + nb + vb);
                encode_entry(head + CKPT_HEADER_BYTES + i * CKPT_ENTRY_BYTES, &e);
                off += e.bytes;
        }
        if (r < 0)
                goto out;
        encode_header(head, shard, job, (uint32_t) n, clock, per);
        uint32_t icrc = crc_update((uint32_t) crc32(0L, Z_NULL, 0), head, CKPT_HEADER_BYTES + index_bytes);
        put32(head + 60, icrc);
        r = ckpt_pwrite_all(fd, head, CKPT_HEADER_BYTES + index_bytes, 0);
        if (r < 0)
                goto out;
        r = ckpt_commit(fd, tmp, path, dir, &what);
        fd = -1;
        if (r < 0)
                goto out;
        if (ret)
                *ret = (CkptFileInfo) { .bytes = off, .index_crc = icrc, .nrec = (uint32_t) n };
out:
        if (fd >= 0)
                (void) close(fd);
        if (r < 0) {
                snprintf(err, errn, "%s %s: %s", what, tmp, strerror(-r));
                (void) unlink(tmp);
        }
        ps_free(scratch);
        ps_free(head);
        return r;
}

#define BAD(...) do { snprintf(err, errn, __VA_ARGS__); r = -EBADMSG; goto fail; } while (0)

int ckpt_check_index(const uint8_t *buf, size_t n, uint64_t file_size, CkptHeader *header, CkptEntry **entries,
                     char *err, size_t errn) {
        CkptEntry *e = NULL;
        int r = 0;
        if (n < CKPT_HEADER_BYTES || file_size < n)
                BAD("shorter than a header (%llu bytes)", (unsigned long long) file_size);
        if (memcmp(buf, CKPT_MAGIC, 8) != 0)
                BAD("not a psnet checkpoint file (bad magic)");
        CkptHeader h = { .version = get32(buf + 8), .shard = get32(buf + 12), .job = get32(buf + 16),
                         .nrec = get32(buf + 20), .clock = (int64_t) get64(buf + 24), .per = get32(buf + 32),
                         .index_crc = get32(buf + 60) };
        uint64_t index_bytes = get64(buf + 40);
        if (h.version != CKPT_VERSION)
                BAD("version %u (this build reads %u)", h.version, CKPT_VERSION);
        if (h.nrec > CKPT_MAX_RECORDS || index_bytes != (uint64_t) h.nrec * CKPT_ENTRY_BYTES || h.per > CKPT_MAX_PER)
                BAD("bad header (records %u, index %llu bytes, state %u per value)", h.nrec,
                    (unsigned long long) index_bytes, h.per);
        if (n < CKPT_HEADER_BYTES + index_bytes)
                BAD("index cut short (%zu of %llu bytes)", n, (unsigned long long) (CKPT_HEADER_BYTES + index_bytes));
        uint8_t zero[4] = { 0 };
        uint32_t crc = crc_update((uint32_t) crc32(0L, Z_NULL, 0), buf, 60);
        crc = crc_update(crc, zero, 4);
        crc = crc_update(crc, buf + CKPT_HEADER_BYTES, index_bytes);
        if (crc != h.index_crc)
                BAD("header checksum mismatch (stored %08x, computed %08x)", h.index_crc, crc);
        e = ps_calloc(h.nrec ? h.nrec : 1, sizeof *e);
        if (!e) {
                snprintf(err, errn, "out of memory");
                return -ENOMEM;
        }
        uint64_t data_start = CKPT_HEADER_BYTES + index_bytes;
        for (uint32_t i = 0; i < h.nrec; i++) {
                const uint8_t *p = buf + CKPT_HEADER_BYTES + (size_t) i * CKPT_ENTRY_BYTES;
                CkptEntry *x = &e[i];
                *x = (CkptEntry) { .tensor = get32(p), .chunk = get32(p + 4), .len = get32(p + 8),
                                   .nlast = get32(p + 12), .steps = get64(p + 16), .clock = (int64_t) get64(p + 24),
                                   .offset = get64(p + 32), .bytes = get64(p + 40), .crc = get32(p + 48) };
                uint64_t want = ckpt_record_bytes(x->len, x->nlast, ckpt_record_per(x->tensor, h.per));
                if (want == 0 || x->bytes != want)
                        BAD("record %u: key (%u,%u) holds %llu bytes, expected %llu", i, x->tensor, x->chunk,
                            (unsigned long long) x->bytes, (unsigned long long) want);
                if (x->offset < data_start || x->offset > file_size || x->bytes > file_size - x->offset)
                        BAD("record %u: key (%u,%u) lies outside the file (offset %llu, %llu bytes, file %llu)", i,
                            x->tensor, x->chunk, (unsigned long long) x->offset, (unsigned long long) x->bytes,
                            (unsigned long long) file_size);
        }
        if (header)
                *header = h;
        if (entries) {
                *entries = e;
                e = NULL;
        }
fail:
        ps_free(e);
        return r;
}

int ckpt_open(const char *path, CkptReader **ret, char *err, size_t errn) {
        char why[192];
        CkptReader *r = ps_calloc(1, sizeof *r);
        if (!r) {
                snprintf(err, errn, "%s: out of memory", path);
                return -ENOMEM;
        }
        snprintf(r->path, sizeof r->path, "%s", path);
        r->fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        int e = 0;
        if (r->fd < 0 || fstat(r->fd, &st) < 0) {
                e = -errno;
                snprintf(err, errn, "%s: %s", path, strerror(-e));
                ckpt_close(r);
                return e;
        }
        r->size = (uint64_t) st.st_size;
        uint8_t h[CKPT_HEADER_BYTES];
        ssize_t k = pread(r->fd, h, sizeof h, 0);
        uint64_t index_bytes = k == (ssize_t) sizeof h ? get64(h + 40) : 0;
        if (k != (ssize_t) sizeof h || index_bytes > (uint64_t) CKPT_MAX_RECORDS * CKPT_ENTRY_BYTES ||
            index_bytes > r->size - sizeof h) {
                snprintf(err, errn, "%s: %s", path, k < 0 ? strerror(errno) : "too short for its header and index");
                ckpt_close(r);
                return -EBADMSG;
        }
        uint8_t *buf = ps_malloc(sizeof h + index_bytes);
        if (!buf) {
                snprintf(err, errn, "%s: out of memory", path);
                ckpt_close(r);
                return -ENOMEM;
        }
        k = pread(r->fd, buf, sizeof h + index_bytes, 0);
        e = k == (ssize_t) (sizeof h + index_bytes)
                    ? ckpt_check_index(buf, (size_t) k, r->size, &r->h, &r->e, why, sizeof why)
                    : -EIO;
        ps_free(buf);
        if (e < 0) {
                snprintf(err, errn, "%s: %s", path, e == -EIO ? "short read" : why);
                ckpt_close(r);
                return e;
        }
        *ret = r;
        return 0;
}

const CkptHeader *ckpt_header(const CkptReader *r) { return &r->h; }
const CkptEntry *ckpt_entry(const CkptReader *r, size_t i) { return i < r->h.nrec ? &r->e[i] : NULL; }

int ckpt_read(CkptReader *r, size_t i, void *buf, char *err, size_t errn) {
        const CkptEntry *e = ckpt_entry(r, i);
        if (!e)
                return -EINVAL;
        uint64_t n = e->bytes;
        return ckpt_read_parts(r, i, &buf, &n, 1, err, errn);
}

int ckpt_read_parts(CkptReader *r, size_t i, void *const *parts, const uint64_t *lens, size_t nparts, char *err,
                    size_t errn) {
        const CkptEntry *e = ckpt_entry(r, i);
        uint64_t total = 0;
        for (size_t p = 0; p < nparts; p++)
                total += lens[p];
        if (!e || total != e->bytes)
                return -EINVAL;
        uint32_t crc = (uint32_t) crc32(0L, Z_NULL, 0);
        uint64_t at = e->offset;
        for (size_t p = 0; p < nparts; p++) {
                uint64_t done = 0;
                while (done < lens[p]) {
                        size_t want = lens[p] - done > (1u << 30) ? (1u << 30) : (size_t) (lens[p] - done);
                        ssize_t k = pread(r->fd, (char *) parts[p] + done, want, (off_t) (at + done));
                        if (k < 0 && errno == EINTR)
                                continue;
                        if (k <= 0) {
                                snprintf(err, errn, "%s: key (%u,%u): %s", r->path, e->tensor, e->chunk,
                                         k < 0 ? strerror(errno) : "file cut short");
                                return -EIO;
                        }
                        done += (uint64_t) k;
                }
                if (lens[p])
                        crc = crc_update(crc, parts[p], lens[p]);
                at += lens[p];
        }
        if (crc != e->crc) {
                snprintf(err, errn, "%s: key (%u,%u): checksum mismatch (stored %08x, computed %08x)", r->path,
                         e->tensor, e->chunk, e->crc, crc);
                return -EBADMSG;
        }
        return 0;
}

CkptReader *ckpt_close(CkptReader *r) {
        if (!r)
                return NULL;
        if (r->fd >= 0)
                (void) close(r->fd);
        ps_free(r->e);
        ps_free(r);
        return NULL;
}
