/* SPDX-License-Identifier: Apache-2.0 */
/* A federated client's work without sockets: the local training step
 * (worker/workerd/edge-train.c) against softmax regression computed here in
 * double from its formulas (the gradient of cross-entropy over a linear
 * layer is (softmax(Wx + b) - onehot(y)) x^T, so two full-batch epochs of
 * FedProx are w1 = w0 - lr g(w0), w2 = w1 - lr (g(w1) + mu (w1 - w0))), the
 * examples' order as a function of the seed alone; and the update on its
 * way out (worker/client/edge-update.c): clipped to the job's norm, refused
 * when not finite, and each --compress codec decoded by the shard's decoder
 * (compress_decode) back to the values within the codec's bound, top-k's
 * error feedback keeping exactly what the frames left out; the frames'
 * memory outlives the update while ZeroMQ holds a frame (the sanitizer
 * build would see a use after free, or a leak). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "compress.h"
#include "edge-train.h"
#include "edge-update.h"
#include "kernels.h"
#include "macro.h"
#include "tap.h"

#define RNG_SEED 0x3c6ef372fe94f82bull
#include "rng.h"

#define IN 6
#define OUT 4
#define N 12

static float xs[N * IN];
static int32_t ys[N];

/* One full-batch gradient of mean cross-entropy at (W, b), in double. */
static void grad_ref(const double *W, const double *b, double *gW, double *gb) {
        memset(gW, 0, sizeof(double) * OUT * IN);
        memset(gb, 0, sizeof(double) * OUT);
        for (int n = 0; n < N; n++) {
                double z[OUT], mx = -INFINITY, s = 0;
                for (int o = 0; o < OUT; o++) {
                        z[o] = b[o];
                        for (int i = 0; i < IN; i++)
                                z[o] += W[o * IN + i] * xs[n * IN + i];
                        mx = fmax(mx, z[o]);
                }
                for (int o = 0; o < OUT; o++)
                        s += (z[o] = exp(z[o] - mx));
                for (int o = 0; o < OUT; o++) {
                        double d = (z[o] / s - (o == ys[n])) / N;
                        gb[o] += d;
                        for (int i = 0; i < IN; i++)
                                gW[o * IN + i] += d * xs[n * IN + i];
                }
        }
}

static void test_train(void) {
        KBackend *kb = NULL;
        Model *m = NULL;
        char err[256];
        int r = kbackend_new("cpu", 1, &kb, err, sizeof err);
        if (r == 0)
                r = model_new_text(kb, "mlp:6-4", N, &m, err, sizeof err);
        if (!CHECK(r == 0 && model_ntensors(m) == 2, "softmax regression on the cpu backend (%s)", r ? err : "ok")) {
                model_free(m);
                kbackend_free(kb);
                return;
        }
        for (int i = 0; i < N * IN; i++)
                xs[i] = (float) rng_uniform(-1.7f, 1.7f);
        for (int n = 0; n < N; n++)
                ys[n] = (int32_t) (rng_next() % OUT);
        Dataset d = { .n = N, .dim = IN, .classes = OUT, .x = xs, .y = ys };
        double W0[OUT * IN], b0[OUT];
        float w0W[OUT * IN], w0b[OUT], uW[OUT * IN], ub[OUT];
        float *w0[2] = { w0W, w0b }, *upd[2] = { uW, ub };
        for (int k = 0; k < OUT * IN; k++)
                W0[k] = w0W[k] = (float) (0.3 * rng_uniform(-1.7f, 1.7f));
        for (int o = 0; o < OUT; o++)
                b0[o] = w0b[o] = (float) (0.1 * rng_uniform(-1.7f, 1.7f));
        const float lr = 0.5f, mu = 0.3f;
        uint32_t mine[N];

        /* Two full-batch epochs with FedProx, against the formulas. */
        memcpy(model_param_host(m, 0), w0W, sizeof w0W);
        memcpy(model_param_host(m, 1), w0b, sizeof w0b);
        for (uint32_t k = 0; k < N; k++)
                mine[k] = N - 1 - k;
        EdgeTrain c = { .local_epochs = 2, .batch = N, .lr = lr, .mu = mu, .seed = 7 };
        double loss = -1;
        r = edge_train(m, &d, mine, N, &c, w0, upd, &loss);
        double W1[OUT * IN], b1[OUT], gW[OUT * IN], gb[OUT], want_W[OUT * IN], want_b[OUT];
        grad_ref(W0, b0, gW, gb);
        for (int k = 0; k < OUT * IN; k++)
                W1[k] = W0[k] - lr * gW[k];
        for (int o = 0; o < OUT; o++)
                b1[o] = b0[o] - lr * gb[o];
        grad_ref(W1, b1, gW, gb);
        double worst = 0;
        for (int k = 0; k < OUT * IN; k++) {
                want_W[k] = W1[k] - lr * (gW[k] + mu * (W1[k] - W0[k])) - W0[k];
                worst = fmax(worst, fabs(uW[k] - want_W[k]));
        }
        for (int o = 0; o < OUT; o++) {
                want_b[o] = b1[o] - lr * (gb[o] + mu * (b1[o] - b0[o])) - b0[o];
                worst = fmax(worst, fabs(ub[o] - want_b[o]));
        }
        CHECK(r == 0 && worst < 2e-5, "two FedProx epochs give the update the formulas give (largest error %.2g)",
              worst);
        CHECK(loss > 0 && isfinite(loss), "with the mean loss of the batches (%.4f)", loss);
        c.mu = 0;
        memcpy(model_param_host(m, 0), w0W, sizeof w0W);
        memcpy(model_param_host(m, 1), w0b, sizeof w0b);
        r = edge_train(m, &d, mine, N, &c, w0, upd, &loss);
        worst = 0;
        for (int k = 0; k < OUT * IN; k++)
                worst = fmax(worst, fabs(uW[k] - want_W[k]));
        CHECK(r == 0 && worst > 1e-4, "without the proximal term the update differs (by %.2g)", worst);

        /* Batches of 1: the order follows the seed alone. */
        float first[OUT * IN];
        uint32_t order_a[N], order_b[N];
        c = (EdgeTrain) { .local_epochs = 1, .batch = 1, .lr = lr, .mu = 0, .seed = 11 };
        bool same = true, differs = false;
        for (int run = 0; run < 3; run++) {
                for (uint32_t k = 0; k < N; k++)
                        mine[k] = run == 1 ? k : N - 1 - k; /* the order it is given does not matter */
                memcpy(model_param_host(m, 0), w0W, sizeof w0W);
                memcpy(model_param_host(m, 1), w0b, sizeof w0b);
                c.seed = run == 2 ? 12 : 11;
                r |= edge_train(m, &d, mine, N, &c, w0, upd, &loss);
                if (run == 0) {
                        memcpy(first, uW, sizeof first);
                        memcpy(order_a, mine, sizeof mine);
                } else if (run == 1)
                        same = memcmp(first, uW, sizeof first) == 0 && memcmp(order_a, mine, sizeof mine) == 0;
                else {
                        differs = memcmp(first, uW, sizeof first) != 0;
                        memcpy(order_b, mine, sizeof mine);
                }
        }
        CHECK(r == 0 && same, "the same seed gives the same order and update, whatever order the examples came in");
        CHECK(differs && memcmp(order_a, order_b, sizeof order_a) != 0, "another seed gives another order");
        qsort(order_b, N, sizeof *order_b, cmp_u32);
        bool perm = true;
        for (uint32_t k = 0; k < N; k++)
                perm &= order_b[k] == k;
        CHECK(perm, "and the client's examples are still its examples");
        CHECK(edge_train_seed(42, 3, 1) != edge_train_seed(42, 3, 2) &&
                      edge_train_seed(42, 3, 1) != edge_train_seed(42, 4, 1),
              "the seed differs by client and by round");

        float acc = -1;
        double tl = -1;
        r = edge_test(m, &d, &acc, &tl);
        CHECK(r == 0 && acc >= 0 && acc <= 1 && tl > 0, "a test gives an accuracy and a loss (%.3f, %.3f)", acc, tl);
        model_free(m);
        kbackend_free(kb);
}

/* A job of two tensors (300 and 5 values) in chunks of 64. */
static void make_job(Job *job, CompressKind ck, float topk, float clip) {
        job_defaults(job);
        (void) job_set_model(job, "mlp:60-5");
        (void) job_set_chunk(job, 64);
        job->mode = MODE_FED;
        job->fed.compress = ck;
        job->fed.topk = topk;
        job->fed.strategy.dp_clip = clip;
}

static void fill(EdgeUpdate *u, const Job *job, double scale) {
        for (uint32_t t = 0; t < job->ntensors; t++)
                for (uint64_t i = 0; i < job->tensors[t].numel; i++)
                        u->t[t][i] = (float) (scale * rng_uniform(-1.7f, 1.7f));
}

static double norm(float *const *t, const Job *job) {
        double s = 0;
        for (uint32_t k = 0; k < job->ntensors; k++)
                for (uint64_t i = 0; i < job->tensors[k].numel; i++)
                        s += (double) t[k][i] * t[k][i];
        return sqrt(s);
}

/* The largest |decoded + resid - want| over every chunk (resid NULL: 0), relative to max |want|. */
static double decoded_error(const EdgeUpdate *u, const Job *job, float *const *want, float *const *resid) {
        double worst = 0, top = 1e-30;
        float *out = malloc(job->chunk_floats * sizeof(float));
        for (uint32_t t = 0; out && t < job->ntensors; t++)
                for (uint32_t k = 0; k < job->tensors[t].nchunks; k++) {
                        const void *data;
                        size_t size;
                        void (*ffn)(void *, void *);
                        void *hint;
                        uint32_t len = job_chunk_len(job, t, k);
                        size_t at = (size_t) k * job->chunk_floats;
                        edge_update_frame(u, job, t, k, &data, &size, &ffn, &hint);
                        if (compress_decode(job->fed.compress, data, size, len, out) < 0)
                                worst = INFINITY;
                        ffn((void *) data, hint);
                        for (uint32_t i = 0; i < len; i++) {
                                double got = out[i] + (resid ? resid[t][at + i] : 0.0f);
                                worst = fmax(worst, fabs(got - want[t][at + i]));
                                top = fmax(top, fabs(want[t][at + i]));
                        }
                }
        free(out);
        return worst / top;
}

static void test_update(void) {
        Job job;
        EdgeUpdate u = { 0 };
        make_job(&job, COMPRESS_NONE, 0, 1.5f);
        CHECK(job.ntensors == 2 && job.tensors[0].nchunks == 5, "the job: 2 tensors, 5 chunks in the first");
        int r = edge_update_alloc(&u, &job);
        fill(&u, &job, 1.0);
        double before = norm(u.t, &job);
        float first = u.t[0][0];
        r |= edge_update_prepare(&u, &job);
        CHECK(r == 0 && u.clipped && fabs(u.norm - before) < 1e-9 * before,
              "an update over --dp-clip is clipped, its norm before said (%.3f)", u.norm);
        CHECK(fabs(norm(u.t, &job) - 1.5) < 1e-5, "to the clip norm (%.6f)", norm(u.t, &job));
        CHECK(fabs(u.t[0][0] / first - 1.5 / before) < 1e-5, "keeping its direction");
        CHECK(u.bytes == job_nfloats(&job) * 4, "f32: bytes as sent are 4 per value (%lu)", (unsigned long) u.bytes);
        fill(&u, &job, 1e-3);
        r = edge_update_prepare(&u, &job);
        CHECK(r == 0 && !u.clipped, "one under it is left alone");
        u.t[1][3] = NAN;
        CHECK(edge_update_prepare(&u, &job) == -ERANGE, "NaN: refused before anything is sent");
        u.t[1][3] = INFINITY;
        CHECK(edge_update_prepare(&u, &job) == -ERANGE, "infinity too");
        /* A frame outlives the update it came from until ZeroMQ lets it go. */
        const void *data;
        size_t size;
        void (*ffn)(void *, void *);
        void *hint;
        u.t[0][70] = 0.25f;
        edge_update_frame(&u, &job, 0, 1, &data, &size, &ffn, &hint);
        edge_update_release(&u, &job);
        CHECK(size == 64 * 4 && ((const float *) data)[6] == 0.25f && !u.t,
              "a frame in flight reads the update after the client let it go");
        ffn((void *) data, hint);
        edge_update_free(&u, &job);

        /* bf16 and int8: the shard's decoder gives the values back within the codec's bound. */
        static const struct { CompressKind ck; double tol; const char *name; } lossy[] = {
                { COMPRESS_BF16, 1.0 / 256, "bf16" }, { COMPRESS_INT8, 1.0 / 127, "int8" } };
        for (size_t k = 0; k < 2; k++) {
                make_job(&job, lossy[k].ck, 0, 0);
                memset(&u, 0, sizeof u);
                r = edge_update_alloc(&u, &job);
                fill(&u, &job, 0.1);
                float *keep[2] = { malloc(300 * 4), malloc(5 * 4) };
                memcpy(keep[0], u.t[0], 300 * 4);
                memcpy(keep[1], u.t[1], 5 * 4);
                r |= edge_update_prepare(&u, &job);
                double e = decoded_error(&u, &job, keep, NULL);
                CHECK(r == 0 && e <= lossy[k].tol && u.bytes < job_nfloats(&job) * 4,
                      "%s: decoded within %.3g of the largest value (%.2g), %lu bytes", lossy[k].name, lossy[k].tol, e,
                      (unsigned long) u.bytes);
                free(keep[0]);
                free(keep[1]);
                edge_update_free(&u, &job);
        }

        /* top-k: the frames and the error feedback hold the update exactly, round after round. */
        make_job(&job, COMPRESS_TOPK, 0.1f, 0);
        memset(&u, 0, sizeof u);
        float *want[2] = { calloc(300, 4), calloc(5, 4) };
        bool exact = true;
        uint64_t bytes = 0;
        for (int round = 0; round < 3; round++) {
                r = edge_update_alloc(&u, &job);
                fill(&u, &job, 0.1);
                for (uint32_t t = 0; t < 2; t++)
                        for (uint64_t i = 0; i < job.tensors[t].numel; i++)
                                want[t][i] = u.t[t][i] + (u.resid ? u.resid[t][i] : 0.0f); /* with what was left out */
                r |= edge_update_prepare(&u, &job);
                exact &= r == 0 && decoded_error(&u, &job, want, u.resid) == 0;
                bytes = u.bytes;
                edge_update_release(&u, &job);
        }
        CHECK(exact, "top-k: decoded frames plus what is kept back are the update plus what earlier ones left out");
        CHECK(bytes < job_nfloats(&job) * 4 / 4, "in under a quarter of the f32 bytes (%lu)", (unsigned long) bytes);
        free(want[0]);
        free(want[1]);
        edge_update_free(&u, &job);
}

int main(void) {
        test_train();
        test_update();
        return tap_done();
}
