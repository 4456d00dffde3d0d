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
 * every push would, bit for bit. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "job.h"
#include "psd-rows.h"
#include "shardmap.h"
#include "tap.h"
#include "wire.h"

static ShardMap *map;
static Rows *rows;
static uint32_t self_id = 1; /* the shard pull() asks */

static void frame(zmq_msg_t *m, const void *p, size_t n) {
        zmq_msg_init_size(m, n);
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

static void members(void *ud, int64_t clock, const uint32_t **ret, size_t *n) {
        (void) ud, (void) clock;
        *ret = members2;
        *n = 2;
}

static void closed(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n, const RowsAck *a,
                   size_t na, int status, const char *reason) {
        (void) ud, (void) table, (void) clock, (void) ids, (void) n, (void) a, (void) reason;
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
        ok &= ok && table_import(t[0], ids, 2, dumped, why, sizeof why) == 0;
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
        rows_free(rows);
        rows = was;
}

/* --- a fail-over (--replicas 2, BSP) --------------------------------------------------------- */

/* A shard of the fail-over test: its rows, and where its closed clocks' copies go. */
typedef struct Side {
        Rows *rows;
        uint32_t id;
        struct Side *backup;    /* the other shard, while copies reach it */
        bool deliver;
        bool half;              /* only the first part of each copy arrives */
        int acks;
} Side;

static void side_closed(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n, const RowsAck *a,
                        size_t na, int status, const char *reason) {
        Side *s = ud;
        (void) a, (void) reason;
        s->acks += (int) na;
        if (status != 0 || !s->backup || !s->deliver)
                return;
        size_t per = rows_row_floats(s->rows, table);
        float buf[64 * 8];
        rows_export(s->rows, table, ids, n, buf);
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
                zmq_msg_t f[2];
                frame(&f[0], ids + from, cnt * 8);
                frame(&f[1], buf + from * per, cnt * per * 4);
                st = rows_copy_in(s->backup->rows, &h, f, why, sizeof why);
                zmq_msg_close(&f[0]);
                zmq_msg_close(&f[1]);
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

static Side side(const Job *job, uint32_t id) {
        Side s = { .id = id };
        char why[160];
        if (rows_new(&s.rows) < 0 || rows_configure(s.rows, job, why, sizeof why) < 0)
                s.rows = rows_free(s.rows);
        return s;
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
        Side s1 = side(job, 1), s2 = side(job, 2), ref = side(job, 2);
        if (!CHECK(s1.rows && s2.rows && ref.rows, "three shards' tables"))
                goto out;
        s1.backup = &s2, s1.deliver = true;
        RowsHooks hk = { .members = members, .closed = side_closed, .ud = &s1 };
        rows_set_hooks(s1.rows, &hk);
        hk.ud = &s2;
        rows_set_hooks(s2.rows, &hk);
        hk.ud = &ref;
        rows_set_hooks(ref.rows, &hk);
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
        Rows *keep = rows;
        ShardMap *keep_map = map;
        rows = ref.rows, map = m2, self_id = 2;
        char why[160] = "";
        pull(0, ids, n, want, 2, why);
        rows = s2.rows;
        int pst = pull(0, ids, n, got, 2, why);
        rows = keep, map = keep_map, self_id = 1;
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

static void test_failover(Job job) {
        char why[160] = "";
        job.mode = MODE_BSP;
        job.replicas = 2;
        job.id += 20;
        if (!CHECK(job_validate(&job, why, sizeof why) == 0, "a BSP job with two copies of its rows (%s)", why))
                return;
        ShardDesc d[2] = { { .id = 1, .endpoint = (char *) "ipc:///tmp/a" }, { .id = 2, .endpoint = (char *) "ipc:///tmp/b" } };
        ShardMap *m1 = NULL, *m2 = NULL;
        if (!CHECK(shardmap_place(1, d, 2, &job, &m1) == 0 && shardmap_place(2, d + 1, 1, &job, &m2) == 0,
                   "maps of two shards and of shard 2 alone"))
                goto out;
        shardmap_set_replicas(m1, 2);
        int64_t ids[24];
        for (int k = 0; k < 24; k++)
                ids[k] = 1000 + 37 * k;
        for (int how = 1; how <= 3; how++)
                test_failover_case(&job, m1, m2, ids, 24, how);
out:
        shardmap_free(m1);
        shardmap_free(m2);
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
        job.id++;
        CHECK(rows_configure(rows, &job, why, sizeof why) == 0, "another job");
        rows_stats(rows, &s);
        CHECK(s.rows == 0, "starts with no rows");
        rows_free(rows);
        shardmap_free(map);
        return tap_done();
}
