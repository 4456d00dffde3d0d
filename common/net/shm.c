/* SPDX-License-Identifier: Apache-2.0 */
/* Same-host shared memory: the worker's half and the checks both halves
 * share; see shm.h. The shard's half is ps/psd/psd-shm.c. */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "endpoint.h"
#include "shm.h"

static int fail(char *reason, size_t n, int err, const char *fmt, const char *arg) {
        if (reason && n)
                snprintf(reason, n, fmt, arg);
        return -err;
}

int shm_socket_path(const char *endpoint, char *buf, size_t n) {
        if (strncmp(endpoint, "ipc://", 6) != 0)
                return -EPROTONOSUPPORT;
        struct sockaddr_un sa;
        int w = snprintf(buf, n, "%s.shm", endpoint + 6);
        if (w < 0 || (size_t) w >= n || (size_t) w >= sizeof sa.sun_path)
                return -ENAMETOOLONG;
        return 0;
}

int shm_check_fd(int fd, uint64_t size, char *reason, size_t n) {
        struct stat st;
        struct statfs fs;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return fail(reason, n, EINVAL, "%s", "the descriptor is no regular file (a memfd is)");
        if (fstatfs(fd, &fs) < 0 || fs.f_type != TMPFS_MAGIC)
                return fail(reason, n, EINVAL, "%s", "the descriptor is no memfd on shmem (hugetlbfs is refused)");
        int seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0 || !(seals & F_SEAL_SHRINK))
                return fail(reason, n, EINVAL, "%s", "the memfd is not sealed against shrinking (F_SEAL_SHRINK)");
        if ((uint64_t) st.st_size != size || size == 0 || size > SHM_MAX_SIZE) {
                char what[96];
                snprintf(what, sizeof what, "%llu bytes where the hello says %llu (1 .. %llu allowed)",
                         (unsigned long long) st.st_size, (unsigned long long) size,
                         (unsigned long long) SHM_MAX_SIZE);
                return fail(reason, n, EINVAL, "the memfd has %s", what);
        }
        return 0;
}

void shm_region_close(ShmRegion *r) {
        if (r->base && !r->shared)
                (void) munmap(r->base, r->size);
        if (r->conn >= 0)
                (void) close(r->conn);
        *r = (ShmRegion) SHM_REGION_INIT;
}

/* Sends the hello with fd and waits for the one-message answer. */
static int handover(ShmRegion *r, const char *path, uint32_t worker, uint32_t flags, int fd, unsigned timeout_ms,
                    char *reason, size_t n) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        r->conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (r->conn < 0)
                return fail(reason, n, errno, "cannot create a unix socket: %s", strerror(errno));
        if (connect(r->conn, (struct sockaddr *) &sa, sizeof sa) < 0)
                return fail(reason, n, errno, "cannot connect: %s", strerror(errno));
        ShmHello hello = { .magic = SHM_MAGIC, .worker = worker, .flags = flags, .size = r->size };
        memcpy(hello.token, r->token, sizeof hello.token);
        struct iovec iov = { .iov_base = &hello, .iov_len = sizeof hello };
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        memset(&u, 0, sizeof u);
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
        if (sendmsg(r->conn, &mh, MSG_NOSIGNAL) != (ssize_t) sizeof hello)
                return fail(reason, n, errno ? errno : EIO, "cannot send the memory: %s", strerror(errno));
        struct pollfd pfd = { .fd = r->conn, .events = POLLIN };
        int p = poll(&pfd, 1, (int) timeout_ms);
        if (p <= 0)
                return fail(reason, n, p == 0 ? ETIMEDOUT : errno, "%s",
                            p == 0 ? "the shard did not answer" : "cannot wait for the shard's answer");
        char ans[256];
        ssize_t got = recv(r->conn, ans, sizeof ans - 1, 0);
        if (got <= 0)
                return fail(reason, n, EPROTO, "%s", "the shard closed the connection without an answer");
        ans[got] = '\0';
        if (ans[0] != '\0')
                return fail(reason, n, EPROTO, "the shard refused: %s", ans);
        return 0;
}

/* A sealed memfd of size bytes, mapped and populated (its pages are charged
 * to the worker). */
static int memfd_new(size_t size, int *ret_fd, void **ret_base, char *reason, size_t n) {
        if (size == 0 || size > SHM_MAX_SIZE)
                return fail(reason, n, EINVAL, "%s", "no memory to share (or more than a shard maps)");
        int fd = memfd_create("psnet-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return fail(reason, n, errno, "memfd_create: %s", strerror(errno));
        if (ftruncate(fd, (off_t) size) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                int e = fail(reason, n, errno, "cannot size and seal the memfd: %s", strerror(errno));
                (void) close(fd);
                return e;
        }
        void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (base == MAP_FAILED) {
                int e = fail(reason, n, errno, "cannot map the memfd: %s", strerror(errno));
                (void) close(fd);
                return e;
        }
        *ret_fd = fd;
        *ret_base = base;
        return 0;
}

static int new_token(ShmRegion *r, char *reason, size_t n) {
        if (getrandom(r->token, sizeof r->token, 0) != (ssize_t) sizeof r->token)
                return fail(reason, n, EIO, "%s", "cannot draw a random token");
        return 0;
}

int shm_region_open(ShmRegion *r, const char *path, uint32_t worker, size_t size, unsigned timeout_ms,
                    char *reason, size_t n) {
        *r = (ShmRegion) SHM_REGION_INIT;
        int fd = -1;
        int e = new_token(r, reason, n);
        if (e == 0)
                e = memfd_new(size, &fd, &r->base, reason, n);
        if (e < 0)
                return e;
        r->size = size;
        e = handover(r, path, worker, 0, fd, timeout_ms, reason, n);
        (void) close(fd);
        if (e < 0)
                shm_region_close(r);
        return e;
}

int shm_memory_new(ShmMemory *m, size_t size, char *reason, size_t n) {
        *m = (ShmMemory) SHM_MEMORY_INIT;
        int e = memfd_new(size, &m->fd, &m->base, reason, n);
        if (e == 0)
                m->size = size;
        return e;
}

void shm_memory_free(ShmMemory *m) {
        if (m->base)
                (void) munmap(m->base, m->size);
        if (m->fd >= 0)
                (void) close(m->fd);
        *m = (ShmMemory) SHM_MEMORY_INIT;
}

int shm_region_share(ShmRegion *r, const ShmMemory *m, const char *path, uint32_t worker, unsigned timeout_ms,
                     char *reason, size_t n) {
        *r = (ShmRegion) SHM_REGION_INIT;
        if (!m->base)
                return fail(reason, n, EINVAL, "%s", "no memory to share");
        int e = new_token(r, reason, n);
        if (e < 0)
                return e;
        r->base = m->base;
        r->size = m->size;
        r->shared = true;
        e = handover(r, path, worker, SHM_HELLO_PLACED_KEYS, m->fd, timeout_ms, reason, n);
        if (e < 0)
                shm_region_close(r);
        return e;
}

int shm_region_fence(ShmRegion *r, unsigned timeout_ms) {
        int e = 0;
        if (r->conn >= 0 && shutdown(r->conn, SHUT_WR) == 0) {
                /* The shard ends the session, then closes its end: EOF here. */
                uint64_t until = now_ms() + timeout_ms;
                for (;;) {
                        uint64_t now = now_ms();
                        if (now >= until) {
                                e = -ETIMEDOUT;
                                break;
                        }
                        struct pollfd pfd = { .fd = r->conn, .events = POLLIN };
                        int p = poll(&pfd, 1, (int) (until - now));
                        if (p < 0 && errno == EINTR)
                                continue;
                        if (p <= 0) {
                                e = p == 0 ? -ETIMEDOUT : -errno;
                                break;
                        }
                        char b[64];
                        ssize_t got = recv(r->conn, b, sizeof b, MSG_DONTWAIT);
                        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
                                break; /* closed (or reset: the shard is gone) */
                }
        }
        shm_region_close(r);
        return e;
}
