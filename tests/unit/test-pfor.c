/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/pfor.c: every index of a loop is computed exactly
 * once, in at most the pool's number of parts, each starting at a multiple
 * of 16; a loop shorter than two parts runs whole on the caller; the threads
 * really run parts; a pool runs thousands of loops in a row; pfor_copy
 * equals memcpy whatever the length; bad sizes are refused. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "pfor.h"
#include "tap.h"

#define MAXN 100003

typedef struct Seen {
        _Atomic unsigned char count[MAXN];
        _Atomic size_t parts, misaligned;
        _Atomic int other_thread;
        pthread_t caller;
} Seen;

static void mark(void *arg, size_t lo, size_t hi) {
        Seen *s = arg;
        atomic_fetch_add(&s->parts, 1);
        if (lo % 16)
                atomic_fetch_add(&s->misaligned, 1);
        if (!pthread_equal(pthread_self(), s->caller))
                atomic_store(&s->other_thread, 1);
        for (size_t i = lo; i < hi; i++)
                atomic_fetch_add(&s->count[i], 1);
}

/* Runs a loop of n over pool and checks each index once; returns the parts. */
static size_t run_once(Pfor *pool, Seen *s, size_t n, size_t min_part, const char *what) {
        memset(s, 0, sizeof *s);
        s->caller = pthread_self();
        pfor_run(pool, n, min_part, mark, s);
        size_t bad = 0;
        for (size_t i = 0; i < MAXN; i++)
                bad += atomic_load(&s->count[i]) != (i < n ? 1 : 0);
        CHECK(bad == 0 && atomic_load(&s->misaligned) == 0,
              "%s: n %zu, every index once (%zu wrong), parts at multiples of 16", what, n, bad);
        return atomic_load(&s->parts);
}

static void test_cover(void) {
        static Seen s;
        const size_t ns[] = { 1, 15, 16, 17, 1000, 4097, 65536, 99999, MAXN };
        for (unsigned threads = 1; threads <= 8; threads += threads < 4 ? 1 : 4) {
                Pfor *pool = NULL;
                if (!CHECK(pfor_new(threads, &pool) == 0 && pfor_threads(pool) == threads, "a pool of %u", threads))
                        return;
                for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                        size_t parts = run_once(pool, &s, ns[k], 64, "cover");
                        CHECK(parts >= 1 && parts <= threads, "%u threads, n %zu: %zu parts", threads, ns[k], parts);
                }
                /* Bigger than two parts of min_part on more than one thread: the
                 * others run some. */
                if (threads > 1) {
                        run_once(pool, &s, MAXN, 1000, "spread");
                        CHECK(atomic_load(&s.other_thread) == 1, "%u threads: parts ran on the pool's threads",
                              threads);
                }
                size_t parts = run_once(pool, &s, 1999, 1000, "short");
                CHECK(parts == 1 && atomic_load(&s.other_thread) == 0,
                      "%u threads: a loop shorter than two parts runs whole on the caller", threads);
                pool = pfor_free(pool);
        }
        size_t parts = run_once(NULL, &s, MAXN, 1, "no pool");
        CHECK(pfor_loops(NULL) == 0, "no pool: no loop cut");
        CHECK(parts == 1 && pfor_threads(NULL) == 1, "no pool: one part on the caller");
}

static void add_one(void *arg, size_t lo, size_t hi) {
        _Atomic size_t *sum = arg;
        atomic_fetch_add(sum, hi - lo);
}

static void test_many_loops(void) {
        Pfor *pool = NULL;
        if (!CHECK(pfor_new(4, &pool) == 0, "a pool of 4"))
                return;
        _Atomic size_t sum = 0;
        for (int i = 0; i < 5000; i++)
                pfor_run(pool, 4096 + (size_t) i, 16, add_one, &sum);
        size_t want = 5000u * 4096u + 4999u * 5000u / 2u;
        CHECK(atomic_load(&sum) == want, "5000 loops in a row: %zu indices, want %zu", atomic_load(&sum), want);
        /* 1 to 4 parts in turn: a thread without a part in one loop must not
         * take one of the next loop's parts for it (run twice). */
        atomic_store(&sum, 0);
        want = 0;
        for (int i = 0; i < 20000; i++) {
                size_t n = 32u * (size_t) (1 + i % 5);
                pfor_run(pool, n, 32, add_one, &sum);
                want += n;
        }
        CHECK(pfor_loops(pool) == 5000u + 16000u, "the pool counts the loops it cut (%lu)",
              (unsigned long) pfor_loops(pool));
        CHECK(atomic_load(&sum) == want, "20000 loops of 1 to 4 parts: %zu indices, want %zu", atomic_load(&sum),
              want);
        pool = pfor_free(pool);
        CHECK(pool == NULL && pfor_free(NULL) == NULL, "pfor_free returns NULL and takes NULL");
}

static void test_copy(void) {
        Pfor *pool = NULL;
        if (!CHECK(pfor_new(3, &pool) == 0, "a pool of 3"))
                return;
        const size_t sizes[] = { 0, 1, 63, 64, 65, 4096, 300001, 1u << 20 };
        unsigned char *src = malloc((1u << 20) + 8), *dst = malloc((1u << 20) + 8);
        if (CHECK(src && dst, "allocated")) {
                for (size_t i = 0; i < (1u << 20) + 8; i++)
                        src[i] = (unsigned char) (i * 131u + 7u);
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                        memset(dst, 0xee, (1u << 20) + 8);
                        /* Unaligned on both sides, parts of at least 4 KiB. */
                        pfor_copy(pool, dst + 3, src + 1, sizes[k], 4096);
                        bool same = memcmp(dst + 3, src + 1, sizes[k]) == 0;
                        bool around = dst[2] == 0xee && dst[3 + sizes[k]] == 0xee;
                        CHECK(same && around, "pfor_copy of %zu bytes equals memcpy and writes nothing around",
                              sizes[k]);
                }
        }
        free(src);
        free(dst);
        pfor_free(pool);
}

static void test_bad(void) {
        Pfor *pool = (Pfor *) 0x1;
        CHECK(pfor_new(0, &pool) == -EINVAL && pool == (Pfor *) 0x1, "0 threads refused, *ret untouched");
        CHECK(pfor_new(PFOR_MAX_THREADS + 1, &pool) == -EINVAL, "%d threads refused", PFOR_MAX_THREADS + 1);
}

int main(void) {
        test_cover();
        test_many_loops();
        test_copy();
        test_bad();
        return tap_done();
}
