/* SPDX-License-Identifier: Apache-2.0 */
/* Uplink compression of a federated update (--compress): how an edge worker
 * encodes each chunk of its delta and how the shard decodes it back to f32
 * before aggregating (issue "Federated edge workers"). One frame per chunk of
 * len values:
 *   BF16  len x 2 bytes: the top half of each f32, rounded to nearest even
 *   INT8  a f32 scale s (little-endian) then len int8 q: x ~ q s, s = max|x| / 127
 *   TOPK  k x (u32 index, f32 value), indices ascending: the k = ceil(F len)
 *         largest |x|; the rest are 0
 * Lossy codecs keep what they dropped on the client (error feedback, Seide et
 * al. 2014; Stich et al. 2018): the next update adds it back before encoding,
 * so over rounds nothing is lost for good. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { COMPRESS_NONE, COMPRESS_BF16, COMPRESS_INT8, COMPRESS_TOPK } CompressKind;

/* "none", "bf16", "int8", "topk:F" with F in (0, 1] (-EINVAL otherwise). */
int compress_from_string(const char *s, CompressKind *ret_kind, float *ret_topk);
/* "none", "bf16", "int8", "topk" */
const char *compress_name(CompressKind kind);
/* The values TOPK keeps of len: max(1, ceil(topk len)), at most len. */
uint32_t compress_topk_count(uint32_t len, float topk);
/* The most bytes one chunk of len values encodes to. */
size_t compress_bound(CompressKind kind, uint32_t len, float topk);
/* Encodes x (len values) into out (compress_bound bytes) and returns the
 * bytes written. residual (len floats, or NULL): added to x first, and left
 * holding what the encoding lost. scratch: len floats (TOPK). */
size_t compress_encode(CompressKind kind, const float *x, uint32_t len, float topk, float *residual, uint8_t *out,
                       float *scratch);
/* Decodes a frame of n bytes (at any alignment) into len floats: -EMSGSIZE
 * for a size the codec cannot have, -EINVAL for an index out of order or
 * range, -ERANGE for a value (or scale) that is not finite. */
int compress_decode(CompressKind kind, const uint8_t *in, size_t n, uint32_t len, float *out);
/* bf16 on the wire (a training job's --wire bf16, and BF16 above): n values
 * as the top half of each f32, rounded to nearest even (NaN stays NaN),
 * little-endian, at any alignment; and back, exactly (no check of the values). */
void bf16_encode(const float *x, size_t n, uint8_t *out);
void bf16_decode(const uint8_t *in, size_t n, float *out);
/* Whether n bytes can be a frame of len values (TOPK: any count up to len). */
int compress_size_ok(CompressKind kind, size_t n, uint32_t len);
