/* SPDX-License-Identifier: Apache-2.0 */
/* A job's sparse tables on this shard (issue 34): the rows of each table
 * (psd-table.h) this shard holds under the map's rendezvous placement
 * (shardmap_row_holder), pulled and pushed by id (ROWS_PULL, ROWS_PUSH).
 *
 * A pull answers the rows of its ids, a row never pushed reading as its
 * initial values (not stored: a pull creates nothing). A push applies one
 * gradient row per id with the table's optimizer, creating rows on first
 * touch, as it comes (the job runs --mode asp), whole or not at all: every
 * id must be this shard's under its map (else MOVED), distinct, its values
 * finite (unless the job allows otherwise), within the job's
 * --max-grad-norm, and its new rows within the table's max-rows and the
 * shard's --memory-limit (else RESOURCE). Duplicates are the worker's seq's
 * business: a (worker, table) push whose seq is not above the last applied
 * one is answered DUPLICATE and not applied again. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include "job.h"
#include "psnet.pb-c.h"
#include "shardmap.h"

typedef struct Rows Rows;

typedef struct RowsStats {
        uint64_t rows;          /* held, all tables */
        uint64_t bytes;         /* their memory (index and slabs) */
        uint64_t pulled, pushed;/* rows answered and applied */
        uint64_t refused;       /* pushes and pulls refused */
} RowsStats;

int rows_new(Rows **ret);
Rows *rows_free(Rows *r);
/* The job's tables, empty for a new job (the same job keeps its rows). 0,
 * -ENOMEM, or -EINVAL with why (a table the shard cannot build). */
int rows_configure(Rows *r, const Job *job, char *why, size_t n);
/* ROWS_PULL (validated by the wire: a table, ids): the rows into *ret
 * (a frame of n x dim f32): OK, or a status with the reason. */
int rows_pull(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *ids,
              zmq_msg_t *ret, char *reason, size_t n);
/* ROWS_PUSH (validated by the wire: a table, ids, rows) from an admitted
 * member: OK (applied), DUPLICATE (applied before), or a status with the
 * reason and nothing applied. room: bytes the shard may still grow by. */
int rows_push(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
              uint64_t room, char *reason, size_t n);
void rows_stats(const Rows *r, RowsStats *ret);
/* Rows held and their bytes in table i (0 when the job has no table i). */
void rows_table_stats(const Rows *r, size_t i, uint64_t *ret_rows, uint64_t *ret_bytes);
