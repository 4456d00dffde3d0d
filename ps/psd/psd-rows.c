/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-rows.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "endpoint.h"
#include "hash.h"
#include "log.h"
#include "macro.h"
#include "psd-rows.h"
#include "psd-table.h"
#include "wire.h"

/* A BSP push waiting for its clock's other members: its rows, copied out of
 * the frames, and where its acknowledgement goes. */
typedef struct Parked {
        uint32_t worker;
        int64_t clock;
        uint32_t part, parts;   /* of the worker's push of the clock (1 part: 0 of 1) */
        uint64_t epoch;         /* the shard-map epoch it was cut for (0: none said) */
        bool acked;             /* a part that did not complete the push: acknowledged when it came */
        uint64_t seq;
        int64_t *ids;
        float *g;
        size_t n;
        zmq_msg_t route;
} Parked;


/* Copies from one primary (ROWS_COPY): per table, the last BSP clock whose
 * copy came whole (-1: none). */
typedef struct Copied {
        uint32_t shard;
        int64_t clock[JOB_MAX_TABLES];
} Copied;

/* A copy in parts: kept until its last part, then installed at once, so
 * that a backup holds a clock's copy whole or not at all. */
typedef struct CopyIn {
        uint32_t shard, table, parts, got;
        int64_t clock;
        int64_t *ids;
        float *rows;
        int64_t *stamps;        /* a bounded table's: each row's (ids' n) */
        size_t n;
        int64_t *gone;          /* a bounded table's rows its primary dropped */
        size_t ngone;
} CopyIn;

/* Ids a sender was asked for (ROWS_WANT) and does not hold: they start as
 * new rows here. Open addressing over (table, id); tab[i] = table + 1, 0
 * where empty. */
typedef struct IdSet {
        int64_t *ids;
        uint8_t *tab;
        size_t cap, n;
} IdSet;

static size_t idset_slot(const IdSet *s, uint32_t t, int64_t id) {
        size_t mask = s->cap - 1, i = (size_t) mix64((uint64_t) id ^ ((uint64_t) t << 56)) & mask;
        while (s->tab[i] && (s->tab[i] != t + 1 || s->ids[i] != id))
                i = (i + 1) & mask;
        return i;
}

static bool idset_has(const IdSet *s, uint32_t t, int64_t id) {
        return s->cap && s->tab[idset_slot(s, t, id)];
}

static int idset_add(IdSet *s, uint32_t t, int64_t id) {
        if (2 * (s->n + 1) > s->cap) {
                IdSet g = { .cap = s->cap ? 2 * s->cap : 64 };
                g.ids = ps_malloc(g.cap * sizeof *g.ids);
                g.tab = ps_calloc(g.cap, sizeof *g.tab);
                if (!g.ids || !g.tab) {
                        ps_free(g.ids);
                        ps_free(g.tab);
                        return -ENOMEM;
                }
                for (size_t i = 0; i < s->cap; i++)
                        if (s->tab[i]) {
                                size_t j = idset_slot(&g, s->tab[i] - 1u, s->ids[i]);
                                g.tab[j] = s->tab[i];
                                g.ids[j] = s->ids[i];
                                g.n++;
                        }
                ps_free(s->ids);
                ps_free(s->tab);
                *s = g;
        }
        size_t i = idset_slot(s, t, id);
        if (!s->tab[i]) {
                s->tab[i] = (uint8_t) (t + 1);
                s->ids[i] = id;
                s->n++;
        }
        return 0;
}

/* The last clock each worker pushed a table at (ids grow as workers come). */
typedef struct LastPush {
        uint32_t worker;
        int64_t clock;          /* the last clock it pushed (a part of) */
        uint32_t parts;         /* that push's parts */
        uint64_t in;            /* the parts of it in (bit per part) */
        int64_t done;           /* the last clock whose every part is in */
        uint64_t epoch;         /* the shard-map epoch that push was cut for */
        /* ASP/SSP: the ids of the worker's push of rec_clock whose update
         * this shard holds, applied here, copied from their primary
         * (ROWS_COPY naming the worker) or noted by the shard they moved
         * from (ROWS_MOVE naming it): a push of that clock sent again after
         * a map change is cut to the others. */
        int64_t rec_clock;
        IdSet rec;
} LastPush;

/* A shard whose rows come here after a map change that moves rows
 * (ROWS_MOVE): per table, the last clock it closed before the change, and
 * whether its first and its last rows came (bits by table); the ids it was
 * asked for and does not hold. */
typedef struct Source {
        uint32_t shard;
        int64_t clock[JOB_MAX_TABLES];
        uint64_t got, done;
        IdSet absent;
} Source;

/* Empties s, keeping its memory for the next ids. */
static void idset_clear(IdSet *s) {
        if (s->cap)
                memset(s->tab, 0, s->cap * sizeof *s->tab);
        s->n = 0;
}

static void idset_free(IdSet *s) {
        ps_free(s->ids);
        ps_free(s->tab);
        *s = (IdSet) { 0 };
}

static void sources_free(Source *src, size_t n) {
        for (size_t i = 0; i < n; i++)
                idset_free(&src[i].absent);
        ps_free(src);
}

/* The parts' bits of a push in parts parts. */
static uint64_t all_parts(uint32_t parts) {
        return parts >= 64 ? UINT64_MAX : ((uint64_t) 1 << parts) - 1;
}

struct Rows {
        uint32_t job_id;
        bool has_job;
        Table *tables[JOB_MAX_TABLES];
        TableConf conf[JOB_MAX_TABLES];
        size_t ntables;
        bool allow_nonfinite;
        float max_grad_norm;
        LastPush *last[JOB_MAX_TABLES];
        size_t nlast[JOB_MAX_TABLES];
        ConsistencyMode mode;
        Parked *parked[JOB_MAX_TABLES];
        size_t nparked[JOB_MAX_TABLES];
        int64_t closed[JOB_MAX_TABLES]; /* BSP: the last clock closed (-1: none) */
        /* A checkpoint's writer reads the tables: nothing changes them, and
         * tables a new job drops wait here until it is done. */
        bool frozen;
        Table **retired;
        size_t nretired;
        RowsHooks hooks;
        RowsStats stats;
        /* --replicas >= 2 (BSP): the copies this shard holds of rows other
         * shards lead, what came from each primary, and the map before the
         * last fail-over with the shards it lost. */
        Table *backup[JOB_MAX_TABLES];
        Copied *copied;
        size_t ncopied;
        CopyIn *incoming;
        size_t nincoming;
        ShardMap *prev;
        uint32_t *lost;
        size_t nlost;
        /* After a fail-over: the rows this shard leads, sent again to their
         * backups from row number rebuild_at[t] on (rows_rebuild_step). */
        size_t rebuild_at[JOB_MAX_TABLES];
        bool rebuilding;
        uint64_t rebuilt, rebuild_ms;
        /* After a fail-over, until every copy of a row this shard now leads
         * has joined its table (a step at a time, and a row as soon as a
         * pull or a clock touches it): the map, the backup rows looked at. */
        ShardMap *promote;
        uint32_t promote_self;
        size_t promote_at[JOB_MAX_TABLES];
        uint64_t promoted, promote_ms;
        uint64_t whole_epoch;   /* the map epoch before a promotion and rebuild under way */
        uint64_t rebuilds;      /* rebuilds finished (their copies sent) */
        /* BSP: the last clock closed here a second time after it opened
         * again (reopened): sent again after that, it is a duplicate. */
        int64_t reclosed[JOB_MAX_TABLES];
        /* A map change that moves rows between live shards (a shard added,
         * or one removed where rows have one copy): the new map, and this
         * shard's part as a sender (rows_move_step): per table, the clock
         * closed at the change and the sweep of its rows; the shards whose
         * rows come here, while some have not said their last. */
        ShardMap *move_map;
        uint32_t move_self;
        int move_stage;         /* MOVE_* */
        uint32_t move_table;
        size_t move_at;
        int64_t move_clock[JOB_MAX_TABLES];
        uint64_t move_sent, move_kept, move_ms, moves, move_wanted;
        Source *src;
        size_t nsrc;
        bool receiving;
        bool move_failed;       /* a receiver refused rows: not whole until the next change */
        bool rebuild_after_move; /* a copy was lost while rows moved (rows_copies_lost) */
        /* The last push's ids to copy to their backups (rows_last_applied):
         * applied under ASP/SSP, or all of one sent again under a newer
         * map; and the ids its table's bounds dropped. */
        int64_t *copy_ids, *copy_gone;
        size_t copy_n, copy_ngone;
        /* A sender's rows it no longer leads, which their new primary
         * dropped (its bounds; ROWS_COPY's ids dropped) before they were
         * made copies here: dropped then, not made copies. */
        IdSet demote_gone;
};

/* A sender's stages: its rows to their new holders, then its copies no
 * longer held here dropped, its last word to every receiver; once all of
 * that was answered, its rows it no longer leads made copies or dropped. */
enum { MOVE_NONE, MOVE_FIRST, MOVE_SEND, MOVE_COPIES, MOVE_LAST, MOVE_ANSWERS, MOVE_DEMOTE };

static Source *source_of(const Rows *r, uint32_t shard) {
        for (size_t i = 0; i < r->nsrc; i++)
                if (r->src[i].shard == shard)
                        return &r->src[i];
        return NULL;
}

void rows_set_hooks(Rows *r, const RowsHooks *hooks) { r->hooks = *hooks; }

static void parked_free(Parked *p) {
        ps_free(p->ids);
        ps_free(p->g);
        zmq_msg_close(&p->route);
}

size_t rows_parked(const Rows *r) {
        size_t n = 0;
        for (size_t i = 0; i < r->ntables; i++)
                n += r->nparked[i];
        return n;
}

int rows_new(Rows **ret) {
        Rows *r = ps_calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        *ret = r;
        return 0;
}

/* Frees t, or keeps it for the writer that reads it. */
static void retire(Rows *r, Table *t) {
        Table **a = r->frozen && t ? ps_realloc(r->retired, (r->nretired + 1) * sizeof *a) : NULL;
        if (a) {
                r->retired = a;
                a[r->nretired++] = t;
        } else if (!r->frozen)
                table_free(t);
        /* else out of memory: left allocated rather than freed under the writer */
}

static void copyin_free(CopyIn *c) {
        ps_free(c->ids);
        ps_free(c->rows);
        ps_free(c->stamps);
        ps_free(c->gone);
}

static void drop_copies(Rows *r) {
        for (size_t i = 0; i < r->nincoming; i++)
                copyin_free(&r->incoming[i]);
        ps_free(r->incoming);
        r->incoming = NULL;
        r->nincoming = 0;
        ps_free(r->copied);
        r->copied = NULL;
        r->ncopied = 0;
        r->prev = shardmap_free(r->prev);
        r->promote = shardmap_free(r->promote);
        ps_free(r->lost);
        r->lost = NULL;
        r->nlost = 0;
        r->move_map = shardmap_free(r->move_map);
        r->move_stage = MOVE_NONE;
        sources_free(r->src, r->nsrc);
        r->src = NULL;
        r->nsrc = 0;
        r->receiving = r->move_failed = false;
        idset_free(&r->demote_gone);
}

static void drop_tables(Rows *r) {
        drop_copies(r);
        for (size_t i = 0; i < r->ntables; i++) {
                table_free(r->backup[i]); /* never read by a checkpoint's writer */
                r->backup[i] = NULL;
                for (size_t k = 0; k < r->nparked[i]; k++)
                        parked_free(&r->parked[i][k]); /* their workers ask again, or time out */
                ps_free(r->parked[i]);
                r->parked[i] = NULL;
                r->nparked[i] = 0;
                retire(r, r->tables[i]);
                r->tables[i] = NULL;
                for (size_t k = 0; k < r->nlast[i]; k++)
                        idset_free(&r->last[i][k].rec);
                ps_free(r->last[i]);
                r->last[i] = NULL;
                r->nlast[i] = 0;
        }
        r->ntables = 0;
}

Rows *rows_free(Rows *r) {
        if (r) {
                r->frozen = false; /* the writer is done: the checkpointer goes first */
                drop_tables(r);
                ps_free(r->copy_ids);
                ps_free(r->copy_gone);
                rows_thaw(r);
                ps_free(r);
        }
        return NULL;
}

int rows_configure(Rows *r, const Job *job, char *why, size_t n) {
        r->allow_nonfinite = job->allow_nonfinite;
        r->max_grad_norm = job->max_grad_norm;
        r->mode = job->mode;
        if (r->has_job && r->job_id == job->id)
                return 0;
        drop_tables(r);
        r->has_job = true;
        r->job_id = job->id;
        for (size_t i = 0; i < job->ntables; i++) {
                job_table_conf(job, i, &r->conf[i]);
                char w[160];
                int e = table_new(&r->conf[i], &r->tables[i], w, sizeof w);
                if (e == 0 && (e = table_new_copies(&r->conf[i], &r->backup[i], w, sizeof w)) < 0)
                        r->tables[i] = table_free(r->tables[i]);
                if (e == 0) /* the rows its bounds drop go with its copies */
                        table_log_gone(r->tables[i], table_stamped(r->tables[i]));
                if (e < 0) {
                        drop_tables(r);
                        if (why && n)
                                snprintf(why, n, "table %s: %s", job->tables[i].name,
                                         e == -ENOMEM ? "out of memory" : w);
                        return e;
                }
                r->closed[i] = r->reclosed[i] = -1;
                r->ntables = i + 1;
        }
        return 0;
}

/* While rows move (this shard sends or receives), its bounded tables
 * drop no row: one dropped before it has arrived, or by a sender that no
 * longer sees its pushes, would be wrong (psd-table.h: table_hold_bounds). */
static void hold_bounds(Rows *r);

/* OK where the message names one of the job's tables, else UNKNOWN_KEY with the reason. */
static int known_table(const Rows *r, const Psnet__Header *h, char *reason, size_t n) {
        if (h->table < r->ntables)
                return PSNET__STATUS__STATUS_OK;
        snprintf(reason, n, "table %u is not one of the job's %zu tables", h->table, r->ntables);
        return PSNET__STATUS__STATUS_UNKNOWN_KEY;
}

/* The table a message names, and its ids copied out of the frame (any
 * alignment, as ZeroMQ hands frames): OK, or a status with the reason. */
static int request_table(Rows *r, const Psnet__Header *h, const zmq_msg_t *ids, Table **ret_t, int64_t **ret_ids,
                         size_t *ret_n, char *reason, size_t n) {
        int st = known_table(r, h, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
        size_t count = zmq_msg_size((zmq_msg_t *) ids) / sizeof(int64_t);
        int64_t *v = ps_malloc(MAX(count, (size_t) 1) * sizeof *v);
        if (!v) {
                snprintf(reason, n, "out of memory for %zu ids", count);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        memcpy(v, zmq_msg_data((zmq_msg_t *) ids), count * sizeof *v);
        *ret_t = r->tables[h->table];
        *ret_ids = v;
        *ret_n = count;
        return PSNET__STATUS__STATUS_OK;
}

/* Every id is this shard's (its first copy under the map): OK, or MOVED. */
static int check_holder(const ShardMap *map, uint32_t self, uint32_t table, const int64_t *ids, size_t count,
                        char *reason, size_t n) {
        int me = shardmap_find(map, self);
        for (size_t i = 0; i < count; i++) {
                int at = shardmap_row_holder(map, table, ids[i], 0);
                if (me < 0 || at != me) {
                        snprintf(reason, n, "row %lld of table %u is shard %u's under map epoch %lu, not this one's",
                                 (long long) ids[i], table, at >= 0 ? shardmap_shard(map, (size_t) at)->id : 0,
                                 (unsigned long) shardmap_epoch(map));
                        return PSNET__STATUS__STATUS_MOVED;
                }
        }
        return PSNET__STATUS__STATUS_OK;
}

/* After a fail-over: the copies among ids[0..n) of rows this shard now
 * leads join table t now, before they are read or changed. 0, or -EBUSY
 * (a checkpoint's writer reads the tables), -ENOMEM. */
static int promote_ids(Rows *r, uint32_t t, const int64_t *ids, size_t n) {
        if (!r->promote || table_size(r->backup[t]) == 0)
                return 0;
        int me = shardmap_find(r->promote, r->promote_self);
        for (size_t k = 0; k < n && me >= 0; k++) {
                if (!table_row(r->backup[t], ids[k], NULL) || shardmap_row_holder(r->promote, t, ids[k], 0) != me)
                        continue;
                if (r->frozen)
                        return -EBUSY;
                int e = table_move_one(r->backup[t], r->tables[t], ids[k]);
                if (e < 0)
                        return e;
                r->promoted++;
        }
        return 0;
}

bool rows_promoting(const Rows *r) { return r->promote || r->move_stage != MOVE_NONE || r->receiving; }

static void hold_bounds(Rows *r) {
        bool hold = r->move_stage != MOVE_NONE || r->receiving;
        for (size_t t = 0; t < r->ntables; t++)
                table_hold_bounds(r->tables[t], hold);
}

/* After a map change that moves rows here: UNAVAILABLE (the reason said)
 * where a row of ids[0..n) of table t comes from a shard that has not
 * sent it yet (it is asked for it now: RowsHooks.want), or, for a push,
 * while a sender has not said the clock its rows stand at (what is applied
 * is cut by it); else OK. */
static int move_wait(const Rows *r, uint32_t t, const int64_t *ids, size_t n, bool push, char *reason,
                     size_t len) {
        if (!r->receiving)
                return PSNET__STATUS__STATUS_OK;
        uint64_t bit = (uint64_t) 1 << t;
        const Source *late = NULL;
        for (size_t i = 0; push && !late && i < r->nsrc; i++)
                if (!(r->src[i].got & bit))
                        late = &r->src[i];
        if (late) {
                snprintf(reason, len, "table %s's rows move here from shard %u after a map change, which has not "
                         "said their clock yet: ask again", r->conf[t].name, late->shard);
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        /* The rows not here yet, by sender: each asked for its own. */
        int64_t *want = ps_malloc(MAX(n, (size_t) 1) * sizeof *want);
        uint32_t *from = ps_malloc(MAX(n, (size_t) 1) * sizeof *from);
        size_t m = 0;
        for (size_t k = 0; k < n; k++) {
                int at = shardmap_row_holder(r->prev, t, ids[k], 0);
                const Source *src = at >= 0 ? source_of(r, shardmap_shard(r->prev, (size_t) at)->id) : NULL;
                if (!src || (src->done & bit) || table_row(r->tables[t], ids[k], NULL) ||
                    idset_has(&src->absent, t, ids[k]))
                        continue;
                if (!late)
                        late = src;
                if (want && from) {
                        want[m] = ids[k];
                        from[m++] = src->shard;
                }
        }
        int64_t *sel = m ? ps_malloc(m * sizeof *sel) : NULL;
        for (size_t i = 0; sel && r->hooks.want && i < r->nsrc; i++) {
                size_t c = 0;
                for (size_t k = 0; k < m; k++)
                        if (from[k] == r->src[i].shard)
                                sel[c++] = want[k];
                if (c)
                        r->hooks.want(r->hooks.ud, r->src[i].shard, t, sel, c);
        }
        ps_free(sel);
        ps_free(want);
        ps_free(from);
        if (!late)
                return PSNET__STATUS__STATUS_OK;
        snprintf(reason, len, "rows of table %s move here from shard %u after a map change: asked for, ask again",
                 r->conf[t].name, late->shard);
        return PSNET__STATUS__STATUS_UNAVAILABLE;
}

uint64_t rows_rebuilds(const Rows *r, uint64_t *ret_from) {
        *ret_from = r->whole_epoch;
        return r->rebuilds;
}

uint64_t rows_whole_epoch(const Rows *r, uint64_t epoch) {
        return rows_promoting(r) || r->rebuilding || r->move_failed ? r->whole_epoch : epoch;
}

int rows_pull(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *ids,
              zmq_msg_t *ret, char *reason, size_t n) {
        Table *t;
        _cleanup_free_ int64_t *v = NULL;
        size_t count;
        int st = request_table(r, h, ids, &t, &v, &count, reason, n);
        if (st == PSNET__STATUS__STATUS_OK)
                st = check_holder(map, self, h->table, v, count, reason, n);
        if (st != PSNET__STATUS__STATUS_OK) {
                r->stats.refused++;
                return st;
        }
        if ((st = move_wait(r, h->table, v, count, false, reason, n)) != PSNET__STATUS__STATUS_OK)
                return st;
        if (promote_ids(r, h->table, v, count) < 0) {
                snprintf(reason, n, "the shard takes over rows of table %s after a fail-over%s: ask again",
                         r->conf[h->table].name, r->frozen ? " once its checkpoint is written" : "");
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        for (size_t k = 0; r->mode == MODE_BSP && k < r->nparked[h->table]; k++)
                if (r->parked[h->table][k].clock < h->clock) {
                        snprintf(reason, n, "table %s's clock %ld waits for other workers' pushes: ask again",
                                 r->conf[h->table].name, (long) r->parked[h->table][k].clock);
                        log_debug("%s", reason);
                        return PSNET__STATUS__STATUS_UNAVAILABLE;
                }
        size_t dim = r->conf[h->table].dim, bytes = count * dim * sizeof(float);
        if (zmq_msg_init_size(ret, bytes) < 0) {
                snprintf(reason, n, "out of memory for %zu rows", count);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        /* Into the answer's frame where it is aligned for floats, as
         * wire_frame_f32 reads frames; else through a copy. */
        float *in_place = (float *) wire_frame_f32(ret);
        _cleanup_free_ float *staged = in_place ? NULL : ps_malloc(MAX(bytes, sizeof(float)));
        if (!in_place && !staged) {
                zmq_msg_close(ret);
                snprintf(reason, n, "out of memory for %zu rows", count);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        int e = table_pull(t, v, count, false, in_place ? in_place : staged, reason, n); /* creates nothing */
        if (e < 0) {
                zmq_msg_close(ret);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        if (staged)
                memcpy(zmq_msg_data(ret), staged, bytes);
        r->stats.pulled += count;
        return PSNET__STATUS__STATUS_OK;
}

/* table_push's answer as a status (its reason in why, or out of memory). */
static int push_status(int e, const TableConf *c, char *why, size_t n) {
        if (e == -ENOMEM)
                snprintf(why, n, "out of memory for the rows of table %s", c->name);
        return e == 0 ? PSNET__STATUS__STATUS_OK : e == -EINVAL ? PSNET__STATUS__STATUS_INVALID
                                                                : PSNET__STATUS__STATUS_RESOURCE;
}

/* The worker's last pushed clock of table i (slot made where it has none). */
static LastPush *last_of(Rows *r, size_t i, uint32_t worker) {
        for (size_t k = 0; k < r->nlast[i]; k++)
                if (r->last[i][k].worker == worker)
                        return &r->last[i][k];
        LastPush *a = ps_realloc(r->last[i], (r->nlast[i] + 1) * sizeof *a);
        if (!a)
                return NULL;
        r->last[i] = a;
        a[r->nlast[i]] = (LastPush) { .worker = worker, .clock = -1, .done = -1, .rec_clock = -1 };
        return &a[r->nlast[i]++];
}

/* The worker's push of clock holds the update of ids[0..n) here now
 * (LastPush.rec): 0, -ENOMEM. */
static int record_applied(LastPush *l, int64_t clock, const int64_t *ids, size_t n) {
        if (clock < l->rec_clock)
                return 0;
        if (clock > l->rec_clock) {
                idset_clear(&l->rec);
                l->rec_clock = clock;
        }
        for (size_t k = 0; k < n; k++)
                if (idset_add(&l->rec, 0, ids[k]) < 0)
                        return -ENOMEM;
        return 0;
}

/* The ids[0..n) (taken) are the push's to copy to their backups
 * (rows_last_applied), and the push acknowledged once that copy is
 * answered: applied here (ASP/SSP), or, sent again under a newer map, all
 * of it, since the copy of its first sending may still be on its way
 * (which that copy follows on each link). */
static void to_copy(Rows *r, int64_t **ids, size_t n) {
        ps_free(r->copy_ids);
        r->copy_ids = *ids;
        r->copy_n = n;
        *ids = NULL;
}

/* The rows of a push whose id applied says no (ids v and gradients g,
 * dim floats each, compacted; their count returned). */
static size_t keep_unapplied(int64_t *v, float *g, size_t count, size_t dim, bool (*applied)(int64_t id, void *ud),
                             void *ud) {
        size_t kept = 0;
        for (size_t k = 0; k < count; k++) {
                if (applied(v[k], ud))
                        continue;
                v[kept] = v[k];
                if (kept != k)
                        memmove(g + kept * dim, g + k * dim, dim * sizeof *g);
                kept++;
        }
        return kept;
}

static bool recorded(int64_t id, void *ud) {
        return idset_has(ud, 0, id);
}

/* ASP/SSP: the ids of a push of the worker's clock whose update this shard
 * holds already go (ids v and gradients g compacted, their count returned). */
static size_t drop_recorded(LastPush *l, int64_t clock, int64_t *v, float *g, size_t count, size_t dim) {
        if (clock != l->rec_clock || !l->rec.n)
                return count;
        return keep_unapplied(v, g, count, dim, recorded, &l->rec);
}

/* BSP: parks the push (v and g taken), or a status with the reason. */
static int park(Rows *r, const Psnet__Header *h, const zmq_msg_t *route, int64_t **v, float **g, size_t count,
                bool completes, char *reason, size_t n) {
        int e = table_distinct(*v, count, reason, n);
        if (e < 0) {
                if (e == -ENOMEM)
                        snprintf(reason, n, "out of memory");
                return e == -ENOMEM ? PSNET__STATUS__STATUS_RESOURCE : PSNET__STATUS__STATUS_INVALID;
        }
        Parked *a = ps_realloc(r->parked[h->table], (r->nparked[h->table] + 1) * sizeof *a);
        if (!a) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        r->parked[h->table] = a;
        Parked *p = &a[r->nparked[h->table]];
        *p = (Parked) { .worker = h->sender, .clock = h->clock, .part = h->has_part ? h->part : 0,
                        .parts = h->has_parts ? h->parts : 1, .epoch = h->has_epoch ? h->epoch : 0,
                        .acked = !completes, .seq = h->seq, .ids = *v,
                        .g = *g, .n = count };
        if (zmq_msg_init(&p->route) < 0 || (route && zmq_msg_copy(&p->route, (zmq_msg_t *) route) < 0)) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        *v = NULL;
        *g = NULL;
        r->nparked[h->table]++;
        return completes ? ROWS_PARKED : PSNET__STATUS__STATUS_OK;
}

/* The last clock of table t whose copy came whole from shard (-1: none). */
static int64_t copied_clock(const Rows *r, uint32_t shard, uint32_t t) {
        for (size_t i = 0; i < r->ncopied; i++)
                if (r->copied[i].shard == shard)
                        return r->copied[i].clock[t];
        return -1;
}

/* Rows came here at the last map change from shards 0..n-1 (a lost
 * primary's, from the copies; a sender's, moved): the clock of table t
 * those of the i-th stand at here into *ret_clock; false past the last. */
static bool came_from(const Rows *r, size_t i, uint32_t t, int64_t *ret_clock) {
        *ret_clock = i < r->nlost ? copied_clock(r, r->lost[i], t)
                   : i < r->nlost + r->nsrc ? r->src[i - r->nlost].clock[t] : -1;
        return i < r->nlost + r->nsrc;
}

/* BSP: whether clock of table t, closed here, is open again after a map
 * change: rows that came here (a lost primary's copies, or rows moved)
 * stand at an earlier clock. Their primary had acknowledged it to no
 * worker (a lost one had not copied it whole; a sender had not closed
 * it), so every member sends it again; closed here a second time, it is
 * not open any more. */
static bool reopened(const Rows *r, uint32_t t, int64_t clock) {
        if (clock > r->closed[t] || clock <= r->reclosed[t])
                return false;
        int64_t at;
        for (size_t i = 0; came_from(r, i, t, &at); i++)
                if (at < clock)
                        return true;
        return false;
}

/* Whether a push of clock to table t may hold rows applied here before the
 * last map change: at most the last clock closed here or that rows that
 * came here stand at. */
static bool before_failover(const Rows *r, uint32_t t, int64_t clock) {
        if (!r->prev)
                return false;
        int64_t horizon = r->closed[t], at;
        for (size_t i = 0; came_from(r, i, t, &at); i++)
                horizon = MAX(horizon, at);
        return clock <= horizon;
}

/* The clock of table t the rows led by was under the map before the last
 * change stand at here: closed here for its own, the clock they came at. */
static int64_t applied_clock(const Rows *r, uint32_t self, uint32_t was, uint32_t t) {
        if (was == self)
                return r->closed[t];
        const Source *src = source_of(r, was);
        return src ? src->clock[t] : copied_clock(r, was, t);
}

/* A push sent again under the map after a map change: the rows of it this
 * shard already holds applied go (ids v and gradients g compacted, their
 * count returned): its own rows at a clock it closed, a lost primary's
 * whose copy of the clock came here whole, and a sender's moved here at
 * that clock or later. */
typedef struct Cut {
        const Rows *r;
        uint32_t self, t;
        int64_t clock;
} Cut;

static bool applied_before(int64_t id, void *ud) {
        const Cut *c = ud;
        int at = shardmap_row_holder(c->r->prev, c->t, id, 0);
        uint32_t was = at >= 0 ? shardmap_shard(c->r->prev, (size_t) at)->id : 0;
        return applied_clock(c->r, c->self, was, c->t) >= c->clock;
}

static size_t drop_applied(const Rows *r, uint32_t self, uint32_t t, int64_t clock, int64_t *v, float *g,
                           size_t count) {
        Cut c = { r, self, t, clock };
        return keep_unapplied(v, g, count, r->conf[t].dim, applied_before, &c);
}

/* The worker's push h (in parts parts, of which those in in are here) is
 * its last of the table. */
static void note_push(LastPush *last, const Psnet__Header *h, uint32_t parts, uint64_t in) {
        last->clock = h->clock;
        last->parts = parts;
        last->in = in;
        if (h->has_epoch)
                last->epoch = h->epoch;
        if (in == all_parts(parts))
                last->done = h->clock;
}

/* The parked pushes of table t that drop(p, ud) picks go, the others keep
 * their order. */
static void drop_parked(Rows *r, size_t t, bool (*drop)(const Parked *p, const void *ud), const void *ud) {
        size_t j = 0;
        for (size_t k = 0; k < r->nparked[t]; k++) {
                Parked *p = &r->parked[t][k];
                if (drop(p, ud))
                        parked_free(p);
                else
                        r->parked[t][j++] = *p;
        }
        r->nparked[t] = j;
}

static bool parked_of(const Parked *p, const void *ud) {
        const Parked *of = ud;
        return p->worker == of->worker && p->clock == of->clock;
}

/* Worker's parked parts of clock in table t go (a push of it sent again
 * under a newer map takes their place; the worker no longer waits on them). */
static void unpark(Rows *r, uint32_t t, uint32_t worker, int64_t clock) {
        const Parked of = { .worker = worker, .clock = clock };
        drop_parked(r, t, parked_of, &of);
}

int rows_push(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
              const zmq_msg_t *route, uint64_t room, char *reason, size_t n) {
        r->copy_n = r->copy_ngone = 0; /* this push's, once applied */
        Table *t;
        _cleanup_free_ int64_t *v = NULL;
        _cleanup_free_ float *owned = NULL; /* the gradients copied: parked (BSP), or a frame not aligned */
        const float *g = NULL;
        size_t count;
        int st = request_table(r, h, &frames[0], &t, &v, &count, reason, n);
        const TableConf *c = st == PSNET__STATUS__STATUS_OK ? &r->conf[h->table] : NULL;
        size_t gb = zmq_msg_size((zmq_msg_t *) &frames[1]);
        LastPush *last = NULL;
        if (st == PSNET__STATUS__STATUS_OK && r->frozen) {
                snprintf(reason, n, "the shard is writing table %s to a checkpoint: ask again", c->name);
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        if (st == PSNET__STATUS__STATUS_OK && gb != count * c->dim * sizeof(float)) {
                snprintf(reason, n, "table %s has rows of %u floats: %zu ids take %zu bytes of gradients, not %zu",
                         c->name, c->dim, count, count * c->dim * sizeof(float), gb);
                st = PSNET__STATUS__STATUS_SIZE;
        }
        if (st == PSNET__STATUS__STATUS_OK && h->has_epoch && h->epoch > shardmap_epoch(map)) {
                snprintf(reason, n, "the push is cut for shard map epoch %lu and this shard has %lu: ask again",
                         (unsigned long) h->epoch, (unsigned long) shardmap_epoch(map));
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        if (st == PSNET__STATUS__STATUS_OK && r->mode == MODE_BSP && h->has_epoch && h->epoch < shardmap_epoch(map)) {
                /* Cut for an older map: it lacks the rows that came here since,
                 * and counted toward a clock it would close it without them.
                 * Its worker sends it again under this map (unpark_older). */
                snprintf(reason, n, "the push is cut for shard map epoch %lu and this shard has %lu: send it again "
                         "under that map", (unsigned long) h->epoch, (unsigned long) shardmap_epoch(map));
                return PSNET__STATUS__STATUS_MOVED;
        }
        if (st == PSNET__STATUS__STATUS_OK)
                st = check_holder(map, self, h->table, v, count, reason, n);
        if (st == PSNET__STATUS__STATUS_OK &&
            (st = move_wait(r, h->table, v, count, true, reason, n)) == PSNET__STATUS__STATUS_UNAVAILABLE)
                return st;
        if (st == PSNET__STATUS__STATUS_OK && !(last = last_of(r, h->table, h->sender))) {
                snprintf(reason, n, "out of memory");
                st = PSNET__STATUS__STATUS_RESOURCE;
        }
        uint32_t parts = h->has_parts ? h->parts : 1, part = h->has_part ? h->part : 0;
        bool same = st == PSNET__STATUS__STATUS_OK && h->clock == last->clock;
        /* The same clock again under a newer map (a fail-over came between):
         * not a duplicate; what it holds that was applied goes below. */
        bool again = same && h->has_epoch && h->epoch > last->epoch;
        if (again) {
                unpark(r, h->table, h->sender, h->clock);
                last->in = 0;
                last->parts = parts;
                same = false;
        }
        if (st == PSNET__STATUS__STATUS_OK && !again &&
            (h->clock < last->clock || (same && (last->in >> part & 1)) || (same && last->in == all_parts(last->parts))))
                return PSNET__STATUS__STATUS_DUPLICATE;
        if (same && parts != last->parts) {
                snprintf(reason, n, "a push of table %s for clock %ld in %u parts, then in %u", c->name,
                         (long) h->clock, last->parts, parts);
                st = PSNET__STATUS__STATUS_INVALID;
        }
        if (st == PSNET__STATUS__STATUS_OK && last->clock >= 0 && h->clock > last->clock + 2) {
                snprintf(reason, n, "clock %ld is more than 2 past worker %u's last push of table %s (%ld)",
                         (long) h->clock, h->sender, c->name, (long) last->clock);
                st = PSNET__STATUS__STATUS_INVALID;
        }
        bool bsp = r->mode == MODE_BSP;
        /* The part that makes the push whole (every push not in parts). */
        uint64_t in = (same ? last->in : 0) | (uint64_t) 1 << part;
        bool completes = in == all_parts(parts);
        if (bsp && st == PSNET__STATUS__STATUS_OK && h->clock <= r->closed[h->table] &&
            !reopened(r, h->table, h->clock)) {
                /* Closed here, and every row of it applied (a push sent again
                 * after a map change): acknowledged, not parked; its rows
                 * copied again first (rows_last_applied), the clock's copy
                 * may still be on its way. */
                note_push(last, h, parts, in);
                if (again)
                        to_copy(r, &v, count);
                return PSNET__STATUS__STATUS_DUPLICATE;
        }
        if (st == PSNET__STATUS__STATUS_OK && !bsp)
                g = wire_frame_f32(&frames[1]); /* read where it lies */
        if (st == PSNET__STATUS__STATUS_OK && !g) {
                if ((owned = ps_malloc(MAX(gb, (size_t) 1))))
                        g = memcpy(owned, zmq_msg_data((zmq_msg_t *) &frames[1]), gb);
                else {
                        snprintf(reason, n, "out of memory for %zu bytes of gradients", gb);
                        st = PSNET__STATUS__STATUS_RESOURCE;
                }
        }
        if (st == PSNET__STATUS__STATUS_OK && bsp && before_failover(r, h->table, h->clock))
                count = drop_applied(r, self, h->table, h->clock, v, owned, count);
        /* ASP/SSP, a push sent again: all its ids, whose rows it copies
         * again (the first sending's copy may still be on its way). */
        _cleanup_free_ int64_t *all = NULL;
        size_t nall = 0;
        if (st == PSNET__STATUS__STATUS_OK && !bsp && last->rec_clock == h->clock && last->rec.n) {
                /* Rows of this push applied here already, or copied here from
                 * a lost primary that applied them (a push sent again). */
                if (!owned && (owned = ps_malloc(MAX(gb, (size_t) 1))))
                        g = memcpy(owned, g, gb);
                if (owned && (all = ps_malloc(MAX(count, (size_t) 1) * sizeof *all))) {
                        nall = count;
                        memcpy(all, v, count * sizeof *all);
                }
                if (owned && all)
                        count = drop_recorded(last, h->clock, v, owned, count, c->dim);
                else {
                        snprintf(reason, n, "out of memory for %zu bytes of gradients", gb);
                        st = PSNET__STATUS__STATUS_RESOURCE;
                }
        }
        if (st == PSNET__STATUS__STATUS_OK) {
                double sumsq = 0;
                size_t nv = count * c->dim;
                for (size_t i = 0; i < nv; i++)
                        sumsq += (double) g[i] * g[i];
                if (!isfinite(sumsq) && !r->allow_nonfinite) {
                        size_t k = 0;
                        while (k < nv && isfinite(g[k]))
                                k++;
                        snprintf(reason, n, "gradient of row %lld of table %s is not finite (value %zu)",
                                 (long long) v[k / c->dim], c->name, k % c->dim);
                        st = PSNET__STATUS__STATUS_NOT_FINITE;
                } else if (r->max_grad_norm > 0 && sqrt(sumsq) > r->max_grad_norm) {
                        snprintf(reason, n, "the push's gradients of table %s here have an L2 norm of %.4g, above the "
                                 "job's --max-grad-norm %.4g", c->name, sqrt(sumsq), (double) r->max_grad_norm);
                        st = PSNET__STATUS__STATUS_INVALID;
                }
        }
        if (st == PSNET__STATUS__STATUS_OK && (uint64_t) count * (table_row_bytes(c) + 32) > room) {
                snprintf(reason, n, "the shard is at its memory limit: %zu new rows of table %s may not fit (%llu "
                         "bytes left)", count, c->name, (unsigned long long) room);
                st = PSNET__STATUS__STATUS_RESOURCE;
        }
        if (st == PSNET__STATUS__STATUS_OK && !bsp && count > 0 && promote_ids(r, h->table, v, count) < 0) {
                /* copies of a lost primary's rows it touches join this shard's first */
                snprintf(reason, n, "the shard takes over rows of table %s after a fail-over%s: ask again", c->name,
                         r->frozen ? " once its checkpoint is written" : "");
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        if (st == PSNET__STATUS__STATUS_OK && bsp)
                st = park(r, h, route, &v, &owned, count, completes, reason, n);
        else if (st == PSNET__STATUS__STATUS_OK && count > 0) {
                table_tick(t, h->clock);
                st = push_status(table_push(t, v, count, g, reason, n), c, reason, n);
                /* For its copies (rows_last_applied), and a push sent again
                 * after a map change (a fail-over, rows moved). */
                ps_free(r->copy_gone);
                r->copy_gone = NULL;
                long ng = table_gone(t, &r->copy_gone);
                r->copy_ngone = ng > 0 ? (size_t) ng : 0;
                if (st == PSNET__STATUS__STATUS_OK && record_applied(last, h->clock, v, count) < 0)
                        log_warning("out of memory noting the rows worker %u's push of clock %ld applied: sent again "
                                    "after a map change, they would be applied again", h->sender, (long) h->clock);
                to_copy(r, &v, st == PSNET__STATUS__STATUS_OK ? count : 0);
        }
        if (st == PSNET__STATUS__STATUS_OK && all) /* sent again: every row of it copied again */
                to_copy(r, &all, nall);
        if (st != PSNET__STATUS__STATUS_OK && st != ROWS_PARKED) {
                r->stats.refused++;
                return st;
        }
        note_push(last, h, parts, in);
        if (st == ROWS_PARKED)
                return ROWS_PARKED; /* the caller settles, under its fence's limit */
        if (bsp)
                return PSNET__STATUS__STATUS_OK; /* a part kept until its clock closes */
        r->stats.pushed += count;
        return PSNET__STATUS__STATUS_OK;
}

/* An id, and where its gradient row comes from (the parked push and row). */
typedef struct Src {
        int64_t id;
        uint32_t push, row;
} Src;

static int cmp_src(const void *a, const void *b) {
        const Src *x = a, *y = b;
        if (x->id != y->id)
                return (x->id > y->id) - (x->id < y->id);
        return (x->push > y->push) - (x->push < y->push); /* the pushes come in ascending worker order */
}

static int cmp_parked(const void *a, const void *b) {
        const Parked *x = a, *y = b;
        if (x->clock != y->clock)
                return (x->clock > y->clock) - (x->clock < y->clock);
        if (x->worker != y->worker)
                return (x->worker > y->worker) - (x->worker < y->worker);
        return (x->part > y->part) - (x->part < y->part);
}

/* Applies the nmembers parked pushes p[0..np) of one clock of table i (in
 * ascending worker order): each id's rows summed in that order, over the
 * members: OK (the distinct ids applied into *ret_ids, *ret_n), or a status
 * with the reason (nothing applied). */
static int apply_clock(Rows *r, size_t i, const Parked *p, size_t np, size_t nmembers, int64_t **ret_ids,
                       size_t *ret_n, int64_t **ret_gone, size_t *ret_ngone, char *reason, size_t n) {
        const TableConf *c = &r->conf[i];
        size_t total = 0;
        *ret_ids = *ret_gone = NULL;
        *ret_n = *ret_ngone = 0;
        for (size_t k = 0; k < np; k++)
                total += p[k].n;
        if (total == 0)
                return PSNET__STATUS__STATUS_OK;
        Src *src = ps_malloc(total * sizeof *src);
        int64_t *ids = ps_malloc(total * sizeof *ids);
        float *sum = ps_calloc(total * c->dim, sizeof *sum);
        int st = PSNET__STATUS__STATUS_OK;
        if (!src || !ids || !sum) {
                snprintf(reason, n, "out of memory merging %zu rows of table %s", total, c->name);
                st = PSNET__STATUS__STATUS_RESOURCE;
        }
        size_t at = 0, nu = 0;
        for (size_t k = 0; st == PSNET__STATUS__STATUS_OK && k < np; k++)
                for (size_t j = 0; j < p[k].n; j++)
                        src[at++] = (Src) { p[k].ids[j], (uint32_t) k, (uint32_t) j };
        if (st == PSNET__STATUS__STATUS_OK) {
                qsort(src, total, sizeof *src, cmp_src);
                float scale = 1.0f / (float) nmembers;
                for (size_t k = 0; k < total; k++) {
                        if (k == 0 || src[k].id != src[k - 1].id)
                                ids[nu++] = src[k].id;
                        float *dst = sum + (nu - 1) * c->dim;
                        const float *g = p[src[k].push].g + (size_t) src[k].row * c->dim;
                        for (uint32_t d = 0; d < c->dim; d++)
                                dst[d] += g[d];
                }
                for (size_t k = 0; k < nu * c->dim; k++)
                        sum[k] *= scale;
                table_tick(r->tables[i], p[0].clock);
                hold_bounds(r);
                if (promote_ids(r, (uint32_t) i, ids, nu) < 0) {
                        snprintf(reason, n, "out of memory taking over rows of table %s", c->name);
                        st = PSNET__STATUS__STATUS_RESOURCE;
                } else
                        st = push_status(table_push(r->tables[i], ids, nu, sum, reason, n), c, reason, n);
                long ng = table_gone(r->tables[i], ret_gone);
                if (ng < 0) /* they keep their stamps there: dropped in their turn after a fail-over */
                        log_warning("out of memory noting the rows table %s dropped: its backups may keep them",
                                    c->name);
                else
                        *ret_ngone = (size_t) ng;
                if (st == PSNET__STATUS__STATUS_OK) {
                        r->stats.pushed += nu;
                        *ret_ids = ids;
                        *ret_n = nu;
                        ids = NULL;
                }
        }
        ps_free(src);
        ps_free(ids);
        ps_free(sum);
        return st;
}

/* Whether worker is among members[0..nm) (ascending). */
static bool is_member_of(uint32_t worker, const uint32_t *members, size_t nm) {
        return bsearch(&worker, members, nm, sizeof *members, cmp_u32) != NULL;
}

/* What parked_by_leaver picks: a push of clock by a worker not among
 * members[0..nm). */
typedef struct Leavers {
        int64_t clock;
        const uint32_t *members;
        size_t nm;
} Leavers;

static bool parked_by_leaver(const Parked *p, const void *ud) {
        const Leavers *l = ud;
        return p->clock == l->clock && !is_member_of(p->worker, l->members, l->nm);
}

/* The parked pushes p[0..np) of clock in table t (sorted by worker) of
 * workers no longer members of it (evicted, or their leases ran out) go,
 * answered STALE: counted, the clock would wait on a worker that sends
 * nothing again, and every pull past it with it. Whether any went. */
static bool unpark_leavers(Rows *r, size_t t, int64_t clock, size_t np, const uint32_t *members, size_t nm) {
        const Parked *p = r->parked[t];
        const Leavers l = { clock, members, nm };
        size_t ngone = 0, nacks = 0;
        for (size_t k = 0; k < np; k++)
                ngone += parked_by_leaver(&p[k], &l);
        if (ngone == 0)
                return false; /* the common case: nothing to allocate */
        _cleanup_free_ RowsAck *acks = ps_malloc(ngone * sizeof *acks);
        if (!acks)
                return false; /* out of memory: they stay, the clock waits */
        for (size_t k = 0; k < np; k++)
                if (parked_by_leaver(&p[k], &l) && !p[k].acked)
                        acks[nacks++] = (RowsAck) { &p[k].route, p[k].seq, p[k].worker };
        char reason[160];
        snprintf(reason, sizeof reason, "the worker is no longer a member of the job at clock %ld (evicted, or its "
                 "lease ran out): its push is not applied", (long) clock);
        log_info("table rows push dropped: its worker left table=%s clock=%ld pushes=%zu", r->conf[t].name,
                 (long) clock, ngone);
        if (r->hooks.closed && nacks)
                r->hooks.closed(r->hooks.ud, (uint32_t) t, clock, NULL, 0, NULL, 0, acks, nacks,
                                PSNET__STATUS__STATUS_STALE, reason);
        drop_parked(r, t, parked_by_leaver, &l);
        return true;
}

void rows_settle(Rows *r, int64_t limit) {
        if (r->mode != MODE_BSP || !r->hooks.members || r->frozen)
                return;
        for (size_t i = 0; i < r->ntables; i++) {
                while (r->nparked[i] > 0) {
                        Parked *p = r->parked[i];
                        qsort(p, r->nparked[i], sizeof *p, cmp_parked);
                        int64_t clock = p[0].clock;
                        size_t np = 0;
                        while (np < r->nparked[i] && p[np].clock == clock)
                                np++;
                        const uint32_t *members = NULL;
                        size_t nm = 0;
                        r->hooks.members(r->hooks.ud, clock, &members, &nm);
                        if (nm > 0 && unpark_leavers(r, i, clock, np, members, nm))
                                continue;
                        /* Closes when every member pushed it whole (parked pushes are members': admitted). */
                        size_t have = 0;
                        for (size_t m = 0, k = 0; m < nm; m++) {
                                while (k < np && p[k].worker < members[m])
                                        k++;
                                size_t got = 0, want = k < np ? p[k].parts : 1;
                                while (k < np && p[k].worker == members[m]) {
                                        got++;
                                        k++;
                                }
                                have += got > 0 && got == want;
                        }
                        if (clock >= limit || nm == 0 || have < nm)
                                break;
                        char reason[192] = "";
                        _cleanup_free_ int64_t *ids = NULL, *gone = NULL;
                        size_t nids = 0, ngone = 0;
                        int st = apply_clock(r, i, p, np, nm, &ids, &nids, &gone, &ngone, reason, sizeof reason);
                        if (st != PSNET__STATUS__STATUS_OK)
                                r->stats.refused++;
                        _cleanup_free_ RowsAck *acks = ps_malloc(np * sizeof *acks);
                        size_t nacks = 0;
                        for (size_t k = 0; k < np; k++)
                                if (!p[k].acked && acks)
                                        acks[nacks++] = (RowsAck) { &p[k].route, p[k].seq, p[k].worker };
                        if (clock <= r->closed[i]) /* a clock opened again (reopened) */
                                r->reclosed[i] = MAX(r->reclosed[i], clock);
                        r->closed[i] = MAX(r->closed[i], clock);
                        if (r->hooks.closed) /* copied to the backups, then acknowledged */
                                r->hooks.closed(r->hooks.ud, (uint32_t) i, clock, ids, nids, gone, ngone, acks, nacks,
                                                st, reason);
                        for (size_t k = 0; k < np; k++)
                                parked_free(&p[k]);
                        memmove(p, p + np, (r->nparked[i] - np) * sizeof *p);
                        r->nparked[i] -= np;
                }
        }
}

void rows_table_stats(const Rows *r, size_t i, uint64_t *ret_rows, uint64_t *ret_bytes, TableCounts *ret_counts) {
        *ret_rows = i < r->ntables ? table_size(r->tables[i]) : 0;
        *ret_bytes = i < r->ntables ? table_memory(r->tables[i]) : 0;
        if (i < r->ntables)
                table_counts(r->tables[i], ret_counts);
        else
                *ret_counts = (TableCounts) { 0 };
}

void rows_stats(const Rows *r, RowsStats *ret) {
        *ret = r->stats;
        ret->rows = ret->bytes = ret->backup_rows = 0;
        for (size_t i = 0; i < r->ntables; i++) {
                ret->rows += table_size(r->tables[i]);
                ret->backup_rows += table_size(r->backup[i]);
                ret->bytes += table_memory(r->tables[i]) + table_memory(r->backup[i]);
        }
        for (size_t i = 0; i < r->nincoming; i++) {
                const CopyIn *c = &r->incoming[i];
                ret->bytes += c->n * (sizeof(int64_t) + table_row_floats(r->backup[c->table]) * sizeof(float));
        }
}

/* --- copies for the backups (--replicas >= 2, BSP) ------------------------------------------ */

size_t rows_row_floats(const Rows *r, uint32_t table) {
        return table < r->ntables ? table_row_floats(r->tables[table]) : 0;
}

void rows_export(const Rows *r, uint32_t table, const int64_t *ids, size_t n, float *out) {
        table_export(r->tables[table], ids, n, out);
}

void rows_last_applied(const Rows *r, const int64_t **ids, size_t *n, const int64_t **gone, size_t *ngone) {
        *ids = r->copy_ids;
        *n = r->copy_n;
        *gone = r->copy_gone;
        *ngone = r->copy_ngone;
}

bool rows_bounded(const Rows *r, uint32_t table) {
        return table < r->ntables && table_stamped(r->tables[table]);
}

size_t rows_copy_rows(const Rows *r, uint32_t table, const int64_t *ids, size_t n, int64_t *ret_ids,
                      float *ret_rows, int64_t *ret_stamps) {
        return table_export_held(r->tables[table], ids, n, ret_ids, ret_rows, ret_stamps);
}

static Copied *copied_of(Rows *r, uint32_t shard) {
        for (size_t i = 0; i < r->ncopied; i++)
                if (r->copied[i].shard == shard)
                        return &r->copied[i];
        Copied *a = ps_realloc(r->copied, (r->ncopied + 1) * sizeof *a);
        if (!a)
                return NULL;
        r->copied = a;
        Copied *c = &a[r->ncopied++];
        c->shard = shard;
        for (size_t t = 0; t < JOB_MAX_TABLES; t++)
                c->clock[t] = -1;
        return c;
}

static void incoming_drop(Rows *r, size_t i) {
        copyin_free(&r->incoming[i]);
        r->incoming[i] = r->incoming[--r->nincoming];
}

/* Appends frame f's n items of size each to *a (holding have): 0, -ENOMEM. */
static int append_frame(void **a, size_t have, const zmq_msg_t *f, size_t n, size_t each) {
        void *g = ps_realloc(*a, MAX((have + n) * each, (size_t) 1));
        if (!g)
                return -ENOMEM;
        *a = g;
        if (n)
                memcpy((char *) g + have * each, zmq_msg_data((zmq_msg_t *) f), n * each);
        return 0;
}

int rows_copy_in(Rows *r, const Psnet__Header *h, const zmq_msg_t *frames, size_t nframes, char *reason, size_t n) {
        int st = known_table(r, h, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
        uint32_t t = h->table, parts = h->has_parts ? h->parts : 1, part = h->has_part ? h->part : 0;
        size_t per = table_row_floats(r->backup[t]);
        size_t count = zmq_msg_size((zmq_msg_t *) &frames[0]) / sizeof(int64_t);
        if (zmq_msg_size((zmq_msg_t *) &frames[1]) != count * per * sizeof(float)) {
                snprintf(reason, n, "a copy of table %s has rows of %zu floats, not %zu bytes for %zu ids",
                         r->conf[t].name, per, zmq_msg_size((zmq_msg_t *) &frames[1]), count);
                return PSNET__STATUS__STATUS_SIZE;
        }
        bool bounded = table_stamped(r->backup[t]);
        if (nframes != (bounded ? 4u : 2u)) {
                snprintf(reason, n, "a copy of table %s carries %s (%zu frames)", r->conf[t].name,
                         bounded ? "its rows' stamps and the rows dropped: it has max-rows or ttl"
                                 : "its ids and rows alone: it has no max-rows or ttl",
                         nframes);
                return PSNET__STATUS__STATUS_INVALID;
        }
        size_t ngone = bounded ? zmq_msg_size((zmq_msg_t *) &frames[3]) / sizeof(int64_t) : 0;
        size_t i = 0;
        while (i < r->nincoming && (r->incoming[i].shard != h->sender || r->incoming[i].table != t))
                i++;
        if (i < r->nincoming && (r->incoming[i].clock != h->clock || r->incoming[i].parts != parts ||
                                 r->incoming[i].got != part)) {
                incoming_drop(r, i); /* a copy cut short (its sender sent another): never installed */
                i = r->nincoming;
        }
        if (i == r->nincoming && part != 0) {
                snprintf(reason, n, "part %u of a copy of table %s for clock %ld whose first part did not come", part,
                         r->conf[t].name, (long) h->clock);
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (i == r->nincoming) {
                CopyIn *a = ps_realloc(r->incoming, (r->nincoming + 1) * sizeof *a);
                if (!a)
                        goto oom;
                r->incoming = a;
                a[r->nincoming++] = (CopyIn) { .shard = h->sender, .table = t, .parts = parts, .clock = h->clock };
        }
        CopyIn *c = &r->incoming[i];
        if (append_frame((void **) &c->ids, c->n, &frames[0], count, sizeof *c->ids) < 0 ||
            append_frame((void **) &c->rows, c->n, &frames[1], count, per * sizeof *c->rows) < 0 ||
            (bounded && (append_frame((void **) &c->stamps, c->n, &frames[2], count, sizeof *c->stamps) < 0 ||
                         append_frame((void **) &c->gone, c->ngone, &frames[3], ngone, sizeof *c->gone) < 0))) {
                incoming_drop(r, i);
                goto oom;
        }
        c->n += count;
        c->ngone += ngone;
        if (++c->got < c->parts)
                return PSNET__STATUS__STATUS_OK;
        Copied *from = copied_of(r, h->sender);
        int e = from ? table_distinct(c->ids, c->n, reason, n) : -ENOMEM;
        if (e == 0) { /* the rows the primary dropped first: none of them is among its rows */
                table_remove(r->backup[t], c->gone, c->ngone);
                for (size_t k = 0; r->move_stage != MOVE_NONE && e == 0 && k < c->ngone; k++)
                        if (table_row(r->tables[t], c->gone[k], NULL) &&
                            shardmap_row_rank(r->move_map, t, c->gone[k], r->move_self) > 0)
                                e = idset_add(&r->demote_gone, t, c->gone[k]); /* not to be made a copy */
                if (e == 0)
                        e = table_import(r->backup[t], c->ids, c->n, c->rows, c->stamps, reason, n);
        }
        int64_t clock = c->clock;
        if (e == 0 && h->has_origin) { /* a worker's push (ASP, SSP): that push sent again is cut by what came */
                LastPush *l = last_of(r, t, h->origin);
                if (!l || record_applied(l, clock, c->ids, c->n) < 0)
                        log_warning("out of memory noting the rows of worker %u's clock %ld copied here from shard "
                                    "%u: sent again after a fail-over, they would be applied again", h->origin,
                                    (long) clock, h->sender);
        }
        incoming_drop(r, i);
        if (e < 0) {
                if (e == -ENOMEM)
                        snprintf(reason, n, "out of memory for the copy of table %s", r->conf[t].name);
                return e == -ENOMEM ? PSNET__STATUS__STATUS_RESOURCE : PSNET__STATUS__STATUS_INVALID;
        }
        from->clock[t] = MAX(from->clock[t], clock);
        log_debug("table copy installed table=%s from=%u clock=%ld", r->conf[t].name, h->sender, (long) clock);
        r->stats.copies_in++;
        return PSNET__STATUS__STATUS_OK;
oom:
        snprintf(reason, n, "out of memory for a copy of %zu rows of table %s", count, r->conf[t].name);
        return PSNET__STATUS__STATUS_RESOURCE;
}

typedef struct Leads {
        const ShardMap *map;
        uint32_t table;
        int me;
} Leads;

static bool leads_here(int64_t id, void *ud) {
        const Leads *l = ud;
        return shardmap_row_holder(l->map, l->table, id, 0) == l->me;
}

/* A step of the promotion: budget copies looked at. Whether more remain. */
static bool promote_step(Rows *r, size_t budget) {
        Leads l = { .map = r->promote, .me = shardmap_find(r->promote, r->promote_self) };
        for (size_t t = 0; t < r->ntables && l.me >= 0; t++) {
                if (r->promote_at[t] >= table_size(r->backup[t]))
                        continue;
                l.table = (uint32_t) t;
                long moved = table_move_if(r->backup[t], r->tables[t], &r->promote_at[t], budget, leads_here, &l);
                if (moved < 0)
                        return true; /* out of memory: again at the next step */
                r->promoted += (uint64_t) moved;
                return true;
        }
        uint64_t backups = 0;
        for (size_t t = 0; t < r->ntables; t++)
                backups += table_size(r->backup[t]);
        log_info("table rows promoted rows=%lu backup_rows=%lu map_epoch=%lu ms=%lu", (unsigned long) r->promoted,
                 (unsigned long) backups, (unsigned long) shardmap_epoch(r->promote),
                 (unsigned long) (now_ms() - r->promote_ms));
        /* Then every row it leads goes to its backups again: some of them
         * had their copy on a lost shard. */
        r->rebuilding = l.me >= 0 && shardmap_replicas(r->promote) >= 2;
        memset(r->rebuild_at, 0, sizeof r->rebuild_at);
        r->rebuild_ms = now_ms();
        r->promote = shardmap_free(r->promote);
        return r->rebuilding;
}

void rows_copies_lost(Rows *r, uint64_t epoch) {
        if (r->ntables == 0)
                return;
        if (!rows_promoting(r) && !r->rebuilding && !r->move_failed)
                r->whole_epoch = epoch ? epoch - 1 : 0;
        if (r->promote)
                return; /* its rebuild, which sends every row, follows the promotion */
        if (r->move_stage != MOVE_NONE) {
                r->rebuild_after_move = true; /* once the rows this shard no longer leads are gone */
                return;
        }
        log_warning("a copy of table rows did not reach a backup: every row led here goes to its backups again");
        r->rebuilding = true;
        memset(r->rebuild_at, 0, sizeof r->rebuild_at);
        r->rebuilt = 0;
        r->rebuild_ms = now_ms();
}

bool rows_rebuild_step(Rows *r, size_t budget, RowsRebuildFn fn, void *ud) {
        if (r->promote)
                return !r->frozen && promote_step(r, budget);
        for (size_t t = 0; r->rebuilding && t < r->ntables; t++) {
                const Table *tb = r->tables[t];
                if (r->rebuild_at[t] >= table_size(tb))
                        continue;
                size_t per = table_row_floats(tb), n = MIN(budget, table_size(tb) - r->rebuild_at[t]);
                _cleanup_free_ int64_t *ids = ps_malloc(MAX(n, (size_t) 1) * sizeof *ids);
                _cleanup_free_ float *rows = ps_malloc(MAX(n * per, (size_t) 1) * sizeof *rows);
                if (!ids || !rows)
                        return true; /* tried again at the next step */
                n = table_dump(tb, r->rebuild_at[t], n, ids, rows);
                if (fn(ud, (uint32_t) t, r->closed[t], ids, n) < 0)
                        return false; /* the same rows at the next tick */
                r->rebuild_at[t] += n;
                r->rebuilt += n;
                return true;
        }
        if (r->rebuilding) {
                log_info("table rows sent to their backups again rows=%lu ms=%lu", (unsigned long) r->rebuilt,
                         (unsigned long) (now_ms() - r->rebuild_ms));
                r->rebuilds++;
        }
        r->rebuilding = false;
        r->rebuilt = 0;
        return false;
}

/* --- rows moved at a map change (a shard added; one removed with one copy) ------------------ */

/* Whether shard is a receiver of a move from old to map: a shard new to
 * the map; every shard of it where a shard left and rows had one copy. */
static bool move_receiver(const ShardMap *old, const ShardMap *map, uint32_t shard) {
        if (shardmap_find(map, shard) < 0)
                return false;
        if (shardmap_find(old, shard) < 0)
                return true;
        if (shardmap_replicas(old) >= 2)
                return false;
        for (size_t i = 0; i < shardmap_size(old); i++)
                if (shardmap_find(map, shardmap_shard(old, i)->id) < 0)
                        return true;
        return false;
}

/* Whether shard sends rows at a move from old to map: one of old's that
 * stays, or leaves where rows had one copy (it hands them over). */
static bool move_sender(const ShardMap *old, const ShardMap *map, uint32_t shard) {
        return shardmap_find(old, shard) >= 0 && (shardmap_find(map, shard) >= 0 || shardmap_replicas(old) < 2);
}

/* Pushes parked under a map older than epoch go: they may lack rows this
 * shard leads now, or hold rows it no longer leads, and their workers send
 * them again under the new map (nothing of them was acknowledged). Counted
 * with the pushes cut for the new one, a clock would close without the
 * rows that came here. */
static bool parked_before(const Parked *p, const void *ud) {
        return p->epoch < *(const uint64_t *) ud;
}

static void unpark_older(Rows *r, uint64_t epoch) {
        for (size_t t = 0; t < r->ntables; t++)
                drop_parked(r, t, parked_before, &epoch);
}

/* A map change that moves rows: the maps before and after kept (pushes
 * sent again are cut by them), the senders this shard waits on, and its
 * own sweep as a sender (the pushes parked under the older map are gone:
 * unpark_older). */
static void move_begin(Rows *r, const ShardMap *old, const ShardMap *map, uint32_t self) {
        size_t ns = shardmap_size(old);
        ShardMap *prev = shardmap_dup(old), *next = shardmap_dup(map);
        Source *src = ps_calloc(MAX(ns, (size_t) 1), sizeof *src);
        if (!prev || !next || !src) {
                shardmap_free(prev);
                shardmap_free(next);
                ps_free(src);
                log_error("out of memory starting to move table rows: they stay where they are, and the shards "
                          "that lead them now serve them empty");
                return;
        }
        if (!rows_promoting(r) && !r->rebuilding && !r->move_failed)
                r->whole_epoch = shardmap_epoch(old);
        /* What the change before this one left (pscoord waits until it is settled). */
        shardmap_free(r->prev);
        r->prev = prev;
        ps_free(r->lost);
        r->lost = NULL;
        r->nlost = 0;
        r->promote = shardmap_free(r->promote);
        r->move_map = shardmap_free(r->move_map);
        r->move_stage = MOVE_NONE;
        sources_free(r->src, r->nsrc);
        r->src = src;
        r->nsrc = 0;
        if (move_receiver(old, map, self))
                for (size_t i = 0; i < ns; i++) {
                        uint32_t id = shardmap_shard(old, i)->id;
                        if (id == self || !move_sender(old, map, id))
                                continue;
                        src[r->nsrc].shard = id;
                        for (size_t t = 0; t < JOB_MAX_TABLES; t++)
                                src[r->nsrc].clock[t] = -1;
                        r->nsrc++;
                }
        r->receiving = r->nsrc > 0;
        for (size_t t = 0; t < r->ntables; t++) {
                r->reclosed[t] = -1;
                r->move_clock[t] = r->closed[t];
        }
        if (move_sender(old, map, self)) {
                r->move_map = next;
                next = NULL;
                r->move_self = self;
                r->move_stage = MOVE_FIRST;
                r->move_table = 0;
                r->move_at = 0;
                r->move_sent = r->move_kept = r->move_wanted = 0;
                r->move_ms = now_ms();
                /* A row led here that leads elsewhere now stays here as a copy
                 * where this shard still holds it: a copy of every clock its
                 * new primary closes comes after the clock closed here. */
                for (size_t i = 0; i < shardmap_size(map); i++) {
                        Copied *c = move_receiver(old, map, shardmap_shard(map, i)->id)
                                            ? copied_of(r, shardmap_shard(map, i)->id) : NULL;
                        for (size_t t = 0; c && t < r->ntables; t++)
                                c->clock[t] = MAX(c->clock[t], r->closed[t]);
                }
        }
        shardmap_free(next);
        log_info("table rows move map_epoch=%lu senders_here=%zu sends=%s", (unsigned long) shardmap_epoch(map),
                 r->nsrc, r->move_stage != MOVE_NONE ? "yes" : "no");
}

/* One sender's row: who gets it (each new holder that did not hold it
 * before, but this shard), as whole rows by destination. */
typedef struct MoveOut {
        const Rows *r;
        uint32_t t;
        size_t per;
        int64_t **ids;          /* by shard of the new map */
        float **rows;
        int64_t **stamps;
        size_t *n;
} MoveOut;

static void move_route(MoveOut *o, int64_t id, const float *row, int64_t stamp) {
        const Rows *r = o->r;
        for (uint32_t i = 0; i < shardmap_replicas(r->move_map); i++) {
                int at = shardmap_row_holder(r->move_map, o->t, id, i);
                if (at < 0)
                        continue;
                uint32_t shard = shardmap_shard(r->move_map, (size_t) at)->id;
                if (shard == r->move_self || shardmap_row_rank(r->prev, o->t, id, shard) >= 0)
                        continue;
                size_t k = o->n[at]++;
                o->ids[at][k] = id;
                o->stamps[at][k] = stamp;
                memcpy(o->rows[at] + k * o->per, row, o->per * sizeof *row);
        }
}

typedef struct Sweep {
        const Rows *r;
        uint32_t t;
} Sweep;

static int drop_unheld(int64_t id, const float *row, void *ud) {
        const Sweep *w = ud;
        (void) row;
        return shardmap_row_rank(w->r->move_map, w->t, id, w->r->move_self) < 0 ? TABLE_DROP : TABLE_KEEP;
}

/* A row this shard no longer leads becomes a copy where it backs it, but
 * not over a copy its new primary sent since (newer), nor where that
 * primary dropped it meanwhile. */
static int demote(int64_t id, const float *row, void *ud) {
        const Sweep *w = ud;
        (void) row;
        int rank = shardmap_row_rank(w->r->move_map, w->t, id, w->r->move_self);
        if (rank > 0 && (table_row(w->r->backup[w->t], id, NULL) || idset_has(&w->r->demote_gone, w->t, id)))
                return TABLE_DROP;
        return rank == 0 ? TABLE_KEEP : rank > 0 ? TABLE_MOVE : TABLE_DROP;
}

/* ASP/SSP, before a sender's first word of table t to receiver to: what
 * each worker's pushes of it left here (LastPush), the ids of its last
 * recorded push cut to the rows this shard led that to holds now and did
 * not before (they come from here), so that a push sent again under the
 * new map is cut there as here (ROWS_MOVE naming the worker). 0, or the
 * failed send's error. */
static int move_records(Rows *r, uint32_t t, uint32_t to, const RowsMoveHooks *hk) {
        for (size_t k = 0; k < r->nlast[t]; k++) {
                const LastPush *l = &r->last[t][k];
                const IdSet *s = &l->rec;
                _cleanup_free_ int64_t *ids = ps_malloc(MAX(s->n, (size_t) 1) * sizeof *ids);
                if (!ids)
                        return -ENOMEM;
                size_t n = 0;
                for (size_t i = 0; i < s->cap; i++)
                        if (s->tab[i] && shardmap_row_rank(r->prev, t, s->ids[i], r->move_self) == 0 &&
                            shardmap_row_rank(r->move_map, t, s->ids[i], to) >= 0 &&
                            shardmap_row_rank(r->prev, t, s->ids[i], to) < 0)
                                ids[n++] = s->ids[i];
                size_t at = 0;
                do { /* at most WIRE_MAX_ROWS ids a message; the done clock in each */
                        size_t c = MIN(n - at, (size_t) WIRE_MAX_ROWS);
                        int e = hk->record(hk->ud, to, t, l->worker, l->rec_clock, l->done, ids + at, c);
                        if (e < 0)
                                return e;
                        at += c;
                } while (at < n);
        }
        return 0;
}

/* MOVE_SEND: budget rows of the table in hand to their new holders. */
static int move_send(Rows *r, size_t budget, RowsMoveFn send, void *ud) {
        uint32_t t = r->move_table;
        const Table *tb = r->tables[t];
        size_t per = table_row_floats(tb), ns = shardmap_size(r->move_map);
        budget = MIN(budget, MAX((size_t) WIRE_ROWS_PART_BYTES / (per * sizeof(float)), (size_t) 1));
        size_t n = MIN(budget, table_size(tb) - MIN(r->move_at, table_size(tb)));
        bool bounded = table_stamped(tb);
        _cleanup_free_ int64_t *ids = ps_malloc(MAX(n, (size_t) 1) * sizeof *ids);
        _cleanup_free_ float *rows = ps_malloc(MAX(n * per, (size_t) 1) * sizeof *rows);
        _cleanup_free_ int64_t *stamps = ps_malloc(MAX(n, (size_t) 1) * sizeof *stamps);
        _cleanup_free_ int64_t **dids = ps_calloc(ns, sizeof *dids);
        _cleanup_free_ float **drows = ps_calloc(ns, sizeof *drows);
        _cleanup_free_ int64_t **dstamps = ps_calloc(ns, sizeof *dstamps);
        _cleanup_free_ size_t *dn = ps_calloc(ns, sizeof *dn);
        int e = ids && rows && stamps && dids && drows && dstamps && dn ? 0 : -ENOMEM;
        for (size_t j = 0; e == 0 && j < ns; j++)
                if (!(dids[j] = ps_malloc(MAX(n, (size_t) 1) * sizeof **dids)) ||
                    !(drows[j] = ps_malloc(MAX(n * per, (size_t) 1) * sizeof **drows)) ||
                    !(dstamps[j] = ps_malloc(MAX(n, (size_t) 1) * sizeof **dstamps)))
                        e = -ENOMEM;
        if (e == 0) {
                n = table_dump(tb, r->move_at, n, ids, rows);
                table_stamps(tb, ids, n, stamps);
                MoveOut o = { r, t, per, dids, drows, dstamps, dn };
                for (size_t k = 0; k < n; k++)
                        move_route(&o, ids[k], rows + k * per, stamps[k]);
                for (size_t j = 0; e == 0 && j < ns; j++)
                        if (dn[j] > 0) {
                                e = send(ud, shardmap_shard(r->move_map, j)->id, t, r->move_clock[t] + 1, dids[j],
                                         drows[j], bounded ? dstamps[j] : NULL, dn[j], false);
                                r->move_sent += dn[j];
                        }
                if (e == 0)
                        r->move_at += n;
        }
        for (size_t j = 0; dids && drows && dstamps && j < ns; j++) {
                ps_free(dids[j]);
                ps_free(drows[j]);
                ps_free(dstamps[j]);
        }
        return e;
}

/* Called past the last stage (rows_move_step's MOVE_DEMOTE done). */
static void move_done(Rows *r) {
        log_info("table rows moved rows_sent=%lu rows_asked_for=%lu rows_no_longer_led=%lu map_epoch=%lu ms=%lu",
                 (unsigned long) r->move_sent, (unsigned long) r->move_wanted, (unsigned long) r->move_kept,
                 (unsigned long) shardmap_epoch(r->move_map), (unsigned long) (now_ms() - r->move_ms));
        r->move_stage = MOVE_NONE;
        r->moves++;
        idset_free(&r->demote_gone);
        for (size_t t = 0; t < r->ntables; t++) {
                table_trim(r->tables[t]);
                table_trim(r->backup[t]);
        }
        if (r->rebuild_after_move) {
                r->rebuild_after_move = false;
                rows_copies_lost(r, shardmap_epoch(r->move_map));
        }
}

uint64_t rows_moves(const Rows *r) { return r->moves; }

bool rows_move_step(Rows *r, size_t budget, const RowsMoveHooks *hk) {
        RowsMoveFn send = hk->send;
        void *ud = hk->ud;
        if (r->move_stage == MOVE_NONE || r->frozen)
                return false;
        if (r->move_stage == MOVE_SEND && hk->busy && hk->busy(ud))
                return false; /* at the next tick */
        if (r->move_stage == MOVE_SEND || r->move_stage == MOVE_COPIES || r->move_stage == MOVE_DEMOTE) {
                if (r->move_table >= r->ntables && r->move_stage == MOVE_DEMOTE) {
                        move_done(r);
                        return false;
                }
                if (r->move_table >= r->ntables) {
                        r->move_table = 0;
                        r->move_at = 0;
                        r->move_stage++;
                        return true;
                }
                uint32_t t = r->move_table;
                Table *tb = r->move_stage == MOVE_COPIES ? r->backup[t] : r->tables[t];
                if (r->move_at >= table_size(tb)) {
                        r->move_table++;
                        r->move_at = 0;
                        return true;
                }
                Sweep w = { r, t };
                long gone = 0;
                int e = 0;
                if (r->move_stage == MOVE_SEND)
                        e = move_send(r, budget, send, ud);
                else if (r->move_stage == MOVE_COPIES)
                        gone = shardmap_find(r->move_map, r->move_self) >= 0
                                       ? table_sweep(tb, NULL, &r->move_at, budget, drop_unheld, &w)
                                       : (r->move_at = table_size(tb), 0);
                else
                        gone = table_sweep(tb, r->backup[t], &r->move_at, budget, demote, &w);
                if (e < 0 || gone < 0)
                        log_warning_errno(e < 0 ? e : (int) gone, "Failed a step of moving table %s's rows (%m): "
                                          "again at the next", r->conf[t].name);
                else if (r->move_stage == MOVE_DEMOTE)
                        r->move_kept += (uint64_t) gone;
                return true;
        }
        if (r->move_stage == MOVE_FIRST || r->move_stage == MOVE_LAST) {
                /* First the clock each table's rows stand at, to every
                 * receiver (so that it takes pushes before the rows come);
                 * at last that all are sent. */
                bool last = r->move_stage == MOVE_LAST;
                for (size_t t = 0; t < r->ntables; t++)
                        for (size_t i = 0; i < shardmap_size(r->move_map); i++) {
                                uint32_t id = shardmap_shard(r->move_map, i)->id;
                                if (id == r->move_self || !move_receiver(r->prev, r->move_map, id))
                                        continue;
                                int e = !last && r->mode != MODE_BSP ? move_records(r, (uint32_t) t, id, hk) : 0;
                                if (e == 0)
                                        e = send(ud, id, (uint32_t) t, r->move_clock[t] + 1, NULL, NULL, NULL, 0,
                                                 last);
                                if (e < 0) {
                                        log_warning_errno(e, "Failed to tell shard %u of the rows of table %s that "
                                                          "move to it (%m): again at the next step", id,
                                                          r->conf[t].name);
                                        return true;
                                }
                        }
                r->move_stage = last ? MOVE_ANSWERS : MOVE_SEND;
                return true;
        }
        /* MOVE_ANSWERS: every receiver took what was sent before rows go. */
        int a = hk->answered(ud);
        if (a == 0)
                return false; /* looked at again at the next tick */
        if (a < 0) {
                log_error("a shard refused table rows moved to it: this shard keeps its rows as they are, and the "
                          "rows stay on fewer copies than the map says (psctl status: rows_whole_epoch)");
                r->move_stage = MOVE_NONE;
                r->move_failed = true;
                return false;
        }
        r->move_stage = MOVE_DEMOTE;
        r->move_table = 0;
        r->move_at = 0;
        return true;
}

/* A ROWS_MOVE naming a worker (move_records): its last recorded push's
 * ids join what this shard holds of it (a newer push's replace an older
 * one's), and its last clock done here is at least the sender's. */
static int move_record_in(Rows *r, const Psnet__Header *h, const zmq_msg_t *frames, size_t nframes, size_t count,
                          char *reason, size_t n) {
        uint32_t t = h->table;
        if (r->mode == MODE_BSP || nframes != 2 || zmq_msg_size((zmq_msg_t *) &frames[1]) != 0) {
                snprintf(reason, n, "what worker %u's pushes of table %s left at shard %u comes under ASP or SSP alone, "
                         "as ids and an empty frame", h->origin, r->conf[t].name, h->sender);
                return PSNET__STATUS__STATUS_INVALID;
        }
        _cleanup_free_ int64_t *ids = ps_malloc(MAX(count, (size_t) 1) * sizeof *ids);
        LastPush *l = ids ? last_of(r, t, h->origin) : NULL;
        if (l && count)
                memcpy(ids, zmq_msg_data((zmq_msg_t *) &frames[0]), count * sizeof *ids); /* a frame of any alignment */
        if (!l || record_applied(l, h->clock, ids, count) < 0) {
                snprintf(reason, n, "out of memory noting worker %u's pushes of table %s", h->origin, r->conf[t].name);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        l->done = MAX(l->done, h->done);
        return PSNET__STATUS__STATUS_OK;
}

int rows_move_in(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
                 size_t nframes, char *reason, size_t n) {
        int st = known_table(r, h, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
        uint32_t t = h->table;
        uint64_t bit = (uint64_t) 1 << t;
        Source *src = source_of(r, h->sender);
        if (src && h->epoch == shardmap_epoch(map) && (src->done & bit))
                return PSNET__STATUS__STATUS_OK; /* asked-for rows after its last: every row came already */
        if (!src || !r->receiving || h->epoch != shardmap_epoch(map)) {
                snprintf(reason, n, "shard %u moves no rows here under map epoch %lu (this shard acts on %lu)",
                         h->sender, (unsigned long) h->epoch, (unsigned long) shardmap_epoch(map));
                return PSNET__STATUS__STATUS_MOVED;
        }
        if (r->frozen) {
                snprintf(reason, n, "the shard is writing table %s to a checkpoint", r->conf[t].name);
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        size_t per = table_row_floats(r->tables[t]);
        size_t count = zmq_msg_size((zmq_msg_t *) &frames[0]) / sizeof(int64_t);
        if (h->has_origin)
                return move_record_in(r, h, frames, nframes, count, reason, n);
        bool bounded = table_stamped(r->tables[t]);
        if (nframes != (bounded ? 3u : 2u)) {
                snprintf(reason, n, "rows of table %s moved here carry %s (%zu frames)", r->conf[t].name,
                         bounded ? "their stamps: it has max-rows or ttl" : "ids and rows alone: it has no max-rows or ttl",
                         nframes);
                return PSNET__STATUS__STATUS_INVALID;
        }
        hold_bounds(r);
        if (count > 0 && zmq_msg_size((zmq_msg_t *) &frames[1]) == 0) {
                /* Ids asked for that the sender does not hold: new rows here. */
                for (size_t k = 0; k < count; k++) {
                        int64_t id;
                        memcpy(&id, (const char *) zmq_msg_data((zmq_msg_t *) &frames[0]) + k * sizeof id, sizeof id);
                        if (!table_row(r->tables[t], id, NULL) && idset_add(&src->absent, t, id) < 0) {
                                snprintf(reason, n, "out of memory noting ids of table %s", r->conf[t].name);
                                return PSNET__STATUS__STATUS_RESOURCE;
                        }
                }
                return PSNET__STATUS__STATUS_OK;
        }
        if (zmq_msg_size((zmq_msg_t *) &frames[1]) != count * per * sizeof(float)) {
                snprintf(reason, n, "rows of table %s moved here have %zu floats, not %zu bytes for %zu ids",
                         r->conf[t].name, per, zmq_msg_size((zmq_msg_t *) &frames[1]), count);
                return PSNET__STATUS__STATUS_SIZE;
        }
        _cleanup_free_ int64_t *ids = ps_malloc(MAX(count, (size_t) 1) * sizeof *ids);
        _cleanup_free_ float *rows = ps_malloc(MAX(count * per, (size_t) 1) * sizeof *rows);
        _cleanup_free_ int64_t *bids = ps_malloc(MAX(count, (size_t) 1) * sizeof *bids);
        _cleanup_free_ float *brows = ps_malloc(MAX(count * per, (size_t) 1) * sizeof *brows);
        _cleanup_free_ int64_t *sts = ps_malloc(MAX(count, (size_t) 1) * sizeof *sts);
        _cleanup_free_ int64_t *bst = ps_malloc(MAX(count, (size_t) 1) * sizeof *bst);
        if (!ids || !rows || !bids || !brows || !sts || !bst) {
                snprintf(reason, n, "out of memory for %zu rows of table %s", count, r->conf[t].name);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        const int64_t *in_ids = zmq_msg_data((zmq_msg_t *) &frames[0]);
        const float *in_rows = zmq_msg_data((zmq_msg_t *) &frames[1]);
        size_t led = 0, backed = 0;
        for (size_t k = 0; k < count; k++) {
                int64_t id;
                memcpy(&id, in_ids + k, sizeof id); /* a frame of any alignment */
                int place = shardmap_row_rank(map, t, id, self);
                if (place < 0) {
                        snprintf(reason, n, "row %lld of table %s moved here is not this shard's under map epoch %lu",
                                 (long long) id, r->conf[t].name, (unsigned long) shardmap_epoch(map));
                        return PSNET__STATUS__STATUS_MOVED;
                }
                if (place == 0 && table_row(r->tables[t], id, NULL))
                        continue; /* came already (asked for), and may have changed since */
                int64_t *ds = place == 0 ? sts + led : bst + backed;
                int64_t *di = place == 0 ? ids + led : bids + backed;
                float *dr = place == 0 ? rows + led++ * per : brows + backed++ * per;
                *di = id;
                if (bounded)
                        memcpy(ds, (const char *) zmq_msg_data((zmq_msg_t *) &frames[2]) + k * sizeof *ds, sizeof *ds);
                memcpy(dr, (const char *) in_rows + k * per * sizeof(float), per * sizeof(float));
        }
        int e = table_import(r->tables[t], ids, led, rows, bounded ? sts : NULL, reason, n);
        if (e == 0)
                e = table_import(r->backup[t], bids, backed, brows, bounded ? bst : NULL, reason, n);
        if (e < 0) {
                if (e == -ENOMEM)
                        snprintf(reason, n, "out of memory for %zu rows of table %s moved here", count, r->conf[t].name);
                log_error("rows of table %s moved here from shard %u not taken reason=\"%s\"", r->conf[t].name,
                          h->sender, reason);
                return e == -ENOMEM ? PSNET__STATUS__STATUS_RESOURCE : PSNET__STATUS__STATUS_INVALID;
        }
        r->stats.moved_in += led + backed;
        if (!(src->got & bit)) {
                src->got |= bit;
                src->clock[t] = h->clock - 1; /* it says the first clock it had not closed */
                /* Every sender's clock known: those at or below the lowest are
                 * closed here too (every member completed them). */
                bool all = true;
                int64_t lo = INT64_MAX;
                for (size_t i = 0; i < r->nsrc; i++) {
                        all = all && (r->src[i].got & bit);
                        lo = MIN(lo, r->src[i].clock[t]);
                }
                if (all)
                        r->closed[t] = MAX(r->closed[t], lo);
        }
        if (h->has_last && h->last) {
                src->done |= bit;
                /* The copies it sent here stand at its clock or later: as if
                 * it had copied that clock here whole (a fail-over of it
                 * reads this). */
                Copied *c = copied_of(r, h->sender);
                if (c)
                        c->clock[t] = MAX(c->clock[t], src->clock[t]);
                uint64_t every = r->ntables >= 64 ? UINT64_MAX : ((uint64_t) 1 << r->ntables) - 1;
                bool all = true;
                for (size_t i = 0; i < r->nsrc; i++)
                        all = all && (r->src[i].done & every) == every;
                if (all) {
                        log_info("table rows moved here rows=%lu senders=%zu map_epoch=%lu",
                                 (unsigned long) r->stats.moved_in, r->nsrc, (unsigned long) shardmap_epoch(map));
                        r->receiving = false;
                        for (size_t i = 0; i < r->nsrc; i++) /* their clocks stay: pushes sent again are cut by them */
                                idset_free(&r->src[i].absent);
                }
        }
        return PSNET__STATUS__STATUS_OK;
}

int rows_want(Rows *r, const Psnet__Header *h, const zmq_msg_t *frames, RowsMoveFn send, void *ud, char *reason,
              size_t n) {
        int st = known_table(r, h, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
        if (r->move_stage == MOVE_NONE || r->move_stage >= MOVE_ANSWERS)
                return PSNET__STATUS__STATUS_OK; /* every row was sent (an ask that crossed its last) */
        uint32_t t = h->table;
        size_t count = zmq_msg_size((zmq_msg_t *) &frames[0]) / sizeof(int64_t), per = table_row_floats(r->tables[t]);
        _cleanup_free_ int64_t *held = ps_malloc(MAX(count, (size_t) 1) * sizeof *held);
        _cleanup_free_ int64_t *absent = ps_malloc(MAX(count, (size_t) 1) * sizeof *absent);
        _cleanup_free_ float *rows = ps_malloc(MAX(count * per, (size_t) 1) * sizeof *rows);
        _cleanup_free_ int64_t *stamps = ps_malloc(MAX(count, (size_t) 1) * sizeof *stamps);
        if (!held || !absent || !rows || !stamps) {
                snprintf(reason, n, "out of memory for %zu rows of table %s", count, r->conf[t].name);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        size_t nh = 0, na = 0;
        for (size_t k = 0; k < count; k++) {
                int64_t id;
                memcpy(&id, (const char *) zmq_msg_data((zmq_msg_t *) &frames[0]) + k * sizeof id, sizeof id);
                /* Only a row this shard led that the asker leads now. */
                if (shardmap_row_rank(r->move_map, t, id, h->sender) != 0 ||
                    shardmap_row_rank(r->prev, t, id, r->move_self) != 0)
                        continue;
                if (table_row(r->tables[t], id, NULL))
                        held[nh++] = id;
                else
                        absent[na++] = id;
        }
        table_export(r->tables[t], held, nh, rows);
        table_stamps(r->tables[t], held, nh, stamps);
        bool bounded = table_stamped(r->tables[t]);
        int e = nh ? send(ud, h->sender, t, r->move_clock[t] + 1, held, rows, bounded ? stamps : NULL, nh, false) : 0;
        if (e == 0 && na)
                e = send(ud, h->sender, t, r->move_clock[t] + 1, absent, NULL, NULL, na, false);
        if (e < 0) {
                snprintf(reason, n, "the rows asked for could not be sent: %s", strerror(-e));
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        r->move_wanted += nh + na;
        return PSNET__STATUS__STATUS_OK;
}

const ShardDesc *rows_prev_shard(const Rows *r, uint32_t shard) {
        int i = r->prev ? shardmap_find(r->prev, shard) : -1;
        return i >= 0 ? shardmap_shard(r->prev, (size_t) i) : NULL;
}

void rows_map_changed(Rows *r, const ShardMap *old, const ShardMap *map, uint32_t self) {
        if (!old || !map || r->ntables == 0 || shardmap_epoch(old) == shardmap_epoch(map))
                return;
        unpark_older(r, shardmap_epoch(map));
        for (size_t i = 0; i < shardmap_size(map); i++)
                if (move_receiver(old, map, shardmap_shard(map, i)->id)) {
                        move_begin(r, old, map, self);
                        return;
                }
        size_t nlost = 0;
        _cleanup_free_ uint32_t *lost = ps_malloc(MAX(shardmap_size(old), (size_t) 1) * sizeof *lost);
        ShardMap *prev = shardmap_dup(old);
        if (!lost || !prev) {
                shardmap_free(prev);
                log_error("out of memory noting the shards the map lost: pushes sent again after a fail-over may "
                          "be applied twice");
                return;
        }
        for (size_t i = 0; i < shardmap_size(old); i++)
                if (shardmap_find(map, shardmap_shard(old, i)->id) < 0)
                        lost[nlost++] = shardmap_shard(old, i)->id;
        if (nlost == 0) {
                shardmap_free(prev);
                return;
        }
        shardmap_free(r->prev);
        ps_free(r->lost);
        r->prev = prev;
        r->lost = lost;
        lost = NULL;
        r->nlost = nlost;
        for (size_t i = 0; i < r->nincoming;) {
                bool gone = false;
                for (size_t k = 0; k < nlost; k++)
                        gone = gone || r->incoming[i].shard == r->lost[k];
                if (gone)
                        incoming_drop(r, i); /* a lost primary's copy cut short: never installed */
                else
                        i++;
        }
        /* The copies of the rows this shard leads now join its tables: a
         * row as soon as a pull or a clock touches it, the rest a step at a
         * time (rows_rebuild_step; a scan and a checkpoint's cut wait for
         * the last). */
        if (shardmap_find(map, self) < 0)
                return;
        if (!r->promote && !r->rebuilding)
                r->whole_epoch = shardmap_epoch(old);
        shardmap_free(r->promote);
        r->promote = shardmap_dup(map);
        r->promote_self = self;
        r->promoted = 0;
        r->promote_ms = now_ms();
        r->rebuilding = false;
        memset(r->promote_at, 0, sizeof r->promote_at);
        if (!r->promote)
                log_error("out of memory: the copies of the rows this shard leads now stay copies");
}

int rows_scan(Rows *r, const Psnet__Header *h, zmq_msg_t *ret, bool *ret_more, uint64_t *ret_next, char *reason,
              size_t n) {
        int st = known_table(r, h, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
        if (rows_promoting(r)) {
                snprintf(reason, n, "rows of table %s change hands after a map change (a fail-over, or a shard "
                         "added or removed): ask again", r->conf[h->table].name);
                return PSNET__STATUS__STATUS_UNAVAILABLE;
        }
        const Table *t = r->tables[h->table];
        size_t dim = r->conf[h->table].dim, from = h->has_cursor ? (size_t) h->cursor : 0;
        size_t total = table_size(t), count = from < total ? MIN(total - from, (size_t) ROWS_SCAN_MAX) : 0;
        _cleanup_free_ int64_t *ids = ps_malloc(MAX(count, (size_t) 1) * sizeof *ids);
        _cleanup_free_ float *values = ps_malloc(MAX(count * dim, (size_t) 1) * sizeof *values);
        bool ok = ids && values && zmq_msg_init_size(&ret[0], count * sizeof *ids) == 0;
        if (ok && zmq_msg_init_size(&ret[1], count * dim * sizeof *values) < 0) {
                zmq_msg_close(&ret[0]);
                ok = false;
        }
        if (!ok) {
                snprintf(reason, n, "out of memory for %zu rows", count);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        table_scan(t, from, count, ids, values);
        memcpy(zmq_msg_data(&ret[0]), ids, count * sizeof *ids);
        memcpy(zmq_msg_data(&ret[1]), values, count * dim * sizeof *values);
        *ret_more = from + count < total;
        *ret_next = from + count;
        r->stats.pulled += count;
        return PSNET__STATUS__STATUS_OK;
}

/* --- checkpoints ---------------------------------------------------------------------------- */

size_t rows_ntables(const Rows *r) { return r->ntables; }

const TableConf *rows_conf(const Rows *r, size_t i) { return i < r->ntables ? &r->conf[i] : NULL; }

void rows_closed(const Rows *r, int64_t *ret_lo, int64_t *ret_hi) {
        int64_t lo = -1, hi = -1;
        for (size_t i = 0; i < r->ntables; i++) {
                lo = i == 0 ? r->closed[i] : MIN(lo, r->closed[i]);
                hi = MAX(hi, r->closed[i]);
        }
        *ret_lo = lo;
        *ret_hi = hi;
}

void rows_worker_clocks(const Rows *r, uint32_t worker, int64_t *ret_lo, int64_t *ret_hi) {
        int64_t lo = -1, hi = -1;
        for (size_t i = 0; i < r->ntables; i++) {
                int64_t c = -1;
                for (size_t k = 0; k < r->nlast[i]; k++)
                        if (r->last[i][k].worker == worker)
                                c = r->last[i][k].done;
                lo = i == 0 ? c : MIN(lo, c);
                hi = MAX(hi, c);
        }
        *ret_lo = lo;
        *ret_hi = hi;
}

size_t rows_block_rows(const Table *t) {
        return MIN((size_t) CKPT_MAX_NLAST, (size_t) CKPT_MAX_LEN / table_row_floats(t));
}

size_t rows_blocks(const Rows *r) {
        size_t n = 0;
        for (size_t i = 0; i < r->ntables; i++) {
                size_t b = rows_block_rows(r->tables[i]);
                n += (table_size(r->tables[i]) + b - 1) / b;
        }
        return n;
}

size_t rows_snapshot(Rows *r, int64_t clock, CkptRecord *out, Table **ret_tables) {
        size_t n = 0;
        for (size_t i = 0; i < r->ntables; i++) {
                const Table *t = r->tables[i];
                size_t per = table_row_floats(t), b = rows_block_rows(t), total = table_size(t);
                ret_tables[i] = r->tables[i];
                for (size_t from = 0, block = 0; from < total; from += b, block++) {
                        size_t m = MIN(b, total - from);
                        out[n++] = (CkptRecord) { .tensor = CKPT_ROWS | (uint32_t) i, .chunk = (uint32_t) block,
                                                  .len = (uint32_t) (m * per), .nlast = (uint32_t) m,
                                                  .clock = clock };
                }
        }
        r->frozen = true;
        return n;
}

void rows_thaw(Rows *r) {
        r->frozen = false;
        for (size_t i = 0; i < r->nretired; i++)
                table_free(r->retired[i]);
        ps_free(r->retired);
        r->retired = NULL;
        r->nretired = 0;
}

void rows_adopt(Rows *r, Table *const *tables, Table *const *backups, size_t n, int64_t clock) {
        for (size_t i = 0; i < n && i < r->ntables; i++) {
                if (tables[i]) {
                        table_free(r->tables[i]);
                        r->tables[i] = tables[i];
                        table_log_gone(tables[i], table_stamped(tables[i]));
                }
                if (backups && backups[i]) {
                        table_free(r->backup[i]);
                        r->backup[i] = backups[i];
                }
                r->closed[i] = clock - 1;
        }
}
