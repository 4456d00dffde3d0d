/* SPDX-License-Identifier: Apache-2.0 */
/* A fixed set of threads for elementwise loops (psd --threads): the caller
 * hands a range [0, n) and a function, the range is cut into contiguous
 * parts, one per thread (the caller runs the first), and pfor_run returns
 * once every part is done. Nothing else crosses threads: a part's function
 * sees only its own indices, so a loop gives the same bits with any number
 * of threads as long as each index is computed alone. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Pfor Pfor;
/* Computes the loop's indices [lo, hi) (lo < hi). */
typedef void (*PforFn)(void *arg, size_t lo, size_t hi);

#define PFOR_MAX_THREADS 64

/* A pool of nthreads (1..PFOR_MAX_THREADS) threads counting the caller's:
 * nthreads - 1 are started, with every signal blocked. 1: no thread, every
 * loop runs on the caller. -EINVAL or -errno of pthread_create. */
int pfor_new(unsigned nthreads, Pfor **ret);
/* Stops and joins the threads (none may be in pfor_run). NULL-safe. */
Pfor *pfor_free(Pfor *p);
/* Threads counting the caller's; 1 for NULL. */
unsigned pfor_threads(const Pfor *p);
/* Loops pfor_run cut into more than one part so far (read by the caller). */
uint64_t pfor_loops(const Pfor *p);
/* Runs fn over [0, n) in at most pfor_threads(p) parts of at least min_part
 * indices (so a short loop runs whole on the caller), each starting at a
 * multiple of 16 (no two threads write one 64-byte line of floats). p NULL:
 * fn(arg, 0, n). Not reentrant: one loop at a time per pool. */
void pfor_run(Pfor *p, size_t n, size_t min_part, PforFn fn, void *arg);
/* memcpy of bytes cut into parts of at least min_bytes run by p's threads. */
void pfor_copy(Pfor *p, void *dst, const void *src, size_t bytes, size_t min_bytes);
