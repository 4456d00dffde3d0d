/* SPDX-License-Identifier: Apache-2.0 */
/* See metrics.h. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "alloc.h"
#include "macro.h"
#include "metrics.h"
#include "version.h"

static const double bounds[METRICS_BUCKETS] = {
        0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 60,
};

static void put(MetricsBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(MetricsBuf *b, const char *fmt, ...) {
        va_list ap;
        if (b->failed)
                return;
        for (;;) {
                va_start(ap, fmt);
                int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
                va_end(ap);
                if (n < 0) {
                        b->failed = true;
                        return;
                }
                if (b->data && b->len + (size_t) n < b->cap) {
                        b->len += (size_t) n;
                        return;
                }
                size_t cap = MAX(b->cap * 2, b->len + (size_t) n + 4096);
                char *d = realloc(b->data, cap);
                if (!d) {
                        b->failed = true;
                        return;
                }
                b->data = d;
                b->cap = cap;
        }
}

static void put_value(MetricsBuf *b, double v) {
        if (isnan(v))
                put(b, "NaN");
        else if (isinf(v))
                put(b, v > 0 ? "+Inf" : "-Inf");
        else if (v == floor(v) && fabs(v) < 1e15)
                put(b, "%.0f", v);
        else {
                /* The fewest digits that read back as v (a start time in
                 * seconds keeps its milliseconds; 0.1 stays 0.1). */
                char t[32];
                for (int digits = 9; digits <= 17; digits++) {
                        snprintf(t, sizeof t, "%.*g", digits, v);
                        if (strtod(t, NULL) == v)
                                break;
                }
                put(b, "%s", t);
        }
}

/* A label value with \, " and newline escaped. */
static void put_escaped(MetricsBuf *b, const char *s) {
        for (; s && *s; s++) {
                if (*s == '\\' || *s == '"')
                        put(b, "\\%c", *s);
                else if (*s == '\n')
                        put(b, "\\n");
                else
                        put(b, "%c", *s);
        }
}

void metrics_family(MetricsBuf *b, const char *name, const char *type, const char *help) {
        put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_v(MetricsBuf *b, const char *name, double v, va_list ap) {
        bool labels = false;
        put(b, "%s", name);
        for (const char *k = va_arg(ap, const char *); k; k = va_arg(ap, const char *)) {
                put(b, "%s%s=\"", labels ? "," : "{", k);
                put_escaped(b, va_arg(ap, const char *));
                put(b, "\"");
                labels = true;
        }
        put(b, "%s ", labels ? "}" : "");
        put_value(b, v);
        put(b, "\n");
}

void metrics_sample(MetricsBuf *b, const char *name, double v, ...) {
        va_list ap;
        va_start(ap, v);
        sample_v(b, name, v, ap);
        va_end(ap);
}

void metrics_one(MetricsBuf *b, const char *name, const char *type, const char *help, double v) {
        metrics_family(b, name, type, help);
        metrics_sample(b, name, v, NULL);
}

void histogram_observe(Histogram *h, double seconds) {
        size_t i = 0;
        while (i < METRICS_BUCKETS && seconds > bounds[i])
                i++;
        h->counts[i]++;
        h->n++;
        h->sum += seconds;
}

void metrics_histogram(MetricsBuf *b, const char *name, const char *help, const Histogram *h) {
        char bucket[128], le[32];
        metrics_family(b, name, "histogram", help);
        snprintf(bucket, sizeof bucket, "%s_bucket", name);
        uint64_t cum = 0;
        for (size_t i = 0; i < METRICS_BUCKETS; i++) {
                cum += h->counts[i];
                snprintf(le, sizeof le, "%g", bounds[i]);
                metrics_sample(b, bucket, (double) cum, "le", le, NULL);
        }
        metrics_sample(b, bucket, (double) h->n, "le", "+Inf", NULL);
        put(b, "%s_sum ", name);
        put_value(b, h->sum);
        put(b, "\n%s_count %lu\n", name, (unsigned long) h->n);
}

/* The process's own figures, as Prometheus' client libraries name them
 * (process_*), from /proc: 0 when they were read, -errno otherwise. */
typedef struct ProcFigures {
        double cpu_s, start_s, virtual_bytes, resident_bytes, open_fds, max_fds;
} ProcFigures;

static int proc_figures(ProcFigures *f) {
        char buf[1024];
        long ticks = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
        if (ticks <= 0 || page <= 0)
                return -EINVAL;
        FILE *fp = fopen("/proc/self/stat", "re");
        if (!fp)
                return -errno;
        size_t n = fread(buf, 1, sizeof buf - 1, fp);
        fclose(fp);
        buf[n] = 0;
        /* After the command's name in parentheses (which may hold anything):
         * field 3 (state) onwards. */
        const char *p = strrchr(buf, ')');
        unsigned long long utime, stime, start, vsize;
        long long rss;
        if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu "
                         "%llu %lld", &utime, &stime, &start, &vsize, &rss) != 5)
                return -EBADMSG;
        unsigned long long btime = 0;
        if (!(fp = fopen("/proc/stat", "re")))
                return -errno;
        while (fgets(buf, sizeof buf, fp))
                if (sscanf(buf, "btime %llu", &btime) == 1)
                        break;
        fclose(fp);
        if (!btime)
                return -EBADMSG;
        DIR *d = opendir("/proc/self/fd");
        if (!d)
                return -errno;
        double fds = 0;
        for (struct dirent *e; (e = readdir(d));)
                fds += e->d_name[0] != '.';
        closedir(d);
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return -errno;
        *f = (ProcFigures) {
                .cpu_s = (double) (utime + stime) / (double) ticks,
                .start_s = (double) btime + (double) start / (double) ticks,
                .virtual_bytes = (double) vsize,
                .resident_bytes = (double) rss * (double) page,
                .open_fds = fds - 1, /* the directory's own descriptor */
                .max_fds = rl.rlim_cur == RLIM_INFINITY ? INFINITY : (double) rl.rlim_cur,
        };
        return 0;
}

void metrics_common(MetricsBuf *b, const char *daemon) {
        uint64_t allocated = 0, resident = 0;
        metrics_family(b, "psnet_build_info", "gauge", "The psnet release, the git revision built and the daemon "
                       "(always 1).");
        metrics_sample(b, "psnet_build_info", 1, "daemon", daemon, "version", psnet_version(), "revision",
                       psnet_revision(), "allocator", alloc_name(), NULL);
        if (alloc_stats(&allocated, &resident) == 0 && (allocated || resident)) {
                metrics_one(b, "psnet_allocated_bytes", "gauge", "Bytes the allocator has handed out.",
                            (double) allocated);
                metrics_one(b, "psnet_resident_bytes", "gauge", "Bytes the allocator keeps resident.",
                            (double) resident);
        }
        ProcFigures f;
        if (proc_figures(&f) < 0)
                return; /* no /proc: the process figures are left out, not made up */
        metrics_one(b, "process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.", f.cpu_s);
        metrics_one(b, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
                    f.start_s);
        metrics_one(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", f.virtual_bytes);
        metrics_one(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", f.resident_bytes);
        metrics_one(b, "process_open_fds", "gauge", "Number of open file descriptors.", f.open_fds);
        if (isfinite(f.max_fds))
                metrics_one(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.", f.max_fds);
}

void metrics_free(MetricsBuf *b) {
        free(b->data);
        *b = (MetricsBuf) { 0 };
}
