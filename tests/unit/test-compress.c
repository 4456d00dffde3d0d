/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/compress.c: each codec's round trip within its
 * stated error, top-k keeping exactly the largest values, error feedback
 * losing nothing over rounds, and the decoder refusing frames that cannot
 * be (sizes, indices, NaN). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "compress.h"
#include "tap.h"

#define LEN 1000

static int cmp_desc(const void *a, const void *b) {
        float x = *(const float *) a, y = *(const float *) b;
        return x > y ? -1 : x < y;
}

static float x[LEN], y[LEN], scratch[LEN], resid[LEN];
static uint8_t buf[LEN * 8];

static float draw(uint64_t *s) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        return (float) ((double) (*s >> 11) * 0x1p-53 - 0.5) * 2.0f;
}

int main(void) {
        uint64_t s = 7;
        for (int i = 0; i < LEN; i++)
                x[i] = draw(&s) * (i % 7 == 0 ? 10.0f : 0.1f);
        CompressKind k;
        float f;
        CHECK(compress_from_string("topk:0.05", &k, &f) == 0 && k == COMPRESS_TOPK && f == 0.05f, "topk:0.05 parses");
        CHECK(compress_from_string("topk:0", &k, &f) == -EINVAL && compress_from_string("topk:1.5", &k, &f) == -EINVAL &&
              compress_from_string("gzip", &k, &f) == -EINVAL, "topk:0, topk:1.5 and gzip are refused");

        /* bf16: 8 significant bits, relative error <= 2^-8 (half a unit in the last place). */
        size_t n = compress_encode(COMPRESS_BF16, x, LEN, 0, NULL, buf, scratch);
        double worst = 0;
        CHECK(n == LEN * 2 && compress_decode(COMPRESS_BF16, buf, n, LEN, y) == 0, "bf16: 2 bytes a value");
        for (int i = 0; i < LEN; i++)
                worst = fmax(worst, fabs(y[i] - x[i]) / fabs(x[i]));
        CHECK(worst <= 0x1p-8, "bf16: relative error %.3g <= 2^-8", worst);

        /* bf16_encode/decode against a reference in double arithmetic: every
         * 4099th bit pattern (all exponents, both signs, odd and even
         * mantissas, ties), at an odd byte offset. Nearest bf16, ties to
         * even; NaN stays NaN; infinities and overflow to infinity kept. */
        {
                enum { N = 4096 };
                static float in[N], back[N];
                static uint8_t wire[2 * N + 1];
                bool same = true, exact = true;
                uint64_t tried = 0;
                for (uint64_t base = 0; base < (1ull << 32) && same && exact; base += 4099ull * N) {
                        for (int i = 0; i < N; i++) {
                                uint32_t u = (uint32_t) (base + 4099ull * (uint64_t) i);
                                memcpy(&in[i], &u, sizeof u);
                        }
                        bf16_encode(in, N, wire + 1);
                        bf16_decode(wire + 1, N, back);
                        for (int i = 0; i < N; i++, tried++) {
                                uint32_t u, got;
                                memcpy(&u, &in[i], sizeof u);
                                memcpy(&got, &back[i], sizeof got);
                                exact = exact && (got & 0xffffu) == 0 &&
                                        got >> 16 == (uint32_t) (wire[1 + 2 * i] | wire[2 + 2 * i] << 8);
                                if (isnan(in[i])) {
                                        same = same && isnan(back[i]);
                                        continue;
                                }
                                /* The two bf16 neighbours of x, and which is nearer (ties: even). */
                                uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
                                float flo, fhi;
                                memcpy(&flo, &lo, sizeof lo);
                                memcpy(&fhi, &hi, sizeof hi);
                                double dlo = fabs((double) in[i] - (double) flo);
                                double dhi = isinf(fhi) ? INFINITY : fabs((double) fhi - (double) in[i]);
                                if ((u & 0x7fffffffu) >= 0x7f7f8000u && (u & 0x7fffffffu) < 0x7f800000u)
                                        dhi = 0; /* half way to the top bf16 and past it: infinity */
                                uint32_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1u) ? hi : lo;
                                same = same && got == want;
                        }
                }
                CHECK(same && exact && tried > 1000000,
                      "bf16_encode/decode: nearest, ties to even, NaN kept, over %lu bit patterns",
                      (unsigned long) tried);
        }

        /* int8: |error| <= scale / 2, scale = max|x| / 127. */
        n = compress_encode(COMPRESS_INT8, x, LEN, 0, NULL, buf, scratch);
        float m = 0, sc;
        for (int i = 0; i < LEN; i++)
                m = fmaxf(m, fabsf(x[i]));
        memcpy(&sc, buf, 4);
        worst = 0;
        CHECK(n == LEN + 4 && compress_decode(COMPRESS_INT8, buf, n, LEN, y) == 0 && sc == m / 127.0f,
              "int8: a scale and a byte a value (scale %g = max %g / 127)", (double) sc, (double) m);
        for (int i = 0; i < LEN; i++)
                worst = fmax(worst, fabs(y[i] - x[i]));
        CHECK(worst <= sc / 2 * (1 + 1e-6), "int8: error %.3g <= scale / 2", worst);
        float zeros[4] = { 0 };
        n = compress_encode(COMPRESS_INT8, zeros, 4, 0, NULL, buf, scratch);
        CHECK(compress_decode(COMPRESS_INT8, buf, n, 4, y) == 0 && y[0] == 0 && y[3] == 0, "int8: all zeros");

        /* top-k: the k largest |x| in index order, the rest 0. */
        uint32_t want = compress_topk_count(LEN, 0.05f);
        n = compress_encode(COMPRESS_TOPK, x, LEN, 0.05f, NULL, buf, scratch);
        CHECK(want == 50 && n == want * 8 && compress_decode(COMPRESS_TOPK, buf, n, LEN, y) == 0,
              "topk:0.05 of 1000 values sends 50 pairs (%zu bytes)", n);
        size_t kept = 0;
        float minkept = INFINITY, maxdropped = 0;
        for (int i = 0; i < LEN; i++) {
                if (y[i] != 0) {
                        kept++;
                        minkept = fminf(minkept, fabsf(x[i]));
                        if (y[i] != x[i])
                                minkept = -1;
                } else
                        maxdropped = fmaxf(maxdropped, fabsf(x[i]));
        }
        CHECK(kept == want && minkept >= maxdropped, "topk keeps exactly the %u largest, as they are (smallest kept "
              "%g >= largest dropped %g)", want, (double) minkept, (double) maxdropped);
        float same[100];
        for (int i = 0; i < 100; i++)
                same[i] = 1.0f;
        n = compress_encode(COMPRESS_TOPK, same, 100, 0.1f, NULL, buf, scratch);
        CHECK(n == 10 * 8 && compress_decode(COMPRESS_TOPK, buf, n, 100, y) == 0, "topk with all values tied sends k");
        float *big = calloc(262144, sizeof *big), *bs = malloc(262144 * sizeof *bs);
        uint8_t *bb = malloc(compress_bound(COMPRESS_TOPK, 262144, 0.01f));
        if (big && bs && bb) {
                big[12345] = 3;
                n = compress_encode(COMPRESS_TOPK, big, 262144, 0.01f, NULL, bb, bs);
                CHECK(n == compress_topk_count(262144, 0.01f) * 8 && bb[0] == 0 && bb[8] == 1,
                      "topk of a chunk of zeros with one value (a run of equal values) is quick and sends k pairs");
        }
        free(big), free(bs), free(bb);
        /* Against a reference (sorting), 300 random chunks: lengths 1..2999, a
         * share of them, values from a few magnitudes (ties, zeros, subnormals,
         * both signs): exactly the k largest |x|, ties at the k-th kept in index
         * order. */
        {
                static float rx[3000], ry[3000], rs[3000], sorted[3000];
                static uint8_t rb[3000 * 8];
                static const float mags[] = { 0.0f, 1e-40f, 1e-3f, 0.5f, 0.5f, 1.0f, 2.0f, 1e30f };
                unsigned seed = 12345, bad = 0;
                for (int trial = 0; trial < 300 && !bad; trial++) {
                        seed = seed * 1103515245u + 12345u;
                        uint32_t len = 1 + (seed >> 8) % 2999;
                        float f = (float) (1 + (seed >> 4) % 1000) / 1000.0f;
                        for (uint32_t i = 0; i < len; i++) {
                                seed = seed * 1103515245u + 12345u;
                                float m = (seed >> 9) % 4 ? mags[(seed >> 13) % 8] : (float) ((seed >> 16) % 1000) / 7.0f;
                                rx[i] = (seed >> 30) & 1 ? -m : m;
                                sorted[i] = fabsf(rx[i]);
                        }
                        uint32_t k = compress_topk_count(len, f);
                        qsort(sorted, len, sizeof *sorted, cmp_desc);
                        float t = sorted[k - 1];
                        uint32_t above = 0;
                        for (uint32_t i = 0; i < len; i++)
                                above += fabsf(rx[i]) > t;
                        size_t bytes = compress_encode(COMPRESS_TOPK, rx, len, f, NULL, rb, rs);
                        if (bytes != (size_t) k * 8 || compress_decode(COMPRESS_TOPK, rb, bytes, len, ry) != 0) {
                                bad = 1;
                                break;
                        }
                        uint32_t ties = k - above;
                        for (uint32_t i = 0; i < len; i++) {
                                float a = fabsf(rx[i]);
                                bool keep = a > t || (a == t && ties > 0 && ties--);
                                /* a kept zero decodes as 0 as well */
                                if ((keep ? ry[i] != rx[i] : ry[i] != 0.0f))
                                        bad = 1;
                        }
                }
                CHECK(!bad, "topk matches a sorting reference on 300 random chunks with ties, zeros and subnormals");
        }

        /* Error feedback: over R rounds, what went plus what is held = what came. */
        memset(resid, 0, sizeof resid);
        double sent[LEN] = { 0 };
        for (int r = 0; r < 20; r++) {
                n = compress_encode(COMPRESS_TOPK, x, LEN, 0.05f, resid, buf, scratch);
                compress_decode(COMPRESS_TOPK, buf, n, LEN, y);
                for (int i = 0; i < LEN; i++)
                        sent[i] += y[i];
        }
        worst = 0;
        for (int i = 0; i < LEN; i++)
                worst = fmax(worst, fabs(sent[i] + resid[i] - 20.0 * x[i]) / 20.0);
        CHECK(worst < 1e-5, "error feedback: 20 rounds sent + held = 20 x the update (worst %.3g)", worst);
        size_t nz = 0;
        for (int i = 0; i < LEN; i++)
                nz += sent[i] != 0;
        CHECK(nz > 2 * want, "and the small values get their turn (%zu of %d values sent at least once)", nz, LEN);

        /* What the decoder refuses. */
        uint8_t t[24];
        uint32_t i0 = 5, i1 = 5, big_i = LEN;
        float v = 1, nan = NAN;
        memcpy(t, &i0, 4), memcpy(t + 4, &v, 4), memcpy(t + 8, &i1, 4), memcpy(t + 12, &v, 4);
        CHECK(compress_decode(COMPRESS_TOPK, t, 16, LEN, y) == -EINVAL, "topk: indices not ascending");
        memcpy(t, &big_i, 4);
        CHECK(compress_decode(COMPRESS_TOPK, t, 8, LEN, y) == -EINVAL, "topk: an index past the chunk");
        memcpy(t, &i0, 4), memcpy(t + 4, &nan, 4);
        CHECK(compress_decode(COMPRESS_TOPK, t, 8, LEN, y) == -ERANGE, "topk: a NaN value");
        CHECK(compress_decode(COMPRESS_TOPK, t, 12, LEN, y) == -EMSGSIZE &&
              compress_decode(COMPRESS_TOPK, t, 24, 2, y) == -EMSGSIZE && compress_decode(COMPRESS_TOPK, t, 0, 2, y) ==
              -EMSGSIZE, "topk: a size not in pairs, more pairs than values, or none");
        memcpy(t, &nan, 4);
        CHECK(compress_decode(COMPRESS_INT8, t, 8, 4, y) == -ERANGE, "int8: a NaN scale");
        CHECK(compress_decode(COMPRESS_INT8, t, 7, 4, y) == -EMSGSIZE && compress_decode(COMPRESS_BF16, t, 7, 4, y) ==
              -EMSGSIZE, "int8 and bf16: a wrong size");
        uint16_t hn = 0x7fc0;
        memcpy(t, &hn, 2);
        CHECK(compress_decode(COMPRESS_BF16, t, 2, 1, y) == -ERANGE, "bf16: a NaN");
        return tap_done();
}
