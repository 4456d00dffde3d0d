/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-fixture.h. */
#include <stdlib.h>
#include <string.h>
#include "psd-fixture.h"
#include "psd-optim.h"
#include "tap.h"

void on_ack(void *userdata, PushReq *req) {
        Acks *k = userdata;
        if (k->n >= MAX_ACKS) {
                k->overflow++;
                return;
        }
        Ack *a = &k->a[k->n++];
        a->seq = req->seq;
        a->worker = req->worker;
        a->clock = req->clock;
        a->status = req->status;
        size_t rs = zmq_msg_size(&req->route);
        if (rs >= sizeof a->route)
                rs = sizeof a->route - 1;
        memcpy(a->route, zmq_msg_data(&req->route), rs);
        a->route[rs] = '\0';
}

/* Number of acks for seq. */
size_t acks_count(const Acks *k, uint64_t seq) {
        size_t n = 0;
        for (size_t i = 0; i < k->n; i++)
                n += k->a[i].seq == seq;
        return n;
}

/* Status of the (first) ack for seq, or -1 if none. */
int acks_status(const Acks *k, uint64_t seq) {
        for (size_t i = 0; i < k->n; i++)
                if (k->a[i].seq == seq)
                        return k->a[i].status;
        return -1;
}

void make_job(Job *job, uint32_t id, ConsistencyMode mode, const char *optim) {
        char err[160] = "";
        job_defaults(job);
        job->id = id;
        job->chunk_floats = CHUNK_FLOATS;
        int r = job_set_model(job, MODEL);
        if (r == 0)
                r = job_set_optim(job, optim);
        job->mode = mode;
        job->lr_scaling = LR_SCALING_NONE; /* test_lr_scaling turns it on */
        job->optim.weight_decay = 0.01f;
        if (strcmp(optim, "adam") == 0)
                job->optim.lr = 0.01f;
        if (r == 0)
                r = job_validate(job, err, sizeof err);
        if (r != 0)
                CHECK(false, "fixture job validates (%s)", err);
}

ShardMap *make_map(uint64_t epoch, const uint32_t *ids, size_t n, const Job *job) {
        ShardDesc d[4];
        char ep[4][40];
        ShardMap *m = NULL;
        for (size_t i = 0; i < n && i < 4; i++) {
                snprintf(ep[i], sizeof ep[i], "ipc:///tmp/psnet-test-%u.sock", ids[i]);
                d[i].id = ids[i];
                d[i].endpoint = ep[i];
        }
        if (shardmap_place(epoch, d, n, job, &m) < 0)
                CHECK(false, "fixture map builds");
        return m;
}

Gate *shard_free(Gate *g) {
        if (!g)
                return NULL;
        Store *s = gate_store(g);
        gate_free(g);
        store_free(s);
        return NULL;
}

Gate *open_store(uint32_t id, const Job *job, const ShardMap *map, Acks *acks) {
        const GateHooks gh = { .ack = on_ack, .ud = acks };
        return open_shard(id, job, map, &gh);
}

Gate *open_shard(uint32_t id, const Job *job, const ShardMap *map, const GateHooks *gh) {
        Store *s = NULL;
        Gate *g = NULL;
        const StoreConf sc = { .shard_id = id };
        if (store_new(&sc, &s) < 0)
                return NULL;
        if (gate_new(s, gh, &g) < 0) {
                store_free(s);
                return NULL;
        }
        if (gate_configure(g, job, map) < 0)
                return shard_free(g);
        return g;
}

/* A store that owns every key (a one-shard map) with the given membership. */
Gate *open_solo(const Job *job, Acks *acks, const uint32_t *members, size_t n) {
        uint32_t one = 1;
        ShardMap *map = make_map(1, &one, 1, job);
        Gate *s = map ? open_store(1, job, map, acks) : NULL;
        shardmap_free(map);
        if (s && gate_set_members(s, members, n, 1) < 0)
                s = shard_free(s);
        if (!s)
                CHECK(false, "fixture store opens");
        return s;
}

Chunk *key(Gate *g, uint32_t t, uint32_t k) {
        return store_key(gate_store(g), t, k);
}

Chunk *store_key(Store *s, uint32_t t, uint32_t k) {
        int st = -1;
        Chunk *c = store_lookup(s, t, k, job_chunk_len(&s->job, t, k), &st);
        if (!c)
                CHECK(false, "fixture key (%u,%u) is owned (status %d)", t, k, st);
        return c;
}

/* 64-byte aligned, zeroed floats, as the store's own buffers are. */
float *fbuf(size_t n) {
        size_t bytes = ((n ? n : 1) * sizeof(float) + 63) / 64 * 64;
        float *p = aligned_alloc(64, bytes);
        if (p)
                memset(p, 0, bytes);
        return p;
}

/* A route frame as a ROUTER socket would give it: a short identity. */
void route_msg(zmq_msg_t *m, uint32_t worker) {
        char id[16];
        int n = snprintf(id, sizeof id, "w%u", worker);
        zmq_msg_init_size(m, (size_t) n);
        memcpy(zmq_msg_data(m), id, (size_t) n);
}

PushReq *req_new(uint32_t worker, int64_t clock, uint64_t seq) {
        zmq_msg_t route;
        PushReq *req = NULL;
        route_msg(&route, worker);
        if (pushreq_new(&route, seq, worker, clock, &req) < 0)
                CHECK(false, "fixture pushreq_new");
        zmq_msg_close(&route);
        return req;
}

/* Offers g (c->len floats) for c in req, as psd does with a received frame. */
int req_push(Gate *s, PushReq *req, Chunk *c, const float *g) {
        zmq_msg_t grad;
        zmq_msg_init_size(&grad, (size_t) c->len * sizeof(float));
        memcpy(zmq_msg_data(&grad), g, (size_t) c->len * sizeof(float));
        int r = gate_push(s, c, req, &grad);
        zmq_msg_close(&grad); /* empty if the store took it */
        return r;
}

/* A whole one-key PUSH request: new, push, the reader's settle. */
int push1(Gate *s, Chunk *c, uint32_t worker, int64_t clock, uint64_t seq,
                 const float *g) {
        PushReq *req = req_new(worker, clock, seq);
        if (!req)
                return -1;
        int r = req_push(s, req, c, g);
        pushreq_settle(s, req, ST_OK);
        return r;
}

void ref_init(Ref *r, const Job *job, uint32_t t, uint32_t k) {
        r->job = job;
        r->len = job_chunk_len(job, t, k);
        r->w = fbuf(r->len);
        r->state = fbuf(r->len * 2);
        r->steps = 0;
        job_init_chunk(job, t, k, r->w);
}

void ref_step(Ref *r, const float *g) {
        float *gb = fbuf(r->len);
        memcpy(gb, g, r->len * sizeof(float));
        optim_apply(&r->job->optim, ++r->steps, r->w, gb, r->state, r->len);
        free(gb);
}

void ref_done(Ref *r) {
        free(r->w);
        free(r->state);
}

bool same(const float *a, const float *b, uint32_t n) {
        return memcmp(a, b, (size_t) n * sizeof(float)) == 0;
}

/* An ordinary gradient of worker w at clock c. */
void grad_fill(float *g, uint32_t len, uint32_t w, int64_t c) {
        for (uint32_t j = 0; j < len; j++)
                g[j] = (float) ((int) ((w * 7 + (uint32_t) c * 13 + j * 3) % 11) - 5) * 0.037f +
                       (float) w * 0.001f;
}
