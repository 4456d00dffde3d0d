/* SPDX-License-Identifier: Apache-2.0 */
/* A fixed pool of threads for elementwise loops: see pfor.h.
 *
 * pfor_run publishes the loop under a new generation; thread i runs part i
 * when the loop has one, and the caller runs part 0, then waits until the
 * count of parts left falls to 0. Waking a sleeping thread costs tens of
 * microseconds on a VM (measured 50-60 here: more than half a 1 MiB chunk's
 * optimizer step), so both sides spin first, for a bounded time: a thread
 * for PFOR_SPIN_NS after its last part (the next chunk of a push comes
 * within microseconds), the caller for PFOR_WAIT_SPIN_NS; then they sleep on
 * a condition variable. The generation changes under the mutex, and a
 * thread counts itself asleep under it, so no wake-up is lost.
 *
 * The generation word carries the loop's number of parts in its low byte: a
 * thread without a part in a loop reads nothing else of it, since the caller
 * may already be writing the next loop (it waits only for the parts). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "alloc.h"
#include "pfor.h"

#define PFOR_ALIGN 16
#define PFOR_SPIN_NS 200000u
#define PFOR_WAIT_SPIN_NS 2000000u

typedef struct PforThread {
        Pfor *pool;
        unsigned index;
        pthread_t tid;
} PforThread;

struct Pfor {
        pthread_mutex_t mu;
        pthread_cond_t start, done;
        unsigned nthreads, started;
        PforThread *threads;
        _Atomic uint64_t gen;     /* loops run << 8 | the last one's parts */
        _Atomic bool stop;
        unsigned sleepers;   /* threads waiting on start (under mu) */
        bool caller_waits;   /* the caller waits on done (under mu) */
        /* The loop of generation gen, written before gen changes. */
        PforFn fn;
        void *arg;
        size_t n, part;
        _Atomic unsigned pending; /* parts not done, the caller's aside */
        uint64_t loops;           /* loops cut into parts (the caller's alone) */
};

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

static void pfor_part(Pfor *p, size_t i, PforFn fn, void *arg) {
        size_t lo = i * p->part, hi = lo + p->part < p->n ? lo + p->part : p->n;
        if (lo < hi)
                fn(arg, lo, hi);
}

/* The next generation after seen, or seen once stopping. */
static uint64_t pfor_next(Pfor *p, uint64_t seen) {
        uint64_t until = now_ns() + PFOR_SPIN_NS, g;
        for (unsigned k = 0;; k++) {
                g = atomic_load_explicit(&p->gen, memory_order_acquire);
                if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
                        return g;
                if ((k & 63) == 63) {
                        if (now_ns() > until)
                                break;
                        sched_yield(); /* more threads than CPUs: let the ones with work run */
                }
                cpu_relax();
        }
        pthread_mutex_lock(&p->mu);
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) {
                p->sleepers++;
                pthread_cond_wait(&p->start, &p->mu);
                p->sleepers--;
        }
        pthread_mutex_unlock(&p->mu);
        return g;
}

static void *pfor_thread(void *userdata) {
        PforThread *t = userdata;
        Pfor *p = t->pool;
        uint64_t seen = 0;

        for (;;) {
                seen = pfor_next(p, seen);
                if (atomic_load(&p->stop))
                        break;
                if (t->index >= (seen & 0xff))
                        continue;
                pfor_part(p, t->index, p->fn, p->arg);
                if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
                        pthread_mutex_lock(&p->mu);
                        if (p->caller_waits)
                                pthread_cond_signal(&p->done);
                        pthread_mutex_unlock(&p->mu);
                }
        }
        return NULL;
}

int pfor_new(unsigned nthreads, Pfor **ret) {
        if (nthreads < 1 || nthreads > PFOR_MAX_THREADS)
                return -EINVAL;
        Pfor *p = ps_calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        p->nthreads = nthreads;
        if (nthreads == 1) {
                *ret = p;
                return 0;
        }
        p->threads = ps_calloc(nthreads, sizeof *p->threads);
        if (!p->threads) {
                ps_free(p);
                return -ENOMEM;
        }
        int r = pthread_mutex_init(&p->mu, NULL);
        if (r == 0 && (r = pthread_cond_init(&p->start, NULL)) != 0)
                pthread_mutex_destroy(&p->mu);
        if (r == 0 && (r = pthread_cond_init(&p->done, NULL)) != 0) {
                pthread_cond_destroy(&p->start);
                pthread_mutex_destroy(&p->mu);
        }
        if (r != 0) {
                ps_free(p->threads);
                ps_free(p);
                return -r;
        }
        /* Signals stay with the loop's thread (libuv's handlers). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (unsigned i = 1; i < nthreads && r == 0; i++) {
                p->threads[i] = (PforThread) { .pool = p, .index = i };
                r = pthread_create(&p->threads[i].tid, NULL, pfor_thread, &p->threads[i]);
                if (r == 0)
                        p->started++;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0) {
                pfor_free(p);
                return -r;
        }
        *ret = p;
        return 0;
}

Pfor *pfor_free(Pfor *p) {
        if (!p)
                return NULL;
        if (p->nthreads > 1) {
                pthread_mutex_lock(&p->mu);
                atomic_store(&p->stop, true);
                pthread_cond_broadcast(&p->start);
                pthread_mutex_unlock(&p->mu);
                for (unsigned i = 1; i <= p->started; i++)
                        pthread_join(p->threads[i].tid, NULL);
                pthread_cond_destroy(&p->done);
                pthread_cond_destroy(&p->start);
                pthread_mutex_destroy(&p->mu);
        }
        ps_free(p->threads);
        ps_free(p);
        return NULL;
}

unsigned pfor_threads(const Pfor *p) {
        return p ? p->nthreads : 1;
}

uint64_t pfor_loops(const Pfor *p) {
        return p ? p->loops : 0;
}

void pfor_run(Pfor *p, size_t n, size_t min_part, PforFn fn, void *arg) {
        if (n == 0)
                return;
        size_t parts = min_part > 0 ? n / min_part : n;
        if (!p || p->nthreads == 1 || parts < 2) {
                fn(arg, 0, n);
                return;
        }
        if (parts > p->nthreads)
                parts = p->nthreads;
        size_t part = (n + parts - 1) / parts;
        part = (part + PFOR_ALIGN - 1) / PFOR_ALIGN * PFOR_ALIGN;
        parts = (n + part - 1) / part;

        p->loops++;
        p->fn = fn;
        p->arg = arg;
        p->n = n;
        p->part = part;
        atomic_store_explicit(&p->pending, (unsigned) parts - 1, memory_order_relaxed);
        pthread_mutex_lock(&p->mu);
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_relaxed);
        atomic_store_explicit(&p->gen, ((g >> 8) + 1) << 8 | parts, memory_order_release);
        if (p->sleepers > 0)
                pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mu);

        pfor_part(p, 0, fn, arg);

        uint64_t until = now_ns() + PFOR_WAIT_SPIN_NS;
        for (unsigned k = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; k++) {
                if ((k & 63) == 63 && now_ns() > until) {
                        pthread_mutex_lock(&p->mu);
                        p->caller_waits = true;
                        while (atomic_load(&p->pending) > 0)
                                pthread_cond_wait(&p->done, &p->mu);
                        p->caller_waits = false;
                        pthread_mutex_unlock(&p->mu);
                        break;
                }
                if ((k & 63) == 63)
                        sched_yield();
                cpu_relax();
        }
}

typedef struct PforCopy {
        char *dst;
        const char *src;
} PforCopy;

/* Indices are 64-byte lines (the last one short). */
static void pfor_copy_range(void *arg, size_t lo, size_t hi) {
        const PforCopy *c = arg;
        memcpy(c->dst + lo * 64, c->src + lo * 64, (hi - lo) * 64);
}

void pfor_copy(Pfor *p, void *dst, const void *src, size_t bytes, size_t min_bytes) {
        size_t lines = bytes / 64, tail = bytes % 64;
        PforCopy c = { .dst = dst, .src = src };
        pfor_run(p, lines, min_bytes / 64, pfor_copy_range, &c);
        if (tail)
                memcpy(c.dst + lines * 64, c.src + lines * 64, tail);
}
