/* SPDX-License-Identifier: Apache-2.0 */
/* A worker's PUSH as it came, made into what the gate takes (psd-gate.h's
 * Push): one path whatever it came as. Frames of f32 are taken as they
 * are; bf16 frames are widened (the backups get the bf16 ones, half the
 * bytes); top-k frames (--sparsify) are decoded to dense f32; shared memory
 * (a session and offsets instead of frames) is read where it lies key by
 * key when the push is f32 and has no backup to go to, else copied out into
 * frames once. The decoding runs inside gate_push_request, after the sender
 * is admitted: nothing is widened or copied for a stranger. */
#pragma once
#include "psd-gate.h"
#include "psd-shm.h"
#include "wire.h"

/* What the decoding needs and makes (push_source_done frees it). */
typedef struct PushSource {
        Store *store;
        ShmServer *shm;         /* NULL: no shared memory here */
        WireMsg *m;
        uint8_t **at;           /* read in place: where each key lies */
        zmq_msg_t *wire16;      /* bf16 with backups: the frames as they came, for them */
        size_t nwire16;
} PushSource;

/* p, for m (its keys' chunks looked up, sender_key the connection's CURVE
 * key or NULL), ready for gate_push_request with src as its decoder's. */
void push_from_message(Push *p, PushSource *src, Store *s, ShmServer *shm, WireMsg *m, Chunk **chunks,
                       const uint8_t *sender_key);
void push_source_done(PushSource *src);
