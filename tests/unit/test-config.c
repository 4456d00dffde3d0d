/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/config.c: flags in both spellings, config files, flags
 * overriding files, and the error messages for every kind of bad input. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include "config.h"
#include "log.h"
#include "macro.h"
#include "psnet-config.h"
#include "tap.h"
#include "version.h"

static char *o_listen;
static int o_clock;
static unsigned o_workers;
static uint64_t o_seed;
static float o_lr;
static bool o_verbose;

static const ProgramInfo prog = {
        .name = "tprog", .summary = "a test program", .usage = "[OPTIONS] COMMAND",
        .epilog = "Commands:\n  run   do it\n",
};

static const Option opts[] = {
        { "listen", OPT_STR, &o_listen, "ENDPOINT", "where to listen" },
        { "clock", OPT_INT, &o_clock, "N", "a signed number" },
        { "expect-workers", OPT_UINT, &o_workers, "N", "workers to wait for" },
        { "seed", OPT_U64, &o_seed, "N", "random seed" },
        { "lr", OPT_FLOAT, &o_lr, "RATE", "learning rate" },
        { "verbose", OPT_BOOL, &o_verbose, NULL, "say more" },
};
#define NOPTS (sizeof opts / sizeof opts[0])

static void reset(void) {
        config_free_strings(opts, NOPTS);
        o_listen = (char *) "tcp://*:5555"; /* a literal default: must never be freed */
        o_clock = 7;
        o_workers = 2;
        o_seed = 42;
        o_lr = 0.5f;
        o_verbose = false;
}

/* Captures what fd (1 or 2) receives while a parse runs. */
typedef struct Capture {
        int fd, saved;
        char path[64];
} Capture;

static void capture_begin(Capture *c, int fd) {
        int t;
        c->fd = fd;
        snprintf(c->path, sizeof c->path, "/tmp/test-config-out-XXXXXX");
        t = mkstemp(c->path);
        fflush(fd == 1 ? stdout : stderr);
        c->saved = dup(fd);
        if (t < 0 || c->saved < 0 || dup2(t, fd) < 0) {
                fprintf(stderr, "capture failed\n");
                exit(1);
        }
        close(t);
}

/* Returns a malloc'd copy of what was captured. */
static char *capture_end(Capture *c) {
        char *buf = calloc(1, 8192);
        FILE *f;
        fflush(c->fd == 1 ? stdout : stderr);
        dup2(c->saved, c->fd);
        close(c->saved);
        f = fopen(c->path, "r");
        if (f && buf) {
                size_t n = fread(buf, 1, 8191, f);
                buf[n] = '\0';
        }
        if (f)
                fclose(f);
        unlink(c->path);
        return buf;
}

/* Runs config_parse on a NULL-terminated list, capturing stderr into *ret_err. */
static int parse(char **ret_err, int *ret_optind, ...) {
        char *argv[32];
        int argc = 0, r, optind = -1;
        va_list ap;
        Capture c;

        argv[argc++] = (char *) "tprog";
        va_start(ap, ret_optind);
        for (char *a; (a = va_arg(ap, char *));)
                argv[argc++] = a;
        va_end(ap);
        argv[argc] = NULL;

        capture_begin(&c, 2);
        r = config_parse(&prog, opts, NOPTS, argc, argv, &optind);
        char *err = capture_end(&c);
        if (err && *err && err[strlen(err) - 1] == '\n')
                err[strlen(err) - 1] = '\0';   /* keep TAP lines whole */
        if (ret_err)
                *ret_err = err;
        else
                free(err);
        if (ret_optind)
                *ret_optind = optind;
        return r;
}

static char *write_file(const char *text) {
        static char path[64];
        int fd;
        snprintf(path, sizeof path, "/tmp/test-config-XXXXXX");
        fd = mkstemp(path);
        if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t) strlen(text)) {
                fprintf(stderr, "cannot write %s\n", path);
                exit(1);
        }
        close(fd);
        return path;
}

static void test_flags(void) {
        int r, optind;
        char *err;

        reset();
        r = parse(&err, &optind, "--listen", "ipc:///tmp/a.sock", "--clock=-3", "--expect-workers", "4",
                  "--seed=18446744073709551615", "--lr", "0.125", "--verbose", "run", "--clock", "9",
                  (char *) NULL);
        CHECK(r == 0, "good flags parse (r=%d, stderr: %s)", r, err);
        CHECK(err && err[0] == '\0', "nothing printed on success");
        free(err);
        CHECK(o_listen && strcmp(o_listen, "ipc:///tmp/a.sock") == 0, "--listen VALUE sets a string");
        CHECK(o_clock == -3, "--clock=-3 sets a negative int (%d)", o_clock);
        CHECK(o_workers == 4, "--expect-workers 4 (%u)", o_workers);
        CHECK(o_seed == UINT64_MAX, "--seed takes the full u64 range");
        CHECK(o_lr == 0.125f, "--lr 0.125 (%g)", (double) o_lr);
        CHECK(o_verbose, "bare --verbose sets true");
        CHECK(optind == 10, "options stop at the first non-option (optind %d)", optind);

        r = parse(NULL, &optind, "--verbose=false", "--", "--clock", (char *) NULL);
        CHECK(r == 0 && !o_verbose, "--verbose=false sets false");
        CHECK(optind == 3, "\"--\" ends the options and is skipped (optind %d)", optind);

        o_verbose = true;
        r = parse(NULL, &optind, "--no-verbose", (char *) NULL);
        CHECK(r == 0 && !o_verbose, "--no-verbose sets false");
        CHECK(optind == 2, "optind is argc when all arguments are options (%d)", optind);

        r = parse(NULL, NULL, "--expect_workers=11", "--listen=", (char *) NULL);
        CHECK(r == 0 && o_workers == 11, "'_' and '-' are interchangeable in names");
        CHECK(o_listen && o_listen[0] == '\0', "--listen= sets an empty string");

        r = parse(NULL, NULL, "--listen", "a", "--listen", "b", (char *) NULL);
        CHECK(r == 0 && strcmp(o_listen, "b") == 0, "the last of repeated flags wins");

        r = parse(NULL, &optind, "-", (char *) NULL);
        CHECK(r == 0 && optind == 1, "a lone '-' is an argument, not an option");
}

static void test_errors(void) {
        char *err;
        int r;

        reset();
        r = parse(&err, NULL, "--foo", (char *) NULL);
        CHECK(r == -EINVAL, "unknown flag is -EINVAL (%d)", r);
        CHECK(err && strstr(err, "tprog: unknown option '--foo' (see tprog --help)"), "message names it: %s", err);
        free(err);

        r = parse(&err, NULL, "-x", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "'-x'"), "unknown short option: %s", err);
        free(err);

        r = parse(&err, NULL, "--listen", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "--listen") && strstr(err, "needs a value"),
              "missing value at the end: %s", err);
        free(err);

        r = parse(&err, NULL, "--listen", "--verbose", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "needs a value"), "a flag is not taken for a missing value: %s", err);
        free(err);

        struct { const char *flag, *value, *what; } bad[] = {
                { "--clock", "12abc", "trailing garbage" },
                { "--clock", "", "empty number" },
                { "--clock", "2147483648", "int overflow" },
                { "--clock", "0x10", "hex is not decimal" },
                { "--expect-workers", "-1", "negative unsigned" },
                { "--expect-workers", "4294967296", "unsigned overflow" },
                { "--seed", "18446744073709551616", "u64 overflow" },
                { "--seed", " 5", "leading blank" },
                { "--lr", "fast", "not a number" },
                { "--lr", "1e39", "float overflow" },
                { "--lr", "nan", "nan" },
                { "--lr", "0.5x", "float with garbage" },
                { "--verbose=", "maybe", "bad boolean" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                char flag[64];
                reset();
                if (strchr(bad[i].flag, '=')) {
                        snprintf(flag, sizeof flag, "%s%s", bad[i].flag, bad[i].value);
                        r = parse(&err, NULL, flag, (char *) NULL);
                } else
                        r = parse(&err, NULL, bad[i].flag, bad[i].value, (char *) NULL);
                CHECK(r == -EINVAL && strstr(err, "invalid value"), "%s is refused: %s", bad[i].what, err);
                free(err);
        }
        CHECK(o_clock == 7 && o_workers == 2 && o_seed == 42, "refused values leave options untouched");

        r = parse(&err, NULL, "--help=yes", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "takes no value"), "--help=VALUE refused: %s", err);
        free(err);
}

static void test_file(void) {
        char *path, *err, where[128];
        char arg[96];
        int r;

        reset();
        path = write_file("; comment\n"
                          "listen = ipc:///run/x.sock\n"
                          "[psd]\n"
                          "  clock = 12\n"
                          "expect_workers=5\n"
                          "# another comment\n"
                          "lr = 0.25 ; inline comment\n"
                          "verbose = yes\n");
        snprintf(arg, sizeof arg, "--config=%s", path);
        r = parse(&err, NULL, arg, (char *) NULL);
        CHECK(r == 0, "config file parses (r=%d: %s)", r, err);
        free(err);
        CHECK(o_listen && strcmp(o_listen, "ipc:///run/x.sock") == 0, "file sets a string");
        CHECK(o_clock == 12, "indented key in a section is read (%d)", o_clock);
        CHECK(o_workers == 5, "underscore key name in file");
        CHECK(o_lr == 0.25f, "inline comment stripped (%g)", (double) o_lr);
        CHECK(o_verbose, "boolean from file");

        /* Flags win over the file wherever --config stands. */
        reset();
        r = parse(&err, NULL, "--clock", "99", "--config", path, "--lr=2", (char *) NULL);
        CHECK(r == 0, "flags + file parse (%s)", err);
        free(err);
        CHECK(o_clock == 99, "flag before --config still overrides the file (%d)", o_clock);
        CHECK(o_lr == 2.0f, "flag after --config overrides the file");
        CHECK(o_workers == 5, "file values not given as flags stay");
        unlink(path);

        /* Unknown key names file and line. */
        reset();
        path = write_file("clock = 1\n\n[x]\nbogus = 3\n");
        r = parse(&err, NULL, "--config", path, (char *) NULL);
        snprintf(where, sizeof where, "%s:4: unknown key 'bogus'", path);
        CHECK(r == -EINVAL && strstr(err, where), "unknown key names file:line: %s", err);
        free(err);
        unlink(path);

        /* Bad number in a file. */
        reset();
        path = write_file("clock = ten\n");
        r = parse(&err, NULL, "--config", path, (char *) NULL);
        snprintf(where, sizeof where, "%s:1: invalid value 'ten' for 'clock'", path);
        CHECK(r == -EINVAL && strstr(err, where), "bad value in file names file:line: %s", err);
        free(err);
        unlink(path);

        /* Syntax error. */
        reset();
        path = write_file("clock = 1\njust some words\n");
        r = parse(&err, NULL, "--config", path, (char *) NULL);
        snprintf(where, sizeof where, "%s:2: syntax error", path);
        CHECK(r == -EINVAL && strstr(err, where), "syntax error names the line: %s", err);
        free(err);
        unlink(path);

        /* Unreadable file. */
        reset();
        r = parse(&err, NULL, "--config", "/nonexistent/psnet.conf", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "cannot read config file /nonexistent/psnet.conf"),
              "missing file is a clear error: %s", err);
        free(err);
        r = parse(&err, NULL, "--config", "/tmp", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "cannot read config file /tmp"), "a directory is refused: %s", err);
        free(err);
        r = parse(&err, NULL, "--config", (char *) NULL);
        CHECK(r == -EINVAL && strstr(err, "needs a value"), "--config without a file: %s", err);
        free(err);
}

static void test_config_set(void) {
        Capture c;
        int r;
        char *err;

        reset();
        r = config_set(&prog, opts, NOPTS, "seed", "123", "test");
        CHECK(r == 0 && o_seed == 123, "config_set sets a value");
        capture_begin(&c, 2);
        r = config_set(&prog, opts, NOPTS, "nope", "1", "where");
        err = capture_end(&c);
        CHECK(r == -EINVAL && strstr(err, "where: unknown key 'nope'"), "config_set unknown name");
        free(err);
}

static void test_help(void) {
        Capture c;
        char *out;
        int r;

        reset();
        capture_begin(&c, 1);
        {
                char *argv[] = { (char *) "tprog", (char *) "--lr", (char *) "bad", (char *) "--help", NULL };
                /* --lr's value is only parsed after the scan; --help wins first. */
                r = config_parse(&prog, opts, NOPTS, 4, argv, NULL);
        }
        out = capture_end(&c);
        CHECK(r == 1, "--help returns 1 (%d)", r);
        CHECK(out && strstr(out, "Usage: tprog [OPTIONS] COMMAND"), "usage line");
        CHECK(out && strstr(out, "a test program"), "summary");
        CHECK(out && strstr(out, "--listen ENDPOINT") && strstr(out, "where to listen"), "option with arg and help");
        CHECK(out && strstr(out, "(default: tcp://*:5555)"), "string default shown");
        CHECK(out && strstr(out, "(default: 7)") && strstr(out, "(default: 0.5)"), "number defaults shown");
        CHECK(out && strstr(out, "--config FILE"), "--config listed");
        CHECK(out && strstr(out, "Commands:\n  run   do it"), "epilog printed");
        free(out);

        capture_begin(&c, 1);
        {
                char *argv[] = { (char *) "tprog", (char *) "--version", NULL };
                r = config_parse(&prog, opts, NOPTS, 2, argv, NULL);
        }
        out = capture_end(&c);
        char want[128];
        snprintf(want, sizeof want, "tprog %s (git %s)\n", PSNET_VERSION, psnet_revision());
        CHECK(r == 1 && out && strcmp(out, want) == 0 && psnet_revision()[0], "--version prints \"%.*s\"",
              (int) strlen(want) - 1, want);
        free(out);
}

/* One line of JSON (--log-format json) for a log line: its fields and
 * their types, and what logfmt's words become. */
static void test_json_log(void) {
        Capture c;
        json_error_t e;
        log_setup("tprog");
        log_set_fields("shard=2");
        log_set_format(LOG_FORMAT_JSON);
        capture_begin(&c, 2);
        log_info("applied a push key=\"a \\\"b\\\" c\" clock=41 ratio=0.5 big=1e400 id=007 words=two words neg=-3");
        char *line = capture_end(&c);
        json_t *o = line ? json_loads(line, 0, &e) : NULL;
        CHECK(o && json_object_size(o) == 12, "a log line is one JSON object of 12 fields (%s)", line ? line : "?");
        CHECK(o && strcmp(json_string_value(json_object_get(o, "msg")) ?: "", "applied a push") == 0 &&
                      strcmp(json_string_value(json_object_get(o, "level")) ?: "", "info") == 0 &&
                      strcmp(json_string_value(json_object_get(o, "daemon")) ?: "", "tprog") == 0 &&
                      json_integer_value(json_object_get(o, "shard")) == 2 &&
                      strlen(json_string_value(json_object_get(o, "ts")) ?: "") == 24,
              "msg, level, daemon, the program's fields and a timestamp to the millisecond");
        CHECK(o && strcmp(json_string_value(json_object_get(o, "key")) ?: "", "a \"b\" c") == 0,
              "a quoted value is a string, its escapes undone");
        CHECK(o && json_is_integer(json_object_get(o, "clock")) && json_integer_value(json_object_get(o, "clock")) == 41 &&
                      json_is_real(json_object_get(o, "ratio")) && json_real_value(json_object_get(o, "ratio")) == 0.5 &&
                      json_integer_value(json_object_get(o, "neg")) == -3,
              "a bare number is a JSON number");
        CHECK(o && strcmp(json_string_value(json_object_get(o, "big")) ?: "", "1e400") == 0 &&
                      strcmp(json_string_value(json_object_get(o, "id")) ?: "", "007") == 0,
              "a number JSON cannot hold as written (1e400, 007) stays a string");
        CHECK(o && strcmp(json_string_value(json_object_get(o, "words")) ?: "", "two words") == 0,
              "a word that is no pair goes with the value before it");
        const char *keys[] = { "ts", "level", "daemon", "shard", "msg", "key" };
        size_t k = 0;
        const char *name;
        json_t *v;
        json_object_foreach(o, name, v) {
                if (k < ELEMENTSOF(keys) && strcmp(name, keys[k]) == 0)
                        k++;
        }
        CHECK(k == ELEMENTSOF(keys), "in logfmt's order: ts, level, daemon, fields, msg, then the pairs");
        json_decref(o);
        free(line);

        capture_begin(&c, 2);
        log_error_errno(ENOENT, "Failed to open \xff\xfe here path=/x");
        line = capture_end(&c);
        o = line ? json_loads(line, 0, &e) : NULL;
        CHECK(o && strcmp(json_string_value(json_object_get(o, "errno")) ?: "", "ENOENT") == 0 &&
                      strcmp(json_string_value(json_object_get(o, "msg")) ?: "", "Failed to open ?? here") == 0 &&
                      strcmp(json_string_value(json_object_get(o, "level")) ?: "", "error") == 0,
              "errno by name; bytes that are no UTF-8 as '?' (%s)", line ? line : "?");
        json_decref(o);
        free(line);

        log_set_format(LOG_FORMAT_LOGFMT);
        capture_begin(&c, 2);
        log_info("applied clock=41");
        line = capture_end(&c);
        CHECK(line && strncmp(line, "ts=", 3) == 0 && strstr(line, " level=info daemon=tprog shard=2 msg=\"applied\" clock=41\n"),
              "logfmt stays the default's line (%s)", line ? line : "?");
        free(line);
        CHECK(log_format_from_string("json") == LOG_FORMAT_JSON && log_format_from_string("logfmt") == LOG_FORMAT_LOGFMT &&
                      log_format_from_string("yaml") == -EINVAL,
              "json and logfmt are the formats");
        log_set_fields("");
}

int main(void) {
        test_json_log();
        test_flags();
        test_errors();
        test_file();
        test_config_set();
        test_help();
        reset();
        config_free_strings(opts, NOPTS);
        CHECK(o_listen && strcmp(o_listen, "tcp://*:5555") == 0, "a default literal is not owned, not freed");
        CHECK(parse(NULL, NULL, "--listen", "x", (char *) NULL) == 0, "set a string to free");
        config_free_strings(opts, NOPTS);
        CHECK(o_listen == NULL, "config_free_strings frees and clears parsed strings");
        return tap_done();
}
