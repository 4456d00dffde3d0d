/* workerd --edge: a federated client; see edge.h. The states, each left by
 * an event:
 *
 *   JOINING  --a federated job-->  LOADING (its share of the data, in the
 *   thread pool)  -->  IDLE  --pscoord samples it for round N-->  PULLING
 *   (the round's model)  -->  TRAINING (local epochs, in the thread pool)
 *   -->  PUSHING (its delta and example count, to every shard)  -->
 *   ANSWERING (tells pscoord the update is there)  -->  IDLE ...
 *   With --secagg (edge-secagg.h) the client answers pscoord's key and
 *   share exchanges whatever its state, and after TRAINING keeps its delta,
 *   gives the model back and waits in MASKING for the round's peers (stage
 *   3); it masks (in the thread pool) and pushes then, and after ANSWERING
 *   still answers the unmasking (stage 4).
 *   --pscoord asks for the final evaluation-->  EVALUATING  -->  IDLE until
 *   the job is done, then it leaves.
 *
 * QUEUED sits between IDLE and PULLING while the other clients of the
 * process hold the models: with --simulate N, N virtual clients (each its own
 * session, id and share of the data) live in one process, a Fleet, and share
 * one loaded dataset and --parallel models (Slots, by default one per core
 * with the cpu backend); a client holds a model while it pulls, trains and
 * pushes (the others wait their turn in a FIFO), so a round of hundreds of
 * clients runs on one machine, on all its cores, in the memory of a few.
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
#include "edge-secagg.h"
#include "hash.h"
#include "idx.h"
#include "kernels.h"
#include "keys.h"
#include "log.h"
#include "macro.h"
#include "metrics.h"
#include "model.h"
#include "partition.h"
#include "service.h"
#include "session.h"
#include "wire-job.h"

typedef enum { E_JOINING, E_LOADING, E_IDLE, E_QUEUED, E_PULLING, E_TRAINING, E_MASKING, E_PUSHING, E_ANSWERING,
               E_EVALUATING, E_LEAVING, E_LEFT } EdgeState;

typedef struct Fleet Fleet;
typedef struct Edge Edge;

/* A model and its buffers: the client that holds it pulls into params,
 * trains (w0 the pulled weights, delta the update) and pushes from it. */
typedef struct Slot {
        Fleet *f;
        Model *model;
        float **params, **w0, **delta;
        Edge *holder;
        uv_work_t work;             /* its holder's training or evaluation */
        int work_r;
        size_t eval_correct;
        double eval_loss;
        /* --compress: the holder's encoded update, per tensor and chunk */
        uint8_t **cbuf;
        size_t **csize;
        float *cscratch;
} Slot;

/* One federated client: its session, its share of the data, its rounds. */
struct Edge {
        Fleet *f;
        Slot *slot;                 /* the model it holds, if any */
        uint32_t part;              /* its share: part of the fleet's nparts */
        Session *session;
        Client *client;
        Job job;
        bool has_job;
        ShardMap *map;
        EdgeState state;
        bool leaving;
        struct Edge *next;          /* in the fleet's queue for the model */
        uint32_t *mine, nmine;
        /* the round */
        uint64_t number, pending;   /* the round in progress; one asked for while busy */
        uint32_t round, pending_round; /* the aggregated round they make (0: not said) */
        bool pending_eval;
        uint32_t eval_round;        /* the evaluation asked for: after this round (--eval-every; 0: the final) */
        uint64_t eval_number;
        int64_t eval_clock;         /* the rounds in the model pulled for it */
        double loss;
        double norm;                /* the update's L2 norm before clipping (--dp-clip) */
        uint64_t clipped;           /* rounds whose update was clipped */
        uint64_t examples;
        uint64_t rounds, counted, late;
        float **resid;              /* --compress topk: what earlier updates left out (error feedback) */
        uint64_t bytes, bytes_sent, bytes_raw; /* the last update's frames; all of them, as sent and as f32 */
        /* --secagg: the round's exchanges, the delta kept after training (then
         * masked in place), the masking work */
        EdgeSecAgg sa;
        uint64_t sa_keys_due;       /* a round whose keys wait for the data to load */
        float sa_keys_clip;
        uint32_t **sa_upd;
        bool sa_masking;
        uv_work_t sa_work;
};

typedef enum { D_NONE, D_LOADING, D_READY } DataState;

/* The process: one loop, one dataset, one model, n clients. */
struct Fleet {
        const WorkerConfig *cfg;
        uv_loop_t loop;
        void *zctx;
        Service *service;
        NetIdentity id;
        Edge *edges;
        size_t n, nleft, nready;
        uint32_t nparts, first_part;
        int exit_code;
        /* data, loaded once for the first job */
        DataState data;
        uv_work_t work;
        Edge *loader;               /* the client the data is loaded for */
        Dataset *train, *test;
        int work_r;
        char err[256];
        /* the models: nslots clients at a time (their holders), the others queued */
        KBackend *kb;
        Slot *slots;
        size_t nslots, want_slots;  /* set up; asked for (--parallel) */
        Edge *queue_head, *queue_tail;
        size_t cstride;             /* --compress: bytes per chunk in a slot's cbuf */
};

/* The model's shapes (every slot's are the same). */
static Model *fleet_model(const Fleet *f) {
        return f->slots ? f->slots[0].model : NULL;
}

static void edge_leave(Edge *e);
static void round_start(Edge *e, uint64_t number);

static void evaluate_start(Edge *e);
static void fleet_want(Edge *e);
static void sa_mask_start(Edge *e);
static void sa_drop(Edge *e);
static void sa_keys_late(Edge *e);

static const char *state_name(EdgeState s) {
        static const char *const names[] = { "joining", "loading", "idle", "queued", "pulling", "training",
                                             "masking", "pushing", "answering", "evaluating", "leaving", "left" };
        return s <= E_LEFT ? names[s] : "?";
}

/* Log lines name the client they are about (one loop: no line interleaves). */
static void edge_log(const Edge *e) {
        char f[48];
        uint32_t id = e->session ? session_id(e->session) : 0;
        if (id)
                snprintf(f, sizeof f, "edge=%u", id);
        else
                snprintf(f, sizeof f, "part=%u", e->part);
        log_set_fields(f);
}

/* --- leaving ------------------------------------------------------------------------ */

/* The process ends once every client has left. */
static void edge_gone(Edge *e) {
        Fleet *f = e->f;
        if (e->state == E_LEFT)
                return;
        e->state = E_LEFT;
        if (++f->nleft == f->n)
                uv_stop(&f->loop);
}

static void on_left(Session *s, int r, WireMsg *m, void *ud) {
        (void) s, (void) r, (void) m;
        edge_gone(ud);
}

static void edge_leave(Edge *e) {
        if (e->state == E_LEAVING || e->state == E_LEFT)
                return;
        edge_log(e);
        e->state = E_LEAVING;
        log_info("leaving rounds=%lu counted=%lu late=%lu clipped=%lu bytes_sent=%lu bytes_raw=%lu",
                 (unsigned long) e->rounds, (unsigned long) e->counted, (unsigned long) e->late,
                 (unsigned long) e->clipped, (unsigned long) e->bytes_sent, (unsigned long) e->bytes_raw);
        if (!e->session || session_deregister(e->session, 1000, on_left, e) < 0)
                edge_gone(e);
}

static void edge_fail(Edge *e, int r) {
        if (e->f->exit_code == 0)
                e->f->exit_code = r;
        edge_leave(e);
}

/* The model goes to the next client in the queue (one that is leaving leaves). */
static Slot *free_slot(Fleet *f) {
        for (size_t i = 0; i < f->nslots; i++)
                if (!f->slots[i].holder)
                        return &f->slots[i];
        return NULL;
}

/* Free models to the clients queued for one, first come first served. */
static void fleet_dispatch(Fleet *f) {
        Slot *s;
        while (f->queue_head && (s = free_slot(f))) {
                Edge *e = f->queue_head;
                f->queue_head = e->next;
                if (!f->queue_head)
                        f->queue_tail = NULL;
                e->next = NULL;
                e->state = E_IDLE;
                edge_log(e);
                if (e->leaving) {
                        edge_leave(e);
                        continue;
                }
                if (!e->pending_eval && !e->pending)
                        continue;
                s->holder = e;
                e->slot = s;
                if (e->pending_eval) {
                        e->pending_eval = false;
                        evaluate_start(e);
                } else {
                        uint64_t n = e->pending;
                        e->pending = 0;
                        e->round = e->pending_round;
                        round_start(e, n);
                }
        }
}

/* e gives its model back (if it holds one): to the next client queued. */
static void slot_release(Edge *e) {
        Slot *s = e->slot;
        if (!s)
                return;
        s->holder = NULL;
        e->slot = NULL;
        fleet_dispatch(e->f);
}

/* e wants the model for a round or the evaluation (pending, pending_eval). */
static void fleet_want(Edge *e) {
        Fleet *f = e->f;
        if (e->state != E_IDLE)
                return; /* queued already, or busy: go_idle comes back here */
        e->state = E_QUEUED;
        if (f->queue_tail)
                f->queue_tail->next = e;
        else
                f->queue_head = e;
        f->queue_tail = e;
        fleet_dispatch(f);
}

/* After a round or an evaluation: the model to the next client; e's own next
 * round or evaluation asked for meanwhile, if any. */
static void go_idle(Edge *e) {
        e->state = E_IDLE;
        slot_release(e);
        edge_log(e);
        if (e->leaving) {
                edge_leave(e);
                return;
        }
        if (e->pending_eval || e->pending)
                fleet_want(e);
}

/* --- the model and the data ------------------------------------------------------------ */

/* Training or evaluating in the thread pool, on the model e holds. */
static int slot_work(Edge *e, uv_work_cb work, uv_after_work_cb done) {
        Slot *s = e->slot;
        s->work.data = s;
        return uv_queue_work(&e->f->loop, &s->work, work, done);
}

/* Back from training or evaluating (eval): the client, or NULL when it is
 * leaving (the model goes to the next) or the work failed (it goes idle). */
static Edge *slot_work_back(Slot *s, int status, bool eval) {
        Edge *e = s->holder;
        edge_log(e);
        if (e->state == E_LEAVING || !e->session) {
                slot_release(e);
                return NULL;
        }
        int r = status < 0 ? status : s->work_r;
        if (r < 0) {
                if (eval)
                        log_error_errno(r, "Evaluation failed: %m");
                else
                        log_warning_errno(r, "Local training of round %lu failed: %m", (unsigned long) e->number);
                go_idle(e);
                return NULL;
        }
        return e;
}

static void load_work(uv_work_t *req) {
        Fleet *f = req->data;
        const Job *job = &f->loader->job;
        const char *dir = f->cfg->data ? f->cfg->data : job->dataset;
        f->work_r = dataset_load(dir, "train", job->train_limit, 0, 1, &f->train, f->err, sizeof f->err);
        if (f->work_r >= 0)
                f->work_r = dataset_load(dir, "test", job->test_limit, 0, 1, &f->test, f->err, sizeof f->err);
}

static int slot_setup(Fleet *f, Slot *s, const Job *job) {
        s->f = f;
        char err[256];
        int r = model_new_text(f->kb, job->model, (int) job->batch, &s->model, err, sizeof err);
        if (r < 0) {
                log_error("cannot build the model %s reason=\"%s\"", job->model_name, err);
                return r;
        }
        model_set_options(s->model, false, true);
        size_t nt = model_ntensors(s->model);
        s->params = ps_calloc(nt, sizeof *s->params);
        s->w0 = ps_calloc(nt, sizeof *s->w0);
        s->delta = ps_calloc(nt, sizeof *s->delta);
        if (!s->params || !s->w0 || !s->delta)
                return log_error_errno(ENOMEM, "Out of memory");
        for (size_t t = 0; t < nt; t++) {
                size_t numel = model_tensor_numel(s->model, t);
                s->params[t] = model_param_host(s->model, t);
                s->w0[t] = ps_malloc(numel * sizeof(float));
                s->delta[t] = ps_malloc(numel * sizeof(float));
                if (!s->w0[t] || !s->delta[t])
                        return log_error_errno(ENOMEM, "Out of memory");
        }
        if (job->fed.compress != COMPRESS_NONE) {
                s->cbuf = ps_calloc(nt, sizeof *s->cbuf);
                s->csize = ps_calloc(nt, sizeof *s->csize);
                s->cscratch = ps_malloc((size_t) job->chunk_floats * sizeof(float));
                if (!s->cbuf || !s->csize || !s->cscratch)
                        return log_error_errno(ENOMEM, "Out of memory");
                for (size_t t = 0; t < nt; t++) {
                        uint32_t nk = job->tensors[t].nchunks;
                        s->cbuf[t] = ps_malloc(MAX((size_t) nk * f->cstride, (size_t) 1));
                        s->csize[t] = ps_calloc(MAX(nk, 1u), sizeof **s->csize);
                        if (!s->cbuf[t] || !s->csize[t])
                                return log_error_errno(ENOMEM, "Out of memory");
                }
        }
        return 0;
}

static void slot_free(Slot *s) {
        size_t nt = s->model ? model_ntensors(s->model) : 0;
        for (size_t t = 0; t < nt; t++) {
                if (s->w0)
                        ps_free(s->w0[t]);
                if (s->delta)
                        ps_free(s->delta[t]);
                if (s->cbuf)
                        ps_free(s->cbuf[t]);
                if (s->csize)
                        ps_free(s->csize[t]);
        }
        ps_free(s->cbuf);
        ps_free(s->csize);
        ps_free(s->cscratch);
        ps_free(s->params);
        ps_free(s->w0);
        ps_free(s->delta);
        model_free(s->model);
}

/* The backend and the models: --parallel of them with the cpu backend (each
 * client's training on one core), one on a GPU. */
static int fleet_setup(Fleet *f, const Job *job) {
        char err[256];
        if (dataset_check_model(f->train, f->test, job->in_numel, job->classes, err, sizeof err) < 0) {
                log_error("model %s does not fit the data in %s: %s", job->model_name, f->cfg->data ? f->cfg->data : job->dataset, err);
                return -EINVAL;
        }
        int r = kbackend_new(f->cfg->backend, (int) f->cfg->threads, &f->kb, err, sizeof err);
        if (r < 0) {
                log_error("cannot start the %s backend reason=\"%s\"", f->cfg->backend, err);
                return r;
        }
        size_t n = MAX(f->want_slots, (size_t) 1);
        if (strcmp(f->kb->ops->name, "cpu") != 0 && n > 1) {
                log_info("one model at a time on the %s backend (--parallel %zu is for the cpu backend)",
                         f->kb->ops->name, n);
                n = 1;
        }
        if (job->fed.compress != COMPRESS_NONE)
                f->cstride = compress_bound(job->fed.compress, job->chunk_floats, job->fed.topk);
        f->slots = ps_calloc(n, sizeof *f->slots);
        if (!f->slots)
                return log_error_errno(ENOMEM, "Out of memory");
        f->nslots = n;
        for (size_t i = 0; i < n; i++)
                if ((r = slot_setup(f, &f->slots[i], job)) < 0)
                        return r;
        if (f->n > 1)
                log_info("models built models=%zu clients=%zu backend=%s", n, f->n, f->kb->ops->name);
        return 0;
}

/* The data is here: e keeps its own share of it. */
static void edge_ready(Edge *e) {
        Fleet *f = e->f;
        const WorkerConfig *cfg = f->cfg;
        edge_log(e);
        if (e->job.train_limit != f->loader->job.train_limit || strcmp(e->job.dataset, f->loader->job.dataset)) {
                log_error("job %u's data differs from the data this process loaded", e->job.id);
                edge_fail(e, -EINVAL);
                return;
        }
        int r = partition_client(f->train->y, f->train->n, e->job.classes, f->nparts, cfg->alpha, e->job.seed, e->part, &e->mine,
                                 &e->nmine);
        if (r < 0) {
                log_error("cannot split the training set reason=\"%s\"", strerror(-r));
                edge_fail(e, r);
                return;
        }
        if (e->nmine == 0) {
                log_error("partition %u/%u of the training set is empty (alpha %g)", e->part, f->nparts, cfg->alpha);
                edge_fail(e, -ENODATA);
                return;
        }
        if (f->n == 1 && e->nmine < f->train->n) {
                /* A process of one client keeps its own images only. */
                r = dataset_keep(f->train, e->mine, e->nmine);
                for (uint32_t k = 0; r == 0 && k < e->nmine; k++)
                        e->mine[k] = k;
                if (r < 0) {
                        log_error("cannot keep this client's share of the training set");
                        edge_fail(e, r);
                        return;
                }
        }
        log_info("ready partition=%u/%u images=%u alpha=%s backend=%s", e->part, f->nparts, e->nmine,
                 cfg->alpha > 0 ? "dirichlet" : "iid", f->kb->ops->name);
        if (++f->nready == f->n)
                service_ready(f->service);
        sa_keys_late(e);
        go_idle(e);
}

static void load_done(uv_work_t *req, int status) {
        Fleet *f = req->data;
        int r = status < 0 ? status : f->work_r;
        if (r < 0)
                log_error("cannot load the data reason=\"%s\"", status < 0 ? uv_strerror(status) : f->err);
        else
                r = fleet_setup(f, &f->loader->job);
        f->data = r < 0 ? D_NONE : D_READY;
        for (size_t i = 0; i < f->n; i++) {
                Edge *e = &f->edges[i];
                if (e->state != E_LOADING)
                        continue;
                if (r < 0)
                        edge_fail(e, r);
                else
                        edge_ready(e);
        }
        alloc_purge(); /* the files' buffers, and the rest of the set a lone client does not keep */
}

/* A job came for e: its share of the data, loaded once for the process. */
static void edge_load(Edge *e) {
        Fleet *f = e->f;
        e->state = E_LOADING;
        if (f->data == D_READY) {
                edge_ready(e);
                return;
        }
        if (f->data == D_LOADING)
                return; /* load_done takes it */
        f->data = D_LOADING;
        f->loader = e;
        f->work.data = f;
        int r = uv_queue_work(&f->loop, &f->work, load_work, load_done);
        if (r < 0) {
                f->data = D_NONE;
                log_error("Failed to start the data loader: %s", uv_strerror(r));
                edge_fail(e, r);
        }
}

/* --- a round --------------------------------------------------------------------------- */

/* Local training in the thread pool: local_epochs passes over this client's
 * share, plain SGD with the job's batch and lr (FedProx: plus mu (w - w0)),
 * then delta = w - w0, clipped to L2 norm dp_clip in a private job (the
 * shards refuse it otherwise). */
static void train_work(uv_work_t *req) {
        Slot *sl = req->data;
        Edge *e = sl->holder;
        Fleet *f = sl->f;
        const Job *job = &e->job;
        size_t nt = model_ntensors(sl->model);
        uint32_t batch = job->batch;
        float lr = job->optim.lr, mu = job->fed.prox_mu;
        float *xb = model_batch_x(sl->model);
        int32_t *yb = model_batch_y(sl->model);
        double loss_sum = 0;
        uint64_t nb = 0;
        /* The order of the examples follows the job's seed, the aggregated
         * round this one makes (not its number, which a retried round or a
         * restore changes) and the client: a job restored from a checkpoint
         * trains as the uninterrupted one would. fedasync: the task's number. */
        uint64_t r = job->fed.async || !e->round ? e->number : e->round;
        uint64_t x = job->seed * 1000003u + r * 7919u + session_id(e->session);
        qsort(e->mine, e->nmine, sizeof *e->mine, cmp_u32); /* from the same order in every process */
        sl->work_r = 0;
        for (uint32_t ep = 0; ep < job->fed.local_epochs && sl->work_r == 0; ep++) {
                shuffle_u32(e->mine, e->nmine, &x); /* a fresh order each epoch */
                for (uint32_t s = 0; s < e->nmine && sl->work_r == 0; s += batch) {
                        uint32_t b = MIN(batch, e->nmine - s);
                        for (uint32_t k = 0; k < b; k++) {
                                uint32_t i = e->mine[s + k];
                                memcpy(xb + (size_t) k * f->train->dim, f->train->x + (size_t) i * f->train->dim,
                                       f->train->dim * sizeof(float));
                                yb[k] = f->train->y[i];
                        }
                        float loss;
                        int correct;
                        sl->work_r = model_upload_params(sl->model);
                        if (sl->work_r == 0)
                                sl->work_r = model_train_step(sl->model, xb, yb, (int) b, &loss, &correct);
                        if (sl->work_r < 0)
                                break;
                        for (size_t t = 0; t < nt; t++)
                                fed_client_step(sl->params[t], sl->w0[t], model_grad_host(sl->model, t),
                                                model_tensor_numel(sl->model, t), lr, mu);
                        loss_sum += loss;
                        nb++;
                }
        }
        for (size_t t = 0; t < nt && sl->work_r == 0; t++) {
                size_t n = model_tensor_numel(sl->model, t);
                for (size_t i = 0; i < n; i++) {
                        sl->delta[t][i] = sl->params[t][i] - sl->w0[t][i];
                        if (!isfinite(sl->delta[t][i]))
                                sl->work_r = -ERANGE;
                }
        }
        double sq = 0;
        for (size_t t = 0; t < nt && sl->work_r == 0; t++) {
                double nv = fed_norm2(sl->delta[t], model_tensor_numel(sl->model, t));
                sq += nv * nv;
        }
        e->norm = sqrt(sq);
        float clip = job->fed.strategy.dp_clip;
        if (sl->work_r == 0 && clip > 0 && e->norm > clip) {
                float scale = (float) (clip / e->norm);
                for (size_t t = 0; t < nt; t++)
                        for (size_t i = 0; i < model_tensor_numel(sl->model, t); i++)
                                sl->delta[t][i] *= scale;
                e->clipped++;
        }
        e->loss = nb ? loss_sum / (double) nb : 0.0;
        /* --compress: each chunk encoded; top-k keeps what it leaves out for the next round. */
        CompressKind ck = job->fed.compress;
        e->bytes = 0;
        if (sl->work_r == 0 && ck == COMPRESS_TOPK && !e->resid) {
                e->resid = ps_calloc(nt, sizeof *e->resid);
                for (size_t t = 0; e->resid && t < nt; t++)
                        if (!(e->resid[t] = ps_calloc(model_tensor_numel(sl->model, t), sizeof(float))))
                                sl->work_r = -ENOMEM;
                if (!e->resid)
                        sl->work_r = -ENOMEM;
        }
        for (size_t t = 0; sl->work_r == 0 && ck != COMPRESS_NONE && t < nt; t++)
                for (uint32_t k = 0; k < job->tensors[t].nchunks; k++) {
                        size_t at = (size_t) k * job->chunk_floats;
                        uint32_t len = job_chunk_len(job, (uint32_t) t, k);
                        sl->csize[t][k] = compress_encode(ck, sl->delta[t] + at, len, job->fed.topk,
                                                         e->resid ? e->resid[t] + at : NULL,
                                                         sl->cbuf[t] + (size_t) k * f->cstride, sl->cscratch);
                        e->bytes += sl->csize[t][k];
                }
        if (ck == COMPRESS_NONE)
                for (size_t t = 0; t < nt; t++)
                        e->bytes += model_tensor_numel(sl->model, t) * sizeof(float);
}

/* The pushed frame of chunk k of tensor t: the encoded one (--compress). */
static void compressed_frame(void *ud, uint32_t tensor, uint32_t chunk, const void **ret_data, size_t *ret_size) {
        Slot *s = ud;
        *ret_data = s->cbuf[tensor] + (size_t) chunk * s->f->cstride;
        *ret_size = s->csize[tensor][chunk];
}

static void on_answer(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s;
        edge_log(e);
        if (r == 0) {
                e->counted++;
                log_info("update counted number=%lu examples=%lu loss=%.4f norm=%.4g bytes=%lu%s",
                         (unsigned long) e->number, (unsigned long) e->examples, e->loss, e->norm,
                         (unsigned long) e->bytes,
                         e->job.fed.strategy.dp_clip > 0 && e->norm > e->job.fed.strategy.dp_clip ? " clipped=1" : "");
        } else if (m && m->hdr && m->hdr->status == PSNET__STATUS__STATUS_STALE) {
                e->late++;
                log_warning("update not counted number=%lu reason=\"%s\"", (unsigned long) e->number,
                            m->hdr->reason ? m->hdr->reason : "late");
        } else
                log_warning_errno(r, "pscoord did not take the update of round %lu: %m", (unsigned long) e->number);
        go_idle(e);
}

/* rd to pscoord (an update's answer, a secure aggregation stage, an
 * accuracy); cb gets pscoord's reply. */
static int round_answer(Edge *e, Psnet__Round *rd, unsigned timeout_ms, SessionReplyFn cb) {
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ROUND_REP);
        h.body_case = PSNET__HEADER__BODY_ROUND;
        h.round = rd;
        return session_request(e->session, &h, PSNET__MSG_TYPE__MSG_JOB_REP, timeout_ms, cb, e);
}

static void on_pushed(Client *c, int r, int64_t clock, void *ud) {
        Edge *e = ud;
        (void) c, (void) clock;
        edge_log(e);
        if (r == 0 || r == -ESTALE) {
                e->bytes_sent += e->bytes;
                e->bytes_raw += job_nfloats(&e->job) * sizeof(float);
        }
        sa_drop(e); /* a masked update is no longer needed once on the shards (or refused) */
        if (r == -ESTALE)
                /* A shard closed the round first: pscoord says so too (and counts it late). */
                log_warning("round %lu closed before the update reached every shard", (unsigned long) e->number);
        else if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->number);
                go_idle(e);
                return;
        }
        /* On every shard: the model goes to the next client; tell pscoord, which
         * counts the update if the round is still open. */
        e->state = E_ANSWERING;
        if (e->slot) {
                slot_release(e);
                edge_log(e);
        }
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = e->number;
        rd.has_examples = rd.has_loss = rd.has_bytes = true;
        rd.bytes = e->bytes;
        rd.examples = e->examples;
        rd.loss = (float) e->loss;
        r = round_answer(e, &rd, 10000, on_answer);
        if (r < 0) {
                log_warning_errno(r, "Failed to answer round %lu: %m", (unsigned long) e->number);
                go_idle(e);
        }
}

static void train_done(uv_work_t *req, int status) {
        Slot *sl = req->data;
        Edge *e = slot_work_back(sl, status, false);
        if (!e)
                return;
        e->examples = (uint64_t) e->nmine;
        if (e->job.fed.secagg) {
                if (e->pending > e->number) {
                        /* Sampled again while it trained (stopped, slow): its round went
                         * on without it, and no peer will mask with it any more. */
                        log_info("update of round %lu dropped: round %lu has started", (unsigned long) e->number,
                                 (unsigned long) e->pending);
                        go_idle(e);
                        return;
                }
                /* The delta stays with this client; the model goes to the next. */
                size_t nt = model_ntensors(sl->model);
                sa_drop(e);
                e->sa_upd = ps_calloc(nt, sizeof *e->sa_upd);
                for (size_t t = 0; e->sa_upd && t < nt; t++) {
                        size_t bytes = model_tensor_numel(sl->model, t) * sizeof(float);
                        e->sa_upd[t] = ps_malloc(bytes);
                        if (!e->sa_upd[t]) {
                                sa_drop(e);
                                break;
                        }
                        memcpy(e->sa_upd[t], sl->delta[t], bytes);
                }
                if (!e->sa_upd) {
                        log_warning("Out of memory keeping the update of round %lu", (unsigned long) e->number);
                        go_idle(e);
                        return;
                }
                e->state = E_MASKING;
                slot_release(e);
                edge_log(e);
                if (e->sa.number == e->number && e->sa.stage == 3)
                        sa_mask_start(e);
                else
                        log_info("trained number=%lu: waiting for the round's peers to mask", (unsigned long) e->number);
                return;
        }
        e->state = E_PUSHING;
        client_set_examples(e->client, e->examples);
        if (e->job.fed.compress != COMPRESS_NONE)
                client_set_frames(e->client, PSNET__CODEC__CODEC_BF16 + (int) e->job.fed.compress - COMPRESS_BF16,
                                  compressed_frame, sl);
        int r = client_round(e->client, (const float *const *) sl->delta, (int64_t) e->number, NULL, 0, on_pushed, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->number);
                go_idle(e);
        }
}

static void on_pulled(Client *c, int r, int64_t clock, void *ud) {
        Edge *e = ud;
        (void) c, (void) clock;
        edge_log(e);
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the model of round %lu: %m", (unsigned long) e->number);
                go_idle(e);
                return;
        }
        Slot *sl = e->slot;
        for (size_t t = 0; t < model_ntensors(sl->model); t++)
                memcpy(sl->w0[t], sl->params[t], model_tensor_numel(sl->model, t) * sizeof(float));
        e->state = E_TRAINING;
        r = slot_work(e, train_work, train_done);
        if (r < 0) {
                log_warning("Failed to start local training: %s", uv_strerror(r));
                go_idle(e);
        }
}

/* Not a member of any membership: no membership epoch on its requests. */
static int client_ready(Edge *e) {
        Fleet *f = e->f;
        return client_follow(&e->client, &f->loop, f->zctx, &e->job, e->map, session_id(e->session),
                             f->id.enabled ? &f->id.keys : NULL, 0);
}

static void round_start(Edge *e, uint64_t number) {
        Fleet *f = e->f;
        e->number = number;
        e->rounds++;
        e->state = E_PULLING;
        int r = client_ready(e);
        if (r == 0) {
                client_set_timeout(e->client, f->cfg->round_timeout * 1000u);
                r = client_round(e->client, NULL, 0, e->slot->params, (int64_t) number, on_pulled, e);
        }
        if (r < 0) {
                log_warning_errno(r, "Failed to start round %lu: %m", (unsigned long) number);
                go_idle(e);
        }
}

/* --- secure aggregation (--secagg) ----------------------------------------------------------- */

/* Frees the update kept for masking (not the round's keys and shares). */
static void sa_drop(Edge *e) {
        const Model *m = fleet_model(e->f);
        for (size_t t = 0; e->sa_upd && m && t < model_ntensors(m); t++)
                ps_free(e->sa_upd[t]);
        ps_free(e->sa_upd);
        e->sa_upd = NULL;
}

static void on_sa_answer(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s;
        edge_log(e);
        if (r < 0)
                log_warning("pscoord did not take this client's secure aggregation answer reason=\"%s\"",
                            m && m->hdr && m->hdr->reason ? m->hdr->reason : strerror(-r));
}

static void sa_send(Edge *e, EdgeSecAggOut *o) {
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = e->sa.number;
        rd.secagg = &o->sa;
        int r = round_answer(e, &rd, 10000, on_sa_answer);
        if (r < 0)
                log_warning_errno(r, "Failed to send secure aggregation stage %u: %m", o->sa.stage);
        edge_secagg_out_free(o);
}

static void sa_mask_work(uv_work_t *req) {
        Edge *e = req->data;
        const Model *m = fleet_model(e->f);
        for (size_t t = 0; t < model_ntensors(m); t++)
                edge_secagg_mask(&e->sa, (uint32_t) t, (const float *) e->sa_upd[t], e->sa_upd[t],
                                 model_tensor_numel(m, t));
}

static void sa_mask_done(uv_work_t *req, int status) {
        Edge *e = req->data;
        e->sa_masking = false;
        edge_log(e);
        if (status < 0 || e->leaving || e->state != E_MASKING || !e->sa_upd) {
                sa_drop(e);
                if (e->state == E_MASKING)
                        go_idle(e);
                return;
        }
        e->state = E_PUSHING;
        client_set_examples(e->client, e->examples);
        client_set_masked(e->client, true);
        int r = client_round(e->client, (const float *const *) e->sa_upd, (int64_t) e->number, NULL, 0, on_pushed, e);
        if (r < 0) {
                log_warning_errno(r, "Failed to push the update of round %lu: %m", (unsigned long) e->number);
                sa_drop(e);
                go_idle(e);
        }
}

static void sa_mask_start(Edge *e) {
        e->sa_masking = true;
        e->sa_work.data = e;
        int r = uv_queue_work(&e->f->loop, &e->sa_work, sa_mask_work, sa_mask_done);
        if (r < 0) {
                e->sa_masking = false;
                log_warning("Failed to start masking: %s", uv_strerror(r));
                sa_drop(e);
                go_idle(e);
        }
}

/* A trained update that waits for peers that never came (the round failed
 * at pscoord): dropped when something newer comes. */
static void sa_abandon(Edge *e) {
        if (e->state != E_MASKING || e->sa_masking)
                return;
        log_info("update of round %lu dropped: its round went on without it", (unsigned long) e->number);
        sa_drop(e);
        go_idle(e);
}

/* Stages 1 to 4 from pscoord (edge-secagg.h). false: not a secagg message
 * this function completes (stage 1 also starts training). */
static bool sa_round(Edge *e, const Psnet__Round *rd) {
        const Psnet__SecAgg *in = rd->secagg;
        EdgeSecAggOut o;
        memset(&o, 0, sizeof o);
        char err[160] = "";
        int r = 0;
        uint32_t stage = in->has_stage ? in->stage : 0;
        if (stage == 1) {
                if (e->state == E_MASKING && e->number != rd->number)
                        sa_abandon(e);
                if (e->nmine == 0) {
                        /* Still loading: the keys go once the data is here (edge_ready). */
                        e->sa_keys_due = rd->number;
                        e->sa_keys_clip = in->has_clip ? in->clip : 0;
                        return false;
                }
                r = edge_secagg_keys(&e->sa, rd->number, session_id(e->session), in, (uint64_t) e->nmine,
                                     e->job.fed.strategy.dp_clip > 0, &o);
                if (r == 0)
                        sa_send(e, &o);
                else
                        log_warning("round %lu: cannot take part in secure aggregation (%s)", (unsigned long) rd->number,
                                    strerror(-r));
                return r < 0; /* with keys sent, it trains */
        }
        if (stage == 2) {
                r = edge_secagg_shares(&e->sa, rd->number, in, &o, err, sizeof err);
                if (r == 0)
                        sa_send(e, &o);
        } else if (stage == 3) {
                r = edge_secagg_peers(&e->sa, rd->number, in, err, sizeof err);
                if (r == 0) {
                        log_info("secure aggregation peers number=%lu peers=%zu threshold=%u", (unsigned long) rd->number,
                                 e->sa.n2, e->sa.t);
                        if (e->state == E_MASKING && e->number == rd->number && !e->sa_masking)
                                sa_mask_start(e);
                }
        } else if (stage == 4) {
                r = edge_secagg_reveal(&e->sa, rd->number, in, &o, err, sizeof err);
                if (r == 0) {
                        log_info("secure aggregation revealed number=%lu survivors=%zu", (unsigned long) rd->number,
                                 in->n_survivors);
                        sa_send(e, &o);
                        edge_secagg_clear(&e->sa);
                }
        } else {
                r = -EINVAL;
                snprintf(err, sizeof err, "unknown stage %u", stage);
        }
        if (r < 0) {
                edge_secagg_out_free(&o);
                log_warning("secure aggregation stage %u of round %lu refused reason=\"%s\"", stage,
                            (unsigned long) rd->number, err[0] ? err : strerror(-r));
        }
        return true;
}

/* The data is loaded: the keys of a round that asked for them meanwhile. */
static void sa_keys_late(Edge *e) {
        if (!e->sa_keys_due)
                return;
        Psnet__SecAgg in = PSNET__SEC_AGG__INIT;
        Psnet__Round rd = PSNET__ROUND__INIT;
        in.has_stage = in.has_clip = true;
        in.stage = 1;
        in.clip = e->sa_keys_clip;
        rd.number = e->sa_keys_due;
        rd.secagg = &in;
        e->sa_keys_due = 0;
        if (sa_round(e, &rd))
                log_warning("round %lu: no keys sent, it trains without taking part", (unsigned long) rd.number);
}

/* --- the final evaluation ----------------------------------------------------------------- */

static void eval_work(uv_work_t *req) {
        Slot *s = req->data;
        const Dataset *test = s->f->test;
        s->work_r = model_upload_params(s->model);
        if (s->work_r == 0)
                s->work_r = model_evaluate(s->model, test->x, test->y, test->n, &s->eval_correct, &s->eval_loss);
}

static void on_result(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s, (void) m;
        edge_log(e);
        if (r < 0)
                log_warning_errno(r, "pscoord did not take the accuracy: %m");
        go_idle(e);
}

static void on_eval_answer(Session *s, int r, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s;
        edge_log(e);
        if (r < 0)
                log_warning("pscoord did not take the accuracy reason=\"%s\"",
                            m && m->hdr && m->hdr->reason ? m->hdr->reason : strerror(-r));
        go_idle(e);
}

static void eval_done(uv_work_t *req, int status) {
        Slot *sl = req->data;
        Edge *e = slot_work_back(sl, status, true);
        if (!e)
                return;
        Fleet *f = e->f;
        float acc = (float) sl->eval_correct / (float) f->test->n;
        log_info("evaluated accuracy=%.4f test_loss=%.4f images=%u rounds=%ld", acc, sl->eval_loss, f->test->n,
                 (long) e->eval_clock);
        if (e->eval_round) {
                /* --eval-every: the accuracy of the model after eval_clock rounds. */
                Psnet__Round rd = PSNET__ROUND__INIT;
                rd.number = e->eval_number;
                rd.has_evaluate = rd.evaluate = rd.has_round = rd.has_accuracy = rd.has_loss = true;
                rd.round = (uint32_t) MAX(e->eval_clock, (int64_t) 0);
                rd.accuracy = acc;
                rd.loss = (float) sl->eval_loss;
                e->eval_round = 0;
                int r = round_answer(e, &rd, 5000, on_eval_answer);
                if (r < 0) {
                        log_warning_errno(r, "Failed to report the accuracy: %m");
                        go_idle(e);
                }
                return;
        }
        Psnet__WorkerInfo wi = PSNET__WORKER_INFO__INIT;
        Psnet__Result res = PSNET__RESULT__INIT;
        wi.id = session_id(e->session);
        wi.has_accuracy = wi.has_done = wi.done = true;
        wi.accuracy = acc;
        uint64_t d = FNV1A64_INIT; /* over the weights, as workerd's */
        for (size_t t = 0; t < model_ntensors(sl->model); t++)
                d = fnv1a64(d, sl->params[t], model_tensor_numel(sl->model, t) * sizeof(float));
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
        (void) c;
        edge_log(e);
        e->eval_clock = clock;
        if (r < 0) {
                log_warning_errno(r, "Failed to pull the final model: %m");
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
        e->state = E_EVALUATING;
        if (e->eval_round)
                log_info("testing the model of round %u", e->eval_round);
        else
                log_info("evaluating the final model");
        int r = client_ready(e);
        if (r == 0)
                r = client_round(e->client, NULL, 0, e->slot->params, 0, on_final, e);
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
                log_info("federated job job=%u model=%s strategy=%s local_epochs=%u batch=%u lr=%g prox_mu=%g", e->job.id,
                         e->job.model_name, fed_strategy_name(e->job.fed.strategy.kind), e->job.fed.local_epochs,
                         e->job.batch, (double) e->job.optim.lr, (double) e->job.fed.prox_mu);
                edge_load(e);
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
                if (st == JOB_FAILED && e->f->exit_code == 0)
                        e->f->exit_code = -ECANCELED;
                e->leaving = true;
                sa_abandon(e);
                if (e->state == E_IDLE || e->state == E_JOINING)
                        edge_leave(e); /* else once the work under way is done (go_idle, fleet_release) */
        }
}

static void on_round(Edge *e, const Psnet__Round *rd) {
        bool eval = rd->has_evaluate && rd->evaluate;
        if (!e->has_job) {
                log_warning("pscoord sent a round before the job; ignored");
                return;
        }
        if (rd->secagg && sa_round(e, rd))
                return;
        if (eval)
                sa_abandon(e);
        if (eval)
                log_info("pscoord asks this edge worker to evaluate the final model");
        else
                log_info("sampled number=%lu round=%u timeout_ms=%u", (unsigned long) rd->number,
                         rd->has_round ? rd->round : 0, rd->has_timeout_ms ? rd->timeout_ms : 0);
        /* Loading, queued or still on an earlier round (which has closed at
         * pscoord): the newest request waits for the model (go_idle, fleet_want). */
        if (eval) {
                bool mid = rd->has_round && rd->round > 0;
                if (mid && e->pending_eval && e->eval_round == 0)
                        return; /* the final evaluation is asked for already */
                e->pending_eval = true;
                e->eval_round = mid ? rd->round : 0;
                e->eval_number = rd->number;
        } else {
                e->pending = rd->number;
                e->pending_round = rd->has_round ? rd->round : 0;
        }
        fleet_want(e);
}

static void on_message(Session *s, WireMsg *m, void *ud) {
        Edge *e = ud;
        (void) s;
        edge_log(e);
        if (m->hdr->type == PSNET__MSG_TYPE__MSG_CONFIG)
                apply_config(e, m->hdr->config);
        else if (m->hdr->type == PSNET__MSG_TYPE__MSG_ROUND)
                on_round(e, m->hdr->round);
        else
                log_debug("ignoring message from pscoord type=%s", wire_type_name(m->hdr->type));
}

static void on_registered(Session *s, bool again, void *ud) {
        Edge *e = ud;
        edge_log(e);
        log_info("registered%s coord=%s part=%u", again ? " again" : "", session_endpoint(s), e->part);
        if (!e->has_job)
                log_info("waiting for a federated job");
}

static void on_failed(Session *s, int err, const char *reason, void *ud) {
        Edge *e = ud;
        (void) s;
        edge_log(e);
        log_error("cannot join reason=\"%s\"", reason);
        if (e->f->exit_code == 0)
                e->f->exit_code = err;
        edge_gone(e);
}

static void on_signal(void *ud, int signo) {
        Fleet *f = ud;
        (void) signo;
        service_stopping(f->service);
        for (size_t i = 0; i < f->n; i++) {
                Edge *e = &f->edges[i];
                e->leaving = true;
                sa_abandon(e);
                if (e->state == E_IDLE || e->state == E_JOINING)
                        edge_leave(e); /* else once the work under way is done (go_idle, fleet_release) */
        }
}

static void edge_metrics(void *ud, MetricsBuf *b) {
        Fleet *f = ud;
        uint64_t rounds = 0, counted = 0, late = 0, clipped = 0, examples = 0, sent = 0, raw = 0;
        size_t in[E_LEFT + 1] = { 0 };
        for (size_t i = 0; i < f->n; i++) {
                const Edge *e = &f->edges[i];
                in[e->state]++;
                rounds += e->rounds;
                counted += e->counted;
                late += e->late;
                clipped += e->clipped;
                examples += e->nmine;
                sent += e->bytes_sent;
                raw += e->bytes_raw;
        }
        metrics_family(b, "psnet_edge_state", "gauge",
                       "The process's clients in each state (one client: 1 for its state; --simulate: counts).");
        for (EdgeState s = E_JOINING; s <= E_LEFT; s++)
                metrics_sample(b, "psnet_edge_state", (double) in[s], "state", state_name(s), NULL);
        metrics_one(b, "psnet_edge_clients", "gauge", "Clients in this process (--simulate N).", (double) f->n);
        metrics_one(b, "psnet_edge_rounds_total", "counter", "Rounds these clients were sampled for.", (double) rounds);
        metrics_one(b, "psnet_edge_updates_counted_total", "counter", "Updates pscoord counted.", (double) counted);
        metrics_one(b, "psnet_edge_updates_late_total", "counter", "Updates that came after their round closed.",
                    (double) late);
        metrics_one(b, "psnet_edge_updates_clipped_total", "counter",
                    "Updates scaled down to the job's clip norm (--dp-clip).", (double) clipped);
        metrics_one(b, "psnet_edge_update_bytes_total", "counter",
                    "Bytes of the updates these clients pushed, as sent (--compress).", (double) sent);
        metrics_one(b, "psnet_edge_update_raw_bytes_total", "counter",
                    "Bytes the same updates have as f32 (the ratio to the above is what --compress saves).",
                    (double) raw);
        metrics_one(b, "psnet_edge_examples", "gauge", "Training examples these clients hold.", (double) examples);
}

static void edge_status(void *ud, char *buf, size_t n) {
        Fleet *f = ud;
        if (f->n == 1) {
                const Edge *e = &f->edges[0];
                snprintf(buf, n, "%s (rounds %lu, counted %lu)", state_name(e->state), (unsigned long) e->rounds,
                         (unsigned long) e->counted);
                return;
        }
        uint64_t counted = 0;
        size_t idle = 0;
        for (size_t i = 0; i < f->n; i++) {
                counted += f->edges[i].counted;
                idle += f->edges[i].state == E_IDLE;
        }
        snprintf(buf, n, "%zu clients, %zu idle, %zu left (counted %lu)", f->n, idle, f->nleft,
                 (unsigned long) counted);
}

static void fleet_free(Fleet *f) {
        for (size_t i = 0; f->edges && i < f->n; i++) {
                Edge *e = &f->edges[i];
                e->client = client_free(e->client);
                e->session = session_free(e->session);
        }
        f->service = service_free(f->service);
        uv_run(&f->loop, UV_RUN_DEFAULT); /* work in the thread pool finishes before the loop closes */
        if (uv_loop_close(&f->loop) < 0)
                log_debug("event loop closed with handles open");
        if (f->zctx)
                zmq_ctx_term(f->zctx);
        for (size_t i = 0; f->edges && i < f->n; i++) {
                sa_drop(&f->edges[i]);
                edge_secagg_clear(&f->edges[i].sa);
        }
        const Model *m = fleet_model(f);
        for (size_t i = 0; f->edges && i < f->n; i++) {
                for (size_t t = 0; m && f->edges[i].resid && t < model_ntensors(m); t++)
                        ps_free(f->edges[i].resid[t]);
                ps_free(f->edges[i].resid);
        }
        for (size_t i = 0; i < f->nslots; i++)
                slot_free(&f->slots[i]);
        ps_free(f->slots);
        kbackend_free(f->kb);
        dataset_free(f->train);
        dataset_free(f->test);
        for (size_t i = 0; f->edges && i < f->n; i++) {
                free(f->edges[i].mine);
                shardmap_free(f->edges[i].map);
        }
        ps_free(f->edges);
}

int edge_run(const WorkerConfig *cfg) {
        Fleet f = { .cfg = cfg, .n = cfg->simulate ? cfg->simulate : 1 };
        char err[512];
        /* Models: one per core by default (each client's training on one), no
         * more than clients; the thread pool has a thread for each, and one for
         * the loader, before its first use. */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        f.want_slots = cfg->parallel ? cfg->parallel : (size_t) MAX(cores, 1L);
        f.want_slots = MIN(f.want_slots, f.n);
        if (f.want_slots + 1 > 4 && !getenv("UV_THREADPOOL_SIZE")) {
                char v[16];
                snprintf(v, sizeof v, "%zu", MIN(f.want_slots + 1, (size_t) 1024));
                if (setenv("UV_THREADPOOL_SIZE", v, 0) < 0)
                        log_warning_errno(errno, "Failed to size the thread pool: %m");
        }
        int r = uv_loop_init(&f.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        /* Shares: --partition K/N gives the first client share K of N; --simulate M
         * alone makes the M clients the M shares of the data. */
        f.nparts = cfg->part_n ? cfg->part_n : (uint32_t) f.n;
        f.first_part = cfg->part_n ? cfg->part : 0;
        if (f.first_part + f.n > f.nparts) {
                log_error("%zu clients from share %u do not fit in %u shares (--partition, --simulate)", f.n,
                          f.first_part, f.nparts);
                r = -EINVAL;
                goto out;
        }
        f.edges = ps_calloc(f.n, sizeof *f.edges);
        f.zctx = zmq_ctx_new();
        if (!f.edges || !f.zctx) {
                r = -ENOMEM;
                goto out;
        }
        (void) zmq_ctx_set(f.zctx, ZMQ_IO_THREADS, 1);
        if (f.n > 256)
                (void) zmq_ctx_set(f.zctx, ZMQ_MAX_SOCKETS, (int) (f.n * 4 + 64));
        if (cfg->keys) {
                r = keys_identity_load(&f.id, cfg->keys, cfg->key ? cfg->key : "edge",
                                       cfg->coord_key ? cfg->coord_key : "pscoord", PSNET__ROLE__ROLE_EDGE, err,
                                       sizeof err);
                if (r < 0) {
                        log_error("cannot use the keys reason=\"%s\"", err);
                        r = -EINVAL;
                        goto out;
                }
        }
        const ServiceOps sops = { .stop = on_signal, .metrics = edge_metrics, .status = edge_status };
        r = service_new(&f.loop, "workerd", &sops, &f, &f.service);
        if (r == 0 && cfg->http && (r = service_http(f.service, cfg->http, err, sizeof err)) < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto out;
        }
        if (r < 0)
                goto out;
        const SessionConf sc = {
                .endpoint = cfg->coord, .role = PSNET__ROLE__ROLE_EDGE,
                .connect_timeout_ms = cfg->connect_timeout * 1000u,
                .keys = f.id.enabled ? &f.id.keys : NULL, .coord_key = f.id.enabled ? f.id.coord_key : NULL,
        };
        const SessionOps so = { .registered = on_registered, .failed = on_failed, .message = on_message };
        for (size_t i = 0; i < f.n; i++) {
                Edge *e = &f.edges[i];
                e->f = &f;
                e->part = f.first_part + (uint32_t) i;
                e->state = E_JOINING;
                r = session_new(&f.loop, f.zctx, &sc, &so, e, &e->session);
                if (r == 0)
                        r = session_start(e->session);
                if (r < 0) {
                        log_error_errno(r, "Cannot reach pscoord at %s: %m", cfg->coord);
                        goto out;
                }
        }
        if (f.n > 1)
                log_info("simulating clients=%zu shares=%u-%u of %u", f.n, f.first_part,
                         f.first_part + (uint32_t) f.n - 1, f.nparts);
        (void) uv_run(&f.loop, UV_RUN_DEFAULT);
        r = f.exit_code;
out:
        fleet_free(&f);
        return r;
}
