/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/schedule.c: the job's epochs in clocks as workers
 * come and go. */
#include "schedule.h"
#include "tap.h"

int main(void) {
        /* 12,000 images, 3 epochs, batch 64, 2 workers from the start. */
        const uint64_t n = 12000, total = 3 * n;
        Schedule s = { .base_clock = 0, .samples_before = 0, .workers = 2, .batch = 64 };
        CHECK(schedule_end_clock(&s, total) == 282, "2 workers: ceil(36000 / 128) = 282 clocks (%ld)",
              (long) schedule_end_clock(&s, total));
        CHECK(schedule_samples_at(&s, 94) == 12032, "clock 94: 12,032 samples");
        CHECK(schedule_epoch(schedule_samples_at(&s, 93), n, 3) == 1, "clock 93 is in epoch 1 (11,904 samples)");
        CHECK(schedule_epoch(schedule_samples_at(&s, 94), n, 3) == 2, "clock 94 is in epoch 2");
        CHECK(schedule_epoch(schedule_samples_at(&s, 282), n, 3) == 3, "the end is capped at epoch 3");
        CHECK(schedule_samples_at(&s, -5) == 0, "a clock before the base: samples_before");

        /* A third worker joins at clock 100: the rest goes faster, the end comes sooner. */
        schedule_rebase(&s, 100, 3);
        CHECK(s.base_clock == 100 && s.samples_before == 12800 && s.workers == 3, "rebase at 100 counts 12,800");
        CHECK(schedule_end_clock(&s, total) == 100 + 121, "3 workers: 100 + ceil(23,200 / 192) = 221 (%ld)",
              (long) schedule_end_clock(&s, total));
        CHECK(schedule_samples_at(&s, 221) >= total && schedule_samples_at(&s, 220) < total,
              "221 is the first clock with every sample trained");
        /* A worker dies at 150 (not done): two are left for the rest. */
        schedule_rebase(&s, 150, 2);
        CHECK(s.samples_before == 12800 + 50 * 192, "the 50 clocks of 3 workers counted (%lu)",
              (unsigned long) s.samples_before);
        CHECK(schedule_end_clock(&s, total) == 150 + 107, "then 150 + ceil(13,600 / 128) = 257 (%ld)",
              (long) schedule_end_clock(&s, total));
        /* A rebase to a clock before the base (an ASP joiner starting behind) changes only the count. */
        schedule_rebase(&s, 120, 3);
        CHECK(s.base_clock == 150 && s.samples_before == 22400 && s.workers == 3, "a rebase backwards keeps the base");
        /* Everything trained: the end is the base. */
        Schedule d = { .base_clock = 500, .samples_before = total + 10, .workers = 2, .batch = 64 };
        CHECK(schedule_end_clock(&d, total) == 500, "trained already: ends at the base");
        d.workers = 0;
        d.samples_before = 0;
        CHECK(schedule_end_clock(&d, total) == 500, "no workers: the base (no division by zero)");
        CHECK(schedule_epoch(5, 0, 3) == 1 && schedule_epoch(0, n, 0) == 1, "degenerate epochs are 1");
        return tap_done();
}
