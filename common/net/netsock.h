/* SPDX-License-Identifier: Apache-2.0 */
/* The one place psnet makes sockets: a ZeroMQ ROUTER or DEALER on a libuv loop
 * that speaks the wire format (wire.h). netsock_new sets every option a psnet
 * socket has (linger, high-water marks, the largest frame, ZMTP heartbeats,
 * CURVE keys); each received message, good or bad, goes to one callback. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "wire.h"

/* A CURVE key pair (32-byte binary keys). */
typedef struct NetKeyPair {
        uint8_t public_key[32], secret_key[32];
} NetKeyPair;

typedef struct NetMux NetMux;

typedef struct NetSockConf {
        int type;                 /* ZMQ_ROUTER or ZMQ_DEALER */
        const char *name;         /* for logs: "data", "pscoord", ... */
        int64_t max_msg;          /* largest frame accepted (ZMQ_MAXMSGSIZE); 0: no limit */
        int sndhwm, rcvhwm;       /* frames queued per peer (0: no limit) */
        int linger_ms;            /* how long close waits for unsent messages */
        unsigned heartbeat_ms;    /* ZMTP heartbeats (0: none): a peer silent for 3 of them is dropped */
        bool handover;            /* ROUTER: a reconnecting peer takes its identity over */
        bool immediate;           /* DEALER: queue nothing for a peer not connected (send: -EAGAIN) */
        const NetKeyPair *keys;   /* CURVE with these keys; NULL: plain (NULL mechanism) */
        bool curve_server;        /* with keys: this socket is the CURVE server (binds) */
        const char *zap_domain;   /* servers: the ZAP domain (allow-list); NULL: none */
        bool addressed;           /* each message has an address frame before its header (WireMsg.to;
                                   * psgate's front: netsock_send_to answers) */
        NetMux *via;              /* DEALER: no socket of its own, its messages go through this one
                                   * (netmux_new); the other options are the mux's */
        uint32_t via_to;          /* with via: the far end (NETMUX_COORD or a shard's id) */
} NetSockConf;

typedef struct NetSock NetSock;

/* A monitored event (netsock_monitor): event is ZMQ_EVENT_*, value libzmq's
 * detail (a ZMTP/ZAP protocol error, the ZAP status code, a descriptor), why
 * a sentence for people about a failed handshake (NULL for other events). */
typedef void (*NetHandshakeFn)(NetSock *s, int event, int value, const char *why, void *ud);

/* m is valid during the call only (the callback may take m->hdr, m->route or
 * frames by clearing them). r is 0 for a good message or -EBADMSG for a bad
 * one (m->status and m->reason say why; m->hdr may be NULL). */
typedef void (*NetRecvFn)(NetSock *s, WireMsg *m, int r, void *ud);

int netsock_new(uv_loop_t *loop, void *zctx, const NetSockConf *conf, NetRecvFn on_msg, void *ud,
                NetSock **ret);
/* Binds; ipc:// directories are created and stale socket files removed. */
int netsock_bind(NetSock *s, const char *endpoint);
/* Connects; with CURVE, server_key (32 bytes) is the key the server must have. */
int netsock_connect(NetSock *s, const char *endpoint, const uint8_t *server_key);
/* Sends without blocking (wire_send semantics: frames are moved). -EAGAIN when
 * the peer's queue is full or, for a DEALER, no peer is connected and the
 * queue is full; the message is then dropped. */
int netsock_send(NetSock *s, const zmq_msg_t *route, const Psnet__Header *h, zmq_msg_t *frames, size_t n);
int netsock_send_error(NetSock *s, const zmq_msg_t *route, int status, uint64_t seq, const char *reason);
/* The same with an address frame after the route (NetSockConf.addressed). */
int netsock_send_to(NetSock *s, const zmq_msg_t *route, const zmq_msg_t *to, const Psnet__Header *h,
                    zmq_msg_t *frames, size_t n);
int netsock_send_error_to(NetSock *s, const zmq_msg_t *route, const zmq_msg_t *to, int status, uint64_t seq,
                          const char *reason);
/* Sends one already packed header frame (a DEALER's request) without
 * blocking; -EAGAIN as netsock_send. */
int netsock_send_packed(NetSock *s, const void *data, size_t len);
const char *netsock_name(const NetSock *s);
/* Watches the socket's events (ZMQ_EVENT_* mask; 0: failed handshakes) and
 * calls cb for each. */
int netsock_monitor(NetSock *s, int events, NetHandshakeFn cb);
/* How long closing waits for unsent messages from now on (a peer known
 * gone: 0, or the process's exit waits the whole linger for it). */
int netsock_set_linger(NetSock *s, int ms);
/* Closes (safe inside the socket's own callback). Returns NULL. */
NetSock *netsock_close(NetSock *s);
/* Whether s is inside its own callback: a close now closes the ZeroMQ
 * socket only once that returns. */
bool netsock_in_callback(const NetSock *s);

/* Many DEALERs over one connection (an edge client behind psgate: its
 * session with pscoord and its shard connections, one outbound connection to
 * one address). Each message leaves with a first frame naming its far end,
 * 4 bytes little-endian, NETMUX_COORD or a shard's id; psgate relays it there
 * and sends the answers back with the same first frame, and the mux hands
 * each to the NetSock (NetSockConf.via, via_to) of that end. conf is the
 * connection's (a DEALER); the mux lives until it and its NetSocks are
 * closed. */
#define NETMUX_COORD UINT32_MAX
int netmux_new(uv_loop_t *loop, void *zctx, const NetSockConf *conf, const char *endpoint,
               const uint8_t *server_key, NetMux **ret);
NetMux *netmux_close(NetMux *m);
