/* SPDX-License-Identifier: Apache-2.0 */
/* A job's sparse tables on this shard (issue 34): the rows of each table
 * (psd-table.h) this shard holds under the map's rendezvous placement
 * (shardmap_row_holder), pulled and pushed by id (ROWS_PULL, ROWS_PUSH).
 *
 * A pull answers the rows of its ids, a row never pushed reading as its
 * initial values (not stored: a pull creates nothing). A push applies one
 * gradient row per id with the table's optimizer, creating rows on first
 * touch, whole or not at all: under ASP as it comes; under BSP it is parked
 * until every member of its clock pushed the table for that clock (an empty
 * push from a worker with no row here), then the members' rows are summed
 * per id in ascending worker order, averaged over the members, applied
 * once, and every push of the clock acknowledged (clocks close in order;
 * a fence holds them). Every
 * id must be this shard's under its map (else MOVED), distinct, its values
 * finite (unless the job allows otherwise), within the job's
 * --max-grad-norm, and its new rows within the table's max-rows and the
 * shard's --memory-limit (else RESOURCE). Duplicates are the worker's seq's
 * business: a (worker, table) push for a clock not above its last one is
 * answered DUPLICATE and not applied again. Under BSP a pull for clock c
 * waits (UNAVAILABLE: asked again) while a clock below c is open. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include "job.h"
#include "ckpt-file.h"
#include "psnet.pb-c.h"
#include "psd-table.h"
#include "shardmap.h"

typedef struct Rows Rows;

typedef struct RowsStats {
        uint64_t rows;          /* held, all tables */
        uint64_t bytes;         /* their memory (index and slabs) */
        uint64_t pulled, pushed;/* rows answered and applied */
        uint64_t refused;       /* pushes and pulls refused */
        uint64_t backup_rows;   /* copies held of rows other shards lead */
        uint64_t copies_in;     /* ROWS_COPY installed (a clock of a table from a primary) */
        uint64_t moved_in;      /* rows ROWS_MOVE brought here (as its own or as copies) */
} RowsStats;

/* A parked push to acknowledge: where its answer goes. */
typedef struct RowsAck {
        const zmq_msg_t *route;
        uint64_t seq;
        uint32_t worker;
} RowsAck;

/* What the rows need of their shard under BSP. */
typedef struct RowsHooks {
        /* The members of clock (ascending worker ids), as the gate has them. */
        void (*members)(void *ud, int64_t clock, const uint32_t **ret, size_t *n);
        /* Clock of table closed: ids[0..n) were applied (status OK; their
         * rows as rows_copy_rows reads them, for the backups) and the
         * table's bounds dropped the rows of gone[0..ngone), or nothing was
         * (status and reason); acks: the parked pushes to acknowledge. */
        void (*closed)(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n, const int64_t *gone,
                       size_t ngone, const RowsAck *acks, size_t nacks, int status, const char *reason);
        /* While rows move here (below, "rows moved"): a request touches
         * ids[0..n) of table, which sender shard has not sent yet: ask it
         * for them now (ROWS_WANT). */
        void (*want)(void *ud, uint32_t shard, uint32_t table, const int64_t *ids, size_t n);
        void *ud;
} RowsHooks;

/* rows_push's answer for a push parked under BSP (no status yet). */
#define ROWS_PARKED 1000

int rows_new(Rows **ret);
void rows_set_hooks(Rows *r, const RowsHooks *hooks);
Rows *rows_free(Rows *r);
/* The job's tables, empty for a new job (the same job keeps its rows). 0,
 * -ENOMEM, or -EINVAL with why (a table the shard cannot build). */
int rows_configure(Rows *r, const Job *job, char *why, size_t n);
/* ROWS_PULL (validated by the wire: a table, ids): the rows into *ret
 * (a frame of n x dim f32): OK, or a status with the reason. */
int rows_pull(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *ids,
              zmq_msg_t *ret, char *reason, size_t n);
/* ROWS_SCAN (validated by the wire: a table): up to ROWS_SCAN_MAX of the
 * rows this shard holds from h->cursor on, their ids and values into ret[0]
 * and ret[1], and whether rows remain past them (*ret_next: the cursor to
 * ask from). OK, or a status with the reason. */
#define ROWS_SCAN_MAX 65536u
int rows_scan(Rows *r, const Psnet__Header *h, zmq_msg_t *ret, bool *ret_more, uint64_t *ret_next, char *reason,
              size_t n);
/* ROWS_PUSH (validated by the wire: a table, ids, rows) from an admitted
 * member: OK (applied), ROWS_PARKED (BSP: acknowledged through the hooks
 * once its clock closes; route copied), DUPLICATE (pushed before), or a
 * status with the reason and nothing applied. room: bytes the shard may
 * still grow by. */
int rows_push(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
              const zmq_msg_t *route, uint64_t room, char *reason, size_t n);
/* BSP: closes every table's clocks below limit whose members all pushed,
 * in order (limit: a fence's, INT64_MAX without one). */
void rows_settle(Rows *r, int64_t limit);
/* Pushes parked, all tables. */
size_t rows_parked(const Rows *r);
void rows_stats(const Rows *r, RowsStats *ret);
/* Rows held, their bytes and the counts of rows made and dropped in table i
 * (0 when the job has no table i). */
void rows_table_stats(const Rows *r, size_t i, uint64_t *ret_rows, uint64_t *ret_bytes, TableCounts *ret_counts);

/* --- copies (--replicas >= 2; BSP) ---
 * After a clock of a table closes on its primary, every row it changed goes
 * whole (values, optimizer state, step count: rows_export) to each of the
 * row's backups (shardmap_row_holder 1..R-1) as ROWS_COPY (psd-migrate.c),
 * to every other shard of the map (empty where it backs none of them), and
 * the clock's pushes are acknowledged once every copy was answered. A
 * backup keeps a copy's parts until its last and installs them at once
 * into its copies of the table (kept apart from the rows it leads: pulls,
 * scans and checkpoints see only those), noting the clock it has whole
 * from that primary. At a fail-over (rows_map_changed) the copies of rows
 * this shard now leads become its own, and a push a worker sends again
 * under the new map is cut down to the rows not applied here yet: its own
 * at a clock closed here, a lost primary's whose copy of the clock came
 * whole. A clock closed here that a lost primary had not copied here whole
 * opens again: that primary acknowledged it to nobody, so every member
 * sends it again.
 * A table with max-rows or ttl (bounded) copies each row's stamp (the clock
 * it was last pushed at) with it, and the ids its bounds dropped at the
 * clock, which the backup drops too: it holds what its primary holds, each
 * row with its stamp, and a row led after a fail-over is dropped in its
 * turn as it would have been. */
size_t rows_row_floats(const Rows *r, uint32_t table);
void rows_export(const Rows *r, uint32_t table, const int64_t *ids, size_t n, float *out);
/* ASP/SSP: the ids the last rows_push applied here (n 0 where it applied
 * none) and those its table's bounds dropped, for its copies (valid until
 * the next rows_push). A ROWS_COPY naming the worker (h->origin) is noted
 * as that worker's push of the clock: sent again after a fail-over, a push
 * is cut to the rows whose update this shard does not hold yet. A push
 * sent again under a newer map, in any mode (BSP: DUPLICATE, its clock
 * closed here), gives all its ids: their rows are copied again, and the
 * push acknowledged once that copy is answered, since the first sending's
 * copy may still be on its way. */
void rows_last_applied(const Rows *r, const int64_t **ids, size_t *n, const int64_t **gone, size_t *ngone);
/* Whether table keeps its rows' stamps (a bounded one). */
bool rows_bounded(const Rows *r, uint32_t table);
/* The rows this shard leads of ids[0..n) (an id pushed and not kept here,
 * not admitted or refused, has none): their ids, whole rows (rows_export)
 * and, for a bounded table, stamps (else ret_stamps is not written): how
 * many. */
size_t rows_copy_rows(const Rows *r, uint32_t table, const int64_t *ids, size_t n, int64_t *ret_ids,
                      float *ret_rows, int64_t *ret_stamps);
/* A ROWS_COPY from primary h->sender (validated by the wire): OK (a part
 * kept, or the copy installed), or a status with the reason. */
int rows_copy_in(Rows *r, const Psnet__Header *h, const zmq_msg_t *frames, size_t nframes, char *reason, size_t n);
/* The map changed from old to map: after a fail-over (shards lost), the
 * copies of the rows self leads now join its tables; where rows move
 * between live shards (below), self's part in that begins. */
void rows_map_changed(Rows *r, const ShardMap *old, const ShardMap *map, uint32_t self);

/* --- rows moved at a map change ---
 * A change that gives rows new holders among live shards (a shard added;
 * or one removed where rows have a single copy, which then hands its rows
 * over) moves them: each shard of the map before that stays (or leaves
 * with the only copies) is a sender, each shard that holds rows it did not
 * hold before (the new one; with a single copy, every one) a receiver.
 * A sender drops the pushes parked under the old map (their workers send
 * them again under the new one, cut by it), then, a step at a time
 * (rows_move_step): tells every receiver the clock each table stands at
 * (the last closed before the change: rows it no longer leads change no
 * more), sends each row it led to each new holder that did not hold it
 * (ROWS_MOVE, whole), drops its copies of rows it no longer holds, says
 * its last; once every receiver has answered all of it, the rows it no
 * longer leads become copies (it backs them now) or go. A receiver
 * (rows_move_in) installs rows as they come, as its own or as copies;
 * until every sender said its clock it answers pushes UNAVAILABLE, then
 * closes up to the lowest, and until a sender said its last, a request
 * touching rows that sender led and has not sent, which it asks that
 * sender for at once (ROWS_WANT, rows_want). A push sent again is cut as after a
 * fail-over: under BSP a sender's rows at or below its clock were applied;
 * under ASP/SSP the ids the sender noted of the worker's push were
 * (RowsMoveHooks.record). A checkpoint's cut waits for the move
 * (rows_promoting). */
/* clock: the first the sender had not closed at the change. */
/* stamps: a bounded table's rows' (NULL for another, or no rows). */
typedef int (*RowsMoveFn)(void *ud, uint32_t shard, uint32_t table, int64_t clock, const int64_t *ids,
                          const float *rows, const int64_t *stamps, size_t n, bool last);
/* A step of this shard's part as a sender, budget rows at most: send
 * sends to a receiver, answered says whether everything sent was answered
 * (1), not yet (0), or some was refused (-1: the rows stay here and the
 * shard never says they are whole), and busy whether the receivers are
 * behind (no rows are sent then: what is queued for a receiver stays
 * short, and rows it asks for reach it soon). Whether more steps remain
 * now. */
/* record (ASP/SSP): before its first word of a table to a receiver,
 * what each worker's pushes of the table left at this shard: the ids of
 * its push of clock whose update this shard holds, for rows that go to the
 * receiver, and its last clock whose push is whole here (done): a push
 * sent again under the new map is cut there as here. */
typedef struct RowsMoveHooks {
        RowsMoveFn send;
        int (*record)(void *ud, uint32_t shard, uint32_t table, uint32_t worker, int64_t clock, int64_t done,
                      const int64_t *ids, size_t n);
        int (*answered)(void *ud);
        bool (*busy)(void *ud);
        void *ud;
} RowsMoveHooks;
bool rows_move_step(Rows *r, size_t budget, const RowsMoveHooks *hk);
/* This shard's parts as a sender finished (rows no longer led made copies
 * or dropped, their memory given back to the allocator). */
uint64_t rows_moves(const Rows *r);
/* A ROWS_MOVE from h->sender (validated by the wire) under map: OK, or a
 * status with the reason (nothing installed then). Rows of its own that
 * came already (asked for) are not installed again: they may have changed
 * here since. Ids without rows (asked for, not held by the sender) start
 * as new rows here. */
int rows_move_in(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
                 size_t nframes, char *reason, size_t n);
/* A ROWS_WANT from receiver h->sender (validated by the wire): the rows it
 * asks for that this shard led, and now the asker leads, sent at once
 * (send; ids this shard does not hold without rows). OK, or a status with
 * the reason. */
int rows_want(Rows *r, const Psnet__Header *h, const zmq_msg_t *frames, RowsMoveFn send, void *ud, char *reason,
              size_t n);
/* Shard of the map before the last change (NULL: none such): a sender
 * that left the map is known by it. */
const ShardDesc *rows_prev_shard(const Rows *r, uint32_t shard);
/* After a fail-over the copies of the rows this shard now leads join its
 * tables (those a pull or a clock touches at once; the rest budget rows a
 * step, none while a checkpoint is written), then every row it leads goes
 * to its backups again (some had their copy on a lost shard), budget rows a
 * step: fn gets them (ids; their rows as rows_export reads them). Whether
 * more steps remain. */
typedef int (*RowsRebuildFn)(void *ud, uint32_t table, int64_t clock, const int64_t *ids, size_t n);
bool rows_rebuild_step(Rows *r, size_t budget, RowsRebuildFn fn, void *ud);
/* A copy of a clock did not reach a backup (it could not be sent, or was
 * refused) while the map is at epoch: the clock's rows are on fewer copies
 * than the map says, so every row led here goes to its backups again
 * (rows_rebuild_step; fn < 0: that step again at the next tick), and until
 * that was answered this shard does not say its rows are whole under
 * epoch (pscoord fails the job rather than lose them with it). */
void rows_copies_lost(Rows *r, uint64_t epoch);
/* Whether copies still wait to join the tables after a fail-over, or rows
 * move: a checkpoint's cut waits for them. */
bool rows_promoting(const Rows *r);
/* The map epoch since which every row this shard leads is on all its
 * copies: epoch (the current one) but while a fail-over's copies join its
 * rows and its rows go to their new backups, the one before that. */
uint64_t rows_whole_epoch(const Rows *r, uint64_t epoch);
/* Rebuilds finished (their copies sent, maybe not yet answered), and the
 * whole epoch from before the last (*ret_from). */
uint64_t rows_rebuilds(const Rows *r, uint64_t *ret_from);

/* --- checkpoints (psd-checkpoint.c) --- */
size_t rows_ntables(const Rows *r);
const TableConf *rows_conf(const Rows *r, size_t i);
/* BSP: the lowest and highest clock closed over the tables (-1: none yet;
 * both -1 without tables). */
void rows_closed(const Rows *r, int64_t *ret_lo, int64_t *ret_hi);
/* The lowest and highest clock worker pushed at over the tables (-1 for a
 * table it has not pushed; both -1 without tables). */
void rows_worker_clocks(const Rows *r, uint32_t worker, int64_t *ret_lo, int64_t *ret_hi);
/* The records a snapshot of every table takes (CKPT_ROWS blocks of
 * rows_block_rows rows each, the last shorter). */
size_t rows_blocks(const Rows *r);
size_t rows_block_rows(const Table *t);
/* A checkpoint's cut: the records of every table's rows into
 * out[0..rows_blocks) (without their data: the writer reads it from
 * ret_tables[table], table_dump, from row chunk x rows_block_rows on), each
 * at clock; how many. The tables freeze: nothing changes them (a push is
 * answered UNAVAILABLE, a BSP clock does not close; a new job's tables
 * replace them, which are kept) until rows_thaw. */
size_t rows_snapshot(Rows *r, int64_t clock, CkptRecord *out, Table **ret_tables);
/* The writer is done: the tables change again (then rows_settle), those
 * replaced meanwhile are freed. */
void rows_thaw(Rows *r);
/* A checkpoint's tables, loaded (by psd-checkpoint.c, off the loop):
 * tables[i] replaces table i and backups[i] its copies of other shards'
 * rows (taken over; NULL keeps it), and the tables' clocks stand at clock
 * (BSP: clock - 1 closed). */
void rows_adopt(Rows *r, Table *const *tables, Table *const *backups, size_t n, int64_t clock);
