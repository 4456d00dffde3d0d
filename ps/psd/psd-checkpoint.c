/* SPDX-License-Identifier: Apache-2.0 */
/* A shard's part of checkpoints; see psd-checkpoint.h. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "ckpt-manifest.h"
#include "endpoint.h"
#include "job-init.h"
#include "log.h"
#include "macro.h"
#include "psd-checkpoint.h"
#include "psd-optim.h"

typedef struct Loaded {
        CkptEntry e;
        uint8_t *buf;   /* a restored key's last clocks (copied by the chunk) */
        ValBuf *val;    /* its values and state, taken over by the chunk (no copy) */
        float *state;
} Loaded;

struct Checkpointer {
        Gate *g;
        Store *s;               /* the gate's */
        uv_loop_t *loop;
        uint32_t shard;
        CheckpointDoneFn done;
        void *ud;
        bool busy, freeing;
        uv_work_t work;
        /* the save or load in hand */
        bool save_pending, restore;
        bool seed;              /* a load from the job's seed, not from a checkpoint (checkpoint_seed) */
        Job seed_job;           /* the job, copied for the thread */
        uint64_t seq;
        char name[CKPT_NAME_MAX + 1];
        char dir[PATH_MAX];
        int64_t clock;
        uint32_t per, job;
        uint64_t started;
        int err;
        char reason[2 * PATH_MAX + 512];
        /* save: the snapshot */
        CkptRecord *recs;
        ValBuf **vals;
        size_t n, cap;
        CkptFileInfo info;
        /* restore: the keys wanted (flat index: base[t] + k) and what was read */
        uint64_t *base;
        bool *want;
        uint32_t *lens;         /* per key: its values (the job's, copied for the thread) */
        uint32_t ntensors, *nchunks;
        uint64_t nkeys;
        Loaded *loaded;
        size_t nloaded, restored;
        uint64_t bytes;
        /* the job's tables: saved with the chunks; a restore's built here off the loop */
        Rows *rows;
        size_t nrecs_dense;     /* the snapshot's chunk records; rows records follow */
        Table *frozen[JOB_MAX_TABLES]; /* a save's tables, read by the writer (rows_snapshot) */
        uint32_t saved_chunks;  /* a save's, for its answer */
        uint64_t rows_count;    /* a save's table rows written, or a restore's loaded (its thread counts) */
        Table *tables[JOB_MAX_TABLES];
        Table *backups[JOB_MAX_TABLES]; /* a restore's copies of the rows other shards lead (--replicas >= 2) */
        TableConf tconf[JOB_MAX_TABLES]; /* theirs, copied for the thread */
        size_t ntables;
        ShardMap *map;          /* a restore's: where each row goes */
};

int checkpointer_new(Gate *g, uv_loop_t *loop, uint32_t shard, CheckpointDoneFn done, void *ud,
                     Checkpointer **ret) {
        Checkpointer *k = ps_calloc(1, sizeof *k);
        if (!k)
                return -ENOMEM;
        *k = (Checkpointer) { .g = g, .s = gate_store(g), .loop = loop, .shard = shard, .done = done, .ud = ud };
        k->work.data = k;
        *ret = k;
        return 0;
}

static void save_clear(Checkpointer *k) {
        for (size_t i = 0; i < MIN(k->n, k->nrecs_dense); i++) {
                if (k->vals && k->vals[i])
                        store_value_unref(k->vals[i]);
                if (k->recs) {
                        ps_free((void *) k->recs[i].state);
                        ps_free((void *) k->recs[i].last_clocks);
                }
        }
        ps_free(k->recs);
        ps_free(k->vals);
        k->recs = NULL;
        k->vals = NULL;
        k->n = k->nrecs_dense = 0;
}

static void restore_clear(Checkpointer *k) {
        for (size_t i = 0; i < k->nloaded; i++) {
                ps_free(k->loaded[i].buf);
                store_value_unref(k->loaded[i].val);
                ps_free(k->loaded[i].state);
        }
        ps_free(k->loaded);
        for (size_t i = 0; i < k->ntables; i++) {
                k->tables[i] = table_free(k->tables[i]);
                k->backups[i] = table_free(k->backups[i]);
        }
        k->ntables = 0;
        k->map = shardmap_free(k->map);
        ps_free(k->base);
        ps_free(k->want);
        ps_free(k->lens);
        ps_free(k->nchunks);
        k->lens = k->nchunks = NULL;
        k->loaded = NULL;
        k->base = NULL;
        k->want = NULL;
        k->nloaded = 0;
}

void checkpointer_set_rows(Checkpointer *k, Rows *rows) { k->rows = rows; }

bool checkpoint_loading(const Checkpointer *k) { return k->busy && k->restore; }

void checkpointer_free(Checkpointer *k) {
        if (!k)
                return;
        /* A write or load in flight finishes first (nothing else waits on it now). */
        k->freeing = true;
        while (k->busy)
                (void) uv_run(k->loop, UV_RUN_ONCE);
        save_clear(k);
        restore_clear(k);
        ps_free(k);
}

static void answer(Checkpointer *k, int status, const char *reason) {
        Psnet__CheckpointRep rep = PSNET__CHECKPOINT_REP__INIT;
        char file[64];
        ckpt_shard_file(k->shard, file, sizeof file);
        rep.name = k->name;
        rep.has_clock = rep.has_ms = rep.has_restore = true;
        rep.clock = k->clock;
        rep.ms = now_ms() - k->started;
        rep.restore = k->restore;
        rep.file = file;
        if (status == PSNET__STATUS__STATUS_OK && !k->restore) {
                rep.has_bytes = rep.has_chunks = rep.has_index_crc = true;
                rep.bytes = k->info.bytes;
                rep.chunks = k->saved_chunks;
                rep.index_crc = k->info.index_crc;
        } else if (status == PSNET__STATUS__STATUS_OK) {
                rep.has_bytes = rep.has_chunks = true;
                rep.bytes = k->bytes;
                rep.chunks = (uint32_t) k->restored;
        }
        if (status == PSNET__STATUS__STATUS_OK && k->rows_count) {
                rep.has_rows = true;
                rep.rows = k->rows_count;
        }
        k->done(k->ud, k->seq, &rep, status, reason);
}

/* The answer to building job's chunks from its --init file. */
static void answer_init(Checkpointer *k, const Job *job, int status, const char *reason, size_t keys,
                        uint64_t bytes, uint64_t ms) {
        Psnet__CheckpointRep rep = PSNET__CHECKPOINT_REP__INIT;
        rep.name = (char *) "init";
        rep.has_init = rep.init = rep.has_job = true;
        rep.job = job->id;
        rep.has_chunks = rep.has_bytes = rep.has_ms = true;
        rep.chunks = (uint32_t) keys;
        rep.bytes = bytes;
        rep.ms = ms;
        k->done(k->ud, 0, &rep, status, reason);
}

void checkpoint_init_failed(Checkpointer *k, const Job *job, int err) {
        char reason[sizeof job->init + 96];
        snprintf(reason, sizeof reason, "cannot start reading %s: %s", job->init, strerror(-err));
        log_error("initial values not loaded reason=\"%s\"", reason);
        answer_init(k, job, PSNET__STATUS__STATUS_INTERNAL, reason, 0, 0, 0);
}

/* --- save ------------------------------------------------------------------------------ */

int checkpoint_save(Checkpointer *k, uint64_t seq, const char *name, const char *dir, int64_t clock, char *reason,
                    size_t n) {
        Store *s = k->s;
        if (k->busy || k->save_pending) {
                snprintf(reason, n, "checkpoint %s is still being %s here", k->name, k->restore ? "loaded" : "written");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        if (!s->has_job || !ckpt_name_valid(name) || !dir || dir[0] != '/' || strlen(dir) >= sizeof k->dir || clock < 0) {
                snprintf(reason, n, "no job here, or a bad checkpoint name, directory or clock");
                return PSNET__STATUS__STATUS_INVALID;
        }
        bool fed = s->job.mode == MODE_FED;
        if (!fed && !k->g->fenced) {
                snprintf(reason, n, "not fenced (a new configuration ended the fence): try again");
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        /* Hold everyone at the boundary: no BSP clock past it closes, no pull
         * past the one before it is answered (so nobody pushes it). A
         * federated job needs no fence: pscoord cuts it between two rounds. */
        if (!fed) {
                k->g->fence_limit = clock;
                k->g->fence_pull_limit = clock - 1;
        }
        k->save_pending = true;
        k->restore = false;
        k->seq = seq;
        k->clock = clock;
        k->started = now_ms();
        snprintf(k->name, sizeof k->name, "%s", name);
        snprintf(k->dir, sizeof k->dir, "%s", dir);
        log_info("checkpoint requested name=%s clock=%ld", name, (long) clock);
        checkpoint_poll(k);
        return PSNET__STATUS__STATUS_OK;
}

typedef struct BspCut {
        int64_t clock;
        int ready;              /* 1, 0 (a chunk short of it), -1 (one past it) */
        const Chunk *past;
} BspCut;

static void bsp_cut_chunk(Store *s, Chunk *c, void *ud) {
        BspCut *b = ud;
        (void) s;
        if (c->backup || b->ready < 0)
                return;
        if (c->clock > b->clock) {
                b->ready = -1;
                b->past = c;
        } else if (c->clock < b->clock)
                b->ready = 0;
}

/* Whether the tables stand at the boundary B: 1 yes, 0 not yet, -1 past it
 * (err says). BSP: clock B - 1 closed (and B not). ASP/SSP: every member
 * pushed each table at B - 1 (a worker pushes every table to every shard
 * each clock, empty where it has no row there), or completed B clocks of
 * the chunks here (it pushes its rows before its chunks; a worker that
 * joined at B or later). */
static int rows_at_boundary(Checkpointer *k, const GateCfg *cfg, char *err, size_t n) {
        const Gate *g = k->g;
        int64_t want = k->clock - 1, lo, hi;
        if (!k->rows || rows_ntables(k->rows) == 0)
                return 1;
        if (rows_promoting(k->rows))
                return 0; /* a fail-over's copies join the tables first */
        if (cfg->mode == MODE_BSP) {
                rows_closed(k->rows, &lo, &hi);
                if (hi > want) {
                        snprintf(err, n, "a table's clock %ld closed here, past the boundary %ld", (long) hi,
                                 (long) k->clock);
                        return -1;
                }
                return lo >= want;
        }
        for (size_t i = 0; i < cfg->nmembers; i++) {
                uint32_t w = cfg->members[i];
                rows_worker_clocks(k->rows, w, &lo, &hi);
                if (hi > want) {
                        snprintf(err, n, "worker %u pushed rows of clock %ld, past the boundary %ld", w, (long) hi,
                                 (long) k->clock);
                        return -1;
                }
                int64_t wc = gate_worker_clock(g, w);
                if (lo < want && wc < k->clock)
                        return 0;
        }
        return 1;
}

/* Whether the chunks this shard leads and its tables' rows stand at the
 * boundary: 1 yes, 0 not yet, -1 past it (err says). */
static int at_boundary(Checkpointer *k, char *err, size_t n) {
        Store *s = k->s;
        const Gate *g = k->g;
        const GateCfg *cfg = gate_cfg(g, k->clock);
        if (store_incoming(s) > 0)
                return 0;
        if (s->job.mode == MODE_FED)
                return 1; /* between two rounds, which pscoord holds */
        int rows = rows_at_boundary(k, cfg, err, n);
        if (rows <= 0)
                return rows;
        if (s->stats.nkeys == s->stats.backup_keys)
                return 1; /* no chunk of its own to cut */
        if (cfg->mode == MODE_BSP) {
                BspCut b = { .clock = k->clock, .ready = 1 };
                store_foreach(s, bsp_cut_chunk, &b);
                if (b.ready < 0)
                        snprintf(err, n, "key (%u,%u) is at clock %ld, past the boundary %ld", b.past->tensor,
                                 b.past->chunk, (long) b.past->clock, (long) k->clock);
                return b.ready;
        }
        for (size_t i = 0; i < cfg->nmembers; i++) {
                uint32_t w = cfg->members[i];
                int64_t wc = gate_worker_clock(g, w);
                if (wc > k->clock) {
                        snprintf(err, n, "worker %u pushed clock %ld, past the boundary %ld", w, (long) wc - 1,
                                 (long) k->clock);
                        return -1;
                }
                if (wc < k->clock)
                        return 0;
        }
        return 1;
}

/* CkptFillFn: a block of a table's rows, read from the frozen table as
 * the file is written (no copy of the table is made). */
static int fill_rows(void *ud, const CkptRecord *rec, int64_t *ids, float *rows) {
        Checkpointer *k = ud;
        uint32_t t = rec->tensor & ~CKPT_ROWS;
        if (t >= JOB_MAX_TABLES || !k->frozen[t])
                return -EINVAL;
        size_t from = (size_t) rec->chunk * rows_block_rows(k->frozen[t]);
        return table_dump(k->frozen[t], from, rec->nlast, ids, rows) == rec->nlast ? 0 : -EPROTO;
}

static void save_work(uv_work_t *w) {
        Checkpointer *k = w->data;
        char file[64];
        /* pscoord made the directory; one it removed (a save given up) stays gone. */
        ckpt_shard_file(k->shard, file, sizeof file);
        k->err = ckpt_write_fill(k->dir, file, k->shard, k->job, k->clock, k->per, k->recs, k->n, fill_rows, k,
                                 &k->info, k->reason, sizeof k->reason);
}

/* BSP: the tables' clocks that can close now (not past a fence's). */
static void settle_rows(Checkpointer *k) {
        if (k->rows)
                rows_settle(k->rows, k->g->fenced ? k->g->fence_limit : INT64_MAX);
}

/* A save's tables change again. */
static void thaw(Checkpointer *k) {
        if (k->rows && k->n > k->nrecs_dense) {
                rows_thaw(k->rows);
                settle_rows(k);
        }
        memset(k->frozen, 0, sizeof k->frozen);
}

static void after_work(uv_work_t *w, int status) {
        Checkpointer *k = w->data;
        k->busy = false;
        if (status < 0 && k->err == 0) {
                k->err = status;
                snprintf(k->reason, sizeof k->reason, "canceled");
        }
        if (k->freeing)
                return;
        if (!k->restore) {
                thaw(k);
                save_clear(k);
                if (k->err < 0) {
                        log_error("checkpoint failed name=%s clock=%ld reason=\"%s\"", k->name, (long) k->clock,
                                  k->reason);
                        answer(k, k->err == -ENOSPC ? PSNET__STATUS__STATUS_RESOURCE : PSNET__STATUS__STATUS_INTERNAL,
                               k->reason);
                } else {
                        log_info("checkpoint written name=%s clock=%ld chunks=%u bytes=%lu ms=%lu", k->name,
                                 (long) k->clock, k->info.nrec, (unsigned long) k->info.bytes,
                                 (unsigned long) (now_ms() - k->started));
                        answer(k, PSNET__STATUS__STATUS_OK, NULL);
                }
                return;
        }
        /* restore: install what was read */
        Store *s = k->s;
        int r = k->err;
        size_t installed = 0;
        if (r == 0 && (!s->has_job || s->job.id != k->job || !s->chunks)) {
                r = -ESTALE; /* another job came meanwhile: what was read is not its */
                snprintf(k->reason, sizeof k->reason, "the job changed while its keys were being loaded");
        }
        for (size_t i = 0; r == 0 && i < k->nloaded; i++) {
                Loaded *l = &k->loaded[i];
                size_t per = job_state_per_value(&s->job);
                ChunkImage im = { .tensor = l->e.tensor, .chunk = l->e.chunk, .len = l->e.len,
                                  .nlast = l->e.nlast, .state_floats = per * l->e.len, .steps = l->e.steps,
                                  .clock = l->e.clock, .restored = true };
                /* The chunk takes the buffers built (seed) or read (restore) in the thread. */
                im.adopt_values = l->val;
                im.adopt_state = l->state;
                im.last_clocks = (const int64_t *) l->buf;
                int e = gate_install_image(k->g, &im);
                Chunk *now = s->chunks[l->e.tensor] ? s->chunks[l->e.tensor][l->e.chunk] : NULL;
                if (now && now->val == l->val) {
                        l->val = NULL; /* the chunk's now */
                        l->state = NULL;
                }
                if (e == 0)
                        installed++;
                else if (e != -EEXIST && e != -ENOENT) { /* a copy from the primary came first; or the map moved it */
                        r = e;
                        snprintf(k->reason, sizeof k->reason, "installing key (%u,%u) of checkpoint %s: %s",
                                 l->e.tensor, l->e.chunk, k->name, strerror(-e));
                }
        }
        if (r == 0 && k->ntables) {
                rows_adopt(k->rows, k->tables, k->backups, k->ntables, k->clock);
                for (size_t i = 0; i < k->ntables; i++)
                        k->tables[i] = k->backups[i] = NULL; /* the rows' now */
        }
        s->restoring = false;
        k->restored = k->nloaded; /* for the answer */
        uint64_t rows_loaded = k->rows_count;
        restore_clear(k);
        if (rows_loaded)
                alloc_purge(); /* the blocks read and the tables' index as it grew: a one-off peak */
        if (k->seed) {
                k->seed = false;
                k->restore = false;
                uint64_t ms = now_ms() - k->started;
                if (k->seed_job.init[0]) {
                        /* From the --init file: pscoord hears either way, and fails the job on an error. */
                        if (r < 0)
                                log_error("initial values not loaded file=%s reason=\"%s\"", k->seed_job.init,
                                          k->reason);
                        else
                                log_info("initial values loaded file=%s keys=%zu bytes=%lu ms=%lu", k->seed_job.init,
                                         installed, (unsigned long) k->bytes, (unsigned long) ms);
                        answer_init(k, &k->seed_job, r == -ESTALE || r == -EINVAL ? PSNET__STATUS__STATUS_INVALID
                                                     : r < 0                      ? PSNET__STATUS__STATUS_INTERNAL
                                                                                  : PSNET__STATUS__STATUS_OK,
                                    r < 0 ? k->reason : NULL, installed, k->bytes, ms);
                } else if (r < 0) {
                        /* Built here instead: the loop stalls, but the job goes on. */
                        log_error("initial values not built in the background reason=\"%s\"; building them here",
                                  k->reason);
                        r = store_create_missing(s);
                        if (r < 0)
                                log_error_errno(r, "Failed to build the initial values: %m");
                } else
                        log_info("initial values built keys=%zu bytes=%lu ms=%lu", installed, (unsigned long) k->bytes,
                                 (unsigned long) ms);
                return;
        }
        if (r < 0) {
                log_error("restore failed name=%s reason=\"%s\"", k->name, k->reason);
                answer(k, PSNET__STATUS__STATUS_INTERNAL, k->reason);
        } else {
                log_info("restored name=%s clock=%ld keys=%zu rows=%lu bytes=%lu ms=%lu", k->name, (long) k->clock,
                         installed, (unsigned long) rows_loaded, (unsigned long) k->bytes,
                         (unsigned long) (now_ms() - k->started));
                answer(k, PSNET__STATUS__STATUS_OK, NULL);
        }
}

/* One chunk this shard leads into the snapshot (k->err set on failure). */
static void snapshot_chunk(Store *s, Chunk *ch, void *ud) {
        Checkpointer *k = ud;
        if (ch->backup || k->err < 0)
                return;
        if (k->n == k->cap) { /* the store's count of led keys disagrees with its chunks */
                k->err = -EPROTO;
                return;
        }
        CkptRecord *rec = &k->recs[k->n];
        *rec = (CkptRecord) { .tensor = ch->tensor, .chunk = ch->chunk, .len = ch->len, .nlast = (uint32_t) ch->nlast,
                              .steps = ch->steps, .clock = ch->clock };
        k->vals[k->n++] = store_value_ref(ch);
        rec->values = k->vals[k->n - 1]->data;
        float *st = k->per ? ps_malloc((size_t) ch->len * k->per * sizeof(float)) : NULL;
        int64_t *last = ps_malloc((ch->nlast ? ch->nlast : 1) * sizeof *last);
        rec->state = st;
        rec->last_clocks = last;
        if ((k->per && !st) || !last) {
                k->err = -ENOMEM;
                return;
        }
        (void) s;
        if (k->per)
                memcpy(st, ch->state, (size_t) ch->len * k->per * sizeof(float));
        /* Nothing at or past the boundary is in the cut: a push parked for it
         * (BSP) comes again after a restore, and must not be taken for a
         * duplicate. */
        for (size_t i = 0; i < ch->nlast; i++)
                last[i] = MIN(ch->last_clock[i], k->clock - 1);
}

/* The snapshot, in the loop: values by reference, state and de-dup copied. */
static int snapshot(Checkpointer *k) {
        Store *s = k->s;
        uint64_t n = s->stats.nkeys - s->stats.backup_keys;
        size_t blocks = k->rows ? rows_blocks(k->rows) : 0;
        k->recs = ps_calloc(n + blocks ? n + blocks : 1, sizeof *k->recs);
        k->vals = ps_calloc(n + blocks ? n + blocks : 1, sizeof *k->vals);
        if (!k->recs || !k->vals)
                return -ENOMEM;
        k->cap = (size_t) n;
        k->nrecs_dense = (size_t) n; /* save_clear frees these as chunks' */
        k->rows_count = 0;
        k->per = (uint32_t) job_state_per_value(&s->job);
        k->job = s->job.id;
        k->err = 0;
        store_foreach(s, snapshot_chunk, k);
        k->nrecs_dense = k->n;
        k->saved_chunks = (uint32_t) k->n;
        if (k->err < 0 || !blocks)
                return k->err;
        /* The tables' rows: their records only; the tables freeze until the
         * writer has read them (thaw), so no copy of them is made. */
        k->n += rows_snapshot(k->rows, k->clock, k->recs + k->n, k->frozen);
        for (size_t i = k->nrecs_dense; i < k->n; i++)
                k->rows_count += k->recs[i].nlast;
        return 0;
}

void checkpoint_poll(Checkpointer *k) {
        char err[192];
        if (!k->save_pending)
                return;
        Store *s = k->s;
        bool fed = s->has_job && s->job.mode == MODE_FED;
        if (k->g->fenced && !fed)
                settle_rows(k); /* the boundary may have moved the fence's limit */
        int ready = s->has_job ? at_boundary(k, err, sizeof err) : -1;
        if (ready == 0 && (k->g->fenced || fed))
                return; /* a federated job's keys moving in: pscoord's --checkpoint-timeout bounds it */
        k->save_pending = false;
        if (ready < 0 || ready == 0) {
                if (ready == 0)
                        snprintf(err, sizeof err, "a new configuration ended the fence before this shard reached "
                                 "clock %ld", (long) k->clock);
                else if (!s->has_job)
                        snprintf(err, sizeof err, "the job is gone");
                log_warning("checkpoint given up name=%s reason=\"%s\"", k->name, err);
                answer(k, PSNET__STATUS__STATUS_UNAVAILABLE, err);
                return;
        }
        int r = snapshot(k);
        /* The cut is taken: this shard's fence ends, training goes on. */
        if (!fed) {
                k->g->fenced = false;
                (void) gate_settle(k->g);
                gate_wake(k->g);
                settle_rows(k);
        }
        if (r < 0) {
                thaw(k);
                save_clear(k);
                answer(k, r == -ENOMEM ? PSNET__STATUS__STATUS_RESOURCE : PSNET__STATUS__STATUS_INTERNAL,
                       r == -ENOMEM ? "out of memory taking the snapshot" : "the shard's key count is wrong");
                return;
        }
        log_info("checkpoint snapshot name=%s clock=%ld chunks=%zu row_blocks=%zu wait_ms=%lu", k->name,
                 (long) k->clock, k->nrecs_dense, k->n - k->nrecs_dense, (unsigned long) (now_ms() - k->started));
        k->busy = true;
        r = uv_queue_work(k->loop, &k->work, save_work, after_work);
        if (r < 0) {
                k->busy = false;
                thaw(k);
                save_clear(k);
                snprintf(err, sizeof err, "cannot start the writer: %s", uv_strerror(r));
                answer(k, PSNET__STATUS__STATUS_INTERNAL, err);
        }
}

/* --- restore --------------------------------------------------------------------------- */

/* A record of table rows (entry e of file path, read by rd): the rows the
 * map places on this shard go into their table. 0, or an error with
 * k->reason saying what. */
static int restore_rows(Checkpointer *k, CkptReader *rd, size_t i, const CkptEntry *e, const char *path) {
        uint32_t t = e->tensor & ~CKPT_ROWS;
        size_t per = t < k->ntables ? table_row_floats(k->tables[t]) : 0;
        if (t >= k->ntables || (uint64_t) e->nlast * per != e->len) {
                snprintf(k->reason, sizeof k->reason, "%s: a block of %u rows of %u floats of table %u: not one of "
                         "the job's tables", path, e->nlast, e->nlast ? e->len / e->nlast : 0, t);
                return -EBADMSG;
        }
        if (!e->nlast)
                return 0;
        _cleanup_free_ int64_t *ids = ps_malloc((size_t) e->nlast * sizeof *ids);
        _cleanup_free_ float *rows = ps_malloc((size_t) e->len * sizeof *rows);
        if (!ids || !rows) {
                snprintf(k->reason, sizeof k->reason, "out of memory");
                return -ENOMEM;
        }
        void *parts[2] = { ids, rows };
        uint64_t lens[2] = { (uint64_t) e->nlast * 8, (uint64_t) e->len * 4 };
        int r = ckpt_read_parts(rd, i, parts, lens, 2, k->reason, sizeof k->reason);
        if (r < 0)
                return r;
        /* The rows this shard leads, then (--replicas >= 2) those it backs. */
        int me = shardmap_find(k->map, k->shard);
        _cleanup_free_ int64_t *bids = ps_malloc((size_t) e->nlast * sizeof *bids);
        _cleanup_free_ float *brows = ps_malloc((size_t) e->len * sizeof *brows);
        if (!bids || !brows) {
                snprintf(k->reason, sizeof k->reason, "out of memory");
                return -ENOMEM;
        }
        size_t kept = 0, backed = 0;
        for (size_t j = 0; j < e->nlast; j++) {
                if (shardmap_row_holder(k->map, t, ids[j], 0) != me) {
                        bool backs = false;
                        for (uint32_t c = 1; c < shardmap_replicas(k->map) && !backs; c++)
                                backs = shardmap_row_holder(k->map, t, ids[j], c) == me;
                        if (backs) {
                                bids[backed] = ids[j];
                                memcpy(brows + backed * per, rows + j * per, per * sizeof *rows);
                                backed++;
                        }
                        continue;
                }
                ids[kept] = ids[j];
                if (kept != j)
                        memcpy(rows + kept * per, rows + j * per, per * sizeof *rows);
                kept++;
        }
        char why[160];
        r = table_import(k->tables[t], ids, kept, rows, NULL, why, sizeof why);
        if (r == 0)
                r = table_import(k->backups[t], bids, backed, brows, NULL, why, sizeof why);
        if (r < 0) {
                snprintf(k->reason, sizeof k->reason, "%s: table %s: %s", path, k->tconf[t].name,
                         r == -ENOMEM ? "out of memory" : r == -EINVAL ? "a row twice in the checkpoint" : why);
                return r == -ENOSPC ? -ENOSPC : r == -ENOMEM ? -ENOMEM : -EBADMSG;
        }
        k->rows_count += kept;
        k->bytes += e->bytes;
        return 0;
}

static void restore_work(uv_work_t *w) {
        Checkpointer *k = w->data;
        Psnet__CheckpointManifest *m = NULL;
        char path[PATH_MAX + 80];
        int r = ckpt_manifest_read(k->dir, &m, k->reason, sizeof k->reason);
        if (r == 0 && m->clock != k->clock) {
                snprintf(k->reason, sizeof k->reason, "%s/" CKPT_MANIFEST ": clock %ld, pscoord said %ld", k->dir,
                         (long) m->clock, (long) k->clock);
                r = -EBADMSG;
        }
        uint64_t found = 0, wanted = 0;
        for (uint64_t i = 0; i < k->nkeys; i++)
                wanted += k->want[i];
        size_t cap = (size_t) wanted;
        k->loaded = ps_calloc(cap ? cap : 1, sizeof *k->loaded);
        if (r == 0 && !k->loaded) {
                r = -ENOMEM;
                snprintf(k->reason, sizeof k->reason, "out of memory");
        }
        for (size_t f = 0; r == 0 && f < m->n_files; f++) {
                CkptReader *rd = NULL;
                snprintf(path, sizeof path, "%s/%s", k->dir, m->files[f]->file);
                r = ckpt_open(path, &rd, k->reason, sizeof k->reason);
                if (r < 0)
                        break;
                const CkptHeader *h = ckpt_header(rd);
                if (h->clock != k->clock || h->per != k->per || h->index_crc != m->files[f]->index_crc) {
                        snprintf(k->reason, sizeof k->reason, "%s: clock %ld, %u state floats per value, index "
                                 "checksum %08x; the manifest says clock %ld, %u, %08x", path, (long) h->clock, h->per,
                                 h->index_crc, (long) k->clock, k->per, m->files[f]->index_crc);
                        r = -EBADMSG;
                }
                for (uint32_t i = 0; r == 0 && i < h->nrec; i++) {
                        const CkptEntry *e = ckpt_entry(rd, i);
                        if (e->tensor & CKPT_ROWS) {
                                r = restore_rows(k, rd, i, e, path);
                                continue;
                        }
                        if (e->tensor >= k->ntensors || e->chunk >= k->nchunks[e->tensor] ||
                            e->len != k->lens[k->base[e->tensor] + e->chunk]) {
                                snprintf(k->reason, sizeof k->reason, "%s: key (%u,%u) of %u values is not the "
                                         "job's", path, e->tensor, e->chunk, e->len);
                                r = -EBADMSG;
                                break;
                        }
                        uint64_t idx = k->base[e->tensor] + e->chunk;
                        if (!k->want[idx])
                                continue;
                        if (found >= cap) {
                                snprintf(k->reason, sizeof k->reason, "%s: key (%u,%u) appears twice", path,
                                         e->tensor, e->chunk);
                                r = -EBADMSG;
                                break;
                        }
                        /* Straight into the buffers the chunk takes over: last
                         * clocks, values, optimizer state (no copy in the loop). */
                        Loaded *l = &k->loaded[found];
                        l->e = *e;
                        k->nloaded = (size_t) ++found;
                        uint64_t lens[3] = { (uint64_t) e->nlast * 8, (uint64_t) e->len * 4,
                                             (uint64_t) e->len * 4 * k->per };
                        l->buf = ps_malloc(lens[0] ? lens[0] : 1);
                        l->val = store_value_new(e->len);
                        l->state = k->per ? ps_malloc(lens[2]) : NULL;
                        if (!l->buf || !l->val || (k->per && !l->state)) {
                                r = -ENOMEM;
                                snprintf(k->reason, sizeof k->reason, "out of memory");
                                break;
                        }
                        void *parts[3] = { l->buf, l->val->data, l->state };
                        r = ckpt_read_parts(rd, i, parts, lens, k->per ? 3 : 2, k->reason, sizeof k->reason);
                        if (r == -EINVAL)
                                snprintf(k->reason, sizeof k->reason, "%s: key (%u,%u): a record of %lu bytes, not "
                                         "%lu", path, e->tensor, e->chunk, (unsigned long) e->bytes,
                                         (unsigned long) (lens[0] + lens[1] + lens[2]));
                        k->want[idx] = false;
                        k->bytes += e->bytes;
                }
                ckpt_close(rd);
        }
        for (uint32_t t = 0; r == 0 && t < k->ntensors; t++)
                for (uint32_t c = 0; c < k->nchunks[t]; c++)
                        if (k->want[k->base[t] + c]) {
                                snprintf(k->reason, sizeof k->reason, "checkpoint %s holds no key (%u,%u)", k->name,
                                         t, c);
                                r = -ENOENT;
                                break;
                        }
        if (m)
                psnet__checkpoint_manifest__free_unpacked(m, NULL);
        k->err = r;
}

/* The keys this shard holds and lacks (flat index base[t] + c), for a load. */
static int restore_setup(Checkpointer *k) {
        Store *s = k->s;
        restore_clear(k);
        k->job = s->job.id;
        k->ntensors = s->job.ntensors;
        k->base = ps_calloc(k->ntensors ? k->ntensors : 1, sizeof *k->base);
        k->nchunks = ps_calloc(k->ntensors ? k->ntensors : 1, sizeof *k->nchunks);
        if (!k->base || !k->nchunks)
                return -ENOMEM;
        uint64_t total = 0;
        for (uint32_t t = 0; t < k->ntensors; t++) {
                k->base[t] = total;
                k->nchunks[t] = s->job.tensors[t].nchunks;
                total += k->nchunks[t];
        }
        k->nkeys = total;
        k->want = ps_calloc(total ? total : 1, sizeof *k->want);
        k->lens = ps_calloc(total ? total : 1, sizeof *k->lens);
        if (!k->want || !k->lens)
                return -ENOMEM;
        for (uint32_t t = 0; t < k->ntensors; t++)
                for (uint32_t c = 0; c < k->nchunks[t]; c++) {
                        k->lens[k->base[t] + c] = job_chunk_len(&s->job, t, c);
                        k->want[k->base[t] + c] = !s->chunks[t][c] &&
                                                  shardmap_holder_rank(s->map, t, c, s->shard_id) >= 0;
                }
        k->rows_count = 0;
        return 0;
}

/* A restore's tables, empty, to be filled in the thread pool; and the map
 * that places their rows. */
static int restore_tables_setup(Checkpointer *k) {
        Store *s = k->s;
        size_t n = k->rows ? rows_ntables(k->rows) : 0;
        if (!n)
                return 0;
        k->map = shardmap_dup(s->map);
        if (!k->map)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                char why[160];
                k->tconf[i] = *rows_conf(k->rows, i);
                int r = table_new(&k->tconf[i], &k->tables[i], why, sizeof why);
                if (r == 0 && (r = table_new_copies(&k->tconf[i], &k->backups[i], why, sizeof why)) < 0)
                        k->tables[i] = table_free(k->tables[i]);
                if (r < 0)
                        return r;
                k->ntables = i + 1;
                /* ttl counts from the checkpoint's clock, on the copies as on the rows */
                table_tick(k->tables[i], k->clock);
                table_tick(k->backups[i], k->clock);
        }
        return 0;
}

int checkpoint_restore(Checkpointer *k, const char *name, const char *dir, int64_t clock) {
        Store *s = k->s;
        if (k->busy || k->save_pending || !s->has_job || !s->map || !ckpt_name_valid(name) || !dir || dir[0] != '/' ||
            strlen(dir) >= sizeof k->dir)
                return -EINVAL;
        k->clock = clock;
        int r = restore_setup(k);
        if (r == 0)
                r = restore_tables_setup(k);
        if (r < 0) {
                restore_clear(k);
                return r;
        }
        k->restore = true;
        k->seq = 0;
        k->per = (uint32_t) job_state_per_value(&s->job);
        k->started = now_ms();
        k->err = 0;
        k->bytes = 0;
        snprintf(k->name, sizeof k->name, "%s", name);
        snprintf(k->dir, sizeof k->dir, "%s", dir);
        k->busy = true;
        r = uv_queue_work(k->loop, &k->work, restore_work, after_work);
        if (r < 0) {
                k->busy = false;
                return r;
        }
        log_info("restoring name=%s clock=%ld", name, (long) clock);
        return 0;
}

/* --- the job's initial values, built off the loop ---------------------------------------- */

/* Every key this shard holds under the job's first map, from the job's seed:
 * the same values on every copy, as chunk_new(init) would make them. A model
 * of hundreds of MiB takes seconds to build on few cores: in the loop, it
 * would stall the shard past its lease. */
static void seed_work(uv_work_t *w) {
        Checkpointer *k = w->data;
        StFile init = { 0 };
        uint64_t wanted = 0;
        if (k->seed_job.init[0]) {
                k->err = job_init_open(&k->seed_job, &init, k->reason, sizeof k->reason);
                if (k->err < 0)
                        return;
        }
        for (uint64_t i = 0; i < k->nkeys; i++)
                wanted += k->want[i];
        k->loaded = ps_calloc(wanted ? wanted : 1, sizeof *k->loaded);
        if (!k->loaded) {
                snprintf(k->reason, sizeof k->reason, "out of memory");
                k->err = -ENOMEM;
                st_free(&init);
                return;
        }
        for (uint32_t t = 0; t < k->ntensors; t++)
                for (uint32_t c = 0; c < k->nchunks[t]; c++) {
                        uint64_t idx = k->base[t] + c;
                        if (!k->want[idx])
                                continue;
                        uint32_t len = k->lens[idx];
                        Loaded *l = &k->loaded[k->nloaded];
                        l->e = (CkptEntry) { .tensor = t, .chunk = c, .len = len,
                                             .bytes = (uint64_t) len * sizeof(float) };
                        k->nloaded++;
                        l->val = store_value_new(len);
                        l->state = k->per ? ps_calloc((size_t) len * k->per, sizeof(float)) : NULL;
                        if (!l->val || (k->per && !l->state)) {
                                snprintf(k->reason, sizeof k->reason, "out of memory");
                                k->err = -ENOMEM;
                                st_free(&init);
                                return;
                        }
                        if (init.buf)
                                job_init_chunk_from(&k->seed_job, &init, t, c, l->val->data);
                        else
                                job_init_chunk(&k->seed_job, t, c, l->val->data);
                        k->bytes += l->e.bytes;
                }
        st_free(&init);
        k->err = 0;
}

int checkpoint_seed(Checkpointer *k) {
        Store *s = k->s;
        if (k->busy || k->save_pending || !s->has_job || !s->map)
                return -EBUSY;
        int r = restore_setup(k);
        if (r < 0)
                return r;
        k->restore = k->seed = true;
        k->seed_job = s->job;
        k->seq = 0;
        k->clock = 0;
        k->per = (uint32_t) job_state_per_value(&s->job);
        k->started = now_ms();
        k->err = 0;
        k->bytes = 0;
        snprintf(k->name, sizeof k->name, "seed");
        k->busy = true;
        r = uv_queue_work(k->loop, &k->work, seed_work, after_work);
        if (r < 0) {
                k->busy = false;
                k->restore = k->seed = false;
                restore_clear(k);
                return r;
        }
        return 0;
}
