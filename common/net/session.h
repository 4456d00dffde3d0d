/* SPDX-License-Identifier: Apache-2.0 */
/* A peer's session with pscoord, on the peer's libuv loop: one DEALER,
 * registration (psd, workerd), heartbeats that keep the lease, registration
 * again when pscoord forgot the peer (restart, lease lost), and requests
 * matched to their replies by sequence number, each with a deadline (psctl,
 * a worker's result). Nothing waits: registering is a state, and the peer's
 * own work (a shard's pushes and pulls) goes on meanwhile.
 *
 *   REGISTERING --REGISTER_REP--> REGISTERED --UNKNOWN_PEER--> REGISTERING
 *        \--no answer within connect_timeout_ms (first time only)--> failed()
 *
 * A registration that gets no answer is sent again every second (pscoord
 * treats a second REGISTER from the same connection as the same peer). */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "netsock.h"

typedef struct Session Session;

typedef struct SessionConf {
        const char *endpoint;         /* pscoord */
        Psnet__Role role;             /* SERVER, WORKER, EDGE: registers and heartbeats; NONE: requests only */
        const char *advertise;        /* shards: their data endpoint */
        uint32_t want_id;             /* shards: their id; workers: an id to reclaim (0: any) */
        uint64_t memory_limit;        /* shards: bytes of model state they may hold */
        uint64_t max_msg;             /* shards: the largest frame they accept */
        unsigned connect_timeout_ms;  /* the first registration gives up after this (0: never) */
        const NetKeyPair *keys;       /* CURVE keys of this peer; NULL: plain */
        const uint8_t *coord_key;     /* with keys: pscoord's public key */
        NetMux *via;                  /* through psgate (netsock.h): endpoint and coord_key are unused */
        /* The session's socket on a ZeroMQ context of its own (not via): a
         * connection of the caller's context that stalls its I/O thread (a
         * host name slow to resolve: libzmq resolves in that thread) then
         * cannot hold up the heartbeats and lose the lease. Two threads
         * more; for the daemons (psd, a worker), not for many sessions in
         * one process. */
        bool own_context;
} SessionConf;

typedef struct SessionOps {
        /* Registered (again, when again): session_id and session_lease_ms are set. */
        void (*registered)(Session *s, bool again, void *ud);
        /* The first registration failed: -ETIMEDOUT (no answer within
         * connect_timeout_ms) or -ECONNREFUSED (refused; reason says why); or
         * any registration was denied for who this peer is (-EACCES). */
        void (*failed)(Session *s, int err, const char *reason, void *ud);
        /* A message pscoord sent by itself (CONFIG, FENCE, ...). May be NULL. */
        void (*message)(Session *s, WireMsg *m, void *ud);
        /* Fills hb with this peer's figures before a heartbeat leaves. May be NULL. */
        void (*heartbeat)(Session *s, Psnet__Heartbeat *hb, void *ud);
} SessionOps;

/* A request's outcome: r = 0 and m the reply of the wanted type; -ECONNREFUSED
 * and m the MSG_ERROR (m->hdr->status, reason); -ETIMEDOUT or another error
 * with m NULL. m is valid during the call only. */
typedef void (*SessionReplyFn)(Session *s, int r, WireMsg *m, void *ud);

int session_new(uv_loop_t *loop, void *zctx, const SessionConf *conf, const SessionOps *ops, void *ud,
                Session **ret);
/* Connects and, for SERVER and WORKER, starts registering. */
int session_start(Session *s);
/* Sends h (type and body set by the caller) with this peer's id and the next seq. */
int session_send(Session *s, Psnet__Header *h);
/* Answers a message pscoord sent (e.g. FENCE): h with this peer's id and seq. */
int session_reply(Session *s, Psnet__Header *h, uint64_t seq);
/* Sends h and calls cb with the reply of type want (or MSG_ERROR), or
 * -ETIMEDOUT after timeout_ms. While pscoord is not connected the request is
 * sent again every 100 ms until the deadline. A registered peer's request
 * answered UNKNOWN_PEER (pscoord restarted, or the lease ran out) is held,
 * the peer registers again, and the request leaves again under the id it
 * gets, within the same deadline. */
int session_request(Session *s, Psnet__Header *h, Psnet__MsgType want, unsigned timeout_ms, SessionReplyFn cb,
                    void *ud);
/* Leaves the cluster: DEREGISTER, answered or not within timeout_ms, then cb
 * (r as for session_request). Heartbeats stop. cb may be NULL. reason (NULL:
 * none) tells pscoord why the member leaves, when it fails. */
int session_deregister(Session *s, const char *reason, unsigned timeout_ms, SessionReplyFn cb, void *ud);

uint32_t session_id(const Session *s);
unsigned session_lease_ms(const Session *s);
bool session_registered(const Session *s);
/* Whether this side still holds its lease at now (ms): registered, and a
 * heartbeat (or the registration) answered by pscoord left less than the
 * lease ago. pscoord counts the lease from later (when that message
 * arrived), so the lease always runs out here first. */
bool session_lease_valid(const Session *s, uint64_t now);
uint64_t session_lease_until(const Session *s);
/* Sends the heartbeat now if it is due: for a daemon's message handler to
 * call between messages, so that a long turn of its loop (64 large pushes
 * applied in one go) does not hold the heartbeat back until the turn ends.
 * true when one was sent. */
bool session_poll(Session *s);
/* A heartbeat every quarter lease: three can go missing before it runs out. */
#define SESSION_HEARTBEAT_MS(lease) MAX((lease) / 4u, 25u)
const char *session_endpoint(const Session *s);
/* Why the last handshake with pscoord failed ("" when none did): a refused or
 * missing key shows here rather than as silence. */
const char *session_handshake_error(const Session *s);
/* Milliseconds since pscoord last answered anything (0 before the first). */
uint64_t session_silent_ms(const Session *s);

/* Closes the socket and the timers; pending requests are dropped without a
 * call. NULL is fine. Returns NULL. */
Session *session_free(Session *s);
