/* SPDX-License-Identifier: Apache-2.0 */
/* The tests' and benchmarks' random numbers: a splitmix64 stream (common/hash.h),
 * the same sequence on every platform, so a failing check replays exactly. Each
 * file defines RNG_SEED before including this and gets its own stream. */
#pragma once
#include <stdint.h>
#include "hash.h"

static uint64_t rng_state = RNG_SEED;

static inline uint64_t rng_next(void) {
        return splitmix64_next(&rng_state);
}

/* Uniform in [lo, hi), from the top 53 bits. */
static inline float rng_uniform(float lo, float hi) {
        return lo + (hi - lo) * (float) ((double) (rng_next() >> 11) / 9007199254740992.0);
}
