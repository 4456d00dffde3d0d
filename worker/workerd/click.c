/* SPDX-License-Identifier: Apache-2.0 */
/* See click.h. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "click.h"
#include "hash.h"
#include "macro.h"

int click_batch_init(ClickBatch *b, size_t cap, size_t dim, bool grads, bool per_field) {
        memset(b, 0, sizeof *b);
        b->grads = grads;
        b->per_field = per_field;
        b->cap = MAX(cap, (size_t) 1);
        b->dim = MAX(dim, (size_t) 1);
        b->hcap = 16;
        while (b->hcap < 2 * b->cap)
                b->hcap *= 2;
        b->uniq = malloc(b->cap * sizeof *b->uniq);
        b->slot = malloc(b->cap * sizeof *b->slot);
        b->table = malloc(b->hcap * sizeof *b->table);
        b->ufield = calloc(b->cap, sizeof *b->ufield);
        if (!b->uniq || !b->slot || !b->table || !b->ufield) {
                click_batch_free(b);
                return -ENOMEM;
        }
        memset(b->table, 0xff, b->hcap * sizeof *b->table);
        return 0;
}

void click_batch_free(ClickBatch *b) {
        free(b->uniq);
        free(b->slot);
        free(b->rows);
        free(b->rgrad);
        free(b->table);
        free(b->ufield);
        memset(b, 0, sizeof *b);
}

/* Where (id, field) hashes: field 0 at mix64(id). */
static size_t home(const ClickBatch *b, int64_t id, uint32_t f) {
        return (size_t) mix64((uint64_t) id ^ (uint64_t) f * 0x9e3779b97f4a7c15ull) & (b->hcap - 1);
}

static uint32_t intern(ClickBatch *b, int64_t id, uint32_t f) {
        size_t mask = b->hcap - 1;
        for (size_t h = home(b, id, f);; h = (h + 1) & mask) {
                uint32_t k = b->table[h];
                if (k == UINT32_MAX) {
                        b->table[h] = (uint32_t) b->nuniq;
                        b->uniq[b->nuniq] = id;
                        b->ufield[b->nuniq] = (uint8_t) f;
                        return (uint32_t) b->nuniq++;
                }
                if (b->uniq[k] == id && b->ufield[k] == f)
                        return k;
        }
}

/* Rows for n distinct ids: grown to what a gather needs, never past cap. */
static int rows_reserve(ClickBatch *b, size_t n) {
        if (n <= b->rows_cap)
                return 0;
        n = MIN(MAX(n, 2 * b->rows_cap), b->cap);
        float *rows = realloc(b->rows, n * b->dim * sizeof *rows);
        if (!rows)
                return -ENOMEM;
        b->rows = rows;
        if (b->grads) {
                float *rgrad = realloc(b->rgrad, n * b->dim * sizeof *rgrad);
                if (!rgrad)
                        return -ENOMEM;
                b->rgrad = rgrad;
        }
        b->rows_cap = n;
        return 0;
}

int click_batch_gather(ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n) {
        /* Empties the index where the last gather wrote, not all of it. */
        for (size_t k = 0; k < b->nuniq; k++) {
                size_t mask = b->hcap - 1, h = home(b, b->uniq[k], b->ufield[k]);
                while (b->table[h] != UINT32_MAX)
                        b->table[h] = UINT32_MAX, h = (h + 1) & mask;
        }
        b->nuniq = 0;
        uint32_t F = d->fields;
        if (b->per_field) {
                /* Field by field, so that each field's ids lie together. */
                for (uint32_t f = 0; f < F; f++) {
                        b->part[f] = b->nuniq;
                        for (size_t s = 0; s < n; s++) {
                                int64_t id = d->ids[(size_t) (idx ? idx[s] : s) * F + f];
                                b->slot[s * F + f] = id < 0 ? CLICK_MISSING : intern(b, id, f);
                        }
                }
                b->nparts = F;
        } else {
                for (size_t s = 0; s < n; s++) {
                        const int64_t *ids = d->ids + (size_t) (idx ? idx[s] : s) * F;
                        for (uint32_t f = 0; f < F; f++)
                                b->slot[s * F + f] = ids[f] < 0 ? CLICK_MISSING : intern(b, ids[f], 0);
                }
                b->part[0] = 0;
                b->nparts = 1;
        }
        b->part[b->nparts] = b->nuniq;
        return rows_reserve(b, MAX(b->nuniq, (size_t) 1)); /* a row at least: a push of none still has its gradients */
}

void click_lr_logits(const ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, const float *w,
                     float bias, float *logits) {
        for (size_t s = 0; s < n; s++) {
                const float *x = d->x ? d->x + (size_t) (idx ? idx[s] : s) * d->dense : NULL;
                double z = bias;
                for (uint32_t k = 0; x && k < d->dense; k++)
                        z += (double) w[k] * x[k];
                for (uint32_t f = 0; f < d->fields; f++) {
                        uint32_t u = b->slot[s * d->fields + f];
                        if (u != CLICK_MISSING)
                                z += b->rows[u];
                }
                logits[s] = (float) z;
        }
}

float click_lr_step(ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, const float *w, float bias,
                    float *logits, float *gw, float *gb) {
        click_lr_logits(b, d, idx, n, w, bias, logits);
        memset(gw, 0, d->dense * sizeof *gw);
        memset(b->rgrad, 0, b->nuniq * sizeof *b->rgrad);
        double loss = 0, g_bias = 0;
        for (size_t s = 0; s < n; s++) {
                size_t i = idx ? idx[s] : s;
                double z = logits[s], y = d->y[i];
                /* log(1 + e^-|z|) + max(z, 0) - y z: stable for any z. */
                loss += log1p(exp(-fabs(z))) + (z > 0 ? z : 0) - y * z;
                float g = (float) ((1.0 / (1.0 + exp(-z)) - y) / (double) n);
                g_bias += g;
                const float *x = d->x ? d->x + i * d->dense : NULL;
                for (uint32_t k = 0; x && k < d->dense; k++)
                        gw[k] += g * x[k];
                for (uint32_t f = 0; f < d->fields; f++) {
                        uint32_t u = b->slot[s * d->fields + f];
                        if (u != CLICK_MISSING)
                                b->rgrad[u] += g;
                }
        }
        *gb = (float) g_bias;
        return (float) (loss / (double) MAX(n, (size_t) 1));
}
