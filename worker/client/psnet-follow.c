/* SPDX-License-Identifier: Apache-2.0 */
/* What every libpsnet client takes from pscoord and tells it; see psnet-follow.h. */
#include <errno.h>
#include <string.h>
#include "hash.h"
#include "log.h"
#include "alloc.h"
#include "modeldesc.h"
#include "psnet-follow.h"
#include "wire-job.h"

/* pm as a map of f's job (job set), or NULL after logging why not. */
static ShardMap *map_of_job(const Job *job, const Psnet__ShardMap *pm) {
        ShardMap *m;
        if (shardmap_from_proto(pm, &m) < 0) {
                log_error("pscoord sent a shard map that does not validate");
                return NULL;
        }
        if (!shardmap_fits_job(m, job)) {
                log_error("pscoord sent a shard map of other keys than its job's");
                return shardmap_free(m);
        }
        return m;
}

int follow_job(Follow *f, const Psnet__Config *ctl) {
        char err[192];
        if (f->has_job || !ctl->job || !ctl->map)
                return 0;
        Job job;
        if (job_from_proto(ctl->job, &job, err, sizeof err) < 0) {
                log_error("pscoord sent a job that does not validate reason=\"%s\"", err);
                return -EINVAL;
        }
        ShardMap *m = map_of_job(&job, ctl->map);
        if (!m)
                return -EINVAL;
        f->job = job;
        f->map = m;
        f->has_job = true;
        return 1;
}

int follow_map(Follow *f, const Psnet__Config *ctl) {
        if (!f->has_job || !ctl->map || (ctl->job && ctl->job->id != f->job.id) ||
            (f->map && ctl->map->epoch <= shardmap_epoch(f->map)))
                return 0;
        ShardMap *m = map_of_job(&f->job, ctl->map);
        if (!m)
                return -EINVAL;
        shardmap_free(f->map);
        f->map = m;
        return 1;
}

bool follow_state(Follow *f, const Psnet__Config *ctl) {
        JobState st;
        if (job_state_from_proto(ctl->job_state, &st) < 0)
                return false;
        f->state = st;
        f->has_state = true;
        return true;
}

bool follow_ended(const Follow *f) {
        return f->has_state && job_state_final(f->state);
}

PsnetJobState follow_public_state(const Follow *f) {
        switch (f->has_state ? f->state : JOB_WAITING) {
        case JOB_RUNNING: return PSNET_JOB_RUNNING;
        case JOB_DONE: return PSNET_JOB_DONE;
        case JOB_STOPPED: return PSNET_JOB_STOPPED;
        case JOB_FAILED: return PSNET_JOB_FAILED;
        case JOB_WAITING: break;
        }
        return PSNET_JOB_WAITING;
}

void follow_done(Follow *f) {
        f->map = shardmap_free(f->map);
        f->has_job = false;
}

uint64_t follow_digest(const Job *job, float *const *params) {
        uint64_t d = FNV1A64_INIT;
        for (size_t t = 0; params && t < job->ntensors; t++)
                if (params[t])
                        d = fnv1a64(d, params[t], job->tensors[t].numel * sizeof(float));
        return d;
}

int follow_result(Session *s, const Job *job, Psnet__WorkerInfo *wi, float *const *params, unsigned timeout_ms,
                  SessionReplyFn cb, void *ud) {
        Psnet__Header h;
        Psnet__Result res = PSNET__RESULT__INIT;
        if (wi->has_accuracy && params) {
                wi->has_weights_digest = true;
                wi->weights_digest = follow_digest(job, params);
        }
        res.worker = wi;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_RESULT);
        h.body_case = PSNET__HEADER__BODY_RESULT;
        h.result = &res;
        return session_request(s, &h, PSNET__MSG_TYPE__MSG_RESULT_REP, timeout_ms, cb, ud);
}

int follow_identity(NetIdentity *id, const char *keys_dir, const char *key_name, const char *server_key_name,
                    Psnet__Role role) {
        char err[512];
        if (keys_identity_load(id, keys_dir, key_name, server_key_name, role, err, sizeof err) < 0) {
                log_error("cannot use the keys reason=\"%s\"", err);
                return -EINVAL;
        }
        return 0;
}

int follow_session(uv_loop_t *loop, void *zctx, const char *coord, Psnet__Role role, const char *keys_dir,
                   const char *key_name, const char *default_key, const char *coord_key_name,
                   unsigned connect_timeout_ms, NetIdentity *id, NetMux *via, const SessionOps *ops, void *ud,
                   Session **ret) {
        if (keys_dir && follow_identity(id, keys_dir, key_name ? key_name : default_key,
                                        coord_key_name ? coord_key_name : "pscoord", role) < 0)
                return -EINVAL;
        const SessionConf sc = {
                .endpoint = coord, .role = role, .connect_timeout_ms = connect_timeout_ms ? connect_timeout_ms : 10000,
                .keys = id->enabled ? &id->keys : NULL, .coord_key = id->enabled ? id->coord_key : NULL, .via = via,
                .own_context = role == PSNET__ROLE__ROLE_WORKER, /* a worker's heartbeats apart from its shard links */
        };
        int r = session_new(loop, zctx, &sc, ops, ud, ret);
        return r < 0 ? r : session_start(*ret);
}

const char *follow_reason(const WireMsg *m, int r) {
        return m && m->hdr && m->hdr->reason ? m->hdr->reason : strerror(-r);
}

int follow_model_json(const Follow *f, char *buf, size_t n) {
        if (!f->has_job)
                return -ENOENT;
        ModelDesc *d = ps_calloc(1, sizeof *d);
        if (!d)
                return -ENOMEM;
        char err[256];
        int r = modeldesc_parse(f->job.model, d, err, sizeof err);
        if (r == 0)
                r = modeldesc_json(d, buf, n);
        ps_free(d);
        return r;
}
