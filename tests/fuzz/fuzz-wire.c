/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the wire codec as a daemon meets it. The input is cut
 * into the parts of one multipart message (a header and its frames: each part
 * is a 2-byte little-endian length and that many bytes; the rest of the input
 * is the last part), sent over an inproc pair and read back with wire_recv,
 * which decodes the protobuf header and checks it against the frames
 * (wire_validate). Whatever comes in, wire_recv answers 0 or a clear error and
 * never reads out of bounds; a message it accepts has frames that match its
 * keys. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "compress.h"
#include "wire.h"

static void *ctx, *tx, *rx;

static int setup(void) {
        ctx = zmq_ctx_new();
        tx = ctx ? zmq_socket(ctx, ZMQ_PAIR) : NULL;
        rx = ctx ? zmq_socket(ctx, ZMQ_PAIR) : NULL;
        if (!tx || !rx || zmq_bind(rx, "inproc://fuzz-wire") < 0 || zmq_connect(tx, "inproc://fuzz-wire") < 0)
                abort();
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static int once = -1;
        if (once < 0)
                once = setup();
        size_t at = 0;
        int parts = 0;
        while (parts < 64) {
                size_t len = size - at;
                bool last = true;
                if (size - at >= 2) {
                        size_t want = (size_t) data[at] | (size_t) data[at + 1] << 8;
                        if (want + 2 <= size - at) {
                                at += 2;
                                len = want;
                                last = at + len >= size;
                        }
                }
                if (zmq_send(tx, data + at, len, last ? ZMQ_DONTWAIT : ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
                        abort();
                at += len;
                parts++;
                if (last)
                        break;
        }
        if (parts == 64 && at < size && zmq_send(tx, data + at, size - at, ZMQ_DONTWAIT) < 0)
                abort();
        WireMsg m;
        int r = wire_recv(rx, false, 0, &m);
        if (r == 0) {
                if (!m.hdr || m.status != 0)
                        abort();
                /* A raw frame holds len values of the dtype (f32: 4 bytes, bf16:
                 * 2); a coded federated push's, its codec's size for len values. */
                if (m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_SCAN && (!m.hdr->has_table || m.nframes != 0))
                        abort(); /* a scan names a table and carries nothing */
                if (m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL || m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PUSH ||
                    m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL_REP || m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY ||
                    m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE || m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_WANT) {
                        /* Ids of 8 bytes, then (but for a pull) as many rows of floats. */
                        size_t ids = m.nframes ? zmq_msg_size(&m.frames[0]) : 0, n = ids / 8;
                        bool pull = m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL ||
                                    m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_WANT;
                        /* A move's ids without rows: ids asked for that its sender does not hold. */
                        bool move = m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE;
                        bool absent = move && m.nframes >= 2 && zmq_msg_size(&m.frames[1]) == 0;
                        bool push = !pull; /* a push or an answer may be empty */
                        size_t rows = pull || m.nframes < 2 ? 0 : zmq_msg_size(&m.frames[1]);
                        /* A bounded table's copy: its rows' stamps and the ids dropped; its move: the stamps. */
                        size_t more = m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY && m.nframes == 4 ? 2
                                    : move && m.nframes == 3                                         ? 1
                                                                                                     : 0;
                        if (!m.hdr->has_table || m.nframes != (pull ? 1u : 2u) + more || ids % 8 || (n == 0 && !push) ||
                            (!pull && !absent && (n == 0 ? rows != 0 : rows == 0 || rows % (n * 4))))
                                abort(); /* accepted, yet its rows do not add up */
                        if (more && zmq_msg_size(&m.frames[2]) != (absent ? 0 : n * 8))
                                abort(); /* a stamp for each row */
                        if (more == 2 && zmq_msg_size(&m.frames[3]) % 8)
                                abort(); /* ids dropped of 8 bytes */
                }
                if (m.hdr->has_last && m.hdr->type != PSNET__MSG_TYPE__MSG_ROWS_MOVE)
                        abort(); /* only a move says it is the last */
                bool move_rec = m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE && m.hdr->has_origin;
                if ((m.hdr->has_origin && m.hdr->type != PSNET__MSG_TYPE__MSG_ROWS_COPY && !move_rec) ||
                    m.hdr->has_done != move_rec)
                        abort(); /* a worker named by a copy or a move only; a move naming one says its done */
                if (move_rec && (m.nframes != 2 || zmq_msg_size(&m.frames[1]) != 0 || m.hdr->done < -1 ||
                                 m.hdr->has_last))
                        abort(); /* a move naming a worker: its ids, an empty frame */
                bool rows_parts = m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PUSH ||
                                  m.hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY;
                if ((m.hdr->has_part || m.hdr->has_parts) &&
                    ((m.hdr->type != PSNET__MSG_TYPE__MSG_PUSH && !rows_parts) || m.hdr->parts < 2 ||
                     m.hdr->part >= m.hdr->parts || (rows_parts && m.hdr->parts > WIRE_MAX_ROWS_PARTS)))
                        abort(); /* accepted, yet its parts do not add up */
                bool coded = m.hdr->codec >= PSNET__CODEC__CODEC_BF16; /* MASKED frames are raw f32 */
                size_t width = m.hdr->dtype == PSNET__DTYPE__DTYPE_BF16 ? 2 : 4;
                for (size_t i = 0; i < m.nframes && i < m.hdr->n_keys; i++) {
                        size_t have = zmq_msg_size(&m.frames[i]);
                        uint32_t len = m.hdr->keys[i]->len;
                        if (coded ? !compress_size_ok((CompressKind) (m.hdr->codec - PSNET__CODEC__CODEC_BF16 +
                                                                      COMPRESS_BF16), have, len)
                                  : have != (size_t) len * width)
                                abort(); /* accepted, yet a frame does not match its key */
                }
        } else if (r != -EBADMSG)
                abort();
        else if (m.status == 0 || !m.reason[0])
                abort(); /* refused without a status or a reason */
        wire_msg_done(&m);
        return 0;
}
