/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/metrics.c: label values escaped, non-finite values in
 * Prometheus' spelling, histogram buckets cumulative with +Inf equal to the
 * count, and a text far larger than the first allocation. */
#include <string.h>
#include "metrics.h"
#include "tap.h"

static bool has(const MetricsBuf *b, const char *line) {
        return b->data && strstr(b->data, line) != NULL;
}

int main(void) {
        MetricsBuf b = { 0 };
        metrics_family(&b, "psnet_t_x", "gauge", "A test.");
        metrics_sample(&b, "psnet_t_x", 1.5, "path", "a\"b\\c\nd", NULL);
        metrics_sample(&b, "psnet_t_x", 0.0 / 0.0, NULL);
        metrics_sample(&b, "psnet_t_x", 1.0 / 0.0, "k", "1", "j", "2", NULL);
        metrics_sample(&b, "psnet_t_x", -1.0 / 0.0, NULL);
        metrics_sample(&b, "psnet_t_x", 12345678, NULL);
        CHECK(!b.failed, "the text is complete");
        CHECK(has(&b, "# HELP psnet_t_x A test.\n# TYPE psnet_t_x gauge\n"), "HELP and TYPE lines");
        CHECK(has(&b, "psnet_t_x{path=\"a\\\"b\\\\c\\nd\"} 1.5\n"), "quote, backslash and newline escaped");
        CHECK(has(&b, "psnet_t_x NaN\n"), "NaN");
        CHECK(has(&b, "psnet_t_x{k=\"1\",j=\"2\"} +Inf\n"), "two labels and +Inf");
        CHECK(has(&b, "psnet_t_x -Inf\n"), "-Inf");
        CHECK(has(&b, "psnet_t_x 12345678\n"), "whole numbers without exponent");
        metrics_free(&b);
        CHECK(b.data == NULL && b.len == 0, "metrics_free empties the buffer");

        Histogram h = { 0 };
        histogram_observe(&h, 0.00005); /* first bucket */
        histogram_observe(&h, 0.0001);  /* on a bound: le is inclusive */
        histogram_observe(&h, 0.003);   /* le 0.005 */
        histogram_observe(&h, 120);     /* beyond 60 s: only +Inf */
        metrics_histogram(&b, "psnet_t_seconds", "Latency.", &h);
        CHECK(has(&b, "# TYPE psnet_t_seconds histogram\n"), "histogram type");
        CHECK(has(&b, "psnet_t_seconds_bucket{le=\"0.0001\"} 2\n"), "a bound is inclusive");
        CHECK(has(&b, "psnet_t_seconds_bucket{le=\"0.0025\"} 2\n"), "buckets below an observation do not count it");
        CHECK(has(&b, "psnet_t_seconds_bucket{le=\"0.005\"} 3\n"), "buckets are cumulative");
        CHECK(has(&b, "psnet_t_seconds_bucket{le=\"60\"} 3\n"), "120 s is past the last bound");
        CHECK(has(&b, "psnet_t_seconds_bucket{le=\"+Inf\"} 4\n"), "+Inf holds every observation");
        CHECK(has(&b, "psnet_t_seconds_count 4\n"), "_count");
        CHECK(has(&b, "psnet_t_seconds_sum 120.00315\n"), "_sum");
        metrics_free(&b);

        char label[32];
        for (int i = 0; i < 5000; i++) {
                snprintf(label, sizeof label, "%d", i);
                metrics_sample(&b, "psnet_t_many", i, "i", label, NULL);
        }
        CHECK(!b.failed && has(&b, "psnet_t_many{i=\"0\"} 0\n") && has(&b, "psnet_t_many{i=\"4999\"} 4999\n"),
              "5000 samples (%zu bytes) grow the buffer intact", b.len);
        CHECK(b.len == strlen(b.data), "the text is one NUL-terminated string");
        metrics_free(&b);
        return tap_done();
}
