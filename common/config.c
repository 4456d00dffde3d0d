/* SPDX-License-Identifier: Apache-2.0 */
/* Option parsing for psnet's daemons and tools (see config.h): an INI file read
 * with inih, then "--name value" / "--name=value" flags, which win. Errors are
 * printed to stderr once, naming the option and where it came from, because
 * that is this module's whole contract with its callers (they exit on -EINVAL).
 *
 * Conventions:
 *   - Names match with '-' and '_' interchangeable ("expect-workers" in a flag,
 *     "expect_workers" in a file).
 *   - Numbers are decimal; unsigned options refuse a sign; floats must be finite.
 *   - Booleans: a bare "--name" sets true, "--no-name" false, and
 *     "--name=VALUE" / "name = VALUE" take true/false/yes/no/on/off/1/0.
 *   - --config FILE is applied before every other flag, wherever it stands;
 *     several are applied in order. If the table itself has an option named
 *     "config" it also receives the path (daemons keep it for SIGHUP reloads).
 *   - --help / -h and --version are acted on when met, so "--help" shows the
 *     program's built-in defaults. */
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "macro.h"
#include "psnet-config.h"
#include "version.h"

/* Strings this module strdup'd into OPT_STR options. An option's initial value
 * may be a string literal, so ownership cannot be read off the pointer: we keep
 * the list. Parsing happens at start-up, on one thread. */
static char **owned;
static size_t nowned, cap_owned;

static bool owned_remove(const char *p) {
        for (size_t i = 0; i < nowned; i++)
                if (owned[i] == p) {
                        owned[i] = owned[--nowned];
                        return true;
                }
        return false;
}

static int owned_add(char *p) {
        if (nowned == cap_owned) {
                size_t n = cap_owned ? cap_owned * 2 : 16;
                char **a = realloc(owned, n * sizeof *a);
                if (!a)
                        return -ENOMEM;
                owned = a;
                cap_owned = n;
        }
        owned[nowned++] = p;
        return 0;
}

/* Compares names with '-' and '_' treated as the same character. */
static bool name_eq(const char *a, const char *b, size_t blen) {
        size_t i;
        for (i = 0; i < blen && a[i]; i++) {
                char x = a[i] == '_' ? '-' : a[i], y = b[i] == '_' ? '-' : b[i];
                if (x != y)
                        return false;
        }
        return i == blen && a[i] == '\0';
}

static const Option *option_find(const Option *opts, size_t nopts, const char *name, size_t len) {
        for (size_t i = 0; i < nopts; i++)
                if (opts[i].name && opts[i].ptr && name_eq(opts[i].name, name, len))
                        return &opts[i];
        return NULL;
}

static void print_where(const ProgramInfo *prog, const char *where) {
        if (where)
                fprintf(stderr, "%s: %s: ", prog->name, where);
        else
                fprintf(stderr, "%s: ", prog->name);
}

static int parse_bool(const char *s, bool *ret) {
        static const char *const yes[] = { "1", "true", "yes", "on" };
        static const char *const no[] = { "0", "false", "no", "off" };
        for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *ret = true;
                        return 0;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *ret = false;
                        return 0;
                }
        }
        return -EINVAL;
}

/* Signed decimal integer in [lo, hi]. */
static int parse_signed(const char *s, long long lo, long long hi, long long *ret) {
        char *end;
        long long v;
        if (*s == '\0' || !(*s == '-' || *s == '+' || (*s >= '0' && *s <= '9')))
                return -EINVAL;
        errno = 0;
        v = strtoll(s, &end, 10);
        if (*end != '\0')
                return -EINVAL;
        if (errno == ERANGE || v < lo || v > hi)
                return -ERANGE;
        *ret = v;
        return 0;
}

/* A sign is refused: strtoull would wrap "-1". */
int config_parse_unsigned(const char *s, unsigned long long hi, unsigned long long *ret) {
        char *end;
        unsigned long long v;
        if (!(*s >= '0' && *s <= '9'))
                return -EINVAL;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (*end != '\0')
                return -EINVAL;
        if (errno == ERANGE || v > hi)
                return -ERANGE;
        *ret = v;
        return 0;
}

static int parse_float(const char *s, float *ret) {
        char *end;
        float v;
        if (*s == '\0' || *s == ' ' || *s == '\t')
                return -EINVAL;
        errno = 0;
        v = strtof(s, &end);
        if (*end != '\0')
                return -EINVAL;
        if (!isfinite(v) || (errno == ERANGE && fabsf(v) >= 1.0f))
                return -ERANGE;
        *ret = v;
        return 0;
}

static int set_value(const Option *o, const char *value) {
        long long sv;
        unsigned long long uv;
        int r;

        switch (o->type) {
        case OPT_STR: {
                char **p = o->ptr, *s = strdup(value);
                if (!s)
                        return -ENOMEM;
                r = owned_add(s);
                if (r < 0) {
                        free(s);
                        return r;
                }
                if (*p && owned_remove(*p))
                        free(*p);
                *p = s;
                return 0;
        }
        case OPT_INT:
                r = parse_signed(value, INT_MIN, INT_MAX, &sv);
                if (r >= 0)
                        *(int *) o->ptr = (int) sv;
                return r;
        case OPT_UINT:
                r = config_parse_unsigned(value, UINT_MAX, &uv);
                if (r >= 0)
                        *(unsigned *) o->ptr = (unsigned) uv;
                return r;
        case OPT_U64:
                r = config_parse_unsigned(value, UINT64_MAX, &uv);
                if (r >= 0)
                        *(uint64_t *) o->ptr = (uint64_t) uv;
                return r;
        case OPT_FLOAT:
                return parse_float(value, o->ptr);
        case OPT_BOOL:
                return parse_bool(value, o->ptr);
        }
        return -EINVAL;
}

static const char *type_expect(OptType t) {
        switch (t) {
        case OPT_INT: return "an integer";
        case OPT_UINT: return "a non-negative integer";
        case OPT_U64: return "a non-negative integer";
        case OPT_FLOAT: return "a finite number";
        case OPT_BOOL: return "true or false";
        case OPT_STR: return "a string";
        }
        return "a value";
}

/* Sets option o; where == NULL means the command line. */
static int option_set(const ProgramInfo *prog, const Option *o, const char *value, const char *where) {
        int r = set_value(o, value);
        if (r == -ENOMEM) {
                print_where(prog, where);
                fprintf(stderr, "out of memory\n");
                return -ENOMEM;
        }
        if (r < 0) {
                print_where(prog, where);
                fprintf(stderr, "invalid value '%s' for %s%s%s: %s %s\n", value,
                        where ? "'" : "--", o->name, where ? "'" : "",
                        r == -ERANGE ? "out of range, expected" : "expected", type_expect(o->type));
                return -EINVAL;
        }
        return 0;
}

int config_set(const ProgramInfo *prog, const Option *opts, size_t nopts, const char *name,
               const char *value, const char *where) {
        const Option *o = option_find(opts, nopts, name, strlen(name));
        if (!o) {
                print_where(prog, where);
                fprintf(stderr, "unknown %s '%s%s' (see %s --help)\n", where ? "key" : "option",
                        where ? "" : "--", name, prog->name);
                return -EINVAL;
        }
        if (!value) {
                print_where(prog, where);
                fprintf(stderr, "'%s' needs a value\n", name);
                return -EINVAL;
        }
        return option_set(prog, o, value, where);
}

/* --- config file ----------------------------------------------------------- */

typedef struct FileCtx {
        const ProgramInfo *prog;
        const Option *opts;
        size_t nopts;
        const char *path;
        FILE *f;
        int line;         /* physical line of the text last handed to inih */
        bool at_bol;      /* the next read starts a new physical line */
        int too_long;     /* first line that did not fit inih's buffer, or 0 */
        int bad_line;     /* first line our handler refused, or 0 */
        int r;            /* first error from the handler */
        int read_errno;   /* errno of a failed read, or 0 */
} FileCtx;

/* fgets for inih that counts physical lines (inih's own count is not passed to
 * the handler in Debian's build), swallows the rest of an over-long line, and
 * strips leading blanks so an indented "key = value" is not taken for a
 * continuation of the previous value. */
static char *file_reader(char *str, int num, void *stream) {
        FileCtx *c = stream;
        size_t n, skip;

        if (!fgets(str, num, c->f)) {
                if (ferror(c->f))
                        c->read_errno = errno ? errno : EIO;
                return NULL;
        }
        if (c->at_bol)
                c->line++;
        n = strlen(str);
        c->at_bol = n > 0 && str[n - 1] == '\n';
        if (!c->at_bol && !feof(c->f)) {
                int ch;
                if (!c->too_long)
                        c->too_long = c->line;
                while ((ch = fgetc(c->f)) != EOF && ch != '\n')
                        ;
                c->at_bol = true;
        }
        skip = strspn(str, " \t");
        if (skip > 0)
                memmove(str, str + skip, n - skip + 1);
        return str;
}

static int file_handler(void *user, const char *section _unused_, const char *name, const char *value) {
        FileCtx *c = user;
        char where[PATH_MAX + 32];
        int r;

        snprintf(where, sizeof where, "%s:%d", c->path, c->line);
        if (name_eq("config", name, strlen(name))) {
                print_where(c->prog, where);
                fprintf(stderr, "'config' cannot be set inside a config file\n");
                r = -EINVAL;
        } else
                r = config_set(c->prog, c->opts, c->nopts, name, value, where);
        if (r < 0) {
                if (!c->bad_line) {
                        c->bad_line = c->line;
                        c->r = r;
                }
                return 0;
        }
        return 1;
}

int config_load_file(const ProgramInfo *prog, const Option *opts, size_t nopts, const char *path) {
        FileCtx c = { .prog = prog, .opts = opts, .nopts = nopts, .path = path, .at_bol = true };
        int r;

        c.f = fopen(path, "re");
        if (!c.f) {
                fprintf(stderr, "%s: cannot read config file %s: %s\n", prog->name, path, strerror(errno));
                return -EINVAL;
        }
        r = ini_parse_stream(file_reader, &c, file_handler, &c);
        fclose(c.f);
        if (c.read_errno) {
                fprintf(stderr, "%s: cannot read config file %s: %s\n", prog->name, path,
                        strerror(c.read_errno));
                return -EINVAL;
        }
        if (r == -2) {
                fprintf(stderr, "%s: %s: out of memory\n", prog->name, path);
                return -ENOMEM;
        }
        if (c.too_long) {
                fprintf(stderr, "%s: %s:%d: line too long\n", prog->name, path, c.too_long);
                return -EINVAL;
        }
        if (c.bad_line)
                return c.r == -ENOMEM ? -ENOMEM : -EINVAL;
        if (r != 0) {
                /* inih refused a line our handler never saw. Without over-long
                 * lines inih's count equals ours. */
                fprintf(stderr, "%s: %s:%d: syntax error (expected 'key = value' or '[section]')\n",
                        prog->name, path, r);
                return -EINVAL;
        }
        return 0;
}

/* --- command line ------------------------------------------------------------ */

typedef struct Flag {
        const Option *opt;   /* NULL for --config */
        const char *value;   /* NULL for a bare boolean */
        bool negate;         /* --no-NAME */
} Flag;

static bool is_builtin(const char *name, size_t len, const char *builtin) {
        return name_eq(builtin, name, len);
}

int config_parse(const ProgramInfo *prog, const Option *opts, size_t nopts, int argc,
                 char **argv, int *ret_optind) {
        _cleanup_free_ Flag *flags = NULL;
        size_t nflags = 0;
        const Option *config_opt = option_find(opts, nopts, "config", strlen("config"));
        int i, r, first_arg;

        flags = calloc(argc > 0 ? (size_t) argc : 1, sizeof *flags);
        if (!flags) {
                fprintf(stderr, "%s: out of memory\n", prog->name);
                return -ENOMEM;
        }

        /* Pass 1: split the flags from their values, find --help, --version and
         * unknown names, without setting anything yet. */
        for (i = 1; i < argc; i++) {
                const char *a = argv[i], *name, *eq, *value = NULL;
                const Option *o;
                size_t len;
                bool negate = false;

                if (strcmp(a, "--") == 0) {
                        i++;
                        break;
                }
                if (a[0] != '-' || a[1] == '\0')
                        break;
                if (strcmp(a, "-h") == 0) {
                        config_print_help(prog, opts, nopts);
                        return 1;
                }
                if (a[1] != '-') {
                        fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", prog->name, a, prog->name);
                        return -EINVAL;
                }
                name = a + 2;
                eq = strchr(name, '=');
                len = eq ? (size_t) (eq - name) : strlen(name);
                if (eq)
                        value = eq + 1;

                if (is_builtin(name, len, "help") || is_builtin(name, len, "version")) {
                        if (value) {
                                fprintf(stderr, "%s: option '--%.*s' takes no value\n", prog->name, (int) len, name);
                                return -EINVAL;
                        }
                        if (is_builtin(name, len, "help"))
                                config_print_help(prog, opts, nopts);
                        else
                                printf("%s %s (git %s)\n", prog->name, psnet_version(), psnet_revision());
                        return 1;
                }

                o = option_find(opts, nopts, name, len);
                if (!o && !is_builtin(name, len, "config") && len > 3 && strncmp(name, "no-", 3) == 0) {
                        o = option_find(opts, nopts, name + 3, len - 3);
                        if (o && o->type == OPT_BOOL && !value)
                                negate = true;
                        else
                                o = NULL;
                }
                if (!o && !is_builtin(name, len, "config")) {
                        fprintf(stderr, "%s: unknown option '--%.*s' (see %s --help)\n", prog->name,
                                (int) len, name, prog->name);
                        return -EINVAL;
                }
                if (!value && !(o && o->type == OPT_BOOL)) {
                        /* A following "--word" is taken for a forgotten value;
                         * "--name=--word" passes one on purpose. */
                        if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                                fprintf(stderr, "%s: option '--%.*s' needs a value (%s)\n", prog->name,
                                        (int) len, name, o && o->arg ? o->arg : "FILE");
                                return -EINVAL;
                        }
                        value = argv[++i];
                }
                flags[nflags++] = (Flag) {
                        .opt = is_builtin(name, len, "config") ? NULL : o,
                        .value = value,
                        .negate = negate,
                };
        }
        first_arg = i < argc ? i : argc;

        /* Pass 2: config files, in order, so that the flags below override them. */
        for (size_t k = 0; k < nflags; k++)
                if (!flags[k].opt) {
                        r = config_load_file(prog, opts, nopts, flags[k].value);
                        if (r < 0)
                                return r;
                        if (config_opt) {
                                r = option_set(prog, config_opt, flags[k].value, NULL);
                                if (r < 0)
                                        return r;
                        }
                }

        /* Pass 3: the other flags, in order. */
        for (size_t k = 0; k < nflags; k++) {
                const Flag *f = &flags[k];
                if (!f->opt)
                        continue;
                if (f->opt->type == OPT_BOOL && !f->value) {
                        *(bool *) f->opt->ptr = !f->negate;
                        continue;
                }
                r = option_set(prog, f->opt, f->value, NULL);
                if (r < 0)
                        return r;
        }
        if (ret_optind)
                *ret_optind = first_arg;
        return 0;
}

/* --- help ---------------------------------------------------------------------- */

static const char *arg_of(const Option *o) {
        if (o->arg)
                return o->arg;
        switch (o->type) {
        case OPT_STR: return "STRING";
        case OPT_INT: return "INT";
        case OPT_UINT:
        case OPT_U64: return "N";
        case OPT_FLOAT: return "NUMBER";
        case OPT_BOOL: return "";
        }
        return "VALUE";
}

static void print_default(const Option *o) {
        /* A help text that states its own default (one computed at start,
         * say) is not followed by the variable's initial value. */
        if (!o->ptr || (o->help && strstr(o->help, "(default")))
                return;
        switch (o->type) {
        case OPT_STR: {
                const char *s = *(char *const *) o->ptr;
                if (s && *s)
                        printf(" (default: %s)", s);
                break;
        }
        case OPT_INT: printf(" (default: %d)", *(const int *) o->ptr); break;
        case OPT_UINT: printf(" (default: %u)", *(const unsigned *) o->ptr); break;
        case OPT_U64: printf(" (default: %llu)", (unsigned long long) *(const uint64_t *) o->ptr); break;
        case OPT_FLOAT: printf(" (default: %g)", (double) *(const float *) o->ptr); break;
        case OPT_BOOL:
                if (*(const bool *) o->ptr)
                        printf(" (default: on)");
                break;
        }
}

static void print_option(int width, const char *name, const char *arg, const char *help) {
        char left[160];
        snprintf(left, sizeof left, "--%s%s%s", name, *arg ? " " : "", arg);
        printf("  %-*s  %s", width, left, help ? help : "");
}

void config_print_help(const ProgramInfo *prog, const Option *opts, size_t nopts) {
        int width = (int) strlen("--config FILE");
        bool has_config = option_find(opts, nopts, "config", strlen("config")) != NULL;

        for (size_t i = 0; i < nopts; i++) {
                const char *arg = opts[i].type == OPT_BOOL ? "" : arg_of(&opts[i]);
                if (!opts[i].name)
                        continue;
                int w = (int) (2 + strlen(opts[i].name) + (*arg ? 1 + strlen(arg) : 0));
                width = MAX(width, MIN(w, 40));
        }

        printf("Usage: %s %s\n", prog->name, prog->usage ? prog->usage : "[OPTIONS]");
        if (prog->summary)
                printf("%s\n", prog->summary);
        printf("\nOptions:\n");
        for (size_t i = 0; i < nopts; i++) {
                const Option *o = &opts[i];
                if (!o->name)
                        continue;
                print_option(width, o->name, o->type == OPT_BOOL ? "" : arg_of(o), o->help);
                print_default(o);
                printf("\n");
        }
        if (!has_config) {
                print_option(width, "config", "FILE", "read options from an INI file; flags override it");
                printf("\n");
        }
        print_option(width, "help", "", "show this help and exit");
        printf("\n");
        print_option(width, "version", "", "show the version and exit");
        printf("\n");
        if (prog->epilog)
                printf("\n%s%s", prog->epilog,
                       prog->epilog[0] && prog->epilog[strlen(prog->epilog) - 1] == '\n' ? "" : "\n");
}

void config_free_strings(const Option *opts, size_t nopts) {
        for (size_t i = 0; i < nopts; i++) {
                char **p;
                if (opts[i].type != OPT_STR || !opts[i].ptr)
                        continue;
                p = opts[i].ptr;
                if (*p && owned_remove(*p)) {
                        free(*p);
                        *p = NULL;
                }
        }
        if (nowned == 0) {
                owned = mfree(owned);
                cap_owned = 0;
        }
}
