/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/table-spec.c: the --tables text read into tables with
 * each optimizer's defaults, written back and read again to the same tables,
 * and every bad table refused with a reason naming it and its field. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "table-spec.h"
#include "tap.h"

static void test_parse(void) {
        TableConf t[JOB_MAX_TABLES], back[JOB_MAX_TABLES];
        size_t n = 99, nb = 0;
        char err[192] = "", text[4096];
        const char *spec = "ad:1:ftrl:lr=0.05:l1=1:l2=0.5,emb:16,big:64:adam:max-rows=1000000:init=0.1:admit=3:ttl=50";
        int r = tables_parse(spec, t, JOB_MAX_TABLES, &n, err, sizeof err);
        if (!CHECK(r == 0 && n == 3, "three tables read (%d, %s)", r, err))
                return;
        CHECK(strcmp(t[0].name, "ad") == 0 && t[0].dim == 1 && t[0].optim == TABLE_FTRL && t[0].lr == 0.05f &&
                      t[0].l1 == 1.0f && t[0].l2 == 0.5f && t[0].beta == 1.0f && t[0].init_scale == 0.0f,
              "ftrl: alpha 0.05, l1 1, l2 0.5, beta 1 (its default), rows start at 0");
        CHECK(strcmp(t[1].name, "emb") == 0 && t[1].dim == 16 && t[1].optim == TABLE_ADAGRAD && t[1].lr == 0.01f &&
                      t[1].eps == 1e-10f && t[1].init_scale == 0.01f && t[1].max_rows == 0,
              "no optimizer named: adagrad with torch.optim.Adagrad's lr 0.01 and eps 1e-10");
        CHECK(t[2].optim == TABLE_ADAM && t[2].lr == 0.001f && t[2].beta1 == 0.9f && t[2].beta2 == 0.999f &&
                      t[2].eps == 1e-8f && t[2].max_rows == 1000000 && t[2].init_scale == 0.1f && t[2].admit == 3 &&
                      t[2].ttl == 50 && t[1].admit == 1 && t[1].ttl == 0,
              "adam: torch's defaults, max-rows, init, admit and ttl as given (else admit 1, ttl 0)");
        CHECK(table_row_bytes(&t[0]) == 12 && table_row_bytes(&t[1]) == 128 && table_row_bytes(&t[2]) == 64 * 12 + 4,
              "bytes a row: values and state (ftrl 3 x 4, adagrad 16 x 8, adam 64 x 12 + its step count)");
        r = tables_format(t, n, text, sizeof text);
        r = r == 0 ? tables_parse(text, back, JOB_MAX_TABLES, &nb, err, sizeof err) : r;
        CHECK(r == 0 && nb == 3 && memcmp(back, t, sizeof *t * 3) == 0, "written and read back, the same tables: %s",
              text);
        CHECK(tables_format(t, n, text, 40) == -ENOSPC, "too small a buffer: -ENOSPC");
        CHECK(tables_parse("", t, JOB_MAX_TABLES, &n, err, sizeof err) == 0 && n == 0, "\"\" is no tables");
}

static void refused(const char *text, const char *want) {
        TableConf t[JOB_MAX_TABLES];
        size_t n = 0;
        char err[192] = "";
        int r = tables_parse(text, t, JOB_MAX_TABLES, &n, err, sizeof err);
        CHECK(r == -EINVAL && strstr(err, want), "'%s' refused: %s", text, err);
}

static void test_refusals(void) {
        refused("emb", "NAME:DIM");
        refused("emb:0", "dim '0' is not 1 to 4096");
        refused("emb:4097", "dim '4097'");
        refused("emb:-3", "dim '-3'");
        refused("emb:16:rmsprop", "optimizer 'rmsprop' is not sgd, adagrad, adam or ftrl");
        refused("emb:16:adagrad:momentum=0.9", "unknown key 'momentum'");
        refused("emb:16:adagrad:lr=fast", "lr=fast is not a number");
        refused("emb:16:adagrad:lr=-1", "table emb: lr must be positive");
        refused("emb:16:adam:beta1=1", "beta1 and beta2 must be in [0, 1)");
        refused("ad:1:ftrl:l1=-1", "ftrl's beta, l1 and l2");
        refused("emb:16:sgd:init=nan", "init must be finite");
        refused("emb:16:adagrad:max-rows=-5", "max-rows=-5 is not a count");
        refused("emb:16:adagrad:lr", "'lr' is not KEY=VALUE");
        refused("emb:16:adagrad:admit=256", "admit must be 1 to 255");
        refused("emb:16:adagrad:ttl=soon", "ttl=soon is not a count of clocks");
        refused("e/m:16", "its name must be");
        refused("emb:16,emb:8", "table emb is declared twice");
        char many[1024] = "";
        for (int i = 0; i <= (int) JOB_MAX_TABLES; i++)
                snprintf(many + strlen(many), sizeof many - strlen(many), "%st%d:1", i ? "," : "", i);
        refused(many, "more than 64 tables");
}

int main(void) {
        test_parse();
        test_refusals();
        return tap_done();
}
