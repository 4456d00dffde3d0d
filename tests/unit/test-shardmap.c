/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/shardmap.c: an explicit placement that gives every
 * shard its share of the bytes within 10% once chunks are cut to a tenth of
 * a share (job_fair_chunk), that depends only on the job and the shard ids,
 * that moves only what it must when shards come and go; and the checks on a
 * map that arrives from the network. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shardmap.h"
#include "tap.h"

static ShardDesc descs[16];
static char names[16][40];

static void make_descs(const uint32_t *ids, size_t n) {
        for (size_t i = 0; i < n; i++) {
                snprintf(names[i], sizeof names[i], "ipc:///tmp/psd-%u.sock", ids[i]);
                descs[i] = (ShardDesc) { .id = ids[i], .endpoint = names[i] };
        }
}

static Job job_of(const char *model, uint32_t chunk_floats) {
        Job j;
        job_defaults(&j);
        j.chunk_floats = chunk_floats;
        if (job_set_model(&j, model) < 0)
                CHECK(false, "model %s", model);
        return j;
}

/* Each shard's bytes under m (indexed as shardmap_shard); returns the total. */
static uint64_t loads(const ShardMap *m, const Job *job, uint64_t *load) {
        uint64_t total = 0;
        memset(load, 0, shardmap_size(m) * sizeof *load);
        for (uint32_t t = 0; t < job->ntensors; t++)
                for (uint32_t c = 0; c < job->tensors[t].nchunks; c++) {
                        uint64_t b = (uint64_t) job_chunk_len(job, t, c) * 4;
                        load[shardmap_lookup(m, t, c)] += b;
                        total += b;
                }
        return total;
}

/* The largest deviation of a shard's bytes from an even share, as a fraction of it. */
static double spread(const ShardMap *m, const Job *job) {
        uint64_t load[16];
        double share = (double) loads(m, job, load) / (double) shardmap_size(m), worst = 0;
        for (size_t i = 0; i < shardmap_size(m); i++) {
                double d = ((double) load[i] - share) / share;
                worst = d < 0 ? (-d > worst ? -d : worst) : (d > worst ? d : worst);
        }
        return worst;
}

static void test_basics(void) {
        const uint32_t ids[4] = { 30, 10, 40, 20 };
        Job job = job_of("mlp:784-256-10", 4096);
        ShardMap *m = NULL, *m2 = NULL;
        make_descs(ids, 4);
        int r = shardmap_place(17, descs, 4, &job, &m);
        if (!CHECK(r == 0 && m, "shardmap_place over 4 shards (%d)", r))
                return;
        CHECK(shardmap_epoch(m) == 17 && shardmap_size(m) == 4, "epoch and size kept");
        CHECK(shardmap_shard(m, 0)->id == 10 && shardmap_shard(m, 1)->id == 20 && shardmap_shard(m, 2)->id == 30 &&
              shardmap_shard(m, 3)->id == 40, "shards sorted by id");
        CHECK(strcmp(shardmap_shard(m, 2)->endpoint, "ipc:///tmp/psd-30.sock") == 0, "endpoint follows its id");
        names[1][0] = 'X';
        CHECK(shardmap_shard(m, 0)->endpoint[0] == 'i', "endpoints are copied");
        CHECK(shardmap_find(m, 30) == 2 && shardmap_find(m, 25) == -ENOENT, "find by id");
        CHECK(shardmap_nkeys(m) == job_nkeys(&job) && shardmap_ntensors(m) == job.ntensors &&
              shardmap_tensor_chunks(m, 0) == job.tensors[0].nchunks, "the layout is the job's (%zu keys)",
              shardmap_nkeys(m));
        CHECK(shardmap_fits_job(m, &job), "fits its job");
        Job other = job_of("mlp:784-256-10", 8192);
        CHECK(!shardmap_fits_job(m, &other), "not a job chunked otherwise");
        CHECK(shardmap_lookup(m, 4, 0) == -ENOENT && shardmap_lookup(m, 0, job.tensors[0].nchunks) == -ENOENT,
              "a key outside the map: -ENOENT");
        CHECK(shardmap_owner_id(m, 99, 0) == 0 && shardmap_owner_id(m, 0, 0) >= 10, "owner ids (0: none)");

        /* The same shards in another order: the same placement. */
        const uint32_t ids2[4] = { 40, 20, 30, 10 };
        make_descs(ids2, 4);
        r = shardmap_place(18, descs, 4, &job, &m2);
        CHECK(r == 0 && m2 && memcmp(shardmap_owners(m), shardmap_owners(m2), shardmap_nkeys(m) * 4) == 0,
              "placement does not depend on the order shards are given in");
        shardmap_free(m2);
        m2 = shardmap_dup(m);
        CHECK(m2 && shardmap_epoch(m2) == 17 && memcmp(shardmap_owners(m), shardmap_owners(m2),
                                                        shardmap_nkeys(m) * 4) == 0 &&
                      strcmp(shardmap_shard(m2, 3)->endpoint, shardmap_shard(m, 3)->endpoint) == 0,
              "shardmap_dup copies everything");
        shardmap_free(m2);
        shardmap_free(m);
}

/* The demo's model (one 784 KiB tensor, three small ones) in 1 MiB chunks is 4
 * keys: no placement can even that out. Cut to a tenth of a share, it can. */
static void test_fair(void) {
        const uint32_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        make_descs(ids, 8);
        Job coarse = job_of("mlp:784-256-10", JOB_DEFAULT_CHUNK_FLOATS);
        ShardMap *m = NULL;
        uint64_t load[16];
        if (shardmap_place(1, descs, 2, &coarse, &m) == 0) {
                loads(m, &coarse, load);
                CHECK(load[0] && load[1], "4 uncut keys on 2 shards: neither is empty (%lu, %lu bytes)",
                      (unsigned long) load[0], (unsigned long) load[1]);
                m = shardmap_free(m);
        }
        static const char *models[] = { "mlp:784-256-10", "mlp:784-1024-1024-10", "mlp:784-4096-10",
                                         "mlp:100-3000-7-50-10", "mlp:784-64-10" };
        for (size_t i = 0; i < sizeof models / sizeof *models; i++)
                for (size_t s = 1; s <= 8; s++) {
                        Job job = job_of(models[i], JOB_DEFAULT_CHUNK_FLOATS);
                        uint32_t fair = job_fair_chunk(&job, s);
                        CHECK(fair <= job.chunk_floats && job_set_chunk(&job, fair) == 0, "cut %s for %zu shards",
                              models[i], s);
                        if (shardmap_place(1, descs, s, &job, &m) < 0) {
                                CHECK(false, "place %s on %zu shards", models[i], s);
                                continue;
                        }
                        double d = spread(m, &job);
                        CHECK(d <= 0.10, "%s on %zu shards (%lu keys of %u floats): every shard within %.1f%% "
                              "of an even share", models[i], s, (unsigned long) job_nkeys(&job), fair, 100 * d);
                        m = shardmap_free(m);
                }
        /* A big model keeps its chunks: a tenth of a share is larger than 1 MiB. */
        Job big = job_of("mlp:4096-8192-8192-10", JOB_DEFAULT_CHUNK_FLOATS);
        CHECK(job_fair_chunk(&big, 4) == JOB_DEFAULT_CHUNK_FLOATS, "a 512 MiB model on 4 shards keeps 1 MiB chunks");
}

/* Shards come and go: only the keys that must move, move. */
static void test_change(void) {
        const uint32_t ids[5] = { 1, 2, 3, 4, 5 };
        Job job = job_of("mlp:784-1024-1024-10", JOB_DEFAULT_CHUNK_FLOATS);
        job_set_chunk(&job, job_fair_chunk(&job, 4));
        make_descs(ids, 5);
        ShardMap *m4 = NULL, *m5 = NULL, *m3 = NULL;
        if (shardmap_place(1, descs, 4, &job, &m4) < 0 || shardmap_change(m4, 2, descs, 5, &job, &m5) < 0) {
                CHECK(false, "maps for the movement test");
                goto out;
        }
        uint64_t load[16], total = loads(m5, &job, load), moved = 0, wrong = 0, maxkey = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t c = 0; c < job.tensors[t].nchunks; c++) {
                        uint64_t b = (uint64_t) job_chunk_len(&job, t, c) * 4;
                        maxkey = b > maxkey ? b : maxkey;
                        uint32_t a = shardmap_owner_id(m4, t, c), z = shardmap_owner_id(m5, t, c);
                        if (a != z) {
                                moved += b;
                                wrong += z != 5; /* a key moves only to the new shard */
                        }
                }
        CHECK(wrong == 0, "adding shard 5: keys move only to it (%lu moved elsewhere)", (unsigned long) wrong);
        CHECK(moved <= total / 5 + maxkey && moved + maxkey >= total / 5,
              "it receives its share: %lu of %lu bytes moved (a fifth is %lu)", (unsigned long) moved,
              (unsigned long) total, (unsigned long) (total / 5));
        CHECK(spread(m5, &job) <= 0.15, "5 shards within 15%% of even (%.1f%%; chunks were cut for 4)",
              100 * spread(m5, &job));
        /* Shard 2 leaves: only its keys move, and to the others evenly. */
        const uint32_t left[4] = { 1, 3, 4, 5 };
        make_descs(left, 4);
        if (shardmap_change(m5, 3, descs, 4, &job, &m3) < 0) {
                CHECK(false, "map without shard 2");
                goto out;
        }
        uint64_t stays = 0;
        wrong = moved = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t c = 0; c < job.tensors[t].nchunks; c++) {
                        uint32_t a = shardmap_owner_id(m5, t, c), z = shardmap_owner_id(m3, t, c);
                        wrong += a != 2 && a != z;
                        moved += a == 2;
                        stays += z == 2;
                }
        CHECK(wrong == 0 && moved > 0 && stays == 0, "removing shard 2: its %lu keys move, no other",
              (unsigned long) moved);
        CHECK(spread(m3, &job) <= 0.10, "4 shards again within 10%% (%.1f%%)", 100 * spread(m3, &job));
        Job other = job_of("mlp:784-256-10", 4096);
        ShardMap *x = (ShardMap *) 0x1;
        CHECK(shardmap_change(m3, 4, descs, 4, &other, &x) == -EINVAL && x == (ShardMap *) 0x1,
              "changing a map for another job's keys is refused");
out:
        shardmap_free(m3);
        shardmap_free(m4);
        shardmap_free(m5);
}

/* A map from the network is checked before anything reads it. */
static void test_from_owners(void) {
        const uint32_t ids[3] = { 1, 2, 3 }, unsorted[3] = { 2, 1, 3 }, dup[3] = { 1, 1, 3 };
        const uint32_t chunks[2] = { 3, 1 }, owners[4] = { 0, 1, 2, 1 }, bad[4] = { 0, 1, 3, 1 };
        ShardMap *m = (ShardMap *) 0x1;
        make_descs(ids, 3);
        CHECK(shardmap_from_owners(5, descs, 3, chunks, 2, bad, 4, &m) == -EINVAL, "an owner past the shards");
        CHECK(shardmap_from_owners(5, descs, 3, chunks, 2, owners, 3, &m) == -EINVAL, "too few owners");
        CHECK(shardmap_from_owners(5, descs, 3, chunks, 2, owners, 5, &m) == -EINVAL, "too many owners");
        CHECK(shardmap_from_owners(5, descs, 0, chunks, 2, owners, 4, &m) == -EINVAL, "no shards");
        CHECK(shardmap_from_owners(5, descs, 3, NULL, 2, owners, 4, &m) == -EINVAL, "no layout");
        CHECK(shardmap_from_owners(5, descs, 3, chunks, JOB_MAX_TENSORS + 1, owners, 4, &m) == -EINVAL,
              "too many tensors");
        const uint32_t huge[2] = { SHARDMAP_MAX_KEYS, 1 };
        CHECK(shardmap_from_owners(5, descs, 3, huge, 2, owners, 4, &m) == -EINVAL, "too many keys");
        make_descs(unsorted, 3);
        CHECK(shardmap_from_owners(5, descs, 3, chunks, 2, owners, 4, &m) == -EINVAL, "shards not in id order");
        make_descs(dup, 3);
        CHECK(shardmap_from_owners(5, descs, 3, chunks, 2, owners, 4, &m) == -EINVAL, "duplicate ids");
        CHECK(m == (ShardMap *) 0x1, "ret untouched on failure");
        make_descs(ids, 3);
        m = NULL;
        CHECK(shardmap_from_owners(5, descs, 3, chunks, 2, owners, 4, &m) == 0 && m, "a good map");
        if (m)
                CHECK(shardmap_owner_id(m, 0, 2) == 3 && shardmap_owner_id(m, 1, 0) == 2 &&
                      shardmap_lookup(m, 1, 1) == -ENOENT, "owners by key");
        shardmap_free(m);
        Job job = job_of("mlp:784-256-10", 4096);
        CHECK(shardmap_place(1, descs, 0, &job, &m) == -EINVAL && shardmap_place(1, NULL, 2, &job, &m) == -EINVAL,
              "placing on no shards");
}

/* Replicas: each key on its owner and the next R-1 shards in id order; a
 * fail-over gives a dead shard's keys to their first live backup and moves
 * nothing else; a key whose every copy is gone is named. */
static void test_replicas(void) {
        const uint32_t ids[4] = { 10, 20, 30, 40 };
        Job job = job_of("mlp:784-256-10", 4096);
        ShardMap *m = NULL, *f = NULL, *g = NULL;
        make_descs(ids, 4);
        if (!CHECK(shardmap_place(5, descs, 4, &job, &m) == 0, "place over 4 shards"))
                return;
        CHECK(shardmap_replicas(m) == 1, "one copy unless set");
        shardmap_set_replicas(m, 9);
        CHECK(shardmap_replicas(m) == 4, "at most one copy per shard (9 asked, %u kept)", shardmap_replicas(m));
        shardmap_set_replicas(m, 2);
        size_t nk = shardmap_nkeys(m), ring_ok = 0, rank_ok = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t c = 0; c < job.tensors[t].nchunks; c++) {
                        int o = shardmap_lookup(m, t, c), b = shardmap_holder(m, t, c, 1);
                        ring_ok += shardmap_holder(m, t, c, 0) == o && b == (o + 1) % 4 &&
                                   shardmap_holder(m, t, c, 2) == -ENOENT;
                        uint32_t oid = shardmap_shard(m, (size_t) o)->id, bid = shardmap_shard(m, (size_t) b)->id;
                        int others = 0;
                        for (size_t i = 0; i < 4; i++)
                                others += shardmap_holder_rank(m, t, c, ids[i]) < 0;
                        rank_ok += shardmap_holder_rank(m, t, c, oid) == 0 && shardmap_holder_rank(m, t, c, bid) == 1 &&
                                   others == 2;
                }
        CHECK(ring_ok == nk, "every key's backup is the next shard by id, cyclically (%zu of %zu)", ring_ok, nk);
        CHECK(rank_ok == nk, "holder ranks: 0 the owner, 1 the backup, -1 the rest (%zu of %zu)", rank_ok, nk);
        uint64_t bytes[4], load[4], total = loads(m, &job, load), sum = 0;
        shardmap_bytes(m, &job, bytes);
        for (size_t i = 0; i < 4; i++)
                sum += bytes[i];
        CHECK(sum == 2 * total * 2, "shardmap_bytes counts both copies (values + momentum): %llu",
              (unsigned long long) sum);
        ShardMap *d = shardmap_dup(m);
        CHECK(d && shardmap_replicas(d) == 2, "shardmap_dup keeps the replicas");
        shardmap_free(d);

        uint32_t dead = 20, lt = 99, lk = 99;
        int r = shardmap_failover(m, 6, &dead, 1, &f, &lt, &lk);
        if (!CHECK(r == 0 && f, "fail-over of shard 20 (%d)", r))
                goto out;
        CHECK(shardmap_epoch(f) == 6 && shardmap_size(f) == 3 && shardmap_find(f, 20) < 0 && shardmap_replicas(f) == 2,
              "the new map: epoch 6, shards 10 30 40, two copies");
        size_t promoted = 0, kept = 0, stray = 0;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t c = 0; c < job.tensors[t].nchunks; c++) {
                        uint32_t was = shardmap_owner_id(m, t, c), now = shardmap_owner_id(f, t, c);
                        if (was == 20)
                                promoted += now == shardmap_shard(m, (size_t) shardmap_holder(m, t, c, 1))->id;
                        else if (was == now)
                                kept++;
                        else
                                stray++;
                }
        CHECK(promoted + kept == nk && stray == 0,
              "shard 20's keys went to their backup (%zu), no other key moved (%zu kept, %zu moved)", promoted, kept,
              stray);
        /* Two neighbours gone at once with two copies: some key had both. */
        uint32_t both[2] = { 30, 40 };
        r = shardmap_failover(m, 7, both, 2, &g, &lt, &lk);
        bool lost_named = r == -ENODATA && shardmap_owner_id(m, lt, lk) == 30;
        CHECK(lost_named, "30 and 40 together: -ENODATA naming a key of 30 backed up on 40 (%d, key %u,%u)", r, lt,
              lk);
        shardmap_free(g);
        uint32_t all[4] = { 10, 20, 30, 40 };
        g = NULL;
        CHECK(shardmap_failover(m, 8, all, 4, &g, NULL, NULL) == -ENODATA && !g, "no shard left: -ENODATA");
out:
        shardmap_free(f);
        shardmap_free(m);
}

/* Rows of a table by rendezvous hashing: a similar share on every shard,
 * the same whatever order the shards came in, copies on distinct shards, and
 * only the rows that must move when a shard comes, leaves or fails. */
static void test_rows(void) {
        const uint32_t ids3[3] = { 7, 3, 11 }, ids4[4] = { 3, 7, 11, 12 }, rev3[3] = { 11, 7, 3 };
        Job job = job_of("mlp:784-256-10", 4096);
        ShardMap *m3 = NULL, *m4 = NULL, *r3 = NULL, *f = NULL;
        make_descs(ids3, 3);
        int r = shardmap_place(1, descs, 3, &job, &m3);
        make_descs(rev3, 3);
        r = r == 0 ? shardmap_place(1, descs, 3, &job, &r3) : r;
        make_descs(ids4, 4);
        r = r == 0 ? shardmap_place(2, descs, 4, &job, &m4) : r;
        if (!CHECK(r == 0, "maps over 3, 3 reversed and 4 shards"))
                goto out;
        shardmap_set_replicas(m3, 2);
        shardmap_set_replicas(r3, 2);
        enum { N = 300000 };
        size_t share[3] = { 0 }, same = 0, distinct = 0, moved_new = 0, moved_other = 0, none = 0, ranked = 0;
        for (int64_t k = 0; k < N; k++) {
                int64_t id = k * 2654435761 - 77; /* spread ids, negatives among them */
                int p = shardmap_row_holder(m3, 1, id, 0), b = shardmap_row_holder(m3, 1, id, 1);
                share[p]++;
                same += p == shardmap_row_holder(r3, 1, id, 0) && b == shardmap_row_holder(r3, 1, id, 1);
                distinct += b >= 0 && b != p;
                none += shardmap_row_holder(m3, 1, id, 2) == -ENOENT;
                uint32_t was = shardmap_shard(m3, (size_t) p)->id,
                         now = shardmap_shard(m4, (size_t) shardmap_row_holder(m4, 1, id, 0))->id;
                moved_new += now == 12;
                moved_other += now != was && now != 12;
                for (size_t s = 0; s < 3; s++) {
                        uint32_t sid = shardmap_shard(m3, s)->id;
                        int rank = shardmap_row_rank(m3, 1, id, sid);
                        ranked += rank == ((int) s == p ? 0 : (int) s == b ? 1 : -1);
                }
        }
        CHECK(ranked == 3 * (size_t) N && shardmap_row_rank(m3, 1, 5, 12) == -1,
              "each shard's rank of a row is the copy it holds (%zu of %d), none for a shard not in the map",
              ranked, 3 * N);
        for (size_t i = 0; i < 3; i++)
                CHECK(share[i] > N / 3 * 97 / 100 && share[i] < N / 3 * 103 / 100,
                      "shard %u holds %zu of %d rows (within 3%% of a third)", shardmap_shard(m3, i)->id, share[i], N);
        CHECK(same == N, "the same holders whatever order the shards came in (%zu of %d)", same, N);
        CHECK(distinct == N && none == N, "two copies on distinct shards, no third (%zu, %zu of %d)", distinct, none,
              N);
        CHECK(moved_new > N / 4 * 95 / 100 && moved_new < N / 4 * 105 / 100 && moved_other == 0,
              "a fourth shard takes a quarter of the rows (%zu of %d), no other row moves (%zu)", moved_new, N,
              moved_other);
        uint32_t dead = 7, lt, lk;
        if (!CHECK(shardmap_failover(m3, 3, &dead, 1, &f, &lt, &lk) == 0, "fail-over of shard 7"))
                goto out;
        size_t to_backup = 0, stray = 0;
        for (int64_t id = 0; id < 30000; id++) {
                uint32_t was = shardmap_shard(m3, (size_t) shardmap_row_holder(m3, 0, id, 0))->id,
                         backup = shardmap_shard(m3, (size_t) shardmap_row_holder(m3, 0, id, 1))->id,
                         now = shardmap_shard(f, (size_t) shardmap_row_holder(f, 0, id, 0))->id;
                to_backup += was == 7 && now == backup;
                stray += was != 7 && now != was;
        }
        CHECK(to_backup > 9000 && stray == 0, "shard 7's rows went to their backups (%zu), no other row moved (%zu)",
              to_backup, stray);
        CHECK(shardmap_row_holder(m3, 0, 5, 0) != shardmap_row_holder(m3, 1, 5, 0) ||
                      shardmap_row_holder(m3, 0, 6, 0) != shardmap_row_holder(m3, 1, 6, 0) ||
                      shardmap_row_holder(m3, 0, 8, 0) != shardmap_row_holder(m3, 1, 8, 0),
              "the same id in two tables is two rows, placed apart");
out:
        shardmap_free(f);
        shardmap_free(m3);
        shardmap_free(r3);
        shardmap_free(m4);
}

int main(void) {
        test_basics();
        test_rows();
        test_replicas();
        test_fair();
        test_change();
        test_from_owners();
        return tap_done();
}
