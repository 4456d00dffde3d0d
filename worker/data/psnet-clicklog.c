/* SPDX-License-Identifier: Apache-2.0 */
/* psnet-clicklog: writes a synthetic click log with a planted model
 * (clicklog.h) and prints what the best model could reach on its test set. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "clicklog.h"
#include "config.h"
#include "macro.h"
#include "program.h"

/* "V" for every field, or "V1,V2,..." one per field; numbers may be 1e6. */
static int parse_vocab(const char *s, ClickConf *c) {
        uint32_t n = 0;
        const char *p = s;
        while (*p && n < CLICKLOG_MAX_FIELDS) {
                char *end;
                double v = strtod(p, &end);
                if (end == p || !(v >= 1 && v <= 1099511627776.0) || v != floor(v))
                        return -EINVAL;
                c->vocab[n++] = (uint64_t) v;
                if (*end == ',')
                        end++;
                else if (*end)
                        return -EINVAL;
                p = end;
        }
        if (*p)
                return -EINVAL;
        if (n == 1)
                for (uint32_t f = 1; f < c->fields && f < CLICKLOG_MAX_FIELDS; f++)
                        c->vocab[f] = c->vocab[0];
        else if (n != c->fields)
                return -ERANGE;
        return 0;
}

int main(int argc, char **argv) {
        char *out = NULL, *vocab = NULL;
        uint64_t train = 100000, test = 20000, seed = 1;
        unsigned fields = 8, dense = 4;
        float zipf = 1.1f, sd = 0.7f, bias = -1.5f, missing = 0.02f;
        const Option opts[] = {
                { "out", OPT_STR, &out, "DIR", "where to write train/ and test/ (made if missing)" },
                { "train-rows", OPT_U64, &train, "N", "training samples (default 100000)" },
                { "test-rows", OPT_U64, &test, "N", "test samples (default 20000)" },
                { "fields", OPT_UINT, &fields, "F", "categorical fields, 1-64 (default 8)" },
                { "vocab", OPT_STR, &vocab, "V[,V...]",
                  "ids per field: one number for all, or one per field (default: 10^3 to 10^6, spread over the fields)" },
                { "dense", OPT_UINT, &dense, "D", "dense features N(0, 1), 0-64 (default 4)" },
                { "zipf", OPT_FLOAT, &zipf, "S", "id frequencies ~ rank^-S (default 1.1)" },
                { "weight-sd", OPT_FLOAT, &sd, "X", "spread of the planted per-id weights (default 0.7)" },
                { "bias", OPT_FLOAT, &bias, "B", "the planted logit's constant (default -1.5: about a quarter clicks)" },
                { "missing", OPT_FLOAT, &missing, "P", "share of missing values per field, written -1 (default 0.02)" },
                { "seed", OPT_U64, &seed, "N", "the same seed writes the same files" },
        };
        const ProgramInfo prog = {
                .name = "psnet-clicklog", .summary = "write a synthetic click log with a planted model", .usage = "--out DIR [OPTIONS]",
                .epilog = "Writes DIR/{train,test}/{sparse,dense,label}.npy (int64 [N, F], -1 missing; float32 [N, D];\n"
                          "uint8 [N]) and DIR/test/logit.npy (the planted model's logits), then prints the planted\n"
                          "model's AUC and log loss on the test set: the best any model can reach.",
        };
        Program p;
        int r = program_start(&p, &prog, opts, ELEMENTSOF(opts), argc, argv);
        if (r != 0)
                goto done;
        ClickConf c = { .train_rows = train, .test_rows = test, .fields = fields, .dense = dense, .zipf = zipf,
                        .weight_sd = sd, .bias = bias, .missing = missing, .seed = seed };
        if (!out) {
                fprintf(stderr, "psnet-clicklog: --out DIR is required (see --help)\n");
                r = -EINVAL;
                goto done;
        }
        if (vocab) {
                int v = fields == 0 || fields > CLICKLOG_MAX_FIELDS ? 0 : parse_vocab(vocab, &c);
                if (v < 0) {
                        fprintf(stderr, "psnet-clicklog: --vocab '%s': %s\n", vocab,
                                v == -ERANGE ? "give one number, or one per field (--fields)"
                                             : "numbers from 1 to 2^40, separated by commas");
                        r = -EINVAL;
                        goto done;
                }
        } else
                for (unsigned f = 0; f < fields && f < CLICKLOG_MAX_FIELDS; f++)
                        c.vocab[f] = (uint64_t) llround(pow(10.0, 3.0 + 3.0 * (fields > 1 ? (double) f / (fields - 1) : 0)));
        ClickSummary s;
        char err[512];
        r = clicklog_write(&c, out, &s, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "psnet-clicklog: %s\n", err);
                if (r != -EINVAL)
                        r = -EIO;
                goto done;
        }
        printf("dir=%s train_rows=%lu test_rows=%lu fields=%u dense=%u click_rate=%.4f best_auc=%.4f "
               "best_logloss=%.4f\n", out, (unsigned long) train, (unsigned long) test, fields, dense, s.click_rate,
               s.best_auc, s.best_logloss);
done:
        program_done(&p); /* frees out and vocab */
        return program_exit(r);
}
