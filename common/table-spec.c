/* SPDX-License-Identifier: Apache-2.0 */
/* See table-spec.h. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "table-spec.h"

static const char *const optim_names[] = { "sgd", "adagrad", "adam", "ftrl" };

int table_optim_from_string(const char *s, TableOptim *ret) {
        for (size_t i = 0; i < sizeof optim_names / sizeof *optim_names; i++)
                if (strcmp(s, optim_names[i]) == 0) {
                        *ret = (TableOptim) i;
                        return 0;
                }
        return -EINVAL;
}

const char *table_optim_name(TableOptim o) {
        return (unsigned) o < sizeof optim_names / sizeof *optim_names ? optim_names[o] : "?";
}

unsigned table_state_per_value(TableOptim o) {
        return o == TABLE_SGD ? 0 : o == TABLE_ADAGRAD ? 1 : 2;
}

void table_conf_init(TableConf *c, const char *name, uint32_t dim, TableOptim o) {
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", name);
        c->dim = dim;
        c->optim = o;
        c->lr = o == TABLE_ADAM ? 0.001f : o == TABLE_FTRL ? 0.05f : 0.01f;
        c->eps = o == TABLE_ADAM ? 1e-8f : 1e-10f;
        c->beta1 = 0.9f;
        c->beta2 = 0.999f;
        c->beta = 1.0f;
        c->init_scale = o == TABLE_FTRL ? 0.0f : 0.01f;
        c->admit = 1;
}

static bool finite_pos(float x) { return isfinite(x) && x > 0; }

/* A name as a tensor's: letters, digits, '_', '.', '-'; not empty. */
static bool good_name(const char *s) {
        if (!s[0])
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
                      *s == '_' || *s == '.' || *s == '-'))
                        return false;
        return true;
}

int table_conf_check(const TableConf *c, char *why, size_t n) {
        const char *bad = NULL;
        if (!memchr(c->name, 0, sizeof c->name) || !good_name(c->name))
                bad = "its name must be 1 to 63 letters, digits, '_', '.' or '-'";
        else if (c->dim == 0 || c->dim > TABLE_MAX_DIM)
                bad = "dim must be 1 to 4096";
        else if ((unsigned) c->optim > TABLE_FTRL)
                bad = "unknown optimizer (sgd, adagrad, adam, ftrl)";
        else if (!finite_pos(c->lr))
                bad = "lr must be positive";
        else if ((c->optim == TABLE_ADAGRAD || c->optim == TABLE_ADAM) && !finite_pos(c->eps))
                bad = "eps must be positive";
        else if (c->optim == TABLE_ADAM && !(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
                bad = "adam's beta1 and beta2 must be in [0, 1)";
        else if (c->optim == TABLE_FTRL && !(c->beta >= 0 && c->l1 >= 0 && c->l2 >= 0 && isfinite(c->beta) &&
                                             isfinite(c->l1) && isfinite(c->l2)))
                bad = "ftrl's beta, l1 and l2 must be finite and >= 0";
        else if (!(c->init_scale >= 0 && isfinite(c->init_scale)))
                bad = "init must be finite and >= 0";
        else if (c->admit > 255)
                bad = "admit must be 1 to 255 pushes";
        else if (c->cache_rows > TABLE_MAX_CACHE_ROWS)
                bad = "cache-rows must be at most 67,108,864";
        if (bad && why && n)
                snprintf(why, n, "%s", bad);
        return bad ? -EINVAL : 0;
}

uint64_t table_row_bytes(const TableConf *c) {
        return (uint64_t) c->dim * (1 + table_state_per_value(c->optim)) * sizeof(float) +
               (c->optim == TABLE_ADAM ? sizeof(float) : 0);
}

static int perr(char *err, size_t n, const char *fmt, ...) {
        if (err && n) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(err, n, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

static bool parse_float(const char *v, float *ret) {
        char *end;
        errno = 0;
        float x = strtof(v, &end);
        if (errno || end == v || *end)
                return false;
        *ret = x;
        return true;
}

/* One KEY=VALUE of table c. */
static int parse_option(TableConf *c, char *kv, char *err, size_t n) {
        char *eq = strchr(kv, '=');
        if (!eq)
                return perr(err, n, "table %s: '%s' is not KEY=VALUE", c->name, kv);
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        static const struct { const char *key, *what; size_t off; bool u32; } counts[] = {
                { "max-rows", "rows", offsetof(TableConf, max_rows), false },
                { "admit", "pushes", offsetof(TableConf, admit), true },
                { "ttl", "clocks", offsetof(TableConf, ttl), false },
                { "cache", "clocks", offsetof(TableConf, cache), false },
                { "cache-rows", "rows", offsetof(TableConf, cache_rows), false },
        };
        for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
                if (strcmp(k, counts[i].key) != 0)
                        continue;
                char *end;
                errno = 0;
                unsigned long long x = strtoull(v, &end, 10);
                if (errno || end == v || *end || v[0] == '-' || (counts[i].u32 && x > UINT32_MAX))
                        return perr(err, n, "table %s: %s=%s is not a count of %s", c->name, k, v, counts[i].what);
                if (counts[i].u32)
                        *(uint32_t *) ((char *) c + counts[i].off) = (uint32_t) x;
                else
                        *(uint64_t *) ((char *) c + counts[i].off) = x;
                return 0;
        }
        static const struct { const char *key; size_t off; } keys[] = {
                { "lr", offsetof(TableConf, lr) },       { "eps", offsetof(TableConf, eps) },
                { "beta1", offsetof(TableConf, beta1) }, { "beta2", offsetof(TableConf, beta2) },
                { "beta", offsetof(TableConf, beta) },   { "l1", offsetof(TableConf, l1) },
                { "l2", offsetof(TableConf, l2) },       { "init", offsetof(TableConf, init_scale) },
        };
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
                if (strcmp(k, keys[i].key) == 0) {
                        if (!parse_float(v, (float *) ((char *) c + keys[i].off)))
                                return perr(err, n, "table %s: %s=%s is not a number", c->name, k, v);
                        return 0;
                }
        return perr(err, n, "table %s: unknown key '%s' (lr, eps, beta1, beta2, beta, l1, l2, init, max-rows, admit, "
                    "ttl, cache, cache-rows)", c->name, k);
}

/* One NAME:DIM[:OPTIM][:KEY=VALUE]... (s is cut in place). */
static int parse_one(char *s, TableConf *c, char *err, size_t n) {
        char *save = NULL, *name = strtok_r(s, ":", &save), *dim = name ? strtok_r(NULL, ":", &save) : NULL;
        if (!name || !dim)
                return perr(err, n, "table '%s': NAME:DIM[:OPTIM][:KEY=VALUE]... expected", s);
        char *end;
        errno = 0;
        unsigned long d = strtoul(dim, &end, 10);
        if (errno || end == dim || *end || dim[0] == '-' || d == 0 || d > TABLE_MAX_DIM)
                return perr(err, n, "table %s: dim '%s' is not 1 to %u", name, dim, TABLE_MAX_DIM);
        if (strlen(name) >= TABLE_MAX_NAME)
                return perr(err, n, "table name '%.40s...' is longer than %u bytes", name, TABLE_MAX_NAME - 1);
        char *tok = strtok_r(NULL, ":", &save);
        TableOptim o = TABLE_ADAGRAD;
        if (tok && !strchr(tok, '=')) {
                if (table_optim_from_string(tok, &o) < 0)
                        return perr(err, n, "table %s: optimizer '%s' is not sgd, adagrad, adam or ftrl", name, tok);
                tok = strtok_r(NULL, ":", &save);
        }
        table_conf_init(c, name, (uint32_t) d, o);
        for (; tok; tok = strtok_r(NULL, ":", &save))
                if (parse_option(c, tok, err, n) < 0)
                        return -EINVAL;
        char why[128];
        if (table_conf_check(c, why, sizeof why) < 0)
                return perr(err, n, "table %s: %s", c->name, why);
        return 0;
}

int tables_parse(const char *s, TableConf *out, size_t max, size_t *ret_n, char *err, size_t errlen) {
        size_t count = 0;
        char *copy = strdup(s ? s : "");
        if (!copy)
                return perr(err, errlen, "out of memory");
        int r = 0;
        char *save = NULL;
        for (char *one = strtok_r(copy, ",", &save); one; one = strtok_r(NULL, ",", &save)) {
                if (count == max) {
                        r = perr(err, errlen, "more than %zu tables", max);
                        break;
                }
                if ((r = parse_one(one, &out[count], err, errlen)) < 0)
                        break;
                for (size_t i = 0; i < count && r == 0; i++)
                        if (strcmp(out[i].name, out[count].name) == 0)
                                r = perr(err, errlen, "table %s is declared twice", out[count].name);
                if (r < 0)
                        break;
                count++;
        }
        free(copy);
        if (r == 0)
                *ret_n = count;
        return r;
}

int tables_format(const TableConf *t, size_t count, char *buf, size_t n) {
        size_t at = 0;
        if (n)
                buf[0] = 0;
        for (size_t i = 0; i < count; i++) {
                const TableConf *c = &t[i];
                int w = snprintf(buf + at, n - at,
                                 "%s%s:%u:%s:lr=%.9g:eps=%.9g:beta1=%.9g:beta2=%.9g:beta=%.9g:l1=%.9g:l2=%.9g:"
                                 "init=%.9g:max-rows=%llu:admit=%u:ttl=%llu:cache=%llu:cache-rows=%llu",
                                 i ? "," : "", c->name, c->dim, table_optim_name(c->optim), (double) c->lr,
                                 (double) c->eps, (double) c->beta1, (double) c->beta2, (double) c->beta,
                                 (double) c->l1, (double) c->l2, (double) c->init_scale,
                                 (unsigned long long) c->max_rows, c->admit, (unsigned long long) c->ttl,
                                 (unsigned long long) c->cache, (unsigned long long) c->cache_rows);
                if (w < 0 || (size_t) w >= n - at)
                        return -ENOSPC;
                at += (size_t) w;
        }
        return 0;
}
