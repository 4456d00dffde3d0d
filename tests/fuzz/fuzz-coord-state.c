/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: pscoord loading its state file (--state-dir) past the
 * decoding. The input is the CoordState message; the target seals it (magic,
 * CRC-32, length) as pscoord writes it, so that mutations reach pscoord's
 * checks of the state (the job validates, the map fits the job, a running job
 * has a map, no peer twice, sane sizes) instead of stopping at the checksum
 * (fuzz-ckpt mutates sealed files as they are). Whatever the message, pscoord
 * either refuses it with a reason or holds a state that keeps those promises;
 * nothing leaks. */
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "coord-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static const CoordConfig cfg = { .lease_ms = 3000, .shard_lease_ms = 600 };
        Coord c = { .cfg = &cfg, .state = JOB_WAITING, .state_lock = -1 };
        Psnet__CoordState *st = NULL;
        char why[512] = "";
        uint8_t *buf = ps_malloc(CKPT_SEALED_HEAD + size);
        if (!buf)
                return 0;
        ckpt_sealed_head("PSNETCS1", data, size, buf);
        if (size)
                memcpy(buf + CKPT_SEALED_HEAD, data, size);
        int r = coord_state_parse(&c, buf, CKPT_SEALED_HEAD + size, &st, why, sizeof why);
        ps_free(buf);
        if (r == 0) {
                if ((c.state == JOB_RUNNING && !c.map) || (c.map && !shardmap_fits_job(c.map, &c.job)))
                        abort(); /* accepted a state pscoord could not run */
                for (size_t i = 0; i < c.npeers; i++) {
                        if (!c.peers[i].detached || c.peers[i].id == 0)
                                abort();
                        for (size_t j = 0; j < i; j++)
                                if (c.peers[j].role == c.peers[i].role && c.peers[j].id == c.peers[i].id)
                                        abort(); /* the same peer twice */
                }
                psnet__coord_state__free_unpacked(st, NULL);
        } else if (!why[0])
                abort(); /* refused without a reason */
        coord_state_forget(&c);
        return 0;
}
