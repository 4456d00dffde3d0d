/* SPDX-License-Identifier: Apache-2.0 */
/* Small helpers shared by every folder: cleanup attributes, array sizes, min/max,
 * an integer order.
 * Modelled on systemd's macro.h: locals that own memory are declared with a
 * _cleanup_ attribute so every early return frees them. */
#pragma once
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
/* <sys/param.h> (pulled in by uv.h) defines the same two. */
#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif
#ifndef MAX
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _cleanup_(f) __attribute__((cleanup(f)))

static inline void freep(void *p) { free(*(void **) p); }
#define _cleanup_free_ _cleanup_(freep)

/* Returns NULL so that "p = mfree(p);" both frees and clears. */
static inline void *mfree(void *p) { free(p); return NULL; }

/* qsort/bsearch order of uint32_t values, ascending. */
static inline int cmp_u32(const void *a, const void *b) {
        uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
        return x < y ? -1 : x > y;
}

