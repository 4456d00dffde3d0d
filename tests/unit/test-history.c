/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the job's samples in ps/pscoord/coord-history.c: one per
 * heartbeat with a new clock, bounded, thinned evenly per worker when full
 * (the first ones kept, the stride doubling), reset by a new job, and what
 * MSG_HISTORY cannot carry (a loss that is not finite) left out. */
#include <math.h>
#include <stdlib.h>
#include "alloc.h"
#include "coord-internal.h"
#include "tap.h"

static void beat(Coord *c, Peer *p, int64_t clock, float loss) {
        p->worker.has_clock = p->worker.has_loss = p->worker.has_samples_per_s = true;
        p->worker.clock = clock;
        p->worker.loss = loss;
        p->worker.samples_per_s = 1000.0f;
        coord_history_sample(c, p);
}

/* Each worker's samples in order of clocks, with seqs multiples of the stride. */
static bool even(const Coord *c, uint32_t worker, size_t *ret_n) {
        int64_t last = -1;
        size_t n = 0;
        for (size_t k = 0; k < c->nclocks; k++) {
                const ClockRec *r = &c->clocks[k];
                if (r->worker != worker)
                        continue;
                if (r->clock <= last || r->seq % c->clock_stride != 0)
                        return false;
                last = r->clock;
                n++;
        }
        *ret_n = n;
        return true;
}

int main(void) {
        Coord *c = ps_calloc(1, sizeof *c);
        Peer *peers = ps_calloc(3, sizeof *peers);
        if (!c || !peers)
                return 1;
        c->state = JOB_RUNNING;
        c->peers = peers;
        c->npeers = 3;
        c->clock_stride = 1;
        for (uint32_t i = 0; i < 3; i++)
                peers[i] = (Peer) { .id = i + 1, .role = PSNET__ROLE__ROLE_WORKER, .member = i < 2 };

        beat(c, &peers[0], 0, 2.3f);
        CHECK(c->nclocks == 0, "clock 0 (no step yet): no sample");
        beat(c, &peers[0], 5, 2.3f);
        beat(c, &peers[0], 5, 2.2f);
        CHECK(c->nclocks == 1, "a heartbeat with the same clock again: one sample (%zu)", c->nclocks);
        beat(c, &peers[2], 7, 1.0f);
        CHECK(c->nclocks == 1, "a worker that is not a member: none");
        beat(c, &peers[1], 6, NAN);
        CHECK(c->nclocks == 2 && isnan(c->clocks[1].loss) && c->clocks[1].worker == 2,
              "a loss that is not finite is recorded as none");
        CHECK(c->clocks[0].spread == 0, "no map: no staleness measured");

        /* Two workers over many clocks: bounded, thinned evenly, the start kept. */
        const int64_t steps = COORD_CLOCK_HISTORY * 5;
        for (int64_t k = 1; k <= steps; k++) {
                beat(c, &peers[0], 5 + k, 1.0f);
                beat(c, &peers[1], 6 + k, 1.0f);
        }
        CHECK(c->nclocks <= COORD_CLOCK_HISTORY, "at most %d samples (%zu)", COORD_CLOCK_HISTORY, c->nclocks);
        CHECK(c->clock_stride == 16, "the stride doubled as they filled (%u)", c->clock_stride);
        size_t n1 = 0, n2 = 0;
        CHECK(even(c, 1, &n1) && even(c, 2, &n2), "each worker's samples: ascending clocks, every stride-th");
        CHECK(n1 + 1 >= n2 && n2 + 1 >= n1 && n1 > COORD_CLOCK_HISTORY / 4,
              "the workers share them evenly (%zu, %zu)", n1, n2);
        CHECK(c->clocks[0].clock == 5 && c->clocks[0].worker == 1, "the job's first sample is still there");
        const ClockRec *lastr = &c->clocks[c->nclocks - 1];
        CHECK(lastr->clock >= 6 + steps - 2 * 16, "and a recent one (%ld)", (long) lastr->clock);

        coord_history_reset(c);
        CHECK(c->nclocks == 0 && c->clock_stride == 1 && peers[0].hist_seq == 0 && peers[0].hist_clock == 0,
              "a new job starts them again");
        beat(c, &peers[0], 1, 2.0f);
        CHECK(c->nclocks == 1 && c->clocks[0].seq == 0, "from its first clock");

        c->state = JOB_DONE;
        beat(c, &peers[0], 2, 2.0f);
        CHECK(c->nclocks == 1, "none when no job runs");
        ps_free(c->clocks);
        ps_free(peers);
        ps_free(c);
        return tap_done();
}
