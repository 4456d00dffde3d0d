/* SPDX-License-Identifier: Apache-2.0 */
/* A training job (see job.h): the MLP's tensors and how they are cut into
 * chunks (keys), deterministic initial values, validation, and the names of
 * its enums. Its wire form is in common/net/wire-job.c.
 *
 * Initial values are a pure function of (seed, tensor, element index): each
 * element draws from a counter-based generator (splitmix64's mixer over the
 * three numbers), so any shard computes the same chunk, and the values do not
 * even depend on the chunk size. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hash.h"
#include "job.h"
#include "log.h"
#include "macro.h"
#include "psnet-config.h"
#include "secagg.h"

#define JOB_MAX_BATCH (1u << 20)
#define JOB_MAX_EPOCHS 1000000u
#define JOB_MAX_PEERS 65536u

#define job_err(err, errlen, ...) reason_set(err, errlen, -EINVAL, __VA_ARGS__)

const char *optim_kind_name(OptimKind k) {
        return k == OPTIM_ADAM ? "adam" : k == OPTIM_SGD ? "sgd" : "?";
}

const char *tensor_init_name(TensorInit i) {
        switch (i) {
        case INIT_ZEROS: return "zeros";
        case INIT_HE: return "he";
        case INIT_XAVIER: return "xavier";
        case INIT_ONES: return "ones";
        case INIT_NORMAL: return "normal";
        }
        return "?";
}

const char *job_state_name(JobState s) {
        switch (s) {
        case JOB_WAITING: return "waiting";
        case JOB_RUNNING: return "running";
        case JOB_DONE: return "done";
        case JOB_STOPPED: return "stopped";
        case JOB_FAILED: return "failed";
        }
        return "?";
}

bool job_state_final(JobState s) {
        return s == JOB_DONE || s == JOB_STOPPED || s == JOB_FAILED;
}

void job_defaults(Job *job) {
        int r _unused_;

        memset(job, 0, sizeof *job);
        job->optim.kind = OPTIM_SGD;
        job->optim.lr = 0.02f;
        job->optim.momentum = 0.9f;
        job->optim.weight_decay = 0.0f;
        job->optim.beta1 = 0.9f;
        job->optim.beta2 = 0.999f;
        job->optim.eps = 1e-8f;
        job->optim.nesterov = false;
        job->mode = MODE_BSP;
        job->chunk_floats = JOB_DEFAULT_CHUNK_FLOATS;
        job->seed = 42;
        job->batch = 64;
        job->epochs = 5;
        job->lr_scaling = LR_SCALING_AUTO;
        job->warmup_clocks = JOB_DEFAULT_WARMUP_CLOCKS;
        /* Federated rounds: Flower's defaults where it has them (fraction_fit
         * 1.0, min_fit_clients 2, min_available_clients 2, FedAvg). */
        fed_params_default(FED_AVG, &job->fed.strategy);
        job->fed.rounds = 20;
        job->fed.fraction = 1.0f;
        job->fed.min_clients = 2;
        job->fed.min_available = 2;
        job->fed.round_timeout_ms = 60000;
        job->fed.local_epochs = 1;
        job->fed.dp_delta = 1e-5f;
        job->fed.secagg_clip = SECAGG_DEFAULT_CLIP;
        job->fed.secagg_threshold = SECAGG_DEFAULT_THRESHOLD;
        job->fed.secagg_timeout_ms = SECAGG_DEFAULT_TIMEOUT_MS;
        job->fed.buffer = 10;           /* FedBuff's K */
        job->fed.staleness_exp = 0.5f;  /* FedBuff's 1 / sqrt(1 + s) */
        snprintf(job->dataset, sizeof job->dataset, "%s", PSNET_DEFAULT_DATA);
        r = job_set_model(job, "mlp:784-256-10");
        assert(r == 0);
}

int job_set_model_why(Job *job, const char *model, char *err, size_t errlen) {
        ModelDesc *d;
        JobTensor tensors[JOB_MAX_TENSORS];
        int r;

        if (!model)
                return job_err(err, errlen, "no model");
        if (job->chunk_floats < 1 || job->chunk_floats > JOB_MAX_CHUNK_FLOATS)
                return job_err(err, errlen, "chunk_floats %u out of range", job->chunk_floats);
        if (strlen(model) >= sizeof job->model)
                return job_err(err, errlen, "model text longer than %zu bytes", sizeof job->model - 1);
        d = malloc(sizeof *d);
        if (!d)
                return reason_set(err, errlen, -ENOMEM, "out of memory");
        r = modeldesc_parse(model, d, err, errlen);
        if (r < 0)
                goto out;

        memset(tensors, 0, sizeof tensors);
        for (size_t i = 0; i < d->ntensors; i++) {
                const MdTensor *m = &d->tensors[i];
                JobTensor *t = &tensors[i];
                uint64_t nchunks = (m->numel + job->chunk_floats - 1) / job->chunk_floats;

                if (nchunks > UINT32_MAX) {
                        r = job_err(err, errlen, "tensor %s: too many chunks", m->name);
                        goto out;
                }
                snprintf(t->name, sizeof t->name, "%s", m->name);
                t->ndim = m->ndim;
                memcpy(t->shape, m->shape, sizeof t->shape);
                t->numel = m->numel;
                t->init = m->init;
                t->fan_in = m->fan_in;
                t->fan_out = m->fan_out;
                t->buffer = m->buffer;
                t->nchunks = (uint32_t) nchunks;
        }
        snprintf(job->model, sizeof job->model, "%s", model);
        snprintf(job->model_name, sizeof job->model_name, "%.127s", d->name);
        memcpy(job->tensors, tensors, sizeof tensors);
        job->ntensors = d->ntensors;
        job->external = d->external;
        job->click = d->click;
        job->click_dim = d->click_dim;
        job->click_fields = d->click_fields;
        job->in_numel = d->external ? 0 : (uint32_t) md_shape_numel(&d->input);
        job->classes = d->classes;
out:
        free(d);
        return r;
}

int job_set_model(Job *job, const char *model) {
        return job_set_model_why(job, model, NULL, 0);
}

size_t optim_state_per_value(const OptimConf *c) {
        if (c->kind == OPTIM_ADAM)
                return 2;
        return c->momentum != 0.0f ? 1 : 0;
}

size_t job_state_per_value(const Job *job) {
        return job->mode == MODE_FED ? fed_state_per_value(job->fed.strategy.kind) : optim_state_per_value(&job->optim);
}

uint64_t job_chunk_bytes(const Job *job, uint32_t t, uint32_t c) {
        return (uint64_t) job_chunk_len(job, t, c) * sizeof(float) * (1 + job_state_per_value(job));
}

uint64_t job_model_bytes(const Job *job) {
        return job_nfloats(job) * sizeof(float) * (1 + job_state_per_value(job));
}

int job_set_chunk(Job *job, uint32_t chunk_floats) {
        if (chunk_floats < 1 || chunk_floats > JOB_MAX_CHUNK_FLOATS)
                return -EINVAL;
        for (size_t i = 0; i < job->ntensors; i++)
                if ((job->tensors[i].numel + chunk_floats - 1) / chunk_floats > UINT32_MAX)
                        return -EINVAL;
        job->chunk_floats = chunk_floats;
        for (size_t i = 0; i < job->ntensors; i++)
                job->tensors[i].nchunks = (uint32_t) ((job->tensors[i].numel + chunk_floats - 1) / chunk_floats);
        return 0;
}

uint32_t job_fair_chunk(const Job *job, size_t nshards) {
        if (nshards <= 1)
                return job->chunk_floats; /* one shard holds everything whatever the chunks */
        uint64_t fair = job_nfloats(job) / (10u * MAX(nshards, (size_t) 1));
        fair = MAX(fair, (uint64_t) JOB_MIN_FAIR_CHUNK_FLOATS);
        return (uint32_t) MIN(fair, (uint64_t) job->chunk_floats);
}

int mode_parse(const char *s, ConsistencyMode *ret_mode, uint32_t *ret_staleness) {
        if (!s)
                return -EINVAL;
        if (strcmp(s, "fed") == 0) {
                *ret_mode = MODE_FED;
                *ret_staleness = 0;
                return 0;
        }
        if (strcmp(s, "bsp") == 0 || strcmp(s, "asp") == 0) {
                *ret_mode = s[0] == 'b' ? MODE_BSP : MODE_ASP;
                *ret_staleness = 0;
                return 0;
        }
        if (strncmp(s, "ssp:", 4) != 0 || s[4] < '0' || s[4] > '9')
                return -EINVAL;
        char *end;
        errno = 0;
        unsigned long v = strtoul(s + 4, &end, 10);
        if (errno || *end || v > JOB_MAX_STALENESS)
                return -EINVAL;
        *ret_mode = MODE_SSP;
        *ret_staleness = (uint32_t) v;
        return 0;
}

const char *mode_string(ConsistencyMode mode, uint32_t staleness, char *buf, size_t n) {
        if (mode == MODE_SSP)
                snprintf(buf, n, "ssp:%u", staleness);
        else
                snprintf(buf, n, "%s", mode == MODE_ASP ? "asp" : mode == MODE_FED ? "fed" : "bsp");
        return buf;
}

int job_set_mode(Job *job, const char *mode) {
        if (mode && strcmp(mode, "fedasync") == 0) {
                job->mode = MODE_FED;
                job->staleness = 0;
                job->fed.async = true;
                return 0;
        }
        job->fed.async = false;
        return mode_parse(mode, &job->mode, &job->staleness);
}

const char *job_mode_string(const Job *job, char *buf, size_t n) {
        if (job->mode == MODE_FED && job->fed.async) {
                snprintf(buf, n, "fedasync");
                return buf;
        }
        return mode_string(job->mode, job->staleness, buf, n);
}

int job_set_optim(Job *job, const char *kind) {
        if (!kind)
                return -EINVAL;
        if (strcmp(kind, "sgd") == 0)
                job->optim.kind = OPTIM_SGD;
        else if (strcmp(kind, "adam") == 0)
                job->optim.kind = OPTIM_ADAM;
        else
                return -EINVAL;
        return 0;
}

static bool str_terminated(const char *s, size_t size) {
        return memchr(s, '\0', size) != NULL;
}

void job_click_table(const Job *job, char *buf, size_t n) {
        snprintf(buf, n, JOB_CLICK_TABLE, job->click_dim);
}

int job_validate(const Job *job, char *err, size_t errlen) {
        const OptimConf *o = &job->optim;
        uint64_t nkeys = 0;

        if (err && errlen > 0)
                err[0] = '\0';
        if (!str_terminated(job->model, sizeof job->model) || job->model[0] == '\0')
                return job_err(err, errlen, "model is empty");
        if (job->chunk_floats < 1 || job->chunk_floats > JOB_MAX_CHUNK_FLOATS)
                return job_err(err, errlen, "chunk_floats %u out of range 1..%u", job->chunk_floats,
                               JOB_MAX_CHUNK_FLOATS);
        if (job->ntensors < 1 || job->ntensors > JOB_MAX_TENSORS ||
            (!job->external && (job->in_numel < 1 || job->classes < 1)))
                return job_err(err, errlen, "model %s has %zu tensors, %u inputs, %u classes", job->model_name,
                               job->ntensors, job->in_numel, job->classes);
        for (size_t i = 0; i < job->ntensors; i++) {
                const JobTensor *t = &job->tensors[i];
                uint64_t numel = 1, nchunks;
                if (!str_terminated(t->name, sizeof t->name) || t->name[0] == '\0')
                        return job_err(err, errlen, "tensor %zu has no name", i);
                if (t->ndim < 1 || t->ndim > 4)
                        return job_err(err, errlen, "tensor %s has %u dimensions", t->name, t->ndim);
                for (unsigned d = 0; d < t->ndim; d++)
                        numel *= t->shape[d];
                if (numel == 0 || numel != t->numel)
                        return job_err(err, errlen, "tensor %s: shape gives %llu values, numel says %llu",
                                       t->name, (unsigned long long) numel, (unsigned long long) t->numel);
                nchunks = (t->numel + job->chunk_floats - 1) / job->chunk_floats;
                if (nchunks != t->nchunks)
                        return job_err(err, errlen,
                                       "tensor %s has %u chunks, %llu values in chunks of %u need %llu"
                                       " (set chunk_floats before the model)",
                                       t->name, t->nchunks, (unsigned long long) t->numel,
                                       job->chunk_floats, (unsigned long long) nchunks);
                if ((unsigned) t->init > INIT_NORMAL)
                        return job_err(err, errlen, "tensor %s: unknown init (zeros, he, xavier, ones, normal)", t->name);
                if (t->fan_in == 0 || t->fan_out == 0)
                        return job_err(err, errlen, "tensor %s has fan_in %u, fan_out %u", t->name,
                                       t->fan_in, t->fan_out);
                nkeys += t->nchunks;
        }
        if (nkeys > UINT32_MAX)
                return job_err(err, errlen, "%llu keys is too many", (unsigned long long) nkeys);

        if (job->replicas > JOB_MAX_REPLICAS)
                return job_err(err, errlen, "%u replicas is too many (at most %u)", job->replicas, JOB_MAX_REPLICAS);
        if (o->kind != OPTIM_SGD && o->kind != OPTIM_ADAM)
                return job_err(err, errlen, "optimizer must be sgd or adam");
        if (!isfinite(o->lr) || o->lr <= 0)
                return job_err(err, errlen, "lr %g must be > 0", (double) o->lr);
        if (!isfinite(o->momentum) || o->momentum < 0 || o->momentum >= 1)
                return job_err(err, errlen, "momentum %g must be in [0, 1)", (double) o->momentum);
        if (!isfinite(o->weight_decay) || o->weight_decay < 0)
                return job_err(err, errlen, "weight_decay %g must be >= 0", (double) o->weight_decay);
        if (!isfinite(o->beta1) || o->beta1 < 0 || o->beta1 >= 1)
                return job_err(err, errlen, "beta1 %g must be in [0, 1)", (double) o->beta1);
        if (!isfinite(o->beta2) || o->beta2 < 0 || o->beta2 >= 1)
                return job_err(err, errlen, "beta2 %g must be in [0, 1)", (double) o->beta2);
        if (!isfinite(o->eps) || o->eps <= 0)
                return job_err(err, errlen, "eps %g must be > 0", (double) o->eps);
        if (job->mode != MODE_BSP && job->mode != MODE_ASP && job->mode != MODE_SSP && job->mode != MODE_FED)
                return job_err(err, errlen, "mode must be bsp, asp, ssp:S or fed");
        if (!(isfinite(job->max_grad_norm) && job->max_grad_norm >= 0.0f))
                return job_err(err, errlen, "--max-grad-norm %g must be a finite L2 norm >= 0 (0: no bound)",
                               (double) job->max_grad_norm);
        if (!(job->sparsify >= 0.0f && job->sparsify <= 1.0f))
                return job_err(err, errlen, "--sparsify %g must be a share of each chunk's gradients, 0 < F <= 1 "
                                            "(0: off)", (double) job->sparsify);
        if (job->mode == MODE_FED && job->sparsify > 0.0f)
                return job_err(err, errlen, "--sparsify is for training jobs; a federated job's updates are "
                                            "sparsified with --compress topk:F");
        bool buffers = false;
        for (size_t i = 0; i < job->ntensors; i++)
                buffers |= job->tensors[i].buffer;
        if (buffers && job->sparsify > 0.0f)
                return job_err(err, errlen, "--sparsify drops values of each push, and a buffer tensor (a "
                                            "running mean) needs them all: a model with buffers trains dense");
        if (job->ntables > JOB_MAX_TABLES)
                return job_err(err, errlen, "%zu tables, at most %u", job->ntables, JOB_MAX_TABLES);
        for (size_t i = 0; i < job->ntables; i++) {
                const TableConf *c = &job->tables[i];
                char why[128];
                if (table_conf_check(c, why, sizeof why) < 0)
                        return job_err(err, errlen, "table %zu: %s", i, why);
                for (size_t k = 0; k < i; k++)
                        if (strcmp(job->tables[k].name, c->name) == 0)
                                return job_err(err, errlen, "table %s is declared twice", c->name);
                for (size_t k = 0; k < job->ntensors; k++)
                        if (strcmp(job->tensors[k].name, c->name) == 0)
                                return job_err(err, errlen, "table %s has a tensor's name", c->name);
        }
        /* A click model's rows: one table for every field, or one per field. */
        bool dims = job->ntables > 0;
        for (size_t i = 0; job->click && i < job->ntables; i++)
                dims = dims && job->tables[i].dim == job->click_dim;
        if (job->click && (!dims || (job->click_fields && job->ntables != 1 && job->ntables != job->click_fields))) {
                char def[64], fields[64] = "";
                job_click_table(job, def, sizeof def);
                if (job->click_fields)
                        snprintf(fields, sizeof fields, ", or one per field (%u)", job->click_fields);
                return job_err(err, errlen, "model %s keeps a row of %u float%s per id in one table for every field%s "
                               "(--tables NAME:%u[:OPTIM][:KEY=VALUE]...; without --tables: %s)", job->model_name,
                               job->click_dim, job->click_dim == 1 ? "" : "s", fields, job->click_dim, def);
        }
        if (job->ntables > 0 && job->mode == MODE_FED)
                return job_err(err, errlen, "--tables is for training jobs; federated clients train dense models");
        if (job->mode == MODE_FED && job->wire != JOB_WIRE_F32)
                return job_err(err, errlen, "--wire bf16 is for training jobs; a federated job's updates are "
                                            "encoded with --compress bf16");
        if (job->mode == MODE_FED) {
                const FedConf *f = &job->fed;
                char why[160];
                if (fed_params_check(&f->strategy, why, sizeof why) < 0)
                        return job_err(err, errlen, "%s", why);
                if (f->rounds < 1 || f->rounds > JOB_MAX_FED_ROUNDS)
                        return job_err(err, errlen, "rounds %u out of range 1..%u", f->rounds, JOB_MAX_FED_ROUNDS);
                if (!(f->fraction > 0 && f->fraction <= 1))
                        return job_err(err, errlen, "fraction %g must be in (0, 1]", (double) f->fraction);
                if (!(f->fraction_evaluate >= 0 && f->fraction_evaluate <= 1))
                        return job_err(err, errlen, "--fraction-evaluate %g must be in [0, 1] (0: no federated "
                                                    "evaluation)", (double) f->fraction_evaluate);
                if (f->async && f->fraction_evaluate > 0)
                        return job_err(err, errlen, "--fraction-evaluate evaluates after each round; --mode "
                                                    "fedasync has none (--eval-every tests its model)");
                if (f->min_clients < 1 || f->min_clients > JOB_MAX_PEERS)
                        return job_err(err, errlen, "min_clients %u out of range 1..%u", f->min_clients, JOB_MAX_PEERS);
                if (f->min_available < f->min_clients || f->min_available > JOB_MAX_PEERS)
                        return job_err(err, errlen, "min_available %u must be at least min_clients %u (and at most %u)",
                                       f->min_available, f->min_clients, JOB_MAX_PEERS);
                if (f->round_timeout_ms < 100 || f->round_timeout_ms > 86400000u)
                        return job_err(err, errlen, "round timeout %u ms out of range 100 ms..1 day",
                                       f->round_timeout_ms);
                if (f->local_epochs < 1 || f->local_epochs > JOB_MAX_LOCAL_EPOCHS)
                        return job_err(err, errlen, "local_epochs %u out of range 1..%u", f->local_epochs,
                                       JOB_MAX_LOCAL_EPOCHS);
                if (!isfinite(f->prox_mu) || f->prox_mu < 0)
                        return job_err(err, errlen, "prox_mu %g must be >= 0", (double) f->prox_mu);
                if (!(f->dp_delta > 0 && f->dp_delta < 1))
                        return job_err(err, errlen, "dp_delta %g must be in (0, 1)", (double) f->dp_delta);
                if (!isfinite(f->secagg_clip) || f->secagg_clip <= 0 || f->secagg_clip > 1e6f)
                        return job_err(err, errlen, "secagg clip %g must be in (0, 1e6]", (double) f->secagg_clip);
                if (!(f->secagg_threshold > 0 && f->secagg_threshold <= 1))
                        return job_err(err, errlen, "secagg threshold %g must be in (0, 1]",
                                       (double) f->secagg_threshold);
                if (f->secagg_timeout_ms < 100 || f->secagg_timeout_ms > 86400000u)
                        return job_err(err, errlen, "secagg timeout %u ms out of range 100 ms..1 day",
                                       f->secagg_timeout_ms);
                if (f->secagg && f->strategy.kind == FED_CUSTOM)
                        return job_err(err, errlen, "secure aggregation shows no one a single update, and a custom "
                                                    "strategy is a function of each one: --secagg does not combine "
                                                    "with --strategy custom");
                if (f->async && f->strategy.kind == FED_CUSTOM)
                        return job_err(err, errlen, "--mode fedasync applies updates as they come: a custom strategy "
                                                    "aggregates the updates of a round, and it has none");
                if (f->secagg && (f->strategy.kind == FED_MEDIAN || f->strategy.kind == FED_TRIMMED_MEAN ||
                                  fed_is_krum(f->strategy.kind)))
                        return job_err(err, errlen, "secure aggregation gives the shards only the sum of the "
                                       "updates: the %s strategy needs each one (use a mean-based strategy)",
                                       fed_strategy_name(f->strategy.kind));
                if (f->compress > COMPRESS_TOPK || (f->compress == COMPRESS_TOPK && !(f->topk > 0 && f->topk <= 1)))
                        return job_err(err, errlen, "compression %d (top-k share %g) is not one of none, bf16, int8, "
                                       "topk:F with F in (0, 1]", (int) f->compress, (double) f->topk);
                if (f->async && (f->buffer < 1 || f->buffer > JOB_MAX_PEERS))
                        return job_err(err, errlen, "buffer %u out of range 1..%u", f->buffer, JOB_MAX_PEERS);
                if (!isfinite(f->staleness_exp) || f->staleness_exp < 0 || f->staleness_exp > 10)
                        return job_err(err, errlen, "staleness exponent %g must be in [0, 10]",
                                       (double) f->staleness_exp);
                if (f->async && fed_is_krum(f->strategy.kind))
                        return job_err(err, errlen, "--mode fedasync applies updates as they come: %s compares "
                                       "the updates of a round, and has none", fed_strategy_name(f->strategy.kind));
                if (f->async && (f->secagg || f->strategy.dp_clip > 0))
                        return job_err(err, errlen, "--mode fedasync applies updates as they come, weighted by their "
                                       "staleness: it does not combine with %s", f->secagg ? "--secagg" : "--dp-clip");
                if (f->secagg && f->compress != COMPRESS_NONE)
                        return job_err(err, errlen, "secure aggregation masks every coordinate as a 32-bit integer: "
                                       "--compress %s does not combine with it", compress_name(f->compress));
                if (f->secagg && f->min_clients < 2)
                        return job_err(err, errlen, "secure aggregation needs at least 2 clients per round (the "
                                       "sum of one client is its update): --min-clients %u", f->min_clients);
                if (job->replicas > 1 && f->async)
                        return job_err(err, errlen, "a fedasync job keeps one copy of each chunk (replicas %u: "
                                       "replicated buffers are not built yet; mode fed replicates its rounds)",
                                       job->replicas);
        }
        if (job->staleness > JOB_MAX_STALENESS)
                return job_err(err, errlen, "staleness %u out of range 0..%u", job->staleness, JOB_MAX_STALENESS);
        if (job->batch < 1 || job->batch > JOB_MAX_BATCH)
                return job_err(err, errlen, "batch %u out of range 1..%u", job->batch, JOB_MAX_BATCH);
        if (job->epochs < 1 || job->epochs > JOB_MAX_EPOCHS)
                return job_err(err, errlen, "epochs %u out of range 1..%u", job->epochs, JOB_MAX_EPOCHS);
        if (!str_terminated(job->dataset, sizeof job->dataset) || job->dataset[0] == '\0')
                return job_err(err, errlen, "dataset is empty");
        if (!str_terminated(job->init, sizeof job->init))
                return job_err(err, errlen, "init path longer than %zu bytes", sizeof job->init - 1);
        if (job->init[0] && job->init[0] != '/')
                return job_err(err, errlen, "init file '%s' is not an absolute path", job->init);
        if (job->expect_workers > JOB_MAX_PEERS || job->expect_shards > JOB_MAX_PEERS)
                return job_err(err, errlen, "expect_workers %u / expect_shards %u out of range 0..%u",
                               job->expect_workers, job->expect_shards, JOB_MAX_PEERS);
        return 0;
}

uint32_t job_chunk_len(const Job *job, uint32_t t, uint32_t c) {
        const JobTensor *jt;
        uint64_t start;

        if (t >= job->ntensors || job->chunk_floats == 0)
                return 0;
        jt = &job->tensors[t];
        if (c >= jt->nchunks)
                return 0;
        start = (uint64_t) c * job->chunk_floats;
        if (start >= jt->numel)
                return 0;
        return (uint32_t) (jt->numel - start < job->chunk_floats ? jt->numel - start : job->chunk_floats);
}

uint64_t job_nkeys(const Job *job) {
        uint64_t n = 0;
        for (size_t i = 0; i < job->ntensors; i++)
                n += job->tensors[i].nchunks;
        return n;
}

uint64_t job_nfloats(const Job *job) {
        uint64_t n = 0;
        for (size_t i = 0; i < job->ntensors; i++)
                n += job->tensors[i].numel;
        return n;
}

/* --- initialisation ------------------------------------------------------------ */


/* 64 random bits for (seed, tensor, element, stream): a counter-based generator. */
static uint64_t rng_bits(uint64_t seed, uint32_t t, uint64_t i, unsigned stream) {
        uint64_t x = mix64(seed + UINT64_C(0x9e3779b97f4a7c15));
        x = mix64(x ^ (((uint64_t) t << 8 | stream) + UINT64_C(0xd1b54a32d192ed03)));
        return mix64(x ^ (i + UINT64_C(0x8cb92ba72f3d8dd7)));
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_unit(uint64_t bits) {
        return (double) (bits >> 11) * 0x1.0p-53;
}

void job_init_chunk(const Job *job, uint32_t t, uint32_t c, float *out) {
        uint32_t len = job_chunk_len(job, t, c);
        const JobTensor *jt;
        uint64_t base;

        if (len == 0)
                return;
        jt = &job->tensors[t];
        base = (uint64_t) c * job->chunk_floats;

        if (jt->init == INIT_HE || jt->init == INIT_NORMAL) {
                double std = jt->init == INIT_NORMAL ? INIT_NORMAL_STD : sqrt(2.0 / (double) jt->fan_in);
                for (uint32_t k = 0; k < len; k++) {
                        /* Box-Muller; u1 in (0, 1] keeps the log finite. */
                        double u1 = 1.0 - rng_unit(rng_bits(job->seed, t, base + k, 0));
                        double u2 = rng_unit(rng_bits(job->seed, t, base + k, 1));
                        out[k] = (float) (std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
                }
        } else if (jt->init == INIT_XAVIER) {
                double a = sqrt(6.0 / ((double) jt->fan_in + (double) jt->fan_out));
                for (uint32_t k = 0; k < len; k++)
                        out[k] = (float) (a * (2.0 * rng_unit(rng_bits(job->seed, t, base + k, 0)) - 1.0));
        } else if (jt->init == INIT_ONES) {
                for (uint32_t k = 0; k < len; k++)
                        out[k] = 1.0f;
        } else
                memset(out, 0, (size_t) len * sizeof *out);
}

/* The factor for W members (see job_lr_factor). */
static float lr_workers_factor(const Job *job, ConsistencyMode mode, uint32_t workers, int64_t clock) {
        if (job->lr_scaling == LR_SCALING_NONE || workers <= 1)
                return 1.0f;
        bool linear = job->lr_scaling == LR_SCALING_LINEAR ||
                      (job->lr_scaling == LR_SCALING_AUTO && mode == MODE_BSP && job->optim.kind == OPTIM_SGD);
        float target = linear ? (float) workers : sqrtf((float) workers);
        if (job->warmup_clocks == 0 || clock + 1 >= (int64_t) job->warmup_clocks)
                return target;
        float ramp = clock < 0 ? 0.0f : (float) (clock + 1) / (float) job->warmup_clocks;
        return 1.0f + (target - 1.0f) * ramp;
}

float job_lr_factor(const Job *job, ConsistencyMode mode, uint32_t workers, int64_t clock, float progress) {
        float f = lr_workers_factor(job, mode, workers, clock);
        if (job->lr_schedule != LR_SCHEDULE_COSINE || !(progress >= 0.0f))
                return f;
        double p = MIN((double) progress, 1.0);
        return f * (float) (0.5 * (1.0 + cos(M_PI * p)));
}

static const char *const lr_scaling_names[] = { "none", "auto", "linear", "sqrt" };

/* The index of s in names, or -EINVAL. */
static int name_index(const char *const *names, size_t n, const char *s) {
        for (size_t i = 0; i < n; i++)
                if (strcmp(s, names[i]) == 0)
                        return (int) i;
        return -EINVAL;
}

int lr_scaling_from_string(const char *s, LrScaling *ret) {
        int i = name_index(lr_scaling_names, ELEMENTSOF(lr_scaling_names), s);
        if (i < 0)
                return i;
        *ret = (LrScaling) i;
        return 0;
}

const char *lr_scaling_name(LrScaling s) {
        return (size_t) s < ELEMENTSOF(lr_scaling_names) ? lr_scaling_names[s] : "?";
}

static const char *const lr_schedule_names[] = { "constant", "cosine" };

int lr_schedule_from_string(const char *s, LrSchedule *ret) {
        int i = name_index(lr_schedule_names, ELEMENTSOF(lr_schedule_names), s);
        if (i < 0)
                return i;
        *ret = (LrSchedule) i;
        return 0;
}

const char *lr_schedule_name(LrSchedule s) {
        return (size_t) s < ELEMENTSOF(lr_schedule_names) ? lr_schedule_names[s] : "?";
}

int job_set_tables(Job *job, const char *text, char *err, size_t errlen) {
        TableConf t[JOB_MAX_TABLES];
        size_t n = 0;
        if (tables_parse(text, t, JOB_MAX_TABLES, &n, err, errlen) < 0)
                return -EINVAL;
        memcpy(job->tables, t, n * sizeof *t);
        job->ntables = n;
        return 0;
}

void job_table_conf(const Job *job, size_t i, TableConf *ret) {
        *ret = job->tables[i];
        uint64_t x = job->seed ^ (0x7461626c65ull + i); /* "table" */
        ret->seed = splitmix64_next(&x);
}

int job_table_find(const Job *job, const char *name) {
        for (size_t i = 0; i < job->ntables; i++)
                if (strcmp(job->tables[i].name, name) == 0)
                        return (int) i;
        return -ENOENT;
}
