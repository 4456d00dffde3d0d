/* SPDX-License-Identifier: Apache-2.0 */
/* See boundary.h. */
#include "boundary.h"
#include "macro.h"

void fence_clocks_add(FenceClocks *f, int64_t max_clock, int64_t max_wclock, int64_t min_wclock) {
        f->max_clock = MAX(f->max_clock, max_clock);
        f->max_wclock = MAX(f->max_wclock, max_wclock);
        /* The joiners start no earlier than any shard's slowest member: the
         * largest of the shards' minima (a shard that has not heard a member
         * yet answers -1 or 0). */
        f->min_wclock = MAX(f->min_wclock, min_wclock);
}

Boundary boundary_pick(ConsistencyMode old, ConsistencyMode next, const FenceClocks *f) {
        Boundary b;
        if (old == MODE_BSP)
                b.from = f->max_clock + 1;
        else if (next == MODE_BSP)
                b.from = f->max_wclock + 2;
        else
                b.from = 0;
        b.start = b.from > 0 ? b.from : MAX(f->min_wclock, (int64_t) 0);
        return b;
}
