/* SPDX-License-Identifier: Apache-2.0 */
/* workerd --edge: the process of one or many federated clients (edge.c),
 * --simulate N. One loop; the data loaded once for the first job (in the
 * thread pool) and split among the clients (--partition K/N, --alpha); the
 * models, --parallel of them (by default one per core with the cpu backend),
 * lent to the clients for a round or a test, first come first served, so
 * that a round of hundreds of clients runs on one machine, on all its cores,
 * in the memory of a few; a round's pull goes into a pull buffer first (4
 * per model), so that slow pulls do not hold the models; signals, /metrics
 * and the status line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "alloc.h"
#include "edge.h"
#include "edge-fleet.h"
#include "kernels.h"
#include "log.h"
#include "macro.h"
#include "metrics.h"
#include "partition.h"
#include "service.h"

typedef enum { D_NONE, D_LOADING, D_READY } DataState;

/* A model and its buffers, lent to one client at a time. */
typedef struct Slot {
        EdgeSlot s;
        Edge *holder;
} Slot;

typedef struct Fleet {
        const WorkerConfig *cfg;
        uv_loop_t loop;
        Service *service;
        Edge **edges;
        size_t n, nleft, nready;
        uint32_t nparts, first_part;
        int exit_code;
        /* the data, loaded once for the first job */
        DataState data;
        uv_work_t work;
        Job job;                    /* the job the data is loaded for */
        Dataset *train, *test;
        Dataset *own_test;          /* a lone client: its share of the test set (test is loaded when asked) */
        bool lone;                  /* one client: only its shares are loaded */
        int work_r;
        char err[256];
        /* the models: nslots lent to clients at a time, the others queued (a ring) */
        KBackend *kb;
        Slot *slots;
        size_t nslots, want_slots;
        Edge **queue;
        size_t qhead, qlen;
        /* --simulate: the pull buffers (up to FLEET_PULL_BUFFERS x nslots, made
         * as needed), lent to the clients for a round's pull, the others queued */
        float ***bufs;
        bool *buf_lent;
        size_t nbufs, max_bufs;
        Edge **pqueue;
        size_t pqhead, pqlen;
} Fleet;

/* A process of many clients pulls into buffers of its own, this many per
 * model: a slow pull holds a buffer, not a model, so the models train the
 * rounds already pulled meanwhile. */
#define FLEET_PULL_BUFFERS 4

/* --- the models ----------------------------------------------------------------------- */

static Slot *free_slot(Fleet *f) {
        for (size_t i = 0; i < f->nslots; i++)
                if (!f->slots[i].holder)
                        return &f->slots[i];
        return NULL;
}

/* Free models to the clients queued for one, first come first served. */
static void fleet_dispatch(Fleet *f) {
        Slot *s;
        while (f->qlen && (s = free_slot(f))) {
                Edge *e = f->queue[f->qhead];
                f->qhead = (f->qhead + 1) % f->n;
                f->qlen--;
                s->holder = e;
                if (!edge_lend(e, &s->s))
                        s->holder = NULL;
        }
}

static void host_want(Edge *e, void *ud) {
        Fleet *f = ud;
        f->queue[(f->qhead + f->qlen++) % f->n] = e; /* at most once each: it waits QUEUED */
        fleet_dispatch(f);
}

/* A pull buffer of the job's model: one block, the tensors one after another. */
static float **buf_new(const Fleet *f) {
        const Model *m = f->slots[0].s.model;
        size_t nt = model_ntensors(m), floats = 0;
        for (size_t t = 0; t < nt; t++)
                floats += model_tensor_numel(m, t);
        float **b = ps_malloc(nt * sizeof *b + MAX(floats, (size_t) 1) * sizeof(float));
        if (!b)
                return NULL;
        float *at = (float *) (b + nt);
        for (size_t t = 0; t < nt; t++) {
                b[t] = at;
                at += model_tensor_numel(m, t);
        }
        return b;
}

/* Free pull buffers to the clients queued for one, first come first served. */
static void fleet_dispatch_pull(Fleet *f) {
        while (f->pqlen && f->nslots) {
                size_t i = 0;
                while (i < f->nbufs && f->buf_lent[i])
                        i++;
                if (i == f->nbufs) {
                        if (f->nbufs == f->max_bufs || !(f->bufs[i] = buf_new(f)))
                                return; /* every one lent (or no memory for one more): the queue waits */
                        f->nbufs++;
                }
                Edge *e = f->pqueue[f->pqhead];
                f->pqhead = (f->pqhead + 1) % f->n;
                f->pqlen--;
                f->buf_lent[i] = true; /* before: a pull that fails at once gives it back inside */
                if (!edge_lend_pull(e, f->bufs[i]))
                        f->buf_lent[i] = false;
        }
}

static void host_want_pull(Edge *e, void *ud) {
        Fleet *f = ud;
        f->pqueue[(f->pqhead + f->pqlen++) % f->n] = e; /* at most once each: it waits QUEUED */
        fleet_dispatch_pull(f);
}

static void host_give_back_pull(Edge *e, float **buf, void *ud) {
        Fleet *f = ud;
        (void) e;
        for (size_t i = 0; i < f->nbufs; i++)
                if (f->bufs[i] == buf)
                        f->buf_lent[i] = false;
        fleet_dispatch_pull(f);
}

static void host_give_back(Edge *e, EdgeSlot *es, void *ud) {
        Fleet *f = ud;
        (void) e;
        Slot *s = (Slot *) es;
        s->holder = NULL;
        fleet_dispatch(f);
}

static int slot_setup(Fleet *f, Slot *s, const Job *job) {
        char err[256];
        int r = model_new_text(f->kb, job->model, (int) job->batch, &s->s.model, err, sizeof err);
        if (r < 0) {
                log_error("cannot build the model %s reason=\"%s\"", job->model_name, err);
                return r;
        }
        model_set_options(s->s.model, false, true);
        size_t nt = model_ntensors(s->s.model);
        s->s.params = ps_calloc(nt, sizeof *s->s.params);
        s->s.w0 = ps_calloc(nt, sizeof *s->s.w0);
        if (!s->s.params || !s->s.w0)
                return log_error_errno(ENOMEM, "Out of memory");
        for (size_t t = 0; t < nt; t++) {
                s->s.params[t] = model_param_host(s->s.model, t);
                if (!(s->s.w0[t] = ps_malloc(model_tensor_numel(s->s.model, t) * sizeof(float))))
                        return log_error_errno(ENOMEM, "Out of memory");
        }
        return 0;
}

static void slot_free(Slot *s) {
        size_t nt = s->s.model ? model_ntensors(s->s.model) : 0;
        for (size_t t = 0; s->s.w0 && t < nt; t++)
                ps_free(s->s.w0[t]);
        ps_free(s->s.params);
        ps_free(s->s.w0);
        model_free(s->s.model);
}

/* The backend and the models: --parallel of them with the cpu backend (each
 * client's training on one core), one on a GPU. */
static int fleet_setup(Fleet *f, const Job *job) {
        char err[256];
        if (dataset_check_model(f->train, f->test ? f->test : f->own_test, job->in_numel, job->classes, err,
                                sizeof err) < 0) {
                log_error("model %s does not fit the data in %s: %s", job->model_name,
                          f->cfg->data ? f->cfg->data : job->dataset, err);
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
        f->slots = ps_calloc(n, sizeof *f->slots);
        if (!f->slots)
                return log_error_errno(ENOMEM, "Out of memory");
        f->nslots = n;
        for (size_t i = 0; i < n; i++)
                if ((r = slot_setup(f, &f->slots[i], job)) < 0)
                        return r;
        f->max_bufs = MIN(f->max_bufs, n * FLEET_PULL_BUFFERS);
        if (f->n > 1)
                log_info("models built models=%zu clients=%zu backend=%s pull_buffers=%zu", n, f->n,
                         f->kb->ops->name, f->max_bufs);
        fleet_dispatch_pull(f); /* rounds asked for while the data loaded */
        return 0;
}

/* --- the data ------------------------------------------------------------------------- */

/* The data is here: e keeps its own share of it. */
static void edge_ready(Fleet *f, Edge *e, const Job *job) {
        const WorkerConfig *cfg = f->cfg;
        edge_log(e);
        if (job->train_limit != f->job.train_limit || strcmp(job->dataset, f->job.dataset)) {
                log_error("job %u's data differs from the data this process loaded", job->id);
                edge_fail(e, -EINVAL);
                return;
        }
        uint32_t *mine = NULL, nmine = 0;
        int r;
        if (f->lone) {
                /* Loaded as its share alone (pick_partition): every sample is its own. */
                nmine = f->train->n;
                mine = malloc(MAX(nmine, 1u) * sizeof *mine);
                r = mine ? 0 : -ENOMEM;
                for (uint32_t k = 0; mine && k < nmine; k++)
                        mine[k] = k;
        } else
                r = partition_client(f->train->y, f->train->n, job->classes, f->nparts, cfg->alpha, job->seed,
                                     edge_part(e), &mine, &nmine);
        if (r < 0) {
                log_error("cannot split the training set reason=\"%s\"", strerror(-r));
                edge_fail(e, r);
                return;
        }
        if (nmine == 0) {
                log_error("partition %u/%u of the training set is empty (alpha %g)", edge_part(e), f->nparts,
                          cfg->alpha);
                free(mine);
                edge_fail(e, -ENODATA);
                return;
        }
        if (!f->lone && f->n == 1 && nmine < f->train->n) {
                /* A process of one client keeps its own images only. */
                r = dataset_keep(f->train, mine, nmine);
                for (uint32_t k = 0; r == 0 && k < nmine; k++)
                        mine[k] = k;
                if (r < 0) {
                        log_error("cannot keep this client's share of the training set");
                        free(mine);
                        edge_fail(e, r);
                        return;
                }
        }
        log_info("ready partition=%u/%u images=%u alpha=%s backend=%s", edge_part(e), f->nparts, nmine,
                 cfg->alpha > 0 ? "dirichlet" : "iid", f->kb->ops->name);
        if (++f->nready == f->n)
                service_ready(f->service);
        const char *dir = f->cfg->data ? f->cfg->data : f->job.dataset;
        edge_data(e, f->train, f->test, f->own_test, dir, f->job.test_limit, mine, nmine);
}

/* A lone client's samples: its partition of the training set, as
 * partition_client makes it from the labels. */
typedef struct PickCtx {
        uint32_t classes, part, nparts;
        double alpha;
        uint64_t seed;
} PickCtx;

static int pick_partition(const int32_t *labels, uint32_t n, void *ud, uint32_t **ret, uint32_t *ret_n) {
        const PickCtx *c = ud;
        return partition_client(labels, n, c->classes, c->nparts, c->alpha, c->seed, c->part, ret, ret_n);
}

/* Its share of the test set (edge_test_share). */
static int pick_test_share(const int32_t *labels, uint32_t n, void *ud, uint32_t **ret, uint32_t *ret_n) {
        const PickCtx *c = ud;
        (void) labels;
        uint32_t start, count;
        edge_test_share(n, c->part, c->nparts, &start, &count);
        uint32_t *idx = malloc(MAX(count, 1u) * sizeof *idx);
        if (!idx)
                return -ENOMEM;
        for (uint32_t k = 0; k < count; k++)
                idx[k] = start + k;
        *ret = idx;
        *ret_n = count;
        return 0;
}

static void load_work(uv_work_t *req) {
        Fleet *f = req->data;
        const char *dir = f->cfg->data ? f->cfg->data : f->job.dataset;
        if (f->lone) {
                /* One client: its shares alone are ever held, the full test set
                 * only if pscoord asks this one to test the global model. */
                PickCtx c = { .classes = f->job.classes, .part = f->first_part, .nparts = f->nparts,
                              .alpha = f->cfg->alpha, .seed = f->job.seed };
                f->work_r = dataset_load_picked(dir, "train", f->job.train_limit, pick_partition, &c, &f->train,
                                                f->err, sizeof f->err);
                if (f->work_r >= 0)
                        f->work_r = dataset_load_picked(dir, "test", f->job.test_limit, pick_test_share, &c,
                                                        &f->own_test, f->err, sizeof f->err);
                return;
        }
        f->work_r = dataset_load(dir, "train", f->job.train_limit, 0, 1, &f->train, f->err, sizeof f->err);
        if (f->work_r >= 0)
                f->work_r = dataset_load(dir, "test", f->job.test_limit, 0, 1, &f->test, f->err, sizeof f->err);
}

static void load_done(uv_work_t *req, int status) {
        Fleet *f = req->data;
        int r = status < 0 ? status : f->work_r;
        if (r < 0)
                log_error("cannot load the data reason=\"%s\"", status < 0 ? uv_strerror(status) : f->err);
        else
                r = fleet_setup(f, &f->job);
        f->data = r < 0 ? D_NONE : D_READY;
        for (size_t i = 0; i < f->n; i++) {
                Edge *e = f->edges[i];
                if (edge_state(e) != E_LOADING)
                        continue;
                if (r < 0)
                        edge_fail(e, r);
                else
                        edge_ready(f, e, psnet_edge_job(edge_psnet(e)));
        }
        alloc_purge(); /* the files' buffers, and the rest of the set a lone client does not keep */
}

/* A job came for e: its share of the data, loaded once for the process. */
static void host_job(Edge *e, const Job *job, void *ud) {
        Fleet *f = ud;
        if (job->external) {
                /* Its clients compute it (psnet.fed): this edge has no code for it. */
                log_error("model %s lists tensors only: its clients compute it (psnet.fed, docs/federated.md); "
                          "workerd --edge trains models built from layers", job->model_name);
                edge_fail(e, -EOPNOTSUPP);
                return;
        }
        if (f->data == D_READY) {
                edge_ready(f, e, job);
                return;
        }
        if (f->data == D_LOADING)
                return; /* load_done takes it */
        f->data = D_LOADING;
        f->job = *job;
        f->work.data = f;
        int r = uv_queue_work(&f->loop, &f->work, load_work, load_done);
        if (r < 0) {
                f->data = D_NONE;
                log_error("Failed to start the data loader: %s", uv_strerror(r));
                edge_fail(e, r);
        }
}

/* --- the process ---------------------------------------------------------------------- */

/* The process ends once every client has left. */
static void host_gone(Edge *e, int r, void *ud) {
        Fleet *f = ud;
        (void) e;
        if (r < 0 && f->exit_code == 0)
                f->exit_code = r;
        if (++f->nleft == f->n)
                uv_stop(&f->loop);
}

static void on_signal(void *ud, int signo) {
        Fleet *f = ud;
        (void) signo;
        service_stopping(f->service);
        for (size_t i = 0; i < f->n; i++)
                edge_stop(f->edges[i]);
}

static void edge_metrics(void *ud, MetricsBuf *b) {
        Fleet *f = ud;
        EdgeStats sum = { 0 };
        uint64_t examples = 0;
        size_t in[E_LEFT + 1] = { 0 };
        for (size_t i = 0; i < f->n; i++) {
                const EdgeStats *s = edge_stats(f->edges[i]);
                in[edge_state(f->edges[i])]++;
                sum.rounds += s->rounds;
                sum.counted += s->counted;
                sum.late += s->late;
                sum.clipped += s->clipped;
                sum.bytes_sent += s->bytes_sent;
                sum.bytes_raw += s->bytes_raw;
                examples += edge_examples(f->edges[i]);
        }
        metrics_family(b, "psnet_edge_state", "gauge",
                       "The process's clients in each state (one client: 1 for its state; --simulate: counts).");
        for (EdgeState s = E_JOINING; s <= E_LEFT; s++)
                metrics_sample(b, "psnet_edge_state", (double) in[s], "state", edge_state_name(s), NULL);
        metrics_one(b, "psnet_edge_clients", "gauge", "Clients in this process (--simulate N).", (double) f->n);
        metrics_one(b, "psnet_edge_rounds_total", "counter", "Rounds these clients were sampled for.",
                    (double) sum.rounds);
        metrics_one(b, "psnet_edge_updates_counted_total", "counter", "Updates pscoord counted.", (double) sum.counted);
        metrics_one(b, "psnet_edge_updates_late_total", "counter", "Updates that came after their round closed.",
                    (double) sum.late);
        metrics_one(b, "psnet_edge_updates_clipped_total", "counter",
                    "Updates scaled down to the job's clip norm (--dp-clip).", (double) sum.clipped);
        metrics_one(b, "psnet_edge_update_bytes_total", "counter",
                    "Bytes of the updates these clients pushed, as sent (--compress).", (double) sum.bytes_sent);
        metrics_one(b, "psnet_edge_update_raw_bytes_total", "counter",
                    "Bytes the same updates have as f32 (the ratio to the above is what --compress saves).",
                    (double) sum.bytes_raw);
        metrics_one(b, "psnet_edge_examples", "gauge", "Training examples these clients hold.", (double) examples);
}

static void edge_status(void *ud, char *buf, size_t n) {
        Fleet *f = ud;
        if (f->n == 1) {
                const Edge *e = f->edges[0];
                snprintf(buf, n, "%s (rounds %lu, counted %lu)", edge_state_name(edge_state(e)),
                         (unsigned long) edge_stats(e)->rounds, (unsigned long) edge_stats(e)->counted);
                return;
        }
        uint64_t counted = 0;
        size_t idle = 0;
        for (size_t i = 0; i < f->n; i++) {
                counted += edge_stats(f->edges[i])->counted;
                idle += edge_state(f->edges[i]) == E_IDLE;
        }
        snprintf(buf, n, "%zu clients, %zu idle, %zu left (counted %lu)", f->n, idle, f->nleft,
                 (unsigned long) counted);
}

static void fleet_free(Fleet *f) {
        for (size_t i = 0; f->edges && i < f->n; i++)
                edge_close(f->edges[i]);
        f->service = service_free(f->service);
        uv_run(&f->loop, UV_RUN_DEFAULT); /* work in the thread pool finishes before the loop closes */
        if (uv_loop_close(&f->loop) < 0)
                log_debug("event loop closed with handles open");
        for (size_t i = 0; f->edges && i < f->n; i++)
                edge_free(f->edges[i]);
        for (size_t i = 0; i < f->nslots; i++)
                slot_free(&f->slots[i]);
        ps_free(f->slots);
        kbackend_free(f->kb);
        dataset_free(f->train);
        dataset_free(f->test);
        dataset_free(f->own_test);
        for (size_t i = 0; i < f->nbufs; i++)
                ps_free(f->bufs[i]);
        ps_free(f->bufs);
        ps_free(f->buf_lent);
        ps_free(f->pqueue);
        ps_free(f->edges);
        ps_free(f->queue);
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
        f.lone = f.n == 1;
        if (f.first_part + f.n > f.nparts) {
                log_error("%zu clients from share %u do not fit in %u shares (--partition, --simulate)", f.n,
                          f.first_part, f.nparts);
                r = -EINVAL;
                goto out;
        }
        f.edges = ps_calloc(f.n, sizeof *f.edges);
        f.queue = ps_calloc(f.n, sizeof *f.queue);
        /* One client pulls into its model: a device's memory holds one. */
        f.max_bufs = f.n > 1 ? f.want_slots * FLEET_PULL_BUFFERS : 0;
        if (f.max_bufs) {
                f.bufs = ps_calloc(f.max_bufs, sizeof *f.bufs);
                f.buf_lent = ps_calloc(f.max_bufs, sizeof *f.buf_lent);
                f.pqueue = ps_calloc(f.n, sizeof *f.pqueue);
        }
        if (!f.edges || !f.queue || (f.max_bufs && (!f.bufs || !f.buf_lent || !f.pqueue))) {
                r = -ENOMEM;
                goto out;
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
        const EdgeHost host = { .job = host_job, .want = host_want, .give_back = host_give_back,
                                .want_pull = f.max_bufs ? host_want_pull : NULL, .give_back_pull = host_give_back_pull,
                                .gone = host_gone,
                                .ud = &f };
        PsnetEdgeOptions o = {
                .coord = cfg->coord, .connect_timeout_ms = cfg->connect_timeout * 1000u,
                .round_timeout_ms = cfg->round_timeout * 1000u, .keys_dir = cfg->keys,
                .key_name = cfg->key, .coord_key_name = cfg->coord_key,
                .clients = (unsigned) f.n, .gateway = cfg->gateway, .gateway_key_name = cfg->gateway_key,
        };
        for (size_t i = 0; i < f.n; i++) {
                r = edge_new(&f.loop, &o, f.first_part + (uint32_t) i, f.nparts, &host, &f.edges[i]);
                if (r == -EINVAL)
                        goto out; /* the keys: logged */
                if (r < 0) {
                        log_error_errno(r, "Cannot reach pscoord at %s: %m", cfg->gateway ? cfg->gateway : cfg->coord);
                        goto out;
                }
                o.share = edge_psnet(f.edges[0]);
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
