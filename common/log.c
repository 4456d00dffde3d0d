/* SPDX-License-Identifier: Apache-2.0 */
/* logfmt logger used by every daemon and tool (see log.h for the line format). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <ctype.h>
#include <jansson.h>
#include "hash.h"
#include "log.h"

static char log_daemon[32] = "psnet";
static char log_fields[128];
static int log_level = LOG_INFO;
static LogFormat log_format = LOG_FORMAT_LOGFMT;

void log_setup(const char *daemon) {
        snprintf(log_daemon, sizeof log_daemon, "%s", daemon);
        const char *e = getenv("PSNET_LOG_LEVEL");
        if (e && log_level_from_string(e) >= 0)
                log_level = log_level_from_string(e);
        e = getenv("PSNET_LOG_FORMAT");
        if (e && log_format_from_string(e) >= 0)
                log_format = (LogFormat) log_format_from_string(e);
}

int log_format_from_string(const char *s) {
        return strcmp(s, "logfmt") == 0 ? LOG_FORMAT_LOGFMT : strcmp(s, "json") == 0 ? LOG_FORMAT_JSON : -EINVAL;
}
void log_set_format(LogFormat f) { log_format = f; }

void log_set_fields(const char *fields) { snprintf(log_fields, sizeof log_fields, "%s", fields ? fields : ""); }
void log_set_level(int level) { log_level = level; }
int log_get_level(void) { return log_level; }

int log_level_from_string(const char *s) {
        static const struct { const char *n; int l; } t[] = {
                { "debug", LOG_DEBUG }, { "info", LOG_INFO }, { "notice", LOG_NOTICE },
                { "warning", LOG_WARNING }, { "warn", LOG_WARNING }, { "error", LOG_ERR },
        };
        for (size_t i = 0; i < ELEMENTSOF(t); i++)
                if (strcmp(s, t[i].n) == 0)
                        return t[i].l;
        return -EINVAL;
}

static const char *level_name(int l) {
        switch (l) {
        case LOG_DEBUG: return "debug";
        case LOG_INFO: return "info";
        case LOG_NOTICE: return "notice";
        case LOG_WARNING: return "warning";
        default: return "error";
        }
}

/* Finds where the key=value tail starts: the first space-separated token that
 * looks like [a-z_]+=. Returns the length of the text part. */
static size_t text_len(const char *s) {
        const char *p = s;
        while (*p) {
                const char *tok = p == s ? p : (p[-1] == ' ' ? p : NULL);
                if (tok) {
                        const char *q = tok;
                        while (islower((unsigned char) *q) || *q == '_' || isdigit((unsigned char) *q))
                                q++;
                        if (q > tok && *q == '=')
                                return (size_t) (tok - s);
                }
                p++;
        }
        return strlen(s);
}

/* A bare logfmt value that is a JSON number as written (no sign but a
 * minus, no leading zeros, no hex, nan or inf) goes into a JSON line as a
 * number; anything else as a string. */
static bool json_number(const char *v, size_t len) {
        size_t i = 0;
        if (i < len && v[i] == '-')
                i++;
        if (i >= len || !isdigit((unsigned char) v[i]))
                return false;
        if (v[i] == '0')
                i++;
        else
                while (i < len && isdigit((unsigned char) v[i]))
                        i++;
        if (i < len && v[i] == '.') {
                if (++i >= len || !isdigit((unsigned char) v[i]))
                        return false;
                while (i < len && isdigit((unsigned char) v[i]))
                        i++;
        }
        if (i < len && (v[i] == 'e' || v[i] == 'E')) {
                if (++i < len && (v[i] == '+' || v[i] == '-'))
                        i++;
                if (i >= len || !isdigit((unsigned char) v[i]))
                        return false;
                while (i < len && isdigit((unsigned char) v[i]))
                        i++;
        }
        return i == len;
}

/* A JSON string of s's len bytes: as they are when they are UTF-8, with
 * every byte above 0x7f as '?' when not (a peer's bytes in a reason). */
static json_t *json_text(const char *s, size_t len) {
        json_t *v = json_stringn(s, len);
        if (v)
                return v;
        char *c = strndup(s, len);
        if (!c)
                return NULL;
        for (char *p = c; *p; p++)
                if ((unsigned char) *p > 0x7f)
                        *p = '?';
        v = json_string(c);
        free(c);
        return v;
}

/* Adds the logfmt pairs of s (key=value, key="quoted \"value\"") to o. A
 * word that is no pair is added to the value before it (the caller wrote a
 * value with spaces); one before any pair, to msg. */
static void json_pairs(json_t *o, const char *s) {
        char key[64] = "msg";
        while (*s) {
                while (*s == ' ')
                        s++;
                if (!*s)
                        break;
                const char *k = s;
                while (islower((unsigned char) *s) || *s == '_' || isdigit((unsigned char) *s))
                        s++;
                bool pair = s > k && *s == '=' && (size_t) (s - k) < sizeof key;
                json_t *v = NULL;
                if (pair) {
                        snprintf(key, sizeof key, "%.*s", (int) (s - k), k);
                        s++;
                        if (*s == '"') {
                                char val[1024];
                                size_t j = 0;
                                for (s++; *s && *s != '"'; s++) {
                                        if (*s == '\\' && s[1])
                                                s++;
                                        if (j + 1 < sizeof val)
                                                val[j++] = *s;
                                }
                                if (*s == '"')
                                        s++;
                                v = json_text(val, j);
                        } else {
                                const char *b = s;
                                while (*s && *s != ' ')
                                        s++;
                                v = json_number(b, (size_t) (s - b)) ? json_loadb(b, (size_t) (s - b), JSON_DECODE_ANY, NULL)
                                                                     : json_text(b, (size_t) (s - b));
                                if (!v) /* past what a JSON number holds here (1e400, 2^64) */
                                        v = json_text(b, (size_t) (s - b));
                        }
                        if (v)
                                json_object_set_new(o, key, v);
                        continue;
                }
                /* A word that is no pair: to the value before it, as text. */
                const char *b = k;
                while (*s && *s != ' ')
                        s++;
                json_t *prev = json_object_get(o, key);
                char *num = prev && !json_is_string(prev) ? json_dumps(prev, JSON_ENCODE_ANY) : NULL;
                const char *before = json_is_string(prev) ? json_string_value(prev) : num ? num : "";
                char *joined = NULL;
                if (asprintf(&joined, "%s%s%.*s", before, *before ? " " : "", (int) (s - b), b) >= 0) {
                        json_object_set_new(o, key, json_text(joined, strlen(joined)));
                        free(joined);
                }
                free(num);
        }
}

/* One event as a line of JSON: {"ts", "level", "daemon", the fields of
 * log_set_fields, "msg", the caller's pairs, "errno"}. */
static void log_json(const char *ts, int level, const char *msg, const char *tail, int err) {
        json_t *o = json_pack("{s:s,s:s,s:s}", "ts", ts, "level", level_name(level), "daemon", log_daemon);
        if (!o)
                return;
        json_pairs(o, log_fields);
        json_object_set_new(o, "msg", json_text(msg, strlen(msg)));
        json_pairs(o, tail);
        if (err)
                json_object_set_new(o, "errno", json_string(strerrorname_np(err) ? strerrorname_np(err) : "?"));
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        json_decref(o);
        if (line) {
                fprintf(stderr, "%s\n", line);
                free(line);
        }
}

int log_internal(int level, int err, const char *fmt, ...) {
        char buf[2048], ts[40];
        int saved = errno;
        struct timespec now;
        struct tm tm;
        va_list ap;

        if (err < 0)
                err = -err;
        errno = err;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);

        clock_gettime(CLOCK_REALTIME, &now);
        gmtime_r(&now.tv_sec, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);

        size_t n = text_len(buf);
        while (n > 0 && buf[n - 1] == ' ')
                n--;
        const char *tail = buf + text_len(buf);
        char msg[2048];
        size_t j = 0;
        for (size_t i = 0; i < n && j + 2 < sizeof msg; i++) {
                if (buf[i] == '"' || buf[i] == '\\')
                        msg[j++] = '\\';
                msg[j++] = buf[i] == '\n' ? ' ' : buf[i];
        }
        msg[j] = 0;

        if (log_format == LOG_FORMAT_JSON) {
                snprintf(ts + strlen(ts), sizeof ts - strlen(ts), ".%03ldZ", now.tv_nsec / 1000000);
                buf[n] = 0; /* the text, without the key=value tail (which starts past it) */
                log_json(ts, level, buf, tail, err);
                errno = saved;
                return -err;
        }
        fprintf(stderr, "ts=%s.%03ldZ level=%s daemon=%s%s%s msg=\"%s\"%s%s%s%s\n", ts,
                now.tv_nsec / 1000000, level_name(level), log_daemon, log_fields[0] ? " " : "",
                log_fields, msg, *tail ? " " : "", tail, err ? " errno=" : "",
                err ? strerrorname_np(err) ? strerrorname_np(err) : "?" : "");
        errno = saved;
        return -err;
}

int reason_set(char *buf, size_t n, int r, const char *fmt, ...) {
        va_list ap;
        if (buf && n > 0) {
                va_start(ap, fmt);
                vsnprintf(buf, n, fmt, ap);
                va_end(ap);
        }
        return r;
}

const char *bytes_human(uint64_t bytes, char *buf, size_t n) {
        static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
        if (bytes < 1024) {
                snprintf(buf, n, "%llu bytes", (unsigned long long) bytes);
                return buf;
        }
        double v = (double) bytes / 1024.0;
        size_t u = 0;
        while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
                v /= 1024.0;
                u++;
        }
        snprintf(buf, n, "%.1f %s", v, units[u]);
        return buf;
}

static uint64_t mono_second(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec;
}

bool log_limit(LogLimit *l, const char *what) {
        uint64_t second = mono_second();
        if (second != l->window) {
                l->window = second;
                l->lines = 0;
        }
        if (l->lines >= LOG_LIMIT_BURST) {
                if (l->lines++ == LOG_LIMIT_BURST)
                        log_warning("more %s than %d in a second: the rest of this second's are left out of this log "
                                    "(counted in /metrics)", what, LOG_LIMIT_BURST);
                l->left_out++;
                return false;
        }
        l->lines++;
        if (l->left_out) {
                log_warning("%llu more %s left out of this log (at most %d lines a second, %d from one peer for "
                            "one reason)", (unsigned long long) l->left_out, what, LOG_LIMIT_BURST,
                            LOG_LIMIT_KEY_BURST);
                l->left_out = 0;
        }
        return true;
}

bool log_window(LogWindow *w, uint64_t now) {
        if (now - w->start > LOG_WINDOW_MS) {
                w->start = now;
                w->lines = 0;
        }
        return w->lines++ < LOG_WINDOW_LINES;
}

bool log_limit_by(LogLimitBy *l, uint64_t key, const char *what) {
        uint64_t second = mono_second();
        size_t i = (size_t) (key % LOG_LIMIT_KEYS);
        if (l->slot[i].window != second || l->slot[i].key != key) {
                l->slot[i].window = second;
                l->slot[i].key = key;
                l->slot[i].lines = 0;
        }
        if (l->slot[i].lines >= LOG_LIMIT_KEY_BURST) {
                if (l->slot[i].lines++ == LOG_LIMIT_KEY_BURST && log_limit(&l->total, what))
                        log_warning("more %s than %d in a second from one peer for one reason: the rest of this "
                                    "second's from it are left out of this log (counted in /metrics)", what,
                                    LOG_LIMIT_KEY_BURST);
                l->total.left_out++;
                return false;
        }
        l->slot[i].lines++;
        return log_limit(&l->total, what);
}

uint64_t log_limit_key(const void *peer, size_t len, uint64_t n) {
        return mix64(fnv1a64(FNV1A64_INIT, peer, len) ^ mix64(n));
}
