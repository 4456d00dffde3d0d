/* workerd's training loop; see worker-loop.h. One thread: while it waits for
 * shards it also serves the pscoord link (config pushes, heartbeats) and
 * signals, through the client's poll hooks. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include "alloc.h"
#include "client.h"
#include "coordlink.h"
#include "hash.h"
#include "signals.h"
#include "idx.h"
#include "kernels.h"
#include "log.h"
#include "model.h"
#include "wire-job.h"
#include "worker-loop.h"

typedef struct Worker {
        const WorkerConfig *cfg;
        void *zctx;
        CoordLink *coord;
        int sfd;
        Job job;
        bool has_job;
        ShardMap *map;
        JobState state;
        bool has_state;
        uint32_t rank, nworkers;
        bool stop;                  /* signal received, job stopped or drained */
        bool job_stopped, draining;
        int64_t start_clock;
        uint32_t part_rank, part_n; /* the partition loaded */
        /* progress */
        int64_t clock;
        uint32_t epoch;
        uint64_t step, samples, last_samples;
        double loss_sum;
        uint64_t loss_n;
        float last_loss, sps, samples_ps;
        uint64_t last_hb, last_progress;
} Worker;

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static bool is_member(const Worker *w, const Psnet__Membership *m) {
        for (size_t i = 0; m && i < m->n_workers; i++)
                if (m->workers[i] == w->coord->id)
                        return true;
        return false;
}

/* Replaces w->map with pscoord's; keeps the old one if the new does not validate. */
static int worker_take_map(Worker *w, const Psnet__ShardMap *pm) {
        ShardMap *m;
        if (shardmap_from_proto(pm, &m) < 0) {
                log_error("pscoord sent a shard map that does not validate");
                return -EINVAL;
        }
        shardmap_free(w->map);
        w->map = m;
        return 0;
}

static void worker_apply_config(Worker *w, const Psnet__Config *ctl) {
        char err[192];
        if (job_state_from_proto(ctl->job_state, &w->state) == 0)
                w->has_state = true;
        if (ctl->has_rank)
                w->rank = ctl->rank;
        if (ctl->has_nworkers)
                w->nworkers = ctl->nworkers;
        if (ctl->has_drain && ctl->drain && !w->draining) {
                log_info("drain requested: leaving after this step");
                w->draining = w->stop = true;
        }
        /* The job is taken once this worker is a member: a worker that joins a
         * running job waits for the clock boundary pscoord picks for it. */
        if (ctl->job && ctl->map && !w->has_job && is_member(w, ctl->members)) {
                if (job_from_proto(ctl->job, &w->job, err, sizeof err) < 0) {
                        log_error("pscoord sent a job that does not validate reason=\"%s\"", err);
                        return;
                }
                if (worker_take_map(w, ctl->map) < 0)
                        return;
                w->has_job = true;
                w->start_clock = ctl->has_start_clock ? ctl->start_clock : 0;
        } else if (ctl->map && w->has_job && w->map && ctl->map->epoch > shardmap_epoch(w->map) &&
                   (!ctl->job || ctl->job->id == w->job.id)) {
                if (worker_take_map(w, ctl->map) == 0)
                        log_info("shard map epoch=%lu shards=%zu", (unsigned long) shardmap_epoch(w->map),
                                 shardmap_size(w->map));
        } else if (ctl->job && w->has_job && ctl->job->id != w->job.id) {
                log_warning("pscoord moved to job %u; this worker trains job %u and stops", ctl->job->id, w->job.id);
                w->stop = w->job_stopped = true;
        }
        if (w->has_state && w->state == JOB_STOPPED && !w->job_stopped) {
                log_info("job stopped by the operator");
                w->stop = w->job_stopped = true;
        }
}

static void worker_register(Worker *w, unsigned timeout_ms, int *ret);

static void on_coord(void *ud) {
        Worker *w = ud;
        for (;;) {
                WireMsg m;
                int r = wire_recv(w->coord->sock, false, ZMQ_DONTWAIT, &m);
                if (r == 0) {
                        Psnet__Header *h = m.hdr;
                        if (h->type == PSNET__MSG_TYPE__MSG_CONFIG)
                                worker_apply_config(w, h->config);
                        else if (h->type == PSNET__MSG_TYPE__MSG_ERROR &&
                                 h->status == PSNET__STATUS__STATUS_UNKNOWN_PEER) {
                                int rr;
                                log_warning("pscoord lost this worker (lease or restart): registering again");
                                worker_register(w, 5000, &rr);
                        }
                } else if (r == -EBADMSG)
                        log_warning("bad message from pscoord reason=\"%s\"", m.reason);
                wire_msg_done(&m);
                if (r < 0 && r != -EBADMSG)
                        break;
        }
}

static void on_signal(void *ud) {
        Worker *w = ud;
        bool hup;
        int sig = signals_read(w->sfd, &hup);
        if (sig) {
                log_info("stopping after this step signal=%s", strsignal(sig));
                w->stop = true;
        }
}

static void send_heartbeat(Worker *w) {
        Psnet__Header h;
        Psnet__Heartbeat hb = PSNET__HEARTBEAT__INIT;
        Psnet__WorkerInfo wi = PSNET__WORKER_INFO__INIT;
        wi.id = w->coord->id;
        wi.has_rank = wi.has_clock = wi.has_steps_per_s = wi.has_samples_per_s = true;
        wi.has_loss = wi.has_epoch = wi.has_step = true;
        wi.rank = w->rank;
        wi.clock = w->clock;
        wi.steps_per_s = w->sps;
        wi.samples_per_s = w->samples_ps;
        wi.loss = w->last_loss;
        wi.epoch = w->epoch;
        wi.step = w->step;
        hb.worker = &wi;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_HEARTBEAT);
        h.body_case = PSNET__HEADER__BODY_HEARTBEAT;
        h.heartbeat = &hb;
        int r = coordlink_send(w->coord, &h);
        if (r < 0)
                log_warning_errno(r, "Failed to send heartbeat: %m");
        w->last_hb = now_ms();
}

static void on_tick(void *ud) {
        Worker *w = ud;
        uint64_t now = now_ms();
        if (now - w->last_hb >= MAX(w->coord->lease_ms / 3, 50u))
                send_heartbeat(w);
}

static bool should_stop(void *ud) {
        Worker *w = ud;
        return w->stop;
}

static void worker_register(Worker *w, unsigned timeout_ms, int *ret) {
        WireMsg m;
        uint32_t old = w->coord->id;
        int r = coordlink_register(w->coord, PSNET__ROLE__ROLE_WORKER, NULL, old, timeout_ms, &m);
        if (r == -ETIMEDOUT)
                r = log_error_errno(r, "pscoord at %s did not answer within %u s (is it running?)",
                                    w->cfg->coord, timeout_ms / 1000);
        else if (r == -ECONNREFUSED) {
                log_error("pscoord refused registration reason=\"%s\"", m.hdr->reason ? m.hdr->reason : "");
                wire_msg_done(&m);
        } else if (r < 0)
                log_error_errno(r, "Failed to register with pscoord at %s: %m", w->cfg->coord);
        else {
                char f[32];
                snprintf(f, sizeof f, "worker=%u", w->coord->id);
                log_set_fields(f);
                log_info("registered coord=%s lease_ms=%u", w->cfg->coord, w->coord->lease_ms);
                wire_msg_done(&m);
        }
        *ret = r;
}

/* Waits up to timeout_ms for pscoord or a signal and handles what came; keeps
 * the lease. */
static int serve_link(Worker *w, long timeout_ms) {
        zmq_pollitem_t items[] = {
                { .socket = w->coord->sock, .events = ZMQ_POLLIN },
                { .fd = w->sfd, .events = ZMQ_POLLIN },
        };
        int n = zmq_poll(items, 2, timeout_ms);
        if (n < 0 && errno != EINTR)
                return -errno;
        if (n > 0 && (items[0].revents & ZMQ_POLLIN))
                on_coord(w);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN))
                on_signal(w);
        on_tick(w);
        return 0;
}

/* Waits (serving heartbeats) until pscoord says the job runs. */
static int wait_for_job(Worker *w) {
        bool said = false;
        while (!w->stop) {
                if (w->has_job && w->has_state && w->state == JOB_RUNNING)
                        return 0;
                if (!said) {
                        log_info("waiting for the job to start state=%s",
                                 w->has_state ? job_state_name(w->state) : "?");
                        said = true;
                }
                int r = serve_link(w, 200);
                if (r < 0)
                        return r;
        }
        return -ECANCELED;
}

/* Fisher-Yates with a splitmix64 stream: the same order for the same seed. */
static void shuffle(uint32_t *perm, uint32_t n, uint64_t seed) {
        uint64_t x = seed;
        for (uint32_t i = n; i > 1; i--) {
                uint32_t j = (uint32_t) (splitmix64_next(&x) % i);
                uint32_t t = perm[i - 1];
                perm[i - 1] = perm[j];
                perm[j] = t;
        }
}

static void progress(Worker *w, double *t_last, bool force) {
        uint64_t now = now_ms();
        if (!force && now - w->last_progress < w->cfg->progress_ms)
                return;
        double t = mono_s(), dt = t - *t_last;
        if (dt > 0) {
                w->samples_ps = (float) ((double) (w->samples - w->last_samples) / dt);
                w->sps = w->samples_ps / (float) w->job.batch;
        }
        if (w->loss_n)
                w->last_loss = (float) (w->loss_sum / (double) w->loss_n);
        log_info("progress epoch=%u/%u step=%lu loss=%.4f samples_per_s=%.0f clock=%ld", w->epoch,
                 w->job.epochs, (unsigned long) w->step, w->last_loss, w->samples_ps, (long) w->clock);
        w->loss_sum = 0;
        w->loss_n = 0;
        w->last_samples = w->samples;
        *t_last = t;
        w->last_progress = now;
}

/* Logs a CRC-32 over every pulled tensor: under BSP all workers must log the
 * same value for the same clock. */
static void trace_pull(Worker *w, Model *m, float *const *params, int64_t clock) {
        uLong crc = crc32(0L, Z_NULL, 0);
        for (size_t t = 0; t < model_ntensors(m); t++)
                crc = crc32(crc, (const Bytef *) params[t],
                            (uInt) (model_tensor_numel(m, t) * sizeof(float)));
        log_info("pulled clock=%ld checksum=%08lx", (long) clock, (unsigned long) crc);
        (void) w;
}

static int send_result(Worker *w, bool has_acc, float acc) {
        Psnet__Header h;
        Psnet__Result res = PSNET__RESULT__INIT;
        Psnet__WorkerInfo wi = PSNET__WORKER_INFO__INIT;
        WireMsg m;
        wi.id = w->coord->id;
        wi.has_rank = wi.has_clock = wi.has_step = wi.has_done = wi.has_loss = true;
        wi.rank = w->rank;
        wi.clock = w->clock;
        wi.step = w->step;
        wi.loss = w->last_loss;
        wi.done = true;
        wi.has_accuracy = has_acc;
        wi.accuracy = acc;
        res.worker = &wi;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_RESULT);
        h.body_case = PSNET__HEADER__BODY_RESULT;
        h.result = &res;
        int r = coordlink_request(w->coord, &h, PSNET__MSG_TYPE__MSG_RESULT_REP,
                                  5000, NULL, NULL, &m);
        if (r == 0 || r == -ECONNREFUSED)
                wire_msg_done(&m);
        return r;
}

/* Loads the data sets in a thread, so that the main thread keeps the lease
 * (heartbeats) and answers signals however long the files take. */
typedef struct Loader {
        const char *dir;
        uint32_t train_limit, test_limit;
        Dataset *train, *test;
        char err[256];
        int r;
        atomic_bool done;
} Loader;

static void *loader_main(void *arg) {
        Loader *l = arg;
        l->r = dataset_load(l->dir, "train", l->train_limit, 0, 1, &l->train, l->err, sizeof l->err);
        if (l->r >= 0)
                l->r = dataset_load(l->dir, "t10k", l->test_limit, 0, 1, &l->test, l->err, sizeof l->err);
        atomic_store(&l->done, true);
        return NULL;
}

static int load_data(Worker *w, Loader *l) {
        pthread_t t;
        int r = pthread_create(&t, NULL, loader_main, l);
        if (r != 0)
                return log_error_errno(r, "Failed to start the data loader: %m");
        while (!atomic_load(&l->done))
                serve_link(w, 50);
        pthread_join(t, NULL);
        return l->r;
}

/* One pull/push round at w->clock; when a shard says the map moved on, waits
 * for pscoord's new map (serving the link) and does the round again. */
static int worker_round(Worker *w, Client *client, const float *const *grads, float *const *params, int64_t *got) {
        for (;;) {
                if (shardmap_epoch(w->map) > client_map_epoch(client)) {
                        int r = client_set_map(client, w->map);
                        if (r < 0)
                                return log_error_errno(r, "Failed to use the new shard map: %m");
                }
                int r = grads ? client_round(client, grads, w->clock, params, w->clock + 1, got)
                              : client_round(client, NULL, 0, params, w->clock, got);
                if (r != -EAGAIN)
                        return r;
                uint64_t need = client_need_epoch(client), deadline = now_ms() + 30000;
                while (shardmap_epoch(w->map) < need && !w->stop) {
                        if (now_ms() > deadline)
                                return log_error_errno(ETIMEDOUT, "no shard map epoch %lu from pscoord within 30 s",
                                                       (unsigned long) need);
                        serve_link(w, 50);
                }
                if (w->stop)
                        return -ECANCELED;
        }
}

/* This worker's share of the training set: indices i with i % n == rank, in perm. */
static uint32_t partition(uint32_t *perm, uint32_t total, uint32_t rank, uint32_t n) {
        uint32_t k = 0;
        for (uint32_t i = rank; i < total; i += n)
                perm[k++] = i;
        return k;
}

static int train(Worker *w) {
        char err[256];
        int r;
        const char *dir = w->cfg->data ? w->cfg->data : w->job.dataset;
        Dataset *trainset = NULL, *testset = NULL;
        KBackend *kb = NULL;
        Model *model = NULL;
        Client *client = NULL;
        float *xb;
        int32_t *yb;
        uint32_t *perm = NULL;
        double t_batch = 0, t_compute = 0, t_exchange = 0;
        float **params = NULL, **grads = NULL, **next = NULL;
        uint32_t batch = w->job.batch;

        Loader loader = { .dir = dir, .train_limit = w->job.train_limit, .test_limit = w->job.test_limit };
        r = load_data(w, &loader);
        trainset = loader.train;
        testset = loader.test;
        if (r < 0) {
                log_error("cannot load the data reason=\"%s\"", loader.err);
                goto out;
        }
        uint32_t dim = trainset->rows * trainset->cols;
        if (dim != w->job.layers[0] || w->job.layers[w->job.nlayers - 1] < 10) {
                log_error("model %s does not fit the data: %u inputs, 10 classes", w->job.model, dim);
                r = -EINVAL;
                goto out;
        }
        if (trainset->n / MAX(w->nworkers, 1u) < batch) {
                log_error("this worker's partition has %u images, fewer than one batch of %u",
                          trainset->n / MAX(w->nworkers, 1u), batch);
                r = -EINVAL;
                goto out;
        }
        r = kbackend_new(w->cfg->backend, (int) w->cfg->threads, &kb, err, sizeof err);
        if (r < 0) {
                log_error("cannot start the %s backend reason=\"%s\"", w->cfg->backend, err);
                goto out;
        }
        if (w->cfg->tf32) {
                r = kb->ops->set_tf32(kb, true);
                if (r == -ENOTSUP)
                        log_warning("--tf32 has no effect on the %s backend", kb->ops->name);
                else if (r < 0) {
                        log_error_errno(r, "Failed to turn on TF32: %m");
                        goto out;
                }
        }
        r = model_new(kb, w->job.layers, w->job.nlayers, (int) batch, &model);
        if (r < 0) {
                log_error_errno(r, "Failed to build the model: %m");
                goto out;
        }
        model_set_options(model, !w->cfg->no_graphs, true);
        size_t nt = model_ntensors(model);
        params = ps_calloc(nt, sizeof *params);
        grads = ps_calloc(nt, sizeof *grads);
        /* Batches are gathered straight into the model's (page-locked) buffers. */
        xb = model_batch_x(model);
        yb = model_batch_y(model);
        perm = ps_malloc((size_t) trainset->n * sizeof(uint32_t));
        if (!params || !grads || !perm) {
                r = log_error_errno(ENOMEM, "Out of memory");
                goto out;
        }
        for (size_t t = 0; t < nt; t++) {
                params[t] = model_param_host(model, t);
                grads[t] = model_grad_host(model, t);
        }
        /* --prefetch on: the next clock's pull is sent while the step computes,
         * into a second set of (page-locked) buffers; the two sets alternate. The
         * pulled weights then miss this worker's own last push (one clock staler
         * under ASP/SSP; under BSP the shard answers only once the clock closed, so
         * nothing changes but the order of the requests). Off by default: on the
         * H100 it gave +20-30% samples/s on a 7 MiB model under ASP but cost
         * accuracy, and slowed the 0.8 MiB demo model (docs/benchmarks.md). It only
         * overlaps anything where the step runs on a device (ops->async). */
        bool prefetch = strcmp(w->cfg->prefetch, "on") == 0;
        if (prefetch && !kb->ops->async)
                log_warning("--prefetch on with the %s backend: the step is done before the pull leaves, "
                            "nothing overlaps", kb->ops->name);
        if (prefetch) {
                next = ps_calloc(nt, sizeof *next);
                if (!next) {
                        r = log_error_errno(ENOMEM, "Out of memory");
                        goto out;
                }
                for (size_t t = 0; t < nt; t++) {
                        r = kb->ops->host_alloc(kb, model_tensor_numel(model, t) * sizeof(float), (void **) &next[t]);
                        if (r < 0) {
                                log_error_errno(r, "Failed to allocate pull buffers: %m");
                                goto out;
                        }
                }
        }
        ClientHooks hooks = {
                .coord_sock = w->coord->sock, .signal_fd = w->sfd, .on_coord = on_coord,
                .on_signal = on_signal, .on_tick = on_tick, .should_stop = should_stop,
                .tick_ms = 100, .ud = w,
        };
        r = client_new(w->zctx, &w->job, w->map, w->coord->id, &hooks, &client);
        if (r < 0) {
                log_error_errno(r, "Failed to connect to the shards: %m");
                goto out;
        }
        client_set_timeout(client, w->cfg->round_timeout * 1000u);
        int64_t got;
        w->clock = w->start_clock;
        r = worker_round(w, client, NULL, params, &got);
        if (r < 0)
                goto out;
        if (w->cfg->trace_pulls)
                trace_pull(w, model, params, w->clock);
        w->part_rank = w->rank;
        w->part_n = MAX(w->nworkers, 1u);
        uint32_t nmine = partition(perm, trainset->n, w->part_rank, w->part_n);
        uint32_t steps = nmine / batch;
        log_info("training rank=%u/%u images=%u steps_per_epoch=%u backend=%s prefetch=%s clock=%ld", w->rank,
                 w->nworkers, nmine, steps, kb->ops->name, prefetch ? "on" : "off", (long) w->clock);
        bool said_graph = false;
        double t0 = mono_s(), t_last = t0;
        for (uint32_t e = 0; e < w->job.epochs && !w->stop; e++) {
                w->epoch = e + 1;
                if (w->rank != w->part_rank || MAX(w->nworkers, 1u) != w->part_n) {
                        /* The membership changed: take this worker's new share of the data. */
                        w->part_rank = w->rank;
                        w->part_n = MAX(w->nworkers, 1u);
                        nmine = partition(perm, trainset->n, w->part_rank, w->part_n);
                        steps = nmine / batch;
                        log_info("partition rank=%u/%u images=%u", w->rank, w->nworkers, nmine);
                }
                shuffle(perm, nmine, w->job.seed * 1000003u + w->rank * 7919u + e);
                for (uint32_t s = 0; s < steps && !w->stop; s++) {
                        double ta = mono_s(), tb, tc;
                        for (uint32_t b = 0; b < batch; b++) {
                                uint32_t i = perm[(size_t) s * batch + b];
                                memcpy(xb + (size_t) b * dim, trainset->x + (size_t) i * dim, dim * sizeof(float));
                                yb[b] = trainset->y[i];
                        }
                        float loss;
                        int correct;
                        tb = mono_s();
                        r = model_upload_params_from(model, params);
                        if (r >= 0)
                                r = model_step_begin(model, xb, yb, (int) batch);
                        if (r >= 0 && prefetch) {
                                r = client_pull_begin(client, next, w->clock + 1);
                                if (r < 0) {
                                        (void) model_step_end(model, NULL, NULL);
                                        log_error_errno(r, "Failed to prefetch: %m");
                                        goto out;
                                }
                        }
                        if (r >= 0)
                                r = model_step_end(model, &loss, &correct);
                        if (r < 0) {
                                log_error_errno(r, "Training step failed: %m");
                                goto out;
                        }
                        tc = mono_s();
                        t_batch += tb - ta;
                        t_compute += tc - tb;
                        if (w->cfg->step_delay_ms) {
                                /* Test knob: a deliberately slow worker. */
                                struct timespec d = { w->cfg->step_delay_ms / 1000,
                                                      (long) (w->cfg->step_delay_ms % 1000) * 1000000L };
                                nanosleep(&d, NULL);
                        }
                        r = worker_round(w, client, (const float *const *) grads, prefetch ? next : params, &got);
                        t_exchange += mono_s() - tc;
                        if (r == -ECANCELED)
                                break;
                        if (r < 0)
                                goto out;
                        if (prefetch) {
                                float **t = params;
                                params = next;
                                next = t;
                        }
                        w->clock++;
                        if (w->cfg->trace_pulls)
                                trace_pull(w, model, params, w->clock);
                        if (!said_graph && model_graph_active(model)) {
                                log_info("steps run as a captured graph");
                                said_graph = true;
                        }
                        w->step++;
                        w->samples += batch;
                        w->loss_sum += loss;
                        w->loss_n++;
                        progress(w, &t_last, false);
                        on_tick(w);
                }
        }
        progress(w, &t_last, true);
        double secs = mono_s() - t0;
        const ClientStats *cs = client_stats(client);
        /* Where the time went: gathering batches, computing (params upload, step,
         * gradients download) and the push/pull round (which includes waiting for
         * the shards to apply and, under BSP, for the other workers). */
        log_info("trained steps=%lu seconds=%.2f samples_per_s=%.0f batch_s=%.3f compute_s=%.3f exchange_s=%.3f "
                 "wait_s=%.2f pushed_mb=%.1f pulled_mb=%.1f",
                 (unsigned long) w->step, secs, secs > 0 ? (double) w->samples / secs : 0.0, t_batch, t_compute,
                 t_exchange, cs->wait_s, (double) cs->bytes_pushed / 1e6, (double) cs->bytes_pulled / 1e6);
        r = 0;
        if (w->job_stopped || w->draining) {
                (void) send_result(w, false, 0);
                goto out;
        }
        if (testset) {
                size_t correct = 0;
                double loss = 0;
                r = model_upload_params_from(model, params);
                if (r >= 0)
                        r = model_evaluate(model, testset->x, testset->y, testset->n, &correct, &loss);
                if (r < 0) {
                        log_error_errno(r, "Evaluation failed: %m");
                        goto out;
                }
                float acc = (float) correct / (float) testset->n;
                log_info("evaluated accuracy=%.4f test_loss=%.4f images=%u", acc, loss, testset->n);
                r = send_result(w, true, acc);
        } else
                r = send_result(w, false, 0);
        if (r < 0)
                log_warning_errno(r, "Failed to report the result to pscoord: %m");
        r = 0;
out:
        client_free(client);
        /* The buffer sets may have swapped: free the ones that are not the model's. */
        for (size_t t = 0; next && t < model_ntensors(model); t++) {
                float *mine = model_param_host(model, t), *other = params[t] == mine ? next[t] : params[t];
                if (other)
                        kb->ops->host_free(kb, other);
        }
        ps_free(next);
        model_free(model);
        kbackend_free(kb);
        dataset_free(trainset);
        dataset_free(testset);
        ps_free(perm);
        ps_free(params);
        ps_free(grads);
        return r;
}

int worker_run(const WorkerConfig *cfg) {
        Worker w = { .cfg = cfg, .sfd = -1 };
        int r;

        /* Block the signals before ZeroMQ starts its threads, which inherit the
         * mask: a signal delivered to one of them would end the process. */
        w.sfd = signals_open();
        if (w.sfd < 0)
                return log_error_errno(w.sfd, "Failed to set up signals: %m");
        w.zctx = zmq_ctx_new();
        if (!w.zctx) {
                close(w.sfd);
                return log_error_errno(errno, "Failed to create ZeroMQ context: %m");
        }
        (void) zmq_ctx_set(w.zctx, ZMQ_IO_THREADS, 1);
        r = coordlink_open(w.zctx, cfg->coord, &w.coord);
        if (r < 0) {
                log_error_errno(r, "Bad pscoord endpoint %s: %m", cfg->coord);
                goto out;
        }
        worker_register(&w, cfg->connect_timeout * 1000u, &r);
        if (r < 0)
                goto out;
        r = wait_for_job(&w);
        if (r == 0)
                r = train(&w);
        else if (r == -ECANCELED)
                r = 0;
        (void) coordlink_send_type(w.coord, PSNET__MSG_TYPE__MSG_DEREGISTER);
        log_info("left the job");
out:
        w.coord = coordlink_free(w.coord);
        shardmap_free(w.map);
        if (w.sfd >= 0)
                close(w.sfd);
        zmq_ctx_term(w.zctx);
        return r;
}
