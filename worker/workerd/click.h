/* SPDX-License-Identifier: Apache-2.0 */
/* A click model's batch of ids, and the lr:D model's arithmetic
 * (docs/tables.md, "The built-in click models"; dlrm.h has DLRM's): for each
 * sample, logit = bias + w . x + the sum of its fields' id weights (a missing
 * field, id -1, adds nothing); the loss is the mean binary cross-entropy of
 * sigmoid(logit), as torch.nn.BCEWithLogitsLoss. A batch's ids are gathered
 * once, deduplicated (one row pulled and one gradient pushed per distinct
 * id), so that a row's gradient is the sum over the batch's samples that hold
 * it. The trainer (trainer.c) pulls the rows and pushes the gradients. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "clickdata.h"
#include "modeldesc.h"

#define CLICK_MISSING UINT32_MAX

typedef struct ClickBatch {
        size_t cap;       /* samples x fields it holds at most */
        size_t dim;       /* floats per row */
        size_t rows_cap;  /* distinct ids rows (and rgrad) have room for */
        bool grads;       /* it keeps rgrad (a training batch; not the test set's) */
        /* A table per field: ids are distinct per field (the same id in two
         * fields is two rows), and uniq holds field 0's, then field 1's, ...:
         * field f's are uniq[part[f] .. part[f + 1]). Else one table for
         * all: part[0] 0, part[1] nuniq. */
        bool per_field;
        uint32_t nparts;
        size_t part[MD_MAX_FIELDS + 1];
        int64_t *uniq;    /* the distinct ids, in first-seen order (per field with per_field) */
        uint8_t *ufield;  /* per distinct id: its field (0 without per_field) */
        size_t nuniq;
        uint32_t *slot;   /* per sample and field: its id's index in uniq, or CLICK_MISSING */
        float *rows;      /* per distinct id: its row (dim floats), as pulled */
        float *rgrad;     /* per distinct id: the loss's gradient of it */
        uint32_t *table;  /* an open-addressing index of uniq (hcap slots, UINT32_MAX empty) */
        size_t hcap;
} ClickBatch;

/* Room for cap = samples x fields ids, their rows of dim floats, and with
 * grads their gradients; with per_field a table per field. 0 or -ENOMEM. */
int click_batch_init(ClickBatch *b, size_t cap, size_t dim, bool grads, bool per_field);
void click_batch_free(ClickBatch *b);
/* The distinct ids of samples idx[0..n) of d (idx NULL: samples 0..n), and
 * each one's slot; rows and rgrad grow to hold their rows. n x d->fields
 * must be within the batch's cap. 0 or -ENOMEM. */
int click_batch_gather(ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n);
/* The logits of those samples from the pulled rows, w (d->dense values) and
 * bias, into logits[0..n). */
void click_lr_logits(const ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, const float *w,
                     float bias, float *logits);
/* One step's forward and backward: the mean loss, and the gradients of it in
 * gw (d->dense), gb (1) and b->rgrad (one per distinct id). logits: n floats
 * of scratch. */
float click_lr_step(ClickBatch *b, const ClickData *d, const uint32_t *idx, size_t n, const float *w, float bias,
                    float *logits, float *gw, float *gb);
