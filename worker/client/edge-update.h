/* SPDX-License-Identifier: Apache-2.0 */
/* A federated client's update between its training and the shards
 * (psnet-edge.c): the buffers the caller writes it into, and what the job
 * asks of it before it leaves, the same for every client: its L2 norm,
 * clipping to the job's --dp-clip, a check that every value is finite, and
 * the job's --compress codec chunk by chunk with error feedback (top-k keeps
 * what it leaves out for the next update). Pure functions of the job and
 * the buffers, tested without sockets (tests/unit/test-edge.c).
 *
 * The values and the encoded frames are one block of memory, reference
 * counted: the frames ZeroMQ sends from it (zero-copy) hold it, so that it
 * is freed only once the client has let it go and ZeroMQ has sent, or
 * dropped, the last of them, whatever became of the push. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "job.h"

typedef struct EdgeBlock EdgeBlock;

typedef struct EdgeUpdate {
        EdgeBlock *block;       /* the values and the encoded frames (NULL: no update held) */
        float **t;              /* per tensor, numel floats each, in block */
        uint8_t **cbuf;         /* --compress: per tensor, nchunks * cstride bytes, in block */
        size_t **csize;         /* --compress: per tensor and chunk, the encoded bytes */
        size_t cstride;
        float **resid;          /* --compress topk: what earlier updates left out, per tensor (NULL: none yet) */
        float *scratch;         /* chunk_floats, for top-k */
        /* what edge_update_prepare found */
        double norm;            /* before clipping */
        bool clipped;
        uint64_t bytes;         /* as sent: encoded, or f32 */
} EdgeUpdate;

/* The buffers for job's update: 0 (also when held already), or -ENOMEM
 * with none held. */
int edge_update_alloc(EdgeUpdate *u, const Job *job);
/* Lets the update's block go (freed once no frame holds it); the error
 * feedback stays for the next update. */
void edge_update_release(EdgeUpdate *u, const Job *job);
/* Lets everything go, error feedback too. */
void edge_update_free(EdgeUpdate *u, const Job *job);
/* Readies u->t to leave: norm, clipped to job->fed.strategy.dp_clip when
 * over it, then encoded chunk by chunk under job->fed.compress. -ERANGE when
 * a value is NaN or infinite (nothing encoded), -ENOMEM. */
int edge_update_prepare(EdgeUpdate *u, const Job *job);
/* The frame of chunk k of tensor t as it leaves (the encoded bytes, or the
 * f32 or masked values), with a reference to the block that *ret_free(data,
 * *ret_hint) drops (ZeroMQ's zmq_free_fn). */
void edge_update_frame(const EdgeUpdate *u, const Job *job, uint32_t t, uint32_t k, const void **ret_data,
                       size_t *ret_size, void (**ret_free)(void *data, void *hint), void **ret_hint);
