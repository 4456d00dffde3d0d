/* SPDX-License-Identifier: Apache-2.0 */
/* An edge worker's side of secure aggregation; see edge-secagg.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>
#include "alloc.h"
#include "edge-secagg.h"
#include "macro.h"

static void wipe_free(void *p, size_t n) {
        if (p)
                sodium_memzero(p, n);
        ps_free(p);
}

void edge_secagg_clear(EdgeSecAgg *s) {
        size_t kb = s->n1 * SECAGG_KEY;
        wipe_free(s->mask_share, kb);
        wipe_free(s->self_share, kb);
        wipe_free(s->pair, kb);
        ps_free(s->u1);
        ps_free(s->mask_pk);
        ps_free(s->share_pk);
        ps_free(s->in2);
        sodium_memzero(s, sizeof *s);
}

void edge_secagg_out_free(EdgeSecAggOut *o) {
        ps_free(o->bx);
        ps_free(o->bp);
        ps_free(o->se);
        ps_free(o->sp);
        wipe_free(o->raw, o->nraw);
        memset(o, 0, sizeof *o);
}

static int err_out(char *err, size_t n, const char *what) {
        snprintf(err, n, "%s", what);
        return -EINVAL;
}

int edge_secagg_keys(EdgeSecAgg *s, uint64_t number, uint32_t me, const Psnet__SecAgg *in, uint64_t examples,
                     bool unweighted, EdgeSecAggOut *out) {
        edge_secagg_clear(s);
        memset(out, 0, sizeof *out);
        if (!in->has_clip || !(in->clip > 0) || examples == 0)
                return -EINVAL;
        int r = secagg_keys_new(&s->k);
        if (r < 0)
                return r;
        s->number = number;
        s->me = me;
        s->clip = in->clip;
        s->unweighted = unweighted;
        s->examples = examples;
        s->stage = 1;
        psnet__sec_agg__init(&out->sa);
        out->sa.has_stage = out->sa.has_mask_key = out->sa.has_share_key = out->sa.has_examples = true;
        out->sa.stage = 1;
        out->sa.mask_key = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = s->k.mask_pk };
        out->sa.share_key = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = s->k.share_pk };
        out->sa.examples = examples;
        return 0;
}

static bool is_key(const ProtobufCBinaryData *b, bool has) {
        return has && b->len == SECAGG_KEY;
}

int edge_secagg_shares(EdgeSecAgg *s, uint64_t number, const Psnet__SecAgg *in, EdgeSecAggOut *out, char *err,
                       size_t errn) {
        memset(out, 0, sizeof *out);
        if (s->number != number || s->stage != 1)
                return err_out(err, errn, "stage 2 of a round this client did not send keys for");
        size_t n = in->n_peers;
        if (n < 2 || n > SECAGG_MAX_CLIENTS || !in->has_threshold || in->threshold < 2 || in->threshold > n)
                return err_out(err, errn, "stage 2 names fewer than 2 (or over 255) clients, or a threshold not "
                               "in 2..clients");
        s->u1 = ps_calloc(n, sizeof *s->u1);
        s->mask_pk = ps_calloc(n, SECAGG_KEY);
        s->share_pk = ps_calloc(n, SECAGG_KEY);
        s->mask_share = ps_calloc(n, SECAGG_KEY);
        s->self_share = ps_calloc(n, SECAGG_KEY);
        s->pair = ps_calloc(n, SECAGG_KEY);
        s->in2 = ps_calloc(n, sizeof *s->in2);
        s->n1 = n;
        if (!s->u1 || !s->mask_pk || !s->share_pk || !s->mask_share || !s->self_share || !s->pair || !s->in2)
                return -ENOMEM;
        bool found = false;
        for (size_t i = 0; i < n; i++) {
                const Psnet__SecAggPeer *p = in->peers[i];
                if ((i && p->client <= s->u1[i - 1]) || !is_key(&p->mask_key, p->has_mask_key) ||
                    !is_key(&p->share_key, p->has_share_key))
                        return err_out(err, errn, "stage 2's clients are out of order or lack their keys");
                s->u1[i] = p->client;
                memcpy(s->mask_pk[i], p->mask_key.data, SECAGG_KEY);
                memcpy(s->share_pk[i], p->share_key.data, SECAGG_KEY);
                if (p->client == s->me) {
                        if (memcmp(s->mask_pk[i], s->k.mask_pk, SECAGG_KEY) ||
                            memcmp(s->share_pk[i], s->k.share_pk, SECAGG_KEY))
                                return err_out(err, errn, "stage 2 gives this client keys that are not its own");
                        s->mi = i;
                        found = true;
                }
        }
        if (!found)
                return err_out(err, errn, "stage 2 does not name this client");
        s->t = in->threshold;
        _cleanup_free_ uint8_t (*ms)[SECAGG_KEY] = ps_malloc(n * SECAGG_KEY);
        _cleanup_free_ uint8_t (*ss)[SECAGG_KEY] = ps_malloc(n * SECAGG_KEY);
        out->bx = ps_calloc(n, sizeof *out->bx);
        out->bp = ps_calloc(n, sizeof *out->bp);
        out->nraw = n * SECAGG_BOX;
        out->raw = ps_malloc(out->nraw);
        if (!ms || !ss || !out->bx || !out->bp || !out->raw)
                return -ENOMEM;
        int r = secagg_split(s->k.mask_sk, n, s->t, ms);
        if (r == 0)
                r = secagg_split(s->k.self_seed, n, s->t, ss);
        size_t nb = 0;
        for (size_t i = 0; r == 0 && i < n; i++) {
                if (i == s->mi) {
                        memcpy(s->mask_share[i], ms[i], SECAGG_KEY);
                        memcpy(s->self_share[i], ss[i], SECAGG_KEY);
                        continue;
                }
                uint8_t *box = out->raw + nb * SECAGG_BOX;
                r = secagg_seal(&s->k, s->share_pk[i], s->me, s->u1[i], number, ms[i], ss[i], box);
                psnet__sec_agg_box__init(&out->bx[nb]);
                out->bx[nb].from = s->me;
                out->bx[nb].to = s->u1[i];
                out->bx[nb].box = (ProtobufCBinaryData) { .len = SECAGG_BOX, .data = box };
                out->bp[nb] = &out->bx[nb];
                nb++;
        }
        sodium_memzero(ms, n * SECAGG_KEY);
        sodium_memzero(ss, n * SECAGG_KEY);
        if (r < 0)
                return err_out(err, errn, "sealing the shares failed");
        psnet__sec_agg__init(&out->sa);
        out->sa.has_stage = true;
        out->sa.stage = 2;
        out->sa.n_boxes = nb;
        out->sa.boxes = out->bp;
        s->stage = 2;
        return 0;
}

static ssize_t u1_place(const EdgeSecAgg *s, uint32_t id) {
        for (size_t i = 0; i < s->n1; i++)
                if (s->u1[i] == id)
                        return (ssize_t) i;
        return -1;
}

int edge_secagg_peers(EdgeSecAgg *s, uint64_t number, const Psnet__SecAgg *in, char *err, size_t errn) {
        if (s->number != number || s->stage != 2)
                return err_out(err, errn, "stage 3 of a round this client did not send shares for");
        if (!in->has_weight || in->weight == 0 || in->n_peers < s->t || in->n_peers > s->n1)
                return err_out(err, errn, "stage 3 names fewer clients than the threshold, or no weight");
        for (size_t k = 0; k < in->n_peers; k++) {
                const Psnet__SecAggPeer *p = in->peers[k];
                ssize_t i = u1_place(s, p->client);
                if (i < 0 || s->in2[i] || !is_key(&p->mask_key, p->has_mask_key) ||
                    memcmp(p->mask_key.data, s->mask_pk[i], SECAGG_KEY))
                        return err_out(err, errn, "stage 3 names a client of no stage 2, twice, or with another key");
                s->in2[i] = true;
        }
        if (!s->in2[s->mi])
                return err_out(err, errn, "stage 3 does not name this client");
        if (in->n_boxes != in->n_peers - 1)
                return err_out(err, errn, "stage 3 carries a box for each other client");
        _cleanup_free_ bool *got = ps_calloc(s->n1, sizeof *got);
        if (!got)
                return -ENOMEM;
        for (size_t b = 0; b < in->n_boxes; b++) {
                const Psnet__SecAggBox *x = in->boxes[b];
                ssize_t i = u1_place(s, x->from);
                if (i < 0 || !s->in2[i] || got[i] || x->to != s->me)
                        return err_out(err, errn, "stage 3 carries a box from no client of it, twice, or for another");
                if (secagg_open(&s->k, s->share_pk[i], x->from, s->me, number, x->box.data, x->box.len,
                                s->mask_share[i], s->self_share[i]) < 0) {
                        snprintf(err, errn, "the box from client %u does not open", x->from);
                        return -EBADMSG;
                }
                got[i] = true;
        }
        for (size_t i = 0; i < s->n1; i++)
                if (s->in2[i] && i != s->mi &&
                    secagg_pair_seed(s->k.mask_sk, s->k.mask_pk, s->mask_pk[i], s->pair[i]) < 0)
                        return err_out(err, errn, "a client's mask key gives no agreement");
        s->n2 = in->n_peers;
        s->weight = in->weight;
        s->stage = 3;
        return 0;
}

void edge_secagg_mask(const EdgeSecAgg *s, uint32_t tensor, const float *x, uint32_t *y, size_t len) {
        double mult = (double) (s->unweighted ? 1 : s->examples) * secagg_scale(s->weight, s->clip);
        secagg_quantise(x, y, len, s->clip, mult);
        secagg_mask(y, len, 0, s->k.self_seed, s->number, tensor, false);
        for (size_t i = 0; i < s->n1; i++)
                if (s->in2[i] && i != s->mi)
                        /* +PRG for a peer with a larger id, -PRG for a smaller one: they cancel. */
                        secagg_mask(y, len, 0, s->pair[i], s->number, tensor, s->u1[i] < s->me);
}

int edge_secagg_reveal(EdgeSecAgg *s, uint64_t number, const Psnet__SecAgg *in, EdgeSecAggOut *out, char *err,
                       size_t errn) {
        memset(out, 0, sizeof *out);
        if (s->number != number || s->stage != 3)
                return err_out(err, errn, "stage 4 of a round this client did not mask for, or a second time");
        if (in->n_survivors < s->t)
                return err_out(err, errn, "stage 4 names fewer survivors than the threshold");
        _cleanup_free_ bool *surv = ps_calloc(s->n1, sizeof *surv);
        if (!surv)
                return -ENOMEM;
        for (size_t k = 0; k < in->n_survivors; k++) {
                ssize_t i = u1_place(s, in->survivors[k]);
                if (i < 0 || !s->in2[i] || surv[i])
                        return err_out(err, errn, "stage 4 names a survivor of no stage 3, or twice");
                surv[i] = true;
        }
        out->se = ps_calloc(s->n2, sizeof *out->se);
        out->sp = ps_calloc(s->n2, sizeof *out->sp);
        if (!out->se || !out->sp)
                return -ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < s->n1; i++) {
                if (!s->in2[i])
                        continue;
                psnet__sec_agg_secret__init(&out->se[k]);
                out->se[k].client = s->u1[i];
                out->se[k].self = surv[i];
                out->se[k].value = (ProtobufCBinaryData) { .len = SECAGG_KEY,
                                                           .data = surv[i] ? s->self_share[i] : s->mask_share[i] };
                out->sp[k] = &out->se[k];
                k++;
        }
        psnet__sec_agg__init(&out->sa);
        out->sa.has_stage = true;
        out->sa.stage = 4;
        out->sa.n_secrets = k;
        out->sa.secrets = out->sp;
        s->stage = 4; /* never again this round */
        return 0;
}
