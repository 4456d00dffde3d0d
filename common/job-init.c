/* SPDX-License-Identifier: Apache-2.0 */
/* A job's initial values from a safetensors file; see job-init.h. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include "hash.h"
#include "job-init.h"

/* The most bytes a file for job may have: its values and the largest header. */
static uint64_t max_file(const Job *job) {
        return 8 + (uint64_t) ST_MAX_HEADER + job_nfloats(job) * sizeof(float);
}

/* The model's tensors against the file's: names, shapes, nothing more. */
static int check_tensors(const Job *job, const char *path, const StFile *f, char *err, size_t n) {
        for (size_t i = 0; i < job->ntensors; i++) {
                const JobTensor *jt = &job->tensors[i];
                uint64_t want[4];
                char a[96], b[96];
                for (unsigned d = 0; d < jt->ndim; d++)
                        want[d] = jt->shape[d];
                md_dims_string(want, jt->ndim, a, sizeof a);
                const StTensor *t = st_find(f, jt->name);
                if (!t) {
                        snprintf(err, n, "%s has no tensor '%s' (the model's %s)", path, jt->name, a);
                        return -EINVAL;
                }
                bool same = t->ndim == jt->ndim;
                for (unsigned d = 0; same && d < jt->ndim; d++)
                        same = t->shape[d] == want[d];
                if (!same) {
                        md_dims_string(t->shape, t->ndim, b, sizeof b);
                        snprintf(err, n, "tensor '%s' is %s in %s; the model's is %s", jt->name, b, path, a);
                        return -EINVAL;
                }
        }
        if (f->ntensors != job->ntensors)
                for (size_t i = 0; i < f->ntensors; i++) {
                        bool known = false;
                        for (size_t k = 0; !known && k < job->ntensors; k++)
                                known = strcmp(f->tensors[i].name, job->tensors[k].name) == 0;
                        if (!known) {
                                snprintf(err, n, "%s holds tensor '%s', which the model (%s) has not", path,
                                         f->tensors[i].name, job->model_name);
                                return -EINVAL;
                        }
                }
        return 0;
}

static int open_checked(const Job *job, const char *path, StFile *f, char *err, size_t n) {
        int r = st_read(path, max_file(job), f, err, n);
        if (r == -EFBIG)
                snprintf(err, n, "%s is larger than a file of the model's %llu values can be", path,
                         (unsigned long long) job_nfloats(job));
        if (r < 0)
                return r;
        r = check_tensors(job, path, f, err, n);
        if (r < 0)
                st_free(f);
        return r;
}

int job_init_check(Job *job, const char *file, char *err, size_t n) {
        char path[sizeof job->init];
        StFile f;
        size_t len = strlen(file);
        if (file[0] != '/' || len >= sizeof path) {
                snprintf(err, n, "init file '%s': an absolute path of at most %zu bytes (every shard reads it)",
                         file, sizeof path - 1);
                return -EINVAL;
        }
        memcpy(path, file, len + 1); /* file may be job->init */
        int r = open_checked(job, path, &f, err, n);
        if (r < 0)
                return r;
        for (size_t i = 0; !job->allow_nonfinite && r == 0 && i < f.ntensors; i++) {
                const StTensor *t = &f.tensors[i];
                for (uint64_t k = 0; k < t->numel; k++) {
                        float v;
                        memcpy(&v, t->data + k, sizeof v);
                        if (!isfinite(v)) {
                                snprintf(err, n, "tensor '%s' of %s holds %s at index %llu", t->name, path,
                                         isnan(v) ? "NaN" : "an infinite value", (unsigned long long) k);
                                r = -EINVAL;
                                break;
                        }
                }
        }
        if (r == 0) {
                memcpy(job->init, path, len + 1);
                job->init_size = f.len;
                job->init_digest = digest64(f.buf, f.len);
        }
        st_free(&f);
        return r;
}

int job_init_open(const Job *job, StFile *ret, char *err, size_t n) {
        int r = open_checked(job, job->init, ret, err, n);
        if (r < 0)
                return r;
        const char *why = ret->len != job->init_size                          ? "its size differs"
                          : digest64(ret->buf, ret->len) != job->init_digest ? "its bytes differ"
                                                                              : NULL;
        if (why) {
                snprintf(err, n, "%s is not the file pscoord checked when the job was submitted (%s): it changed "
                         "since, or this host sees another file at that path", job->init, why);
                st_free(ret);
                return -ESTALE;
        }
        return 0;
}

void job_init_chunk_from(const Job *job, const StFile *f, uint32_t t, uint32_t c, float *out) {
        const StTensor *st = st_find(f, job->tensors[t].name);
        uint32_t len = job_chunk_len(job, t, c);
        if (st && len)
                memcpy(out, st->data + (uint64_t) c * job->chunk_floats, (size_t) len * sizeof *out);
}
