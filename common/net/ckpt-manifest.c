/* SPDX-License-Identifier: Apache-2.0 */
/* A checkpoint's manifest; see ckpt-manifest.h. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "ckpt-manifest.h"

#define MAGIC "PSNETMF1"

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
        size_t len = psnet__checkpoint_manifest__get_packed_size(m);
        uint8_t *buf = len <= CKPT_MANIFEST_MAX ? ps_malloc(len ? len : 1) : NULL;
        if (!buf) {
                snprintf(err, errn, "%s/" CKPT_MANIFEST ": manifest of %zu bytes: out of memory or over the limit",
                         dir, len);
                return -ENOMEM;
        }
        psnet__checkpoint_manifest__pack(m, buf);
        int r = ckpt_sealed_write(dir, CKPT_MANIFEST, MAGIC, buf, len, err, errn);
        ps_free(buf);
        return r;
}

int ckpt_manifest_parse(const uint8_t *buf, size_t n, Psnet__CheckpointManifest **ret, char *err, size_t errn) {
        const uint8_t *payload;
        size_t len;
        int r = ckpt_sealed_open(buf, n, MAGIC, "checkpoint manifest", &payload, &len, err, errn);
        if (r < 0)
                return r;
        Psnet__CheckpointManifest *m = psnet__checkpoint_manifest__unpack(NULL, len, payload);
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
        uint8_t *buf = NULL;
        size_t n = 0;
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        int r = ckpt_sealed_read(path, CKPT_MANIFEST_MAX, &buf, &n, err, errn);
        if (r < 0)
                return r;
        r = ckpt_manifest_parse(buf, n, ret, why, sizeof why);
        if (r < 0)
                snprintf(err, errn, "%s: %s", path, why);
        ps_free(buf);
        return r;
}
