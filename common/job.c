/* A training job (see job.h): the MLP's tensors and how they are cut into
 * chunks (keys), deterministic initial values, validation, and conversion to
 * and from the wire's JobSpec.
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
#include "macro.h"
#include "psnet-config.h"

#define JOB_MAX_CHUNK_FLOATS (64u * 1024u * 1024u)
#define JOB_MIN_WIDTHS 2
#define JOB_MAX_WIDTHS 16
#define JOB_MAX_WIDTH 65536u
#define JOB_MAX_BATCH (1u << 20)
#define JOB_MAX_EPOCHS 1000000u
#define JOB_MAX_PEERS 65536u

static int job_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int job_err(char *err, size_t errlen, const char *fmt, ...) {
        va_list ap;
        if (err && errlen > 0) {
                va_start(ap, fmt);
                vsnprintf(err, errlen, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

static bool init_known(const char *s) {
        return strcmp(s, "zeros") == 0 || strcmp(s, "he") == 0 || strcmp(s, "xavier") == 0;
}

/* Copies s into a fixed buffer; false if it does not fit. */
static bool copy_str(char *dst, size_t size, const char *s) {
        size_t n = strlen(s);
        if (n >= size)
                return false;
        memcpy(dst, s, n + 1);
        return true;
}

void job_defaults(Job *job) {
        int r _unused_;

        memset(job, 0, sizeof *job);
        snprintf(job->optim.kind, sizeof job->optim.kind, "sgd");
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
        snprintf(job->dataset, sizeof job->dataset, "%s", PSNET_DEFAULT_DATA);
        r = job_set_model(job, "mlp:784-256-10");
        assert(r == 0);
}

int job_set_model(Job *job, const char *model) {
        uint32_t widths[JOB_MAX_WIDTHS];
        JobTensor tensors[JOB_MAX_TENSORS];
        size_t n = 0;
        const char *p;

        if (!model || strncmp(model, "mlp:", 4) != 0 || strlen(model) >= sizeof job->model)
                return -EINVAL;
        if (job->chunk_floats < 1 || job->chunk_floats > JOB_MAX_CHUNK_FLOATS)
                return -EINVAL;

        p = model + 4;
        for (;;) {
                uint64_t v = 0;
                const char *start = p;
                while (*p >= '0' && *p <= '9') {
                        v = v * 10 + (uint64_t) (*p - '0');
                        if (v > JOB_MAX_WIDTH)
                                return -EINVAL;
                        p++;
                }
                if (p == start || v < 1 || n == JOB_MAX_WIDTHS)
                        return -EINVAL;
                widths[n++] = (uint32_t) v;
                if (*p == '\0')
                        break;
                if (*p != '-')
                        return -EINVAL;
                p++;
        }
        if (n < JOB_MIN_WIDTHS)
                return -EINVAL;

        memset(tensors, 0, sizeof tensors);
        for (size_t l = 0; l + 1 < n; l++) {
                JobTensor *w = &tensors[2 * l], *b = &tensors[2 * l + 1];
                uint64_t nchunks;

                snprintf(w->name, sizeof w->name, "W%zu", l);
                w->ndim = 2;
                w->shape[0] = widths[l + 1];
                w->shape[1] = widths[l];
                w->numel = (uint64_t) widths[l + 1] * widths[l];
                snprintf(w->init, sizeof w->init, "he");

                snprintf(b->name, sizeof b->name, "b%zu", l);
                b->ndim = 1;
                b->shape[0] = widths[l + 1];
                b->numel = widths[l + 1];
                snprintf(b->init, sizeof b->init, "zeros");

                for (JobTensor *t = w; t <= b; t++) {
                        t->fan_in = widths[l];
                        t->fan_out = widths[l + 1];
                        nchunks = (t->numel + job->chunk_floats - 1) / job->chunk_floats;
                        if (nchunks > UINT32_MAX)
                                return -EINVAL;
                        t->nchunks = (uint32_t) nchunks;
                }
        }

        snprintf(job->model, sizeof job->model, "%s", model);
        memcpy(job->tensors, tensors, sizeof tensors);
        job->ntensors = 2 * (n - 1);
        memset(job->layers, 0, sizeof job->layers);
        memcpy(job->layers, widths, n * sizeof widths[0]);
        job->nlayers = n;
        return 0;
}

int job_set_mode(Job *job, const char *mode) {
        if (!mode)
                return -EINVAL;
        if (strcmp(mode, "bsp") == 0)
                job->mode = MODE_BSP;
        else if (strcmp(mode, "asp") == 0)
                job->mode = MODE_ASP;
        else if (strncmp(mode, "ssp:", 4) == 0) {
                char *end;
                errno = 0;
                if (mode[4] < '0' || mode[4] > '9')
                        return -EINVAL;
                unsigned long v = strtoul(mode + 4, &end, 10);
                if (errno || *end || v > JOB_MAX_STALENESS)
                        return -EINVAL;
                job->mode = MODE_SSP;
                job->staleness = (uint32_t) v;
                return 0;
        } else
                return -EINVAL;
        job->staleness = 0;
        return 0;
}

const char *job_mode_string(const Job *job, char *buf, size_t n) {
        if (job->mode == MODE_SSP)
                snprintf(buf, n, "ssp:%u", job->staleness);
        else
                snprintf(buf, n, "%s", job->mode == MODE_ASP ? "asp" : "bsp");
        return buf;
}

int job_set_optim(Job *job, const char *kind) {
        if (!kind || (strcmp(kind, "sgd") != 0 && strcmp(kind, "adam") != 0))
                return -EINVAL;
        snprintf(job->optim.kind, sizeof job->optim.kind, "%s", kind);
        return 0;
}

static bool str_terminated(const char *s, size_t size) {
        return memchr(s, '\0', size) != NULL;
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
        if (job->nlayers < JOB_MIN_WIDTHS || job->nlayers > JOB_MAX_WIDTHS ||
            job->ntensors != 2 * (job->nlayers - 1))
                return job_err(err, errlen, "model '%s' has %zu layers and %zu tensors", job->model,
                               job->nlayers, job->ntensors);
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
                if (!str_terminated(t->init, sizeof t->init) || !init_known(t->init))
                        return job_err(err, errlen, "tensor %s: unknown init (zeros, he, xavier)", t->name);
                if (t->fan_in == 0 || t->fan_out == 0)
                        return job_err(err, errlen, "tensor %s has fan_in %u, fan_out %u", t->name,
                                       t->fan_in, t->fan_out);
                nkeys += t->nchunks;
        }
        if (nkeys > UINT32_MAX)
                return job_err(err, errlen, "%llu keys is too many", (unsigned long long) nkeys);

        if (!str_terminated(o->kind, sizeof o->kind) ||
            (strcmp(o->kind, "sgd") != 0 && strcmp(o->kind, "adam") != 0))
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
        if (job->mode != MODE_BSP && job->mode != MODE_ASP && job->mode != MODE_SSP)
                return job_err(err, errlen, "mode must be bsp, asp or ssp:S");
        if (job->staleness > JOB_MAX_STALENESS)
                return job_err(err, errlen, "staleness %u out of range 0..%u", job->staleness, JOB_MAX_STALENESS);
        if (job->batch < 1 || job->batch > JOB_MAX_BATCH)
                return job_err(err, errlen, "batch %u out of range 1..%u", job->batch, JOB_MAX_BATCH);
        if (job->epochs < 1 || job->epochs > JOB_MAX_EPOCHS)
                return job_err(err, errlen, "epochs %u out of range 1..%u", job->epochs, JOB_MAX_EPOCHS);
        if (!str_terminated(job->dataset, sizeof job->dataset) || job->dataset[0] == '\0')
                return job_err(err, errlen, "dataset is empty");
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

        if (strcmp(jt->init, "he") == 0) {
                double std = sqrt(2.0 / (double) jt->fan_in);
                for (uint32_t k = 0; k < len; k++) {
                        /* Box-Muller; u1 in (0, 1] keeps the log finite. */
                        double u1 = 1.0 - rng_unit(rng_bits(job->seed, t, base + k, 0));
                        double u2 = rng_unit(rng_bits(job->seed, t, base + k, 1));
                        out[k] = (float) (std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
                }
        } else if (strcmp(jt->init, "xavier") == 0) {
                double a = sqrt(6.0 / ((double) jt->fan_in + (double) jt->fan_out));
                for (uint32_t k = 0; k < len; k++)
                        out[k] = (float) (a * (2.0 * rng_unit(rng_bits(job->seed, t, base + k, 0)) - 1.0));
        } else
                memset(out, 0, (size_t) len * sizeof *out);
}

/* --- wire conversion ------------------------------------------------------------- */

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
                        free(t->init);
                        free(t);
                }
                free(spec->tensors);
        }
        if (spec->optim)
                free(spec->optim->kind);
        free(spec->optim);
        free(spec->mode);
        free(spec->dataset);
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
        char mode[32];
        s->mode = strdup(job_mode_string(job, mode, sizeof mode));
        s->has_lr_scaling = true;
        s->lr_scaling = job->lr_scaling;
        s->dataset = strdup(job->dataset);
        s->optim = o = malloc(sizeof *o);
        if (o) {
                psnet__optim_spec__init(o);
                o->kind = strdup(job->optim.kind);
        }
        s->tensors = calloc(job->ntensors ? job->ntensors : 1, sizeof *s->tensors);
        if (!s->model || !s->mode || !s->dataset || !o || !o->kind || !s->tensors)
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
                t->init = strdup(jt->init);
                t->shape = malloc(jt->ndim * sizeof *t->shape);
                if (!t->name || !t->init || !t->shape)
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
        *ret = s;
        return 0;

nomem:
        job_proto_free(s);
        return -ENOMEM;
}

int job_from_proto(const Psnet__JobSpec *spec, Job *ret, char *err, size_t errlen) {
        const Psnet__OptimSpec *o;
        Job j;
        int r;

        if (err && errlen > 0)
                err[0] = '\0';
        if (!spec)
                return job_err(err, errlen, "no job spec");
        if (!spec->model || !spec->mode || !spec->dataset || !spec->optim || !spec->optim->kind)
                return job_err(err, errlen, "job spec lacks a required field");
        o = spec->optim;

        job_defaults(&j);
        j.id = spec->id;
        if (spec->chunk_floats < 1 || spec->chunk_floats > JOB_MAX_CHUNK_FLOATS)
                return job_err(err, errlen, "chunk_floats %u out of range 1..%u", spec->chunk_floats,
                               JOB_MAX_CHUNK_FLOATS);
        j.chunk_floats = spec->chunk_floats;
        r = job_set_model(&j, spec->model);
        if (r < 0)
                return job_err(err, errlen, "bad model '%.64s' (expected mlp:D0-D1-...-Dn, 2..%d widths of 1..%u)",
                               spec->model, JOB_MAX_WIDTHS, JOB_MAX_WIDTH);

        if (spec->n_tensors > JOB_MAX_TENSORS)
                return job_err(err, errlen, "%zu tensors, at most %d", spec->n_tensors, JOB_MAX_TENSORS);
        if (spec->n_tensors != j.ntensors)
                return job_err(err, errlen, "model %s has %zu tensors, spec lists %zu", j.model, j.ntensors,
                               spec->n_tensors);
        if (spec->n_tensors > 0 && !spec->tensors)
                return job_err(err, errlen, "tensor list missing");
        for (size_t i = 0; i < spec->n_tensors; i++) {
                const Psnet__TensorSpec *t = spec->tensors[i];
                JobTensor *jt = &j.tensors[i];
                if (!t || !t->name || !t->init)
                        return job_err(err, errlen, "tensor %zu lacks a required field", i);
                if (strcmp(t->name, jt->name) != 0)
                        return job_err(err, errlen, "tensor %zu is named '%.32s', model %s says %s", i, t->name,
                                       j.model, jt->name);
                if (t->n_shape != jt->ndim || (t->n_shape > 0 && !t->shape) ||
                    memcmp(t->shape, jt->shape, jt->ndim * sizeof *t->shape) != 0)
                        return job_err(err, errlen, "tensor %s: shape does not match model %s", jt->name, j.model);
                if (!init_known(t->init))
                        return job_err(err, errlen, "tensor %s: unknown init '%.16s' (zeros, he, xavier)",
                                       jt->name, t->init);
                snprintf(jt->init, sizeof jt->init, "%s", t->init);
        }

        if (job_set_optim(&j, o->kind) < 0)
                return job_err(err, errlen, "optimizer '%.16s' is not sgd or adam", o->kind);
        j.optim.lr = o->lr;
        j.optim.momentum = o->momentum;
        j.optim.nesterov = o->nesterov;
        j.optim.weight_decay = o->weight_decay;
        j.optim.beta1 = o->beta1;
        j.optim.beta2 = o->beta2;
        j.optim.eps = o->eps;
        if (job_set_mode(&j, spec->mode) < 0)
                return job_err(err, errlen, "mode '%.16s' is not bsp, asp or ssp:S", spec->mode);
        j.lr_scaling = spec->has_lr_scaling && spec->lr_scaling;
        j.seed = spec->seed;
        j.batch = spec->batch;
        j.epochs = spec->epochs;
        if (!copy_str(j.dataset, sizeof j.dataset, spec->dataset))
                return job_err(err, errlen, "dataset path longer than %zu bytes", sizeof j.dataset - 1);
        j.expect_workers = spec->has_expect_workers ? spec->expect_workers : 0;
        j.expect_shards = spec->has_expect_shards ? spec->expect_shards : 0;
        j.train_limit = spec->has_train_limit ? spec->train_limit : 0;
        j.test_limit = spec->has_test_limit ? spec->test_limit : 0;

        r = job_validate(&j, err, errlen);
        if (r < 0)
                return r;
        *ret = j;
        return 0;
}
