/* SPDX-License-Identifier: Apache-2.0 */
/* The one message table (common/net/wire.c) and the daemons' handler tables
 * (pscoord's coord_dispatch, a shard's psd_dispatch) through the one
 * dispatch (common/net/dispatch.c): every type a role may send to a daemon
 * has a row there, and no row serves a type no role may send; with --keys,
 * every (type, role) the message table does not allow is answered DENIED by
 * the dispatch before any handler runs (the real tables' handlers would
 * crash on the NULL daemon they are given here); a role that may is handed
 * to the row; no row is UNKNOWN_TYPE; a row that needs a registered peer is
 * UNKNOWN_PEER without one, and gets it with one. */
#include <string.h>
#include "coord-internal.h"
#include "dispatch.h"
#include "psd-server.h"
#include "tap.h"

static const Psnet__Role roles[] = { PSNET__ROLE__ROLE_ADMIN, PSNET__ROLE__ROLE_SERVER, PSNET__ROLE__ROLE_WORKER,
                                     PSNET__ROLE__ROLE_EDGE };

static WireMsg msg(Psnet__Header *h, int type, Psnet__Role role) {
        psnet__header__init(h);
        h->type = (Psnet__MsgType) type;
        WireMsg m;
        memset(&m, 0, sizeof m);
        m.hdr = h;
        m.peer.role = role;
        return m;
}

static void check_table(const DispatchTable *t, const char *who) {
        size_t n;
        const WireType *types = wire_types(&n);
        NetIdentity id = { .enabled = true };
        bool rows_ok = true, served_ok = true, denied_ok = true;
        char missing[256] = "";
        for (size_t i = 0; i < n; i++) {
                unsigned mask = t->at_coord ? types[i].at_coord : types[i].at_shard;
                const DispatchRow *row = dispatch_row(t, types[i].type);
                if (mask && (!row || !row->fn)) {
                        rows_ok = false;
                        snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", types[i].name);
                }
                if (row && row->fn && !mask)
                        served_ok = false;
                for (size_t k = 0; k < ELEMENTSOF(roles); k++) {
                        if (mask & WIRE_ROLE(roles[k]))
                                continue;
                        Psnet__Header h;
                        WireMsg m = msg(&h, types[i].type, roles[k]);
                        char reason[160] = "";
                        int st = dispatch_message(t, &id, NULL, &m, reason, sizeof reason);
                        denied_ok &= st == PSNET__STATUS__STATUS_DENIED && strstr(reason, "may not send");
                }
        }
        CHECK(rows_ok, "%s: every type a role may send it has a row%s", who, missing);
        CHECK(served_ok, "%s: no row serves a type no role may send it", who);
        CHECK(denied_ok, "%s: every other role is DENIED by the table, before any handler", who);
}

static int called;
static void *seen_peer;
static void handler(void *d, WireMsg *m, void *peer) {
        (void) d, (void) m;
        called++;
        seen_peer = peer;
}
static void *peer_found;
static void *find(void *d, const WireMsg *m) {
        (void) d, (void) m;
        return peer_found;
}

int main(void) {
        check_table(&coord_dispatch, "pscoord");
        check_table(&psd_dispatch, "psd");
        Psnet__Header h;
        WireMsg m = msg(&h, PSNET__MSG_TYPE__MSG_JOB_STOP, PSNET__ROLE__ROLE_WORKER);
        char reason[160];
        NetIdentity keys = { .enabled = true }, none = { 0 };
        CHECK(dispatch_message(&coord_dispatch, &keys, NULL, &m, reason, sizeof reason) ==
                              PSNET__STATUS__STATUS_DENIED &&
                      strcmp(reason, "role worker may not send JOB_STOP (admin only)") == 0,
              "a worker's JOB_STOP: \"%s\"", reason);

        /* A table of two rows: one for anyone, one for registered peers. */
        DispatchRow rows[PSNET__MSG_TYPE__MSG_HISTORY + 1] = { 0 };
        rows[PSNET__MSG_TYPE__MSG_STATUS] = (DispatchRow) { handler };
        rows[PSNET__MSG_TYPE__MSG_HEARTBEAT] = (DispatchRow) { handler, .needs_peer = true };
        rows[PSNET__MSG_TYPE__MSG_ERROR] = (DispatchRow) { .ignore = true };
        DispatchTable t = { .daemon = "test", .at_coord = true, .rows = rows, .nrows = ELEMENTSOF(rows),
                            .find_peer = find, .no_peer_reason = "register first" };
        m = msg(&h, PSNET__MSG_TYPE__MSG_STATUS, PSNET__ROLE__ROLE_ADMIN);
        int st = dispatch_message(&t, &keys, NULL, &m, reason, sizeof reason);
        CHECK(st == 0 && called == 1 && !seen_peer, "a role that may send it reaches its row");
        m = msg(&h, PSNET__MSG_TYPE__MSG_STATUS, PSNET__ROLE__ROLE_NONE);
        st = dispatch_message(&t, &none, NULL, &m, reason, sizeof reason);
        CHECK(st == 0 && called == 2, "without keys every role may");
        m = msg(&h, PSNET__MSG_TYPE__MSG_JOB_STOP, PSNET__ROLE__ROLE_ADMIN);
        st = dispatch_message(&t, &keys, NULL, &m, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_UNKNOWN_TYPE && called == 2 && strstr(reason, "JOB_STOP"),
              "no row: UNKNOWN_TYPE (\"%s\")", reason);
        m = msg(&h, PSNET__MSG_TYPE__MSG_HEARTBEAT, PSNET__ROLE__ROLE_WORKER);
        st = dispatch_message(&t, &keys, NULL, &m, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_UNKNOWN_PEER && called == 2 && strcmp(reason, "register first") == 0,
              "a row for registered peers, from a stranger: UNKNOWN_PEER");
        static int a_peer;
        peer_found = &a_peer;
        st = dispatch_message(&t, &keys, NULL, &m, reason, sizeof reason);
        CHECK(st == 0 && called == 3 && seen_peer == &a_peer, "from a registered peer: the row gets the peer");
        m = msg(&h, PSNET__MSG_TYPE__MSG_ERROR, PSNET__ROLE__ROLE_NONE);
        st = dispatch_message(&t, &none, NULL, &m, reason, sizeof reason);
        CHECK(st == 0 && called == 3, "an ignored row takes the message and answers nothing");
        m = msg(&h, 99, PSNET__ROLE__ROLE_NONE);
        st = dispatch_message(&t, &none, NULL, &m, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_UNKNOWN_TYPE, "a type past the table: UNKNOWN_TYPE");
        return tap_done();
}
