/* SPDX-License-Identifier: Apache-2.0 */
/* Denormal floats flushed to zero within a scope, on the calling thread.
 *
 * A unit that stops learning (a dead ReLU's weights, a filter no input
 * reaches) gets a gradient of exactly 0 at every step, and its optimizer
 * state decays: momentum's v and Adam's m are multiplied by 0.9 a step and
 * enter the denormal range (below 1.2e-38) after about 800 steps. They never
 * leave it: 0.9 times the smallest denormal rounds back to itself. The CPU
 * then takes a slow path (a microcode assist) for every operation that reads
 * or writes such a value: with 40% of the values so, an Adam step took 2.2x
 * the time of a live one on the AMD EPYC of our VM (bench-apply --dead 0.4),
 * and many Intel cores charge far more. The built-in CNN holds 38-43% of its
 * Adam first moments at that value from step 900 on (PyTorch's Adam, the same
 * model: tests/bench/torch_denormals.py, docs/bench-log.md). Flushing them
 * costs nothing a model could see: a value under 1.2e-38 becomes 0.
 *
 *   _cleanup_(fpflush_end) _unused_ FpFlush fz = fpflush_begin();
 *
 * sets flush-to-zero and denormals-are-zero (x86-64: MXCSR's FTZ and DAZ;
 * aarch64: FPCR's FZ) and puts the caller's mode back when fz goes out of
 * scope (_unused_: clang counts a variable read only by its cleanup as
 * unused). Elsewhere both do nothing. The mode is per thread: a loop cut over a
 * pool's threads takes it in each range (psd-optim.c). */
#pragma once
#include <stdint.h>
#include "macro.h"
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#endif

typedef struct FpFlush {
        uint64_t saved;
} FpFlush;

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
#define FPFLUSH_BITS 0x8040u /* MXCSR: FTZ (bit 15) and DAZ (bit 6) */
static inline uint64_t fpflush_get(void) { return _mm_getcsr(); }
static inline void fpflush_set(uint64_t m) { _mm_setcsr((unsigned) m); }
#elif defined(__aarch64__)
#define FPFLUSH_BITS (1u << 24) /* FPCR: FZ */
static inline uint64_t fpflush_get(void) {
        uint64_t m;
        __asm__ __volatile__("mrs %0, fpcr" : "=r"(m));
        return m;
}
static inline void fpflush_set(uint64_t m) { __asm__ __volatile__("msr fpcr, %0" : : "r"(m)); }
#else
#define FPFLUSH_BITS 0u
static inline uint64_t fpflush_get(void) { return 0; }
static inline void fpflush_set(uint64_t m) { (void) m; }
#endif

static inline FpFlush fpflush_begin(void) {
        FpFlush f = { .saved = fpflush_get() };
        if ((f.saved & FPFLUSH_BITS) != FPFLUSH_BITS)
                fpflush_set(f.saved | FPFLUSH_BITS);
        return f;
}

static inline void fpflush_end(FpFlush *f) {
        if ((f->saved & FPFLUSH_BITS) != FPFLUSH_BITS)
                fpflush_set(f->saved);
}
