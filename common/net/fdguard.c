/* SPDX-License-Identifier: Apache-2.0 */
/* See fdguard.h. accept() and accept4() defined here come before libc's for
 * every library of the process (the executable is searched first, and the
 * linker exports these because libzmq and libuv use them); the real ones are
 * found with dlsym(RTLD_NEXT). They run on libzmq's I/O threads and libuv's
 * loop: atomics only, and a log line at most once a second. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "fdguard.h"
#include "log.h"
#include "macro.h"

#define FDGUARD_RESERVE_MIN 32
#define FDGUARD_RESERVE_MAX 4096

typedef int (*Accept4Fn)(int, struct sockaddr *, socklen_t *, int);

static atomic_ulong guard_budget, guard_limit;
static atomic_uint_least64_t guard_refused, guard_logged_second;
static atomic_int guard_spare = -1;

static void *real_fn(const char *name) {
        void *f = dlsym(RTLD_NEXT, name);
        if (!f)
                errno = ENOSYS;
        return f;
}

static void refused_one(const char *why) {
        uint64_t n = atomic_fetch_add(&guard_refused, 1) + 1;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t second = (uint64_t) ts.tv_sec, last = atomic_load(&guard_logged_second);
        if (second != last && atomic_compare_exchange_strong(&guard_logged_second, &last, second))
                log_warning("refused a connection: %s (at most one such line a second) refused_total=%llu "
                            "budget=%lu limit=%lu", why, (unsigned long long) n, atomic_load(&guard_budget),
                            atomic_load(&guard_limit));
}

/* After the real accept on listening socket s returned fd: the connection,
 * or -1 with errno EAGAIN where it was refused. */
static int guard(int s, int fd, Accept4Fn again) {
        unsigned long budget = atomic_load(&guard_budget);
        if (budget == 0)
                return fd;
        if (fd >= 0) {
                if ((unsigned long) fd < budget)
                        return fd;
                (void) close(fd);
                refused_one("past the connection budget (descriptors below it all in use): raise the open-files "
                            "limit (LimitNOFILE=, ulimit -n) for more peers");
                errno = EAGAIN;
                return -1;
        }
        if (errno != EMFILE && errno != ENFILE)
                return fd;
        /* Nothing left to take the connection with: it would wait in the
         * backlog and wake libzmq again and again (or, on ipc, abort it).
         * Taken on the spare descriptor and closed; the spare opened again. */
        int spare = atomic_exchange(&guard_spare, -1);
        if (spare >= 0) {
                (void) close(spare);
                int c = again(s, NULL, NULL, SOCK_CLOEXEC);
                if (c >= 0)
                        (void) close(c);
                atomic_store(&guard_spare, open("/dev/null", O_RDONLY | O_CLOEXEC));
        }
        refused_one("no descriptor left to take it with: raise the open-files limit (LimitNOFILE=, ulimit -n)");
        errno = EAGAIN;
        return -1;
}

int accept4(int s, struct sockaddr *addr, socklen_t *len, int flags) {
        static _Atomic(Accept4Fn) real;
        Accept4Fn f = atomic_load(&real);
        if (!f) {
                *(void **) &f = real_fn("accept4");
                if (!f)
                        return -1;
                atomic_store(&real, f);
        }
        return guard(s, f(s, addr, len, flags), f);
}

int accept(int s, struct sockaddr *addr, socklen_t *len) {
        return accept4(s, addr, len, 0);
}

void fdguard_init(void) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return;
        /* Every peer connection costs a descriptor: the soft limit goes up to the hard one. */
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t) 1 << 20 : rl.rlim_max;
        if (rl.rlim_cur < want) {
                rlim_t was = rl.rlim_cur;
                rl.rlim_cur = want;
                if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                        log_warning_errno(errno, "Cannot raise the open-files limit to %lu: %m", (unsigned long) want);
                        rl.rlim_cur = was;
                }
        }
        unsigned long limit = rl.rlim_cur == RLIM_INFINITY ? 1ul << 20 : (unsigned long) rl.rlim_cur;
        unsigned long reserve = MIN(MAX(limit / 8, (unsigned long) FDGUARD_RESERVE_MIN), (unsigned long) FDGUARD_RESERVE_MAX);
        atomic_store(&guard_limit, limit);
        atomic_store(&guard_spare, open("/dev/null", O_RDONLY | O_CLOEXEC));
        atomic_store(&guard_budget, limit > reserve ? limit - reserve : 1);
        if (limit < 4096)
                log_warning("open-files limit is %lu: connections past %lu are refused; raise it (LimitNOFILE=, "
                            "ulimit -n) for more than a few hundred peers", limit, atomic_load(&guard_budget));
}

unsigned long fdguard_budget(void) { return atomic_load(&guard_budget); }
unsigned long fdguard_limit(void) { return atomic_load(&guard_limit); }
uint64_t fdguard_refused(void) { return atomic_load(&guard_refused); }
