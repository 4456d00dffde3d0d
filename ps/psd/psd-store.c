/* The shard's chunks, optimizer state and BSP/ASP gate; see psd-store.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "errors.h"
#include "log.h"
#include "psd-optim.h"
#include "psd-store.h"
#include "wire.h"

#define STORE_MAX_WORKER_ID 65535u

/* The slot of a per-worker-id clock table, growing it (new slots -1) as needed;
 * NULL when out of memory. */
static int64_t *clock_slot(int64_t **tab, size_t *n, uint32_t worker) {
        if (worker >= *n) {
                size_t m = MAX((size_t) worker + 1, *n * 2);
                int64_t *p = ps_realloc(*tab, m * sizeof *p);
                if (!p)
                        return NULL;
                for (size_t i = *n; i < m; i++)
                        p[i] = -1;
                *tab = p;
                *n = m;
        }
        return &(*tab)[worker];
}

static ValBuf *valbuf_new(uint32_t n) {
        ValBuf *v = ps_malloc(sizeof *v);
        if (!v)
                return NULL;
        v->data = ps_malloc_aligned((size_t) n * sizeof(float));
        if (!v->data) {
                ps_free(v);
                return NULL;
        }
        atomic_init(&v->refs, 1);
        v->n = n;
        return v;
}

static void valbuf_unref(ValBuf *v) {
        if (v && atomic_fetch_sub(&v->refs, 1) == 1) {
                ps_free(v->data);
                ps_free(v);
        }
}

/* ZeroMQ calls this from its I/O thread once a pull reply frame is sent. */
static void valbuf_zmq_free(void *data, void *hint) {
        (void) data;
        valbuf_unref(hint);
}

/* Makes c->val safe to write: copies it if a reply in flight still reads it. */
static int chunk_make_writable(Store *s, Chunk *c) {
        if (atomic_load(&c->val->refs) == 1)
                return 0;
        ValBuf *n = valbuf_new(c->len);
        if (!n)
                return -ENOMEM;
        s->copies++;
        memcpy(n->data, c->val->data, (size_t) c->len * sizeof(float));
        valbuf_unref(c->val);
        c->val = n;
        return 0;
}

static Chunk *chunk_free(Store *s, Chunk *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < c->npending; i++) {
                zmq_msg_close(&c->pending[i].grad);
                pushreq_settle(s, c->pending[i].req, PSNET__STATUS__STATUS_SHUTTING_DOWN);
        }
        ps_free(c->pending);
        ps_free(c->last_clock);
        ps_free(c->state);
        valbuf_unref(c->val);
        ps_free(c);
        return NULL;
}

/* A chunk of key (t, k); its values are the job's initial ones when init, else
 * left for the caller to fill (a chunk that moved here). */
static int chunk_new(const Job *job, uint32_t t, uint32_t k, bool init, Chunk **ret) {
        uint32_t len = job_chunk_len(job, t, k);
        size_t per = optim_state_per_value(&job->optim);
        Chunk *c = ps_calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->tensor = t;
        c->chunk = k;
        c->len = len;
        c->val = valbuf_new(len);
        c->state = per ? ps_calloc((size_t) len * per, sizeof(float)) : NULL;
        if (!c->val || (per && !c->state)) {
                valbuf_unref(c->val);
                ps_free(c->state);
                ps_free(c);
                return -ENOMEM;
        }
        if (init)
                job_init_chunk(job, t, k, c->val->data);
        *ret = c;
        return 0;
}

int pushreq_new(const zmq_msg_t *route, uint64_t seq, uint32_t worker, int64_t clock,
                PushReq **ret) {
        PushReq *r = ps_calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        zmq_msg_init(&r->route);
        if (route && zmq_msg_copy(&r->route, (zmq_msg_t *) route) < 0) {
                zmq_msg_close(&r->route);
                ps_free(r);
                return -errno;
        }
        r->seq = seq;
        r->worker = worker;
        r->clock = clock;
        r->remaining = 1;
        r->status = PSNET__STATUS__STATUS_OK;
        *ret = r;
        return 0;
}

static void pushreq_note(PushReq *req, int status) {
        if (status != PSNET__STATUS__STATUS_OK && req->status == PSNET__STATUS__STATUS_OK)
                req->status = status;
}

void pushreq_settle(Store *s, PushReq *req, int status) {
        pushreq_note(req, status);
        if (--req->remaining > 0)
                return;
        if (s->ack)
                s->ack(s->ack_userdata, req);
        zmq_msg_close(&req->route);
        ps_free(req);
}

int store_new(uint32_t shard_id, StoreAckFn ack, void *userdata, Store **ret) {
        Store *s = ps_calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->shard_id = shard_id;
        s->ack = ack;
        s->ack_userdata = userdata;
        *ret = s;
        return 0;
}

static void store_drop_chunks(Store *s) {
        if (!s->chunks)
                return;
        for (size_t t = 0; t < s->job.ntensors; t++) {
                if (!s->chunks[t])
                        continue;
                for (uint32_t k = 0; k < s->job.tensors[t].nchunks; k++)
                        s->chunks[t][k] = chunk_free(s, s->chunks[t][k]);
                ps_free(s->chunks[t]);
        }
        s->chunks = mfree(s->chunks);
        s->nkeys = s->bytes = 0;
}

Store *store_free(Store *s) {
        if (!s)
                return NULL;
        store_drop_chunks(s);
        shardmap_free(s->map);
        ps_free(s->prev.members);
        ps_free(s->cur.members);
        ps_free(s->wclock);
        ps_free(s->sum);
        ps_free(s);
        return NULL;
}

static int shardmap_copy(const ShardMap *m, ShardMap **ret) {
        size_t n = shardmap_size(m);
        ShardDesc *d = ps_calloc(n, sizeof *d);
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                d[i] = *shardmap_shard(m, i);
        int r = shardmap_new(shardmap_epoch(m), shardmap_vnodes(m), d, n, ret);
        ps_free(d);
        return r;
}

/* Refuses the pushes parked on c (MOVED: the workers resend them to the new
 * owner, which de-duplicates), then hands c to the move callback. */
static void chunk_move_out(Store *s, Chunk *c, const ShardDesc *dest) {
        Pending *list = c->pending;
        size_t n = c->npending;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        for (size_t i = 0; i < n; i++) {
                uint32_t w = list[i].req->worker;
                if (w < c->nlast && c->last_clock[w] >= c->clock)
                        c->last_clock[w] = c->clock - 1; /* not applied: may come again */
                zmq_msg_close(&list[i].grad);
                pushreq_settle(s, list[i].req, PSNET__STATUS__STATUS_MOVED);
        }
        ps_free(list);
        if (s->move)
                s->move(s->ack_userdata, c, dest);
}

int store_install(Store *s, uint32_t tensor, uint32_t chunk, const void *values, uint32_t len,
                  const void *state, size_t state_floats, uint64_t steps, int64_t clock,
                  const int64_t *last_clocks, size_t nlast) {
        if (!s->has_job || !s->map || job_chunk_len(&s->job, tensor, chunk) != len)
                return -EINVAL;
        size_t per = optim_state_per_value(&s->job.optim);
        if (state_floats != per * len || nlast > 65536)
                return -EINVAL;
        if (s->chunks[tensor][chunk])
                return -EEXIST;
        if (shardmap_shard(s->map, shardmap_lookup(s->map, tensor, chunk))->id != s->shard_id)
                return -ENOENT;
        Chunk *c;
        int r = chunk_new(&s->job, tensor, chunk, false, &c);
        if (r < 0)
                return r;
        memcpy(c->val->data, values, (size_t) len * sizeof(float));
        if (per)
                memcpy(c->state, state, state_floats * sizeof(float));
        c->steps = steps;
        c->clock = clock;
        if (nlast) {
                c->last_clock = ps_malloc(nlast * sizeof *c->last_clock);
                if (!c->last_clock) {
                        chunk_free(s, c);
                        return -ENOMEM;
                }
                memcpy(c->last_clock, last_clocks, nlast * sizeof *c->last_clock);
                c->nlast = nlast;
        }
        s->chunks[tensor][chunk] = c;
        s->nkeys++;
        s->bytes += (uint64_t) len * sizeof(float) * (1 + per);
        return store_settle(s);
}

uint64_t store_incoming(const Store *s) {
        uint64_t n = 0;
        if (!s->has_job || !s->map || !s->chunks)
                return 0;
        for (uint32_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (!s->chunks[t][k] &&
                            shardmap_shard(s->map, shardmap_lookup(s->map, t, k))->id == s->shard_id)
                                n++;
        return n;
}

int store_configure(Store *s, const Job *job, const ShardMap *map) {
        ShardMap *copy = NULL;
        int r = shardmap_copy(map, &copy);
        if (r < 0)
                return r;
        /* Another job, or the same id describing other tensors (a restarted pscoord
         * numbers jobs from 1 again): start over rather than mix the two. */
        bool fresh = false;
        if (s->has_job && (s->job.id != job->id || s->job.ntensors != job->ntensors ||
                           s->job.chunk_floats != job->chunk_floats || s->job.seed != job->seed ||
                           strcmp(s->job.model, job->model) != 0 ||
                           s->job.optim.kind != job->optim.kind)) {
                store_drop_chunks(s);
                s->has_job = false;
        }
        if (!s->has_job) {
                fresh = true;
                s->job = *job;
                s->chunks = ps_calloc(job->ntensors, sizeof *s->chunks);
                ps_free(s->sum);
                s->sum = ps_malloc_aligned((size_t) job->chunk_floats * sizeof(float));
                if (!s->chunks || !s->sum) {
                        shardmap_free(copy);
                        return -ENOMEM;
                }
                s->pushes = s->pulls = s->applied = s->copies = 0;
        }
        if (!s->has_job) {
                s->cur.mode = s->prev.mode = job->mode;
                s->cur.staleness = s->prev.staleness = job->staleness;
        }
        s->job.lr_scaling = job->lr_scaling;
        s->has_job = true;

        size_t per = optim_state_per_value(&job->optim);
        bool first_map = s->map == NULL || fresh;
        /* The new map first: chunks that leave are sent under its epoch, which lets
         * a new owner that has not received the map yet keep them until it does. */
        shardmap_free(s->map);
        s->map = copy;
        s->nkeys = s->bytes = 0;
        for (uint32_t t = 0; t < job->ntensors; t++) {
                uint32_t n = job->tensors[t].nchunks;
                if (!s->chunks[t]) {
                        s->chunks[t] = ps_calloc(n, sizeof(Chunk *));
                        if (!s->chunks[t])
                                return -ENOMEM;
                }
                for (uint32_t k = 0; k < n; k++) {
                        size_t owner = shardmap_lookup(copy, t, k);
                        bool mine = shardmap_shard(copy, owner)->id == s->shard_id;
                        if (mine && !s->chunks[t][k] && first_map) {
                                r = chunk_new(job, t, k, true, &s->chunks[t][k]);
                                if (r < 0)
                                        return r;
                        } else if (!mine && s->chunks[t][k]) {
                                chunk_move_out(s, s->chunks[t][k], shardmap_shard(copy, owner));
                                s->chunks[t][k] = chunk_free(s, s->chunks[t][k]);
                        }
                        if (s->chunks[t][k]) {
                                s->nkeys++;
                                s->bytes += (uint64_t) s->chunks[t][k]->len * sizeof(float) * (1 + per);
                        }
                }
        }
        return store_settle(s);
}

static int cmp_u32(const void *a, const void *b) {
        uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
        return x < y ? -1 : x > y;
}

static int64_t *worker_clock(Store *s, uint32_t worker) {
        return clock_slot(&s->wclock, &s->nwclock, worker);
}

static int cfg_set(StoreCfg *c, ConsistencyMode mode, uint32_t staleness, const uint32_t *w, size_t n) {
        uint32_t *m = ps_malloc((n ? n : 1) * sizeof *m);
        if (!m)
                return -ENOMEM;
        if (n)
                memcpy(m, w, n * sizeof *m);
        qsort(m, n, sizeof *m, cmp_u32);
        ps_free(c->members);
        c->members = m;
        c->nmembers = n;
        c->mode = mode;
        c->staleness = staleness;
        return 0;
}

const StoreCfg *store_cfg(const Store *s, int64_t clock) {
        return clock < s->switch_clock ? &s->prev : &s->cur;
}

static int chunk_flush_async(Store *s, Chunk *c);

int store_set_config(Store *s, ConsistencyMode mode, uint32_t staleness, const uint32_t *workers,
                     const int64_t *start, size_t n, const uint32_t *prev, size_t nprev,
                     int64_t from_clock, uint64_t epoch) {
        ConsistencyMode old_mode = s->cur.mode;
        uint32_t old_staleness = s->cur.staleness;
        int r;
        if (prev)
                r = cfg_set(&s->prev, old_mode, old_staleness, prev, nprev);
        else
                r = cfg_set(&s->prev, mode, staleness, workers, n);
        if (r < 0)
                return r;
        r = cfg_set(&s->cur, mode, staleness, workers, n);
        if (r < 0)
                return r;
        s->switch_clock = prev ? from_clock : 0;
        s->members_epoch = epoch;
        s->fenced = false;
        for (size_t i = 0; start && i < n; i++) {
                int64_t *wc = worker_clock(s, workers[i]);
                if (!wc)
                        return -ENOMEM;
                if (*wc < start[i])
                        *wc = start[i];
        }
        if (s->has_job && s->chunks) {
                for (size_t t = 0; t < s->job.ntensors; t++)
                        for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                                Chunk *c = s->chunks[t][k];
                                if (!c)
                                        continue;
                                /* Entering BSP: chunk clocks count closed clocks from the boundary on. */
                                if (mode == MODE_BSP && old_mode != MODE_BSP)
                                        c->clock = from_clock;
                                /* Leaving BSP: what was parked for a clock now governed otherwise is applied. */
                                if (store_cfg(s, c->clock)->mode != MODE_BSP && c->npending) {
                                        r = chunk_flush_async(s, c);
                                        if (r < 0)
                                                return r;
                                }
                        }
        }
        return store_settle(s);
}

int store_set_members(Store *s, const uint32_t *workers, size_t n, uint64_t epoch) {
        return store_set_config(s, s->cur.mode, s->cur.staleness, workers, NULL, n, NULL, 0, 0, epoch);
}

int64_t store_fence(Store *s, int64_t *ret_min_worker, int64_t *ret_max_worker) {
        int64_t maxc = 0;
        if (s->has_job && s->chunks)
                for (size_t t = 0; t < s->job.ntensors; t++)
                        for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                                if (s->chunks[t][k] && s->chunks[t][k]->clock > maxc)
                                        maxc = s->chunks[t][k]->clock;
        int64_t slowest = -1, fastest = 0;
        for (size_t i = 0; i < s->cur.nmembers; i++) {
                uint32_t w = s->cur.members[i];
                int64_t wc = w < s->nwclock ? s->wclock[w] : -1;
                if (wc >= 0 && (slowest < 0 || wc < slowest))
                        slowest = wc;
                if (wc > fastest)
                        fastest = wc;
        }
        s->fenced = true;
        s->fence_limit = maxc + 1;
        s->fence_pull_limit = fastest + 1;
        *ret_min_worker = slowest < 0 ? 0 : slowest;
        *ret_max_worker = fastest;
        return maxc;
}

/* The slowest member's completed clocks under cfg (members with no push yet count as 0). */
static int64_t slowest_member(const Store *s, const StoreCfg *cfg) {
        int64_t slowest = -1;
        for (size_t i = 0; i < cfg->nmembers; i++) {
                uint32_t w = cfg->members[i];
                int64_t wc = w < s->nwclock && s->wclock[w] >= 0 ? s->wclock[w] : 0;
                if (slowest < 0 || wc < slowest)
                        slowest = wc;
        }
        return slowest;
}

bool store_pull_ready(Store *s, Chunk *const *chunks, size_t n, int64_t clock, int64_t *ret_slowest) {
        const StoreCfg *cfg = store_cfg(s, clock);
        int64_t slowest = slowest_member(s, cfg);
        if (ret_slowest)
                *ret_slowest = slowest;
        if (cfg->mode != MODE_BSP && s->fenced && clock > s->fence_pull_limit)
                return false;
        switch (cfg->mode) {
        case MODE_ASP:
                return true;
        case MODE_SSP:
                return cfg->nmembers == 0 || slowest >= clock - (int64_t) cfg->staleness;
        case MODE_BSP:
        default:
                for (size_t i = 0; i < n; i++)
                        if (chunks[i]->clock < clock)
                                return false;
                /* Also every member of the previous clock pushed it (matters right
                 * after a switch from ASP/SSP, where pushes are applied on arrival). */
                if (clock > 0) {
                        const StoreCfg *pc = store_cfg(s, clock - 1);
                        if (pc->mode != MODE_BSP && pc->nmembers && slowest_member(s, pc) < clock)
                                return false;
                }
                return true;
        }
}

Chunk *store_lookup(Store *s, uint32_t tensor, uint32_t chunk, uint32_t len, int *ret_status) {
        if (!s->has_job) {
                *ret_status = PSNET__STATUS__STATUS_NO_JOB;
                return NULL;
        }
        uint32_t want = job_chunk_len(&s->job, tensor, chunk);
        if (want == 0) {
                *ret_status = PSNET__STATUS__STATUS_UNKNOWN_KEY;
                return NULL;
        }
        if (want != len) {
                *ret_status = PSNET__STATUS__STATUS_SIZE;
                return NULL;
        }
        Chunk *c = s->chunks[tensor][chunk];
        if (!c) {
                bool mine = s->map && shardmap_shard(s->map, shardmap_lookup(s->map, tensor, chunk))->id == s->shard_id;
                *ret_status = mine ? PSNET__STATUS__STATUS_MIGRATING : PSNET__STATUS__STATUS_MOVED;
                return NULL;
        }
        *ret_status = PSNET__STATUS__STATUS_OK;
        return c;
}

static int64_t *chunk_last_clock(Chunk *c, uint32_t worker) {
        return clock_slot(&c->last_clock, &c->nlast, worker);
}

/* Gradient data of a frame as aligned floats (copied into scratch if needed). */
static const float *grad_data(const zmq_msg_t *m, float *scratch, uint32_t len) {
        const float *g = wire_frame_f32(m);
        if (g)
                return g;
        memcpy(scratch, zmq_msg_data((zmq_msg_t *) m), (size_t) len * sizeof(float));
        return scratch;
}

static int chunk_apply(Store *s, Chunk *c, const float *g, size_t nworkers) {
        int r = chunk_make_writable(s, c);
        if (r < 0)
                return r;
        OptimConf o = s->job.optim;
        if (s->job.lr_scaling)
                o.lr *= (float) MAX(nworkers, (size_t) 1);
        optim_apply(&o, ++c->steps, c->val->data, g, c->state, c->len);
        s->applied++;
        return 0;
}

static bool is_member(const StoreCfg *cfg, uint32_t worker) {
        return bsearch(&worker, cfg->members, cfg->nmembers, sizeof(uint32_t), cmp_u32) != NULL;
}

static int cmp_pending(const void *a, const void *b) {
        const Pending *x = a, *y = b;
        return x->req->worker < y->req->worker ? -1 : x->req->worker > y->req->worker;
}

/* Closes c's clock if every member has pushed for it. Non-members' gradients
 * parked for the closing clock are refused (STALE), never silently dropped. */
static int chunk_settle(Store *s, Chunk *c) {
        const StoreCfg *cfg = store_cfg(s, c->clock);
        if (cfg->mode != MODE_BSP || c->npending == 0 || cfg->nmembers == 0)
                return 0;
        if (s->fenced && c->clock >= s->fence_limit)
                return 0;
        size_t have = 0;
        for (size_t i = 0; i < c->npending; i++)
                if (is_member(cfg, c->pending[i].req->worker))
                        have++;
        if (have < cfg->nmembers)
                return 0;

        qsort(c->pending, c->npending, sizeof *c->pending, cmp_pending);
        /* Sum in worker-id order, scaled by 1/W in the same pass as the last term
         * ((g1 + g2) + g3) * (1/3): the result depends on nothing but the inputs.
         * A single member's aligned frame is used as it is (x * 1 == x). */
        float *sum = s->sum;
        const float *mean = sum;
        float inv = 1.0f / (float) have;
        size_t used = 0;
        for (size_t i = 0; i < c->npending; i++) {
                Pending *p = &c->pending[i];
                if (!is_member(cfg, p->req->worker))
                        continue;
                const float *g = wire_frame_f32(&p->grad);
                bool last = used + 1 == have;
                if (!g) {
                        /* Unaligned frame: accumulate through memcpy. */
                        float tmp;
                        const char *raw = zmq_msg_data(&p->grad);
                        for (uint32_t j = 0; j < c->len; j++) {
                                memcpy(&tmp, raw + (size_t) j * sizeof tmp, sizeof tmp);
                                float v = used ? sum[j] + tmp : tmp;
                                sum[j] = last ? v * inv : v;
                        }
                } else if (used == 0 && last)
                        mean = g;
                else if (used == 0)
                        memcpy(sum, g, (size_t) c->len * sizeof(float));
                else if (last)
                        for (uint32_t j = 0; j < c->len; j++)
                                sum[j] = (sum[j] + g[j]) * inv;
                else
                        for (uint32_t j = 0; j < c->len; j++)
                                sum[j] += g[j];
                used++;
        }
        int r = chunk_apply(s, c, mean, used);
        c->clock++;

        /* Take the list before settling: acks may run arbitrary code. */
        Pending *list = c->pending;
        size_t n = c->npending;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        for (size_t i = 0; i < n; i++) {
                int st = r < 0 ? status_from_errno(r)
                         : is_member(cfg, list[i].req->worker) ? PSNET__STATUS__STATUS_OK
                                                              : PSNET__STATUS__STATUS_STALE;
                zmq_msg_close(&list[i].grad);
                pushreq_settle(s, list[i].req, st);
        }
        ps_free(list);
        return r;
}

/* Applies one worker's gradient on arrival (ASP, SSP), as 1/W of a step. */
static int chunk_apply_scaled(Store *s, Chunk *c, const zmq_msg_t *grad, const StoreCfg *cfg) {
        const float *g = grad_data(grad, s->sum, c->len);
        if (cfg->nmembers <= 1) /* g * 1 == g */
                return chunk_apply(s, c, g, 1);
        float scale = 1.0f / (float) cfg->nmembers;
        for (uint32_t j = 0; j < c->len; j++)
                s->sum[j] = g[j] * scale;
        /* The chunk clock is left alone: it counts BSP clocks only (c->steps counts updates). */
        return chunk_apply(s, c, s->sum, cfg->nmembers);
}

/* Applies and acknowledges pushes parked under BSP whose clock is now governed by
 * ASP or SSP (a mode switch at a boundary). */
static int chunk_flush_async(Store *s, Chunk *c) {
        Pending *list = c->pending;
        size_t n = c->npending;
        int r = 0;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        qsort(list, n, sizeof *list, cmp_pending);
        for (size_t i = 0; i < n; i++) {
                if (r == 0)
                        r = chunk_apply_scaled(s, c, &list[i].grad, store_cfg(s, list[i].req->clock));
                zmq_msg_close(&list[i].grad);
                pushreq_settle(s, list[i].req, r < 0 ? status_from_errno(r) : PSNET__STATUS__STATUS_OK);
        }
        ps_free(list);
        return r;
}

int store_push(Store *s, Chunk *c, PushReq *req, zmq_msg_t *grad) {
        if (req->worker > STORE_MAX_WORKER_ID || req->clock < 0) {
                pushreq_note(req, PSNET__STATUS__STATUS_INVALID);
                return 0;
        }
        int64_t *last = chunk_last_clock(c, req->worker);
        if (!last)
                return -ENOMEM;
        s->pushes++;
        if (req->clock <= *last) {
                pushreq_note(req, PSNET__STATUS__STATUS_DUPLICATE);
                return 0;
        }
        int64_t *wc = worker_clock(s, req->worker);
        if (!wc)
                return -ENOMEM;
        const StoreCfg *cfg = store_cfg(s, req->clock);

        if (cfg->mode != MODE_BSP) {
                /* Each push counts as 1/W of a step, so W workers make one step's worth
                 * of progress per round, as under BSP (and the same lr suits both). */
                int r = chunk_apply_scaled(s, c, grad, cfg);
                if (r < 0)
                        return r;
                *last = req->clock;
                if (*wc < req->clock + 1)
                        *wc = req->clock + 1;
                return 0;
        }

        if (req->clock != c->clock) {
                /* Behind: that clock has closed without it. Ahead: not possible for a
                 * worker that pulled first; refuse rather than guess. */
                pushreq_note(req, PSNET__STATUS__STATUS_STALE);
                return 0;
        }
        if (c->npending == c->cpending) {
                size_t n = c->cpending ? c->cpending * 2 : 4;
                Pending *p = ps_realloc(c->pending, n * sizeof *p);
                if (!p)
                        return -ENOMEM;
                c->pending = p;
                c->cpending = n;
        }
        Pending *p = &c->pending[c->npending++];
        p->req = req;
        zmq_msg_init(&p->grad);
        zmq_msg_move(&p->grad, grad);
        req->remaining++;
        *last = req->clock;
        if (*wc < req->clock + 1)
                *wc = req->clock + 1;
        return chunk_settle(s, c);
}

int store_settle(Store *s) {
        if (!s->has_job || !s->chunks)
                return 0;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (s->chunks[t][k]) {
                                int r = chunk_settle(s, s->chunks[t][k]);
                                if (r < 0)
                                        return r;
                        }
        return 0;
}

int store_value_msg(Store *s, Chunk *c, zmq_msg_t *ret) {
        atomic_fetch_add(&c->val->refs, 1);
        if (zmq_msg_init_data(ret, c->val->data, (size_t) c->len * sizeof(float), valbuf_zmq_free,
                              c->val) < 0) {
                valbuf_unref(c->val);
                return -errno;
        }
        s->pulls++;
        return 0;
}

int64_t store_clock(const Store *s) {
        if (!s->has_job || !s->chunks)
                return 0;
        if (s->cur.mode != MODE_BSP) {
                /* ASP/SSP: the fastest member's progress. */
                int64_t m = 0;
                for (size_t i = 0; i < s->cur.nmembers; i++) {
                        uint32_t w = s->cur.members[i];
                        if (w < s->nwclock && s->wclock[w] > m)
                                m = s->wclock[w];
                }
                return m;
        }
        int64_t m = -1;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                        const Chunk *c = s->chunks[t][k];
                        if (c && (m < 0 || c->clock < m))
                                m = c->clock;
                }
        return m < 0 ? 0 : m;
}
