/* SPDX-License-Identifier: Apache-2.0 */
/* Conversions between common/'s types and their wire messages; see wire-job.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "log.h"
#include "macro.h"
#include "wire-job.h"
#include "wire.h"

#define conv_err(err, errlen, ...) reason_set(err, errlen, -EINVAL, __VA_ARGS__)

static Psnet__Init init_to_proto(TensorInit i) {
        switch (i) {
        case INIT_HE: return PSNET__INIT__INIT_HE;
        case INIT_XAVIER: return PSNET__INIT__INIT_XAVIER;
        case INIT_ONES: return PSNET__INIT__INIT_ONES;
        case INIT_NORMAL: return PSNET__INIT__INIT_NORMAL;
        case INIT_ZEROS: break;
        }
        return PSNET__INIT__INIT_ZEROS;
}

static int init_from_proto(Psnet__Init i, TensorInit *ret) {
        switch (i) {
        case PSNET__INIT__INIT_ZEROS: *ret = INIT_ZEROS; return 0;
        case PSNET__INIT__INIT_HE: *ret = INIT_HE; return 0;
        case PSNET__INIT__INIT_XAVIER: *ret = INIT_XAVIER; return 0;
        case PSNET__INIT__INIT_ONES: *ret = INIT_ONES; return 0;
        case PSNET__INIT__INIT_NORMAL: *ret = INIT_NORMAL; return 0;
        default: return -EINVAL;
        }
}

void mode_to_proto(ConsistencyMode mode, uint32_t staleness, Psnet__ModeSpec *ret) {
        psnet__mode_spec__init(ret);
        ret->mode = mode == MODE_SSP ? PSNET__MODE__MODE_SSP
                    : mode == MODE_ASP ? PSNET__MODE__MODE_ASP
                    : mode == MODE_FED ? PSNET__MODE__MODE_FED : PSNET__MODE__MODE_BSP;
        ret->has_staleness = mode == MODE_SSP;
        ret->staleness = mode == MODE_SSP ? staleness : 0;
}

int mode_from_proto(const Psnet__ModeSpec *m, ConsistencyMode *ret_mode, uint32_t *ret_staleness) {
        if (!m)
                return -EINVAL;
        switch (m->mode) {
        case PSNET__MODE__MODE_BSP: *ret_mode = MODE_BSP; break;
        case PSNET__MODE__MODE_ASP: *ret_mode = MODE_ASP; break;
        case PSNET__MODE__MODE_SSP: *ret_mode = MODE_SSP; break;
        case PSNET__MODE__MODE_FED: *ret_mode = MODE_FED; break;
        default: return -EINVAL;
        }
        uint32_t s = m->mode == PSNET__MODE__MODE_SSP && m->has_staleness ? m->staleness : 0;
        if (s > JOB_MAX_STALENESS)
                return -EINVAL;
        *ret_staleness = s;
        return 0;
}

Psnet__JobState job_state_to_proto(JobState s) {
        switch (s) {
        case JOB_RUNNING: return PSNET__JOB_STATE__JOB_RUNNING;
        case JOB_DONE: return PSNET__JOB_STATE__JOB_DONE;
        case JOB_STOPPED: return PSNET__JOB_STATE__JOB_STOPPED;
        case JOB_FAILED: return PSNET__JOB_STATE__JOB_FAILED;
        case JOB_WAITING: break;
        }
        return PSNET__JOB_STATE__JOB_WAITING;
}

int job_state_from_proto(Psnet__JobState s, JobState *ret) {
        switch (s) {
        case PSNET__JOB_STATE__JOB_WAITING: *ret = JOB_WAITING; return 0;
        case PSNET__JOB_STATE__JOB_RUNNING: *ret = JOB_RUNNING; return 0;
        case PSNET__JOB_STATE__JOB_DONE: *ret = JOB_DONE; return 0;
        case PSNET__JOB_STATE__JOB_STOPPED: *ret = JOB_STOPPED; return 0;
        case PSNET__JOB_STATE__JOB_FAILED: *ret = JOB_FAILED; return 0;
        default: return -EINVAL;
        }
}

/* --- job ------------------------------------------------------------------------ */

void job_proto_free(Psnet__JobSpec *spec) {
        if (!spec)
                return;
        free(spec->model);
        if (spec->tensors) {
                for (size_t i = 0; i < spec->n_tensors; i++) {
                        Psnet__TensorSpec *t = spec->tensors[i];
                        if (!t)
                                continue;
                        free(t->name);
                        free(t->shape);
                        free(t);
                }
                free(spec->tensors);
        }
        free(spec->optim);
        free(spec->mode);
        free(spec->dataset);
        free(spec->init);
        free(spec->tables);
        if (spec->fed) {
                free(spec->fed->strategy);
                free(spec->fed);
        }
        free(spec);
}

int job_to_proto(const Job *job, Psnet__JobSpec **ret) {
        Psnet__JobSpec *s;
        Psnet__OptimSpec *o;

        if (job_validate(job, NULL, 0) < 0)
                return -EINVAL;
        s = malloc(sizeof *s);
        if (!s)
                return -ENOMEM;
        psnet__job_spec__init(s);
        s->id = job->id;
        s->model = strdup(job->model);
        s->mode = malloc(sizeof *s->mode);
        if (s->mode)
                mode_to_proto(job->mode, job->staleness, s->mode);
        s->has_lr_scaling = true;
        s->lr_scaling = (Psnet__LrScaling) job->lr_scaling; /* the same numbering */
        s->has_warmup_clocks = true;
        s->warmup_clocks = job->warmup_clocks;
        s->has_wire = job->wire != JOB_WIRE_F32;
        s->wire = job->wire == JOB_WIRE_BF16 ? PSNET__DTYPE__DTYPE_BF16 : PSNET__DTYPE__DTYPE_F32;
        s->has_lr_schedule = job->lr_schedule != LR_SCHEDULE_CONSTANT;
        s->lr_schedule = (Psnet__LrSchedule) job->lr_schedule; /* the same numbering */
        s->has_allow_nonfinite = true;
        s->allow_nonfinite = job->allow_nonfinite;
        s->has_sparsify = job->sparsify > 0.0f;
        s->sparsify = job->sparsify;
        s->has_max_grad_norm = job->max_grad_norm > 0.0f;
        s->max_grad_norm = job->max_grad_norm;
        s->has_replicas = true;
        s->replicas = job->replicas;
        if (job->ntables > 0) {
                size_t n = job->ntables * 512;
                s->tables = malloc(n);
                if (!s->tables || tables_format(job->tables, job->ntables, s->tables, n) < 0)
                        goto nomem;
        }
        s->dataset = strdup(job->dataset);
        if (job->init[0]) {
                s->init = strdup(job->init);
                s->has_init_size = s->has_init_digest = job->init_size != 0;
                s->init_size = job->init_size;
                s->init_digest = job->init_digest;
        }
        s->optim = o = malloc(sizeof *o);
        if (o) {
                psnet__optim_spec__init(o);
                o->kind = job->optim.kind == OPTIM_ADAM ? PSNET__OPTIM_KIND__OPTIM_ADAM : PSNET__OPTIM_KIND__OPTIM_SGD;
        }
        s->tensors = calloc(job->ntensors ? job->ntensors : 1, sizeof *s->tensors);
        if (!s->model || !s->mode || !s->dataset || !o || !s->tensors || (job->init[0] && !s->init))
                goto nomem;
        s->n_tensors = job->ntensors;
        for (size_t i = 0; i < job->ntensors; i++) {
                const JobTensor *jt = &job->tensors[i];
                Psnet__TensorSpec *t = malloc(sizeof *t);
                if (!t)
                        goto nomem;
                psnet__tensor_spec__init(t);
                s->tensors[i] = t;
                t->name = strdup(jt->name);
                t->init = init_to_proto(jt->init);
                t->shape = malloc(jt->ndim * sizeof *t->shape);
                if (!t->name || !t->shape)
                        goto nomem;
                t->n_shape = jt->ndim;
                memcpy(t->shape, jt->shape, jt->ndim * sizeof *t->shape);
        }

        o->has_lr = o->has_momentum = o->has_nesterov = o->has_weight_decay = true;
        o->has_beta1 = o->has_beta2 = o->has_eps = true;
        o->lr = job->optim.lr;
        o->momentum = job->optim.momentum;
        o->nesterov = job->optim.nesterov;
        o->weight_decay = job->optim.weight_decay;
        o->beta1 = job->optim.beta1;
        o->beta2 = job->optim.beta2;
        o->eps = job->optim.eps;

        s->chunk_floats = job->chunk_floats;
        s->seed = job->seed;
        s->batch = job->batch;
        s->epochs = job->epochs;
        s->has_expect_workers = s->has_expect_shards = true;
        s->has_train_limit = s->has_test_limit = true;
        s->expect_workers = job->expect_workers;
        s->expect_shards = job->expect_shards;
        s->train_limit = job->train_limit;
        s->test_limit = job->test_limit;
        if (job->mode == MODE_FED) {
                const FedConf *f = &job->fed;
                Psnet__FedSpec *fs = s->fed = malloc(sizeof *fs);
                if (!fs)
                        goto nomem;
                psnet__fed_spec__init(fs);
                fs->strategy = strdup(fed_strategy_name(f->strategy.kind));
                if (!fs->strategy)
                        goto nomem;
                fs->has_server_lr = fs->has_server_momentum = fs->has_beta1 = fs->has_beta2 = true;
                fs->has_tau = fs->has_trim = fs->has_rounds = fs->has_fraction = fs->has_min_clients = true;
                fs->has_min_available = fs->has_round_timeout_ms = fs->has_local_epochs = fs->has_prox_mu = true;
                fs->has_dp_clip = fs->has_dp_noise = fs->has_dp_delta = true;
                fs->has_secagg = fs->has_secagg_clip = fs->has_secagg_threshold = fs->has_secagg_timeout_ms = true;
                fs->secagg = f->secagg;
                fs->secagg_clip = f->secagg_clip;
                fs->secagg_threshold = f->secagg_threshold;
                fs->secagg_timeout_ms = f->secagg_timeout_ms;
                fs->has_compress = fs->has_topk = fs->has_eval_every = true;
                fs->has_async = fs->has_buffer = fs->has_staleness_exp = true;
                fs->async = f->async;
                fs->buffer = f->buffer;
                fs->staleness_exp = f->staleness_exp;
                fs->eval_every = f->eval_every;
                fs->has_fraction_evaluate = f->fraction_evaluate > 0;
                fs->fraction_evaluate = f->fraction_evaluate;
                fs->compress = (uint32_t) f->compress;
                fs->topk = f->topk;
                fs->server_lr = f->strategy.eta;
                fs->server_momentum = f->strategy.beta;
                fs->beta1 = f->strategy.beta1;
                fs->beta2 = f->strategy.beta2;
                fs->tau = f->strategy.tau;
                fs->trim = f->strategy.trim;
                fs->has_byzantine = fed_is_krum(f->strategy.kind);
                fs->byzantine = f->strategy.byzantine;
                fs->rounds = f->rounds;
                fs->fraction = f->fraction;
                fs->min_clients = f->min_clients;
                fs->min_available = f->min_available;
                fs->round_timeout_ms = f->round_timeout_ms;
                fs->local_epochs = f->local_epochs;
                fs->prox_mu = f->prox_mu;
                fs->dp_clip = f->strategy.dp_clip;
                fs->dp_noise = f->strategy.dp_noise;
                fs->dp_delta = f->dp_delta;
        }
        *ret = s;
        return 0;

nomem:
        job_proto_free(s);
        return -ENOMEM;
}

int job_from_proto(const Psnet__JobSpec *spec, Job *ret, char *err, size_t errlen) {
        const Psnet__OptimSpec *o;
        Job j;
        char why[256];
        int r;

        if (err && errlen > 0)
                err[0] = '\0';
        if (!spec)
                return conv_err(err, errlen, "no job spec");
        if (!spec->model || !spec->mode || !spec->dataset || !spec->optim)
                return conv_err(err, errlen, "job spec lacks a required field");
        o = spec->optim;

        job_defaults(&j);
        j.id = spec->id;
        if (spec->chunk_floats < 1 || spec->chunk_floats > JOB_MAX_CHUNK_FLOATS)
                return conv_err(err, errlen, "chunk_floats %u out of range 1..%u", spec->chunk_floats,
                                JOB_MAX_CHUNK_FLOATS);
        j.chunk_floats = spec->chunk_floats;
        r = job_set_model_why(&j, spec->model, why, sizeof why);
        if (r < 0)
                return conv_err(err, errlen, "bad model: %s", why);

        if (spec->n_tensors > JOB_MAX_TENSORS)
                return conv_err(err, errlen, "%zu tensors, at most %d", spec->n_tensors, JOB_MAX_TENSORS);
        if (spec->n_tensors != j.ntensors)
                return conv_err(err, errlen, "model %s has %zu tensors, spec lists %zu", j.model, j.ntensors,
                                spec->n_tensors);
        if (spec->n_tensors > 0 && !spec->tensors)
                return conv_err(err, errlen, "tensor list missing");
        for (size_t i = 0; i < spec->n_tensors; i++) {
                const Psnet__TensorSpec *t = spec->tensors[i];
                JobTensor *jt = &j.tensors[i];
                if (!t || !t->name)
                        return conv_err(err, errlen, "tensor %zu lacks a required field", i);
                if (strcmp(t->name, jt->name) != 0)
                        return conv_err(err, errlen, "tensor %zu is named '%.96s', model %s says %s", i, t->name,
                                        j.model, jt->name);
                if (t->n_shape != jt->ndim || (t->n_shape > 0 && !t->shape) ||
                    memcmp(t->shape, jt->shape, jt->ndim * sizeof *t->shape) != 0)
                        return conv_err(err, errlen, "tensor %s: shape does not match model %s", jt->name, j.model);
                if (init_from_proto(t->init, &jt->init) < 0)
                        return conv_err(err, errlen, "tensor %s: unknown init %d (zeros, he, xavier)", jt->name,
                                        (int) t->init);
        }

        if (o->kind == PSNET__OPTIM_KIND__OPTIM_SGD)
                j.optim.kind = OPTIM_SGD;
        else if (o->kind == PSNET__OPTIM_KIND__OPTIM_ADAM)
                j.optim.kind = OPTIM_ADAM;
        else
                return conv_err(err, errlen, "optimizer %d is not sgd or adam", (int) o->kind);
        j.optim.lr = o->lr;
        j.optim.momentum = o->momentum;
        j.optim.nesterov = o->nesterov;
        j.optim.weight_decay = o->weight_decay;
        j.optim.beta1 = o->beta1;
        j.optim.beta2 = o->beta2;
        j.optim.eps = o->eps;
        if (mode_from_proto(spec->mode, &j.mode, &j.staleness) < 0)
                return conv_err(err, errlen, "mode %d (staleness %u) is not bsp, asp or ssp:0..%u", (int) spec->mode->mode,
                                spec->mode->staleness, JOB_MAX_STALENESS);
        if (spec->has_lr_scaling && (spec->lr_scaling < PSNET__LR_SCALING__LR_SCALING_NONE ||
                                     spec->lr_scaling > PSNET__LR_SCALING__LR_SCALING_SQRT))
                return conv_err(err, errlen, "lr scaling %d is not none, auto, linear or sqrt", (int) spec->lr_scaling);
        j.lr_scaling = spec->has_lr_scaling ? (LrScaling) spec->lr_scaling : LR_SCALING_NONE;
        j.warmup_clocks = spec->has_warmup_clocks ? spec->warmup_clocks : 0;
        if (spec->has_lr_schedule && (spec->lr_schedule < PSNET__LR_SCHEDULE__LR_SCHEDULE_CONSTANT ||
                                      spec->lr_schedule > PSNET__LR_SCHEDULE__LR_SCHEDULE_COSINE))
                return conv_err(err, errlen, "lr schedule %d is not constant or cosine", (int) spec->lr_schedule);
        j.lr_schedule = spec->has_lr_schedule ? (LrSchedule) spec->lr_schedule : LR_SCHEDULE_CONSTANT;
        if (spec->has_wire && spec->wire != PSNET__DTYPE__DTYPE_F32 && spec->wire != PSNET__DTYPE__DTYPE_BF16)
                return conv_err(err, errlen, "wire dtype %d is not f32 or bf16", (int) spec->wire);
        j.wire = spec->has_wire && spec->wire == PSNET__DTYPE__DTYPE_BF16 ? JOB_WIRE_BF16 : JOB_WIRE_F32;
        j.allow_nonfinite = spec->has_allow_nonfinite && spec->allow_nonfinite;
        j.sparsify = spec->has_sparsify ? spec->sparsify : 0.0f;
        j.max_grad_norm = spec->has_max_grad_norm ? spec->max_grad_norm : 0.0f;
        j.replicas = spec->has_replicas ? spec->replicas : 0;
        if (spec->tables && job_set_tables(&j, spec->tables, err, errlen) < 0)
                return -EINVAL;
        j.seed = spec->seed;
        j.batch = spec->batch;
        j.epochs = spec->epochs;
        if (strlen(spec->dataset) >= sizeof j.dataset)
                return conv_err(err, errlen, "dataset path longer than %zu bytes", sizeof j.dataset - 1);
        snprintf(j.dataset, sizeof j.dataset, "%s", spec->dataset);
        if (spec->init && spec->init[0]) {
                if (strlen(spec->init) >= sizeof j.init || spec->init[0] != '/')
                        return conv_err(err, errlen, "init file: an absolute path shorter than %zu bytes",
                                        sizeof j.init);
                /* Without a size: not checked yet (psctl's submit; pscoord checks it). */
                snprintf(j.init, sizeof j.init, "%s", spec->init);
                j.init_size = spec->has_init_size ? spec->init_size : 0;
                j.init_digest = spec->has_init_digest ? spec->init_digest : 0;
        }
        j.expect_workers = spec->has_expect_workers ? spec->expect_workers : 0;
        j.expect_shards = spec->has_expect_shards ? spec->expect_shards : 0;
        j.train_limit = spec->has_train_limit ? spec->train_limit : 0;
        j.test_limit = spec->has_test_limit ? spec->test_limit : 0;
        if (j.mode == MODE_FED) {
                const Psnet__FedSpec *fs = spec->fed;
                FedConf *f = &j.fed;
                if (!fs || !fs->strategy)
                        return conv_err(err, errlen, "a federated job without its rounds (fed)");
                if (fed_strategy_from_string(fs->strategy, &f->strategy.kind) < 0)
                        return conv_err(err, errlen, "unknown federated strategy '%.32s'", fs->strategy);
                fed_params_default(f->strategy.kind, &f->strategy);
                /* Absent fields keep the defaults (job_defaults, the strategy's). */
                if (fs->has_server_lr)
                        f->strategy.eta = fs->server_lr;
                if (fs->has_server_momentum)
                        f->strategy.beta = fs->server_momentum;
                if (fs->has_beta1)
                        f->strategy.beta1 = fs->beta1;
                if (fs->has_beta2)
                        f->strategy.beta2 = fs->beta2;
                if (fs->has_tau)
                        f->strategy.tau = fs->tau;
                if (fs->has_trim)
                        f->strategy.trim = fs->trim;
                if (fs->has_byzantine)
                        f->strategy.byzantine = fs->byzantine;
                if (fs->has_rounds)
                        f->rounds = fs->rounds;
                if (fs->has_fraction)
                        f->fraction = fs->fraction;
                if (fs->has_min_clients)
                        f->min_clients = fs->min_clients;
                if (fs->has_min_available)
                        f->min_available = fs->min_available;
                if (fs->has_round_timeout_ms)
                        f->round_timeout_ms = fs->round_timeout_ms;
                if (fs->has_local_epochs)
                        f->local_epochs = fs->local_epochs;
                if (fs->has_prox_mu)
                        f->prox_mu = fs->prox_mu;
                if (fs->has_dp_clip)
                        f->strategy.dp_clip = fs->dp_clip;
                if (fs->has_dp_noise)
                        f->strategy.dp_noise = fs->dp_noise;
                if (fs->has_dp_delta)
                        f->dp_delta = fs->dp_delta;
                if (fs->has_secagg)
                        f->secagg = fs->secagg;
                if (fs->has_secagg_clip)
                        f->secagg_clip = fs->secagg_clip;
                if (fs->has_secagg_threshold)
                        f->secagg_threshold = fs->secagg_threshold;
                if (fs->has_secagg_timeout_ms)
                        f->secagg_timeout_ms = fs->secagg_timeout_ms;
                if (fs->has_compress)
                        f->compress = fs->compress > COMPRESS_TOPK ? COMPRESS_TOPK + 1 : (CompressKind) fs->compress;
                if (fs->has_topk)
                        f->topk = fs->topk;
                if (fs->has_eval_every)
                        f->eval_every = fs->eval_every;
                if (fs->has_fraction_evaluate)
                        f->fraction_evaluate = fs->fraction_evaluate;
                if (fs->has_async)
                        f->async = fs->async;
                if (fs->has_buffer)
                        f->buffer = fs->buffer;
                if (fs->has_staleness_exp)
                        f->staleness_exp = fs->staleness_exp;
        }

        r = job_validate(&j, err, errlen);
        if (r < 0)
                return r;
        *ret = j;
        return 0;
}

int64_t job_max_frame(const Job *job) {
        size_t per = job_state_per_value(job);
        int64_t chunk = (int64_t) job->chunk_floats * (int64_t) sizeof(float) * (int64_t) MAX(per, (size_t) 1);
        return MAX(chunk, (int64_t) WIRE_MAX_HEADER);
}

/* --- shard map -------------------------------------------------------------------- */

int shardmap_from_proto(const Psnet__ShardMap *pm, ShardMap **ret) {
        if (!pm || pm->n_shards == 0 || pm->n_shards > 65536)
                return -EINVAL;
        ShardDesc *d = calloc(pm->n_shards, sizeof *d);
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < pm->n_shards; i++) {
                const Psnet__ShardRef *s = pm->shards[i];
                if (!s || !s->has_id || !s->endpoint || !s->endpoint[0] ||
                    (s->has_public_key && s->public_key.len != 32)) {
                        free(d);
                        return -EINVAL;
                }
                d[i].id = s->id;
                d[i].endpoint = s->endpoint;
                if (s->has_public_key) {
                        memcpy(d[i].public_key, s->public_key.data, 32);
                        d[i].has_public_key = true;
                }
        }
        int r = shardmap_from_owners(pm->epoch, d, pm->n_shards, pm->tensor_chunks, pm->n_tensor_chunks, pm->owners,
                                     pm->n_owners, ret);
        free(d);
        if (r == 0 && pm->has_replicas && pm->replicas > pm->n_shards) {
                *ret = shardmap_free(*ret);
                return -EINVAL;
        }
        if (r == 0)
                shardmap_set_replicas(*ret, pm->has_replicas ? pm->replicas : 1);
        return r;
}

void shardmap_proto_free(Psnet__ShardMap *pm) {
        if (!pm)
                return;
        if (pm->shards)
                for (size_t i = 0; i < pm->n_shards; i++)
                        free(pm->shards[i]);
        free(pm->shards);
        free(pm);
}

int shardmap_to_proto(const ShardMap *m, Psnet__ShardMap **ret) {
        size_t n = shardmap_size(m);
        Psnet__ShardMap *pm = malloc(sizeof *pm);
        if (!pm)
                return -ENOMEM;
        psnet__shard_map__init(pm);
        pm->shards = calloc(n, sizeof *pm->shards);
        if (!pm->shards) {
                free(pm);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                const ShardDesc *d = shardmap_shard(m, i);
                Psnet__ShardRef *s = malloc(sizeof *s);
                if (!s) {
                        shardmap_proto_free(pm);
                        return -ENOMEM;
                }
                psnet__shard_ref__init(s);
                s->has_id = true;
                s->id = d->id;
                s->endpoint = d->endpoint;  /* borrowed from m */
                s->has_public_key = d->has_public_key;
                s->public_key.len = d->has_public_key ? 32 : 0;
                s->public_key.data = d->has_public_key ? (uint8_t *) d->public_key : NULL;
                pm->shards[pm->n_shards++] = s;
        }
        pm->epoch = shardmap_epoch(m);
        /* Borrowed from m too: uint32_t arrays as protobuf-c wants them. */
        pm->n_tensor_chunks = shardmap_ntensors(m);
        pm->tensor_chunks = (uint32_t *) shardmap_tensor_chunks_array(m);
        pm->n_owners = shardmap_nkeys(m);
        pm->owners = (uint32_t *) shardmap_owners(m);
        pm->has_replicas = true;
        pm->replicas = shardmap_replicas(m);
        *ret = pm;
        return 0;
}
