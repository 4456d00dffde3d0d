/* SPDX-License-Identifier: Apache-2.0 */
/* Synthetic click logs with a planted model (issue 34): F categorical fields,
 * each with its own vocabulary (10^3 to 10^8 ids) drawn with Zipf(s)
 * frequencies, D dense features N(0, 1), and a label drawn from
 * sigmoid(bias + sum of the planted weight of each field's id + the dense
 * features' planted weights). Each id's weight comes from the seed, the field
 * and the id alone (nothing is stored, whatever the vocabulary), so the true
 * logit of every sample is known: its AUC on the test set is the best any
 * model can reach, printed beside the data. Ids are spread over the positive
 * int64 range (a hash of the field and the rank), as real feature ids are.
 * Files: DIR/{train,test}/{dense,sparse,label}.npy (float32 [N, D], int64
 * [N, F] with -1 for a missing value, uint8 [N]) and DIR/test/logit.npy
 * (float32 [N], the planted model's). */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CLICKLOG_MAX_FIELDS 64
#define CLICKLOG_MAX_DENSE 64

typedef struct ClickConf {
        uint64_t train_rows, test_rows;
        uint32_t fields;                      /* 1..64 */
        uint64_t vocab[CLICKLOG_MAX_FIELDS];  /* ids per field, 1..2^40 */
        uint32_t dense;                       /* 0..64 */
        double zipf;                          /* the frequency exponent s > 0 (1.1: a few ids take most rows) */
        double weight_sd;                     /* the planted weights' spread */
        double bias;                          /* the planted logit's constant (-1.5: ~25% clicks) */
        double missing;                       /* share of missing values per field, 0..1 */
        uint64_t seed;
} ClickConf;

typedef struct ClickSummary {
        double click_rate;                    /* train and test together */
        double best_auc;                      /* of the planted logit on the test set */
        double best_logloss;                  /* idem */
} ClickSummary;

/* Writes the data set under dir (its train/ and test/ made). 0, or a
 * negative errno with err saying why (a conf out of range: which field). */
int clicklog_write(const ClickConf *c, const char *dir, ClickSummary *ret, char *err, size_t n);

/* The id of field f's rank-r value (r from 1), as written. */
int64_t clicklog_id(const ClickConf *c, uint32_t f, uint64_t rank);
/* The planted weight of field f's value id. */
double clicklog_weight(const ClickConf *c, uint32_t f, int64_t id);

/* The area under the ROC curve of scores for labels (0/1), ties counted a
 * half (the Mann-Whitney statistic); NaN when one class is absent. */
double auc(const float *scores, const uint8_t *labels, size_t n);
/* The mean log loss of probabilities sigmoid(logits) for labels. */
double logloss_of_logits(const float *logits, const uint8_t *labels, size_t n);
