/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/job-init.c, a job started from a safetensors file
 * (--init): a file with the model's tensors passes pscoord's check, which
 * records its size and digest; a shard reads every chunk's values from it
 * (chunks cut across the tensors); each refusal names the file, the tensor
 * and the reason: a tensor missing, another shape, a tensor the model has
 * not, NaN or infinity (taken with allow_nonfinite), a relative path, no
 * file; a file changed after the check is refused by the shard; the path,
 * size and digest cross the wire. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "job-init.h"
#include "tap.h"
#include "wire-job.h"

#define NT 4
static const char *names[NT] = { "0.weight", "0.bias", "2.weight", "2.bias" };
static const uint64_t shapes[NT][2] = { { 3, 4 }, { 3, 0 }, { 2, 3 }, { 2, 0 } };
static const unsigned ndims[NT] = { 2, 1, 2, 1 };
static float vals[NT][12];

/* The model mlp:4-3-2's tensors (value = 100 t + i), with changes: skip
 * tensor `skip`, give tensor `reshape` another shape, add a tensor `extra`,
 * poison = a value to put at 0.bias[1]. */
static void write_file(const char *path, int skip, int reshape, const char *extra, float poison) {
        StOut out[NT + 1];
        uint64_t other[2] = { 4, 3 }, es[1] = { 1 };
        size_t n = 0;
        for (int t = 0; t < NT; t++) {
                for (int i = 0; i < 12; i++)
                        vals[t][i] = 100.0f * (float) t + (float) i + 0.5f;
                if (t == skip)
                        continue;
                out[n++] = (StOut) { names[t], ndims[t], t == reshape ? other : shapes[t], vals[t] };
        }
        vals[1][1] = poison;
        if (extra)
                out[n++] = (StOut) { extra, 1, es, vals[0] };
        char err[256];
        const char *meta[2] = { "format", "pt" };
        int r = st_write(path, out, n, meta, 1, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "st_write: %s\n", err);
                abort();
        }
}

static Job model(void) {
        Job j;
        job_defaults(&j);
        if (job_set_model(&j, "mlp:4-3-2") < 0 || job_set_chunk(&j, 5) < 0)
                abort();
        return j;
}

static void refused(const char *what, const char *path, const char *want) {
        Job j = model();
        char err[512] = "";
        int r = job_init_check(&j, path, err, sizeof err);
        CHECK(r < 0 && strstr(err, want) && !j.init[0] && !j.init_size, "%s: refused (%s)", what, err);
}

int main(void) {
        char path[] = "/tmp/test-job-init-XXXXXX", err[512];
        int fd = mkstemp(path);
        CHECK(fd >= 0 && close(fd) == 0, "a temporary file");

        write_file(path, -1, -1, NULL, 1.5f);
        Job j = model();
        int r = job_init_check(&j, path, err, sizeof err);
        CHECK(r == 0 && strcmp(j.init, path) == 0 && j.init_size > 0 && j.init_digest != 0,
              "the model's tensors pass (%s), size %llu", r ? err : "ok", (unsigned long long) j.init_size);

        /* A shard reads every chunk (5 values each: 0.weight in 3 chunks). */
        StFile f;
        r = job_init_open(&j, &f, err, sizeof err);
        CHECK(r == 0 && f.len == j.init_size, "a shard opens the file checked (%s)", r ? err : "ok");
        int bad = 0, chunks = 0;
        for (uint32_t t = 0; r == 0 && t < j.ntensors; t++)
                for (uint32_t c = 0; c < j.tensors[t].nchunks; c++) {
                        float got[5] = { -1, -1, -1, -1, -1 };
                        uint32_t len = job_chunk_len(&j, t, c);
                        job_init_chunk_from(&j, &f, t, c, got);
                        chunks++;
                        for (uint32_t i = 0; i < len; i++)
                                bad += got[i] != vals[t][c * 5 + i];
                        for (uint32_t i = len; i < 5; i++)
                                bad += got[i] != -1.0f; /* nothing past the chunk */
                }
        CHECK(r == 0 && bad == 0 && chunks == 3 + 1 + 2 + 1, "every chunk is the file's values (%d chunks, %d wrong)",
              chunks, bad);
        if (r == 0)
                st_free(&f);

        /* The path, size and digest cross the wire; a spec without size is not yet checked. */
        Psnet__JobSpec *spec = NULL;
        Job back;
        r = job_to_proto(&j, &spec);
        r = r == 0 ? job_from_proto(spec, &back, err, sizeof err) : r;
        CHECK(r == 0 && strcmp(back.init, j.init) == 0 && back.init_size == j.init_size &&
                      back.init_digest == j.init_digest,
              "init, its size and digest cross the wire (%s)", r ? err : "ok");
        if (spec)
                job_proto_free(spec);
        Job unchecked = model();
        snprintf(unchecked.init, sizeof unchecked.init, "%s", path);
        spec = NULL;
        r = job_to_proto(&unchecked, &spec);
        r = r == 0 ? job_from_proto(spec, &back, err, sizeof err) : r;
        CHECK(r == 0 && strcmp(back.init, path) == 0 && back.init_size == 0, "psctl's unchecked init crosses too");
        if (spec)
                job_proto_free(spec);
        r = job_init_open(&back, &f, err, sizeof err);
        CHECK(r == -ESTALE && strstr(err, "not the file pscoord checked"), "a shard refuses an unchecked file (%s)",
              err);

        /* The file changes after the check: a shard refuses it. */
        write_file(path, -1, -1, NULL, 2.5f);
        r = job_init_open(&j, &f, err, sizeof err);
        CHECK(r == -ESTALE && strstr(err, "its bytes differ") && strstr(err, path), "changed values: refused (%s)",
              err);
        write_file(path, -1, -1, "extra", 1.5f);
        Job bigger = model();
        CHECK(job_init_check(&bigger, path, err, sizeof err) < 0, "setup: a file with an extra tensor");
        r = job_init_open(&j, &f, err, sizeof err);
        CHECK(r == -EINVAL && strstr(err, "'extra'"), "an extra tensor at the shard: refused (%s)", err);

        /* Refusals, each with its reason. */
        write_file(path, 2, -1, NULL, 1.5f);
        refused("a tensor missing", path, "has no tensor '2.weight' (the model's [2, 3])");
        write_file(path, -1, 0, NULL, 1.5f);
        refused("another shape", path, "tensor '0.weight' is [4, 3] in");
        write_file(path, -1, -1, "3.weight", 1.5f);
        refused("a tensor the model has not", path, "holds tensor '3.weight', which the model");
        write_file(path, -1, -1, NULL, NAN);
        refused("NaN", path, "tensor '0.bias' of");
        refused("NaN, its index", path, "holds NaN at index 1");
        write_file(path, -1, -1, NULL, -INFINITY);
        refused("infinity", path, "an infinite value at index 1");
        Job nf = model();
        nf.allow_nonfinite = true;
        CHECK(job_init_check(&nf, path, err, sizeof err) == 0, "taken with allow_nonfinite");
        refused("a relative path", "model.safetensors", "an absolute path");
        refused("no file", "/nonexistent/psnet/x.safetensors", "/nonexistent/psnet/x.safetensors");
        FILE *o = fopen(path, "w");
        CHECK(o && fputs("not a safetensors file at all", o) >= 0 && fclose(o) == 0, "setup: garbage");
        refused("garbage", path, path);

        /* A job's validation refuses a relative init. */
        Job rel = model();
        snprintf(rel.init, sizeof rel.init, "x.safetensors");
        CHECK(job_validate(&rel, err, sizeof err) < 0 && strstr(err, "not an absolute path"), "job_validate: %s", err);

        unlink(path);
        return tap_done();
}
