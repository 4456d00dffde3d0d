/* SPDX-License-Identifier: Apache-2.0 */
/* For side-by-side benchmarks with another federated framework: writes the
 * split of the training set among clients that workerd --edge computes
 * (partition_client, the same labels, seed, client count and alpha) and the
 * initial model pscoord's job starts from (job_init_chunk, the same seed), so
 * that the other framework trains the same clients from the same weights.
 *
 *   bench-fedsplit --out DIR [--data DIR] [--clients 100] [--alpha A|iid]
 *                  [--seed 42] [--model mlp:784-256-10] [--train-limit N]
 *
 * DIR gets split.txt (line k: client k's image indices, ascending, space
 * separated) and one NAME.f32 per tensor (row-major float32, the shape of the
 * job's tensor: W as [out, in], PyTorch's layout), and model.txt (one line per
 * tensor: name and shape). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "idx.h"
#include "job.h"
#include "partition.h"

static int usage(FILE *f, int rc) {
        fputs("usage: bench-fedsplit --out DIR [--data DIR] [--clients N] [--alpha A|iid] [--seed S]\n"
              "                      [--model mlp:784-256-10] [--train-limit N]\n",
              f);
        return rc;
}

static int write_tensor(const char *dir, const Job *job, uint32_t t, FILE *index) {
        const JobTensor *jt = &job->tensors[t];
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.f32", dir, jt->name);
        FILE *f = fopen(path, "wb");
        if (!f) {
                fprintf(stderr, "bench-fedsplit: %s: %s\n", path, strerror(errno));
                return -1;
        }
        float *buf = ps_malloc((size_t) job->chunk_floats * sizeof(float));
        int r = buf ? 0 : -1;
        for (uint32_t c = 0; r == 0 && c < jt->nchunks; c++) {
                uint32_t len = job_chunk_len(job, t, c);
                job_init_chunk(job, t, c, buf);
                if (fwrite(buf, sizeof(float), len, f) != len)
                        r = -1;
        }
        free(buf);
        if (fclose(f) != 0 || r < 0) {
                fprintf(stderr, "bench-fedsplit: cannot write %s\n", path);
                return -1;
        }
        fprintf(index, "%s", jt->name);
        for (uint32_t d = 0; d < jt->ndim; d++)
                fprintf(index, " %u", jt->shape[d]);
        fputc('\n', index);
        return 0;
}

int main(int argc, char **argv) {
        const char *out = NULL, *data = NULL, *model = "mlp:784-256-10";
        unsigned long clients = 100, seed = 42, limit = 0;
        double alpha = 0.5;
        for (int i = 1; i < argc; i += 2) { /* OPTION VALUE pairs */
                const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (!strcmp(a, "-h") || !strcmp(a, "--help"))
                        return usage(stdout, 0);
                if (!v)
                        return usage(stderr, 2);
                char *end = NULL;
                errno = 0;
                if (!strcmp(a, "--out"))
                        out = v;
                else if (!strcmp(a, "--data"))
                        data = v;
                else if (!strcmp(a, "--model"))
                        model = v;
                else if (!strcmp(a, "--alpha"))
                        alpha = strcmp(v, "iid") == 0 ? 0 : strtod(v, &end);
                else if (!strcmp(a, "--clients"))
                        clients = strtoul(v, &end, 10);
                else if (!strcmp(a, "--seed"))
                        seed = strtoul(v, &end, 10);
                else if (!strcmp(a, "--train-limit"))
                        limit = strtoul(v, &end, 10);
                else
                        return usage(stderr, 2);
                if (errno || (end && *end) || clients == 0 || clients > 100000 || limit > UINT32_MAX) {
                        fprintf(stderr, "bench-fedsplit: bad value '%s' for %s\n", v, a);
                        return 2;
                }
        }
        if (!out)
                return usage(stderr, 2);

        Job job;
        job_defaults(&job);
        job.seed = seed;
        if (job_set_model(&job, model) < 0) {
                fprintf(stderr, "bench-fedsplit: bad model '%s'\n", model);
                return 2;
        }
        char err[512];
        Dataset *train = NULL;
        if (dataset_load(data ? data : job.dataset, "train", (uint32_t) limit, 0, 1, &train, err, sizeof err) < 0) {
                fprintf(stderr, "bench-fedsplit: %s\n", err);
                return 1;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/split.txt", out);
        FILE *f = fopen(path, "w");
        if (!f) {
                fprintf(stderr, "bench-fedsplit: %s: %s\n", path, strerror(errno));
                dataset_free(train);
                return 1;
        }
        int rc = 0;
        for (uint32_t k = 0; k < clients && rc == 0; k++) {
                uint32_t *mine = NULL, n = 0;
                int r = partition_client(train->y, train->n, train->classes, (uint32_t) clients, alpha, job.seed, k, &mine, &n);
                if (r < 0) {
                        fprintf(stderr, "bench-fedsplit: cannot split: %s\n", strerror(-r));
                        rc = 1;
                        break;
                }
                for (uint32_t i = 0; i < n; i++)
                        fprintf(f, i ? " %u" : "%u", mine[i]);
                fputc('\n', f);
                free(mine);
        }
        if (fclose(f) != 0 && rc == 0) {
                fprintf(stderr, "bench-fedsplit: cannot write %s\n", path);
                rc = 1;
        }
        dataset_free(train);
        snprintf(path, sizeof path, "%s/model.txt", out);
        FILE *index = rc == 0 ? fopen(path, "w") : NULL;
        if (rc == 0 && !index) {
                fprintf(stderr, "bench-fedsplit: %s: %s\n", path, strerror(errno));
                rc = 1;
        }
        for (uint32_t t = 0; rc == 0 && t < job.ntensors; t++)
                if (write_tensor(out, &job, t, index) < 0)
                        rc = 1;
        if (index && fclose(index) != 0 && rc == 0) {
                fprintf(stderr, "bench-fedsplit: cannot write %s\n", path);
                rc = 1;
        }
        return rc;
}
