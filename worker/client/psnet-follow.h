/* SPDX-License-Identifier: Apache-2.0 */
/* What every kind of libpsnet client (a training worker, psnet-worker.c; a
 * federated edge client, psnet-edge.c) takes from pscoord and tells it in
 * the same way: the job and the shard map out of a CONFIG (the job once,
 * then each newer map of it, checked before use), the job's state, and the
 * job's result with a digest of the weights evaluated. Internal to
 * libpsnet. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "job.h"
#include "keys.h"
#include "psnet.h"
#include "session.h"
#include "shardmap.h"

typedef struct Follow {
        Job job;
        bool has_job;
        ShardMap *map;          /* the newest map of the job (NULL before the job) */
        JobState state;
        bool has_state;
} Follow;

/* Takes ctl's job and map when ctl carries both and f has no job yet:
 * 1 taken, 0 nothing to take, -EINVAL (logged: a job or map that does not
 * validate, or a map of other keys than the job's; f unchanged). */
int follow_job(Follow *f, const Psnet__Config *ctl);
/* Takes ctl's map when it is a newer map of f's job: 1 taken, 0 nothing to
 * take, -EINVAL (logged; the old map stays). */
int follow_map(Follow *f, const Psnet__Config *ctl);
/* Takes ctl's job state when it carries one: whether it did. */
bool follow_state(Follow *f, const Psnet__Config *ctl);
/* Whether pscoord has said the job ended (done, stopped, failed). */
bool follow_ended(const Follow *f);
/* The job's state as psnet.h says it (WAITING until pscoord said one). */
PsnetJobState follow_public_state(const Follow *f);
void follow_done(Follow *f);

/* FNV-1a 64 over the bytes of the job's tensors in params, tensor after
 * tensor (NULL ones skipped): equal digests, equal weights. */
uint64_t follow_digest(const Job *job, float *const *params);
/* The job's model description as JSON, every field spelled out
 * (psnet_job_model_json's). -ENOSPC if it does not fit n, -ENOENT before the
 * job. */
int follow_model_json(const Follow *f, char *buf, size_t n);
/* MSG_RESULT with wi (whose digest is set from params when has_accuracy
 * and params), answered by MSG_RESULT_REP to cb within timeout_ms. */
int follow_result(Session *s, const Job *job, Psnet__WorkerInfo *wi, float *const *params, unsigned timeout_ms,
                  SessionReplyFn cb, void *ud);

/* A client's identity from keys_dir: its key key_name in role, and the
 * public key of the server it dials (pscoord's or psgate's) in
 * id->coord_key. -EINVAL (logged) when they do not load. */
int follow_identity(NetIdentity *id, const char *keys_dir, const char *key_name, const char *server_key_name,
                    Psnet__Role role);
/* A client's pscoord session, started: its identity loaded from keys_dir
 * first when keys_dir is set (key_name, else default_key; pscoord's
 * coord_key_name, else "pscoord"), then registered as role within
 * connect_timeout_ms (0: 10 s), through via when not NULL (psgate). 0,
 * -EINVAL for keys that do not load (logged), or the session's error. */
int follow_session(uv_loop_t *loop, void *zctx, const char *coord, Psnet__Role role, const char *keys_dir,
                   const char *key_name, const char *default_key, const char *coord_key_name,
                   unsigned connect_timeout_ms, NetIdentity *id, NetMux *via, const SessionOps *ops, void *ud,
                   Session **ret);
/* What a failed request to pscoord says: its reason, else r's. */
const char *follow_reason(const WireMsg *m, int r);
