/* SPDX-License-Identifier: Apache-2.0 */
/* A federated client's update before it leaves; see edge-update.h. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include "alloc.h"
#include "compress.h"
#include "edge-update.h"
#include "fed.h"
#include "macro.h"

struct EdgeBlock {
        atomic_uint refs;
        size_t bytes;
        uint8_t data[];
};

static void block_unref(EdgeBlock *b) {
        if (b && atomic_fetch_sub(&b->refs, 1) == 1)
                ps_free(b);
}

/* zmq_free_fn: a frame of the block is sent or dropped. */
static void block_frame_gone(void *data, void *hint) {
        (void) data;
        block_unref(hint);
}

int edge_update_alloc(EdgeUpdate *u, const Job *job) {
        if (u->block)
                return 0;
        uint32_t nt = job->ntensors;
        CompressKind ck = job->fed.compress;
        size_t values = (size_t) job_nfloats(job) * sizeof(float), frames = 0;
        if (ck != COMPRESS_NONE) {
                u->cstride = (compress_bound(ck, job->chunk_floats, job->fed.topk) + 7) & ~(size_t) 7;
                for (uint32_t t = 0; t < nt; t++)
                        frames += (size_t) job->tensors[t].nchunks * u->cstride;
        }
        u->block = ps_malloc(sizeof(EdgeBlock) + MAX(values + frames, (size_t) 1));
        u->t = ps_calloc(MAX(nt, 1u), sizeof *u->t);
        if (ck != COMPRESS_NONE) {
                u->cbuf = ps_calloc(MAX(nt, 1u), sizeof *u->cbuf);
                u->csize = ps_calloc(MAX(nt, 1u), sizeof *u->csize);
                if (!u->scratch)
                        u->scratch = ps_malloc((size_t) job->chunk_floats * sizeof(float));
        }
        bool ok = u->block && u->t && (ck == COMPRESS_NONE || (u->cbuf && u->csize && u->scratch));
        if (u->block) {
                atomic_init(&u->block->refs, 1);
                u->block->bytes = values + frames;
        }
        size_t at = 0;
        for (uint32_t t = 0; ok && t < nt; t++) {
                u->t[t] = (float *) (u->block->data + at);
                at += (size_t) job->tensors[t].numel * sizeof(float);
        }
        for (uint32_t t = 0; ok && ck != COMPRESS_NONE && t < nt; t++) {
                uint32_t nk = job->tensors[t].nchunks;
                u->cbuf[t] = u->block->data + at;
                at += (size_t) nk * u->cstride;
                ok = (u->csize[t] = ps_calloc(MAX(nk, 1u), sizeof **u->csize)) != NULL;
        }
        if (!ok) {
                edge_update_release(u, job);
                return -ENOMEM;
        }
        return 0;
}

void edge_update_release(EdgeUpdate *u, const Job *job) {
        for (uint32_t t = 0; u->csize && t < job->ntensors; t++)
                ps_free(u->csize[t]);
        u->csize = mfree(u->csize);
        u->cbuf = mfree(u->cbuf);
        u->t = mfree(u->t);
        block_unref(u->block);
        u->block = NULL;
}

void edge_update_free(EdgeUpdate *u, const Job *job) {
        edge_update_release(u, job);
        for (uint32_t t = 0; u->resid && t < job->ntensors; t++)
                ps_free(u->resid[t]);
        u->resid = mfree(u->resid);
        u->scratch = mfree(u->scratch);
}

int edge_update_prepare(EdgeUpdate *u, const Job *job) {
        uint32_t nt = job->ntensors;
        double sq = 0;
        u->clipped = false;
        u->norm = 0;
        u->bytes = 0;
        if (!u->block)
                return -EINVAL;
        for (uint32_t t = 0; t < nt; t++) {
                size_t n = job->tensors[t].numel;
                for (size_t i = 0; i < n; i++)
                        if (!isfinite(u->t[t][i]))
                                return -ERANGE;
                double nv = fed_norm2(u->t[t], n);
                sq += nv * nv;
        }
        u->norm = sqrt(sq);
        float clip = job->fed.strategy.dp_clip;
        if (clip > 0 && u->norm > clip) {
                float scale = (float) (clip / u->norm);
                for (uint32_t t = 0; t < nt; t++)
                        for (size_t i = 0; i < job->tensors[t].numel; i++)
                                u->t[t][i] *= scale;
                u->clipped = true;
        }
        CompressKind ck = job->fed.compress;
        if (ck == COMPRESS_NONE) {
                u->bytes = job_nfloats(job) * sizeof(float);
                return 0;
        }
        if (ck == COMPRESS_TOPK && !u->resid) {
                float **resid = ps_calloc(MAX(nt, 1u), sizeof *resid);
                bool ok = resid != NULL;
                for (uint32_t t = 0; ok && t < nt; t++)
                        ok = (resid[t] = ps_calloc(MAX(job->tensors[t].numel, (uint64_t) 1), sizeof(float))) != NULL;
                for (uint32_t t = 0; !ok && resid && t < nt; t++)
                        ps_free(resid[t]);
                if (!ok) {
                        ps_free(resid);
                        return -ENOMEM;
                }
                u->resid = resid;
        }
        for (uint32_t t = 0; t < nt; t++)
                for (uint32_t k = 0; k < job->tensors[t].nchunks; k++) {
                        size_t at = (size_t) k * job->chunk_floats;
                        uint32_t len = job_chunk_len(job, t, k);
                        u->csize[t][k] = compress_encode(ck, u->t[t] + at, len, job->fed.topk,
                                                         u->resid ? u->resid[t] + at : NULL,
                                                         u->cbuf[t] + (size_t) k * u->cstride, u->scratch);
                        u->bytes += u->csize[t][k];
                }
        return 0;
}

void edge_update_frame(const EdgeUpdate *u, const Job *job, uint32_t t, uint32_t k, const void **ret_data,
                       size_t *ret_size, void (**ret_free)(void *data, void *hint), void **ret_hint) {
        if (u->cbuf) {
                *ret_data = u->cbuf[t] + (size_t) k * u->cstride;
                *ret_size = u->csize[t][k];
        } else {
                *ret_data = u->t[t] + (size_t) k * job->chunk_floats;
                *ret_size = (size_t) job_chunk_len(job, t, k) * sizeof(float);
        }
        atomic_fetch_add(&u->block->refs, 1);
        *ret_free = block_frame_gone;
        *ret_hint = u->block;
}
