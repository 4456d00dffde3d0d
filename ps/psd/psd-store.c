/* The shard's chunks, their values and optimizer state; see psd-store.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "log.h"
#include "psd-optim.h"
#include "psd-store.h"

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

int store_new(uint32_t shard_id, GateAckFn ack, GateAnswerFn answer, void *userdata, Store **ret) {
        Store *s = ps_calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->shard_id = shard_id;
        s->gate.ack = ack;
        s->gate.answer = answer;
        s->gate.ud = userdata;
        s->gate.limits = (GateLimits) { .max_parked = 1024, .max_parked_per_worker = GATE_PARKED_PER_WORKER,
                                        .park_timeout_ms = GATE_DEFAULT_PARK_TIMEOUT_MS };
        *ret = s;
        return 0;
}

void store_foreach(Store *s, void (*fn)(Store *s, Chunk *c, void *ud), void *ud) {
        if (!s->has_job || !s->chunks)
                return;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (s->chunks[t][k])
                                fn(s, s->chunks[t][k], ud);
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
        gate_done(s);
        store_drop_chunks(s);
        shardmap_free(s->map);
        ps_free(s->sum);
        ps_free(s);
        return NULL;
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
        if (shardmap_owner_id(s->map, tensor, chunk) != s->shard_id)
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
        s->bytes += job_chunk_bytes(&s->job, tensor, chunk);
        return gate_settle(s);
}

uint64_t store_incoming(const Store *s) {
        uint64_t n = 0;
        if (!s->has_job || !s->map || !s->chunks)
                return 0;
        for (uint32_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (!s->chunks[t][k] &&
                            shardmap_owner_id(s->map, t, k) == s->shard_id)
                                n++;
        return n;
}

int store_configure(Store *s, const Job *job, const ShardMap *map) {
        if (!shardmap_fits_job(map, job))
                return -EINVAL; /* a map of another job's keys */
        ShardMap *copy = shardmap_dup(map);
        int r;
        if (!copy)
                return -ENOMEM;
        /* Another job, or the same id describing other tensors (a restarted pscoord
         * numbers jobs from 1 again): start over rather than mix the two. */
        bool fresh = false;
        if (s->has_job && (s->job.id != job->id || s->job.ntensors != job->ntensors ||
                           s->job.chunk_floats != job->chunk_floats || s->job.seed != job->seed ||
                           strcmp(s->job.model, job->model) != 0 || s->job.optim.kind != job->optim.kind)) {
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
                s->gate.cur.mode = s->gate.prev.mode = job->mode;
                s->gate.cur.staleness = s->gate.prev.staleness = job->staleness;
        }
        s->job.lr_scaling = job->lr_scaling;
        s->job.warmup_clocks = job->warmup_clocks;
        s->job.allow_nonfinite = job->allow_nonfinite;
        s->has_job = true;

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
                        int owner = shardmap_lookup(copy, t, k);
                        bool mine = shardmap_shard(copy, (size_t) owner)->id == s->shard_id;
                        if (mine && !s->chunks[t][k] && first_map) {
                                r = chunk_new(job, t, k, true, &s->chunks[t][k]);
                                if (r < 0)
                                        return r;
                        } else if (!mine && s->chunks[t][k]) {
                                gate_chunk_leaving(s, s->chunks[t][k]);
                                if (s->move)
                                        s->move(s->move_userdata, s->chunks[t][k], shardmap_shard(copy, (size_t) owner));
                                s->chunks[t][k] = chunk_free(s, s->chunks[t][k]);
                        }
                        if (s->chunks[t][k]) {
                                s->nkeys++;
                                s->bytes += job_chunk_bytes(job, t, k);
                        }
                }
        }
        return gate_settle(s);
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
                bool mine = s->map && shardmap_owner_id(s->map, tensor, chunk) == s->shard_id;
                *ret_status = mine ? PSNET__STATUS__STATUS_MIGRATING : PSNET__STATUS__STATUS_MOVED;
                return NULL;
        }
        *ret_status = PSNET__STATUS__STATUS_OK;
        return c;
}

int store_lookup_keys(Store *s, const Psnet__Header *h, Chunk **chunks, char *reason, size_t n) {
        if (h->job != s->job.id) {
                snprintf(reason, n, "job %u is not served here (this shard serves job %u)", h->job, s->job.id);
                return PSNET__STATUS__STATUS_INVALID;
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                int st;
                const Psnet__Key *k = h->keys[i];
                chunks[i] = store_lookup(s, k->tensor, k->chunk, k->len, &st);
                if (chunks[i])
                        continue;
                if (st == PSNET__STATUS__STATUS_SIZE)
                        snprintf(reason, n, "key (%u,%u) declares %u floats, the job's chunk has %u", k->tensor,
                                 k->chunk, k->len, job_chunk_len(&s->job, k->tensor, k->chunk));
                else if (st == PSNET__STATUS__STATUS_MOVED)
                        snprintf(reason, n, "key (%u,%u) is owned by another shard", k->tensor, k->chunk);
                else if (st == PSNET__STATUS__STATUS_MIGRATING)
                        snprintf(reason, n, "key (%u,%u) is moving here; retry", k->tensor, k->chunk);
                else if (st == PSNET__STATUS__STATUS_NO_JOB)
                        snprintf(reason, n, "no job is configured on this shard yet");
                else
                        snprintf(reason, n, "key (%u,%u) is not a key of job %u", k->tensor, k->chunk, s->job.id);
                return st;
        }
        return PSNET__STATUS__STATUS_OK;
}

int store_apply(Store *s, Chunk *c, const float *g, ConsistencyMode mode, size_t nworkers, int64_t clock) {
        int r = chunk_make_writable(s, c);
        if (r < 0)
                return r;
        OptimConf o = s->job.optim;
        o.lr *= job_lr_factor(&s->job, mode, (uint32_t) nworkers, clock);
        optim_apply(&o, ++c->steps, c->val->data, g, c->state, c->len);
        s->applied++;
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

int64_t store_max_clock(const Store *s) {
        int64_t m = 0;
        if (!s->has_job || !s->chunks)
                return 0;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (s->chunks[t][k] && s->chunks[t][k]->clock > m)
                                m = s->chunks[t][k]->clock;
        return m;
}

int64_t store_clock(const Store *s) {
        if (!s->has_job || !s->chunks)
                return 0;
        const Gate *g = &s->gate;
        if (g->cur.mode != MODE_BSP) {
                /* ASP/SSP: the fastest member's progress. */
                int64_t m = 0;
                for (size_t i = 0; i < g->cur.nmembers; i++) {
                        uint32_t w = g->cur.members[i];
                        if (w < g->nwclock && g->wclock[w] > m)
                                m = g->wclock[w];
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
