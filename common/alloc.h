/* SPDX-License-Identifier: Apache-2.0 */
/* The one allocation wrapper (after Redis's zmalloc): daemons link jemalloc, which
 * replaces malloc process-wide (libzmq's message buffers included), and this is
 * where its tuning and the memory figures for status and metrics live. */
#pragma once
#include <stddef.h>
#include <stdint.h>

void *ps_malloc(size_t n);
void *ps_calloc(size_t n, size_t size);
void *ps_realloc(void *p, size_t n);
/* Cache-line aligned allocation for tensor buffers; free with ps_free. */
void *ps_malloc_aligned(size_t n);
char *ps_strdup(const char *s);
/* Makes room for need elements of elem bytes in the array *p of *cap
 * (doubling, from first): 0, or -ENOMEM with *p and *cap untouched. */
int ps_grow(void *p, size_t *cap, size_t need, size_t elem, size_t first);
void ps_free(void *p);

/* Bytes the allocator reports as allocated and resident; 0 when unknown
 * (glibc malloc: sanitizer builds, libpsnet's users). */
int alloc_stats(uint64_t *ret_allocated, uint64_t *ret_resident);
/* Gives the memory freed so far back to the system (jemalloc keeps freed
 * pages: the daemons' configuration never purges them by itself); nothing
 * without jemalloc. For after a one-off peak, such as loading a data set. */
void alloc_purge(void);
/* Freed memory given back once a burst of frees is over: what closed
 * connections and refused messages held (libzmq frees it on its I/O threads
 * about when the daemon learns of them). alloc_purge_soon marks one such
 * event; alloc_purge_due, from the daemon's tick, purges ALLOC_PURGE_QUIET_MS
 * after the last, when more than ALLOC_PURGE_SLACK is held free (kept for
 * the next large messages), and returns the bytes given back (logged). */
#define ALLOC_PURGE_QUIET_MS 200
#define ALLOC_PURGE_SLACK (64ull << 20)
typedef struct AllocPurge {
        uint64_t at;         /* ms: purge then (0: nothing to do) */
        uint64_t purged;     /* bytes given back since start (for /metrics) */
} AllocPurge;
void alloc_purge_soon(AllocPurge *p, uint64_t now_ms);
uint64_t alloc_purge_due(AllocPurge *p, uint64_t now_ms, const char *after);
/* Name of the allocator in use ("jemalloc" or "libc"). */
const char *alloc_name(void);
