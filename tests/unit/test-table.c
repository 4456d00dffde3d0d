/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/psd/psd-table.c, a sparse table's rows on a shard: each
 * optimizer's per-row update against an independent reference — Adagrad and
 * Adam against torch.optim (PyTorch 1.13, float32: one nn.Parameter per row,
 * stepped only when its row is touched, which is what lazy Adam is), SGD and
 * FTRL-proximal against values worked out by hand from the formulas (psd-
 * table.h; FTRL from McMahan et al., KDD 2013) — then rows created on first
 * touch with values that depend on the seed and the id alone, any 64-bit id,
 * growth past a million rows (slabs, the index rebuilt) and the memory it
 * takes a row, and the refusals (an id twice, NaN, a full table)
 * that leave the table as it was. */
#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "hash.h"
#include "psd-table.h"
#include "tap.h"

#define TOL 2e-6

static TableConf conf(TableOptim o, float lr) {
        TableConf c = { .name = "t", .dim = 2, .optim = o, .lr = lr, .eps = 1e-10f, .beta1 = 0.9f, .beta2 = 0.999f,
                        .beta = 1.0f, .l1 = 0.1f, .l2 = 0.01f, .seed = 42 };
        return c;
}

static Table *new_table(const TableConf *c) {
        Table *t = NULL;
        char why[128] = "";
        int r = table_new(c, &t, why, sizeof why);
        CHECK(r == 0, "table_new (%s)", why);
        return t;
}

/* The three gradients of the references, pushed to row 7. */
static const float G[3][2] = { { 0.5f, 0.1f }, { -0.25f, 0.4f }, { 0.05f, -0.3f } };

static void push3(Table *t, int64_t id) {
        char why[128] = "";
        for (int i = 0; i < 3; i++)
                if (table_push(t, &id, 1, G[i], why, sizeof why) != 0)
                        CHECK(false, "push %d of id %lld (%s)", i, (long long) id, why);
}

static void check_optimizers(void) {
        /* SGD, by hand: w = -0.1 * (0.5 - 0.25 + 0.05), -0.1 * (0.1 + 0.4 - 0.3). */
        TableConf c = conf(TABLE_SGD, 0.1f);
        Table *t = new_table(&c);
        push3(t, 7);
        const float *w = table_row(t, 7, NULL);
        CHECK(w && fabsf(w[0] + 0.03f) < TOL && fabsf(w[1] + 0.02f) < TOL, "sgd: %g %g (by hand -0.03 -0.02)",
              w ? w[0] : NAN, w ? w[1] : NAN);
        t = table_free(t);

        /* Adagrad, lr 0.1, eps 1e-10: torch.optim.Adagrad gives -0.0641873479 -0.138179436. */
        c = conf(TABLE_ADAGRAD, 0.1f);
        t = new_table(&c);
        push3(t, 7);
        w = table_row(t, 7, NULL);
        CHECK(w && fabs(w[0] - -0.0641873479) < TOL && fabs(w[1] - -0.138179436) < TOL,
              "adagrad: %.9g %.9g (torch -0.0641873479 -0.138179436)", w ? w[0] : NAN, w ? w[1] : NAN);
        CHECK(w && fabs(w[2] - 0.315) < TOL && fabs(w[3] - 0.26) < TOL, "adagrad's sums of squares: %g %g",
              w ? w[2] : NAN, w ? w[3] : NAN);
        t = table_free(t);

        /* Lazy Adam, lr 0.01: row 7 touched three times, row 9 once, in the
         * third push with (0.2, -0.6). torch.optim.Adam, a parameter per row
         * stepped when touched: -0.0152835716 -0.0206108447 and -0.00999999885
         * 0.00999999978 (row 9's first step: its bias correction is that of
         * step 1, not 3). */
        c = conf(TABLE_ADAM, 0.01f);
        c.eps = 1e-8f;
        t = new_table(&c);
        char why[128] = "";
        int64_t a = 7, both[2] = { 7, 9 };
        table_push(t, &a, 1, G[0], why, sizeof why);
        table_push(t, &a, 1, G[1], why, sizeof why);
        float g3[4] = { G[2][0], G[2][1], 0.2f, -0.6f };
        CHECK(table_push(t, both, 2, g3, why, sizeof why) == 0, "adam: a push of two rows (%s)", why);
        uint32_t s7 = 0, s9 = 0;
        const float *w7 = table_row(t, 7, &s7), *w9 = table_row(t, 9, &s9);
        CHECK(w7 && fabs(w7[0] - -0.0152835716) < TOL && fabs(w7[1] - -0.0206108447) < TOL,
              "lazy adam, row 7 after 3 steps: %.9g %.9g (torch -0.0152835716 -0.0206108447)", w7 ? w7[0] : NAN,
              w7 ? w7[1] : NAN);
        CHECK(w9 && fabs(w9[0] - -0.00999999885) < TOL && fabs(w9[1] - 0.00999999978) < TOL,
              "lazy adam, row 9 after its 1 step: %.9g %.9g (torch -0.00999999885 0.00999999978)",
              w9 ? w9[0] : NAN, w9 ? w9[1] : NAN);
        CHECK(s7 == 3 && s9 == 1, "each row counts its own steps (%u, %u)", s7, s9);
        t = table_free(t);

        /* FTRL-proximal, alpha 0.1, beta 1, l1 0.1, l2 0.01, from z = n = w = 0.
         * Value 0 by hand: g 0.5: s = 0.5/0.1 = 5, z = 0.5, n = 0.25,
         * w = -(0.5 - 0.1) / ((1 + 0.5)/0.1 + 0.01) = -0.0266489007; after the
         * three: -0.0138239492. Value 1 (0.1, 0.4, -0.3 would pass l1; here
         * 0.02, 0.03, -0.01): |z| stays under l1, w is exactly 0. */
        c = conf(TABLE_FTRL, 0.1f);
        t = new_table(&c);
        const float f[3][2] = { { 0.5f, 0.02f }, { -0.25f, 0.03f }, { 0.05f, -0.01f } };
        int64_t id = 7;
        table_push(t, &id, 1, f[0], why, sizeof why);
        w = table_row(t, 7, NULL);
        CHECK(w && fabs(w[0] - -0.0266489007) < TOL, "ftrl, first step by hand: %.9g (-0.0266489007)",
              w ? w[0] : NAN);
        table_push(t, &id, 1, f[1], why, sizeof why);
        table_push(t, &id, 1, f[2], why, sizeof why);
        w = table_row(t, 7, NULL);
        CHECK(w && fabs(w[0] - -0.0138239492) < TOL, "ftrl, third step by hand: %.9g (-0.0138239492)",
              w ? w[0] : NAN);
        CHECK(w && w[1] == 0.0f, "ftrl: a weight whose |z| stays under l1 is exactly 0 (%g)", w ? w[1] : NAN);
        t = table_free(t);
}

static void check_rows(void) {
        TableConf c = conf(TABLE_ADAGRAD, 0.1f);
        c.dim = 16;
        c.init_scale = 0.05f;
        Table *t = new_table(&c), *u = new_table(&c);
        int64_t ids[5] = { 0, -1, INT64_MIN, INT64_MAX, 123456789012345 };
        float a[5 * 16], b[5 * 16];
        char why[128] = "";
        CHECK(table_pull(t, ids, 5, false, a, why, sizeof why) == 0 && table_size(t) == 0,
              "a pull without create reads the initial values and stores nothing");
        CHECK(table_pull(t, ids, 5, true, a, why, sizeof why) == 0 && table_size(t) == 5,
              "rows are created on first touch, any 64-bit id (%zu)", table_size(t));
        CHECK(table_pull(u, ids + 2, 3, true, b, why, sizeof why) == 0 &&
                      table_pull(u, ids, 2, true, b + 3 * 16, why, sizeof why) == 0,
              "another table, the same ids in another order");
        bool same = memcmp(a + 2 * 16, b, 3 * 16 * sizeof(float)) == 0 &&
                    memcmp(a, b + 3 * 16, 2 * 16 * sizeof(float)) == 0;
        CHECK(same, "a row's first values depend on the seed and the id alone");
        bool in = true, differ = false;
        for (int i = 0; i < 5 * 16; i++)
                in = in && a[i] >= -0.05f && a[i] < 0.05f;
        for (int i = 1; i < 5; i++)
                differ = differ || memcmp(a, a + i * 16, 16 * sizeof(float)) != 0;
        CHECK(in && differ, "uniform in [-0.05, 0.05), different per id");
        t = table_free(t);
        u = table_free(u);

        /* A million rows: every one found again with its own values. */
        c.dim = 4;
        t = new_table(&c);
        enum { M = 1000000, B = 4096 };
        int64_t *big = malloc(B * sizeof *big);
        float *rows = malloc((size_t) B * 4 * sizeof *rows);
        bool ok = big && rows;
        for (int64_t start = 0; ok && start < M; start += B) {
                for (int i = 0; i < B; i++)
                        big[i] = (start + i) * 2654435761ll - 7;
                ok = table_pull(t, big, B, true, rows, why, sizeof why) == 0;
        }
        CHECK(ok && table_size(t) == (size_t) (M / B + (M % B != 0)) * B, "a million rows and more (%zu)",
              table_size(t));
        int64_t probe = 777777 * 2654435761ll - 7;
        const float *w = table_row(t, probe, NULL);
        float want[4];
        table_pull(t, &probe, 1, false, want, why, sizeof why);
        CHECK(w && memcmp(w, want, sizeof want) == 0, "row 777,777 is found again with its values");
        CHECK(table_row(t, 5, NULL) == NULL, "an id never touched has no row");
        /* Beside each row's 32 bytes (4 values, 4 sums): its id (8) and at most
         * 4/3 to 8/3 of a 4-byte index slot, plus the last slab's unused rows
         * (no stamps: the table has no max_rows or ttl). */
        size_t mem = table_memory(t), rowb = 4 * 2 * sizeof(float), nr = table_size(t);
        CHECK(mem >= nr * (rowb + 8) && mem <= nr * (rowb + 8 + 11) + 4096 * (rowb + 8) + 4096,
              "memory: %.1f bytes a row for rows of %zu bytes", (double) mem / (double) nr, rowb);
        free(big);
        free(rows);
        t = table_free(t);
}

static void check_refusals(void) {
        TableConf c = conf(TABLE_ADAM, 0.01f);
        c.max_rows = 3;
        Table *t = new_table(&c);
        char why[160] = "";
        int64_t ids[3] = { 1, 2, 1 };
        float g[6] = { 1, 1, 1, 1, 1, 1 };
        CHECK(table_push(t, ids, 3, g, why, sizeof why) == -EINVAL && strstr(why, "id 1 comes twice"),
              "an id twice in one push is refused (%s)", why);
        CHECK(table_size(t) == 0, "and nothing was created");
        g[3] = NAN;
        CHECK(table_push(t, ids, 2, g, why, sizeof why) == -EINVAL && strstr(why, "id 2") && strstr(why, "NaN"),
              "a NaN gradient is refused, naming the id (%s)", why);
        CHECK(table_size(t) == 0, "and nothing was applied");
        g[3] = 1;
        int64_t two[2] = { 1, 2 }, more[2] = { 3, 4 };
        CHECK(table_push(t, two, 2, g, why, sizeof why) == 0 && table_size(t) == 2, "two rows pushed");
        float before[4];
        memcpy(before, table_row(t, 1, NULL), sizeof before / 2);
        memcpy(before + 2, table_row(t, 2, NULL), sizeof before / 2);
        float out[4];
        CHECK(table_pull(t, more, 2, true, out, why, sizeof why) == -ENOSPC && table_size(t) == 2,
              "a pull that would create past the bound is refused");
        CHECK(table_pull(t, two, 2, true, out, why, sizeof why) == 0 && memcmp(out, before, sizeof out) == 0,
              "rows already held are served as they were");
        TableCounts k;
        CHECK(table_push(t, more, 2, g, why, sizeof why) == 0 && table_size(t) == 3 && table_row(t, 3, NULL) &&
                      !table_row(t, 4, NULL) && (table_counts(t, &k), k.refused == 1),
              "all rows pushed at this clock, 2 new where 1 fits: the first made, the other dropped and counted");
        t = table_free(t);
        Table *bad = NULL;
        TableConf z = conf(TABLE_ADAM, 0.01f);
        z.beta1 = 1.0f;
        CHECK(table_new(&z, &bad, why, sizeof why) == -EINVAL && strstr(why, "beta1"),
              "a conf out of range is refused, saying which field (%s)", why);
        z = conf(TABLE_SGD, 0.01f);
        z.dim = 0;
        CHECK(table_new(&z, &bad, why, sizeof why) == -EINVAL && strstr(why, "dim"), "dim 0 is refused (%s)", why);
}

/* A backup's copy: rows exported (values, state, adam's step count) and
 * imported into another table go on exactly as the originals. */
static void check_copy(void) {
        TableConf c = conf(TABLE_ADAM, 0.01f);
        c.init_scale = 0.1f;
        Table *a = new_table(&c), *b = new_table(&c);
        if (!a || !b)
                return;
        int64_t ids[3] = { 5, -9, 1ll << 50 };
        float g[6] = { 1, -1, 0.5f, 2, -3, 0.25f }, rows[3 * 7], ra[6], rb[6];
        CHECK(table_row_floats(a) == 2 * 3 + 1, "an adam row of dim 2: 2 values, 4 of state, its step count");
        table_push(a, ids, 3, g, NULL, 0);
        table_push(a, ids, 2, g, NULL, 0);
        table_export(a, ids, 3, rows);
        CHECK(table_import(b, ids, 3, rows, NULL, NULL, 0) == 0 && table_size(b) == 3, "imported into another table");
        table_push(a, ids, 3, g, NULL, 0);
        table_push(b, ids, 3, g, NULL, 0);
        table_pull(a, ids, 3, false, ra, NULL, 0);
        table_pull(b, ids, 3, false, rb, NULL, 0);
        uint32_t sa, sb;
        table_row(a, ids[0], &sa);
        table_row(b, ids[0], &sb);
        CHECK(memcmp(ra, rb, sizeof ra) == 0 && sa == 3 && sb == 3, "the copy goes on as the original (steps %u %u)",
              sa, sb);
        int64_t missing = 77, twice[2] = { 5, 5 };
        float fresh[7], pulled[2];
        table_export(a, &missing, 1, fresh);
        table_pull(a, &missing, 1, false, pulled, NULL, 0);
        CHECK(fresh[0] == pulled[0] && fresh[1] == pulled[1] && fresh[2] == 0 && fresh[6] == 0,
              "a row the table lacks exports as a new one starts");
        CHECK(table_import(b, twice, 2, rows, NULL, NULL, 0) == -EINVAL, "an id twice: nothing imported");
        table_free(a);
        table_free(b);
}

/* A bounded table's copies (max-rows=4): the ids its bounds drop are
 * noted, handed over once and only while asked for; its rows' stamps go
 * into a table for copies, which bounds nothing itself (past max-rows,
 * no admission) and drops what it is told; a row moved keeps its stamp. */
static void check_bounded_copies(void) {
        TableConf c = conf(TABLE_SGD, 0.1f);
        c.max_rows = 4;
        char why[128] = "";
        Table *a = new_table(&c), *b = NULL, *d = NULL;
        int nc = table_new_copies(&c, &b, why, sizeof why);
        if (!CHECK(a && nc == 0 && table_new_copies(&c, &d, why, sizeof why) == 0, "tables for copies (%s)", why))
                goto out;
        CHECK(table_stamped(a) && table_stamped(b), "a bounded table and its copies keep stamps");
        int64_t first[4] = { 1, 2, 3, 4 }, next[2] = { 5, 6 }, *gone = NULL, st[6], ids6[6] = { 1, 2, 3, 4, 5, 6 };
        float g[12] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }, rows[6 * 2];
        table_push(a, first, 4, g, NULL, 0); /* not noted yet: nothing dropped */
        table_log_gone(a, true);
        table_tick(a, 1);
        table_push(a, first + 2, 2, g, NULL, 0); /* 3 and 4 at clock 1 */
        table_tick(a, 2);
        table_push(a, next, 2, g, NULL, 0); /* 5, 6 new: 1 and 2 go, least recently pushed */
        long ng = table_gone(a, &gone);
        bool two = ng == 2 && ((gone[0] == 1 && gone[1] == 2) || (gone[0] == 2 && gone[1] == 1));
        ps_free(gone);
        CHECK(two && table_gone(a, &gone) == 0 && !gone && table_size(a) == 4,
              "ids 1 and 2, least recently pushed, noted as dropped (%ld), once", ng);
        int64_t held[4] = { 3, 4, 5, 6 };
        table_stamps(a, held, 4, st);
        CHECK(st[0] == 1 && st[1] == 1 && st[2] == 2 && st[3] == 2, "each row's stamp is its last push's clock");
        int64_t ask[3] = { 1, 5, 4 }, hid[3], hst[3];
        float hrows[3 * 2], erows[2 * 2];
        int64_t heldpair[2] = { 5, 4 }, est[2];
        table_export(a, heldpair, 2, erows);
        table_stamps(a, heldpair, 2, est);
        size_t nh = table_export_held(a, ask, 3, hid, hrows, hst);
        CHECK(nh == 2 && hid[0] == 5 && hid[1] == 4 && memcmp(hrows, erows, sizeof erows) == 0 && hst[0] == est[0] &&
                      hst[1] == est[1],
              "the rows held of 3 ids (1 dropped): 2, with their rows and stamps (%zu)", nh);
        /* The copies: 6 rows past max-rows 4 (its first four, then the dropped go). */
        table_export(a, held, 4, rows + 4);
        CHECK(table_push(a, first, 0, g, NULL, 0) == 0, "an empty push");
        int64_t old[2] = { 1, 2 }, olds[2] = { 0, 0 };
        float oldrows[4] = { 0.5f, 0.5f, 0.25f, 0.25f };
        CHECK(table_import(b, old, 2, oldrows, olds, why, sizeof why) == 0 &&
                      table_import(b, held, 4, rows + 4, st, why, sizeof why) == 0 && table_size(b) == 6,
              "a table for copies holds 6 rows of a table of at most 4 (%s)", why);
        int64_t got[6];
        table_stamps(b, ids6, 6, got);
        CHECK(got[0] == 0 && got[2] == 1 && got[5] == 2, "with their stamps");
        CHECK(table_remove(b, old, 2) == 2 && table_remove(b, old, 2) == 0 && table_size(b) == 4,
              "the rows told dropped go, once");
        CHECK(table_move_one(b, d, 5) == 1 && table_row(d, 5, NULL) != NULL, "a row moved");
        table_stamps(d, next, 1, got);
        CHECK(got[0] == 2, "keeps its stamp (%lld)", (long long) got[0]);
        table_log_gone(a, false);
        table_tick(a, 3);
        int64_t more[2] = { 7, 8 };
        table_push(a, more, 2, g, NULL, 0);
        CHECK(table_gone(a, &gone) == 0, "no longer noted once asked not to");
        /* Held (rows moving): nothing dropped, past max-rows too; released, the next push drops down to it. */
        table_hold_bounds(a, true);
        table_tick(a, 4);
        int64_t six[6] = { 11, 12, 13, 14, 15, 16 };
        int made = table_push(a, six, 6, g, NULL, 0);
        CHECK(made == 0 && table_size(a) == 10, "held: 6 new rows past 4 all made (%zu)", table_size(a));
        table_hold_bounds(a, false);
        table_tick(a, 5);
        int64_t one[1] = { 17 };
        int released = table_push(a, one, 1, g, NULL, 0);
        CHECK(released == 0 && table_size(a) <= 4, "released: the next push drops down to 4 (%zu)", table_size(a));
out:
        table_free(a);
        table_free(b);
        table_free(d);
}

/* A sweep's verdict on odd ids: even ids stay, those divisible by 3 move,
 * the rest go. */
static int verdict(int64_t id, const float *row, void *ud) {
        int *seen = ud;
        (*seen) += row != NULL;
        return id % 2 == 0 ? TABLE_KEEP : id % 3 == 0 ? TABLE_MOVE : TABLE_DROP;
}

/* A sweep keeps, moves (whole) or drops each row as it says, a step at a
 * time; a trim after gives back the slabs past the rows left. */
static void check_sweep(void) {
        TableConf c = conf(TABLE_ADAGRAD, 0.1f);
        Table *a = new_table(&c), *b = new_table(&c);
        if (!a || !b)
                return;
        enum { N = 20000 };
        static int64_t ids[N];
        static float g[N * 2], before[N * 2], after[N * 2];
        for (int i = 0; i < N; i++) {
                ids[i] = 1000 + i;
                g[2 * i] = 0.01f * (float) (i % 97), g[2 * i + 1] = -0.5f;
        }
        table_push(a, ids, N, g, NULL, 0);
        table_pull(a, ids, N, false, before, NULL, 0);
        size_t full = table_memory(a), at = 0;
        int seen = 0, steps = 0;
        long gone = 0;
        while (at < table_size(a) && steps < 1000) {
                long r = table_sweep(a, b, &at, 4096, verdict, &seen);
                if (r < 0)
                        break;
                gone += r;
                steps++;
        }
        size_t kept = 0, moved = 0;
        for (int i = 0; i < N; i++) {
                kept += ids[i] % 2 == 0 && table_row(a, ids[i], NULL);
                moved += ids[i] % 2 && ids[i] % 3 == 0 && table_row(b, ids[i], NULL);
        }
        CHECK(seen == N && gone == N / 2 && kept == N / 2 && table_size(a) == N / 2 && moved == table_size(b) &&
                      moved > 3000 && steps >= 3,
              "a sweep of %d rows in %d steps: each seen once, even ids kept (%zu), a third of the odd moved (%zu), "
              "the rest gone", N, steps, kept, moved);
        table_pull(a, ids, N, false, after, NULL, 0);
        table_pull(b, ids, N, false, g, NULL, 0);
        bool same = true;
        for (int i = 0; i < N; i++)
                if (ids[i] % 2 == 0 || ids[i] % 3 == 0)
                        same &= memcmp((ids[i] % 2 == 0 ? after : g) + 2 * i, before + 2 * i, 2 * sizeof *g) == 0;
        CHECK(same, "the rows kept and moved hold their values, bit for bit");
        size_t slab = 4096 * (table_row_floats(a) * sizeof(float) + sizeof(int64_t));
        table_trim(a);
        size_t trimmed = table_memory(a);
        table_trim(a);
        CHECK(trimmed + slab <= full && table_memory(a) == trimmed,
              "a trim gives back the slabs past the rows left but one (%zu of %zu bytes; a slab %zu), once", trimmed,
              full, slab);
        table_free(a);
        table_free(b);
}

/* Bounds: max_rows makes room by the least recently pushed rows, ttl drops
 * rows unpushed that long, admit makes a row at an id's admit-th push. */
static void check_bounds(void) {
        char why[160] = "";
        TableConf c = conf(TABLE_SGD, 0.5f);
        c.max_rows = 4;
        Table *t = new_table(&c);
        if (!t)
                return;
        float g[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
        for (int64_t id = 1; id <= 4; id++) {
                table_tick(t, id);
                table_push(t, &id, 1, g, why, sizeof why);
        }
        table_tick(t, 5);
        int64_t one = 1, five[2] = { 5, 6 };
        table_push(t, &one, 1, g, why, sizeof why); /* 1 is recent again: 2 and 3 are the oldest */
        TableCounts k;
        table_counts(t, &k);
        CHECK(table_push(t, five, 2, g, why, sizeof why) == 0 && table_size(t) == 4 && table_row(t, 1, NULL) &&
                      !table_row(t, 2, NULL) && !table_row(t, 3, NULL) && table_row(t, 4, NULL) &&
                      table_row(t, 5, NULL) && table_row(t, 6, NULL),
              "full at 4 rows: two new ones take the places of the two least recently pushed (%s)", why);
        float w[2];
        int64_t all[4] = { 1, 4, 5, 6 };
        bool found = true;
        for (int i = 0; i < 4; i++) {
                table_pull(t, &all[i], 1, false, w, why, sizeof why);
                found &= table_row(t, all[i], NULL) && memcmp(table_row(t, all[i], NULL), w, sizeof w) == 0;
        }
        CHECK(found, "every row kept is found again at its place after the moves");
        TableCounts k2;
        table_counts(t, &k2);
        CHECK(k2.evicted_full - k.evicted_full == 2 && k2.admitted == 6, "counted: 2 evicted, 6 rows made");
        t = table_free(t);

        c = conf(TABLE_SGD, 0.5f);
        c.ttl = 10;
        t = new_table(&c);
        int64_t ids[100];
        for (int i = 0; i < 100; i++)
                ids[i] = i * 7919 + 3;
        table_tick(t, 1);
        float gg[200];
        for (int i = 0; i < 200; i++)
                gg[i] = 1;
        table_push(t, ids, 100, gg, why, sizeof why);
        table_tick(t, 20);
        for (int i = 0; i < 10; i++) /* pushes of one recent row sweep the rest */
                table_push(t, &ids[0], 1, g, why, sizeof why);
        table_counts(t, &k);
        CHECK(table_size(t) == 1 && table_row(t, ids[0], NULL) && k.evicted_ttl == 99,
              "ttl 10: rows unpushed since clock 1 are gone at clock 20, the pushed one stays (%zu left, %llu dropped)",
              table_size(t), (unsigned long long) k.evicted_ttl);
        t = table_free(t);

        /* Many evictions of both kinds: every row left is found by its id, and
         * only those. */
        c = conf(TABLE_SGD, 0.5f);
        c.max_rows = 700;
        c.ttl = 8;
        t = new_table(&c);
        uint64_t x = 12345;
        int64_t batch[256];
        float gb[512];
        for (int i = 0; i < 512; i++)
                gb[i] = 0.25f;
        for (int clock = 0; clock < 400; clock++) {
                /* Bursts past max_rows (the oldest go), then a trickle (ttl takes the rest). */
                int nb = clock % 50 < 5 ? 256 : 16;
                table_tick(t, clock);
                for (int i = 0; i < nb; i++)
                        batch[i] = (int64_t) (splitmix64_next(&x) % 4000) * 256 + i; /* distinct within the batch */
                table_push(t, batch, (size_t) nb, gb, why, sizeof why);
        }
        size_t found_rows = 0;
        for (int64_t v = 0; v < 4000 * 256; v++)
                found_rows += table_row(t, v, NULL) != NULL;
        table_counts(t, &k);
        CHECK(found_rows == table_size(t) && table_size(t) <= 700 && k.evicted_full > 0 && k.evicted_ttl > 0 &&
                      k.admitted - k.evicted_full - k.evicted_ttl == table_size(t),
              "bursts and trickles over 400 clocks: %zu rows, every one found (%zu), %llu made = %llu evicted full + "
              "%llu by ttl + those left", table_size(t), found_rows, (unsigned long long) k.admitted,
              (unsigned long long) k.evicted_full, (unsigned long long) k.evicted_ttl);
        t = table_free(t);

        c = conf(TABLE_SGD, 0.5f);
        c.admit = 3;
        t = new_table(&c);
        int64_t id = 42;
        float before[2], after[2];
        table_pull(t, &id, 1, false, before, why, sizeof why);
        table_push(t, &id, 1, g, why, sizeof why);
        table_push(t, &id, 1, g, why, sizeof why);
        table_counts(t, &k);
        CHECK(table_size(t) == 0 && k.filtered == 2, "admit 3: two pushes of an id make no row (%llu filtered)",
              (unsigned long long) k.filtered);
        table_push(t, &id, 1, g, why, sizeof why);
        table_pull(t, &id, 1, false, after, why, sizeof why);
        CHECK(table_size(t) == 1 && after[0] == before[0] - 0.5f && after[1] == before[1] - 0.5f,
              "the third makes it, from its initial values, and is applied");
        t = table_free(t);
}

/* An Adam row a push leaves at gradient 0 in one of its values: that
 * value's first moment, at the smallest denormal (where IEEE keeps it), is
 * flushed to 0 (common/fpflush.h), and the caller's mode is as it was. */
static void check_denormals(void) {
        TableConf c = conf(TABLE_ADAM, 0.01f);
        Table *t = new_table(&c);
        if (!t)
                return;
        int64_t id = 11;
        float row[7], g[2] = { 0.0f, 0.5f };
        table_export(t, &id, 1, row); /* a fresh row: its first values, state 0 */
        row[2] = FLT_TRUE_MIN;         /* m of value 0 */
        row[4] = 1e-6f;                /* v of value 0 */
        CHECK(table_import(t, &id, 1, row, NULL, NULL, 0) == 0, "a row imported with a denormal moment");
        CHECK(table_push(t, &id, 1, g, NULL, 0) == 0, "pushed with gradient 0 in value 0");
        table_export(t, &id, 1, row);
        volatile float x = FLT_MIN;
        CHECK(row[2] == 0.0f && row[3] != 0.0f && x / 4.0f > 0.0f,
              "the denormal moment flushed to 0 (%g), the other moved (%g), the caller's mode kept", (double) row[2],
              (double) row[3]);
        t = table_free(t);
}

int main(void) {
        check_copy();
        check_denormals();
        check_bounded_copies();
        check_sweep();
        check_bounds();
        check_optimizers();
        check_rows();
        check_refusals();
        CHECK(table_state_per_value(TABLE_SGD) == 0 && table_state_per_value(TABLE_ADAGRAD) == 1 &&
                      table_state_per_value(TABLE_ADAM) == 2 && table_state_per_value(TABLE_FTRL) == 2,
              "state per value: sgd 0, adagrad 1, adam 2, ftrl 2");
        return tap_done();
}
