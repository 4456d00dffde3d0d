/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/workerd/click.c, lr:D's arithmetic: a batch's ids
 * deduplicated in first-seen order, -1 left out, the index emptied between
 * batches (a second gather of other ids, then the first again), and with a
 * table per field each field's ids apart and together; the loss
 * against BCE-with-logits written out per sample; every gradient (rows,
 * dense weights, bias) against central finite differences of the loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "click.h"
#include "tap.h"

enum { N = 6, F = 3, D = 2 };

static int64_t ids[N * F] = { 7, 9, -1, 7, 11, 9, -1, -1, 13, 9, 7, 7, 40, 41, 42, 13, 9, -1 };
static float x[N * D] = { 0.5f, -1.0f, 1.5f, 0.25f, -0.75f, 2.0f, 0.0f, 1.0f, -2.0f, 0.5f, 1.0f, 1.0f };
static uint8_t y[N] = { 1, 0, 1, 0, 1, 1 };
static const ClickData data = { .n = N, .fields = F, .dense = D, .ids = ids, .x = x, .y = y };

/* The loss of samples idx written out, each row's weight by id from rows. */
static double loss_of(const ClickBatch *b, const uint32_t *idx, size_t n, const float *w, float bias) {
        double sum = 0;
        for (size_t s = 0; s < n; s++) {
                uint32_t i = idx[s];
                double z = bias;
                for (int k = 0; k < D; k++)
                        z += (double) w[k] * x[i * D + k];
                for (int f = 0; f < F; f++)
                        for (size_t u = 0; ids[i * F + f] >= 0 && u < b->nuniq; u++)
                                if (b->uniq[u] == ids[i * F + f])
                                        z += b->rows[u];
                double p = 1.0 / (1.0 + exp(-z));
                sum += -(y[i] ? log(p) : log(1.0 - p));
        }
        return sum / (double) n;
}

int main(void) {
        ClickBatch b;
        CHECK(click_batch_init(&b, N * F, 1, true, false) == 0, "a batch of %d ids", N * F);
        uint32_t idx[4] = { 0, 1, 3, 5 };
        CHECK(click_batch_gather(&b, &data, idx, 4) == 0 && b.rows_cap >= 4, "gathered, rows for its ids");
        const int64_t want[] = { 7, 9, 11, 13 };
        CHECK(b.nuniq == 4 && memcmp(b.uniq, want, sizeof want) == 0,
              "samples 0, 1, 3, 5: the distinct ids 7, 9, 11, 13 in first-seen order (%zu)", b.nuniq);
        CHECK(b.slot[2] == CLICK_MISSING && b.slot[3] == 0 && b.slot[5] == 1 && b.slot[6 + 0] == 1 &&
                      b.slot[6 + 1] == 0 && b.slot[6 + 2] == 0 && b.slot[9 + 2] == CLICK_MISSING,
              "each field's slot: its id's place, -1 missing");
        uint32_t other[1] = { 4 };
        CHECK(click_batch_gather(&b, &data, other, 1) == 0, "gathered");
        CHECK(b.nuniq == 3 && b.uniq[0] == 40 && b.uniq[2] == 42, "another batch: its own ids only");
        CHECK(click_batch_gather(&b, &data, idx, 4) == 0, "gathered");
        CHECK(b.nuniq == 4 && memcmp(b.uniq, want, sizeof want) == 0, "the first batch again: the same ids");

        for (size_t u = 0; u < b.nuniq; u++)
                b.rows[u] = 0.1f * (float) u - 0.2f;
        float w[D] = { 0.3f, -0.4f }, bias = 0.05f, gw[D], gb, logits[4];
        float loss = click_lr_step(&b, &data, idx, 4, w, bias, logits, gw, &gb);
        double ref = loss_of(&b, idx, 4, w, bias);
        CHECK(fabs(loss - ref) < 1e-6, "the loss is BCE with logits' mean (%.7f, %.7f)", loss, ref);
        const double h = 1e-3;
        double worst = 0;
        for (size_t u = 0; u < b.nuniq; u++) {
                float keep = b.rows[u];
                b.rows[u] = keep + (float) h;
                double up = loss_of(&b, idx, 4, w, bias);
                b.rows[u] = keep - (float) h;
                double down = loss_of(&b, idx, 4, w, bias);
                b.rows[u] = keep;
                worst = fmax(worst, fabs((up - down) / (2 * h) - b.rgrad[u]));
        }
        CHECK(worst < 1e-4, "each row's gradient is the loss's finite difference (worst %.2g)", worst);
        worst = 0;
        for (int k = 0; k < D; k++) {
                float keep = w[k];
                w[k] = keep + (float) h;
                double up = loss_of(&b, idx, 4, w, bias);
                w[k] = keep - (float) h;
                double down = loss_of(&b, idx, 4, w, bias);
                w[k] = keep;
                worst = fmax(worst, fabs((up - down) / (2 * h) - gw[k]));
        }
        double up = loss_of(&b, idx, 4, w, bias + (float) h), down = loss_of(&b, idx, 4, w, bias - (float) h);
        worst = fmax(worst, fabs((up - down) / (2 * h) - gb));
        CHECK(worst < 1e-4, "and the dense weights' and the bias's (worst %.2g)", worst);
        click_lr_logits(&b, &data, idx, 4, w, bias, logits);
        float again[4];
        click_lr_step(&b, &data, idx, 4, w, bias, again, gw, &gb);
        CHECK(memcmp(logits, again, sizeof logits) == 0, "click_lr_logits gives the step's logits");
        click_batch_free(&b);

        /* A table per field: the same id in two fields is two rows, each
         * field's ids together, in field order. */
        CHECK(click_batch_init(&b, N * F, 4, true, true) == 0, "a batch with a table per field");
        CHECK(click_batch_gather(&b, &data, idx, 4) == 0 && b.rows_cap >= 8, "gathered, rows of 4 for its ids");
        const int64_t per[] = { 7, 9, 13, 9, 11, 7, 9, 7 };
        CHECK(b.nuniq == 8 && memcmp(b.uniq, per, sizeof per) == 0 && b.nparts == 3 && b.part[0] == 0 &&
                      b.part[1] == 3 && b.part[2] == 6 && b.part[3] == 8,
              "field 0's 7, 9, 13, field 1's 9, 11, 7, field 2's 9, 7 (%zu ids, %u parts)", b.nuniq, b.nparts);
        CHECK(b.slot[0] == 0 && b.slot[1] == 3 && b.slot[2] == CLICK_MISSING && b.slot[2 * 3 + 2] == 7 &&
                      b.slot[2 * 3 + 1] == 5 && b.slot[2 * 3 + 0] == 1,
              "each field's slot is its own row: 9 in field 1 is row 3, 7 in field 2 row 7");
        CHECK(click_batch_gather(&b, &data, other, 1) == 0 && b.nuniq == 3 && b.part[1] == 1 && b.part[3] == 3,
              "another batch: its own ids, one a field");
        click_batch_free(&b);
        return tap_done();
}
