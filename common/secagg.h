/* SPDX-License-Identifier: Apache-2.0 */
/* Secure aggregation of a federated round (Bonawitz et al., "Practical
 * Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017): the
 * pieces the edge workers, pscoord and the shards share. The round's flow
 * lives in ps/pscoord/coord-fed.c (the "server" of the paper: it routes keys
 * and sealed shares and recovers the seeds), worker/workerd/edge.c (the
 * clients) and ps/psd/psd-fedround.c (the shards: they sum and unmask).
 *
 * Each client u of a round has two X25519 key pairs, one whose agreement
 * with a peer v seals the shares sent to v (crypto_box), one whose agreement
 * gives the pairwise mask seed s_uv, and a random self-mask seed b_u. It
 * sends, per coordinate j of tensor t,
 *   y_u = q_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)   (mod 2^32)
 * where q_u is its update quantised to a signed integer (below) and PRG is
 * XChaCha20's key stream under the seed, with the round number and t in its
 * nonce and j as its position: any shard computes the masks of its own
 * chunks alone. The pairwise masks cancel in the sum over the clients that
 * stayed; the self masks are removed with the b_u that the survivors reveal
 * (Shamir shares, threshold t); the pairwise masks of a client that dropped
 * after the shares went out are removed with its mask key, also rebuilt from
 * shares. No one is ever given both b_u and u's mask key, so what a shard
 * holds of one client is uniformly random to it.
 *
 * Quantisation: with W the weight of the clients that may send (the sum of
 * their example counts, or their number for an unweighted round) and B the
 * clipping range, S = (2^31 - 1) / (W B) and client u sends
 *   q_u = round(clamp(d, -B, B) n_u S)
 * for each coordinate d of its delta (n_u its weight). However many send,
 * |sum q_u| < 2^31, so the sum read as int32 is exact, and sum q_u / (S W')
 * (W' the weight of those counted) differs from the weighted mean of the
 * clamped deltas by at most (clients / 2) / (S W') <= clients B / 2^32 per
 * coordinate. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SECAGG_KEY 32u
/* Shamir's shares are over GF(2^8) (libgfshare): x = 1..255. */
#define SECAGG_MAX_CLIENTS 255u
/* One sealed pair of shares: nonce, MAC, (from, to, round, two shares). */
#define SECAGG_PLAIN (4u + 4u + 8u + 2u * SECAGG_KEY)
#define SECAGG_BOX (24u + 16u + SECAGG_PLAIN)
#define SECAGG_DEFAULT_CLIP 8.0f
#define SECAGG_DEFAULT_THRESHOLD 0.5f
#define SECAGG_DEFAULT_TIMEOUT_MS 10000u

typedef struct SecAggKeys {
        uint8_t share_pk[SECAGG_KEY], share_sk[SECAGG_KEY]; /* seals the shares */
        uint8_t mask_pk[SECAGG_KEY], mask_sk[SECAGG_KEY];   /* pairwise mask seeds */
        uint8_t self_seed[SECAGG_KEY];                      /* b_u */
} SecAggKeys;

/* libsodium, and libgfshare's random source set to libsodium's CSPRNG
 * (libgfshare also draws from it to wipe its buffers; the functions below
 * call this first). 0 or -EIO. Safe to call again. */
int secagg_init(void);
/* A client's fresh keys for one round. */
int secagg_keys_new(SecAggKeys *k);
/* Shares needed to rebuild a seed among n clients: max(2, ceil(frac n)). */
uint32_t secagg_threshold(size_t n, float frac);
/* S for weight w and range clip (both > 0). */
double secagg_scale(uint64_t weight, float clip);
/* out[i] = round(clamp(x[i], -clip, clip) mult) as a two's-complement
 * uint32, mult = n_u S. out may be x itself. */
void secagg_quantise(const float *x, uint32_t *out, size_t n, float clip, double mult);
/* The pairwise seed of two clients (either side computes the same):
 * BLAKE2b of the X25519 agreement and both public keys, lower one first.
 * -EINVAL for a peer key that gives no agreement. */
int secagg_pair_seed(const uint8_t my_sk[SECAGG_KEY], const uint8_t my_pk[SECAGG_KEY],
                     const uint8_t peer_pk[SECAGG_KEY], uint8_t seed[SECAGG_KEY]);
/* v[i] += PRG(seed; number, tensor)[off + i] (subtract: -=), i < n. */
void secagg_mask(uint32_t *v, size_t n, uint64_t off, const uint8_t seed[SECAGG_KEY], uint64_t number,
                 uint32_t tensor, bool subtract);
/* Shamir: shares[i] is the share at x = i + 1 of secret, any t of the n
 * rebuild it. -EINVAL unless 2 <= t <= n <= 255; -ENOMEM. */
int secagg_split(const uint8_t secret[SECAGG_KEY], size_t n, uint32_t t, uint8_t (*shares)[SECAGG_KEY]);
/* The secret from k shares at the distinct x's xs (1..255); with fewer
 * than the threshold the result is garbage (the caller counts). */
int secagg_combine(const uint8_t *xs, const uint8_t (*shares)[SECAGG_KEY], size_t k, uint8_t secret[SECAGG_KEY]);
/* Seals from's two shares for to (round number) with from's share key and
 * to's public share key. */
int secagg_seal(const SecAggKeys *me, const uint8_t peer_share_pk[SECAGG_KEY], uint32_t from, uint32_t to,
                uint64_t number, const uint8_t mask_share[SECAGG_KEY], const uint8_t self_share[SECAGG_KEY],
                uint8_t box[SECAGG_BOX]);
/* Opens a box sealed for me by from: -EBADMSG when it does not
 * authenticate or names another sender, receiver or round. */
int secagg_open(const SecAggKeys *me, const uint8_t peer_share_pk[SECAGG_KEY], uint32_t from, uint32_t to,
                uint64_t number, const uint8_t *box, size_t len, uint8_t mask_share[SECAGG_KEY],
                uint8_t self_share[SECAGG_KEY]);
/* True when sk is the secret key of pk (a rebuilt mask key is checked). */
bool secagg_key_matches(const uint8_t sk[SECAGG_KEY], const uint8_t pk[SECAGG_KEY]);
