/* The control-plane link every peer (psd, workerd, psctl) keeps to pscoord: a
 * DEALER socket, registration with a bounded wait, and control messages. */
#pragma once
#include <stdint.h>
#include "wire.h"
#include "shardmap.h"

typedef struct CoordLink {
        void *sock;
        char *endpoint;
        uint32_t id;          /* assigned at registration (0 before) */
        uint32_t lease_ms;
        uint64_t seq;
} CoordLink;

/* Connects (asynchronously, as ZeroMQ does). Returns -EINVAL for a bad endpoint. */
int coordlink_open(void *zctx, const char *endpoint, CoordLink **ret);
CoordLink *coordlink_free(CoordLink *l);

/* Sends a control message: h (type and body set by the caller, e.g. with
 * wire_header_init) gets sender = l->id and the next seq. */
int coordlink_send(CoordLink *l, Psnet__Header *h);
/* A message of this type without a body. */
int coordlink_send_type(CoordLink *l, Psnet__MsgType type);

/* Sends h and waits up to timeout_ms for the reply of type want (or
 * MSG_ERROR); other messages arriving meanwhile are passed to on_other (may be
 * NULL: then they are dropped). Returns 0 with *ret filled, -ETIMEDOUT,
 * -ECONNREFUSED when the reply is MSG_ERROR (ret filled: status/reason), or
 * another negative errno. */
int coordlink_request(CoordLink *l, Psnet__Header *h, Psnet__MsgType want,
                      unsigned timeout_ms, void (*on_other)(void *ud, WireMsg *m), void *ud,
                      WireMsg *ret);

/* Registers with the given role; on success l->id and l->lease_ms are set and
 * *ret holds the reply. */
int coordlink_register(CoordLink *l, Psnet__Role role, const char *endpoint, uint32_t want_id,
                       unsigned timeout_ms, WireMsg *ret);

#include "endpoint.h"


