/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: everything psnet reads back from disk after a crash or a
 * bad copy. The first byte picks the reader, the rest is the file:
 *   0  a shard's checkpoint file (ckpt_open, then every record by ckpt_read);
 *   1  a checkpoint manifest (ckpt_manifest_parse);
 *   2  pscoord's state file (the sealed file, then CoordState).
 * Each accepts or refuses with a reason; none crashes or reads out of bounds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "ckpt-manifest.h"
#include "fuzz-util.h"

static void shard_file(const uint8_t *data, size_t size) {
        const char *path = fuzz_file(data, size);
        char err[512];
        CkptReader *r = NULL;
        if (!path)
                abort();
        if (ckpt_open(path, &r, err, sizeof err) < 0) {
                if (!err[0])
                        abort();
                return;
        }
        const CkptHeader *h = ckpt_header(r);
        for (size_t i = 0; i < h->nrec; i++) {
                const CkptEntry *e = ckpt_entry(r, i);
                void *buf = ps_malloc(e->bytes ? e->bytes : 1);
                if (!buf)
                        break;
                int k = ckpt_read(r, i, buf, err, sizeof err);
                if (k < 0 && !err[0])
                        abort();
                ps_free(buf);
        }
        ckpt_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        char err[512] = "";
        switch (data[0] % 3) {
        case 0:
                shard_file(data + 1, size - 1);
                break;
        case 1: {
                Psnet__CheckpointManifest *m = NULL;
                if (ckpt_manifest_parse(data + 1, size - 1, &m, err, sizeof err) == 0)
                        psnet__checkpoint_manifest__free_unpacked(m, NULL);
                else if (!err[0])
                        abort();
                break;
        }
        default: {
                const uint8_t *p;
                size_t n;
                if (ckpt_sealed_open(data + 1, size - 1, "PSNETCS1", "pscoord state", &p, &n, err, sizeof err) == 0) {
                        Psnet__CoordState *st = psnet__coord_state__unpack(NULL, n, p);
                        if (st)
                                psnet__coord_state__free_unpacked(st, NULL);
                } else if (!err[0])
                        abort();
        }
        }
        return 0;
}
