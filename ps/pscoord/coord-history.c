/* The job's history as pscoord keeps it: the test accuracy after each epoch
 * (the worker of rank 0 evaluates at each epoch's end and reports it with
 * its heartbeats; the evaluator reports the last epoch's with its result).
 * Kept in order of epochs, the last COORD_EPOCH_HISTORY of them, in the
 * state file and psctl status. See coord-internal.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "coord-internal.h"
#include "log.h"

void coord_history_reset(Coord *c) {
        c->nepochs = 0;
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
                };
                append(c, &r);
                any = true;
                log_info("epoch evaluated job=%u epoch=%u/%u accuracy=%.4f test_loss=%.4f clock=%ld worker=%u",
                         c->job.id, r.epoch, c->job.epochs, r.accuracy, r.test_loss, (long) r.clock, worker);
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
                        .seconds = o->seconds,
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
