/* Unit tests for ps/psd/psd-store.c: which keys a shard keeps under a map, how a
 * key is looked up, the BSP gate (deterministic aggregation whatever the
 * arrival order, dedupe by (worker, chunk, clock), stale and non-member
 * pushes, membership changes closing clocks), ASP (apply on arrival, scaled by
 * the membership), copy-on-write value buffers behind zero-copy pull replies,
 * and the once-per-request acknowledgement of multi-key pushes.
 *
 * Every expected value is computed here, independently of the store: initial
 * values with job_init_chunk, sums by hand in ascending worker order, and the
 * update by optim_apply on a private copy of the chunk and its state. The
 * messages are real zmq_msg_t (no context is needed for messages), so running
 * this under ASan also checks that parked frames and snapshots are freed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "job.h"
#include "psd-optim.h"
#include "psd-store.h"
#include "shardmap.h"
#include "tap.h"

#define ST_OK PSNET__STATUS__STATUS_OK
#define ST_UNKNOWN_KEY PSNET__STATUS__STATUS_UNKNOWN_KEY
#define ST_MOVED PSNET__STATUS__STATUS_MOVED
#define ST_SIZE PSNET__STATUS__STATUS_SIZE
#define ST_NO_JOB PSNET__STATUS__STATUS_NO_JOB
#define ST_DUPLICATE PSNET__STATUS__STATUS_DUPLICATE
#define ST_STALE PSNET__STATUS__STATUS_STALE
#define ST_INVALID PSNET__STATUS__STATUS_INVALID
#define ST_SHUTTING_DOWN PSNET__STATUS__STATUS_SHUTTING_DOWN

/* chunk_floats 16 on mlp:20-10-5 gives W0 [10x20] = 200 floats in 13 chunks
 * (the last one 8 floats), b0 10 floats, W1 [5x10] = 50 floats in 4 chunks (the
 * last one 2 floats), b1 5 floats: 19 keys, full chunks and short tails (the
 * short ones are small enough for ZeroMQ to keep them inside the zmq_msg_t). */
#define CHUNK_FLOATS 16
#define MODEL "mlp:20-10-5"
#define MAXLEN CHUNK_FLOATS

/* --- acknowledgements ----------------------------------------------------------- */

#define MAX_ACKS 256

typedef struct Ack {
        uint64_t seq;
        uint32_t worker;
        int64_t clock;
        int status;
        char route[16];
} Ack;

typedef struct Acks {
        Ack a[MAX_ACKS];
        size_t n, overflow;
} Acks;

static void on_ack(void *userdata, PushReq *req) {
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
static size_t acks_count(const Acks *k, uint64_t seq) {
        size_t n = 0;
        for (size_t i = 0; i < k->n; i++)
                n += k->a[i].seq == seq;
        return n;
}

/* Status of the (first) ack for seq, or -1 if none. */
static int acks_status(const Acks *k, uint64_t seq) {
        for (size_t i = 0; i < k->n; i++)
                if (k->a[i].seq == seq)
                        return k->a[i].status;
        return -1;
}

/* --- fixtures --------------------------------------------------------------------- */

static void make_job(Job *job, uint32_t id, ConsistencyMode mode, const char *optim) {
        char err[160] = "";
        job_defaults(job);
        job->id = id;
        job->chunk_floats = CHUNK_FLOATS;
        int r = job_set_model(job, MODEL);
        if (r == 0)
                r = job_set_optim(job, optim);
        job->mode = mode;
        job->optim.weight_decay = 0.01f;
        if (strcmp(optim, "adam") == 0)
                job->optim.lr = 0.01f;
        if (r == 0)
                r = job_validate(job, err, sizeof err);
        if (r != 0)
                CHECK(false, "fixture job validates (%s)", err);
}

static ShardMap *make_map(uint64_t epoch, const uint32_t *ids, size_t n) {
        ShardDesc d[4];
        char ep[4][40];
        ShardMap *m = NULL;
        for (size_t i = 0; i < n && i < 4; i++) {
                snprintf(ep[i], sizeof ep[i], "ipc:///tmp/psnet-test-%u.sock", ids[i]);
                d[i].id = ids[i];
                d[i].endpoint = ep[i];
        }
        if (shardmap_new(epoch, SHARDMAP_DEFAULT_VNODES, d, n, &m) < 0)
                CHECK(false, "fixture map builds");
        return m;
}

static Store *open_store(uint32_t id, const Job *job, const ShardMap *map, Acks *acks) {
        Store *s = NULL;
        if (store_new(id, on_ack, acks, &s) < 0)
                return NULL;
        if (store_configure(s, job, map) < 0)
                return store_free(s);
        return s;
}

/* A store that owns every key (a one-shard map) with the given membership. */
static Store *open_solo(const Job *job, Acks *acks, const uint32_t *members, size_t n) {
        uint32_t one = 1;
        ShardMap *map = make_map(1, &one, 1);
        Store *s = map ? open_store(1, job, map, acks) : NULL;
        shardmap_free(map);
        if (s && store_set_members(s, members, n, 1) < 0)
                s = store_free(s);
        if (!s)
                CHECK(false, "fixture store opens");
        return s;
}

static Chunk *key(Store *s, uint32_t t, uint32_t k) {
        int st = -1;
        Chunk *c = store_lookup(s, t, k, job_chunk_len(&s->job, t, k), &st);
        if (!c)
                CHECK(false, "fixture key (%u,%u) is owned (status %d)", t, k, st);
        return c;
}

/* 64-byte aligned, zeroed floats, as the store's own buffers are. */
static float *fbuf(size_t n) {
        size_t bytes = ((n ? n : 1) * sizeof(float) + 63) / 64 * 64;
        float *p = aligned_alloc(64, bytes);
        if (p)
                memset(p, 0, bytes);
        return p;
}

/* A route frame as a ROUTER socket would give it: a short identity. */
static void route_msg(zmq_msg_t *m, uint32_t worker) {
        char id[16];
        int n = snprintf(id, sizeof id, "w%u", worker);
        zmq_msg_init_size(m, (size_t) n);
        memcpy(zmq_msg_data(m), id, (size_t) n);
}

static PushReq *req_new(uint32_t worker, int64_t clock, uint64_t seq) {
        zmq_msg_t route;
        PushReq *req = NULL;
        route_msg(&route, worker);
        if (pushreq_new(&route, seq, worker, clock, &req) < 0)
                CHECK(false, "fixture pushreq_new");
        zmq_msg_close(&route);
        return req;
}

/* Offers g (c->len floats) for c in req, as psd does with a received frame. */
static int req_push(Store *s, PushReq *req, Chunk *c, const float *g) {
        zmq_msg_t grad;
        zmq_msg_init_size(&grad, (size_t) c->len * sizeof(float));
        memcpy(zmq_msg_data(&grad), g, (size_t) c->len * sizeof(float));
        int r = store_push(s, c, req, &grad);
        zmq_msg_close(&grad); /* empty if the store took it */
        return r;
}

/* A whole one-key PUSH request: new, push, the reader's settle. */
static int push1(Store *s, Chunk *c, uint32_t worker, int64_t clock, uint64_t seq,
                 const float *g) {
        PushReq *req = req_new(worker, clock, seq);
        if (!req)
                return -1;
        int r = req_push(s, req, c, g);
        pushreq_settle(s, req, ST_OK);
        return r;
}

/* The test's own copy of a chunk: values and optimizer state, updated with
 * optim_apply exactly as the formulas say, independently of the store. */
typedef struct Ref {
        const Job *job;
        uint32_t len;
        float *w, *state;
        uint64_t steps;
} Ref;

static void ref_init(Ref *r, const Job *job, uint32_t t, uint32_t k) {
        r->job = job;
        r->len = job_chunk_len(job, t, k);
        r->w = fbuf(r->len);
        r->state = fbuf(r->len * 2);
        r->steps = 0;
        job_init_chunk(job, t, k, r->w);
}

static void ref_step(Ref *r, const float *g) {
        float *gb = fbuf(r->len);
        memcpy(gb, g, r->len * sizeof(float));
        optim_apply(&r->job->optim, ++r->steps, r->w, gb, r->state, r->len);
        free(gb);
}

static void ref_done(Ref *r) {
        free(r->w);
        free(r->state);
}

static bool same(const float *a, const float *b, uint32_t n) {
        return memcmp(a, b, (size_t) n * sizeof(float)) == 0;
}

/* An ordinary gradient of worker w at clock c. */
static void grad_fill(float *g, uint32_t len, uint32_t w, int64_t c) {
        for (uint32_t j = 0; j < len; j++)
                g[j] = (float) ((int) ((w * 7 + (uint32_t) c * 13 + j * 3) % 11) - 5) * 0.037f +
                       (float) w * 0.001f;
}

/* --- configure and lookup ------------------------------------------------------------ */

/* What the move callback saw of each chunk leaving a store. */
typedef struct Moved {
        uint32_t t, k, len;
        float *val, *state;
        size_t nstate, nlast;
        int64_t *last;
        uint64_t steps;
        int64_t clock;
} Moved;
static Moved moved[64];
static size_t moved_n;

static void on_move(void *ud, Chunk *c, const ShardDesc *dest) {
        (void) dest;
        (void) ud;
        if (moved_n >= 64)
                return;
        Moved *m = &moved[moved_n++];
        size_t per = c->state ? 1 : 0; /* sgd with momentum in these tests: 1 float per value */
        m->t = c->tensor;
        m->k = c->chunk;
        m->len = c->len;
        m->val = malloc(c->len * sizeof(float));
        m->nstate = per * c->len;
        m->state = malloc((m->nstate ? m->nstate : 1) * sizeof(float));
        m->nlast = c->nlast;
        m->last = malloc((c->nlast ? c->nlast : 1) * sizeof(int64_t));
        memcpy(m->val, c->val->data, c->len * sizeof(float));
        if (m->nstate)
                memcpy(m->state, c->state, m->nstate * sizeof(float));
        if (c->nlast)
                memcpy(m->last, c->last_clock, c->nlast * sizeof(int64_t));
        m->steps = c->steps;
        m->clock = c->clock;
}

static void moved_free(Moved *m) {
        free(m->val);
        free(m->state);
        free(m->last);
}

static void test_configure_two_shards(void) {
        Job job;
        Acks a1 = { 0 }, a2 = { 0 };
        uint32_t ids[2] = { 1, 2 };
        make_job(&job, 7, MODE_BSP, "sgd");
        ShardMap *map = make_map(1, ids, 2);
        Store *s1 = open_store(1, &job, map, &a1), *s2 = open_store(2, &job, map, &a2);
        if (!CHECK(map && s1 && s2, "two stores configured under a 2-shard map"))
                goto out;

        size_t per = optim_state_per_value(&job.optim);
        uint64_t keys = 0, once = 0, by_map = 0, init_ok = 0, len_ok = 0, n1 = 0, n2 = 0;
        uint64_t bytes1 = 0, bytes2 = 0;
        float *want = fbuf(MAXLEN);
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        Chunk *c1 = s1->chunks[t][k], *c2 = s2->chunks[t][k];
                        Chunk *c = c1 ? c1 : c2;
                        uint32_t len = job_chunk_len(&job, t, k);
                        uint32_t owner = shardmap_shard(map, shardmap_lookup(map, t, k))->id;
                        keys++;
                        once += (c1 != NULL) != (c2 != NULL);
                        by_map += (c1 && owner == 1) || (c2 && owner == 2);
                        n1 += c1 != NULL;
                        n2 += c2 != NULL;
                        if (c1)
                                bytes1 += (uint64_t) len * 4 * (1 + per);
                        if (c2)
                                bytes2 += (uint64_t) len * 4 * (1 + per);
                        if (!c)
                                continue;
                        job_init_chunk(&job, t, k, want);
                        len_ok += c->len == len && c->tensor == t && c->chunk == k;
                        init_ok += c->len == len && same(c->val->data, want, len) &&
                                   c->clock == 0 && c->steps == 0;
                }
        CHECK(keys == job_nkeys(&job) && keys == 19, "the job has 19 keys (%lu)", (unsigned long) keys);
        CHECK(once == keys, "every key is owned by exactly one of the two shards (%lu of %lu)",
              (unsigned long) once, (unsigned long) keys);
        CHECK(by_map == keys, "each key is owned by the shard the map names (%lu of %lu)",
              (unsigned long) by_map, (unsigned long) keys);
        CHECK(n1 > 0 && n2 > 0, "both shards own keys (%lu + %lu)", (unsigned long) n1,
              (unsigned long) n2);
        CHECK(s1->nkeys == n1 && s2->nkeys == n2, "nkeys counts the owned keys (%lu, %lu)",
              (unsigned long) s1->nkeys, (unsigned long) s2->nkeys);
        CHECK(s1->bytes == bytes1 && s2->bytes == bytes2,
              "bytes counts values and optimizer state of the owned keys");
        CHECK(len_ok == keys, "each owned chunk has its key and the job's length");
        CHECK(init_ok == keys, "each owned chunk starts at job_init_chunk, clock 0, no steps");
        CHECK(store_clock(s1) == 0 && store_clock(s2) == 0, "store_clock is 0 before any push");

        /* Shard 2 leaves: shard 1 takes every key, keeping the ones it had (with
         * their updates) and initialising the others; shard 2 drops its keys,
         * refusing a push parked on one of them. */
        uint32_t one = 1, w12[2] = { 1, 2 };
        uint32_t t1 = UINT32_MAX, k1 = 0, t2 = UINT32_MAX, k2 = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        if (s1->chunks[t][k] && t1 == UINT32_MAX)
                                t1 = t, k1 = k;
                        if (s2->chunks[t][k] && t2 == UINT32_MAX)
                                t2 = t, k2 = k;
                }
        store_set_members(s1, &one, 1, 1);
        store_set_members(s2, w12, 2, 1);
        Chunk *kept = s1->chunks[t1][k1];
        float g[MAXLEN];
        Ref ref;
        ref_init(&ref, &job, t1, k1);
        grad_fill(g, kept->len, 1, 0);
        push1(s1, kept, 1, 0, 1, g);
        ref_step(&ref, g);
        grad_fill(g, s2->chunks[t2][k2]->len, 1, 0);
        push1(s2, s2->chunks[t2][k2], 1, 0, 2, g); /* parked: worker 2 has not pushed */
        CHECK(a2.n == 0, "shard 2: a push waiting for the other member is not acknowledged yet");

        ShardMap *solo = make_map(2, &one, 1);
        moved_n = 0;
        s2->move = on_move;
        int r1 = store_configure(s1, &job, solo), r2 = store_configure(s2, &job, solo);
        CHECK(r1 == 0 && r2 == 0, "reconfigure under the one-shard map");
        CHECK(s2->nkeys == 0 && moved_n == n2, "shard 2 hands over all its %lu keys (%zu moved)", (unsigned long) n2,
              moved_n);
        CHECK(s1->nkeys == n1 && store_incoming(s1) == n2, "shard 1 keeps %lu and awaits %lu (incoming %lu)",
              (unsigned long) n1, (unsigned long) n2, (unsigned long) store_incoming(s1));
        CHECK(s1->chunks[t1][k1] == kept && same(kept->val->data, ref.w, kept->len) && kept->steps == 1,
              "a key shard 1 kept keeps its updated values");
        int st = -1;
        CHECK(!store_lookup(s1, t2, k2, job_chunk_len(&job, t2, k2), &st) && st == PSNET__STATUS__STATUS_MIGRATING,
              "shard 1 answers MIGRATING for a key on its way (status %d)", st);
        CHECK(!store_lookup(s2, t2, k2, job_chunk_len(&job, t2, k2), &st) && st == ST_MOVED,
              "shard 2 answers MOVED for a key it gave away (status %d)", st);
        CHECK(a2.n == 1 && acks_status(&a2, 2) == ST_MOVED,
              "the push parked on a key that moved away is refused MOVED, once (%zu acks, status %d)",
              a2.n, acks_status(&a2, 2));
        size_t installed = 0;
        for (size_t i = 0; i < moved_n; i++) {
                Moved *mv = &moved[i];
                installed += store_install(s1, mv->t, mv->k, mv->val, mv->len, mv->state, mv->nstate, mv->steps,
                                           mv->clock, mv->last, mv->nlast) == 0;
        }
        CHECK(installed == n2 && s1->nkeys == keys && store_incoming(s1) == 0,
              "shard 1 installs the %zu moved keys and owns all %lu", installed, (unsigned long) keys);
        Chunk *taken = s1->chunks[t2][k2];
        if (CHECK(taken != NULL, "shard 1 holds the key that moved from shard 2")) {
                job_init_chunk(&job, t2, k2, want);
                CHECK(same(taken->val->data, want, taken->len) && taken->clock == 0,
                      "the moved key arrives with the values it had (no update was applied)");
                /* The refused push was not applied: the worker may push that clock again. */
                float g2[MAXLEN];
                grad_fill(g2, taken->len, 1, 0);
                store_set_members(s1, w12, 2, 2);
                push1(s1, taken, 1, 0, 3, g2);
                CHECK(taken->npending == 1, "the refused push is accepted again at the new owner");
        }
        CHECK(store_install(s1, t1, k1, kept->val->data, kept->len, kept->state, kept->len, 0, 0, NULL, 0) == -EEXIST,
              "installing a key that is already here is refused");
        for (size_t i = 0; i < moved_n; i++)
                moved_free(&moved[i]);
        ref_done(&ref);
        shardmap_free(solo);
        free(want);
out:
        store_free(s1);
        store_free(s2);
        shardmap_free(map);
}

static void test_lookup(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t ids[2] = { 1, 2 };
        Store *s = NULL;
        int st = -1;
        make_job(&job, 7, MODE_BSP, "sgd");

        store_new(1, on_ack, &acks, &s);
        if (!CHECK(s != NULL, "store_new"))
                return;
        CHECK(!store_lookup(s, 0, 0, CHUNK_FLOATS, &st) && st == ST_NO_JOB,
              "before configure: NO_JOB (status %d)", st);
        CHECK(store_clock(s) == 0, "before configure: store_clock is 0");

        ShardMap *map = make_map(1, ids, 2);
        store_configure(s, &job, map);
        uint32_t mt = UINT32_MAX, mk = 0, ot = UINT32_MAX, ok_ = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        bool mine = shardmap_shard(map, shardmap_lookup(map, t, k))->id == 1;
                        if (mine && mt == UINT32_MAX)
                                mt = t, mk = k;
                        if (!mine && ot == UINT32_MAX)
                                ot = t, ok_ = k;
                }
        if (!CHECK(mt != UINT32_MAX && ot != UINT32_MAX, "the map splits the keys"))
                goto out;

        uint32_t len = job_chunk_len(&job, mt, mk);
        Chunk *c = store_lookup(s, mt, mk, len, &st);
        CHECK(c && c == s->chunks[mt][mk] && st == ST_OK && c->tensor == mt && c->chunk == mk,
              "own key (%u,%u): the chunk, OK", mt, mk);
        st = -1;
        CHECK(!store_lookup(s, (uint32_t) job.ntensors, 0, 1, &st) && st == ST_UNKNOWN_KEY,
              "tensor past the job: UNKNOWN_KEY (status %d)", st);
        st = -1;
        CHECK(!store_lookup(s, UINT32_MAX, 0, 1, &st) && st == ST_UNKNOWN_KEY,
              "tensor UINT32_MAX: UNKNOWN_KEY (status %d)", st);
        st = -1;
        CHECK(!store_lookup(s, 0, job.tensors[0].nchunks, CHUNK_FLOATS, &st) && st == ST_UNKNOWN_KEY,
              "chunk past the tensor: UNKNOWN_KEY (status %d)", st);
        st = -1;
        CHECK(!store_lookup(s, mt, mk, len + 1, &st) && st == ST_SIZE,
              "one float too many: SIZE (status %d)", st);
        st = -1;
        CHECK(!store_lookup(s, mt, mk, len - 1, &st) && st == ST_SIZE,
              "one float too few: SIZE (status %d)", st);
        st = -1;
        CHECK(!store_lookup(s, 0, 12, CHUNK_FLOATS, &st) && st == ST_SIZE,
              "full length on the short last chunk: SIZE (status %d)", st);
        st = -1;
        CHECK(!store_lookup(s, ot, ok_, job_chunk_len(&job, ot, ok_), &st) && st == ST_MOVED,
              "key (%u,%u) of the other shard: MOVED (status %d)", ot, ok_, st);
out:
        shardmap_free(map);
        store_free(s);
}

/* --- BSP -------------------------------------------------------------------------------- */

/* Gradients chosen so that float addition order shows: |g1| = |g3| ~ 1e7
 * (ulp 1) with opposite signs and g2 < 1, so (g1+g2)+g3 loses g2's fraction
 * while (g3+g1)+g2 keeps it. */
static void grad_order(float *g, uint32_t len, uint32_t w, int64_t c) {
        for (uint32_t j = 0; j < len; j++)
                g[j] = w == 1 ? 1.0e7f + 1000.0f * (float) j + (float) c
                     : w == 2 ? 0.3f + 0.01f * (float) j + 0.1f * (float) c
                              : -1.0e7f - 1000.0f * (float) j;
}

static void test_bsp_order(void) {
        static const uint32_t orders[3][3] = { { 3, 1, 2 }, { 1, 2, 3 }, { 2, 3, 1 } };
        static const uint32_t keys[2][2] = { { 0, 0 }, { 0, 12 } }; /* 16 floats, 8 floats */
        uint32_t members[3] = { 3, 1, 2 };                          /* unsorted on purpose */
        Job job;
        Acks acks[3];
        Store *s[3];
        make_job(&job, 7, MODE_BSP, "sgd");
        memset(acks, 0, sizeof acks);
        for (int o = 0; o < 3; o++)
                s[o] = open_solo(&job, &acks[o], members, 3);
        if (!s[0] || !s[1] || !s[2])
                goto out;

        float g[4][MAXLEN];
        /* The check has teeth: summing in arrival order 3,1,2 would differ. */
        grad_order(g[1], MAXLEN, 1, 0);
        grad_order(g[2], MAXLEN, 2, 0);
        grad_order(g[3], MAXLEN, 3, 0);
        bool differs = false;
        for (uint32_t j = 0; j < MAXLEN; j++) {
                float asc = g[1][j], arr = g[3][j];
                asc += g[2][j];
                asc += g[3][j];
                arr += g[1][j];
                arr += g[2][j];
                differs |= asc != arr;
        }
        CHECK(differs, "the test gradients' float sum depends on the order of addition");

        for (int kk = 0; kk < 2; kk++) {
                uint32_t t = keys[kk][0], k = keys[kk][1];
                Ref ref;
                ref_init(&ref, &job, t, k);
                uint32_t len = ref.len;
                for (int64_t clock = 0; clock < 2; clock++) {
                        for (uint32_t w = 1; w <= 3; w++)
                                grad_order(g[w], len, w, clock);
                        float sum[MAXLEN];
                        float inv = 1.0f / 3.0f;
                        for (uint32_t j = 0; j < len; j++) {
                                sum[j] = g[1][j];
                                sum[j] += g[2][j];
                                sum[j] += g[3][j];
                                sum[j] *= inv;
                        }
                        ref_step(&ref, sum);

                        for (int o = 0; o < 3; o++) {
                                Chunk *c = key(s[o], t, k);
                                if (!c)
                                        continue;
                                float before[MAXLEN];
                                memcpy(before, c->val->data, len * sizeof(float));
                                size_t acks0 = acks[o].n;
                                bool early = false;
                                for (int i = 0; i < 3; i++) {
                                        uint32_t w = orders[o][i];
                                        uint64_t seq = (uint64_t) (kk * 100 + clock * 10 + w);
                                        push1(s[o], c, w, clock, seq, g[w]);
                                        if (i < 2)
                                                early |= acks[o].n != acks0 || c->clock != clock ||
                                                         !same(c->val->data, before, len);
                                }
                                CHECK(!early, "order %u,%u,%u key (%u,%u) clock %ld: nothing applied or "
                                      "acknowledged before the last member pushed",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock);
                                bool acks_ok = acks[o].n == acks0 + 3;
                                for (uint32_t w = 1; w <= 3; w++) {
                                        uint64_t seq = (uint64_t) (kk * 100 + clock * 10 + w);
                                        acks_ok &= acks_count(&acks[o], seq) == 1 &&
                                                   acks_status(&acks[o], seq) == ST_OK;
                                }
                                CHECK(acks_ok, "order %u,%u,%u key (%u,%u) clock %ld: one OK ack per "
                                      "request when the clock closes (%zu)",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock,
                                      acks[o].n - acks0);
                                CHECK(c->clock == clock + 1 && c->steps == (uint64_t) clock + 1 &&
                                      c->npending == 0,
                                      "order %u,%u,%u key (%u,%u): chunk clock %ld -> %ld",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock,
                                      (long) c->clock);
                                CHECK(same(c->val->data, ref.w, len),
                                      "order %u,%u,%u key (%u,%u) clock %ld: values are optim_apply of "
                                      "((g1+g2)+g3)*(1/3), bit for bit",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock);
                        }
                        Chunk *c0 = key(s[0], t, k), *c1 = key(s[1], t, k), *c2 = key(s[2], t, k);
                        CHECK(c0 && c1 && c2 && same(c0->val->data, c1->val->data, len) &&
                              same(c1->val->data, c2->val->data, len) &&
                              same(c0->state, c1->state, len) && same(c1->state, c2->state, len),
                              "key (%u,%u) clock %ld: the three arrival orders give identical values "
                              "and state (memcmp)", t, k, (long) clock);
                }
                ref_done(&ref);
        }
        /* Clock 2 everywhere on the two keys, 0 elsewhere. */
        CHECK(store_clock(s[0]) == 0, "store_clock is the smallest chunk clock (0)");
out:
        for (int o = 0; o < 3; o++)
                store_free(s[o]);
}

static void test_bsp_dedupe(void) {
        uint32_t m12[2] = { 1, 2 }, m123[3] = { 1, 2, 3 };
        Job job;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], gx[MAXLEN], avg[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        grad_fill(g1, len, 1, 0);
        grad_fill(g2, len, 2, 0);
        for (uint32_t j = 0; j < len; j++)
                gx[j] = 100.0f; /* would show if a retry were applied */
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);

        push1(s, c, 1, 0, 10, g1);
        CHECK(acks.n == 0 && c->npending == 1, "worker 1's push is parked, not acknowledged");
        push1(s, c, 1, 0, 11, gx);
        CHECK(acks.n == 1 && acks_status(&acks, 11) == ST_DUPLICATE && c->npending == 1,
              "a retry before the clock closes: DUPLICATE at once, not parked (status %d)",
              acks_status(&acks, 11));
        push1(s, c, 2, 0, 12, g2);
        CHECK(acks.n == 3 && acks_status(&acks, 10) == ST_OK && acks_status(&acks, 12) == ST_OK &&
              acks_count(&acks, 10) == 1,
              "the clock closes: the original and worker 2 acknowledged OK, once each");
        CHECK(c->clock == 1 && c->steps == 1 && same(c->val->data, ref.w, len),
              "applied once: optim_apply of (g1+g2)/2, the retry not counted");
        push1(s, c, 1, 0, 13, gx);
        CHECK(acks_status(&acks, 13) == ST_DUPLICATE && c->steps == 1 && c->npending == 0 &&
                      same(c->val->data, ref.w, len),
              "a retry after the clock closed: DUPLICATE, not applied (status %d)",
              acks_status(&acks, 13));

        /* Worker 3 joins late and pushes for clock 0, which has closed. */
        store_set_members(s, m123, 3, 2);
        push1(s, c, 3, 0, 14, gx);
        CHECK(acks_status(&acks, 14) == ST_STALE && c->npending == 0 && c->steps == 1 &&
                      same(c->val->data, ref.w, len),
              "a push for a closed clock: STALE, not applied (status %d)", acks_status(&acks, 14));
        push1(s, c, 1, 5, 15, gx);
        CHECK(acks_status(&acks, 15) == ST_STALE && c->npending == 0 && c->steps == 1,
              "a push for a clock ahead of the chunk: STALE (status %d)", acks_status(&acks, 15));
        grad_fill(g1, len, 1, 1);
        push1(s, c, 1, 1, 16, g1);
        CHECK(acks_count(&acks, 16) == 0 && c->npending == 1,
              "the refused push ahead does not block worker 1's push for the current clock");

        /* Bad requests. */
        push1(s, c, 70000, 1, 17, gx);
        CHECK(acks_status(&acks, 17) == ST_INVALID && c->npending == 1,
              "worker id past 65535: INVALID (status %d)", acks_status(&acks, 17));
        push1(s, c, 2, -1, 18, gx);
        CHECK(acks_status(&acks, 18) == ST_INVALID && c->npending == 1,
              "negative clock: INVALID (status %d)", acks_status(&acks, 18));
        CHECK(acks.overflow == 0 && acks.a[0].seq == 11 && strcmp(acks.a[0].route, "w1") == 0 &&
              acks.a[0].worker == 1 && acks.a[0].clock == 0,
              "an ack carries the request's route, worker and clock (\"%s\")", acks.a[0].route);
        size_t before = acks.n;
        s = store_free(s);
        CHECK(acks.n == before + 1 && acks_status(&acks, 16) == ST_SHUTTING_DOWN,
              "store_free refuses the parked push, once (status %d)", acks_status(&acks, 16));
        ref_done(&ref);
out:
        store_free(s);
}

/* A worker outside the membership may push; it is parked, never counted, and
 * refused when the clock closes. */
static void test_bsp_non_member(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], g9[MAXLEN], avg[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 3, 0) : NULL; /* b1: 5 floats */
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 3, 0);
        grad_fill(g1, len, 1, 0);
        grad_fill(g2, len, 2, 0);
        for (uint32_t j = 0; j < len; j++)
                g9[j] = 50.0f;
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);

        push1(s, c, 9, 0, 20, g9);
        CHECK(acks.n == 0 && c->npending == 1 && c->clock == 0,
              "a non-member's push is parked, not acknowledged");
        push1(s, c, 1, 0, 21, g1);
        CHECK(acks.n == 0 && c->clock == 0 && c->steps == 0,
              "one member and one non-member do not close a clock of two members");
        push1(s, c, 2, 0, 22, g2);
        CHECK(acks.n == 3 && acks_status(&acks, 20) == ST_STALE && acks_status(&acks, 21) == ST_OK &&
                      acks_status(&acks, 22) == ST_OK,
              "the clock closes: the non-member refused STALE, the members OK (status %d)",
              acks_status(&acks, 20));
        CHECK(c->clock == 1 && c->steps == 1 && c->npending == 0 && same(c->val->data, ref.w, len),
              "the values are optim_apply of (g1+g2)/2, without the non-member's gradient");
        push1(s, c, 9, 0, 23, g9);
        CHECK(acks_status(&acks, 23) == ST_DUPLICATE || acks_status(&acks, 23) == ST_STALE,
              "the non-member retrying the closed clock is refused (status %d)",
              acks_status(&acks, 23));
        CHECK(c->steps == 1 && same(c->val->data, ref.w, len), "and not applied");
        ref_done(&ref);
out:
        store_free(s);
}

static void test_membership_shrink(void) {
        uint32_t m12[2] = { 1, 2 }, m1 = 1;
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN], gx[MAXLEN], one[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL, *b = s ? key(s, 3, 0) : NULL;
        if (!a || !b)
                goto out;
        Ref ra, rb;
        ref_init(&ra, &job, 0, 0);
        ref_init(&rb, &job, 3, 0);

        grad_fill(g, a->len, 1, 0);
        push1(s, a, 1, 0, 1, g);
        for (uint32_t j = 0; j < a->len; j++)
                one[j] = g[j] * (1.0f / 1.0f);
        ref_step(&ra, one);
        grad_fill(g, b->len, 1, 0);
        push1(s, b, 1, 0, 2, g);
        for (uint32_t j = 0; j < b->len; j++)
                one[j] = g[j] * (1.0f / 1.0f);
        ref_step(&rb, one);
        CHECK(acks.n == 0 && a->clock == 0 && b->clock == 0, "members {1,2}: worker 1 alone waits");

        store_set_members(s, &m1, 1, 2);
        CHECK(a->clock == 1 && b->clock == 1 && a->steps == 1 && b->steps == 1,
              "store_set_members({1}) closes the clocks worker 1 completed");
        CHECK(acks.n == 2 && acks_status(&acks, 1) == ST_OK && acks_status(&acks, 2) == ST_OK,
              "and acknowledges worker 1's pushes OK");
        CHECK(same(a->val->data, ra.w, a->len) && same(b->val->data, rb.w, b->len),
              "with g1 alone: optim_apply of g1 * (1/1)");
        for (uint32_t j = 0; j < MAXLEN; j++)
                gx[j] = 9.0f;
        push1(s, a, 2, 0, 3, gx);
        CHECK(acks_status(&acks, 3) == ST_STALE && a->steps == 1,
              "worker 2 pushing the closed clock afterwards: STALE (status %d)", acks_status(&acks, 3));

        /* An empty membership closes nothing; psd passes the empty repeated field
         * of the Control message as (NULL, 0). */
        store_set_members(s, NULL, 0, 3);
        grad_fill(g, a->len, 1, 1);
        push1(s, a, 1, 1, 4, g);
        CHECK(a->clock == 1 && a->npending == 1 && acks_count(&acks, 4) == 0,
              "with no members nothing closes");
        for (uint32_t j = 0; j < a->len; j++)
                one[j] = g[j] * (1.0f / 1.0f);
        ref_step(&ra, one);
        store_set_members(s, &m1, 1, 4);
        CHECK(a->clock == 2 && acks_status(&acks, 4) == ST_OK && same(a->val->data, ra.w, a->len),
              "worker 1 rejoining closes the clock with its parked push");
        ref_done(&ra);
        ref_done(&rb);
out:
        store_free(s);
}

/* A frame whose data is not float-aligned (a receive buffer may hand such a
 * frame over) takes the store's copying path; the result must be the same. */
static void test_bsp_unaligned(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], avg[MAXLEN];
        _Alignas(64) char raw[MAXLEN * sizeof(float) + 8];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        grad_fill(g1, len, 1, 0);
        grad_fill(g2, len, 2, 0);
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);

        /* Worker 2's frame is the unaligned one, so it is summed second. */
        push1(s, c, 1, 0, 1, g1);
        memcpy(raw + 1, g2, len * sizeof(float));
        zmq_msg_t grad;
        zmq_msg_init_data(&grad, raw + 1, len * sizeof(float), NULL, NULL);
        PushReq *req = req_new(2, 0, 2);
        store_push(s, c, req, &grad);
        zmq_msg_close(&grad);
        pushreq_settle(s, req, ST_OK);
        CHECK(acks.n == 2 && c->clock == 1 && same(c->val->data, ref.w, len),
              "an unaligned frame sums like an aligned one");

        /* And first: worker 1 unaligned at clock 1. */
        grad_fill(g1, len, 1, 1);
        grad_fill(g2, len, 2, 1);
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);
        memcpy(raw + 3, g1, len * sizeof(float));
        zmq_msg_init_data(&grad, raw + 3, len * sizeof(float), NULL, NULL);
        req = req_new(1, 1, 3);
        store_push(s, c, req, &grad);
        zmq_msg_close(&grad);
        pushreq_settle(s, req, ST_OK);
        push1(s, c, 2, 1, 4, g2);
        CHECK(acks.n == 4 && c->clock == 2 && same(c->val->data, ref.w, len),
              "an unaligned first frame starts the sum like an aligned one");
        ref_done(&ref);
out:
        store_free(s);
}

/* --- ASP -------------------------------------------------------------------------------- */

static void test_asp(void) {
        uint32_t m4[4] = { 1, 2, 3, 4 }, m2[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN], gx[MAXLEN], sc[MAXLEN];
        _Alignas(64) char raw[MAXLEN * sizeof(float) + 8];
        make_job(&job, 7, MODE_ASP, "adam");
        Store *s = open_solo(&job, &acks, m4, 4);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        for (uint32_t j = 0; j < len; j++)
                gx[j] = 100.0f;

        struct { uint32_t w; int64_t clock; uint64_t seq; int want; } steps[] = {
                { 1, 0, 1, ST_OK },        { 1, 0, 2, ST_DUPLICATE }, { 2, 0, 3, ST_OK },
                { 1, 1, 4, ST_OK },        { 1, 0, 5, ST_DUPLICATE }, { 3, 0, 6, ST_OK },
                { 3, 0, 7, ST_DUPLICATE },
        };
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
                bool apply = steps[i].want == ST_OK;
                uint64_t before = c->steps;
                if (apply) {
                        grad_fill(g, len, steps[i].w, steps[i].clock);
                        for (uint32_t j = 0; j < len; j++)
                                sc[j] = g[j] * (1.0f / 4.0f);
                        ref_step(&ref, sc);
                }
                push1(s, c, steps[i].w, steps[i].clock, steps[i].seq, apply ? g : gx);
                CHECK(acks_count(&acks, steps[i].seq) == 1 && acks_status(&acks, steps[i].seq) == steps[i].want,
                      "asp: worker %u clock %ld acknowledged at once, status %d (got %d)", steps[i].w,
                      (long) steps[i].clock, steps[i].want, acks_status(&acks, steps[i].seq));
                CHECK(c->steps == before + apply && c->npending == 0 && same(c->val->data, ref.w, len),
                      "asp: worker %u clock %ld %s: values are adam step %lu of g/4", steps[i].w,
                      (long) steps[i].clock, apply ? "applied on arrival" : "not applied",
                      (unsigned long) ref.steps);
        }
        CHECK(c->clock == 0 && c->steps == 4,
              "asp: steps counts the updates, the BSP clock stays (clock %ld, steps %lu)", (long) c->clock,
              (unsigned long) c->steps);

        /* The scale follows the membership. */
        store_set_members(s, m2, 2, 2);
        grad_fill(g, len, 2, 1);
        for (uint32_t j = 0; j < len; j++)
                sc[j] = g[j] * (1.0f / 2.0f);
        ref_step(&ref, sc);
        push1(s, c, 2, 1, 8, g);
        CHECK(acks_status(&acks, 8) == ST_OK && same(c->val->data, ref.w, len),
              "asp: with 2 members a push counts g/2");

        /* An unaligned frame is scaled the same. */
        grad_fill(g, len, 4, 0);
        for (uint32_t j = 0; j < len; j++)
                sc[j] = g[j] * (1.0f / 2.0f);
        ref_step(&ref, sc);
        memcpy(raw + 1, g, len * sizeof(float));
        zmq_msg_t grad;
        zmq_msg_init_data(&grad, raw + 1, len * sizeof(float), NULL, NULL);
        PushReq *req = req_new(4, 0, 9);
        store_push(s, c, req, &grad);
        zmq_msg_close(&grad);
        pushreq_settle(s, req, ST_OK);
        CHECK(acks_status(&acks, 9) == ST_OK && same(c->val->data, ref.w, len) &&
                      same(c->state, ref.state, 2 * len),
              "asp: an unaligned frame applies like an aligned one (values and adam state)");
        ref_done(&ref);
out:
        store_free(s);
}

/* --- copy-on-write ----------------------------------------------------------------------- */

static void test_copy_on_write(void) {
        uint32_t m1 = 1;
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN], snap0[MAXLEN], snap1[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, &m1, 1);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);

        zmq_msg_t m1msg, m2msg, m3msg, m4msg;
        ValBuf *old = c->val;
        memcpy(snap0, c->val->data, len * sizeof(float));
        uint64_t pulls = s->pulls;
        CHECK(store_value_msg(s, c, &m1msg) == 0, "store_value_msg");
        CHECK(zmq_msg_size(&m1msg) == len * sizeof(float) && zmq_msg_data(&m1msg) == (void *) old->data,
              "the reply frame is the chunk's buffer itself (zero copy)");
        CHECK(atomic_load(&old->refs) == 2 && s->pulls == pulls + 1,
              "the reply holds a reference (refs %d)", atomic_load(&old->refs));

        grad_fill(g, len, 1, 0);
        ref_step(&ref, g);
        push1(s, c, 1, 0, 1, g);
        CHECK(c->steps == 1 && c->val != old && c->val->data != old->data,
              "an update under a reply copies the buffer first");
        CHECK(same(zmq_msg_data(&m1msg), snap0, len), "the reply still holds the old values");
        CHECK(same(c->val->data, ref.w, len), "the chunk holds the new values");
        CHECK(atomic_load(&old->refs) == 1 && atomic_load(&c->val->refs) == 1,
              "the old buffer is the reply's alone, the new one the chunk's");

        /* No reply in flight: the update is in place. */
        ValBuf *cur = c->val;
        grad_fill(g, len, 1, 1);
        ref_step(&ref, g);
        push1(s, c, 1, 1, 2, g);
        CHECK(c->val == cur && same(c->val->data, ref.w, len), "without a reply the update is in place");

        /* Two replies over one snapshot. */
        memcpy(snap1, c->val->data, len * sizeof(float));
        store_value_msg(s, c, &m2msg);
        store_value_msg(s, c, &m3msg);
        CHECK(atomic_load(&cur->refs) == 3, "two replies, two references (refs %d)",
              atomic_load(&cur->refs));
        grad_fill(g, len, 1, 2);
        ref_step(&ref, g);
        push1(s, c, 1, 2, 3, g);
        CHECK(c->val != cur && same(c->val->data, ref.w, len) && same(zmq_msg_data(&m2msg), snap1, len) &&
                      same(zmq_msg_data(&m3msg), snap1, len),
              "both replies keep the snapshot, the chunk moves on");
        zmq_msg_close(&m2msg);
        CHECK(atomic_load(&cur->refs) == 1 && same(zmq_msg_data(&m3msg), snap1, len),
              "closing one reply leaves the other's snapshot intact");
        zmq_msg_close(&m3msg);  /* frees cur: ASan reports a leak otherwise */
        zmq_msg_close(&m1msg);  /* frees old */

        /* A reply outlives the store. */
        memcpy(snap1, c->val->data, len * sizeof(float));
        store_value_msg(s, c, &m4msg);
        s = store_free(s);
        CHECK(same(zmq_msg_data(&m4msg), snap1, len), "a reply still reads its values after store_free");
        zmq_msg_close(&m4msg);
        ref_done(&ref);
out:
        store_free(s);
}

/* --- multi-key requests ---------------------------------------------------------------------- */

static void test_multi_key(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL, *b = s ? key(s, 0, 12) : NULL, *c = s ? key(s, 3, 0) : NULL;
        if (!a || !b || !c)
                goto out;
        Ref ra, rb;
        ref_init(&ra, &job, 0, 0);
        ref_init(&rb, &job, 0, 12);
        float ga1[MAXLEN], ga2[MAXLEN], gb1[MAXLEN], gb2[MAXLEN], avg[MAXLEN];
        grad_fill(ga1, a->len, 1, 0);
        grad_fill(ga2, a->len, 2, 0);
        grad_fill(gb1, b->len, 1, 0);
        grad_fill(gb2, b->len, 2, 0);
        for (uint32_t j = 0; j < a->len; j++) {
                avg[j] = ga1[j];
                avg[j] += ga2[j];
                avg[j] *= 0.5f;
        }
        ref_step(&ra, avg);
        for (uint32_t j = 0; j < b->len; j++) {
                avg[j] = gb1[j];
                avg[j] += gb2[j];
                avg[j] *= 0.5f;
        }
        ref_step(&rb, avg);

        PushReq *r1 = req_new(1, 0, 1);
        req_push(s, r1, a, ga1);
        req_push(s, r1, b, gb1);
        pushreq_settle(s, r1, ST_OK);
        CHECK(acks.n == 0, "worker 1 pushes keys A and B in one request: parked, no ack");

        PushReq *r2 = req_new(2, 0, 2);
        req_push(s, r2, a, ga2);
        CHECK(a->clock == 1 && acks.n == 0, "worker 2 closes A; neither request is acknowledged "
              "while its reader still holds it");
        pushreq_settle(s, r2, ST_OK);
        CHECK(acks.n == 1 && acks_status(&acks, 2) == ST_OK && acks_count(&acks, 1) == 0,
              "worker 2's request is acknowledged; worker 1's waits for B");

        push1(s, b, 2, 0, 3, gb2);
        CHECK(acks.n == 3 && acks_count(&acks, 1) == 1 && acks_status(&acks, 1) == ST_OK &&
                      acks_status(&acks, 3) == ST_OK,
              "B closes: worker 1's request is acknowledged OK, once");
        CHECK(same(a->val->data, ra.w, a->len) && same(b->val->data, rb.w, b->len),
              "A and B each applied optim_apply of their mean");

        /* A request whose second key is refused is acknowledged with the
         * refusal, once, after its other key settles. */
        PushReq *r4 = req_new(1, 1, 4);
        grad_fill(g, a->len, 1, 1);
        req_push(s, r4, a, g);
        grad_fill(g, c->len, 1, 1);
        req_push(s, r4, c, g); /* C is still at clock 0: STALE */
        pushreq_settle(s, r4, ST_OK);
        CHECK(acks_count(&acks, 4) == 0, "a request with a refused key still waits for its parked key");
        grad_fill(g, a->len, 2, 1);
        push1(s, a, 2, 1, 5, g);
        CHECK(acks_count(&acks, 4) == 1 && acks_status(&acks, 4) == ST_STALE && a->clock == 2,
              "then it is acknowledged once with the first refusal (status %d)", acks_status(&acks, 4));

        /* Members {1}: a request closes its keys as it goes and is acknowledged
         * when its reader lets go. */
        uint32_t m1 = 1;
        store_set_members(s, &m1, 1, 2);
        PushReq *r6 = req_new(1, 1, 6);
        grad_fill(g, b->len, 1, 1);
        req_push(s, r6, b, g);
        grad_fill(g, c->len, 1, 0);
        PushReq *r7 = req_new(1, 0, 7);
        req_push(s, r7, c, g);
        CHECK(acks_count(&acks, 6) == 0 && acks_count(&acks, 7) == 0 && b->clock == 2 && c->clock == 1,
              "keys applied while the reader holds the requests: no ack yet");
        pushreq_settle(s, r6, ST_OK);
        pushreq_settle(s, r7, ST_OK);
        CHECK(acks_count(&acks, 6) == 1 && acks_status(&acks, 6) == ST_OK && acks_count(&acks, 7) == 1 &&
                      acks_status(&acks, 7) == ST_OK,
              "acknowledged OK once the reader settles");

        /* Two different refusals in one request: the first one is reported. */
        Chunk *d = key(s, 1, 0); /* b0, still at clock 0 */
        if (d) {
                PushReq *r8 = req_new(1, 1, 8);
                grad_fill(g, a->len, 1, 1);
                req_push(s, r8, a, g); /* worker 1 has pushed A for clock 1: DUPLICATE */
                grad_fill(g, c->len, 1, 1);
                req_push(s, r8, c, g); /* C is at clock 1: applied */
                grad_fill(g, d->len, 1, 1);
                req_push(s, r8, d, g); /* D is at clock 0: STALE */
                pushreq_settle(s, r8, ST_OK);
                CHECK(acks_count(&acks, 8) == 1 && acks_status(&acks, 8) == ST_DUPLICATE &&
                              c->clock == 2 && d->clock == 0 && a->steps == 2,
                      "first refusal wins: DUPLICATE before STALE (status %d)", acks_status(&acks, 8));
        }
        ref_done(&ra);
        ref_done(&rb);
out:
        store_free(s);
}

/* A new job id drops the old chunks (refusing their parked pushes) and starts
 * the new job's from its initial values. */
static void test_new_job(void) {
        uint32_t m12[2] = { 1, 2 }, one = 1;
        Job job, job2;
        Acks acks = { 0 };
        float g[MAXLEN], want[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        make_job(&job2, 8, MODE_BSP, "sgd");
        job2.seed = 4242;
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        grad_fill(g, c->len, 1, 0);
        push1(s, c, 1, 0, 1, g);
        ShardMap *map = make_map(3, &one, 1);
        int r = store_configure(s, &job2, map);
        shardmap_free(map);
        CHECK(r == 0 && s->job.id == 8 && s->has_job, "configure a new job id");
        CHECK(acks.n == 1 && acks_status(&acks, 1) == ST_SHUTTING_DOWN,
              "the old job's parked push is refused, once (status %d)", acks_status(&acks, 1));
        c = key(s, 0, 0);
        job_init_chunk(&job2, 0, 0, want);
        CHECK(c && c->clock == 0 && c->steps == 0 && c->npending == 0 && same(c->val->data, want, c->len),
              "the new job's chunk starts at its own initial values");
out:
        store_free(s);
}

/* lr_scaling: the step uses lr * W (W = members of the clock). */
static void test_lr_scaling(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job, scaled;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], mean[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        job.lr_scaling = true;
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL;
        if (!a)
                goto out;
        scaled = job;
        scaled.optim.lr = job.optim.lr * 2.0f;
        Ref r;
        ref_init(&r, &scaled, 0, 0);
        grad_fill(g1, a->len, 1, 0);
        grad_fill(g2, a->len, 2, 0);
        for (uint32_t j = 0; j < a->len; j++)
                mean[j] = (g1[j] + g2[j]) * (1.0f / 2.0f);
        ref_step(&r, mean);
        push1(s, a, 1, 0, 1, g1);
        push1(s, a, 2, 0, 2, g2);
        CHECK(a->clock == 1 && same(a->val->data, r.w, a->len),
              "lr_scaling with 2 members: optim_apply with lr * 2 of the mean gradient");
        ref_done(&r);
out:
        store_free(s);
}

/* SSP(s): a pull for clock c is ready once the slowest member completed c - s. */
static void test_ssp_gate(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        make_job(&job, 7, MODE_SSP, "sgd");
        job.staleness = 2;
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL;
        if (!a)
                goto out;
        store_set_config(s, MODE_SSP, 2, m12, NULL, 2, NULL, 0, 0, 2);
        int64_t slowest = -1;
        CHECK(store_pull_ready(s, &a, 1, 2, &slowest) && slowest == 0,
              "ssp:2: clock 2 is ready with the slowest at 0 (slowest %ld)", (long) slowest);
        CHECK(!store_pull_ready(s, &a, 1, 3, NULL), "ssp:2: clock 3 waits for the slowest at 0");
        for (int64_t c = 0; c < 4; c++) {
                grad_fill(g, a->len, 1, c);
                push1(s, a, 1, c, (uint64_t) (10 + c), g);
        }
        CHECK(a->steps == 4 && acks.n == 4, "ssp: pushes apply on arrival (%lu steps)", (unsigned long) a->steps);
        CHECK(!store_pull_ready(s, &a, 1, 5, &slowest) && slowest == 0,
              "worker 1 at clock 4 cannot pull clock 5 while worker 2 completed 0");
        grad_fill(g, a->len, 2, 0);
        push1(s, a, 2, 0, 20, g);
        grad_fill(g, a->len, 2, 1);
        push1(s, a, 2, 1, 21, g);
        CHECK(store_pull_ready(s, &a, 1, 4, &slowest) && slowest == 2 && !store_pull_ready(s, &a, 1, 5, NULL),
              "with the slowest at 2, clock 4 is ready and clock 5 is not (slowest %ld)", (long) slowest);
        CHECK(store_clock(s) == 4, "store_clock under SSP is the fastest member's progress (%ld)", (long) store_clock(s));
out:
        store_free(s);
}

/* A fence holds BSP clocks past the next one; a boundary switch keeps the old
 * membership below from_clock and the new one from it on. */
static void test_fence_boundary(void) {
        uint32_t m12[2] = { 1, 2 }, m123[3] = { 1, 2, 3 };
        int64_t starts[3] = { 0, 0, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Store *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL;
        if (!a)
                goto out;
        int64_t lo = -1, hi = -1;
        int64_t maxc = store_fence(s, &lo, &hi);
        CHECK(maxc == 0 && s->fence_limit == 1, "fence at clock 0: clock 0 may still close, clock 1 not");
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, a->len, w, 0);
                push1(s, a, w, 0, w, g);
        }
        CHECK(a->clock == 1, "clock 0 closes under the fence");
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, a->len, w, 1);
                push1(s, a, w, 1, 10 + w, g);
        }
        CHECK(a->clock == 1 && a->npending == 2, "clock 1 does not close while fenced");
        /* Worker 3 joins from clock 2: clock 1 closes with {1,2}, clock 2 needs {1,2,3}. */
        store_set_config(s, MODE_BSP, 0, m123, starts, 3, m12, 2, 2, 2);
        CHECK(a->clock == 2 && !s->fenced, "the boundary ends the fence; clock 1 closes with the old members");
        CHECK(store_cfg(s, 1)->nmembers == 2 && store_cfg(s, 2)->nmembers == 3,
              "clocks below 2 keep 2 members, from 2 on 3");
        CHECK(store_pull_ready(s, &a, 1, 2, NULL), "the joiner's first pull, clock 2, is ready");
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, a->len, w, 2);
                push1(s, a, w, 2, 20 + w, g);
        }
        CHECK(a->clock == 2, "clock 2 waits for the joiner");
        grad_fill(g, a->len, 3, 2);
        push1(s, a, 3, 2, 23, g);
        CHECK(a->clock == 3 && acks_status(&acks, 23) == ST_OK, "and closes with it");
out:
        store_free(s);
}

int main(void) {
        test_configure_two_shards();
        test_lookup();
        test_bsp_order();
        test_bsp_dedupe();
        test_bsp_non_member();
        test_membership_shrink();
        test_bsp_unaligned();
        test_asp();
        test_copy_on_write();
        test_multi_key();
        test_new_job();
        test_lr_scaling();
        test_ssp_gate();
        test_fence_boundary();
        return tap_done();
}
