/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/psd/psd-store.c: which keys a shard keeps under a map (and
 * what leaves when the map changes), how a key is looked up, copy-on-write
 * value buffers behind zero-copy pull replies, and a new job starting over.
 * Every expected value is computed here, independently of the store (see
 * psd-fixture.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "alloc.h"
#include "psd-fixture.h"
#include "psd-optim.h"
#include "tap.h"

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

static void on_move(void *ud, Chunk *c, const ShardDesc *dest, bool replica) {
        (void) dest;
        (void) ud;
        (void) replica;
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
        ShardMap *map = make_map(1, ids, 2, &job);
        Gate *g1 = open_store(1, &job, map, &a1), *g2 = open_store(2, &job, map, &a2);
        Store *s1 = g1 ? gate_store(g1) : NULL, *s2 = g2 ? gate_store(g2) : NULL;
        if (!CHECK(map && s1 && s2, "two stores configured under a 2-shard map"))
                goto out;

        size_t per = job_state_per_value(&job);
        uint64_t keys = 0, once = 0, by_map = 0, init_ok = 0, len_ok = 0, n1 = 0, n2 = 0;
        uint64_t bytes1 = 0, bytes2 = 0;
        float *want = fbuf(MAXLEN);
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        Chunk *c1 = s1->chunks[t][k], *c2 = s2->chunks[t][k];
                        Chunk *c = c1 ? c1 : c2;
                        uint32_t len = job_chunk_len(&job, t, k);
                        uint32_t owner = shardmap_owner_id(map, t, k);
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
        CHECK(s1->stats.nkeys == n1 && s2->stats.nkeys == n2, "nkeys counts the owned keys (%lu, %lu)",
              (unsigned long) s1->stats.nkeys, (unsigned long) s2->stats.nkeys);
        CHECK(s1->stats.bytes == bytes1 && s2->stats.bytes == bytes2,
              "bytes counts values and optimizer state of the owned keys");
        CHECK(len_ok == keys, "each owned chunk has its key and the job's length");
        CHECK(init_ok == keys, "each owned chunk starts at job_init_chunk, clock 0, no steps");
        CHECK(gate_clock(g1) == 0 && gate_clock(g2) == 0, "store_clock is 0 before any push");

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
        gate_set_members(g1, &one, 1, 1);
        gate_set_members(g2, w12, 2, 1);
        Chunk *kept = s1->chunks[t1][k1];
        float g[MAXLEN];
        Ref ref;
        ref_init(&ref, &job, t1, k1);
        grad_fill(g, kept->len, 1, 0);
        push1(g1, kept, 1, 0, 1, g);
        ref_step(&ref, g);
        grad_fill(g, s2->chunks[t2][k2]->len, 1, 0);
        push1(g2, s2->chunks[t2][k2], 1, 0, 2, g); /* parked: worker 2 has not pushed */
        CHECK(a2.n == 0, "shard 2: a push waiting for the other member is not acknowledged yet");

        ShardMap *solo = make_map(2, &one, 1, &job);
        moved_n = 0;
        s2->move = on_move;
        int r1 = gate_configure(g1, &job, solo), r2 = gate_configure(g2, &job, solo);
        CHECK(r1 == 0 && r2 == 0, "reconfigure under the one-shard map");
        CHECK(s2->stats.nkeys == 0 && moved_n == n2, "shard 2 hands over all its %lu keys (%zu moved)", (unsigned long) n2,
              moved_n);
        CHECK(s1->stats.nkeys == n1 && store_incoming(s1) == n2, "shard 1 keeps %lu and awaits %lu (incoming %lu)",
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
                const ChunkImage im = { .tensor = mv->t, .chunk = mv->k, .len = mv->len, .values = mv->val,
                                        .state = mv->state, .state_floats = mv->nstate, .steps = mv->steps,
                                        .clock = mv->clock, .last_clocks = mv->last, .nlast = mv->nlast };
                installed += gate_install_image(g1, &im) == 0;
        }
        CHECK(installed == n2 && s1->stats.nkeys == keys && store_incoming(s1) == 0,
              "shard 1 installs the %zu moved keys and owns all %lu", installed, (unsigned long) keys);
        Chunk *taken = s1->chunks[t2][k2];
        if (CHECK(taken != NULL, "shard 1 holds the key that moved from shard 2")) {
                job_init_chunk(&job, t2, k2, want);
                CHECK(same(taken->val->data, want, taken->len) && taken->clock == 0,
                      "the moved key arrives with the values it had (no update was applied)");
                /* The refused push was not applied: the worker may push that clock again. */
                float g2[MAXLEN];
                grad_fill(g2, taken->len, 1, 0);
                gate_set_members(g1, w12, 2, 2);
                push1(g1, taken, 1, 0, 3, g2);
                CHECK(taken->npending == 1, "the refused push is accepted again at the new owner");
        }
        const ChunkImage again = { .tensor = t1, .chunk = k1, .len = kept->len, .values = kept->val->data,
                                   .state = kept->state, .state_floats = kept->len };
        CHECK(gate_install_image(g1, &again) == -EEXIST,
              "installing a key that is already here is refused");
        for (size_t i = 0; i < moved_n; i++)
                moved_free(&moved[i]);
        ref_done(&ref);
        shardmap_free(solo);
        free(want);
out:
        shard_free(g1);
        shard_free(g2);
        shardmap_free(map);
}

static void test_lookup(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t ids[2] = { 1, 2 };
        Store *s = NULL;
        int st = -1;
        make_job(&job, 7, MODE_BSP, "sgd");

        (void) acks;
        const StoreConf sc = { .shard_id = 1 };
        store_new(&sc, &s);
        if (!CHECK(s != NULL, "store_new"))
                return;
        CHECK(!store_lookup(s, 0, 0, CHUNK_FLOATS, &st) && st == ST_NO_JOB,
              "before configure: NO_JOB (status %d)", st);
        CHECK(store_min_clock(s) == 0, "before configure: store_min_clock is 0");

        ShardMap *map = make_map(1, ids, 2, &job);
        store_configure(s, &job, map);
        uint32_t mt = UINT32_MAX, mk = 0, ot = UINT32_MAX, ok_ = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        bool mine = shardmap_owner_id(map, t, k) == 1;
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

static void test_copy_on_write(void) {
        uint32_t m1 = 1;
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN], snap0[MAXLEN], snap1[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *sh = open_solo(&job, &acks, &m1, 1);
        Store *s = sh ? gate_store(sh) : NULL;
        Chunk *c = sh ? key(sh, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);

        zmq_msg_t m1msg, m2msg, m3msg, m4msg;
        ValBuf *old = c->val;
        memcpy(snap0, c->val->data, len * sizeof(float));
        uint64_t pulls = s->stats.pulls;
        CHECK(store_value_msg(s, c, &m1msg) == 0, "store_value_msg");
        CHECK(zmq_msg_size(&m1msg) == len * sizeof(float) && zmq_msg_data(&m1msg) == (void *) old->data,
              "the reply frame is the chunk's buffer itself (zero copy)");
        CHECK(atomic_load(&old->refs) == 2 && s->stats.pulls == pulls + 1,
              "the reply holds a reference (refs %d)", atomic_load(&old->refs));

        grad_fill(g, len, 1, 0);
        ref_step(&ref, g);
        push1(sh, c, 1, 0, 1, g);
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
        push1(sh, c, 1, 1, 2, g);
        CHECK(c->val == cur && same(c->val->data, ref.w, len), "without a reply the update is in place");

        /* Two replies over one snapshot. */
        memcpy(snap1, c->val->data, len * sizeof(float));
        store_value_msg(s, c, &m2msg);
        store_value_msg(s, c, &m3msg);
        CHECK(atomic_load(&cur->refs) == 3, "two replies, two references (refs %d)",
              atomic_load(&cur->refs));
        grad_fill(g, len, 1, 2);
        ref_step(&ref, g);
        push1(sh, c, 1, 2, 3, g);
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
        sh = shard_free(sh);
        s = NULL;
        CHECK(same(zmq_msg_data(&m4msg), snap1, len), "a reply still reads its values after store_free");
        zmq_msg_close(&m4msg);
        ref_done(&ref);
out:
        shard_free(sh);
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
        Gate *sh = open_solo(&job, &acks, m12, 2);
        Store *s = sh ? gate_store(sh) : NULL;
        Chunk *c = sh ? key(sh, 0, 0) : NULL;
        if (!c)
                goto out;
        grad_fill(g, c->len, 1, 0);
        push1(sh, c, 1, 0, 1, g);
        ShardMap *map = make_map(3, &one, 1, &job2);
        int r = gate_configure(sh, &job2, map);
        shardmap_free(map);
        CHECK(r == 1 && s->job.id == 8 && s->has_job, "configure a new job id (a fresh job)");
        CHECK(acks.n == 1 && acks_status(&acks, 1) == ST_SHUTTING_DOWN,
              "the old job's parked push is refused, once (status %d)", acks_status(&acks, 1));
        c = key(sh, 0, 0);
        job_init_chunk(&job2, 0, 0, want);
        CHECK(c && c->clock == 0 && c->steps == 0 && c->npending == 0 && same(c->val->data, want, c->len),
              "the new job's chunk starts at its own initial values");
out:
        shard_free(sh);
}

/* A job's first chunks built elsewhere (the thread pool, checkpoint_seed):
 * with restoring set the first map creates none, and an image that hands over
 * its buffers becomes the chunk without a copy; an image refused leaves them
 * to the caller. */
static void test_adopt(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t one = 1;
        make_job(&job, 9, MODE_BSP, "sgd");
        Store *s = NULL;
        ShardMap *map = make_map(1, &one, 1, &job);
        (void) acks;
        const StoreConf sc = { .shard_id = 1 };
        if (!CHECK(map && store_new(&sc, &s) == 0, "a store"))
                goto out;
        store_set_restoring(s, true);
        CHECK(store_configure(s, &job, map) == 1 && s->stats.nkeys == 0 && store_incoming(s) == job_nkeys(&job),
              "with restoring set, the first map creates no chunk (%lu awaited)", (unsigned long) store_incoming(s));
        uint32_t len = job_chunk_len(&job, 0, 0);
        size_t per = job_state_per_value(&job);
        ValBuf *v = store_value_new(len);
        float *st = ps_calloc(per ? (size_t) len * per : 1, sizeof(float));
        if (!CHECK(v && st, "buffers"))
                goto out;
        job_init_chunk(&job, 0, 0, v->data);
        const ChunkImage im = { .tensor = 0, .chunk = 0, .len = len, .state_floats = per * len, .restored = true,
                                .adopt_values = v, .adopt_state = st };
        Chunk *c = NULL;
        CHECK(store_install_image(s, &im, &c) == 0 && c == s->chunks[0][0], "an image handing over its buffers installs");
        CHECK(c && c->val == v && c->state == st && s->stats.nkeys == 1, "the chunk holds those very buffers (no copy)");
        ValBuf *v2 = store_value_new(len);
        float *st2 = ps_calloc(per ? (size_t) len * per : 1, sizeof(float));
        Chunk *c2 = NULL;
        const ChunkImage im2 = { .tensor = 0, .chunk = 0, .len = len, .state_floats = per * len, .restored = true,
                                 .adopt_values = v2, .adopt_state = st2 };
        CHECK(v2 && st2 && store_install_image(s, &im2, &c2) == -EEXIST && s->chunks[0][0] == c && c->val == v,
              "a second image of a key held is refused, and the chunk keeps its own");
        store_value_unref(v2); /* refused: still the caller's (ASan would see a double free or a leak) */
        ps_free(st2);
        store_set_restoring(s, false);
        CHECK(store_create_missing(s) == 0 && store_incoming(s) == 0 && s->stats.nkeys == job_nkeys(&job),
              "store_create_missing builds the rest from the seed");
out:
        shardmap_free(map);
        store_free(s);
}

int main(void) {
        test_adopt();
        test_configure_two_shards();
        test_lookup();
        test_copy_on_write();
        test_new_job();
        return tap_done();
}
