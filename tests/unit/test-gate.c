/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for ps/psd/psd-gate.c: the BSP gate (deterministic aggregation
 * whatever the arrival order, dedupe by (worker, chunk, clock), stale and
 * non-member pushes, membership changes closing clocks, unaligned frames), ASP
 * (apply on arrival, scaled by the membership), the once-per-request
 * acknowledgement of multi-key pushes, lr scaling, the SSP bound, fences and
 * boundaries, pushes in parts, the admission of pushes (membership, key,
 * finite values) and the bounded list of parked pulls.
 *
 * Every expected value is computed here, independently of the gate: initial
 * values with job_init_chunk, sums by hand in ascending worker order, and the
 * update by optim_apply on a private copy of the chunk and its state. The
 * messages are real zmq_msg_t (no context is needed for messages), so running
 * this under ASan also checks that parked frames and snapshots are freed. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "psd-fixture.h"
#include "psd-optim.h"
#include "tap.h"
#include "wire.h"

/* Gradients chosen so that float addition order shows: |g1| = |g3| ~ 1e7
 * (ulp 1) with opposite signs and g2 < 1, so (g1+g2)+g3 loses g2's fraction
 * while (g3+g1)+g2 keeps it. */
static void grad_order(float *g, uint32_t len, uint32_t w, int64_t c) {
        for (uint32_t j = 0; j < len; j++)
                g[j] = w == 1 ? 1.0e7f + 1000.0f * (float) j + (float) c
                     : w == 2 ? 0.3f + 0.01f * (float) j + 0.1f * (float) c
                              : -1.0e7f - 1000.0f * (float) j;
}

static void test_bsp_order(void) {
        static const uint32_t orders[3][3] = { { 3, 1, 2 }, { 1, 2, 3 }, { 2, 3, 1 } };
        static const uint32_t keys[2][2] = { { 0, 0 }, { 0, 12 } }; /* 16 floats, 8 floats */
        uint32_t members[3] = { 3, 1, 2 };                          /* unsorted on purpose */
        Job job;
        Acks acks[3];
        Gate *s[3];
        make_job(&job, 7, MODE_BSP, "sgd");
        memset(acks, 0, sizeof acks);
        for (int o = 0; o < 3; o++)
                s[o] = open_solo(&job, &acks[o], members, 3);
        if (!s[0] || !s[1] || !s[2])
                goto out;

        float g[4][MAXLEN];
        /* The check has teeth: summing in arrival order 3,1,2 would differ. */
        grad_order(g[1], MAXLEN, 1, 0);
        grad_order(g[2], MAXLEN, 2, 0);
        grad_order(g[3], MAXLEN, 3, 0);
        bool differs = false;
        for (uint32_t j = 0; j < MAXLEN; j++) {
                float asc = g[1][j], arr = g[3][j];
                asc += g[2][j];
                asc += g[3][j];
                arr += g[1][j];
                arr += g[2][j];
                differs |= asc != arr;
        }
        CHECK(differs, "the test gradients' float sum depends on the order of addition");

        for (int kk = 0; kk < 2; kk++) {
                uint32_t t = keys[kk][0], k = keys[kk][1];
                Ref ref;
                ref_init(&ref, &job, t, k);
                uint32_t len = ref.len;
                for (int64_t clock = 0; clock < 2; clock++) {
                        for (uint32_t w = 1; w <= 3; w++)
                                grad_order(g[w], len, w, clock);
                        float sum[MAXLEN];
                        float inv = 1.0f / 3.0f;
                        for (uint32_t j = 0; j < len; j++) {
                                sum[j] = g[1][j];
                                sum[j] += g[2][j];
                                sum[j] += g[3][j];
                                sum[j] *= inv;
                        }
                        ref_step(&ref, sum);

                        for (int o = 0; o < 3; o++) {
                                Chunk *c = key(s[o], t, k);
                                if (!c)
                                        continue;
                                float before[MAXLEN];
                                memcpy(before, c->val->data, len * sizeof(float));
                                size_t acks0 = acks[o].n;
                                bool early = false;
                                for (int i = 0; i < 3; i++) {
                                        uint32_t w = orders[o][i];
                                        uint64_t seq = (uint64_t) (kk * 100 + clock * 10 + w);
                                        push1(s[o], c, w, clock, seq, g[w]);
                                        if (i < 2)
                                                early |= acks[o].n != acks0 || c->clock != clock ||
                                                         !same(c->val->data, before, len);
                                }
                                CHECK(!early, "order %u,%u,%u key (%u,%u) clock %ld: nothing applied or "
                                      "acknowledged before the last member pushed",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock);
                                bool acks_ok = acks[o].n == acks0 + 3;
                                for (uint32_t w = 1; w <= 3; w++) {
                                        uint64_t seq = (uint64_t) (kk * 100 + clock * 10 + w);
                                        acks_ok &= acks_count(&acks[o], seq) == 1 &&
                                                   acks_status(&acks[o], seq) == ST_OK;
                                }
                                CHECK(acks_ok, "order %u,%u,%u key (%u,%u) clock %ld: one OK ack per "
                                      "request when the clock closes (%zu)",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock,
                                      acks[o].n - acks0);
                                CHECK(c->clock == clock + 1 && c->steps == (uint64_t) clock + 1 &&
                                      c->npending == 0,
                                      "order %u,%u,%u key (%u,%u): chunk clock %ld -> %ld",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock,
                                      (long) c->clock);
                                CHECK(same(c->val->data, ref.w, len),
                                      "order %u,%u,%u key (%u,%u) clock %ld: values are optim_apply of "
                                      "((g1+g2)+g3)*(1/3), bit for bit",
                                      orders[o][0], orders[o][1], orders[o][2], t, k, (long) clock);
                        }
                        Chunk *c0 = key(s[0], t, k), *c1 = key(s[1], t, k), *c2 = key(s[2], t, k);
                        CHECK(c0 && c1 && c2 && same(c0->val->data, c1->val->data, len) &&
                              same(c1->val->data, c2->val->data, len) &&
                              same(c0->state, c1->state, len) && same(c1->state, c2->state, len),
                              "key (%u,%u) clock %ld: the three arrival orders give identical values "
                              "and state (memcmp)", t, k, (long) clock);
                }
                ref_done(&ref);
        }
        /* Clock 2 everywhere on the two keys, 0 elsewhere. */
        CHECK(gate_clock(s[0]) == 0, "store_clock is the smallest chunk clock (0)");
out:
        for (int o = 0; o < 3; o++)
                shard_free(s[o]);
}

static void test_bsp_dedupe(void) {
        uint32_t m12[2] = { 1, 2 }, m123[3] = { 1, 2, 3 };
        Job job;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], gx[MAXLEN], avg[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        grad_fill(g1, len, 1, 0);
        grad_fill(g2, len, 2, 0);
        for (uint32_t j = 0; j < len; j++)
                gx[j] = 100.0f; /* would show if a retry were applied */
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);

        push1(s, c, 1, 0, 10, g1);
        CHECK(acks.n == 0 && c->npending == 1, "worker 1's push is parked, not acknowledged");
        push1(s, c, 1, 0, 11, gx);
        CHECK(acks.n == 1 && acks_status(&acks, 11) == ST_DUPLICATE && c->npending == 1,
              "a retry before the clock closes: DUPLICATE at once, not parked (status %d)",
              acks_status(&acks, 11));
        push1(s, c, 2, 0, 12, g2);
        CHECK(acks.n == 3 && acks_status(&acks, 10) == ST_OK && acks_status(&acks, 12) == ST_OK &&
              acks_count(&acks, 10) == 1,
              "the clock closes: the original and worker 2 acknowledged OK, once each");
        CHECK(c->clock == 1 && c->steps == 1 && same(c->val->data, ref.w, len),
              "applied once: optim_apply of (g1+g2)/2, the retry not counted");
        push1(s, c, 1, 0, 13, gx);
        CHECK(acks_status(&acks, 13) == ST_DUPLICATE && c->steps == 1 && c->npending == 0 &&
                      same(c->val->data, ref.w, len),
              "a retry after the clock closed: DUPLICATE, not applied (status %d)",
              acks_status(&acks, 13));

        /* Worker 3 joins late and pushes for clock 0, which has closed. */
        gate_set_members(s, m123, 3, 2);
        push1(s, c, 3, 0, 14, gx);
        CHECK(acks_status(&acks, 14) == ST_STALE && c->npending == 0 && c->steps == 1 &&
                      same(c->val->data, ref.w, len),
              "a push for a closed clock: STALE, not applied (status %d)", acks_status(&acks, 14));
        push1(s, c, 1, 5, 15, gx);
        CHECK(acks_status(&acks, 15) == ST_STALE && c->npending == 0 && c->steps == 1,
              "a push for a clock ahead of the chunk: STALE (status %d)", acks_status(&acks, 15));
        grad_fill(g1, len, 1, 1);
        push1(s, c, 1, 1, 16, g1);
        CHECK(acks_count(&acks, 16) == 0 && c->npending == 1,
              "the refused push ahead does not block worker 1's push for the current clock");

        /* Bad requests. */
        push1(s, c, 70000, 1, 17, gx);
        CHECK(acks_status(&acks, 17) == ST_INVALID && c->npending == 1,
              "worker id past 65535: INVALID (status %d)", acks_status(&acks, 17));
        push1(s, c, 2, -1, 18, gx);
        CHECK(acks_status(&acks, 18) == ST_INVALID && c->npending == 1,
              "negative clock: INVALID (status %d)", acks_status(&acks, 18));
        CHECK(acks.overflow == 0 && acks.a[0].seq == 11 && strcmp(acks.a[0].route, "w1") == 0 &&
              acks.a[0].worker == 1 && acks.a[0].clock == 0,
              "an ack carries the request's route, worker and clock (\"%s\")", acks.a[0].route);
        size_t before = acks.n;
        s = shard_free(s);
        CHECK(acks.n == before + 1 && acks_status(&acks, 16) == ST_SHUTTING_DOWN,
              "store_free refuses the parked push, once (status %d)", acks_status(&acks, 16));
        ref_done(&ref);
out:
        shard_free(s);
}

/* A worker outside the membership may push; it is parked, never counted, and
 * refused when the clock closes. */
static void test_bsp_non_member(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], g9[MAXLEN], avg[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 3, 0) : NULL; /* b1: 5 floats */
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 3, 0);
        grad_fill(g1, len, 1, 0);
        grad_fill(g2, len, 2, 0);
        for (uint32_t j = 0; j < len; j++)
                g9[j] = 50.0f;
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);

        push1(s, c, 9, 0, 20, g9);
        CHECK(acks.n == 0 && c->npending == 1 && c->clock == 0,
              "a non-member's push is parked, not acknowledged");
        push1(s, c, 1, 0, 21, g1);
        CHECK(acks.n == 0 && c->clock == 0 && c->steps == 0,
              "one member and one non-member do not close a clock of two members");
        push1(s, c, 2, 0, 22, g2);
        CHECK(acks.n == 3 && acks_status(&acks, 20) == ST_STALE && acks_status(&acks, 21) == ST_OK &&
                      acks_status(&acks, 22) == ST_OK,
              "the clock closes: the non-member refused STALE, the members OK (status %d)",
              acks_status(&acks, 20));
        CHECK(c->clock == 1 && c->steps == 1 && c->npending == 0 && same(c->val->data, ref.w, len),
              "the values are optim_apply of (g1+g2)/2, without the non-member's gradient");
        push1(s, c, 9, 0, 23, g9);
        CHECK(acks_status(&acks, 23) == ST_DUPLICATE || acks_status(&acks, 23) == ST_STALE,
              "the non-member retrying the closed clock is refused (status %d)",
              acks_status(&acks, 23));
        CHECK(c->steps == 1 && same(c->val->data, ref.w, len), "and not applied");
        ref_done(&ref);
out:
        shard_free(s);
}

static void test_membership_shrink(void) {
        uint32_t m12[2] = { 1, 2 }, m1 = 1;
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN], gx[MAXLEN], one[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL, *b = s ? key(s, 3, 0) : NULL;
        if (!a || !b)
                goto out;
        Ref ra, rb;
        ref_init(&ra, &job, 0, 0);
        ref_init(&rb, &job, 3, 0);

        grad_fill(g, a->len, 1, 0);
        push1(s, a, 1, 0, 1, g);
        for (uint32_t j = 0; j < a->len; j++)
                one[j] = g[j] * (1.0f / 1.0f);
        ref_step(&ra, one);
        grad_fill(g, b->len, 1, 0);
        push1(s, b, 1, 0, 2, g);
        for (uint32_t j = 0; j < b->len; j++)
                one[j] = g[j] * (1.0f / 1.0f);
        ref_step(&rb, one);
        CHECK(acks.n == 0 && a->clock == 0 && b->clock == 0, "members {1,2}: worker 1 alone waits");

        gate_set_members(s, &m1, 1, 2);
        CHECK(a->clock == 1 && b->clock == 1 && a->steps == 1 && b->steps == 1,
              "gate_set_members({1}) closes the clocks worker 1 completed");
        CHECK(acks.n == 2 && acks_status(&acks, 1) == ST_OK && acks_status(&acks, 2) == ST_OK,
              "and acknowledges worker 1's pushes OK");
        CHECK(same(a->val->data, ra.w, a->len) && same(b->val->data, rb.w, b->len),
              "with g1 alone: optim_apply of g1 * (1/1)");
        for (uint32_t j = 0; j < MAXLEN; j++)
                gx[j] = 9.0f;
        push1(s, a, 2, 0, 3, gx);
        CHECK(acks_status(&acks, 3) == ST_STALE && a->steps == 1,
              "worker 2 pushing the closed clock afterwards: STALE (status %d)", acks_status(&acks, 3));

        /* An empty membership closes nothing; psd passes the empty repeated field
         * of the Control message as (NULL, 0). */
        gate_set_members(s, NULL, 0, 3);
        grad_fill(g, a->len, 1, 1);
        push1(s, a, 1, 1, 4, g);
        CHECK(a->clock == 1 && a->npending == 1 && acks_count(&acks, 4) == 0,
              "with no members nothing closes");
        for (uint32_t j = 0; j < a->len; j++)
                one[j] = g[j] * (1.0f / 1.0f);
        ref_step(&ra, one);
        gate_set_members(s, &m1, 1, 4);
        CHECK(a->clock == 2 && acks_status(&acks, 4) == ST_OK && same(a->val->data, ra.w, a->len),
              "worker 1 rejoining closes the clock with its parked push");
        ref_done(&ra);
        ref_done(&rb);
out:
        shard_free(s);
}

/* A frame whose data is not float-aligned (a receive buffer may hand such a
 * frame over) takes the store's copying path; the result must be the same. */
static void test_bsp_unaligned(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], avg[MAXLEN];
        _Alignas(64) char raw[MAXLEN * sizeof(float) + 8];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, m12, 2);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        grad_fill(g1, len, 1, 0);
        grad_fill(g2, len, 2, 0);
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);

        /* Worker 2's frame is the unaligned one, so it is summed second. */
        push1(s, c, 1, 0, 1, g1);
        memcpy(raw + 1, g2, len * sizeof(float));
        zmq_msg_t grad;
        zmq_msg_init_data(&grad, raw + 1, len * sizeof(float), NULL, NULL);
        PushReq *req = req_new(2, 0, 2);
        gate_push(s, c, req, &grad);
        zmq_msg_close(&grad);
        pushreq_settle(s, req, ST_OK);
        CHECK(acks.n == 2 && c->clock == 1 && same(c->val->data, ref.w, len),
              "an unaligned frame sums like an aligned one");

        /* And first: worker 1 unaligned at clock 1. */
        grad_fill(g1, len, 1, 1);
        grad_fill(g2, len, 2, 1);
        for (uint32_t j = 0; j < len; j++) {
                avg[j] = g1[j];
                avg[j] += g2[j];
                avg[j] *= 1.0f / 2.0f;
        }
        ref_step(&ref, avg);
        memcpy(raw + 3, g1, len * sizeof(float));
        zmq_msg_init_data(&grad, raw + 3, len * sizeof(float), NULL, NULL);
        req = req_new(1, 1, 3);
        gate_push(s, c, req, &grad);
        zmq_msg_close(&grad);
        pushreq_settle(s, req, ST_OK);
        push1(s, c, 2, 1, 4, g2);
        CHECK(acks.n == 4 && c->clock == 2 && same(c->val->data, ref.w, len),
              "an unaligned first frame starts the sum like an aligned one");
        ref_done(&ref);
out:
        shard_free(s);
}

static void test_asp(void) {
        uint32_t m4[4] = { 1, 2, 3, 4 }, m2[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN], gx[MAXLEN], sc[MAXLEN];
        _Alignas(64) char raw[MAXLEN * sizeof(float) + 8];
        make_job(&job, 7, MODE_ASP, "adam");
        Gate *s = open_solo(&job, &acks, m4, 4);
        Chunk *c = s ? key(s, 0, 0) : NULL;
        if (!c)
                goto out;
        uint32_t len = c->len;
        Ref ref;
        ref_init(&ref, &job, 0, 0);
        for (uint32_t j = 0; j < len; j++)
                gx[j] = 100.0f;

        struct { uint32_t w; int64_t clock; uint64_t seq; int want; } steps[] = {
                { 1, 0, 1, ST_OK },        { 1, 0, 2, ST_DUPLICATE }, { 2, 0, 3, ST_OK },
                { 1, 1, 4, ST_OK },        { 1, 0, 5, ST_DUPLICATE }, { 3, 0, 6, ST_OK },
                { 3, 0, 7, ST_DUPLICATE },
        };
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
                bool apply = steps[i].want == ST_OK;
                uint64_t before = c->steps;
                if (apply) {
                        grad_fill(g, len, steps[i].w, steps[i].clock);
                        for (uint32_t j = 0; j < len; j++)
                                sc[j] = g[j] * (1.0f / 4.0f);
                        ref_step(&ref, sc);
                }
                push1(s, c, steps[i].w, steps[i].clock, steps[i].seq, apply ? g : gx);
                CHECK(acks_count(&acks, steps[i].seq) == 1 && acks_status(&acks, steps[i].seq) == steps[i].want,
                      "asp: worker %u clock %ld acknowledged at once, status %d (got %d)", steps[i].w,
                      (long) steps[i].clock, steps[i].want, acks_status(&acks, steps[i].seq));
                CHECK(c->steps == before + apply && c->npending == 0 && same(c->val->data, ref.w, len),
                      "asp: worker %u clock %ld %s: values are adam step %lu of g/4", steps[i].w,
                      (long) steps[i].clock, apply ? "applied on arrival" : "not applied",
                      (unsigned long) ref.steps);
        }
        CHECK(c->clock == 0 && c->steps == 4,
              "asp: steps counts the updates, the BSP clock stays (clock %ld, steps %lu)", (long) c->clock,
              (unsigned long) c->steps);

        /* The scale follows the membership. */
        gate_set_members(s, m2, 2, 2);
        grad_fill(g, len, 2, 1);
        for (uint32_t j = 0; j < len; j++)
                sc[j] = g[j] * (1.0f / 2.0f);
        ref_step(&ref, sc);
        push1(s, c, 2, 1, 8, g);
        CHECK(acks_status(&acks, 8) == ST_OK && same(c->val->data, ref.w, len),
              "asp: with 2 members a push counts g/2");

        /* An unaligned frame is scaled the same. */
        grad_fill(g, len, 4, 0);
        for (uint32_t j = 0; j < len; j++)
                sc[j] = g[j] * (1.0f / 2.0f);
        ref_step(&ref, sc);
        memcpy(raw + 1, g, len * sizeof(float));
        zmq_msg_t grad;
        zmq_msg_init_data(&grad, raw + 1, len * sizeof(float), NULL, NULL);
        PushReq *req = req_new(4, 0, 9);
        gate_push(s, c, req, &grad);
        zmq_msg_close(&grad);
        pushreq_settle(s, req, ST_OK);
        CHECK(acks_status(&acks, 9) == ST_OK && same(c->val->data, ref.w, len) &&
                      same(c->state, ref.state, 2 * len),
              "asp: an unaligned frame applies like an aligned one (values and adam state)");
        ref_done(&ref);
out:
        shard_free(s);
}

static void test_multi_key(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL, *b = s ? key(s, 0, 12) : NULL, *c = s ? key(s, 3, 0) : NULL;
        if (!a || !b || !c)
                goto out;
        Ref ra, rb;
        ref_init(&ra, &job, 0, 0);
        ref_init(&rb, &job, 0, 12);
        float ga1[MAXLEN], ga2[MAXLEN], gb1[MAXLEN], gb2[MAXLEN], avg[MAXLEN];
        grad_fill(ga1, a->len, 1, 0);
        grad_fill(ga2, a->len, 2, 0);
        grad_fill(gb1, b->len, 1, 0);
        grad_fill(gb2, b->len, 2, 0);
        for (uint32_t j = 0; j < a->len; j++) {
                avg[j] = ga1[j];
                avg[j] += ga2[j];
                avg[j] *= 0.5f;
        }
        ref_step(&ra, avg);
        for (uint32_t j = 0; j < b->len; j++) {
                avg[j] = gb1[j];
                avg[j] += gb2[j];
                avg[j] *= 0.5f;
        }
        ref_step(&rb, avg);

        PushReq *r1 = req_new(1, 0, 1);
        req_push(s, r1, a, ga1);
        req_push(s, r1, b, gb1);
        pushreq_settle(s, r1, ST_OK);
        CHECK(acks.n == 0, "worker 1 pushes keys A and B in one request: parked, no ack");

        PushReq *r2 = req_new(2, 0, 2);
        req_push(s, r2, a, ga2);
        CHECK(a->clock == 1 && acks.n == 0, "worker 2 closes A; neither request is acknowledged "
              "while its reader still holds it");
        pushreq_settle(s, r2, ST_OK);
        CHECK(acks.n == 1 && acks_status(&acks, 2) == ST_OK && acks_count(&acks, 1) == 0,
              "worker 2's request is acknowledged; worker 1's waits for B");

        push1(s, b, 2, 0, 3, gb2);
        CHECK(acks.n == 3 && acks_count(&acks, 1) == 1 && acks_status(&acks, 1) == ST_OK &&
                      acks_status(&acks, 3) == ST_OK,
              "B closes: worker 1's request is acknowledged OK, once");
        CHECK(same(a->val->data, ra.w, a->len) && same(b->val->data, rb.w, b->len),
              "A and B each applied optim_apply of their mean");

        /* A request whose second key is refused is acknowledged with the
         * refusal, once, after its other key settles. */
        PushReq *r4 = req_new(1, 1, 4);
        grad_fill(g, a->len, 1, 1);
        req_push(s, r4, a, g);
        grad_fill(g, c->len, 1, 1);
        req_push(s, r4, c, g); /* C is still at clock 0: STALE */
        pushreq_settle(s, r4, ST_OK);
        CHECK(acks_count(&acks, 4) == 0, "a request with a refused key still waits for its parked key");
        grad_fill(g, a->len, 2, 1);
        push1(s, a, 2, 1, 5, g);
        CHECK(acks_count(&acks, 4) == 1 && acks_status(&acks, 4) == ST_STALE && a->clock == 2,
              "then it is acknowledged once with the first refusal (status %d)", acks_status(&acks, 4));

        /* Members {1}: a request closes its keys as it goes and is acknowledged
         * when its reader lets go. */
        uint32_t m1 = 1;
        gate_set_members(s, &m1, 1, 2);
        PushReq *r6 = req_new(1, 1, 6);
        grad_fill(g, b->len, 1, 1);
        req_push(s, r6, b, g);
        grad_fill(g, c->len, 1, 0);
        PushReq *r7 = req_new(1, 0, 7);
        req_push(s, r7, c, g);
        CHECK(acks_count(&acks, 6) == 0 && acks_count(&acks, 7) == 0 && b->clock == 2 && c->clock == 1,
              "keys applied while the reader holds the requests: no ack yet");
        pushreq_settle(s, r6, ST_OK);
        pushreq_settle(s, r7, ST_OK);
        CHECK(acks_count(&acks, 6) == 1 && acks_status(&acks, 6) == ST_OK && acks_count(&acks, 7) == 1 &&
                      acks_status(&acks, 7) == ST_OK,
              "acknowledged OK once the reader settles");

        /* Two different refusals in one request: the first one is reported. */
        Chunk *d = key(s, 1, 0); /* b0, still at clock 0 */
        if (d) {
                PushReq *r8 = req_new(1, 1, 8);
                grad_fill(g, a->len, 1, 1);
                req_push(s, r8, a, g); /* worker 1 has pushed A for clock 1: DUPLICATE */
                grad_fill(g, c->len, 1, 1);
                req_push(s, r8, c, g); /* C is at clock 1: applied */
                grad_fill(g, d->len, 1, 1);
                req_push(s, r8, d, g); /* D is at clock 0: STALE */
                pushreq_settle(s, r8, ST_OK);
                CHECK(acks_count(&acks, 8) == 1 && acks_status(&acks, 8) == ST_DUPLICATE &&
                              c->clock == 2 && d->clock == 0 && a->steps == 2,
                      "first refusal wins: DUPLICATE before STALE (status %d)", acks_status(&acks, 8));
        }
        ref_done(&ra);
        ref_done(&rb);
out:
        shard_free(s);
}

/* Runs n BSP clocks of members 1 and 2 on key (0,0) of a fresh store for job,
 * worker 1's pushes saying progress p1[c] and worker 2's p2[c] (NULL: none),
 * and says whether every step equals the reference optimizer's at lr x
 * factor[c] on the mean gradient. The reference keeps its optimizer state
 * across steps; the factor goes into the lr of its job before each step. */
static bool two_member_steps(const Job *job, size_t n, const float *factor, const float *p1, const float *p2) {
        uint32_t m12[2] = { 1, 2 };
        Acks acks = { 0 };
        float g1[MAXLEN], g2[MAXLEN], mean[MAXLEN];
        Job ref_job = *job;
        Gate *s = open_solo(job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL;
        bool all = a != NULL;
        Ref r;
        ref_init(&r, &ref_job, 0, 0);
        for (size_t clk = 0; a && clk < n; clk++) {
                grad_fill(g1, a->len, 1, (uint32_t) clk);
                grad_fill(g2, a->len, 2, (uint32_t) clk);
                for (uint32_t j = 0; j < a->len; j++)
                        mean[j] = (g1[j] + g2[j]) * (1.0f / 2.0f);
                ref_job.optim.lr = job->optim.lr * factor[clk];
                ref_step(&r, mean);
                PushReq *q1 = req_new(1, (int64_t) clk, 10 + clk), *q2 = req_new(2, (int64_t) clk, 20 + clk);
                if (!q1 || !q2)
                        return false;
                q1->progress = p1 ? p1[clk] : -1.0f;
                q2->progress = p2 ? p2[clk] : -1.0f;
                req_push(s, q1, a, g1);
                pushreq_settle(s, q1, ST_OK);
                req_push(s, q2, a, g2);
                pushreq_settle(s, q2, ST_OK);
                all &= a->clock == (int64_t) clk + 1 && same(a->val->data, r.w, a->len);
        }
        ref_done(&r);
        shard_free(s);
        return all;
}

/* lr_scaling: the step uses lr * W (W = members of the clock), ramped up over
 * the warm-up clocks. */
static void test_lr_scaling(void) {
        Job job;
        make_job(&job, 7, MODE_BSP, "sgd");
        job.lr_scaling = LR_SCALING_AUTO; /* BSP, SGD: x W */
        job.warmup_clocks = 4;
        const float factor[] = { 1.25f, 1.5f, 1.75f, 2.0f, 2.0f, 2.0f };
        CHECK(two_member_steps(&job, 6, factor, NULL, NULL),
              "lr_scaling with 2 members: lr x 1.25, 1.5, 1.75 over the warm-up, then x 2, of the mean gradient");
}

/* --lr-schedule cosine: a BSP clock's step takes the lr at the progress its
 * members' pushes carried (the furthest of them), an ASP push at its own;
 * pushes without progress are applied at the unscheduled rate. */
static void test_lr_schedule(void) {
        uint32_t m12[2] = { 1, 2 };
        Job job;
        float g1[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        job.lr_schedule = LR_SCHEDULE_COSINE;
        /* Worker 1 says p, worker 2 p + 0.05 (a worker cannot raise the rate
         * past the furthest member's); clock 3 carries none. */
        const float p1[] = { 0.0f, 0.25f, 0.5f, -1.0f, 0.9f }, p2[] = { 0.05f, 0.3f, 0.55f, -1.0f, 0.95f };
        float factor[5];
        for (size_t c = 0; c < 5; c++)
                factor[c] = p2[c] < 0 ? 1.0f : 0.5f * (1.0f + cosf(3.14159265f * p2[c]));
        CHECK(two_member_steps(&job, 5, factor, p1, p2),
              "BSP: each clock's step at lr x (1 + cos(pi p)) / 2 of the furthest progress p, none at clock 3");

        /* ASP: each push is 1/W of a step at its own progress. Without momentum
         * or weight decay, a push at 0.5 moves the weights half as far as the
         * same gradient at 0. */
        Job plain;
        Acks acks2 = { 0 };
        make_job(&plain, 8, MODE_ASP, "sgd");
        plain.optim.momentum = plain.optim.weight_decay = 0.0f;
        plain.lr_schedule = LR_SCHEDULE_COSINE;
        Gate *t = open_solo(&plain, &acks2, m12, 2);
        Chunk *b = t ? key(t, 0, 0) : NULL;
        float d[2][MAXLEN], was[MAXLEN];
        const float at[2] = { 0.0f, 0.5f };
        grad_fill(g1, b ? b->len : 0, 1, 0);
        for (int i = 0; b && i < 2; i++) {
                memcpy(was, b->val->data, b->len * sizeof(float));
                PushReq *x = req_new(1, i, (uint64_t) (1 + i));
                if (!x)
                        break;
                x->progress = at[i];
                req_push(t, x, b, g1);
                pushreq_settle(t, x, ST_OK);
                for (uint32_t j = 0; j < b->len; j++)
                        d[i][j] = b->val->data[j] - was[j];
        }
        /* Differences of weights carry their rounding: compare the whole moves,
         * and the direction value by value. */
        double n0 = 0, n1 = 0;
        bool along = b != NULL;
        for (uint32_t j = 0; b && j < b->len; j++) {
                n0 += fabs((double) d[0][j]);
                n1 += fabs((double) d[1][j]);
                along = along && (d[0][j] > 0) == (d[1][j] > 0);
        }
        CHECK(along && n0 > 0 && fabs(n1 / n0 - 0.5) < 1e-4,
              "ASP: a push at progress 0.5 moves the weights half as far as one at 0 (%.6f of it)", n0 > 0 ? n1 / n0 : 0);
        shard_free(t);
}

/* A store of job 7 for workers 1 and 2 under SSP with this staleness. */
static Gate *open_ssp(Job *job, Acks *acks, uint32_t staleness) {
        uint32_t m12[2] = { 1, 2 };
        make_job(job, 7, MODE_SSP, "sgd");
        job->staleness = staleness;
        Gate *s = open_solo(job, acks, m12, 2);
        if (s)
                gate_set_config(s, MODE_SSP, staleness, m12, NULL, NULL, 2, NULL, 0, 0, 2);
        return s;
}

/* SSP(s): a pull for clock c is ready once the slowest member completed c - s. */
static void test_ssp_gate(void) {
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        Gate *s = open_ssp(&job, &acks, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL;
        if (!a)
                goto out;
        int64_t slowest = -1;
        CHECK(gate_pull_ready(s, &a, 1, 2, &slowest) && slowest == 0,
              "ssp:2: clock 2 is ready with the slowest at 0 (slowest %ld)", (long) slowest);
        CHECK(!gate_pull_ready(s, &a, 1, 3, NULL), "ssp:2: clock 3 waits for the slowest at 0");
        for (int64_t c = 0; c < 4; c++) {
                grad_fill(g, a->len, 1, c);
                push1(s, a, 1, c, (uint64_t) (10 + c), g);
        }
        CHECK(a->steps == 4 && acks.n == 4, "ssp: pushes apply on arrival (%lu steps)", (unsigned long) a->steps);
        CHECK(!gate_pull_ready(s, &a, 1, 5, &slowest) && slowest == 0,
              "worker 1 at clock 4 cannot pull clock 5 while worker 2 completed 0");
        grad_fill(g, a->len, 2, 0);
        push1(s, a, 2, 0, 20, g);
        grad_fill(g, a->len, 2, 1);
        push1(s, a, 2, 1, 21, g);
        CHECK(gate_pull_ready(s, &a, 1, 4, &slowest) && slowest == 2 && !gate_pull_ready(s, &a, 1, 5, NULL),
              "with the slowest at 2, clock 4 is ready and clock 5 is not (slowest %ld)", (long) slowest);
        CHECK(gate_clock(s) == 4, "store_clock under SSP is the fastest member's progress (%ld)", (long) gate_clock(s));
        /* A copy forwarded by another shard's primary is not worker 2's push to
         * this shard: its own push of clock 2 may still be on its way. */
        PushReq *copy = req_new(2, 2, 30);
        if (copy) {
                copy->replica = true;
                grad_fill(g, a->len, 2, 2);
                req_push(s, copy, a, g);
                pushreq_settle(s, copy, ST_OK);
        }
        CHECK(copy && a->steps == 7 && !gate_pull_ready(s, &a, 1, 5, &slowest) && slowest == 2,
              "a forwarded copy applies but leaves worker 2's clock here at 2 (slowest %ld)", (long) slowest);
        grad_fill(g, a->len, 2, 3);
        push1(s, a, 2, 3, 31, g);
        CHECK(gate_pull_ready(s, &a, 1, 5, &slowest) && slowest == 4,
              "its own next push moves it (slowest %ld)", (long) slowest);
out:
        shard_free(s);
}

/* Part part of parts of worker's push of clock, cut for map epoch: key c. */
static void push_part(Gate *s, Chunk *c, uint32_t worker, int64_t clock, uint64_t seq, uint32_t part,
                      uint32_t parts, uint64_t epoch) {
        float g[MAXLEN];
        PushReq *req = req_new(worker, clock, seq);
        if (!req)
                return;
        req->part = part;
        req->parts = parts;
        req->epoch = epoch;
        grad_fill(g, c->len, worker, clock);
        (void) req_push(s, req, c, g);
        (void) gate_push_part(s, req);
        pushreq_settle(s, req, ST_OK);
}

/* A push in parts counts as the worker's push only once every part is in:
 * before that, a pull that needs it waits (SSP with staleness 0). */
static void test_push_in_parts(void) {
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        Gate *s = open_ssp(&job, &acks, 0);
        Chunk *a = s ? key(s, 0, 0) : NULL, *b = s ? key(s, 0, 12) : NULL;
        if (!a || !b)
                goto out;
        Chunk *both[2] = { a, b };
        grad_fill(g, a->len, 2, 0);
        push1(s, a, 2, 0, 1, g);
        grad_fill(g, b->len, 2, 0);
        push1(s, b, 2, 0, 2, g);
        int64_t slowest = -1;
        bool ready;
        push_part(s, a, 1, 0, 3, 0, 2, 5);
        ready = gate_pull_ready(s, both, 2, 1, &slowest);
        CHECK(a->steps == 2 && !ready && slowest == 0,
              "part 0 of 2 applies but leaves worker 1's clock at 0 (slowest %ld)", (long) slowest);
        push_part(s, b, 1, 0, 4, 1, 2, 4);
        ready = gate_pull_ready(s, both, 2, 1, &slowest);
        CHECK(b->steps == 2 && !ready && slowest == 0,
              "a late part 1 cut for an older map does not complete it (slowest %ld)", (long) slowest);
        push_part(s, a, 1, 0, 5, 0, 2, 5);
        ready = gate_pull_ready(s, both, 2, 1, &slowest);
        CHECK(a->steps == 2 && !ready && slowest == 0,
              "part 0 again: a duplicate, and still one part of two (slowest %ld)", (long) slowest);
        /* Under map epoch 6 (a key moved away, say) the same clock in 3 parts. */
        push_part(s, a, 1, 0, 6, 0, 3, 6);
        push_part(s, b, 1, 0, 7, 2, 3, 6);
        ready = gate_pull_ready(s, both, 2, 1, &slowest);
        CHECK(!ready && slowest == 0,
              "under a new map, the parts seen under the old one do not count (slowest %ld)", (long) slowest);
        push_part(s, b, 1, 0, 8, 1, 3, 6);
        ready = gate_pull_ready(s, both, 2, 1, &slowest);
        CHECK(ready && slowest == 1, "every part in: worker 1 completed clock 0 (slowest %ld)", (long) slowest);
        push_part(s, a, 1, 1, 9, 1, 2, 6);
        push_part(s, b, 1, 0, 10, 0, 2, 6);
        grad_fill(g, a->len, 2, 1);
        push1(s, a, 2, 1, 11, g);
        grad_fill(g, b->len, 2, 1);
        push1(s, b, 2, 1, 12, g);
        ready = gate_pull_ready(s, both, 2, 2, &slowest);
        CHECK(!ready && slowest == 1, "a late part of clock 0 does not complete clock 1 (slowest %ld)",
              (long) slowest);
        push_part(s, b, 1, 1, 13, 0, 2, 6);
        ready = gate_pull_ready(s, both, 2, 2, &slowest);
        CHECK(ready && slowest == 2 && a->steps == 4 && b->steps == 4 && s->push_parts == 9,
              "clock 1's two parts complete it (slowest %ld; %lu parts offered, late ones too)", (long) slowest,
              (unsigned long) s->push_parts);
out:
        shard_free(s);
}

/* A fence holds BSP clocks past the next one; a boundary switch keeps the old
 * membership below from_clock and the new one from it on. */
static void test_fence_boundary(void) {
        uint32_t m12[2] = { 1, 2 }, m123[3] = { 1, 2, 3 };
        int64_t starts[3] = { 0, 0, 2 };
        Job job;
        Acks acks = { 0 };
        float g[MAXLEN];
        make_job(&job, 7, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, m12, 2);
        Chunk *a = s ? key(s, 0, 0) : NULL;
        if (!a)
                goto out;
        int64_t lo = -1, hi = -1;
        int64_t maxc = gate_fence(s, &lo, &hi);
        CHECK(maxc == 0 && s->fence_limit == 1, "fence at clock 0: clock 0 may still close, clock 1 not");
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, a->len, w, 0);
                push1(s, a, w, 0, w, g);
        }
        CHECK(a->clock == 1, "clock 0 closes under the fence");
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, a->len, w, 1);
                push1(s, a, w, 1, 10 + w, g);
        }
        CHECK(a->clock == 1 && a->npending == 2, "clock 1 does not close while fenced");
        /* Worker 3 joins from clock 2: clock 1 closes with {1,2}, clock 2 needs {1,2,3}. */
        gate_set_config(s, MODE_BSP, 0, m123, starts, NULL, 3, m12, 2, 2, 2);
        CHECK(a->clock == 2 && !s->fenced, "the boundary ends the fence; clock 1 closes with the old members");
        CHECK(gate_cfg(s, 1)->nmembers == 2 && gate_cfg(s, 2)->nmembers == 3,
              "clocks below 2 keep 2 members, from 2 on 3");
        CHECK(gate_pull_ready(s, &a, 1, 2, NULL), "the joiner's first pull, clock 2, is ready");
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, a->len, w, 2);
                push1(s, a, w, 2, 20 + w, g);
        }
        CHECK(a->clock == 2, "clock 2 waits for the joiner");
        grad_fill(g, a->len, 3, 2);
        push1(s, a, 3, 2, 23, g);
        CHECK(a->clock == 3 && acks_status(&acks, 23) == ST_OK, "and closes with it");
out:
        shard_free(s);
}

/* --- admission of pushes ---------------------------------------------------------------- */

/* A one-key PUSH header for key (t,k) of job with frame f (len floats). */
static void push_hdr(Psnet__Header *h, Psnet__Key *k, Psnet__Key **kp, const Job *job, uint32_t worker,
                     int64_t clock, uint32_t t, uint32_t kk) {
        wire_header_init(h, PSNET__MSG_TYPE__MSG_PUSH);
        psnet__key__init(k);
        k->tensor = t;
        k->chunk = kk;
        k->len = job_chunk_len(job, t, kk);
        kp[0] = k;
        h->n_keys = 1;
        h->keys = kp;
        h->has_sender = h->has_clock = h->has_seq = h->has_job = true;
        h->job = job->id;
        h->sender = worker;
        h->clock = clock;
        h->seq = 1;
}

static void test_admission(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t members[] = { 1, 2 };
        make_job(&job, 1, MODE_ASP, "sgd");
        Gate *s = open_solo(&job, &acks, members, 2);
        if (!s)
                return;
        Psnet__Header h;
        Psnet__Key k, *kp[1];
        zmq_msg_t f[1];
        char reason[192];
        uint32_t len = job_chunk_len(&job, 0, 0);
        float *g = fbuf(len);
        grad_fill(g, len, 1, 0);
        zmq_msg_init_size(&f[0], len * sizeof(float));
        memcpy(zmq_msg_data(&f[0]), g, len * sizeof(float));

        push_hdr(&h, &k, kp, &job, 1, 0, 0, 0);
        CHECK(gate_admit_push(s, &h, f, NULL, reason, sizeof reason) == ST_OK, "a member's finite push is admitted");
        push_hdr(&h, &k, kp, &job, 9, 0, 0, 0);
        int st = gate_admit_push(s, &h, f, NULL, reason, sizeof reason);
        CHECK(st == ST_STALE && strstr(reason, "worker 9 is not a member of clock 0"),
              "a non-member's push is refused, not applied (%s)", reason);
        CHECK(gate_admit_sender(s, &h, NULL, reason, sizeof reason) == ST_STALE,
              "by the sender step, before its values are looked at");

        /* NaN, +inf, -inf anywhere: refused whole, naming the value. */
        const float bad[] = { NAN, INFINITY, -INFINITY };
        for (size_t b = 0; b < 3; b++) {
                float *d = zmq_msg_data(&f[0]);
                size_t at = (b * 7 + 3) % len;
                memcpy(d, g, len * sizeof(float));
                d[at] = bad[b];
                push_hdr(&h, &k, kp, &job, 2, 0, 0, 0);
                st = gate_admit_push(s, &h, f, NULL, reason, sizeof reason);
                char want[64];
                snprintf(want, sizeof want, "at value %zu", at);
                CHECK(st == PSNET__STATUS__STATUS_NOT_FINITE && strstr(reason, want),
                      "a gradient with %g at %zu is refused (%s)", (double) bad[b], at, reason);
                /* In two steps (psd converts a push between them): the sender
                 * step does not read the values, the values step refuses them. */
                CHECK(gate_admit_sender(s, &h, NULL, reason, sizeof reason) == ST_OK &&
                              gate_admit_values(s, &h, f, reason, sizeof reason) == PSNET__STATUS__STATUS_NOT_FINITE,
                      "the member passes the sender step, its %g the values step", (double) bad[b]);
        }
        /* A long frame: the scan's blocks of 64 and its tail. */
        {
                zmq_msg_t big[1];
                size_t n = 1000;
                zmq_msg_init_size(&big[0], n * sizeof(float));
                float *d = zmq_msg_data(&big[0]);
                for (size_t i = 0; i < n; i++)
                        d[i] = (float) i * 0.5f - 100.0f;
                CHECK(gate_admit_push(s, &h, big, NULL, reason, sizeof reason) == ST_OK, "1000 finite values pass");
                const size_t at[] = { 0, 63, 64, 777, 959, 960, 999 };
                bool all = true;
                for (size_t j = 0; j < sizeof at / sizeof at[0]; j++) {
                        float keep = d[at[j]];
                        d[at[j]] = j % 2 ? INFINITY : NAN;
                        char want[48];
                        snprintf(want, sizeof want, "at value %zu ", at[j]);
                        all = all && gate_admit_push(s, &h, big, NULL, reason, sizeof reason) ==
                                             PSNET__STATUS__STATUS_NOT_FINITE && strstr(reason, want);
                        d[at[j]] = keep;
                }
                CHECK(all, "a bad value is found wherever it is (block start, block end, tail)");
                zmq_msg_close(&big[0]);
        }
        /* A push in shared memory: the keys' values one after another, checked
         * in place (a pool of 3 threads cuts the long key). */
        {
                Psnet__Key k2[2] = { PSNET__KEY__INIT, PSNET__KEY__INIT }, *kp2[2] = { &k2[0], &k2[1] };
                Psnet__Header h2 = h;
                size_t n2 = 200000;
                float *span = fbuf(len + n2);
                for (size_t i = 0; i < len + n2; i++)
                        span[i] = (float) (i % 101) * 0.01f;
                k2[0].tensor = 0, k2[0].chunk = 0, k2[0].len = len;
                k2[1].tensor = 0, k2[1].chunk = 1, k2[1].len = (uint32_t) n2;
                h2.n_keys = 2;
                h2.keys = kp2;
                CHECK(pfor_new(3, &gate_store(s)->pool) == 0, "a pool of 3 threads for the store");
                uint8_t *at[2] = { (uint8_t *) span, (uint8_t *) (span + len) };
                CHECK(gate_admit_keys(s, &h2, at, reason, sizeof reason) == ST_OK,
                      "finite values in shared memory are admitted");
                span[len + 150001] = NAN;
                st = gate_admit_keys(s, &h2, at, reason, sizeof reason);
                CHECK(st == PSNET__STATUS__STATUS_NOT_FINITE && strstr(reason, "key (0,1)") &&
                              strstr(reason, "at value 150001 "),
                      "a NaN in the second key is found in the third thread's part (%s)", reason);
                span[len + 3] = -INFINITY;
                span[2] = INFINITY;
                size_t zeroed = gate_zero_nonfinite(s, span, len + n2);
                CHECK(zeroed == 3 && span[2] == 0.0f && span[len + 3] == 0.0f && span[len + 150001] == 0.0f &&
                              span[1] == 0.01f,
                      "gate_zero_nonfinite sets the 3 bad values to 0 and leaves the rest (%zu)", zeroed);
                span[5] = NAN;
                gate_store(s)->job.allow_nonfinite = true;
                CHECK(gate_zero_nonfinite(s, span, len + n2) == 0 && isnan(span[5]) &&
                              gate_admit_keys(s, &h2, at, reason, sizeof reason) == ST_OK,
                      "a job that allows non-finite values keeps them");
                gate_store(s)->job.allow_nonfinite = false;
                gate_store(s)->pool = pfor_free(gate_store(s)->pool);
                free(span);
        }
        gate_store(s)->job.allow_nonfinite = true;
        CHECK(gate_admit_push(s, &h, f, NULL, reason, sizeof reason) == ST_OK, "unless the job allows non-finite");
        gate_store(s)->job.allow_nonfinite = false;
        memcpy(zmq_msg_data(&f[0]), g, len * sizeof(float));

        /* --max-grad-norm: above the bound refused whole and counted, at or
         * under it admitted; a 3e38 value does not overflow into a pass. */
        double sumsq = 0;
        for (uint32_t i = 0; i < len; i++)
                sumsq += (double) g[i] * g[i];
        float norm = (float) sqrt(sumsq);
        uint64_t refused = s->refused_norm;
        gate_store(s)->job.max_grad_norm = norm * 1.01f;
        push_hdr(&h, &k, kp, &job, 1, 0, 0, 0);
        CHECK(gate_admit_push(s, &h, f, NULL, reason, sizeof reason) == ST_OK,
              "a push of norm %g under --max-grad-norm %g is admitted", (double) norm, (double) (norm * 1.01f));
        gate_store(s)->job.max_grad_norm = norm * 0.99f;
        st = gate_admit_push(s, &h, f, NULL, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_INVALID && strstr(reason, "above the job's --max-grad-norm") &&
                      s->refused_norm == refused + 1,
              "one above it is refused and counted (%s)", reason);
        ((float *) zmq_msg_data(&f[0]))[len / 2] = 3e38f;
        gate_store(s)->job.max_grad_norm = 1e30f;
        st = gate_admit_push(s, &h, f, NULL, reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_INVALID && strstr(reason, "3e+38"),
              "a finite 3e38 gradient is refused under --max-grad-norm 1e30 (%s)", reason);
        uint8_t *at1[1] = { zmq_msg_data(&f[0]) };
        CHECK(gate_admit_keys(s, &h, at1, reason, sizeof reason) == PSNET__STATUS__STATUS_INVALID,
              "read in place (shared memory) too");
        gate_store(s)->job.max_grad_norm = 0.0f;
        CHECK(gate_admit_push(s, &h, f, NULL, reason, sizeof reason) == ST_OK, "without a bound it is admitted");
        memcpy(zmq_msg_data(&f[0]), g, len * sizeof(float));

        /* The job's progress a push carries must be a share, 0..1. */
        const float progress[] = { 0.0f, 0.5f, 1.0f, -0.25f, 1.5f, NAN, INFINITY };
        bool shares = true;
        for (size_t i = 0; i < sizeof progress / sizeof progress[0]; i++) {
                push_hdr(&h, &k, kp, &job, 1, 0, 0, 0);
                h.has_progress = true;
                h.progress = progress[i];
                st = gate_admit_push(s, &h, f, NULL, reason, sizeof reason);
                shares = shares && (i < 3 ? st == ST_OK
                                          : st == PSNET__STATUS__STATUS_INVALID &&
                                                    strstr(reason, "is not a share of the job (0 to 1)"));
        }
        CHECK(shares, "progress 0, 0.5 and 1 pass; -0.25, 1.5, NaN and inf are refused (%s)", reason);

        /* With CURVE keys in the membership, the connection's key must be the member's. */
        uint8_t keys[2][32];
        memset(keys[0], 0x11, 32);
        memset(keys[1], 0x22, 32);
        CHECK(gate_set_config(s, MODE_ASP, 0, members, NULL, (const uint8_t(*)[32]) keys, 2, NULL, 0, 0, 2) == 0,
              "membership with keys");
        push_hdr(&h, &k, kp, &job, 1, 0, 0, 0);
        CHECK(gate_admit_push(s, &h, f, keys[0], reason, sizeof reason) == ST_OK, "worker 1 with its own key");
        st = gate_admit_push(s, &h, f, keys[1], reason, sizeof reason);
        CHECK(st == PSNET__STATUS__STATUS_DENIED && strstr(reason, "not worker 1's"),
              "worker 2's key claiming to be worker 1 is denied (%s)", reason);
        zmq_msg_close(&f[0]);
        free(g);
        shard_free(s);
}

/* --- parked pulls ---------------------------------------------------------------------- */

static struct {
        int ok, refused, last_status;
        char last_reason[192];
} answers;

static void on_answer(void *ud, const zmq_msg_t *route, const Psnet__Header *req, Chunk **chunks, int status,
                      const char *reason, uint64_t arrived) {
        (void) ud, (void) route, (void) req, (void) chunks, (void) arrived;
        if (status == ST_OK)
                answers.ok++;
        else
                answers.refused++;
        answers.last_status = status;
        snprintf(answers.last_reason, sizeof answers.last_reason, "%s", reason ? reason : "");
}

/* A PULL of key (t,k) as the gate gets it: unpacked, owned by the caller. */
static Psnet__Header *pull_hdr(const Job *job, uint32_t worker, int64_t clock, uint32_t t, uint32_t kk) {
        Psnet__Header h;
        Psnet__Key k, *kp[1];
        push_hdr(&h, &k, kp, job, worker, clock, t, kk);
        h.type = PSNET__MSG_TYPE__MSG_PULL;
        size_t n = psnet__header__get_packed_size(&h);
        uint8_t *buf = malloc(n);
        if (!buf)
                return NULL;
        psnet__header__pack(&h, buf);
        Psnet__Header *u = psnet__header__unpack(NULL, n, buf);
        free(buf);
        return u;
}

/* gate_pull as psd calls it; returns the status (0: answered or parked). */
static int pull(Gate *s, const Job *job, uint32_t worker, int64_t clock, uint64_t now, char *reason) {
        zmq_msg_t route;
        route_msg(&route, worker);
        Psnet__Header *h = pull_hdr(job, worker, clock, 0, 0);
        Chunk *c[1] = { key(s, 0, 0) };
        int st = gate_pull(s, &route, &h, c, now, reason, 192);
        if (h)
                psnet__header__free_unpacked(h, NULL); /* not parked: still ours */
        zmq_msg_close(&route);
        return st;
}

static void set_clock(Store *s, Chunk *c, void *ud) {
        (void) s;
        c->clock = *(const int64_t *) ud;
}

/* A key that moved here at clock 40, a worker whose pushes have not reached
 * this shard yet (its push was answered MIGRATING just before the key came):
 * its pull for clock 41 is within reach of the key, not "far ahead". */
static void test_pull_of_moved_key(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t members[] = { 1, 2 };
        char reason[192];
        int64_t at = 40;
        make_job(&job, 1, MODE_BSP, "sgd");
        ShardMap *map = make_map(1, (uint32_t[]) { 1 }, 1, &job);
        const GateHooks gh = { .ack = on_ack, .answer = on_answer, .ud = &acks };
        Gate *s = open_shard(1, &job, map, &gh);
        if (!s || gate_set_members(s, members, 2, 1) < 0) {
                CHECK(false, "store for the moved-key pull");
                shardmap_free(map);
                shard_free(s);
                return;
        }
        shardmap_free(map);
        store_foreach(gate_store(s), set_clock, &at);
        memset(&answers, 0, sizeof answers);
        int st = pull(s, &job, 2, 41, 1000, reason);
        CHECK(st == 0 && s->nparked == 1, "a pull of clock 41 for keys at clock 40 waits (status %d %s)", st,
              st ? reason : "");
        st = pull(s, &job, 2, 45, 1000, reason);
        CHECK(st == ST_INVALID && strstr(reason, "clocks ahead"), "clock 45 is still too far (%s)", reason);
        shard_free(s);
}

static void test_parked_pulls(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t members[] = { 1, 2 };
        char reason[192];
        make_job(&job, 1, MODE_BSP, "sgd");
        ShardMap *map = make_map(1, (uint32_t[]) { 1 }, 1, &job);
        const GateHooks gh = { .ack = on_ack, .answer = on_answer, .ud = &acks };
        Gate *s = open_shard(1, &job, map, &gh);
        if (!s || gate_set_members(s, members, 2, 1) < 0) {
                CHECK(false, "store for the pull tests");
                shardmap_free(map);
                shard_free(s);
                return;
        }
        shardmap_free(map);
        memset(&answers, 0, sizeof answers);
        CHECK(pull(s, &job, 1, 0, 1000, reason) == 0 && answers.ok == 1, "a pull of clock 0 is answered at once");
        CHECK(pull(s, &job, 1, 1, 1000, reason) == 0 && answers.ok == 1 && s->nparked == 1,
              "a pull of clock 1 waits (parked)");
        int st = pull(s, &job, 1, 5, 1000, reason);
        CHECK(st == ST_INVALID && strstr(reason, "clocks ahead"), "a pull far ahead of its worker is refused (%s)",
              reason);
        st = pull(s, &job, 9, 1, 1000, reason);
        CHECK(st == PSNET__STATUS__STATUS_DENIED && strstr(reason, "not a member"),
              "a non-member may not wait (%s)", reason);
        const size_t per = GATE_PARKED_PER_WORKER;
        for (size_t i = 1; i < per; i++)
                (void) pull(s, &job, 1, 1, 1000, reason);
        CHECK(s->nparked == per, "worker 1 has %zu pulls waiting", per);
        st = pull(s, &job, 1, 1, 1000, reason);
        CHECK(st == PSNET__STATUS__STATUS_RESOURCE && strstr(reason, "too many pulls waiting") &&
              s->nparked == per, "one more is refused (%s)", reason);
        s->limits.max_parked = per + 1;
        CHECK(pull(s, &job, 2, 1, 2000, reason) == 0 && s->nparked == per + 1, "worker 2 parks one");
        st = pull(s, &job, 2, 1, 2000, reason);
        CHECK(st == PSNET__STATUS__STATUS_RESOURCE, "the total bound holds too");

        /* Clock 0 closes: every parked pull of clock 1 is answered. */
        uint32_t len = job_chunk_len(&job, 0, 0);
        float *g = fbuf(len);
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, len, w, 0);
                push1(s, key(s, 0, 0), w, 0, 100 + w, g);
        }
        gate_wake(s);
        CHECK(answers.ok == (int) per + 2 && s->nparked == 0,
              "clock 0 closed: the %zu parked pulls are answered (%d)", per + 1, answers.ok - 1);

        /* Expiry: a pull parked longer than the time-out is refused. */
        CHECK(pull(s, &job, 1, 2, 10000, reason) == 0 && s->nparked == 1, "a pull of clock 2 waits");
        gate_expire(s, 10000 + s->limits.park_timeout_ms - 1);
        CHECK(s->nparked == 1, "not yet expired");
        gate_expire(s, 10000 + s->limits.park_timeout_ms);
        CHECK(s->nparked == 0 && answers.last_status == PSNET__STATUS__STATUS_RESOURCE &&
              strstr(answers.last_reason, "waited"), "expired and refused (%s)", answers.last_reason);
        free(g);
        shard_free(s);
}

static void test_stragglers(void) {
        Job job;
        Acks acks = { 0 };
        uint32_t members[] = { 1, 2, 3 }, ids[8];
        make_job(&job, 1, MODE_BSP, "sgd");
        Gate *s = open_solo(&job, &acks, members, 3);
        if (!s)
                return;
        uint64_t ms = 1;
        CHECK(gate_stragglers(s, 0, ids, 8, &ms) == 0 && ms == 0, "nobody waits: no stragglers");
        uint32_t len = job_chunk_len(&job, 0, 0);
        float *g = fbuf(len);
        for (uint32_t w = 1; w <= 2; w++) {
                grad_fill(g, len, w, 0);
                push1(s, key(s, 0, 0), w, 0, w, g);
        }
        size_t n = gate_stragglers(s, key(s, 0, 0)->pending_since + 1500, ids, 8, &ms);
        CHECK(n == 1 && ids[0] == 3 && ms == 1500, "workers 1 and 2 wait on worker 3 for 1.5 s (%zu, %lu ms)", n,
              (unsigned long) ms);
        free(g);
        shard_free(s);
}

int main(void) {
        test_bsp_order();
        test_bsp_dedupe();
        test_bsp_non_member();
        test_membership_shrink();
        test_bsp_unaligned();
        test_asp();
        test_multi_key();
        test_lr_scaling();
        test_lr_schedule();
        test_ssp_gate();
        test_push_in_parts();
        test_fence_boundary();
        test_admission();
        test_parked_pulls();
        test_pull_of_moved_key();
        test_stragglers();
        return tap_done();
}
