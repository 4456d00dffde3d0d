/* SPDX-License-Identifier: Apache-2.0 */
/* logfmt (or JSON) logging: one line per event on stderr,
 *   ts=2026-11-22T22:00:00.123Z level=info daemon=psd shard=2 msg="applied" clock=41
 * The caller writes "text key=value ..."; the leading words become msg="...",
 * the key=value tokens follow verbatim. "%m" expands to strerror(err).
 * The level is checked before the arguments are evaluated. */
#pragma once
#include <stdint.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdlib.h>
#include <syslog.h>
#include "macro.h"

/* The line format: logfmt (above), or one JSON object a line with the same
 * fields (ts, level, daemon, msg, then the caller's key=value pairs; a bare
 * value that reads as a number is a JSON number, the rest strings). From
 * --log-format (program.h) or PSNET_LOG_FORMAT. */
typedef enum { LOG_FORMAT_LOGFMT, LOG_FORMAT_JSON } LogFormat;

/* The program's name on every line, and PSNET_LOG_LEVEL / PSNET_LOG_FORMAT. */
void log_setup(const char *daemon);
/* "logfmt" or "json"; -EINVAL otherwise. */
int log_format_from_string(const char *s);
void log_set_format(LogFormat f);
/* Extra fields printed on every line after daemon=, e.g. "shard=2". */
void log_set_fields(const char *fields);
void log_set_level(int level);
int log_get_level(void);
/* Parses "debug", "info", "warning", "error"; returns -EINVAL otherwise. */
int log_level_from_string(const char *s);

/* Returns -abs(err) (or 0 when err == 0) so callers can "return log_error_errno(r, ...)". */
int log_internal(int level, int err, const char *fmt, ...) _printf_(3, 4);

#define log_full_errno(level, err, ...)                                   \
        ({                                                                \
                int _l = (level), _e = (err);                             \
                (log_get_level() >= _l) ? log_internal(_l, _e, __VA_ARGS__) \
                                        : (_e > 0 ? -_e : _e);            \
        })

#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)
#define log_debug_errno(e, ...) log_full_errno(LOG_DEBUG, e, __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, e, __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, e, __VA_ARGS__)

/* A bound on lines of one kind (a refusal, say) a flood could repeat: at
 * most LOG_LIMIT_BURST a second; past that one line says the rest of the
 * second's are left out, and the next line written says how many were.
 * Zero-initialised. */
#define LOG_LIMIT_BURST 20
typedef struct LogLimit {
        uint64_t window;       /* the second (monotonic) being counted */
        unsigned lines;        /* written in it */
        uint64_t left_out;     /* not written since the last line */
} LogLimit;
/* true: write this line (after a note of the lines left out before it, if
 * any, under what); false: leave it out, counted. */
bool log_limit(LogLimit *l, const char *what);

/* A bound on lines of one kind that come rarely but may come in a burst
 * (connections closed): at most LOG_WINDOW_LINES in LOG_WINDOW_MS, the rest
 * left out (counted in /metrics by the caller). Zero-initialised. */
#define LOG_WINDOW_MS 10000
#define LOG_WINDOW_LINES 10
typedef struct LogWindow {
        uint64_t start;        /* ms: the window being counted began then */
        unsigned lines;        /* asked for in it */
} LogWindow;
/* true: write this line (now in ms). */
bool log_window(LogWindow *w, uint64_t now);

/* The same bound over lines from many sources (refusals: a peer and a
 * reason), with each source's own at most LOG_LIMIT_KEY_BURST a second, so
 * that one peer's flood leaves room in the log for the others'. Sources are
 * told apart by a key (log_limit_key) on LOG_LIMIT_KEYS slots: two keys on one
 * slot share it. Zero-initialised. */
#define LOG_LIMIT_KEYS 64
#define LOG_LIMIT_KEY_BURST 5
typedef struct LogLimitBy {
        LogLimit total;
        struct {
                uint64_t key, window;
                unsigned lines;
        } slot[LOG_LIMIT_KEYS];
} LogLimitBy;
bool log_limit_by(LogLimitBy *l, uint64_t key, const char *what);
/* A key for log_limit_by from a peer's bytes (its routing id) and a number (a status). */
uint64_t log_limit_key(const void *peer, size_t len, uint64_t n);

/* Writes a reason for people into buf (when buf is not NULL and n > 0) and
 * returns r: `return reason_set(err, errlen, -EINVAL, "bad --x '%s'", x);`. */
int reason_set(char *buf, size_t n, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* A size for people to read in a reason: "512 bytes", "4.0 MiB", "1.5 GiB". */
const char *bytes_human(uint64_t bytes, char *buf, size_t n);
