/* SPDX-License-Identifier: Apache-2.0 */
/* Options for daemons and tools: one table per program, filled from an INI file
 * (--config FILE, parsed by inih) and then from the command line, which wins.
 * In the file, keys are option names without "--", in any section or none:
 *     [psd]
 *     listen = ipc:///run/psnet/psd-0.sock
 * Unknown keys in the file and unknown flags are errors that name the culprit. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
        OPT_STR,   /* char ** (strdup'd; free with config_free_strings) */
        OPT_INT,   /* int * */
        OPT_UINT,  /* unsigned * */
        OPT_U64,   /* uint64_t * */
        OPT_FLOAT, /* float * */
        OPT_BOOL,  /* bool *; a flag without value sets true */
} OptType;

typedef struct Option {
        const char *name;  /* long name without "--" */
        OptType type;
        void *ptr;
        const char *arg;   /* placeholder shown in --help, e.g. "ENDPOINT" */
        const char *help;
} Option;

typedef struct ProgramInfo {
        const char *name;     /* "psd" */
        const char *summary;  /* one line */
        const char *usage;    /* e.g. "[OPTIONS]" or "[OPTIONS] COMMAND" */
        const char *epilog;   /* printed after the option list (commands, examples); may be NULL */
} ProgramInfo;

/* Parses argv. Options stop at the first non-option argument or "--";
 * *ret_optind is the index of the first argument left. Handles --help (prints
 * usage to stdout, returns 1), --version (returns 1) and --config FILE.
 * Returns 0 on success, 1 when the program should exit 0, or -EINVAL after
 * printing a clear message to stderr. */
int config_parse(const ProgramInfo *prog, const Option *opts, size_t nopts, int argc,
                 char **argv, int *ret_optind);

/* Sets the options an INI file names (as --config FILE does): 0, or
 * -EINVAL / -ENOMEM after saying why on stderr (naming the file and line). */
int config_load_file(const ProgramInfo *prog, const Option *opts, size_t nopts, const char *path);

/* Sets one option from a string; -EINVAL with a message on stderr if it does not parse. */
int config_set(const ProgramInfo *prog, const Option *opts, size_t nopts, const char *name,
               const char *value, const char *where);

void config_print_help(const ProgramInfo *prog, const Option *opts, size_t nopts);

/* An unsigned decimal integer <= hi (a sign refused): 0, -EINVAL (not a
 * number) or -ERANGE. For values read elsewhere, e.g. the environment. */
int config_parse_unsigned(const char *s, unsigned long long hi, unsigned long long *ret);

/* Frees the strings that OPT_STR options own (those set by parsing). */
void config_free_strings(const Option *opts, size_t nopts);
