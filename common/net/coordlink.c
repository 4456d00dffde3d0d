/* Control-plane link to pscoord; see coordlink.h. */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "alloc.h"
#include "coordlink.h"
#include "endpoint.h"

int coordlink_open(void *zctx, const char *endpoint, CoordLink **ret) {
        CoordLink *l = ps_calloc(1, sizeof *l);
        if (!l)
                return -ENOMEM;
        l->endpoint = ps_strdup(endpoint);
        l->sock = zmq_socket(zctx, ZMQ_DEALER);
        if (!l->endpoint || !l->sock) {
                int r = l->sock ? -ENOMEM : -errno;
                coordlink_free(l);
                return r;
        }
        int zero = 0;
        (void) zmq_setsockopt(l->sock, ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_connect(l->sock, endpoint) < 0) {
                int r = -errno;
                coordlink_free(l);
                return r;
        }
        *ret = l;
        return 0;
}

CoordLink *coordlink_free(CoordLink *l) {
        if (!l)
                return NULL;
        if (l->sock) {
                /* Let a last DEREGISTER reach a live pscoord, without hanging on a dead one. */
                int linger = 500;
                (void) zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
                zmq_close(l->sock);
        }
        ps_free(l->endpoint);
        ps_free(l);
        return NULL;
}

int coordlink_send(CoordLink *l, Psnet__Header *h) {
        h->has_sender = true;
        h->sender = l->id;
        h->has_seq = true;
        h->seq = ++l->seq;
        return wire_send(l->sock, NULL, h, NULL, 0);
}

int coordlink_send_type(CoordLink *l, Psnet__MsgType type) {
        Psnet__Header h;
        wire_header_init(&h, type);
        return coordlink_send(l, &h);
}

int coordlink_request(CoordLink *l, Psnet__Header *h, Psnet__MsgType want,
                      unsigned timeout_ms, void (*on_other)(void *ud, WireMsg *m), void *ud,
                      WireMsg *ret) {
        int r = coordlink_send(l, h);
        if (r < 0)
                return r;
        uint64_t deadline = now_ms() + timeout_ms;
        for (;;) {
                uint64_t now = now_ms();
                if (now >= deadline)
                        return -ETIMEDOUT;
                zmq_pollitem_t it = { .socket = l->sock, .events = ZMQ_POLLIN };
                r = zmq_poll(&it, 1, (long) (deadline - now));
                if (r < 0) {
                        if (errno == EINTR)
                                return -EINTR;
                        return -errno;
                }
                if (r == 0)
                        continue;
                WireMsg m;
                r = wire_recv(l->sock, false, ZMQ_DONTWAIT, &m);
                if (r == -EAGAIN) {
                        wire_msg_done(&m);
                        continue;
                }
                if (r < 0 && r != -EBADMSG) {
                        wire_msg_done(&m);
                        return r;
                }
                if (r == 0 && (m.hdr->type == want || m.hdr->type == PSNET__MSG_TYPE__MSG_ERROR)) {
                        *ret = m;
                        return m.hdr->type == want ? 0 : -ECONNREFUSED;
                }
                if (r == 0 && on_other)
                        on_other(ud, &m);
                wire_msg_done(&m);
        }
}

int coordlink_register(CoordLink *l, Psnet__Role role, const char *endpoint, uint32_t want_id,
                       unsigned timeout_ms, WireMsg *ret) {
        Psnet__Header h;
        Psnet__Register reg = PSNET__REGISTER__INIT;
        char host[64] = "";
        reg.role = role;
        reg.endpoint = (char *) endpoint;
        reg.has_want_id = want_id != 0;
        reg.want_id = want_id;
        reg.has_pid = true;
        reg.pid = (uint32_t) getpid();
        if (gethostname(host, sizeof host - 1) == 0)
                reg.name = host;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_REGISTER);
        h.body_case = PSNET__HEADER__BODY_REG;
        h.reg = &reg;
        int r = coordlink_request(l, &h, PSNET__MSG_TYPE__MSG_REGISTER_REP, timeout_ms, NULL, NULL, ret);
        if (r < 0)
                return r;
        l->id = ret->hdr->reg_rep->assigned_id;
        l->lease_ms = ret->hdr->reg_rep->lease_ms ? ret->hdr->reg_rep->lease_ms : 5000;
        return 0;
}

