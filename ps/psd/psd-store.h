/* SPDX-License-Identifier: Apache-2.0 */
/* The shard's store: the chunks this shard owns under the current map, their
 * values and optimizer state, and how an update is applied to them. When
 * pushes are applied and pulls answered is the gate's business (psd-gate.h):
 * the gate holds the store and calls it, never the other way round; where the
 * store drops a chunk that pushes are parked on, it tells its owner through
 * the release hook. How a chunk travels to another shard is psd-migrate.h's.
 *
 * Values live in reference-counted buffers so that pull replies are sent
 * zero-copy: an update on a buffer that a reply still references copies it
 * first (copy-on-write), so a reply is always one consistent snapshot. */
#pragma once
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>
#include "job.h"
#include "pfor.h"
#include "psnet.pb-c.h"
#include "shardmap.h"

typedef struct ValBuf {
        atomic_int refs;
        uint32_t n;
        float *data;     /* 64-byte aligned, n floats */
} ValBuf;

/* A push parked on a chunk: the gate's (psd-gate.h). */
typedef struct Pending Pending;

typedef struct Chunk {
        uint32_t tensor, chunk, len;
        ValBuf *val;
        float *state;           /* optimizer state, optim_state_per_value * len */
        uint64_t steps;         /* updates applied */
        int64_t clock;          /* BSP clocks closed (ASP/SSP updates leave it; steps counts them) */
        bool backup;            /* held as a backup: updated by the primary's forwarded pushes only */
        /* The gate's, per chunk (the store only counts them): */
        Pending *pending;       /* BSP: pushes parked for clock `clock` */
        size_t npending, cpending;
        uint64_t pending_since; /* ms the first of them arrived */
        int64_t *last_clock;    /* per worker id: last clock applied or parked, -1 none */
        size_t nlast;
        uint32_t fed_slot;      /* mode fed: its index in the open round's updates (psd-fedround.c) */
} Chunk;

/* The callback sends c's state to dest. replica false: c moves to dest, its
 * new primary (the gate refused the pushes parked on it, MOVED, before the
 * call, so the workers resend them there). replica true: dest becomes (or is
 * rebuilt as) a backup of c, whose primary this shard is; the state carries
 * the parked pushes. */
typedef void (*StoreMoveFn)(void *userdata, Chunk *c, const ShardDesc *dest, bool replica);

/* A chunk's state as it travels (psd-migrate.c). */
typedef struct ChunkImage {
        uint32_t tensor, chunk, len;
        const void *values, *state;       /* state NULL: zeros */
        /* Instead of values and state: buffers the chunk takes over (no copy;
         * no parked pushes then). Once the chunk holds them (0, or a later
         * error of gate_settle) the store owns them; before, the caller does. */
        ValBuf *adopt_values;
        float *adopt_state;
        size_t state_floats;
        uint64_t steps;
        int64_t clock;
        const int64_t *last_clocks;
        size_t nlast;
        const uint32_t *pending_workers;  /* BSP pushes parked for clock */
        const float *pending_progress;    /* the progress each carried (NULL: none) */
        const zmq_msg_t *pending;         /* their gradient frames */
        size_t npending;
        bool replica;   /* a backup's copy from its primary: replaces an older copy */
        bool restored;  /* read from a checkpoint by this shard: not sent on to the backups, which read theirs */
} ChunkImage;

/* Why the store lets a chunk go that pushes may be parked on (the release
 * hook): it leaves this shard, it is demoted to a backup (its parked pushes
 * become copies), or it is dropped (another job, a newer copy, the end). */
typedef enum { STORE_LEAVING, STORE_DEMOTED, STORE_DROPPED } StoreRelease;
/* Empties c's parked pushes (DEMOTED: answers them and keeps the copies)
 * before the store moves or frees c. */
typedef void (*StoreReleaseFn)(void *ud, Chunk *c, StoreRelease why);

/* What a store is built from. */
typedef struct StoreConf {
        uint32_t shard_id;
        Pfor *pool;             /* psd --threads: runs the loops over a chunk's values (NULL: the caller's
                                 * thread alone); the owner's */
        StoreMoveFn move;       /* where chunks go (psd-migrate.c; NULL: nowhere) */
        void *move_userdata;
} StoreConf;

/* What the store has done, for status and metrics (store_stats). */
typedef struct StoreStats {
        uint64_t nkeys, bytes;
        uint64_t backup_keys;   /* of nkeys, those held as a backup */
        uint64_t pushes, pulls, applied;
        float last_lr;          /* the lr of the last update applied (with its factors; 0: none yet) */
        uint64_t copies;        /* values copied before an update because a pull reply still read them */
} StoreStats;

/* The fields, as libuv's handles say theirs: public ones are read by the
 * shard's other files (psd-gate.c, psd-migrate.c, psd-checkpoint.c,
 * psd-fedround.c), never written; psd-server.c goes through the accessors
 * below; private ones are psd-store.c's alone. */
typedef struct Store {
        /* public, read-only */
        Job job;
        bool has_job;
        uint32_t shard_id;
        ShardMap *map;
        Chunk ***chunks;        /* [tensor][chunk]: NULL when not owned */
        Pfor *pool;
        StoreStats stats;       /* pushes counts the gate's (gate_push) */
        bool restoring;         /* the job's first map creates no chunk from the seed in the loop: they
                                 * come from the Checkpointer (a checkpoint, or the seed built in the
                                 * thread pool) or from their primaries (store_set_restoring) */
        float *sum;             /* scratch for aggregation (chunk_floats), the gate's */
        /* private */
        StoreMoveFn move;
        void *move_userdata;
        StoreReleaseFn release;
        void *release_ud;
} Store;

int store_new(const StoreConf *conf, Store **ret);
/* Frees the chunks (the release hook empties their parked pushes first). */
Store *store_free(Store *s);
/* The hook that empties a chunk's parked pushes before the store lets it go (the gate's). */
void store_set_release(Store *s, StoreReleaseFn fn, void *ud);

/* The job (NULL before the first), the map it routes by (NULL before the
 * first), its figures. */
const Job *store_job(const Store *s);
const ShardMap *store_map(const Store *s);
const StoreStats *store_stats(const Store *s);
/* A fresh job's chunks come from the Checkpointer, not from the seed in the loop. */
void store_set_restoring(Store *s, bool restoring);
/* Keys answered in shared memory (a pull written where the worker said). */
void store_pulled(Store *s, size_t keys);

/* Installs a job and the map. The first map of a job initialises every chunk
 * this shard owns (deterministically). A later map moves chunks: those it no
 * longer owns go to the move callback; those it newly owns are awaited
 * (store_install) and answered MIGRATING until they arrive. A different job
 * drops everything. 1 for a fresh job, 0, or a negative errno. */
int store_configure(Store *s, const Job *job, const ShardMap *map);

/* Installs the state of a chunk that came here (psd-migrate.c), without its
 * parked pushes (gate_install_image parks those): the chunk in *ret. -EEXIST
 * when it is already here, -ENOENT when the map does not give it to this
 * shard, -EINVAL when the sizes do not match the job. A replica image (a
 * backup being built) replaces the copy held unless that one is as new or
 * newer (steps, then parked pushes): -EEXIST then. A moved chunk this shard
 * now leads goes to its backups (the move callback, replica true). */
int store_install_image(Store *s, const ChunkImage *im, Chunk **ret);
/* Creates, from the job's seed, every chunk this shard holds under its map
 * and lacks (in the loop: the fallback when the thread pool cannot). */
int store_create_missing(Store *s);

/* Keys the map gives this shard that have not arrived yet. */
uint64_t store_incoming(const Store *s);

/* The chunk for a key this shard is the primary of, or NULL. *ret_status says
 * why not: NO_JOB, UNKNOWN_KEY, SIZE, MOVED (another shard leads it),
 * MIGRATING (on its way here). */
Chunk *store_lookup(Store *s, uint32_t tensor, uint32_t chunk, uint32_t len, int *ret_status);
/* The chunk for a key this shard is a backup of, forwarded by primary (a
 * shard id): NULL with MOVED when the map says otherwise, MIGRATING when the
 * copy has not arrived. */
Chunk *store_lookup_backup(Store *s, uint32_t tensor, uint32_t chunk, uint32_t len, uint32_t primary,
                           int *ret_status);
/* The shards after this one that hold copies of its keys (its backups under
 * the map), at most max, as indices into the map: the count. */
size_t store_backups(const Store *s, uint32_t *idx, size_t max);

/* Looks every key of a PULL or PUSH up (and its job id): OK with chunks
 * filled, or the status of the first key that is not here, with a reason. */
int store_lookup_keys(Store *s, const Psnet__Header *h, Chunk **chunks, char *reason, size_t n);

/* Applies one update gscale * g (len floats: the mean over nworkers members'
 * gradients with gscale 1, or one push with gscale 1/W) of clock under mode,
 * at the job's progress the pushes carried (negative: none): the job's
 * optimizer with lr times job_lr_factor. A buffer tensor's chunk (running
 * statistics, not trained) moves gscale of the way to g instead: BSP gives
 * the workers' mean with gscale 1, ASP and SSP each push with 1/W. Copies the
 * values first if a reply reads them. */
int store_apply(Store *s, Chunk *c, const float *g, float gscale, ConsistencyMode mode, size_t nworkers, int64_t clock,
                float progress);
/* One federated round on c (mode fed): the job's strategy over the n client
 * updates (fed_aggregate, noise and scratch as it asks); the chunk's clock counts
 * rounds. -EINVAL (nothing changed) for updates it refuses. */
int store_fed_apply(Store *s, Chunk *c, const float *const *updates, const uint64_t *examples, size_t n,
                    const float *noise, float *scratch);
/* A securely aggregated round on c: the strategy's server step with the
 * round's mean delta d (len floats), as store_fed_apply after its mean. */
int store_fed_step(Store *s, Chunk *c, const float *d);

/* A reference to c's values as they are now (a later update copies them
 * first); drop it with store_value_unref, from any thread. */
ValBuf *store_value_ref(Chunk *c);
void store_value_unref(ValBuf *v);
/* A new value buffer of n floats (uninitialised), one reference; callable
 * from any thread (the thread pool builds a job's initial values in them). */
ValBuf *store_value_new(uint32_t n);

/* A zero-copy message over the chunk's current values (takes a reference). */
int store_value_msg(Store *s, Chunk *c, zmq_msg_t *ret);
/* A message of the chunk's current values as bf16 (a --wire bf16 pull). */
int store_value_bf16(Store *s, Chunk *c, zmq_msg_t *ret);

/* Smallest clock over owned chunks (0 when none). */
int64_t store_min_clock(const Store *s);
/* Highest chunk clock over owned chunks (0 when none). */
int64_t store_max_clock(const Store *s);

/* The fewest and the most updates applied to a chunk this shard leads (0, 0
 * when none). */
void store_steps(const Store *s, uint64_t *ret_min, uint64_t *ret_max);
/* Calls fn on every chunk this shard owns. */
void store_foreach(Store *s, void (*fn)(Store *s, Chunk *c, void *ud), void *ud);

/* Bytes per thread below which a copy by s->pool (pfor_copy: pushes and
 * pulls through shared memory) stays on one thread. */
#define STORE_MIN_COPY (256u << 10)
/* bf16_encode (encode: f32 src to bf16 dst) or bf16_decode of n values, in
 * parts run by s->pool. */
void store_bf16(Store *s, void *dst, const void *src, size_t n, bool encode);
/* A bf16 message's frames (sizes checked by wire_validate) become f32 frames
 * in place, exactly widened: what follows sees f32 values. -ENOMEM: some
 * frames may be converted, none lost. */
int store_frames_to_f32(Store *s, zmq_msg_t *frames, const Psnet__Header *h);
