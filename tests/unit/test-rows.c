/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/psd/psd-rows.c: a job's tables on one shard of two, rows
 * pulled and pushed by id: initial values before any push, a push applied
 * once with the table's optimizer (sgd: w - lr g, checked by hand), and each
 * refusal (another shard's row, a duplicate clock, a clock far ahead, a
 * non-finite value, the norm bound, the memory limit, a wrong row width, an
 * unknown table) applying nothing; under BSP, the members' pushes of a
 * clock parked until the last, then their mean applied once and each
 * acknowledged, a pull past an open clock asked to wait; a checkpoint's
 * copy of the rows loads back bit for bit; a primary lost at a clock whose
 * copy reached its backup, did not, or was never made: the workers' pushes
 * sent again leave the backup holding every row as one shard that took
 * every push would, bit for bit; rows moved at a map change (a shard
 * added, one removed with a single copy) end the same, on all their
 * copies. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "job.h"
#include "macro.h"
#include "psd-rows.h"
#include "shardmap.h"
#include "tap.h"
#include "wire.h"

static ShardMap *map;
static Rows *rows;
static uint32_t self_id = 1; /* the shard pull() asks */

static void frame(zmq_msg_t *m, const void *p, size_t n) {
        zmq_msg_init_size(m, n);
        if (n)
                memcpy(zmq_msg_data(m), p, n);
}

static Psnet__Header header(Psnet__MsgType type, uint32_t table, uint32_t worker, int64_t clock) {
        Psnet__Header h;
        wire_header_init(&h, type);
        h.has_table = h.has_sender = h.has_clock = h.has_seq = true;
        h.table = table, h.sender = worker, h.clock = clock, h.seq = (uint64_t) clock + 1;
        return h;
}

/* Pulls n rows of table into out (dim floats each): the status. */
static int pull(uint32_t table, const int64_t *ids, size_t n, float *out, size_t dim, char *why) {
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_PULL, table, 1, 0);
        zmq_msg_t f, r;
        frame(&f, ids, n * 8);
        int st = rows_pull(rows, map, self_id, &h, &f, &r, why, 160);
        if (st == 0) {
                memcpy(out, zmq_msg_data(&r), n * dim * 4);
                zmq_msg_close(&r);
        }
        zmq_msg_close(&f);
        return st;
}

/* The next push's part of parts (0: not in parts), then back to none. */
static uint32_t next_part, next_parts;

static int push(uint32_t table, uint32_t worker, int64_t clock, const int64_t *ids, size_t n, const float *g,
                size_t gfloats, uint64_t room, char *why) {
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_PUSH, table, worker, clock);
        if (next_parts) {
                h.has_part = h.has_parts = h.has_epoch = true;
                h.part = next_part, h.parts = next_parts, h.epoch = 1;
                next_parts = 0;
        }
        zmq_msg_t f[2];
        frame(&f[0], ids, n * 8);
        frame(&f[1], g, gfloats * 4);
        int st = rows_push(rows, map, 1, &h, f, NULL, room, why, 160);
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        return st;
}

static const uint32_t members2[2] = { 7, 8 };
static int acks, ack_status;
/* The members every clock has (workers 7 and 8 but where a test evicts one). */
static const uint32_t *members_now = members2;
static size_t nmembers_now = 2;

static void members(void *ud, int64_t clock, const uint32_t **ret, size_t *n) {
        (void) ud, (void) clock;
        *ret = members_now;
        *n = nmembers_now;
}

static void closed(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n, const int64_t *gone,
                   size_t ngone, const RowsAck *a, size_t na, int status, const char *reason) {
        (void) ud, (void) table, (void) clock, (void) ids, (void) n, (void) gone, (void) ngone, (void) a, (void) reason;
        acks += (int) na;
        ack_status = status;
}

/* A checkpoint's cut of the tables: records whose rows, read from the
 * frozen tables, load into empty tables (as a restore does) with every row
 * as it was, bit for bit; meanwhile a push is asked to come again and
 * changes nothing; adopted, the tables stand at the restore's clock. */
static void test_snapshot(const Job *job, const int64_t *mine, const float *want) {
        size_t nb = rows_blocks(rows);
        CkptRecord recs[4];
        Table *frozen[JOB_MAX_TABLES] = { 0 };
        long n = nb <= 4 ? (long) rows_snapshot(rows, 2, recs, frozen) : -1;
        CHECK(n == (long) nb && n == 1 && recs[0].tensor == CKPT_ROWS && recs[0].nlast == 2 && recs[0].clock == 2 &&
              !recs[0].values && frozen[0], "one record of table 0's 2 rows, its data left in the table (%ld)", n);
        if (n != 1)
                return;
        char why[160] = "";
        float g[4] = { 9, 9, 9, 9 }, now[4];
        int st = push(0, 7, 2, mine, 2, g, 4, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        CHECK(st == PSNET__STATUS__STATUS_UNAVAILABLE && strstr(why, "ask again") &&
              pull(0, mine, 2, now, 2, why) == 0 && memcmp(now, want, sizeof now) == 0,
              "frozen: a push is asked to come again (%s), the rows still read as they were", why);
        int64_t ids[2];
        float dumped[2 * 8];
        size_t per = table_row_floats(frozen[0]);
        bool ok = per <= 8 && table_dump(frozen[0], 0, 2, ids, dumped) == 2;
        rows_thaw(rows);
        Table *t[JOB_MAX_TABLES] = { 0 };
        for (size_t i = 0; i < rows_ntables(rows); i++)
                ok &= table_new(rows_conf(rows, i), &t[i], why, sizeof why) == 0;
        ok &= ok && table_import(t[0], ids, 2, dumped, NULL, why, sizeof why) == 0;
        Rows *r2 = NULL;
        ok &= rows_new(&r2) == 0 && rows_configure(r2, job, why, sizeof why) == 0;
        CHECK(ok, "the rows load into empty tables (%s)", why);
        if (!ok) {
                for (size_t i = 0; i < JOB_MAX_TABLES; i++)
                        table_free(t[i]);
                rows_free(r2);
                return;
        }
        rows_adopt(r2, t, NULL, rows_ntables(r2), 2);
        Rows *was = rows;
        rows = r2;
        float got[4];
        int64_t lo, hi;
        rows_closed(rows, &lo, &hi);
        CHECK(pull(0, mine, 2, got, 2, why) == 0 && memcmp(got, want, sizeof got) == 0 && lo == 1 && hi == 1,
              "restored: the same rows bit for bit, clock 1 closed (%ld)", (long) lo);
        rows = was;
        rows_free(r2);
}

static void test_bsp(Job job, const int64_t *mine) {
        char why[160] = "";
        job.mode = MODE_BSP;
        job.id += 10;
        Rows *was = rows;
        if (!CHECK(rows_new(&rows) == 0 && rows_configure(rows, &job, why, sizeof why) == 0, "a BSP job (%s)", why))
                return;
        const RowsHooks hk = { .members = members, .closed = closed };
        rows_set_hooks(rows, &hk);
        float before[4], after[4], g7[4] = { 1, 2, 3, 4 }, g8[2] = { -3, 6 };
        pull(0, mine, 2, before, 2, why);
        int st = push(0, 7, 0, mine, 2, g7, 4, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        CHECK(st == ROWS_PARKED && acks == 0, "worker 7's push of clock 0 is parked (%d, %d acks)", st, acks);
        CHECK(pull(0, mine, 2, after, 2, why) == PSNET__STATUS__STATUS_OK && memcmp(before, after, sizeof after) == 0,
              "a pull of clock 0 reads the rows as they were");
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_PULL, 0, 7, 1);
        zmq_msg_t f, r;
        frame(&f, mine, 16);
        st = rows_pull(rows, map, 1, &h, &f, &r, why, sizeof why);
        zmq_msg_close(&f);
        CHECK(st == PSNET__STATUS__STATUS_UNAVAILABLE && strstr(why, "waits"),
              "a pull of clock 1 waits while clock 0 is open (%s)", why);
        st = push(0, 8, 0, mine + 1, 1, g8, 2, UINT64_MAX, why);
        rows_settle(rows, 0);
        CHECK(st == ROWS_PARKED && acks == 0, "worker 8's push parked; a fence at clock 0 holds the clock");
        rows_settle(rows, INT64_MAX);
        CHECK(acks == 2 && ack_status == 0 && rows_parked(rows) == 0, "the fence gone, both are acknowledged OK");
        pull(0, mine, 2, after, 2, why);
        /* sgd lr 0.5 on the mean of the two workers' rows: row 0 (1, 2) / 2, row 1 ((3, 4) + (-3, 6)) / 2. */
        bool mean = after[0] == before[0] - 0.5f * 0.5f && after[1] == before[1] - 0.5f * 1.0f &&
                    after[2] == before[2] - 0.5f * 0.0f && after[3] == before[3] - 0.5f * 5.0f;
        CHECK(mean, "the rows moved by the members' mean gradient, once (%g %g %g %g)", (double) (before[0] - after[0]),
              (double) (before[1] - after[1]), (double) (before[2] - after[2]), (double) (before[3] - after[3]));
        st = push(0, 7, 1, mine, 0, g7, 0, UINT64_MAX, why);
        CHECK(st == ROWS_PARKED, "an empty push (no row of this shard's) is parked too");
        st = push(0, 8, 1, mine, 2, (const float[]) { 2, 2, 2, 2 }, 4, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        pull(0, mine, 2, before, 2, why);
        CHECK(st == ROWS_PARKED && acks == 4 && before[0] == after[0] - 0.5f * 1.0f,
              "with it clock 1 closes: worker 8's rows over 2 members (%d acks)", acks);
        int64_t lo, hi, wlo, whi;
        rows_closed(rows, &lo, &hi);
        rows_worker_clocks(rows, 7, &wlo, &whi);
        CHECK(lo == -1 && hi == 1 && wlo == -1 && whi == 1, "a checkpoint's cut sees table 0 at clock 1 and table 1, "
              "never pushed, at none (%ld %ld); worker 7 the same (%ld %ld)", (long) lo, (long) hi, (long) wlo,
              (long) whi);
        test_snapshot(&job, mine, before);
        int64_t twice[2] = { mine[0], mine[0] };
        st = push(0, 7, 2, twice, 2, g7, 4, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_INVALID && strstr(why, "twice"), "an id twice is refused, not parked (%s)",
              why);
        /* Clock 2: worker 7's push in two parts, worker 8's whole. */
        int acks0 = acks;
        pull(0, mine, 2, before, 2, why);
        next_part = 0, next_parts = 2;
        int s0 = push(0, 7, 2, mine, 1, (const float[]) { 2, 4 }, 2, UINT64_MAX, why);
        next_part = 0, next_parts = 2;
        int sd = push(0, 7, 2, mine, 1, (const float[]) { 2, 4 }, 2, UINT64_MAX, why);
        int s8 = push(0, 8, 2, mine, 0, g8, 0, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        CHECK(s0 == PSNET__STATUS__STATUS_OK && sd == PSNET__STATUS__STATUS_DUPLICATE && s8 == ROWS_PARKED &&
              rows_parked(rows) == 2 && acks == acks0, "part 0 of 2 is kept and acknowledged at once, again it is "
              "a DUPLICATE; the clock waits for part 1 (%d %d %d, %zu parked)", s0, sd, s8, rows_parked(rows));
        next_part = 1, next_parts = 2;
        int s1 = push(0, 7, 2, mine + 1, 1, (const float[]) { -6, 8 }, 2, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        pull(0, mine, 2, after, 2, why);
        CHECK(s1 == ROWS_PARKED && acks == acks0 + 2 && rows_parked(rows) == 0 &&
              after[0] == before[0] - 0.5f * 1.0f && after[1] == before[1] - 0.5f * 2.0f &&
              after[2] == before[2] - 0.5f * -3.0f && after[3] == before[3] - 0.5f * 4.0f,
              "part 1 closes the clock: both parts' rows over 2 members, the two whole pushes acknowledged (%d acks)",
              acks - acks0);
        /* Clock 3: worker 7 pushes, then is evicted (the membership is worker
         * 8 alone): its parked push goes, answered STALE, and the clock
         * closes on worker 8's push alone. */
        static const uint32_t only8[1] = { 8 };
        acks0 = acks;
        pull(0, mine, 2, before, 2, why);
        int s7 = push(0, 7, 3, mine, 2, (const float[]) { 10, 10, 10, 10 }, 4, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        members_now = only8, nmembers_now = 1;
        rows_settle(rows, INT64_MAX);
        CHECK(s7 == ROWS_PARKED && acks == acks0 + 1 && ack_status == PSNET__STATUS__STATUS_STALE &&
                      rows_parked(rows) == 0,
              "worker 7 evicted with its push of clock 3 parked: the push goes, answered STALE (%d %d %d, %zu parked)", s7, acks - acks0,
              ack_status, rows_parked(rows));
        s8 = push(0, 8, 3, mine, 2, (const float[]) { 2, -2, 4, 8 }, 4, UINT64_MAX, why);
        rows_settle(rows, INT64_MAX);
        pull(0, mine, 2, after, 2, why);
        CHECK(s8 == ROWS_PARKED && acks == acks0 + 2 && ack_status == 0 && after[0] == before[0] - 0.5f * 2.0f &&
                      after[1] == before[1] - 0.5f * -2.0f && after[2] == before[2] - 0.5f * 4.0f &&
                      after[3] == before[3] - 0.5f * 8.0f,
              "worker 8's push closes clock 3 alone: its rows over 1 member, nothing of worker 7's (%g %g %g %g)",
              (double) (before[0] - after[0]), (double) (before[1] - after[1]), (double) (before[2] - after[2]),
              (double) (before[3] - after[3]));
        members_now = members2, nmembers_now = 2;
        rows_free(rows);
        rows = was;
}

/* --- a fail-over (--replicas 2, BSP) --------------------------------------------------------- */

/* A map of shards ids[0..n) (1, 2, 3 or 9) keeping replicas copies. */
static ShardMap *map_of(uint64_t epoch, const uint32_t *ids, size_t n, uint32_t replicas, const Job *job) {
        static const char *ep[] = { "ipc:///tmp/x1", "ipc:///tmp/x2", "ipc:///tmp/x3", "ipc:///tmp/x9" };
        ShardDesc d[4];
        ShardMap *m = NULL;
        for (size_t i = 0; i < n; i++)
                d[i] = (ShardDesc) { .id = ids[i], .endpoint = (char *) ep[ids[i] == 9 ? 3 : ids[i] - 1] };
        if (shardmap_place(epoch, d, n, job, &m) < 0)
                return NULL;
        shardmap_set_replicas(m, replicas);
        return m;
}

/* job under BSP with replicas copies (0: pscoord's default), numbered
 * off past its own: whether it validates (why says if not). */
static bool bsp_job(Job *job, uint32_t replicas, uint32_t off, char *why, size_t n) {
        job->mode = MODE_BSP;
        job->replicas = replicas;
        job->id += off;
        return job_validate(job, why, n) == 0;
}


/* A shard of the fail-over test: its rows, and where its closed clocks' copies go. */
typedef struct Side {
        Rows *rows;
        uint32_t id;
        struct Side *backup;    /* the other shard, while copies reach it */
        bool deliver;
        bool half;              /* only the first part of each copy arrives */
        int acks;
        const ShardMap *map;    /* the move test's: the map it acts on */
} Side;

static void side_closed(void *ud, uint32_t table, int64_t clock, const int64_t *all, size_t nall,
                        const int64_t *gone, size_t ngone, const RowsAck *a, size_t na, int status, const char *reason) {
        Side *s = ud;
        (void) a, (void) reason;
        s->acks += (int) na;
        if (status != 0 || !s->backup || !s->deliver)
                return;
        size_t per = rows_row_floats(s->rows, table);
        float buf[64 * 8];
        int64_t ids[64], stamps[64];
        size_t n = rows_copy_rows(s->rows, table, all, nall, ids, buf, stamps);
        bool bounded = rows_bounded(s->rows, table);
        /* In two parts, as a large copy goes: nothing installed before the last. */
        int st = 0;
        char why[160] = "";
        RowsStats before, after;
        rows_stats(s->backup->rows, &before);
        for (uint32_t part = 0; part < (s->half ? 1u : 2u) && st == 0; part++) {
                Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_COPY, table, s->id, clock);
                h.has_part = h.has_parts = true;
                h.part = part, h.parts = 2;
                size_t from = part ? n / 2 : 0, cnt = part ? n - n / 2 : n / 2;
                zmq_msg_t f[4];
                frame(&f[0], ids + from, cnt * 8);
                frame(&f[1], buf + from * per, cnt * per * 4);
                /* A bounded table's: the stamps, and the rows dropped in the last part. */
                frame(&f[2], stamps + from, cnt * 8);
                frame(&f[3], gone, part ? ngone * 8 : 0);
                st = rows_copy_in(s->backup->rows, &h, f, bounded ? 4 : 2, why, sizeof why);
                for (int k = 0; k < 4; k++)
                        zmq_msg_close(&f[k]);
                if (part == 0)
                        rows_stats(s->backup->rows, &after);
        }
        if (s->half)
                return;
        CHECK(st == 0 && after.copies_in == before.copies_in,
              "shard %u's copy of clock %ld (%zu rows, 2 parts) installed on shard %u at its last part (%s)", s->id,
              (long) clock, n, s->backup->id, why);
}

/* Worker's push of ids[0..n) at clock, cut for map epoch, to shard s under m. */
static int push_to(Side *s, const ShardMap *m, uint32_t worker, int64_t clock, uint64_t epoch, const int64_t *ids,
                   size_t n) {
        float g[64 * 2];
        for (size_t k = 0; k < n; k++)
                for (int d = 0; d < 2; d++)
                        g[k * 2 + d] = (float) worker * 0.25f - (float) clock * 0.125f + (float) (ids[k] % 7) * 0.5f +
                                       (float) d;
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_PUSH, 0, worker, clock);
        h.has_epoch = true;
        h.epoch = epoch;
        zmq_msg_t f[2];
        frame(&f[0], ids, n * 8);
        frame(&f[1], g, n * 2 * 4);
        char why[160] = "";
        int st = rows_push(s->rows, m, s->id, &h, f, NULL, UINT64_MAX, why, sizeof why);
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        rows_settle(s->rows, INT64_MAX);
        return st;
}

/* Rows of ids[0..n) of table 0 (2 floats each) from shard self's tables
 * rs under m into out: pull's status. */
static int pull_as(Rows *rs, ShardMap *m, uint32_t self, const int64_t *ids, size_t n, float *out) {
        Rows *keep = rows;
        ShardMap *keep_map = map;
        uint32_t keep_self = self_id;
        rows = rs, map = m, self_id = self;
        char why[160] = "";
        int st = pull(0, ids, n, out, 2, why);
        rows = keep, map = keep_map, self_id = keep_self;
        return st;
}

static Side side(const Job *job, uint32_t id) {
        Side s = { .id = id };
        char why[160];
        if (rows_new(&s.rows) < 0 || rows_configure(s.rows, job, why, sizeof why) < 0)
                s.rows = rows_free(s.rows);
        return s;
}

/* ids[0..n) split by their holder under m1: shard 1's into a, the others' into b. */
static void split_ids(const ShardMap *m1, const int64_t *ids, size_t n, int64_t *a, size_t *na, int64_t *b,
                      size_t *nb) {
        *na = *nb = 0;
        for (size_t k = 0; k < n; k++) {
                if (shardmap_row_holder(m1, 0, ids[k], 0) == shardmap_find(m1, 1))
                        a[(*na)++] = ids[k];
                else
                        b[(*nb)++] = ids[k];
        }
}

/* The fail-over tests' shards: 1 (its closed clocks copied to 2), 2, and a
 * reference shard 2 that takes every push under the new map; false (said)
 * when their tables could not be made. */
static bool failover_sides(const Job *job, Side *s1, Side *s2, Side *ref) {
        *s1 = side(job, 1), *s2 = side(job, 2), *ref = side(job, 2);
        if (!CHECK(s1->rows && s2->rows && ref->rows, "three shards' tables"))
                return false;
        s1->backup = s2, s1->deliver = true;
        RowsHooks hk = { .members = members, .closed = side_closed, .ud = s1 };
        rows_set_hooks(s1->rows, &hk);
        hk.ud = s2;
        rows_set_hooks(s2->rows, &hk);
        hk.ud = ref;
        rows_set_hooks(ref->rows, &hk);
        return true;
}

/* Shards 1 and 2 each lead some rows and back the other's; workers 7 and 8
 * push clocks 0..2 to both. Shard 1 dies at clock 2: its copy of the clock
 * reached shard 2 (how 1), only its first part did (how 2), or shard 1
 * never closed the clock and worker 8's push of it never reached shard 2
 * (how 3). Both
 * workers then send clock 2 again to shard 2 under the new map: shard 2
 * ends with every row as one shard that took every push would, each
 * clock's update applied once. */
static void test_failover_case(const Job *job, ShardMap *m1, ShardMap *m2, const int64_t *ids, size_t n, int how) {
        Side s1, s2, ref;
        if (!failover_sides(job, &s1, &s2, &ref))
                goto out;
        /* Each shard's share of ids under m1; the last 8 ids are pushed at
         * clock 0 only (their copies are left for the promotion's steps). */
        int64_t a[64], b[64];
        size_t na = 0, nb = 0, late = n - 8, na_late = 0;
        for (int64_t c = 0; c < 3; c++) {
                size_t cnt = c == 0 ? n : late;
                na = nb = 0;
                for (size_t k = 0; k < cnt; k++) {
                        if (shardmap_row_holder(m1, 0, ids[k], 0) == shardmap_find(m1, 1))
                                a[na++] = ids[k];
                        else
                                b[nb++] = ids[k];
                }
                if (c == 0)
                        na_late = na;
                for (uint32_t w = 7; w <= 8; w++)
                        push_to(&ref, m2, w, c, 2, ids, cnt);
                if (c == 2 && how == 2)
                        s1.half = true; /* its last part lost with the shard */
                for (uint32_t w = 7; w <= 8; w++) {
                        if (!(c == 2 && how == 3))
                                push_to(&s1, m1, w, c, 1, a, na);
                        if (!(c == 2 && how == 3 && w == 8))
                                push_to(&s2, m1, w, c, 1, b, nb);
                }
        }
        rows_map_changed(s2.rows, m1, m2, 2);
        RowsStats rs;
        rows_stats(s2.rows, &rs);
        uint64_t copies = rs.backup_rows;
        int acks = s2.acks;
        int st7 = push_to(&s2, m2, 7, 2, 2, ids, late), st8 = push_to(&s2, m2, 8, 2, 2, ids, late);
        /* The copies no push touched join a few at a time. */
        rows_stats(s2.rows, &rs);
        uint64_t left = rs.backup_rows;
        bool promoting = rows_promoting(s2.rows);
        int steps = 0;
        while (rows_rebuild_step(s2.rows, 4, NULL, NULL))
                steps++;
        rows_stats(s2.rows, &rs);
        CHECK(copies == na_late && left == (how == 1 ? na_late : na_late - na) && promoting && !rows_promoting(s2.rows) &&
                      rs.backup_rows == 0 && steps >= (int) (left / 4),
              "its %llu copies became its own: %llu as the pushes touched them, %llu in %d steps",
              (unsigned long long) copies, (unsigned long long) (copies - left), (unsigned long long) left, steps);
        float want[64 * 2], got[64 * 2];
        pull_as(ref.rows, m2, 2, ids, n, want);
        int pst = pull_as(s2.rows, m2, 2, ids, n, got);
        int want7 = how == 1 ? PSNET__STATUS__STATUS_DUPLICATE : ROWS_PARKED;
        int want8 = how == 1 ? PSNET__STATUS__STATUS_DUPLICATE : ROWS_PARKED;
        const char *what[] = { "", "its copy came", "its copy's last part was lost", "it never closed the clock" };
        CHECK(st7 == want7 && st8 == want8 && (how == 1 || s2.acks == acks + 2),
              "shard 1 lost at clock 2 (%s): the pushes sent again are %s (%d %d, %d acks)", what[how],
              how == 1 ? "applied already: DUPLICATE" : "cut to the rows not applied, parked, then acknowledged", st7,
              st8, s2.acks - acks);
        CHECK(pst == 0 && memcmp(got, want, n * 2 * sizeof *got) == 0 && na > 0 && nb > 0,
              "shard 2 leads all %zu rows (%zu were shard 1's), each as one shard that took every push holds it, "
              "bit for bit", n, na_late);
        rows_stats(s2.rows, &rs);
        CHECK(rs.rows == n, "it holds them all (%llu)", (unsigned long long) rs.rows);
out:
        rows_free(s1.rows);
        rows_free(s2.rows);
        rows_free(ref.rows);
}

/* Shard 1 of two dies while worker 8's push of clock 2 is parked on shard
 * 2 (cut for the old map: it lacks shard 1's rows) and worker 7's has not
 * come. Worker 7 sends its push under the new map first: the clock waits
 * for worker 8's sent again, not for the parked one, which went with the
 * old map (closed with it, the clock would lack worker 8's gradients of
 * shard 1's rows, and worker 8's push sent again would wait for good on a
 * clock opened again). That push, the old map's, sent again late: MOVED. */
static void test_failover_mixed(const Job *job, ShardMap *m1, ShardMap *m2, const int64_t *ids, size_t n) {
        Side s1, s2, ref;
        if (!failover_sides(job, &s1, &s2, &ref))
                goto out;
        int64_t a[64], b[64];
        size_t na, nb;
        split_ids(m1, ids, n, a, &na, b, &nb);
        for (int64_t c = 0; c < 3; c++)
                for (uint32_t w = 7; w <= 8; w++) {
                        push_to(&ref, m2, w, c, 2, ids, n);
                        if (c < 2) {
                                push_to(&s1, m1, w, c, 1, a, na);
                                push_to(&s2, m1, w, c, 1, b, nb);
                        }
                }
        int parked = push_to(&s2, m1, 8, 2, 1, b, nb);
        rows_map_changed(s2.rows, m1, m2, 2);
        int acks0 = s2.acks;
        int stale = push_to(&s2, m2, 8, 2, 1, b, nb);
        int st7 = push_to(&s2, m2, 7, 2, 2, ids, n);
        int acks7 = s2.acks;
        int st8 = push_to(&s2, m2, 8, 2, 2, ids, n);
        CHECK(parked == ROWS_PARKED && stale == PSNET__STATUS__STATUS_MOVED && st7 == ROWS_PARKED &&
                      acks7 == acks0 && st8 == ROWS_PARKED && s2.acks == acks0 + 2 && rows_parked(s2.rows) == 0,
              "worker 8's push of the old map, parked, goes at the change (sent again under it: MOVED); clock 2 "
              "closes on both workers' pushes of the new map (%d %d %d %d, %d then %d acks)", parked, stale, st7, st8,
              acks7 - acks0, s2.acks - acks0);
        while (rows_rebuild_step(s2.rows, 4, NULL, NULL))
                ;
        float want[64 * 2], got[64 * 2];
        pull_as(ref.rows, m2, 2, ids, n, want);
        int pst = pull_as(s2.rows, m2, 2, ids, n, got);
        CHECK(pst == 0 && memcmp(got, want, n * 2 * sizeof *got) == 0 && na > 0 && nb > 0,
              "shard 2 then holds all %zu rows as one shard that took every push, bit for bit", n);
out:
        rows_free(s1.rows);
        rows_free(s2.rows);
        rows_free(ref.rows);
}

static void test_failover(Job job) {
        char why[160] = "";
        if (!CHECK(bsp_job(&job, 2, 20, why, sizeof why), "a BSP job with two copies of its rows (%s)", why))
                return;
        const uint32_t two[2] = { 1, 2 }, second[1] = { 2 };
        ShardMap *m1 = map_of(1, two, 2, 2, &job), *m2 = map_of(2, second, 1, 1, &job);
        if (!CHECK(m1 && m2, "maps of two shards and of shard 2 alone"))
                goto out;
        int64_t ids[24];
        for (int k = 0; k < 24; k++)
                ids[k] = 1000 + 37 * k;
        for (int how = 1; how <= 3; how++)
                test_failover_case(&job, m1, m2, ids, 24, how);
        test_failover_mixed(&job, m1, m2, ids, 24);
out:
        shardmap_free(m1);
        shardmap_free(m2);
}

static int asp_refused;

/* ASP: worker's push just applied on s, copied whole to shard to as
 * psd-server.c does (ROWS_COPY naming the worker). */
static void asp_copy(Side *s, Side *to, uint32_t worker, int64_t clock) {
        const int64_t *ids, *gone;
        size_t n, ngone;
        rows_last_applied(s->rows, &ids, &n, &gone, &ngone);
        int64_t held[64], st[64];
        float rows[64 * 8];
        size_t k = rows_copy_rows(s->rows, 0, ids, n, held, rows, st);
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_COPY, 0, s->id, clock);
        h.has_origin = true;
        h.origin = worker;
        zmq_msg_t f[2];
        frame(&f[0], held, k * 8);
        frame(&f[1], rows, k * rows_row_floats(s->rows, 0) * 4);
        char why[160] = "";
        if (rows_copy_in(to->rows, &h, f, 2, why, sizeof why) != 0)
                asp_refused++;
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
}

/* ASP on two copies: shards 1 and 2 each lead some of 24 ids and back the
 * other's; workers 7 and 8 push clocks 0..2, each push applied as it
 * comes and copied to the other shard. Shard 1 dies during worker 8's
 * push of clock 2: applied there and copied (how 1), applied there and not
 * copied (how 2), or never sent (how 3); its part on shard 2 applied in
 * cases 1 and 2. Worker 8 sends the push again to shard 2 under the new
 * map: shard 2 applies only the rows whose update it lacks, and ends with
 * every row as one shard that took every push once, in the same order.
 * how 4: shard 1 applied the push, its copy still on the way when a map
 * change (mb, the same shards) has worker 8 send it again to both: shard
 * 1 applies nothing again but copies every row of it again, so that when
 * it dies before the first copy arrives (m4), shard 2 still holds it. */
static void test_asp_failover_case(const Job *job, ShardMap *m1, ShardMap *m2, ShardMap *mb, ShardMap *m4,
                                   const int64_t *ids, size_t n, int how) {
        Side s1 = side(job, 1), s2 = side(job, 2), ref = side(job, 2);
        if (!CHECK(s1.rows && s2.rows && ref.rows, "ASP: three shards' tables"))
                goto out;
        int64_t a[64], b[64];
        size_t na, nb;
        split_ids(m1, ids, n, a, &na, b, &nb);
        asp_refused = 0;
        for (int64_t c = 0; c < 3; c++)
                for (uint32_t w = 7; w <= 8; w++) {
                        push_to(&ref, m2, w, c, 2, ids, n);
                        bool last = c == 2 && w == 8;
                        if (!(last && how == 3)) {
                                push_to(&s1, m1, w, c, 1, a, na);
                                if (!(last && (how == 2 || how == 4)))
                                        asp_copy(&s1, &s2, w, c);
                                push_to(&s2, m1, w, c, 1, b, nb);
                                asp_copy(&s2, &s1, w, c);
                        }
                }
        int st = 0;
        if (how == 4) {
                rows_map_changed(s1.rows, m1, mb, 1);
                rows_map_changed(s2.rows, m1, mb, 2);
                st = push_to(&s1, mb, 8, 2, 3, a, na);
                asp_copy(&s1, &s2, 8, 2);
                st |= push_to(&s2, mb, 8, 2, 3, b, nb);
                rows_map_changed(s2.rows, mb, m4, 2);
        } else {
                rows_map_changed(s2.rows, m1, m2, 2);
                st = push_to(&s2, m2, 8, 2, 2, ids, n); /* worker 8's push of clock 2, sent again under the new map */
        }
        while (rows_rebuild_step(s2.rows, 4, NULL, NULL))
                ;
        float want[64 * 2], got[64 * 2];
        pull_as(ref.rows, m2, 2, ids, n, want);
        int pst = pull_as(s2.rows, m2, 2, ids, n, got);
        const char *what[] = { "", "applied there and copied", "applied there, its copy lost", "never sent",
                               "applied there, sent again to it while its copy was on the way" };
        CHECK(st == 0 && pst == 0 && asp_refused == 0 && memcmp(got, want, n * 2 * sizeof *got) == 0 && na > 0 &&
                      nb > 0,
              "ASP: shard 1 lost during worker 8's push of clock 2 (%s): sent again, shard 2 ends with every row as "
              "one shard that took every push once, bit for bit (%d)", what[how], st);
out:
        rows_free(s1.rows);
        rows_free(s2.rows);
        rows_free(ref.rows);
}

static void test_asp_failover(Job job) {
        char why[160] = "";
        job.mode = MODE_ASP;
        job.replicas = 2;
        job.id += 95;
        if (!CHECK(job_validate(&job, why, sizeof why) == 0, "an ASP job with two copies of its rows (%s)", why))
                return;
        const uint32_t two[2] = { 1, 2 }, second[1] = { 2 };
        ShardMap *m1 = map_of(1, two, 2, 2, &job), *m2 = map_of(2, second, 1, 1, &job);
        ShardMap *mb = map_of(3, two, 2, 2, &job), *m4 = map_of(4, second, 1, 1, &job);
        int64_t ids[24];
        for (int k = 0; k < 24; k++)
                ids[k] = 3000 + 41 * k;
        for (int how = 1; m1 && m2 && mb && m4 && how <= 4; how++)
                test_asp_failover_case(&job, m1, m2, mb, m4, ids, 24, how);
        shardmap_free(m1);
        shardmap_free(m2);
        shardmap_free(mb);
        shardmap_free(m4);
}

/* A table that drops rows (ttl=2, or max-rows=10) on two copies: shards
 * 1 and 2 each lead some of 40 ids and back the other's; workers 7 and 8
 * push 16 of them at each clock, 4 further on at the next, so that shard
 * 1's bounds drop rows. Its backup holds as many copies as it has rows after
 * every clock; shard 1 lost, shard 2 leads exactly the rows shard 1 held,
 * each bit for bit with the clock it was last pushed at. */
static void test_bounded_failover(Job job, uint64_t ttl, uint64_t max_rows) {
        char why[160] = "";
        job.tables[0].ttl = ttl;
        job.tables[0].max_rows = max_rows;
        const char *what = ttl ? "ttl=2" : "max-rows=10";
        bool valid = bsp_job(&job, 2, ttl ? 80 : 81, why, sizeof why);
        const uint32_t two[2] = { 1, 2 }, second[1] = { 2 };
        ShardMap *m1 = map_of(1, two, 2, 2, &job), *m2 = map_of(2, second, 1, 1, &job);
        Side s1 = side(&job, 1), s2 = side(&job, 2);
        if (!CHECK(valid && m1 && m2 && s1.rows && s2.rows, "a BSP job with two copies of a table with %s (%s)", what,
                   why))
                goto out;
        s1.backup = &s2, s1.deliver = true;
        RowsHooks hk = { .members = members, .closed = side_closed, .ud = &s1 };
        rows_set_hooks(s1.rows, &hk);
        hk.ud = &s2;
        rows_set_hooks(s2.rows, &hk);
        int64_t ids[40], a[40], b[40];
        for (int k = 0; k < 40; k++)
                ids[k] = 5000 + 53 * k;
        bool mirrored = true;
        for (int64_t c = 0; c < 6; c++) {
                size_t na = 0, nb = 0;
                for (size_t k = 4 * (size_t) c; k < 4 * (size_t) c + 16; k++) {
                        if (shardmap_row_holder(m1, 0, ids[k], 0) == shardmap_find(m1, 1))
                                a[na++] = ids[k];
                        else
                                b[nb++] = ids[k];
                }
                for (uint32_t w = 7; w <= 8; w++) {
                        push_to(&s1, m1, w, c, 1, a, na);
                        push_to(&s2, m1, w, c, 1, b, nb);
                }
                RowsStats r1, r2;
                rows_stats(s1.rows, &r1);
                rows_stats(s2.rows, &r2);
                mirrored &= r2.backup_rows == r1.rows;
        }
        uint64_t held1, bytes;
        TableCounts counts;
        rows_table_stats(s1.rows, 0, &held1, &bytes, &counts);
        uint64_t dropped = counts.evicted_ttl + counts.evicted_full;
        CHECK(mirrored && dropped > 0 && held1 > 0,
              "%s: shard 1 dropped %llu rows over 6 clocks; after each, shard 2 held a copy of each row it held "
              "and no more (%llu at the end)", what, (unsigned long long) dropped, (unsigned long long) held1);
        rows_map_changed(s2.rows, m1, m2, 2);
        while (rows_rebuild_step(s2.rows, 4, NULL, NULL))
                ;
        int64_t a1[40], a2[40], st1[40], st2[40];
        float r1[40 * 2], r2[40 * 2];
        size_t mine = 0;
        for (int k = 0; k < 40; k++)
                if (shardmap_row_holder(m1, 0, ids[k], 0) == shardmap_find(m1, 1))
                        a[mine++] = ids[k];
        size_t k1 = rows_copy_rows(s1.rows, 0, a, mine, a1, r1, st1);
        size_t k2 = rows_copy_rows(s2.rows, 0, a, mine, a2, r2, st2);
        bool same = k1 == k2 && k1 == held1 && k1 < mine && memcmp(a1, a2, k1 * 8) == 0 &&
                    memcmp(r1, r2, k1 * 2 * 4) == 0 && memcmp(st1, st2, k1 * 8) == 0;
        CHECK(same,
              "%s: shard 1 lost, shard 2 leads the %zu rows of its %zu ids it still held, none it dropped, each bit "
              "for bit with the clock it was last pushed at (%zu)", what, k1, mine, k2);
out:
        rows_free(s1.rows);
        rows_free(s2.rows);
        shardmap_free(m1);
        shardmap_free(m2);
}

/* --- rows moved at a map change (a shard added; one removed with one copy) ------------------ */

static Side *sides[4];
static size_t nsides;
static int move_refused, copies_refused;

static Side *side_of(uint32_t id) {
        for (size_t i = 0; i < nsides; i++)
                if (sides[i]->id == id)
                        return sides[i];
        return NULL;
}

/* RowsHooks.closed: each row's copy to each of its backups under the
 * shard's map, every other shard of it a copy (empty where it backs none),
 * as psd-migrate.c sends them. */
static void route_copy(Side *s, uint32_t table, int64_t clock, int64_t origin, const int64_t *all, size_t nall,
                       const int64_t *gone, size_t ngone) {
        if (shardmap_replicas(s->map) < 2 || shardmap_find(s->map, s->id) < 0)
                return;
        size_t per = rows_row_floats(s->rows, table);
        float rows[64 * 8], sel[64 * 8];
        int64_t ids[64], stamps[64], sids[64], sst[64], sgone[64];
        size_t n = rows_copy_rows(s->rows, table, all, nall, ids, rows, stamps);
        for (size_t j = 0; j < shardmap_size(s->map); j++) {
                Side *to = side_of(shardmap_shard(s->map, j)->id);
                if (!to || to == s)
                        continue;
                size_t m = 0, g = 0;
                for (size_t k = 0; k < n; k++)
                        for (uint32_t i = 1; i < shardmap_replicas(s->map); i++)
                                if (shardmap_row_holder(s->map, table, ids[k], i) == (int) j) {
                                        sids[m] = ids[k];
                                        sst[m] = stamps[k];
                                        memcpy(sel + m++ * per, rows + k * per, per * 4);
                                }
                for (size_t k = 0; k < ngone && g < 64; k++)
                        for (uint32_t i = 1; i < shardmap_replicas(s->map); i++)
                                if (shardmap_row_holder(s->map, table, gone[k], i) == (int) j)
                                        sgone[g++] = gone[k];
                Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_COPY, table, s->id, clock);
                h.has_epoch = true;
                h.epoch = shardmap_epoch(s->map);
                h.has_origin = origin >= 0;
                h.origin = origin >= 0 ? (uint32_t) origin : 0;
                zmq_msg_t f[4];
                frame(&f[0], sids, m * 8);
                frame(&f[1], sel, m * per * 4);
                frame(&f[2], sst, m * 8);
                frame(&f[3], sgone, g * 8);
                char why[160] = "";
                if (rows_copy_in(to->rows, &h, f, rows_bounded(s->rows, table) ? 4 : 2, why, sizeof why) != 0)
                        copies_refused++;
                for (int k = 0; k < 4; k++)
                        zmq_msg_close(&f[k]);
        }
}

static void route_closed(void *ud, uint32_t table, int64_t clock, const int64_t *all, size_t nall,
                         const int64_t *gone, size_t ngone, const RowsAck *a, size_t na, int status,
                         const char *reason) {
        Side *s = ud;
        (void) a, (void) reason;
        s->acks += (int) na;
        if (status == 0)
                route_copy(s, table, clock, -1, all, nall, gone, ngone);
}

/* ASP/SSP: whether push_all copies each push's rows to their backups as it
 * is applied (naming the worker), as psd-server.c does. */
static bool copy_pushes;

/* RowsMoveFn: a ROWS_MOVE from the sender (ud) to shard, under the new map. */
static int route_move(void *ud, uint32_t shard, uint32_t table, int64_t clock, const int64_t *ids, const float *r,
                      const int64_t *stamps, size_t n, bool last) {
        Side *s = ud, *to = side_of(shard);
        if (!to)
                return -EHOSTUNREACH;
        size_t per = rows_row_floats(s->rows, table);
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_MOVE, table, s->id, clock);
        h.has_epoch = h.has_last = true;
        h.epoch = shardmap_epoch(to->map);
        h.last = last;
        zmq_msg_t f[3];
        frame(&f[0], ids, n * 8);
        frame(&f[1], r, r ? n * per * 4 : 0); /* none: ids asked for that it does not hold */
        frame(&f[2], stamps, stamps ? n * 8 : 0);
        char why[160] = "";
        int st = rows_move_in(to->rows, to->map, to->id, &h, f, rows_bounded(s->rows, table) ? 3 : 2, why, sizeof why);
        for (int k = 0; k < 3; k++)
                zmq_msg_close(&f[k]);
        if (st != 0) {
                move_refused++;
                fprintf(stderr, "# shard %u refused rows from %u: %s\n", shard, s->id, why);
        }
        return 0;
}

static int records;

/* RowsMoveHooks.record: a ROWS_MOVE naming the worker, from the sender (ud). */
static int route_record(void *ud, uint32_t shard, uint32_t table, uint32_t worker, int64_t clock, int64_t done,
                        const int64_t *ids, size_t n) {
        Side *s = ud, *to = side_of(shard);
        if (!to)
                return -EHOSTUNREACH;
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_MOVE, table, s->id, clock);
        h.has_epoch = h.has_origin = h.has_done = true;
        h.epoch = shardmap_epoch(to->map);
        h.origin = worker;
        h.done = done;
        zmq_msg_t f[2];
        frame(&f[0], ids, n * 8);
        frame(&f[1], NULL, 0);
        char why[160] = "";
        int st = rows_move_in(to->rows, to->map, to->id, &h, f, 2, why, sizeof why);
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        if (st != 0) {
                move_refused++;
                fprintf(stderr, "# shard %u refused worker %u's record from %u: %s\n", shard, worker, s->id, why);
        }
        records++;
        return 0;
}

static int no_rebuild(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n) {
        (void) ud, (void) table, (void) clock, (void) ids, (void) n;
        return 0;
}

static int wants;

/* RowsHooks.want: the receiver (ud) asks the sender, which answers at once. */
static void route_want(void *ud, uint32_t shard, uint32_t table, const int64_t *ids, size_t n) {
        Side *s = ud, *from = side_of(shard);
        if (!from)
                return;
        Psnet__Header h = header(PSNET__MSG_TYPE__MSG_ROWS_WANT, table, s->id, 0);
        zmq_msg_t f;
        frame(&f, ids, n * 8);
        char why[160] = "";
        if (rows_want(from->rows, &h, &f, route_move, from, why, sizeof why) != 0)
                move_refused++;
        zmq_msg_close(&f);
        wants++;
}

static int all_answered(void *ud) {
        (void) ud;
        return move_refused ? -1 : 1;
}

/* Whether rows come to shard at the change from m1 to m2 (psd-rows.h). */
static bool move_receiver_of(const ShardMap *m1, const ShardMap *m2, uint32_t shard) {
        return shardmap_find(m1, shard) < 0 || (shardmap_replicas(m1) < 2 && shardmap_size(m2) < shardmap_size(m1));
}

/* Whether a push answered UNAVAILABLE is sent again (once). */
static bool again;

/* Each worker's push of clock under m: to every shard of m, its ids cut by m. */
static void push_all(const ShardMap *m, uint32_t worker, int64_t clock, const int64_t *ids, size_t n, int *ret_st,
                     uint32_t only) {
        for (size_t j = 0; j < shardmap_size(m); j++) {
                Side *s = side_of(shardmap_shard(m, j)->id);
                if (!s || (only && s->id != only))
                        continue;
                int64_t cut[64];
                size_t c = 0;
                for (size_t k = 0; k < n; k++)
                        if (shardmap_row_holder(m, 0, ids[k], 0) == (int) j)
                                cut[c++] = ids[k];
                int st = push_to(s, m, worker, clock, shardmap_epoch(m), cut, c);
                if (st == PSNET__STATUS__STATUS_UNAVAILABLE && again) /* rows asked for meanwhile */
                        st = push_to(s, m, worker, clock, shardmap_epoch(m), cut, c);
                const int64_t *applied, *gone;
                size_t na, ngone;
                rows_last_applied(s->rows, &applied, &na, &gone, &ngone);
                if (copy_pushes && na > 0)
                        route_copy(s, 0, clock, worker, applied, na, gone, ngone);
                if (ret_st)
                        ret_st[s->id] = st;
        }
}

/* Pulls every id of table 0 from its primary under m into out: the first
 * status not OK, or OK. */
static int pull_all(const ShardMap *m, const int64_t *ids, size_t n, float *out) {
        Rows *keep = rows;
        ShardMap *keep_map = map;
        uint32_t keep_self = self_id;
        int st = 0;
        char why[160] = "";
        map = (ShardMap *) m;
        for (size_t k = 0; k < n && st == 0; k++) {
                Side *s = side_of(shardmap_shard(m, (size_t) shardmap_row_holder(m, 0, ids[k], 0))->id);
                rows = s->rows, self_id = s->id;
                st = pull(0, ids + k, 1, out + k * 2, 2, why);
        }
        rows = keep, map = keep_map, self_id = keep_self;
        return st;
}

/* Shards 1, 2, 3 (sd) under m1 and the reference shard 9 (ref) under
 * mref, routed to one another: whether all four have their tables. */
static bool move_sides(const Job *job, Side *sd, Side *ref, const ShardMap *m1, const ShardMap *mref,
                       const char *what) {
        for (int i = 0; i < 3; i++)
                sd[i] = side(job, (uint32_t) i + 1);
        *ref = side(job, 9);
        nsides = 0;
        move_refused = copies_refused = 0;
        wants = 0;
        again = false;
        for (int i = 0; i < 3; i++) {
                sd[i].map = m1;
                sides[nsides++] = &sd[i];
        }
        ref->map = mref;
        sides[nsides++] = ref;
        if (!CHECK(sd[0].rows && sd[1].rows && sd[2].rows && ref->rows, "%s: four shards' tables", what))
                return false;
        for (size_t i = 0; i < nsides; i++) {
                RowsHooks hk = { .members = members, .closed = route_closed, .want = route_want, .ud = sides[i] };
                rows_set_hooks(sides[i]->rows, &hk);
        }
        return true;
}

/* Steps of the three shards' moves until none has more, or until *steps
 * reaches limit. */
static void move_steps(Side *sd, int *steps, int limit) {
        for (bool more = true; more && *steps < limit; (*steps)++) {
                more = false;
                for (int i = 0; i < 3; i++)
                        more |= rows_move_step(sd[i].rows, 4,
                                               &(RowsMoveHooks) { route_move, route_record, all_answered, NULL, &sd[i] });
        }
}

/* The 48 ids into ids (the last 8 pushed first at clock 3); workers 7 and 8
 * push clocks 0..2 of the first 40 to the reference and under m1, worker
 * 8's of clock 2 reaching shard 1 alone; then the map becomes m2. */
static void start_move(Side *sd, const ShardMap *m1, const ShardMap *m2, const ShardMap *mref, int64_t *ids) {
        for (int k = 0; k < 48; k++)
                ids[k] = 5000 + 53 * k;
        for (int64_t c = 0; c < 3; c++)
                for (uint32_t w = 7; w <= 8; w++) {
                        push_all(mref, w, c, ids, 40, NULL, 0);
                        push_all(m1, w, c, ids, 40, NULL, c == 2 && w == 8 ? 1 : 0);
                }
        for (int i = 0; i < 3; i++) {
                rows_map_changed(sd[i].rows, m1, m2, sd[i].id);
                sd[i].map = m2;
        }
}

/* Both workers push clock 3 (to the reference and under m2; rows asked for
 * meanwhile are sent at once), then the moves run to their end: whether
 * every shard's rows are whole under m2 (epoch 2); the rows asked for
 * since the change into *asked. */
static bool finish_move(Side *sd, const ShardMap *m2, const ShardMap *mref, const int64_t *ids, int *steps,
                        int *asked) {
        for (uint32_t w = 7; w <= 8; w++) {
                push_all(mref, w, 3, ids, 48, NULL, 0);
                push_all(m2, w, 3, ids, 48, NULL, 0);
        }
        again = false;
        *asked = wants;
        move_steps(sd, steps, 100000);
        bool settled = true;
        for (int i = 0; i < 3; i++)
                settled &= !rows_promoting(sd[i].rows) && rows_whole_epoch(sd[i].rows, 2) == 2;
        return settled;
}

/* Each of the 48 rows led once and backed R - 1 times under m2; then,
 * shard lost + 1 lost (m3, where given), the others hold every row as want. */
static void check_held(Side *sd, const char *what, const ShardMap *m2, const ShardMap *m3, int lost,
                       const int64_t *ids, const float *want) {
        RowsStats rs;
        uint64_t led = 0, backed = 0;
        for (int i = 0; i < 3; i++) {
                rows_stats(sd[i].rows, &rs);
                led += rs.rows;
                backed += rs.backup_rows;
        }
        CHECK(led == 48 && backed == 48 * (shardmap_replicas(m2) - 1),
              "%s: each row led once (%llu), with %u cop%s beside it (%llu)", what, (unsigned long long) led,
              shardmap_replicas(m2) - 1, shardmap_replicas(m2) == 2 ? "y" : "ies", (unsigned long long) backed);
        if (!m3)
                return;
        /* The others promote their copies of its rows (of the new shard's,
         * copies it sent while the rows moved, not the older rows the
         * senders made copies). */
        for (int i = 0; i < 3; i++) {
                if (i != lost) {
                        rows_map_changed(sd[i].rows, m2, m3, sd[i].id);
                        while (rows_rebuild_step(sd[i].rows, 4, no_rebuild, NULL))
                                ;
                }
                sd[i].map = m3;
        }
        float got[96];
        int pf = pull_all(m3, ids, 48, got);
        CHECK(pf == 0 && memcmp(got, want, sizeof got) == 0,
              "%s: shard %d lost after it, its backups hold its rows, bit for bit", what, lost + 1);
}

/* Shards of m1 train clocks 0..1 with workers 7 and 8; at clock 2 worker
 * 8's push reaches only shard 1, which closes it. The map becomes m2 (a
 * shard added, or one removed where rows had one copy): the rows move
 * while the new holders ask pushes to wait; both workers send clock 2
 * again under m2 and push clock 3. Every row then reads as on one shard
 * that took every push, bit for bit, each on its R copies: after losing
 * shard 1 (m3) the others still hold them all so. */
static void test_move_case(const Job *job, const char *what, const ShardMap *m1, const ShardMap *m2,
                           const ShardMap *m3, int lost, const ShardMap *mref, bool ask) {
        Side sd[3], ref;
        if (!move_sides(job, sd, &ref, m1, mref, what))
                goto out;
        int64_t ids[48];
        start_move(sd, m1, m2, mref, ids);
        /* The new map: a receiver waits for its senders. */
        int st_wait[4] = { 0 };
        push_all(m2, 7, 2, ids, 40, st_wait, 0);
        bool waits = false;
        for (int i = 0; i < 3; i++)
                waits |= st_wait[sd[i].id] == PSNET__STATUS__STATUS_UNAVAILABLE;
        /* ask: the senders say their clocks, then the workers go on, the
         * rows their pushes touch asked for as they come, and only then do
         * the senders send the rest (which must not undo what changed). */
        int steps = 0;
        move_steps(sd, &steps, ask ? 1 : 100000);
        int st2[4][4] = { { 0 } };
        again = true;
        for (uint32_t w = 7; w <= 8; w++)
                push_all(m2, w, 2, ids, 40, st2[w - 7], 0);
        int asked;
        bool settled = finish_move(sd, m2, mref, ids, &steps, &asked);
        CHECK(waits && settled && move_refused == 0 && steps > 3 && (ask ? asked > 0 : asked == 0),
              "%s: pushes wait while rows move (UNAVAILABLE)%s, then the move ends in %d steps, every shard whole", what,
              ask ? ", the rows they touch asked for at once" : "", steps);
        float want[96], got[96];
        int pr = pull_all(mref, ids, 48, want), pg = pull_all(m2, ids, 48, got);
        /* Shard 1 closed clock 2: its own rows of it were applied. With rows
         * of a sender that had not closed it, the clock opens again there. */
        bool gains = shardmap_find(m1, 1) >= 0 && move_receiver_of(m1, m2, 1);
        int want2 = gains ? ROWS_PARKED : PSNET__STATUS__STATUS_DUPLICATE;
        CHECK(pr == 0 && pg == 0 && memcmp(got, want, sizeof got) == 0 && copies_refused == 0 && st2[0][1] == want2,
              "%s: clock 2 sent again (at shard 1, which closed it: %s), then clock 3: every row as one shard that "
              "took every push holds it, bit for bit (%d %d %d)", what, gains ? "opened again" : "DUPLICATE", pr, pg,
              st2[0][1]);
        check_held(sd, what, m2, m3, lost, ids, want);
out:
        for (int i = 0; i < 3; i++)
                rows_free(sd[i].rows);
        rows_free(ref.rows);
        nsides = 0;
}

typedef void (*MoveCase)(const Job *job, const char *what, const ShardMap *m1, const ShardMap *m2,
                         const ShardMap *m3, int lost, const ShardMap *mref, bool ask);

/* The moves each mode's case runs through (run), named with prefix: a
 * shard added to two (two copies; then the added one lost, or shard 1), one
 * added to one (one copy, then two), one removed from three (one copy),
 * each with and without the rows asked for before their turn. */
static void move_cases(const Job *job, MoveCase run, const char *prefix) {
        const uint32_t one[1] = { 1 }, two[2] = { 1, 2 }, three[3] = { 1, 2, 3 }, rest[2] = { 2, 3 }, r9[1] = { 9 };
        ShardMap *m[9] = { map_of(1, r9, 1, 1, job), map_of(1, two, 2, 2, job), map_of(2, three, 3, 2, job),
                           map_of(3, rest, 2, 2, job), map_of(3, two, 2, 2, job), map_of(1, one, 1, 1, job),
                           map_of(2, two, 2, 2, job), map_of(1, three, 3, 1, job), map_of(2, two, 2, 1, job) };
        const struct {
                const char *what;
                int m1, m2, m3, lost;
                bool ask;
        } cases[] = {
                { "shard 3 added to 2 (2 copies)", 1, 2, 3, 0, false },
                { "shard 3 added to 2, rows asked for", 1, 2, 3, 0, true },
                { "shard 3 added to 2, then lost", 1, 2, 4, 2, true },
                { "shard 2 added to 1 (1 copy, then 2)", 5, 6, -1, 0, false },
                { "shard 2 added to 1, rows asked for", 5, 6, -1, 0, true },
                { "shard 3 removed from 3 (1 copy)", 7, 8, -1, 0, false },
                { "shard 3 removed from 3, rows asked for", 7, 8, -1, 0, true },
        };
        bool all = true;
        for (int i = 0; i < 9; i++)
                all &= m[i] != NULL;
        all = CHECK(all, "%sthe maps", prefix);
        for (size_t i = 0; all && i < sizeof cases / sizeof *cases; i++) {
                char what[160];
                snprintf(what, sizeof what, "%s%s", prefix, cases[i].what);
                run(job, what, m[cases[i].m1], m[cases[i].m2], cases[i].m3 >= 0 ? m[cases[i].m3] : NULL,
                    cases[i].lost, m[0], cases[i].ask);
        }
        for (int i = 0; i < 9; i++)
                shardmap_free(m[i]);
}

static void test_move(Job job) {
        char why[160] = "";
        if (CHECK(bsp_job(&job, 0, 40, why, sizeof why), "a BSP job whose rows may move (%s)", why))
                move_cases(&job, test_move_case, "");
}

/* ASP: shards of m1 apply workers 7 and 8's pushes of clocks 0..2 as they
 * come (each copied to its rows' backups, naming the worker), but worker
 * 8's push of clock 2 reaches only shard 1. The map becomes m2: the
 * senders tell each receiver what each worker's pushes left with them,
 * then move the rows; worker 8 sends clock 2 again under m2 (the
 * receivers ask it to wait until their senders spoke), both push clock 3.
 * Every row then reads as on one shard that took every push once, in the
 * same order, bit for bit, on its R copies, and after losing shard lost +
 * 1 (m3) too. The receivers know each worker's clocks done (SSP's bound
 * counts them). */
static void test_asp_move_case(const Job *job, const char *what, const ShardMap *m1, const ShardMap *m2,
                               const ShardMap *m3, int lost, const ShardMap *mref, bool ask) {
        Side sd[3], ref;
        records = 0;
        copy_pushes = true;
        if (!move_sides(job, sd, &ref, m1, mref, what))
                goto out;
        int64_t ids[48];
        start_move(sd, m1, m2, mref, ids);
        int st_wait[4] = { 0 };
        push_all(m2, 8, 2, ids, 40, st_wait, 0);
        bool waits = false;
        for (int i = 0; i < 3; i++)
                if (shardmap_find(m2, sd[i].id) >= 0 && move_receiver_of(m1, m2, sd[i].id))
                        waits |= st_wait[sd[i].id] == PSNET__STATUS__STATUS_UNAVAILABLE;
        int steps = 0;
        move_steps(sd, &steps, ask ? 1 : 100000);
        /* Each receiver knows both workers' clocks of table 0 done from
         * its senders (2: worker 8's push of it is whole on shard 1). */
        bool clocks = true;
        for (int i = 0; i < 3; i++)
                if (shardmap_find(m2, sd[i].id) >= 0 && move_receiver_of(m1, m2, sd[i].id))
                        for (uint32_t w = 7; w <= 8; w++) {
                                int64_t lo, hi;
                                rows_worker_clocks(sd[i].rows, w, &lo, &hi);
                                clocks &= hi == 2;
                        }
        again = true;
        push_all(m2, 8, 2, ids, 40, NULL, 0);
        int asked;
        bool settled = finish_move(sd, m2, mref, ids, &steps, &asked);
        CHECK(waits && settled && move_refused == 0 && records > 0 && clocks && (ask ? asked > 0 : asked == 0),
              "%s: pushes wait until the senders said what each worker's pushes left with them (%d messages; "
              "its clocks done known: %s)%s, then the move ends in %d steps, every shard whole", what, records,
              clocks ? "yes" : "no", ask ? ", the rows they touch asked for at once" : "", steps);
        float want[96], got[96];
        int pr = pull_all(mref, ids, 48, want), pg = pull_all(m2, ids, 48, got);
        CHECK(pr == 0 && pg == 0 && memcmp(got, want, sizeof got) == 0 && copies_refused == 0,
              "%s: worker 8's clock 2 sent again (applied on shard 1 before the change), then clock 3: every row "
              "as one shard that took every push once holds it, bit for bit (%d %d)", what, pr, pg);
        check_held(sd, what, m2, m3, lost, ids, want);
out:
        copy_pushes = false;
        for (int i = 0; i < 3; i++)
                rows_free(sd[i].rows);
        rows_free(ref.rows);
        nsides = 0;
}

static void test_asp_move(Job job) {
        char why[160] = "";
        job.mode = MODE_ASP;
        job.replicas = 0;
        job.id += 47;
        if (CHECK(job_validate(&job, why, sizeof why) == 0, "an ASP job whose rows may move (%s)", why))
                move_cases(&job, test_asp_move_case, "ASP, ");
}

/* Shards sd[0..n) under m, their copies, moves and asks routed to one
 * another (route_closed, route_move, route_want). */
static void routed(Side *sd, size_t n, const ShardMap *m) {
        for (size_t i = 0; i < n; i++) {
                sd[i].map = m;
                sides[nsides++] = &sd[i];
                RowsHooks hk = { .members = members, .closed = route_closed, .want = route_want, .ud = &sd[i] };
                rows_set_hooks(sd[i].rows, &hk);
        }
}

/* The map of shards sd[0..n) changes from m1 to m2, and their moves run
 * to their end: the steps taken. */
static int move_all(Side *sd, size_t n, const ShardMap *m1, const ShardMap *m2) {
        for (size_t i = 0; i < n; i++) {
                rows_map_changed(sd[i].rows, m1, m2, sd[i].id);
                sd[i].map = m2;
        }
        int steps = 0;
        for (bool more = true; more && steps < 10000; steps++) {
                more = false;
                for (size_t i = 0; i < n; i++)
                        more |= rows_move_step(sd[i].rows, 4, &(RowsMoveHooks) { route_move, route_record, all_answered, NULL, &sd[i] });
        }
        return steps;
}

/* A table with ttl=2 on shard 1 alone; shard 2 added (two copies): 5
 * groups of 8 ids, group g last pushed at clock g (0..4), so that groups 0
 * and 1 are gone by clock 4. Its rows move with the clock each was last
 * pushed at: at clock 5, which pushes group 4 again, group 2 goes (3
 * clocks unpushed) wherever it is, group 3 stays, and every row held has
 * one copy on the other shard. */
static void test_bounded_move(Job job) {
        char why[160] = "";
        job.tables[0].ttl = 2;
        bool valid = bsp_job(&job, 2, 90, why, sizeof why);
        const uint32_t one[1] = { 1 }, two[2] = { 1, 2 };
        ShardMap *m1 = map_of(1, one, 1, 1, &job), *m2 = map_of(2, two, 2, 2, &job);
        Side sd[2] = { side(&job, 1), side(&job, 2) };
        nsides = 0;
        move_refused = copies_refused = 0;
        if (!CHECK(valid && m1 && m2 && sd[0].rows && sd[1].rows, "a BSP job of a table with ttl=2 (%s)", why))
                goto out;
        routed(sd, 2, m1);
        int64_t ids[40];
        for (int k = 0; k < 40; k++)
                ids[k] = 9000 + 61 * k;
        for (int64_t c = 0; c < 5; c++) /* groups c..4 (ids 8c..39) at clock c */
                for (uint32_t w = 7; w <= 8; w++)
                        push_all(m1, w, c, ids + 8 * c, 40 - 8 * (size_t) c, NULL, 0);
        RowsStats r1;
        rows_stats(sd[0].rows, &r1);
        int steps = move_all(sd, 2, m1, m2);
        bool settled = !rows_promoting(sd[0].rows) && !rows_promoting(sd[1].rows) && move_refused == 0;
        uint64_t held[2], bytes;
        TableCounts k2;
        rows_table_stats(sd[1].rows, 0, &held[1], &bytes, &k2);
        CHECK(settled && r1.rows == 24 && held[1] > 0 && held[1] < 24,
              "ttl=2: shard 1 held groups 2 to 4 (%llu rows); shard 2 added, it leads %llu of them in %d steps",
              (unsigned long long) r1.rows, (unsigned long long) held[1], steps);
        for (uint32_t w = 7; w <= 8; w++)
                push_all(m2, w, 5, ids + 32, 8, NULL, 0);
        int64_t got[40], st[40];
        float rows8[40 * 4];
        size_t n1 = rows_copy_rows(sd[0].rows, 0, ids, 40, got, rows8, st);
        size_t n2 = rows_copy_rows(sd[1].rows, 0, ids, 40, got + n1, rows8, st + n1);
        bool groups = n1 + n2 == 16;
        for (size_t k = 0; k < n1 + n2; k++)
                groups &= (got[k] - 9000) / 61 >= 24 && st[k] == ((got[k] - 9000) / 61 >= 32 ? 5 : 3);
        RowsStats a, b;
        rows_stats(sd[0].rows, &a);
        rows_stats(sd[1].rows, &b);
        CHECK(groups && n1 > 0 && n2 > 0 && a.backup_rows + b.backup_rows == 16 && copies_refused == 0,
              "after clock 5 the shards hold groups 3 and 4 (%zu + %zu rows), each with the clock it was last pushed "
              "at, and one copy of each (%llu)", n1, n2, (unsigned long long) (a.backup_rows + b.backup_rows));
out:
        rows_free(sd[0].rows);
        rows_free(sd[1].rows);
        shardmap_free(m1);
        shardmap_free(m2);
        nsides = 0;
}

/* A table with max-rows=8 on three shards, one copy; shard 3 removed: its
 * rows move to the two left, past their bound while they come (a row
 * dropped before it has arrived could come again), every one of them
 * kept; the next clock's push brings each shard back within 8. */
static void test_bounded_removal(Job job) {
        char why[160] = "";
        job.tables[0].max_rows = 8;
        bool valid = bsp_job(&job, 1, 91, why, sizeof why);
        const uint32_t three[3] = { 1, 2, 3 }, two[2] = { 1, 2 };
        ShardMap *m1 = map_of(1, three, 3, 1, &job), *m2 = map_of(2, two, 2, 1, &job);
        Side sd[3] = { side(&job, 1), side(&job, 2), side(&job, 3) };
        nsides = 0;
        move_refused = 0;
        if (!CHECK(valid && m1 && m2 && sd[0].rows && sd[1].rows && sd[2].rows, "max-rows=8 on three shards (%s)",
                   why))
                goto out;
        routed(sd, 3, m1);
        int64_t ids[24];
        for (int k = 0; k < 24; k++)
                ids[k] = 7100 + 29 * k;
        for (uint32_t w = 7; w <= 8; w++)
                push_all(m1, w, 0, ids, 24, NULL, 0);
        uint64_t before = 0, after = 0, most = 0, bytes;
        TableCounts k;
        for (int i = 0; i < 3; i++) {
                uint64_t n;
                rows_table_stats(sd[i].rows, 0, &n, &bytes, &k);
                before += n;
        }
        (void) move_all(sd, 3, m1, m2);
        for (int i = 0; i < 2; i++) {
                uint64_t n;
                rows_table_stats(sd[i].rows, 0, &n, &bytes, &k);
                after += n;
                most = MAX(most, n);
        }
        CHECK(move_refused == 0 && after == before && most > 8,
              "shard 3 removed: all %llu rows moved to the two left, %llu on one (past 8 while they come)",
              (unsigned long long) after, (unsigned long long) most);
        int64_t fresh[2] = { 99001, 99002 };
        for (uint32_t w = 7; w <= 8; w++)
                push_all(m2, w, 1, fresh, 2, NULL, 0);
        most = 0;
        for (int i = 0; i < 2; i++) {
                uint64_t n;
                rows_table_stats(sd[i].rows, 0, &n, &bytes, &k);
                most = MAX(most, n);
        }
        CHECK(most <= 8, "the next clock brings each shard within max-rows again (%llu)", (unsigned long long) most);
out:
        for (int i = 0; i < 3; i++)
                rows_free(sd[i].rows);
        shardmap_free(m1);
        shardmap_free(m2);
        nsides = 0;
}

/* A copy that did not reach a backup: the primary says its rows are not
 * whole and sends every row it leads to its backups again, a step again
 * at the next tick where it could not be sent. */
static size_t resent;
static int resend_fail;

static int count_rebuild(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n) {
        (void) ud, (void) table, (void) clock, (void) ids;
        if (resend_fail > 0) {
                resend_fail--;
                return -EAGAIN;
        }
        resent += n;
        return 0;
}

static void test_copies_lost(Job job) {
        char why[160] = "";
        bool valid = bsp_job(&job, 2, 60, why, sizeof why);
        const uint32_t two[2] = { 1, 2 };
        ShardMap *m = map_of(1, two, 2, 2, &job);
        Side s = side(&job, 1);
        if (!CHECK(valid && m && s.rows, "shard 1 of two, two copies (%s)", why))
                goto out;
        RowsHooks hk = { .members = members, .closed = closed, .ud = &s };
        rows_set_hooks(s.rows, &hk);
        int64_t ids[30];
        size_t n = 0;
        for (int64_t id = 7000; n < 30; id++)
                if (shardmap_row_holder(m, 0, id, 0) == shardmap_find(m, 1))
                        ids[n++] = id;
        for (uint32_t w = 7; w <= 8; w++)
                push_to(&s, m, w, 0, 1, ids, n);
        uint64_t from, before = rows_rebuilds(s.rows, &from);
        rows_copies_lost(s.rows, 1);
        bool behind = rows_whole_epoch(s.rows, 1) == 0;
        resent = 0;
        resend_fail = 1;
        bool more = rows_rebuild_step(s.rows, 8, count_rebuild, NULL);
        size_t after_fail = resent;
        int steps = 0;
        while (rows_rebuild_step(s.rows, 8, count_rebuild, NULL) && steps < 100)
                steps++;
        CHECK(behind && !more && after_fail == 0 && resent == n && rows_rebuilds(s.rows, &from) == before + 1 &&
                      from == 0 && rows_whole_epoch(s.rows, 1) == 1,
              "a copy lost: not whole under epoch 1 until all %zu rows led here were sent again (%zu, in %d steps; a "
              "step that could not be sent is tried again)", n, resent, steps);
        /* A push of the closed clock again: under the same map a duplicate
         * alone; under a newer one (the same shards) its rows are copied
         * again before it is acknowledged (the first copy may be on its way). */
        const int64_t *got, *gone;
        size_t ngot, ngone;
        int dup = push_to(&s, m, 7, 0, 1, ids, n);
        rows_last_applied(s.rows, &got, &ngot, &gone, &ngone);
        size_t same_map = ngot;
        ShardMap *m2 = map_of(2, two, 2, 2, &job);
        if (m2) {
                rows_map_changed(s.rows, m, m2, 1);
                int again = push_to(&s, m2, 7, 0, 2, ids, n);
                rows_last_applied(s.rows, &got, &ngot, &gone, &ngone);
                CHECK(dup == PSNET__STATUS__STATUS_DUPLICATE && same_map == 0 &&
                              again == PSNET__STATUS__STATUS_DUPLICATE && ngot == n && memcmp(got, ids, n * 8) == 0,
                      "a closed clock sent again: a DUPLICATE; under a newer map its %zu rows go to be copied again "
                      "(%zu)", n, ngot);
        }
        shardmap_free(m2);
out:
        rows_free(s.rows);
        shardmap_free(m);
}

int main(void) {
        Job job;
        char why[160] = "";
        job_defaults(&job);
        job.mode = MODE_ASP;
        job.replicas = 1;
        job.max_grad_norm = 100;
        if (!CHECK(job_set_tables(&job, "w:2:sgd:lr=0.5:init=0.1,e:3:adagrad", why, sizeof why) == 0 &&
                           job_validate(&job, why, sizeof why) == 0,
                   "a job with two tables (%s)", why))
                return tap_done();
        ShardDesc d[2] = { { .id = 1, .endpoint = (char *) "ipc:///tmp/a" }, { .id = 2, .endpoint = (char *) "ipc:///tmp/b" } };
        CHECK(shardmap_place(1, d, 2, &job, &map) == 0 && rows_new(&rows) == 0 &&
                      rows_configure(rows, &job, why, sizeof why) == 0,
              "shard 1 of two holds the tables (%s)", why);
        /* Ids shard 1 holds, and one it does not. */
        int64_t mine[3], other = -1;
        size_t nm = 0;
        for (int64_t id = 100; nm < 3 || other < 0; id++) {
                bool here = shardmap_row_holder(map, 0, id, 0) == shardmap_find(map, 1);
                if (here && nm < 3)
                        mine[nm++] = id;
                else if (!here && other < 0)
                        other = id;
        }
        float before[6], after[6], g[6] = { 1, -2, 0.5f, 0, 4, -4 };
        CHECK(pull(0, mine, 3, before, 2, why) == 0, "pull of three rows never pushed (%s)", why);
        bool init_ok = true;
        for (int i = 0; i < 6; i++)
                init_ok &= fabsf(before[i]) <= 0.1f;
        CHECK(init_ok && before[0] != before[2], "they read as their initial values, within init=0.1, row by row");
        RowsStats s;
        rows_stats(rows, &s);
        CHECK(s.rows == 0, "a pull creates no row (%llu held)", (unsigned long long) s.rows);

        CHECK(push(0, 7, 0, mine, 3, g, 6, UINT64_MAX, why) == 0, "push of three gradients (%s)", why);
        CHECK(pull(0, mine, 3, after, 2, why) == 0, "pulled again");
        bool sgd = true;
        for (int i = 0; i < 6; i++)
                sgd &= after[i] == before[i] - 0.5f * g[i];
        CHECK(sgd, "each row moved by -lr g (sgd, lr 0.5), exactly");
        CHECK(push(0, 7, 0, mine, 3, g, 6, UINT64_MAX, why) == PSNET__STATUS__STATUS_DUPLICATE,
              "the same worker's push of clock 0 again: DUPLICATE");
        float again[6];
        pull(0, mine, 3, again, 2, why);
        CHECK(memcmp(again, after, sizeof again) == 0, "and not applied twice");

        int64_t mixed[2] = { mine[0], other };
        int st = push(0, 7, 1, mixed, 2, g, 4, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_MOVED && strstr(why, "shard 2's"), "a row of shard 2: MOVED (%s)", why);
        st = pull(0, mixed, 2, again, 2, why);
        CHECK(st == PSNET__STATUS__STATUS_MOVED, "pulled here: MOVED too (%s)", why);
        st = push(0, 7, 5, mine, 3, g, 6, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_INVALID && strstr(why, "more than 2 past"), "clock 5 after 0: INVALID (%s)",
              why);
        float bad[6] = { 1, 2, NAN, 0, 0, 0 };
        st = push(0, 7, 1, mine, 3, bad, 6, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_NOT_FINITE && strstr(why, "not finite"), "a NaN: NOT_FINITE (%s)", why);
        float big[6] = { 90, 90, 0, 0, 0, 0 };
        st = push(0, 7, 1, mine, 3, big, 6, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_INVALID && strstr(why, "--max-grad-norm"), "norm 127 over 100: INVALID (%s)",
              why);
        st = push(0, 7, 1, mine, 3, g, 6, 10, why);
        CHECK(st == PSNET__STATUS__STATUS_RESOURCE && strstr(why, "memory limit"), "no room: RESOURCE (%s)", why);
        float g9[9] = { 0 };
        st = push(0, 7, 1, mine, 3, g9, 9, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_SIZE && strstr(why, "rows of 2 floats"), "rows of 3 floats for dim 2: SIZE (%s)",
              why);
        int64_t twice[2] = { mine[0], mine[0] };
        st = push(0, 7, 1, twice, 2, g, 4, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_INVALID, "an id twice: INVALID (%s)", why);
        st = push(5, 7, 1, mine, 3, g, 6, UINT64_MAX, why);
        CHECK(st == PSNET__STATUS__STATUS_UNKNOWN_KEY, "table 5 of 2: UNKNOWN_KEY (%s)", why);
        pull(0, mine, 3, again, 2, why);
        CHECK(memcmp(again, after, sizeof again) == 0, "nothing of the refused pushes applied");
        CHECK(push(0, 7, 1, mine, 3, g, 6, UINT64_MAX, why) == 0 && push(0, 8, 0, mine, 3, g, 6, UINT64_MAX, why) == 0,
              "clock 1 of worker 7, then clock 0 of worker 8: applied (%s)", why);
        /* A push in parts: each part applied as it comes, once. */
        float p0[6];
        pull(0, mine, 3, p0, 2, why);
        next_part = 1, next_parts = 3;
        int a1 = push(0, 7, 2, mine + 1, 1, g, 2, UINT64_MAX, why);
        next_part = 1, next_parts = 3;
        int a1d = push(0, 7, 2, mine + 1, 1, g, 2, UINT64_MAX, why);
        next_part = 2, next_parts = 2;
        int amix = push(0, 7, 2, mine + 2, 1, g, 2, UINT64_MAX, why);
        int64_t lo, hi;
        rows_worker_clocks(rows, 7, &lo, &hi);
        CHECK(a1 == 0 && a1d == PSNET__STATUS__STATUS_DUPLICATE && amix == PSNET__STATUS__STATUS_INVALID && hi == 1,
              "part 1 of 3 applied, again a DUPLICATE, a part of another count refused (%s); worker 7 counts clock 1 "
              "whole, not 2 (%ld)", why, (long) hi);
        next_part = 0, next_parts = 3;
        int a0 = push(0, 7, 2, mine, 1, g, 2, UINT64_MAX, why);
        next_part = 2, next_parts = 3;
        int a2 = push(0, 7, 2, mine + 2, 1, g, 2, UINT64_MAX, why);
        pull(0, mine, 3, again, 2, why);
        rows_worker_clocks(rows, 7, &lo, &hi);
        bool each = a0 == 0 && a2 == 0 && hi == 2;
        for (int i = 0; i < 6; i++)
                each &= again[i] == p0[i] - 0.5f * g[i % 2];
        CHECK(each, "with parts 0 and 2 every row moved once, and clock 2 counts whole (%ld)", (long) hi);
        next_part = 0, next_parts = 3;
        CHECK(push(0, 7, 2, mine, 1, g, 2, UINT64_MAX, why) == PSNET__STATUS__STATUS_DUPLICATE,
              "a part of a whole push again: DUPLICATE");
        rows_stats(rows, &s);
        CHECK(s.rows == 3 && s.pushed == 12 && s.refused >= 10 && s.bytes > 0,
              "3 rows held, 12 applied, the refusals counted (%llu, %llu, %llu)", (unsigned long long) s.rows,
              (unsigned long long) s.pushed, (unsigned long long) s.refused);
        test_bsp(job, mine);
        test_failover(job);
        test_asp_failover(job);
        test_bounded_failover(job, 2, 0);
        test_bounded_failover(job, 0, 10);
        test_move(job);
        test_asp_move(job);
        test_bounded_move(job);
        test_bounded_removal(job);
        test_copies_lost(job);
        job.id++;
        CHECK(rows_configure(rows, &job, why, sizeof why) == 0, "another job");
        rows_stats(rows, &s);
        CHECK(s.rows == 0, "starts with no rows");
        rows_free(rows);
        shardmap_free(map);
        return tap_done();
}
