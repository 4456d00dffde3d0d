/* SPDX-License-Identifier: Apache-2.0 */
/* A worker's PUSH made into the gate's Push; see psd-push.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "alloc.h"
#include "compress.h"
#include "macro.h"
#include "psd-push.h"

static const char *codec_name(int codec) {
        static const char *const names[] = { "raw", "masked", "bf16", "int8", "topk" };
        return codec >= 0 && codec < (int) ELEMENTSOF(names) ? names[codec] : "?";
}

/* A push in shared memory becomes frames of its own (f32, or bf16 widened
 * later as a bf16 push in frames is): copied out once, so that what the gate
 * checks is what it applies whatever the worker writes meanwhile, and parked
 * pushes, backups and checkpoints see an ordinary push. A status. */
static int from_shm(PushSource *src, char *reason, size_t n) {
        Psnet__Header *h = src->m->hdr;
        bool bf16 = h->dtype == PSNET__DTYPE__DTYPE_BF16;
        _cleanup_free_ uint8_t **at = shm_server_keys(src->shm, h, bf16 ? 2 : sizeof(float), reason, n);
        if (!at)
                return PSNET__STATUS__STATUS_INVALID;
        /* wire_msg_done frees the array with free(). */
        zmq_msg_t *frames = malloc(MAX(h->n_keys, (size_t) 1) * sizeof *frames);
        if (!frames) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                size_t size = (size_t) h->keys[i]->len * (bf16 ? 2 : sizeof(float));
                if (zmq_msg_init_size(&frames[i], size) < 0) {
                        for (size_t j = 0; j < i; j++)
                                zmq_msg_close(&frames[j]);
                        free(frames);
                        snprintf(reason, n, "out of memory");
                        return PSNET__STATUS__STATUS_RESOURCE;
                }
                pfor_copy(src->store->pool, zmq_msg_data(&frames[i]), at[i], size, STORE_MIN_COPY);
        }
        src->m->frames = frames;
        src->m->nframes = h->n_keys;
        h->has_shm_session = h->has_shm_offset = false;
        h->n_shm_keys = 0;
        return PSNET__STATUS__STATUS_OK;
}

/* --sparsify frames (CODEC_TOPK, sizes checked by wire_validate) become
 * dense f32 frames. A status: a frame whose indices are out of order or
 * range, or whose values are not finite, is refused whole. */
static int from_topk(WireMsg *m, char *reason, size_t n) {
        Psnet__Header *h = m->hdr;
        for (size_t i = 0; i < h->n_keys; i++) {
                zmq_msg_t f;
                uint32_t len = h->keys[i]->len;
                if (zmq_msg_init_size(&f, (size_t) len * sizeof(float)) < 0) {
                        snprintf(reason, n, "out of memory");
                        return PSNET__STATUS__STATUS_RESOURCE;
                }
                int r = compress_decode(COMPRESS_TOPK, zmq_msg_data(&m->frames[i]), zmq_msg_size(&m->frames[i]), len,
                                        zmq_msg_data(&f));
                if (r < 0) {
                        zmq_msg_close(&f);
                        snprintf(reason, n, "the sparse gradient of key (%u,%u) %s", h->keys[i]->tensor,
                                 h->keys[i]->chunk,
                                 r == -ERANGE ? "holds NaN or infinity" : "has indices out of order or range");
                        return r == -ERANGE ? PSNET__STATUS__STATUS_NOT_FINITE : PSNET__STATUS__STATUS_INVALID;
                }
                zmq_msg_close(&m->frames[i]);
                zmq_msg_init(&m->frames[i]);
                zmq_msg_move(&m->frames[i], &f);
        }
        h->codec = PSNET__CODEC__CODEC_RAW;
        return PSNET__STATUS__STATUS_OK;
}

/* bf16 frames widened to f32 in place; with backups, the bf16 ones kept for
 * them (shared, not copied). */
static int from_bf16(PushSource *src, size_t nbackups, char *reason, size_t n) {
        WireMsg *m = src->m;
        Psnet__Header *h = m->hdr;
        if (nbackups > 0) {
                src->wire16 = ps_malloc(MAX(h->n_keys, (size_t) 1) * sizeof *src->wire16);
                for (size_t i = 0; src->wire16 && i < h->n_keys; i++, src->nwire16++) {
                        zmq_msg_init(&src->wire16[i]);
                        if (zmq_msg_copy(&src->wire16[i], &m->frames[i]) < 0) {
                                zmq_msg_close(&src->wire16[i]);
                                break;
                        }
                }
        }
        if ((nbackups > 0 && src->nwire16 < h->n_keys) || store_frames_to_f32(src->store, m->frames, h) < 0) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        h->dtype = PSNET__DTYPE__DTYPE_F32;
        return PSNET__STATUS__STATUS_OK;
}

static int push_decode(Push *p, void *ud, char *reason, size_t n) {
        PushSource *src = ud;
        WireMsg *m = src->m;
        Psnet__Header *h = m->hdr;
        /* A training job's pushes are f32 or bf16 frames, or with --sparsify
         * top-k frames; the other codecs are a federated update's. */
        if (h->codec != PSNET__CODEC__CODEC_RAW &&
            (h->codec != PSNET__CODEC__CODEC_TOPK || !(src->store->job.sparsify > 0.0f))) {
                snprintf(reason, n, "codec %s on a push of a training job%s", codec_name(h->codec),
                         h->codec == PSNET__CODEC__CODEC_TOPK ? " that was not started with --sparsify"
                                                              : " (dense f32 or bf16, or top-k with --sparsify)");
                return PSNET__STATUS__STATUS_INVALID;
        }
        bool bf16 = h->dtype == PSNET__DTYPE__DTYPE_BF16, shm = h->has_shm_session;
        p->bytes = 0;
        for (size_t i = 0; i < h->n_keys; i++)
                p->bytes += shm ? (uint64_t) h->keys[i]->len * (bf16 ? 2 : 4) : zmq_msg_size(&m->frames[i]);
        uint32_t backups[JOB_MAX_REPLICAS];
        size_t nbackups = store_backups(src->store, backups, ELEMENTSOF(backups));
        int st = PSNET__STATUS__STATUS_OK;
        if (shm && !bf16 && h->codec == PSNET__CODEC__CODEC_RAW && nbackups == 0) {
                /* Read where it lies, one key at a time (gate_push_request). */
                src->at = shm_server_keys(src->shm, h, sizeof(float), reason, n);
                if (!src->at)
                        return PSNET__STATUS__STATUS_INVALID;
                p->at = src->at;
                p->frames = NULL;
                return st;
        }
        if (shm)
                st = from_shm(src, reason, n);
        if (st == PSNET__STATUS__STATUS_OK && h->codec == PSNET__CODEC__CODEC_TOPK)
                st = from_topk(m, reason, n);
        if (st == PSNET__STATUS__STATUS_OK && h->dtype == PSNET__DTYPE__DTYPE_BF16) {
                st = from_bf16(src, nbackups, reason, n);
                p->forward = src->wire16;
                p->forward_bf16 = src->wire16 != NULL;
        }
        p->frames = m->frames;
        return st;
}

void push_from_message(Push *p, PushSource *src, Store *s, ShmServer *shm, WireMsg *m, Chunk **chunks,
                       const uint8_t *sender_key) {
        *src = (PushSource) { .store = s, .shm = shm, .m = m };
        *p = (Push) { .h = m->hdr, .route = &m->route, .sender_key = sender_key, .chunks = chunks,
                      .frames = m->frames, .decode = push_decode, .decode_ud = src };
}

void push_source_done(PushSource *src) {
        for (size_t i = 0; i < src->nwire16; i++)
                zmq_msg_close(&src->wire16[i]);
        src->wire16 = mfree(src->wire16);
        src->nwire16 = 0;
        src->at = mfree(src->at);
}
