/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/psctl/psctl-print.c: psctl --json always prints valid JSON.
 * A status whose figures are NaN or infinite (a diverged loss) prints them as
 * null, strings with quotes and control characters are escaped, and the table
 * form prints every shard and worker. Output is captured from stdout and read
 * back with jansson, an independent parser. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "job.h"
#include "psctl.h"
#include "tap.h"
#include "wire-job.h"

/* Runs fn with stdout captured; returns what it printed (malloc'd). */
static char *capture(void (*fn)(void *), void *arg) {
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len), *saved = stdout;
        if (!mem)
                return NULL;
        fflush(stdout);
        stdout = mem;
        fn(arg);
        fflush(stdout);
        stdout = saved;
        fclose(mem);
        return buf;
}

typedef struct Ctx {
        Psnet__StatusRep *s;
        int r;
} Ctx;

static void run_json(void *a) {
        Ctx *c = a;
        c->r = print_status_json(c->s);
}

static void run_table(void *a) {
        print_status_table(((Ctx *) a)->s);
}

static void run_result(void *a) {
        ((Ctx *) a)->r = print_json_result("done", true, NAN);
}

int main(void) {
        Job job;
        Psnet__JobSpec *spec = NULL;
        job_defaults(&job);
        job.id = 3;
        if (job_to_proto(&job, &spec) < 0)
                return 2;
        Psnet__ShardInfo sh = PSNET__SHARD_INFO__INIT, *shp[1] = { &sh };
        Psnet__WorkerInfo wk = PSNET__WORKER_INFO__INIT, *wkp[1] = { &wk };
        sh.id = 1;
        sh.endpoint = (char *) "ipc:///tmp/\"odd\"\npath";
        sh.keys = 4;
        wk.id = 7;
        wk.loss = NAN;
        wk.samples_per_s = INFINITY;
        wk.steps_per_s = -INFINITY;
        Psnet__StatusRep s = PSNET__STATUS_REP__INIT;
        s.job = spec;
        s.job_state = PSNET__JOB_STATE__JOB_RUNNING;
        s.n_shards = 1;
        s.shards = shp;
        s.n_workers = 1;
        s.workers = wkp;
        s.has_accuracy = true;
        s.accuracy = NAN;
        s.coord_endpoint = (char *) "tcp://127.0.0.1:7000";
        Ctx c = { .s = &s };

        char *out = capture(run_json, &c);
        json_error_t err;
        json_t *j = out ? json_loads(out, 0, &err) : NULL;
        CHECK(c.r == 0 && j, "status with NaN and infinite figures is valid JSON (%s)", j ? "ok" : err.text);
        CHECK(out && !strstr(out, "nan") && !strstr(out, "inf"), "no nan or inf in the text");
        json_t *w = j ? json_array_get(json_object_get(j, "workers"), 0) : NULL;
        CHECK(w && json_is_null(json_object_get(w, "loss")) && json_is_null(json_object_get(w, "samples_per_s")) &&
              json_is_null(json_object_get(w, "steps_per_s")), "non-finite worker figures are null");
        CHECK(j && json_is_null(json_object_get(json_object_get(j, "job"), "accuracy")), "a NaN accuracy is null");
        json_t *ep = j ? json_object_get(json_array_get(json_object_get(j, "shards"), 0), "endpoint") : NULL;
        CHECK(ep && strcmp(json_string_value(ep), sh.endpoint) == 0, "quotes and newlines survive the round trip");
        CHECK(j && strcmp(json_string_value(json_object_get(json_object_get(j, "job"), "state")), "running") == 0 &&
              strcmp(json_string_value(json_object_get(json_object_get(j, "job"), "mode")), "bsp") == 0,
              "state and mode by name");
        json_decref(j);
        free(out);

        out = capture(run_result, &c);
        j = out ? json_loads(out, 0, &err) : NULL;
        CHECK(c.r == 0 && j && json_is_null(json_object_get(j, "accuracy")), "job wait --json with a NaN accuracy: null");
        json_decref(j);
        free(out);

        out = capture(run_table, &c);
        CHECK(out && strstr(out, "SHARD") && strstr(out, "WORKER") && strstr(out, "state=running"),
              "the table has both sections and the state");
        free(out);
        job_proto_free(spec);
        return tap_done();
}
