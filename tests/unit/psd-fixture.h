/* SPDX-License-Identifier: Apache-2.0 */
/* What the store's and the gate's unit tests share (test-store.c,
 * test-gate.c): acknowledgements collected from the gate, a small job and map,
 * a store and its gate opened on them, pushes built as psd builds them, and an independent
 * reference copy of a chunk updated with optim_apply. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <zmq.h>
#include "job.h"
#include "psd-gate.h"
#include "shardmap.h"

#define ST_OK PSNET__STATUS__STATUS_OK
#define ST_UNKNOWN_KEY PSNET__STATUS__STATUS_UNKNOWN_KEY
#define ST_MOVED PSNET__STATUS__STATUS_MOVED
#define ST_SIZE PSNET__STATUS__STATUS_SIZE
#define ST_NO_JOB PSNET__STATUS__STATUS_NO_JOB
#define ST_DUPLICATE PSNET__STATUS__STATUS_DUPLICATE
#define ST_STALE PSNET__STATUS__STATUS_STALE
#define ST_INVALID PSNET__STATUS__STATUS_INVALID
#define ST_SHUTTING_DOWN PSNET__STATUS__STATUS_SHUTTING_DOWN

/* chunk_floats 16 on mlp:20-10-5 gives W0 [10x20] = 200 floats in 13 chunks
 * (the last one 8 floats), b0 10 floats, W1 [5x10] = 50 floats in 4 chunks (the
 * last one 2 floats), b1 5 floats: 19 keys, full chunks and short tails (the
 * short ones are small enough for ZeroMQ to keep them inside the zmq_msg_t). */
#define CHUNK_FLOATS 16
#define MODEL "mlp:20-10-5"
#define MAXLEN CHUNK_FLOATS

#define MAX_ACKS 256

typedef struct Ack {
        uint64_t seq;
        uint32_t worker;
        int64_t clock;
        int status;
        char route[16];
} Ack;

typedef struct Acks {
        Ack a[MAX_ACKS];
        size_t n, overflow;
} Acks;

/* The test's own copy of a chunk: values and optimizer state, updated with
 * optim_apply exactly as the formulas say, independently of the store. */
typedef struct Ref {
        const Job *job;
        uint32_t len;
        float *w, *state;
        uint64_t steps;
} Ref;

void on_ack(void *userdata, PushReq *req);
size_t acks_count(const Acks *k, uint64_t seq);
int acks_status(const Acks *k, uint64_t seq);
void make_job(Job *job, uint32_t id, ConsistencyMode mode, const char *optim);
ShardMap *make_map(uint64_t epoch, const uint32_t *ids, size_t n, const Job *job);
/* A shard's store and the gate over it (the gate holds the store). */
Gate *open_store(uint32_t id, const Job *job, const ShardMap *map, Acks *acks);
/* The same with other hooks (a test's own answer, forward). */
Gate *open_shard(uint32_t id, const Job *job, const ShardMap *map, const GateHooks *gh);
Gate *open_solo(const Job *job, Acks *acks, const uint32_t *members, size_t n);
/* The gate, then its store. NULL is fine. */
Gate *shard_free(Gate *g);
Chunk *key(Gate *g, uint32_t t, uint32_t k);
Chunk *store_key(Store *s, uint32_t t, uint32_t k);
float *fbuf(size_t n);
void route_msg(zmq_msg_t *m, uint32_t worker);
PushReq *req_new(uint32_t worker, int64_t clock, uint64_t seq);
int req_push(Gate *s, PushReq *req, Chunk *c, const float *g);
int push1(Gate *s, Chunk *c, uint32_t worker, int64_t clock, uint64_t seq, const float *g);
void ref_init(Ref *r, const Job *job, uint32_t t, uint32_t k);
void ref_step(Ref *r, const float *g);
void ref_done(Ref *r);
bool same(const float *a, const float *b, uint32_t n);
void grad_fill(float *g, uint32_t len, uint32_t w, int64_t c);
