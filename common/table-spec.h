/* SPDX-License-Identifier: Apache-2.0 */
/* A job's sparse tables (issue 34): what each is, as the job declares it and
 * the shards build it (ps/psd/psd-table.h keeps the rows). A table has a name,
 * rows of dim floats keyed by arbitrary 64-bit ids, an initialiser and a
 * per-row optimizer with its figures.
 *
 * Written on the command line (--tables) and on the wire (JobSpec.tables) as
 * one text: tables separated by ',', each NAME:DIM[:OPTIM][:KEY=VALUE]...
 *   OPTIM  sgd, adagrad (the default), adam (lazy: a row's own step count)
 *          or ftrl (FTRL-proximal, lr is its alpha; rows start at 0)
 *   KEY    lr, eps, beta1, beta2 (adam), beta, l1, l2 (ftrl), init (new rows
 *          uniform in [-init, init); 0: zeros), max-rows (per shard, 0: no
 *          bound; when full the least recently pushed rows make room),
 *          admit (an id gets a row once it was pushed this many times,
 *          1..255; counted in a count-min sketch), ttl (a row not pushed for
 *          this many clocks is dropped; 0: never), cache (a worker keeps the
 *          rows it pulled and reads them again for this many clocks before
 *          it pulls them anew: a hot-row cache; 0: off), cache-rows (the
 *          rows it keeps, default 262,144)
 * e.g. "ad:1:ftrl:lr=0.05:l1=1,emb:16:adagrad:lr=0.1". Defaults follow
 * torch.optim's where it has the optimizer (adagrad lr 0.01 eps 1e-10; adam
 * lr 0.001 betas 0.9/0.999 eps 1e-8), FTRL McMahan et al.'s (alpha 0.05,
 * beta 1); sgd lr 0.01; init 0.01. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TABLE_MAX_DIM 4096u
#define TABLE_MAX_NAME 64u
#define JOB_MAX_TABLES 64u  /* a table per field of a click log of up to 64 fields (MD_MAX_FIELDS) */
#define TABLE_DEFAULT_CACHE_ROWS 262144u
#define TABLE_MAX_CACHE_ROWS (1u << 26)

typedef enum { TABLE_SGD, TABLE_ADAGRAD, TABLE_ADAM, TABLE_FTRL } TableOptim;

typedef struct TableConf {
        char name[TABLE_MAX_NAME];
        uint32_t dim;           /* floats per row, 1..TABLE_MAX_DIM */
        TableOptim optim;
        float lr;               /* ftrl: alpha */
        float eps;              /* adagrad, adam */
        float beta1, beta2;     /* adam */
        float beta, l1, l2;     /* ftrl */
        float init_scale;       /* new rows uniform in [-init_scale, init_scale) (0: zeros; ftrl: always 0) */
        uint64_t seed;          /* of the new rows' values (the job's seed and the table's place) */
        uint64_t max_rows;      /* rows one shard may hold (0: no bound): the least recently pushed go */
        uint32_t admit;         /* pushes of an id before it gets a row (0 or 1: the first) */
        uint64_t ttl;           /* clocks a row may go unpushed before it is dropped (0: never) */
        uint64_t cache;         /* clocks a worker reads a pulled row again before it pulls it anew (0: off) */
        uint64_t cache_rows;    /* rows a worker's cache keeps (0: TABLE_DEFAULT_CACHE_ROWS) */
} TableConf;

/* "sgd", "adagrad", "adam", "ftrl"; -EINVAL for anything else. */
int table_optim_from_string(const char *s, TableOptim *ret);
const char *table_optim_name(TableOptim o);
/* Floats of optimizer state per row value (sgd 0, adagrad 1, adam 2, ftrl 2). */
unsigned table_state_per_value(TableOptim o);
/* A table of this name, dim and optimizer with its defaults (above). */
void table_conf_init(TableConf *c, const char *name, uint32_t dim, TableOptim o);
/* 0, or -EINVAL with why naming the field out of range. */
int table_conf_check(const TableConf *c, char *why, size_t n);
/* Bytes one row takes on a shard: its values and optimizer state (and adam's step count). */
uint64_t table_row_bytes(const TableConf *c);

/* Parses the text above into at most max tables (seed left 0): 0 with their
 * count, or -EINVAL with err saying which table and field. "" is no tables. */
int tables_parse(const char *s, TableConf *out, size_t max, size_t *ret_n, char *err, size_t errlen);
/* The text tables_parse reads back into the same tables (every figure
 * written, %.9g): 0, or -ENOSPC when n bytes are too few. */
int tables_format(const TableConf *t, size_t count, char *buf, size_t n);
