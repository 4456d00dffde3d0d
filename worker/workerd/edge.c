/* workerd --edge: a federated client; see edge.h. The states, each left by
 * an event:
 *
 *   JOINING  --a federated job-->  LOADING (its share of the data, in the
 *   thread pool)  -->  IDLE  --pscoord samples it for round N-->  PULLING
 *   (the round's model)  -->  TRAINING (local epochs, in the thread pool)
 *   -->  PUSHING (its delta and example count, to every shard)  -->
 *   ANSWERING (tells pscoord the update is there)  -->  IDLE ...
 *   --pscoord asks for the final evaluation-->  EVALUATING  -->  IDLE until
 *   the job is done, then it leaves.
 *
 * The data never leaves the process: only the delta of the weights (and the
 * number of examples behind it) goes to the shards. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>
#include "alloc.h"
#include "client.h"
#include "edge.h"
#include "hash.h"
#include "idx.h"
#include "kernels.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "partition.h"
#include "service.h"
#include "session.h"
#include "wire-job.h"

typedef enum { E_JOINING, E_LOADING, E_IDLE, E_PULLING, E_TRAINING, E_PUSHING, E_ANSWERING, E_EVALUATING,
               E_LEAVING } EdgeState;

typedef struct Edge {
        const WorkerConfig *cfg;
        uv_loop_t loop;
        void *zctx;
        Service *service;
        Session *session;
        NetIdentity id;
        Client *client;
        Job job;
        bool has_job;
        ShardMap *map;
        EdgeState state;
        int exit_code;
        bool leaving;
        /* data */
        uv_work_t work;
        Dataset *train, *test;
        uint32_t *mine, nmine, dim;
        int work_r;
        char err[256];
        /* model */
        KBackend *kb;
        Model *model;
        float **params, **w0, **delta;
        /* the round */
        uint64_t number, pending;     /* the round in progress; one asked for while busy */
        bool pending_eval;
        double loss;
        double norm;                /* the update's L2 norm before clipping (--dp-clip) */
        uint64_t clipped;           /* rounds whose update was clipped */
        uint64_t examples;
        size_t eval_correct;
        double eval_loss;
        uint64_t rounds, counted, late;
} Edge;

static void edge_leave(Edge *e);
static void round_start(Edge *e, uint64_t number);
static void evaluate_start(Edge *e);

static const char *state_name(EdgeState s) {
        static const char *const names[] = { "joining", "loading", "idle", "pulling", "training", "pushing",
                                             "answering", "evaluating", "leaving" };
        return s <= E_LEAVING ? names[s] : "?";
}

/* --- leaving ------------------------------------------------------------------------ */

static void on_left(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s, (void) r, (void) m;
        uv_stop(&e->loop);
}

static void edge_leave(Edge *e) {
        if (e->state == E_LEAVING)
                return;
        e->state = E_LEAVING;
        log_info("leaving rounds=%lu counted=%lu late=%lu clipped=%lu", (unsigned long) e->rounds,
                 (unsigned long) e->counted, (unsigned long) e->late, (unsigned long) e->clipped);
        if (!e->session || session_deregister(e->session, 1000, on_left, e) < 0)
                uv_stop(&e->loop);
}

static void edge_fail(Edge *e, int r) {
        if (e->exit_code == 0)
                e->exit_code = r;
        edge_leave(e);
}

/* After a round or an evaluation: the next one asked for meanwhile, if any. */
static void go_idle(Edge *e) {
        e->state = E_IDLE;
        if (e->leaving) {
                edge_leave(e);
                return;
        }
        if (e->pending_eval) {
                e->pending_eval = false;
                evaluate_start(e);
        } else if (e->pending) {
                uint64_t n = e->pending;
                e->pending = 0;
                round_start(e, n);
        }
}

/* --- the model and the data ------------------------------------------------------------ */

static void load_work(uv_work_t *req) {
        Edge *e = req->data;
        const WorkerConfig *cfg = e->cfg;
        const char *dir = cfg->data ? cfg->data : e->job.dataset;
        e->work_r = dataset_load(dir, "train", e->job.train_limit, 0, 1, &e->train, e->err, sizeof e->err);
        if (e->work_r >= 0)
                e->work_r = dataset_load(dir, "t10k", e->job.test_limit, 0, 1, &e->test, e->err, sizeof e->err);
        if (e->work_r < 0)
                return;
        uint32_t k = cfg->part_n ? cfg->part : 0, n = cfg->part_n ? cfg->part_n : 1;
        e->work_r = partition_client(e->train->y, e->train->n, 10, n, cfg->alpha, e->job.seed, k, &e->mine,
                                     &e->nmine);
        if (e->work_r < 0)
                snprintf(e->err, sizeof e->err, "cannot split the training set: %s", strerror(-e->work_r));
        else if (e->nmine == 0) {
                e->work_r = -ENODATA;
                snprintf(e->err, sizeof e->err, "partition %u/%u of the training set is empty (alpha %g)", k, n,
                         cfg->alpha);
        }
}

static int edge_setup(Edge *e) {
        char err[256];
        const Job *job = &e->job;
        e->dim = e->train->rows * e->train->cols;
        if (e->dim != job->layers[0] || job->layers[job->nlayers - 1] < 10) {
                log_error("model %s does not fit the data: %u inputs, 10 classes", job->model, e->dim);
                return -EINVAL;
        }
        int r = kbackend_new(e->cfg->backend, (int) e->cfg->threads, &e->kb, err, sizeof err);
        if (r < 0) {
                log_error("cannot start the %s backend reason=\"%s\"", e->cfg->backend, err);
                return r;
        }
        r = model_new(e->kb, job->layers, job->nlayers, (int) job->batch, &e->model);
        if (r < 0)
                return log_error_errno(r, "Failed to build the model: %m");
        model_set_options(e->model, false, true);
        size_t nt = model_ntensors(e->model);
        e->params = ps_calloc(nt, sizeof *e->params);
        e->w0 = ps_calloc(nt, sizeof *e->w0);
        e->delta = ps_calloc(nt, sizeof *e->delta);
        if (!e->params || !e->w0 || !e->delta)
                return log_error_errno(ENOMEM, "Out of memory");
        for (size_t t = 0; t < nt; t++) {
                size_t numel = model_tensor_numel(e->model, t);
                e->params[t] = model_param_host(e->model, t);
                e->w0[t] = ps_malloc(numel * sizeof(float));
                e->delta[t] = ps_malloc(numel * sizeof(float));
                if (!e->w0[t] || !e->delta[t])
                        return log_error_errno(ENOMEM, "Out of memory");
        }
        return 0;
}

static void load_done(uv_work_t *req, int status) {
        Edge *e = req->data;
        if (e->state == E_LEAVING || !e->session)
                return;
        if (status < 0 || e->work_r < 0) {
                log_error("cannot load the data reason=\"%s\"", status < 0 ? uv_strerror(status) : e->err);
                edge_fail(e, status < 0 ? status : e->work_r);
                return;
        }
        int r = edge_setup(e);
        if (r < 0) {
                edge_fail(e, r);
                return;
        }
        log_info("ready partition=%u/%u images=%u alpha=%s backend=%s", e->cfg->part_n ? e->cfg->part : 0,
                 e->cfg->part_n ? e->cfg->part_n : 1, e->nmine, e->cfg->alpha > 0 ? "dirichlet" : "iid",
                 e->kb->ops->name);
        service_ready(e->service);
        go_idle(e);
}

/* --- a round --------------------------------------------------------------------------- */

/* Local training in the thread pool: local_epochs passes over this client's
 * share, plain SGD with the job's batch and lr (FedProx: plus mu (w - w0)),
 * then delta = w - w0, clipped to L2 norm dp_clip in a private job (the
 * shards refuse it otherwise). */
static void train_work(uv_work_t *req) {
        Edge *e = req->data;
        const Job *job = &e->job;
        size_t nt = model_ntensors(e->model);
        uint32_t batch = job->batch;
        float lr = job->optim.lr, mu = job->fed.prox_mu;
        float *xb = model_batch_x(e->model);
        int32_t *yb = model_batch_y(e->model);
        double loss_sum = 0;
        uint64_t nb = 0;
        uint64_t x = job->seed * 1000003u + e->number * 7919u + session_id(e->session);
        e->work_r = 0;
        for (uint32_t ep = 0; ep < job->fed.local_epochs && e->work_r == 0; ep++) {
                shuffle_u32(e->mine, e->nmine, &x); /* a fresh order each epoch */
                for (uint32_t s = 0; s < e->nmine && e->work_r == 0; s += batch) {
                        uint32_t b = MIN(batch, e->nmine - s);
                        for (uint32_t k = 0; k < b; k++) {
                                uint32_t i = e->mine[s + k];
                                memcpy(xb + (size_t) k * e->dim, e->train->x + (size_t) i * e->dim,
                                       e->dim * sizeof(float));
                                yb[k] = e->train->y[i];
                        }
                        float loss;
                        int correct;
                        e->work_r = model_upload_params(e->model);
                        if (e->work_r == 0)
                                e->work_r = model_train_step(e->model, xb, yb, (int) b, &loss, &correct);
                        if (e->work_r < 0)
                                break;
                        for (size_t t = 0; t < nt; t++)
                                fed_client_step(e->params[t], e->w0[t], model_grad_host(e->model, t),
                                                model_tensor_numel(e->model, t), lr, mu);
                        loss_sum += loss;
                        nb++;
                }
        }
        for (size_t t = 0; t < nt && e->work_r == 0; t++) {
                size_t n = model_tensor_numel(e->model, t);
                for (size_t i = 0; i < n; i++) {
                        e->delta[t][i] = e->params[t][i] - e->w0[t][i];
                        if (!isfinite(e->delta[t][i]))
                                e->work_r = -ERANGE;
                }
        }
        double sq = 0;
        for (size_t t = 0; t < nt && e->work_r == 0; t++) {
                double nv = fed_norm2(e->delta[t], model_tensor_numel(e->model, t));
                sq += nv * nv;
        }
        e->norm = sqrt(sq);
        float clip = job->fed.strategy.dp_clip;
        if (e->work_r == 0 && clip > 0 && e->norm > clip) {
                float scale = (float) (clip / e->norm);
                for (size_t t = 0; t < nt; t++)
                        for (size_t i = 0; i < model_tensor_numel(e->model, t); i++)
                                e->delta[t][i] *= scale;
                e->clipped++;
        }
        e->loss = nb ? loss_sum / (double) nb : 0.0;
}

static void on_answer(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s;
        if (r == 0) {
                e->counted++;
                log_info("update counted number=%lu examples=%lu loss=%.4f norm=%.4g%s", (unsigned long) e->number,
                         (unsigned long) e->examples, e->loss, e->norm,
                         e->job.fed.strategy.dp_clip > 0 && e->norm > e->job.fed.strategy.dp_clip ? " clipped=1" : "");
        } else if (m && m->hdr && m->hdr->status == PSNET__STATUS__STATUS_STALE) {
                e->late++;
                log_warning("update not counted number=%lu reason=\"%s\"", (unsigned long) e->number,
                            m->hdr->reason ? m->hdr->reason : "late");
        } else
                log_warning_errno(r, "pscoord did not take the update of round %lu: %m", (unsigned long) e->number);
        go_idle(e);
}

static void on_pushed(Client *c, int r, int64_t clock, void *ud) {
        Edge *e = ud;
        (void) c, (void) clock;
        if (r == -ESTALE)
                /* A shard closed the round first: pscoord says so too (and counts it late). */
                log_warning("round %lu closed before the update reached every shard", (unsigned long) e->number);
        else if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->number);
                go_idle(e);
                return;
        }
        /* On every shard: tell pscoord, which counts it if the round is still open. */
        e->state = E_ANSWERING;
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = e->number;
        rd.has_examples = rd.has_loss = true;
        rd.examples = e->examples;
        rd.loss = (float) e->loss;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROUND_REP);
        h.body_case = PSNET__HEADER__BODY_ROUND;
        h.round = &rd;
        r = session_request(e->session, &h, PSNET__MSG_TYPE__MSG_JOB_REP, 10000, on_answer, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to answer round %lu: %m", (unsigned long) e->number);
                go_idle(e);
        }
}

static void train_done(uv_work_t *req, int status) {
        Edge *e = req->data;
        if (e->state == E_LEAVING || !e->session)
                return;
        if (status < 0 || e->work_r < 0) {
                log_warning_errno(status < 0 ? status : e->work_r, "Local training of round %lu failed: %m",
                                  (unsigned long) e->number);
                go_idle(e);
                return;
        }
        e->state = E_PUSHING;
        e->examples = (uint64_t) e->nmine;
        client_set_examples(e->client, e->examples);
        int r = client_round(e->client, (const float *const *) e->delta, (int64_t) e->number, NULL, 0, on_pushed, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->number);
                go_idle(e);
        }
}

static void on_pulled(Client *c, int r, int64_t clock, void *ud) {
        Edge *e = ud;
        (void) c, (void) clock;
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the model of round %lu: %m", (unsigned long) e->number);
                go_idle(e);
                return;
        }
        for (size_t t = 0; t < model_ntensors(e->model); t++)
                memcpy(e->w0[t], e->params[t], model_tensor_numel(e->model, t) * sizeof(float));
        e->state = E_TRAINING;
        e->work.data = e;
        r = uv_queue_work(&e->loop, &e->work, train_work, train_done);
        if (r < 0) {
                log_warning("Failed to start local training: %s", uv_strerror(r));
                go_idle(e);
        }
}

/* Not a member of any membership: no membership epoch on its requests. */
static int client_ready(Edge *e) {
        return client_follow(&e->client, &e->loop, e->zctx, &e->job, e->map, session_id(e->session),
                             e->id.enabled ? &e->id.keys : NULL, 0);
}

static void round_start(Edge *e, uint64_t number) {
        e->number = number;
        e->rounds++;
        e->state = E_PULLING;
        int r = client_ready(e);
        if (r == 0) {
                client_set_timeout(e->client, e->cfg->round_timeout * 1000u);
                r = client_round(e->client, NULL, 0, e->params, (int64_t) number, on_pulled, e);
        }
        if (r < 0) {
                log_warning_errno(r, "Failed to start round %lu: %m", (unsigned long) number);
                go_idle(e);
        }
}

/* --- the final evaluation ----------------------------------------------------------------- */

static void eval_work(uv_work_t *req) {
        Edge *e = req->data;
        e->work_r = model_upload_params(e->model);
        if (e->work_r == 0)
                e->work_r = model_evaluate(e->model, e->test->x, e->test->y, e->test->n, &e->eval_correct,
                                           &e->eval_loss);
}

static void on_result(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s, (void) m;
        if (r < 0)
                log_warning_errno(r, "pscoord did not take the accuracy: %m");
        go_idle(e);
}

static void eval_done(uv_work_t *req, int status) {
        Edge *e = req->data;
        if (e->state == E_LEAVING || !e->session)
                return;
        if (status < 0 || e->work_r < 0) {
                log_error_errno(status < 0 ? status : e->work_r, "Evaluation failed: %m");
                go_idle(e);
                return;
        }
        float acc = (float) e->eval_correct / (float) e->test->n;
        log_info("evaluated accuracy=%.4f test_loss=%.4f images=%u", acc, e->eval_loss, e->test->n);
        Psnet__WorkerInfo wi = PSNET__WORKER_INFO__INIT;
        Psnet__Result res = PSNET__RESULT__INIT;
        wi.id = session_id(e->session);
        wi.has_accuracy = wi.has_done = wi.done = true;
        wi.accuracy = acc;
        uint64_t d = FNV1A64_INIT; /* over the weights, as workerd's */
        for (size_t t = 0; t < model_ntensors(e->model); t++)
                d = fnv1a64(d, e->params[t], model_tensor_numel(e->model, t) * sizeof(float));
        wi.has_weights_digest = true;
        wi.weights_digest = d;
        res.worker = &wi;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_RESULT);
        h.body_case = PSNET__HEADER__BODY_RESULT;
        h.result = &res;
        int r = session_request(e->session, &h, PSNET__MSG_TYPE__MSG_RESULT_REP, 5000, on_result, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to report the accuracy: %m");
                go_idle(e);
        }
}

static void on_final(Client *c, int r, int64_t clock, void *ud) {
        Edge *e = ud;
        (void) c, (void) clock;
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the final model: %m");
                go_idle(e);
                return;
        }
        e->work.data = e;
        r = uv_queue_work(&e->loop, &e->work, eval_work, eval_done);
        if (r < 0) {
                log_warning("Failed to start the evaluation: %s", uv_strerror(r));
                go_idle(e);
        }
}

static void evaluate_start(Edge *e) {
        e->state = E_EVALUATING;
        log_info("evaluating the final model");
        int r = client_ready(e);
        if (r == 0)
                r = client_round(e->client, NULL, 0, e->params, 0, on_final, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the final model: %m");
                go_idle(e);
        }
}

/* --- pscoord ----------------------------------------------------------------------------- */

static void apply_config(Edge *e, const Psnet__Config *ctl) {
        char err[192];
        JobState st;
        if (ctl->job && ctl->map && !e->has_job) {
                if (job_from_proto(ctl->job, &e->job, err, sizeof err) < 0) {
                        log_error("pscoord sent a job that does not validate reason=\"%s\"", err);
                        edge_fail(e, -EPROTO);
                        return;
                }
                if (e->job.mode != MODE_FED) {
                        log_error("job %u is not federated (mode fed): an edge worker has nothing to do in it",
                                  e->job.id);
                        edge_fail(e, -EINVAL);
                        return;
                }
                if (shardmap_from_proto(ctl->map, &e->map) < 0) {
                        log_error("pscoord sent a shard map that does not validate");
                        edge_fail(e, -EPROTO);
                        return;
                }
                e->has_job = true;
                e->state = E_LOADING;
                log_info("federated job job=%u model=%s strategy=%s local_epochs=%u batch=%u lr=%g prox_mu=%g", e->job.id,
                         e->job.model, fed_strategy_name(e->job.fed.strategy.kind), e->job.fed.local_epochs,
                         e->job.batch, (double) e->job.optim.lr, (double) e->job.fed.prox_mu);
                e->work.data = e;
                int r = uv_queue_work(&e->loop, &e->work, load_work, load_done);
                if (r < 0) {
                        log_error("Failed to start the data loader: %s", uv_strerror(r));
                        edge_fail(e, r);
                        return;
                }
        } else if (ctl->map && e->has_job && e->map && ctl->map->epoch > shardmap_epoch(e->map) &&
                   (!ctl->job || ctl->job->id == e->job.id)) {
                ShardMap *m;
                if (shardmap_from_proto(ctl->map, &m) == 0) {
                        shardmap_free(e->map);
                        e->map = m;
                }
        }
        if (job_state_from_proto(ctl->job_state, &st) == 0 && job_state_final(st) && e->has_job) {
                log_info("the job is %s", job_state_name(st));
                if (st == JOB_FAILED && e->exit_code == 0)
                        e->exit_code = -ECANCELED;
                e->leaving = true;
                if (e->state == E_IDLE || e->state == E_JOINING)
                        edge_leave(e); /* else once the work under way is done (go_idle) */
        }
}

static void on_round(Edge *e, const Psnet__Round *rd) {
        bool eval = rd->has_evaluate && rd->evaluate;
        if (!e->has_job) {
                log_warning("pscoord sent a round before the job; ignored");
                return;
        }
        if (eval)
                log_info("pscoord asks this edge worker to evaluate the final model");
        else
                log_info("sampled number=%lu round=%u timeout_ms=%u edge=%u", (unsigned long) rd->number,
                         rd->has_round ? rd->round : 0, rd->has_timeout_ms ? rd->timeout_ms : 0,
                         session_id(e->session));
        if (e->state != E_IDLE) {
                /* Loading, or still on an earlier round (which has closed at pscoord). */
                if (eval)
                        e->pending_eval = true;
                else
                        e->pending = rd->number;
                return;
        }
        if (eval)
                evaluate_start(e);
        else
                round_start(e, rd->number);
}

static void on_message(Session *s, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s;
        if (m->hdr->type == PSNET__MSG_TYPE__MSG_CONFIG)
                apply_config(e, m->hdr->config);
        else if (m->hdr->type == PSNET__MSG_TYPE__MSG_ROUND)
                on_round(e, m->hdr->round);
        else
                log_debug("ignoring message from pscoord type=%s", wire_type_name(m->hdr->type));
}

static void on_registered(Session *s, bool again, void *ud) {
        Edge *e = ud;
        char f[32];
        snprintf(f, sizeof f, "edge=%u", session_id(s));
        log_set_fields(f);
        log_info("registered%s coord=%s", again ? " again" : "", session_endpoint(s));
        if (!e->has_job)
                log_info("waiting for a federated job");
}

static void on_failed(Session *s, int err, const char *reason, void *ud) {
        Edge *e = ud;
        (void) s;
        log_error("cannot join reason=\"%s\"", reason);
        e->exit_code = err;
        uv_stop(&e->loop);
}

static void on_signal(void *ud, int signo) {
        Edge *e = ud;
        (void) signo;
        service_stopping(e->service);
        e->leaving = true;
        if (e->state == E_IDLE || e->state == E_JOINING)
                edge_leave(e); /* else once the work under way is done (go_idle) */
}

static void edge_metrics(void *ud, MetricsBuf *b) {
        Edge *e = ud;
        metrics_family(b, "psnet_edge_state", "gauge", "What the edge worker does (1 for the current state).");
        for (EdgeState s = E_JOINING; s <= E_LEAVING; s++)
                metrics_sample(b, "psnet_edge_state", e->state == s ? 1 : 0, "state", state_name(s), NULL);
        metrics_one(b, "psnet_edge_rounds_total", "counter", "Rounds this client was sampled for.", (double) e->rounds);
        metrics_one(b, "psnet_edge_updates_counted_total", "counter", "Updates pscoord counted.", (double) e->counted);
        metrics_one(b, "psnet_edge_updates_late_total", "counter", "Updates that came after their round closed.",
                    (double) e->late);
        metrics_one(b, "psnet_edge_updates_clipped_total", "counter",
                    "Updates scaled down to the job's clip norm (--dp-clip).", (double) e->clipped);
        metrics_one(b, "psnet_edge_examples", "gauge", "Training examples this client holds.", (double) e->nmine);
}

static void edge_status(void *ud, char *buf, size_t n) {
        Edge *e = ud;
        snprintf(buf, n, "%s (rounds %lu, counted %lu)", state_name(e->state), (unsigned long) e->rounds,
                 (unsigned long) e->counted);
}

int edge_run(const WorkerConfig *cfg) {
        Edge e = { .cfg = cfg, .state = E_JOINING };
        char err[512];
        int r = uv_loop_init(&e.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        e.zctx = zmq_ctx_new();
        if (!e.zctx) {
                r = -ENOMEM;
                goto out;
        }
        (void) zmq_ctx_set(e.zctx, ZMQ_IO_THREADS, 1);
        if (cfg->keys) {
                r = keys_identity_load(&e.id, cfg->keys, cfg->key ? cfg->key : "edge",
                                       cfg->coord_key ? cfg->coord_key : "pscoord", PSNET__ROLE__ROLE_EDGE, err,
                                       sizeof err);
                if (r < 0) {
                        log_error("cannot use the keys reason=\"%s\"", err);
                        r = -EINVAL;
                        goto out;
                }
        }
        const ServiceOps sops = { .stop = on_signal, .metrics = edge_metrics, .status = edge_status };
        r = service_new(&e.loop, "workerd", &sops, &e, &e.service);
        if (r == 0 && cfg->http && (r = service_http(e.service, cfg->http, err, sizeof err)) < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto out;
        }
        if (r < 0)
                goto out;
        const SessionConf sc = {
                .endpoint = cfg->coord, .role = PSNET__ROLE__ROLE_EDGE,
                .connect_timeout_ms = cfg->connect_timeout * 1000u,
                .keys = e.id.enabled ? &e.id.keys : NULL, .coord_key = e.id.enabled ? e.id.coord_key : NULL,
        };
        const SessionOps so = { .registered = on_registered, .failed = on_failed, .message = on_message };
        r = session_new(&e.loop, e.zctx, &sc, &so, &e, &e.session);
        if (r == 0)
                r = session_start(e.session);
        if (r < 0) {
                log_error_errno(r, "Cannot reach pscoord at %s: %m", cfg->coord);
                goto out;
        }
        (void) uv_run(&e.loop, UV_RUN_DEFAULT);
        r = e.exit_code;
out:
        e.client = client_free(e.client);
        e.session = session_free(e.session);
        e.service = service_free(e.service);
        uv_run(&e.loop, UV_RUN_DEFAULT); /* work in the thread pool finishes before the loop closes */
        if (uv_loop_close(&e.loop) < 0)
                log_debug("event loop closed with handles open");
        if (e.zctx)
                zmq_ctx_term(e.zctx);
        for (size_t t = 0; e.model && t < model_ntensors(e.model); t++) {
                if (e.w0)
                        ps_free(e.w0[t]);
                if (e.delta)
                        ps_free(e.delta[t]);
        }
        ps_free(e.params);
        ps_free(e.w0);
        ps_free(e.delta);
        model_free(e.model);
        kbackend_free(e.kb);
        dataset_free(e.train);
        dataset_free(e.test);
        free(e.mine);
        shardmap_free(e.map);
        return r;
}
