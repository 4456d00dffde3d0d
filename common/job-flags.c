/* SPDX-License-Identifier: Apache-2.0 */
/* Job options shared by pscoord and psctl; see job-flags.h. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "job-flags.h"

void jobflags_init(JobFlags *f) {
        Job d;
        job_defaults(&d);
        *f = (JobFlags) {
                .lr = d.optim.lr, .momentum = d.optim.momentum, .weight_decay = d.optim.weight_decay,
                .epochs = d.epochs, .batch = d.batch, .workers = 0, .shards = 0,
                .chunk_kb = d.chunk_floats * 4 / 1024, .seed = d.seed, .warmup_clocks = d.warmup_clocks,
                .server_lr = -1, .server_momentum = -1, .tau = -1, .trim = -1, .byzantine = -1, .fraction = d.fed.fraction,
                .prox_mu = d.fed.prox_mu, .rounds = d.fed.rounds, .min_clients = d.fed.min_clients,
                .min_available = d.fed.min_available, .round_timeout = d.fed.round_timeout_ms / 1000,
                .local_epochs = d.fed.local_epochs, .dp_delta = d.fed.dp_delta,
                .secagg_clip = d.fed.secagg_clip, .secagg_threshold = d.fed.secagg_threshold,
                .secagg_timeout = d.fed.secagg_timeout_ms / 1000, .buffer = d.fed.buffer,
                .staleness_exp = d.fed.staleness_exp,
        };
}

size_t jobflags_options(JobFlags *f, Option *o) {
        const Option t[JOBFLAGS_NOPTS] = {
                { "model", OPT_STR, &f->model, "MODEL",
                  "mlp:D0-D1-...-Dn (e.g. mlp:784-256-10), cnn, vit, a click model lr:D or dlrm:F:BOT:TOP "
                  "(docs/tables.md), or a JSON file describing the layers (docs/models.md)" },
                { "mode", OPT_STR, &f->mode, "MODE",
                  "consistency: bsp, asp or ssp:S (default bsp); fed: federated rounds of edge workers; fedasync: "
                  "federated without rounds, the shards applying each --buffer of updates as they come" },
                { "optim", OPT_STR, &f->optim, "NAME", "optimizer on the shards: sgd or adam (default sgd)" },
                { "lr", OPT_FLOAT, &f->lr, "RATE", "learning rate for one worker's batch (see --lr-scaling)" },
                { "momentum", OPT_FLOAT, &f->momentum, "MU", "SGD momentum" },
                { "weight-decay", OPT_FLOAT, &f->weight_decay, "WD", "L2 weight decay" },
                { "epochs", OPT_UINT, &f->epochs, "N", "passes over the training data by all workers together" },
                { "batch", OPT_UINT, &f->batch, "N", "mini-batch per worker" },
                { "workers", OPT_UINT, &f->workers, "N", "start when this many workers joined (0: 1)" },
                { "shards", OPT_UINT, &f->shards, "N", "start when this many shards joined (0: 1)" },
                { "data", OPT_STR, &f->data, "DIR",
                  "directory of the data set: IDX files as Fashion-MNIST's, or NumPy x_train.npy, y_train.npy, "
                  "x_test.npy, y_test.npy (docs/data.md)" },
                { "chunk-kb", OPT_UINT, &f->chunk_kb, "KIB", "tensor chunk (key) size" },
                { "seed", OPT_U64, &f->seed, "N", "seed of the initial weights and shuffling" },
                { "init", OPT_STR, &f->init, "FILE",
                  "start from the values of this safetensors file (psctl export's, or a PyTorch state_dict "
                  "saved as safetensors) instead of random ones; pscoord and every shard read it" },
                { "train-limit", OPT_UINT, &f->train_limit, "N", "use only the first N training images (0: all)" },
                { "test-limit", OPT_UINT, &f->test_limit, "N", "evaluate on the first N test images (0: all)" },
                { "lr-scaling", OPT_STR, &f->lr_scaling, "RULE",
                  "how lr follows the number of workers W, so that accuracy holds as workers are added: auto "
                  "(lr x W under BSP, x sqrt(W) under ASP/SSP and for Adam), linear, sqrt or none (default auto)" },
                { "warmup-clocks", OPT_UINT, &f->warmup_clocks, "N",
                  "lr ramps up from its 1-worker value over the first N clocks (with --lr-scaling)" },
                { "lr-schedule", OPT_STR, &f->lr_schedule, "SCHEDULE",
                  "lr over the job: constant, or cosine (from lr at the start down to 0 at the last clock, "
                  "following the share of the job's samples trained) (default constant)" },
                { "wire", OPT_STR, &f->wire, "DTYPE",
                  "what workers push and pull: f32, or bf16 (half the bytes; the shards keep f32 values and "
                  "optimizer state) (default f32)" },
                { "sparsify", OPT_FLOAT, &f->sparsify, "F",
                  "workers push only the largest F of each chunk's gradients (0 < F <= 1; as index and value), "
                  "keeping the rest to add to their next push (error feedback); pulls stay dense (default: off)" },
                { "allow-nonfinite", OPT_BOOL, &f->allow_nonfinite, NULL,
                  "shards accept NaN/Inf gradients instead of refusing the push (skips a pass over every push; "
                  "for trusted workers only)" },
                { "max-grad-norm", OPT_FLOAT, &f->max_grad_norm, "N",
                  "shards refuse a push whose gradients there have an L2 norm above N (counted in "
                  "psnet_psd_refused_total{reason=\"grad_norm\"}): a bound on what one faulty or hostile worker "
                  "can do to the model in one push (default 0: none)" },
                { "tables", OPT_STR, &f->tables, "SPEC",
                  "sparse tables beside the model's tensors, rows keyed by 64-bit ids and placed on the shards by "
                  "the id: NAME:DIM[:OPTIM][:KEY=VALUE]... separated by ',', OPTIM sgd, adagrad (default), adam or "
                  "ftrl, KEY lr, eps, beta1, beta2, beta, l1, l2, init, max-rows, admit, ttl, cache, cache-rows "
                  "(docs/tables.md)" },
                { "replicas", OPT_UINT, &f->replicas, "R",
                  "copies of every chunk, each on its own shard: a push is acknowledged once every live copy "
                  "holds it, and a dead shard's backups take over (0: 2 with two shards or more, else 1; 1 for a job "
                  "with tables)" },
                { "rounds", OPT_UINT, &f->rounds, "N", "fed: aggregated rounds the job runs (default 20)" },
                { "fraction", OPT_FLOAT, &f->fraction, "F",
                  "fed: share of the connected edge workers sampled each round (default 1)" },
                { "min-clients", OPT_UINT, &f->min_clients, "N",
                  "fed: a round samples at least N clients and counts only with N updates, else it runs "
                  "again with a fresh sample (default 2)" },
                { "min-available", OPT_UINT, &f->min_available, "N",
                  "fed: rounds start once N edge workers are connected (default 2)" },
                { "round-timeout", OPT_UINT, &f->round_timeout, "SECONDS",
                  "fed: a round closes with the updates that arrived this long after it opened (default 60)" },
                { "local-epochs", OPT_UINT, &f->local_epochs, "N",
                  "fed: passes over its own data each client trains per round (batch --batch, lr --lr)" },
                { "strategy", OPT_STR, &f->strategy, "NAME",
                  "fed: aggregation on the shards: fedavg (default), fedavgm, fedadagrad, fedadam, fedyogi, "
                  "median, trimmed-mean, krum, multi-krum; custom: the user's, run by a strategy process "
                  "(psnet.fed.start_strategy)" },
                { "server-lr", OPT_FLOAT, &f->server_lr, "ETA", "fed: the server's lr (default: the strategy's)" },
                { "server-momentum", OPT_FLOAT, &f->server_momentum, "BETA",
                  "fedavgm: the server's momentum (default 0.9)" },
                { "tau", OPT_FLOAT, &f->tau, "TAU", "fedadagrad/fedadam/fedyogi: adaptivity (default: the strategy's)" },
                { "trim", OPT_FLOAT, &f->trim, "BETA",
                  "trimmed-mean: share of the updates dropped at each end of every coordinate (default 0.1)" },
                { "byzantine", OPT_FLOAT, &f->byzantine, "F",
                  "krum, multi-krum: share of a round's updates assumed bad (f = floor(F n); multi-krum keeps "
                  "n - f) (default 0.2)" },
                { "prox-mu", OPT_FLOAT, &f->prox_mu, "MU",
                  "fed: FedProx, clients add MU (w - w_round) to their gradients (default 0: FedAvg's clients)" },
                { "dp-clip", OPT_FLOAT, &f->dp_clip, "C",
                  "fed: differential privacy: each client clips its update to L2 norm C and the shards average "
                  "the updates unweighted, refusing any above C (default 0: off)" },
                { "dp-noise", OPT_FLOAT, &f->dp_noise, "Z",
                  "fed: Gaussian noise of std Z x C added by the shards to the sum of each round (needs --dp-clip); "
                  "the privacy spent is reported as epsilon" },
                { "dp-delta", OPT_FLOAT, &f->dp_delta, "D", "fed: the delta of the epsilon reported (default 1e-5)" },
                { "secagg", OPT_BOOL, &f->secagg, NULL,
                  "fed: secure aggregation: clients mask their updates with pairwise masks that cancel in the sum "
                  "(X25519, Shamir shares for clients that drop), so no shard sees one client's update" },
                { "secagg-clip", OPT_FLOAT, &f->secagg_clip, "B",
                  "fed, --secagg: each coordinate of an update is clamped to +-B before it is quantised to 32-bit "
                  "integers (default 8; the rounding error is at most clients x B / 2^32)" },
                { "secagg-threshold", OPT_FLOAT, &f->secagg_threshold, "F",
                  "fed, --secagg: share of a round's clients (at least 2) that must stay to the end for its sum "
                  "to be recovered (default 0.5)" },
                { "compress", OPT_STR, &f->compress, "CODEC",
                  "fed: how clients send their updates: none (f32, default), bf16, int8 (with a scale per chunk) "
                  "or topk:F (the largest F of each chunk's values, the rest kept on the client for the next "
                  "round); the bytes sent are reported" },
                { "buffer", OPT_UINT, &f->buffer, "K",
                  "fedasync: the shards apply the updates each K that come (default 10)" },
                { "staleness-exp", OPT_FLOAT, &f->staleness_exp, "A",
                  "fedasync: an update trained on the model of s aggregations ago weighs (1 + s)^-A times its "
                  "examples (default 0.5)" },
                { "eval-every", OPT_UINT, &f->eval_every, "N",
                  "fed: every N aggregated rounds one edge worker tests the model on its test set and the accuracy "
                  "joins the round history (default 0: the final model only)" },
                { "fraction-evaluate", OPT_FLOAT, &f->fraction_evaluate, "F",
                  "fed: after each round this share of the connected clients test its model on their own data; "
                  "the accuracy and loss, weighted by their examples, join the round history (default 0: none)" },
                { "secagg-timeout", OPT_UINT, &f->secagg_timeout, "SECONDS",
                  "fed, --secagg: how long each exchange of keys, shares and unmasking waits for clients "
                  "(default 10)" },
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
        if (f->model) {
                char why[300];
                int r = modeldesc_resolve(f->model, model, sizeof model, why, sizeof why);
                if (r >= 0)
                        r = job_set_model_why(job, model, why, sizeof why);
                if (r < 0) {
                        snprintf(err, errlen, "bad --model: %s", why);
                        return -EINVAL;
                }
        }
        if (f->mode && job_set_mode(job, f->mode) < 0) {
                snprintf(err, errlen, "bad --mode '%s' (expected bsp, asp, ssp:S, fed or fedasync)", f->mode);
                return -EINVAL;
        }
        if (f->optim && job_set_optim(job, f->optim) < 0) {
                snprintf(err, errlen, "bad --optim '%s' (expected sgd or adam)", f->optim);
                return -EINVAL;
        }
        if (f->data)
                snprintf(job->dataset, sizeof job->dataset, "%s", f->data);
        if (f->init && f->init[0]) {
                /* Absolute: pscoord and the shards read it from their own working directories. */
                char cwd[PATH_MAX];
                int n = f->init[0] == '/' ? snprintf(job->init, sizeof job->init, "%s", f->init)
                      : getcwd(cwd, sizeof cwd) ? snprintf(job->init, sizeof job->init, "%s/%s", cwd, f->init)
                                                : -1;
                if (n < 0 || (size_t) n >= sizeof job->init) {
                        snprintf(err, errlen, "bad --init '%s': give an absolute path of at most %zu bytes", f->init,
                                 sizeof job->init - 1);
                        return -EINVAL;
                }
        }
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
        if (f->lr_schedule && lr_schedule_from_string(f->lr_schedule, &job->lr_schedule) < 0) {
                snprintf(err, errlen, "bad --lr-schedule '%s' (expected constant or cosine)", f->lr_schedule);
                return -EINVAL;
        }
        job->warmup_clocks = f->warmup_clocks;
        if (f->wire && strcmp(f->wire, "f32") != 0 && strcmp(f->wire, "bf16") != 0) {
                snprintf(err, errlen, "bad --wire '%s' (expected f32 or bf16)", f->wire);
                return -EINVAL;
        }
        job->wire = f->wire && strcmp(f->wire, "bf16") == 0 ? JOB_WIRE_BF16 : JOB_WIRE_F32;
        job->sparsify = f->sparsify;
        job->allow_nonfinite = f->allow_nonfinite;
        job->max_grad_norm = f->max_grad_norm;
        job->replicas = f->replicas;
        if (f->tables && job_set_tables(job, f->tables, err, errlen) < 0)
                return -EINVAL; /* err names the table and the field */
        if (!f->tables && job->click) {
                char def[64];
                job_click_table(job, def, sizeof def);
                if (job_set_tables(job, def, err, errlen) < 0)
                        return -EINVAL;
        }
        job->train_limit = f->train_limit;
        job->test_limit = f->test_limit;
        if (f->strategy && fed_strategy_from_string(f->strategy, &job->fed.strategy.kind) < 0) {
                snprintf(err, errlen, "bad --strategy '%s' (expected fedavg, fedavgm, fedadagrad, fedadam, fedyogi, "
                         "median, trimmed-mean, krum, multi-krum or custom)", f->strategy);
                return -EINVAL;
        }
        fed_params_default(job->fed.strategy.kind, &job->fed.strategy);
        if (f->server_lr >= 0)
                job->fed.strategy.eta = f->server_lr;
        if (f->server_momentum >= 0)
                job->fed.strategy.beta = f->server_momentum;
        if (f->tau >= 0)
                job->fed.strategy.tau = f->tau;
        if (f->trim >= 0)
                job->fed.strategy.trim = f->trim;
        if (f->byzantine >= 0)
                job->fed.strategy.byzantine = f->byzantine;
        job->fed.rounds = f->rounds;
        job->fed.fraction = f->fraction;
        job->fed.min_clients = f->min_clients;
        job->fed.min_available = f->min_available;
        job->fed.round_timeout_ms = f->round_timeout > 86400 ? UINT32_MAX : f->round_timeout * 1000u;
        job->fed.local_epochs = f->local_epochs;
        job->fed.prox_mu = f->prox_mu;
        job->fed.strategy.dp_clip = f->dp_clip;
        job->fed.strategy.dp_noise = f->dp_noise;
        job->fed.dp_delta = f->dp_delta;
        job->fed.secagg = f->secagg;
        job->fed.eval_every = f->eval_every;
        job->fed.fraction_evaluate = f->fraction_evaluate;
        job->fed.buffer = f->buffer;
        job->fed.staleness_exp = f->staleness_exp;
        job->fed.secagg_clip = f->secagg_clip;
        job->fed.secagg_threshold = f->secagg_threshold;
        job->fed.secagg_timeout_ms = f->secagg_timeout > 86400 ? UINT32_MAX : f->secagg_timeout * 1000u;
        if (f->compress && compress_from_string(f->compress, &job->fed.compress, &job->fed.topk) < 0) {
                snprintf(err, errlen, "bad --compress '%s' (expected none, bf16, int8 or topk:F with F in (0, 1])",
                         f->compress);
                return -EINVAL;
        }
        if (job->mode != MODE_FED && (f->strategy || f->server_lr >= 0 || f->prox_mu != 0 || f->dp_clip != 0 ||
                                      f->dp_noise != 0 || f->secagg || job->fed.compress != COMPRESS_NONE)) {
                snprintf(err, errlen, "--strategy, --server-lr, --prox-mu, --dp-clip, --dp-noise, --secagg and "
                         "--compress are for federated jobs (--mode fed)");
                return -EINVAL;
        }
        return job_validate(job, err, errlen);
}
