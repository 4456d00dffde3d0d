/* SPDX-License-Identifier: Apache-2.0 */
/* workerd's trainer; see trainer.h. The states, each left by an event:
 *
 *   JOINING  --job-->  LOADING  --data loaded-->  PULLING (first weights)
 *   --round done-->  STEPPING: a uv_idle runs one step (batch, compute), the
 *   round of that clock leaves (push + pull); its completion schedules the
 *   next step, or FINISHING at the job's end clock (or a stop): it tells
 *   pscoord it finished. The last member to finish EVALUATES: it pulls the
 *   final weights and evaluates them in the thread pool, reports the
 *   accuracy and leaves; the others are WAITING until the job is done (or
 *   until pscoord asks one of them to evaluate instead), then leave. A
 *   worker stopped early (operator, drain, signal) leaves at once.
 *
 * At the end of every epoch but the last, the worker of rank 0 evaluates the
 * weights it just pulled on the test set before its next step (in the thread
 * pool, the loop serving meanwhile) and reports the accuracy with its
 * progress: pscoord keeps it as the job's accuracy by epoch. Under BSP the
 * others wait for it at the next clock.
 *
 * Epochs are the job's (common/schedule.h): every member stops at the clock
 * pscoord's schedule gives for epochs x training images, however many
 * workers there were and whenever this one joined. Within that, a worker
 * trains on its share of the data (images i with i % workers == rank) in
 * shuffled passes.
 *
 * A step computes on the loop's thread (it is work, not waiting); the
 * pscoord session and the shards' replies are handled between steps. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <uv.h>
#include <zlib.h>
#include "alloc.h"
#include "click.h"
#include "clicklog.h"
#include "click-kb.h"
#include "dlrm-kb.h"
#include "dlrm.h"
#include "endpoint.h"
#include "hash.h"
#include "idx.h"
#include "kernels.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "psnet-internal.h"
#include "schedule.h"
#include "service.h"
#include "trainer.h"

typedef enum {
        T_JOINING, T_LOADING, T_PULLING, T_STEPPING, T_FINISHING, T_WAITING, T_EVALUATING, T_DONE
} TrainerState;

typedef struct Trainer {
        const WorkerConfig *cfg;
        uv_loop_t loop;
        Service *service;
        PsnetWorker *w;
        const Job *job;
        TrainerState state;
        int exit_code;
        bool stop;                    /* a signal, a drain or the operator: finish after this step */
        bool stopped_early;           /* training did not run to the end */
        /* data */
        uv_work_t load_work;
        const char *data_dir;
        Dataset *train, *test;
        uint32_t ntrain, ntest;       /* samples of either kind of data */
        int load_r;
        char load_err[256];
        char fail_why[512];              /* told to pscoord when leaving failed ("": nothing to tell) */
        uint32_t *perm, nmine, steps_per_pass, part_rank, part_n;
        uint64_t total;               /* samples the job trains: epochs x training images */
        /* compute */
        KBackend *kb;
        Model *model;
        float **params, **grads, **next;
        bool shared;                     /* params, grads and next lie in libpsnet's shared memory */
        void *registered;                /* that memory, host_register'd with the backend (NULL: not) */
        float *xb;
        int32_t *yb;
        /* schedule */
        uint32_t pass;                /* passes over this worker's share (the shuffle's seed) */
        uint32_t step_in_pass;        /* steps done in the pass */
        int64_t resume_steps;         /* steps of this membership before the start clock (a restored job) */
        bool pass_open;
        int64_t clock, end_clock;     /* the job ends at end_clock (the schedule's) */
        uint32_t job_epoch;           /* the job's epoch at clock (1-based) */
        float job_progress;           /* the job's progress at clock, 0..1 */
        uint64_t step, samples;
        float loss;
        bool prefetch;                /* --prefetch, where the model has it */
        /* lr:D and dlrm (job->click): a click log; a row per id in table 0,
         * pulled for each batch's distinct ids and pushed as their gradients */
        ClickData *ctrain, *ctest;
        ClickBatch cbatch, ctestb;     /* a training batch's ids; the test set's */
        Dlrm dlrm;                     /* dlrm's buffers (dlrm.dim 0: lr:D, or a step on t->kb) */
        DlrmKb dkb;                    /* dlrm's step on t->kb instead (dkb.kb NULL: dlrm.c's) */
        LrKb lkb;                      /* lr:D's on t->kb instead (lkb.kb NULL: click.c's) */
        float *cbuf;                   /* params and grads of the tensors, logits */
        float *clogits;
        double eval_auc;
        bool click_pushing;            /* the rows request under way is the push */
        bool click_rows_done;          /* that batch's rows exchange is done (one for all its tables) */
        uv_idle_t step_idle;
        uv_timer_t delay;
        /* timing and progress */
        double t0, t_last, t_batch, t_compute, t_exchange, t_round;
        double loss_sum;
        uint64_t loss_n, last_samples, last_progress;
        float last_loss, sps, samples_ps;
        bool said_graph;
        /* evaluation: the final weights, or (the worker of rank 0) the weights
         * at each epoch's end, between two steps */
        uv_work_t eval_work;
        int eval_r;
        size_t eval_correct;
        double eval_loss, t_eval;
        bool eval_epoch_end;          /* the evaluation under way is an epoch's */
        uint32_t epochs_seen;         /* epochs the job had finished at the last step */
        Histogram round_hist, compute_hist;
} Trainer;

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void trainer_finish(Trainer *t);
static void trainer_fail(Trainer *t, int r);
static void trainer_rejoin(Trainer *t);

/* --- the end --------------------------------------------------------------------- */

static void on_left(PsnetWorker *w, void *ud) {
        Trainer *t = ud;
        (void) w;
        t->state = T_DONE;
        uv_stop(&t->loop);
}

static void trainer_leave(Trainer *t) {
        t->state = T_FINISHING;
        if (psnet_worker_leave_because(t->w, t->fail_why, on_left, t) < 0)
                uv_stop(&t->loop);
}

static void trainer_fail(Trainer *t, int r) {
        if (t->exit_code == 0)
                t->exit_code = r;
        trainer_leave(t);
}

static void evaluate_start(Trainer *t);
static void step_idle_cb(uv_idle_t *h);

/* pscoord heard that this worker finished: it evaluates (the last member to
 * finish), or waits for the job to be done. */
static void on_finished_sent(PsnetWorker *w, int r, bool evaluate, void *ud) {
        Trainer *t = ud;
        (void) w;
        if (r < 0) {
                log_warning_errno(r, "Failed to tell pscoord that training finished: %m");
                trainer_leave(t);
        } else if (evaluate)
                evaluate_start(t);
        else if (t->stop)
                trainer_leave(t); /* the job ended meanwhile */
        else {
                t->state = T_WAITING;
                log_info("finished training; waiting for the job to end (the last member to finish evaluates)");
        }
}

static void on_accuracy_sent(PsnetWorker *w, int r, bool evaluate, void *ud) {
        Trainer *t = ud;
        (void) w, (void) evaluate;
        if (r < 0)
                log_warning_errno(r, "Failed to report the accuracy to pscoord: %m");
        trainer_leave(t);
}

/* A click model on the test set, its rows pulled: accuracy at 0.5, log
 * loss, AUC. */
static void click_evaluate(Trainer *t) {
        const ClickData *d = t->ctest;
        float *logits = t->clogits;
        int r = t->dkb.kb ? dlrm_kb_load(&t->dkb, &t->ctestb, t->params)
              : t->lkb.kb ? lr_kb_load(&t->lkb, &t->ctestb, t->params[0], t->params[1][0])
                          : 0;
        if (t->lkb.kb)
                for (size_t first = 0; r == 0 && first < d->n; first += t->lkb.max_batch)
                        r = lr_kb_logits(&t->lkb, &t->ctestb, d, first, MIN(t->lkb.max_batch, d->n - first),
                                         logits + first);
        else if (t->dkb.kb)
                for (size_t first = 0; r == 0 && first < d->n; first += t->dkb.max_batch)
                        r = dlrm_kb_logits(&t->dkb, &t->ctestb, d, first, MIN(t->dkb.max_batch, d->n - first),
                                           logits + first);
        else if (t->dlrm.dim)
                for (size_t first = 0; first < d->n; first += t->dlrm.max_batch)
                        dlrm_logits(&t->dlrm, &t->ctestb, d, first, MIN(t->dlrm.max_batch, d->n - first), t->params,
                                    logits + first);
        else
                click_lr_logits(&t->ctestb, d, NULL, d->n, t->params[0], t->params[1][0], logits);
        size_t correct = 0;
        for (uint64_t i = 0; i < d->n; i++)
                correct += (logits[i] > 0) == (d->y[i] != 0);
        t->eval_correct = correct;
        t->eval_loss = logloss_of_logits(logits, d->y, d->n);
        t->eval_auc = auc(logits, d->y, d->n);
        t->eval_r = r;
}

static void eval_work(uv_work_t *req) {
        Trainer *t = req->data;
        double t0 = mono_s();
        if (t->job->click) {
                click_evaluate(t);
                t->t_eval += mono_s() - t0;
                return;
        }
        t->eval_r = model_upload_params_from(t->model, t->params);
        if (t->eval_r >= 0)
                t->eval_r = model_evaluate_from(t->model, dataset_samples, t->test, t->test->y, t->test->n,
                                                &t->eval_correct, &t->eval_loss);
        t->t_eval += mono_s() - t0;
}

static void eval_done(uv_work_t *req, int status) {
        Trainer *t = req->data;
        if (!t->w)
                return; /* finishing after the loop stopped: nothing left to report to */
        bool epoch_end = t->eval_epoch_end;
        t->eval_epoch_end = false;
        if (status < 0 || t->eval_r < 0) {
                log_error_errno(status < 0 ? status : t->eval_r, "Evaluation failed: %m");
                trainer_fail(t, status < 0 ? status : t->eval_r);
                return;
        }
        float acc = (float) t->eval_correct / (float) t->ntest;
        const PsnetEval ev = { .epoch = epoch_end ? t->epochs_seen : t->job->epochs, .accuracy = acc,
                               .test_loss = (float) t->eval_loss, .train_loss = t->last_loss, .clock = t->clock,
                               .auc = t->job->click ? (float) t->eval_auc : 0.0f };
        if (t->job->click)
                log_info("evaluated%s epoch=%u accuracy=%.4f test_loss=%.4f auc=%.4f samples=%u clock=%ld",
                         epoch_end ? " epoch end" : "", ev.epoch, acc, t->eval_loss, t->eval_auc, t->ntest,
                         (long) t->clock);
        else
                log_info("evaluated%s epoch=%u accuracy=%.4f test_loss=%.4f images=%u clock=%ld",
                         epoch_end ? " epoch end" : "", ev.epoch, acc, t->eval_loss, t->ntest, (long) t->clock);
        if (psnet_worker_evaluated(t->w, &ev) < 0)
                log_warning("evaluation of epoch %u not reported: an evaluation of a later epoch was", ev.epoch);
        if (epoch_end)
                (void) uv_idle_start(&t->step_idle, step_idle_cb);
        else if (psnet_worker_result(t->w, true, acc, on_accuracy_sent, t) < 0)
                trainer_leave(t);
}

/* The evaluation of the weights pulled, in the thread pool. */
static void eval_queue(Trainer *t) {
        t->eval_work.data = t;
        int r = uv_queue_work(&t->loop, &t->eval_work, eval_work, eval_done);
        if (r < 0) {
                t->eval_epoch_end = false;
                log_error("Failed to start the evaluation: %s", uv_strerror(r));
                trainer_fail(t, r);
        }
}

/* Of b's parts (part p's ids are table p's: one table for every field, or
 * one per field), those that have ids (a push: every
 * part, every table pushed each clock, empty where the step touched none of
 * its rows, for a BSP clock closes on a shard once every member pushed
 * every table), all in one exchange (each table's requests in flight
 * together): their rows pulled into b->rows, or their gradients pushed;
 * done follows (which sets t->click_rows_done). false: that exchange is
 * done already. */
static bool click_part_rows(Trainer *t, ClickBatch *b, bool push, PsnetRowsFn done) {
        PsnetRowsTable tabs[JOB_MAX_TABLES];
        size_t n = 0;
        for (uint32_t p = 0; !t->click_rows_done && p < b->nparts && n < JOB_MAX_TABLES; p++) {
                size_t from = b->part[p], cnt = b->part[p + 1] - from;
                if (!push && cnt == 0)
                        continue;
                tabs[n++] = (PsnetRowsTable) { .table = p, .ids = b->uniq + from, .n = cnt,
                                               .grads = push ? b->rgrad + from * b->dim : NULL,
                                               .out = push ? NULL : b->rows + from * b->dim };
        }
        if (n == 0)
                return false;
        int r = psnet_worker_rows_many(t->w, tabs, n, push, t->clock, done, t);
        if (r < 0) {
                log_error_errno(r, "Failed to %s the rows of %zu table%s at clock %ld: %m", push ? "push" : "pull", n,
                                n == 1 ? "" : "s", (long) t->clock);
                trainer_fail(t, r);
        }
        return true;
}

static void click_test_rows_done(PsnetWorker *w, int r, void *ud);

/* The test set's rows, then the evaluation. */
static void click_test_rows(Trainer *t) {
        if (!click_part_rows(t, &t->ctestb, false, click_test_rows_done))
                eval_queue(t);
}

static void click_test_rows_done(PsnetWorker *w, int r, void *ud) {
        Trainer *t = ud;
        (void) w;
        if (r < 0) {
                if (r != -ECANCELED) {
                        log_error_errno(r, "Failed to pull the test set's rows: %m");
                        trainer_fail(t, r);
                }
                return;
        }
        t->click_rows_done = true;
        click_test_rows(t);
}

/* The weights are here; a click model's rows of the test set's ids are
 * pulled first. */
static void eval_begin(Trainer *t) {
        if (!t->job->click) {
                eval_queue(t);
                return;
        }
        t->click_rows_done = false;
        click_test_rows(t);
}

/* An epoch ended at this clock: evaluate the weights just pulled before the
 * next step. */
static void evaluate_epoch(Trainer *t) {
        t->eval_epoch_end = true;
        eval_begin(t);
}

/* The final weights arrived: evaluate them in the thread pool. */
static void on_final_pull(PsnetWorker *w, int r, void *ud) {
        Trainer *t = ud;
        (void) w;
        if (r < 0) {
                if (r != -ECANCELED) {
                        log_error_errno(r, "Failed to pull the final weights: %m");
                        trainer_fail(t, r);
                }
                return;
        }
        eval_begin(t);
}

/* Every member finished: pull the weights once more (under ASP the others
 * pushed after this worker's last pull) and evaluate them. */
static void evaluate_start(Trainer *t) {
        t->state = T_EVALUATING;
        log_info("evaluating the final weights clock=%ld", (long) t->clock);
        int r = psnet_worker_round(t->w, NULL, 0, t->params, t->clock, on_final_pull, t);
        if (r < 0) {
                log_error_errno(r, "Failed to pull the final weights: %m");
                trainer_fail(t, r);
        }
}

static void progress(Trainer *t, bool force) {
        uint64_t now = now_ms();
        if (!force && now - t->last_progress < t->cfg->progress_ms)
                return;
        double tn = mono_s(), dt = tn - t->t_last;
        if (dt > 0) {
                t->samples_ps = (float) ((double) (t->samples - t->last_samples) / dt);
                t->sps = t->samples_ps / (float) t->job->batch;
        }
        if (t->loss_n)
                t->last_loss = (float) (t->loss_sum / (double) t->loss_n);
        log_info("progress epoch=%u/%u step=%lu loss=%.4f samples_per_s=%.0f clock=%ld end_clock=%ld", t->job_epoch,
                 t->job->epochs, (unsigned long) t->step, t->last_loss, t->samples_ps, (long) t->clock,
                 (long) t->end_clock);
        t->loss_sum = 0;
        t->loss_n = 0;
        t->last_samples = t->samples;
        t->t_last = tn;
        t->last_progress = now;
}

static void report_progress(Trainer *t) {
        PsnetProgress p = {
                .clock = t->clock, .epoch = t->job_epoch, .step = t->step, .samples = t->samples,
                .steps_per_s = t->sps, .samples_per_s = t->samples_ps, .loss = t->loss,
                .progress = t->job_progress, .end_clock = t->end_clock,
        };
        psnet_worker_progress(t->w, &p);
}

/* Training is over (or stopped): the time split, then the result. */
static void trainer_finish(Trainer *t) {
        t->state = T_FINISHING;
        (void) uv_idle_stop(&t->step_idle);
        progress(t, true);
        report_progress(t);
        double secs = mono_s() - t->t0;
        uint64_t pushed, pulled, rounds;
        double wait_s;
        psnet_worker_traffic(t->w, &pushed, &pulled, &rounds, &wait_s);
        /* Where the time went: gathering batches, computing (params upload, step,
         * gradients download) and the push/pull round (which includes waiting
         * for the shards to apply and, under BSP, for the other workers). */
        log_info("trained steps=%lu seconds=%.2f samples_per_s=%.0f batch_s=%.3f compute_s=%.3f exchange_s=%.3f "
                 "eval_s=%.3f wait_s=%.2f pushed_mb=%.1f pulled_mb=%.1f",
                 (unsigned long) t->step, secs, secs > 0 ? (double) t->samples / secs : 0.0, t->t_batch,
                 t->t_compute, t->t_exchange, t->t_eval, wait_s, (double) pushed / 1e6, (double) pulled / 1e6);
        if (t->stopped_early) {
                trainer_leave(t); /* its share of the epochs goes to the others */
                return;
        }
        if (psnet_worker_result(t->w, false, 0, on_finished_sent, t) < 0)
                trainer_leave(t);
}

/* Where the job stands at t->clock: its epoch, progress and end clock. */
static void schedule_update(Trainer *t) {
        uint64_t done = psnet_job_samples_at(t->w, t->clock);
        t->end_clock = psnet_job_end_clock(t->w, t->total);
        t->job_epoch = schedule_epoch(done, t->ntrain, t->job->epochs);
        t->job_progress = t->total ? (float) MIN((double) done / (double) t->total, 1.0) : 1.0f;
}

/* --- steps ------------------------------------------------------------------------ */

/* Logs a CRC-32 over every pulled tensor: under BSP all workers must log the
 * same value for the same clock. */
static void trace_pull(Trainer *t) {
        uLong crc = crc32(0L, Z_NULL, 0);
        for (size_t i = 0; i < t->job->ntensors; i++)
                crc = crc32(crc, (const Bytef *) t->params[i], (uInt) (t->job->tensors[i].numel * sizeof(float)));
        log_info("pulled clock=%ld checksum=%08lx", (long) t->clock, (unsigned long) crc);
}

/* This worker's share of the training set in its own order: indices i with
 * i % n == rank, ascending. */
static void share_order(Trainer *t) {
        uint32_t k = 0;
        for (uint32_t i = t->part_rank; i < t->ntrain; i += t->part_n)
                t->perm[k++] = i;
        t->nmine = k;
}

static void partition(Trainer *t) {
        t->part_rank = psnet_worker_rank(t->w);
        t->part_n = MAX(psnet_worker_count(t->w), 1u);
        share_order(t);
        t->steps_per_pass = t->nmine / t->job->batch;
}

static void on_step_done(PsnetWorker *w, int r, void *ud);

static void step_round(Trainer *t) {
        t->t_round = mono_s();
        int r = psnet_worker_round(t->w, (const float *const *) t->grads, t->clock,
                                   t->prefetch ? t->next : t->params, t->clock + 1, on_step_done, t);
        if (r < 0) {
                log_error_errno(r, "Failed to start a round: %m");
                trainer_fail(t, r);
        }
}

static void on_delay(uv_timer_t *h) {
        step_round(h->data);
}

/* --- click models: a step's rows, pulled before its compute, pushed after ------------------ */

static void click_rows_done(PsnetWorker *w, int r, void *ud);

static void click_step(Trainer *t);

/* The rows request under way; once it is done, the step's next stage: its
 * compute after the pull, its dense round after the push. */
static void click_continue(Trainer *t) {
        if (click_part_rows(t, &t->cbatch, t->click_pushing, click_rows_done))
                return;
        if (!t->click_pushing)
                click_step(t);
        else if (t->cfg->step_delay_ms)
                (void) uv_timer_start(&t->delay, on_delay, t->cfg->step_delay_ms, 0); /* test knob */
        else
                step_round(t);
}

static void click_retry(uv_timer_t *h) {
        click_continue(h->data);
}

static void click_rows_done(PsnetWorker *w, int r, void *ud) {
        Trainer *t = ud;
        (void) w;
        if (r == -ESTALE) {
                trainer_rejoin(t);
                return;
        }
        if (r == -EAGAIN) {
                /* The shards moved to a newer map: once it is here. */
                (void) uv_timer_start(&t->delay, click_retry, 20, 0);
                return;
        }
        if (r < 0) {
                if (r != -ECANCELED)
                        trainer_fail(t, r);
                return;
        }
        t->click_rows_done = true;
        click_continue(t);
}

/* The step's compute, its rows pulled; then the push of their gradients. */
static void click_step(Trainer *t) {
        uint32_t batch = t->job->batch;
        double tb = mono_s();
        const uint32_t *idx = t->perm + (size_t) t->step_in_pass * batch;
        int r = 0;
        if (t->dkb.kb)
                r = dlrm_kb_step(&t->dkb, &t->cbatch, t->ctrain, idx, batch, t->params, t->grads, &t->loss);
        else if (t->lkb.kb)
                r = lr_kb_step(&t->lkb, &t->cbatch, t->ctrain, idx, batch, t->params[0], t->params[1][0], t->grads[0],
                               t->grads[1], &t->loss);
        else if (t->dlrm.dim)
                t->loss = dlrm_step(&t->dlrm, &t->cbatch, t->ctrain, idx, batch, t->params, t->grads);
        else
                t->loss = click_lr_step(&t->cbatch, t->ctrain, idx, batch, t->params[0], t->params[1][0], t->clogits,
                                        t->grads[0], t->grads[1]);
        if (r < 0) {
                log_error_errno(r, "The %s backend failed a step of model %s: %m", t->kb->ops->name,
                                t->job->model_name);
                snprintf(t->fail_why, sizeof t->fail_why, "the %s backend failed a step of model %.64s: %s",
                         t->kb->ops->name, t->job->model_name, strerror(-r));
                trainer_fail(t, r);
                return;
        }
        double tc = mono_s();
        t->t_compute += tc - tb;
        histogram_observe(&t->compute_hist, tc - tb);
        t->click_rows_done = false;
        t->click_pushing = true;
        click_continue(t);
}

/* One step: gather a batch, compute the gradients, send the round. */
static void step_idle_cb(uv_idle_t *h) {
        Trainer *t = h->data;
        (void) uv_idle_stop(h);
        if (t->stop) {
                t->stopped_early = true;
                trainer_finish(t);
                return;
        }
        schedule_update(t);
        if (t->clock >= t->end_clock) {
                trainer_finish(t);
                return;
        }
        if (!t->pass_open) {
                if (psnet_worker_rank(t->w) != t->part_rank || MAX(psnet_worker_count(t->w), 1u) != t->part_n) {
                        /* The membership changed: take this worker's new share of the data. */
                        partition(t);
                        log_info("partition rank=%u/%u images=%u", t->part_rank, t->part_n, t->nmine);
                }
                /* A job restored at clock B resumes where its data stood at B. */
                if (t->resume_steps > 0 && t->steps_per_pass > 0) {
                        t->pass += (uint32_t) (t->resume_steps / t->steps_per_pass);
                        t->resume_steps %= t->steps_per_pass;
                }
                /* A pass's order depends on (seed, rank, pass) alone, shuffled
                 * from the share's own order, not from the last pass's: a
                 * worker that resumes at pass p (a restore, a rejoin) takes
                 * the batches the uninterrupted run took. */
                share_order(t);
                uint64_t x = t->job->seed * 1000003u + t->part_rank * 7919u + t->pass;
                shuffle_u32(t->perm, t->nmine, &x);
                t->step_in_pass = (uint32_t) MAX(t->resume_steps, (int64_t) 0);
                t->resume_steps = 0;
                t->pass_open = true;
        }
        uint32_t batch = t->job->batch, s = t->step_in_pass;
        double ta = mono_s();
        if (t->job->click) {
                if (click_batch_gather(&t->cbatch, t->ctrain, t->perm + (size_t) s * batch, batch) < 0) {
                        log_error_errno(ENOMEM, "Out of memory for a batch's rows");
                        trainer_fail(t, -ENOMEM);
                        return;
                }
                t->t_batch += mono_s() - ta;
                t->click_rows_done = false;
                t->click_pushing = false;
                click_continue(t);
                return;
        }
        for (uint32_t b = 0; b < batch; b++) {
                uint32_t i = t->perm[(size_t) s * batch + b];
                dataset_sample(t->train, i, t->xb + (size_t) b * t->train->dim);
                t->yb[b] = t->train->y[i];
        }
        double tb = mono_s();
        int correct, r = model_upload_params_from(t->model, t->params);
        if (r >= 0)
                r = model_step_begin(t->model, t->xb, t->yb, (int) batch);
        if (r >= 0 && t->prefetch) {
                r = psnet_worker_prefetch(t->w, t->next, t->clock + 1);
                if (r < 0) {
                        (void) model_step_end(t->model, NULL, NULL);
                        log_error_errno(r, "Failed to prefetch: %m");
                        trainer_fail(t, r);
                        return;
                }
        }
        if (r >= 0)
                r = model_step_end(t->model, &t->loss, &correct);
        if (r < 0) {
                log_error_errno(r, "Training step failed: %m");
                trainer_fail(t, r);
                return;
        }
        double tc = mono_s();
        t->t_batch += tb - ta;
        t->t_compute += tc - tb;
        histogram_observe(&t->compute_hist, tc - tb);
        if (t->cfg->step_delay_ms)
                /* Test knob: a deliberately slow worker. */
                (void) uv_timer_start(&t->delay, on_delay, t->cfg->step_delay_ms, 0);
        else
                step_round(t);
}

static void on_first_pull(PsnetWorker *w, int r, void *ud);

/* Admitted again after leaving the membership (libpsnet's -ESTALE): the
 * clock pscoord gives, and the data where the job stands at it. */
static void trainer_rejoin(Trainer *t) {
        int64_t was = t->clock;
        t->clock = psnet_worker_start_clock(t->w);
        t->resume_steps = t->clock - psnet_worker_base_clock(t->w);
        t->pass = 0;
        t->step_in_pass = 0;
        t->pass_open = false;
        t->state = T_PULLING;
        log_info("admitted again: training on clock=%ld left_at=%ld",
                 (long) t->clock, (long) was);
        int r = psnet_worker_round(t->w, NULL, 0, t->params, t->clock, on_first_pull, t);
        if (r < 0) {
                log_error_errno(r, "Failed to pull the weights of clock %ld: %m", (long) t->clock);
                trainer_fail(t, r);
        }
}

static void on_step_done(PsnetWorker *w, int r, void *ud) {
        Trainer *t = ud;
        (void) w;
        t->t_exchange += mono_s() - t->t_round;
        histogram_observe(&t->round_hist, mono_s() - t->t_round);
        if (r == -ESTALE) {
                trainer_rejoin(t);
                return;
        }
        if (r < 0) {
                if (r != -ECANCELED)
                        trainer_fail(t, r);
                return;
        }
        if (t->prefetch) {
                float **tmp = t->params;
                t->params = t->next;
                t->next = tmp;
        }
        t->clock++;
        if (t->cfg->trace_pulls)
                trace_pull(t);
        if (!t->said_graph && t->model && model_graph_active(t->model)) {
                log_info("steps run as a captured graph");
                t->said_graph = true;
        }
        t->step++;
        t->samples += t->job->batch;
        t->loss_sum += t->loss;
        t->loss_n++;
        if (++t->step_in_pass >= t->steps_per_pass) {
                t->pass_open = false;
                t->pass++;
        }
        schedule_update(t);
        progress(t, false);
        report_progress(t);
        /* The job finished an epoch at this clock (not its last: the final
         * weights are evaluated anyway). */
        if (t->clock < t->end_clock && t->job_epoch - 1 > t->epochs_seen) {
                t->epochs_seen = t->job_epoch - 1;
                if (psnet_worker_rank(t->w) == 0) {
                        evaluate_epoch(t);
                        return;
                }
        }
        (void) uv_idle_start(&t->step_idle, step_idle_cb);
}

static void on_first_pull(PsnetWorker *w, int r, void *ud) {
        Trainer *t = ud;
        (void) w;
        if (r == -ESTALE) {
                trainer_rejoin(t);
                return;
        }
        if (r < 0) {
                if (r != -ECANCELED)
                        trainer_fail(t, r);
                return;
        }
        if (t->cfg->trace_pulls)
                trace_pull(t);
        partition(t);
        t->total = (uint64_t) t->job->epochs * t->ntrain;
        schedule_update(t);
        t->epochs_seen = t->job_epoch - 1; /* a worker joining later evaluates the epochs to come only */
        log_info("training rank=%u/%u images=%u steps_per_pass=%u end_clock=%ld backend=%s prefetch=%s clock=%ld",
                 t->part_rank, psnet_worker_count(t->w), t->nmine, t->steps_per_pass, (long) t->end_clock,
                 t->kb ? t->kb->ops->name : "cpu", t->prefetch ? "on" : "off", (long) t->clock);
        t->state = T_STEPPING;
        t->t0 = t->t_last = mono_s();
        (void) uv_idle_start(&t->step_idle, step_idle_cb);
}

/* --- the job's data and model ---------------------------------------------------------- */

static void load_work(uv_work_t *req) {
        Trainer *t = req->data;
        if (t->job->click) {
                t->load_r = clickdata_load(t->data_dir, "train", t->job->train_limit, &t->ctrain, t->load_err,
                                           sizeof t->load_err);
                if (t->load_r >= 0)
                        t->load_r = clickdata_load(t->data_dir, "test", t->job->test_limit, &t->ctest, t->load_err,
                                                   sizeof t->load_err);
                return;
        }
        t->load_r = dataset_load(t->data_dir, "train", t->job->train_limit, 0, 1, &t->train, t->load_err,
                                 sizeof t->load_err);
        if (t->load_r >= 0)
                t->load_r = dataset_load(t->data_dir, "test", t->job->test_limit, 0, 1, &t->test, t->load_err,
                                         sizeof t->load_err);
}

/* The model's host buffers (and --prefetch's second set of values) in the
 * memory libpsnet shares with the shards on this host, so that its rounds
 * push and pull them where they lie (docs/data-path.md, "Same-host shared
 * memory"). Unless PSNET_SHM is off or copy; where it cannot be had, the
 * model keeps its own buffers, copied in and out. */
static void trainer_share(Trainer *t, size_t nt) {
        size_t nsets = t->next ? 3 : 2, bytes = job_nfloats(t->job) * sizeof(float);
        _cleanup_free_ float **sh = ps_calloc(nsets * nt, sizeof *sh);
        if (!sh || nt == 0)
                return;
        int r = psnet_worker_memory(t->w, nsets, sh);
        if (r == -ENOTSUP)
                return; /* PSNET_SHM=off or copy: the model's own buffers, as asked */
        if (r == 0 && t->kb->ops->host_register && (r = t->kb->ops->host_register(t->kb, sh[0], nsets * bytes)) == 0)
                t->registered = sh[0];
        if (r == 0)
                r = model_lend_host(t->model, sh + nt, sh);
        if (r < 0) {
                log_info("the model's tensors stay in its own buffers, copied in and out (%s)", strerror(-r));
                if (t->registered)
                        t->kb->ops->host_unregister(t->kb, t->registered);
                t->registered = NULL;
                return;
        }
        for (size_t i = 0; t->next && i < nt; i++)
                t->next[i] = sh[2 * nt + i];
        t->shared = true;
        log_info("tensors in shared memory bytes=%zu (pushed and pulled in place on this host)", nsets * bytes);
}

/* A click model's buffers: its tensors' values and gradients, a batch's ids
 * and the test set's (gathered once), logits; dlrm's activations. */
static int click_setup(Trainer *t) {
        const Job *job = t->job;
        const ClickData *tr = t->ctrain, *te = t->ctest;
        if (tr->dense != job->in_numel || te->dense != job->in_numel || te->fields != tr->fields ||
            (job->click_fields && tr->fields != job->click_fields)) {
                char fields[48] = "";
                if (job->click_fields)
                        snprintf(fields, sizeof fields, " and %u categorical fields", job->click_fields);
                snprintf(t->fail_why, sizeof t->fail_why, "model %.64s takes %u dense features a sample%s; the data "
                         "in %.200s has %u (train) and %u (test), with %u and %u fields", job->model_name,
                         job->in_numel, fields, t->data_dir, tr->dense, te->dense, tr->fields, te->fields);
                log_error("%s", t->fail_why);
                return -EINVAL;
        }
        /* One table for every field, or one per field. */
        bool per_field = job->ntables > 1;
        if (per_field && job->ntables != tr->fields) {
                snprintf(t->fail_why, sizeof t->fail_why, "model %.64s has %zu tables: one for every field, or one "
                         "per field, and the data in %.200s has %u fields", job->model_name, job->ntables, t->data_dir,
                         tr->fields);
                log_error("%s", t->fail_why);
                return -EINVAL;
        }
        uint32_t batch = job->batch;
        /* Its step runs here, on the loop: on the CPU (click.c, dlrm.c), or
         * on a backend (click-kb.c, dlrm-kb.c) where that has been checked
         * on a GPU (CLICK_CUDA_CHECKED). PSNET_CLICK_BACKEND_STEP=cpu (or 1)
         * asks for the backend step on the CPU backend (the tests of that
         * path), =cuda for it on a GPU before the check (the device run
         * that checks it). */
        bool cuda = strcmp(t->cfg->backend, "cuda") == 0, kb_step = false;
        if (cuda && !CLICK_CUDA_CHECKED) {
                snprintf(t->fail_why, sizeof t->fail_why, "model %.64s's CUDA step has not been checked on a GPU yet "
                         "(tests/unit/test-dlrm-kb): --backend cpu runs it", job->model_name);
                log_error("%s", t->fail_why);
                return -ENOTSUP;
        }
        if (cuda || (strcmp(t->cfg->backend, "auto") == 0 && CLICK_CUDA_CHECKED && kbackend_cuda_built())) {
                char err[256];
                int r = kbackend_new(t->cfg->backend, (int) t->cfg->threads, &t->kb, err, sizeof err);
                if (r < 0 && cuda) {
                        snprintf(t->fail_why, sizeof t->fail_why, "cannot start the cuda backend: %.200s", err);
                        log_error("%s", t->fail_why);
                        return r;
                }
                kb_step = r == 0 && strcmp(t->kb->ops->name, "cuda") == 0;
                if (!kb_step)
                        t->kb = kbackend_free(t->kb);
        }
        const char *env = getenv("PSNET_CLICK_BACKEND_STEP");
        if (!kb_step && env && *env) {
                const char *be = strcmp(env, "1") == 0 ? "cpu" : env;
                char err[256];
                int r = kbackend_new(be, (int) t->cfg->threads, &t->kb, err, sizeof err);
                if (r < 0) {
                        snprintf(t->fail_why, sizeof t->fail_why, "PSNET_CLICK_BACKEND_STEP=%.16s: %.200s", env, err);
                        log_error("%s", t->fail_why);
                        return r;
                }
                log_warning("PSNET_CLICK_BACKEND_STEP=%s: model %s's step on the %s backend%s", env, job->model_name,
                            t->kb->ops->name, CLICK_CUDA_CHECKED ? "" : " (not checked on a GPU yet)");
                kb_step = true;
        }
        if (t->kb && t->cfg->tf32) {
                int r = t->kb->ops->set_tf32(t->kb, true);
                if (r < 0 && r != -ENOTSUP)
                        return log_error_errno(r, "Failed to turn on TF32: %m");
        }
        if (strcmp(t->cfg->backend, "auto") == 0 && !kb_step)
                log_info("model %s trains on the CPU (%s)", job->model_name,
                         CLICK_CUDA_CHECKED ? "no GPU is visible" : "its CUDA step has not been checked on a GPU yet");
        if (t->cfg->prefetch)
                log_warning("--prefetch is for models of layers: model %s pulls each batch's rows first; "
                            "training without it", job->model_name);
        t->prefetch = false;
        /* dlrm's shape: dlrm.c's buffers, or for its backend step below. */
        _cleanup_free_ ModelDesc *d = NULL;
        if (job->click_fields) {
                char err[256];
                d = ps_malloc(sizeof *d);
                int r = d ? modeldesc_parse(job->model, d, err, sizeof err) : -ENOMEM;
                if (r == 0 && !t->kb)
                        r = dlrm_init(&t->dlrm, d, batch);
                if (r < 0)
                        return log_error_errno(r, "Failed to build model %s: %m", job->model_name);
                if (t->cfg->threads > 0 && !t->kb)
                        openblas_set_num_threads((int) t->cfg->threads);
        }
        size_t floats = 0, nlogits = MAX((size_t) batch, (size_t) t->ntest);
        for (size_t k = 0; k < job->ntensors; k++)
                floats += 2 * job->tensors[k].numel;
        t->cbuf = ps_calloc(floats + nlogits, sizeof(float));
        t->params = ps_calloc(job->ntensors, sizeof *t->params);
        t->grads = ps_calloc(job->ntensors, sizeof *t->grads);
        t->perm = ps_malloc((size_t) t->ntrain * sizeof(uint32_t));
        if (!t->cbuf || !t->params || !t->grads || !t->perm ||
            click_batch_init(&t->cbatch, (size_t) batch * tr->fields, job->click_dim, true, per_field) < 0 ||
            click_batch_init(&t->ctestb, (size_t) t->ntest * te->fields, job->click_dim, false, per_field) < 0 ||
            click_batch_gather(&t->ctestb, te, NULL, te->n) < 0)
                return log_error_errno(ENOMEM, "Out of memory");
        float *p = t->cbuf;
        for (size_t k = 0; k < job->ntensors; k++) {
                t->params[k] = p, p += job->tensors[k].numel;
                t->grads[k] = p, p += job->tensors[k].numel;
        }
        t->clogits = p;
        if (t->kb) {
                /* Its step on the backend: room for a batch's rows, and the test set's. */
                char err[256];
                size_t rows = MAX((size_t) batch * tr->fields, t->ctestb.nuniq);
                int r = d ? dlrm_kb_init(&t->dkb, t->kb, d, batch, rows, err, sizeof err)
                          : lr_kb_init(&t->lkb, t->kb, tr->fields, job->in_numel, batch, rows, err, sizeof err);
                if (r < 0) {
                        snprintf(t->fail_why, sizeof t->fail_why, "model %.64s on the %s backend: %.150s",
                                 job->model_name, t->kb->ops->name, err);
                        log_error("%s", t->fail_why);
                        return r;
                }
                log_info("model %s's step runs on the %s backend", job->model_name, t->kb->ops->name);
        }
        log_info("click model %s dense=%u fields=%u tables=%s%s dim=%u test_ids=%zu", job->model_name, job->in_numel,
                 tr->fields, job->tables[0].name, per_field ? ",... (one per field)" : "", job->click_dim,
                 t->ctestb.nuniq);
        return 0;
}

/* Builds the backend, the model and the buffers for the job. */
static int trainer_setup(Trainer *t) {
        char err[256];
        const Job *job = t->job;
        uint32_t batch = job->batch;
        t->prefetch = t->cfg->prefetch;
        if (job->click && (t->ctrain->n > UINT32_MAX || t->ctest->n > UINT32_MAX)) {
                snprintf(t->fail_why, sizeof t->fail_why, "more than 2^32 samples in %.200s", t->data_dir);
                log_error("%s", t->fail_why);
                return -EFBIG;
        }
        t->ntrain = job->click ? (uint32_t) t->ctrain->n : t->train->n;
        t->ntest = job->click ? (uint32_t) t->ctest->n : t->test->n;
        if (job->external) {
                log_error("model %s lists tensors only: its client computes it (psnet.torch, docs/python.md); "
                          "workerd builds models of layers", job->model_name);
                return -EOPNOTSUPP;
        }
        uint32_t nw = MAX(psnet_worker_count(t->w), 1u);
        if (t->ntrain / nw < batch) {
                uint32_t have = t->ntrain / nw;
                log_error("this worker's partition has %u samples, fewer than one batch of %u", have, batch);
                snprintf(t->fail_why, sizeof t->fail_why, "its partition has %u samples, fewer than one batch of %u",
                         have, batch);
                return -EINVAL;
        }
        if (job->click)
                return click_setup(t);
        if (dataset_check_model(t->train, t->test, job->in_numel, job->classes, err, sizeof err) < 0) {
                log_error("model %s does not fit the data in %s: %s", job->model_name, t->data_dir, err);
                snprintf(t->fail_why, sizeof t->fail_why, "model %.100s does not fit the data in %.100s: %s",
                         job->model_name, t->data_dir, err);
                return -EINVAL;
        }
        int r = kbackend_new(t->cfg->backend, (int) t->cfg->threads, &t->kb, err, sizeof err);
        if (r < 0) {
                log_error("cannot start the %s backend reason=\"%s\"", t->cfg->backend, err);
                return r;
        }
        if (t->cfg->tf32) {
                r = t->kb->ops->set_tf32(t->kb, true);
                if (r == -ENOTSUP)
                        log_warning("--tf32 has no effect on the %s backend", t->kb->ops->name);
                else if (r < 0)
                        return log_error_errno(r, "Failed to turn on TF32: %m");
        }
        r = model_new_text(t->kb, job->model, (int) batch, &t->model, err, sizeof err);
        /* --backend auto picked a device whose backend lacks one of the model's ops. */
        if (r == -ENOTSUP && strcmp(t->cfg->backend, "auto") == 0 && strcmp(t->kb->ops->name, "cpu") != 0) {
                log_warning("model %s on the %s backend: %s; training on the cpu backend", job->model_name,
                            t->kb->ops->name, err);
                t->kb = kbackend_free(t->kb);
                r = kbackend_new("cpu", (int) t->cfg->threads, &t->kb, err, sizeof err);
                if (r >= 0)
                        r = model_new_text(t->kb, job->model, (int) batch, &t->model, err, sizeof err);
        }
        if (r < 0) {
                log_error("cannot build the model %s reason=\"%s\"", job->model_name, err);
                snprintf(t->fail_why, sizeof t->fail_why, "cannot build the model %.200s: %s", job->model_name, err);
                return r;
        }
        model_set_seed(t->model, job->seed ^ (uint64_t) psnet_worker_rank(t->w));
        model_set_options(t->model, !t->cfg->no_graphs, true);
        size_t nt = model_ntensors(t->model);
        t->params = ps_calloc(nt, sizeof *t->params);
        t->grads = ps_calloc(nt, sizeof *t->grads);
        /* Batches are gathered straight into the model's (page-locked) buffers. */
        t->xb = model_batch_x(t->model);
        t->yb = model_batch_y(t->model);
        t->perm = ps_malloc((size_t) t->ntrain * sizeof(uint32_t));
        if (!t->params || !t->grads || !t->perm)
                return log_error_errno(ENOMEM, "Out of memory");
        if (t->prefetch && !(t->next = ps_calloc(nt, sizeof *t->next)))
                return log_error_errno(ENOMEM, "Out of memory");
        trainer_share(t, nt);
        for (size_t i = 0; i < nt; i++) {
                t->params[i] = model_param_host(t->model, i);
                t->grads[i] = model_grad_host(t->model, i);
        }
        /* --prefetch on: the next clock's pull is sent while the step computes,
         * into a second set of (page-locked) buffers; the two sets alternate. The
         * pulled weights then miss this worker's own last push (one clock staler
         * under ASP/SSP; under BSP the shard answers only once the clock closed,
         * so nothing changes but the order of the requests). Off by default: on
         * the H100 it gave +20-30% samples/s on a 7 MiB model under ASP but cost
         * accuracy, and slowed the 0.8 MiB demo model (docs/bench-log.md). It
         * only overlaps anything where the step runs on a device (ops->async). */
        if (t->prefetch && !t->kb->ops->async)
                log_warning("--prefetch on with the %s backend: the step is done before the pull leaves, "
                            "nothing overlaps", t->kb->ops->name);
        if (t->prefetch && !t->shared) {
                for (size_t i = 0; i < nt; i++) {
                        r = t->kb->ops->host_alloc(t->kb, model_tensor_numel(t->model, i) * sizeof(float),
                                                   (void **) &t->next[i]);
                        if (r < 0)
                                return log_error_errno(r, "Failed to allocate pull buffers: %m");
                }
        }
        return 0;
}

static void load_done(uv_work_t *req, int status) {
        Trainer *t = req->data;
        if (!t->w)
                return; /* finishing after the loop stopped */
        if (status < 0 || t->load_r < 0) {
                log_error("cannot load the data reason=\"%s\"", status < 0 ? uv_strerror(status) : t->load_err);
                snprintf(t->fail_why, sizeof t->fail_why, "cannot load the data from %.200s: %s", t->data_dir,
                         status < 0 ? uv_strerror(status) : t->load_err);
                trainer_fail(t, status < 0 ? status : t->load_r);
                return;
        }
        if (t->stop) {
                t->stopped_early = true;
                trainer_leave(t);
                return;
        }
        if (t->job->click)
                log_info("data loaded dir=%s format=clicklog train=%lu test=%lu fields=%u dense=%u", t->data_dir,
                         (unsigned long) t->ctrain->n, (unsigned long) t->ctest->n, t->ctrain->fields,
                         t->ctrain->dense);
        else {
                char shape[64];
                md_shape_string(&t->train->shape, shape, sizeof shape);
                log_info("data loaded dir=%s format=%s train=%u test=%u sample=\"%s\" classes=%u", t->data_dir,
                         t->train->format, t->train->n, t->test->n, shape, MAX(t->train->classes, t->test->classes));
        }
        int r = trainer_setup(t);
        if (r < 0) {
                trainer_fail(t, r);
                return;
        }
        t->state = T_PULLING;
        t->clock = psnet_worker_start_clock(t->w);
        t->resume_steps = t->clock - psnet_worker_base_clock(t->w);
        r = psnet_worker_round(t->w, NULL, 0, t->params, t->clock, on_first_pull, t);
        if (r < 0) {
                log_error_errno(r, "Failed to pull the first weights: %m");
                trainer_fail(t, r);
        }
}

/* --- libpsnet's events -------------------------------------------------------------- */

static void on_job(PsnetWorker *w, void *ud) {
        Trainer *t = ud;
        t->job = psnet_worker_job(w);
        if (t->stop) {
                trainer_leave(t);
                return;
        }
        t->state = T_LOADING;
        t->data_dir = t->cfg->data ? t->cfg->data : t->job->dataset;
        /* In the thread pool: the loop keeps the lease and answers signals
         * however long the files take. */
        t->load_work.data = t;
        int r = uv_queue_work(&t->loop, &t->load_work, load_work, load_done);
        if (r < 0) {
                log_error("Failed to start the data loader: %s", uv_strerror(r));
                trainer_fail(t, r);
        }
}

static void on_stop(PsnetWorker *w, const char *why, void *ud) {
        Trainer *t = ud;
        t->stop = true;
        if (psnet_worker_job_state(w) == PSNET_JOB_FAILED && t->exit_code == 0)
                t->exit_code = -ECANCELED; /* the job failed: this worker's exit says so */
        if (t->state == T_EVALUATING || t->state == T_FINISHING || t->state == T_DONE)
                return;
        log_info("stopping after this step reason=\"%s\"", why);
        /* The step in flight: a few seconds to end, none once the job failed. */
        psnet_worker_stopping(w, psnet_worker_job_state(w) == PSNET_JOB_FAILED ? 0 : PSNET_STOP_GRACE_MS);
        if (t->state == T_JOINING || t->state == T_WAITING)
                trainer_leave(t);
}

/* pscoord asks this worker to evaluate: the one it asked first has gone. */
static void on_evaluate(PsnetWorker *w, void *ud) {
        Trainer *t = ud;
        (void) w;
        if (t->state == T_WAITING)
                evaluate_start(t);
        else
                log_warning("pscoord asked for an evaluation while %s; ignored",
                            t->state == T_EVALUATING ? "evaluating already" : "training");
}

static void on_failed(PsnetWorker *w, int err, const char *reason, void *ud) {
        Trainer *t = ud;
        if (err == -ETIMEDOUT && strcmp(reason, "no answer") != 0)
                log_error("cannot talk to pscoord at %s reason=\"%s\"", t->cfg->coord, reason);
        else if (err == -ETIMEDOUT)
                log_error_errno(err, "pscoord at %s did not answer within %u s (is it running?)", t->cfg->coord,
                                t->cfg->connect_timeout);
        else
                log_error("pscoord refused registration reason=\"%s\"", reason);
        (void) w;
        t->exit_code = err;
        uv_stop(&t->loop);
}

static void on_registered(PsnetWorker *w, void *ud) {
        Trainer *t = ud;
        (void) w;
        service_ready(t->service);
}

static const char *state_name(TrainerState s) {
        static const char *const names[] = { "joining", "loading", "pulling", "training", "finishing", "waiting",
                                             "evaluating", "done" };
        return s <= T_DONE ? names[s] : "?";
}

static void trainer_metrics(void *ud, MetricsBuf *b) {
        Trainer *t = ud;
        uint64_t pushed = 0, pulled = 0, rounds = 0;
        double wait_s = 0;
        if (t->w)
                psnet_worker_traffic(t->w, &pushed, &pulled, &rounds, &wait_s);
        metrics_family(b, "psnet_workerd_state", "gauge", "What the worker does (1 for the current state).");
        for (TrainerState s = T_JOINING; s <= T_DONE; s++)
                metrics_sample(b, "psnet_workerd_state", t->state == s ? 1 : 0, "state", state_name(s), NULL);
        metrics_one(b, "psnet_workerd_steps_total", "counter", "Training steps done.", (double) t->step);
        metrics_one(b, "psnet_workerd_samples_total", "counter", "Samples trained on.", (double) t->samples);
        metrics_one(b, "psnet_workerd_clock", "gauge", "The worker's clock.", (double) t->clock);
        metrics_one(b, "psnet_workerd_epoch", "gauge", "The job's epoch in progress (1-based).", (double) t->job_epoch);
        metrics_one(b, "psnet_workerd_job_progress", "gauge", "The job's progress (0..1) as this worker sees it.",
                    t->job_progress);
        /* Rates are PromQL's (rate(psnet_workerd_samples_total[1m])); a loss
         * is left out until there is one. */
        if (t->step > 0 && isfinite(t->last_loss))
                metrics_one(b, "psnet_workerd_loss", "gauge", "Mean training loss over the last progress interval.",
                            t->last_loss);
        metrics_one(b, "psnet_workerd_pushed_bytes_total", "counter", "Gradient bytes pushed.", (double) pushed);
        metrics_one(b, "psnet_workerd_pulled_bytes_total", "counter", "Value bytes pulled.", (double) pulled);
        metrics_one(b, "psnet_workerd_wait_seconds_total", "counter", "Seconds spent waiting for the shards.", wait_s);
        metrics_histogram(b, "psnet_workerd_round_seconds", "A push/pull round, from its start to its last reply.",
                          &t->round_hist);
        metrics_histogram(b, "psnet_workerd_compute_seconds", "A training step's compute.", &t->compute_hist);
}

static void trainer_status(void *ud, char *buf, size_t n) {
        Trainer *t = ud;
        if (t->state == T_STEPPING)
                snprintf(buf, n, "training epoch %u/%u (%.0f%%) step %lu loss %.4f", t->job_epoch,
                         t->job ? t->job->epochs : 0, 100.0 * t->job_progress, (unsigned long) t->step, t->last_loss);
        else
                snprintf(buf, n, "%s", state_name(t->state));
}

static void on_signal(void *ud, int signo) {
        Trainer *t = ud;
        (void) signo;
        service_stopping(t->service);
        if (t->state == T_FINISHING || t->state == T_EVALUATING || t->state == T_DONE)
                return;
        t->stop = true;
        psnet_worker_stopping(t->w, PSNET_STOP_GRACE_MS); /* the step in flight: a few seconds, not --round-timeout */
        if (t->state == T_JOINING || t->state == T_WAITING)
                trainer_leave(t);
}

static void trainer_free(Trainer *t) {
        size_t nt = t->model ? model_ntensors(t->model) : 0;
        /* The buffer sets may have swapped: free the ones that are not the model's. */
        for (size_t i = 0; t->next && !t->shared && i < nt; i++) {
                float *mine = model_param_host(t->model, i), *other = t->params[i] == mine ? t->next[i] : t->params[i];
                if (other)
                        t->kb->ops->host_free(t->kb, other);
        }
        ps_free(t->next);
        model_free(t->model);
        dlrm_kb_free(&t->dkb);
        lr_kb_free(&t->lkb);
        kbackend_free(t->kb);
        dataset_free(t->train);
        dataset_free(t->test);
        clickdata_free(t->ctrain);
        clickdata_free(t->ctest);
        click_batch_free(&t->cbatch);
        click_batch_free(&t->ctestb);
        dlrm_free(&t->dlrm);
        ps_free(t->cbuf);
        ps_free(t->perm);
        ps_free(t->params);
        ps_free(t->grads);
}

int trainer_run(const WorkerConfig *cfg) {
        Trainer t = { .cfg = cfg, .state = T_JOINING };
        int r = uv_loop_init(&t.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        const ServiceOps sops = { .stop = on_signal, .metrics = trainer_metrics, .status = trainer_status };
        r = service_new(&t.loop, "workerd", &sops, &t, &t.service);
        char herr[256];
        if (r == 0 && cfg->http && (r = service_http(t.service, cfg->http, herr, sizeof herr)) < 0) {
                log_error("%s", herr);
                r = -EINVAL;
                goto out;
        }
        if (r == 0)
                r = uv_idle_init(&t.loop, &t.step_idle);
        if (r == 0)
                r = uv_timer_init(&t.loop, &t.delay);
        if (r < 0) {
                log_error_errno(r, "Failed to set up the event loop: %s", uv_strerror(r));
                goto out;
        }
        t.step_idle.data = t.delay.data = &t;
        const PsnetWorkerOptions o = {
                .coord = cfg->coord, .connect_timeout_ms = cfg->connect_timeout * 1000u,
                .round_timeout_ms = cfg->round_timeout * 1000u, .keys_dir = cfg->keys, .key_name = cfg->key,
                .coord_key_name = cfg->coord_key,
        };
        const PsnetWorkerEvents ev = { .registered = on_registered, .job = on_job, .stop = on_stop,
                                       .evaluate = on_evaluate, .failed = on_failed };
        r = psnet_worker_new(&t.loop, &o, &ev, &t, &t.w);
        if (r < 0) {
                if (r != -EINVAL)
                        log_error_errno(r, "Cannot reach pscoord at %s: %m", cfg->coord);
                goto out;
        }
        (void) uv_run(&t.loop, UV_RUN_DEFAULT);
        r = t.exit_code;
out:
        if (t.registered) {
                /* Nothing copies to or from the shared memory once the backend is idle. */
                (void) t.kb->ops->sync(t.kb);
                t.kb->ops->host_unregister(t.kb, t.registered);
                t.registered = NULL;
        }
        t.w = psnet_worker_free(t.w);
        t.service = service_free(t.service);
        if (t.step_idle.data)
                uv_close((uv_handle_t *) &t.step_idle, NULL);
        if (t.delay.data)
                uv_close((uv_handle_t *) &t.delay, NULL);
        /* Work in the thread pool (a load or an evaluation) finishes before the loop closes. */
        uv_run(&t.loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&t.loop) < 0)
                log_debug("event loop closed with handles open");
        trainer_free(&t);
        return r;
}
