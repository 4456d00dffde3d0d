/* Unit tests for common/shardmap.c: determinism, balance, minimal movement
 * when a shard joins or leaves, argument checks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "shardmap.h"
#include "tap.h"

#define NKEYS 100000u

/* Keys shaped like a job's: 20 tensors of 5000 chunks. */
static void key_of(uint32_t i, uint32_t *t, uint32_t *c) {
        *t = i / 5000u;
        *c = i % 5000u;
}

static ShardDesc descs[8];
static char names[8][32];

static void make_descs(const uint32_t *ids, size_t n) {
        for (size_t i = 0; i < n; i++) {
                snprintf(names[i], sizeof names[i], "ipc:///tmp/psd-%u.sock", ids[i]);
                descs[i].id = ids[i];
                descs[i].endpoint = names[i];
        }
}

/* Owner id of every key. */
static uint32_t *owners(const ShardMap *m) {
        uint32_t *o = malloc(NKEYS * sizeof *o);
        if (!o) {
                fprintf(stderr, "out of memory\n");
                exit(2);
        }
        for (uint32_t i = 0; i < NKEYS; i++) {
                uint32_t t, c;
                key_of(i, &t, &c);
                o[i] = shardmap_shard(m, shardmap_lookup(m, t, c))->id;
        }
        return o;
}

static void test_basics(void) {
        const uint32_t ids[4] = { 30, 10, 40, 20 };
        ShardMap *m = NULL, *m2 = NULL;
        int r;

        make_descs(ids, 4);
        r = shardmap_new(17, 64, descs, 4, &m);
        CHECK(r == 0 && m, "shardmap_new over 4 shards (%d)", r);
        if (!m)
                return;
        CHECK(shardmap_epoch(m) == 17, "epoch kept");
        CHECK(shardmap_vnodes(m) == 64, "vnodes kept");
        CHECK(shardmap_size(m) == 4, "size");
        CHECK(shardmap_shard(m, 0)->id == 10 && shardmap_shard(m, 1)->id == 20 && shardmap_shard(m, 2)->id == 30 &&
              shardmap_shard(m, 3)->id == 40, "shards sorted by id");
        CHECK(strcmp(shardmap_shard(m, 2)->endpoint, "ipc:///tmp/psd-30.sock") == 0, "endpoint follows its id");
        CHECK(shardmap_shard(m, 0)->endpoint != descs[1].endpoint, "endpoints are copied");
        names[1][0] = 'X';
        CHECK(shardmap_shard(m, 0)->endpoint[0] == 'i', "the copy does not change with the caller's string");
        CHECK(shardmap_find(m, 30) == 2 && shardmap_find(m, 10) == 0, "find by id");
        CHECK(shardmap_find(m, 25) == -ENOENT && shardmap_find(m, 0) == -ENOENT && shardmap_find(m, 99) == -ENOENT,
              "find of a missing id is -ENOENT");

        /* The same shards in another order give the same map. */
        {
                const uint32_t ids2[4] = { 40, 30, 20, 10 };
                bool same = true;
                make_descs(ids2, 4);
                r = shardmap_new(18, 64, descs, 4, &m2);
                CHECK(r == 0, "second map");
                for (uint32_t i = 0; m2 && i < NKEYS; i++) {
                        uint32_t t, c;
                        key_of(i, &t, &c);
                        if (shardmap_shard(m, shardmap_lookup(m, t, c))->id !=
                            shardmap_shard(m2, shardmap_lookup(m2, t, c))->id)
                                same = false;
                }
                CHECK(same, "placement does not depend on the order shards are given in");
                CHECK(shardmap_lookup(m, 3, 4) == shardmap_lookup(m, 3, 4), "lookup is deterministic");
                m2 = shardmap_free(m2);
        }
        CHECK(shardmap_hash(1, 2) == shardmap_hash(1, 2) && shardmap_hash(1, 2) != shardmap_hash(2, 1) &&
              shardmap_hash(0, 0) != 0, "hash is a deterministic, order-sensitive function");
        m = shardmap_free(m);
        CHECK(m == NULL && shardmap_free(NULL) == NULL, "free returns NULL and takes NULL");
}

static void test_single(void) {
        const uint32_t ids[1] = { 5 };
        ShardMap *m = NULL;
        bool all = true;
        make_descs(ids, 1);
        CHECK(shardmap_new(1, 1, descs, 1, &m) == 0, "one shard, one vnode");
        for (uint32_t i = 0; m && i < 1000; i++)
                all = all && shardmap_lookup(m, i, i * 7) == 0;
        CHECK(all, "one shard owns every key");
        shardmap_free(m);
}

static void test_invalid(void) {
        const uint32_t dup[3] = { 1, 2, 1 };
        ShardMap *m = (ShardMap *) 0x1;
        make_descs(dup, 3);
        CHECK(shardmap_new(1, 64, descs, 3, &m) == -EINVAL, "duplicate ids refused");
        CHECK(m == (ShardMap *) 0x1, "ret untouched on failure");
        CHECK(shardmap_new(1, 64, descs, 0, &m) == -EINVAL, "zero shards refused");
        CHECK(shardmap_new(1, 0, descs, 2, &m) == -EINVAL, "zero vnodes refused");
        CHECK(shardmap_new(1, 4097, descs, 2, &m) == -EINVAL, "4097 vnodes refused");
        CHECK(shardmap_new(1, 64, NULL, 2, &m) == -EINVAL, "NULL shards refused");
        m = NULL;
        CHECK(shardmap_new(1, 4096, descs, 2, &m) == 0, "4096 vnodes accepted");
        shardmap_free(m);
}

static void test_balance_and_movement(void) {
        const uint32_t ids5[5] = { 0, 1, 2, 3, 4 };
        ShardMap *m4 = NULL, *m5 = NULL, *m3 = NULL;
        uint32_t *o4, *o5, *o3;
        unsigned count[5] = { 0 };
        unsigned moved = 0, wrong = 0;
        double lo = 1, hi = 0;

        make_descs(ids5, 5);
        if (shardmap_new(1, SHARDMAP_DEFAULT_VNODES, descs, 4, &m4) < 0 ||
            shardmap_new(2, SHARDMAP_DEFAULT_VNODES, descs, 5, &m5) < 0) {
                CHECK(false, "maps for the movement test");
                return;
        }
        o4 = owners(m4);
        o5 = owners(m5);

        /* Balance: 4 shards, 64 vnodes, 100k keys. With v vnodes a shard's share
         * has a relative spread of about 1/sqrt(v) = 12.5%; this hash gives
         * 0.242 .. 0.257, and we allow 15%. */
        for (uint32_t i = 0; i < NKEYS; i++)
                count[o4[i]]++;
        for (int s = 0; s < 4; s++) {
                double share = (double) count[s] / NKEYS;
                lo = share < lo ? share : lo;
                hi = share > hi ? share : hi;
        }
        printf("# 4 shards x 64 vnodes: shares %.3f .. %.3f (ideal 0.250)\n", lo, hi);
        CHECK(lo >= 0.25 * 0.85 && hi <= 0.25 * 1.15, "each of 4 shards holds 25%% +- 15%% of the keys");
        for (int s = 0; s < 4; s++)
                CHECK(count[s] > 0, "shard %d owns keys", s);

        /* Adding shard 4: only keys that now belong to it move. */
        for (uint32_t i = 0; i < NKEYS; i++)
                if (o4[i] != o5[i]) {
                        moved++;
                        if (o5[i] != 4)
                                wrong++;
                }
        printf("# adding a 5th shard moved %.3f of the keys (ideal 0.200)\n", (double) moved / NKEYS);
        CHECK(wrong == 0, "every moved key goes to the new shard (%u do not)", wrong);
        CHECK((double) moved / NKEYS > 0.1 && (double) moved / NKEYS < 0.3, "about 1/5 of the keys move (%u)", moved);

        /* Removing shard 2 from the 4: only its keys move. */
        {
                ShardDesc three[3] = { descs[0], descs[1], descs[3] };
                unsigned lost = 0, other = 0;
                if (shardmap_new(3, SHARDMAP_DEFAULT_VNODES, three, 3, &m3) < 0) {
                        CHECK(false, "map without shard 2");
                } else {
                        o3 = owners(m3);
                        for (uint32_t i = 0; i < NKEYS; i++) {
                                if (o4[i] == 2) {
                                        lost++;
                                        if (o3[i] == 2)
                                                other++;
                                } else if (o3[i] != o4[i])
                                        other++;
                        }
                        CHECK(lost == count[2] && other == 0,
                              "removing a shard moves exactly its keys, and none of the others (%u)", other);
                        free(o3);
                        shardmap_free(m3);
                }
        }
        free(o4);
        free(o5);
        shardmap_free(m4);
        shardmap_free(m5);
}

int main(void) {
        test_basics();
        test_single();
        test_invalid();
        test_balance_and_movement();
        return tap_done();
}
