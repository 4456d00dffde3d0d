/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/job.c (model strings, chunking, deterministic
 * initialisation and its statistics, modes) and common/net/wire-job.c (the
 * job's wire form: round trip and refusals). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "job-flags.h"
#include "job.h"
#include "tap.h"
#include "wire-job.h"

static void test_defaults(void) {
        Job j;
        char err[128];

        job_defaults(&j);
        CHECK(strcmp(j.model, "mlp:784-256-10") == 0, "default model");
        CHECK(j.optim.kind == OPTIM_SGD && j.optim.lr == 0.02f && j.optim.momentum == 0.9f &&
              j.optim.weight_decay == 0.0f, "default optimizer sgd lr 0.02 momentum 0.9");
        CHECK(j.optim.beta1 == 0.9f && j.optim.beta2 == 0.999f && j.optim.eps == 1e-8f, "adam defaults");
        CHECK(j.mode == MODE_BSP && j.chunk_floats == JOB_DEFAULT_CHUNK_FLOATS && j.seed == 42 && j.batch == 64 &&
              j.epochs == 5, "mode, chunk, seed, batch, epochs");
        CHECK(strcmp(j.dataset, "/usr/share/datasets/fashion-mnist") == 0, "default dataset");
        CHECK(j.expect_workers == 0 && j.expect_shards == 0 && j.train_limit == 0 && j.test_limit == 0, "zeros");
        CHECK(j.lr_scaling == LR_SCALING_AUTO && j.warmup_clocks == JOB_DEFAULT_WARMUP_CLOCKS,
              "lr scales with the workers by default");
        CHECK(job_validate(&j, err, sizeof err) == 0, "defaults validate (%s)", err);
}

/* How lr follows the number of members: linear under BSP, square root under
 * ASP/SSP and for Adam (auto), ramped up over the warm-up clocks. */
static void test_lr_factor(void) {
        Job j;
        LrScaling l;
        job_defaults(&j);
        j.warmup_clocks = 0;
        CHECK(job_lr_factor(&j, MODE_BSP, 8, 0, -1.0f) == 8.0f && job_lr_factor(&j, MODE_BSP, 2, 500, -1.0f) == 2.0f,
              "auto, SGD, BSP: lr x W");
        CHECK_CLOSE(job_lr_factor(&j, MODE_ASP, 16, 0, -1.0f), 4.0f, 1e-6, "auto, SGD, ASP: lr x sqrt(W)");
        CHECK_CLOSE(job_lr_factor(&j, MODE_SSP, 9, 0, -1.0f), 3.0f, 1e-6, "auto, SGD, SSP: lr x sqrt(W)");
        CHECK(job_lr_factor(&j, MODE_BSP, 1, 0, -1.0f) == 1.0f && job_lr_factor(&j, MODE_ASP, 0, 0, -1.0f) == 1.0f,
              "one worker (or none): lr");
        j.warmup_clocks = 100;
        CHECK_CLOSE(job_lr_factor(&j, MODE_BSP, 8, 0, -1.0f), 1.07f, 1e-6, "warm-up: clock 0 takes 1/100 of the way (%g)",
                    (double) job_lr_factor(&j, MODE_BSP, 8, 0, -1.0f));
        CHECK_CLOSE(job_lr_factor(&j, MODE_BSP, 8, 49, -1.0f), 4.5f, 1e-6, "clock 49: half way from 1 to 8");
        CHECK(job_lr_factor(&j, MODE_BSP, 8, 99, -1.0f) == 8.0f && job_lr_factor(&j, MODE_BSP, 8, 100000, -1.0f) == 8.0f, "then W");
        CHECK(job_lr_factor(&j, MODE_BSP, 8, -3, -1.0f) == 1.0f, "a negative clock: no ramp yet");
        j.warmup_clocks = 0;
        j.lr_scaling = LR_SCALING_LINEAR;
        CHECK(job_lr_factor(&j, MODE_ASP, 8, 5, -1.0f) == 8.0f, "linear: x W under ASP too");
        j.lr_scaling = LR_SCALING_SQRT;
        CHECK_CLOSE(job_lr_factor(&j, MODE_BSP, 4, 5, -1.0f), 2.0f, 1e-6, "sqrt: x sqrt(W) under BSP too");
        CHECK(job_set_optim(&j, "adam") == 0, "adam");
        j.lr_scaling = LR_SCALING_AUTO;
        CHECK_CLOSE(job_lr_factor(&j, MODE_BSP, 16, 7, -1.0f), 4.0f, 1e-6, "auto, Adam, BSP: lr x sqrt(W)");
        j.lr_scaling = LR_SCALING_NONE;
        CHECK(job_lr_factor(&j, MODE_BSP, 16, 7, -1.0f) == 1.0f, "none: lr as given");
        CHECK(lr_scaling_from_string("sqrt", &l) == 0 && l == LR_SCALING_SQRT &&
              lr_scaling_from_string("auto", &l) == 0 && l == LR_SCALING_AUTO &&
              lr_scaling_from_string("Linear", &l) == -EINVAL && strcmp(lr_scaling_name(LR_SCALING_NONE), "none") == 0,
              "names");
}

/* --lr-schedule cosine: (1 + cos(pi p)) / 2 of the job's progress p, on top of
 * the members' factor; no progress known, or constant: no change. */
static void test_lr_schedule(void) {
        Job j;
        LrSchedule l;
        job_defaults(&j);
        j.warmup_clocks = 0;
        CHECK(job_lr_factor(&j, MODE_BSP, 2, 10, 0.5f) == 2.0f, "constant: progress changes nothing");
        j.lr_schedule = LR_SCHEDULE_COSINE;
        CHECK(job_lr_factor(&j, MODE_BSP, 2, 0, 0.0f) == 2.0f, "cosine at the start: the members' factor (%g)",
              (double) job_lr_factor(&j, MODE_BSP, 2, 0, 0.0f));
        CHECK_CLOSE(job_lr_factor(&j, MODE_BSP, 2, 10, 0.5f), 1.0f, 1e-6, "half way: half the rate");
        CHECK_CLOSE(job_lr_factor(&j, MODE_BSP, 1, 10, 0.25f), 0.8535534f, 1e-6, "a quarter: (1 + cos(pi/4)) / 2");
        CHECK_CLOSE(job_lr_factor(&j, MODE_ASP, 4, 10, 0.75f), 2.0f * 0.1464466f, 1e-6,
                    "three quarters, ASP with 4 members: sqrt(4) x (1 + cos(3 pi/4)) / 2");
        CHECK(job_lr_factor(&j, MODE_BSP, 1, 10, 1.0f) < 1e-7f && job_lr_factor(&j, MODE_BSP, 1, 10, 7.0f) < 1e-7f,
              "at the end and past it: 0");
        CHECK(job_lr_factor(&j, MODE_BSP, 2, 10, -1.0f) == 2.0f && job_lr_factor(&j, MODE_BSP, 2, 10, NAN) == 2.0f,
              "no progress known: not scheduled");
        float prev = 2.0f;
        bool falls = true;
        for (int k = 1; k <= 100; k++) {
                float f = job_lr_factor(&j, MODE_BSP, 2, k, (float) k / 100.0f);
                falls = falls && f < prev;
                prev = f;
        }
        CHECK(falls, "falls at every step of the job");
        CHECK(lr_schedule_from_string("cosine", &l) == 0 && l == LR_SCHEDULE_COSINE &&
              lr_schedule_from_string("constant", &l) == 0 && l == LR_SCHEDULE_CONSTANT &&
              lr_schedule_from_string("step", &l) == -EINVAL &&
              strcmp(lr_schedule_name(LR_SCHEDULE_COSINE), "cosine") == 0,
              "names");
}

/* The job flags pscoord and psctl job submit share: the lr rule, the warm-up
 * and the finite check, and a bad rule refused with the reason. */
static void test_flags(void) {
        JobFlags f;
        Option o[JOBFLAGS_NOPTS];
        Job j;
        char err[192] = "";
        const ProgramInfo prog = { .name = "t" };
        char *argv[] = { "t", "--lr-scaling", "sqrt", "--warmup-clocks", "7", "--allow-nonfinite", "--lr-schedule",
                         "cosine", "--wire", "bf16", "--sparsify", "0.05", NULL };
        int optind_ = 0;
        jobflags_init(&f);
        size_t n = jobflags_options(&f, o);
        CHECK(n == JOBFLAGS_NOPTS && config_parse(&prog, o, n, 12, argv, &optind_) == 0, "job flags parse");
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.lr_scaling == LR_SCALING_SQRT &&
              j.warmup_clocks == 7 && j.allow_nonfinite && j.lr_schedule == LR_SCHEDULE_COSINE &&
              j.wire == JOB_WIRE_BF16 && j.sparsify == 0.05f,
              "--lr-scaling sqrt --warmup-clocks 7 --allow-nonfinite --lr-schedule cosine --wire bf16 --sparsify 0.05 "
              "(%s)", err);
        config_free_strings(o, n);
        jobflags_init(&f);
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.lr_scaling == LR_SCALING_AUTO && !j.allow_nonfinite &&
              j.warmup_clocks == JOB_DEFAULT_WARMUP_CLOCKS && j.lr_schedule == LR_SCHEDULE_CONSTANT &&
                      j.wire == JOB_WIRE_F32 && j.sparsify == 0.0f,
              "defaults: auto, constant, f32, dense pushes, the checks on");
        const float bad_norm[] = { -1.0f, NAN, INFINITY };
        for (size_t b = 0; b < 3; b++) {
                f.max_grad_norm = bad_norm[b];
                CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--max-grad-norm"),
                      "--max-grad-norm %g is refused: %s", (double) bad_norm[b], err);
        }
        f.max_grad_norm = 5.0f;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.max_grad_norm == 5.0f, "--max-grad-norm 5 (%s)", err);
        f.max_grad_norm = 0.0f;
        const float bad_sparsify[] = { -0.1f, 1.5f, NAN };
        for (size_t b = 0; b < 3; b++) {
                f.sparsify = bad_sparsify[b];
                CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "0 < F <= 1"),
                      "--sparsify %g is refused: %s", (double) bad_sparsify[b], err);
        }
        f.sparsify = 0.1f;
        f.mode = "fed";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--compress topk:F"),
              "--sparsify on a federated job is refused, naming --compress: %s", err);
        f.sparsify = 0.0f;
        f.mode = NULL;
        f.lr_scaling = "fast";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "bad --lr-scaling 'fast'"),
              "a bad rule is refused: %s", err);
        f.lr_scaling = NULL;
        f.lr_schedule = "linear";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL &&
                      strstr(err, "bad --lr-schedule 'linear' (expected constant or cosine)"),
              "a bad schedule is refused: %s", err);
        f.lr_schedule = NULL;
        f.wire = "fp16";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL &&
                      strstr(err, "bad --wire 'fp16' (expected f32 or bf16)"),
              "a wire dtype other than f32 and bf16 is refused: %s", err);
        f.wire = "bf16";
        f.mode = "fed";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--compress bf16"),
              "--wire bf16 on a federated job is refused, naming --compress: %s", err);
}

/* Differential privacy flags: parsed, checked, carried by the job spec. */
static void test_dp_flags(void) {
        JobFlags f;
        Option o[JOBFLAGS_NOPTS];
        Job j, back;
        char err[192] = "";
        const ProgramInfo prog = { .name = "t" };
        char *argv[] = { "t", "--mode", "fed", "--dp-clip", "1.5", "--dp-noise", "0.8", "--dp-delta", "1e-6", NULL };
        int optind_ = 0;
        jobflags_init(&f);
        size_t n = jobflags_options(&f, o);
        CHECK(config_parse(&prog, o, n, 9, argv, &optind_) == 0 && jobflags_to_job(&f, &j, err, sizeof err) == 0 &&
              j.fed.strategy.dp_clip == 1.5f && j.fed.strategy.dp_noise == 0.8f && j.fed.dp_delta == 1e-6f,
              "--dp-clip 1.5 --dp-noise 0.8 --dp-delta 1e-6 (%s)", err);
        Psnet__JobSpec *spec = NULL;
        CHECK(job_to_proto(&j, &spec) == 0 && job_from_proto(spec, &back, err, sizeof err) == 0 &&
              back.fed.strategy.dp_clip == 1.5f && back.fed.strategy.dp_noise == 0.8f && back.fed.dp_delta == 1e-6f,
              "the job spec carries them (%s)", err);
        job_proto_free(spec);
        f.dp_clip = 0;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--dp-clip"),
              "noise without a clip norm: refused (%s)", err);
        f.dp_clip = 1, f.dp_delta = 1;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "dp_delta"),
              "delta 1: refused (%s)", err);
        config_free_strings(o, n);
        jobflags_init(&f);
        f.dp_clip = 1;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "federated"),
              "--dp-clip on a bsp job: refused (%s)", err);
}

/* --tables: parsed into the job, checked against it, carried by its wire
 * form, each shard's seed derived from the job's. */
static void test_tables(void) {
        JobFlags f;
        Option o[JOBFLAGS_NOPTS];
        Job j, back;
        char err[192] = "";
        const ProgramInfo prog = { .name = "t" };
        char *argv[] = { "t", "--mode", "asp", "--replicas", "1", "--tables", "ad:1:ftrl:l1=2,emb:16:adam:lr=0.01",
                         NULL };
        int optind_ = 0;
        jobflags_init(&f);
        size_t n = jobflags_options(&f, o);
        CHECK(config_parse(&prog, o, n, 7, argv, &optind_) == 0 && jobflags_to_job(&f, &j, err, sizeof err) == 0 &&
                      j.ntables == 2 && j.tables[0].optim == TABLE_FTRL && j.tables[0].l1 == 2.0f &&
                      j.tables[1].dim == 16 && j.tables[1].lr == 0.01f,
              "--tables ad:1:ftrl:l1=2,emb:16:adam:lr=0.01 (%s)", err);
        CHECK(job_table_find(&j, "emb") == 1 && job_table_find(&j, "x") == -ENOENT, "tables found by name");
        Psnet__JobSpec *spec = NULL;
        int r = job_to_proto(&j, &spec);
        CHECK(r == 0 && job_from_proto(spec, &back, err, sizeof err) == 0 && back.ntables == 2 &&
                      memcmp(back.tables, j.tables, 2 * sizeof *j.tables) == 0,
              "the job spec carries the tables (%s)", err);
        if (spec) {
                free(spec->tables);
                spec->tables = strdup("emb:0");
                CHECK(job_from_proto(spec, &back, err, sizeof err) == -EINVAL && strstr(err, "table emb: dim"),
                      "a spec with a bad table is refused: %s", err);
        }
        job_proto_free(spec);
        TableConf a, b, c;
        job_table_conf(&j, 0, &a);
        job_table_conf(&j, 1, &b);
        j.seed = 7;
        job_table_conf(&j, 0, &c);
        CHECK(a.seed != b.seed && a.seed != c.seed && a.l1 == 2.0f, "each table's seed from the job's and its place");
        snprintf(j.tables[1].name, sizeof j.tables[1].name, "%.60s", j.tensors[0].name);
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "has a tensor's name"),
              "a table named as a tensor is refused: %s", err);
        config_free_strings(o, n);
        jobflags_init(&f);
        f.mode = "fed";
        f.tables = "emb:8";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--tables is for training jobs"),
              "tables in a federated job are refused: %s", err);
        f.mode = NULL;
        f.replicas = 1;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.mode == MODE_BSP, "tables under bsp (%s)", err);
        f.mode = "ssp:2";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.mode == MODE_SSP, "tables under ssp (%s)", err);
        f.mode = "asp";
        f.replicas = 0;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.replicas == 0,
              "tables without --replicas: pscoord's default (%s)", err);
        f.replicas = 2;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.replicas == 2,
              "tables on two copies under asp (%s)", err);
        f.replicas = 0;
        f.tables = NULL;
        f.model = "lr:4";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.click && j.ntables == 1 &&
                      strcmp(j.tables[0].name, "ids") == 0 && j.tables[0].dim == 1 && j.in_numel == 4 &&
                      j.ntensors == 2 && j.tensors[0].numel == 4 && j.tensors[1].numel == 1,
              "lr:4 gets its table (ids:1:ftrl) and a Linear(4, 1) (%s)", err);
        f.tables = "w:2";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "row of 1 float per id") &&
                      strstr(err, "NAME:1"),
              "lr:4 with a table of dim 2 is refused, saying why: %s", err);
        f.tables = "w:1:sgd:lr=0.5";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.tables[0].optim == TABLE_SGD,
              "lr:4 with its own table of dim 1 (%s)", err);
        f.tables = NULL;
        f.model = "dlrm:3:4-8:6-1";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.click && j.click_dim == 8 && j.click_fields == 3 &&
                      j.ntables == 1 && strcmp(j.tables[0].name, "ids") == 0 && j.tables[0].dim == 8 &&
                      j.tables[0].optim == TABLE_ADAGRAD && j.in_numel == 4 && j.ntensors == 6 &&
                      j.tensors[2].numel == 6 * (8 + 6) && strcmp(j.tensors[2].name, "top.0.weight") == 0,
              "dlrm:3:4-8:6-1 gets a table of dim 8 and its MLPs' tensors (%s)", err);
        f.tables = "emb:4";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "row of 8 floats per id") &&
                      strstr(err, "ids:8:adagrad"),
              "dlrm with a table of another dim is refused, saying what it takes: %s", err);
        f.tables = "emb:8:adam,more:8";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "or one per field (3)"),
              "dlrm of 3 fields with two tables is refused, saying what it takes: %s", err);
        f.tables = "f0:8,f1:8:adam,f2:8:sgd";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.ntables == 3,
              "dlrm of 3 fields with a table per field (%s)", err);
        f.tables = "f0:8,f1:8,f2:4";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "row of 8 floats"),
              "a table per field, one of another dim: refused (%s)", err);
        f.tables = "emb:8:adam:lr=0.01";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.tables[0].optim == TABLE_ADAM,
              "dlrm with its own table of dim 8 (%s)", err);
        f.tables = "w:1:sgd:lr=0.5";
        f.model = "lr:0";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "lr:D"),
              "lr:0 is refused, saying what lr:D takes: %s", err);
        f.model = NULL;
        f.tables = "emb:8";
        f.tables = "emb:8:lamb";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "optimizer 'lamb'"),
              "a bad --tables is refused naming the table's field: %s", err);
}

static void test_secagg_flags(void) {
        JobFlags f;
        Option o[JOBFLAGS_NOPTS];
        Job j, back;
        char err[192] = "";
        const ProgramInfo prog = { .name = "t" };
        char *argv[] = { "t", "--mode", "fed", "--secagg", "--secagg-clip", "2.5", "--secagg-threshold", "0.75",
                         "--secagg-timeout", "7", NULL };
        int optind_ = 0;
        jobflags_init(&f);
        size_t n = jobflags_options(&f, o);
        CHECK(config_parse(&prog, o, n, 10, argv, &optind_) == 0 && jobflags_to_job(&f, &j, err, sizeof err) == 0 &&
              j.fed.secagg && j.fed.secagg_clip == 2.5f && j.fed.secagg_threshold == 0.75f &&
              j.fed.secagg_timeout_ms == 7000, "--secagg --secagg-clip 2.5 --secagg-threshold 0.75 --secagg-timeout 7 "
              "(%s)", err);
        Psnet__JobSpec *spec = NULL;
        CHECK(job_to_proto(&j, &spec) == 0 && job_from_proto(spec, &back, err, sizeof err) == 0 && back.fed.secagg &&
              back.fed.secagg_clip == 2.5f && back.fed.secagg_threshold == 0.75f && back.fed.secagg_timeout_ms == 7000,
              "the job spec carries them (%s)", err);
        job_proto_free(spec);
        f.strategy = "median";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "median"),
              "--secagg with a robust strategy: refused (%s)", err);
        f.strategy = NULL;
        f.min_clients = 1;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "at least 2 clients"),
              "--secagg with --min-clients 1: refused (%s)", err);
        f.min_clients = 2, f.secagg_clip = 0;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "secagg clip"),
              "--secagg-clip 0: refused (%s)", err);
        f.secagg_clip = 1, f.secagg_threshold = 1.5f;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "secagg threshold"),
              "--secagg-threshold 1.5: refused (%s)", err);
        f.secagg_threshold = 0.5f;
        f.compress = "int8";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--compress int8"),
              "--secagg with --compress: refused (%s)", err);
        f.compress = NULL;
        config_free_strings(o, n);
        jobflags_init(&f);
        f.mode = "fed";
        f.compress = "topk:0.25";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.fed.compress == COMPRESS_TOPK && j.fed.topk == 0.25f &&
              job_to_proto(&j, &spec) == 0 && job_from_proto(spec, &back, err, sizeof err) == 0 &&
              back.fed.compress == COMPRESS_TOPK && back.fed.topk == 0.25f, "--compress topk:0.25 travels (%s)", err);
        job_proto_free(spec);
        f.compress = "zstd";
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "--compress"),
              "--compress zstd: refused (%s)", err);
        f.compress = NULL;
        f.mode = "fedasync";
        f.buffer = 7;
        f.staleness_exp = 1;
        char ms[16];
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == 0 && j.mode == MODE_FED && j.fed.async &&
              j.fed.buffer == 7 && j.fed.staleness_exp == 1 && job_to_proto(&j, &spec) == 0 &&
              job_from_proto(spec, &back, err, sizeof err) == 0 && back.fed.async && back.fed.buffer == 7 &&
              strcmp(job_mode_string(&back, ms, sizeof ms), "fedasync") == 0,
              "--mode fedasync --buffer 7 --staleness-exp 1 travels (%s)", err);
        job_proto_free(spec);
        f.dp_clip = 1;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "fedasync"),
              "fedasync with --dp-clip: refused (%s)", err);
        f.dp_clip = 0, f.buffer = 0;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "buffer 0"),
              "--buffer 0: refused (%s)", err);
        jobflags_init(&f);
        f.secagg = true;
        CHECK(jobflags_to_job(&f, &j, err, sizeof err) == -EINVAL && strstr(err, "federated"),
              "--secagg on a bsp job: refused (%s)", err);
}

static void test_model(void) {
        Job j;
        int r;

        job_defaults(&j);
        r = job_set_model(&j, "mlp:784-256-128-10");
        CHECK(r == 0, "3-layer model parses");
        CHECK(j.in_numel == 784 && j.classes == 10 && strcmp(j.model_name, "mlp:784-256-128-10") == 0,
              "784 inputs, 10 classes");
        CHECK(j.ntensors == 6, "6 tensors (%zu)", j.ntensors);
        CHECK(strcmp(j.tensors[0].name, "0.weight") == 0 && j.tensors[0].ndim == 2 && j.tensors[0].shape[0] == 256 &&
              j.tensors[0].shape[1] == 784 && j.tensors[0].numel == 256u * 784u, "0.weight is [256 x 784]");
        CHECK(j.tensors[0].init == INIT_HE && j.tensors[0].fan_in == 784 && j.tensors[0].fan_out == 256,
              "0.weight he init, fan_in 784, fan_out 256");
        CHECK(strcmp(j.tensors[1].name, "0.bias") == 0 && j.tensors[1].ndim == 1 && j.tensors[1].shape[0] == 256 &&
              j.tensors[1].numel == 256 && j.tensors[1].init == INIT_ZEROS, "0.bias is [256], zeros");
        CHECK(strcmp(j.tensors[4].name, "4.weight") == 0 && j.tensors[4].shape[0] == 10 && j.tensors[4].shape[1] == 128 &&
              j.tensors[4].fan_in == 128, "4.weight (after two linear+relu pairs) is [10 x 128]");
        CHECK(strcmp(j.tensors[5].name, "4.bias") == 0 && j.tensors[5].numel == 10, "4.bias is [10]");

        CHECK(job_set_model(&j, "mlp:1-1") == 0 && j.ntensors == 2, "smallest model");
        CHECK(job_set_model(&j, "mlp:65536-2") == 0 && j.tensors[0].numel == 131072, "widest width accepted");
        CHECK(job_set_model(&j, "mlp:1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16") == 0 && j.ntensors == 30,
              "16 widths accepted");

        static const char *const bad[] = {
                "", "mlp:", "mlp:784", "cnn:784-10", "mlp:784-", "mlp:-784-10", "mlp:784--10", "mlp:784-0-10",
                "mlp:65537-10", "mlp:784-a-10", "mlp:784-10 ", "mlp: 784-10", "mlp:+784-10", "MLP:784-10",
                "mlp:1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16-17", "mlp:99999999999999999999-1",
        };
        job_defaults(&j);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                r = job_set_model(&j, bad[i]);
                CHECK(r == -EINVAL, "model \"%s\" refused (%d)", bad[i], r);
        }
        CHECK(strcmp(j.model, "mlp:784-256-10") == 0 && j.ntensors == 4, "refused models leave the job untouched");
        CHECK(job_set_model(&j, NULL) == -EINVAL, "NULL model refused");

        CHECK(job_set_mode(&j, "asp") == 0 && j.mode == MODE_ASP, "mode asp");
        CHECK(job_set_mode(&j, "bsp") == 0 && j.mode == MODE_BSP, "mode bsp");
        CHECK(job_set_mode(&j, "ssp") == -EINVAL && j.mode == MODE_BSP, "unknown mode refused");
        j.optim.lr = 0.01f;
        CHECK(job_set_optim(&j, "adam") == 0 && j.optim.kind == OPTIM_ADAM && j.optim.lr == 0.01f,
              "optimizer adam keeps lr");
        CHECK(job_set_optim(&j, "rmsprop") == -EINVAL && j.optim.kind == OPTIM_ADAM,
              "unknown optimizer refused");
        char buf[32];
        CHECK(job_set_mode(&j, "ssp:7") == 0 && j.mode == MODE_SSP && j.staleness == 7 &&
              strcmp(job_mode_string(&j, buf, sizeof buf), "ssp:7") == 0, "mode ssp:7 and its name");
        CHECK(job_set_mode(&j, "ssp:2x") == -EINVAL && job_set_mode(&j, "ssp:") == -EINVAL &&
              job_set_mode(&j, "ssp:1000001") == -EINVAL && j.mode == MODE_SSP && j.staleness == 7,
              "bad staleness refused, mode untouched");
        CHECK(strcmp(optim_kind_name(OPTIM_ADAM), "adam") == 0 && strcmp(tensor_init_name(INIT_XAVIER), "xavier") == 0 &&
              strcmp(job_state_name(JOB_FAILED), "failed") == 0 && job_state_final(JOB_STOPPED) &&
              !job_state_final(JOB_RUNNING), "enum names");
}

static void test_chunks(void) {
        Job j;
        uint64_t keys = 0, floats = 0;

        job_defaults(&j);
        j.chunk_floats = 1000;
        CHECK(job_set_model(&j, "mlp:784-256-10") == 0, "model with 1000-float chunks");
        /* W0: 200704 = 200 * 1000 + 704; b0: 256; W1: 2560; b1: 10. */
        CHECK(j.tensors[0].nchunks == 201 && j.tensors[1].nchunks == 1 && j.tensors[2].nchunks == 3 &&
              j.tensors[3].nchunks == 1, "chunk counts 201, 1, 3, 1");
        CHECK(job_chunk_len(&j, 0, 0) == 1000 && job_chunk_len(&j, 0, 199) == 1000, "full chunks");
        CHECK(job_chunk_len(&j, 0, 200) == 704, "last chunk shorter (%u)", job_chunk_len(&j, 0, 200));
        CHECK(job_chunk_len(&j, 0, 201) == 0, "past the last chunk: 0");
        CHECK(job_chunk_len(&j, 2, 2) == 560 && job_chunk_len(&j, 3, 0) == 10, "W1 tail 560, b1 10");
        CHECK(job_chunk_len(&j, 4, 0) == 0, "past the last tensor: 0");
        for (uint32_t t = 0; t < j.ntensors; t++)
                for (uint32_t c = 0; c < j.tensors[t].nchunks; c++) {
                        keys++;
                        floats += job_chunk_len(&j, t, c);
                }
        CHECK(job_nkeys(&j) == 206 && keys == 206, "job_nkeys 206 (%llu)", (unsigned long long) job_nkeys(&j));
        CHECK(job_nfloats(&j) == 203530 && floats == 203530, "job_nfloats = 784*256+256+256*10+10 = sum of chunks");

        job_defaults(&j);
        CHECK(job_nkeys(&j) == 4, "1 MiB chunks: one key per tensor of the default model");

        /* Changing chunk_floats without rebuilding the tensors is caught. */
        {
                char err[160];
                j.chunk_floats = 1000;
                CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "chunks"),
                      "stale chunk counts refused: %s", err);
        }
}

static void test_init(void) {
        Job j;
        float *a, *b, *whole;
        const uint32_t cf = 4096;
        uint32_t len, nchunks;
        bool same = true, differs = false, zeros = true, bounded = true;
        double sum = 0, sum2 = 0;
        uint64_t n;

        job_defaults(&j);
        j.chunk_floats = cf;
        if (job_set_model(&j, "mlp:784-256-10") < 0) {
                CHECK(false, "model");
                return;
        }
        n = j.tensors[0].numel;
        nchunks = j.tensors[0].nchunks;
        a = malloc(cf * sizeof *a);
        b = malloc(cf * sizeof *b);
        whole = malloc(n * sizeof *whole);
        if (!a || !b || !whole) {
                fprintf(stderr, "out of memory\n");
                exit(2);
        }

        /* Same chunk twice, and chunks computed in reverse order. */
        len = job_chunk_len(&j, 0, 5);
        job_init_chunk(&j, 0, 5, a);
        job_init_chunk(&j, 0, 5, b);
        CHECK(memcmp(a, b, len * sizeof *a) == 0, "same (seed, t, c) gives the same values");
        for (uint32_t c = nchunks; c-- > 0;)
                job_init_chunk(&j, 0, c, whole + (uint64_t) c * cf);
        CHECK(memcmp(whole + 5 * cf, a, len * sizeof *a) == 0, "values do not depend on the order chunks are made in");
        job_init_chunk(&j, 0, 6, b);
        CHECK(memcmp(a, b, len * sizeof *a) != 0, "different chunks differ");

        /* Another chunk size gives the same tensor (values keyed by element). */
        {
                Job k = j;
                k.chunk_floats = 1000;
                if (job_set_model(&k, k.model) == 0) {
                        float *part = malloc(1000 * sizeof *part);
                        for (uint32_t c = 0; part && c < k.tensors[0].nchunks; c++) {
                                uint32_t l = job_chunk_len(&k, 0, c);
                                job_init_chunk(&k, 0, c, part);
                                if (memcmp(part, whole + (uint64_t) c * 1000, l * sizeof *part) != 0)
                                        same = false;
                        }
                        free(part);
                        CHECK(part && same, "the tensor's values do not depend on chunk_floats");
                }
        }

        /* Another seed changes them. */
        {
                Job k = j;
                k.seed = 43;
                job_init_chunk(&k, 0, 5, b);
                CHECK(memcmp(a, b, len * sizeof *a) != 0, "another seed, other values");
        }

        /* He: mean 0, std sqrt(2 / fan_in) over 200704 values. */
        for (uint64_t i = 0; i < n; i++) {
                sum += whole[i];
                sum2 += (double) whole[i] * whole[i];
        }
        {
                double mean = sum / (double) n, std = sqrt(sum2 / (double) n - mean * mean);
                double want = sqrt(2.0 / 784.0);
                printf("# he: mean %.5f std %.5f (want 0, %.5f)\n", mean, std, want);
                CHECK(fabs(mean) < 0.01 * want, "he mean ~ 0 (%g, within 1%% of the std)", mean);
                CHECK_CLOSE(std, want, 0.01, "he std %g ~ sqrt(2/784) = %g (1%%)", std, want);
        }
        /* Fraction within one std: 68.3% for a normal. */
        {
                double s = sqrt(2.0 / 784.0);
                uint64_t in = 0;
                for (uint64_t i = 0; i < n; i++)
                        in += fabs(whole[i]) < s;
                CHECK_CLOSE((double) in / (double) n, 0.6827, 0.01, "he values look normal: %.4f within 1 std",
                            (double) in / (double) n);
        }

        /* Biases: zeros. */
        for (uint32_t i = 0; i < 256; i++)
                b[i] = 1.0f;
        job_init_chunk(&j, 1, 0, b);
        for (uint32_t i = 0; i < 256; i++)
                zeros = zeros && b[i] == 0.0f;
        CHECK(zeros, "biases start at zero");

        /* Xavier: uniform(-a, a), a = sqrt(6 / (fan_in + fan_out)), variance a^2 / 3. */
        {
                double bound = sqrt(6.0 / (784.0 + 256.0)), m2 = 0;
                j.tensors[0].init = INIT_XAVIER;
                for (uint32_t c = 0; c < nchunks; c++)
                        job_init_chunk(&j, 0, c, whole + (uint64_t) c * cf);
                for (uint64_t i = 0; i < n; i++) {
                        bounded = bounded && fabs(whole[i]) <= bound;
                        m2 += (double) whole[i] * whole[i];
                        differs = differs || whole[i] != whole[0];
                }
                CHECK(bounded && differs, "xavier values within +-%g", bound);
                CHECK_CLOSE(sqrt(m2 / (double) n), bound / sqrt(3.0), 0.01, "xavier std ~ a/sqrt(3)");
        }
        free(a);
        free(b);
        free(whole);
}

static bool jobs_equal(const Job *x, const Job *y) {
        if (x->id != y->id || strcmp(x->model, y->model) != 0 || x->ntensors != y->ntensors ||
            x->in_numel != y->in_numel || x->classes != y->classes || strcmp(x->model_name, y->model_name) != 0)
                return false;
        for (size_t i = 0; i < x->ntensors; i++) {
                const JobTensor *a = &x->tensors[i], *b = &y->tensors[i];
                if (strcmp(a->name, b->name) != 0 || a->ndim != b->ndim ||
                    memcmp(a->shape, b->shape, sizeof a->shape) != 0 || a->numel != b->numel ||
                    a->init != b->init || a->nchunks != b->nchunks || a->fan_in != b->fan_in ||
                    a->fan_out != b->fan_out)
                        return false;
        }
        return x->optim.kind == y->optim.kind && x->optim.lr == y->optim.lr &&
               x->optim.momentum == y->optim.momentum && x->optim.weight_decay == y->optim.weight_decay &&
               x->optim.beta1 == y->optim.beta1 && x->optim.beta2 == y->optim.beta2 && x->optim.eps == y->optim.eps &&
               x->optim.nesterov == y->optim.nesterov && x->mode == y->mode && x->staleness == y->staleness &&
               x->lr_scaling == y->lr_scaling && x->warmup_clocks == y->warmup_clocks &&
               x->lr_schedule == y->lr_schedule && x->wire == y->wire && x->sparsify == y->sparsify &&
               x->allow_nonfinite == y->allow_nonfinite && x->max_grad_norm == y->max_grad_norm &&
               x->chunk_floats == y->chunk_floats &&
               x->seed == y->seed && x->batch == y->batch && x->epochs == y->epochs &&
               strcmp(x->dataset, y->dataset) == 0 && x->expect_workers == y->expect_workers &&
               x->expect_shards == y->expect_shards && x->train_limit == y->train_limit &&
               x->test_limit == y->test_limit;
}

static void test_proto(void) {
        Job j, back;
        Psnet__JobSpec *spec = NULL, *unpacked;
        uint8_t *buf;
        size_t len;
        char err[160];
        int r;

        job_defaults(&j);
        j.id = 9;
        j.chunk_floats = 5000;
        CHECK(job_set_model(&j, "mlp:100-50-20-3") == 0, "model");
        CHECK(job_set_optim(&j, "adam") == 0 && job_set_mode(&j, "ssp:4") == 0, "adam, ssp:4");
        j.lr_scaling = LR_SCALING_SQRT;
        j.warmup_clocks = 77;
        j.lr_schedule = LR_SCHEDULE_COSINE;
        j.wire = JOB_WIRE_BF16;
        j.sparsify = 0.25f;
        j.allow_nonfinite = true;
        j.max_grad_norm = 12.5f;
        j.optim.lr = 0.001f;
        j.optim.nesterov = true;
        j.optim.weight_decay = 0.01f;
        j.optim.beta2 = 0.99f;
        j.seed = UINT64_C(0xfedcba9876543210);
        j.batch = 32;
        j.epochs = 3;
        snprintf(j.dataset, sizeof j.dataset, "/data/fmnist");
        j.expect_workers = 4;
        j.expect_shards = 2;
        j.train_limit = 1000;
        j.test_limit = 200;
        j.tensors[2].init = INIT_XAVIER;

        r = job_to_proto(&j, &spec);
        CHECK(r == 0 && spec, "job_to_proto (%d)", r);
        if (!spec)
                return;
        CHECK(spec->n_tensors == 6 && strcmp(spec->tensors[0]->name, "0.weight") == 0 && spec->tensors[0]->n_shape == 2 &&
              spec->tensors[0]->shape[0] == 50 && spec->tensors[0]->shape[1] == 100, "tensor specs");
        CHECK(spec->mode->mode == PSNET__MODE__MODE_SSP && spec->mode->staleness == 4 &&
              spec->optim->kind == PSNET__OPTIM_KIND__OPTIM_ADAM && spec->tensors[2]->init == PSNET__INIT__INIT_XAVIER,
              "mode, optimizer and init as enums");

        /* Through bytes, as on the wire. */
        len = psnet__job_spec__get_packed_size(spec);
        buf = malloc(len);
        if (!buf)
                exit(2);
        psnet__job_spec__pack(spec, buf);
        job_proto_free(spec);
        unpacked = psnet__job_spec__unpack(NULL, len, buf);
        free(buf);
        CHECK(unpacked != NULL, "packed spec unpacks");
        if (!unpacked)
                return;
        r = job_from_proto(unpacked, &back, err, sizeof err);
        CHECK(r == 0, "job_from_proto (%s)", err);
        CHECK(r == 0 && jobs_equal(&j, &back), "round trip gives the same job");

        /* Refusals: each spoils one field of a good spec. */
        {
                Psnet__JobSpec *s = unpacked;
                Job untouched;
                memset(&untouched, 0x5a, sizeof untouched);
#define REFUSE(what, mutate, restore)                                                      \
        do {                                                                               \
                mutate;                                                                    \
                Job out = untouched;                                                       \
                r = job_from_proto(s, &out, err, sizeof err);                              \
                CHECK(r == -EINVAL && err[0] && memcmp(&out, &untouched, sizeof out) == 0, \
                      "refused: %s (%s)", what, err);                                      \
                restore;                                                                   \
        } while (0)
                char *saved_str;
                uint32_t saved_u;
                float saved_f;
                size_t saved_n;

                saved_str = s->model;
                REFUSE("bad model", s->model = (char *) "mlp:100", s->model = saved_str);
                REFUSE("model not matching tensors", s->model = (char *) "mlp:100-50-20-4", s->model = saved_str);
                Psnet__Mode saved_m = s->mode->mode;
                REFUSE("mode 9", s->mode->mode = (Psnet__Mode) 9, s->mode->mode = saved_m);
                saved_u = s->mode->staleness;
                REFUSE("staleness 10^7", s->mode->staleness = 10000000, s->mode->staleness = saved_u);
                Psnet__ModeSpec *saved_ms = s->mode;
                REFUSE("no mode", s->mode = NULL, s->mode = saved_ms);
                Psnet__OptimKind saved_k = s->optim->kind;
                REFUSE("optimizer 7", s->optim->kind = (Psnet__OptimKind) 7, s->optim->kind = saved_k);
                saved_u = s->chunk_floats;
                REFUSE("chunk_floats 0", s->chunk_floats = 0, s->chunk_floats = saved_u);
                REFUSE("chunk_floats 64Mi+1", s->chunk_floats = 64u * 1024 * 1024 + 1, s->chunk_floats = saved_u);
                saved_u = s->batch;
                REFUSE("batch 0", s->batch = 0, s->batch = saved_u);
                saved_u = s->epochs;
                REFUSE("epochs 0", s->epochs = 0, s->epochs = saved_u);
                saved_f = s->optim->lr;
                REFUSE("lr 0", s->optim->lr = 0, s->optim->lr = saved_f);
                REFUSE("lr nan", s->optim->lr = NAN, s->optim->lr = saved_f);
                saved_f = s->optim->momentum;
                REFUSE("momentum 1", s->optim->momentum = 1, s->optim->momentum = saved_f);
                saved_f = s->optim->eps;
                REFUSE("eps 0", s->optim->eps = 0, s->optim->eps = saved_f);
                saved_n = s->n_tensors;
                REFUSE("one tensor missing", s->n_tensors = saved_n - 1, s->n_tensors = saved_n);
                REFUSE("65 tensors", s->n_tensors = 65, s->n_tensors = saved_n);
                saved_str = s->tensors[1]->name;
                REFUSE("tensor renamed", s->tensors[1]->name = (char *) "bias", s->tensors[1]->name = saved_str);
                saved_u = s->tensors[0]->shape[0];
                REFUSE("tensor reshaped", s->tensors[0]->shape[0] = 51, s->tensors[0]->shape[0] = saved_u);
                saved_n = s->tensors[0]->n_shape;
                REFUSE("tensor rank", s->tensors[0]->n_shape = 1, s->tensors[0]->n_shape = saved_n);
                Psnet__Init saved_i = s->tensors[0]->init;
                REFUSE("unknown init", s->tensors[0]->init = (Psnet__Init) 5, s->tensors[0]->init = saved_i);
                saved_str = s->dataset;
                REFUSE("empty dataset", s->dataset = (char *) "", s->dataset = saved_str);
                {
                        static char longpath[300];
                        memset(longpath, 'd', sizeof longpath - 1);
                        REFUSE("dataset too long", s->dataset = longpath, s->dataset = saved_str);
                }
                REFUSE("no dataset", s->dataset = NULL, s->dataset = saved_str);
                Psnet__OptimSpec *saved_o = s->optim;
                REFUSE("no optimizer", s->optim = NULL, s->optim = saved_o);
                CHECK(job_from_proto(NULL, &back, err, sizeof err) == -EINVAL, "NULL spec refused");
                r = job_from_proto(s, &back, NULL, 0);
                CHECK(r == 0, "restored spec accepted again, NULL err buffer allowed");
#undef REFUSE
        }
        psnet__job_spec__free_unpacked(unpacked, NULL);

        /* job_to_proto refuses an invalid job. */
        j.batch = 0;
        spec = NULL;
        CHECK(job_to_proto(&j, &spec) == -EINVAL && spec == NULL, "job_to_proto refuses an invalid job");
        job_proto_free(NULL);
}

static void test_validate(void) {
        Job j;
        char err[160];

        job_defaults(&j);
        j.optim.weight_decay = -1;
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "weight_decay"), "negative wd: %s", err);
        job_defaults(&j);
        j.optim.beta2 = 1.0f;
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "beta2"), "beta2 1: %s", err);
        job_defaults(&j);
        j.mode = (ConsistencyMode) 7;
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "mode"), "bad mode: %s", err);
        job_defaults(&j);
        j.expect_workers = 1u << 20;
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL, "absurd expect_workers: %s", err);
        job_defaults(&j);
        j.tensors[0].numel++;
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "0.weight"), "numel not matching shape: %s", err);
        job_defaults(&j);
        j.chunk_floats = 0;
        CHECK(job_validate(&j, err, sizeof err) == -EINVAL && strstr(err, "chunk_floats"), "chunk 0: %s", err);
        CHECK(job_set_model(&j, "mlp:2-2") == -EINVAL, "job_set_model needs a valid chunk_floats");
}

int main(void) {
        test_defaults();
        test_lr_factor();
        test_lr_schedule();
        test_flags();
        test_dp_flags();
        test_tables();
        test_secagg_flags();
        test_model();
        test_chunks();
        test_init();
        test_proto();
        test_validate();
        return tap_done();
}
