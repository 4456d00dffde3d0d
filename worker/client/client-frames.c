/* SPDX-License-Identifier: Apache-2.0 */
/* Requests whose values travel in ZeroMQ frames (client-internal.h's
 * ClientTransport client_frames): f32 sent zero-copy from the caller's
 * buffers, bf16 (--wire bf16) encoded into frames of their own, top-k
 * (--sparsify) encoded once per push clock with error feedback, or a
 * federated update's frames as its caller encoded them; pulls answered in
 * frames. */
#include <errno.h>
#include <string.h>
#include "alloc.h"
#include "client-internal.h"
#include "compress.h"

/* --sparsify: each key's push encoded once per push clock (a resend, or the
 * round run again under a new map, sends the same frame, so the error
 * feedback counts each gradient once), just before it goes to its shard (so
 * that one shard applies while the next one's keys are encoded). */
struct Sparse {
        float *resid;                  /* what earlier pushes left out, job_nfloats */
        float *scratch;                /* chunk_floats */
        uint8_t *buf;                  /* compress_bound bytes */
        size_t *key_base;              /* per tensor: its first key's index */
        size_t *float_base;            /* per tensor: its first value's index */
        zmq_msg_t *frames;             /* per key, encoded */
        int64_t *clock;                /* per key: the push clock its frame holds (-1: none) */
        size_t nkeys;
};

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

static int frames_push(Client *c, ShardConn *s, Part *part) {
        bool sparse = client_pushes_sparse(c);
        zmq_msg_t *frames = ps_malloc(part->nkeys * sizeof *frames);
        if (!frames)
                return -ENOMEM;
        bool bf16 = client_wire_bf16(c);
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
                                bf16_encode(client_tensor_at((float *const *) c->grads, &c->job, k), k->len,
                                            zmq_msg_data(&frames[i]));
                } else {
                        zmq_free_fn *ffn = NULL;
                        void *hint = NULL;
                        if (c->frame_fn) {
                                const void *d = NULL;
                                c->frame_fn(c->frame_ud, k->tensor, k->chunk, &d, &size, &ffn, &hint);
                                p = (void *) d;
                        } else
                                p = client_tensor_at((float *const *) c->grads, &c->job, k);
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
        client_header(c, s, part, &h, true);
        int r = netsock_send(s->sock, NULL, &h, frames, part->nkeys);
        ps_free(frames);
        return r;
}

static int frames_pull(Client *c, ShardConn *s, Part *part) {
        Psnet__Header h;
        client_header(c, s, part, &h, false);
        return netsock_send(s->sock, NULL, &h, NULL, 0);
}

static int frames_take(Client *c, ShardConn *s, Part *part, const Psnet__Header *h, const WireMsg *m) {
        (void) s, (void) part;
        bool bf16 = h->dtype == PSNET__DTYPE__DTYPE_BF16;
        for (size_t i = 0; i < h->n_keys; i++)
                client_take_key(c, h->keys[i], zmq_msg_data((zmq_msg_t *) &m->frames[i]), bf16);
        return 0;
}

void client_frames_free(Client *c) {
        c->sparse = sparse_free(c->sparse);
}

const ClientTransport client_frames = {
        .name = "frames", .send_push = frames_push, .send_pull = frames_pull, .take_values = frames_take,
};
