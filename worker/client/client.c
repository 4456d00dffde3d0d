/* The shards' data plane; see client.h. A round is a small state per part of
 * each shard's keys (push and pull: to send, sent, a resend scheduled, done)
 * plus two timers: one for the round's deadline, one for the earliest resend.
 * A shard's keys go in parts of at most part_bytes (in frames or through
 * shared memory alike), at most CLIENT_WINDOW of each kind in flight to one
 * shard, so that a shard holds a few parts of a worker's push or pull at a
 * time rather than all of it (docs/ARCHITECTURE.md, "Pushes and pulls in
 * parts"); a federated update goes whole. Replies arrive through each shard's
 * netsock callback; the round's callback runs once, when every part has been
 * answered or something failed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "alloc.h"
#include "client.h"
#include "compress.h"
#include "config.h"
#include "endpoint.h"
#include "errors.h"
#include "log.h"
#include "shm.h"
#include "wire.h"

/* Requests of each kind (push, pull) in flight to one shard at a time. */
#define CLIENT_WINDOW 4
/* The most bytes of keys one push or pull carries in frames, unless
 * PSNET_PART_KIB says otherwise: a key each with the default chunk of 1 MiB
 * (measured best on one host: docs/benchmarks.md). A shard's keys go in at
 * most WIRE_MAX_PARTS parts, bigger ones where they would be more. */
#define CLIENT_PART_BYTES (1u << 20)

/* One request of a round: a part's push or pull. */
typedef enum { REQ_NONE, REQ_TODO, REQ_SENT, REQ_RETRY, REQ_DONE } ReqState;

typedef struct PartReq {
        ReqState state;
        uint64_t seq;                  /* REQ_SENT: the request's */
        uint64_t at;                   /* REQ_RETRY: resend then (ms) */
        bool mem;                      /* REQ_SENT: named the client's memory (in place) */
} PartReq;

/* Keys [first, first + nkeys) of a shard's, pushed and pulled in requests of
 * their own; through the shard's own shared memory at before values from the
 * start of the gradients' and of the values' areas; in place (the client's
 * memory) where the keys lie in the caller's tensors. */
typedef struct Part {
        size_t first, nkeys;
        size_t before;                 /* values of the shard's keys before first */
        PartReq push, pull;
} Part;

typedef struct ShardConn {
        struct Client *client;
        uint32_t id;
        char *endpoint;
        NetSock *sock;
        Psnet__Key *keys;          /* the keys this shard owns */
        Psnet__Key **keyp;
        size_t nkeys;
        Part *parts;                   /* this round's (shard_plan), MIN(nkeys, WIRE_MAX_PARTS) of room */
        size_t nparts;
        /* Same-host shared memory (shm.h): the pushed gradients at 0, the
         * pulled values at area, each key after the other. */
        ShmRegion shm;
        size_t area;                   /* bytes of this shard's keys as f32 */
        bool shm_tried;                /* opened, or failed: frames until the next connection */
        /* A session over the client's memory (client_set_memory): rounds in
         * place name the caller's own tensors in it. */
        ShmRegion mem;
        bool mem_tried;
} ShardConn;

/* --sparsify: each key's push encoded once per push clock (a resend, or the
 * round run again under a new map, sends the same frame, so the error
 * feedback counts each gradient once), just before it goes to its shard (so
 * that one shard applies while the next one's keys are encoded). */
typedef struct Sparse {
        float *resid;                  /* what earlier pushes left out, job_nfloats */
        float *scratch;                /* chunk_floats */
        uint8_t *buf;                  /* compress_bound bytes */
        size_t *key_base;              /* per tensor: its first key's index */
        size_t *float_base;            /* per tensor: its first value's index */
        zmq_msg_t *frames;             /* per key, encoded */
        int64_t *clock;                /* per key: the push clock its frame holds (-1: none) */
        size_t nkeys;
} Sparse;

struct Client {
        uv_loop_t *loop;
        void *zctx;
        uv_timer_t deadline, retry;
        unsigned timers;               /* timers not yet closed */
        uint64_t map_epoch, need_epoch;
        uint64_t members_epoch;        /* sent with every request (0: not yet known) */
        uint64_t examples;             /* sent with pushes (a federated update's example count; 0: none) */
        float progress;                /* sent with pushes (the job's progress; negative: none) */
        bool masked;                   /* pushes carry CODEC_MASKED (a --secagg update) */
        bool pull_f32;                 /* --wire bf16: pulls ask for f32 all the same (the final weights) */
        int codec;                     /* with frame_fn: a --compress update's codec */
        ClientFrameFn frame_fn;
        void *frame_ud;
        Job job;
        uint32_t worker_id;
        NetKeyPair keys;
        bool has_keys;
        ShardConn *shards;
        size_t nshards;
        uint64_t seq;
        unsigned timeout_ms;
        size_t part_bytes;             /* CLIENT_PART_BYTES or PSNET_PART_KIB */
        /* the round in progress */
        bool busy;
        const float *const *grads;
        int64_t push_clock, pull_clock, min_clock;
        float *const *params;
        ClientRoundFn cb;
        void *cb_ud;
        double t0;
        /* client_pull_begin's pull, completed by the next round */
        float *const *pf_params;
        int64_t pf_clock;
        bool prefetching;
        int prefetch_err;              /* an answer to the prefetched pull that ends the next round */
        bool freeing;
        Sparse *sparse;                /* --sparsify (NULL: dense pushes) */
        /* client_set_memory: the caller's tensors in memory every shard on
         * this host maps; sets of job_nfloats floats, tensor after tensor:
         * the gradients, then the values (one set or more). */
        const ShmMemory *mem;
        size_t *tensor_base;           /* per tensor: its first float's index in a set */
        size_t set_floats, nsets;
        bool inplace;                  /* the round's (or prefetch's) tensors are the memory's */
        uint64_t *offs;                /* job_nkeys: a request's places of keys (header_mem) */
        size_t pull_set;               /* in place: the set the values go to */
        ClientStats stats;
};

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void client_on_reply(NetSock *ns, WireMsg *m, int r, void *ud);

static void client_mem_fence(Client *c);

static void client_disconnect(Client *c) {
        client_mem_fence(c);
        for (size_t i = 0; c->shards && i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->sock = netsock_close(s->sock);
                shm_region_close(&s->shm);
                ps_free(s->endpoint);
                ps_free(s->keys);
                ps_free(s->keyp);
                ps_free(s->parts);
        }
        c->shards = mfree(c->shards);
        c->nshards = 0;
}

/* Connects to every shard of map and routes every key to its owner. */
static int client_connect(Client *c, const ShardMap *map) {
        const Job *job = &c->job;
        if (!shardmap_fits_job(map, job))
                return log_error_errno(EINVAL, "the shard map holds other keys than the job's");
        c->nshards = shardmap_size(map);
        c->map_epoch = shardmap_epoch(map);
        c->shards = ps_calloc(c->nshards, sizeof *c->shards);
        if (!c->shards)
                return -ENOMEM;
        size_t nkeys = job_nkeys(job);
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                const ShardDesc *d = shardmap_shard(map, i);
                s->client = c;
                s->id = d->id;
                s->shm = s->mem = (ShmRegion) SHM_REGION_INIT;
                s->endpoint = ps_strdup(d->endpoint);
                s->keys = ps_calloc(nkeys, sizeof *s->keys);
                s->keyp = ps_calloc(nkeys, sizeof *s->keyp);
                if (!s->endpoint || !s->keys || !s->keyp)
                        return -ENOMEM;
                /* No queue limits: a round's frames are the caller's own buffers. */
                const NetSockConf nc = { .type = ZMQ_DEALER, .name = s->endpoint, .keys = c->has_keys ? &c->keys : NULL };
                if (c->has_keys && !d->has_public_key)
                        return log_error_errno(EINVAL, "the shard map has no key for shard %u at %s", s->id, s->endpoint);
                int r = netsock_new(c->loop, c->zctx, &nc, client_on_reply, s, &s->sock);
                if (r == 0)
                        r = netsock_connect(s->sock, s->endpoint, c->has_keys && d->has_public_key ? d->public_key : NULL);
                if (r < 0)
                        return log_error_errno(r, "Cannot connect to shard %u at %s: %m", s->id, s->endpoint);
        }
        for (uint32_t t = 0; t < job->ntensors; t++)
                for (uint32_t k = 0; k < job->tensors[t].nchunks; k++) {
                        ShardConn *s = &c->shards[(size_t) shardmap_lookup(map, t, k)];
                        Psnet__Key *key = &s->keys[s->nkeys];
                        psnet__key__init(key);
                        key->tensor = t;
                        key->chunk = k;
                        key->len = job_chunk_len(job, t, k);
                        s->keyp[s->nkeys++] = key;
                        s->area += (size_t) key->len * sizeof(float);
                }
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->parts = ps_calloc(MAX(MIN(s->nkeys, (size_t) WIRE_MAX_PARTS), (size_t) 1), sizeof *s->parts);
                if (!s->parts)
                        return -ENOMEM;
        }
        return 0;
}

static void client_timer_closed(uv_handle_t *h) {
        Client *c = h->data;
        if (--c->timers == 0)
                ps_free(c);
}

int client_new(uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
               const NetKeyPair *keys, Client **ret) {
        Client *c = ps_calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->loop = loop;
        c->zctx = zctx;
        c->job = *job;
        c->worker_id = worker_id;
        c->timeout_ms = 120000;
        c->progress = -1.0f;
        c->part_bytes = CLIENT_PART_BYTES;
        const char *env = getenv("PSNET_PART_KIB");
        if (env) {
                unsigned long long kib = 0;
                if (config_parse_unsigned(env, 1ull << 22, &kib) < 0 || kib == 0)
                        log_warning("PSNET_PART_KIB=%s is no size in KiB (1 to 4194304): parts of %zu KiB", env,
                                    c->part_bytes >> 10);
                else
                        c->part_bytes = (size_t) kib << 10;
        }
        if (keys) {
                c->keys = *keys;
                c->has_keys = true;
        }
        int r = uv_timer_init(loop, &c->deadline);
        if (r == 0) {
                c->deadline.data = c;
                c->timers++;
                r = uv_timer_init(loop, &c->retry);
                if (r == 0) {
                        c->retry.data = c;
                        c->timers++;
                }
        }
        if (r == 0)
                r = client_connect(c, map);
        if (r < 0) {
                client_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

static Sparse *sparse_free(Sparse *sp) {
        if (!sp)
                return NULL;
        for (size_t i = 0; sp->frames && i < sp->nkeys; i++)
                zmq_msg_close(&sp->frames[i]);
        ps_free(sp->frames);
        ps_free(sp->clock);
        ps_free(sp->resid);
        ps_free(sp->scratch);
        ps_free(sp->buf);
        ps_free(sp->key_base);
        ps_free(sp->float_base);
        ps_free(sp);
        return NULL;
}

Client *client_free(Client *c) {
        if (!c)
                return NULL;
        client_disconnect(c);
        c->sparse = sparse_free(c->sparse);
        c->tensor_base = mfree(c->tensor_base);
        c->offs = mfree(c->offs);
        c->freeing = true;
        if (c->timers == 0) {
                ps_free(c);
                return NULL;
        }
        uv_close((uv_handle_t *) &c->deadline, client_timer_closed);
        if (c->timers == 2)
                uv_close((uv_handle_t *) &c->retry, client_timer_closed);
        return NULL;
}

void client_abort(Client *c) {
        if (!c->busy)
                return;
        c->busy = false;
        c->cb = NULL;
        (void) uv_timer_stop(&c->deadline);
        (void) uv_timer_stop(&c->retry);
}

size_t client_memory_size(const Job *job, size_t nsets) {
        return nsets * job_nfloats(job) * sizeof(float);
}

float *client_memory_tensor(const Job *job, const ShmMemory *m, size_t set, uint32_t t) {
        if (!m || !m->base || t >= job->ntensors || client_memory_size(job, set + 1) > m->size)
                return NULL;
        size_t at = set * job_nfloats(job);
        for (uint32_t i = 0; i < t; i++)
                at += job->tensors[i].numel;
        return (float *) m->base + at;
}

int client_set_memory(Client *c, const ShmMemory *m) {
        if (c->busy || c->prefetching)
                return -EBUSY;
        client_mem_fence(c);
        c->mem = NULL;
        c->inplace = false;
        if (!m)
                return 0;
        size_t set = client_memory_size(&c->job, 1);
        if (!m->base || set == 0 || m->size < 2 * set)
                return -EINVAL;
        if (!c->tensor_base && !(c->tensor_base = ps_calloc(MAX(c->job.ntensors, 1u), sizeof *c->tensor_base)))
                return -ENOMEM;
        if (!c->offs && !(c->offs = ps_calloc(MAX(job_nkeys(&c->job), (size_t) 1), sizeof *c->offs)))
                return -ENOMEM;
        for (uint32_t t = 1; t < c->job.ntensors; t++)
                c->tensor_base[t] = c->tensor_base[t - 1] + c->job.tensors[t - 1].numel;
        c->set_floats = job_nfloats(&c->job);
        c->nsets = m->size / set;
        c->mem = m;
        return 0;
}

int client_set_map(Client *c, const ShardMap *map) {
        if (c->busy)
                return -EBUSY;
        client_disconnect(c);
        c->need_epoch = 0;
        c->prefetching = false; /* its requests went with the old sockets: the round pulls again */
        c->prefetch_err = 0;
        return client_connect(c, map);
}

int client_follow(Client **c, uv_loop_t *loop, void *zctx, const Job *job, const ShardMap *map, uint32_t worker_id,
                  const NetKeyPair *keys, uint64_t members_epoch) {
        if (!*c) {
                int r = client_new(loop, zctx, job, map, worker_id, keys, c);
                if (r == 0)
                        client_set_members_epoch(*c, members_epoch);
                return r;
        }
        if (shardmap_epoch(map) > (*c)->map_epoch)
                return client_set_map(*c, map);
        return 0;
}

uint64_t client_map_epoch(const Client *c) { return c->map_epoch; }
uint64_t client_need_epoch(const Client *c) { return c->need_epoch; }
void client_set_timeout(Client *c, unsigned ms) { c->timeout_ms = ms; }
void client_set_members_epoch(Client *c, uint64_t epoch) { c->members_epoch = epoch; }
void client_set_examples(Client *c, uint64_t examples) { c->examples = examples; }
void client_set_progress(Client *c, float progress) { c->progress = progress; }
void client_set_pull_f32(Client *c, bool f32) { c->pull_f32 = f32; }
void client_set_masked(Client *c, bool masked) { c->masked = masked; }
void client_set_frames(Client *c, int codec, ClientFrameFn fn, void *ud) {
        c->codec = codec;
        c->frame_fn = fn;
        c->frame_ud = ud;
}
const ClientStats *client_stats(const Client *c) { return &c->stats; }
bool client_busy(const Client *c) { return c->busy; }

/* --sparsify for this client's pushes: a training job's. */
static bool pushes_sparse(const Client *c) {
        return c->job.sparsify > 0.0f && c->job.mode != MODE_FED && !c->masked && !c->frame_fn;
}

static Sparse *sparse_new(const Job *job) {
        Sparse *sp = ps_calloc(1, sizeof *sp);
        if (!sp)
                return NULL;
        sp->nkeys = job_nkeys(job);
        sp->resid = ps_calloc(job_nfloats(job), sizeof(float));
        sp->scratch = ps_malloc((size_t) job->chunk_floats * sizeof(float));
        sp->buf = ps_malloc(compress_bound(COMPRESS_TOPK, job->chunk_floats, job->sparsify));
        sp->key_base = ps_calloc(job->ntensors, sizeof *sp->key_base);
        sp->float_base = ps_calloc(job->ntensors, sizeof *sp->float_base);
        sp->frames = ps_calloc(sp->nkeys, sizeof *sp->frames);
        for (size_t i = 0; sp->frames && i < sp->nkeys; i++)
                zmq_msg_init(&sp->frames[i]); /* before anything may fail: sparse_free closes them */
        sp->clock = ps_malloc(sp->nkeys * sizeof *sp->clock);
        if (!sp->resid || !sp->scratch || !sp->buf || !sp->key_base || !sp->float_base || !sp->frames || !sp->clock)
                return sparse_free(sp);
        for (size_t i = 0; i < sp->nkeys; i++)
                sp->clock[i] = -1;
        for (uint32_t t = 1; t < job->ntensors; t++) {
                sp->key_base[t] = sp->key_base[t - 1] + job->tensors[t - 1].nchunks;
                sp->float_base[t] = sp->float_base[t - 1] + job->tensors[t - 1].numel;
        }
        return sp;
}

/* Key (t, k)'s frame of push clock for --sparsify, encoded on first use: the
 * k largest of the chunk plus what earlier pushes left out (compress.h). */
static int sparse_frame(Client *c, const Psnet__Key *key, int64_t clock, zmq_msg_t **ret) {
        const Job *job = &c->job;
        if (!c->sparse && !(c->sparse = sparse_new(job)))
                return -ENOMEM;
        Sparse *sp = c->sparse;
        size_t i = sp->key_base[key->tensor] + key->chunk, at = (size_t) key->chunk * job->chunk_floats;
        zmq_msg_t *f = &sp->frames[i];
        if (sp->clock[i] != clock) {
                size_t n = compress_encode(COMPRESS_TOPK, c->grads[key->tensor] + at, key->len, job->sparsify,
                                           sp->resid + sp->float_base[key->tensor] + at, sp->buf, sp->scratch);
                zmq_msg_close(f);
                if (zmq_msg_init_size(f, n) < 0) {
                        zmq_msg_init(f);
                        sp->clock[i] = -1;
                        return -errno;
                }
                memcpy(zmq_msg_data(f), sp->buf, n);
                sp->clock[i] = clock;
        }
        *ret = f;
        return 0;
}

/* --wire bf16 for this client's pushes and pulls: a training job's, not a
 * federated update (which says its encoding with a codec). */
static bool wire_bf16(const Client *c) {
        return c->job.wire == JOB_WIRE_BF16 && !c->masked && !c->frame_fn;
}

/* Whether pulls ask for bf16 values: --wire bf16, unless the caller wants
 * f32 (the final weights). */
static bool pulls_bf16(const Client *c) {
        return wire_bf16(c) && !c->pull_f32;
}

/* Shards reached through shared memory of either kind now. */
static void shm_count(Client *c) {
        c->stats.shm_shards = 0;
        for (size_t i = 0; i < c->nshards; i++)
                c->stats.shm_shards += c->shards[i].shm.base || c->shards[i].mem.base;
}

ClientShm client_shm_mode(void) {
        const char *env = getenv("PSNET_SHM");
        return !env ? CLIENT_SHM_ON : strcmp(env, "off") == 0 ? CLIENT_SHM_OFF
                                   : strcmp(env, "copy") == 0 ? CLIENT_SHM_COPY : CLIENT_SHM_ON;
}

/* Whether shared memory may reach shard s at all: a training job's pushes
 * and pulls to a shard on an ipc:// endpoint, unless PSNET_SHM=off. The
 * handover socket's path into path. */
static bool shm_allowed(const Client *c, const ShardConn *s, char *path, size_t n) {
        if (client_shm_mode() == CLIENT_SHM_OFF || c->job.mode == MODE_FED || c->masked || c->frame_fn ||
            s->nkeys == 0)
                return false;
        return shm_socket_path(s->endpoint, path, n) == 0;
}

/* Whether shard s's tensors travel through shared memory of its own (the
 * caller's tensors copied in and out). Opened on first use; when the shard
 * does not take it (another host's socket, an old shard, --no-shm), frames
 * until the next connection. */
static bool shard_shm(Client *c, ShardConn *s) {
        if (s->shm.base)
                return true;
        if (s->shm_tried)
                return false;
        s->shm_tried = true;
        char path[128], reason[256];
        if (!shm_allowed(c, s, path, sizeof path))
                return false;
        if (shm_region_open(&s->shm, path, c->worker_id, 2 * s->area, 2000, reason, sizeof reason) < 0) {
                log_info("shard %u: no shared memory (%s): tensors travel in frames", s->id, reason);
                return false;
        }
        shm_count(c);
        log_debug("shard %u: tensors travel through %zu bytes of shared memory", s->id, s->shm.size);
        return true;
}

/* The same for the client's memory: whether a round in place reaches shard s
 * through it. */
static bool shard_mem(Client *c, ShardConn *s) {
        if (s->mem.base)
                return true;
        if (s->mem_tried || !c->mem)
                return false;
        s->mem_tried = true;
        char path[128], reason[256];
        if (!shm_allowed(c, s, path, sizeof path))
                return false;
        if (shm_region_share(&s->mem, c->mem, path, c->worker_id, 2000, reason, sizeof reason) < 0) {
                log_info("shard %u: no shared memory (%s): tensors travel in frames", s->id, reason);
                return false;
        }
        shm_count(c);
        log_debug("shard %u: the worker's tensors lie in %zu bytes of shared memory", s->id, s->mem.size);
        return true;
}

/* How long a failed round waits in all for the shards to end their sessions
 * over the client's memory. */
#define CLIENT_FENCE_MS 2000u

/* Ends every session over the client's memory and waits until each shard
 * ended its end, so that no request given up on reads or writes the
 * caller's tensors after the caller takes them back. */
static void client_mem_fence(Client *c) {
        uint64_t until = now_ms() + CLIENT_FENCE_MS;
        for (size_t i = 0; c->shards && i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                s->mem_tried = false;
                if (!s->mem.base)
                        continue;
                uint64_t now = now_ms();
                if (shm_region_fence(&s->mem, now < until ? (unsigned) (until - now) : 1) < 0)
                        log_warning("shard %u did not end its shared-memory session within %u s: a request given "
                                    "up on may still read or write this worker's tensors",
                                    s->id, CLIENT_FENCE_MS / 1000);
        }
        shm_count(c);
}

/* After a failed round a shard may still read or write a session's memory
 * for requests given up on: the next round opens new ones (of the shard's
 * own memory; the client's memory is fenced, as the caller's tensors are
 * the caller's again). */
static void client_shm_reset(Client *c) {
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                shm_region_close(&s->shm);
                s->shm_tried = false;
        }
        client_mem_fence(c);
}

static void header_shm(Psnet__Header *h, const ShmRegion *r, uint64_t offset) {
        h->has_shm_session = h->has_shm_offset = true;
        h->shm_session.data = (uint8_t *) r->token;
        h->shm_session.len = sizeof r->token;
        h->shm_offset = offset;
}

static void header_for(Client *c, ShardConn *s, const Part *part, Psnet__Header *h, Psnet__MsgType type,
                       int64_t clock, uint64_t seq) {
        wire_header_init(h, type);
        h->has_job = h->has_sender = h->has_seq = h->has_clock = true;
        h->job = c->job.id;
        h->sender = c->worker_id;
        h->seq = seq;
        h->clock = clock;
        h->n_keys = part->nkeys;
        h->keys = s->keyp + part->first;
        if (type == PSNET__MSG_TYPE__MSG_PUSH && s->nparts > 1) {
                h->has_part = h->has_parts = h->has_epoch = true;
                h->part = (uint32_t) (part - s->parts);
                h->parts = (uint32_t) s->nparts;
                h->epoch = c->map_epoch;
        }
        h->has_members_epoch = c->members_epoch != 0;
        h->members_epoch = c->members_epoch;
        h->has_examples = type == PSNET__MSG_TYPE__MSG_PUSH && c->examples != 0;
        h->examples = c->examples;
        h->has_dtype = (type == PSNET__MSG_TYPE__MSG_PUSH && wire_bf16(c) && !pushes_sparse(c)) ||
                       (type == PSNET__MSG_TYPE__MSG_PULL && pulls_bf16(c));
        h->dtype = h->has_dtype ? PSNET__DTYPE__DTYPE_BF16 : PSNET__DTYPE__DTYPE_F32;
        h->has_progress = type == PSNET__MSG_TYPE__MSG_PUSH && c->progress >= 0.0f;
        h->progress = c->progress;
        if (type == PSNET__MSG_TYPE__MSG_PUSH && (c->masked || c->frame_fn)) {
                h->has_codec = true;
                h->codec = c->frame_fn ? (Psnet__Codec) c->codec : PSNET__CODEC__CODEC_MASKED;
        } else if (type == PSNET__MSG_TYPE__MSG_PUSH && pushes_sparse(c)) {
                h->has_codec = true;
                h->codec = PSNET__CODEC__CODEC_TOPK;
        }
}

static float *tensor_at(float *const *tensors, const Job *job, const Psnet__Key *k) {
        return tensors[k->tensor] + (size_t) k->chunk * job->chunk_floats;
}

/* Key k's first float in a set of the client's memory. */
static size_t key_float(const Client *c, const Psnet__Key *k) {
        return c->tensor_base[k->tensor] + (size_t) k->chunk * c->job.chunk_floats;
}

/* Cuts shard s's keys into this round's parts, before any of its requests
 * leaves: parts of at most part_bytes of whole keys (as f32), at most
 * WIRE_MAX_PARTS of them; a federated update, which a shard takes whole, in
 * one. */
static void shard_plan(Client *c, ShardConn *s) {
        size_t per = s->nkeys;
        if (s->nkeys > 1 && c->job.mode != MODE_FED && !c->masked && !c->frame_fn) {
                size_t key_bytes = MAX((size_t) c->job.chunk_floats * sizeof(float), (size_t) 1);
                per = MAX(c->part_bytes / key_bytes, (size_t) 1);
                per = MAX(per, (s->nkeys + WIRE_MAX_PARTS - 1) / WIRE_MAX_PARTS);
        }
        s->nparts = 0;
        size_t before = 0;
        for (size_t first = 0; first < s->nkeys; first += per) {
                Part *part = &s->parts[s->nparts++];
                *part = (Part) { .first = first, .nkeys = MIN(per, s->nkeys - first), .before = before };
                for (size_t i = 0; i < part->nkeys; i++)
                        before += s->keyp[first + i]->len;
        }
}

/* Where part's pulled values lie in shared memory: after the gradients. */
static uint64_t pull_offset(const Client *c, const ShardConn *s, const Part *part) {
        return s->area + part->before * (pulls_bf16(c) ? 2 : sizeof(float));
}

/* A push through shared memory: the part's gradients copied in, one after
 * another where the part's keys lie, and a header that says where. */
static int send_push_shm(Client *c, ShardConn *s, Part *part) {
        bool bf16 = wire_bf16(c);
        uint64_t offset = part->before * (bf16 ? 2 : sizeof(float));
        uint8_t *at = (uint8_t *) s->shm.base + offset;
        for (size_t i = 0; i < part->nkeys; i++) {
                const Psnet__Key *k = s->keyp[part->first + i];
                const float *g = tensor_at((float *const *) c->grads, &c->job, k);
                size_t size = (size_t) k->len * (bf16 ? 2 : sizeof(float));
                if (bf16)
                        bf16_encode(g, k->len, at);
                else
                        memcpy(at, g, size);
                at += size;
                c->stats.bytes_pushed += (uint64_t) size;
        }
        Psnet__Header h;
        part->push.seq = ++c->seq;
        header_for(c, s, part, &h, PSNET__MSG_TYPE__MSG_PUSH, c->push_clock, part->push.seq);
        header_shm(&h, &s->shm, offset);
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

/* Whether part's requests name the client's memory: a round in place to a
 * shard on this host. */
static bool part_in_place(Client *c, ShardConn *s) {
        return c->inplace && shard_mem(c, s);
}

/* Where part's key i lies in set `set` of the client's memory (bytes). */
static uint64_t mem_offset(const Client *c, const ShardConn *s, const Part *part, size_t set, size_t i) {
        return (set * c->set_floats + key_float(c, s->keyp[part->first + i])) * sizeof(float);
}

/* Where part's values go in place: the caller's tensors in set pull_set. */
static uint64_t pull_offset_mem(const Client *c, const ShardConn *s, const Part *part) {
        return mem_offset(c, s, part, c->pull_set, 0);
}

/* A request in place names where its keys lie in set `set` (the caller's
 * tensors): at shm_offset one after another when they follow each other
 * there, else each key's place (shm_keys, in the client's offs until the
 * request is sent). */
static void header_mem(Psnet__Header *h, const Client *c, ShardConn *s, const Part *part, size_t set) {
        header_shm(h, &s->mem, mem_offset(c, s, part, set, 0));
        uint64_t *offs = c->offs;
        bool follow = true;
        for (size_t i = 0; i < part->nkeys; i++) {
                offs[i] = mem_offset(c, s, part, set, i);
                if (i > 0 && offs[i] != offs[i - 1] + (uint64_t) s->keyp[part->first + i - 1]->len * sizeof(float))
                        follow = false;
        }
        h->n_shm_keys = follow ? 0 : part->nkeys;
        h->shm_keys = offs;
}

/* A push in place: the gradients are where the caller left them. */
static int send_push_mem(Client *c, ShardConn *s, Part *part) {
        for (size_t i = 0; i < part->nkeys; i++)
                c->stats.bytes_pushed += (uint64_t) s->keyp[part->first + i]->len * sizeof(float);
        Psnet__Header h;
        part->push.seq = ++c->seq;
        part->push.mem = true;
        header_for(c, s, part, &h, PSNET__MSG_TYPE__MSG_PUSH, c->push_clock, part->push.seq);
        header_mem(&h, c, s, part, 0);
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

static int send_push(Client *c, ShardConn *s, Part *part) {
        bool sparse = pushes_sparse(c);
        part->push.mem = false;
        if (part_in_place(c, s))
                return send_push_mem(c, s, part);
        if (!sparse && shard_shm(c, s))
                return send_push_shm(c, s, part);
        zmq_msg_t *frames = ps_malloc(part->nkeys * sizeof *frames);
        if (!frames)
                return -ENOMEM;
        bool bf16 = wire_bf16(c);
        for (size_t i = 0; i < part->nkeys; i++) {
                const Psnet__Key *k = s->keyp[part->first + i];
                void *p;
                size_t size = (size_t) k->len * sizeof(float);
                int r;
                if (sparse) {
                        /* The key's frame of this clock, shared (ZeroMQ counts the references). */
                        zmq_msg_t *f = NULL;
                        zmq_msg_init(&frames[i]);
                        r = sparse_frame(c, k, c->push_clock, &f);
                        if (r == 0) {
                                r = zmq_msg_copy(&frames[i], f);
                                size = zmq_msg_size(f);
                        } else {
                                errno = -r;
                                r = -1;
                        }
                } else if (bf16) {
                        /* A frame of its own, which ZeroMQ frees once sent. */
                        size = (size_t) k->len * 2;
                        r = zmq_msg_init_size(&frames[i], size);
                        if (r == 0)
                                bf16_encode(tensor_at((float *const *) c->grads, &c->job, k), k->len,
                                            zmq_msg_data(&frames[i]));
                } else {
                        zmq_free_fn *ffn = NULL;
                        void *hint = NULL;
                        if (c->frame_fn) {
                                const void *d = NULL;
                                c->frame_fn(c->frame_ud, k->tensor, k->chunk, &d, &size, &ffn, &hint);
                                p = (void *) d;
                        } else
                                p = tensor_at((float *const *) c->grads, &c->job, k);
                        /* No free function: the buffer is the caller's and outlives the round. */
                        r = zmq_msg_init_data(&frames[i], p, size, ffn, hint);
                        if (r < 0 && ffn) {
                                int e = errno;
                                ffn(p, hint);
                                errno = e;
                        }
                }
                if (r < 0) {
                        r = -errno;
                        for (size_t j = 0; j < i; j++)
                                zmq_msg_close(&frames[j]);
                        ps_free(frames);
                        return r;
                }
                c->stats.bytes_pushed += (uint64_t) size;
        }
        Psnet__Header h;
        part->push.seq = ++c->seq;
        header_for(c, s, part, &h, PSNET__MSG_TYPE__MSG_PUSH, c->push_clock, part->push.seq);
        int r = netsock_send(s->sock, NULL, &h, frames, part->nkeys);
        ps_free(frames);
        return r;
}

static int send_pull(Client *c, ShardConn *s, Part *part) {
        Psnet__Header h;
        part->pull.seq = ++c->seq;
        header_for(c, s, part, &h, PSNET__MSG_TYPE__MSG_PULL, c->pull_clock, part->pull.seq);
        part->pull.mem = part_in_place(c, s);
        if (part->pull.mem)
                header_mem(&h, c, s, part, c->pull_set);
        else if (shard_shm(c, s))
                header_shm(&h, &s->shm, pull_offset(c, s, part));
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

/* Sends shard s's requests that are due, in order: of each kind (push,
 * pull) those among the CLIENT_WINDOW parts from the first one not answered
 * yet. A window that slides only past answered parts (not past one waiting
 * to be sent again) keeps workers in step under BSP, where a part is
 * answered once every worker pushed it: the lowest part not answered yet is
 * in every worker's window. A part's pull leaves only after the round's
 * push of that part: on the one pipe to the shard it then arrives after the
 * push, whose values it reads back (a worker reads its own update under ASP
 * and SSP too). The pulls' window would otherwise run ahead of the pushes'
 * wherever pushes are acknowledged late (a shard with backups acknowledges
 * once they hold the push), and a pull would read a key before its push. */
static int shard_pump(Client *c, ShardConn *s) {
        uint64_t now = now_ms();
        for (int pull = 0; pull < 2; pull++) {
                size_t first = 0;
                while (first < s->nparts) {
                        ReqState st = pull ? s->parts[first].pull.state : s->parts[first].push.state;
                        if (st != REQ_DONE && st != REQ_NONE)
                                break;
                        first++;
                }
                for (size_t i = first; i < s->nparts && i < first + CLIENT_WINDOW; i++) {
                        Part *part = &s->parts[i];
                        PartReq *q = pull ? &part->pull : &part->push;
                        if (q->state != REQ_TODO && !(q->state == REQ_RETRY && now >= q->at))
                                continue;
                        if (pull && (part->push.state == REQ_TODO || part->push.state == REQ_RETRY))
                                continue;
                        int r = pull ? send_pull(c, s, part) : send_push(c, s, part);
                        if (r < 0)
                                return log_error_errno(r, "Failed to %s shard %u at %s: %m",
                                                       pull ? "pull from" : "push to", s->id, s->endpoint);
                        q->state = REQ_SENT;
                }
        }
        return 0;
}

/* Whether any request of the round is still to send, sent or to send again. */
static bool part_open(const PartReq *q) {
        return q->state == REQ_TODO || q->state == REQ_SENT || q->state == REQ_RETRY;
}

static bool shard_open(const ShardConn *s) {
        for (size_t i = 0; i < s->nparts; i++)
                if (part_open(&s->parts[i].push) || part_open(&s->parts[i].pull))
                        return true;
        return false;
}

/* Ends the round in progress: timers stopped, the callback called once. */
static void round_end(Client *c, int r) {
        if (!c->busy)
                return;
        c->busy = false;
        (void) uv_timer_stop(&c->deadline);
        (void) uv_timer_stop(&c->retry);
        for (size_t i = 0; i < c->nshards; i++)
                for (size_t j = 0; j < c->shards[i].nparts; j++)
                        c->shards[i].parts[j].push = c->shards[i].parts[j].pull = (PartReq) { REQ_NONE, 0, 0 };
        int64_t clock = c->min_clock < 0 ? c->pull_clock : c->min_clock;
        if (r < 0)
                client_shm_reset(c);
        if (r == 0) {
                c->stats.wait_s += mono_s() - c->t0;
                c->stats.rounds++;
        }
        ClientRoundFn cb = c->cb;
        c->cb = NULL;
        if (cb)
                cb(c, r, clock, c->cb_ud);
}

static void round_check_done(Client *c) {
        for (size_t i = 0; i < c->nshards; i++)
                if (shard_open(&c->shards[i]))
                        return;
        round_end(c, 0);
}

static void retry_cb(uv_timer_t *t);

/* Sets the retry timer to the earliest scheduled resend (a resend is always
 * within its window: it was sent before, and windows only slide forward).
 * Never 0 ms from here: the timer is re-armed from its own callback, where a
 * timer already due would run again at once. */
static void retry_schedule(Client *c) {
        uint64_t next = UINT64_MAX, now = now_ms();
        for (size_t i = 0; i < c->nshards; i++)
                for (size_t j = 0; j < c->shards[i].nparts; j++) {
                        const Part *part = &c->shards[i].parts[j];
                        if (part->push.state == REQ_RETRY)
                                next = MIN(next, part->push.at);
                        if (part->pull.state == REQ_RETRY)
                                next = MIN(next, part->pull.at);
                }
        if (next == UINT64_MAX)
                (void) uv_timer_stop(&c->retry);
        else
                (void) uv_timer_start(&c->retry, retry_cb, next > now ? next - now : 1, 0);
}

/* Resends what is due and, first thing in every round, looks whether it is
 * already complete (the callback never runs inside client_round). */
static void retry_cb(uv_timer_t *t) {
        Client *c = t->data;
        if (!c->busy)
                return;
        if (c->prefetch_err) {
                int r = c->prefetch_err;
                c->prefetch_err = 0;
                round_end(c, r);
                return;
        }
        for (size_t i = 0; i < c->nshards && c->busy; i++) {
                int r = shard_pump(c, &c->shards[i]);
                if (r < 0) {
                        round_end(c, r);
                        return;
                }
        }
        round_check_done(c);
        if (c->busy)
                retry_schedule(c);
}

static void deadline_cb(uv_timer_t *t) {
        Client *c = t->data;
        for (size_t i = 0; i < c->nshards; i++)
                if (shard_open(&c->shards[i])) {
                        log_error_errno(ETIMEDOUT, "shard %u at %s did not answer within %u s", c->shards[i].id,
                                        c->shards[i].endpoint, c->timeout_ms / 1000);
                        break;
                }
        round_end(c, -ETIMEDOUT);
}

/* Sends request q again after delay_ms: for answers that applied nothing, so
 * the resend cannot apply anything twice. */
static void schedule_retry(Client *c, PartReq *q, unsigned delay_ms) {
        q->state = REQ_RETRY;
        q->at = now_ms() + delay_ms;
        retry_schedule(c);
}

/* Handles one reply from shard s. Returns 0, or a negative errno ending the round. */
static int handle_reply(Client *c, ShardConn *s, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        Part *part = NULL;
        PartReq *q = NULL;
        for (size_t i = 0; i < s->nparts && !q; i++) {
                part = &s->parts[i];
                if (part->push.state == REQ_SENT && part->push.seq == h->seq)
                        q = &part->push;
                else if (part->pull.state == REQ_SENT && part->pull.seq == h->seq)
                        q = &part->pull;
        }
        if (!q)
                return 0; /* a reply to a request given up on */
        bool moved = h->status == PSNET__STATUS__STATUS_MOVED &&
                     (h->type == PSNET__MSG_TYPE__MSG_ERROR || h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK);
        if (moved && h->has_epoch && h->epoch > c->map_epoch) {
                /* The shard map changed: the round is done again under the new map
                 * (pushes already applied come back DUPLICATE, so nothing twice). */
                c->need_epoch = MAX(c->need_epoch, h->epoch);
                log_debug("moved shard=%u epoch=%lu: waiting for the new map", s->id, (unsigned long) h->epoch);
                return -EAGAIN;
        }
        if (moved || h->status == PSNET__STATUS__STATUS_MIGRATING || h->status == PSNET__STATUS__STATUS_UNAVAILABLE) {
                /* The shard has not caught up with the map this worker routes by,
                 * the key is on its way there, or the shard may not acknowledge
                 * now (a fail-over under way): ask again shortly. A push resent
                 * comes back DUPLICATE where it was held already. */
                if (h->status == PSNET__STATUS__STATUS_UNAVAILABLE)
                        c->stats.unavailable++;
                schedule_retry(c, q, 20);
                return 0;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_ERROR) {
                if (h->status == PSNET__STATUS__STATUS_NO_JOB) {
                        /* The shard has not got the job from pscoord yet. Nothing was
                         * applied, so resending cannot apply anything twice. */
                        schedule_retry(c, q, 50);
                        return 0;
                }
                if (h->status == PSNET__STATUS__STATUS_INVALID && h->reason &&
                    strncmp(h->reason, SHM_NO_SESSION, strlen(SHM_NO_SESSION)) == 0) {
                        /* The shard no longer holds this client's session (it
                         * restarted): nothing was applied; another session, and
                         * the request again (the push and the pull both come
                         * back so: the first closes the session). */
                        ShmRegion *r = q->mem ? &s->mem : &s->shm;
                        if (r->base)
                                log_info("shard %u: its shared-memory session is gone: opening another", s->id);
                        shm_region_close(r);
                        if (q->mem)
                                s->mem_tried = false;
                        else
                                s->shm_tried = false;
                        shm_count(c);
                        schedule_retry(c, q, 20);
                        return 0;
                }
                if (h->status == PSNET__STATUS__STATUS_STALE) {
                        /* This worker is no member of that clock: it left the
                         * membership (its lease ran out) and must be admitted again. */
                        log_warning("shard refused request shard=%u status=stale reason=\"%s\"", s->id,
                                    h->reason ? h->reason : "");
                        return -ESTALE;
                }
                log_error("shard refused request shard=%u endpoint=%s status=%s reason=\"%s\"", s->id, s->endpoint,
                          status_name(h->status), h->reason ? h->reason : "");
                return -EPROTO;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK && q == &part->push) {
                q->state = REQ_DONE;
                if (h->status == PSNET__STATUS__STATUS_OK || h->status == PSNET__STATUS__STATUS_DUPLICATE)
                        return 0;
                log_warning("push not applied shard=%u status=%s clock=%ld", s->id, status_name(h->status),
                            (long) h->clock);
                if (h->status == PSNET__STATUS__STATUS_STALE) {
                        /* Its clock closed without it (this worker was not yet or no
                         * longer a member): the gradient is dropped, training goes on. */
                        c->stats.stale_pushes++;
                        return 0;
                }
                return -EPROTO;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_PULL_REP && q == &part->pull) {
                if (h->n_keys != part->nkeys) {
                        log_error("shard %u answered %zu keys for %zu asked", s->id, h->n_keys, part->nkeys);
                        return -EPROTO;
                }
                /* In shared memory: where this client asked, in its own session. */
                const uint8_t *at = NULL;
                bool placed = false;           /* in place: the values are in the caller's tensors already */
                if (h->has_shm_session) {
                        const ShmRegion *r = q->mem ? &s->mem : &s->shm;
                        uint64_t offset = q->mem ? pull_offset_mem(c, s, part) : pull_offset(c, s, part);
                        if (!r->base || h->shm_session.len != sizeof r->token ||
                            memcmp(h->shm_session.data, r->token, sizeof r->token) != 0 || h->shm_offset != offset ||
                            (q->mem && h->dtype != PSNET__DTYPE__DTYPE_F32)) {
                                log_error("shard %u answered in shared memory this client did not offer", s->id);
                                return -EPROTO;
                        }
                        placed = q->mem;
                        at = placed ? NULL : (const uint8_t *) r->base + offset;
                }
                for (size_t i = 0; i < h->n_keys; i++) {
                        const Psnet__Key *k = h->keys[i], *want = s->keyp[part->first + i];
                        if (k->tensor != want->tensor || k->chunk != want->chunk || k->len != want->len) {
                                log_error("shard %u answered key (%u,%u) for (%u,%u)", s->id, k->tensor, k->chunk,
                                          want->tensor, want->chunk);
                                return -EPROTO;
                        }
                        bool bf16 = h->dtype == PSNET__DTYPE__DTYPE_BF16;
                        size_t size = (size_t) k->len * (bf16 ? 2 : sizeof(float));
                        if (!placed) {
                                const void *src = at ? at : zmq_msg_data(&m->frames[i]);
                                if (bf16)
                                        bf16_decode(src, k->len, tensor_at(c->params, &c->job, k));
                                else
                                        memcpy(tensor_at(c->params, &c->job, k), src, size);
                        }
                        if (at)
                                at += size;
                        c->stats.bytes_pulled += (uint64_t) size;
                }
                if (c->min_clock < 0 || h->clock < c->min_clock)
                        c->min_clock = h->clock;
                q->state = REQ_DONE;
        }
        return 0;
}

static void client_on_reply(NetSock *ns, WireMsg *m, int r, void *ud) {
        ShardConn *s = ud;
        Client *c = s->client;
        (void) ns;
        if (!c->busy && !c->prefetching)
                return; /* nothing asked: a late answer */
        if (r < 0) {
                log_error("bad reply from shard %u reason=\"%s\"", s->id, m->reason);
                r = -EPROTO;
        } else
                r = handle_reply(c, s, m);
        /* What the answer leaves room for goes now (a prefetch's next part too). */
        if (r == 0)
                r = shard_pump(c, s);
        if (!c->busy) {
                /* A prefetched pull answered before its round started: the values are
                 * in params; a failure ends that round when it starts. */
                if (r < 0 && !c->prefetch_err)
                        c->prefetch_err = r;
                return;
        }
        if (r < 0)
                round_end(c, r);
        else
                round_check_done(c);
}

/* The set of the client's memory whose tensors are these, or -1. */
static long mem_set(const Client *c, const float *const *tensors) {
        if (!c->mem || !tensors || c->job.ntensors == 0)
                return -1;
        for (size_t k = 0; k < c->nsets; k++) {
                const float *base = (const float *) c->mem->base + k * c->set_floats;
                uint32_t t = 0;
                while (t < c->job.ntensors && tensors[t] == base + c->tensor_base[t])
                        t++;
                if (t == c->job.ntensors)
                        return (long) k;
        }
        return -1;
}

/* Whether a round (or a prefetch: grads NULL, push false) with these tensors
 * runs in place: f32 pushes and pulls of a training job whose gradients are
 * the memory's first set and whose values another set. */
static bool round_in_place(Client *c, const float *const *grads, bool push, float *const *params) {
        if (!c->mem || wire_bf16(c) || pushes_sparse(c) || c->masked || c->frame_fn || c->job.mode == MODE_FED)
                return false;
        if (push && mem_set(c, grads) != 0)
                return false;
        long set = params ? mem_set(c, (const float *const *) params) : -1;
        if (params && set < 1)
                return false;
        c->pull_set = set < 1 ? 1 : (size_t) set;
        return true;
}

int client_pull_begin(Client *c, float *const *params, int64_t pull_clock) {
        if (!c || !params || c->prefetching || c->busy)
                return -EINVAL;
        c->params = params;
        c->pull_clock = pull_clock;
        c->min_clock = -1;
        /* The push that completes the round is in place too, or not at all. */
        c->inplace = round_in_place(c, NULL, false, params);
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                shard_plan(c, s);
                for (size_t j = 0; j < s->nparts; j++) {
                        s->parts[j].push = (PartReq) { REQ_NONE, 0, 0 };
                        s->parts[j].pull = (PartReq) { REQ_TODO, 0, 0 };
                }
                int r = shard_pump(c, s);
                if (r < 0)
                        return r;
        }
        c->pf_params = params;
        c->pf_clock = pull_clock;
        c->prefetching = true;
        c->prefetch_err = 0;
        return 0;
}

int client_round(Client *c, const float *const *grads, int64_t push_clock, float *const *params,
                 int64_t pull_clock, ClientRoundFn cb, void *ud) {
        if (c->busy)
                return -EBUSY;
        /* The pulls of client_pull_begin are in flight (or answered): do not send again. */
        bool pulled = c->prefetching;
        if (pulled && (params != c->pf_params || pull_clock != c->pf_clock))
                return -EINVAL;
        bool inplace = round_in_place(c, grads, grads != NULL, params);
        if (pulled && c->inplace && !inplace && grads)
                return -EINVAL; /* a prefetch in place, completed by a push that is not */
        c->prefetching = false;
        if (!pulled)
                c->inplace = inplace;
        c->grads = grads;
        c->push_clock = push_clock;
        c->params = params;
        c->pull_clock = pull_clock;
        c->cb = cb;
        c->cb_ud = ud;
        c->t0 = mono_s();
        if (!pulled)
                c->min_clock = -1;
        c->busy = true;
        for (size_t i = 0; i < c->nshards; i++) {
                ShardConn *s = &c->shards[i];
                /* A prefetch cut the parts already, and its pulls stay as they are. */
                if (!pulled)
                        shard_plan(c, s);
                for (size_t j = 0; j < s->nparts; j++) {
                        s->parts[j].push = (PartReq) { grads ? REQ_TODO : REQ_NONE, 0, 0 };
                        if (!pulled)
                                s->parts[j].pull = (PartReq) { params ? REQ_TODO : REQ_NONE, 0, 0 };
                }
                int r = shard_pump(c, s);
                if (r < 0) {
                        c->busy = false;
                        return r;
                }
        }
        (void) uv_timer_start(&c->deadline, deadline_cb, c->timeout_ms, 0);
        /* Everything may already be in (a prefetch answered, or no keys at all):
         * the retry timer looks at once, on the next loop turn. */
        (void) uv_timer_start(&c->retry, retry_cb, 0, 0);
        return 0;
}
