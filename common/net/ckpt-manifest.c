/* A checkpoint's manifest; see ckpt-manifest.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "ckpt-manifest.h"

#define MAGIC "PSNETMF1"
#define HEAD 16u

bool ckpt_name_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > CKPT_NAME_MAX || name[0] == '.')
                return false;
        for (size_t i = 0; i < n; i++) {
                char ch = name[i];
                if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                      ch == '_' || ch == '-'))
                        return false;
        }
        return true;
}

void ckpt_shard_file(unsigned shard, char *buf, size_t n) { snprintf(buf, n, "shard-%u.ckpt", shard); }

int ckpt_manifest_write(const char *dir, const Psnet__CheckpointManifest *m, char *err, size_t errn) {
        char path[PATH_MAX], tmp[PATH_MAX];
        const char *what = "writing";
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        snprintf(tmp, sizeof tmp, "%s/" CKPT_MANIFEST ".tmp", dir);
        size_t len = psnet__checkpoint_manifest__get_packed_size(m);
        uint8_t *buf = len <= CKPT_MANIFEST_MAX ? ps_malloc(HEAD + len) : NULL;
        if (!buf) {
                snprintf(err, errn, "%s: manifest of %zu bytes: out of memory or over the limit", path, len);
                return -ENOMEM;
        }
        psnet__checkpoint_manifest__pack(m, buf + HEAD);
        uint32_t crc = (uint32_t) crc32(crc32(0L, Z_NULL, 0), buf + HEAD, (uInt) len), l32 = (uint32_t) len;
        memcpy(buf, MAGIC, 8);
        memcpy(buf + 8, &crc, 4);
        memcpy(buf + 12, &l32, 4);
        int r = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
                r = -errno;
                what = "creating";
        } else {
                r = ckpt_pwrite_all(fd, buf, HEAD + len, 0);
                if (r < 0)
                        (void) close(fd);
                else
                        r = ckpt_commit(fd, tmp, path, dir, &what);
        }
        if (r < 0) {
                snprintf(err, errn, "%s %s: %s", what, tmp, strerror(-r));
                (void) unlink(tmp);
        }
        ps_free(buf);
        return r;
}

int ckpt_manifest_parse(const uint8_t *buf, size_t n, Psnet__CheckpointManifest **ret, char *err, size_t errn) {
        uint32_t crc, len;
        if (n < HEAD || memcmp(buf, MAGIC, 8) != 0) {
                snprintf(err, errn, "not a psnet checkpoint manifest");
                return -EBADMSG;
        }
        memcpy(&crc, buf + 8, 4);
        memcpy(&len, buf + 12, 4);
        if (len != n - HEAD) {
                snprintf(err, errn, "manifest length %u, file holds %zu", len, n - HEAD);
                return -EBADMSG;
        }
        uint32_t have = (uint32_t) crc32(crc32(0L, Z_NULL, 0), buf + HEAD, len);
        if (have != crc) {
                snprintf(err, errn, "manifest checksum mismatch (stored %08x, computed %08x)", crc, have);
                return -EBADMSG;
        }
        Psnet__CheckpointManifest *m = psnet__checkpoint_manifest__unpack(NULL, len, buf + HEAD);
        if (!m) {
                snprintf(err, errn, "manifest does not decode");
                return -EBADMSG;
        }
        bool ok = ckpt_name_valid(m->name) && m->clock >= 0 && m->job;
        for (size_t i = 0; ok && i < m->n_files; i++) {
                char want[64];
                ckpt_shard_file(m->files[i]->shard, want, sizeof want);
                ok = strcmp(m->files[i]->file, want) == 0;
        }
        if (!ok) {
                psnet__checkpoint_manifest__free_unpacked(m, NULL);
                snprintf(err, errn, "manifest names a bad checkpoint, clock or file");
                return -EBADMSG;
        }
        *ret = m;
        return 0;
}

int ckpt_manifest_read(const char *dir, Psnet__CheckpointManifest **ret, char *err, size_t errn) {
        char path[PATH_MAX], why[160];
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
                int e = -errno;
                snprintf(err, errn, "%s: %s", path, strerror(-e));
                if (fd >= 0)
                        (void) close(fd);
                return e;
        }
        if (st.st_size > (off_t) (CKPT_MANIFEST_MAX + HEAD)) {
                (void) close(fd);
                snprintf(err, errn, "%s: %lld bytes, over the limit", path, (long long) st.st_size);
                return -EBADMSG;
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
        if (r == 0)
                r = ckpt_manifest_parse(buf, n, ret, why, sizeof why);
        else
                snprintf(why, sizeof why, "%s", strerror(-r));
        if (r < 0)
                snprintf(err, errn, "%s: %s", path, why);
        ps_free(buf);
        return r;
}
