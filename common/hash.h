/* 64-bit mixing shared by the shard map, initial weights and data shuffling. */
#pragma once
#include <stdint.h>

/* splitmix64's finalizer (Stafford's Mix13): a bijection with full avalanche. */
static inline uint64_t mix64(uint64_t x) {
        x ^= x >> 30;
        x *= UINT64_C(0xbf58476d1ce4e5b9);
        x ^= x >> 27;
        x *= UINT64_C(0x94d049bb133111eb);
        x ^= x >> 31;
        return x;
}

/* The next value of a splitmix64 stream whose state is *x. */
static inline uint64_t splitmix64_next(uint64_t *x) {
        *x += UINT64_C(0x9e3779b97f4a7c15);
        return mix64(*x);
}
