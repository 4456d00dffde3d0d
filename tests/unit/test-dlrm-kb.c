/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/workerd/dlrm-kb.c, the DLRM step on a compute
 * backend: on the CPU backend against dlrm.c (the reference the click
 * models train with, itself checked against PyTorch by test-dlrm), and,
 * where a CUDA backend can be made, on it against the CPU backend. Two
 * shapes (a small one, and the paper's Criteo widths scaled down), a fifth
 * of the fields missing, a table per field and one for every field; the
 * step's loss, every tensor's gradient, the rows' gradients and the test
 * logits. Tolerances, |got - want| <= atol + rtol |want| per element: the
 * CPU backend (1e-6, 1e-5): the same products in OpenBLAS, the sums of
 * each row's gradients in another order; CUDA (1e-5, 1e-4), as
 * test-cuda-layers' embedding_backward and gemm_batched in fp32. Also: a
 * shape past 2^24 ids refused (-E2BIG), a batch of more rows than room. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "click-kb.h"
#include "click.h"
#include "dlrm-kb.h"
#include "dlrm.h"
#include "macro.h"
#include "modeldesc.h"
#include "tap.h"

#define RNG_SEED 0x2545f4914f6cdd1dull
#include "rng.h"

/* Whether got[0..n) is want's within atol + rtol |want|; the worst place into *at. */
static bool close_to(const float *got, const float *want, size_t n, double atol, double rtol, size_t *at) {
        bool ok = true;
        double worst = -1;
        for (size_t i = 0; i < n; i++) {
                double d = fabs((double) got[i] - want[i]), lim = atol + rtol * fabs((double) want[i]);
                if (!(d <= lim))
                        ok = false;
                if (d - lim > worst) {
                        worst = d - lim;
                        *at = i;
                }
        }
        return ok;
}

typedef struct Case {
        const char *model;
        uint32_t n, batch, vocab;
        bool per_field;
} Case;

/* One case on backend kb against want (NULL: against dlrm.c) */
static void run_case(const Case *c, KBackend *kb, double atol, double rtol) {
        ModelDesc *d = calloc(1, sizeof *d);
        char err[256] = "";
        if (!CHECK(d && modeldesc_parse(c->model, d, err, sizeof err) == 0, "%s parses (%s)", c->model, err)) {
                free(d);
                return;
        }
        uint32_t F = d->click_fields, D = d->tensors[0].shape[1], E = d->click_dim;
        ClickData data = { .n = c->n, .fields = F, .dense = D };
        data.ids = malloc((size_t) c->n * F * sizeof *data.ids);
        data.x = malloc((size_t) c->n * D * sizeof *data.x);
        data.y = malloc(c->n);
        for (size_t i = 0; i < (size_t) c->n * F; i++)
                data.ids[i] = rng_uniform(0, 1) < 0.2f ? -1 : (int64_t) (rng_uniform(0, 1) * (float) c->vocab) * 7919;
        for (size_t i = 0; i < (size_t) c->n * D; i++)
                data.x[i] = rng_uniform(-1, 1);
        for (size_t i = 0; i < c->n; i++)
                data.y[i] = rng_uniform(0, 1) < 0.3f;
        float *params[DLRM_KB_TENSORS], *g_ref[DLRM_KB_TENSORS], *g_kb[DLRM_KB_TENSORS];
        for (size_t t = 0; t < d->ntensors; t++) {
                size_t k = (size_t) d->tensors[t].numel;
                params[t] = malloc(k * sizeof(float));
                g_ref[t] = calloc(k, sizeof(float));
                g_kb[t] = calloc(k, sizeof(float));
                float scale = 1.0f / sqrtf((float) d->tensors[t].shape[t % 2 ? 0 : 1]);
                for (size_t i = 0; i < k; i++)
                        params[t][i] = rng_uniform(-scale, scale) + (t % 2 ? 0.05f : 0.0f);
        }
        uint32_t *idx = malloc(c->batch * sizeof *idx);
        for (uint32_t s = 0; s < c->batch; s++)
                idx[s] = (s * 7u + 3u) % c->n;
        Dlrm ref;
        DlrmKb m;
        ClickBatch b, tb;
        int r = dlrm_init(&ref, d, c->batch);
        r = r ? r : click_batch_init(&b, (size_t) c->batch * F, E, true, c->per_field);
        r = r ? r : click_batch_init(&tb, (size_t) c->n * F, E, false, c->per_field);
        r = r ? r : click_batch_gather(&b, &data, idx, c->batch);
        r = r ? r : click_batch_gather(&tb, &data, NULL, c->n);
        if (!CHECK(r == 0, "%s: the reference, its batches (%d)", c->model, r))
                goto out;
        r = dlrm_kb_init(&m, kb, d, c->batch, MAX(b.nuniq, tb.nuniq), err, sizeof err);
        if (!CHECK(r == 0, "%s on %s: set up (%s)", c->model, kb->ops->name, err))
                goto out_ref;
        for (size_t u = 0; u < b.nuniq; u++)
                for (uint32_t k = 0; k < E; k++)
                        b.rows[u * E + k] = rng_uniform(-0.5f, 0.5f);
        for (size_t u = 0; u < tb.nuniq; u++)
                for (uint32_t k = 0; k < E; k++)
                        tb.rows[u * E + k] = rng_uniform(-0.5f, 0.5f);
        float want_loss = dlrm_step(&ref, &b, &data, idx, c->batch, params, g_ref);
        float *rg_ref = malloc(b.nuniq * E * sizeof(float));
        memcpy(rg_ref, b.rgrad, b.nuniq * E * sizeof(float));
        memset(b.rgrad, 0, b.nuniq * E * sizeof(float));
        float loss = NAN;
        r = dlrm_kb_step(&m, &b, &data, idx, c->batch, params, g_kb, &loss);
        size_t at = 0;
        bool grads = r == 0;
        for (size_t t = 0; grads && t < d->ntensors; t++)
                grads = close_to(g_kb[t], g_ref[t], (size_t) d->tensors[t].numel, atol, rtol, &at);
        bool rows = r == 0 && close_to(b.rgrad, rg_ref, b.nuniq * E, atol, rtol, &at);
        const char *what = c->per_field ? "a table per field" : "one table";
        CHECK(r == 0 && fabs((double) loss - want_loss) <= atol + rtol * fabs((double) want_loss),
              "%s, %s, %s: a step's loss %.7f, dlrm.c's %.7f (%d)", c->model, what, kb->ops->name, (double) loss,
              (double) want_loss, r);
        CHECK(grads, "%s, %s, %s: every tensor's gradient within (%g, %g)", c->model, what, kb->ops->name, atol, rtol);
        CHECK(rows, "%s, %s, %s: the %zu rows' gradients within (%g, %g)", c->model, what, kb->ops->name, b.nuniq, atol,
              rtol);
        /* The test set's logits, in chunks of a batch. */
        float *lw = malloc(c->n * sizeof(float)), *lg = malloc(c->n * sizeof(float));
        r = dlrm_kb_load(&m, &tb, params);
        for (size_t first = 0; first < c->n; first += c->batch) {
                size_t k = MIN((size_t) c->batch, c->n - first);
                dlrm_logits(&ref, &tb, &data, first, k, params, lw + first);
                if (r == 0)
                        r = dlrm_kb_logits(&m, &tb, &data, first, k, lg + first);
        }
        CHECK(r == 0 && close_to(lg, lw, c->n, atol, rtol, &at), "%s, %s, %s: the logits of %u test samples (%d)",
              c->model, what, kb->ops->name, c->n, r);
        free(lw);
        free(lg);
        free(rg_ref);
        dlrm_kb_free(&m);
out_ref:
        dlrm_free(&ref);
out:
        click_batch_free(&b);
        click_batch_free(&tb);
        for (size_t t = 0; t < d->ntensors; t++) {
                free(params[t]);
                free(g_ref[t]);
                free(g_kb[t]);
        }
        free(idx);
        free(data.ids);
        free(data.x);
        free(data.y);
        free(d);
}

/* lr:dense on backend kb against click.c: a step's loss and gradients,
 * then the logits of the whole log. */
static void run_lr_case(uint32_t dense, bool per_field, KBackend *kb, double atol, double rtol) {
        enum { N = 60, F = 5, BATCH = 24 };
        ClickData data = { .n = N, .fields = F, .dense = dense };
        int64_t ids[N * F];
        float x[N * 4];
        uint8_t y[N];
        data.ids = ids, data.x = dense ? x : NULL, data.y = y;
        for (size_t i = 0; i < N * F; i++)
                ids[i] = rng_uniform(0, 1) < 0.2f ? -1 : (int64_t) (rng_uniform(0, 1) * 40.0f) * 104729;
        for (size_t i = 0; i < N * dense; i++)
                x[i] = rng_uniform(-1, 1);
        for (size_t i = 0; i < N; i++)
                y[i] = rng_uniform(0, 1) < 0.4f;
        uint32_t idx[BATCH];
        for (uint32_t s = 0; s < BATCH; s++)
                idx[s] = (s * 5u + 1u) % N;
        float w[4] = { 0.3f, -0.2f, 0.1f, 0.4f }, bias = -0.15f;
        ClickBatch b, tb;
        LrKb m;
        char err[256] = "";
        int r = click_batch_init(&b, BATCH * F, 1, true, per_field);
        r = r ? r : click_batch_init(&tb, N * F, 1, false, per_field);
        r = r ? r : click_batch_gather(&b, &data, idx, BATCH);
        r = r ? r : click_batch_gather(&tb, &data, NULL, N);
        r = r ? r : lr_kb_init(&m, kb, F, dense, BATCH, MAX(b.nuniq, tb.nuniq), err, sizeof err);
        if (!CHECK(r == 0, "lr:%u on %s: set up (%s)", dense, kb->ops->name, err))
                return;
        for (size_t u = 0; u < b.nuniq; u++)
                b.rows[u] = rng_uniform(-0.5f, 0.5f);
        for (size_t u = 0; u < tb.nuniq; u++)
                tb.rows[u] = rng_uniform(-0.5f, 0.5f);
        float logits[N], gw_ref[4] = { 0 }, gb_ref = 0, gw[4] = { 0 }, gb = 0, rg_ref[BATCH * F], loss = NAN;
        float want = click_lr_step(&b, &data, idx, BATCH, w, bias, logits, gw_ref, &gb_ref);
        memcpy(rg_ref, b.rgrad, b.nuniq * sizeof(float));
        memset(b.rgrad, 0, b.nuniq * sizeof(float));
        r = lr_kb_step(&m, &b, &data, idx, BATCH, w, bias, gw, &gb, &loss);
        size_t at = 0;
        const char *what = per_field ? "a table per field" : "one table";
        CHECK(r == 0 && fabs((double) loss - want) <= atol + rtol * fabs((double) want) &&
                      close_to(gw, gw_ref, dense, atol, rtol, &at) && close_to(&gb, &gb_ref, 1, atol, rtol, &at) &&
                      close_to(b.rgrad, rg_ref, b.nuniq, atol, rtol, &at),
              "lr:%u, %s, %s: a step's loss (%.7f, click.c's %.7f), the dense weights', bias's and %zu rows' "
              "gradients within (%g, %g) (%d)", dense, what, kb->ops->name, (double) loss, (double) want, b.nuniq,
              atol, rtol, r);
        float lw[N], lg[N];
        click_lr_logits(&tb, &data, NULL, N, w, bias, lw);
        r = lr_kb_load(&m, &tb, w, bias);
        for (size_t first = 0; r == 0 && first < N; first += BATCH)
                r = lr_kb_logits(&m, &tb, &data, first, MIN((size_t) BATCH, N - first), lg + first);
        CHECK(r == 0 && close_to(lg, lw, N, atol, rtol, &at), "lr:%u, %s, %s: the logits of %d samples (%d)", dense,
              what, kb->ops->name, N, r);
        lr_kb_free(&m);
        click_batch_free(&b);
        click_batch_free(&tb);
}

int main(void) {
        const Case cases[] = {
                { "dlrm:4:3-8-4:8-1", 40, 16, 30, false },
                { "dlrm:4:3-8-4:8-1", 40, 16, 30, true },
                { "dlrm:26:13-64-16:32-8-1", 300, 128, 500, true },
        };
        KBackend *cpu = NULL, *gpu = NULL;
        char err[256] = "";
        if (!CHECK(kbackend_new("cpu", 1, &cpu, err, sizeof err) == 0, "the cpu backend (%s)", err))
                return tap_done();
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
                run_case(&cases[i], cpu, 1e-6, 1e-5);
        run_lr_case(4, false, cpu, 1e-6, 1e-5);
        run_lr_case(4, true, cpu, 1e-6, 1e-5);
        run_lr_case(0, false, cpu, 1e-6, 1e-5);
        /* Refused shapes. */
        ModelDesc d;
        DlrmKb m;
        CHECK(modeldesc_parse("dlrm:26:13-64-16:32-8-1", &d, err, sizeof err) == 0, "the Criteo shape parses");
        int r = dlrm_kb_init(&m, cpu, &d, 1u << 15, 1000, err, sizeof err);
        CHECK(r == -E2BIG && strstr(err, "2^24"), "a batch of 32,768 samples of 27 vectors: refused (%s)", err);
        r = dlrm_kb_init(&m, cpu, &d, 64, 10, err, sizeof err);
        ClickBatch b = { .nuniq = 11 };
        CHECK(r == 0 && dlrm_kb_load(&m, &b, NULL) == -E2BIG, "a batch of 11 rows where 10 fit: -E2BIG");
        if (r == 0)
                dlrm_kb_free(&m);
        if (kbackend_cuda_built() && kbackend_new("cuda", 0, &gpu, err, sizeof err) == 0) {
                for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
                        run_case(&cases[i], gpu, 1e-5, 1e-4);
                run_lr_case(4, false, gpu, 1e-5, 1e-4);
                run_lr_case(0, true, gpu, 1e-5, 1e-4);
                kbackend_free(gpu);
        } else
                printf("# skipped: the CUDA step (no CUDA backend: %s)\n",
                       kbackend_cuda_built() ? err : "a build without CUDA");
        kbackend_free(cpu);
        return tap_done();
}
