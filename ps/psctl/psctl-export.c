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

/* Pulls every tensor of job under map into params; the values' clock. */
static int pull_all(uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, const NetKeyPair *keys,
                    unsigned timeout_s, float **params, int64_t *ret_clock) {
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
        StOut *out = ps_calloc(job.ntensors, sizeof *out);
        uint64_t(*shapes)[4] = ps_calloc(job.ntensors, sizeof *shapes);
        if (!d || !model || !params || !out || !shapes) {
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
                out[t] = (StOut) { .name = job.tensors[t].name, .ndim = job.tensors[t].ndim, .shape = shapes[t],
                                   .data = params[t] };
                bytes += job.tensors[t].numel * sizeof(float);
        }
        int64_t clock = 0;
        r = pull_all(loop, zctx, &job, map, keys, timeout_s, params, &clock);
        if (r < 0)
                goto out;
        char jobid[16], clk[24], acc[32];
        snprintf(jobid, sizeof jobid, "%u", job.id);
        snprintf(clk, sizeof clk, "%ld", (long) clock);
        snprintf(acc, sizeof acc, "%.6f", st->has_accuracy ? (double) st->accuracy : -1.0);
        const char *meta[] = { "format", "pt", "psnet.model", model, "psnet.model_name", job.model_name,
                               "psnet.job", jobid, "psnet.clock", clk, "psnet.accuracy", st->has_accuracy ? acc : "" };
        r = st_write(path, out, job.ntensors, meta, ELEMENTSOF(meta) / 2, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "psctl: cannot write the export: %s\n", err);
                goto out;
        }
        char nt[24];
        snprintf(nt, sizeof nt, "%zu", (size_t) job.ntensors);
        if (json)
                r = print_json_strings("file", path, "model", job.model_name, "clock", clk, "tensors", nt, NULL);
        else
                printf("exported %s: %zu tensors, %lu bytes of float32, model %s, clock %ld\n", path, (size_t) job.ntensors,
                       (unsigned long) bytes, job.model_name, (long) clock);
out:
        for (size_t t = 0; params && t < job.ntensors; t++)
                ps_free(params[t]);
        ps_free(params);
        ps_free(out);
        ps_free(shapes);
        ps_free(model);
        ps_free(d);
        shardmap_free(map);
        return r;
}
