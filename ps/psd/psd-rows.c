/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-rows.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
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
        bool acked;             /* a part that did not complete the push: acknowledged when it came */
        uint64_t seq;
        int64_t *ids;
        float *g;
        size_t n;
        zmq_msg_t route;
} Parked;

/* The last clock each worker pushed a table at (ids grow as workers come). */
typedef struct LastPush {
        uint32_t worker;
        int64_t clock;          /* the last clock it pushed (a part of) */
        uint32_t parts;         /* that push's parts */
        uint64_t in;            /* the parts of it in (bit per part) */
        int64_t done;           /* the last clock whose every part is in */
} LastPush;

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
};

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

static void drop_tables(Rows *r) {
        for (size_t i = 0; i < r->ntables; i++) {
                for (size_t k = 0; k < r->nparked[i]; k++)
                        parked_free(&r->parked[i][k]); /* their workers ask again, or time out */
                ps_free(r->parked[i]);
                r->parked[i] = NULL;
                r->nparked[i] = 0;
                retire(r, r->tables[i]);
                r->tables[i] = NULL;
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
                if (e < 0) {
                        drop_tables(r);
                        if (why && n)
                                snprintf(why, n, "table %s: %s", job->tables[i].name,
                                         e == -ENOMEM ? "out of memory" : w);
                        return e;
                }
                r->closed[i] = -1;
                r->ntables = i + 1;
        }
        return 0;
}

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
        for (size_t k = 0; r->mode == MODE_BSP && k < r->nparked[h->table]; k++)
                if (r->parked[h->table][k].clock < h->clock) {
                        snprintf(reason, n, "table %s's clock %ld waits for other workers' pushes: ask again",
                                 r->conf[h->table].name, (long) r->parked[h->table][k].clock);
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
        a[r->nlast[i]] = (LastPush) { .worker = worker, .clock = -1, .done = -1 };
        return &a[r->nlast[i]++];
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
                        .parts = h->has_parts ? h->parts : 1, .acked = !completes, .seq = h->seq, .ids = *v,
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

int rows_push(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
              const zmq_msg_t *route, uint64_t room, char *reason, size_t n) {
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
        if (st == PSNET__STATUS__STATUS_OK)
                st = check_holder(map, self, h->table, v, count, reason, n);
        if (st == PSNET__STATUS__STATUS_OK && !(last = last_of(r, h->table, h->sender))) {
                snprintf(reason, n, "out of memory");
                st = PSNET__STATUS__STATUS_RESOURCE;
        }
        uint32_t parts = h->has_parts ? h->parts : 1, part = h->has_part ? h->part : 0;
        bool same = st == PSNET__STATUS__STATUS_OK && h->clock == last->clock;
        if (st == PSNET__STATUS__STATUS_OK &&
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
        /* The part that makes the push whole (every push not in parts). */
        uint64_t in = (same ? last->in : 0) | (uint64_t) 1 << part;
        bool completes = in == all_parts(parts);
        if (st == PSNET__STATUS__STATUS_OK && bsp)
                st = park(r, h, route, &v, &owned, count, completes, reason, n);
        else if (st == PSNET__STATUS__STATUS_OK && count > 0) {
                table_tick(t, h->clock);
                st = push_status(table_push(t, v, count, g, reason, n), c, reason, n);
        }
        if (st != PSNET__STATUS__STATUS_OK && st != ROWS_PARKED) {
                r->stats.refused++;
                return st;
        }
        last->clock = h->clock;
        last->parts = parts;
        last->in = in;
        if (completes)
                last->done = h->clock;
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
 * members: OK, or a status with the reason (nothing applied). */
static int apply_clock(Rows *r, size_t i, const Parked *p, size_t np, size_t nmembers, char *reason, size_t n) {
        const TableConf *c = &r->conf[i];
        size_t total = 0;
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
                st = push_status(table_push(r->tables[i], ids, nu, sum, reason, n), c, reason, n);
                if (st == PSNET__STATUS__STATUS_OK)
                        r->stats.pushed += nu;
        }
        ps_free(src);
        ps_free(ids);
        ps_free(sum);
        return st;
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
                        int st = apply_clock(r, i, p, np, nm, reason, sizeof reason);
                        if (st != PSNET__STATUS__STATUS_OK)
                                r->stats.refused++;
                        for (size_t k = 0; k < np; k++) {
                                if (r->hooks.ack && !p[k].acked)
                                        r->hooks.ack(r->hooks.ud, &p[k].route, p[k].seq, clock, st, reason);
                                parked_free(&p[k]);
                        }
                        memmove(p, p + np, (r->nparked[i] - np) * sizeof *p);
                        r->nparked[i] -= np;
                        r->closed[i] = clock;
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
        ret->rows = ret->bytes = 0;
        for (size_t i = 0; i < r->ntables; i++) {
                ret->rows += table_size(r->tables[i]);
                ret->bytes += table_memory(r->tables[i]);
        }
}

int rows_scan(Rows *r, const Psnet__Header *h, zmq_msg_t *ret, bool *ret_more, uint64_t *ret_next, char *reason,
              size_t n) {
        int st = known_table(r, h, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
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

void rows_adopt(Rows *r, Table *const *tables, size_t n, int64_t clock) {
        for (size_t i = 0; i < n && i < r->ntables; i++) {
                if (tables[i]) {
                        table_free(r->tables[i]);
                        r->tables[i] = tables[i];
                }
                r->closed[i] = clock - 1;
        }
}
