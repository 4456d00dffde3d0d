/* SPDX-License-Identifier: Apache-2.0 */
/* Allocation wrapper; see alloc.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "log.h"

/* jemalloc's control interface when the program links jemalloc (the daemons
 * do; their tuning is in jemalloc-conf.c), NULL otherwise (libpsnet's users,
 * sanitizer builds). */
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) __attribute__((weak));

void *ps_malloc(size_t n) { return malloc(n ? n : 1); }
void *ps_calloc(size_t n, size_t size) { return calloc(n ? n : 1, size ? size : 1); }
void *ps_realloc(void *p, size_t n) { return realloc(p, n ? n : 1); }
void ps_free(void *p) { free(p); }
char *ps_strdup(const char *s) { return s ? strdup(s) : NULL; }

void *ps_malloc_aligned(size_t n) {
        void *p = NULL;
        if (posix_memalign(&p, 64, n ? n : 64) != 0)
                return NULL;
        return p;
}

int ps_grow(void *p, size_t *cap, size_t need, size_t elem, size_t first) {
        void **pp = p;
        if (need <= *cap)
                return 0;
        size_t c = *cap ? *cap : (first ? first : 1);
        while (c < need)
                c *= 2;
        void *q = ps_realloc(*pp, c * elem);
        if (!q)
                return -ENOMEM;
        *pp = q;
        *cap = c;
        return 0;
}

const char *alloc_name(void) {
        return mallctl ? "jemalloc" : "libc";
}

void alloc_purge(void) {
        /* "arena.<MALLCTL_ARENAS_ALL>.purge": every arena. */
        if (mallctl)
                (void) mallctl("arena.4096.purge", NULL, NULL, NULL, 0);
}

void alloc_purge_soon(AllocPurge *p, uint64_t now) {
        p->at = now + ALLOC_PURGE_QUIET_MS;
}

uint64_t alloc_purge_due(AllocPurge *p, uint64_t now, const char *after) {
        uint64_t allocated, resident, after_a, after_r;
        if (!p->at || now < p->at)
                return 0;
        p->at = 0;
        if (alloc_stats(&allocated, &resident) < 0 || resident <= allocated + ALLOC_PURGE_SLACK)
                return 0;
        alloc_purge();
        if (alloc_stats(&after_a, &after_r) < 0 || after_r >= resident)
                return 0;
        p->purged += resident - after_r;
        log_info("gave freed memory back after %s mib=%lu resident_mib=%lu", after,
                 (unsigned long) ((resident - after_r) >> 20), (unsigned long) (after_r >> 20));
        return resident - after_r;
}

int alloc_stats(uint64_t *ret_allocated, uint64_t *ret_resident) {
        uint64_t epoch = 1;
        size_t allocated = 0, resident = 0, sz = sizeof(size_t), esz = sizeof epoch;
        *ret_allocated = *ret_resident = 0;
        if (!mallctl)
                return 0;
        if (mallctl("epoch", &epoch, &esz, &epoch, esz) != 0 ||
            mallctl("stats.allocated", &allocated, &sz, NULL, 0) != 0)
                return -EIO;
        sz = sizeof(size_t);
        if (mallctl("stats.resident", &resident, &sz, NULL, 0) != 0)
                return -EIO;
        *ret_allocated = allocated;
        *ret_resident = resident;
        return 0;
}
