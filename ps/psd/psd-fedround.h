/* SPDX-License-Identifier: Apache-2.0 */
/* A federated job's rounds on the shard (mode fed; pscoord runs them,
 * ps/pscoord/coord-fed.c). pscoord opens round N with its sampled clients;
 * each of them pushes its update (the delta of its local training, with its
 * example count) for every key, with clock N; the shard keeps a copy of each
 * client's update per chunk it leads and acknowledges it. pscoord then closes
 * the round naming the clients that count (every one of them acknowledged by
 * every shard), and each chunk is aggregated by the job's strategy
 * (common/fed.h) over exactly those, in ascending client order; or it drops
 * them all (a failed round). A pull answers the values as they are: they
 * change only at a close. Refused with a reason: a push for a round that is
 * not open here (STALE, a late update), from a client not sampled, or with
 * another client's key (DENIED), without an example count (MALFORMED), with
 * a NaN or infinity (NOT_FINITE); a second push of the same update is
 * DUPLICATE (acknowledged, not kept twice). The updates a round may hold are
 * bounded when it opens: sampled clients x this shard's values must fit in
 * its memory limit.
 *
 * --strategy custom: the strategy process (ROLE_STRATEGY) reads each
 * client's update of the open round (a PULL with update_of) and pushes the
 * round's delta (a PUSH with strategy_delta, RAW f32, checked as an update
 * is; a chunk's last one stands); the close applies that delta with the server step (w += server-lr x
 * delta) instead of a mean, and is refused while any of it is missing. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>
#include "psd-store.h"
#include "psnet.pb-c.h"

typedef struct FedShard FedShard;

int fedshard_new(FedShard **ret);
FedShard *fedshard_free(FedShard *f);
/* Drops the open round, or a fedasync job's buffered updates (a new job or map). */
void fedshard_reset(FedShard *f);

/* pscoord's MSG_ROUND: opens rd->number for rd->clients (with CURVE,
 * rd->keys), or closes it; in a fedasync job, applies the (client, task)
 * updates it names (rd->tasks, rd->staleness; rd->keys checked against the
 * connections they came over). A status (OK, or why not with reason). */
int fedshard_round(FedShard *f, Store *s, const Psnet__Round *rd, uint64_t memory_limit, char *reason, size_t n);

/* krum, multi-krum: pscoord's MSG_ROUND score for round rd->number's
 * clients rd->clients (each with its whole update here): *ret (freed by the
 * caller) gets the squared distances between their updates over the chunks
 * this shard leads, the upper triangle row by row, *ret_n of them. A status. */
int fedshard_score(FedShard *f, Store *s, const Psnet__Round *rd, double **ret, size_t *ret_n, char *reason,
                   size_t n);

/* A client's PUSH of h->n_keys chunks (looked up: chunks) with frames; key:
 * the sender's CURVE key (NULL without CURVE); memory_limit bounds a
 * fedasync job's buffer (0: none). A status: OK (kept), DUPLICATE, or why it
 * is refused, with reason. */
int fedshard_push(FedShard *f, Store *s, const Psnet__Header *h, Chunk **chunks, const zmq_msg_t *frames,
                  const uint8_t *key, uint64_t memory_limit, char *reason, size_t n);

/* --strategy custom: the strategy's PULL of client h->update_of's update of
 * the open round h->clock: one frame per key (copies, f32) into frames
 * (h->n_keys of them, initialised here on OK). A status, with reason. */
int fedshard_update_frames(FedShard *f, Store *s, const Psnet__Header *h, Chunk **chunks, zmq_msg_t *frames,
                           char *reason, size_t n);

/* The round open (0: none), updates kept, and the bytes they take. */
uint64_t fedshard_number(const FedShard *f);
uint64_t fedshard_bytes(const FedShard *f);
