/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/metrics.c: label values escaped, non-finite values in
 * Prometheus' spelling, histogram buckets cumulative with +Inf equal to the
 * count, and a text far larger than the first allocation. And common/log.c's
 * bound on refusal lines: one peer's flood takes its share of a second's lines
 * and leaves the rest to the others'. */
#include <string.h>
#include <time.h>
#include "log.h"
#include "metrics.h"
#include "tap.h"

static long mono_second(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long) ts.tv_sec;
}

/* 1,000 refusals from peer A, then 3 from peer B and 1,000 from C for
 * another reason, all in one second (tried again where a second began
 * between): A gets LOG_LIMIT_KEY_BURST lines, B all 3, C what the total
 * leaves. */
static void check_log_limit_by(void) {
        unsigned a = 0, b = 0, c = 0;
        for (int tries = 0; tries < 5; tries++) {
                LogLimitBy l = { 0 };
                uint64_t ka = log_limit_key("peer-a", 6, 7), kb = log_limit_key("peer-b", 6, 7),
                         kc = log_limit_key("peer-b", 6, 8);
                long s = mono_second();
                a = b = c = 0;
                for (int i = 0; i < 1000; i++)
                        a += log_limit_by(&l, ka, "test refusals");
                for (int i = 0; i < 3; i++)
                        b += log_limit_by(&l, kb, "test refusals");
                for (int i = 0; i < 1000; i++)
                        c += log_limit_by(&l, kc, "test refusals");
                if (mono_second() == s)
                        break;
        }
        CHECK(a == LOG_LIMIT_KEY_BURST, "one peer's 1,000 refusals in a second: %u lines (%d)", a, LOG_LIMIT_KEY_BURST);
        CHECK(b == 3, "another peer's 3 refusals in that second are all written: %u", b);
        CHECK(c == LOG_LIMIT_KEY_BURST, "the same peer for another reason gets its own %u lines", c);
        CHECK(a + b + c <= LOG_LIMIT_BURST, "all within the total of %d a second", LOG_LIMIT_BURST);
        CHECK(log_limit_key("peer-a", 6, 7) != log_limit_key("peer-a", 6, 8) &&
                      log_limit_key("peer-a", 6, 7) != log_limit_key("peer-b", 6, 7),
              "keys differ by peer and by reason");
}

static bool has(const MetricsBuf *b, const char *line) {
        return b->data && strstr(b->data, line) != NULL;
}

int main(void) {
        check_log_limit_by();
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
