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

struct NetMux {
        NetSock *base;            /* the connection (a DEALER whose messages are addressed) */
        NetSock *socks;           /* the NetSocks through it */
        unsigned refs;            /* the owner's and each NetSock's (and a dispatch's) */
};

struct NetSock {
        NetMux *mux;              /* via a mux: watch and sock are the mux's */
        uint32_t to;
        NetSock *next;            /* in the mux's list */
        ZWatch *watch;
        ZWatch *monitor;          /* PAIR socket reading the monitor's events */
        void *zctx;
        uv_loop_t *loop;
        void *sock;
        bool router, addressed;
        NetRecvFn on_msg;
        NetHandshakeFn on_handshake;
        void *ud;
        char name[32];
};

static void netsock_readable(ZWatch *w, void *ud) {
        NetSock *s = ud;
        WireMsg m;
        int r = s->addressed ? wire_recv_to(zwatch_socket(w), s->router, ZMQ_DONTWAIT, &m)
                             : wire_recv(zwatch_socket(w), s->router, ZMQ_DONTWAIT, &m);
        if (r == 0 || r == -EBADMSG)
                s->on_msg(s, &m, r, s->ud);
        else if (r != -EAGAIN && r != -ETERM)
                log_warning_errno(r, "Failed to receive on the %s socket: %m", s->name);
        wire_msg_done(&m);
}

static int setopt_int(void *sock, int opt, int v) {
        return zmq_setsockopt(sock, opt, &v, sizeof v) < 0 ? -errno : 0;
}

static void netmux_unref(NetMux *m) {
        if (m && --m->refs == 0) {
                netsock_close(m->base);
                free(m);
        }
}

int netsock_new(uv_loop_t *loop, void *zctx, const NetSockConf *conf, NetRecvFn on_msg, void *ud,
                NetSock **ret) {
        NetSock *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->router = conf->type == ZMQ_ROUTER;
        s->addressed = conf->addressed;
        s->zctx = zctx;
        s->loop = loop;
        s->on_msg = on_msg;
        s->ud = ud;
        snprintf(s->name, sizeof s->name, "%s", conf->name ? conf->name : "?");
        if (conf->via) {
                if (s->router) {
                        free(s);
                        return -EINVAL;
                }
                s->mux = conf->via;
                s->to = conf->via_to;
                s->watch = s->mux->base->watch;
                s->sock = s->mux->base->sock;
                s->next = s->mux->socks;
                s->mux->socks = s;
                s->mux->refs++;
                *ret = s;
                return 0;
        }
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
        if (s->mux)
                return 0; /* the mux's one connection */
        if (server_key && zmq_setsockopt(s->sock, ZMQ_CURVE_SERVERKEY, server_key, 32) < 0)
                return -errno;
        return zmq_connect(s->sock, endpoint) < 0 ? -errno : 0;
}

int netsock_send(NetSock *s, const zmq_msg_t *route, const Psnet__Header *h, zmq_msg_t *frames, size_t n) {
        int r;
        if (s->mux) {
                zmq_msg_t to;
                wire_address_init(&to, s->to);
                r = wire_send_to(s->sock, NULL, &to, h, frames, n);
                zmq_msg_close(&to);
        } else
                r = wire_send(s->sock, route, h, frames, n);
        /* A send may consume ZMQ_FD's edge: look for incoming messages again. */
        zwatch_kick(s->watch);
        return r;
}

int netsock_send_error(NetSock *s, const zmq_msg_t *route, int status, uint64_t seq, const char *reason) {
        int r;
        if (s->mux) {
                zmq_msg_t to;
                wire_address_init(&to, s->to);
                r = wire_send_error_to(s->sock, NULL, &to, status, seq, reason);
                zmq_msg_close(&to);
        } else
                r = wire_send_error(s->sock, route, status, seq, reason);
        zwatch_kick(s->watch);
        return r;
}

int netsock_send_to(NetSock *s, const zmq_msg_t *route, const zmq_msg_t *to, const Psnet__Header *h,
                    zmq_msg_t *frames, size_t n) {
        int r = wire_send_to(s->sock, route, to, h, frames, n);
        zwatch_kick(s->watch);
        return r;
}

int netsock_send_error_to(NetSock *s, const zmq_msg_t *route, const zmq_msg_t *to, int status, uint64_t seq,
                          const char *reason) {
        int r = wire_send_error_to(s->sock, route, to, status, seq, reason);
        zwatch_kick(s->watch);
        return r;
}

int netsock_send_packed(NetSock *s, const void *data, size_t len) {
        int r = 0;
        if (s->mux) {
                /* Nothing is queued for a DEALER with no peer (-EAGAIN) on the
                 * first part; a later part of a message begun always goes. */
                zmq_msg_t to;
                wire_address_init(&to, s->to);
                r = zmq_msg_send(&to, s->sock, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0 ? -errno : 0;
                zmq_msg_close(&to);
        }
        if (r == 0)
                r = zmq_send(s->sock, data, len, ZMQ_DONTWAIT) < 0 ? -errno : 0;
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
        if (s->mux) {
                /* The mux's one connection: its handshakes are told to every
                 * NetSock that asked (netmux_new watches them). */
                s->on_handshake = cb;
                return 0;
        }
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

int netsock_set_linger(NetSock *s, int ms) {
        if (s->mux)
                return 0; /* the mux's socket, shared: its own linger */
        return setopt_int(s->sock, ZMQ_LINGER, ms);
}

bool netsock_in_callback(const NetSock *s) { return s && !s->mux && zwatch_in_dispatch(s->watch); }

NetSock *netsock_close(NetSock *s) {
        if (!s)
                return NULL;
        if (s->mux) {
                for (NetSock **p = &s->mux->socks; *p; p = &(*p)->next)
                        if (*p == s) {
                                *p = s->next;
                                break;
                        }
                netmux_unref(s->mux);
                free(s);
                return NULL;
        }
        if (s->monitor) {
                (void) zmq_socket_monitor(s->sock, NULL, 0);
                zwatch_close(s->monitor);
        }
        zwatch_close(s->watch);
        free(s);
        return NULL;
}

/* --- the mux ------------------------------------------------------------------------ */

/* A message through the mux: its address frame names the NetSock it is for. */
static void netmux_on_msg(NetSock *base, WireMsg *m, int r, void *ud) {
        NetMux *mx = ud;
        uint32_t to = 0;
        bool addressed = m->has_to && wire_address(&m->to, &to);
        NetSock *s = mx->socks;
        while (addressed && s && s->to != to)
                s = s->next;
        if (!s) {
                log_debug("a message through %s for no one here dropped to=%u", base->name, to);
                return;
        }
        /* The callback may close s, the mux's other NetSocks, the mux. */
        mx->refs++;
        s->on_msg(s, m, r, s->ud);
        netmux_unref(mx);
}

/* A failed handshake with psgate: every NetSock through it hears of it. */
static void netmux_handshake(NetSock *base, int event, int value, const char *why, void *ud) {
        NetMux *mx = ud;
        (void) base;
        mx->refs++;
        for (NetSock *s = mx->socks, *next; s; s = next) {
                next = s->next;
                if (s->on_handshake)
                        s->on_handshake(s, event, value, why, s->ud);
        }
        netmux_unref(mx);
}

int netmux_new(uv_loop_t *loop, void *zctx, const NetSockConf *conf, const char *endpoint,
               const uint8_t *server_key, NetMux **ret) {
        if (conf->type != ZMQ_DEALER || conf->via)
                return -EINVAL;
        NetMux *mx = calloc(1, sizeof *mx);
        if (!mx)
                return -ENOMEM;
        NetSockConf c = *conf;
        c.addressed = true; /* each message's first frame is its far end */
        int r = netsock_new(loop, zctx, &c, netmux_on_msg, mx, &mx->base);
        if (r < 0) {
                free(mx);
                return r;
        }
        mx->refs = 1;
        r = netsock_monitor(mx->base, 0, netmux_handshake);
        if (r == 0)
                r = netsock_connect(mx->base, endpoint, server_key);
        if (r < 0) {
                netmux_unref(mx);
                return r;
        }
        *ret = mx;
        return 0;
}

NetMux *netmux_close(NetMux *m) {
        netmux_unref(m);
        return NULL;
}
