/* SPDX-License-Identifier: Apache-2.0 */
/* See schedule.h. */
#include "macro.h"
#include "schedule.h"

uint64_t schedule_samples_at(const Schedule *s, int64_t clock) {
        if (clock <= s->base_clock)
                return s->samples_before;
        return s->samples_before + (uint64_t) (clock - s->base_clock) * s->workers * s->batch;
}

int64_t schedule_end_clock(const Schedule *s, uint64_t total) {
        uint64_t per_clock = (uint64_t) s->workers * s->batch;
        if (per_clock == 0 || total <= s->samples_before)
                return s->base_clock;
        return s->base_clock + (int64_t) ((total - s->samples_before + per_clock - 1) / per_clock);
}

void schedule_rebase(Schedule *s, int64_t clock, uint32_t workers) {
        if (clock > s->base_clock) {
                s->samples_before = schedule_samples_at(s, clock);
                s->base_clock = clock;
        }
        s->workers = workers;
}

uint32_t schedule_epoch(uint64_t samples, uint64_t per_epoch, uint32_t epochs) {
        if (per_epoch == 0)
                return 1;
        uint64_t e = samples / per_epoch + 1;
        return (uint32_t) MIN(e, (uint64_t) MAX(epochs, 1u));
}
