/* SPDX-License-Identifier: Apache-2.0 */
/* The wire codec (see wire.h and proto/psnet.proto): receives a whole ZeroMQ
 * multipart message, decodes frame 0 as a protobuf Header and checks the
 * payload frames against it; sends a header plus zero-copy payload frames.
 *
 * Receiving always drains every part of a message, good or bad, so a bad
 * message can never leave the socket in the middle of the next one.
 *
 * REQ peers are not supported: the empty delimiter frame a REQ socket puts
 * after the identity arrives where the header is expected and is refused as
 * an empty (malformed) header. psnet's peers are DEALERs. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compress.h"
#include "keys.h"
#include "log.h"
#include "wire.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "psnet sends f32 tensors raw; big-endian hosts would need byte swapping"
#endif

static int fail(char *reason, size_t len, int status, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
static int fail(char *reason, size_t len, int status, const char *fmt, ...) {
        va_list ap;
        if (reason && len > 0) {
                va_start(ap, fmt);
                vsnprintf(reason, len, fmt, ap);
                va_end(ap);
        }
        return status;
}

/* Every message type, the one table a new type is added to (and a row in
 * the handler table of the daemon that serves it): its name, whether payload
 * frames follow the header, the body it must carry (NOT_SET: none), and the
 * roles (with --keys) that may send it to pscoord and to a shard (0: that
 * daemon serves it to no one). REGISTER's role must be the key's: pscoord
 * checks. A shard serves an edge's PULL and PUSH only in a federated job,
 * and an operator's PULL (psctl export) only reads; a strategy's PULL and
 * PUSH only in a --strategy custom job (update_of, strategy_delta). */
#define B(x) PSNET__HEADER__BODY_##x
#define A WIRE_ROLE(PSNET__ROLE__ROLE_ADMIN)
#define S WIRE_ROLE(PSNET__ROLE__ROLE_SERVER)
#define W WIRE_ROLE(PSNET__ROLE__ROLE_WORKER)
#define E WIRE_ROLE(PSNET__ROLE__ROLE_EDGE)
#define T WIRE_ROLE(PSNET__ROLE__ROLE_STRATEGY)
static const WireType types[] = {
        { PSNET__MSG_TYPE__MSG_ERROR, "ERROR", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_PULL, "PULL", false, B(_NOT_SET), 0, A | W | E | T },
        { PSNET__MSG_TYPE__MSG_PULL_REP, "PULL_REP", true, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_PUSH, "PUSH", true, B(_NOT_SET), 0, W | E | T },
        { PSNET__MSG_TYPE__MSG_PUSH_ACK, "PUSH_ACK", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_REGISTER, "REGISTER", false, B(REG), S | W | E | T, 0 },
        { PSNET__MSG_TYPE__MSG_REGISTER_REP, "REGISTER_REP", false, B(REG_REP), 0, 0 },
        { PSNET__MSG_TYPE__MSG_HEARTBEAT, "HEARTBEAT", false, B(HEARTBEAT), S | W | E | T, 0 },
        { PSNET__MSG_TYPE__MSG_HEARTBEAT_REP, "HEARTBEAT_REP", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_DEREGISTER, "DEREGISTER", false, B(_NOT_SET), S | W | E | T, 0 },
        { PSNET__MSG_TYPE__MSG_CONFIG, "CONFIG", false, B(CONFIG), 0, 0 },
        { PSNET__MSG_TYPE__MSG_STATUS, "STATUS", false, B(_NOT_SET), A, 0 },
        { PSNET__MSG_TYPE__MSG_STATUS_REP, "STATUS_REP", false, B(STATUS_REP), 0, 0 },
        { PSNET__MSG_TYPE__MSG_JOB_SUBMIT, "JOB_SUBMIT", false, B(SUBMIT), A, 0 },
        { PSNET__MSG_TYPE__MSG_JOB_STOP, "JOB_STOP", false, B(_NOT_SET), A, 0 },
        { PSNET__MSG_TYPE__MSG_JOB_REP, "JOB_REP", false, B(JOB_REP), 0, 0 },
        { PSNET__MSG_TYPE__MSG_RESULT, "RESULT", false, B(RESULT), W | E, 0 },
        { PSNET__MSG_TYPE__MSG_DEREGISTER_REP, "DEREGISTER_REP", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_DRAIN, "DRAIN", false, B(WORKER), A, 0 },
        { PSNET__MSG_TYPE__MSG_JOB_MODE, "JOB_MODE", false, B(MODE), A, 0 },
        { PSNET__MSG_TYPE__MSG_FENCE, "FENCE", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_FENCE_REP, "FENCE_REP", false, B(FENCE_REP), S, 0 },
        { PSNET__MSG_TYPE__MSG_CHUNK_STATE, "CHUNK_STATE", true, B(CHUNK_STATE), 0, S },
        { PSNET__MSG_TYPE__MSG_CHUNK_ACK, "CHUNK_ACK", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_SHARD_ADD, "SHARD_ADD", false, B(SHARD), A, 0 },
        { PSNET__MSG_TYPE__MSG_SHARD_REMOVE, "SHARD_REMOVE", false, B(SHARD), A, 0 },
        { PSNET__MSG_TYPE__MSG_RESULT_REP, "RESULT_REP", false, B(RESULT_REP), 0, 0 },
        { PSNET__MSG_TYPE__MSG_REPLICATE, "REPLICATE", true, B(REPLICATE), 0, S },
        { PSNET__MSG_TYPE__MSG_REPLICATE_ACK, "REPLICATE_ACK", false, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_CHECKPOINT, "CHECKPOINT", false, B(CHECKPOINT), A, 0 },
        { PSNET__MSG_TYPE__MSG_CHECKPOINT_REP, "CHECKPOINT_REP", false, B(CHECKPOINT_REP), S, 0 },
        { PSNET__MSG_TYPE__MSG_CHECKPOINT_LIST, "CHECKPOINT_LIST", false, B(_NOT_SET), A, 0 },
        { PSNET__MSG_TYPE__MSG_CHECKPOINT_LIST_REP, "CHECKPOINT_LIST_REP", false, B(CHECKPOINT_LIST), 0, 0 },
        { PSNET__MSG_TYPE__MSG_CHECKPOINT_RESTORE, "CHECKPOINT_RESTORE", false, B(CHECKPOINT), A, 0 },
        { PSNET__MSG_TYPE__MSG_ROUND, "ROUND", false, B(ROUND), 0, 0 },
        { PSNET__MSG_TYPE__MSG_ROUND_REP, "ROUND_REP", false, B(ROUND), S | E | T, 0 },
        { PSNET__MSG_TYPE__MSG_HISTORY, "HISTORY", false, B(_NOT_SET), A, 0 },
        { PSNET__MSG_TYPE__MSG_HISTORY_REP, "HISTORY_REP", false, B(HISTORY), 0, 0 },
        { PSNET__MSG_TYPE__MSG_ROWS_PULL, "ROWS_PULL", true, B(_NOT_SET), 0, A | W },
        { PSNET__MSG_TYPE__MSG_ROWS_PULL_REP, "ROWS_PULL_REP", true, B(_NOT_SET), 0, 0 },
        { PSNET__MSG_TYPE__MSG_ROWS_PUSH, "ROWS_PUSH", true, B(_NOT_SET), 0, W },
        { PSNET__MSG_TYPE__MSG_ROWS_SCAN, "ROWS_SCAN", false, B(_NOT_SET), 0, A },
        { PSNET__MSG_TYPE__MSG_ROWS_COPY, "ROWS_COPY", true, B(_NOT_SET), 0, S },
        { PSNET__MSG_TYPE__MSG_ROWS_MOVE, "ROWS_MOVE", true, B(_NOT_SET), 0, S },
        { PSNET__MSG_TYPE__MSG_ROWS_WANT, "ROWS_WANT", true, B(_NOT_SET), 0, S },
};
#undef B
#undef A
#undef S
#undef W
#undef E
#undef T

static int type_index(int t) {
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
                if (types[i].type == t)
                        return (int) i;
        return -1;
}

const char *wire_type_name(int type) {
        int i = type_index(type);
        return i < 0 ? "?" : types[i].name;
}

const WireType *wire_type(int type) {
        int i = type_index(type);
        return i < 0 ? NULL : &types[i];
}

const WireType *wire_types(size_t *ret_n) {
        *ret_n = sizeof types / sizeof types[0];
        return types;
}

unsigned wire_roles_at(bool shard) {
        unsigned m = 0;
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
                m |= shard ? types[i].at_shard : types[i].at_coord;
        /* psgate relays what edge clients send (as the client: wire_recv). */
        if (m & WIRE_ROLE(PSNET__ROLE__ROLE_EDGE))
                m |= WIRE_ROLE(PSNET__ROLE__ROLE_GATEWAY);
        return m;
}

/* The name of a body case, for reasons. */
static const char *body_name(int body) {
        if (body == PSNET__HEADER__BODY__NOT_SET)
                return "no body";
        for (unsigned i = 0; i < psnet__header__descriptor.n_fields; i++)
                if ((int) psnet__header__descriptor.fields[i].id == body)
                        return psnet__header__descriptor.fields[i].name;
        return "an unknown body";
}

int wire_validate(const Psnet__Header *hdr, const zmq_msg_t *frames, size_t nframes,
                  char *reason, size_t reasonlen) {
        if (reason && reasonlen > 0)
                reason[0] = '\0';
        if (!hdr)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED, "no header");
        if (hdr->version != WIRE_VERSION)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_VERSION,
                            "peer speaks protocol version %u, this one speaks version %u: run the same psnet "
                            "release everywhere",
                            hdr->version, (unsigned) WIRE_VERSION);
        int ti = type_index(hdr->type);
        if (ti < 0)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_UNKNOWN_TYPE,
                            "unknown message type %d", (int) hdr->type);
        if ((int) hdr->body_case != types[ti].body)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED, "%s carries %s, it takes %s",
                            types[ti].name, body_name(hdr->body_case), body_name(types[ti].body));
        bool bf16 = hdr->dtype == PSNET__DTYPE__DTYPE_BF16;
        if (hdr->dtype != PSNET__DTYPE__DTYPE_F32 &&
            (!bf16 || hdr->codec != PSNET__CODEC__CODEC_RAW ||
             (hdr->type != PSNET__MSG_TYPE__MSG_PUSH && hdr->type != PSNET__MSG_TYPE__MSG_PULL &&
              hdr->type != PSNET__MSG_TYPE__MSG_PULL_REP && hdr->type != PSNET__MSG_TYPE__MSG_REPLICATE)))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_DTYPE,
                            "dtype %d not supported here (f32 = %d; bf16 = %d on a PUSH, PULL, PULL_REP or REPLICATE "
                            "without a codec)", (int) hdr->dtype, PSNET__DTYPE__DTYPE_F32, PSNET__DTYPE__DTYPE_BF16);
        if (hdr->codec != PSNET__CODEC__CODEC_RAW &&
            (hdr->codec > PSNET__CODEC__CODEC_TOPK || hdr->type != PSNET__MSG_TYPE__MSG_PUSH))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_DTYPE,
                            "codec %d not supported here (raw = %d; masked, bf16, int8, topk = %d..%d on a federated "
                            "push)", (int) hdr->codec, PSNET__CODEC__CODEC_RAW, PSNET__CODEC__CODEC_MASKED,
                            PSNET__CODEC__CODEC_TOPK);
        bool shm = hdr->has_shm_session;
        if (shm && (hdr->shm_session.len != WIRE_SHM_TOKEN || hdr->codec != PSNET__CODEC__CODEC_RAW ||
                    (hdr->type != PSNET__MSG_TYPE__MSG_PUSH && hdr->type != PSNET__MSG_TYPE__MSG_PULL &&
                     hdr->type != PSNET__MSG_TYPE__MSG_PULL_REP)))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "a shared-memory session (%zu bytes) goes on a PUSH, PULL or PULL_REP without a codec, "
                            "and names %u bytes", hdr->shm_session.len, (unsigned) WIRE_SHM_TOKEN);
        if (hdr->n_shm_keys > 0 && (!shm || hdr->n_shm_keys != hdr->n_keys ||
                                    (hdr->type != PSNET__MSG_TYPE__MSG_PUSH && hdr->type != PSNET__MSG_TYPE__MSG_PULL)))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%zu places of keys in shared memory: a PUSH or PULL in shared memory places each of its "
                            "%zu keys or none", hdr->n_shm_keys, hdr->n_keys);
        bool is_rows_push = hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PUSH || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY;
        if ((hdr->has_part || hdr->has_parts) &&
            ((hdr->type != PSNET__MSG_TYPE__MSG_PUSH && !is_rows_push) || !hdr->has_part || !hdr->has_parts ||
             !hdr->has_epoch || hdr->parts < 2 || hdr->parts > (is_rows_push ? WIRE_MAX_ROWS_PARTS : WIRE_MAX_PARTS) ||
             hdr->part >= hdr->parts))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "part %u of %u: a PUSH, ROWS_PUSH or ROWS_COPY in parts names its part (from 0), 2 to %u "
                            "parts "
                            "and the map epoch", hdr->part, hdr->parts,
                            (unsigned) (is_rows_push ? WIRE_MAX_ROWS_PARTS : WIRE_MAX_PARTS));
        if ((unsigned) hdr->status > PSNET__STATUS__STATUS_UNAVAILABLE)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "unknown status %d", (int) hdr->status);
        if (hdr->n_keys > WIRE_MAX_KEYS)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%zu keys, at most %u allowed", hdr->n_keys, (unsigned) WIRE_MAX_KEYS);
        if (hdr->n_keys > 0 && !hdr->keys)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED, "key list missing");
        for (size_t i = 0; i < hdr->n_keys; i++) {
                const Psnet__Key *k = hdr->keys[i];
                if (!k)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED, "key %zu missing", i);
                if (k->len == 0)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                                    "key %zu (%u,%u) declares 0 floats", i, k->tensor, k->chunk);
        }

        bool rows = hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL_REP ||
                    hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PUSH || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_SCAN ||
                    hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE ||
                    hdr->type == PSNET__MSG_TYPE__MSG_ROWS_WANT;
        if (hdr->has_last && hdr->type != PSNET__MSG_TYPE__MSG_ROWS_MOVE)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%s says whether it is the last: only ROWS_MOVE does", types[ti].name);
        if (hdr->has_origin && hdr->type != PSNET__MSG_TYPE__MSG_ROWS_COPY && hdr->type != PSNET__MSG_TYPE__MSG_ROWS_MOVE)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%s names a worker whose pushes it carries: only ROWS_COPY and ROWS_MOVE do",
                            types[ti].name);
        if (hdr->has_done != (hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE && hdr->has_origin))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%s %s a worker's last clock done: a ROWS_MOVE naming a worker does, no other",
                            types[ti].name, hdr->has_done ? "says" : "does not say");
        if (hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE && hdr->has_origin &&
            (nframes != 2 || zmq_msg_size((zmq_msg_t *) &frames[1]) != 0 || hdr->done < -1 || hdr->has_last))
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "a ROWS_MOVE naming a worker carries its ids and an empty frame, a done of -1 or more, "
                            "and is not a last (%zu frames)", nframes);
        if (hdr->has_cursor && hdr->type != PSNET__MSG_TYPE__MSG_ROWS_SCAN &&
            hdr->type != PSNET__MSG_TYPE__MSG_ROWS_PULL_REP)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%s carries a cursor: only ROWS_SCAN and its answer do", types[ti].name);
        if (rows) {
                /* Ids (8 bytes each, at least one but in a push, which a BSP
                 * worker sends every shard, and in a scan's answer), then, but
                 * for a pull, their rows: the same number of rows of
                 * 1..WIRE_MAX_ROW_DIM floats. A scan carries nothing. */
                size_t want = hdr->type == PSNET__MSG_TYPE__MSG_ROWS_SCAN ? 0
                            : hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_WANT
                                    ? 1 : 2;
                /* A copy of a table with max-rows or ttl carries its rows'
                 * stamps (8 bytes each) and the ids its primary dropped; a
                 * move of its rows their stamps. */
                bool bounded = (hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY && nframes == 4) ||
                               (hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE && nframes == 3);
                if (!hdr->has_table || hdr->n_keys > 0 || shm || (nframes != want && !bounded))
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                                    "%s names a table and carries %zu frame%s%s, no keys (%s, %zu keys, %zu frames)",
                                    types[ti].name, want, want == 1 ? "" : "s",
                                    hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY   ? " (4 with stamps)"
                                    : hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE ? " (3 with stamps)"
                                                                                  : "",
                                    hdr->has_table ? "a table" : "no table", hdr->n_keys, nframes);
                if (want == 0)
                        return PSNET__STATUS__STATUS_OK;
                size_t ib = zmq_msg_size((zmq_msg_t *) &frames[0]), n = ib / 8;
                bool copy = hdr->type == PSNET__MSG_TYPE__MSG_ROWS_COPY || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE;
                bool push = hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PUSH || hdr->type == PSNET__MSG_TYPE__MSG_ROWS_PULL_REP ||
                            copy;
                if (ib % 8 != 0 || (n == 0 && !push) || n > WIRE_MAX_ROWS)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                    "%s's ids frame has %zu bytes: %u to %u ids of 8 bytes", types[ti].name, ib,
                                    push ? 0 : 1, WIRE_MAX_ROWS);
                if (n == 0 && zmq_msg_size((zmq_msg_t *) &frames[1]) != 0)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                    "an empty %s carries an empty rows frame, not %zu bytes", types[ti].name,
                                    zmq_msg_size((zmq_msg_t *) &frames[1]));
                /* A move's ids without rows: ids it was asked for and does not hold. */
                bool absent = hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE && zmq_msg_size((zmq_msg_t *) &frames[1]) == 0;
                if (want == 2 && n > 0 && !absent) {
                        size_t rb = zmq_msg_size((zmq_msg_t *) &frames[1]);
                        /* A copy's rows are whole: values, up to twice as much state, a step count. */
                        size_t most = copy ? 3 * WIRE_MAX_ROW_DIM + 1 : WIRE_MAX_ROW_DIM;
                        if (rb % (n * sizeof(float)) != 0 || rb == 0 || rb / (n * sizeof(float)) > most)
                                return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                            "%s's rows frame has %zu bytes, not %zu rows of 1 to %zu floats",
                                            types[ti].name, rb, n, most);
                }
                if (bounded && hdr->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE) {
                        size_t sb = zmq_msg_size((zmq_msg_t *) &frames[2]);
                        if (sb != (absent ? 0 : n * 8))
                                return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                            "ROWS_MOVE's stamps frame has %zu bytes, not 8 for each of its %zu rows",
                                            sb, absent ? (size_t) 0 : n);
                } else if (bounded) {
                        size_t sb = zmq_msg_size((zmq_msg_t *) &frames[2]), gb = zmq_msg_size((zmq_msg_t *) &frames[3]);
                        if (sb != n * 8 || gb % 8 != 0 || gb / 8 > WIRE_MAX_ROWS)
                                return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                            "ROWS_COPY's stamps frame has %zu bytes, not 8 for each of %zu ids, or its "
                                            "frame of ids dropped %zu bytes, not up to %u ids of 8 bytes",
                                            sb, n, gb, WIRE_MAX_ROWS);
                }
                return PSNET__STATUS__STATUS_OK;
        }
        if (hdr->has_table)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%s names a table: only the ROWS_ messages do",
                            types[ti].name);
        if (hdr->type == PSNET__MSG_TYPE__MSG_CHUNK_STATE) {
                /* One key; frames: its values (len floats), its optimizer state,
                 * then one gradient per parked push named in pending_workers. */
                size_t npend = hdr->chunk_state->n_pending_workers;
                if (hdr->n_keys != 1 || nframes != 2 + npend)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                                    "CHUNK_STATE carries one key and 2 + %zu frames (%zu keys, %zu frames)", npend,
                                    hdr->n_keys, nframes);
                if (hdr->chunk_state->n_pending_progress != 0 && hdr->chunk_state->n_pending_progress != npend)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                                    "CHUNK_STATE names %zu parked pushes and the progress of %zu", npend,
                                    hdr->chunk_state->n_pending_progress);
                uint64_t want = (uint64_t) hdr->keys[0]->len * sizeof(float);
                size_t have = zmq_msg_size((zmq_msg_t *) &frames[0]), st = zmq_msg_size((zmq_msg_t *) &frames[1]);
                if ((uint64_t) have != want || st % want != 0)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                    "CHUNK_STATE frames of %zu and %zu bytes for a key of %llu bytes", have, st,
                                    (unsigned long long) want);
                for (size_t i = 0; i < npend; i++)
                        if ((uint64_t) zmq_msg_size((zmq_msg_t *) &frames[2 + i]) != want)
                                return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                            "CHUNK_STATE parked gradient %zu has %zu bytes for a key of %llu bytes",
                                            i, zmq_msg_size((zmq_msg_t *) &frames[2 + i]),
                                            (unsigned long long) want);
                return PSNET__STATUS__STATUS_OK;
        }
        if (!types[ti].frames || shm) {
                if (nframes > 0)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                                    "%s%s carries %zu payload frame%s; it takes none",
                                    types[ti].name, shm ? " in shared memory" : "", nframes, nframes == 1 ? "" : "s");
                return PSNET__STATUS__STATUS_OK;
        }
        if (nframes != hdr->n_keys)
                return fail(reason, reasonlen, PSNET__STATUS__STATUS_MALFORMED,
                            "%s declares %zu key%s but carries %zu payload frame%s",
                            types[ti].name, hdr->n_keys, hdr->n_keys == 1 ? "" : "s",
                            nframes, nframes == 1 ? "" : "s");
        for (size_t i = 0; i < nframes; i++) {
                const Psnet__Key *k = hdr->keys[i];
                size_t have = zmq_msg_size((zmq_msg_t *) &frames[i]);
                uint64_t want = (uint64_t) k->len * (bf16 ? 2 : sizeof(float));
                if (hdr->codec >= PSNET__CODEC__CODEC_BF16) {
                        CompressKind ck = (CompressKind) (hdr->codec - PSNET__CODEC__CODEC_BF16 + COMPRESS_BF16);
                        if (!compress_size_ok(ck, have, k->len))
                                return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                            "frame %zu has %zu bytes, not a %s frame of key (%u,%u)'s %u values", i + 1,
                                            have, compress_name(ck), k->tensor, k->chunk, k->len);
                        continue;
                }
                if ((uint64_t) have != want)
                        return fail(reason, reasonlen, PSNET__STATUS__STATUS_SIZE,
                                    "frame %zu has %zu bytes, key (%u,%u) declares %u %s values = %llu bytes",
                                    i + 1, have, k->tensor, k->chunk, k->len, bf16 ? "bf16" : "f32",
                                    (unsigned long long) want);
        }
        return PSNET__STATUS__STATUS_OK;
}

void wire_peer_from_user_id(const char *uid, WirePeer *peer) {
        char role[16], z85[48];
        memset(peer, 0, sizeof *peer);
        if (!uid || sscanf(uid, "%15s %16s %63s %47s", role, peer->fingerprint, peer->name, z85) != 4 ||
            strlen(z85) != 40 || !zmq_z85_decode(peer->key, z85) || role_from_name(role, &peer->role) < 0)
                memset(peer, 0, sizeof *peer);
}

/* A gateway's message is its edge client's (Header.relay_key): the peer
 * becomes that client, as psgate's handshake admitted it; a relay from any
 * other key is refused. Without keys (role NONE) there is no one to be. */
static int peer_relayed(WireMsg *msg) {
        const Psnet__Header *h = msg->hdr;
        WirePeer *peer = &msg->peer;
        if (peer->role == PSNET__ROLE__ROLE_NONE)
                return PSNET__STATUS__STATUS_OK;
        if (peer->role != PSNET__ROLE__ROLE_GATEWAY)
                return h->has_relay_key ? fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_DENIED,
                                               "only a gateway's key relays for another (this key has role %s)",
                                               role_name(peer->role))
                                        : PSNET__STATUS__STATUS_OK;
        if (!h->has_relay_key || h->relay_key.len != 32)
                return fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_DENIED,
                            "a gateway speaks for the edge client it relays (relay_key), never for itself");
        peer->role = PSNET__ROLE__ROLE_EDGE;
        memcpy(peer->key, h->relay_key.data, 32);
        keys_fingerprint(peer->key, peer->fingerprint);
        snprintf(peer->name, sizeof peer->name, "%s", h->relay_name && h->relay_name[0] ? h->relay_name : "-");
        return PSNET__STATUS__STATUS_OK;
}

/* Receives the next part of the current message (never blocks: ZeroMQ hands a
 * multipart message over whole). */
static int recv_more(void *sock, zmq_msg_t *m) {
        for (;;) {
                if (zmq_msg_recv(m, sock, 0) >= 0)
                        return 0;
                if (errno != EINTR)
                        return -errno;
        }
}

static bool has_more(const zmq_msg_t *m) {
        return zmq_msg_more((zmq_msg_t *) m) == 1;
}

static int recv_parts(void *sock, bool router, bool addressed, int flags, WireMsg *msg);

void wire_address_init(zmq_msg_t *m, uint32_t to) {
        zmq_msg_init_size(m, 4);
        uint8_t *d = zmq_msg_data(m);
        for (int i = 0; i < 4; i++)
                d[i] = (uint8_t) (to >> (8 * i));
}

bool wire_address(const zmq_msg_t *m, uint32_t *ret) {
        if (zmq_msg_size((zmq_msg_t *) m) != 4)
                return false;
        const uint8_t *d = zmq_msg_data((zmq_msg_t *) m);
        *ret = (uint32_t) d[0] | (uint32_t) d[1] << 8 | (uint32_t) d[2] << 16 | (uint32_t) d[3] << 24;
        return true;
}

uint64_t wire_refusal_key(const zmq_msg_t *route, int status) {
        zmq_msg_t *r = (zmq_msg_t *) route; /* zmq_msg_data and _size do not change it */
        return log_limit_key(zmq_msg_data(r), zmq_msg_size(r), (uint64_t) status);
}

int wire_recv(void *sock, bool router, int flags, WireMsg *msg) {
        return recv_parts(sock, router, false, flags, msg);
}

int wire_recv_to(void *sock, bool router, int flags, WireMsg *msg) {
        return recv_parts(sock, router, true, flags, msg);
}

static int recv_parts(void *sock, bool router, bool addressed, int flags, WireMsg *msg) {
        zmq_msg_t head;
        size_t cap = 0, extra = 0;
        bool more, nomem = false;
        int r;

        memset(msg, 0, sizeof *msg);
        msg->status = PSNET__STATUS__STATUS_OK;

        /* First part: the identity (ROUTER) or the header (DEALER). */
        if (router) {
                if (zmq_msg_init(&msg->route) < 0)
                        return -errno;
                if (zmq_msg_recv(&msg->route, sock, flags) < 0) {
                        r = -errno;
                        zmq_msg_close(&msg->route);
                        return r;
                }
                msg->has_route = true;
                if (!has_more(&msg->route)) {
                        msg->status = fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_MALFORMED,
                                           "message has no header frame");
                        return -EBADMSG;
                }
        }
        if (addressed) {
                if (zmq_msg_init(&msg->to) < 0)
                        return -errno;
                r = router ? recv_more(sock, &msg->to) : (zmq_msg_recv(&msg->to, sock, flags) < 0 ? -errno : 0);
                if (r < 0) {
                        zmq_msg_close(&msg->to);
                        return r;
                }
                msg->has_to = true;
                router = true; /* the header is the next part of a message begun */
                uint32_t to;
                if (!has_more(&msg->to) || !wire_address(&msg->to, &to)) {
                        /* Drain the rest: the next message must start clean. */
                        while (has_more(&msg->to)) {
                                zmq_msg_t part;
                                zmq_msg_init(&part);
                                r = recv_more(sock, &part);
                                bool more = r == 0 && has_more(&part);
                                zmq_msg_close(&part);
                                if (!more)
                                        break;
                        }
                        msg->status = fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_MALFORMED,
                                           "message has no 4-byte address frame before its header");
                        return -EBADMSG;
                }
        }
        if (zmq_msg_init(&head) < 0)
                return -errno;
        r = router ? recv_more(sock, &head) : (zmq_msg_recv(&head, sock, flags) < 0 ? -errno : 0);
        if (r < 0) {
                zmq_msg_close(&head);
                return r;
        }
        wire_peer_from_user_id(zmq_msg_gets(&head, "User-Id"), &msg->peer);
        more = has_more(&head);

        /* Payload parts: keep up to WIRE_MAX_KEYS, drain the rest. */
        while (more) {
                zmq_msg_t part;
                if (zmq_msg_init(&part) < 0) {
                        r = -errno;
                        goto fail;
                }
                r = recv_more(sock, &part);
                if (r < 0) {
                        zmq_msg_close(&part);
                        goto fail;
                }
                more = has_more(&part);
                if (msg->nframes >= WIRE_MAX_KEYS || nomem) {
                        extra++;
                        zmq_msg_close(&part);
                        continue;
                }
                if (msg->nframes == cap) {
                        size_t n = cap ? cap * 2 : 8;
                        zmq_msg_t *a = realloc(msg->frames, n * sizeof *a);
                        if (!a) {
                                nomem = true;
                                zmq_msg_close(&part);
                                continue;
                        }
                        msg->frames = a;
                        cap = n;
                }
                /* Moving a received zmq_msg_t by value is what zmq_msg_move does. */
                msg->frames[msg->nframes++] = part;
        }
        if (nomem) {
                r = -ENOMEM;
                goto fail;
        }

        if (zmq_msg_size(&head) == 0)
                msg->status = fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_MALFORMED,
                                   "header frame is empty");
        else if (zmq_msg_size(&head) > WIRE_MAX_HEADER)
                msg->status = fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_MALFORMED,
                                   "header frame has %zu bytes, at most %u allowed",
                                   zmq_msg_size(&head), WIRE_MAX_HEADER);
        else {
                msg->hdr = psnet__header__unpack(NULL, zmq_msg_size(&head), zmq_msg_data(&head));
                if (!msg->hdr)
                        msg->status = fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_MALFORMED,
                                           "header frame (%zu bytes) does not decode as psnet.Header",
                                           zmq_msg_size(&head));
                else if (extra > 0)
                        msg->status = fail(msg->reason, sizeof msg->reason, PSNET__STATUS__STATUS_MALFORMED,
                                           "message has %zu payload frames, at most %u allowed",
                                           msg->nframes + extra, (unsigned) WIRE_MAX_KEYS);
                else
                        msg->status = wire_validate(msg->hdr, msg->frames, msg->nframes, msg->reason,
                                                    sizeof msg->reason);
                if (msg->status == PSNET__STATUS__STATUS_OK)
                        msg->status = peer_relayed(msg);
        }
        zmq_msg_close(&head);
        return msg->status == PSNET__STATUS__STATUS_OK ? 0 : -EBADMSG;

fail:
        zmq_msg_close(&head);
        return r;
}

void wire_msg_done(WireMsg *msg) {
        if (!msg)
                return;
        if (msg->has_route)
                zmq_msg_close(&msg->route);
        msg->has_route = false;
        if (msg->has_to)
                zmq_msg_close(&msg->to);
        msg->has_to = false;
        if (msg->hdr)
                psnet__header__free_unpacked(msg->hdr, NULL);
        msg->hdr = NULL;
        for (size_t i = 0; i < msg->nframes; i++)
                zmq_msg_close(&msg->frames[i]);
        free(msg->frames);
        msg->frames = NULL;
        msg->nframes = 0;
}

void wire_header_init(Psnet__Header *hdr, Psnet__MsgType type) {
        psnet__header__init(hdr);
        hdr->version = WIRE_VERSION;
        hdr->type = type;
}

/* Sends one part without blocking; parts after the first are retried on
 * EINTR because a multipart message, once started, has to be finished (on
 * EAGAIN mid-message, libzmq rolls the message back or drops it whole). On
 * failure the part is still ours (zmq_msg_send only takes it on success). */
static int send_part(void *sock, zmq_msg_t *m, bool first, bool more) {
        for (;;) {
                if (zmq_msg_send(m, sock, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) >= 0)
                        return 0;
                if (errno != EINTR || first)
                        return -errno;
        }
}

int wire_send(void *sock, const zmq_msg_t *route, const Psnet__Header *hdr, zmq_msg_t *frames,
              size_t nframes) {
        return wire_send_to(sock, route, NULL, hdr, frames, nframes);
}

/* Sends a copy of m (a route or an address frame) as the first part or a
 * later one of a message. */
static int send_copy(void *sock, const zmq_msg_t *m, bool first) {
        zmq_msg_t c;
        if (zmq_msg_init(&c) < 0)
                return -errno;
        if (zmq_msg_copy(&c, (zmq_msg_t *) m) < 0) {
                int r = -errno;
                zmq_msg_close(&c);
                return r;
        }
        int r = send_part(sock, &c, first, true);
        if (r < 0)
                zmq_msg_close(&c);
        return r;
}

int wire_send_to(void *sock, const zmq_msg_t *route, const zmq_msg_t *to, const Psnet__Header *hdr,
                 zmq_msg_t *frames, size_t nframes) {
        zmq_msg_t head;
        size_t size, sent = 0;
        int r;

        /* Everything that can fail for want of memory happens before the first
         * part leaves, so a failure never strands half a message in the socket. */
        size = psnet__header__get_packed_size(hdr);
        if (size > WIRE_MAX_HEADER) {
                r = -EMSGSIZE;
                goto fail;
        }
        if (zmq_msg_init_size(&head, size) < 0) {
                r = -errno;
                goto fail;
        }
        psnet__header__pack(hdr, zmq_msg_data(&head));

        if (route && (r = send_copy(sock, route, true)) < 0)
                goto fail_head;
        if (to && (r = send_copy(sock, to, !route)) < 0)
                goto fail_head;
        r = send_part(sock, &head, !route && !to, nframes > 0);
        if (r < 0)
                goto fail_head;

        for (; sent < nframes; sent++) {
                r = send_part(sock, &frames[sent], false, sent + 1 < nframes);
                if (r < 0)
                        goto fail;
        }
        return 0;

fail_head:
        zmq_msg_close(&head);
fail:
        /* The frames not handed to ZeroMQ are still ours: release them. */
        for (; sent < nframes; sent++)
                zmq_msg_close(&frames[sent]);
        return r;
}

int wire_send_error(void *sock, const zmq_msg_t *route, int status, uint64_t seq,
                    const char *reason) {
        return wire_send_error_to(sock, route, NULL, status, seq, reason);
}

int wire_send_error_to(void *sock, const zmq_msg_t *route, const zmq_msg_t *to, int status, uint64_t seq,
                       const char *reason) {
        Psnet__Header hdr;

        wire_header_init(&hdr, PSNET__MSG_TYPE__MSG_ERROR);
        hdr.has_status = true;
        hdr.status = (Psnet__Status) status;
        hdr.has_seq = true;
        hdr.seq = seq;
        hdr.reason = (char *) reason;   /* packed, never written */
        return wire_send_to(sock, route, to, &hdr, NULL, 0);
}

const float *wire_frame_f32(const zmq_msg_t *frame) {
        const void *p = zmq_msg_data((zmq_msg_t *) frame);
        if ((uintptr_t) p % _Alignof(float) != 0)
                return NULL;
        return p;
}
