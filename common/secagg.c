/* SPDX-License-Identifier: Apache-2.0 */
/* Secure aggregation's pieces; see secagg.h. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <libgfshare.h>
#include <sodium.h>
#include "alloc.h"
#include "macro.h"
#include "secagg.h"

_Static_assert(SECAGG_BOX == crypto_box_NONCEBYTES + crypto_box_MACBYTES + SECAGG_PLAIN, "box layout");
_Static_assert(SECAGG_KEY == crypto_box_PUBLICKEYBYTES && SECAGG_KEY == crypto_scalarmult_SCALARBYTES, "X25519");

static void fill_random(unsigned char *b, unsigned int n) {
        randombytes_buf(b, n);
}

int secagg_init(void) {
        if (sodium_init() < 0)
                return -EIO;
        /* libgfshare draws the polynomials' coefficients from this (its
         * default is none). */
        gfshare_fill_rand = fill_random;
        return 0;
}

int secagg_keys_new(SecAggKeys *k) {
        int r = secagg_init();
        if (r < 0)
                return r;
        if (crypto_box_keypair(k->share_pk, k->share_sk) < 0)
                return -EIO;
        randombytes_buf(k->mask_sk, sizeof k->mask_sk);
        if (crypto_scalarmult_base(k->mask_pk, k->mask_sk) < 0)
                return -EIO;
        randombytes_buf(k->self_seed, sizeof k->self_seed);
        return 0;
}

uint32_t secagg_threshold(size_t n, float frac) {
        double t = ceil((double) frac * (double) n - 1e-9);
        if (t < 2)
                t = 2;
        return (uint32_t) t;
}

double secagg_scale(uint64_t weight, float clip) {
        return 2147483647.0 / ((double) weight * (double) clip);
}

void secagg_quantise(const float *x, uint32_t *out, size_t n, float clip, double mult) {
        for (size_t i = 0; i < n; i++) {
                float v;
                memcpy(&v, x + i, sizeof v);
                if (!(v >= -clip)) /* NaN too: the sender checked, this keeps the bound */
                        v = -clip;
                if (v > clip)
                        v = clip;
                int64_t q = llround((double) v * mult);
                uint32_t u = (uint32_t) q;
                memcpy(out + i, &u, sizeof u);
        }
}

int secagg_pair_seed(const uint8_t my_sk[SECAGG_KEY], const uint8_t my_pk[SECAGG_KEY],
                     const uint8_t peer_pk[SECAGG_KEY], uint8_t seed[SECAGG_KEY]) {
        uint8_t q[crypto_scalarmult_BYTES];
        if (crypto_scalarmult(q, my_sk, peer_pk) < 0)
                return -EINVAL;
        bool mine_first = memcmp(my_pk, peer_pk, SECAGG_KEY) < 0;
        crypto_generichash_state st;
        crypto_generichash_init(&st, NULL, 0, SECAGG_KEY);
        crypto_generichash_update(&st, q, sizeof q);
        crypto_generichash_update(&st, mine_first ? my_pk : peer_pk, SECAGG_KEY);
        crypto_generichash_update(&st, mine_first ? peer_pk : my_pk, SECAGG_KEY);
        crypto_generichash_final(&st, seed, SECAGG_KEY);
        sodium_memzero(q, sizeof q);
        return 0;
}

static void put64(uint8_t *p, uint64_t v) {
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint64_t get64(const uint8_t *p) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
                v |= (uint64_t) p[i] << (8 * i);
        return v;
}

void secagg_mask(uint32_t *v, size_t n, uint64_t off, const uint8_t seed[SECAGG_KEY], uint64_t number,
                 uint32_t tensor, bool subtract) {
        /* 64 blocks of 16 words at a time. */
        enum { BLOCKS = 64, WORDS = BLOCKS * 16 };
        static const uint8_t zero[WORDS * 4];
        uint8_t nonce[crypto_stream_xchacha20_NONCEBYTES] = { 'p', 's', 'S', 'A' };
        uint8_t ks[WORDS * 4];
        put64(nonce + 4, number);
        put64(nonce + 12, tensor);
        size_t done = 0;
        while (done < n) {
                uint64_t pos = off + done, block = pos / 16;
                size_t skip = (size_t) (pos % 16), take = MIN(n - done, (size_t) WORDS - skip);
                size_t bytes = (skip + take + 15) / 16 * 64;
                crypto_stream_xchacha20_xor_ic(ks, zero, bytes, nonce, block, seed);
                for (size_t i = 0; i < take; i++) {
                        const uint8_t *p = ks + (skip + i) * 4;
                        uint32_t m = (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
                                     (uint32_t) p[3] << 24;
                        v[done + i] = subtract ? v[done + i] - m : v[done + i] + m;
                }
                done += take;
        }
        sodium_memzero(ks, sizeof ks);
}

int secagg_split(const uint8_t secret[SECAGG_KEY], size_t n, uint32_t t, uint8_t (*shares)[SECAGG_KEY]) {
        if (t < 2 || t > n || n > SECAGG_MAX_CLIENTS)
                return -EINVAL;
        int r = secagg_init();
        if (r < 0)
                return r;
        uint8_t xs[SECAGG_MAX_CLIENTS], buf[SECAGG_KEY];
        for (size_t i = 0; i < n; i++)
                xs[i] = (uint8_t) (i + 1);
        gfshare_ctx *g = gfshare_ctx_init_enc(xs, (unsigned) n, (unsigned char) t, SECAGG_KEY);
        if (!g)
                return -ENOMEM;
        memcpy(buf, secret, SECAGG_KEY); /* the library takes it writable */
        gfshare_ctx_enc_setsecret(g, buf);
        for (size_t i = 0; i < n; i++)
                gfshare_ctx_enc_getshare(g, (unsigned char) i, shares[i]);
        gfshare_ctx_free(g); /* wipes the coefficients */
        sodium_memzero(buf, sizeof buf);
        return 0;
}

int secagg_combine(const uint8_t *xs, const uint8_t (*shares)[SECAGG_KEY], size_t k, uint8_t secret[SECAGG_KEY]) {
        if (k < 1 || k > SECAGG_MAX_CLIENTS)
                return -EINVAL;
        uint8_t x[SECAGG_MAX_CLIENTS], buf[SECAGG_KEY];
        int r = secagg_init(); /* gfshare_ctx_free overwrites with random bytes */
        if (r < 0)
                return r;
        for (size_t i = 0; i < k; i++) {
                if (xs[i] == 0)
                        return -EINVAL;
                for (size_t j = 0; j < i; j++)
                        if (xs[j] == xs[i])
                                return -EINVAL;
                x[i] = xs[i];
        }
        gfshare_ctx *g = gfshare_ctx_init_dec(x, (unsigned) k, SECAGG_KEY);
        if (!g)
                return -ENOMEM;
        for (size_t i = 0; i < k; i++) {
                memcpy(buf, shares[i], SECAGG_KEY);
                gfshare_ctx_dec_giveshare(g, (unsigned char) i, buf);
        }
        gfshare_ctx_dec_extract(g, secret);
        gfshare_ctx_free(g);
        sodium_memzero(buf, sizeof buf);
        return 0;
}

static void plain_put(uint8_t *p, uint32_t from, uint32_t to, uint64_t number, const uint8_t *a, const uint8_t *b) {
        put64(p, (uint64_t) from | (uint64_t) to << 32);
        put64(p + 8, number);
        memcpy(p + 16, a, SECAGG_KEY);
        memcpy(p + 16 + SECAGG_KEY, b, SECAGG_KEY);
}

int secagg_seal(const SecAggKeys *me, const uint8_t peer_share_pk[SECAGG_KEY], uint32_t from, uint32_t to,
                uint64_t number, const uint8_t mask_share[SECAGG_KEY], const uint8_t self_share[SECAGG_KEY],
                uint8_t box[SECAGG_BOX]) {
        uint8_t plain[SECAGG_PLAIN];
        plain_put(plain, from, to, number, mask_share, self_share);
        randombytes_buf(box, crypto_box_NONCEBYTES);
        int r = crypto_box_easy(box + crypto_box_NONCEBYTES, plain, sizeof plain, box, peer_share_pk, me->share_sk);
        sodium_memzero(plain, sizeof plain);
        return r < 0 ? -EINVAL : 0;
}

int secagg_open(const SecAggKeys *me, const uint8_t peer_share_pk[SECAGG_KEY], uint32_t from, uint32_t to,
                uint64_t number, const uint8_t *box, size_t len, uint8_t mask_share[SECAGG_KEY],
                uint8_t self_share[SECAGG_KEY]) {
        uint8_t plain[SECAGG_PLAIN];
        if (len != SECAGG_BOX ||
            crypto_box_open_easy(plain, box + crypto_box_NONCEBYTES, len - crypto_box_NONCEBYTES, box,
                                 peer_share_pk, me->share_sk) < 0)
                return -EBADMSG;
        int r = 0;
        if (get64(plain) != ((uint64_t) from | (uint64_t) to << 32) || get64(plain + 8) != number)
                r = -EBADMSG;
        else {
                memcpy(mask_share, plain + 16, SECAGG_KEY);
                memcpy(self_share, plain + 16 + SECAGG_KEY, SECAGG_KEY);
        }
        sodium_memzero(plain, sizeof plain);
        return r;
}

bool secagg_key_matches(const uint8_t sk[SECAGG_KEY], const uint8_t pk[SECAGG_KEY]) {
        uint8_t q[SECAGG_KEY];
        bool ok = crypto_scalarmult_base(q, sk) == 0 && sodium_memcmp(q, pk, SECAGG_KEY) == 0;
        sodium_memzero(q, sizeof q);
        return ok;
}
