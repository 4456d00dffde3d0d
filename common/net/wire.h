/* SPDX-License-Identifier: Apache-2.0 */
/* The wire codec: a psnet message is a ZeroMQ multipart message whose first frame
 * is a protobuf Header and whose other frames are raw f32 tensor bytes, one per
 * header key. Receiving validates everything structural before the caller sees
 * it; sending tensor frames is zero-copy (zmq_msg_init_data) where the caller
 * hands over buffers. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include "psnet.pb-c.h"
#include "psnet-config.h"

#define WIRE_VERSION PSNET_PROTO_MAJOR
#define WIRE_MAX_KEYS 65536
#define WIRE_MAX_HEADER (1u << 20)
#define WIRE_SHM_TOKEN 16       /* bytes of a shared-memory session's token (Header.shm_session) */
#define WIRE_MAX_PARTS 1024     /* parts of a PUSH sent in several messages (Header.parts) */
#define WIRE_MAX_ROWS (1u << 20) /* row ids in one ROWS_PULL or ROWS_PUSH */
/* A worker's rows to one shard travel in frames of at most this many bytes
 * of rows (a push of more in parts, Header.part and parts, at most
 * WIRE_MAX_ROWS_PARTS of them): within any shard's --max-msg that can hold a
 * job with tables (pscoord checks). */
#define WIRE_ROWS_PART_BYTES (4u << 20)
#define WIRE_MAX_ROWS_PARTS 64u
#define WIRE_MAX_ROW_DIM 4096u  /* floats a row (TABLE_MAX_DIM) */

/* Who sent a message, as the ZAP handler admitted its connection (keys.h,
 * zap.h); role NONE and empty strings without --keys. */
typedef struct WirePeer {
        Psnet__Role role;
        char fingerprint[17];
        char name[64];
        uint8_t key[32];         /* its public key (valid when role != NONE) */
} WirePeer;

/* The ZAP handler's User-Id, "ROLE FINGERPRINT NAME KEY" (zap.c), into peer
 * (zeroed: role NONE, when uid is NULL or not such a line). */
void wire_peer_from_user_id(const char *uid, WirePeer *peer);

typedef struct WireMsg {
        zmq_msg_t route;         /* ROUTER peer identity (valid when has_route) */
        bool has_route;
        zmq_msg_t to;            /* wire_recv_to: the address frame (valid when has_to) */
        bool has_to;
        Psnet__Header *hdr;      /* NULL when the header did not decode */
        zmq_msg_t *frames;       /* payload frames 1..n */
        size_t nframes;
        WirePeer peer;           /* the sender's key, when the socket uses CURVE */
        int status;              /* PSNET__STATUS__* describing why decoding failed */
        char reason[192];        /* human reason when decoding failed */
} WireMsg;

/* Receives one whole multipart message. With router=true the first frame is the
 * peer identity. Returns:
 *   0        decoded and validated: hdr != NULL, frames match hdr->keys;
 *   -EBADMSG the message reached us but is bad: status and reason say why, and the
 *            route (if any) is valid so the caller can answer with wire_send_error;
 *   other negative errno from ZeroMQ (-EAGAIN with ZMQ_DONTWAIT, -EINTR, -ETERM).
 * In every case call wire_msg_done afterwards. */
int wire_recv(void *sock, bool router, int flags, WireMsg *msg);
/* A refusal's key in a log's bound (log_limit_by): its peer, the routing id
 * route, and its status. */
uint64_t wire_refusal_key(const zmq_msg_t *route, int status);
/* The same for a message whose header follows an address frame of 4 bytes
 * (after the route, with router): the far end of a message through psgate
 * (netsock.h, NetMux), into msg->to. */
int wire_recv_to(void *sock, bool router, int flags, WireMsg *msg);
/* The address frame: a far end (NETMUX_COORD or a shard id), 4 bytes
 * little-endian. wire_address_init makes one (it cannot fail: 4 bytes are
 * kept inside the zmq_msg_t); wire_address reads one, false when m is not. */
void wire_address_init(zmq_msg_t *m, uint32_t to);
bool wire_address(const zmq_msg_t *m, uint32_t *ret);
void wire_msg_done(WireMsg *msg);

/* Structural checks on a decoded header and its frames, as wire_recv does:
 * version, known type, the body its type takes (and no other), dtype/codec,
 * key count, frames present exactly for PUSH, PULL_REP and CHUNK_STATE (none
 * for a PUSH or PULL_REP in shared memory), each frame size == key len * 4
 * (2 for bf16), len > 0.
 * Returns a PSNET__STATUS__* (OK = 0) and fills reason. */
int wire_validate(const Psnet__Header *hdr, const zmq_msg_t *frames, size_t nframes,
                  char *reason, size_t reasonlen);

/* "PUSH", "REGISTER", ... ("?" for an unknown type). */
const char *wire_type_name(int type);

/* Role bits (a Psnet__Role's) for WireType's masks. */
#define WIRE_ROLE(r) (1u << (r))
/* A message type as the one table in wire.c has it: its name, whether tensor
 * frames follow the header, the body it carries, and the roles that may send
 * it to pscoord (at_coord) and to a shard (at_shard), 0 where that daemon
 * serves it to no one. */
typedef struct WireType {
        int type;
        const char *name;
        bool frames;
        int body;
        unsigned at_coord, at_shard;
} WireType;
/* The row of type, or NULL for a type the protocol does not have. */
const WireType *wire_type(int type);
/* Every row (for the daemons' tables' tests). */
const WireType *wire_types(size_t *ret_n);
/* The roles some row lets send to a shard (shard) or to pscoord: what the
 * daemon's ZAP admits, each message then checked against its own row. */
unsigned wire_roles_at(bool shard);

/* Initialises a header with version and type set. */
void wire_header_init(Psnet__Header *hdr, Psnet__MsgType type);

/* Sends hdr (packed here) followed by nframes payload messages, which are moved
 * (ownership passes to ZeroMQ; build them with zmq_msg_init_data for zero-copy).
 * route may be NULL (DEALER side); it is copied, not consumed. Never blocks:
 * -EAGAIN when the peer's queue is full (the message is not sent). Returns 0
 * or -errno. */
int wire_send(void *sock, const zmq_msg_t *route, const Psnet__Header *hdr, zmq_msg_t *frames,
              size_t nframes);

/* The same with an address frame (to, copied) between the route and the header. */
int wire_send_to(void *sock, const zmq_msg_t *route, const zmq_msg_t *to, const Psnet__Header *hdr,
                 zmq_msg_t *frames, size_t nframes);

/* Sends MSG_ERROR with status and reason, echoing seq. */
int wire_send_error(void *sock, const zmq_msg_t *route, int status, uint64_t seq,
                    const char *reason);
int wire_send_error_to(void *sock, const zmq_msg_t *route, const zmq_msg_t *to, int status, uint64_t seq,
                       const char *reason);

/* Pointer to a frame's data as f32, or NULL if it is not 4-byte aligned
 * (callers then copy with memcpy). */
const float *wire_frame_f32(const zmq_msg_t *frame);
