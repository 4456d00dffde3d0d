/* SPDX-License-Identifier: Apache-2.0 */
/* A sparse table's rows on one shard (issue 34, the first piece): rows of dim
 * floats keyed by arbitrary 64-bit ids, created on first touch with values
 * that depend only on the table's seed and the id (so a backup, a restore or
 * another shard creates the same row), each with its own optimizer state,
 * updated only when touched:
 *   sgd:     w -= lr * g
 *   adagrad: a += g^2; w -= lr * g / (sqrt(a) + eps)        (torch.optim.Adagrad)
 *   adam:    lazy: the row's own step count t, advanced when it is touched;
 *            m = b1*m + (1-b1) g; v = b2*v + (1-b2) g^2;
 *            w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 *   ftrl:    FTRL-proximal (McMahan et al., KDD 2013), per value, alpha = lr:
 *            s = (sqrt(n + g^2) - sqrt(n)) / alpha; z += g - s*w; n += g^2;
 *            w = |z| <= l1 ? 0 : -(z - sign(z)*l1) / ((beta + sqrt(n)) / alpha + l2)
 * The table's configuration (TableConf) is common/table-spec.h's. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "table-spec.h"

typedef struct Table Table;

/* Called now and then (about every million rows) while a table on the
 * calling thread rehashes its index (a second or more at tens of millions
 * of rows): the shard's heartbeat goes meanwhile, so that its lease holds. */
void table_set_poll(void (*fn)(void *ud), void *ud);
/* 0, -EINVAL (a conf out of range: why says which field) or -ENOMEM. */
int table_new(const TableConf *c, Table **ret, char *why, size_t n);
Table *table_free(Table *t);
size_t table_size(const Table *t);
/* Bytes the table holds (index, slabs and their ids). */
size_t table_memory(const Table *t);

/* The rows of ids[0..n) into out (n * dim floats), each created first where
 * create (else a missing row reads as its initial values, not stored).
 * -ENOSPC where creating them would pass max_rows (nothing created; why
 * says so), -ENOMEM; 0. */
int table_pull(Table *t, const int64_t *ids, size_t n, bool create, float *out, char *why, size_t whylen);
/* One gradient per row (grads: n * dim floats, ids distinct) applied with the
 * table's optimizer, rows created on first touch (on the admit-th with admit >
 * 1: an id not admitted yet is counted and its gradient dropped), each
 * stamped with the clock of table_tick; past max_rows the least recently
 * pushed rows go (and when every row was pushed at this clock, the push's
 * new rows past the bound are dropped, counted as refused); with ttl, rows
 * not pushed for ttl clocks go as a sweep meets them. -EINVAL for an id
 * twice or a non-finite gradient: nothing applied then (why says which),
 * -ENOMEM; 0. */
int table_push(Table *t, const int64_t *ids, size_t n, const float *grads, char *why, size_t whylen);
/* The clock the next pushes are stamped with (and ttl counts from). */
void table_tick(Table *t, int64_t clock);
typedef struct TableCounts {
        uint64_t admitted;      /* rows made */
        uint64_t filtered;      /* pushes of an id not admitted yet (admit > 1): dropped */
        uint64_t evicted_ttl;   /* rows dropped after ttl clocks unpushed */
        uint64_t evicted_full;  /* rows dropped, least recently pushed, to stay within max_rows */
        uint64_t refused;       /* pushed rows of new ids dropped: max_rows full of rows of this clock */
} TableCounts;
void table_counts(const Table *t, TableCounts *ret);
/* -EINVAL (why names the id) where an id of ids[0..n) comes twice, -ENOMEM, 0. */
int table_distinct(const int64_t *ids, size_t n, char *why, size_t whylen);
/* A row as it is kept, values then optimizer state (and adam's step count):
 * its floats; the rows of ids[0..n) so, into out (n x that; a row the table
 * lacks as a new one would start); and rows so written, installed in place
 * of what the table holds (a backup's copy): 0, -EINVAL (an id twice),
 * -ENOSPC past max_rows, -ENOMEM, nothing installed then. */
size_t table_row_floats(const Table *t);
void table_export(const Table *t, const int64_t *ids, size_t n, float *out);
/* stamps: the clock each row was last pushed at (NULL: the clock of
 * table_tick), kept where the table keeps them. */
int table_import(Table *t, const int64_t *ids, size_t n, const float *in, const int64_t *stamps, char *why,
                 size_t whylen);

/* --- a bounded table's copies (max_rows or ttl; --replicas >= 2) ---
 * A backup mirrors its primary's rows: a table for its copies bounds
 * nothing itself (no max_rows, ttl or admission) but keeps each row's
 * stamp; the primary notes the ids its bounds drop (table_log_gone) and
 * hands them over (table_gone) with each clock's copy, the rows it sends
 * carrying their stamps (table_stamps); the backup drops them
 * (table_remove). A row moved between tables (table_move_if, table_sweep,
 * table_move_one) keeps its stamp. */
int table_new_copies(const TableConf *c, Table **ret, char *why, size_t n);
/* Whether the table keeps each row's stamp (it has max_rows or ttl, or is
 * the copies of one that has). */
bool table_stamped(const Table *t);
/* The stamps of the rows of ids[0..n) into out (a row not held, or a table
 * without stamps: the clock of table_tick). */
void table_stamps(const Table *t, const int64_t *ids, size_t n, int64_t *out);
/* The rows the table holds of ids[0..n), each looked up once: their ids
 * into ret_ids, whole rows (as table_export writes them) into out and,
 * where the table keeps stamps, stamps into ret_stamps (else not written):
 * how many. */
size_t table_export_held(const Table *t, const int64_t *ids, size_t n, int64_t *ret_ids, float *out,
                         int64_t *ret_stamps);
/* From now on (on) or no longer, the ids max_rows and ttl drop are noted
 * (the log starts empty). */
void table_log_gone(Table *t, bool on);
/* The ids noted since the last call, into *ret (the caller frees it; NULL
 * where none): how many, or -ENOMEM where one could not be noted (the
 * log starts again empty). */
long table_gone(Table *t, int64_t **ret);
/* Drops the rows of ids[0..n) the table holds: how many. */
size_t table_remove(Table *t, const int64_t *ids, size_t n);
/* While held, max_rows and ttl drop no row (a push makes every new row
 * it brings, an import installs past max_rows): rows moving between
 * shards must not go before they have arrived. Released, the next push
 * drops what the bounds say. */
void table_hold_bounds(Table *t, bool hold);
/* Moves the rows of from whose id take says yes to into to (whole, as
 * table_export writes it), looking at budget rows from row number *at on
 * (*at: where to go on; done once it reaches table_size(from)): a backup's
 * copies of the rows this shard leads after a fail-over, a step at a time.
 * How many moved, or -ENOMEM. from and to have the same conf. */
long table_move_if(Table *from, Table *to, size_t *at, size_t budget, bool (*take)(int64_t id, void *ud), void *ud);
/* What a sweep does with a row: leaves it, moves it into the other table
 * (whole), or drops it. */
enum { TABLE_KEEP, TABLE_MOVE, TABLE_DROP };
typedef int (*TableSweepFn)(int64_t id, const float *row, void *ud);
/* Shows budget rows of t from row number *at on to see (the row whole, as
 * table_export writes it, valid until the call returns), which says what
 * becomes of each (TABLE_MOVE: into to, of the same conf); *at as for
 * table_move_if. How many left t, or -ENOMEM (that row stays). */
long table_sweep(Table *t, Table *to, size_t *at, size_t budget, TableSweepFn see, void *ud);
/* Gives back the slabs past the table's rows (a spare kept), after rows
 * left it (a move's sweep). */
void table_trim(Table *t);
/* Row id of from into to: 1, 0 where from has none, -ENOMEM. */
int table_move_one(Table *from, Table *to, int64_t id);
/* Up to max rows from row number from on (rows are numbered 0..table_size-1
 * in no order of id; a row dropped moves the last one into its number):
 * their ids and values (dim floats each); how many. */
size_t table_scan(const Table *t, size_t from, size_t max, int64_t *ids, float *values);
/* The same, whole rows as table_export writes them (table_row_floats each):
 * a checkpoint's copy of the table. */
size_t table_dump(const Table *t, size_t from, size_t max, int64_t *ids, float *rows);
/* The row of id (dim floats) and its step count (adam), or NULL where it has none. */
const float *table_row(const Table *t, int64_t id, uint32_t *ret_steps);
