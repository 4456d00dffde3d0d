/* Chunks that move between shards when the map changes, written and read in
 * this one file: the old owner sends each leaving chunk (values, optimizer
 * state, step count, clock, de-duplication table) as one MSG_CHUNK_STATE to
 * the new owner's data endpoint, zero-copy; the new owner installs it, or
 * keeps it until the map that sends it there arrives. Refusals come back on
 * the sending shard's DEALER and are logged. */
#pragma once
#include <stdint.h>
#include <uv.h>
#include "keys.h"
#include "psd-store.h"
#include "wire.h"

typedef struct Migrate Migrate;

int migrate_new(uv_loop_t *loop, void *zctx, const NetIdentity *id, Store *store, uint32_t shard_id,
                Migrate **ret);
Migrate *migrate_free(Migrate *m);

/* StoreMoveFn (userdata: the Migrate): sends chunk c to dest. */
void migrate_out(void *userdata, Chunk *c, const ShardDesc *dest);
/* A CHUNK_STATE arrived: installed (OK, DUPLICATE), kept for a map that has not
 * arrived yet (OK; m's contents taken), or refused: a status with a reason. */
int migrate_in(Migrate *mg, WireMsg *m, char *reason, size_t n);
/* After a new map: installs the chunk states that were waiting for it. */
void migrate_retry(Migrate *mg);

uint64_t migrate_moved_out(const Migrate *mg);
uint64_t migrate_moved_in(const Migrate *mg);
