/* Job options shared by pscoord and psctl; see job-flags.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "job-flags.h"

void jobflags_init(JobFlags *f) {
        Job d;
        job_defaults(&d);
        *f = (JobFlags) {
                .lr = d.optim.lr, .momentum = d.optim.momentum, .weight_decay = d.optim.weight_decay,
                .epochs = d.epochs, .batch = d.batch, .workers = 0, .shards = 0,
                .chunk_kb = d.chunk_floats * 4 / 1024, .seed = d.seed, .warmup_clocks = d.warmup_clocks,
        };
}

size_t jobflags_options(JobFlags *f, Option *o) {
        const Option t[JOBFLAGS_NOPTS] = {
                { "model", OPT_STR, &f->model, "SPEC", "model, e.g. mlp:784-256-10" },
                { "mode", OPT_STR, &f->mode, "MODE", "consistency: bsp, asp or ssp:S (default bsp)" },
                { "optim", OPT_STR, &f->optim, "NAME", "optimizer on the shards: sgd or adam (default sgd)" },
                { "lr", OPT_FLOAT, &f->lr, "RATE", "learning rate for one worker's batch (see --lr-scaling)" },
                { "momentum", OPT_FLOAT, &f->momentum, "MU", "SGD momentum" },
                { "weight-decay", OPT_FLOAT, &f->weight_decay, "WD", "L2 weight decay" },
                { "epochs", OPT_UINT, &f->epochs, "N", "passes over the training data by all workers together" },
                { "batch", OPT_UINT, &f->batch, "N", "mini-batch per worker" },
                { "workers", OPT_UINT, &f->workers, "N", "start when this many workers joined (0: 1)" },
                { "shards", OPT_UINT, &f->shards, "N", "start when this many shards joined (0: 1)" },
                { "data", OPT_STR, &f->data, "DIR", "directory of the Fashion-MNIST IDX files" },
                { "chunk-kb", OPT_UINT, &f->chunk_kb, "KIB", "tensor chunk (key) size" },
                { "seed", OPT_U64, &f->seed, "N", "seed of the initial weights and shuffling" },
                { "train-limit", OPT_UINT, &f->train_limit, "N", "use only the first N training images (0: all)" },
                { "test-limit", OPT_UINT, &f->test_limit, "N", "evaluate on the first N test images (0: all)" },
                { "lr-scaling", OPT_STR, &f->lr_scaling, "RULE",
                  "how lr follows the number of workers W, so that accuracy holds as workers are added: auto "
                  "(lr x W under BSP, x sqrt(W) under ASP/SSP and for Adam), linear, sqrt or none (default auto)" },
                { "warmup-clocks", OPT_UINT, &f->warmup_clocks, "N",
                  "lr ramps up from its 1-worker value over the first N clocks (with --lr-scaling)" },
                { "allow-nonfinite", OPT_BOOL, &f->allow_nonfinite, NULL,
                  "shards accept NaN/Inf gradients instead of refusing the push (skips a pass over every push; "
                  "for trusted workers only)" },
                { "replicas", OPT_UINT, &f->replicas, "R",
                  "copies of every chunk, each on its own shard: a push is acknowledged once every live copy "
                  "holds it, and a dead shard's backups take over (0: 2 with two shards or more, else 1)" },
        };
        memcpy(o, t, sizeof t);
        return JOBFLAGS_NOPTS;
}

int jobflags_to_job(const JobFlags *f, Job *job, char *err, size_t errlen) {
        job_defaults(job);
        job->id = 1;
        /* Chunking is computed when the model is set: the chunk size goes first. */
        if (f->chunk_kb == 0 || f->chunk_kb > 65536) {
                snprintf(err, errlen, "bad --chunk-kb %u (1..65536)", f->chunk_kb);
                return -EINVAL;
        }
        job->chunk_floats = f->chunk_kb * 1024u / 4u;
        char model[sizeof job->model];
        snprintf(model, sizeof model, "%s", job->model);
        if (job_set_model(job, model) < 0) {
                snprintf(err, errlen, "bad default model '%s'", job->model);
                return -EINVAL;
        }
        if (f->model && job_set_model(job, f->model) < 0) {
                snprintf(err, errlen, "bad --model '%s' (expected mlp:D0-D1-...-Dn, e.g. mlp:784-256-10)", f->model);
                return -EINVAL;
        }
        if (f->mode && job_set_mode(job, f->mode) < 0) {
                snprintf(err, errlen, "bad --mode '%s' (expected bsp, asp or ssp:S)", f->mode);
                return -EINVAL;
        }
        if (f->optim && job_set_optim(job, f->optim) < 0) {
                snprintf(err, errlen, "bad --optim '%s' (expected sgd or adam)", f->optim);
                return -EINVAL;
        }
        if (f->data)
                snprintf(job->dataset, sizeof job->dataset, "%s", f->data);
        job->optim.lr = f->lr;
        job->optim.momentum = f->momentum;
        job->optim.weight_decay = f->weight_decay;
        job->epochs = f->epochs;
        job->batch = f->batch;
        job->expect_workers = f->workers;
        job->expect_shards = f->shards;
        job->seed = f->seed;
        if (f->lr_scaling && lr_scaling_from_string(f->lr_scaling, &job->lr_scaling) < 0) {
                snprintf(err, errlen, "bad --lr-scaling '%s' (expected auto, linear, sqrt or none)", f->lr_scaling);
                return -EINVAL;
        }
        job->warmup_clocks = f->warmup_clocks;
        job->allow_nonfinite = f->allow_nonfinite;
        job->replicas = f->replicas;
        job->train_limit = f->train_limit;
        job->test_limit = f->test_limit;
        return job_validate(job, err, errlen);
}
