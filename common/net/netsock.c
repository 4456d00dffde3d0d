/* SPDX-License-Identifier: Apache-2.0 */
/* See netsock.h. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "endpoint.h"
#include "log.h"
#include "netsock.h"
#include "zwatch.h"

struct NetSock {
        ZWatch *watch;
        ZWatch *monitor;          /* PAIR socket reading the monitor's events */
        void *zctx;
        uv_loop_t *loop;
        void *sock;
        bool router;
        NetRecvFn on_msg;
        NetHandshakeFn on_handshake;
        void *ud;
        char name[32];
};

static void netsock_readable(ZWatch *w, void *ud) {
        NetSock *s = ud;
        WireMsg m;
        int r = wire_recv(zwatch_socket(w), s->router, ZMQ_DONTWAIT, &m);
        if (r == 0 || r == -EBADMSG)
                s->on_msg(s, &m, r, s->ud);
        else if (r != -EAGAIN && r != -ETERM)
                log_warning_errno(r, "Failed to receive on the %s socket: %m", s->name);
        wire_msg_done(&m);
}

static int setopt_int(void *sock, int opt, int v) {
        return zmq_setsockopt(sock, opt, &v, sizeof v) < 0 ? -errno : 0;
}

int netsock_new(uv_loop_t *loop, void *zctx, const NetSockConf *conf, NetRecvFn on_msg, void *ud,
                NetSock **ret) {
        NetSock *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->router = conf->type == ZMQ_ROUTER;
        s->zctx = zctx;
        s->loop = loop;
        s->on_msg = on_msg;
        s->ud = ud;
        snprintf(s->name, sizeof s->name, "%s", conf->name ? conf->name : "?");
        s->sock = zmq_socket(zctx, conf->type);
        if (!s->sock) {
                int r = -errno;
                free(s);
                return r;
        }
        int64_t max_msg = conf->max_msg > 0 ? conf->max_msg : -1;
        int r = 0;
        if (zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg) < 0)
                r = -errno;
        if (r == 0)
                r = setopt_int(s->sock, ZMQ_LINGER, conf->linger_ms);
        if (r == 0)
                r = setopt_int(s->sock, ZMQ_SNDHWM, conf->sndhwm);
        if (r == 0)
                r = setopt_int(s->sock, ZMQ_RCVHWM, conf->rcvhwm);
        if (r == 0 && conf->heartbeat_ms) {
                r = setopt_int(s->sock, ZMQ_HEARTBEAT_IVL, (int) conf->heartbeat_ms);
                if (r == 0)
                        r = setopt_int(s->sock, ZMQ_HEARTBEAT_TIMEOUT, (int) conf->heartbeat_ms * 3);
                if (r == 0)
                        r = setopt_int(s->sock, ZMQ_HEARTBEAT_TTL, (int) conf->heartbeat_ms * 3);
        }
        if (r == 0 && conf->handover)
                r = setopt_int(s->sock, ZMQ_ROUTER_HANDOVER, 1);
        if (r == 0 && conf->immediate)
                r = setopt_int(s->sock, ZMQ_IMMEDIATE, 1);
        if (r == 0 && conf->keys) {
                if (conf->curve_server)
                        r = setopt_int(s->sock, ZMQ_CURVE_SERVER, 1);
                if (r == 0 && zmq_setsockopt(s->sock, ZMQ_CURVE_PUBLICKEY, conf->keys->public_key, 32) < 0)
                        r = -errno;
                if (r == 0 && zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, conf->keys->secret_key, 32) < 0)
                        r = -errno;
        }
        if (r == 0 && conf->zap_domain &&
            zmq_setsockopt(s->sock, ZMQ_ZAP_DOMAIN, conf->zap_domain, strlen(conf->zap_domain)) < 0)
                r = -errno;
        if (r == 0)
                r = zwatch_new(loop, s->sock, netsock_readable, s, &s->watch);
        if (r < 0) {
                zmq_close(s->sock);
                free(s);
                return r;
        }
        *ret = s;
        return 0;
}

int netsock_bind(NetSock *s, const char *endpoint) {
        int r = endpoint_prepare(endpoint);
        if (r < 0)
                return r;
        return zmq_bind(s->sock, endpoint) < 0 ? -errno : 0;
}

int netsock_connect(NetSock *s, const char *endpoint, const uint8_t *server_key) {
        if (server_key && zmq_setsockopt(s->sock, ZMQ_CURVE_SERVERKEY, server_key, 32) < 0)
                return -errno;
        return zmq_connect(s->sock, endpoint) < 0 ? -errno : 0;
}

int netsock_send(NetSock *s, const zmq_msg_t *route, const Psnet__Header *h, zmq_msg_t *frames, size_t n) {
        int r = wire_send(s->sock, route, h, frames, n);
        /* A send may consume ZMQ_FD's edge: look for incoming messages again. */
        zwatch_kick(s->watch);
        return r;
}

int netsock_send_error(NetSock *s, const zmq_msg_t *route, int status, uint64_t seq, const char *reason) {
        int r = wire_send_error(s->sock, route, status, seq, reason);
        zwatch_kick(s->watch);
        return r;
}

int netsock_send_packed(NetSock *s, const void *data, size_t len) {
        int r = zmq_send(s->sock, data, len, ZMQ_DONTWAIT) < 0 ? -errno : 0;
        zwatch_kick(s->watch);
        return r;
}

const char *netsock_name(const NetSock *s) {
        return s->name;
}

/* What a failed handshake means, for the people who read the logs. */
static const char *handshake_why(int event, int value) {
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
                return value == 400 ? "the peer refused this key (not in its allow-list, or not in a role it serves)"
                                    : "the peer refused this connection (authentication)";
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
                if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
                        return "the two ends disagree on encryption: one runs with --keys, the other without";
                if (value >= ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC && value < ZMQ_PROTOCOL_ERROR_ZAP_UNSPECIFIED)
                        return "the CURVE handshake failed (wrong server key?)";
                return "the handshake broke the protocol";
        }
        return "the handshake failed (wrong server key, or not a psnet peer?)";
}

static void netsock_monitor_readable(ZWatch *w, void *ud) {
        NetSock *s = ud;
        void *m = zwatch_socket(w);
        zmq_msg_t ev, ep;
        zmq_msg_init(&ev);
        zmq_msg_init(&ep);
        if (zmq_msg_recv(&ev, m, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&ev);
                zmq_msg_close(&ep);
                return;
        }
        bool more = zmq_msg_more(&ev);
        if (more)
                (void) zmq_msg_recv(&ep, m, ZMQ_DONTWAIT);
        if (zmq_msg_size(&ev) == 6 && s->on_handshake) {
                const uint8_t *d = zmq_msg_data(&ev);
                uint16_t event;
                uint32_t value;
                memcpy(&event, d, 2);
                memcpy(&value, d + 2, 4);
                bool hs = event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                          event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
                s->on_handshake(s, event, (int) value, hs ? handshake_why(event, (int) value) : NULL, s->ud);
        }
        zmq_msg_close(&ev);
        zmq_msg_close(&ep);
}

int netsock_monitor(NetSock *s, int events, NetHandshakeFn cb) {
        /* A name never used before in this process: a socket closed just now
         * keeps its monitor's inproc name bound until ZeroMQ's reaper has
         * closed it, and a new NetSock may reuse the old one's address (the
         * pointer was the name: zmq_socket_monitor then failed EADDRINUSE). */
        static atomic_ullong next_monitor;
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://psnet-monitor-%llu", (unsigned long long) ++next_monitor);
        if (!events)
                events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
        if (zmq_socket_monitor(s->sock, ep, events) < 0)
                return -errno;
        void *pair = zmq_socket(s->zctx, ZMQ_PAIR);
        int zero = 0;
        if (!pair)
                return -errno;
        if (zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof zero) < 0 || zmq_connect(pair, ep) < 0) {
                int r = -errno;
                zmq_close(pair);
                return r;
        }
        int r = zwatch_new(s->loop, pair, netsock_monitor_readable, s, &s->monitor);
        if (r < 0) {
                zmq_close(pair);
                return r;
        }
        s->on_handshake = cb;
        return 0;
}

int netsock_set_max_msg(NetSock *s, int64_t bytes) {
        int64_t v = bytes > 0 ? bytes : -1;
        return zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &v, sizeof v) < 0 ? -errno : 0;
}

NetSock *netsock_close(NetSock *s) {
        if (!s)
                return NULL;
        if (s->monitor) {
                (void) zmq_socket_monitor(s->sock, NULL, 0);
                zwatch_close(s->monitor);
        }
        zwatch_close(s->watch);
        free(s);
        return NULL;
}
