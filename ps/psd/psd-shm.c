/* SPDX-License-Identifier: Apache-2.0 */
/* Shared-memory sessions on the shard; see psd-shm.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "alloc.h"
#include "endpoint.h"
#include "fdguard.h"
#include "log.h"
#include "macro.h"
#include "psd-shm.h"
#include "shm.h"

typedef struct ShmConn {
        ShmServer *srv;
        uv_poll_t poll;
        int fd;
        bool hello;              /* said hello: a session */
        uint32_t worker;
        uint8_t token[WIRE_SHM_TOKEN];
        uint8_t *base;
        size_t size;
        uint64_t since;
        pid_t pid;
} ShmConn;

struct ShmServer {
        uv_loop_t *loop;
        uv_poll_t listen;
        int lfd;
        char path[108];
        ShmConn *conns[PSD_SHM_MAX_SESSIONS];
        size_t n;
        uint64_t refused;
};

static void conn_closed(uv_handle_t *h) {
        ShmConn *c = h->data;
        if (c->base)
                (void) munmap(c->base, c->size);
        (void) close(c->fd);
        ps_free(c);
}

/* Ends a connection (and its session): out of the table now, freed once
 * libuv has let go of its handle. */
static void conn_end(ShmConn *c, const char *why) {
        ShmServer *s = c->srv;
        for (size_t i = 0; i < s->n; i++)
                if (s->conns[i] == c) {
                        s->conns[i] = s->conns[--s->n];
                        break;
                }
        if (c->hello)
                log_info("shared memory session ended worker=%u pid=%ld bytes=%zu reason=\"%s\"", c->worker,
                         (long) c->pid, c->size, why);
        (void) uv_poll_stop(&c->poll);
        uv_close((uv_handle_t *) &c->poll, conn_closed);
}

static void conn_refuse(ShmConn *c, const char *reason) {
        c->srv->refused++;
        log_warning("refused shared memory pid=%ld reason=\"%s\"", (long) c->pid, reason);
        (void) send(c->fd, reason, strlen(reason), MSG_NOSIGNAL | MSG_DONTWAIT);
        conn_end(c, reason);
}

static void close_fds(struct msghdr *mh) {
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                                int fd;
                                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                                (void) close(fd);
                        }
}

/* The hello: exactly one ShmHello and one descriptor. */
static void conn_hello(ShmConn *c) {
        ShmServer *s = c->srv;
        ShmHello hello;
        struct iovec iov = { .iov_base = &hello, .iov_len = sizeof hello };
        union {
                char buf[CMSG_SPACE(4 * sizeof(int))];
                struct cmsghdr align;
        } u;
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
        ssize_t got = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        int fd = -1, nfds = 0;
        for (struct cmsghdr *cm = got >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                        nfds += (int) ((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
                }
        char reason[192];
        if (got != (ssize_t) sizeof hello || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || nfds != 1 ||
            memcmp(hello.magic, SHM_MAGIC, sizeof hello.magic) != 0 || (hello.flags & ~SHM_HELLO_FLAGS) != 0) {
                if (got >= 0)
                        close_fds(&mh);
                snprintf(reason, sizeof reason, "a hello is one %zu-byte message starting %s with one memfd",
                         sizeof hello, SHM_MAGIC);
                conn_refuse(c, got == 0 ? "closed before its hello" : reason);
                return;
        }
        if (shm_check_fd(fd, hello.size, reason, sizeof reason) < 0) {
                (void) close(fd);
                conn_refuse(c, reason);
                return;
        }
        for (size_t i = 0; i < s->n; i++)
                if (s->conns[i]->hello && memcmp(s->conns[i]->token, hello.token, sizeof hello.token) == 0) {
                        (void) close(fd);
                        conn_refuse(c, "that token names a session already");
                        return;
                }
        void *base = mmap(NULL, hello.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        (void) close(fd);
        if (base == MAP_FAILED) {
                snprintf(reason, sizeof reason, "cannot map the memory: %s", strerror(errno));
                conn_refuse(c, reason);
                return;
        }
        c->base = base;
        c->size = hello.size;
        c->worker = hello.worker;
        memcpy(c->token, hello.token, sizeof c->token);
        c->hello = true;
        const char ok = '\0';
        if (send(c->fd, &ok, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
                conn_end(c, "cannot answer the hello");
                return;
        }
        log_info("shared memory session started worker=%u pid=%ld bytes=%zu", c->worker, (long) c->pid, c->size);
}

static void conn_cb(uv_poll_t *h, int status, int events) {
        ShmConn *c = h->data;
        if (status < 0) {
                conn_end(c, uv_strerror(status));
                return;
        }
        if (!c->hello && (events & UV_READABLE)) {
                conn_hello(c);
                return;
        }
        /* After the hello the worker sends nothing: whatever comes (its close
         * most likely) ends the session. */
        char b;
        ssize_t got = recv(c->fd, &b, 1, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EINTR) && !(events & UV_DISCONNECT))
                return;
        conn_end(c, got == 0 || (events & UV_DISCONNECT) ? "the worker closed it" : "the worker sent more than a hello");
}

static void listen_cb(uv_poll_t *h, int status, int events) {
        ShmServer *s = h->data;
        (void) events;
        if (status < 0)
                return;
        for (;;) {
                int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                                log_warning_errno(-errno, "Failed to accept a shared-memory connection: %m");
                        return;
                }
                fdguard_forget(fd); /* a hello and descriptors, not ZMTP */
                struct ucred cred = { 0 };
                socklen_t cl = sizeof cred;
                (void) getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
                if (s->n == PSD_SHM_MAX_SESSIONS) {
                        s->refused++;
                        log_warning("refused shared memory pid=%ld reason=\"%d sessions open, the most a shard "
                                    "serves\"", (long) cred.pid, PSD_SHM_MAX_SESSIONS);
                        (void) close(fd);
                        continue;
                }
                ShmConn *c = ps_calloc(1, sizeof *c);
                if (!c || uv_poll_init(s->loop, &c->poll, fd) < 0) {
                        ps_free(c);
                        (void) close(fd);
                        continue;
                }
                c->srv = s;
                c->fd = fd;
                c->pid = cred.pid;
                c->since = now_ms();
                c->poll.data = c;
                s->conns[s->n++] = c;
                int r = uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, conn_cb);
                if (r < 0)
                        conn_end(c, uv_strerror(r));
        }
}

int shm_server_new(uv_loop_t *loop, const char *listen_endpoint, ShmServer **ret) {
        char path[108];
        *ret = NULL;
        int r = shm_socket_path(listen_endpoint, path, sizeof path);
        if (r == -EPROTONOSUPPORT)
                return 0;
        if (r < 0) {
                log_info("no shared memory beside %s: the path is too long for a unix socket", listen_endpoint);
                return 0;
        }
        ShmServer *s = ps_calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->loop = loop;
        snprintf(s->path, sizeof s->path, "%s", path);
        char ep[128];
        snprintf(ep, sizeof ep, "ipc://%s", path);
        r = endpoint_prepare(ep); /* a stale socket of a killed shard goes; a live one is an error */
        s->lfd = r < 0 ? -1 : socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (r == 0 && s->lfd < 0)
                r = -errno;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        if (r == 0 && (bind(s->lfd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(s->lfd, 64) < 0))
                r = -errno;
        /* The same access as the data socket beside it. */
        struct stat st;
        if (r == 0 && stat(listen_endpoint + 6, &st) == 0 && chmod(path, st.st_mode & 07777) < 0)
                r = -errno;
        if (r == 0 && (r = uv_poll_init(loop, &s->listen, s->lfd)) == 0) {
                s->listen.data = s;
                r = uv_poll_start(&s->listen, UV_READABLE, listen_cb);
        }
        if (r < 0) {
                log_error_errno(r, "Failed to listen on %s: %m", path);
                if (s->listen.data)
                        uv_close((uv_handle_t *) &s->listen, NULL);
                if (s->lfd >= 0)
                        (void) close(s->lfd);
                ps_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

static void server_closed(uv_handle_t *h) {
        ShmServer *s = h->data;
        (void) close(s->lfd);
        ps_free(s);
}

ShmServer *shm_server_free(ShmServer *s) {
        if (!s)
                return NULL;
        while (s->n > 0)
                conn_end(s->conns[0], "the shard stops");
        (void) unlink(s->path);
        (void) uv_poll_stop(&s->listen);
        uv_close((uv_handle_t *) &s->listen, server_closed);
        return NULL;
}

void shm_server_tick(ShmServer *s, uint64_t now) {
        for (size_t i = 0; s && i < s->n;) {
                ShmConn *c = s->conns[i];
                if (!c->hello && now - c->since > PSD_SHM_HELLO_MS)
                        conn_refuse(c, "no hello within 5 s"); /* takes it out of conns[i] */
                else
                        i++;
        }
}

uint8_t *shm_server_at(ShmServer *s, ProtobufCBinaryData token, uint32_t worker, uint64_t offset, uint64_t bytes,
                       char *reason, size_t n) {
        for (size_t i = 0; s && token.len == WIRE_SHM_TOKEN && i < s->n; i++) {
                ShmConn *c = s->conns[i];
                if (!c->hello || memcmp(c->token, token.data, WIRE_SHM_TOKEN) != 0)
                        continue;
                if (c->worker != worker)
                        break;
                if (offset > c->size || bytes > c->size - offset) {
                        snprintf(reason, n, "bytes %llu..%llu lie outside the %zu bytes of shared memory",
                                 (unsigned long long) offset, (unsigned long long) (offset + bytes), c->size);
                        return NULL;
                }
                return c->base + offset;
        }
        snprintf(reason, n, SHM_NO_SESSION " of worker %u by that token on this shard%s", worker,
                 s ? "" : " (it serves none)");
        return NULL;
}

size_t shm_server_sessions(const ShmServer *s) { return s ? s->n : 0; }
uint64_t shm_server_refused(const ShmServer *s) { return s ? s->refused : 0; }

uint8_t **shm_server_keys(ShmServer *s, const Psnet__Header *h, size_t esize, char *reason, size_t n) {
        uint8_t **at = ps_malloc(MAX(h->n_keys, (size_t) 1) * sizeof *at);
        if (!at) {
                snprintf(reason, n, "out of memory");
                return NULL;
        }
        uint64_t offset = h->shm_offset;
        for (size_t i = 0; i < h->n_keys; i++) {
                uint64_t bytes = (uint64_t) h->keys[i]->len * esize;
                if (h->n_shm_keys > 0)
                        offset = h->shm_keys[i];
                if (!(at[i] = shm_server_at(s, h->shm_session, h->sender, offset, bytes, reason, n)))
                        return mfree(at);
                offset += bytes;
        }
        return at;
}
