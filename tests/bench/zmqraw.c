/* SPDX-License-Identifier: Apache-2.0 */
/* See zmqraw.h. The receiver is a forked child with its own ZeroMQ context; the
 * sender is the calling process. Both are plain blocking loops: nothing here
 * should cost more than ZeroMQ itself.
 *
 * Standalone check (prints GB/s for 1 MiB and 16 MiB messages over ipc and tcp,
 * then the exchange with two peers):
 *   gcc -O2 -DZMQRAW_MAIN tests/bench/zmqraw.c -lzmq -o /tmp/zmqraw && /tmp/zmqraw */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "zmqraw.h"

#define ZMQRAW_WINDOW 8           /* messages in flight */
#define ZMQRAW_POLL_MS 100        /* receive timeout between checks on the peer */
#define ZMQRAW_DEADLINE_MS 10000  /* silence after which the peer is given up */
#define ZMQRAW_LINGER_MS 1000

/* The last ZeroMQ error as a negative errno; a receive timeout is -EAGAIN. */
static int zerr(void) {
        int e = zmq_errno();
        return e > 0 ? -e : -EIO;
}

static int now_ns(int64_t *ret) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
                return -errno;
        *ret = (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
        return 0;
}

static int sock_set_int(void *sock, int opt, int value) {
        return zmq_setsockopt(sock, opt, &value, sizeof(value)) < 0 ? zerr() : 0;
}

/* A context with one I/O thread. */
static int ctx_new(void **ret) {
        void *ctx = zmq_ctx_new();
        if (!ctx)
                return zerr();
        if (zmq_ctx_set(ctx, ZMQ_IO_THREADS, 1) < 0) {
                int r = zerr();
                (void) zmq_ctx_term(ctx);
                return r;
        }
        *ret = ctx;
        return 0;
}

/* Closes sock (if any) and terminates ctx (if any); returns r, or the first
 * error of the teardown if r was 0. */
static int zmq_done(void *ctx, void *sock, int r) {
        if (sock && zmq_close(sock) < 0 && r == 0)
                r = zerr();
        while (ctx && zmq_ctx_term(ctx) < 0) {
                if (zmq_errno() == EINTR)
                        continue;
                if (r == 0)
                        r = zerr();
                break;
        }
        return r;
}

/* A socket of type in ctx with ZMQ_LINGER linger_ms and, where rcvtimeo_ms
 * is not negative, ZMQ_RCVTIMEO; bound at endpoint or connected to it. */
static int sock_open(void *ctx, int type, int rcvtimeo_ms, int linger_ms, const char *endpoint, bool bind,
                     void **ret) {
        void *sock = zmq_socket(ctx, type);
        int r = 0;
        if (!sock)
                return zerr();
        if (rcvtimeo_ms >= 0)
                r = sock_set_int(sock, ZMQ_RCVTIMEO, rcvtimeo_ms);
        if (r >= 0)
                r = sock_set_int(sock, ZMQ_LINGER, linger_ms);
        if (r >= 0 && (bind ? zmq_bind(sock, endpoint) : zmq_connect(sock, endpoint)) < 0)
                r = zerr();
        if (r < 0) {
                (void) zmq_close(sock);
                return r;
        }
        *ret = sock;
        return 0;
}

/* The receiving side of both baselines: a context with one I/O thread and a
 * ROUTER bound at endpoint, waiting at most ZMQRAW_DEADLINE_MS for a message.
 * Nothing is left open when it fails. */
static int router_open(const char *endpoint, void **ret_ctx, void **ret_sock) {
        void *ctx = NULL;
        int r = ctx_new(&ctx);
        if (r < 0)
                return r;
        r = sock_open(ctx, ZMQ_ROUTER, ZMQRAW_DEADLINE_MS, ZMQRAW_LINGER_MS, endpoint, true, ret_sock);
        if (r < 0)
                return zmq_done(ctx, NULL, r);
        *ret_ctx = ctx;
        return 0;
}

/* Closes what router_open opened; returns r, or the first error of the
 * teardown if r was 0. */
static int router_close(const char *endpoint, void *ctx, void *sock, int r) {
        r = zmq_done(ctx, sock, r < 0 ? r : 0);
        /* libzmq leaves the socket file of an ipc endpoint behind. */
        if (strncmp(endpoint, "ipc://", 6) == 0 && endpoint[6] != '@' && unlink(endpoint + 6) < 0 &&
            errno != ENOENT && r == 0)
                r = -errno;
        return r;
}

/* The child: binds a ROUTER, answers the handshake, then receives nmsg
 * messages (all of msg_bytes but the last, of last_bytes) and acks each. */
static int receiver_run(const char *endpoint, size_t nmsg, size_t msg_bytes, size_t last_bytes) {
        void *ctx = NULL, *sock = NULL;
        uint8_t id[256];
        size_t idlen = 0;
        int r;

        r = router_open(endpoint, &ctx, &sock);
        if (r < 0)
                return r;

        /* Frame 0 of each message is the peer's routing id, frame 1 the body.
         * Message 0 is the handshake; 1..nmsg are the payload. */
        for (size_t i = 0; r >= 0 && i <= nmsg; i++) {
                zmq_msg_t idm, body;
                size_t want = i == 0 ? 0 : i == nmsg ? last_bytes : msg_bytes;
                size_t got;

                if (zmq_msg_init(&idm) < 0) {
                        r = zerr();
                        break;
                }
                if (zmq_msg_recv(&idm, sock, 0) < 0) {
                        r = zerr();
                        (void) zmq_msg_close(&idm);
                        break;
                }
                if (!zmq_msg_more(&idm) || zmq_msg_size(&idm) > sizeof(id)) {
                        r = -EPROTO;
                        (void) zmq_msg_close(&idm);
                        break;
                }
                if (i == 0) {
                        idlen = zmq_msg_size(&idm);
                        memcpy(id, zmq_msg_data(&idm), idlen);
                }
                if (zmq_msg_close(&idm) < 0) {
                        r = zerr();
                        break;
                }

                if (zmq_msg_init(&body) < 0) {
                        r = zerr();
                        break;
                }
                if (zmq_msg_recv(&body, sock, 0) < 0) {
                        r = zerr();
                        (void) zmq_msg_close(&body);
                        break;
                }
                got = zmq_msg_size(&body);
                if (zmq_msg_more(&body))
                        r = -EPROTO;
                if (i > 0 && got != want)
                        r = -EMSGSIZE;
                if (zmq_msg_close(&body) < 0 && r >= 0)
                        r = zerr();
                if (r < 0)
                        break;

                if (zmq_send(sock, id, idlen, ZMQ_SNDMORE) < 0 || zmq_send(sock, "k", 1, 0) < 0)
                        r = zerr();
        }
        return router_close(endpoint, ctx, sock, r);
}

/* Receives one ack, waiting at most ZMQRAW_DEADLINE_MS and giving up early if
 * the child is gone (then it is reaped: *reaped and *wstatus are set). */
static int ack_recv(void *sock, pid_t pid, bool *reaped, int *wstatus) {
        char buf[16];

        for (int waited = 0; waited < ZMQRAW_DEADLINE_MS; waited += ZMQRAW_POLL_MS) {
                pid_t p;

                if (zmq_recv(sock, buf, sizeof(buf), 0) >= 0)
                        return 0;
                if (zmq_errno() == EINTR)
                        continue;
                if (zmq_errno() != EAGAIN)
                        return zerr();
                p = waitpid(pid, wstatus, WNOHANG);
                if (p < 0)
                        return -errno;
                if (p == pid) {
                        *reaped = true;
                        return -ECHILD;
                }
        }
        return -ETIMEDOUT;
}

/* The parent: handshake, then nmsg zero-copy sends from buf with a window of
 * ZMQRAW_WINDOW unacked messages. Returns the time from first send to last ack. */
static int sender_run(const char *endpoint, pid_t pid, const uint8_t *buf, size_t nmsg,
                      size_t msg_bytes, size_t last_bytes, bool *reaped, int *wstatus,
                      int64_t *ret_ns) {
        void *ctx = NULL, *sock = NULL;
        int64_t t0 = 0, t1 = 0;
        size_t sent = 0, acked = 0;
        int r;

        r = ctx_new(&ctx);
        if (r < 0)
                return r;
        r = sock_open(ctx, ZMQ_DEALER, ZMQRAW_POLL_MS, 0, endpoint, false, &sock);
        /* Handshake: an empty message, answered once the child has bound. */
        if (r >= 0 && zmq_send(sock, "", 0, 0) < 0)
                r = zerr();
        if (r >= 0)
                r = ack_recv(sock, pid, reaped, wstatus);
        if (r >= 0)
                r = now_ns(&t0);

        while (r >= 0 && acked < nmsg) {
                if (sent < nmsg && sent - acked < ZMQRAW_WINDOW) {
                        zmq_msg_t m;
                        size_t len = sent + 1 == nmsg ? last_bytes : msg_bytes;

                        /* No free function: buf outlives the context. */
                        if (zmq_msg_init_data(&m, (void *) buf, len, NULL, NULL) < 0) {
                                r = zerr();
                                break;
                        }
                        if (zmq_msg_send(&m, sock, 0) < 0) {
                                r = zerr();
                                (void) zmq_msg_close(&m);
                                break;
                        }
                        sent++;
                        continue;
                }
                r = ack_recv(sock, pid, reaped, wstatus);
                if (r >= 0)
                        acked++;
        }
        if (r >= 0)
                r = now_ns(&t1);
        r = zmq_done(ctx, sock, r < 0 ? r : 0);
        if (r < 0)
                return r;
        *ret_ns = t1 - t0;
        return 0;
}

int zmqraw_measure(const char *endpoint, size_t msg_bytes, size_t total_bytes, double *ret_gbps) {
        size_t nmsg, last_bytes;
        uint8_t *buf;
        int64_t ns = 0;
        bool reaped = false;
        int wstatus = 0, r;
        pid_t pid;

        if (!endpoint || !ret_gbps || msg_bytes == 0 || total_bytes == 0)
                return -EINVAL;
        nmsg = total_bytes / msg_bytes + (total_bytes % msg_bytes != 0);
        last_bytes = total_bytes - (nmsg - 1) * msg_bytes;

        /* Pre-faulted, so that page faults are not part of the measure. */
        buf = malloc(msg_bytes);
        if (!buf)
                return -ENOMEM;
        memset(buf, 0xa5, msg_bytes);

        pid = fork();
        if (pid < 0) {
                r = -errno;
                free(buf);
                return r;
        }
        if (pid == 0) {
                r = receiver_run(endpoint, nmsg, msg_bytes, last_bytes);
                _exit(r < 0 ? (-r > 255 ? 255 : -r) : 0);
        }

        r = sender_run(endpoint, pid, buf, nmsg, msg_bytes, last_bytes, &reaped, &wstatus, &ns);
        free(buf);
        if (r < 0 && !reaped)
                (void) kill(pid, SIGKILL);
        while (!reaped) {
                if (waitpid(pid, &wstatus, 0) == pid)
                        reaped = true;
                else if (errno != EINTR)
                        return r < 0 ? r : -errno;
        }
        /* The child's view wins where it has one: it says why the sender failed. */
        if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
                return -WEXITSTATUS(wstatus);
        if (r < 0)
                return r;
        if (!WIFEXITED(wstatus))
                return -ECHILD;
        if (ns <= 0)
                ns = 1;
        *ret_gbps = (double) total_bytes / (double) ns;  /* bytes/ns = GB/s */
        return 0;
}

/* --- the exchange: requests and replies of the same size, to several peers ---- */

/* A child of zmqraw_exchange: binds a ROUTER, answers the handshake, then
 * answers each of count messages of msg_bytes with msg_bytes of its own
 * (zero-copy from one pre-faulted buffer). */
static int echo_run(const char *endpoint, size_t count, size_t msg_bytes) {
        void *ctx = NULL, *sock = NULL;
        uint8_t *buf = malloc(msg_bytes);
        int r;
        if (!buf)
                return -ENOMEM;
        memset(buf, 0x5a, msg_bytes);
        r = router_open(endpoint, &ctx, &sock);
        if (r < 0) {
                free(buf);
                return r;
        }
        /* Message 0 is the handshake (answered with one byte); 1..count the load. */
        for (size_t i = 0; r >= 0 && i <= count; i++) {
                zmq_msg_t idm, body;
                if (zmq_msg_init(&idm) < 0 || zmq_msg_recv(&idm, sock, 0) < 0) {
                        r = zerr();
                        (void) zmq_msg_close(&idm);
                        break;
                }
                if (!zmq_msg_more(&idm) || zmq_msg_init(&body) < 0) {
                        r = -EPROTO;
                        (void) zmq_msg_close(&idm);
                        break;
                }
                if (zmq_msg_recv(&body, sock, 0) < 0)
                        r = zerr();
                else if (zmq_msg_more(&body) || zmq_msg_size(&body) != (i == 0 ? 0 : msg_bytes))
                        r = -EMSGSIZE;
                (void) zmq_msg_close(&body);
                if (r >= 0 && zmq_msg_send(&idm, sock, ZMQ_SNDMORE) < 0)
                        r = zerr();
                if (r < 0) {
                        (void) zmq_msg_close(&idm);
                        break;
                }
                zmq_msg_t rep;
                /* No free function: buf outlives the context. */
                if (i == 0 ? zmq_msg_init_data(&rep, (void *) "k", 1, NULL, NULL) < 0
                           : zmq_msg_init_data(&rep, buf, msg_bytes, NULL, NULL) < 0) {
                        r = zerr();
                        break;
                }
                if (zmq_msg_send(&rep, sock, 0) < 0) {
                        r = zerr();
                        (void) zmq_msg_close(&rep);
                }
        }
        r = router_close(endpoint, ctx, sock, r);
        free(buf); /* after the context: its zero-copy replies point into it */
        return r;
}

/* Whether a child is gone; reaps it. */
static bool child_gone(pid_t pid, bool *reaped, int *wstatus) {
        if (*reaped)
                return true;
        if (waitpid(pid, wstatus, WNOHANG) == pid)
                *reaped = true;
        return *reaped;
}

/* The parent of zmqraw_exchange: one context with one I/O thread, a DEALER
 * per peer; at most ZMQRAW_WINDOW requests unanswered per peer. */
static int exchange_run(const char *const *endpoints, size_t npeers, const pid_t *pids, const size_t *count,
                        const uint8_t *buf, size_t msg_bytes, bool *reaped, int *wstatus, int64_t *ret_ns) {
        void *ctx = NULL, *socks[ZMQRAW_MAX_PEERS] = { NULL };
        size_t sent[ZMQRAW_MAX_PEERS] = { 0 }, got[ZMQRAW_MAX_PEERS] = { 0 }, left = 0, nload = 0;
        int64_t t0 = 0, t1 = 0;
        int r = ctx_new(&ctx);
        if (r < 0)
                return r;
        for (size_t i = 0; r >= 0 && i < npeers; i++) {
                nload += count[i];
                left += count[i] + 1; /* the handshake's answer too */
                r = sock_open(ctx, ZMQ_DEALER, -1, 0, endpoints[i], false, &socks[i]);
                if (r >= 0 && zmq_send(socks[i], "", 0, 0) < 0)
                        r = zerr();
        }
        bool started = false;
        int waited = 0;
        while (r >= 0 && left > 0) {
                /* Every handshake answered: the clock starts, requests leave. */
                if (!started && left == nload) {
                        started = true;
                        r = now_ns(&t0);
                }
                for (size_t i = 0; started && r >= 0 && i < npeers; i++)
                        while (sent[i] < count[i] && sent[i] - got[i] < ZMQRAW_WINDOW) {
                                zmq_msg_t m;
                                if (zmq_msg_init_data(&m, (void *) buf, msg_bytes, NULL, NULL) < 0) {
                                        r = zerr();
                                        break;
                                }
                                if (zmq_msg_send(&m, socks[i], 0) < 0) {
                                        r = zerr();
                                        (void) zmq_msg_close(&m);
                                        break;
                                }
                                sent[i]++;
                        }
                if (r < 0)
                        break;
                zmq_pollitem_t items[ZMQRAW_MAX_PEERS];
                for (size_t i = 0; i < npeers; i++)
                        items[i] = (zmq_pollitem_t) { .socket = socks[i], .events = ZMQ_POLLIN };
                int n = zmq_poll(items, (int) npeers, ZMQRAW_POLL_MS);
                if (n < 0) {
                        if (zmq_errno() != EINTR)
                                r = zerr();
                        continue;
                }
                if (n == 0) {
                        for (size_t i = 0; i < npeers; i++)
                                if (child_gone(pids[i], &reaped[i], &wstatus[i]))
                                        r = -ECHILD;
                        if (r >= 0 && (waited += ZMQRAW_POLL_MS) >= ZMQRAW_DEADLINE_MS)
                                r = -ETIMEDOUT;
                        continue;
                }
                waited = 0;
                for (size_t i = 0; r >= 0 && i < npeers; i++) {
                        if (!(items[i].revents & ZMQ_POLLIN))
                                continue;
                        zmq_msg_t m;
                        (void) zmq_msg_init(&m);
                        while (r >= 0 && zmq_msg_recv(&m, socks[i], ZMQ_DONTWAIT) >= 0) {
                                bool hello = !started;
                                if (zmq_msg_size(&m) != (hello ? 1 : msg_bytes))
                                        r = -EMSGSIZE;
                                else if (!hello)
                                        got[i]++;
                                left--;
                        }
                        if (r >= 0 && zmq_errno() != EAGAIN)
                                r = zerr();
                        (void) zmq_msg_close(&m);
                }
        }
        if (r >= 0)
                r = now_ns(&t1);
        for (size_t i = 0; i < npeers; i++)
                if (socks[i] && zmq_close(socks[i]) < 0 && r >= 0)
                        r = zerr();
        r = zmq_done(ctx, NULL, r < 0 ? r : 0);
        if (r < 0)
                return r;
        *ret_ns = t1 - t0;
        return 0;
}

int zmqraw_exchange(const char *const *endpoints, size_t npeers, size_t msg_bytes, size_t total_bytes,
                    double *ret_gbps) {
        pid_t pids[ZMQRAW_MAX_PEERS];
        size_t count[ZMQRAW_MAX_PEERS];
        bool reaped[ZMQRAW_MAX_PEERS] = { false };
        int wstatus[ZMQRAW_MAX_PEERS] = { 0 };
        int64_t ns = 0;
        int r = 0;
        if (!endpoints || !ret_gbps || npeers == 0 || npeers > ZMQRAW_MAX_PEERS || msg_bytes == 0 ||
            total_bytes < 2 * msg_bytes)
                return -EINVAL;
        /* Requests and replies alike: half the bytes each way, whole messages. */
        size_t nmsg = total_bytes / 2 / msg_bytes;
        for (size_t i = 0; i < npeers; i++)
                count[i] = nmsg / npeers + (i < nmsg % npeers);
        uint8_t *buf = malloc(msg_bytes);
        if (!buf)
                return -ENOMEM;
        memset(buf, 0xa5, msg_bytes);
        size_t forked = 0;
        for (; forked < npeers; forked++) {
                pids[forked] = fork();
                if (pids[forked] < 0) {
                        r = -errno;
                        break;
                }
                if (pids[forked] == 0) {
                        r = echo_run(endpoints[forked], count[forked], msg_bytes);
                        _exit(r < 0 ? (-r > 255 ? 255 : -r) : 0);
                }
        }
        if (r >= 0)
                r = exchange_run(endpoints, npeers, pids, count, buf, msg_bytes, reaped, wstatus, &ns);
        free(buf);
        int child_err = 0;
        for (size_t i = 0; i < forked; i++) {
                if (r < 0 && !reaped[i])
                        (void) kill(pids[i], SIGKILL);
                while (!reaped[i]) {
                        if (waitpid(pids[i], &wstatus[i], 0) == pids[i])
                                reaped[i] = true;
                        else if (errno != EINTR) {
                                reaped[i] = true;
                                wstatus[i] = 0;
                        }
                }
                /* A child's own failure says why the exchange failed. */
                if (r >= 0 && !WIFEXITED(wstatus[i]))
                        child_err = -ECHILD;
                else if (WIFEXITED(wstatus[i]) && WEXITSTATUS(wstatus[i]) != 0 && !child_err)
                        child_err = -WEXITSTATUS(wstatus[i]);
        }
        if (child_err)
                return child_err;
        if (r < 0)
                return r;
        if (ns <= 0)
                ns = 1;
        *ret_gbps = (double) (2 * nmsg * msg_bytes) / (double) ns;
        return 0;
}

#ifdef ZMQRAW_MAIN
#include <stdio.h>

int main(void) {
        const size_t sizes[] = { 1u << 20, 16u << 20 };
        const size_t total = (size_t) 2 << 30;
        char ipc[64];
        const char *endpoints[2] = { ipc, "tcp://127.0.0.1:45599" };
        int ret = 0, r;

        r = snprintf(ipc, sizeof(ipc), "ipc:///tmp/zmqraw-%d.ipc", (int) getpid());
        if (r < 0 || (size_t) r >= sizeof(ipc))
                return 1;
        for (size_t e = 0; e < 2; e++)
                for (size_t s = 0; s < 2; s++) {
                        double gbps;

                        r = zmqraw_measure(endpoints[e], sizes[s], total, &gbps);
                        if (r < 0) {
                                fprintf(stderr, "%s %zu MiB: %s\n", endpoints[e], sizes[s] >> 20,
                                        strerror(-r));
                                ret = 1;
                                continue;
                        }
                        printf("%-32s msg %2zu MiB  total %zu MiB  %6.2f GB/s\n", endpoints[e],
                               sizes[s] >> 20, total >> 20, gbps);
                }
        /* The exchange with two peers, 1 MiB messages. */
        char ipc2[2][64];
        const char *pair[2][2] = { { ipc2[0], ipc2[1] }, { "tcp://127.0.0.1:45601", "tcp://127.0.0.1:45602" } };
        for (size_t k = 0; k < 2; k++)
                if (snprintf(ipc2[k], sizeof ipc2[k], "ipc:///tmp/zmqraw-%d-%zu.ipc", (int) getpid(), k) < 0)
                        return 1;
        for (size_t e = 0; e < 2; e++) {
                double gbps;
                r = zmqraw_exchange(pair[e], 2, 1u << 20, total, &gbps);
                if (r < 0) {
                        fprintf(stderr, "exchange %s: %s\n", pair[e][0], strerror(-r));
                        ret = 1;
                        continue;
                }
                printf("exchange, 2 peers, %-17s msg  1 MiB  total %zu MiB  %6.2f GB/s\n", e ? "tcp" : "ipc",
                       total >> 20, gbps);
        }
        return ret;
}
#endif
