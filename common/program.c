/* SPDX-License-Identifier: Apache-2.0 */
/* How every psnet program starts and ends; see program.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "log.h"
#include "program.h"

Option program_log_option(char **level) {
        return (Option) { "log-level", OPT_STR, level, "LEVEL", "debug, info, warning or error" };
}

Option program_log_format_option(char **format) {
        return (Option) { "log-format", OPT_STR, format, "FORMAT",
                          "logfmt (one key=value line an event) or json (one JSON object a line); default "
                          "$PSNET_LOG_FORMAT, else logfmt" };
}

int program_log_format(const char *prog, const char *format) {
        if (!format)
                return 0;
        int f = log_format_from_string(format);
        if (f < 0) {
                fprintf(stderr, "%s: unknown log format '%s' (logfmt or json)\n", prog, format);
                return -EINVAL;
        }
        log_set_format((LogFormat) f);
        return 0;
}

int program_log_level(const char *prog, const char *level) {
        if (!level)
                return 0;
        int l = log_level_from_string(level);
        if (l < 0) {
                fprintf(stderr, "%s: unknown log level '%s' (debug, info, warning or error)\n", prog, level);
                return -EINVAL;
        }
        log_set_level(l);
        return 0;
}

int program_start(Program *p, const ProgramInfo *info, const Option *opts, size_t n, int argc, char **argv) {
        memset(p, 0, sizeof *p);
        log_setup(info->name);
        if (n + 2 > PROGRAM_MAX_OPTS) {
                fprintf(stderr, "%s: %zu options: at most %d\n", info->name, n, PROGRAM_MAX_OPTS - 2);
                return -EINVAL;
        }
        memcpy(p->opts, opts, n * sizeof *opts);
        p->opts[n] = program_log_option(&p->log_level);
        p->opts[n + 1] = program_log_format_option(&p->log_format);
        p->nopts = n + 2;
        int optind;
        int r = config_parse(info, p->opts, p->nopts, argc, argv, &optind);
        if (r != 0)
                return r > 0 ? 1 : -EINVAL;
        if (optind < argc) {
                fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", info->name, argv[optind],
                        info->name);
                return -EINVAL;
        }
        r = program_log_format(info->name, p->log_format);
        return r < 0 ? r : program_log_level(info->name, p->log_level);
}

void program_done(Program *p) {
        config_free_strings(p->opts, p->nopts);
        p->nopts = 0;
}

int program_exit(int r) {
        if (r >= 0)
                return EXIT_SUCCESS;
        return r == -EINVAL || r == -1 ? 2 : EXIT_FAILURE;
}
