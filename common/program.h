/* SPDX-License-Identifier: Apache-2.0 */
/* How every psnet program starts and ends (pscoord, psd, workerd, psctl):
 * its name on the log lines, its options from --config FILE and then the
 * command line with --log-level added to them and applied here, no argument
 * left over unless it takes some, and one exit status: 0; 2 for a usage or
 * configuration error, where restarting will not help (the systemd units'
 * RestartPreventExitStatus=2); 1 for anything else. Signals, readiness
 * (sd_notify) and the HTTP endpoint of the daemons are service.c's
 * (common/net), one place too. */
#pragma once
#include <stddef.h>
#include "config.h"

/* Where pscoord listens and everyone else looks for it by default. */
#define PSNET_DEFAULT_COORD "ipc:///tmp/psnet/coord.sock"

#define PROGRAM_MAX_OPTS 128

typedef struct Program {
        Option opts[PROGRAM_MAX_OPTS];  /* the program's, then --log-level and --log-format */
        size_t nopts;
        char *log_level, *log_format;
} Program;

/* Parses argc/argv by opts (n of them), --log-level and --log-format after log_setup(name):
 * 0 to run, 1 when the program should exit 0 (--help, --version), or -EINVAL
 * after saying why on stderr (an argument left over among them). */
int program_start(Program *p, const ProgramInfo *info, const Option *opts, size_t n, int argc, char **argv);
/* Frees the strings parsing set. */
void program_done(Program *p);
/* "debug", "info", "warning", "error" as the log level; -EINVAL (said on
 * stderr, naming prog) for anything else. NULL: unchanged. */
int program_log_level(const char *prog, const char *level);
/* The exit status for a program's result: 0 or 1 (done, --help) exit 0,
 * -EINVAL (and -1, a usage error) 2, anything else 1. */
int program_exit(int r);
/* The --log-level and --log-format options, for programs that parse on
 * their own (psctl), and the latter applied: "logfmt" or "json"; -EINVAL
 * (said on stderr, naming prog) for anything else. NULL: unchanged. */
Option program_log_option(char **level);
Option program_log_format_option(char **format);
int program_log_format(const char *prog, const char *format);
