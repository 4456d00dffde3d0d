/* SPDX-License-Identifier: Apache-2.0 */
/* A federated job's rounds as data and messages, below the parts that run
 * them (coord-fed.c, coord-secagg.c, coord-fedasync.c): the FedRounds state
 * reset and freed, the rounds' records, the view psctl status, the state
 * file and a checkpoint keep of them and their restoring, and sending a
 * round to the shards and to one edge worker. It decides nothing. */
#include <sodium.h>
#include "ckpt-manifest.h"
#include "coord-internal.h"
#include "secagg.h"

static const char *phase_name(FedPhase p) {
        static const char *const names[] = { "waiting", "opening", "training", "unmasking", "closing", "evaluating",
                                             "done", "testing", "scoring", "aggregating" };
        return p <= FED_AGGREGATING ? names[p] : "?";
}

void coord_rounds_clear(FedRounds *f) {
        ps_free(f->clients);
        ps_free(f->answered);
        ps_free(f->declined);
        ps_free(f->examples);
        ps_free(f->loss);
        ps_free(f->shard_replied);
        ps_free(f->shard_ids);
        f->shard_ids = NULL;
        ps_free(f->scored);
        ps_free(f->dist);
        f->scored = NULL;
        f->dist = NULL;
        f->nscored = 0;
        f->clients = NULL;
        f->answered = NULL;
        f->declined = NULL;
        f->examples = NULL;
        f->loss = NULL;
        f->shard_replied = NULL;
        f->nclients = f->nanswered = f->replies = f->expected = 0;
        coord_secagg_clear(f);
}

void coord_fed_free(Coord *c) {
        coord_rounds_clear(&c->fed);
        coord_fedasync_free(&c->fed);
        c->fed.closing = mfree(c->fed.closing);
        c->fed.closing_len = 0;
}

void coord_fed_reset(Coord *c) {
        coord_fed_free(c);
        memset(&c->fed, 0, sizeof c->fed);
}

/* The newest record of pscoord's round number v, or (by_round) of the
 * aggregated round v; NULL when none is kept. */
static FedRecord *record_where(FedRounds *f, bool by_round, uint64_t v) {
        for (size_t k = 0; k < f->nhist; k++) {
                FedRecord *r = &f->hist[(f->hist_end + COORD_FED_HISTORY - 1 - k) % COORD_FED_HISTORY];
                if ((by_round ? r->round : r->number) == v)
                        return r;
        }
        return NULL;
}

FedRecord *coord_fed_record_find(FedRounds *f, uint64_t number) {
        return record_where(f, false, number);
}

FedRecord *coord_fed_record_new(FedRounds *f) {
        FedRecord *r = &f->hist[f->hist_end];
        f->hist_end = (f->hist_end + 1) % COORD_FED_HISTORY;
        f->nhist = MIN(f->nhist + 1, (size_t) COORD_FED_HISTORY);
        memset(r, 0, sizeof *r);
        return r;
}

/* Whether rounds sample by Poisson sampling: with central DP noise, each
 * connected client joins with probability --fraction on its own (the round's
 * size varies), as DP-FedAvg's accountant assumes; otherwise a fixed
 * max(min_clients, ceil(fraction x available)). */
bool coord_fed_poisson(const Coord *c) { return c->job.fed.strategy.dp_noise > 0; }

bool coord_fed_available(const Peer *p) {
        return p->role == PSNET__ROLE__ROLE_EDGE && !p->detached;
}

int coord_fed_send_edge(Coord *c, const Peer *p, Psnet__Round *rd) {
        if (!p)
                return -ENOTCONN;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROUND);
        h.body_case = PSNET__HEADER__BODY_ROUND;
        h.round = rd;
        return coord_reply_hdr(c, &p->route, &h, 0);
}

int coord_fed_send_round(Coord *c, Psnet__Round *rd) {
        FedRounds *f = &c->fed;
        size_t ns = shardmap_size(c->map);
        ps_free(f->shard_replied);
        ps_free(f->shard_ids);
        f->shard_replied = ps_calloc(ns ? ns : 1, sizeof *f->shard_replied);
        f->shard_ids = ps_calloc(ns ? ns : 1, sizeof *f->shard_ids);
        if (!f->shard_replied || !f->shard_ids)
                return -ENOMEM;
        for (size_t i = 0; i < ns; i++)
                f->shard_ids[i] = shardmap_shard(c->map, i)->id;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROUND);
        h.body_case = PSNET__HEADER__BODY_ROUND;
        h.round = rd;
        f->replies = 0;
        f->expected = ns;
        f->shard_number = rd->number;
        f->shard_deadline = now_ms() + MAX(FED_SHARD_WAIT_MS, c->job.fed.round_timeout_ms);
        for (size_t i = 0; i < ns; i++) {
                const ShardDesc *sd = shardmap_shard(c->map, i);
                Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, sd->id);
                int r = p && !p->detached ? coord_reply_hdr(c, &p->route, &h, f->number) : -ENOTCONN;
                if (r < 0)
                        return r;
        }
        return 0;
}

void coord_fed_accuracy(Coord *c, uint32_t round, float accuracy) {
        FedRecord *r = record_where(&c->fed, true, round);
        if (r && r->accuracy < 0)
                r->accuracy = accuracy;
}

/* --eval-every: one edge worker (the lowest id connected) tests the model
 * while the rounds go on; its answer (edge_eval) joins the round's record. */
void coord_fed_evaluate_round(Coord *c) {
        FedRounds *f = &c->fed;
        Peer *e = NULL;
        for (size_t i = 0; i < c->npeers; i++)
                if (coord_fed_available(&c->peers[i]) && (!e || c->peers[i].id < e->id))
                        e = &c->peers[i];
        if (!e)
                return;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_evaluate = rd.evaluate = rd.has_round = true;
        rd.round = f->done;
        int r = coord_fed_send_edge(c, e, &rd);
        if (r < 0)
                log_warning_errno(r, "Failed to ask edge=%u to test round %u's model: %m", e->id, f->done);
}

int coord_fed_restore(Coord *c, const Psnet__FedStatus *s, const double *rdp, size_t nrdp, uint64_t rdp_steps,
                      char *err, size_t n) {
        FedRounds *f = &c->fed;
        if (s->n_history > COORD_FED_HISTORY || (nrdp && nrdp != RDP_NORDERS && nrdp != RDP_NINT) || s->rounds_done > c->job.fed.rounds) {
                snprintf(err, n, "its federated rounds (%zu records, %zu RDP orders, %u of %u rounds done)",
                         s->n_history, nrdp, s->rounds_done, c->job.fed.rounds);
                return -EBADMSG;
        }
        coord_fed_reset(c);
        f->number = s->number;
        f->done = s->rounds_done;
        f->failed = s->failed;
        f->late = s->late;
        f->refused = s->refused;
        f->epsilon = s->has_epsilon ? s->epsilon : 0;
        for (size_t k = 0; k < nrdp; k++)
                f->privacy.rdp[k] = rdp[k];
        /* An account saved before fractional orders: those are left out (+inf). */
        for (size_t k = nrdp; nrdp && k < RDP_NORDERS; k++)
                f->privacy.rdp[k] = INFINITY;
        f->privacy.steps = rdp_steps;
        for (size_t k = 0; k < s->n_history; k++) {
                const Psnet__RoundRecord *o = s->history[k];
                FedRecord *r = coord_fed_record_new(f);
                r->number = o->number;
                r->round = o->round;
                r->sampled = o->sampled;
                r->answered = o->answered;
                r->late = o->late;
                r->dropped = o->dropped;
                r->refused = o->refused;
                r->available = o->available;
                r->loss = o->loss;
                r->seconds = o->seconds;
                r->epsilon = o->has_epsilon ? o->epsilon : -1;
                r->bytes_up = o->bytes_up;
                r->bytes_raw = o->bytes_raw;
                r->accuracy = o->has_accuracy ? o->accuracy : -1;
                r->fed_accuracy = o->has_fed_accuracy ? o->fed_accuracy : -1;
                r->fed_loss = o->has_fed_loss ? o->fed_loss : -1;
                r->fed_examples = o->fed_examples;
                r->fed_clients = o->fed_clients;
                snprintf(r->note, sizeof r->note, "%s", o->note ? o->note : "");
        }
        f->phase = FED_WAITING;
        return 0;
}

void coord_fed_view_free(FedView *v) {
        ps_free(v->recs);
        ps_free(v->recp);
        v->recs = NULL;
        v->recp = NULL;
}

int coord_fed_status(Coord *c, FedView *v) {
        FedRounds *f = &c->fed;
        Psnet__FedStatus *s = &v->fs;
        Psnet__RoundRecord *recs = v->recs = ps_calloc(MAX(f->nhist, (size_t) 1), sizeof *recs);
        Psnet__RoundRecord **recp = v->recp = ps_calloc(MAX(f->nhist, (size_t) 1), sizeof *recp);
        psnet__fed_status__init(s);
        if (!recs || !recp) {
                coord_fed_view_free(v);
                return -ENOMEM;
        }
        size_t avail = 0;
        for (size_t i = 0; i < c->npeers; i++)
                avail += coord_fed_available(&c->peers[i]);
        s->has_rounds_done = s->has_rounds = s->has_number = s->has_sampled = s->has_answered = true;
        s->has_available = s->has_failed = s->has_late = s->has_round_ms = true;
        s->rounds_done = f->done;
        s->rounds = c->job.fed.rounds;
        s->number = f->number;
        s->phase = (char *) (c->state == JOB_DONE ? "done" : phase_name(f->phase));
        /* fedasync: the clients training now, and the updates buffered. */
        s->sampled = (uint32_t) (c->job.fed.async ? f->ntasks + f->nbuf : f->nclients);
        s->answered = (uint32_t) (c->job.fed.async ? f->nbuf : f->nanswered);
        s->available = (uint32_t) avail;
        s->failed = f->failed;
        s->late = f->late;
        s->has_refused = f->refused > 0;
        s->refused = f->refused;
        s->round_ms = f->phase == FED_TRAINING ? now_ms() - f->opened_ms : 0;
        if (c->job.fed.async)
                snprintf(v->sampling, sizeof v->sampling, "fedasync: every idle client gets a task");
        else if (coord_fed_poisson(c))
                snprintf(v->sampling, sizeof v->sampling, "poisson q=%g: each connected client on its own",
                         (double) c->job.fed.fraction);
        else
                snprintf(v->sampling, sizeof v->sampling, "fixed: max(%u, ceil(%g x connected)) clients",
                         c->job.fed.min_clients, (double) c->job.fed.fraction);
        s->sampling = v->sampling;
        if (c->job.fed.strategy.dp_noise > 0) {
                s->has_epsilon = s->has_dp_delta = true;
                s->epsilon = f->epsilon;
                s->dp_delta = c->job.fed.dp_delta;
                s->accountant = (char *) RDP_ACCOUNTANT_TEXT;
        }
        for (size_t k = 0; k < f->nhist; k++) {
                const FedRecord *r = &f->hist[(f->hist_end + COORD_FED_HISTORY - f->nhist + k) % COORD_FED_HISTORY];
                Psnet__RoundRecord *o = &recs[k];
                psnet__round_record__init(o);
                o->number = r->number;
                o->has_round = o->has_sampled = o->has_answered = o->has_late = o->has_dropped = true;
                o->has_loss = o->has_seconds = true;
                o->round = r->round;
                o->sampled = r->sampled;
                o->answered = r->answered;
                o->late = r->late;
                o->dropped = r->dropped;
                if (r->refused) {
                        o->has_refused = true;
                        o->refused = r->refused;
                }
                o->loss = r->loss;
                o->seconds = r->seconds;
                o->has_available = true;
                o->available = r->available;
                if (r->epsilon >= 0) {
                        o->has_epsilon = true;
                        o->epsilon = r->epsilon;
                }
                o->has_bytes_up = o->has_bytes_raw = true;
                o->bytes_up = r->bytes_up;
                o->bytes_raw = r->bytes_raw;
                if (r->accuracy >= 0) {
                        o->has_accuracy = true;
                        o->accuracy = r->accuracy;
                }
                if (r->fed_clients) {
                        o->has_fed_accuracy = r->fed_accuracy >= 0;
                        o->fed_accuracy = r->fed_accuracy;
                        o->has_fed_loss = r->fed_loss >= 0;
                        o->fed_loss = r->fed_loss;
                        o->has_fed_examples = o->has_fed_clients = true;
                        o->fed_examples = r->fed_examples;
                        o->fed_clients = r->fed_clients;
                }
                o->note = r->note[0] ? (char *) r->note : NULL;
                recp[k] = o;
        }
        s->n_history = f->nhist;
        s->history = recp;
        return 0;
}

void coord_secagg_clear(FedRounds *f) {
        FedSecAgg *s = &f->sa;
        if (s->shares)
                sodium_memzero(s->shares, s->n * s->n * SECAGG_KEY);
        ps_free(s->u1);
        ps_free(s->u2);
        ps_free(s->revealed);
        ps_free(s->x);
        ps_free(s->mask_pk);
        ps_free(s->share_pk);
        ps_free(s->examples);
        ps_free(s->boxes);
        ps_free(s->has_box);
        ps_free(s->shares);
        memset(s, 0, sizeof *s);
}

void coord_fedasync_free(FedRounds *f) {
        ps_free(f->tasks);
        ps_free(f->buf);
        f->tasks = f->buf = NULL;
        f->ntasks = f->nbuf = f->cap_tasks = f->cap_buf = f->applying = 0;
}

int coord_fed_resume(Coord *c, char *reason, size_t n) {
        char err[PATH_MAX + 200];
        Psnet__CheckpointManifest *m = NULL;
        int r = ckpt_manifest_read(c->restore.dir, &m, err, sizeof err);
        if (r < 0) {
                snprintf(reason, n, "checkpoint %s: %s", c->restore.name, err);
                return r;
        }
        r = m->fed ? coord_fed_restore(c, m->fed, m->fed_rdp, m->n_fed_rdp, m->fed_rdp_steps, err, sizeof err)
                   : -EBADMSG;
        if (r < 0)
                snprintf(reason, n, "checkpoint %s: %s", c->restore.name, m->fed ? err : "no federated rounds in it");
        else
                log_info("federated rounds from checkpoint name=%s rounds_done=%u number=%lu records=%zu epsilon=%.4f",
                         c->restore.name, c->fed.done, (unsigned long) c->fed.number, c->fed.nhist, c->fed.epsilon);
        psnet__checkpoint_manifest__free_unpacked(m, NULL);
        return r;
}

