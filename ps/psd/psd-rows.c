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

/* The last clock each worker pushed a table at (ids grow as workers come). */
typedef struct LastPush {
        uint32_t worker;
        int64_t clock;
} LastPush;

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
        RowsStats stats;
};

int rows_new(Rows **ret) {
        Rows *r = ps_calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        *ret = r;
        return 0;
}

static void drop_tables(Rows *r) {
        for (size_t i = 0; i < r->ntables; i++) {
                r->tables[i] = table_free(r->tables[i]);
                ps_free(r->last[i]);
                r->last[i] = NULL;
                r->nlast[i] = 0;
        }
        r->ntables = 0;
}

Rows *rows_free(Rows *r) {
        if (r) {
                drop_tables(r);
                ps_free(r);
        }
        return NULL;
}

int rows_configure(Rows *r, const Job *job, char *why, size_t n) {
        r->allow_nonfinite = job->allow_nonfinite;
        r->max_grad_norm = job->max_grad_norm;
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
                                snprintf(why, n, "table %s: %s", job->tables[i].name, e == -ENOMEM ? "out of memory" : w);
                        return e;
                }
                r->ntables = i + 1;
        }
        return 0;
}

/* The table a message names, and its ids copied out of the frame (any
 * alignment, as ZeroMQ hands frames): OK, or a status with the reason. */
static int request_table(Rows *r, const Psnet__Header *h, const zmq_msg_t *ids, Table **ret_t, int64_t **ret_ids,
                         size_t *ret_n, char *reason, size_t n) {
        if (h->table >= r->ntables) {
                snprintf(reason, n, "table %u is not one of the job's %zu tables", h->table, r->ntables);
                return PSNET__STATUS__STATUS_UNKNOWN_KEY;
        }
        size_t count = zmq_msg_size((zmq_msg_t *) ids) / sizeof(int64_t);
        int64_t *v = ps_malloc(count * sizeof *v);
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
        size_t dim = r->conf[h->table].dim;
        _cleanup_free_ float *out = ps_malloc(count * dim * sizeof *out);
        if (!out || zmq_msg_init_size(ret, count * dim * sizeof *out) < 0) {
                snprintf(reason, n, "out of memory for %zu rows", count);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        int e = table_pull(t, v, count, false, out, reason, n); /* creates nothing: cannot fail */
        if (e < 0) {
                zmq_msg_close(ret);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        memcpy(zmq_msg_data(ret), out, count * dim * sizeof *out);
        r->stats.pulled += count;
        return PSNET__STATUS__STATUS_OK;
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
        a[r->nlast[i]] = (LastPush) { .worker = worker, .clock = -1 };
        return &a[r->nlast[i]++];
}

int rows_push(Rows *r, const ShardMap *map, uint32_t self, const Psnet__Header *h, const zmq_msg_t *frames,
              uint64_t room, char *reason, size_t n) {
        Table *t;
        _cleanup_free_ int64_t *v = NULL;
        _cleanup_free_ float *g = NULL;
        size_t count;
        int st = request_table(r, h, &frames[0], &t, &v, &count, reason, n);
        const TableConf *c = st == PSNET__STATUS__STATUS_OK ? &r->conf[h->table] : NULL;
        size_t gb = zmq_msg_size((zmq_msg_t *) &frames[1]);
        LastPush *last = NULL;
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
        if (st == PSNET__STATUS__STATUS_OK && h->clock <= last->clock)
                return PSNET__STATUS__STATUS_DUPLICATE;
        if (st == PSNET__STATUS__STATUS_OK && last->clock >= 0 && h->clock > last->clock + 2) {
                snprintf(reason, n, "clock %ld is more than 2 past worker %u's last push of table %s (%ld)",
                         (long) h->clock, h->sender, c->name, (long) last->clock);
                st = PSNET__STATUS__STATUS_INVALID;
        }
        if (st == PSNET__STATUS__STATUS_OK && !(g = ps_malloc(gb))) {
                snprintf(reason, n, "out of memory for %zu bytes of gradients", gb);
                st = PSNET__STATUS__STATUS_RESOURCE;
        }
        if (st == PSNET__STATUS__STATUS_OK) {
                memcpy(g, zmq_msg_data((zmq_msg_t *) &frames[1]), gb);
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
        if (st == PSNET__STATUS__STATUS_OK) {
                int e = table_push(t, v, count, g, reason, n);
                st = e == 0 ? PSNET__STATUS__STATUS_OK
                   : e == -EINVAL ? PSNET__STATUS__STATUS_INVALID
                                  : PSNET__STATUS__STATUS_RESOURCE;
                if (e == -ENOMEM)
                        snprintf(reason, n, "out of memory for the rows of table %s", c->name);
        }
        if (st != PSNET__STATUS__STATUS_OK) {
                r->stats.refused++;
                return st;
        }
        last->clock = h->clock;
        r->stats.pushed += count;
        return PSNET__STATUS__STATUS_OK;
}

void rows_table_stats(const Rows *r, size_t i, uint64_t *ret_rows, uint64_t *ret_bytes) {
        *ret_rows = i < r->ntables ? table_size(r->tables[i]) : 0;
        *ret_bytes = i < r->ntables ? table_memory(r->tables[i]) : 0;
}

void rows_stats(const Rows *r, RowsStats *ret) {
        *ret = r->stats;
        ret->rows = ret->bytes = 0;
        for (size_t i = 0; i < r->ntables; i++) {
                ret->rows += table_size(r->tables[i]);
                ret->bytes += table_memory(r->tables[i]);
        }
}
