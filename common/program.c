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
        if (n + 1 > PROGRAM_MAX_OPTS) {
                fprintf(stderr, "%s: %zu options: at most %d\n", info->name, n, PROGRAM_MAX_OPTS - 1);
                return -EINVAL;
        }
        memcpy(p->opts, opts, n * sizeof *opts);
        p->opts[n] = program_log_option(&p->log_level);
        p->nopts = n + 1;
        int optind;
        int r = config_parse(info, p->opts, p->nopts, argc, argv, &optind);
        if (r != 0)
                return r > 0 ? 1 : -EINVAL;
        if (optind < argc) {
                fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", info->name, argv[optind],
                        info->name);
                return -EINVAL;
        }
        return program_log_level(info->name, p->log_level);
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
