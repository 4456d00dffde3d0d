/* SPDX-License-Identifier: Apache-2.0 */
/* What every request of the shards' data plane says, whichever way it goes
 * (client-internal.h): its header, and where its keys lie in the caller's
 * tensors. */
#include <string.h>
#include "client-internal.h"
#include "compress.h"

bool client_pushes_sparse(const Client *c) {
        return c->job.sparsify > 0.0f && c->job.mode != MODE_FED && !c->masked && !c->frame_fn;
}

bool client_wire_bf16(const Client *c) {
        return c->job.wire == JOB_WIRE_BF16 && !c->masked && !c->frame_fn;
}

bool client_pulls_bf16(const Client *c) {
        return client_wire_bf16(c) && !c->pull_f32;
}

float *client_tensor_at(float *const *tensors, const Job *job, const Psnet__Key *k) {
        return tensors[k->tensor] + (size_t) k->chunk * job->chunk_floats;
}

void client_take_key(Client *c, const Psnet__Key *k, const void *src, bool bf16) {
        size_t size = (size_t) k->len * (bf16 ? 2 : sizeof(float));
        if (bf16)
                bf16_decode(src, k->len, client_tensor_at(c->params, &c->job, k));
        else
                memcpy(client_tensor_at(c->params, &c->job, k), src, size);
        c->stats.bytes_pulled += (uint64_t) size;
}

void client_header(Client *c, ShardConn *s, Part *part, Psnet__Header *h, bool push) {
        Psnet__MsgType type = push ? PSNET__MSG_TYPE__MSG_PUSH : PSNET__MSG_TYPE__MSG_PULL;
        uint64_t seq = ++c->seq;
        int64_t clock = push ? c->push_clock : c->pull_clock;
        if (push)
                part->push.seq = seq;
        else
                part->pull.seq = seq;
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
        h->has_update_of = type == PSNET__MSG_TYPE__MSG_PULL && c->update_of != 0;
        h->update_of = c->update_of;
        h->has_strategy_delta = h->strategy_delta = type == PSNET__MSG_TYPE__MSG_PUSH && c->strategy_delta;
        h->has_examples = type == PSNET__MSG_TYPE__MSG_PUSH && c->examples != 0;
        h->examples = c->examples;
        h->has_dtype = (type == PSNET__MSG_TYPE__MSG_PUSH && client_wire_bf16(c) && !client_pushes_sparse(c)) ||
                       (type == PSNET__MSG_TYPE__MSG_PULL && client_pulls_bf16(c));
        h->dtype = h->has_dtype ? PSNET__DTYPE__DTYPE_BF16 : PSNET__DTYPE__DTYPE_F32;
        h->has_progress = type == PSNET__MSG_TYPE__MSG_PUSH && c->progress >= 0.0f;
        h->progress = c->progress;
        if (type == PSNET__MSG_TYPE__MSG_PUSH && (c->masked || c->frame_fn)) {
                h->has_codec = true;
                h->codec = c->frame_fn ? (Psnet__Codec) c->codec : PSNET__CODEC__CODEC_MASKED;
        } else if (type == PSNET__MSG_TYPE__MSG_PUSH && client_pushes_sparse(c)) {
                h->has_codec = true;
                h->codec = PSNET__CODEC__CODEC_TOPK;
        }
}

