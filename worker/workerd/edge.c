/* SPDX-License-Identifier: Apache-2.0 */
/* One federated client of workerd --edge; see edge.h. Everything it says to
 * the cluster goes through libpsnet's edge API; what it computes is
 * edge-train.c's; the models and the data are the process's (edge-fleet.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include "alloc.h"
#include "edge.h"
#include "edge-train.h"
#include "log.h"
#include "macro.h"

struct Edge {
        uv_loop_t *loop;
        PsnetEdge *pe;
        EdgeHost host;
        uint32_t part, nparts;
        EdgeState state;
        bool leaving;
        int exit_code;
        const Job *job;
        const Dataset *train, *test;
        Dataset own_test;               /* its share of the test set: what a federated evaluation tests */
        /* A lone client's full test set, loaded when pscoord first asks it to
         * test the global model (edge_data without one) */
        char *test_dir;
        uint32_t test_limit;
        Dataset *loaded_test;
        char load_err[256];
        uint32_t *mine, nmine;
        EdgeSlot *slot;                 /* the model lent to it, if any */
        float **pbuf;                   /* the pull buffer lent to it, if any (EdgeHost.want_pull) */
        bool pulled;                    /* pbuf holds the model of rd, pulled */
        /* requests that wait for IDLE: a round to train, a model to test */
        PsnetEdgeRound pending, pending_eval;
        bool has_pending, has_pending_eval;
        /* the request in hand */
        PsnetEdgeRound rd;
        int64_t pulled_rounds;          /* the rounds in the model pulled for a test */
        float *const *upd;              /* libpsnet's update buffers while training */
        double loss;
        float accuracy;
        uv_work_t work;
        int work_r;
        EdgeStats stats;
};

const char *edge_state_name(EdgeState s) {
        static const char *const names[] = { "joining", "loading", "idle", "queued", "pulling", "training",
                                             "pushing", "evaluating", "leaving", "left" };
        return s <= E_LEFT ? names[s] : "?";
}

void edge_log(const Edge *e) {
        char f[48];
        uint32_t id = e->pe ? psnet_edge_id(e->pe) : 0;
        if (id)
                snprintf(f, sizeof f, "edge=%u", id);
        else
                snprintf(f, sizeof f, "part=%u", e->part);
        log_set_fields(f);
}

/* --- leaving --------------------------------------------------------------------------- */

static void edge_gone(Edge *e) {
        if (e->state == E_LEFT)
                return;
        e->state = E_LEFT;
        e->host.gone(e, e->exit_code, e->host.ud);
}

static void on_left(PsnetEdge *pe, int r, void *ud) {
        (void) pe, (void) r;
        edge_gone(ud);
}

static void edge_leave(Edge *e) {
        if (e->state == E_LEAVING || e->state == E_LEFT)
                return;
        edge_log(e);
        e->state = E_LEAVING;
        const EdgeStats *s = &e->stats;
        /* The process's CPU so far (all its threads; with --simulate, all its clients'). */
        struct rusage ru;
        double cpu = getrusage(RUSAGE_SELF, &ru) == 0
                             ? (double) ru.ru_utime.tv_sec + (double) ru.ru_stime.tv_sec +
                                       ((double) ru.ru_utime.tv_usec + (double) ru.ru_stime.tv_usec) / 1e6
                             : -1.0;
        log_info("leaving rounds=%lu counted=%lu late=%lu clipped=%lu bytes_sent=%lu bytes_raw=%lu process_cpu_s=%.2f",
                 (unsigned long) s->rounds, (unsigned long) s->counted, (unsigned long) s->late,
                 (unsigned long) s->clipped, (unsigned long) s->bytes_sent, (unsigned long) s->bytes_raw, cpu);
        if (!e->pe || !psnet_edge_id(e->pe) || psnet_edge_leave(e->pe, on_left, e) < 0)
                edge_gone(e);
}

void edge_fail(Edge *e, int r) {
        if (e->exit_code == 0)
                e->exit_code = r;
        edge_leave(e);
}

/* Leave at once when nothing is under way, else when it is done (go_idle). */
void edge_stop(Edge *e) {
        e->leaving = true;
        psnet_edge_abandon(e->pe); /* an update waiting for its round's peers: none will come */
        if (e->state == E_IDLE || e->state == E_JOINING)
                edge_leave(e);
        else if (e->state != E_LEAVING && e->state != E_LEFT) {
                edge_log(e);
                log_info("leaving once %s ends", edge_state_name(e->state));
        }
}

/* --- the model lent ---------------------------------------------------------------------- */

static void give_back_pull(Edge *e) {
        float **b = e->pbuf;
        if (!b)
                return;
        e->pbuf = NULL;
        e->pulled = false;
        e->host.give_back_pull(e, b, e->host.ud);
        edge_log(e);
}

static void give_back(Edge *e) {
        give_back_pull(e);
        EdgeSlot *s = e->slot;
        if (!s)
                return;
        e->slot = NULL;
        e->host.give_back(e, s, e->host.ud);
        edge_log(e);
}

/* A request waits for IDLE: ask for a model (once); a round, with pull
 * buffers, for one of them first. */
static void want(Edge *e) {
        if (e->state != E_IDLE)
                return; /* queued already, or busy: go_idle comes back here */
        e->state = E_QUEUED;
        if (!e->has_pending_eval && e->host.want_pull)
                e->host.want_pull(e, e->host.ud);
        else
                e->host.want(e, e->host.ud);
}

/* After a round or a test: the model goes back; the next request, if any. */
static void go_idle(Edge *e) {
        e->state = E_IDLE;
        give_back(e);
        if (e->leaving) {
                edge_leave(e);
                return;
        }
        if (e->has_pending_eval || e->has_pending)
                want(e);
}

/* Work on the model lent, in the thread pool. */
static int slot_work(Edge *e, uv_work_cb work, uv_after_work_cb done) {
        e->work.data = e;
        return uv_queue_work(e->loop, &e->work, work, done);
}

/* --- a round ------------------------------------------------------------------------------ */

static void on_pushed(PsnetEdge *pe, int r, const PsnetEdgePushInfo *info, void *ud) {
        Edge *e = ud;
        (void) pe;
        edge_log(e);
        e->stats.bytes_sent += info->bytes;
        e->stats.bytes_raw += info->bytes_raw;
        e->stats.clipped += info->clipped;
        if (r == 0) {
                e->stats.counted++;
                log_info("update counted number=%lu examples=%u loss=%.4f norm=%.4g bytes=%lu%s",
                         (unsigned long) e->rd.number, e->nmine, e->loss, info->norm, (unsigned long) info->bytes,
                         info->clipped ? " clipped=1" : "");
        } else if (r == -ESTALE) {
                e->stats.late++;
                log_warning("update not counted number=%lu reason=\"%s\"", (unsigned long) e->rd.number,
                            info->reason[0] ? info->reason : "late");
        } else if (info->reason[0])
                log_warning("pscoord did not take the update of round %lu reason=\"%s\"", (unsigned long) e->rd.number,
                            info->reason);
        go_idle(e);
}

static void train_work(uv_work_t *req) {
        Edge *e = req->data;
        const Job *job = e->job;
        /* fedasync: the task's number; else the aggregated round it makes. */
        uint64_t round = job->fed.async || !e->rd.round ? e->rd.number : e->rd.round;
        const EdgeTrain c = {
                .local_epochs = job->fed.local_epochs, .batch = job->batch, .lr = job->optim.lr,
                .mu = job->fed.prox_mu, .seed = edge_train_seed(job->seed, round, psnet_edge_id(e->pe)),
        };
        e->work_r = edge_train(e->slot->model, e->train, e->mine, e->nmine, &c, e->slot->w0, e->upd, &e->loss);
}

static void train_done(uv_work_t *req, int status) {
        Edge *e = req->data;
        edge_log(e);
        int r = status < 0 ? status : e->work_r;
        if (!e->pe)
                return; /* closed meanwhile (the process is ending) */
        give_back(e); /* the update is in libpsnet's buffers: the model goes to the next client */
        if (r < 0) {
                log_warning_errno(r, "Local training of round %lu failed: %m", (unsigned long) e->rd.number);
                go_idle(e);
                return;
        }
        e->state = E_PUSHING;
        r = psnet_edge_push(e->pe, e->rd.number, e->nmine, (float) e->loss, on_pushed, e);
        if (r < 0) {
                if (r != -ESTALE)
                        log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->rd.number);
                go_idle(e);
        }
}

/* The model of rd is in the model lent (from a pull buffer, if any): train. */
static void train_start(Edge *e) {
        EdgeSlot *s = e->slot;
        for (size_t t = 0; t < model_ntensors(s->model); t++) {
                size_t bytes = model_tensor_numel(s->model, t) * sizeof(float);
                if (e->pbuf)
                        memcpy(s->params[t], e->pbuf[t], bytes);
                memcpy(s->w0[t], s->params[t], bytes);
        }
        give_back_pull(e);
        e->state = E_TRAINING;
        int r = slot_work(e, train_work, train_done);
        if (r < 0) {
                log_warning("Failed to start local training: %s", uv_strerror(r));
                go_idle(e);
        }
}

static void on_pulled(PsnetEdge *pe, int r, int64_t rounds, void *ud) {
        Edge *e = ud;
        (void) pe, (void) rounds;
        edge_log(e);
        if (r == 0)
                r = psnet_edge_update(e->pe, &e->upd);
        if (r == -ECANCELED) {
                log_info("round given up number=%lu reason=stopping", (unsigned long) e->rd.number);
                go_idle(e);
                return;
        }
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the model of round %lu: %m", (unsigned long) e->rd.number);
                go_idle(e);
                return;
        }
        if (!e->slot) {
                /* Pulled into a buffer: now a model to train it on. */
                e->pulled = true;
                e->state = E_QUEUED;
                e->host.want(e, e->host.ud);
                return;
        }
        train_start(e);
}

static void round_start(Edge *e) {
        e->rd = e->pending;
        e->has_pending = false;
        e->stats.rounds++;
        e->state = E_PULLING;
        int r = psnet_edge_pull(e->pe, e->rd.number, e->pbuf ? e->pbuf : e->slot->params, on_pulled, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to start round %lu: %m", (unsigned long) e->rd.number);
                go_idle(e);
        }
}

/* --- a test ------------------------------------------------------------------------------- */

static void on_reported(PsnetEdge *pe, int r, void *ud) {
        Edge *e = ud;
        (void) pe, (void) r;
        edge_log(e);
        go_idle(e);
}

static void eval_work(uv_work_t *req) {
        Edge *e = req->data;
        if (!e->rd.local && !e->test) {
                /* The first test of the global model this process was asked for. */
                e->work_r = dataset_load(e->test_dir, "test", e->test_limit, 0, 1, &e->loaded_test, e->load_err,
                                         sizeof e->load_err);
                if (e->work_r < 0)
                        return;
                e->test = e->loaded_test;
        }
        e->work_r = edge_test(e->slot->model, e->rd.local ? &e->own_test : e->test, &e->accuracy, &e->loss);
}

static void eval_done(uv_work_t *req, int status) {
        Edge *e = req->data;
        edge_log(e);
        int r = status < 0 ? status : e->work_r;
        if (!e->pe)
                return;
        if (r < 0 || e->leaving) {
                if (r < 0 && e->load_err[0])
                        log_error("cannot load the test set to evaluate reason=\"%s\"", e->load_err);
                else if (r < 0)
                        log_error_errno(r, "Evaluation failed: %m");
                go_idle(e);
                return;
        }
        const Dataset *t = e->rd.local ? &e->own_test : e->test;
        log_info("evaluated accuracy=%.4f test_loss=%.4f images=%u rounds=%ld%s", e->accuracy, e->loss, t->n,
                 (long) e->pulled_rounds, e->rd.local ? " own=1" : "");
        /* The model stays lent until pscoord has the report: its weights are digested. */
        r = e->rd.local ? psnet_edge_report_local(e->pe, &e->rd, e->accuracy, (float) e->loss, t->n, on_reported, e)
                        : psnet_edge_report(e->pe, &e->rd, e->accuracy, (float) e->loss, on_reported, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to report the accuracy: %m");
                go_idle(e);
        }
}

static void on_final(PsnetEdge *pe, int r, int64_t rounds, void *ud) {
        Edge *e = ud;
        (void) pe;
        edge_log(e);
        e->pulled_rounds = rounds;
        if (r < 0) {
                if (r != -ECANCELED) /* stopping */
                        log_warning_errno(r, "Failed to pull the model to test: %m");
                go_idle(e);
                return;
        }
        r = slot_work(e, eval_work, eval_done);
        if (r < 0) {
                log_warning("Failed to start the evaluation: %s", uv_strerror(r));
                go_idle(e);
        }
}

static void evaluate_start(Edge *e) {
        e->rd = e->pending_eval;
        e->has_pending_eval = false;
        e->state = E_EVALUATING;
        if (e->rd.round)
                log_info("testing the model of round %u", e->rd.round);
        else
                log_info("evaluating the final model");
        int r = psnet_edge_pull(e->pe, 0, e->slot->params, on_final, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the model to test: %m");
                go_idle(e);
        }
}

bool edge_lend(Edge *e, EdgeSlot *s) {
        edge_log(e);
        if (e->pulled && !e->leaving) {
                /* A round's model is in its pull buffer. */
                e->slot = s;
                train_start(e);
                return true;
        }
        e->state = E_IDLE;
        if (e->leaving) {
                give_back_pull(e);
                edge_leave(e);
                return false;
        }
        if (!e->has_pending_eval && !e->has_pending)
                return false;
        e->slot = s;
        if (e->has_pending_eval)
                evaluate_start(e);
        else
                round_start(e);
        return true;
}

bool edge_lend_pull(Edge *e, float **buf) {
        edge_log(e);
        e->state = E_IDLE;
        if (e->leaving) {
                edge_leave(e);
                return false;
        }
        if (e->has_pending_eval) {
                /* A test came meanwhile: it goes first, on a model. */
                want(e);
                return false;
        }
        if (!e->has_pending)
                return false;
        e->pbuf = buf;
        round_start(e);
        return true;
}

/* --- libpsnet's events ---------------------------------------------------------------------- */

static void on_round(PsnetEdge *pe, const PsnetEdgeRound *rd, void *ud) {
        Edge *e = ud;
        (void) pe;
        edge_log(e);
        /* Loading, queued or busy with an earlier request (which has closed at
         * pscoord): the newest waits for the model. */
        if (rd->evaluate) {
                if (rd->round > 0 && e->has_pending_eval && e->pending_eval.round == 0)
                        return; /* the final evaluation is asked for already */
                e->pending_eval = *rd;
                e->has_pending_eval = true;
        } else {
                e->pending = *rd;
                e->has_pending = true;
        }
        want(e);
}

static void on_job(PsnetEdge *pe, void *ud) {
        Edge *e = ud;
        edge_log(e);
        e->job = psnet_edge_job(pe);
        e->state = E_LOADING;
        e->host.job(e, e->job, e->host.ud);
}

static void on_end(PsnetEdge *pe, PsnetJobState state, void *ud) {
        Edge *e = ud;
        (void) pe;
        edge_log(e);
        if (state == PSNET_JOB_FAILED && e->exit_code == 0)
                e->exit_code = -ECANCELED;
        edge_stop(e);
}

static void on_registered(PsnetEdge *pe, bool again, void *ud) {
        Edge *e = ud;
        (void) pe, (void) again;
        edge_log(e);
        if (!e->job)
                log_info("waiting for a federated job part=%u", e->part);
}

static void on_failed(PsnetEdge *pe, int err, const char *reason, void *ud) {
        Edge *e = ud;
        (void) reason;
        edge_log(e);
        if (e->exit_code == 0)
                e->exit_code = err;
        if (psnet_edge_id(pe))
                edge_leave(e); /* refused the job: it leaves the cluster */
        else
                edge_gone(e);
}

void edge_test_share(uint32_t n, uint32_t part, uint32_t nparts, uint32_t *start, uint32_t *count) {
        uint32_t k = n / MAX(nparts, 1u);
        *start = k ? MIN(part, nparts - 1) * k : 0;
        *count = k ? k : n;
}

/* --- life ---------------------------------------------------------------------------------- */

void edge_data(Edge *e, const Dataset *train, const Dataset *test, const Dataset *own_test, const char *test_dir,
               uint32_t test_limit, uint32_t *mine, uint32_t nmine) {
        edge_log(e);
        e->train = train;
        e->test = test;
        if (own_test)
                e->own_test = *own_test;
        else {
                /* Its own test data: share part of nparts of the test set, a
                 * contiguous slice (edge_test_share; the test set is not sorted). */
                uint32_t start, n;
                edge_test_share(test->n, e->part, e->nparts, &start, &n);
                e->own_test = dataset_slice(test, start, n);
        }
        free(e->test_dir);
        e->test_dir = test_dir ? strdup(test_dir) : NULL;
        e->test_limit = test_limit;
        free(e->mine);
        e->mine = mine;
        e->nmine = nmine;
        psnet_edge_set_examples(e->pe, nmine);
        go_idle(e);
}

int edge_new(uv_loop_t *loop, const PsnetEdgeOptions *opts, uint32_t part, uint32_t nparts, const EdgeHost *host,
             Edge **ret) {
        Edge *e = ps_calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        e->loop = loop;
        e->host = *host;
        e->part = part;
        e->nparts = nparts;
        e->state = E_JOINING;
        const PsnetEdgeEvents ev = { .registered = on_registered, .failed = on_failed, .job = on_job,
                                     .round = on_round, .end = on_end };
        int r = psnet_edge_new(loop, opts, &ev, e, &e->pe);
        if (r < 0) {
                ps_free(e);
                return r;
        }
        *ret = e;
        return 0;
}

void edge_close(Edge *e) {
        if (e)
                e->pe = psnet_edge_free(e->pe);
}

Edge *edge_free(Edge *e) {
        if (!e)
                return NULL;
        edge_close(e);
        free(e->mine);
        free(e->test_dir);
        dataset_free(e->loaded_test);
        ps_free(e);
        return NULL;
}

PsnetEdge *edge_psnet(Edge *e) { return e->pe; }
EdgeState edge_state(const Edge *e) { return e->state; }
uint32_t edge_part(const Edge *e) { return e->part; }
uint32_t edge_examples(const Edge *e) { return e->nmine; }
const EdgeStats *edge_stats(const Edge *e) { return &e->stats; }
