/* SPDX-License-Identifier: Apache-2.0 */
/* Secure aggregation's exchanges within a federated round (--secagg;
 * common/secagg.h has the scheme). pscoord is the paper's server for them:
 * it routes, it never sees an update. Within the round's TRAINING phase:
 *
 *   stage 1  the sampled clients were told to train; each answers its two
 *            public keys and its example count. Once every one answered or
 *            left, or --secagg-timeout: U1 = those that answered.
 *   stage 2  U1 (ids, keys) and the threshold t go to U1; each answers one
 *            sealed pair of shares (its mask key's, its self seed's) for every
 *            other member. Then U2 = those that answered.
 *   stage 3  each member of U2 gets U2, the boxes sealed for it and the
 *            weight W; it masks its update, pushes it to the shards and
 *            answers as in any round. Training ends as without --secagg.
 *
 * Then UNMASKING, stage 4: the survivors (the members of U2 whose updates
 * count) are named to them; each answers its shares of the survivors' self
 * seeds and of the other members' mask keys. With t of them pscoord rebuilds
 * the seeds and closes the round on the shards with them, which unmask the
 * sum. Too few at any stage: the round fails and runs again with a fresh
 * sample, as a round with too few updates does. */
#include <sodium.h>
#include "coord-internal.h"
#include "secagg.h"

int coord_secagg_start(Coord *c) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        size_t n = f->nclients;
        coord_secagg_clear(f);
        s->n = n;
        s->u1 = ps_calloc(n, sizeof *s->u1);
        s->u2 = ps_calloc(n, sizeof *s->u2);
        s->revealed = ps_calloc(n, sizeof *s->revealed);
        s->x = ps_calloc(n, sizeof *s->x);
        s->mask_pk = ps_calloc(n, sizeof *s->mask_pk);
        s->share_pk = ps_calloc(n, sizeof *s->share_pk);
        s->examples = ps_calloc(n, sizeof *s->examples);
        if (!s->u1 || !s->u2 || !s->revealed || !s->x || !s->mask_pk || !s->share_pk || !s->examples)
                return -ENOMEM;
        s->stage = 1;
        s->deadline = now_ms() + c->job.fed.secagg_timeout_ms;
        return 0;
}

static void send_edge(Coord *c, size_t i, Psnet__SecAgg *sa) {
        FedRounds *f = &c->fed;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_round = true;
        rd.round = f->done + 1;
        rd.secagg = sa;
        int r = coord_fed_send_edge(c, coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]), &rd);
        if (r < 0)
                log_warning_errno(r, "Failed to send round %lu's secure aggregation stage %u to edge=%u: %m",
                                  (unsigned long) f->number, sa->stage, f->clients[i]);
}

/* The round fails: no shard gets any seed (each drops what it holds).
 * While training, nobody has answered with an update yet: true, and the
 * round is to be closed (coord-fed.c: the close drops it) with why in
 * close_why. */
static bool fail(Coord *c, const char *why, char *close_why, size_t cn) {
        log_info("secure aggregation failed number=%lu stage=%u reason=\"%s\"", (unsigned long) c->fed.number,
                 c->fed.sa.stage, why);
        FedRounds *f = &c->fed;
        if (f->phase == FED_TRAINING) {
                snprintf(close_why, cn, "%s", why);
                return true;
        }
        FedRecord *rec = NULL;
        for (size_t k = 0; k < f->nhist && !rec; k++) {
                FedRecord *r = &f->hist[(f->hist_end + COORD_FED_HISTORY - 1 - k) % COORD_FED_HISTORY];
                if (r->number == f->number)
                        rec = r;
        }
        if (rec)
                snprintf(rec->note, sizeof rec->note, "%s", why);
        f->aggregate = false;
        f->phase = FED_CLOSING;
        int r = coord_fed_send_shards(c, true, NULL, 0, NULL);
        if (r < 0)
                coord_job_fail(c, "cannot drop a round on the shards");
        return false;
}

static size_t need(Coord *c) {
        return MAX((size_t) c->job.fed.min_clients, (size_t) 2);
}

/* Stage 1 is over: U1 learns who is in it. */
static bool end_keys(Coord *c, char *close_why, size_t cn) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        char why[96];
        s->n1 = 0;
        for (size_t i = 0; i < s->n; i++) {
                s->u1[i] &= coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]) != NULL;
                if (s->u1[i])
                        s->x[i] = (uint8_t) ++s->n1;
        }
        if (s->n1 < need(c)) {
                snprintf(why, sizeof why, "secure aggregation: %zu of %zu clients sent keys", s->n1, s->n);
                return fail(c, why, close_why, cn);
        }
        s->t = secagg_threshold(s->n1, c->job.fed.secagg_threshold);
        s->boxes = ps_malloc(s->n * s->n * SECAGG_BOX);
        s->has_box = ps_calloc(s->n * s->n, sizeof *s->has_box);
        _cleanup_free_ Psnet__SecAggPeer *pe = ps_calloc(s->n1, sizeof *pe);
        _cleanup_free_ Psnet__SecAggPeer **pp = ps_calloc(s->n1, sizeof *pp);
        if (!s->boxes || !s->has_box || !pe || !pp) {
                coord_job_fail(c, "out of memory in a round's secure aggregation");
                return false;
        }
        size_t k = 0;
        for (size_t i = 0; i < s->n; i++) {
                if (!s->u1[i])
                        continue;
                psnet__sec_agg_peer__init(&pe[k]);
                pe[k].client = f->clients[i];
                pe[k].has_mask_key = pe[k].has_share_key = true;
                pe[k].mask_key = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = s->mask_pk[i] };
                pe[k].share_key = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = s->share_pk[i] };
                pp[k] = &pe[k];
                k++;
        }
        Psnet__SecAgg sa = PSNET__SEC_AGG__INIT;
        sa.has_stage = sa.has_threshold = true;
        sa.stage = 2;
        sa.threshold = s->t;
        sa.n_peers = k;
        sa.peers = pp;
        s->stage = 2;
        s->deadline = now_ms() + c->job.fed.secagg_timeout_ms;
        log_info("secure aggregation keys number=%lu keys=%zu sampled=%zu threshold=%u", (unsigned long) f->number,
                 s->n1, s->n, s->t);
        for (size_t i = 0; i < s->n; i++)
                if (s->u1[i])
                        send_edge(c, i, &sa);
        return false;
}

/* Stage 2 is over: each member of U2 gets U2 and the boxes sealed for it. */
static bool end_shares(Coord *c, char *close_why, size_t cn) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        char why[96];
        bool dp = c->job.fed.strategy.dp_clip > 0;
        s->n2 = 0;
        s->weight = 0;
        for (size_t i = 0; i < s->n; i++) {
                s->u2[i] &= s->u1[i] && coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]) != NULL;
                if (s->u2[i]) {
                        s->n2++;
                        s->weight += dp ? 1 : s->examples[i];
                }
        }
        if (s->n2 < MAX(need(c), (size_t) s->t)) {
                snprintf(why, sizeof why, "secure aggregation: %zu of %zu clients sent their shares (%u needed)",
                         s->n2, s->n1, (unsigned) MAX(need(c), (size_t) s->t));
                return fail(c, why, close_why, cn);
        }
        _cleanup_free_ Psnet__SecAggPeer *pe = ps_calloc(s->n2, sizeof *pe);
        _cleanup_free_ Psnet__SecAggPeer **pp = ps_calloc(s->n2, sizeof *pp);
        _cleanup_free_ Psnet__SecAggBox *bx = ps_calloc(s->n2, sizeof *bx);
        _cleanup_free_ Psnet__SecAggBox **bp = ps_calloc(s->n2, sizeof *bp);
        if (!pe || !pp || !bx || !bp) {
                coord_job_fail(c, "out of memory in a round's secure aggregation");
                return false;
        }
        size_t k = 0;
        for (size_t i = 0; i < s->n; i++) {
                if (!s->u2[i])
                        continue;
                psnet__sec_agg_peer__init(&pe[k]);
                pe[k].client = f->clients[i];
                pe[k].has_mask_key = true;
                pe[k].mask_key = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = s->mask_pk[i] };
                pp[k] = &pe[k];
                k++;
        }
        Psnet__SecAgg sa = PSNET__SEC_AGG__INIT;
        sa.has_stage = sa.has_threshold = sa.has_weight = true;
        sa.stage = 3;
        sa.threshold = s->t;
        sa.weight = s->weight;
        sa.n_peers = k;
        sa.peers = pp;
        s->stage = 3;
        log_info("secure aggregation shares number=%lu shares=%zu keys=%zu weight=%lu", (unsigned long) f->number,
                 s->n2, s->n1, (unsigned long) s->weight);
        for (size_t to = 0; to < s->n; to++) {
                if (!s->u2[to])
                        continue;
                size_t nb = 0;
                for (size_t from = 0; from < s->n; from++) {
                        if (!s->u2[from] || from == to)
                                continue;
                        psnet__sec_agg_box__init(&bx[nb]);
                        bx[nb].from = f->clients[from];
                        bx[nb].to = f->clients[to];
                        bx[nb].box = (ProtobufCBinaryData) { .len = SECAGG_BOX,
                                                             .data = s->boxes + (from * s->n + to) * SECAGG_BOX };
                        bp[nb] = &bx[nb];
                        nb++;
                }
                sa.n_boxes = nb;
                sa.boxes = bp;
                send_edge(c, to, &sa);
        }
        return false;
}

void coord_secagg_unmask(Coord *c) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        _cleanup_free_ uint32_t *ids = ps_malloc(s->n * sizeof *ids);
        s->shares = ps_calloc(s->n * s->n, SECAGG_KEY);
        if (!ids || !s->shares) {
                coord_job_fail(c, "out of memory in a round's secure aggregation");
                return;
        }
        size_t k = 0;
        for (size_t i = 0; i < s->n; i++)
                if (f->answered[i])
                        ids[k++] = f->clients[i];
        Psnet__SecAgg sa = PSNET__SEC_AGG__INIT;
        sa.has_stage = true;
        sa.stage = 4;
        sa.n_survivors = k;
        sa.survivors = ids;
        s->stage = 4;
        s->deadline = now_ms() + c->job.fed.secagg_timeout_ms;
        f->phase = FED_UNMASKING;
        for (size_t i = 0; i < s->n; i++)
                if (f->answered[i])
                        send_edge(c, i, &sa);
}

/* Stage 4 is over: the seeds from t shares each, then the close. */
static bool end_unmask(Coord *c, char *close_why, size_t cn) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        char why[96];
        if (s->nrevealed < s->t) {
                snprintf(why, sizeof why, "secure aggregation: %zu of the %u shares needed to unmask came",
                         s->nrevealed, s->t);
                return fail(c, why, close_why, cn);
        }
        uint8_t xs[SECAGG_MAX_CLIENTS];
        size_t rev[SECAGG_MAX_CLIENTS], nr = 0;
        for (size_t r = 0; r < s->n && nr < s->t; r++)
                if (s->revealed[r]) {
                        rev[nr] = r;
                        xs[nr++] = s->x[r];
                }
        _cleanup_free_ uint32_t *ids = ps_malloc(s->n * sizeof *ids);
        _cleanup_free_ uint8_t (*sec)[SECAGG_KEY] = ps_calloc(s->n, SECAGG_KEY);
        _cleanup_free_ uint8_t (*got)[SECAGG_KEY] = ps_calloc(nr, SECAGG_KEY);
        _cleanup_free_ Psnet__SecAggPeer *pe = ps_calloc(s->n2, sizeof *pe);
        _cleanup_free_ Psnet__SecAggPeer **pp = ps_calloc(s->n2, sizeof *pp);
        _cleanup_free_ Psnet__SecAggSecret *se = ps_calloc(s->n2, sizeof *se);
        _cleanup_free_ Psnet__SecAggSecret **sp = ps_calloc(s->n2, sizeof *sp);
        if (!ids || !sec || !got || !pe || !pp || !se || !sp) {
                coord_job_fail(c, "out of memory in a round's secure aggregation");
                return false;
        }
        size_t nids = 0, k = 0;
        bool bad = false;
        for (size_t v = 0; v < s->n; v++) {
                if (!s->u2[v])
                        continue;
                for (size_t j = 0; j < nr; j++)
                        memcpy(got[j], s->shares[rev[j] * s->n + v], SECAGG_KEY);
                if (secagg_combine(xs, (const uint8_t (*)[SECAGG_KEY]) got, nr, sec[v]) < 0)
                        bad = true;
                if (!f->answered[v] && !secagg_key_matches(sec[v], s->mask_pk[v])) {
                        snprintf(why, sizeof why, "secure aggregation: the shares of client %u's mask key do not "
                                 "rebuild it", f->clients[v]);
                        bad = true;
                }
                psnet__sec_agg_peer__init(&pe[k]);
                pe[k].client = f->clients[v];
                pe[k].has_mask_key = true;
                pe[k].mask_key = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = s->mask_pk[v] };
                pp[k] = &pe[k];
                psnet__sec_agg_secret__init(&se[k]);
                se[k].client = f->clients[v];
                se[k].self = f->answered[v];
                se[k].value = (ProtobufCBinaryData) { .len = SECAGG_KEY, .data = sec[v] };
                sp[k] = &se[k];
                k++;
                if (f->answered[v])
                        ids[nids++] = f->clients[v];
        }
        sodium_memzero(got, nr * SECAGG_KEY);
        if (bad) {
                sodium_memzero(sec, s->n * SECAGG_KEY);
                return fail(c, why, close_why, cn);
        }
        Psnet__SecAgg sa = PSNET__SEC_AGG__INIT;
        sa.has_weight = sa.has_clip = true;
        sa.weight = s->weight;
        sa.clip = c->job.fed.secagg_clip;
        sa.n_peers = sa.n_secrets = k;
        sa.peers = pp;
        sa.secrets = sp;
        log_info("secure aggregation unmask number=%lu survivors=%zu dropped=%zu shares=%zu threshold=%u",
                 (unsigned long) f->number, nids, s->n2 - nids, s->nrevealed, s->t);
        f->phase = FED_CLOSING;
        int r = coord_fed_send_shards(c, true, ids, nids, &sa);
        sodium_memzero(sec, s->n * SECAGG_KEY);
        if (r < 0) {
                char reason[160];
                snprintf(reason, sizeof reason, "cannot close round %lu on the shards: %s", (unsigned long) f->number,
                         strerror(-r));
                coord_job_fail(c, reason);
        }
        return false;
}

bool coord_secagg_poll(Coord *c, uint64_t now, char *why, size_t n) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        size_t waiting = 0;
        for (size_t i = 0; i < s->n; i++) {
                bool asked = s->stage == 1 ? true : s->stage == 2 ? s->u1[i] : f->answered[i];
                bool done = s->stage == 1 ? s->u1[i] : s->stage == 2 ? s->u2[i] : s->revealed[i];
                waiting += asked && !done && coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]);
        }
        /* Keys and shares come within the round's time-out too. */
        bool over = now >= s->deadline || (s->stage < 3 && now >= f->deadline);
        if (waiting > 0 && !over)
                return false;
        if (s->stage == 1)
                return end_keys(c, why, n);
        if (s->stage == 2)
                return end_shares(c, why, n);
        if (s->stage == 4)
                return end_unmask(c, why, n);
        return false;
}

bool coord_secagg_may_count(Coord *c, size_t i, uint64_t examples, char *reason, size_t n) {
        FedSecAgg *s = &c->fed.sa;
        if (s->stage != 3 || !s->u2[i]) {
                snprintf(reason, n, "secure aggregation: only the clients that sent their shares send updates, "
                         "after stage 3 (this round is at stage %u)", s->stage);
                return false;
        }
        if (examples != s->examples[i]) {
                snprintf(reason, n, "secure aggregation: the update says %lu examples, the keys said %lu",
                         (unsigned long) examples, (unsigned long) s->examples[i]);
                return false;
        }
        return true;
}

static bool key_ok(const ProtobufCBinaryData *b, bool has) {
        return has && b->len == SECAGG_KEY;
}

/* Which sampled place holds this id (n: none). */
static size_t place(const FedRounds *f, uint32_t id) {
        size_t i = 0;
        while (i < f->nclients && f->clients[i] != id)
                i++;
        return i;
}

void coord_secagg_rep(Coord *c, WireMsg *m, Peer *p, size_t i) {
        FedRounds *f = &c->fed;
        FedSecAgg *s = &f->sa;
        const Psnet__Round *rd = m->hdr->round;
        const Psnet__SecAgg *sa = rd->secagg;
        uint64_t seq = m->hdr->seq;
        char reason[192];
        bool open = c->job.mode == MODE_FED && c->state == JOB_RUNNING && c->job.fed.secagg &&
                    (f->phase == FED_TRAINING || f->phase == FED_UNMASKING) && rd->number == f->number;
        if (!open || i == f->nclients || !sa->has_stage || sa->stage != s->stage) {
                snprintf(reason, sizeof reason, "round %lu is not at secure aggregation stage %u for edge %u "
                         "(late, or not sampled)", (unsigned long) rd->number, sa->has_stage ? sa->stage : 0, p->id);
                coord_reply_error(c, &m->route, seq, PSNET__STATUS__STATUS_STALE, reason);
                return;
        }
        int st = PSNET__STATUS__STATUS_INVALID;
        reason[0] = '\0';
        if (s->stage == 1) {
                if (s->u1[i])
                        snprintf(reason, sizeof reason, "edge %u sent its keys already", p->id);
                else if (!key_ok(&sa->mask_key, sa->has_mask_key) || !key_ok(&sa->share_key, sa->has_share_key) ||
                         !sa->has_examples || sa->examples == 0)
                        snprintf(reason, sizeof reason, "stage 1 carries two 32-byte public keys and examples >= 1");
                else {
                        for (size_t j = 0; j < s->n && !reason[0]; j++)
                                if (s->u1[j] && (!memcmp(s->mask_pk[j], sa->mask_key.data, SECAGG_KEY) ||
                                                 !memcmp(s->share_pk[j], sa->share_key.data, SECAGG_KEY)))
                                        snprintf(reason, sizeof reason, "edge %u's keys are another client's",
                                                 p->id);
                        if (!reason[0]) {
                                memcpy(s->mask_pk[i], sa->mask_key.data, SECAGG_KEY);
                                memcpy(s->share_pk[i], sa->share_key.data, SECAGG_KEY);
                                s->examples[i] = sa->examples;
                                s->u1[i] = true;
                        }
                }
        } else if (s->stage == 2) {
                /* One box for every other member of U1, each from this client. */
                size_t want = s->n1 - 1, ok = 0;
                if (!s->u1[i] || s->u2[i])
                        snprintf(reason, sizeof reason, "edge %u is not in stage 2 or sent its shares already", p->id);
                else if (sa->n_boxes != want)
                        snprintf(reason, sizeof reason, "stage 2 carries %zu boxes, one for each of the %zu other "
                                 "clients", sa->n_boxes, want);
                for (size_t b = 0; b < sa->n_boxes && !reason[0]; b++) {
                        const Psnet__SecAggBox *x = sa->boxes[b];
                        size_t to = place(f, x->to);
                        if (x->from != p->id || to == f->nclients || to == i || !s->u1[to] ||
                            x->box.len != SECAGG_BOX || s->has_box[i * s->n + to])
                                snprintf(reason, sizeof reason, "box %zu (%u -> %u) is not one box of %u bytes from "
                                         "this client to another in stage 2", b, x->from, x->to, SECAGG_BOX);
                        else {
                                memcpy(s->boxes + (i * s->n + to) * SECAGG_BOX, x->box.data, SECAGG_BOX);
                                s->has_box[i * s->n + to] = true;
                                ok++;
                        }
                }
                if (!reason[0] && ok == want)
                        s->u2[i] = true;
                else
                        for (size_t to = 0; to < s->n; to++)
                                s->has_box[i * s->n + to] = false;
        } else if (s->stage == 4) {
                /* One share for each member of U2: of its self seed if it
                 * counts, of its mask key otherwise. */
                if (!f->answered[i] || s->revealed[i])
                        snprintf(reason, sizeof reason, "edge %u is not a survivor or sent its shares already", p->id);
                else if (sa->n_secrets != s->n2)
                        snprintf(reason, sizeof reason, "stage 4 carries %zu shares, one for each of the %zu clients "
                                 "of stage 3", sa->n_secrets, s->n2);
                size_t ok = 0;
                _cleanup_free_ bool *seen = ps_calloc(s->n, sizeof *seen);
                if (!seen)
                        snprintf(reason, sizeof reason, "out of memory");
                for (size_t k = 0; k < sa->n_secrets && !reason[0]; k++) {
                        const Psnet__SecAggSecret *x = sa->secrets[k];
                        size_t v = place(f, x->client);
                        if (v == f->nclients || !s->u2[v] || seen[v] || x->self != f->answered[v] ||
                            x->value.len != SECAGG_KEY)
                                snprintf(reason, sizeof reason, "share %zu (of client %u) is not the %s share of a "
                                         "client of stage 3", k, x->client, v < f->nclients && f->answered[v] ?
                                         "self seed's" : "mask key's");
                        else {
                                memcpy(s->shares[i * s->n + v], x->value.data, SECAGG_KEY);
                                seen[v] = true;
                                ok++;
                        }
                }
                if (!reason[0] && ok == s->n2) {
                        s->revealed[i] = true;
                        s->nrevealed++;
                } else
                        sodium_memzero(s->shares + i * s->n, s->n * SECAGG_KEY);
        } else
                snprintf(reason, sizeof reason, "round %lu takes updates now, not secure aggregation messages",
                         (unsigned long) f->number);
        if (reason[0]) {
                log_warning("secure aggregation refused edge=%u stage=%u reason=\"%s\"", p->id, s->stage, reason);
                coord_reply_error(c, &m->route, seq, st, reason);
                return;
        }
        (void) coord_reply_job(c, &m->route, seq, "taken");
        coord_todo(c, TODO_FED_POLL);
}
