/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (format 0.0.4), built afresh on every scrape from
 * a daemon's own state: families with HELP and TYPE lines, samples with
 * labels (values escaped), and histograms with fixed buckets. Every psnet
 * metric is named psnet_<daemon>_<what>[_unit][_total]. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct MetricsBuf {
        char *data;
        size_t len, cap;
        bool failed;            /* out of memory: the text is incomplete */
} MetricsBuf;

/* A histogram of seconds with fixed bucket bounds (le), observed on the loop. */
#define METRICS_BUCKETS 12
typedef struct Histogram {
        uint64_t counts[METRICS_BUCKETS + 1]; /* the last: +Inf */
        uint64_t n;
        double sum;
} Histogram;

/* # HELP and # TYPE lines; type "counter", "gauge" or "histogram". */
void metrics_family(MetricsBuf *b, const char *name, const char *type, const char *help);
/* One sample. labels: "k1", "v1", "k2", "v2", ..., NULL (values escaped);
 * non-finite values are written as NaN, +Inf, -Inf. */
void metrics_sample(MetricsBuf *b, const char *name, double v, ...) __attribute__((sentinel));
/* A family with one unlabelled sample: the common case. */
void metrics_one(MetricsBuf *b, const char *name, const char *type, const char *help, double v);

void histogram_observe(Histogram *h, double seconds);
/* The family and its buckets (bounds 100 us .. 60 s), _sum and _count. */
void metrics_histogram(MetricsBuf *b, const char *name, const char *help, const Histogram *h);

/* What every daemon reports: the build (release and git revision), the
 * allocator's figures and the process's own (process_cpu_seconds_total,
 * _start_time_seconds, _resident_memory_bytes, _virtual_memory_bytes,
 * _open_fds, _max_fds: the names Prometheus' client libraries use, so that
 * dashboards made for them work). */
void metrics_common(MetricsBuf *b, const char *daemon);

void metrics_free(MetricsBuf *b);
