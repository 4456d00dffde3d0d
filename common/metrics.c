/* SPDX-License-Identifier: Apache-2.0 */
/* See metrics.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "macro.h"
#include "metrics.h"

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
        else
                put(b, "%.9g", v);
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

void metrics_common(MetricsBuf *b, const char *daemon, const char *version) {
        uint64_t allocated = 0, resident = 0;
        metrics_family(b, "psnet_build_info", "gauge", "The psnet release and daemon (always 1).");
        metrics_sample(b, "psnet_build_info", 1, "daemon", daemon, "version", version, "allocator", alloc_name(),
                       NULL);
        if (alloc_stats(&allocated, &resident) == 0 && (allocated || resident)) {
                metrics_one(b, "psnet_allocated_bytes", "gauge", "Bytes the allocator has handed out.",
                            (double) allocated);
                metrics_one(b, "psnet_resident_bytes", "gauge", "Bytes the allocator keeps resident.",
                            (double) resident);
        }
}

void metrics_free(MetricsBuf *b) {
        free(b->data);
        *b = (MetricsBuf) { 0 };
}
