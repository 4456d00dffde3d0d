/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/net's loop plumbing: zwatch/netsock (edge-triggered
 * draining of ZeroMQ sockets on a libuv loop, sends that must not strand
 * incoming messages, closing a socket from inside its own callback) and the
 * the many DEALERs of one connection (NetMux, an edge client behind psgate),
 * the pscoord session (registration, messages that arrive while registering,
 * heartbeats, registering again, refusals, time-outs), against a scripted fake
 * pscoord on the same loop. Every wait is the loop running until a condition
 * holds, bounded by a deadline timer that fails the check. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include "endpoint.h"
#include "netsock.h"
#include "session.h"
#include "tap.h"
#include "wire.h"

static uv_loop_t loop;
static void *zctx;

static void die(const char *what) {
        fprintf(stderr, "%s\n", what);
        exit(2);
}

static bool guard_fired;
static void guard_cb(uv_timer_t *t) {
        (void) t;
        guard_fired = true;
}

/* Runs the loop (blocking on its events) until *done, or until a guard timer
 * fires after ms; true when done. */
static bool run_until(bool *done, unsigned ms) {
        uv_timer_t guard;
        guard_fired = false;
        if (uv_timer_init(&loop, &guard) < 0 || uv_timer_start(&guard, guard_cb, ms, 0) < 0)
                die("guard timer");
        while (!*done && !guard_fired)
                uv_run(&loop, UV_RUN_ONCE);
        uv_close((uv_handle_t *) &guard, NULL);
        uv_run(&loop, UV_RUN_NOWAIT); /* lets the guard's close complete before it leaves scope */
        return *done;
}

/* --- netsock: a burst both ways ------------------------------------------------------ */

#define BURST 2000
static int got_router, got_dealer;
static bool burst_done, router_closed_self;
static NetSock *router, *dealer;

static void router_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        (void) ud;
        if (r < 0)
                return;
        got_router++;
        /* Answer each one: these sends happen while more requests are queued,
         * which is what must not leave them stranded. */
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH_ACK);
        h.has_seq = true;
        h.seq = m->hdr->seq;
        if (netsock_send(s, &m->route, &h, NULL, 0) < 0)
                die("router send");
}

static void dealer_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        (void) s, (void) ud, (void) m;
        if (r == 0 && ++got_dealer == BURST)
                burst_done = true;
}

static void test_burst(void) {
        NetSockConf rc = { .type = ZMQ_ROUTER, .name = "router" }, dc = { .type = ZMQ_DEALER, .name = "dealer" };
        CHECK(netsock_new(&loop, zctx, &rc, router_msg, NULL, &router) == 0, "router netsock");
        CHECK(netsock_new(&loop, zctx, &dc, dealer_msg, NULL, &dealer) == 0, "dealer netsock");
        CHECK(netsock_bind(router, "inproc://burst") == 0 && netsock_connect(dealer, "inproc://burst", NULL) == 0,
              "bind and connect");
        int sent = 0;
        for (int i = 0; i < BURST; i++) {
                Psnet__Header h;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_HEARTBEAT_REP);
                h.has_seq = true;
                h.seq = (uint64_t) i + 1;
                sent += netsock_send(dealer, NULL, &h, NULL, 0) == 0;
        }
        CHECK(sent == BURST, "%d messages sent in one burst", sent);
        bool all = run_until(&burst_done, 10000);
        CHECK(all, "every request and every reply arrived (%d, %d of %d)", got_router, got_dealer, BURST);
        router = netsock_close(router);
        dealer = netsock_close(dealer);
}

/* --- netsock: closed from inside its own callback ------------------------------------- */

static void closing_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        (void) m, (void) r, (void) ud;
        router_closed_self = true;
        netsock_close(s);
}

static void test_close_in_callback(void) {
        NetSock *r, *d;
        NetSockConf rc = { .type = ZMQ_ROUTER, .name = "r" }, dc = { .type = ZMQ_DEALER, .name = "d" };
        if (netsock_new(&loop, zctx, &rc, closing_msg, NULL, &r) < 0 ||
            netsock_new(&loop, zctx, &dc, dealer_msg, NULL, &d) < 0 || netsock_bind(r, "inproc://closing") < 0 ||
            netsock_connect(d, "inproc://closing", NULL) < 0)
                die("close-in-callback setup");
        for (int i = 0; i < 5; i++) {
                Psnet__Header h;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_HEARTBEAT_REP);
                (void) netsock_send(d, NULL, &h, NULL, 0);
        }
        CHECK(run_until(&router_closed_self, 5000), "a socket closed itself inside its callback (with 4 more queued)");
        d = netsock_close(d);
}

/* --- NetMux: many DEALERs over one connection ------------------------------------------ */

/* The far side plays psgate: an addressed ROUTER that answers each message
 * with its address, its seq + 1000, and once a message for far end 99
 * (whom no NetSock here is). */
static int gate_got, gate_to_coord, gate_to_seven;
static bool gate_bad_address;

static void gate_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        (void) ud;
        uint32_t to;
        if (r < 0 || !m->has_to || !wire_address(&m->to, &to)) {
                gate_bad_address = true;
                return;
        }
        gate_got++;
        gate_to_coord += to == NETMUX_COORD;
        gate_to_seven += to == 7;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH_ACK);
        h.has_seq = true;
        h.seq = m->hdr->seq + 1000;
        if (netsock_send_to(s, &m->route, &m->to, &h, NULL, 0) < 0)
                die("gate answer");
        if (gate_got == 1) {
                zmq_msg_t other;
                wire_address_init(&other, 99);
                if (netsock_send_to(s, &m->route, &other, &h, NULL, 0) < 0)
                        die("gate stray");
                zmq_msg_close(&other);
        }
}

static int mux_coord_got, mux_seven_got, mux_wrong;
static bool mux_done;

static void mux_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        (void) s;
        uint32_t me = (uint32_t) (uintptr_t) ud;
        if (r < 0 || m->hdr->seq < 1000) {
                mux_wrong++;
                return;
        }
        /* Each answer comes to the NetSock of the far end it was sent to:
         * seqs 1..3 went to pscoord, 11..12 to shard 7. */
        uint64_t sent = m->hdr->seq - 1000;
        if ((me == NETMUX_COORD) != (sent < 10))
                mux_wrong++;
        else if (me == NETMUX_COORD)
                mux_coord_got++;
        else
                mux_seven_got++;
        mux_done = mux_coord_got >= 3 && mux_seven_got >= 2;
}

/* A message of type with seq through s (a heartbeat with its body). */
static void mux_send(NetSock *s, Psnet__MsgType type, uint64_t seq) {
        Psnet__Header h;
        wire_header_init(&h, type);
        h.has_seq = true;
        h.seq = seq;
        Psnet__Heartbeat hb = PSNET__HEARTBEAT__INIT;
        if (type == PSNET__MSG_TYPE__MSG_HEARTBEAT) {
                h.body_case = PSNET__HEADER__BODY_HEARTBEAT;
                h.heartbeat = &hb;
        }
        if (netsock_send(s, NULL, &h, NULL, 0) < 0)
                die("mux send");
}

static void test_mux(void) {
        NetSock *gate, *coord, *seven;
        NetMux *mux = NULL;
        NetSockConf gc = { .type = ZMQ_ROUTER, .name = "gate", .addressed = true };
        NetSockConf mc = { .type = ZMQ_DEALER, .name = "mux" };
        if (netsock_new(&loop, zctx, &gc, gate_msg, NULL, &gate) < 0 || netsock_bind(gate, "inproc://mux") < 0 ||
            netmux_new(&loop, zctx, &mc, "inproc://mux", NULL, &mux) < 0)
                die("mux setup");
        NetSockConf cc = { .type = ZMQ_DEALER, .name = "coord", .via = mux, .via_to = NETMUX_COORD };
        NetSockConf sc = { .type = ZMQ_DEALER, .name = "shard-7", .via = mux, .via_to = 7 };
        if (netsock_new(&loop, zctx, &cc, mux_msg, (void *) (uintptr_t) NETMUX_COORD, &coord) < 0 ||
            netsock_new(&loop, zctx, &sc, mux_msg, (void *) (uintptr_t) 7, &seven) < 0 ||
            netsock_connect(coord, "ignored", NULL) < 0 || netsock_connect(seven, "ignored", NULL) < 0)
                die("mux sockets");
        for (uint64_t i = 1; i <= 3; i++)
                mux_send(coord, PSNET__MSG_TYPE__MSG_HEARTBEAT, i);
        for (uint64_t i = 11; i <= 12; i++)
                mux_send(seven, PSNET__MSG_TYPE__MSG_PUSH_ACK, i);
        bool done = run_until(&mux_done, 5000);
        /* The stray for far end 99 left between the first answer and the
         * others, on the same ordered connection: it has been read by now. */
        CHECK(done && mux_coord_got == 3 && mux_seven_got == 2,
              "through one connection, each far end's answers reach its own NetSock (pscoord %d of 3, shard 7 %d "
              "of 2)", mux_coord_got, mux_seven_got);
        CHECK(gate_got == 5 && gate_to_coord == 3 && gate_to_seven == 2 && !gate_bad_address,
              "the far side saw every message with its address frame (%d: %d for pscoord, %d for shard 7)", gate_got,
              gate_to_coord, gate_to_seven);
        CHECK(mux_wrong == 0, "no answer went to the wrong NetSock, and one for a far end nobody is was dropped");
        /* Closed in any order, the mux last or first: its connection goes with the last. */
        mux = netmux_close(mux);
        coord = netsock_close(coord);
        seven = netsock_close(seven);
        gate = netsock_close(gate);
}

/* --- session against a fake pscoord ---------------------------------------------------- */

typedef enum { FAKE_ANSWER, FAKE_REFUSE, FAKE_SILENT, FAKE_CONFIG_FIRST } FakeMode;

static int heartbeats_wanted;
static bool heartbeats_enough;

static struct {
        NetSock *sock;
        FakeMode mode;
        int registers, heartbeats, statuses;
        uint32_t last_want_id, last_status_sender;
        bool unknown_next_heartbeat, unknown_next_status;
} fake;

static void fake_reply(NetSock *s, const zmq_msg_t *route, uint64_t seq, Psnet__MsgType type) {
        Psnet__Header h;
        Psnet__RegisterRep rr = PSNET__REGISTER_REP__INIT;
        wire_header_init(&h, type);
        h.has_seq = true;
        h.seq = seq;
        if (type == PSNET__MSG_TYPE__MSG_REGISTER_REP) {
                rr.assigned_id = 7;
                rr.lease_ms = 300;
                h.body_case = PSNET__HEADER__BODY_REG_REP;
                h.reg_rep = &rr;
        }
        if (netsock_send(s, route, &h, NULL, 0) < 0)
                die("fake send");
}

static void fake_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        (void) ud;
        if (r < 0)
                return;
        Psnet__Header *h = m->hdr;
        if (h->type == PSNET__MSG_TYPE__MSG_REGISTER) {
                fake.registers++;
                fake.last_want_id = h->reg->has_want_id ? h->reg->want_id : 0;
                if (fake.mode == FAKE_SILENT)
                        return;
                if (fake.mode == FAKE_REFUSE) {
                        netsock_send_error(s, &m->route, PSNET__STATUS__STATUS_DENIED, h->seq, "shard id 3 is taken");
                        return;
                }
                if (fake.mode == FAKE_CONFIG_FIRST) {
                        /* A CONFIG overtakes the registration's answer. */
                        Psnet__Header c;
                        Psnet__Config cfg = PSNET__CONFIG__INIT;
                        wire_header_init(&c, PSNET__MSG_TYPE__MSG_CONFIG);
                        c.body_case = PSNET__HEADER__BODY_CONFIG;
                        c.config = &cfg;
                        (void) netsock_send(s, &m->route, &c, NULL, 0);
                }
                fake_reply(s, &m->route, h->seq, PSNET__MSG_TYPE__MSG_REGISTER_REP);
        } else if (h->type == PSNET__MSG_TYPE__MSG_HEARTBEAT) {
                if (++fake.heartbeats >= heartbeats_wanted)
                        heartbeats_enough = true;
                if (fake.unknown_next_heartbeat) {
                        fake.unknown_next_heartbeat = false;
                        netsock_send_error(s, &m->route, PSNET__STATUS__STATUS_UNKNOWN_PEER, h->seq, "who are you");
                } else
                        fake_reply(s, &m->route, h->seq, PSNET__MSG_TYPE__MSG_HEARTBEAT_REP);
        } else if (h->type == PSNET__MSG_TYPE__MSG_STATUS) {
                if (fake.statuses++ == 0)
                        return; /* the first one goes unanswered */
                fake.last_status_sender = h->has_sender ? h->sender : 0;
                if (fake.unknown_next_status) {
                        fake.unknown_next_status = false;
                        netsock_send_error(s, &m->route, PSNET__STATUS__STATUS_UNKNOWN_PEER, h->seq, "who are you");
                        return;
                }
                Psnet__Header rh;
                Psnet__StatusRep sr = PSNET__STATUS_REP__INIT;
                wire_header_init(&rh, PSNET__MSG_TYPE__MSG_STATUS_REP);
                rh.has_seq = true;
                rh.seq = h->seq;
                rh.body_case = PSNET__HEADER__BODY_STATUS_REP;
                rh.status_rep = &sr;
                (void) netsock_send(s, &m->route, &rh, NULL, 0);
        }
}

static struct {
        int registered, registered_again, failed, messages, replies;
        int fail_err, reply_r;
        char fail_reason[128];
        bool flag, replied;
} seen;

static void on_registered(Session *s, bool again, void *ud) {
        (void) s, (void) ud;
        seen.registered++;
        seen.registered_again += again;
        seen.flag = true;
}

static void on_failed(Session *s, int err, const char *reason, void *ud) {
        (void) s, (void) ud;
        seen.failed++;
        seen.fail_err = err;
        snprintf(seen.fail_reason, sizeof seen.fail_reason, "%s", reason);
        seen.flag = true;
}

static void on_message(Session *s, WireMsg *m, void *ud) {
        (void) s, (void) ud;
        if (m->hdr->type == PSNET__MSG_TYPE__MSG_CONFIG)
                seen.messages++;
}

static void on_reply(Session *s, int r, WireMsg *m, void *ud) {
        (void) s, (void) ud, (void) m;
        seen.replies++;
        seen.reply_r = r;
        seen.flag = seen.replied = true;
}

static const SessionOps ops = { .registered = on_registered, .failed = on_failed, .message = on_message };

static Session *start_session(const char *ep, Psnet__Role role, unsigned connect_timeout_ms) {
        Session *s;
        SessionConf c = { .endpoint = ep, .role = role, .connect_timeout_ms = connect_timeout_ms };
        memset(&seen, 0, sizeof seen);
        if (session_new(&loop, zctx, &c, &ops, NULL, &s) < 0 || session_start(s) < 0)
                die("session");
        return s;
}

static bool heartbeats_at_least(int n, unsigned ms) {
        heartbeats_wanted = n;
        heartbeats_enough = fake.heartbeats >= n;
        return run_until(&heartbeats_enough, ms);
}

static void test_session(void) {
        NetSockConf fc = { .type = ZMQ_ROUTER, .name = "fake" };
        if (netsock_new(&loop, zctx, &fc, fake_msg, NULL, &fake.sock) < 0 || netsock_bind(fake.sock, "inproc://coord") < 0)
                die("fake pscoord");

        /* Registration, with a CONFIG that overtakes the answer: it is delivered, not dropped. */
        fake.mode = FAKE_CONFIG_FIRST;
        Session *s = start_session("inproc://coord", PSNET__ROLE__ROLE_WORKER, 2000);
        CHECK(run_until(&seen.flag, 3000) && seen.registered == 1 && seen.registered_again == 0 &&
              session_id(s) == 7 && session_lease_ms(s) == 300 && session_registered(s), "registered: id 7, lease 300");
        CHECK(seen.messages == 1, "the CONFIG that arrived while registering was delivered (%d)", seen.messages);

        /* Heartbeats keep coming, about every lease/3. */
        uint64_t t0 = now_ms();
        int hb0 = fake.heartbeats;
        bool flowing = heartbeats_at_least(hb0 + 3, 2000);
        CHECK(flowing, "heartbeats flow (%d)", fake.heartbeats - hb0);
        CHECK(now_ms() - t0 >= 2 * 100 - 20, "not faster than lease/3 (%lu ms for 3)", (unsigned long) (now_ms() - t0));

        /* A loop turn longer than the heartbeat interval (a daemon applying
         * many large pushes in one go): session_poll, called between its
         * messages, sends the heartbeat that is due without waiting for the
         * timer, and none that is not. */
        uint64_t busy = now_ms();
        while (now_ms() - busy < 150)
                ; /* the loop held up, as by a long turn: not a wait for anything */
        CHECK(session_poll(s), "a heartbeat due during a long turn leaves from session_poll");
        CHECK(!session_poll(s), "the next is not due yet: session_poll sends nothing");
        hb0 = fake.heartbeats;
        CHECK(heartbeats_at_least(hb0 + 1, 2000), "pscoord gets it (%d)", fake.heartbeats - hb0);

        /* pscoord forgets us: the next heartbeat is answered UNKNOWN_PEER and the session registers again. */
        fake.mode = FAKE_ANSWER;
        fake.unknown_next_heartbeat = true;
        seen.flag = false;
        CHECK(run_until(&seen.flag, 3000) && seen.registered_again == 1, "registered again after UNKNOWN_PEER");
        CHECK(fake.last_want_id == 7, "a worker asks for its old id back (%u)", fake.last_want_id);

        /* Requests: one that gets no answer times out; the next one is answered. */
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
        seen.flag = false;
        CHECK(session_request(s, &h, PSNET__MSG_TYPE__MSG_STATUS_REP, 200, on_reply, NULL) == 0, "request sent");
        bool answered = run_until(&seen.flag, 2000);
        CHECK(answered && seen.reply_r == -ETIMEDOUT, "an unanswered request times out (%d)", seen.reply_r);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
        seen.flag = false;
        CHECK(session_request(s, &h, PSNET__MSG_TYPE__MSG_STATUS_REP, 2000, on_reply, NULL) == 0 &&
              run_until(&seen.flag, 3000) && seen.reply_r == 0 && seen.replies == 2, "an answered request gets its reply");

        /* pscoord forgets us while a request is on its way (it restarted): the
         * request is answered UNKNOWN_PEER, held, the session registers again
         * and sends it again, and its caller gets the real answer. */
        fake.unknown_next_status = true;
        int again0 = seen.registered_again, statuses0 = fake.statuses;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
        seen.replied = false;
        CHECK(session_request(s, &h, PSNET__MSG_TYPE__MSG_STATUS_REP, 3000, on_reply, NULL) == 0 &&
              run_until(&seen.replied, 4000) && seen.reply_r == 0 && seen.replies == 3,
              "a request answered UNKNOWN_PEER gets its reply after the registration again (r %d, %d replies)",
              seen.reply_r, seen.replies);
        CHECK(seen.registered_again == again0 + 1 && fake.statuses == statuses0 + 2 && fake.last_status_sender == 7,
              "it registered again once and the request left twice, the second time as id %u (%d registrations "
              "again, %d sends)", fake.last_status_sender, seen.registered_again - again0, fake.statuses - statuses0);
        s = session_free(s);

        /* Refused at the first registration: failed() with pscoord's reason. */
        fake.mode = FAKE_REFUSE;
        s = start_session("inproc://coord", PSNET__ROLE__ROLE_SERVER, 2000);
        CHECK(run_until(&seen.flag, 3000) && seen.failed == 1 && seen.fail_err == -ECONNREFUSED &&
              strcmp(seen.fail_reason, "shard id 3 is taken") == 0, "a refused registration fails with the reason (%s)",
              seen.fail_reason);
        s = session_free(s);

        /* Nobody answers: failed(-ETIMEDOUT) after connect_timeout_ms, registrations resent meanwhile. */
        fake.mode = FAKE_SILENT;
        fake.registers = 0;
        t0 = now_ms();
        s = start_session("inproc://coord", PSNET__ROLE__ROLE_SERVER, 2500);
        CHECK(run_until(&seen.flag, 6000) && seen.failed == 1 && seen.fail_err == -ETIMEDOUT,
              "an unanswered registration fails with -ETIMEDOUT");
        uint64_t took = now_ms() - t0;
        CHECK(took >= 2400 && took < 3400, "after the connect time-out (%lu ms for 2500)", (unsigned long) took);
        CHECK(fake.registers >= 2, "the registration was sent again meanwhile (%d times)", fake.registers);
        s = session_free(s);

        /* A request to an endpoint nobody listens on times out (it is resent while not connected). */
        s = start_session("ipc:///tmp/psnet-test-net-nobody.sock", PSNET__ROLE__ROLE_NONE, 0);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
        CHECK(session_request(s, &h, PSNET__MSG_TYPE__MSG_STATUS_REP, 300, on_reply, NULL) == 0 &&
              run_until(&seen.flag, 2000) && seen.reply_r == -ETIMEDOUT, "a request to nobody times out");
        s = session_free(s);
        fake.sock = netsock_close(fake.sock);
}

int main(void) {
        if (uv_loop_init(&loop) < 0 || !(zctx = zmq_ctx_new()))
                die("loop");
        test_burst();
        test_close_in_callback();
        test_mux();
        test_session();
        uv_run(&loop, UV_RUN_NOWAIT); /* the closes complete (ASan checks the frees) */
        CHECK(uv_loop_close(&loop) == 0, "every handle was closed");
        zmq_ctx_term(zctx);
        return tap_done();
}
