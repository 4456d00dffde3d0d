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
#include <stdlib.h>
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
#define FDGUARD_MAX_CONNS (1ul << 20) /* connections read for their messages: 24 MiB of table at most */

typedef int (*Accept4Fn)(int, struct sockaddr *, socklen_t *, int);

/* A ZMTP 3 connection's inbound bytes as libzmq reads them: where the
 * greeting, a frame's flags, its size or its body is, and the bytes of the
 * message begun. */
typedef struct {
        atomic_bool on;   /* accepted for libzmq: read here */
        uint8_t state;    /* ZMTP_* */
        uint8_t flags;    /* the frame's: 0x01 more, 0x02 long, 0x04 command */
        uint8_t got;      /* bytes of the greeting, or of the frame's size */
        uint64_t left;    /* the frame's size as it is read; then its body's bytes to come */
        uint64_t message; /* the message begun: its frames' bytes, FDGUARD_FRAME_COST each more */
        uint64_t begun;   /* ms (CLOCK_MONOTONIC) when its first frame's size arrived; 0: none begun */
        uint64_t came;    /* bytes of it read since */
} Zmtp;

enum { ZMTP_GREETING, ZMTP_FLAGS, ZMTP_SIZE, ZMTP_BODY };
#define ZMTP_GREETING_BYTES 64
#define ZMTP_MORE 0x01
#define ZMTP_LONG 0x02
#define ZMTP_COMMAND 0x04

typedef int (*SocketFn)(int, int, int);
typedef ssize_t (*RecvFn)(int, void *, size_t, int);

static atomic_ulong guard_budget, guard_limit;
static atomic_uint_least64_t guard_refused, guard_logged_second;
static atomic_int guard_spare = -1;
static atomic_uint_least64_t guard_bound, guard_dropped, guard_dropped_second, guard_slow_ms;
static Zmtp *guard_conns; /* one per descriptor below the budget */

/* libc's (or the sanitizer's) name, looked up once into *slot: NULL with
 * errno ENOSYS where there is none. */
static void *real_fn(_Atomic(void *) *slot, const char *name) {
        void *f = atomic_load(slot);
        if (!f) {
                f = dlsym(RTLD_NEXT, name);
                if (!f) {
                        errno = ENOSYS;
                        return NULL;
                }
                atomic_store(slot, f);
        }
        return f;
}

static uint64_t mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

/* Whether a line of the kind whose last second is *logged may be written now:
 * one a second, from any thread. */
static bool line_due(atomic_uint_least64_t *logged) {
        uint64_t second = mono_ms() / 1000u, last = atomic_load(logged);
        return second != last && atomic_compare_exchange_strong(logged, &last, second);
}

static void refused_one(const char *why) {
        uint64_t n = atomic_fetch_add(&guard_refused, 1) + 1;
        if (line_due(&guard_logged_second))
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

static Zmtp *conn_of(int fd) {
        return guard_conns && fd >= 0 && (unsigned long) fd < atomic_load(&guard_budget) ? &guard_conns[fd] : NULL;
}

/* A connection begun: read from its greeting on. */
static void conn_start(int fd) {
        Zmtp *z = conn_of(fd);
        if (!z)
                return;
        z->state = ZMTP_GREETING;
        z->got = z->flags = 0;
        z->left = z->message = z->begun = 0;
        atomic_store(&z->on, true);
}

void fdguard_forget(int fd) {
        Zmtp *z = conn_of(fd);
        if (z)
                atomic_store(&z->on, false);
}

static void dropped_one(const char *why) {
        uint64_t n = atomic_fetch_add(&guard_dropped, 1) + 1;
        if (line_due(&guard_dropped_second))
                log_warning("dropped a connection: %s (at most one such line a second) dropped_total=%llu "
                            "bound=%llu", why, (unsigned long long) n, (unsigned long long) atomic_load(&guard_bound));
}

/* A frame whole: a message ends with its last frame (commands are none of it). */
static void frame_done(Zmtp *z) {
        if (!(z->flags & (ZMTP_MORE | ZMTP_COMMAND)))
                z->message = z->begun = 0;
        z->state = ZMTP_FLAGS;
}

/* n bytes of the connection as they arrived: false where the connection must
 * go (not ZMTP 3, or a message past the bound), with *why set. The greeting's
 * signature and version are checked: ZMTP 1.0 and 2.0 frame otherwise, and a
 * psnet peer's libzmq speaks 3.x. */
static bool conn_feed(Zmtp *z, const uint8_t *b, size_t n, const char **why) {
        uint64_t bound = atomic_load(&guard_bound), slow = atomic_load(&guard_slow_ms);
        if (z->begun && slow) {
                /* A message begun long ago that comes a byte now and then (the
                 * idle time-out never fires: bytes keep coming) holds its
                 * descriptor and what it sent for good: past the time-out it
                 * must have come at FDGUARD_MIN_RATE bytes a second. */
                uint64_t took = mono_ms() - z->begun;
                if (took > slow && z->came < (took / 1000u) * FDGUARD_MIN_RATE) {
                        *why = "it sent a message begun long ago slower than " FDGUARD_MIN_RATE_TEXT;
                        return false;
                }
        }
        for (size_t i = 0; i < n;) {
                switch (z->state) {
                case ZMTP_GREETING: {
                        uint8_t c = b[i++], at = z->got++;
                        if ((at == 0 && c != 0xff) || (at == 9 && !(c & 0x01)) || (at == 10 && c < 3)) {
                                *why = "it does not speak ZMTP 3 (the framing whose messages are bounded here; a "
                                       "psnet peer's libzmq speaks it)";
                                return false;
                        }
                        if (z->got == ZMTP_GREETING_BYTES)
                                z->state = ZMTP_FLAGS;
                        break;
                }
                case ZMTP_FLAGS:
                        z->came += z->begun != 0;
                        z->flags = b[i++];
                        z->got = 0;
                        z->left = 0;
                        z->state = ZMTP_SIZE;
                        break;
                case ZMTP_SIZE:
                        z->came += z->begun != 0;
                        z->left = z->left << 8 | b[i++];
                        if (++z->got < (z->flags & ZMTP_LONG ? 8 : 1))
                                break;
                        if (!(z->flags & ZMTP_COMMAND)) {
                                if (!z->begun && slow) {
                                        z->begun = mono_ms();
                                        z->came = 0;
                                }
                                /* Past the bound at the frame's size, before
                                 * libzmq has read (or allocated) its body. */
                                z->message += MIN(z->left, UINT64_MAX / 2) + FDGUARD_FRAME_COST;
                                if (bound && z->message > bound) {
                                        *why = "it began a message larger than this daemon takes (the bound "
                                               "below); it was read no further";
                                        return false;
                                }
                        }
                        if (z->left)
                                z->state = ZMTP_BODY;
                        else
                                frame_done(z);
                        break;
                case ZMTP_BODY: {
                        uint64_t take = MIN(z->left, (uint64_t) (n - i));
                        i += take;
                        z->came += z->begun ? take : 0;
                        z->left -= take;
                        if (!z->left)
                                frame_done(z);
                        break;
                }
                }
        }
        return true;
}

ssize_t recv(int fd, void *buf, size_t len, int flags) {
        static _Atomic(void *) real;
        RecvFn f;
        *(void **) &f = real_fn(&real, "recv");
        if (!f)
                return -1;
        ssize_t r = f(fd, buf, len, flags);
        Zmtp *z = r > 0 && !(flags & MSG_PEEK) ? conn_of(fd) : NULL;
        const char *why = NULL;
        if (z && atomic_load(&z->on) && !conn_feed(z, buf, (size_t) r, &why)) {
                /* libzmq takes ECONNRESET as the peer's going: the connection
                 * and the message begun are freed, the bytes read unseen. */
                atomic_store(&z->on, false);
                dropped_one(why);
                errno = ECONNRESET;
                return -1;
        }
        return r;
}

/* Descriptors of new sockets are none of an accepted connection's. */
int socket(int domain, int type, int protocol) {
        static _Atomic(void *) real;
        SocketFn f;
        *(void **) &f = real_fn(&real, "socket");
        if (!f)
                return -1;
        int fd = f(domain, type, protocol);
        fdguard_forget(fd);
        return fd;
}

int accept4(int s, struct sockaddr *addr, socklen_t *len, int flags) {
        static _Atomic(void *) real;
        Accept4Fn f;
        *(void **) &f = real_fn(&real, "accept4");
        if (!f)
                return -1;
        int fd = guard(s, f(s, addr, len, flags), f);
        conn_start(fd);
        return fd;
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
        unsigned long budget = limit > reserve ? limit - reserve : 1;
        /* Zero pages until a descriptor that high is accepted. */
        if (!guard_conns)
                guard_conns = calloc(MIN(budget, FDGUARD_MAX_CONNS), sizeof *guard_conns);
        atomic_store(&guard_budget, guard_conns ? MIN(budget, FDGUARD_MAX_CONNS) : budget);
        if (limit < 4096)
                log_warning("open-files limit is %lu: connections past %lu are refused; raise it (LimitNOFILE=, "
                            "ulimit -n) for more than a few hundred peers", limit, atomic_load(&guard_budget));
}

unsigned long fdguard_budget(void) { return atomic_load(&guard_budget); }
unsigned long fdguard_limit(void) { return atomic_load(&guard_limit); }
uint64_t fdguard_refused(void) { return atomic_load(&guard_refused); }
void fdguard_message_bound(uint64_t bytes) { atomic_store(&guard_bound, bytes); }
void fdguard_message_time(uint64_t ms) { atomic_store(&guard_slow_ms, ms); }
uint64_t fdguard_bound(void) { return atomic_load(&guard_bound); }
uint64_t fdguard_dropped(void) { return atomic_load(&guard_dropped); }
