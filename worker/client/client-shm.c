/* SPDX-License-Identifier: Apache-2.0 */
/* Requests whose values travel through same-host shared memory (common/net/
 * shm.h), the two transports of client-internal.h besides frames:
 * client_shm, through memory of each shard's own that the caller's tensors
 * are copied into and out of; client_inplace, through the caller's own
 * tensors in memory every shard on this host shares (psnet_worker_memory),
 * read and written where they lie. The sessions with each shard, opened on
 * first use and fenced when a round fails, and the caller's memory's layout
 * live here too. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "client-internal.h"
#include "compress.h"
#include "endpoint.h"
#include "log.h"
#include "shm.h"

/* How long a failed round waits in all for the shards to end their sessions
 * over the client's memory. */
#define CLIENT_FENCE_MS 2000u

/* Shards reached through shared memory of either kind now. */
void client_shm_count(Client *c) {
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
bool client_shm_reaches(Client *c, ShardConn *s) {
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
        client_shm_count(c);
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
        client_shm_count(c);
        log_debug("shard %u: the worker's tensors lie in %zu bytes of shared memory", s->id, s->mem.size);
        return true;
}

/* Ends every session over the client's memory and waits until each shard
 * ended its end, so that no request given up on reads or writes the
 * caller's tensors after the caller takes them back. */
void client_mem_fence(Client *c) {
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
        client_shm_count(c);
}

/* After a failed round a shard may still read or write a session's memory
 * for requests given up on: the next round opens new ones (of the shard's
 * own memory; the client's memory is fenced, as the caller's tensors are
 * the caller's again). */
void client_shm_reset(Client *c) {
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

/* Key k's first float in a set of the client's memory. */
static size_t key_float(const Client *c, const Psnet__Key *k) {
        return c->tensor_base[k->tensor] + (size_t) k->chunk * c->job.chunk_floats;
}

/* Where part's pulled values lie in shared memory: after the gradients. */
static uint64_t pull_offset(const Client *c, const ShardConn *s, const Part *part) {
        return s->area + part->before * (client_pulls_bf16(c) ? 2 : sizeof(float));
}

/* A push through shared memory: the part's gradients copied in, one after
 * another where the part's keys lie, and a header that says where. */
static int shm_push(Client *c, ShardConn *s, Part *part) {
        bool bf16 = client_wire_bf16(c);
        uint64_t offset = part->before * (bf16 ? 2 : sizeof(float));
        uint8_t *at = (uint8_t *) s->shm.base + offset;
        for (size_t i = 0; i < part->nkeys; i++) {
                const Psnet__Key *k = s->keyp[part->first + i];
                const float *g = client_tensor_at((float *const *) c->grads, &c->job, k);
                size_t size = (size_t) k->len * (bf16 ? 2 : sizeof(float));
                if (bf16)
                        bf16_encode(g, k->len, at);
                else
                        memcpy(at, g, size);
                at += size;
                c->stats.bytes_pushed += (uint64_t) size;
        }
        Psnet__Header h;
        client_header(c, s, part, &h, true);
        header_shm(&h, &s->shm, offset);
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

/* Whether part's requests name the client's memory: a round in place to a
 * shard on this host. */
bool client_inplace_reaches(Client *c, ShardConn *s) {
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
static int inplace_push(Client *c, ShardConn *s, Part *part) {
        for (size_t i = 0; i < part->nkeys; i++)
                c->stats.bytes_pushed += (uint64_t) s->keyp[part->first + i]->len * sizeof(float);
        Psnet__Header h;
        client_header(c, s, part, &h, true);
        header_mem(&h, c, s, part, 0);
        return netsock_send(s->sock, NULL, &h, NULL, 0);
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
bool client_round_in_place(Client *c, const float *const *grads, bool push, float *const *params) {
        if (!c->mem || client_wire_bf16(c) || client_pushes_sparse(c) || c->masked || c->frame_fn || c->job.mode == MODE_FED)
                return false;
        if (push && mem_set(c, grads) != 0)
                return false;
        long set = params ? mem_set(c, (const float *const *) params) : -1;
        if (params && set < 1)
                return false;
        c->pull_set = set < 1 ? 1 : (size_t) set;
        return true;
}

static int shm_pull(Client *c, ShardConn *s, Part *part) {
        Psnet__Header h;
        client_header(c, s, part, &h, false);
        header_shm(&h, &s->shm, pull_offset(c, s, part));
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

static int inplace_pull(Client *c, ShardConn *s, Part *part) {
        Psnet__Header h;
        client_header(c, s, part, &h, false);
        header_mem(&h, c, s, part, c->pull_set);
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

/* Whether h answers in region r at offset, the session this client offered. */
static bool answered_here(const ShardConn *s, const ShmRegion *r, const Psnet__Header *h, uint64_t offset) {
        if (r->base && h->shm_session.len == sizeof r->token &&
            memcmp(h->shm_session.data, r->token, sizeof r->token) == 0 && h->shm_offset == offset)
                return true;
        log_error("shard %u answered in shared memory this client did not offer", s->id);
        return false;
}

/* The values where this client asked, in the shard's own memory: copied out. */
static int shm_take(Client *c, ShardConn *s, Part *part, const Psnet__Header *h, const WireMsg *m) {
        (void) m;
        uint64_t offset = pull_offset(c, s, part);
        if (!answered_here(s, &s->shm, h, offset))
                return -EPROTO;
        bool bf16 = h->dtype == PSNET__DTYPE__DTYPE_BF16;
        const uint8_t *at = (const uint8_t *) s->shm.base + offset;
        for (size_t i = 0; i < h->n_keys; i++) {
                client_take_key(c, h->keys[i], at, bf16);
                at += (size_t) h->keys[i]->len * (bf16 ? 2 : sizeof(float));
        }
        return 0;
}

/* In place: the values are in the caller's tensors already. */
static int inplace_take(Client *c, ShardConn *s, Part *part, const Psnet__Header *h, const WireMsg *m) {
        (void) m;
        if (!answered_here(s, &s->mem, h, pull_offset_mem(c, s, part)))
                return -EPROTO;
        if (h->dtype != PSNET__DTYPE__DTYPE_F32) {
                log_error("shard %u answered a pull in place in bf16", s->id);
                return -EPROTO;
        }
        for (size_t i = 0; i < h->n_keys; i++)
                c->stats.bytes_pulled += (uint64_t) h->keys[i]->len * sizeof(float);
        return 0;
}

/* The shard no longer holds this client's session (it restarted): nothing
 * was applied; another session, and the request again (the push and the
 * pull both come back so: the first closes the session). */
static void session_gone(Client *c, ShardConn *s, ShmRegion *r, bool *tried) {
        if (r->base)
                log_info("shard %u: its shared-memory session is gone: opening another", s->id);
        shm_region_close(r);
        *tried = false;
        client_shm_count(c);
}

static void shm_lost(Client *c, ShardConn *s) {
        session_gone(c, s, &s->shm, &s->shm_tried);
}

static void inplace_lost(Client *c, ShardConn *s) {
        session_gone(c, s, &s->mem, &s->mem_tried);
}

void client_shm_close(ShardConn *s) {
        shm_region_close(&s->shm);
}

const ClientTransport client_shm = {
        .name = "shm", .send_push = shm_push, .send_pull = shm_pull, .take_values = shm_take, .session_lost = shm_lost,
};

const ClientTransport client_inplace = {
        .name = "in place", .send_push = inplace_push, .send_pull = inplace_pull, .take_values = inplace_take,
        .session_lost = inplace_lost,
};
