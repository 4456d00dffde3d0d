/* SPDX-License-Identifier: Apache-2.0 */
/* psctl export: the job's values, pulled from the shards as they are now
 * through libpsnet's client (the map from pscoord's status; an operator's key
 * may read, never push), written as a safetensors file with PyTorch's
 * state_dict names and layouts, and the model's description in the metadata
 * (common/safetensors.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>
#include "alloc.h"
#include "client.h"
#include "macro.h"
#include "modeldesc.h"
#include "psctl.h"
#include "safetensors.h"
#include "wire-job.h"

typedef struct Pull {
        bool done;
        int r;
        int64_t clock;
} Pull;

static void on_pulled(Client *cl, int r, int64_t clock, void *ud) {
        Pull *p = ud;
        (void) cl;
        p->done = true;
        p->r = r;
        p->clock = clock;
}

/* A table's rows as they come from the shards' scans. */
typedef struct TableRows {
        int64_t *ids;
        float *values;
        size_t n, cap;
        uint32_t dim;
        uint64_t shape_ids[1], shape_values[2];
        bool done;              /* the scan ended, with r */
        int r;
} TableRows;

static int on_page(Client *cl, const void *ids, const void *values, size_t n, void *ud) {
        TableRows *t = ud;
        (void) cl;
        if (t->n + n > t->cap) {
                size_t cap = MAX(t->cap * 2, t->n + n);
                int64_t *i = ps_realloc(t->ids, cap * sizeof *i);
                if (i)
                        t->ids = i;
                float *v = i ? ps_realloc(t->values, cap * t->dim * sizeof *v) : NULL;
                if (!v)
                        return -ENOMEM;
                t->values = v;
                t->cap = cap;
        }
        memcpy(t->ids + t->n, ids, n * sizeof *t->ids);
        memcpy(t->values + t->n * t->dim, values, n * t->dim * sizeof *t->values);
        t->n += n;
        return 0;
}

static void on_scanned(Client *cl, int r, void *ud) {
        TableRows *t = ud;
        (void) cl;
        t->done = true;
        t->r = r;
}

/* Pulls every tensor of job under map into params (the values' clock), and
 * every row of each of its tables into rows[]. */
static int pull_all(uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, const NetKeyPair *keys,
                    unsigned timeout_s, float **params, TableRows *rows, int64_t *ret_clock) {
        Client *cl = NULL;
        int r = client_new(loop, zctx, job, map, 0, keys, NULL, &cl);
        if (r < 0) {
                fprintf(stderr, "psctl: cannot connect to the shards: %s\n", strerror(-r));
                return r;
        }
        client_set_timeout(cl, timeout_s * 1000u);
        Pull p = { 0 };
        r = client_round(cl, NULL, 0, params, 0, on_pulled, &p);
        while (r == 0 && !p.done)
                uv_run(loop, UV_RUN_ONCE);
        if (r == 0)
                r = p.r;
        for (size_t i = 0; r == 0 && i < job->ntables; i++) {
                rows[i].dim = job->tables[i].dim;
                r = client_rows_scan(cl, (uint32_t) i, on_page, on_scanned, &rows[i]);
                while (r == 0 && !rows[i].done)
                        uv_run(loop, UV_RUN_ONCE);
                if (r == 0)
                        r = rows[i].r;
        }
        client_free(cl);
        /* The client's sockets close on the loop. */
        uv_run(loop, UV_RUN_NOWAIT);
        if (r == -EAGAIN)
                fprintf(stderr, "psctl: the shard map changed during the export (a shard moved or failed over): "
                                "run it again\n");
        else if (r < 0)
                fprintf(stderr, "psctl: pulling the values failed: %s (the shards' logs say more)\n", strerror(-r));
        *ret_clock = p.clock;
        return r;
}

int psctl_export(uv_loop_t *loop, void *zctx, const NetKeyPair *keys, unsigned timeout_s, const Psnet__StatusRep *st,
                 const char *path, bool json) {
        char err[512];
        Job job;
        ShardMap *map = NULL;
        if (!st->job || !st->map || st->job_state == PSNET__JOB_STATE__JOB_WAITING) {
                fprintf(stderr, "psctl: no job is running or done: nothing to export\n");
                return -ENOENT;
        }
        int r = job_from_proto(st->job, &job, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "psctl: pscoord's job does not validate: %s\n", err);
                return r;
        }
        ModelDesc *d = ps_calloc(1, sizeof *d);
        char *model = ps_malloc(16384);
        float **params = ps_calloc(job.ntensors, sizeof *params);
        /* A table's rows first (its ids, int64, 8-byte aligned before any
         * float32 data), then the tensors. */
        size_t nt = 2 * job.ntables, nout = nt + job.ntensors;
        StOut *out = ps_calloc(nout, sizeof *out);
        TableRows *rows = ps_calloc(MAX(job.ntables, (size_t) 1), sizeof *rows);
        char (*names)[TABLE_MAX_NAME + 8] = ps_calloc(MAX(nt, (size_t) 1), sizeof *names);
        uint64_t(*shapes)[4] = ps_calloc(job.ntensors, sizeof *shapes);
        if (!d || !model || !params || !out || !shapes || !rows || !names) {
                r = -ENOMEM;
                fprintf(stderr, "psctl: out of memory\n");
                goto out;
        }
        r = modeldesc_parse(job.model, d, err, sizeof err);
        if (r == 0)
                r = modeldesc_json(d, model, 16384);
        if (r < 0) {
                fprintf(stderr, "psctl: the job's model %s: %s\n", job.model_name, r == -ENOSPC ? "too long" : err);
                goto out;
        }
        r = shardmap_from_proto(st->map, &map);
        if (r < 0) {
                fprintf(stderr, "psctl: pscoord's shard map does not validate: %s\n", strerror(-r));
                goto out;
        }
        uint64_t bytes = 0;
        for (size_t t = 0; t < job.ntensors; t++) {
                params[t] = ps_malloc(MAX(job.tensors[t].numel, (uint64_t) 1) * sizeof(float));
                if (!params[t]) {
                        r = -ENOMEM;
                        fprintf(stderr, "psctl: out of memory (%lu values)\n", (unsigned long) job.tensors[t].numel);
                        goto out;
                }
                for (unsigned k = 0; k < job.tensors[t].ndim; k++)
                        shapes[t][k] = job.tensors[t].shape[k];
                out[nt + t] = (StOut) { .name = job.tensors[t].name, .ndim = job.tensors[t].ndim,
                                        .shape = shapes[t], .data = params[t] };
                bytes += job.tensors[t].numel * sizeof(float);
        }
        for (size_t i = 0; i < job.ntables; i++) {
                snprintf(names[2 * i], sizeof names[0], "%s.ids", job.tables[i].name);
                snprintf(names[2 * i + 1], sizeof names[0], "%s.rows", job.tables[i].name);
                for (size_t t = 0; t < job.ntensors; t++)
                        if (!strcmp(job.tensors[t].name, names[2 * i]) || !strcmp(job.tensors[t].name, names[2 * i + 1])) {
                                fprintf(stderr, "psctl: table %s's rows would be written under tensor %s's name\n",
                                        job.tables[i].name, job.tensors[t].name);
                                r = -EEXIST;
                                goto out;
                        }
        }
        int64_t clock = 0;
        r = pull_all(loop, zctx, &job, map, keys, timeout_s, params, rows, &clock);
        if (r < 0)
                goto out;
        uint64_t nrows = 0;
        for (size_t i = 0; i < job.ntables; i++) {
                TableRows *tr = &rows[i];
                tr->shape_ids[0] = tr->shape_values[0] = tr->n;
                tr->shape_values[1] = tr->dim;
                out[i] = (StOut) { .name = names[2 * i], .ndim = 1, .shape = tr->shape_ids, .data = tr->ids,
                                   .i64 = true };
                out[job.ntables + i] = (StOut) { .name = names[2 * i + 1], .ndim = 2, .shape = tr->shape_values,
                                                 .data = tr->values };
                nrows += tr->n;
        }
        char jobid[16], clk[24], acc[32];
        snprintf(jobid, sizeof jobid, "%u", job.id);
        snprintf(clk, sizeof clk, "%ld", (long) clock);
        snprintf(acc, sizeof acc, "%.6f", st->has_accuracy ? (double) st->accuracy : -1.0);
        /* The tables' text (as --tables reads it), so that a reader knows their optimizers. */
        char tables[JOB_MAX_TABLES * 512] = "";
        (void) tables_format(job.tables, job.ntables, tables, sizeof tables);
        const char *meta[] = { "format", "pt", "psnet.model", model, "psnet.model_name", job.model_name,
                               "psnet.job", jobid, "psnet.clock", clk, "psnet.accuracy", st->has_accuracy ? acc : "",
                               "psnet.tables", tables };
        r = st_write(path, out, nout, meta, ELEMENTSOF(meta) / 2, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "psctl: cannot write the export: %s\n", err);
                goto out;
        }
        char ntens[24], nrow[24];
        snprintf(ntens, sizeof ntens, "%zu", (size_t) job.ntensors);
        snprintf(nrow, sizeof nrow, "%lu", (unsigned long) nrows);
        if (json)
                r = print_json_strings("file", path, "model", job.model_name, "clock", clk, "tensors", ntens,
                                       "table_rows", nrow, NULL);
        else {
                printf("exported %s: %zu tensors, %lu bytes of float32, model %s, clock %ld", path,
                       (size_t) job.ntensors, (unsigned long) bytes, job.model_name, (long) clock);
                if (job.ntables)
                        printf("; %zu tables, %lu rows (NAME.ids int64, NAME.rows float32)", job.ntables,
                               (unsigned long) nrows);
                printf("\n");
        }
out:
        for (size_t t = 0; params && t < job.ntensors; t++)
                ps_free(params[t]);
        ps_free(params);
        for (size_t i = 0; rows && i < job.ntables; i++) {
                ps_free(rows[i].ids);
                ps_free(rows[i].values);
        }
        ps_free(rows);
        ps_free(names);
        ps_free(out);
        ps_free(shapes);
        ps_free(model);
        ps_free(d);
        shardmap_free(map);
        return r;
}
