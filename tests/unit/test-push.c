/* SPDX-License-Identifier: Apache-2.0 */
/* The gate fed Pushes directly (psd-gate.c's gate_push_request, and
 * psd-push.c's decoding of what a PUSH came as), without sockets: a push of
 * f32 frames and the same values read where they lie (shared memory) give
 * the same weights, bit for bit, and those of the reference optimizer step
 * on the mean (BSP, two members); a stranger's push is refused before its
 * values are decoded; a NaN refuses the push whole; a decoder's refusal and
 * a backup's are the push's; the backups get the frames; a bf16 push is
 * applied as its widened values; a top-k push as
 * its dense decoding; a training job refuses a federated codec. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "compress.h"
#include "psd-fixture.h"
#include "psd-push.h"
#include "tap.h"

#define NKEYS 2

typedef struct Fwd {
        int calls, status;
        bool bf16;
        size_t bytes;
} Fwd;

static int on_forward(void *ud, PushReq *req, const Psnet__Header *h, const zmq_msg_t *frames, bool bf16) {
        Acks *a = ud;
        Fwd *f = (Fwd *) (a + 1);
        (void) req;
        f->calls++;
        f->bf16 = bf16;
        f->bytes = 0;
        for (size_t i = 0; i < h->n_keys; i++)
                f->bytes += zmq_msg_size((zmq_msg_t *) &frames[i]);
        return f->status;
}

/* Acks and the forward hook's record, side by side (the hooks share one ud). */
typedef struct Rec {
        Acks acks;
        Fwd fwd;
} Rec;

typedef struct Hdr {
        Psnet__Header h;
        Psnet__Key k[NKEYS], *kp[NKEYS];
} Hdr;

static void hdr(Hdr *x, const Job *job, uint32_t worker, int64_t clock, uint64_t seq) {
        wire_header_init(&x->h, PSNET__MSG_TYPE__MSG_PUSH);
        for (uint32_t i = 0; i < NKEYS; i++) {
                psnet__key__init(&x->k[i]);
                x->k[i].tensor = 0;
                x->k[i].chunk = i;
                x->k[i].len = job_chunk_len(job, 0, i);
                x->kp[i] = &x->k[i];
        }
        x->h.n_keys = NKEYS;
        x->h.keys = x->kp;
        x->h.has_sender = x->h.has_clock = x->h.has_seq = x->h.has_job = true;
        x->h.job = job->id;
        x->h.sender = worker;
        x->h.clock = clock;
        x->h.seq = seq;
}

static void frames_of(zmq_msg_t *f, float *const *v, uint32_t len) {
        for (size_t i = 0; i < NKEYS; i++) {
                zmq_msg_init_size(&f[i], len * sizeof(float));
                memcpy(zmq_msg_data(&f[i]), v[i], len * sizeof(float));
        }
}

static void frames_close(zmq_msg_t *f) {
        for (size_t i = 0; i < NKEYS; i++)
                zmq_msg_close(&f[i]);
}

static int decodes;
static int count_decode(Push *p, void *ud, char *reason, size_t n) {
        (void) p, (void) ud, (void) reason, (void) n;
        decodes++;
        return PSNET__STATUS__STATUS_OK;
}
static int refuse_decode(Push *p, void *ud, char *reason, size_t n) {
        (void) p, (void) ud;
        snprintf(reason, n, "no");
        return PSNET__STATUS__STATUS_DTYPE;
}

/* Worker w's push of clock 0 on keys (0,0) and (0,1) of g: frames (in_place
 * false) or read where they lie. The status of gate_push_request. */
static int push(Gate *g, const Job *job, uint32_t w, float *const *v, bool in_place, char *reason) {
        Hdr x;
        zmq_msg_t route, f[NKEYS];
        hdr(&x, job, w, 0, 10 + w);
        route_msg(&route, w);
        Chunk *c[NKEYS] = { key(g, 0, 0), key(g, 0, 1) };
        uint8_t *at[NKEYS] = { (uint8_t *) v[0], (uint8_t *) v[1] };
        Push p = { .h = &x.h, .route = &route, .chunks = c, .decode = count_decode };
        if (in_place)
                p.at = at;
        else {
                frames_of(f, v, job_chunk_len(job, 0, 0));
                p.frames = f;
        }
        int st = gate_push_request(g, &p, reason, 192);
        if (!in_place)
                frames_close(f);
        zmq_msg_close(&route);
        return st;
}

/* Worker 1's push of clock on g, in f32 frames (its status). */
static int twin_push(Gate *g, const Job *job, float *const *v, int64_t clock) {
        Hdr x;
        zmq_msg_t route, f[NKEYS];
        char reason[192];
        hdr(&x, job, 1, clock, 100 + (uint64_t) clock);
        route_msg(&route, 1);
        Chunk *c[NKEYS] = { key(g, 0, 0), key(g, 0, 1) };
        frames_of(f, v, job_chunk_len(job, 0, 0));
        Push p = { .h = &x.h, .route = &route, .chunks = c, .frames = f };
        int st = gate_push_request(g, &p, reason, sizeof reason);
        frames_close(f);
        zmq_msg_close(&route);
        return st;
}

static void test_frames_and_in_place(void) {
        Job job;
        make_job(&job, 1, MODE_BSP, "sgd");
        uint32_t members[] = { 1, 2 }, len = job_chunk_len(&job, 0, 0);
        float *a[NKEYS] = { fbuf(len), fbuf(len) }, *b[NKEYS] = { fbuf(len), fbuf(len) };
        for (size_t i = 0; i < NKEYS; i++) {
                grad_fill(a[i], len, 1, (int64_t) i);
                grad_fill(b[i], len, 2, (int64_t) i);
        }
        Gate *gs[2];
        Acks acks[2];
        memset(acks, 0, sizeof acks);
        char reason[192];
        int st[4];
        decodes = 0;
        for (int k = 0; k < 2; k++) {
                gs[k] = open_solo(&job, &acks[k], members, 2);
                if (!gs[k])
                        return;
                st[2 * k] = push(gs[k], &job, 1, a, k == 1, reason);
                st[2 * k + 1] = push(gs[k], &job, 2, b, k == 1, reason);
        }
        CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0 && decodes == 4, "four pushes taken, each decoded");
        CHECK(acks[0].n == 2 && acks[1].n == 2 && acks_status(&acks[0], 11) == ST_OK && acks_status(&acks[1], 12) == ST_OK,
              "and acknowledged once both members pushed (BSP)");
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        float *mean = fbuf(len);
        for (uint32_t j = 0; j < len; j++)
                mean[j] = (a[0][j] + b[0][j]) * 0.5f;
        ref_step(&ref, mean);
        Chunk *c0 = key(gs[0], 0, 0), *c1 = key(gs[1], 0, 0);
        CHECK(same(c0->val->data, ref.w, len), "frames: the reference step on the mean");
        CHECK(same(c1->val->data, c0->val->data, len) && same(key(gs[1], 0, 1)->val->data, key(gs[0], 0, 1)->val->data,
                                                             len),
              "read in place: the same weights, bit for bit");
        ref_done(&ref);
        free(mean);
        for (int k = 0; k < 2; k++)
                shard_free(gs[k]);
        for (size_t i = 0; i < NKEYS; i++) {
                free(a[i]);
                free(b[i]);
        }
}

static void test_refusals(void) {
        Job job;
        make_job(&job, 1, MODE_ASP, "sgd");
        uint32_t members[] = { 1 }, len = job_chunk_len(&job, 0, 0);
        Rec rec = { 0 };
        const GateHooks gh = { .ack = on_ack, .forward = on_forward, .ud = &rec };
        uint32_t one = 1;
        ShardMap *map = make_map(1, &one, 1, &job);
        Gate *g = map ? open_shard(1, &job, map, &gh) : NULL;
        shardmap_free(map);
        if (!g || gate_set_members(g, members, 1, 1) < 0)
                return (void) CHECK(false, "a shard with a forward hook");
        float *v[NKEYS] = { fbuf(len), fbuf(len) };
        grad_fill(v[0], len, 1, 0);
        grad_fill(v[1], len, 1, 1);
        char reason[192] = "";
        float before[MAXLEN];
        memcpy(before, key(g, 0, 0)->val->data, len * sizeof(float));

        decodes = 0;
        int st = push(g, &job, 7, v, false, reason);
        CHECK(st == ST_STALE && decodes == 0 && strstr(reason, "not a member"),
              "a stranger's push: STALE, nothing decoded for it (%s)", reason);
        v[1][3] = NAN;
        st = push(g, &job, 1, v, false, reason);
        CHECK(st == PSNET__STATUS__STATUS_NOT_FINITE && same(key(g, 0, 0)->val->data, before, len) &&
                      rec.fwd.calls == 0,
              "a NaN in its second key: NOT_FINITE, nothing of it applied or forwarded (%s)", reason);
        st = push(g, &job, 1, v, true, reason);
        CHECK(st == PSNET__STATUS__STATUS_NOT_FINITE, "read in place too");
        v[1][3] = 0.5f;

        Hdr x;
        zmq_msg_t route, f[NKEYS];
        Chunk *c[NKEYS] = { key(g, 0, 0), key(g, 0, 1) };
        hdr(&x, &job, 1, 0, 5);
        route_msg(&route, 1);
        frames_of(f, v, len);
        Push p = { .h = &x.h, .route = &route, .chunks = c, .frames = f, .decode = refuse_decode };
        st = gate_push_request(g, &p, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_DTYPE && strcmp(reason, "no") == 0 && rec.acks.n == 0,
              "a decoder's refusal is the push's");
        rec.fwd.status = PSNET__STATUS__STATUS_UNAVAILABLE;
        p.decode = NULL;
        st = gate_push_request(g, &p, reason, sizeof reason);
        CHECK(st == ST_OK && rec.fwd.calls == 1 && rec.fwd.bytes == 2 * len * sizeof(float) && !rec.fwd.bf16 &&
                      acks_status(&rec.acks, 5) == PSNET__STATUS__STATUS_UNAVAILABLE &&
                      same(key(g, 0, 0)->val->data, before, len),
              "a backup that cannot take it: the push is answered UNAVAILABLE, not applied here");
        rec.fwd.status = ST_OK;
        x.h.seq = 6;
        st = gate_push_request(g, &p, reason, sizeof reason);
        CHECK(st == ST_OK && rec.fwd.calls == 2 && acks_status(&rec.acks, 6) == ST_OK &&
                      !same(key(g, 0, 0)->val->data, before, len),
              "forwarded and applied (ASP)");
        frames_close(f);

        /* Through psd-push.c: a bf16 push (its bf16 frames to the backups), a top-k one, a federated codec. */
        memcpy(before, key(g, 0, 0)->val->data, len * sizeof(float));
        uint8_t b16[NKEYS][MAXLEN * 2];
        for (size_t i = 0; i < NKEYS; i++) {
                bf16_encode(v[i], len, b16[i]);
                zmq_msg_init_size(&f[i], len * 2);
                memcpy(zmq_msg_data(&f[i]), b16[i], len * 2);
        }
        hdr(&x, &job, 1, 1, 7);
        x.h.has_dtype = true;
        x.h.dtype = PSNET__DTYPE__DTYPE_BF16;
        WireMsg m = { .hdr = &x.h, .frames = f, .nframes = NKEYS };
        zmq_msg_init(&m.route);
        zmq_msg_copy(&m.route, &route);
        PushSource src;
        push_from_message(&p, &src, gate_store(g), NULL, &m, c, NULL);
        st = gate_push_request(g, &p, reason, sizeof reason);
        push_source_done(&src);
        /* This shard has no backups: nothing keeps the bf16 frames for them. */
        CHECK(st == ST_OK && rec.fwd.calls == 3 && !rec.fwd.bf16 && rec.fwd.bytes == 2 * len * sizeof(float) &&
                      acks_status(&rec.acks, 7) == ST_OK && x.h.dtype == PSNET__DTYPE__DTYPE_F32 && !p.forward_bf16,
              "bf16: taken, widened to f32 frames (%zu bytes to the forward hook)", rec.fwd.bytes);
        /* A twin shard given the widened values as f32 frames, the same pushes before. */
        float *wide[NKEYS] = { fbuf(len), fbuf(len) };
        bf16_decode(b16[0], len, wide[0]);
        bf16_decode(b16[1], len, wide[1]);
        Acks tacks = { 0 };
        Gate *twin = open_solo(&job, &tacks, members, 1);
        int t1 = twin ? push(twin, &job, 1, v, false, reason) : -1;
        if (twin)
                twin_push(twin, &job, wide, 1);
        CHECK(twin && t1 == ST_OK && same(key(g, 0, 0)->val->data, key(twin, 0, 0)->val->data, len) &&
                      same(key(g, 0, 1)->val->data, key(twin, 0, 1)->val->data, len),
              "and applied as its widened values are (a twin shard given them in f32)");
        shard_free(twin);
        free(wide[0]);
        free(wide[1]);
        frames_close(f);

        /* top-k without --sparsify, and a federated codec: refused. */
        hdr(&x, &job, 1, 2, 8);
        x.h.has_codec = true;
        x.h.codec = PSNET__CODEC__CODEC_INT8;
        m.hdr = &x.h;
        frames_of(f, v, len);
        push_from_message(&p, &src, gate_store(g), NULL, &m, c, NULL);
        st = gate_push_request(g, &p, reason, sizeof reason);
        push_source_done(&src);
        CHECK(st == ST_INVALID && strstr(reason, "codec int8 on a push of a training job"),
              "a federated codec on a training job's push: INVALID (%s)", reason);
        x.h.codec = PSNET__CODEC__CODEC_TOPK;
        push_from_message(&p, &src, gate_store(g), NULL, &m, c, NULL);
        st = gate_push_request(g, &p, reason, sizeof reason);
        push_source_done(&src);
        CHECK(st == ST_INVALID && strstr(reason, "--sparsify"), "top-k without --sparsify: INVALID (%s)", reason);
        frames_close(f);
        zmq_msg_close(&m.route);
        zmq_msg_close(&route);
        free(v[0]);
        free(v[1]);
        shard_free(g);
}

/* A --sparsify job: a top-k push is applied as its dense decoding. */
static void test_topk(void) {
        Job job;
        make_job(&job, 1, MODE_ASP, "sgd");
        job.sparsify = 0.25f;
        uint32_t members[] = { 1 }, len = job_chunk_len(&job, 0, 0);
        Acks acks = { 0 };
        Gate *g = open_solo(&job, &acks, members, 1);
        if (!g)
                return;
        Gate *h2 = open_solo(&job, &acks, members, 1);
        float *v[NKEYS] = { fbuf(len), fbuf(len) }, *dense[NKEYS] = { fbuf(len), fbuf(len) }, scratch[MAXLEN];
        uint8_t enc[NKEYS][MAXLEN * 8];
        size_t size[NKEYS];
        for (size_t i = 0; i < NKEYS; i++) {
                grad_fill(v[i], len, 1, (int64_t) i);
                size[i] = compress_encode(COMPRESS_TOPK, v[i], len, job.sparsify, NULL, enc[i], scratch);
                compress_decode(COMPRESS_TOPK, enc[i], size[i], len, dense[i]);
        }
        Hdr x;
        hdr(&x, &job, 1, 0, 9);
        x.h.has_codec = true;
        x.h.codec = PSNET__CODEC__CODEC_TOPK;
        zmq_msg_t f[NKEYS], route;
        for (size_t i = 0; i < NKEYS; i++) {
                zmq_msg_init_size(&f[i], size[i]);
                memcpy(zmq_msg_data(&f[i]), enc[i], size[i]);
        }
        route_msg(&route, 1);
        WireMsg m = { .hdr = &x.h, .frames = f, .nframes = NKEYS };
        zmq_msg_init(&m.route);
        zmq_msg_copy(&m.route, &route);
        Chunk *c[NKEYS] = { key(g, 0, 0), key(g, 0, 1) };
        Push p;
        PushSource src;
        char reason[192] = "";
        push_from_message(&p, &src, gate_store(g), NULL, &m, c, NULL);
        int st = gate_push_request(g, &p, reason, sizeof reason);
        push_source_done(&src);
        /* The same dense values pushed as f32 frames on a twin shard. */
        int st2 = h2 ? push(h2, &job, 1, dense, false, reason) : -1;
        CHECK(st == ST_OK && st2 == ST_OK && h2 && same(key(g, 0, 0)->val->data, key(h2, 0, 0)->val->data, len) &&
                      same(key(g, 0, 1)->val->data, key(h2, 0, 1)->val->data, len),
              "top-k: applied as its dense decoding, as the same values in f32 frames are (%s)", reason);
        frames_close(f);
        zmq_msg_close(&m.route);
        zmq_msg_close(&route);
        for (size_t i = 0; i < NKEYS; i++) {
                free(v[i]);
                free(dense[i]);
        }
        shard_free(g);
        shard_free(h2);
}

int main(void) {
        test_frames_and_in_place();
        test_refusals();
        test_topk();
        return tap_done();
}
