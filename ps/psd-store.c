/* The shard's chunks, optimizer state and BSP/ASP gate; see psd-store.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "log.h"
#include "psd-optim.h"
#include "psd-store.h"
#include "wire.h"

#define STORE_MAX_WORKER_ID 65535u

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
static int chunk_make_writable(Chunk *c) {
        if (atomic_load(&c->val->refs) == 1)
                return 0;
        ValBuf *n = valbuf_new(c->len);
        if (!n)
                return -ENOMEM;
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

static int chunk_new(const Job *job, uint32_t t, uint32_t k, Chunk **ret) {
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
        ps_free(s->members);
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

int store_configure(Store *s, const Job *job, const ShardMap *map) {
        ShardMap *copy = NULL;
        int r = shardmap_copy(map, &copy);
        if (r < 0)
                return r;
        /* Another job, or the same id describing other tensors (a restarted pscoord
         * numbers jobs from 1 again): start over rather than mix the two. */
        if (s->has_job && (s->job.id != job->id || s->job.ntensors != job->ntensors ||
                           s->job.chunk_floats != job->chunk_floats || s->job.seed != job->seed ||
                           strcmp(s->job.model, job->model) != 0 ||
                           strcmp(s->job.optim.kind, job->optim.kind) != 0)) {
                store_drop_chunks(s);
                s->has_job = false;
        }
        if (!s->has_job) {
                s->job = *job;
                s->chunks = ps_calloc(job->ntensors, sizeof *s->chunks);
                ps_free(s->sum);
                s->sum = ps_malloc_aligned((size_t) job->chunk_floats * sizeof(float));
                if (!s->chunks || !s->sum) {
                        shardmap_free(copy);
                        return -ENOMEM;
                }
                s->pushes = s->pulls = s->applied = 0;
        }
        s->job.mode = job->mode; /* switchable between clocks */
        s->has_job = true;

        size_t per = optim_state_per_value(&job->optim);
        s->nkeys = s->bytes = 0;
        for (uint32_t t = 0; t < job->ntensors; t++) {
                uint32_t n = job->tensors[t].nchunks;
                if (!s->chunks[t]) {
                        s->chunks[t] = ps_calloc(n, sizeof(Chunk *));
                        if (!s->chunks[t]) {
                                shardmap_free(copy);
                                return -ENOMEM;
                        }
                }
                for (uint32_t k = 0; k < n; k++) {
                        size_t owner = shardmap_lookup(copy, t, k);
                        bool mine = shardmap_shard(copy, owner)->id == s->shard_id;
                        if (mine && !s->chunks[t][k]) {
                                r = chunk_new(job, t, k, &s->chunks[t][k]);
                                if (r < 0) {
                                        shardmap_free(copy);
                                        return r;
                                }
                        } else if (!mine && s->chunks[t][k])
                                s->chunks[t][k] = chunk_free(s, s->chunks[t][k]);
                        if (s->chunks[t][k]) {
                                s->nkeys++;
                                s->bytes += (uint64_t) s->chunks[t][k]->len * sizeof(float) * (1 + per);
                        }
                }
        }
        shardmap_free(s->map);
        s->map = copy;
        return store_settle(s);
}

static int cmp_u32(const void *a, const void *b) {
        uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
        return x < y ? -1 : x > y;
}

int store_set_members(Store *s, const uint32_t *workers, size_t n, uint64_t epoch) {
        uint32_t *m = ps_malloc((n ? n : 1) * sizeof *m);
        if (!m)
                return -ENOMEM;
        if (n)
                memcpy(m, workers, n * sizeof *m);
        qsort(m, n, sizeof *m, cmp_u32);
        ps_free(s->members);
        s->members = m;
        s->nmembers = n;
        s->members_epoch = epoch;
        return store_settle(s);
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
                *ret_status = PSNET__STATUS__STATUS_MOVED;
                return NULL;
        }
        *ret_status = PSNET__STATUS__STATUS_OK;
        return c;
}

static int64_t *chunk_last_clock(Chunk *c, uint32_t worker) {
        if (worker >= c->nlast) {
                size_t n = MAX((size_t) worker + 1, c->nlast * 2);
                int64_t *p = ps_realloc(c->last_clock, n * sizeof *p);
                if (!p)
                        return NULL;
                for (size_t i = c->nlast; i < n; i++)
                        p[i] = -1;
                c->last_clock = p;
                c->nlast = n;
        }
        return &c->last_clock[worker];
}

/* Gradient data of a frame as aligned floats (copied into scratch if needed). */
static const float *grad_data(const zmq_msg_t *m, float *scratch, uint32_t len) {
        const float *g = wire_frame_f32(m);
        if (g)
                return g;
        memcpy(scratch, zmq_msg_data((zmq_msg_t *) m), (size_t) len * sizeof(float));
        return scratch;
}

static int chunk_apply(Store *s, Chunk *c, const float *g) {
        int r = chunk_make_writable(c);
        if (r < 0)
                return r;
        optim_apply(&s->job.optim, ++c->steps, c->val->data, g, c->state, c->len);
        s->applied++;
        return 0;
}

static bool is_member(const Store *s, uint32_t worker) {
        return bsearch(&worker, s->members, s->nmembers, sizeof(uint32_t), cmp_u32) != NULL;
}

static int cmp_pending(const void *a, const void *b) {
        const Pending *x = a, *y = b;
        return x->req->worker < y->req->worker ? -1 : x->req->worker > y->req->worker;
}

/* Closes c's clock if every member has pushed for it. Non-members' gradients
 * parked for the closing clock are refused (STALE), never silently dropped. */
static int chunk_settle(Store *s, Chunk *c) {
        if (s->job.mode != MODE_BSP || c->npending == 0 || s->nmembers == 0)
                return 0;
        size_t have = 0;
        for (size_t i = 0; i < c->npending; i++)
                if (is_member(s, c->pending[i].req->worker))
                        have++;
        if (have < s->nmembers)
                return 0;

        qsort(c->pending, c->npending, sizeof *c->pending, cmp_pending);
        float *sum = s->sum;
        size_t used = 0;
        for (size_t i = 0; i < c->npending; i++) {
                Pending *p = &c->pending[i];
                if (!is_member(s, p->req->worker))
                        continue;
                const float *g = wire_frame_f32(&p->grad);
                if (!g) {
                        /* Unaligned frame: accumulate through memcpy. */
                        float tmp;
                        const char *raw = zmq_msg_data(&p->grad);
                        for (uint32_t j = 0; j < c->len; j++) {
                                memcpy(&tmp, raw + (size_t) j * sizeof tmp, sizeof tmp);
                                sum[j] = used ? sum[j] + tmp : tmp;
                        }
                } else if (used == 0)
                        memcpy(sum, g, (size_t) c->len * sizeof(float));
                else
                        for (uint32_t j = 0; j < c->len; j++)
                                sum[j] += g[j];
                used++;
        }
        float inv = 1.0f / (float) used;
        for (uint32_t j = 0; j < c->len; j++)
                sum[j] *= inv;
        int r = chunk_apply(s, c, sum);
        c->clock++;

        /* Take the list before settling: acks may run arbitrary code. */
        Pending *list = c->pending;
        size_t n = c->npending;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        for (size_t i = 0; i < n; i++) {
                int st = r < 0 ? PSNET__STATUS__STATUS_SHUTTING_DOWN
                         : is_member(s, list[i].req->worker) ? PSNET__STATUS__STATUS_OK
                                                              : PSNET__STATUS__STATUS_STALE;
                zmq_msg_close(&list[i].grad);
                pushreq_settle(s, list[i].req, st);
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

        if (s->job.mode == MODE_ASP) {
                /* Each push counts as 1/W of a step, so W workers make one step's worth
                 * of progress per round, as under BSP (and the same lr suits both). */
                const float *g = grad_data(grad, s->sum, c->len);
                float scale = 1.0f / (float) MAX(s->nmembers, (size_t) 1);
                for (uint32_t j = 0; j < c->len; j++)
                        s->sum[j] = g[j] * scale;
                int r = chunk_apply(s, c, s->sum);
                if (r < 0)
                        return r;
                c->clock++;
                *last = req->clock;
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
        int64_t m = -1;
        if (!s->has_job || !s->chunks)
                return 0;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                        const Chunk *c = s->chunks[t][k];
                        if (c && (m < 0 || c->clock < m))
                                m = c->clock;
                }
        return m < 0 ? 0 : m;
}
