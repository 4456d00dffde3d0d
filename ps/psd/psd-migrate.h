/* SPDX-License-Identifier: Apache-2.0 */
/* Everything that travels between shards, written and read in this one file,
 * over one ordered link (a DEALER to the other shard's data endpoint) per
 * peer:
 *
 *   MSG_CHUNK_STATE  a chunk's whole state (values, optimizer state, step
 *                    count, clock, de-duplication table, BSP pushes parked on
 *                    it), zero-copy: to its new primary when it moves, to a
 *                    backup that lacks it (a new backup, or one rebuilt after
 *                    a fail-over);
 *   MSG_REPLICATE    a push the primary admitted, forwarded to every backup of
 *                    its keys before the primary applies or parks it;
 *   MSG_ROWS_COPY    the rows of a table a BSP clock changed on their
 *                    primary, whole, to each other shard that backs some
 *                    of them (psd-rows.h, "copies");
 *   MSG_ROWS_MOVE    rows that have new holders after a map change, whole,
 *                    from the shard that led them (psd-rows.h, "rows
 *                    moved");
 *   MSG_ROWS_WANT    rows a request touches that have not come yet, asked
 *                    for by their new holder.
 *
 * Every message on a link carries the link's next sequence number and is
 * answered (CHUNK_ACK, REPLICATE_ACK) in order, so a push is acknowledged to
 * its worker only once every backup's answer to its forward has come back
 * (psd-gate's PushReq counts them). A backup that leaves the map (dead, or
 * removed) no longer holds anything up: its waiting pushes are released when
 * the map that drops it arrives. A receiver keeps what was sent under a map
 * it has not received yet, in order, until that map arrives. */
#pragma once
#include <stdint.h>
#include <uv.h>
#include "keys.h"
#include "psd-gate.h"
#include "psd-rows.h"
#include "wire.h"

typedef struct Migrate Migrate;

int migrate_new(uv_loop_t *loop, void *zctx, const NetIdentity *id, uint32_t shard_id, Migrate **ret);
/* The shard's gate (and through it the store), once both are made: the
 * store's chunks move over the links, the gate's pushes are forwarded on
 * them. Before anything else is called. */
void migrate_attach(Migrate *mg, Gate *g);
Migrate *migrate_free(Migrate *m);
/* The job's tables: ROWS_COPY goes into them. */
void migrate_attach_rows(Migrate *mg, Rows *rows);
/* After clock of table closed here with ids[0..n) applied (and, of a
 * bounded table, gone[0..ngone) dropped): their rows held here, whole, to
 * every other shard of the map (those of the rows it backs; none: an empty
 * copy, so that each knows the clock came whole), and each of
 * reqs[0..nreqs) waits for every answer. origin >= 0 (ASP, SSP): the
 * worker whose push of clock applied them. OK, or a status where a copy
 * could not be sent (the pushes must not be acknowledged). */
int migrate_rows_copy(Migrate *mg, PushReq *const *reqs, size_t nreqs, uint32_t table, int64_t clock,
                      int64_t origin, const int64_t *ids, size_t n, const int64_t *gone, size_t ngone);
/* Rows of table moved to shard after a map change (psd-rows.h, "rows
 * moved"): one ROWS_MOVE of ids[0..n) and their rows whole (of a bounded
 * table, with their stamps), at clock, the sender's last of the table
 * where last. 0, or a negative errno. */
int migrate_rows_move(Migrate *mg, uint32_t shard, uint32_t table, int64_t clock, const int64_t *ids,
                      const float *rows, const int64_t *stamps, size_t n, bool last);
/* Under ASP/SSP, before a move's first word of a table to shard: what
 * worker's pushes of it left here (RowsMoveHooks.record), as a ROWS_MOVE
 * naming the worker. 0, or a negative errno. */
int migrate_rows_record(Migrate *mg, uint32_t shard, uint32_t table, uint32_t worker, int64_t clock, int64_t done,
                        const int64_t *ids, size_t n);
/* While rows move here: asks sender shard for ids[0..n) of table now
 * (ROWS_WANT; logged where it cannot). */
void migrate_rows_want(Migrate *mg, uint32_t shard, uint32_t table, const int64_t *ids, size_t n);
/* Table rows moved out; answers refusing a ROWS_MOVE (or a message sent
 * among them) since moves began. */
uint64_t migrate_rows_moved(const Migrate *mg);
uint64_t migrate_moves_refused(const Migrate *mg);
/* Answers of a backup refusing a table clock's copy (ROWS_COPY), counted
 * once per push that waited on it. */
uint64_t migrate_copies_refused(const Migrate *mg);
/* The most messages sent on one link and not answered yet. */
uint64_t migrate_unanswered(const Migrate *mg);
/* A move's answers are all in: the next ROWS_MOVE begins another. */
void migrate_moves_end(Migrate *mg);
/* Table rows sent in copies. */
uint64_t migrate_rows_copied(const Migrate *mg);
/* Notes what was sent on each link so far; then whether every link (those
 * to shards still in the map) has answered all of it: a rebuild's copies
 * are held by their backups once that is true. */
void migrate_mark(Migrate *mg);
bool migrate_marked_answered(const Migrate *mg);

/* StoreMoveFn (userdata: the Migrate): sends chunk c's state to dest. */
void migrate_out(void *userdata, Chunk *c, const ShardDesc *dest, bool replica);
/* Forwards an admitted PUSH (header h, its keys all led here; frames f32,
 * or bf16 as the worker sent them) to this shard's backups; req waits for
 * each one's answer. Returns 0, or a status when a backup cannot be reached
 * (the push must not be acknowledged). */
int migrate_forward(Migrate *mg, PushReq *req, const Psnet__Header *h, const zmq_msg_t *frames, bool bf16);
/* After a federated round's close was applied here: every chunk this shard
 * leads goes whole (values and the strategy's state) to each of its
 * backups, and req waits for each one's answer. Returns the states sent. */
size_t migrate_replicate_led(Migrate *mg, PushReq *req);
/* A CHUNK_STATE or REPLICATE from another shard: handled and answered on
 * data (route m->route), or kept for a map that has not arrived yet. */
void migrate_in(Migrate *mg, NetSock *data, WireMsg *m);
/* After a new map: releases the pushes waiting on shards that left it, then
 * handles what was kept for it. */
void migrate_map_changed(Migrate *mg, NetSock *data);

uint64_t migrate_moved_out(const Migrate *mg);
uint64_t migrate_moved_in(const Migrate *mg);
uint64_t migrate_forwarded(const Migrate *mg);
/* Tensor bytes forwarded to backups (as sent: bf16 where the worker sent it). */
uint64_t migrate_forwarded_bytes(const Migrate *mg);
/* Pushes waiting for a backup's answer. */
uint64_t migrate_waiting(const Migrate *mg);
