/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/pscoord/boundary.c: where a change of membership or mode
 * takes effect, from what the shards answered to a fence. */
#include "boundary.h"
#include "tap.h"

static FenceClocks fold(const int64_t (*answers)[3], int n) {
        FenceClocks f = FENCE_CLOCKS_INIT;
        for (int i = 0; i < n; i++)
                fence_clocks_add(&f, answers[i][0], answers[i][1], answers[i][2]);
        return f;
}

int main(void) {
        /* Two shards: one has closed clock 41, the other 40; members pushed 40..41. */
        const int64_t two[][3] = { { 41, 41, 40 }, { 40, 41, 40 } };
        FenceClocks f = fold(two, 2);
        CHECK(f.max_clock == 41 && f.max_wclock == 41 && f.min_wclock == 40, "answers fold to max/max/max-of-min");
        Boundary b = boundary_pick(MODE_BSP, MODE_BSP, &f);
        CHECK(b.from == 42 && b.start == 42, "BSP joiner: the clock after the last one closed (%ld, %ld)",
              (long) b.from, (long) b.start);
        b = boundary_pick(MODE_BSP, MODE_ASP, &f);
        CHECK(b.from == 42 && b.start == 42, "BSP to ASP: also after the last closed clock");
        b = boundary_pick(MODE_BSP, MODE_SSP, &f);
        CHECK(b.from == 42, "BSP to SSP: the same");

        /* ASP: members at different clocks. */
        const int64_t asp[][3] = { { 0, 90, 60 }, { 0, 95, 70 } };
        f = fold(asp, 2);
        b = boundary_pick(MODE_ASP, MODE_BSP, &f);
        CHECK(b.from == 97 && b.start == 97, "ASP to BSP: two past the furthest push (%ld)", (long) b.from);
        b = boundary_pick(MODE_SSP, MODE_BSP, &f);
        CHECK(b.from == 97, "SSP to BSP: the same");
        b = boundary_pick(MODE_ASP, MODE_ASP, &f);
        CHECK(b.from == 0 && b.start == 70, "ASP joiner: at once, from the slowest member any shard saw (%ld)",
              (long) b.start);
        b = boundary_pick(MODE_ASP, MODE_SSP, &f);
        CHECK(b.from == 0 && b.start == 70, "ASP to SSP: at once");

        /* No shard has heard a member yet (a job that just started). */
        const int64_t none[][3] = { { 0, 0, -1 }, { 0, 0, -1 } };
        f = fold(none, 2);
        b = boundary_pick(MODE_ASP, MODE_ASP, &f);
        CHECK(b.from == 0 && b.start == 0, "no pushes yet: a joiner starts at 0");
        b = boundary_pick(MODE_BSP, MODE_BSP, &f);
        CHECK(b.from == 1 && b.start == 1, "BSP with nothing closed: clock 1");
        f = fold(none, 0);
        CHECK(f.max_clock == 0 && f.min_wclock == -1, "no answers: the initial clocks");
        return tap_done();
}
