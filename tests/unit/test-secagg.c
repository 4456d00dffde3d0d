/* SPDX-License-Identifier: Apache-2.0 */
/* Secure aggregation end to end without sockets: five clients run the
 * client side (worker/workerd/edge-secagg.c), this test plays pscoord
 * (routes keys and boxes, rebuilds seeds from t shares with secagg_combine,
 * as coord-secagg.c does) and a real shard aggregates (ps/psd/psd-fedround.c
 * on the fixture's store, job mlp:20-10-5 in 16-float chunks). Checked:
 *   - the secure round's result equals plain FedAvg of the clamped updates
 *     within the quantisation bound of common/secagg.h (clients x B / 2^32);
 *   - one of five clients drops after its masked update reached the shard
 *     (it never reveals its shares): the sum is still recovered, with it;
 *   - one drops before sending its masked update: its pairwise masks are
 *     removed with its rebuilt mask key, the sum is that of the four others;
 *   - what the shard holds of one client is uncorrelated with its update;
 *   - the shard refuses a raw update, a close that would unmask a client,
 *     a wrong mask key; clients refuse lists without them, a box that does
 *     not open, a second unmasking; Shamir needs t shares. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "edge-secagg.h"
#include "macro.h"
#include "psd-fedround.h"
#include "psd-fixture.h"
#include "secagg.h"
#include "tap.h"

#define N 5
#define CLIP 1.0f

typedef struct Round {
        EdgeSecAgg c[N];
        uint32_t id[N];
        uint64_t ex[N];
        float *x[N][4];              /* per client, per tensor: its delta */
        uint32_t *y[N][4];           /* masked */
        bool in2[N], surv[N], reveal[N];
        EdgeSecAggOut out2[N], out4[N];
        uint8_t seeds[N][SECAGG_KEY];
} Round;

static Job job;
static uint64_t number;

static size_t numel(uint32_t t) { return (size_t) job.tensors[t].numel; }

/* Uniform in [-0.6, 0.6] (some beyond CLIP, to be clamped). */
static float draw(void) { return (float) (randombytes_uniform(1200001) / 1e6 - 0.6) * 1.5f; }

static Psnet__SecAgg stage_in(uint32_t stage) {
        Psnet__SecAgg s = PSNET__SEC_AGG__INIT;
        s.has_stage = true;
        s.stage = stage;
        return s;
}

/* Runs one round: in2 = who sends shares (U2), surv = whose update counts,
 * reveal = who answers stage 4. Returns the shard's close status. */
static int run_round(Store *s, FedShard *f, Round *r, bool check_corr) {
        char err[200];
        int ok = 1;
        number++;
        /* Open on the shard. */
        Psnet__Round open = PSNET__ROUND__INIT;
        open.number = number;
        open.n_clients = N;
        open.clients = r->id;
        if (fedshard_round(f, s, &open, 0, err, sizeof err) != ST_OK)
                return CHECK(false, "round opens (%s)", err), -1;
        /* Stage 1. */
        Psnet__SecAgg in1 = stage_in(1);
        in1.has_clip = true;
        in1.clip = CLIP;
        EdgeSecAggOut o1[N];
        for (int i = 0; i < N; i++)
                ok &= edge_secagg_keys(&r->c[i], number, r->id[i], &in1, r->ex[i], false, &o1[i]) == 0;
        /* Stage 2: U1 = all. */
        Psnet__SecAggPeer pe[N], *pp[N];
        for (int i = 0; i < N; i++) {
                psnet__sec_agg_peer__init(&pe[i]);
                pe[i].client = r->id[i];
                pe[i].has_mask_key = pe[i].has_share_key = true;
                pe[i].mask_key = o1[i].sa.mask_key;
                pe[i].share_key = o1[i].sa.share_key;
                pp[i] = &pe[i];
        }
        Psnet__SecAgg in2 = stage_in(2);
        in2.has_threshold = true;
        in2.threshold = secagg_threshold(N, 0.5f);
        in2.n_peers = N;
        in2.peers = pp;
        for (int i = 0; i < N; i++)
                ok &= edge_secagg_shares(&r->c[i], number, &in2, &r->out2[i], err, sizeof err) == 0;
        /* Stage 3: U2, the boxes for each, W. */
        Psnet__SecAggPeer pe3[N], *pp3[N];
        size_t n2 = 0;
        uint64_t w = 0;
        for (int i = 0; i < N; i++)
                if (r->in2[i]) {
                        pe3[n2] = pe[i];
                        pe3[n2].has_share_key = false;
                        pp3[n2] = &pe3[n2];
                        n2++;
                        w += r->ex[i];
                }
        for (int to = 0; to < N; to++) {
                if (!r->in2[to])
                        continue;
                Psnet__SecAggBox *bp[N];
                size_t nb = 0;
                for (int from = 0; from < N; from++)
                        for (size_t b = 0; r->in2[from] && from != to && b < r->out2[from].sa.n_boxes; b++)
                                if (r->out2[from].sa.boxes[b]->to == r->id[to])
                                        bp[nb++] = r->out2[from].sa.boxes[b];
                Psnet__SecAgg in3 = stage_in(3);
                in3.has_weight = true;
                in3.weight = w;
                in3.n_peers = n2;
                in3.peers = pp3;
                in3.n_boxes = nb;
                in3.boxes = bp;
                int rr = edge_secagg_peers(&r->c[to], number, &in3, err, sizeof err);
                ok &= rr == 0;
                if (rr < 0)
                        CHECK(false, "client %u takes stage 3 (%s)", r->id[to], err);
        }
        /* Masked updates: U2 members that survive push theirs (one that
         * drops before pushing does not). */
        for (int i = 0; i < N; i++) {
                if (!r->in2[i] || !r->surv[i])
                        continue;
                for (uint32_t t = 0; t < job.ntensors; t++)
                        edge_secagg_mask(&r->c[i], t, r->x[i][t], r->y[i][t], numel(t));
                for (uint32_t t = 0; t < job.ntensors; t++)
                        for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                                Chunk *c = store_key(s, t, k);
                                Psnet__Key kk = PSNET__KEY__INIT, *kp = &kk;
                                kk.tensor = t;
                                kk.chunk = k;
                                kk.len = c->len;
                                Psnet__Header h = PSNET__HEADER__INIT;
                                h.has_clock = h.has_sender = h.has_examples = h.has_codec = true;
                                h.clock = (int64_t) number;
                                h.sender = r->id[i];
                                h.examples = r->ex[i];
                                h.codec = PSNET__CODEC__CODEC_MASKED;
                                h.n_keys = 1;
                                h.keys = &kp;
                                zmq_msg_t fr;
                                zmq_msg_init_size(&fr, c->len * sizeof(uint32_t));
                                memcpy(zmq_msg_data(&fr), r->y[i][t] + (size_t) k * CHUNK_FLOATS,
                                       c->len * sizeof(uint32_t));
                                int st = fedshard_push(f, s, &h, &c, &fr, NULL, 0, err, sizeof err);
                                zmq_msg_close(&fr);
                                if (st != ST_OK)
                                        ok = CHECK(false, "masked push %u/%u of client %u (%s)", t, k, r->id[i], err);
                        }
        }
        if (check_corr) {
                /* Client 0's masked W0 as the shard holds it vs its update. */
                double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, n = (double) numel(0);
                for (size_t j = 0; j < numel(0); j++) {
                        double a = r->x[0][0][j], b = (double) r->y[0][0][j];
                        sx += a, sy += b, sxx += a * a, syy += b * b, sxy += a * b;
                }
                double corr = (sxy - sx * sy / n) / sqrt((sxx - sx * sx / n) * (syy - sy * sy / n));
                CHECK(fabs(corr) < 4 / sqrt(n), "what the shard holds of one client is uncorrelated with its update "
                      "(r = %.3f over %.0f values)", corr, n);
        }
        /* Stage 4: survivors reveal; pscoord's part: t shares per seed. */
        uint32_t sv[N];
        size_t nsv = 0;
        for (int i = 0; i < N; i++)
                if (r->in2[i] && r->surv[i])
                        sv[nsv++] = r->id[i];
        Psnet__SecAgg in4 = stage_in(4);
        in4.n_survivors = nsv;
        in4.survivors = sv;
        uint8_t xs[N];
        size_t nr = 0;
        int who[N];
        for (int i = 0; i < N; i++)
                if (r->in2[i] && r->surv[i] && r->reveal[i]) {
                        ok &= edge_secagg_reveal(&r->c[i], number, &in4, &r->out4[i], err, sizeof err) == 0;
                        xs[nr] = (uint8_t) (i + 1); /* its place in U1 + 1 */
                        who[nr++] = i;
                }
        uint32_t t = in2.threshold;
        Psnet__SecAggSecret se[N], *sp[N];
        size_t k = 0;
        for (int v = 0; v < N; v++) {
                if (!r->in2[v])
                        continue;
                uint8_t got[N][SECAGG_KEY];
                for (size_t j = 0; j < t && j < nr; j++) {
                        const EdgeSecAggOut *o = &r->out4[who[j]];
                        for (size_t q = 0; q < o->sa.n_secrets; q++)
                                if (o->sa.secrets[q]->client == r->id[v])
                                        memcpy(got[j], o->sa.secrets[q]->value.data, SECAGG_KEY);
                }
                ok &= secagg_combine(xs, (const uint8_t (*)[SECAGG_KEY]) got, MIN((size_t) t, nr), r->seeds[v]) == 0;
                psnet__sec_agg_secret__init(&se[k]);
                se[k].client = r->id[v];
                se[k].self = r->surv[v];
                se[k].value = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = r->seeds[v] };
                sp[k] = &se[k];
                k++;
        }
        CHECK(ok, "round %lu: every client takes every stage", (unsigned long) number);
        Psnet__SecAgg cl = PSNET__SEC_AGG__INIT;
        cl.has_weight = true;
        cl.weight = w;
        cl.n_peers = n2;
        cl.peers = pp3;
        cl.n_secrets = k;
        cl.secrets = sp;
        Psnet__Round close = PSNET__ROUND__INIT;
        close.number = number;
        close.has_close = close.close = true;
        close.n_clients = nsv;
        close.clients = sv;
        close.secagg = &cl;
        /* A close that would unmask a survivor (its mask key instead of its
         * self seed) is refused and changes nothing. */
        if (nsv > 0 && k > 0) {
                se[0].self = !se[0].self;
                int st = fedshard_round(f, s, &close, 0, err, sizeof err);
                CHECK(st == ST_INVALID && strstr(err, "unmask"), "a close giving the wrong secret of client %u is "
                      "refused (%s)", se[0].client, err);
                se[0].self = !se[0].self;
                for (size_t q = 0; q < k; q++)
                        if (!se[q].self) {
                                se[q].value.data[5] ^= 1; /* byte 0's low bits are clamped away */
                                int bad = fedshard_round(f, s, &close, 0, err, sizeof err);
                                CHECK(bad == ST_INVALID && strstr(err, "does not match"), "a close with a wrong mask "
                                      "key for client %u is refused (%s)", se[q].client, err);
                                se[q].value.data[5] ^= 1; /* byte 0's low bits are clamped away */
                                break;
                        }
        }
        int st = fedshard_round(f, s, &close, 0, err, sizeof err);
        if (st != ST_OK)
                CHECK(false, "the secure close (%s)", err);
        for (int i = 0; i < N; i++) {
                edge_secagg_out_free(&o1[i]);
                edge_secagg_out_free(&r->out2[i]);
                edge_secagg_out_free(&r->out4[i]);
                edge_secagg_clear(&r->c[i]);
        }
        return st;
}

/* Runs a round and compares with w + the example-weighted mean of the
 * clamped deltas of the survivors. */
static void check_round(Store *s, FedShard *f, Round *r, const char *what) {
        float *before[4];
        for (uint32_t t = 0; t < job.ntensors; t++) {
                before[t] = fbuf(numel(t));
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        Chunk *c = store_key(s, t, k);
                        memcpy(before[t] + (size_t) k * CHUNK_FLOATS, c->val->data, c->len * sizeof(float));
                }
        }
        int st = run_round(s, f, r, false);
        double wsum = 0, worst = 0;
        size_t nsurv = 0;
        for (int i = 0; i < N; i++)
                if (r->in2[i] && r->surv[i])
                        wsum += (double) r->ex[i], nsurv++;
        for (uint32_t t = 0; t < job.ntensors; t++)
                for (uint32_t k = 0; k < job.tensors[t].nchunks; k++) {
                        Chunk *c = store_key(s, t, k);
                        for (uint32_t j = 0; j < c->len; j++) {
                                size_t g = (size_t) k * CHUNK_FLOATS + j;
                                double m = 0;
                                for (int i = 0; i < N; i++)
                                        if (r->in2[i] && r->surv[i])
                                                m += (double) r->ex[i] * fmin(fmax(r->x[i][t][g], -CLIP), CLIP);
                                double want = before[t][g] + m / wsum;
                                worst = fmax(worst, fabs(c->val->data[j] - want));
                        }
                }
        double bound = (double) N * CLIP / 4294967296.0 + 4e-7; /* + float rounding of w ~ 1 */
        CHECK(st == ST_OK && worst <= bound, "%s: the unmasked mean of %zu clients = plain FedAvg within %.3g "
              "(worst %.3g)", what, nsurv, bound, worst);
        for (uint32_t t = 0; t < job.ntensors; t++)
                free(before[t]);
}

static void primitives(void) {
        uint8_t secret[SECAGG_KEY], sh[5][SECAGG_KEY], out[SECAGG_KEY];
        randombytes_buf(secret, sizeof secret);
        CHECK(secagg_split(secret, 5, 3, sh) == 0, "split into 5 shares, threshold 3");
        uint8_t xs[3] = { 2, 4, 5 };
        uint8_t three[3][SECAGG_KEY];
        memcpy(three[0], sh[1], SECAGG_KEY);
        memcpy(three[1], sh[3], SECAGG_KEY);
        memcpy(three[2], sh[4], SECAGG_KEY);
        const uint8_t(*pick)[SECAGG_KEY] = (const uint8_t(*)[SECAGG_KEY]) three;
        CHECK(secagg_combine(xs, pick, 3, out) == 0 && memcmp(out, secret, SECAGG_KEY) == 0,
              "any 3 of the 5 shares rebuild the secret");
        CHECK(secagg_combine(xs, pick, 2, out) == 0 && memcmp(out, secret, SECAGG_KEY) != 0,
              "2 shares do not");
        CHECK(secagg_split(secret, 5, 1, sh) == -EINVAL && secagg_split(secret, 3, 4, sh) == -EINVAL,
              "a threshold below 2 or above the shares is refused");
        uint8_t dup[2] = { 3, 3 };
        CHECK(secagg_combine(dup, pick, 2, out) == -EINVAL, "two shares at the same x are refused");

        SecAggKeys a, b;
        uint8_t sab[SECAGG_KEY], sba[SECAGG_KEY];
        CHECK(secagg_keys_new(&a) == 0 && secagg_keys_new(&b) == 0, "fresh keys");
        CHECK(secagg_pair_seed(a.mask_sk, a.mask_pk, b.mask_pk, sab) == 0 &&
              secagg_pair_seed(b.mask_sk, b.mask_pk, a.mask_pk, sba) == 0 && memcmp(sab, sba, SECAGG_KEY) == 0,
              "both sides of a pair agree on its seed");
        CHECK(secagg_key_matches(a.mask_sk, a.mask_pk) && !secagg_key_matches(b.mask_sk, a.mask_pk),
              "a mask key matches its own public key only");
        uint32_t v[100] = { 0 };
        secagg_mask(v, 100, 7, sab, 9, 1, false);
        bool nonzero = false;
        for (int i = 0; i < 100; i++)
                nonzero |= v[i] != 0;
        secagg_mask(v + 10, 50, 17, sba, 9, 1, true); /* the same stream from position 17 */
        secagg_mask(v, 10, 7, sba, 9, 1, true);
        secagg_mask(v + 60, 40, 67, sba, 9, 1, true);
        bool zero = true;
        for (int i = 0; i < 100; i++)
                zero &= v[i] == 0;
        CHECK(nonzero && zero, "a pairwise mask added by one and subtracted by the other, in pieces, cancels");
        uint8_t box[SECAGG_BOX], m1[SECAGG_KEY], m2[SECAGG_KEY];
        CHECK(secagg_seal(&a, b.share_pk, 1, 2, 9, sh[0], sh[1], box) == 0 &&
              secagg_open(&b, a.share_pk, 1, 2, 9, box, sizeof box, m1, m2) == 0 &&
              !memcmp(m1, sh[0], SECAGG_KEY) && !memcmp(m2, sh[1], SECAGG_KEY), "a sealed box opens for its receiver");
        CHECK(secagg_open(&b, a.share_pk, 1, 2, 10, box, sizeof box, m1, m2) == -EBADMSG &&
              secagg_open(&b, a.share_pk, 3, 2, 9, box, sizeof box, m1, m2) == -EBADMSG,
              "a box replayed into another round or claimed by another sender does not open");
        box[50] ^= 1;
        CHECK(secagg_open(&b, a.share_pk, 1, 2, 9, box, sizeof box, m1, m2) == -EBADMSG, "a tampered box does not open");
        float x[4] = { 0.5f, -0.25f, 100.0f, -100.0f };
        uint32_t q[4];
        secagg_quantise(x, q, 4, 8.0f, 1000.0);
        CHECK((int32_t) q[0] == 500 && (int32_t) q[1] == -250 && (int32_t) q[2] == 8000 && (int32_t) q[3] == -8000,
              "quantising rounds x S and clamps to +-B (%d %d %d %d)", (int32_t) q[0], (int32_t) q[1],
              (int32_t) q[2], (int32_t) q[3]);
}

/* A large update through the client's masking alone: no linear relation to
 * what goes out; its quantised values without masks are (the check can fail). */
static void uncorrelated(void) {
        enum { L = 200000 };
        EdgeSecAgg c;
        memset(&c, 0, sizeof c);
        Psnet__SecAgg in = stage_in(1);
        in.has_clip = true;
        in.clip = 8;
        EdgeSecAggOut o;
        float *x = malloc(L * sizeof *x);
        uint32_t *y = malloc(L * sizeof *y), *q = malloc(L * sizeof *q);
        if (!x || !y || !q || edge_secagg_keys(&c, 1, 1, &in, 100, false, &o) < 0) {
                CHECK(false, "setup");
                return;
        }
        for (size_t i = 0; i < L; i++)
                x[i] = draw();
        c.stage = 3; /* alone: its self mask only */
        c.weight = 1000;
        edge_secagg_mask(&c, 0, x, y, L);
        secagg_quantise(x, q, L, 8, 100 * secagg_scale(1000, 8));
        double r[2];
        for (int k = 0; k < 2; k++) {
                const uint32_t *z = k ? q : y;
                double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
                for (size_t i = 0; i < L; i++) {
                        double a = x[i], b = k ? (double) (int32_t) z[i] : (double) z[i];
                        sx += a, sy += b, sxx += a * a, syy += b * b, sxy += a * b;
                }
                r[k] = (sxy - sx * sy / L) / sqrt((sxx - sx * sx / L) * (syy - sy * sy / L));
        }
        CHECK(fabs(r[0]) < 4 / sqrt((double) L) && r[1] > 0.999, "a masked update's correlation with the update is "
              "%.4f (< %.4f); unmasked it would be %.4f", r[0], 4 / sqrt((double) L), r[1]);
        edge_secagg_out_free(&o);
        edge_secagg_clear(&c);
        free(x);
        free(y);
        free(q);
}

int main(void) {
        Acks acks = { 0 };
        CHECK(secagg_init() == 0, "libsodium starts");
        primitives();
        uncorrelated();

        make_job(&job, 1, MODE_FED, "sgd");
        job.fed.secagg = true;
        job.fed.secagg_clip = CLIP;
        uint32_t members[1] = { 1 };
        Gate *sh = open_solo(&job, &acks, members, 1);
        Store *s = sh ? gate_store(sh) : NULL;
        FedShard *f = NULL;
        if (!s || fedshard_new(&f) < 0)
                return CHECK(false, "store and rounds"), tap_done();
        Round r;
        memset(&r, 0, sizeof r);
        for (int i = 0; i < N; i++) {
                r.id[i] = (uint32_t) (3 * i + 2);
                r.ex[i] = (uint64_t) (100 + 37 * i);
                for (uint32_t t = 0; t < job.ntensors; t++) {
                        r.x[i][t] = fbuf(numel(t));
                        r.y[i][t] = (uint32_t *) fbuf(numel(t));
                        for (size_t j = 0; j < numel(t); j++)
                                r.x[i][t][j] = draw() * 0.3f * (float) (i + 1); /* client 4's beyond CLIP */
                }
                r.in2[i] = r.surv[i] = r.reveal[i] = true;
        }
        /* A raw update in a secure job: refused. */
        {
                char err[200];
                number++;
                Psnet__Round open = PSNET__ROUND__INIT;
                open.number = number;
                open.n_clients = N;
                open.clients = r.id;
                (void) fedshard_round(f, s, &open, 0, err, sizeof err);
                Chunk *c = store_key(s, 3, 0);
                Psnet__Key kk = PSNET__KEY__INIT, *kp = &kk;
                kk.tensor = 3;
                kk.len = c->len;
                Psnet__Header h = PSNET__HEADER__INIT;
                h.has_clock = h.has_sender = h.has_examples = true;
                h.clock = (int64_t) number;
                h.sender = r.id[0];
                h.examples = 1;
                h.n_keys = 1;
                h.keys = &kp;
                zmq_msg_t fr;
                zmq_msg_init_size(&fr, c->len * sizeof(float));
                memset(zmq_msg_data(&fr), 0, c->len * sizeof(float));
                int st = fedshard_push(f, s, &h, &c, &fr, NULL, 0, err, sizeof err);
                zmq_msg_close(&fr);
                CHECK(st == PSNET__STATUS__STATUS_DTYPE && strstr(err, "masked"), "a plain update in a secure job is "
                      "refused (%s)", err);
        }
        check_round(s, f, &r, "all five");
        r.reveal[4] = false;
        check_round(s, f, &r, "one drops after its masked update (no shares from it)");
        r.reveal[4] = true;
        r.surv[1] = false;
        check_round(s, f, &r, "one drops before its masked update (its mask key rebuilt)");
        r.surv[1] = true;
        r.in2[3] = false;
        check_round(s, f, &r, "one never sends its shares");
        r.in2[3] = true;
        (void) run_round(s, f, &r, true);

        /* Clients' own checks. */
        {
                EdgeSecAgg c;
                memset(&c, 0, sizeof c);
                char err[160];
                Psnet__SecAgg in = stage_in(1);
                in.has_clip = true;
                in.clip = 1;
                EdgeSecAggOut o, o2;
                (void) edge_secagg_keys(&c, 50, 7, &in, 10, false, &o);
                Psnet__SecAggPeer pe[2], *pp[2];
                for (int i = 0; i < 2; i++) {
                        psnet__sec_agg_peer__init(&pe[i]);
                        pe[i].client = (uint32_t) (8 + i);
                        pe[i].has_mask_key = pe[i].has_share_key = true;
                        pe[i].mask_key = o.sa.mask_key;
                        pe[i].share_key = o.sa.share_key;
                        pp[i] = &pe[i];
                }
                Psnet__SecAgg in2 = stage_in(2);
                in2.has_threshold = true;
                in2.threshold = 2;
                in2.n_peers = 2;
                in2.peers = pp;
                CHECK(edge_secagg_shares(&c, 50, &in2, &o2, err, sizeof err) == -EINVAL,
                      "a client refuses a stage 2 that does not name it (%s)", err);
                edge_secagg_out_free(&o2);
                Psnet__SecAgg in4 = stage_in(4);
                CHECK(edge_secagg_reveal(&c, 50, &in4, &o2, err, sizeof err) == -EINVAL,
                      "a client reveals nothing before it masked (%s)", err);
                edge_secagg_out_free(&o2);
                edge_secagg_out_free(&o);
                edge_secagg_clear(&c);
        }
        for (int i = 0; i < N; i++)
                for (uint32_t t = 0; t < job.ntensors; t++) {
                        free(r.x[i][t]);
                        free(r.y[i][t]);
                }
        fedshard_free(f);
        shard_free(sh);
        return tap_done();
}
