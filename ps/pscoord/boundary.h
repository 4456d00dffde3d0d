/* SPDX-License-Identifier: Apache-2.0 */
/* Clock boundaries: the arithmetic pscoord uses to change the membership or
 * the consistency mode while a job runs, kept free of sockets and state so
 * that it has unit tests (tests/unit/test-boundary.c).
 *
 * A change is fenced: every shard of the map answers with the largest clock
 * any of its chunks has closed (max_clock) and the smallest and largest clock
 * a member has pushed (min_wclock, max_wclock); until it hears the boundary,
 * no shard lets a clock past max_clock + 1 close. */
#pragma once
#include <stdint.h>
#include "job.h"

typedef struct FenceClocks {
        int64_t max_clock;      /* the largest clock closed on any shard */
        int64_t max_wclock;     /* the largest clock a member pushed */
        int64_t min_wclock;     /* the smallest clock a member pushed (-1: none) */
} FenceClocks;

/* Folds one shard's answer into f (f starts as FENCE_CLOCKS_INIT). */
#define FENCE_CLOCKS_INIT ((FenceClocks) { .max_clock = 0, .max_wclock = 0, .min_wclock = -1 })
void fence_clocks_add(FenceClocks *f, int64_t max_clock, int64_t max_wclock, int64_t min_wclock);

typedef struct Boundary {
        int64_t from;   /* the first clock of the new membership/mode (0: at once) */
        int64_t start;  /* the clock a joining worker starts from */
} Boundary;

/* Where a change from mode old to next takes effect:
 *   BSP -> anything:  max_clock + 1 (no chunk has closed it: fenced);
 *   ASP/SSP -> BSP:   max_wclock + 2 (no member can push past max_wclock + 1);
 *   ASP/SSP -> ASP/SSP: at once (from 0).
 * A joiner starts at from, or (from 0) at the slowest member's clock. */
Boundary boundary_pick(ConsistencyMode old, ConsistencyMode next, const FenceClocks *f);
