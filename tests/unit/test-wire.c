/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/net/wire.c (and the status table of errors.c) over a real DEALER <-> ROUTER pair on inproc://:
 * round trips of data and control messages, refusal of every malformed
 * message we can build, and no desynchronisation after any of them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "errors.h"
#include "job.h"
#include "tap.h"
#include "wire.h"
#include "wire-job.h"

static void *ctx, *router, *dealer;

static void die(const char *what) {
        fprintf(stderr, "%s: %s\n", what, zmq_strerror(errno));
        exit(2);
}

static void setup(void) {
        int timeout = 5000, hwm = 0;
        ctx = zmq_ctx_new();
        if (!ctx)
                die("zmq_ctx_new");
        router = zmq_socket(ctx, ZMQ_ROUTER);
        dealer = zmq_socket(ctx, ZMQ_DEALER);
        if (!router || !dealer)
                die("zmq_socket");
        /* A test must fail, not hang, when a message does not arrive. */
        if (zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout, sizeof timeout) < 0 ||
            zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout) < 0 ||
            zmq_setsockopt(router, ZMQ_RCVHWM, &hwm, sizeof hwm) < 0 ||
            zmq_setsockopt(dealer, ZMQ_SNDHWM, &hwm, sizeof hwm) < 0)
                die("zmq_setsockopt");
        if (zmq_bind(router, "inproc://test-wire") < 0 || zmq_connect(dealer, "inproc://test-wire") < 0)
                die("bind/connect");
}

static void teardown(void) {
        int linger = 0;
        zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(router);
        zmq_close(dealer);
        zmq_ctx_term(ctx);
}

/* Sends raw parts from the dealer (bypassing wire_send, to build bad messages). */
static void send_raw(void *sock, const void *const *parts, const size_t *sizes, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (zmq_send(sock, parts[i], sizes[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
                        die("zmq_send");
}

static uint8_t *pack(const Psnet__Header *h, size_t *ret_len) {
        size_t n = psnet__header__get_packed_size(h);
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
                die("malloc");
        *ret_len = psnet__header__pack(h, buf);
        return buf;
}

/* Sends a header (packed as given, no validation) plus nframes frames of the given sizes. */
static void send_hdr(const Psnet__Header *h, const size_t *frame_bytes, size_t nframes) {
        const void *parts[8];
        size_t sizes[8];
        static float zeros[4096];
        uint8_t *buf;
        size_t len;

        buf = pack(h, &len);
        parts[0] = buf;
        sizes[0] = len;
        for (size_t i = 0; i < nframes; i++) {
                parts[i + 1] = zeros;
                sizes[i + 1] = frame_bytes[i];
        }
        send_raw(dealer, parts, sizes, nframes + 1);
        free(buf);
}

/* A small valid PULL, sent after each bad message to prove the socket is in step. */
static void send_good(uint64_t seq) {
        Psnet__Header h;
        Psnet__Key k = PSNET__KEY__INIT, *keys[1] = { &k };
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
        h.has_seq = true;
        h.seq = seq;
        k.tensor = 1;
        k.chunk = 2;
        k.len = 3;
        h.n_keys = 1;
        h.keys = keys;
        if (wire_send(dealer, NULL, &h, NULL, 0) < 0)
                die("wire_send");
}

static void expect_good(uint64_t seq, const char *after) {
        WireMsg m;
        int r = wire_recv(router, true, 0, &m);
        CHECK(r == 0 && m.hdr && m.hdr->seq == seq && m.hdr->type == PSNET__MSG_TYPE__MSG_PULL,
              "after %s the next good message decodes (r=%d)", after, r);
        wire_msg_done(&m);
}

/* Receives one message on the router and checks it is refused as expected;
 * then checks that a good message still gets through. */
static void expect_bad(int status, const char *reason_part, const char *what) {
        static uint64_t seq = 1000;
        WireMsg m;
        int r = wire_recv(router, true, 0, &m);
        CHECK(r == -EBADMSG, "%s: refused with -EBADMSG (r=%d)", what, r);
        CHECK(m.status == status, "%s: status %s (got %s: %s)", what, status_name(status), status_name(m.status),
              m.reason);
        CHECK(strstr(m.reason, reason_part) != NULL, "%s: reason \"%s\" contains \"%s\"", what, m.reason,
              reason_part);
        CHECK(m.has_route, "%s: route kept for the error reply", what);
        wire_msg_done(&m);
        send_good(++seq);
        expect_good(seq, what);
}

static int nfreed;
static void free_cb(void *data, void *hint) {
        (void) hint;
        free(data);
        nfreed++;
}

static void test_push_roundtrip(void) {
        Psnet__Header h;
        Psnet__Key k0 = PSNET__KEY__INIT, k1 = PSNET__KEY__INIT, *keys[2] = { &k0, &k1 };
        zmq_msg_t frames[2];
        float *a = malloc(4 * sizeof *a), *b = malloc(2 * sizeof *b);
        WireMsg m;
        int r;

        if (!a || !b)
                die("malloc");
        for (int i = 0; i < 4; i++)
                a[i] = 0.5f * (float) i;
        b[0] = -1.0f;
        b[1] = 3.25f;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
        h.has_job = h.has_epoch = h.has_sender = h.has_seq = h.has_clock = true;
        h.job = 7;
        h.epoch = 3;
        h.sender = 12;
        h.seq = 99;
        h.clock = -5;
        k0.tensor = 0, k0.chunk = 1, k0.len = 4;
        k1.tensor = 2, k1.chunk = 0, k1.len = 2;
        h.n_keys = 2;
        h.keys = keys;
        if (zmq_msg_init_data(&frames[0], a, 4 * sizeof *a, free_cb, NULL) < 0 ||
            zmq_msg_init_data(&frames[1], b, 2 * sizeof *b, free_cb, NULL) < 0)
                die("zmq_msg_init_data");
        nfreed = 0;
        r = wire_send(dealer, NULL, &h, frames, 2);
        CHECK(r == 0, "wire_send PUSH with 2 zero-copy frames (%d)", r);

        r = wire_recv(router, true, 0, &m);
        CHECK(r == 0, "wire_recv PUSH (%d: %s)", r, m.reason);
        CHECK(m.has_route, "router side has the peer's identity");
        CHECK(m.hdr && m.hdr->version == WIRE_VERSION && m.hdr->type == PSNET__MSG_TYPE__MSG_PUSH,
              "version and type");
        CHECK(m.hdr && m.hdr->job == 7 && m.hdr->epoch == 3 && m.hdr->sender == 12 && m.hdr->seq == 99 &&
              m.hdr->clock == -5, "job, epoch, sender, seq, clock");
        CHECK(m.hdr && m.hdr->n_keys == 2 && m.hdr->keys[0]->tensor == 0 && m.hdr->keys[0]->chunk == 1 &&
              m.hdr->keys[0]->len == 4 && m.hdr->keys[1]->tensor == 2 && m.hdr->keys[1]->len == 2, "keys");
        CHECK(m.nframes == 2 && zmq_msg_size(&m.frames[0]) == 16 && zmq_msg_size(&m.frames[1]) == 8,
              "frame sizes");
        if (m.nframes == 2) {
                const float *fa = wire_frame_f32(&m.frames[0]), *fb = wire_frame_f32(&m.frames[1]);
                CHECK(fa && fa[0] == 0.0f && fa[1] == 0.5f && fa[3] == 1.5f, "frame 1 values");
                CHECK(fb && fb[0] == -1.0f && fb[1] == 3.25f, "frame 2 values");
        }

        /* Reply through the route: a PULL_REP with one frame (a copying one). */
        {
                Psnet__Header rep;
                Psnet__Key rk = PSNET__KEY__INIT, *rkeys[1] = { &rk };
                zmq_msg_t f;
                float v[3] = { 1, 2, 3 };
                WireMsg d;

                wire_header_init(&rep, PSNET__MSG_TYPE__MSG_PULL_REP);
                rep.has_seq = true;
                rep.seq = m.hdr ? m.hdr->seq : 0;
                rk.tensor = 4, rk.chunk = 5, rk.len = 3;
                rep.n_keys = 1;
                rep.keys = rkeys;
                if (zmq_msg_init_size(&f, sizeof v) < 0)
                        die("zmq_msg_init_size");
                memcpy(zmq_msg_data(&f), v, sizeof v);
                r = wire_send(router, &m.route, &rep, &f, 1);
                CHECK(r == 0, "router replies through the route (%d)", r);
                r = wire_recv(dealer, false, 0, &d);
                CHECK(r == 0 && !d.has_route, "dealer receives the reply (%d: %s)", r, d.reason);
                CHECK(d.hdr && d.hdr->type == PSNET__MSG_TYPE__MSG_PULL_REP && d.hdr->seq == 99 && d.nframes == 1,
                      "reply type, seq echoed, one frame");
                if (d.nframes == 1) {
                        const float *p = wire_frame_f32(&d.frames[0]);
                        CHECK(p && p[0] == 1 && p[1] == 2 && p[2] == 3, "reply values");
                }
                wire_msg_done(&d);
        }
        wire_msg_done(&m);
        CHECK(nfreed == 2, "zero-copy buffers freed once the receiver is done (%d)", nfreed);
        CHECK(m.hdr == NULL && m.frames == NULL && m.nframes == 0 && !m.has_route, "wire_msg_done clears");
}

static void test_control_roundtrip(void) {
        Psnet__Header h;
        Psnet__JobSpec *spec = NULL;
        Job job, back;
        WireMsg m;
        char err[128];
        int r;

        job_defaults(&job);
        job.id = 5;
        job.seed = 1234;
        job.mode = MODE_SSP;
        job.staleness = 3;
        job.optim.kind = OPTIM_ADAM;
        r = job_set_model(&job, "mlp:20-30-4");
        CHECK(r == 0 && job_to_proto(&job, &spec) == 0, "job to proto");
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_JOB_SUBMIT);
        h.body_case = PSNET__HEADER__BODY_SUBMIT;
        h.submit = spec;
        r = wire_send(dealer, NULL, &h, NULL, 0);
        CHECK(r == 0, "send JOB_SUBMIT with its job body (%d)", r);
        job_proto_free(spec);

        r = wire_recv(router, true, 0, &m);
        CHECK(r == 0 && m.hdr && m.hdr->type == PSNET__MSG_TYPE__MSG_JOB_SUBMIT && m.nframes == 0,
              "JOB_SUBMIT received (%d)", r);
        CHECK(m.hdr && m.hdr->body_case == PSNET__HEADER__BODY_SUBMIT && m.hdr->submit, "submit body present");
        if (m.hdr && m.hdr->submit) {
                CHECK(m.hdr->submit->mode->mode == PSNET__MODE__MODE_SSP && m.hdr->submit->mode->staleness == 3 &&
                      m.hdr->submit->optim->kind == PSNET__OPTIM_KIND__OPTIM_ADAM,
                      "mode and optimizer travel as enums");
                r = job_from_proto(m.hdr->submit, &back, err, sizeof err);
                CHECK(r == 0, "job from proto (%s)", err);
                CHECK(r == 0 && back.id == 5 && back.seed == 1234 && strcmp(back.model, "mlp:20-30-4") == 0 &&
                      back.ntensors == 4 && back.mode == MODE_SSP && back.staleness == 3 &&
                      back.optim.kind == OPTIM_ADAM, "job survives the wire");
        }
        wire_msg_done(&m);

        /* A registration. */
        {
                Psnet__Header rh;
                Psnet__Register reg = PSNET__REGISTER__INIT;
                WireMsg d;
                wire_header_init(&rh, PSNET__MSG_TYPE__MSG_REGISTER);
                reg.role = PSNET__ROLE__ROLE_SERVER;
                reg.endpoint = (char *) "ipc:///tmp/x";
                rh.body_case = PSNET__HEADER__BODY_REG;
                rh.reg = &reg;
                r = wire_send(dealer, NULL, &rh, NULL, 0);
                CHECK(r == 0, "send REGISTER");
                r = wire_recv(router, true, 0, &d);
                CHECK(r == 0 && d.hdr->reg && d.hdr->reg->role == PSNET__ROLE__ROLE_SERVER &&
                      strcmp(d.hdr->reg->endpoint, "ipc:///tmp/x") == 0, "REGISTER body survives");
                wire_msg_done(&d);
        }
}

/* Each message type takes exactly its body; a version-1 peer is told so. */
static void test_bodies(void) {
        Psnet__Header h;
        Psnet__Heartbeat hb = PSNET__HEARTBEAT__INIT;
        Psnet__Register reg = PSNET__REGISTER__INIT;

        wire_header_init(&h, PSNET__MSG_TYPE__MSG_REGISTER);
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "REGISTER carries no body, it takes reg", "REGISTER without body");
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_REGISTER);
        h.body_case = PSNET__HEADER__BODY_HEARTBEAT;
        h.heartbeat = &hb;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "REGISTER carries heartbeat, it takes reg",
                   "REGISTER with another type's body");
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
        h.body_case = PSNET__HEADER__BODY_REG;
        h.reg = &reg;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "STATUS carries reg, it takes no body", "a body where none belongs");

        /* A version-1 REGISTER as a version-1 peer sends it: field 13 (v1's
         * Control, here {reg: {role: 1}}) is unknown to version 2. */
        {
                static const uint8_t v1[] = { 0x08, 0x01, 0x10, 0x0a, 0x6a, 0x04, 0x0a, 0x02, 0x08, 0x01 };
                const void *p[1] = { v1 };
                size_t sz[1] = { sizeof v1 };
                send_raw(dealer, p, sz, 1);
                expect_bad(PSNET__STATUS__STATUS_VERSION, "peer speaks protocol version 1, this one speaks version 2",
                           "a version-1 peer is refused, naming both versions");
        }
}

/* One table: every status maps to a distinct errno and back; names are unique. */
static void test_status_table(void) {
        bool ok = true;
        for (int st = PSNET__STATUS__STATUS_OK; st <= PSNET__STATUS__STATUS_UNAVAILABLE; st++) {
                int e = status_to_errno(st);
                if (status_from_errno(e) != st || strcmp(status_name(st), "unknown") == 0) {
                        ok = false;
                        printf("# status %d -> errno %d -> status %d (%s)\n", st, e, status_from_errno(e),
                               status_name(st));
                }
                for (int o = st + 1; o <= PSNET__STATUS__STATUS_UNAVAILABLE; o++)
                        if (strcmp(status_name(st), status_name(o)) == 0)
                                ok = false;
        }
        CHECK(ok, "status -> errno -> status is the identity, names distinct");
        CHECK(status_from_errno(-ENOMEM) == PSNET__STATUS__STATUS_RESOURCE, "out of memory is RESOURCE, not shutting down");
        CHECK(status_from_errno(-EIO) == PSNET__STATUS__STATUS_INTERNAL, "EIO is INTERNAL");
        CHECK(status_from_errno(-ENOTRECOVERABLE) == PSNET__STATUS__STATUS_INTERNAL, "an unlisted errno is INTERNAL");
        CHECK(status_from_errno(-EXDEV) == PSNET__STATUS__STATUS_MOVED && status_from_errno(EEXIST) ==
              PSNET__STATUS__STATUS_DUPLICATE, "aliases map to their status");
        CHECK(status_to_errno(1000) == -EPROTO && strcmp(status_name(1000), "unknown") == 0, "unknown status");
}

static void test_error_reply(void) {
        WireMsg m, d;
        int r;

        send_good(5);
        r = wire_recv(router, true, 0, &m);
        CHECK(r == 0, "request to answer with an error");
        r = wire_send_error(router, &m.route, PSNET__STATUS__STATUS_MOVED, 5, "key (1,2) moved to epoch 9");
        CHECK(r == 0, "wire_send_error (%d)", r);
        wire_msg_done(&m);
        r = wire_recv(dealer, false, 0, &d);
        CHECK(r == 0 && d.hdr && d.hdr->type == PSNET__MSG_TYPE__MSG_ERROR, "dealer gets MSG_ERROR (%d)", r);
        CHECK(d.hdr && d.hdr->has_status && d.hdr->status == PSNET__STATUS__STATUS_MOVED, "status travels");
        CHECK(d.hdr && d.hdr->seq == 5, "seq echoed");
        CHECK(d.hdr && d.hdr->reason && strcmp(d.hdr->reason, "key (1,2) moved to epoch 9") == 0, "reason travels");
        wire_msg_done(&d);
}

static void test_malformed(void) {
        Psnet__Header h;
        Psnet__Key k0 = PSNET__KEY__INIT, k1 = PSNET__KEY__INIT, *keys[2] = { &k0, &k1 };
        size_t fb[4];

        /* Garbage bytes. */
        {
                static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x42, 0x99 };
                const void *p[1] = { junk };
                size_t s[1] = { sizeof junk };
                send_raw(dealer, p, s, 1);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "does not decode", "garbage header");
        }
        /* Empty message (one empty frame), also what a REQ peer's delimiter looks like. */
        {
                const void *p[1] = { "" };
                size_t s[1] = { 0 };
                send_raw(dealer, p, s, 1);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "empty", "empty message");
        }
        /* Empty header frame followed by a payload frame (REQ-style delimiter). */
        {
                float x = 1;
                const void *p[2] = { "", &x };
                size_t s[2] = { 0, sizeof x };
                send_raw(dealer, p, s, 2);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "empty", "empty header + frame");
        }
        /* Truncated header: cut inside the last key. */
        {
                uint8_t *buf;
                size_t len;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
                k0.tensor = 1, k0.chunk = 2, k0.len = 300;
                h.n_keys = 1;
                h.keys = keys;
                buf = pack(&h, &len);
                {
                        const void *p[1] = { buf };
                        size_t s[1] = { len - 1 };
                        send_raw(dealer, p, s, 1);
                }
                free(buf);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "does not decode", "truncated header");
        }
        /* Header with a required field missing (only "type"). */
        {
                static const uint8_t only_type[] = { 0x10, 0x01 };
                const void *p[1] = { only_type };
                size_t s[1] = { sizeof only_type };
                send_raw(dealer, p, s, 1);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "does not decode", "missing version");
        }
        /* Oversized header frame. */
        {
                size_t n = WIRE_MAX_HEADER + 1;
                uint8_t *big = calloc(1, n);
                const void *p[1] = { big };
                size_t s[1] = { n };
                if (!big)
                        die("calloc");
                send_raw(dealer, p, s, 1);
                free(big);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "header frame has 1048577 bytes", "oversized header");
        }
        /* Wrong version. */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
        h.version = WIRE_VERSION + 1;
        send_hdr(&h, NULL, 0);
        {
                char want[96];
                snprintf(want, sizeof want, "version %u, this one speaks version %u", WIRE_VERSION + 1, WIRE_VERSION);
                expect_bad(PSNET__STATUS__STATUS_VERSION, want, "wrong version");
        }
        /* Unknown type. */
        wire_header_init(&h, (Psnet__MsgType) 99);
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_UNKNOWN_TYPE, "unknown message type 99", "unknown type");
        /* Bad dtype, bad codec. */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
        h.has_dtype = true;
        h.dtype = (Psnet__Dtype) 3;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_DTYPE, "dtype 3", "bad dtype");
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
        h.has_codec = true;
        h.codec = PSNET__CODEC__CODEC_MASKED;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_DTYPE, "codec 1", "a masked codec on a PULL");
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
        h.has_codec = true;
        h.codec = (Psnet__Codec) 7;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_DTYPE, "codec 7", "an unknown codec");
        /* bf16 (--wire bf16): PUSH, PULL, PULL_REP and REPLICATE (a bf16 push
         * forwarded to a backup) only, no codec with it, frames of 2 bytes a
         * value. */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
        h.has_dtype = true;
        h.dtype = PSNET__DTYPE__DTYPE_BF16;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_DTYPE, "bf16 = 1 on a PUSH, PULL, PULL_REP or REPLICATE", "bf16 on a STATUS");
        {
                Psnet__Key bk = PSNET__KEY__INIT, *bkeys[1] = { &bk };
                size_t fb1[1] = { 8 };
                bk.tensor = 0, bk.chunk = 0, bk.len = 4;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
                h.has_dtype = h.has_codec = true;
                h.dtype = PSNET__DTYPE__DTYPE_BF16;
                h.codec = PSNET__CODEC__CODEC_INT8;
                h.n_keys = 1;
                h.keys = bkeys;
                send_hdr(&h, fb1, 1);
                expect_bad(PSNET__STATUS__STATUS_DTYPE, "dtype 1 not supported here", "bf16 with a codec");
                h.has_codec = false;
                h.codec = PSNET__CODEC__CODEC_RAW;
                fb1[0] = 16;
                send_hdr(&h, fb1, 1);
                expect_bad(PSNET__STATUS__STATUS_SIZE, "frame 1 has 16 bytes, key (0,0) declares 4 bf16 values = 8 bytes",
                           "a bf16 PUSH with f32 frames");
                fb1[0] = 8;
                h.has_seq = true;
                h.seq = 77;
                send_hdr(&h, fb1, 1);
                WireMsg m;
                int r = wire_recv(router, true, 0, &m);
                CHECK(r == 0 && m.hdr && m.hdr->dtype == PSNET__DTYPE__DTYPE_BF16 && m.nframes == 1 &&
                              zmq_msg_size(&m.frames[0]) == 8,
                      "a bf16 PUSH of 4 values in 8 bytes is taken (r=%d)", r);
                wire_msg_done(&m);

                Psnet__Replicate rep = PSNET__REPLICATE__INIT;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_REPLICATE);
                h.body_case = PSNET__HEADER__BODY_REPLICATE;
                h.replicate = &rep;
                h.has_dtype = h.has_seq = true;
                h.dtype = PSNET__DTYPE__DTYPE_BF16;
                h.seq = 78;
                h.n_keys = 1;
                h.keys = bkeys;
                fb1[0] = 16;
                send_hdr(&h, fb1, 1);
                expect_bad(PSNET__STATUS__STATUS_SIZE, "frame 1 has 16 bytes, key (0,0) declares 4 bf16 values = 8 bytes",
                           "a bf16 REPLICATE with f32 frames");
                fb1[0] = 8;
                send_hdr(&h, fb1, 1);
                r = wire_recv(router, true, 0, &m);
                CHECK(r == 0 && m.hdr && m.hdr->type == PSNET__MSG_TYPE__MSG_REPLICATE &&
                              m.hdr->dtype == PSNET__DTYPE__DTYPE_BF16 && zmq_msg_size(&m.frames[0]) == 8,
                      "a bf16 REPLICATE of 4 values in 8 bytes is taken (r=%d)", r);
                wire_msg_done(&m);
        }
        /* Shared memory: a 16-byte session on a PUSH, PULL or PULL_REP without
         * a codec; such a PUSH carries no frames. */
        {
                uint8_t tok[WIRE_SHM_TOKEN + 1] = { 0 };
                Psnet__Key sk = PSNET__KEY__INIT, *skeys[1] = { &sk };
                size_t fs[1] = { 16 };
                sk.tensor = 0, sk.chunk = 0, sk.len = 4;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
                h.n_keys = 1;
                h.keys = skeys;
                h.has_shm_session = h.has_shm_offset = true;
                h.shm_session.data = tok;
                h.shm_session.len = WIRE_SHM_TOKEN + 1;
                send_hdr(&h, NULL, 0);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "a shared-memory session (17 bytes)", "a 17-byte session");
                h.shm_session.len = WIRE_SHM_TOKEN;
                send_hdr(&h, fs, 1);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "PUSH in shared memory carries 1 payload frame",
                           "a PUSH in shared memory with a frame");
                h.has_codec = true;
                h.codec = PSNET__CODEC__CODEC_INT8;
                send_hdr(&h, NULL, 0);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "without a codec", "shared memory with a codec");
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS);
                h.has_shm_session = true;
                h.shm_session.data = tok;
                h.shm_session.len = WIRE_SHM_TOKEN;
                send_hdr(&h, NULL, 0);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "on a PUSH, PULL or PULL_REP", "shared memory on a STATUS");
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL_REP);
                h.n_keys = 1;
                h.keys = skeys;
                h.has_seq = h.has_shm_session = h.has_shm_offset = true;
                h.seq = 78;
                h.shm_session.data = tok;
                h.shm_session.len = WIRE_SHM_TOKEN;
                h.shm_offset = 64;
                send_hdr(&h, NULL, 0);
                WireMsg m;
                int r = wire_recv(router, true, 0, &m);
                CHECK(r == 0 && m.hdr && m.hdr->has_shm_session && m.hdr->shm_offset == 64 && m.nframes == 0,
                      "a PULL_REP in shared memory, without frames, is taken (r=%d)", r);
                wire_msg_done(&m);
        }
        /* Keys placed each on its own in shared memory: one place per key, on
         * a PUSH or PULL in shared memory only. */
        {
                Psnet__Key pk[2] = { PSNET__KEY__INIT, PSNET__KEY__INIT }, *pkeys[2] = { &pk[0], &pk[1] };
                uint8_t tok[WIRE_SHM_TOKEN] = { 9 };
                uint64_t places[2] = { 4096, 64 };
                pk[0].len = pk[1].len = 4;
                pk[1].chunk = 1;
                /* The last one is good: what = NULL. */
                static const struct {
                        Psnet__MsgType type;
                        bool session;
                        size_t nplaces;
                        const char *what;
                } cases[] = {
                        { PSNET__MSG_TYPE__MSG_PULL, true, 1, "one place for 2 keys" },
                        { PSNET__MSG_TYPE__MSG_PULL, false, 2, "places without a session" },
                        { PSNET__MSG_TYPE__MSG_PULL_REP, true, 2, "places on a PULL_REP" },
                        { PSNET__MSG_TYPE__MSG_PUSH, true, 2, NULL },
                };
                WireMsg m;
                int r = -1;
                for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                        wire_header_init(&h, cases[i].type);
                        h.n_keys = 2;
                        h.keys = pkeys;
                        h.has_seq = !cases[i].what;
                        h.seq = 80;
                        h.has_shm_session = h.has_shm_offset = cases[i].session;
                        h.shm_session.data = tok;
                        h.shm_session.len = WIRE_SHM_TOKEN;
                        h.shm_offset = places[0];
                        h.n_shm_keys = cases[i].nplaces;
                        h.shm_keys = places;
                        send_hdr(&h, NULL, 0);
                        if (cases[i].what)
                                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "places each of its", cases[i].what);
                        else
                                r = wire_recv(router, true, 0, &m);
                }
                CHECK(r == 0 && m.hdr && m.hdr->n_shm_keys == 2 && m.hdr->shm_keys[0] == 4096 &&
                              m.hdr->shm_keys[1] == 64 && m.nframes == 0,
                      "a PUSH in shared memory placing each key is taken (r=%d)", r);
                wire_msg_done(&m);
        }
        /* A PUSH in parts: part < parts, 2 to WIRE_MAX_PARTS parts, the map
         * epoch; on a PUSH only. */
        {
                Psnet__Key pk = PSNET__KEY__INIT, *pkeys[1] = { &pk };
                size_t fs[1] = { 16 };
                pk.tensor = 0, pk.chunk = 0, pk.len = 4;
                static const struct {
                        uint32_t part, parts;
                        bool epoch;
                        const char *what;
                } bad[] = {
                        { 2, 2, true, "part 2 of 2" },
                        { 0, 1, true, "one part" },
                        { 0, WIRE_MAX_PARTS + 1, true, "more parts than WIRE_MAX_PARTS" },
                        { 0, 2, false, "parts without the map epoch" },
                };
                for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
                        h.n_keys = 1;
                        h.keys = pkeys;
                        h.has_part = h.has_parts = true;
                        h.part = bad[i].part;
                        h.parts = bad[i].parts;
                        h.has_epoch = bad[i].epoch;
                        h.epoch = 3;
                        send_hdr(&h, fs, 1);
                        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "a PUSH, ROWS_PUSH or ROWS_COPY in parts names its part", bad[i].what);
                }
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
                h.n_keys = 1;
                h.keys = pkeys;
                h.has_part = h.has_parts = h.has_epoch = true;
                h.part = 0;
                h.parts = 2;
                send_hdr(&h, NULL, 0);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "a PUSH, ROWS_PUSH or ROWS_COPY in parts names its part", "parts on a PULL");
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
                h.n_keys = 1;
                h.keys = pkeys;
                h.has_seq = h.has_part = h.has_parts = h.has_epoch = true;
                h.seq = 79;
                h.part = WIRE_MAX_PARTS - 1;
                h.parts = WIRE_MAX_PARTS;
                h.epoch = 3;
                send_hdr(&h, fs, 1);
                WireMsg m;
                int r = wire_recv(router, true, 0, &m);
                CHECK(r == 0 && m.hdr && m.hdr->part == WIRE_MAX_PARTS - 1 && m.hdr->parts == WIRE_MAX_PARTS,
                      "the last of %u parts is taken (r=%d)", (unsigned) WIRE_MAX_PARTS, r);
                wire_msg_done(&m);
        }
        /* Unknown status value. */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ERROR);
        h.has_status = true;
        h.status = (Psnet__Status) 77;
        send_hdr(&h, NULL, 0);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "unknown status 77", "unknown status");

        /* PUSH with 2 keys and 1 frame: decoded header kept so seq can be echoed. */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
        h.has_seq = true;
        h.seq = 4242;
        k0.tensor = 0, k0.chunk = 0, k0.len = 4;
        k1.tensor = 0, k1.chunk = 1, k1.len = 2;
        h.n_keys = 2;
        h.keys = keys;
        fb[0] = 16;
        send_hdr(&h, fb, 1);
        {
                WireMsg m;
                int r = wire_recv(router, true, 0, &m);
                CHECK(r == -EBADMSG && m.status == PSNET__STATUS__STATUS_MALFORMED &&
                      strstr(m.reason, "PUSH declares 2 keys but carries 1 payload frame"),
                      "frames count mismatch (%s)", m.reason);
                CHECK(m.hdr && m.hdr->seq == 4242, "decoded header kept on a bad message (seq to echo)");
                CHECK(m.nframes == 1, "the frame that came is held (and freed by wire_msg_done)");
                wire_msg_done(&m);
                send_good(1);
                expect_good(1, "frame count mismatch");
        }
        /* PUSH with 2 keys and 3 frames. */
        fb[0] = 16, fb[1] = 8, fb[2] = 8;
        send_hdr(&h, fb, 3);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "carries 3 payload frames", "extra frame");
        /* Frame size mismatch. */
        k1.tensor = 1, k1.chunk = 0, k1.len = 1024;
        fb[0] = 16, fb[1] = 8192;
        send_hdr(&h, fb, 2);
        expect_bad(PSNET__STATUS__STATUS_SIZE, "frame 2 has 8192 bytes, key (1,0) declares 1024 f32 values = 4096 bytes",
                   "frame size mismatch");
        /* Key with len 0. */
        k1.len = 0;
        fb[1] = 0;
        send_hdr(&h, fb, 2);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "declares 0 floats", "len 0");
        /* Frames on a PULL. */
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
        k0.len = 4;
        h.n_keys = 1;
        h.keys = keys;
        fb[0] = 16;
        send_hdr(&h, fb, 1);
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "PULL carries 1 payload frame; it takes none", "frames on PULL");
        /* Frames on a control message. */
        {
                Psnet__Heartbeat hb = PSNET__HEARTBEAT__INIT;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_HEARTBEAT);
                h.body_case = PSNET__HEADER__BODY_HEARTBEAT;
                h.heartbeat = &hb;
                send_hdr(&h, fb, 1);
        }
        expect_bad(PSNET__STATUS__STATUS_MALFORMED, "HEARTBEAT carries 1 payload frame; it takes none", "frames on HEARTBEAT");

        /* Too many keys. */
        {
                size_t n = WIRE_MAX_KEYS + 1;
                Psnet__Key *ks = calloc(n, sizeof *ks), **kp = calloc(n, sizeof *kp);
                if (!ks || !kp)
                        die("calloc");
                for (size_t i = 0; i < n; i++) {
                        psnet__key__init(&ks[i]);
                        ks[i].tensor = 0;
                        ks[i].chunk = (uint32_t) i;
                        ks[i].len = 1;
                        kp[i] = &ks[i];
                }
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
                h.n_keys = n;
                h.keys = kp;
                send_hdr(&h, NULL, 0);
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "65537 keys, at most 65536", "too many keys");
                free(ks);
                free(kp);
        }
        /* Too many payload frames: the excess is drained, not left in the socket. */
        {
                uint8_t *buf;
                size_t len;
                float x = 0;
                int r = 0;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
                k0.len = 1;
                h.n_keys = 1;
                h.keys = keys;
                buf = pack(&h, &len);
                r |= zmq_send(dealer, buf, len, ZMQ_SNDMORE);
                for (size_t i = 0; i < WIRE_MAX_KEYS + 2; i++)
                        r |= zmq_send(dealer, &x, sizeof x, i + 1 < WIRE_MAX_KEYS + 2 ? ZMQ_SNDMORE : 0);
                free(buf);
                CHECK(r >= 0, "sent a message with 65538 frames");
                expect_bad(PSNET__STATUS__STATUS_MALFORMED, "65538 payload frames", "too many frames");
        }

        /* The DEALER side validates too. */
        {
                WireMsg m, d;
                int r;
                send_good(8);
                r = wire_recv(router, true, 0, &m);
                CHECK(r == 0, "request");
                {
                        zmq_msg_t id;
                        static const uint8_t junk[] = { 0x08 };
                        zmq_msg_init(&id);
                        zmq_msg_copy(&id, &m.route);
                        r = zmq_msg_send(&id, router, ZMQ_SNDMORE) < 0 ||
                            zmq_send(router, junk, sizeof junk, 0) < 0;
                        if (r)
                                zmq_msg_close(&id);
                }
                wire_msg_done(&m);
                r = wire_recv(dealer, false, 0, &d);
                CHECK(r == -EBADMSG && d.status == PSNET__STATUS__STATUS_MALFORMED && !d.has_route && !d.hdr,
                      "dealer refuses a truncated header (%d: %s)", r, d.reason);
                wire_msg_done(&d);
        }
}

/* A table's rows: a table named, ids of 8 bytes, and (but for a pull) as
 * many rows of 1..4096 floats; nothing else carries a table. */
static void test_rows(void) {
        Psnet__Header h;
        zmq_msg_t f[2];
        char reason[192];
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROWS_PUSH);
        h.has_table = true;
        zmq_msg_init_size(&f[0], 3 * 8);
        zmq_msg_init_size(&f[1], 3 * 16 * 4);
        int st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_PUSH of 3 ids and 3 rows of 16 floats (%s)", reason);
        h.has_part = h.has_parts = h.has_epoch = true;
        h.part = WIRE_MAX_ROWS_PARTS - 1;
        h.parts = WIRE_MAX_ROWS_PARTS;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "the last of %u parts of a ROWS_PUSH (%s)", WIRE_MAX_ROWS_PARTS, reason);
        h.parts = WIRE_MAX_ROWS_PARTS + 1;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "2 to 64 parts"),
              "a ROWS_PUSH in %u parts: %s", WIRE_MAX_ROWS_PARTS + 1, reason);
        h.type = PSNET__MSG_TYPE__MSG_ROWS_PULL;
        st = wire_validate(&h, f, 1, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "in parts"), "a ROWS_PULL in parts: %s", reason);
        h.has_part = h.has_parts = h.has_epoch = false;
        h.type = PSNET__MSG_TYPE__MSG_ROWS_PULL;
        st = wire_validate(&h, f, 1, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_PULL of 3 ids (%s)", reason);
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "carries 1 frame"),
              "a ROWS_PULL with rows: %s", reason);
        h.type = PSNET__MSG_TYPE__MSG_ROWS_PUSH;
        h.has_table = false;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "no table"), "no table: %s", reason);
        h.has_table = true;
        zmq_msg_close(&f[1]);
        zmq_msg_init_size(&f[1], 3 * 16 * 4 + 4);
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE && strstr(reason, "not 3 rows"), "rows that do not divide: %s",
              reason);
        zmq_msg_close(&f[1]);
        zmq_msg_init_size(&f[1], 3 * 4097 * 4);
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE, "rows of 4097 floats: %s", reason);
        zmq_msg_close(&f[0]);
        zmq_msg_init_size(&f[0], 3 * 8 + 1);
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE && strstr(reason, "ids frame has 25 bytes"), "ids of 25 bytes: %s",
              reason);
        /* Rows moved after a map change: whole rows, the last said; only a move says it. */
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        zmq_msg_init_size(&f[0], 3 * 8);
        zmq_msg_init_size(&f[1], 3 * 49 * 4);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROWS_MOVE);
        h.has_table = h.has_last = h.last = true;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_MOVE of 3 whole rows of 49 floats, the last (%s)", reason);
        h.has_part = h.has_parts = h.has_epoch = true;
        h.part = 0, h.parts = 2;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "in parts"), "a ROWS_MOVE in parts: %s", reason);
        h.has_part = h.has_parts = false;
        h.type = PSNET__MSG_TYPE__MSG_ROWS_COPY;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "only ROWS_MOVE does"),
              "a ROWS_COPY saying it is the last: %s", reason);
        /* A copy of a table with max-rows or ttl: each row's stamp, then the ids dropped. */
        h.has_last = h.last = false;
        zmq_msg_t b4[4] = { f[0], f[1] };
        zmq_msg_init_size(&b4[2], 3 * 8);
        zmq_msg_init_size(&b4[3], 2 * 8);
        st = wire_validate(&h, b4, 4, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_COPY of 3 rows, their stamps and 2 ids dropped (%s)", reason);
        st = wire_validate(&h, b4, 3, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "carries 2 frames"),
              "a ROWS_COPY of 3 frames: %s", reason);
        zmq_msg_t odd = b4[3];
        b4[3] = b4[2], b4[2] = odd; /* 2 stamps for 3 ids */
        st = wire_validate(&h, b4, 4, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE && strstr(reason, "stamps frame has 16 bytes"),
              "stamps that do not match the ids: %s", reason);
        b4[2] = b4[3], b4[3] = odd;
        zmq_msg_close(&b4[3]);
        zmq_msg_init_size(&b4[3], 13);
        st = wire_validate(&h, b4, 4, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE && strstr(reason, "dropped 13 bytes"), "ids dropped of 13 bytes: %s",
              reason);
        h.type = PSNET__MSG_TYPE__MSG_ROWS_MOVE;
        st = wire_validate(&h, b4, 4, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED, "a ROWS_MOVE of 4 frames: %s", reason);
        h.type = PSNET__MSG_TYPE__MSG_ROWS_COPY;
        zmq_msg_close(&b4[2]);
        zmq_msg_close(&b4[3]);
        /* Ids without rows: a move's answer to a ROWS_WANT for ids its sender lacks; a copy's are refused. */
        zmq_msg_t none;
        zmq_msg_init(&none);
        zmq_msg_t absent[2] = { f[0], none };
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE, "a ROWS_COPY of 3 ids without rows: %s", reason);
        h.type = PSNET__MSG_TYPE__MSG_ROWS_MOVE;
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_MOVE of 3 ids without rows (not held by its sender) (%s)", reason);
        /* What a worker's pushes left at a sender (ASP/SSP): ids, an empty frame, its done. */
        h.has_origin = h.has_done = true;
        h.origin = 7, h.done = 4;
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_MOVE naming worker 7, its 3 ids and done 4 (%s)", reason);
        h.has_done = false;
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "does not say a worker's last clock done"),
              "a ROWS_MOVE naming a worker without its done: %s", reason);
        h.has_done = true, h.done = -2;
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "-1 or more"), "done -2: %s", reason);
        h.done = 4;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "an empty frame"),
              "a ROWS_MOVE naming a worker with rows: %s", reason);
        h.has_last = h.last = true;
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED, "a ROWS_MOVE naming a worker, the last: %s", reason);
        h.has_last = h.last = false;
        h.has_origin = false;
        st = wire_validate(&h, absent, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "says a worker's last clock done"),
              "a done without a worker: %s", reason);
        h.type = PSNET__MSG_TYPE__MSG_ROWS_PUSH;
        h.has_done = false, h.has_origin = true;
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "only ROWS_COPY and ROWS_MOVE do"),
              "a ROWS_PUSH naming a worker: %s", reason);
        h.has_origin = false;
        h.type = PSNET__MSG_TYPE__MSG_ROWS_WANT;
        st = wire_validate(&h, f, 1, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK, "a ROWS_WANT of 3 ids (%s)", reason);
        st = wire_validate(&h, f, 2, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "carries 1 frame"), "a ROWS_WANT with rows: %s",
              reason);
        zmq_msg_close(&none);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
        h.has_table = true;
        st = wire_validate(&h, NULL, 0, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED && strstr(reason, "names a table"), "a PUSH naming a table: %s",
              reason);
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
}

static void test_misc(void) {
        WireMsg m;
        Psnet__Header h;
        Psnet__Key k = PSNET__KEY__INIT, *keys[1] = { &k };
        zmq_msg_t f[1];
        char reason[192];
        int r, st;

        r = wire_recv(router, true, ZMQ_DONTWAIT, &m);
        CHECK(r == -EAGAIN, "nothing waiting with ZMQ_DONTWAIT: -EAGAIN (%d)", r);
        wire_msg_done(&m);

        st = wire_validate(NULL, NULL, 0, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_MALFORMED, "wire_validate(NULL) is malformed");

        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL_REP);
        CHECK(h.version == WIRE_VERSION && h.type == PSNET__MSG_TYPE__MSG_PULL_REP, "wire_header_init");
        k.tensor = 3, k.chunk = 7, k.len = 2;
        h.n_keys = 1;
        h.keys = keys;
        zmq_msg_init_size(&f[0], 8);
        st = wire_validate(&h, f, 1, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_OK && reason[0] == '\0', "wire_validate accepts a good PULL_REP");
        k.len = 3;
        st = wire_validate(&h, f, 1, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_SIZE &&
              strcmp(reason, "frame 1 has 8 bytes, key (3,7) declares 3 f32 values = 12 bytes") == 0,
              "wire_validate size reason: %s", reason);
        zmq_msg_close(&f[0]);

        /* wire_send consumes its frames even when it fails. */
        {
                Psnet__Header big;
                Psnet__Key bk = PSNET__KEY__INIT, *bkeys[1] = { &bk };
                char *reason_big = malloc(WIRE_MAX_HEADER + 16);
                float *buf = malloc(16);
                zmq_msg_t fr;
                if (!reason_big || !buf)
                        die("malloc");
                memset(reason_big, 'x', WIRE_MAX_HEADER + 15);
                reason_big[WIRE_MAX_HEADER + 15] = '\0';
                wire_header_init(&big, PSNET__MSG_TYPE__MSG_PUSH);
                bk.len = 4;
                big.n_keys = 1;
                big.keys = bkeys;
                big.reason = reason_big;
                nfreed = 0;
                zmq_msg_init_data(&fr, buf, 16, free_cb, NULL);
                r = wire_send(dealer, NULL, &big, &fr, 1);
                CHECK(r == -EMSGSIZE, "oversized header refused by wire_send (%d)", r);
                CHECK(nfreed == 1, "its frame was released");
                free(reason_big);
        }

        {
                _Alignas(8) char raw[16];
                zmq_msg_t a, b;
                zmq_msg_init_data(&a, raw + 1, 8, NULL, NULL);
                zmq_msg_init_data(&b, raw + 4, 8, NULL, NULL);
                CHECK(wire_frame_f32(&a) == NULL, "wire_frame_f32 refuses misaligned data");
                CHECK(wire_frame_f32(&b) == (const float *) (raw + 4), "wire_frame_f32 passes aligned data");
                zmq_msg_close(&a);
                zmq_msg_close(&b);
        }
}

int main(void) {
        setup();
        test_push_roundtrip();
        test_control_roundtrip();
        test_bodies();
        test_status_table();
        test_error_reply();
        test_malformed();
        test_misc();
        test_rows();
        teardown();
        return tap_done();
}
