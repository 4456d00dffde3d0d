/* SPDX-License-Identifier: Apache-2.0 */
/* The shard's chunks, their values and optimizer state; see psd-store.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "compress.h"
#include "log.h"
#include "psd-optim.h"
#include "psd-store.h"

/* Values per thread below which a conversion stays on one thread. */
#define STORE_MIN_PART (64u << 10)

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

ValBuf *store_value_new(uint32_t n) { return valbuf_new(n); }

ValBuf *store_value_ref(Chunk *c) {
        atomic_fetch_add(&c->val->refs, 1);
        return c->val;
}

void store_value_unref(ValBuf *v) { valbuf_unref(v); }

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
        s->stats.copies++;
        memcpy(n->data, c->val->data, (size_t) c->len * sizeof(float));
        valbuf_unref(c->val);
        c->val = n;
        return 0;
}

static Chunk *chunk_free(Store *s, Chunk *c) {
        if (!c)
                return NULL;
        if (c->npending && s->release)
                s->release(s->release_ud, c, STORE_DROPPED);
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
        size_t per = job_state_per_value(job);
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

int store_new(const StoreConf *conf, Store **ret) {
        Store *s = ps_calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->shard_id = conf->shard_id;
        s->pool = conf->pool;
        s->move = conf->move;
        s->move_userdata = conf->move_userdata;
        *ret = s;
        return 0;
}

void store_set_release(Store *s, StoreReleaseFn fn, void *ud) {
        s->release = fn;
        s->release_ud = ud;
}

const Job *store_job(const Store *s) { return s->has_job ? &s->job : NULL; }
const ShardMap *store_map(const Store *s) { return s->map; }
const StoreStats *store_stats(const Store *s) { return &s->stats; }
void store_set_restoring(Store *s, bool restoring) { s->restoring = restoring; }
void store_pulled(Store *s, size_t keys) { s->stats.pulls += keys; }

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
        s->stats.nkeys = s->stats.bytes = s->stats.backup_keys = 0;
}

Store *store_free(Store *s) {
        if (!s)
                return NULL;
        store_drop_chunks(s);
        shardmap_free(s->map);
        ps_free(s->sum);
        ps_free(s);
        return NULL;
}

/* Whether a copy with these figures is newer than c (more steps; as many and
 * more pushes parked). */
static bool image_newer(const Chunk *c, const ChunkImage *im) {
        if (im->steps != c->steps)
                return im->steps > c->steps;
        if (im->clock != c->clock)
                return im->clock > c->clock;
        return im->npending > c->npending;
}

static void store_count(Store *s, const Chunk *c, int sign) {
        uint64_t b = job_chunk_bytes(&s->job, c->tensor, c->chunk);
        StoreStats *st = &s->stats;
        if (sign > 0) {
                st->nkeys++;
                st->bytes += b;
                st->backup_keys += c->backup;
        } else {
                st->nkeys--;
                st->bytes -= b;
                st->backup_keys -= c->backup;
        }
}

int store_install_image(Store *s, const ChunkImage *im, Chunk **ret) {
        uint32_t tensor = im->tensor, chunk = im->chunk, len = im->len;
        if (!s->has_job || !s->map || job_chunk_len(&s->job, tensor, chunk) != len)
                return -EINVAL;
        size_t per = job_state_per_value(&s->job);
        if (im->state_floats != per * len || im->nlast > 65536 || im->npending > 65536)
                return -EINVAL;
        int rank = shardmap_holder_rank(s->map, tensor, chunk, s->shard_id);
        if (rank < 0)
                return -ENOENT;
        Chunk *old = s->chunks[tensor][chunk];
        if (old && (!im->replica || !old->backup || !image_newer(old, im)))
                return -EEXIST;
        Chunk *c;
        int r;
        bool adopt = im->adopt_values != NULL;
        if (adopt && (im->adopt_values->n != len || (per && !im->adopt_state) || im->npending))
                return -EINVAL;
        /* Everything that can fail comes before an adopted buffer is taken. */
        int64_t *last = im->nlast ? ps_malloc(im->nlast * sizeof *last) : NULL;
        if (im->nlast && !last)
                return -ENOMEM;
        if (im->nlast)
                memcpy(last, im->last_clocks, im->nlast * sizeof *last);
        if (adopt) {
                c = ps_calloc(1, sizeof *c);
                if (!c) {
                        ps_free(last);
                        return -ENOMEM;
                }
                *c = (Chunk) { .tensor = tensor, .chunk = chunk, .len = len, .val = im->adopt_values,
                               .state = per ? im->adopt_state : NULL };
        } else {
                r = chunk_new(&s->job, tensor, chunk, false, &c);
                if (r < 0) {
                        ps_free(last);
                        return r;
                }
                memcpy(c->val->data, im->values, (size_t) len * sizeof(float));
                if (per && im->state) /* else zeros, from chunk_new */
                        memcpy(c->state, im->state, im->state_floats * sizeof(float));
        }
        c->steps = im->steps;
        c->clock = im->clock;
        c->backup = rank > 0;
        c->last_clock = last;
        c->nlast = im->nlast;
        if (old) {
                store_count(s, old, -1);
                chunk_free(s, old);
        }
        s->chunks[tensor][chunk] = c;
        store_count(s, c, +1);
        /* A chunk that moved here to be led: its backups get it from here. */
        if (rank == 0 && !im->replica && !im->restored && s->move)
                for (uint32_t i = 1; i < shardmap_replicas(s->map); i++)
                        s->move(s->move_userdata, c, shardmap_shard(s->map, (size_t) shardmap_holder(s->map, tensor,
                                                                                                   chunk, i)), true);
        *ret = c;
        return 0;
}

uint64_t store_incoming(const Store *s) {
        uint64_t n = 0;
        if (!s->has_job || !s->map || !s->chunks)
                return 0;
        for (uint32_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (!s->chunks[t][k] && shardmap_holder_rank(s->map, t, k, s->shard_id) >= 0)
                                n++;
        return n;
}

/* Whether the shard at index i of new held key (t, k) under old. */
static bool held_before(const ShardMap *old, const ShardMap *new, uint32_t t, uint32_t k, int i) {
        return old && i >= 0 && shardmap_holder_rank(old, t, k, shardmap_shard(new, (size_t) i)->id) >= 0;
}

/* Key (t, k), held here at rank, from the job's seed (0 or -ENOMEM). */
static int chunk_seed(Store *s, uint32_t t, uint32_t k, int rank) {
        int r = chunk_new(&s->job, t, k, true, &s->chunks[t][k]);
        if (r < 0)
                return r;
        s->chunks[t][k]->backup = rank > 0;
        store_count(s, s->chunks[t][k], +1);
        return 0;
}

int store_create_missing(Store *s) {
        if (!s->has_job || !s->map || !s->chunks)
                return 0;
        for (uint32_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                        int rank = shardmap_holder_rank(s->map, t, k, s->shard_id);
                        if (s->chunks[t][k] || rank < 0)
                                continue;
                        int r = chunk_seed(s, t, k, rank);
                        if (r < 0)
                                return r;
                }
        return 0;
}

/* Key (t, k) under the new map s->map (old: the one before, NULL for the
 * job's first): created (first map), kept (promoted, demoted), sent where it
 * is missing, or dropped. */
static int chunk_remap(Store *s, const ShardMap *old, uint32_t t, uint32_t k, bool first_map) {
        const ShardMap *m = s->map;
        int rank = shardmap_holder_rank(m, t, k, s->shard_id);
        Chunk *c = s->chunks[t][k];
        if (!c) {
                /* The first map of a job: every copy starts from the same
                 * initial values. Later, a copy arrives from its primary. */
                if (rank < 0 || !first_map || s->restoring)
                        return 0;
                return chunk_seed(s, t, k, rank);
        }
        int primary = shardmap_holder(m, t, k, 0);
        if (!c->backup && rank != 0) {
                /* No longer led here: the new primary gets it unless it has a copy. */
                if (c->npending && s->release)
                        s->release(s->release_ud, c, rank < 0 ? STORE_LEAVING : STORE_DEMOTED);
                if (!held_before(old, m, t, k, primary) && s->move)
                        s->move(s->move_userdata, c, shardmap_shard(m, (size_t) primary), false);
        }
        if (rank < 0) {
                store_count(s, c, -1);
                s->chunks[t][k] = chunk_free(s, c);
                return 0;
        }
        if (c->backup != (rank > 0)) {
                store_count(s, c, -1);
                c->backup = rank > 0;
                store_count(s, c, +1);
        }
        /* Led here: every backup without a copy gets one. */
        for (uint32_t i = 1; rank == 0 && i < shardmap_replicas(m); i++) {
                int b = shardmap_holder(m, t, k, i);
                if (!held_before(old, m, t, k, b) && s->move)
                        s->move(s->move_userdata, c, shardmap_shard(m, (size_t) b), true);
        }
        return 0;
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
                s->stats.pushes = s->stats.pulls = s->stats.applied = s->stats.copies = 0;
                s->stats.last_lr = 0.0f;
        }
        s->job.lr_scaling = job->lr_scaling;
        s->job.warmup_clocks = job->warmup_clocks;
        s->job.lr_schedule = job->lr_schedule;
        s->job.allow_nonfinite = job->allow_nonfinite;
        s->job.max_grad_norm = job->max_grad_norm;
        s->has_job = true;

        bool first_map = s->map == NULL || fresh;
        /* The new map first: chunks that leave are sent under its epoch, which lets
         * a new owner that has not received the map yet keep them until it does. */
        ShardMap *prev = s->map, *old = first_map ? NULL : prev;
        s->map = copy;
        for (uint32_t t = 0; t < job->ntensors; t++) {
                uint32_t n = job->tensors[t].nchunks;
                if (!s->chunks[t]) {
                        s->chunks[t] = ps_calloc(n, sizeof(Chunk *));
                        if (!s->chunks[t]) {
                                shardmap_free(prev);
                                return -ENOMEM;
                        }
                }
                for (uint32_t k = 0; k < n; k++) {
                        r = chunk_remap(s, old, t, k, first_map);
                        if (r < 0) {
                                shardmap_free(prev);
                                return r;
                        }
                }
        }
        shardmap_free(prev);
        return fresh ? 1 : 0;
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
        if (!c || c->backup) {
                bool mine = s->map && shardmap_owner_id(s->map, tensor, chunk) == s->shard_id;
                *ret_status = mine ? PSNET__STATUS__STATUS_MIGRATING : PSNET__STATUS__STATUS_MOVED;
                return NULL;
        }
        *ret_status = PSNET__STATUS__STATUS_OK;
        return c;
}

Chunk *store_lookup_backup(Store *s, uint32_t tensor, uint32_t chunk, uint32_t len, uint32_t primary,
                           int *ret_status) {
        if (!s->has_job || !s->map) {
                *ret_status = PSNET__STATUS__STATUS_NO_JOB;
                return NULL;
        }
        uint32_t want = job_chunk_len(&s->job, tensor, chunk);
        if (want == 0 || want != len) {
                *ret_status = want ? PSNET__STATUS__STATUS_SIZE : PSNET__STATUS__STATUS_UNKNOWN_KEY;
                return NULL;
        }
        if (shardmap_owner_id(s->map, tensor, chunk) != primary ||
            shardmap_holder_rank(s->map, tensor, chunk, s->shard_id) <= 0) {
                *ret_status = PSNET__STATUS__STATUS_MOVED;
                return NULL;
        }
        Chunk *c = s->chunks[tensor][chunk];
        *ret_status = c ? PSNET__STATUS__STATUS_OK : PSNET__STATUS__STATUS_MIGRATING;
        return c;
}

size_t store_backups(const Store *s, uint32_t *idx, size_t max) {
        if (!s->map)
                return 0;
        int me = shardmap_find(s->map, s->shard_id);
        size_t n = 0, ns = shardmap_size(s->map);
        for (uint32_t i = 1; me >= 0 && i < shardmap_replicas(s->map) && n < max; i++)
                idx[n++] = (uint32_t) (((size_t) me + i) % ns);
        return n;
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

int store_apply(Store *s, Chunk *c, const float *g, float gscale, ConsistencyMode mode, size_t nworkers, int64_t clock,
                float progress) {
        int r = chunk_make_writable(s, c);
        if (r < 0)
                return r;
        if (s->job.tensors[c->tensor].buffer) {
                /* Not trained: g (the workers' mean under BSP, one worker's
                 * values under ASP and SSP with gscale 1/W) is where the
                 * value goes, all of it or 1/W of the way. */
                float *w = c->val->data;
                for (uint32_t i = 0; i < c->len; i++)
                        w[i] += gscale * (g[i] - w[i]);
                c->steps++;
                s->stats.applied++;
                return 0;
        }
        OptimConf o = s->job.optim;
        o.lr *= job_lr_factor(&s->job, mode, (uint32_t) nworkers, clock, progress);
        s->stats.last_lr = o.lr;
        optim_apply_par(s->pool, &o, ++c->steps, c->val->data, g, gscale, c->state, c->len);
        s->stats.applied++;
        return 0;
}

int store_fed_apply(Store *s, Chunk *c, const float *const *updates, const uint64_t *examples, size_t n,
                    const float *noise, float *scratch) {
        int r = chunk_make_writable(s, c);
        if (r < 0)
                return r;
        r = fed_aggregate(&s->job.fed.strategy, c->val->data, c->state, c->len, updates, examples, n, noise,
                          scratch);
        if (r < 0)
                return r;
        c->steps++;
        c->clock++;
        s->stats.applied++;
        return 0;
}

int store_fed_step(Store *s, Chunk *c, const float *d) {
        int r = chunk_make_writable(s, c);
        if (r < 0)
                return r;
        fed_server_step(&s->job.fed.strategy, c->val->data, c->state, c->len, d);
        c->steps++;
        c->clock++;
        s->stats.applied++;
        return 0;
}

int store_value_msg(Store *s, Chunk *c, zmq_msg_t *ret) {
        atomic_fetch_add(&c->val->refs, 1);
        if (zmq_msg_init_data(ret, c->val->data, (size_t) c->len * sizeof(float), valbuf_zmq_free,
                              c->val) < 0) {
                valbuf_unref(c->val);
                return -errno;
        }
        s->stats.pulls++;
        return 0;
}

int store_value_bf16(Store *s, Chunk *c, zmq_msg_t *ret) {
        if (zmq_msg_init_size(ret, (size_t) c->len * 2) < 0)
                return -errno;
        bf16_encode(c->val->data, c->len, zmq_msg_data(ret));
        s->stats.pulls++;
        return 0;
}

void store_steps(const Store *s, uint64_t *ret_min, uint64_t *ret_max) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (size_t t = 0; s->has_job && s->chunks && t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                        const Chunk *c = s->chunks[t][k];
                        if (!c || c->backup)
                                continue;
                        lo = MIN(lo, c->steps);
                        hi = MAX(hi, c->steps);
                }
        *ret_min = lo == UINT64_MAX ? 0 : lo;
        *ret_max = hi;
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

int64_t store_min_clock(const Store *s) {
        if (!s->has_job || !s->chunks)
                return 0;
        int64_t m = -1;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                        const Chunk *c = s->chunks[t][k];
                        if (c && (m < 0 || c->clock < m))
                                m = c->clock;
                }
        return m < 0 ? 0 : m;
}

typedef struct Bf16Loop {
        void *dst;
        const void *src;
        bool encode; /* f32 src to bf16 dst, else bf16 src to f32 dst */
} Bf16Loop;

static void bf16_range(void *arg, size_t lo, size_t hi) {
        const Bf16Loop *l = arg;
        if (l->encode)
                bf16_encode((const float *) l->src + lo, hi - lo, (uint8_t *) l->dst + 2 * lo);
        else
                bf16_decode((const uint8_t *) l->src + 2 * lo, hi - lo, (float *) l->dst + lo);
}

void store_bf16(Store *s, void *dst, const void *src, size_t n, bool encode) {
        Bf16Loop l = { .dst = dst, .src = src, .encode = encode };
        pfor_run(s->pool, n, STORE_MIN_PART, bf16_range, &l);
}

int store_frames_to_f32(Store *s, zmq_msg_t *frames, const Psnet__Header *h) {
        for (size_t i = 0; i < h->n_keys; i++) {
                zmq_msg_t f;
                uint32_t len = h->keys[i]->len;
                if (zmq_msg_init_size(&f, (size_t) len * sizeof(float)) < 0)
                        return -errno;
                store_bf16(s, zmq_msg_data(&f), zmq_msg_data(&frames[i]), len, false);
                zmq_msg_close(&frames[i]);
                zmq_msg_init(&frames[i]);
                zmq_msg_move(&frames[i], &f);
        }
        return 0;
}
