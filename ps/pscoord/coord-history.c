/* SPDX-License-Identifier: Apache-2.0 */
/* The job's history as pscoord keeps it: the test accuracy after each epoch
 * (the worker of rank 0 evaluates at each epoch's end and reports it with
 * its heartbeats; the evaluator reports the last epoch's with its result).
 * Kept in order of epochs, the last COORD_EPOCH_HISTORY of them, in the
 * state file and psctl status.
 *
 * And the workers' heartbeats as samples (loss, samples/s, the spread of the
 * members' clocks, the shards' learning rate), for psctl report: at most
 * COORD_CLOCK_HISTORY of them over the whole job. When they fill it, every
 * other sample of each worker goes and the stride doubles, so a long job's
 * curves keep their start at a coarser step instead of losing it. See
 * coord-internal.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "coord-internal.h"
#include "log.h"

void coord_history_reset(Coord *c) {
        c->nepochs = 0;
        c->nclocks = 0;
        c->clock_stride = 1;
        for (size_t i = 0; i < c->npeers; i++) {
                c->peers[i].hist_seq = 0;
                c->peers[i].hist_clock = 0;
        }
}

/* Keeps every other sample of each worker (those whose seq is a multiple of
 * twice the stride); the stride doubles. */
static void thin_out(Coord *c) {
        uint32_t keep = c->clock_stride * 2;
        size_t n = 0;
        for (size_t k = 0; k < c->nclocks; k++)
                if (c->clocks[k].seq % keep == 0)
                        c->clocks[n++] = c->clocks[k];
        c->nclocks = n;
        c->clock_stride = keep;
}

void coord_history_sample(Coord *c, Peer *p) {
        const Psnet__WorkerInfo *wi = &p->worker;
        if (c->state != JOB_RUNNING || !p->member || !wi->has_clock || wi->clock <= p->hist_clock)
                return;
        p->hist_clock = wi->clock;
        uint32_t seq = p->hist_seq++;
        if (seq % c->clock_stride != 0)
                return;
        if (!c->clocks) {
                c->clocks = ps_calloc(COORD_CLOCK_HISTORY, sizeof *c->clocks);
                if (!c->clocks) {
                        log_warning("out of memory for the job's samples (psctl report draws none)");
                        return;
                }
        }
        while (c->nclocks == COORD_CLOCK_HISTORY && c->clock_stride < UINT32_MAX / 2) {
                thin_out(c);
                if (seq % c->clock_stride != 0)
                        return;
        }
        if (c->nclocks == COORD_CLOCK_HISTORY)
                return;
        /* Staleness: how far the fastest member is ahead of the slowest, as
         * the shards' gates saw it at their last heartbeats (the workers'
         * own heartbeats come at different moments, so their clocks do not
         * compare). */
        int64_t spread = 0;
        float lr = NAN;
        for (size_t i = 0; i < c->npeers; i++) {
                const Peer *q = &c->peers[i];
                if (q->role != PSNET__ROLE__ROLE_SERVER || !c->map || shardmap_find(c->map, q->id) < 0)
                        continue;
                if (q->shard.has_min_worker_clock && q->shard.has_max_worker_clock &&
                    q->shard.max_worker_clock >= q->shard.min_worker_clock)
                        spread = MAX(spread, q->shard.max_worker_clock - q->shard.min_worker_clock);
                /* The shards' last updates: the same rate under BSP, a push's own under ASP/SSP. */
                if (q->shard.has_lr && isfinite(q->shard.lr) && !(q->shard.lr <= lr))
                        lr = q->shard.lr;
        }
        c->clocks[c->nclocks++] = (ClockRec) {
                .worker = p->id, .seq = seq, .clock = wi->clock, .spread = spread,
                .seconds = (float) (now_ms() - c->job_start_ms) / 1000.0f,
                .loss = wi->has_loss && isfinite(wi->loss) ? wi->loss : NAN,
                .samples_per_s = wi->has_samples_per_s && isfinite(wi->samples_per_s) && wi->samples_per_s >= 0
                                         ? wi->samples_per_s : NAN,
                .lr = lr,
        };
}

void coord_handle_history(Coord *c, WireMsg *m) {
        size_t n = c->nclocks;
        _cleanup_free_ Psnet__ClockSample *cs = ps_calloc(MAX(n, (size_t) 1), sizeof *cs);
        _cleanup_free_ Psnet__ClockSample **csp = ps_calloc(MAX(n, (size_t) 1), sizeof *csp);
        if (!cs || !csp) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        for (size_t k = 0; k < n; k++) {
                const ClockRec *r = &c->clocks[k];
                Psnet__ClockSample *o = &cs[k];
                psnet__clock_sample__init(o);
                o->worker = r->worker;
                o->has_clock = o->has_seconds = o->has_spread = true;
                o->clock = r->clock;
                o->seconds = r->seconds;
                o->spread = r->spread;
                o->has_loss = !isnan(r->loss);
                o->loss = r->loss;
                o->has_samples_per_s = !isnan(r->samples_per_s);
                o->samples_per_s = r->samples_per_s;
                o->has_lr = !isnan(r->lr);
                o->lr = r->lr;
                csp[k] = o;
        }
        Psnet__History hist = PSNET__HISTORY__INIT;
        hist.n_samples = n;
        hist.samples = csp;
        hist.has_stride = hist.has_capacity = true;
        hist.stride = c->clock_stride;
        hist.capacity = COORD_CLOCK_HISTORY;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_HISTORY_REP);
        h.body_case = PSNET__HEADER__BODY_HISTORY;
        h.history = &hist;
        int r = coord_reply_hdr(c, &m->route, &h, m->hdr->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer a history request: %m");
}

/* Appends r, dropping the oldest record when full; records come in order of
 * epochs (an older or repeated one is not recorded). */
static bool append(Coord *c, const EpochRec *r) {
        if (c->nepochs > 0 && r->epoch <= c->epochs[c->nepochs - 1].epoch)
                return false;
        if (c->nepochs == COORD_EPOCH_HISTORY) {
                memmove(c->epochs, c->epochs + 1, (COORD_EPOCH_HISTORY - 1) * sizeof *c->epochs);
                c->nepochs--;
        }
        c->epochs[c->nepochs++] = *r;
        return true;
}

bool coord_history_epoch(Coord *c, uint32_t worker, const Psnet__WorkerInfo *wi) {
        bool any = false;
        for (size_t k = 0; k < wi->n_evals; k++) {
                const Psnet__EpochRecord *o = wi->evals[k];
                if (c->nepochs > 0 && o->epoch <= c->epochs[c->nepochs - 1].epoch)
                        continue; /* heard already (each heartbeat repeats the newest) */
                if (o->epoch == 0 || o->epoch > c->job.epochs || !o->has_accuracy || !(o->accuracy >= 0) ||
                    !(o->accuracy <= 1)) {
                        c->errors++;
                        log_warning("worker=%u reported an evaluation pscoord does not record epoch=%u of %u "
                                    "accuracy=%g", worker, o->epoch, c->job.epochs,
                                    o->has_accuracy ? (double) o->accuracy : NAN);
                        return any;
                }
                EpochRec r = {
                        .epoch = o->epoch, .worker = worker, .accuracy = o->accuracy,
                        .test_loss = o->has_test_loss ? o->test_loss : NAN,
                        .train_loss = o->has_train_loss ? o->train_loss : NAN, .clock = o->clock,
                        .seconds = (float) (now_ms() - c->job_start_ms) / 1000.0f,
                        .auc = o->has_auc && o->auc >= 0 && o->auc <= 1 ? o->auc : NAN,
                };
                append(c, &r);
                any = true;
                log_info("epoch evaluated job=%u epoch=%u/%u accuracy=%.4f test_loss=%.4f auc=%.4f clock=%ld worker=%u",
                         c->job.id, r.epoch, c->job.epochs, r.accuracy, r.test_loss, r.auc, (long) r.clock, worker);
        }
        return any;
}

void coord_history_view_free(HistoryView *v) {
        ps_free(v->recs);
        ps_free(v->recp);
        v->recs = NULL;
        v->recp = NULL;
        v->n = 0;
}

int coord_history_view(const Coord *c, HistoryView *v) {
        v->n = 0;
        v->recs = ps_calloc(MAX(c->nepochs, (size_t) 1), sizeof *v->recs);
        v->recp = ps_calloc(MAX(c->nepochs, (size_t) 1), sizeof *v->recp);
        if (!v->recs || !v->recp) {
                coord_history_view_free(v);
                return -ENOMEM;
        }
        for (size_t k = 0; k < c->nepochs; k++) {
                const EpochRec *r = &c->epochs[k];
                Psnet__EpochRecord *o = &v->recs[k];
                psnet__epoch_record__init(o);
                o->epoch = r->epoch;
                o->has_accuracy = o->has_clock = o->has_seconds = o->has_worker = true;
                o->accuracy = r->accuracy;
                o->clock = r->clock;
                o->seconds = r->seconds;
                o->worker = r->worker;
                o->has_test_loss = !isnan(r->test_loss);
                o->test_loss = r->test_loss;
                o->has_train_loss = !isnan(r->train_loss);
                o->train_loss = r->train_loss;
                o->has_auc = !isnan(r->auc);
                o->auc = o->has_auc ? r->auc : 0;
                v->recp[k] = o;
        }
        v->n = c->nepochs;
        return 0;
}

int coord_history_restore(Coord *c, Psnet__EpochRecord *const *recs, size_t n, char *err, size_t errlen) {
        coord_history_reset(c);
        for (size_t k = 0; k < n; k++) {
                const Psnet__EpochRecord *o = recs[k];
                EpochRec r = {
                        .epoch = o->epoch, .worker = o->worker, .accuracy = o->accuracy,
                        .test_loss = o->has_test_loss ? o->test_loss : NAN,
                        .train_loss = o->has_train_loss ? o->train_loss : NAN, .clock = o->clock,
                        .seconds = o->seconds, .auc = o->has_auc && o->auc >= 0 && o->auc <= 1 ? o->auc : NAN,
                };
                if (!o->has_accuracy || !(r.accuracy >= 0 && r.accuracy <= 1) || r.epoch == 0 ||
                    r.epoch > c->job.epochs || !append(c, &r)) {
                        snprintf(err, errlen, "epoch record %zu (epoch %u, accuracy %g) is out of order or range", k,
                                 o->epoch, (double) o->accuracy);
                        return -EBADMSG;
                }
        }
        return 0;
}
