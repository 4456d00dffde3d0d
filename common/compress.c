/* SPDX-License-Identifier: Apache-2.0 */
/* Uplink compression of a federated update; see compress.h. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "compress.h"

int compress_from_string(const char *s, CompressKind *ret_kind, float *ret_topk) {
        if (!s)
                return -EINVAL;
        *ret_topk = 0;
        if (strcmp(s, "none") == 0)
                *ret_kind = COMPRESS_NONE;
        else if (strcmp(s, "bf16") == 0)
                *ret_kind = COMPRESS_BF16;
        else if (strcmp(s, "int8") == 0)
                *ret_kind = COMPRESS_INT8;
        else if (strncmp(s, "topk:", 5) == 0) {
                char *end;
                float f = strtof(s + 5, &end);
                if (end == s + 5 || *end || !(f > 0 && f <= 1))
                        return -EINVAL;
                *ret_kind = COMPRESS_TOPK;
                *ret_topk = f;
        } else
                return -EINVAL;
        return 0;
}

const char *compress_name(CompressKind kind) {
        static const char *const names[] = { "none", "bf16", "int8", "topk" };
        return kind <= COMPRESS_TOPK ? names[kind] : "?";
}

uint32_t compress_topk_count(uint32_t len, float topk) {
        /* F is a float: 0.05f x 1000 is 50.0000007, which means 50. */
        double p = (double) topk * (double) len, r = nearbyint(p);
        double k = fabs(p - r) <= 1e-6 * fmax(p, 1.0) ? r : ceil(p);
        if (k < 1)
                k = 1;
        return k > len ? len : (uint32_t) k;
}

size_t compress_bound(CompressKind kind, uint32_t len, float topk) {
        switch (kind) {
        case COMPRESS_BF16:
                return (size_t) len * 2;
        case COMPRESS_INT8:
                return 4 + (size_t) len;
        case COMPRESS_TOPK:
                return (size_t) compress_topk_count(len, topk) * 8;
        default:
                return (size_t) len * 4;
        }
}

static void put32(uint8_t *p, uint32_t v) {
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint32_t fbits(float x) {
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        return u;
}

static float bitsf(uint32_t u) {
        float x;
        memcpy(&x, &u, sizeof x);
        return x;
}

static uint16_t to_bf16(float x) {
        uint32_t u = fbits(x);
        if ((u & 0x7fffffffu) > 0x7f800000u)
                return (uint16_t) ((u >> 16) | 0x40); /* NaN stays NaN */
        u += 0x7fffu + ((u >> 16) & 1u);           /* round to nearest even */
        return (uint16_t) (u >> 16);
}

/* GCC vectorises these loops only when asked (-O2 does not). */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORISE __attribute__((optimize("tree-vectorize")))
#else
#define VECTORISE
#endif

VECTORISE void bf16_encode(const float *x, size_t n, uint8_t *out) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* Whole words in and out (memcpy: any alignment), which the compiler
         * turns into vector code: 2.9 -> 4.3 GB/s of f32 on this VM. */
        for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &x[i], sizeof u);
                uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
                uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t) ((u >> 16) | 0x40) : (uint16_t) (r >> 16);
                memcpy(out + 2 * i, &h, sizeof h);
        }
#else
        for (size_t i = 0; i < n; i++) {
                uint16_t h = to_bf16(x[i]);
                out[2 * i] = (uint8_t) h;
                out[2 * i + 1] = (uint8_t) (h >> 8);
        }
#endif
}

VECTORISE void bf16_decode(const uint8_t *in, size_t n, float *out) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        for (size_t i = 0; i < n; i++) {
                uint16_t h;
                memcpy(&h, in + 2 * i, sizeof h);
                uint32_t u = (uint32_t) h << 16;
                memcpy(&out[i], &u, sizeof u);
        }
#else
        for (size_t i = 0; i < n; i++)
                out[i] = bitsf((uint32_t) (in[2 * i] | in[2 * i + 1] << 8) << 16);
#endif
}

/* The k-th largest of v[0..n) (1 <= k <= n), all >= 0: a radix select on
 * their bits, which order as the values do. Three passes over v (11, 11 and
 * 10 bits), each counting the values whose higher bits are the k-th
 * largest's so far into a histogram of the next digit; no data moves, no
 * branch depends on the order of the values. (A quickselect took 70 ms for a
 * 64 MiB model's chunks on this project's 2 vCPU machine, sorting cost more
 * than the bytes saved.) */
static float kth_largest(const float *v, size_t n, size_t k) {
        static const unsigned shift[3] = { 21, 10, 0 }, width[3] = { 11, 11, 10 };
        uint32_t hist[2048], prefix = 0, mask = 0;
        for (int d = 0; d < 3; d++) {
                uint32_t digits = 1u << width[d], dm = digits - 1;
                memset(hist, 0, digits * sizeof *hist);
                for (size_t i = 0; i < n; i++) {
                        uint32_t b = fbits(v[i]);
                        hist[(b >> shift[d]) & dm] += (b & mask) == prefix;
                }
                size_t cum = 0;
                uint32_t x = dm;
                for (;; x--) {
                        if (cum + hist[x] >= k || x == 0)
                                break;
                        cum += hist[x];
                }
                k -= cum;
                prefix |= x << shift[d];
                mask |= dm << shift[d];
        }
        return bitsf(prefix);
}

size_t compress_encode(CompressKind kind, const float *x, uint32_t len, float topk, float *residual, uint8_t *out,
                       float *scratch) {
        /* With a residual, x + residual is what goes, and residual keeps its loss. */
#define IN(i) (residual ? x[i] + residual[i] : x[i])
        if (kind == COMPRESS_BF16 && !residual) {
                bf16_encode(x, len, out);
                return (size_t) len * 2;
        }
        if (kind == COMPRESS_BF16) {
                for (uint32_t i = 0; i < len; i++) {
                        float v = IN(i);
                        uint16_t h = to_bf16(v);
                        out[2 * i] = (uint8_t) h;
                        out[2 * i + 1] = (uint8_t) (h >> 8);
                        if (residual)
                                residual[i] = v - bitsf((uint32_t) h << 16);
                }
                return (size_t) len * 2;
        }
        if (kind == COMPRESS_INT8) {
                float m = 0;
                for (uint32_t i = 0; i < len; i++)
                        m = fmaxf(m, fabsf(IN(i)));
                float s = m / 127.0f;
                put32(out, fbits(s));
                for (uint32_t i = 0; i < len; i++) {
                        float v = IN(i);
                        long q = s > 0 ? lrintf(v / s) : 0;
                        q = q > 127 ? 127 : q < -127 ? -127 : q;
                        out[4 + i] = (uint8_t) (int8_t) q;
                        if (residual)
                                residual[i] = v - (float) q * s;
                }
                return 4 + (size_t) len;
        }
        if (kind == COMPRESS_TOPK) {
                /* One pass makes x + residual (in residual) and its magnitudes
                 * (in scratch); the selection and the count run over scratch,
                 * one chunk, in cache; one more pass writes out what goes. */
                uint32_t k = compress_topk_count(len, topk);
                const float *v = x;
                if (residual) {
                        for (uint32_t i = 0; i < len; i++) {
                                residual[i] += x[i];
                                scratch[i] = fabsf(residual[i]);
                        }
                        v = residual;
                } else
                        for (uint32_t i = 0; i < len; i++)
                                scratch[i] = fabsf(x[i]);
                float t = kth_largest(scratch, len, k);
                /* Every value above the k-th largest, then ties at it up to k, in index order. */
                uint32_t above = 0, n = 0;
                for (uint32_t i = 0; i < len; i++)
                        above += scratch[i] > t;
                uint32_t ties = k - above;
                for (uint32_t i = 0; i < len; i++) {
                        float a = scratch[i];
                        bool keep = a > t;
                        if (!keep && a == t && ties > 0) {
                                keep = true;
                                ties--;
                        }
                        if (keep && n < k) {
                                put32(out + 8 * (size_t) n, i);
                                put32(out + 8 * (size_t) n + 4, fbits(v[i]));
                                n++;
                        }
                        if (residual && keep)
                                residual[i] = 0.0f;
                }
                return (size_t) n * 8;
        }
        for (uint32_t i = 0; i < len; i++) {
                put32(out + 4 * (size_t) i, fbits(IN(i)));
                if (residual)
                        residual[i] = 0;
        }
        return (size_t) len * 4;
#undef IN
}

int compress_size_ok(CompressKind kind, size_t n, uint32_t len) {
        switch (kind) {
        case COMPRESS_BF16:
                return n == (size_t) len * 2;
        case COMPRESS_INT8:
                return n == 4 + (size_t) len;
        case COMPRESS_TOPK:
                return n > 0 && n % 8 == 0 && n / 8 <= len;
        default:
                return n == (size_t) len * 4;
        }
}

int compress_decode(CompressKind kind, const uint8_t *in, size_t n, uint32_t len, float *out) {
        if (!compress_size_ok(kind, n, len))
                return -EMSGSIZE;
        if (kind == COMPRESS_BF16) {
                bf16_decode(in, len, out);
                for (uint32_t i = 0; i < len; i++)
                        if (!isfinite(out[i]))
                                return -ERANGE;
                return 0;
        }
        if (kind == COMPRESS_INT8) {
                float s = bitsf(get32(in));
                if (!isfinite(s) || s < 0)
                        return -ERANGE;
                for (uint32_t i = 0; i < len; i++)
                        out[i] = (float) (int8_t) in[4 + i] * s;
                return 0;
        }
        if (kind == COMPRESS_TOPK) {
                memset(out, 0, (size_t) len * sizeof *out);
                uint32_t prev = 0;
                for (size_t j = 0; j < n / 8; j++) {
                        uint32_t i = get32(in + 8 * j);
                        float v = bitsf(get32(in + 8 * j + 4));
                        if (i >= len || (j > 0 && i <= prev))
                                return -EINVAL;
                        if (!isfinite(v))
                                return -ERANGE;
                        out[i] = v;
                        prev = i;
                }
                return 0;
        }
        for (uint32_t i = 0; i < len; i++) {
                out[i] = bitsf(get32(in + 4 * (size_t) i));
                if (!isfinite(out[i]))
                        return -ERANGE;
        }
        return 0;
}
