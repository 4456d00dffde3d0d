/* SPDX-License-Identifier: Apache-2.0 */
/* 64-bit mixing shared by the shard map, initial weights and data shuffling;
 * the weights' digest. */
#pragma once
#include <stddef.h>
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

/* Fisher-Yates over a[0..n) with the splitmix64 stream *x: the same order for
 * the same state. */
static inline void shuffle_u32(uint32_t *a, uint32_t n, uint64_t *x) {
        for (uint32_t i = n; i > 1; i--) {
                uint32_t j = (uint32_t) (splitmix64_next(x) % i), t = a[i - 1];
                a[i - 1] = a[j];
                a[j] = t;
        }
}

/* FNV-1a 64 of n bytes at p, going on from h (FNV1A64_INIT to start): the
 * final weights' digest, equal digests for equal weights. */
#define FNV1A64_INIT UINT64_C(0xcbf29ce484222325)
static inline uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
        const unsigned char *b = p;
        for (size_t i = 0; i < n; i++)
                h = (h ^ b[i]) * UINT64_C(0x100000001b3);
        return h;
}

/* A 64-bit digest of n bytes (8 at a time through mix64, the length last):
 * tells one file's bytes from another's at memory speed, as the check of a
 * job's --init file on every shard against pscoord's (not a cryptographic
 * hash: it guards against mistakes, not against an attacker). */
static inline uint64_t digest64(const void *p, size_t n) {
        const unsigned char *b = p;
        uint64_t h = UINT64_C(0x9e3779b97f4a7c15);
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
                uint64_t w = 0;
                for (unsigned k = 0; k < 8; k++)
                        w |= (uint64_t) b[i + k] << (8 * k);
                h = mix64(h ^ w) + i;
        }
        uint64_t w = 0;
        for (unsigned k = 0; i + k < n; k++)
                w |= (uint64_t) b[i + k] << (8 * k);
        return mix64(mix64(h ^ w) ^ (uint64_t) n);
}
