/* SPDX-License-Identifier: Apache-2.0 */
/* See session.h. One uv_timer serves every deadline of the session (the next
 * heartbeat, each request's resend and timeout); session_schedule sets it to
 * the earliest. Requests are kept packed, so one that could not leave (pscoord
 * not connected yet: the socket is ZMQ_IMMEDIATE) is sent again as it was. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "endpoint.h"
#include "errors.h"
#include "log.h"
#include "session.h"

#define SESSION_RESEND_MS 100        /* a request that could not leave is tried again */
#define SESSION_REGISTER_RETRY_MS 1000
#define SESSION_DEFAULT_LEASE_MS 5000

typedef struct Req {
        struct Req *next;
        uint64_t seq;
        Psnet__MsgType want;
        uint8_t *packed;
        size_t len;
        bool sent;
        bool held;           /* answered UNKNOWN_PEER: sent again once registered again */
        uint64_t deadline, resend_at;
        SessionReplyFn cb;
        void *ud;
} Req;

typedef enum { S_IDLE, S_REGISTERING, S_REGISTERED, S_LEAVING } SessionState;

struct Session {
        uv_loop_t *loop;
        void *own_zctx;              /* conf.own_context: the socket's context */
        uv_timer_t timer;
        bool timer_init;
        NetSock *sock;
        SessionConf conf;
        char *endpoint, *advertise;
        SessionOps ops;
        void *ud;
        SessionState state;
        bool ever_registered;
        uint64_t started_ms, next_heartbeat, last_reply, warned_silent;
        uint64_t retry_at;           /* register again then (after a RESOURCE refusal); 0: none */
        uint32_t id;
        unsigned lease_ms;
        uint64_t seq;
        uint64_t register_seq;       /* seq of the REGISTER in flight (0: none) */
        uint64_t register_ms;        /* when that REGISTER was first queued */
        /* The lease as this side knows it: pscoord counts it from when a message
         * arrived, this side from when the answered one left, so it runs out
         * here first. */
        uint64_t lease_until;
        struct { uint64_t seq, ms; } hb_sent[8];
        Req *reqs;
        NetKeyPair keys;
        uint8_t coord_key[32];
        char handshake_error[160];
        bool handshake_specific;     /* handshake_error says why (not "no detail") */
};

static void session_schedule(Session *s);

static void req_free(Req *q) {
        free(q->packed);
        free(q);
}

/* Unlinks q from the pending list. */
static void req_unlink(Session *s, Req *q) {
        for (Req **p = &s->reqs; *p; p = &(*p)->next)
                if (*p == q) {
                        *p = q->next;
                        return;
                }
}

static Req *req_find(Session *s, uint64_t seq) {
        for (Req *q = s->reqs; q; q = q->next)
                if (q->seq == seq)
                        return q;
        return NULL;
}

/* Tries to hand q to ZeroMQ; -EAGAIN while pscoord is not connected. */
static int req_send(Session *s, Req *q) {
        /* Through netsock: a send may consume ZMQ_FD's edge, and the replies
         * already queued would wait for the next wake-up (a heartbeat). */
        int r = netsock_send_packed(s->sock, q->packed, q->len);
        if (r == 0)
                q->sent = true;
        else
                q->resend_at = now_ms() + SESSION_RESEND_MS;
        return r;
}

/* Stamps h with this peer's id and the next seq. */
static void session_stamp(Session *s, Psnet__Header *h) {
        h->has_sender = true;
        h->sender = s->id;
        h->has_seq = true;
        h->seq = ++s->seq;
}

/* A held request leaves again under this peer's id now (the same seq, so
 * its answer still finds it): registered again as a new peer, the id changed. */
static int req_restamp(Session *s, Req *q) {
        Psnet__Header *h = psnet__header__unpack(NULL, q->len, q->packed);
        if (!h)
                return -ENOMEM;
        h->has_sender = true;
        h->sender = s->id;
        size_t len = psnet__header__get_packed_size(h);
        uint8_t *buf = malloc(len ? len : 1);
        if (buf)
                psnet__header__pack(h, buf);
        psnet__header__free_unpacked(h, NULL);
        if (!buf)
                return -ENOMEM;
        free(q->packed);
        q->packed = buf;
        q->len = len;
        return 0;
}

int session_send(Session *s, Psnet__Header *h) {
        session_stamp(s, h);
        return netsock_send(s->sock, NULL, h, NULL, 0);
}

int session_reply(Session *s, Psnet__Header *h, uint64_t seq) {
        h->has_sender = h->has_seq = true;
        h->sender = s->id;
        h->seq = seq;
        return netsock_send(s->sock, NULL, h, NULL, 0);
}

/* Queues a request; cb may be NULL (internal requests handle replies inline). */
static int session_queue(Session *s, Psnet__Header *h, Psnet__MsgType want, unsigned timeout_ms,
                         SessionReplyFn cb, void *ud, uint64_t *ret_seq) {
        Req *q = calloc(1, sizeof *q);
        if (!q)
                return -ENOMEM;
        session_stamp(s, h);
        q->seq = h->seq;
        q->len = psnet__header__get_packed_size(h);
        q->packed = malloc(q->len ? q->len : 1);
        if (!q->packed) {
                free(q);
                return -ENOMEM;
        }
        psnet__header__pack(h, q->packed);
        q->want = want;
        q->cb = cb;
        q->ud = ud;
        q->deadline = now_ms() + timeout_ms;
        q->next = s->reqs;
        s->reqs = q;
        int r = req_send(s, q);
        if (r < 0 && r != -EAGAIN) {
                req_unlink(s, q);
                req_free(q);
                return r;
        }
        if (ret_seq)
                *ret_seq = q->seq;
        session_schedule(s);
        return 0;
}

int session_request(Session *s, Psnet__Header *h, Psnet__MsgType want, unsigned timeout_ms, SessionReplyFn cb,
                    void *ud) {
        return session_queue(s, h, want, timeout_ms, cb, ud, NULL);
}

/* --- registration ----------------------------------------------------------- */

static int session_register(Session *s) {
        Psnet__Header h;
        Psnet__Register reg = PSNET__REGISTER__INIT;
        char host[64] = "";
        reg.role = s->conf.role;
        reg.endpoint = s->advertise;
        /* A worker asks for its old id back; a shard always has its own. */
        uint32_t want = s->conf.role == PSNET__ROLE__ROLE_SERVER ? s->conf.want_id : s->id ? s->id : s->conf.want_id;
        reg.has_want_id = want != 0;
        reg.want_id = want;
        reg.has_pid = true;
        reg.pid = (uint32_t) getpid();
        reg.has_memory_limit = s->conf.memory_limit != 0;
        reg.memory_limit = s->conf.memory_limit;
        reg.has_max_msg = s->conf.max_msg != 0;
        reg.max_msg = s->conf.max_msg;
        if (gethostname(host, sizeof host - 1) == 0)
                reg.name = host;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_REGISTER);
        h.body_case = PSNET__HEADER__BODY_REG;
        h.reg = &reg;
        s->state = S_REGISTERING;
        s->register_ms = now_ms();
        /* Sent again after a second without an answer; the first registration
         * stops waiting at its connect time-out, not a retry later. */
        unsigned wait = SESSION_REGISTER_RETRY_MS;
        if (!s->ever_registered && s->conf.connect_timeout_ms) {
                uint64_t spent = now_ms() - s->started_ms;
                uint64_t left = spent < s->conf.connect_timeout_ms ? s->conf.connect_timeout_ms - spent : 0;
                wait = (unsigned) MIN((uint64_t) wait, left);
        }
        return session_queue(s, &h, PSNET__MSG_TYPE__MSG_REGISTER_REP, wait, NULL, NULL, &s->register_seq);
}

/* The answer to our REGISTER (or none: m NULL, r -ETIMEDOUT). */
static void session_register_done(Session *s, int r, WireMsg *m) {
        s->register_seq = 0;
        if (r == 0) {
                bool again = s->ever_registered;
                s->id = m->hdr->reg_rep->assigned_id;
                s->lease_ms = m->hdr->reg_rep->lease_ms ? m->hdr->reg_rep->lease_ms : SESSION_DEFAULT_LEASE_MS;
                s->state = S_REGISTERED;
                s->ever_registered = true;
                s->lease_until = s->register_ms + s->lease_ms;
                s->next_heartbeat = now_ms() + SESSION_HEARTBEAT_MS(s->lease_ms);
                for (Req *q = s->reqs; q; q = q->next)
                        if (q->held) {
                                q->held = false;
                                if (req_restamp(s, q) < 0)
                                        log_error("out of memory: a request held while registering again "
                                                  "leaves unchanged");
                                (void) req_send(s, q); /* -EAGAIN: sent again by the timer */
                        }
                if (s->ops.registered)
                        s->ops.registered(s, again, s->ud);
                return;
        }
        const char *reason = m && m->hdr && m->hdr->reason ? m->hdr->reason : "";
        /* RESOURCE: not now (a shard id still held by a live lease): try again. */
        bool retry = m && m->hdr && m->hdr->status == PSNET__STATUS__STATUS_RESOURCE;
        if (!s->ever_registered && r == -ECONNREFUSED && !retry) {
                s->state = S_IDLE;
                if (s->ops.failed)
                        s->ops.failed(s, r, reason, s->ud);
                return;
        }
        if (!s->ever_registered && s->conf.connect_timeout_ms &&
            now_ms() - s->started_ms >= s->conf.connect_timeout_ms) {
                s->state = S_IDLE;
                if (s->ops.failed)
                        s->ops.failed(s, -ETIMEDOUT, s->handshake_error[0] ? s->handshake_error : "no answer", s->ud);
                return;
        }
        if (r == -ECONNREFUSED && m->hdr->status == PSNET__STATUS__STATUS_DENIED) {
                /* Refused for who we are (a key's role, an eviction): trying again cannot help. */
                s->state = S_IDLE;
                if (s->ops.failed)
                        s->ops.failed(s, -EACCES, reason, s->ud);
                return;
        }
        if (r == -ECONNREFUSED)
                log_warning("pscoord refused the registration; trying again reason=\"%s\"", reason);
        if (retry && !s->ever_registered && s->conf.connect_timeout_ms &&
            now_ms() - s->started_ms + SESSION_REGISTER_RETRY_MS > s->conf.connect_timeout_ms) {
                s->state = S_IDLE;
                if (s->ops.failed)
                        s->ops.failed(s, -ECONNREFUSED, reason, s->ud);
                return;
        }
        if (retry) {
                s->retry_at = now_ms() + SESSION_REGISTER_RETRY_MS; /* not at once: the lease has to run out */
                session_schedule(s);
        } else if (session_register(s) < 0)
                log_error("out of memory while registering with pscoord");
}

/* --- dispatch -------------------------------------------------------------------- */

static void session_finish_req(Session *s, Req *q, int r, WireMsg *m) {
        req_unlink(s, q);
        bool reg = q->seq == s->register_seq;
        SessionReplyFn cb = q->cb;
        void *ud = q->ud;
        req_free(q);
        if (reg)
                session_register_done(s, r, m);
        else if (cb)
                cb(s, r, m, ud);
}

static bool is_reply_type(int t) {
        return t == PSNET__MSG_TYPE__MSG_REGISTER_REP || t == PSNET__MSG_TYPE__MSG_HEARTBEAT_REP ||
               t == PSNET__MSG_TYPE__MSG_DEREGISTER_REP || t == PSNET__MSG_TYPE__MSG_STATUS_REP ||
               t == PSNET__MSG_TYPE__MSG_HISTORY_REP ||
               t == PSNET__MSG_TYPE__MSG_JOB_REP || t == PSNET__MSG_TYPE__MSG_RESULT_REP;
}

static void session_on_msg(NetSock *ns, WireMsg *m, int r, void *ud) {
        Session *s = ud;
        (void) ns;
        if (r < 0) {
                log_warning("bad message from pscoord reason=\"%s\"", m->reason);
                return;
        }
        Psnet__Header *h = m->hdr;
        s->last_reply = now_ms();
        s->warned_silent = 0;
        Req *q = h->has_seq ? req_find(s, h->seq) : NULL;
        bool unknown = h->type == PSNET__MSG_TYPE__MSG_ERROR && h->status == PSNET__STATUS__STATUS_UNKNOWN_PEER;
        /* pscoord forgot this peer (it restarted, or the lease ran out) while
         * a request was on its way, e.g. a worker's RESULT: the request waits,
         * within its deadline, for the registration again and then leaves
         * again. Failing it would lose it. */
        bool hold = unknown && q && q->seq != s->register_seq && s->ever_registered &&
                    (s->state == S_REGISTERED || s->state == S_REGISTERING);
        if (hold) {
                q->held = true;
                q->sent = false;
        } else if (q && (h->type == q->want || h->type == PSNET__MSG_TYPE__MSG_ERROR)) {
                session_finish_req(s, q, h->type == q->want ? 0 : -ECONNREFUSED, m);
                session_schedule(s);
                return;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_HEARTBEAT_REP && h->status == PSNET__STATUS__STATUS_OK && h->has_seq) {
                size_t i = h->seq % ELEMENTSOF(s->hb_sent);
                if (s->hb_sent[i].seq == h->seq && s->hb_sent[i].ms + s->lease_ms > s->lease_until)
                        s->lease_until = s->hb_sent[i].ms + s->lease_ms;
                return;
        }
        if (unknown) {
                s->lease_until = 0;
                if (s->state == S_REGISTERED) {
                        log_warning("pscoord does not know this peer (restarted, or the lease ran out): registering "
                                    "again%s", hold ? ", then sending the request again" : "");
                        if (session_register(s) < 0)
                                log_error("out of memory while registering with pscoord");
                        if (!hold)
                                return;
                }
                if (hold) {
                        session_schedule(s);
                        return;
                }
        }
        if (h->type == PSNET__MSG_TYPE__MSG_ERROR) {
                log_warning("pscoord error status=%s reason=\"%s\"", status_name(h->status),
                            h->reason ? h->reason : "");
                return;
        }
        if (is_reply_type(h->type))
                return; /* a heartbeat's answer, or a late one to a request given up on */
        if (s->ops.message)
                s->ops.message(s, m, s->ud);
}

static void session_heartbeat(Session *s) {
        Psnet__Header h;
        Psnet__Heartbeat hb = PSNET__HEARTBEAT__INIT;
        if (s->ops.heartbeat)
                s->ops.heartbeat(s, &hb, s->ud);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_HEARTBEAT);
        h.body_case = PSNET__HEADER__BODY_HEARTBEAT;
        h.heartbeat = &hb;
        uint64_t sent = now_ms();
        int r = session_send(s, &h);
        if (r == 0) {
                size_t i = h.seq % ELEMENTSOF(s->hb_sent);
                s->hb_sent[i].seq = h.seq;
                s->hb_sent[i].ms = sent;
        }
        if (r < 0 && r != -EAGAIN)
                log_warning_errno(r, "Failed to send a heartbeat: %m");
}

/* Sends the heartbeat if it is due at now, and sets the next one's time. */
static bool heartbeat_if_due(Session *s, uint64_t now) {
        if (s->state != S_REGISTERED || now < s->next_heartbeat)
                return false;
        session_heartbeat(s);
        s->next_heartbeat = now + SESSION_HEARTBEAT_MS(s->lease_ms);
        return true;
}

bool session_poll(Session *s) {
        if (!s || !heartbeat_if_due(s, now_ms()))
                return false;
        session_schedule(s);
        return true;
}

static void session_tick(uv_timer_t *t) {
        Session *s = t->data;
        uint64_t now = now_ms();
        /* Requests: resend what could not leave, time out what got no answer. */
        for (Req *q = s->reqs, *next; q; q = next) {
                next = q->next;
                if (now >= q->deadline) {
                        session_finish_req(s, q, -ETIMEDOUT, NULL);
                        next = s->reqs; /* the callback may have changed the list */
                        now = now_ms();
                        continue;
                }
                if (!q->sent && !q->held && now >= q->resend_at)
                        (void) req_send(s, q);
        }
        if (s->retry_at && now >= s->retry_at) {
                s->retry_at = 0;
                if (session_register(s) < 0)
                        log_error("out of memory while registering with pscoord");
        }
        if (heartbeat_if_due(s, now)) {
                uint64_t silent = session_silent_ms(s);
                if (silent > 3ull * s->lease_ms && now - s->warned_silent > 3ull * s->lease_ms) {
                        log_warning("pscoord silent for %lu ms; serving on", (unsigned long) silent);
                        s->warned_silent = now;
                }
        }
        session_schedule(s);
}

static void session_schedule(Session *s) {
        uint64_t next = UINT64_MAX, now = now_ms();
        for (Req *q = s->reqs; q; q = q->next) {
                next = MIN(next, q->deadline);
                if (!q->sent && !q->held)
                        next = MIN(next, q->resend_at);
        }
        if (s->state == S_REGISTERED)
                next = MIN(next, s->next_heartbeat);
        if (s->retry_at)
                next = MIN(next, s->retry_at);
        if (next == UINT64_MAX) {
                (void) uv_timer_stop(&s->timer);
                return;
        }
        (void) uv_timer_start(&s->timer, session_tick, next > now ? next - now : 0, 0);
}

static void session_on_handshake(NetSock *ns, int event, int value, const char *why, void *ud) {
        Session *s = ud;
        (void) ns;
        /* A handshake cut off without a reason (the other end, having seen
         * the mismatch first, closed the connection) says less than one
         * seen before that said why: the reason stays. */
        bool specific = event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
        if (!specific && s->handshake_specific)
                return;
        s->handshake_specific = specific;
        /* Cut off with no reason while this side has no keys: most likely a
         * pscoord that runs with --keys (it saw the mismatch first). */
        if (!specific && !s->conf.keys)
                why = "the handshake failed: the two ends probably disagree on encryption (pscoord runs with "
                      "--keys? this side has none), or pscoord is not a psnet peer";
        if (strcmp(s->handshake_error, why) != 0)
                log_info("handshake with pscoord failed reason=\"%s\" event=%d detail=%d", why, event, value);
        snprintf(s->handshake_error, sizeof s->handshake_error, "%s", why);
}

const char *session_handshake_error(const Session *s) {
        return s->handshake_error;
}

/* --- life ------------------------------------------------------------------------- */

int session_new(uv_loop_t *loop, void *zctx, const SessionConf *conf, const SessionOps *ops, void *ud,
                Session **ret) {
        Session *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->loop = loop;
        s->conf = *conf;
        s->ops = *ops;
        s->ud = ud;
        s->endpoint = strdup(conf->endpoint);
        s->advertise = conf->advertise ? strdup(conf->advertise) : NULL;
        if (!s->endpoint || (conf->advertise && !s->advertise)) {
                session_free(s);
                return -ENOMEM;
        }
        s->conf.endpoint = s->endpoint;
        s->conf.advertise = s->advertise;
        if (conf->keys) {
                s->keys = *conf->keys;
                s->conf.keys = &s->keys;
                memcpy(s->coord_key, conf->coord_key, 32);
                s->conf.coord_key = s->coord_key;
        }
        int r = uv_timer_init(loop, &s->timer);
        if (r < 0) {
                session_free(s);
                return r;
        }
        s->timer.data = s;
        s->timer_init = true;
        if (conf->own_context && !conf->via) {
                if (!(s->own_zctx = zmq_ctx_new())) {
                        session_free(s);
                        return -errno ? -errno : -ENOMEM;
                }
                (void) zmq_ctx_set(s->own_zctx, ZMQ_IO_THREADS, 1);
                zctx = s->own_zctx;
        }
        NetSockConf nc = {
                .type = ZMQ_DEALER, .name = "pscoord", .max_msg = 64 << 20, .sndhwm = 1000, .rcvhwm = 1000,
                .linger_ms = 500, .immediate = true, .keys = s->conf.keys, .via = conf->via, .via_to = NETMUX_COORD,
        };
        r = netsock_new(loop, zctx, &nc, session_on_msg, s, &s->sock);
        if (r == 0)
                r = netsock_monitor(s->sock, 0, session_on_handshake);
        if (r < 0) {
                session_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

int session_start(Session *s) {
        int r = netsock_connect(s->sock, s->endpoint, s->conf.keys ? s->coord_key : NULL);
        if (r < 0)
                return r;
        s->started_ms = now_ms();
        if (s->conf.role != PSNET__ROLE__ROLE_NONE && s->conf.role != PSNET__ROLE__ROLE_ADMIN)
                return session_register(s);
        return 0;
}

int session_deregister(Session *s, const char *reason, unsigned timeout_ms, SessionReplyFn cb, void *ud) {
        Psnet__Header h;
        s->state = S_LEAVING; /* no more heartbeats, no registering again */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_DEREGISTER);
        h.reason = reason && reason[0] ? (char *) reason : NULL; /* packed before this returns */
        return session_queue(s, &h, PSNET__MSG_TYPE__MSG_DEREGISTER_REP, timeout_ms, cb, ud, NULL);
}

uint32_t session_id(const Session *s) { return s->id; }
unsigned session_lease_ms(const Session *s) { return s->lease_ms; }
bool session_registered(const Session *s) { return s->state == S_REGISTERED; }
bool session_lease_valid(const Session *s, uint64_t now) { return s->state == S_REGISTERED && now < s->lease_until; }
uint64_t session_lease_until(const Session *s) { return s->lease_until; }
const char *session_endpoint(const Session *s) { return s->endpoint; }

uint64_t session_silent_ms(const Session *s) {
        return s->last_reply ? now_ms() - s->last_reply : 0;
}

static void session_timer_closed(uv_handle_t *h) {
        free(h->data);
}

static void *ctx_term_thread(void *ctx) {
        zmq_ctx_term(ctx);
        return NULL;
}

/* Ends the session's own context once its socket is closed: at once, or,
 * freed inside its own callback (the socket closes when that returns), in a
 * thread of its own. */
static void own_context_end(void *ctx, bool deferred) {
        pthread_t t;
        pthread_attr_t a;
        if (deferred && pthread_attr_init(&a) == 0) {
                int r = pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
                if (r == 0)
                        r = pthread_create(&t, &a, ctx_term_thread, ctx);
                pthread_attr_destroy(&a);
                if (r == 0)
                        return;
                log_warning("cannot end the pscoord session's ZeroMQ context in a thread (%s): it is left to the "
                            "process's exit", strerror(r));
                return;
        }
        zmq_ctx_term(ctx);
}

Session *session_free(Session *s) {
        if (!s)
                return NULL;
        while (s->reqs) {
                Req *q = s->reqs;
                s->reqs = q->next;
                req_free(q);
        }
        bool deferred = netsock_in_callback(s->sock);
        s->sock = netsock_close(s->sock);
        if (s->own_zctx)
                own_context_end(s->own_zctx, deferred);
        free(s->endpoint);
        free(s->advertise);
        if (s->timer_init)
                uv_close((uv_handle_t *) &s->timer, session_timer_closed);
        else
                free(s);
        return NULL;
}
