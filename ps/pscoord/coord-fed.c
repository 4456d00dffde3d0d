/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's federated rounds (mode fed). One round at a time:
 *
 *   WAITING  --min-available edge workers connected-->  OPENING: the round's
 *   sample goes to every shard of the map (MSG_ROUND), which make room for
 *   its updates  --every shard answered-->  TRAINING: each sampled client is
 *   told to train (MSG_ROUND); it pulls, trains locally, pushes its delta to
 *   the shards and then tells pscoord (MSG_ROUND_REP)  --every sampled client
 *   answered or left, or --round-timeout-->  CLOSING: the shards aggregate the
 *   updates of the clients that answered (MSG_ROUND close) when at least
 *   --min-clients did, else drop them all and the round runs again with a
 *   fresh sample  --every shard answered-->  WAITING (the next round) or,
 *   after --rounds, EVALUATING: one edge worker pulls the final model and
 *   reports its accuracy (MSG_RESULT); the job is done.
 *
 * A client is counted only once its pushes are acknowledged by every shard
 * and pscoord accepted its answer while the round was open; the close names
 * exactly those clients, so every shard aggregates the same set. A round
 * never waits for a client that left, and never longer than its time-out. */
#include <signal.h>
#include <stdlib.h>
#include "hash.h"
#include "coord-internal.h"
#include "secagg.h"

#define FED_MAX_SHARD_FAILURES 5u /* closes in a row a shard refused: the job fails */
#define FED_RETRY_MS 100u         /* a shard not ready to open a round: asked again after this */

/* The edge workers connected now, in *ret (freed by the caller); NULL when
 * out of memory. */
static Peer **available(Coord *c, size_t *ret_n) {
        Peer **avail = ps_malloc((c->npeers ? c->npeers : 1) * sizeof *avail);
        size_t n = 0;
        for (size_t i = 0; avail && i < c->npeers; i++)
                if (coord_fed_available(&c->peers[i]))
                        avail[n++] = &c->peers[i];
        *ret_n = n;
        return avail;
}

/* Moves k of avail[0..n) into avail[0..k), uniformly (a partial shuffle
 * seeded by *x). */
static void sample_uniform(Peer **avail, size_t n, size_t k, uint64_t *x) {
        for (size_t i = 0; i < k; i++) {
                size_t j = i + (size_t) (splitmix64_next(x) % (n - i));
                Peer *t = avail[i];
                avail[i] = avail[j];
                avail[j] = t;
        }
}

/* Samples the round's clients among those connected: a fixed number,
 * uniformly (a seeded partial shuffle), or by Poisson sampling. */
static int round_open(Coord *c, Peer **avail, size_t navail) {
        FedRounds *f = &c->fed;
        const FedConf *fc = &c->job.fed;
        uint64_t x = c->job.seed * 0x9e3779b97f4a7c15ull + f->number + 1;
        size_t k;
        if (coord_fed_poisson(c)) {
                /* Each client in with probability q (a seeded uniform in [0, 1) each). */
                k = 0;
                for (size_t i = 0; i < navail; i++)
                        if ((double) (splitmix64_next(&x) >> 11) * 0x1.0p-53 < (double) fc->fraction) {
                                Peer *t = avail[k];
                                avail[k++] = avail[i];
                                avail[i] = t;
                        }
                if (fc->secagg && k > SECAGG_MAX_CLIENTS) {
                        log_warning("round sampled %zu clients, more than secure aggregation's %u: the first %u "
                                    "take part", k, SECAGG_MAX_CLIENTS, SECAGG_MAX_CLIENTS);
                        k = SECAGG_MAX_CLIENTS;
                }
        } else {
                /* The fraction is a float: 0.1f x 1000 is 100.0000015, which means 100. */
                k = (size_t) ceil((double) fc->fraction * (double) navail - 1e-5);
                k = MIN(MAX(k, (size_t) fc->min_clients), navail);
                if (fc->secagg && k > SECAGG_MAX_CLIENTS)
                        k = SECAGG_MAX_CLIENTS; /* Shamir's shares over GF(2^8) */
                sample_uniform(avail, navail, k, &x);
        }
        coord_rounds_clear(f);
        size_t k1 = k ? k : 1; /* a Poisson sample may be empty: the round then fails and runs again */
        f->clients = ps_malloc(k1 * sizeof *f->clients);
        f->answered = ps_calloc(k1, sizeof *f->answered);
        f->declined = ps_calloc(k1, sizeof *f->declined);
        f->examples = ps_calloc(k1, sizeof *f->examples);
        f->loss = ps_calloc(k1, sizeof *f->loss);
        if (!f->clients || !f->answered || !f->declined || !f->examples || !f->loss)
                return -ENOMEM;
        for (size_t i = 0; i < k; i++)
                f->clients[i] = avail[i]->id;
        /* Ascending ids: every shard sums in the same order. */
        for (size_t i = 1; i < k; i++)
                for (size_t j = i; j > 0 && f->clients[j - 1] > f->clients[j]; j--) {
                        uint32_t t = f->clients[j];
                        f->clients[j] = f->clients[j - 1];
                        f->clients[j - 1] = t;
                }
        f->nclients = k;
        f->number++;
        f->phase = FED_OPENING;
        f->opened_ms = now_ms();
        FedRecord *r = coord_fed_record_new(f);
        r->number = f->number;
        r->sampled = (uint32_t) k;
        r->available = (uint32_t) navail;
        r->epsilon = -1;
        r->accuracy = -1;
        r->fed_accuracy = r->fed_loss = -1;
        log_info("round opening number=%lu round=%u/%u sampled=%zu available=%zu", (unsigned long) f->number,
                 f->done + 1, fc->rounds, k, navail);
        return coord_fed_send_shards(c, false, f->clients, k, NULL);
}

/* Every shard made room: the sampled clients train. */
static void round_train(Coord *c) {
        FedRounds *f = &c->fed;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_round = rd.has_timeout_ms = true;
        rd.round = f->done + 1;
        rd.timeout_ms = c->job.fed.round_timeout_ms;
        Psnet__SecAgg sa = PSNET__SEC_AGG__INIT;
        if (c->job.fed.secagg) {
                sa.has_stage = sa.has_clip = true;
                sa.stage = 1;
                sa.clip = c->job.fed.secagg_clip;
                rd.secagg = &sa;
                if (coord_secagg_start(c) < 0) {
                        coord_job_fail(c, "out of memory starting a round's secure aggregation");
                        return;
                }
        }
        f->phase = FED_TRAINING;
        f->opened_ms = now_ms();
        f->deadline = f->opened_ms + c->job.fed.round_timeout_ms;
        for (size_t i = 0; i < f->nclients; i++) {
                int r = coord_fed_send_edge(c, coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]), &rd);
                if (r < 0)
                        log_warning_errno(r, "Failed to send round %lu to edge=%u: %m", (unsigned long) f->number,
                                          f->clients[i]);
        }
}

/* Training is over for this round (everyone answered or left, or time is
 * up): the shards aggregate, or drop the updates when too few came. */
/* krum, multi-krum: the shards score the n updates counted (FED_SCORING). */
static void scoring_open(Coord *c, size_t n) {
        FedRounds *f = &c->fed;
        _cleanup_free_ uint32_t *ids = ps_malloc(n * sizeof *ids);
        f->scored = ps_malloc(n * sizeof *f->scored);
        f->dist = ps_calloc(n * n, sizeof *f->dist);
        if (!ids || !f->scored || !f->dist) {
                coord_job_fail(c, "out of memory scoring a round's updates");
                return;
        }
        f->nscored = 0;
        for (size_t i = 0; i < f->nclients; i++)
                if (f->answered[i]) {
                        ids[f->nscored] = f->clients[i];
                        f->scored[f->nscored++] = i;
                }
        f->phase = FED_SCORING;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_round = true;
        rd.round = f->done + 1;
        rd.n_clients = n;
        rd.clients = ids;
        rd.has_score = rd.score = true;
        int r = coord_fed_send_round(c, &rd);
        if (r < 0) {
                char reason[160];
                snprintf(reason, sizeof reason, "cannot score round %lu on the shards: %s", (unsigned long) f->number,
                         strerror(-r));
                coord_job_fail(c, reason);
        }
}

/* A shard's squared distances: added to the sum. false: not what was asked. */
static bool scoring_add(Coord *c, const Psnet__Round *rd) {
        FedRounds *f = &c->fed;
        size_t n = f->nscored;
        if (!(rd->has_score && rd->score) || rd->n_distances != n * (n - 1) / 2)
                return false;
        size_t q = 0;
        for (size_t a = 0; a < n; a++)
                for (size_t b = a + 1; b < n; b++, q++) {
                        if (!(rd->distances[q] >= 0) || !isfinite(rd->distances[q]))
                                return false;
                        f->dist[a * n + b] += rd->distances[q];
                        f->dist[b * n + a] += rd->distances[q];
                }
        return true;
}

/* The close goes to the shards: with the n updates ids (0: the round is dropped). */
static void close_send(Coord *c, const uint32_t *ids, size_t n) {
        FedRounds *f = &c->fed;
        f->phase = FED_CLOSING;
        int r = coord_fed_send_shards(c, true, ids, n, NULL);
        if (r < 0) {
                char reason[160];
                snprintf(reason, sizeof reason, "cannot close round %lu on the shards: %s", (unsigned long) f->number,
                         strerror(-r));
                coord_job_fail(c, reason);
        }
}

/* Every shard scored: pick by Krum score and close with the updates kept. */
static void scoring_done(Coord *c) {
        FedRounds *f = &c->fed;
        size_t n = f->nscored;
        _cleanup_free_ double *scratch = ps_malloc(n * sizeof *scratch), *scores = ps_malloc(n * sizeof *scores);
        _cleanup_free_ unsigned char *keep = ps_calloc(n, 1);
        _cleanup_free_ uint32_t *ids = ps_malloc(n * sizeof *ids);
        if (!scratch || !scores || !keep || !ids) {
                coord_job_fail(c, "out of memory picking a round's updates by Krum score");
                return;
        }
        size_t kept = fed_krum_select(&c->job.fed.strategy, f->dist, n, scratch, scores, keep);
        size_t m = 0;
        char left[64] = "";
        size_t ll = 0;
        for (size_t i = 0; i < n; i++) {
                uint32_t id = f->clients[f->scored[i]];
                if (keep[i])
                        ids[m++] = id;
                else {
                        if (ll < sizeof left)
                                ll += (size_t) snprintf(left + ll, sizeof left - ll, "%s%u", ll ? "," : "", id);
                        log_info("update left out by its Krum score edge=%u number=%lu score=%.6g",
                                 id, (unsigned long) f->number, scores[i]);
                }
        }
        FedRecord *rec = coord_fed_record_find(f, f->number);
        if (rec)
                snprintf(rec->note, sizeof rec->note, "%s kept %zu of %zu%s%s", fed_strategy_name(c->job.fed.strategy.kind),
                         kept, n, m < n ? ", left out " : "", m < n ? left : "");
        log_info("round scored number=%lu strategy=%s kept=%zu of=%zu left_out=\"%s\"", (unsigned long) f->number,
                 fed_strategy_name(c->job.fed.strategy.kind), kept, n, left);
        close_send(c, ids, m);
}

/* The clients whose updates count (answered), ascending: n of them in *ret. */
static int answered_ids(FedRounds *f, uint32_t **ret, size_t *n) {
        *ret = ps_malloc((f->nclients ? f->nclients : 1) * sizeof **ret);
        if (!*ret)
                return -ENOMEM;
        *n = 0;
        for (size_t i = 0; i < f->nclients; i++)
                if (f->answered[i])
                        (*ret)[(*n)++] = f->clients[i];
        return 0;
}

static Peer *strategy_peer(Coord *c) {
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_STRATEGY && !c->peers[i].detached)
                        return &c->peers[i];
        return NULL;
}

/* --strategy custom (FED_AGGREGATING): the strategy process connected is
 * asked to aggregate the updates counted; with none connected the round
 * waits for one until --round-timeout. */
static void strategy_ask(Coord *c) {
        FedRounds *f = &c->fed;
        Peer *p = strategy_peer(c);
        if (!p) {
                if (!f->said_strategy)
                        log_info("round waits for the job's strategy process (psnet.fed.start_strategy) "
                                 "number=%lu", (unsigned long) f->number);
                f->said_strategy = true;
                return;
        }
        _cleanup_free_ uint32_t *ids = NULL;
        size_t n;
        _cleanup_free_ uint64_t *ex = ps_malloc((f->nclients ? f->nclients : 1) * sizeof *ex);
        _cleanup_free_ float *loss = ps_malloc((f->nclients ? f->nclients : 1) * sizeof *loss);
        if (answered_ids(f, &ids, &n) < 0 || !ex || !loss) {
                coord_job_fail(c, "out of memory asking the strategy to aggregate a round");
                return;
        }
        for (size_t i = 0, k = 0; i < f->nclients; i++)
                if (f->answered[i]) {
                        ex[k] = f->examples[i];
                        loss[k++] = f->loss[i];
                }
        uint64_t now = now_ms();
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_round = rd.has_aggregate = rd.aggregate = rd.has_timeout_ms = true;
        rd.round = f->done + 1;
        rd.timeout_ms = (uint32_t) (f->deadline > now ? f->deadline - now : 1);
        rd.n_clients = rd.n_client_examples = rd.n_client_losses = n;
        rd.clients = ids;
        rd.client_examples = ex;
        rd.client_losses = loss;
        int r = coord_fed_send_edge(c, p, &rd);
        if (r < 0) {
                log_warning_errno(r, "Failed to ask strategy=%u to aggregate round %lu: %m", p->id,
                                  (unsigned long) f->number);
                return;
        }
        f->strategy_asked = p->id;
        log_info("round aggregating number=%lu strategy=%u updates=%zu", (unsigned long) f->number, p->id, n);
}

/* The strategy gave no delta (declined, left, or time ran out): the round
 * is dropped and runs again with a fresh sample. */
static void strategy_failed(Coord *c, const char *why) {
        FedRounds *f = &c->fed;
        FedRecord *rec = coord_fed_record_find(f, f->number);
        if (rec)
                snprintf(rec->note, sizeof rec->note, "strategy: %s", why);
        log_warning("round not aggregated by the strategy number=%lu reason=\"%s\"", (unsigned long) f->number, why);
        f->aggregate = false;
        close_send(c, NULL, 0);
}

static void aggregating_poll(Coord *c, uint64_t now) {
        FedRounds *f = &c->fed;
        if (f->strategy_asked && !coord_find_peer(c, PSNET__ROLE__ROLE_STRATEGY, f->strategy_asked)) {
                log_warning("strategy left while it aggregated a round strategy=%u number=%lu", f->strategy_asked,
                            (unsigned long) f->number);
                f->strategy_asked = 0; /* a strategy that connects in time is asked again */
        }
        if (now >= f->deadline)
                strategy_failed(c, f->strategy_asked ? "it did not answer within --round-timeout"
                                                     : "no strategy process connected within --round-timeout");
        else if (!f->strategy_asked)
                strategy_ask(c);
}

/* The strategy's answer: its delta is on every shard (or it declined). */
static void strategy_rep(Coord *c, WireMsg *m, Peer *p) {
        FedRounds *f = &c->fed;
        const Psnet__Round *rd = m->hdr->round;
        if (c->state != JOB_RUNNING || c->job.mode != MODE_FED || f->phase != FED_AGGREGATING ||
            rd->number != f->number || p->id != f->strategy_asked) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_STALE,
                                  "this strategy was not asked to aggregate that round now (or its answer came after "
                                  "--round-timeout): not taken");
                return;
        }
        (void) coord_reply_job(c, &m->route, m->hdr->seq, rd->decline ? "declined" : "taken");
        if (rd->decline) {
                char why[96];
                snprintf(why, sizeof why, "%s", rd->decline);
                strategy_failed(c, why);
                return;
        }
        _cleanup_free_ uint32_t *ids = NULL;
        size_t n;
        if (answered_ids(f, &ids, &n) < 0) {
                coord_job_fail(c, "out of memory closing a round");
                return;
        }
        FedRecord *rec = coord_fed_record_find(f, f->number);
        if (rec)
                snprintf(rec->note, sizeof rec->note, "custom: strategy %u", p->id);
        log_info("round aggregated by the strategy number=%lu strategy=%u updates=%zu", (unsigned long) f->number,
                 p->id, n);
        close_send(c, ids, n);
}

void coord_fed_close(Coord *c, const char *why) {
        FedRounds *f = &c->fed;
        FedRecord *rec = coord_fed_record_find(f, f->number);
        _cleanup_free_ uint32_t *ids = ps_malloc((f->nclients ? f->nclients : 1) * sizeof *ids);
        size_t n = 0;
        double loss = 0;
        uint64_t examples = 0;
        if (!ids) {
                coord_job_fail(c, "out of memory closing a round");
                return;
        }
        size_t refused = 0;
        for (size_t i = 0; i < f->nclients; i++)
                refused += f->declined[i];
        for (size_t i = 0; i < f->nclients; i++)
                if (f->answered[i]) {
                        ids[n++] = f->clients[i];
                        loss += (double) f->loss[i] * (double) f->examples[i];
                        examples += f->examples[i];
                }
        f->aggregate = n >= c->job.fed.min_clients && (!c->job.fed.secagg || n >= f->sa.t);
        if (rec) {
                rec->answered = (uint32_t) n;
                rec->dropped = (uint32_t) (f->nclients - n - refused);
                rec->loss = examples ? (float) (loss / (double) examples) : 0.0f;
                rec->seconds = (float) (now_ms() - f->opened_ms) / 1000.0f;
                if (!f->aggregate)
                        snprintf(rec->note, sizeof rec->note, "%zu of the %u updates it needs (%s)", n,
                                 MAX(c->job.fed.min_clients, c->job.fed.secagg ? f->sa.t : 0), why);
        }
        log_info("round closing number=%lu answered=%zu sampled=%zu why=\"%s\"%s", (unsigned long) f->number, n,
                 f->nclients, why, f->aggregate ? "" : " aggregate=no");
        if (f->aggregate && fed_is_krum(c->job.fed.strategy.kind) && n > 1) {
                scoring_open(c, n);
                return;
        }
        if (f->aggregate && c->job.fed.secagg) {
                coord_secagg_unmask(c);
                return;
        }
        if (f->aggregate && c->job.fed.strategy.kind == FED_CUSTOM) {
                f->phase = FED_AGGREGATING;
                f->deadline = now_ms() + c->job.fed.round_timeout_ms;
                f->strategy_asked = 0;
                f->said_strategy = false;
                strategy_ask(c);
                return;
        }
        close_send(c, ids, f->aggregate ? n : 0);
}

/* A private round was released (noise on the shards): its RDP at the
 * sampling rate q = --fraction of its Poisson sampling joins the account. */
static void privacy_spent(Coord *c, FedRecord *rec) {
        FedRounds *f = &c->fed;
        float z = c->job.fed.strategy.dp_noise;
        if (z <= 0 || !rec || rec->available == 0)
                return;
        double q = (double) c->job.fed.fraction;
        if (rdp_account_step(&f->privacy, q, z) < 0 ||
            rdp_account_epsilon(&f->privacy, c->job.fed.dp_delta, RDP_TIGHT, &f->epsilon, NULL) < 0) {
                log_warning("round %lu: the privacy accountant refused q=%g sigma=%g", (unsigned long) rec->number, q,
                            (double) z);
                return;
        }
        rec->epsilon = f->epsilon;
        log_info("privacy spent round=%u epsilon=%.4f delta=%g q=%.4f noise=%g", f->done, f->epsilon,
                 (double) c->job.fed.dp_delta, q, (double) z);
}

/* --fraction-evaluate: max(1, ceil(F x connected)) clients, uniformly, test
 * the model of the round just aggregated on their own data; the next round
 * opens once they answered (or declined, or left) or at --round-timeout. */
static void testing_open(Coord *c) {
        FedRounds *f = &c->fed;
        size_t navail;
        _cleanup_free_ Peer **avail = available(c, &navail);
        if (!avail)
                return;
        size_t k = (size_t) ceil((double) c->job.fed.fraction_evaluate * (double) navail - 1e-5);
        k = MIN(MAX(k, (size_t) 1), navail);
        if (k == 0)
                return;
        uint64_t x = c->job.seed * 0xbf58476d1ce4e5b9ull + f->number + 1;
        sample_uniform(avail, navail, k, &x);
        coord_rounds_clear(f);
        f->clients = ps_malloc(k * sizeof *f->clients);
        f->answered = ps_calloc(k, sizeof *f->answered);
        f->declined = ps_calloc(k, sizeof *f->declined);
        if (!f->clients || !f->answered || !f->declined) {
                coord_rounds_clear(f);
                log_warning("out of memory asking clients to test round %u's model: not tested", f->done);
                return;
        }
        for (size_t i = 0; i < k; i++)
                f->clients[i] = avail[i]->id;
        f->nclients = k;
        f->phase = FED_TESTING;
        f->test_acc = f->test_loss = 0;
        f->test_examples = 0;
        f->test_round = f->done;
        f->deadline = now_ms() + c->job.fed.round_timeout_ms;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_evaluate = rd.evaluate = rd.has_round = rd.has_local = rd.local = true;
        rd.round = f->done;
        rd.has_timeout_ms = true;
        rd.timeout_ms = c->job.fed.round_timeout_ms;
        log_info("round testing round=%u clients=%zu available=%zu", f->done, k, navail);
        for (size_t i = 0; i < k; i++) {
                int r = coord_fed_send_edge(c, avail[i], &rd);
                if (r < 0)
                        log_warning_errno(r, "Failed to ask edge=%u to test round %u's model: %m", avail[i]->id,
                                          f->done);
        }
}

/* The clients' tests are in (or time is up): their example-weighted accuracy
 * and loss join the round's record. */
static void testing_done(Coord *c, const char *why) {
        FedRounds *f = &c->fed;
        FedRecord *rec = coord_fed_record_find(f, f->number);
        size_t n = 0;
        for (size_t i = 0; i < f->nclients; i++)
                n += f->answered[i];
        if (rec && n) {
                rec->fed_clients = (uint32_t) n;
                rec->fed_examples = f->test_examples;
                rec->fed_accuracy = (float) (f->test_acc / (double) f->test_examples);
                rec->fed_loss = (float) (f->test_loss / (double) f->test_examples);
        }
        log_info("round tested round=%u clients=%zu asked=%zu examples=%lu accuracy=%.4f loss=%.4f why=\"%s\"",
                 f->test_round, n, f->nclients, (unsigned long) f->test_examples,
                 n ? f->test_acc / (double) f->test_examples : 0.0,
                 n ? f->test_loss / (double) f->test_examples : 0.0, why);
        coord_rounds_clear(f);
        f->phase = FED_WAITING;
        f->said_waiting = false;
        coord_todo(c, TODO_SAVE);
}

/* Every shard has closed the round. */
static void round_closed(Coord *c) {
        FedRounds *f = &c->fed;
        FedRecord *rec = coord_fed_record_find(f, f->number);
        f->closing = mfree(f->closing); /* recorded below: nothing to send again */
        f->closing_len = 0;
        if (f->aggregate) {
                f->done++;
                if (rec)
                        rec->round = f->done;
                privacy_spent(c, rec);
                uint32_t every = c->job.fed.eval_every;
                if (every && f->done % every == 0 && f->done < c->job.fed.rounds)
                        coord_fed_evaluate_round(c);
                /* On disk before it is said: a round logged done is one a
                 * restarted pscoord knows. */
                coord_state_save(c);
                log_info("round done round=%u/%u number=%lu answered=%u sampled=%zu dropped=%u loss=%.4f "
                         "seconds=%.2f bytes_up=%lu bytes_raw=%lu", f->done, c->job.fed.rounds,
                         (unsigned long) f->number, rec ? rec->answered : 0, f->nclients, rec ? rec->dropped : 0,
                         rec ? rec->loss : 0.0, rec ? rec->seconds : 0.0, (unsigned long) (rec ? rec->bytes_up : 0),
                         (unsigned long) (rec ? rec->bytes_raw : 0));
        } else {
                f->failed++;
                log_warning("round failed number=%lu reason=\"%s\": it runs again with a fresh sample",
                            (unsigned long) f->number, rec ? rec->note : "");
        }
        coord_rounds_clear(f);
        f->phase = FED_WAITING;
        f->said_waiting = false;
        if (!f->aggregate)
                coord_todo(c, TODO_SAVE); /* the failed round's record, kept across a restart */
        else if (c->job.fed.fraction_evaluate > 0)
                testing_open(c);
}

/* The place of shard id among those the opening or close went to, or -1. */
static int shard_slot(const FedRounds *f, uint32_t id) {
        for (size_t i = 0; f->shard_ids && i < f->expected; i++)
                if (f->shard_ids[i] == id)
                        return (int) i;
        return -1;
}

void coord_fed_shard_lost(Coord *c, uint32_t id) {
        FedRounds *f = &c->fed;
        if (c->job.mode != MODE_FED || c->job.fed.async)
                return;
        FedRecord *rec = coord_fed_record_find(f, f->number);
        int slot = shard_slot(f, id);
        if (f->phase == FED_CLOSING) {
                /* Applied by the others (and copied to their backups before
                 * they answer); the lost shard's chunks lead from its backups
                 * now, with the copies of the rounds it had answered. */
                if (slot >= 0 && !f->shard_replied[slot]) {
                        f->shard_replied[slot] = true;
                        f->replies++;
                }
                if (rec)
                        snprintf(rec->note, sizeof rec->note, "shard %u was lost while it closed", id);
                log_warning("round closing without shard %u (lost) number=%lu", id, (unsigned long) f->number);
                if (f->replies == f->expected)
                        round_closed(c);
                return;
        }
        if (f->phase != FED_OPENING && f->phase != FED_TRAINING && f->phase != FED_UNMASKING && f->phase != FED_SCORING &&
            f->phase != FED_AGGREGATING)
                return; /* between rounds: the next one opens under the new map */
        /* Nothing of it was applied: it is dropped, counted failed, and runs
         * again with a fresh sample under the new map (the shards drop their
         * open round when that map comes). No update is counted twice. */
        if (rec)
                snprintf(rec->note, sizeof rec->note, "shard %u was lost: run again", id);
        f->failed++;
        log_warning("round dropped number=%lu reason=\"shard %u was lost\": it runs again with a fresh sample",
                    (unsigned long) f->number, id);
        coord_rounds_clear(f);
        f->phase = FED_WAITING;
        f->said_waiting = false;
        f->retry_at = now_ms() + FED_RETRY_MS;
        coord_todo(c, TODO_SAVE);
}

/* Restarted with a close in writing (CoordState.fed_closing): the shards
 * may have applied it before the previous pscoord recorded the round. The
 * same close goes to them again: a shard that aggregated it answers it
 * again without applying it, one that did not aggregates it now, and the
 * round is recorded done once, its privacy counted once. */
static void closing_again(Coord *c) {
        FedRounds *f = &c->fed;
        Psnet__Round *rd = psnet__round__unpack(NULL, f->closing_len, f->closing);
        if (!rd) {
                coord_job_fail(c, "the round close in pscoord's state does not decode");
                return;
        }
        coord_rounds_clear(f);
        f->number = rd->number;
        f->aggregate = true;
        f->phase = FED_CLOSING;
        log_info("round closing again after pscoord's restart number=%lu round=%u clients=%zu",
                 (unsigned long) rd->number, rd->round, rd->n_clients);
        int r = coord_fed_send_round(c, rd);
        psnet__round__free_unpacked(rd, NULL);
        if (r < 0) {
                char reason[160];
                snprintf(reason, sizeof reason, "cannot close round %lu on the shards again: %s",
                         (unsigned long) f->number, strerror(-r));
                coord_job_fail(c, reason);
        }
}

/* The final model is evaluated by one edge worker (the lowest id connected). */
static void evaluate_ask(Coord *c) {
        FedRounds *f = &c->fed;
        Peer *e = NULL;
        for (size_t i = 0; i < c->npeers; i++)
                if (coord_fed_available(&c->peers[i]) && (!e || c->peers[i].id < e->id))
                        e = &c->peers[i];
        f->phase = FED_EVALUATING;
        if (!e) {
                c->evaluator = 0;
                if (!f->said_waiting)
                        log_info("rounds done: waiting for an edge worker to evaluate the final model");
                f->said_waiting = true;
                return;
        }
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_evaluate = rd.evaluate = true;
        c->evaluator = e->id;
        f->deadline = now_ms() + MAX(FED_SHARD_WAIT_MS, c->job.fed.round_timeout_ms);
        log_info("rounds done rounds=%u: edge=%u evaluates the final model", f->done, e->id);
        int r = coord_fed_send_edge(c, e, &rd);
        if (r < 0)
                log_warning_errno(r, "Failed to ask edge=%u to evaluate: %m", e->id);
}

void coord_fed_poll(Coord *c) {
        FedRounds *f = &c->fed;
        if (c->job.mode != MODE_FED || c->state != JOB_RUNNING || !c->map)
                return;
        /* Restarted from the state file: nothing goes to the shards before they
         * have registered again (or their leases ran out and they left). */
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER && c->peers[i].detached) {
                        if (!f->said_shards)
                                log_info("rounds wait for shard %u to register again", c->peers[i].id);
                        f->said_shards = true;
                        return;
                }
        f->said_shards = false;
        if (f->closing && f->phase == FED_WAITING) {
                closing_again(c);
                return;
        }
        uint64_t now = now_ms();
        /* Between two rounds (or buffers) a checkpoint waiting for one is cut;
         * the next round waits until every shard has written its file. */
        bool between = c->job.fed.async ? f->phase != FED_CLOSING
                                        : f->phase == FED_WAITING || f->phase == FED_EVALUATING;
        bool held = between && coord_checkpoint_fed_cut(c);
        if ((f->phase == FED_OPENING || f->phase == FED_CLOSING || f->phase == FED_SCORING) &&
            now > f->shard_deadline) {
                char reason[192];
                snprintf(reason, sizeof reason, "%zu of %zu shards answered round %lu's %s within %u s", f->replies,
                         f->expected, (unsigned long) f->number,
                         f->phase == FED_OPENING ? "opening" : f->phase == FED_SCORING ? "scoring" : "closing",
                         (unsigned) (MAX(FED_SHARD_WAIT_MS, c->job.fed.round_timeout_ms) / 1000));
                coord_job_fail(c, reason);
                return;
        }
        if (c->job.fed.async && f->phase != FED_EVALUATING && f->phase != FED_DONE) {
                coord_fedasync_poll(c, now);
                if (f->phase != FED_WAITING)
                        return; /* WAITING: the rounds are done, the final evaluation below */
        }
        if (f->phase == FED_AGGREGATING) {
                aggregating_poll(c, now);
                return;
        }
        if (f->phase == FED_UNMASKING || (f->phase == FED_TRAINING && c->job.fed.secagg && f->sa.stage < 3)) {
                char why[96];
                if (coord_secagg_poll(c, now, why, sizeof why))
                        coord_fed_close(c, why); /* keys or shares fell short: nobody pushed, the round drops */
                return;
        }
        if (f->phase == FED_TRAINING) {
                size_t waiting = 0, expected = 0;
                for (size_t i = 0; i < f->nclients; i++) {
                        bool exp = !c->job.fed.secagg || f->sa.u2[i];
                        expected += exp;
                        waiting += exp && !f->answered[i] && !f->declined[i] &&
                                   coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]);
                }
                if (waiting == 0)
                        coord_fed_close(c, f->nclients == 0             ? "the Poisson sample was empty"
                                           : f->nanswered == expected ? "every sampled client answered"
                                                                      : "the others left or declined");
                else if (now >= f->deadline)
                        coord_fed_close(c, "--round-timeout");
                return;
        }
        if (f->phase == FED_TESTING) {
                size_t waiting = 0;
                for (size_t i = 0; i < f->nclients; i++)
                        waiting += !f->answered[i] && !f->declined[i] &&
                                   coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, f->clients[i]);
                if (waiting == 0)
                        testing_done(c, "every client asked answered, declined or left");
                else if (now >= f->deadline)
                        testing_done(c, "--round-timeout");
                return;
        }
        if (f->phase == FED_EVALUATING) {
                if (!c->evaluator || !coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, c->evaluator) || now > f->deadline)
                        evaluate_ask(c);
                return;
        }
        if (f->phase != FED_WAITING || now < f->retry_at)
                return;
        if (f->done >= c->job.fed.rounds) {
                f->said_waiting = false;
                evaluate_ask(c);
                return;
        }
        if (held)
                return;
        size_t n;
        _cleanup_free_ Peer **avail = available(c, &n);
        if (!avail)
                return;
        if (n < c->job.fed.min_available) {
                if (!f->said_waiting)
                        log_info("round waits for edge workers available=%zu min_available=%u", n,
                                 c->job.fed.min_available);
                f->said_waiting = true;
                return;
        }
        int r = round_open(c, avail, n);
        if (r < 0) {
                char reason[160];
                snprintf(reason, sizeof reason, "cannot open round %lu on the shards: %s", (unsigned long) f->number,
                         strerror(-r));
                coord_job_fail(c, reason);
        }
}

/* Test knob (test-fed-restart): PSNET_TEST_DIE_CLOSING=R kills pscoord
 * (SIGKILL) when the first shard has answered the aggregating close of round
 * R: the shards have applied it, pscoord's state has not recorded it. */
static void test_die_closing(Coord *c) {
        const FedRounds *f = &c->fed;
        const char *e = getenv("PSNET_TEST_DIE_CLOSING");
        if (e && f->phase == FED_CLOSING && f->aggregate && f->replies == 1 && strtoul(e, NULL, 10) == f->done + 1u) {
                log_warning("test: killed with round %u's close answered by one shard (PSNET_TEST_DIE_CLOSING)",
                            f->done + 1);
                raise(SIGKILL);
        }
}

/* A shard's answer to an opening or a closing. */
static void shard_rep(Coord *c, WireMsg *m, Peer *p) {
        FedRounds *f = &c->fed;
        const Psnet__Header *h = m->hdr;
        int idx = shard_slot(f, p->id);
        if (c->state != JOB_RUNNING || c->job.mode != MODE_FED)
                return;
        if ((f->phase != FED_OPENING && f->phase != FED_CLOSING && f->phase != FED_SCORING) ||
            h->round->number != f->shard_number || idx < 0 || !f->shard_replied || f->shard_replied[idx] ||
            (f->phase == FED_SCORING) != (h->round->has_score && h->round->score))
                return; /* an answer to a round given up on (or to another step of it) */
        if (f->phase == FED_SCORING) {
                f->shard_replied[idx] = true;
                f->replies++;
                if (h->status != PSNET__STATUS__STATUS_OK || !scoring_add(c, h->round)) {
                        char reason[320];
                        snprintf(reason, sizeof reason, "shard %u could not score round %lu: %s", p->id,
                                 (unsigned long) f->number,
                                 h->status != PSNET__STATUS__STATUS_OK ? (h->reason ? h->reason : status_name(h->status))
                                                                       : "its distances do not fit the round");
                        coord_job_fail(c, reason);
                        return;
                }
                if (f->replies == f->expected)
                        scoring_done(c);
                return;
        }
        f->shard_replied[idx] = true;
        f->replies++;
        test_die_closing(c);
        if (f->phase == FED_OPENING && h->status == PSNET__STATUS__STATUS_MIGRATING) {
                /* Its keys are still being built or moved in: open again shortly
                 * (a new number; the shards that opened this one drop it then). */
                log_info("round not opened: shard %u is not ready (%s); again shortly", p->id,
                         h->reason ? h->reason : "keys arriving");
                coord_rounds_clear(f);
                f->hist_end = (f->hist_end + COORD_FED_HISTORY - 1) % COORD_FED_HISTORY;
                f->nhist--;
                f->phase = FED_WAITING;
                f->retry_at = now_ms() + FED_RETRY_MS;
                return;
        }
        if (h->status != PSNET__STATUS__STATUS_OK) {
                char reason[320];
                snprintf(reason, sizeof reason, "shard %u refused round %lu's %s: %s", p->id,
                         (unsigned long) f->number, f->phase == FED_OPENING ? "opening" : "closing",
                         h->reason ? h->reason : status_name(h->status));
                if (f->phase == FED_OPENING || h->status == PSNET__STATUS__STATUS_RESOURCE ||
                    ++f->shard_failures >= FED_MAX_SHARD_FAILURES) {
                        coord_job_fail(c, reason);
                        return;
                }
                log_warning("%s", reason);
                f->aggregate = false; /* counted as failed once every shard answered */
                FedRecord *rec = coord_fed_record_find(f, f->number);
                if (rec)
                        snprintf(rec->note, sizeof rec->note, "a shard refused it");
        } else if (f->phase == FED_CLOSING && f->replies == f->expected && f->aggregate)
                f->shard_failures = 0;
        if (f->replies < f->expected)
                return;
        if (c->job.fed.async)
                coord_fedasync_closed(c);
        else if (f->phase == FED_OPENING)
                round_train(c);
        else
                round_closed(c);
        coord_todo(c, TODO_FED_POLL);
}

/* A client's test of a round's model on its own data (--fraction-evaluate). */
static void testing_rep(Coord *c, WireMsg *m, Peer *p, size_t i) {
        FedRounds *f = &c->fed;
        const Psnet__Round *rd = m->hdr->round;
        if (c->state != JOB_RUNNING || f->phase != FED_TESTING || rd->number != f->number || i == f->nclients ||
            f->answered[i] || f->declined[i]) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_STALE,
                                  "this client was not asked to test the model now (or its answer came after "
                                  "--round-timeout): not counted");
                return;
        }
        if (!rd->has_accuracy || !(rd->accuracy >= 0 && rd->accuracy <= 1) || !rd->has_examples || rd->examples == 0 ||
            rd->examples > UINT32_MAX || !rd->has_loss || !(isfinite(rd->loss) && rd->loss >= 0)) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "a client's test carries an accuracy in [0, 1], a finite loss >= 0 and its "
                                  "examples (1 to 2^32 - 1)");
                return;
        }
        f->answered[i] = true;
        f->test_acc += (double) rd->accuracy * (double) rd->examples;
        f->test_loss += (double) rd->loss * (double) rd->examples;
        f->test_examples += rd->examples;
        log_info("round tested by a client edge=%u round=%u accuracy=%.4f loss=%.4f examples=%lu", p->id,
                 f->test_round, (double) rd->accuracy, (double) rd->loss, (unsigned long) rd->examples);
        (void) coord_reply_job(c, &m->route, m->hdr->seq, "taken");
        coord_todo(c, TODO_FED_POLL);
}

/* An edge worker's answer: its update is on every shard. */
static void edge_rep(Coord *c, WireMsg *m, Peer *p) {
        FedRounds *f = &c->fed;
        const Psnet__Round *rd = m->hdr->round;
        char reason[192];
        size_t i = 0;
        while (i < f->nclients && f->clients[i] != p->id)
                i++;
        if (rd->secagg) {
                coord_secagg_rep(c, m, p, i);
                return;
        }
        if (c->job.fed.async && !(rd->has_evaluate && rd->evaluate)) {
                coord_fedasync_rep(c, m, p);
                return;
        }
        if (rd->has_local && rd->local) {
                testing_rep(c, m, p, i);
                return;
        }
        if (rd->decline && f->phase == FED_TESTING && rd->number == f->number && i < f->nclients &&
            !f->answered[i] && !f->declined[i]) {
                f->declined[i] = true;
                log_warning("test declined by its client edge=%u round=%u reason=\"%s\"", p->id, f->test_round,
                            rd->decline);
                (void) coord_reply_job(c, &m->route, m->hdr->seq, "declined");
                coord_todo(c, TODO_FED_POLL);
                return;
        }
        if (rd->has_evaluate && rd->evaluate) {
                /* A test of the model asked for by --eval-every. */
                if (!rd->has_accuracy || !(rd->accuracy >= 0 && rd->accuracy <= 1) || !rd->has_round) {
                        coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                          "an evaluation's answer carries the rounds of the model and an accuracy "
                                          "in [0, 1]");
                        return;
                }
                log_info("round evaluated round=%u accuracy=%.4f edge=%u", rd->round, (double) rd->accuracy, p->id);
                coord_fed_accuracy(c, rd->round, rd->accuracy);
                (void) coord_reply_job(c, &m->route, m->hdr->seq, "taken");
                return;
        }
        bool open = c->job.mode == MODE_FED && c->state == JOB_RUNNING && f->phase == FED_TRAINING &&
                    rd->number == f->number;
        if (rd->decline && open && i < f->nclients && !f->answered[i] && !f->declined[i]) {
                /* Its client sends no update for this round: the round stops waiting for it. */
                f->declined[i] = true;
                f->refused++;
                FedRecord *rec = coord_fed_record_find(f, f->number);
                if (rec)
                        rec->refused++;
                log_warning("update refused by its client edge=%u number=%lu reason=\"%s\"", p->id,
                            (unsigned long) rd->number, rd->decline);
                (void) coord_reply_job(c, &m->route, m->hdr->seq, "declined");
                coord_todo(c, TODO_FED_POLL);
                return;
        }
        if (!open || i == f->nclients || f->answered[i] || (f->declined && f->declined[i])) {
                FedRecord *rec = coord_fed_record_find(f, rd->number);
                if (rd->number <= f->number && (!open || i < f->nclients)) {
                        f->late++;
                        if (rec)
                                rec->late++;
                        snprintf(reason, sizeof reason, "round %lu closed before this update came: it is not counted "
                                 "(late; --round-timeout %u s)", (unsigned long) rd->number,
                                 c->job.fed.round_timeout_ms / 1000);
                        log_info("late update edge=%u number=%lu", p->id, (unsigned long) rd->number);
                        coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_STALE, reason);
                } else {
                        snprintf(reason, sizeof reason, "edge %u was not sampled for round %lu", p->id,
                                 (unsigned long) rd->number);
                        coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                }
                return;
        }
        if (!rd->has_examples || rd->examples == 0 || (rd->has_loss && !isfinite(rd->loss))) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "an update's answer carries its example count (>= 1) and a finite loss");
                return;
        }
        if (c->job.fed.secagg && !coord_secagg_may_count(c, i, rd->examples, reason, sizeof reason)) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        FedRecord *rec = coord_fed_record_find(f, f->number);
        if (rec) {
                rec->bytes_up += rd->has_bytes ? rd->bytes : job_nfloats(&c->job) * sizeof(float);
                rec->bytes_raw += job_nfloats(&c->job) * sizeof(float);
        }
        f->answered[i] = true;
        f->examples[i] = rd->examples;
        f->loss[i] = rd->has_loss ? rd->loss : 0.0f;
        f->nanswered++;
        (void) coord_reply_job(c, &m->route, m->hdr->seq, "counted");
        coord_todo(c, TODO_FED_POLL);
}

void coord_handle_round_rep(Coord *c, WireMsg *m, Peer *p) {
        if (p->role == PSNET__ROLE__ROLE_SERVER)
                shard_rep(c, m, p);
        else if (p->role == PSNET__ROLE__ROLE_EDGE)
                edge_rep(c, m, p);
        else if (p->role == PSNET__ROLE__ROLE_STRATEGY)
                strategy_rep(c, m, p);
        else
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_DENIED,
                                  "ROUND_REP comes from shards, edge workers and a strategy process");
}

