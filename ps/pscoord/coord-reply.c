/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's answers and messages to one peer: a header to a route with the
 * job and the request's sequence number, MSG_JOB_REP, MSG_ERROR (counted and
 * logged). The lowest of pscoord's files: every other one replies through it. */
#include "coord-internal.h"

/* Sends h (type and body set by the caller) to route, echoing seq. */
int coord_reply_hdr(Coord *c, const zmq_msg_t *route, Psnet__Header *h, uint64_t seq) {
        if (zmq_msg_size((zmq_msg_t *) route) == 0)
                return -ENOTCONN; /* a peer known from the state file that has not registered again yet */
        h->has_seq = true;
        h->seq = seq;
        h->has_job = true;
        h->job = c->job.id;
        return netsock_send(c->ctl, route, h, NULL, 0);
}

/* A reply of this type without a body. */
int coord_reply(Coord *c, const zmq_msg_t *route, Psnet__MsgType type, uint64_t seq) {
        Psnet__Header h;
        wire_header_init(&h, type);
        return coord_reply_hdr(c, route, &h, seq);
}

/* MSG_JOB_REP with the job's state and, optionally, a message. */
int coord_reply_job(Coord *c, const zmq_msg_t *route, uint64_t seq, const char *message) {
        Psnet__Header h;
        Psnet__JobRep jr = PSNET__JOB_REP__INIT;
        jr.job_state = job_state_to_proto(c->state);
        jr.message = (char *) message;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_JOB_REP);
        h.body_case = PSNET__HEADER__BODY_JOB_REP;
        h.job_rep = &jr;
        return coord_reply_hdr(c, route, &h, seq);
}

int coord_reply_error(Coord *c, const zmq_msg_t *route, uint64_t seq, int status, const char *reason) {
        c->errors++;
        if (log_limit_by(&c->refusals, wire_refusal_key(route, status), "refused requests"))
                log_warning("refused request reason=\"%s\" status=%s", reason, status_name(status));
        return netsock_send_error(c->ctl, route, status, seq, reason);
}

