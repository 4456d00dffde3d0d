/* SPDX-License-Identifier: Apache-2.0 */
/* libpsnet's data plane (worker/client/client.c) against a fake shard: a
 * ROUTER on the test's own loop that answers what the test scripts (libuv's
 * test/echo-server.c is the idea), over inproc://, no daemon. A round pushes
 * and pulls every key and gets the values the shard sent; UNAVAILABLE and
 * NO_JOB are asked again and then succeed; MOVED under a newer map ends the
 * round -EAGAIN with the epoch to wait for, and the round run again under
 * that map reaches the new shard; STALE is -ESTALE; silence is -ETIMEDOUT;
 * an answer naming other keys is -EPROTO. */
#include <errno.h>
#include <string.h>
#include <uv.h>
#include "client.h"
#include "job.h"
#include "log.h"
#include "netsock.h"
#include "shardmap.h"
#include "tap.h"

typedef enum { ANSWER, UNAVAILABLE_ONCE, NO_JOB_ONCE, MOVED, STALE, SILENT, WRONG_KEY } Script;

typedef struct Shard {
        NetSock *sock;
        uint32_t id;
        Script script;
        int pushes, pulls, refused;
        float value;            /* what a pull answers for every value */
        uint64_t moved_epoch;
} Shard;

static uv_loop_t loop;
static int result = 1;
static bool done;

static void on_round(Client *c, int r, int64_t clock, void *ud) {
        (void) c, (void) clock, (void) ud;
        result = r;
        done = true;
        uv_stop(&loop);
}

static void reply_error(Shard *sh, WireMsg *m, int status, uint64_t epoch) {
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_ERROR);
        h.has_status = h.has_seq = h.has_sender = true;
        h.status = status;
        h.seq = m->hdr->seq;
        h.sender = sh->id;
        h.reason = (char *) "scripted";
        h.has_epoch = epoch != 0;
        h.epoch = epoch;
        (void) netsock_send(sh->sock, &m->route, &h, NULL, 0);
}

static void on_request(NetSock *ns, WireMsg *m, int r, void *ud) {
        Shard *sh = ud;
        (void) ns;
        if (r < 0)
                return;
        Psnet__Header *q = m->hdr;
        bool push = q->type == PSNET__MSG_TYPE__MSG_PUSH;
        sh->pushes += push;
        sh->pulls += !push;
        switch (sh->script) {
        case SILENT:
                return;
        case STALE:
                reply_error(sh, m, PSNET__STATUS__STATUS_STALE, 0);
                return;
        case MOVED:
                reply_error(sh, m, PSNET__STATUS__STATUS_MOVED, sh->moved_epoch);
                return;
        case UNAVAILABLE_ONCE:
        case NO_JOB_ONCE:
                if (sh->refused < 2) { /* the push and the pull, once each */
                        sh->refused++;
                        reply_error(sh, m, sh->script == NO_JOB_ONCE ? PSNET__STATUS__STATUS_NO_JOB
                                                                     : PSNET__STATUS__STATUS_UNAVAILABLE, 0);
                        return;
                }
                break;
        default:
                break;
        }
        Psnet__Header h;
        wire_header_init(&h, push ? PSNET__MSG_TYPE__MSG_PUSH_ACK : PSNET__MSG_TYPE__MSG_PULL_REP);
        h.has_seq = h.has_sender = h.has_clock = h.has_job = true;
        h.seq = q->seq;
        h.sender = sh->id;
        h.clock = q->clock;
        h.job = q->job;
        if (push) {
                (void) netsock_send(sh->sock, &m->route, &h, NULL, 0);
                return;
        }
        Psnet__Key other = PSNET__KEY__INIT, *keys[64];
        size_t n = q->n_keys < 64 ? q->n_keys : 64;
        zmq_msg_t frames[64];
        for (size_t i = 0; i < n; i++) {
                keys[i] = q->keys[i];
                zmq_msg_init_size(&frames[i], (size_t) q->keys[i]->len * sizeof(float));
                float *v = zmq_msg_data(&frames[i]);
                for (uint32_t j = 0; j < q->keys[i]->len; j++)
                        v[j] = sh->value;
        }
        if (sh->script == WRONG_KEY && n > 0) {
                other = *q->keys[0];
                other.chunk += 1;
                keys[0] = &other;
        }
        h.n_keys = n;
        h.keys = keys;
        (void) netsock_send(sh->sock, &m->route, &h, frames, n);
}

static int shard_open(Shard *sh, void *zctx, uint32_t id, const char *endpoint) {
        memset(sh, 0, sizeof *sh);
        sh->id = id;
        const NetSockConf nc = { .type = ZMQ_ROUTER, .name = "fake shard" };
        int r = netsock_new(&loop, zctx, &nc, on_request, sh, &sh->sock);
        return r < 0 ? r : netsock_bind(sh->sock, endpoint);
}

static ShardMap *map_of(const Job *job, uint64_t epoch, uint32_t id, const char *endpoint) {
        ShardDesc d = { .id = id, .endpoint = (char *) endpoint };
        ShardMap *m = NULL;
        return shardmap_place(epoch, &d, 1, job, &m) < 0 ? NULL : m;
}

/* One round of c (push and pull of every key), run until it ends: its result. */
static int round_of(Client *c, float *const *grads, float *const *params) {
        done = false;
        result = 1;
        int r = client_round(c, (const float *const *) grads, 0, params, 1, on_round, NULL);
        if (r < 0)
                return r;
        while (!done)
                uv_run(&loop, UV_RUN_DEFAULT);
        return result;
}

static bool all(float *const *p, const Job *job, float v) {
        for (uint32_t t = 0; t < job->ntensors; t++)
                for (uint64_t i = 0; i < job->tensors[t].numel; i++)
                        if (p[t][i] != v)
                                return false;
        return true;
}

int main(void) {
        log_set_level(LOG_ERR);
        Job job;
        job_defaults(&job);
        (void) job_set_model(&job, "mlp:20-10-5");
        (void) job_set_chunk(&job, 16);
        job.id = 3;
        void *zctx = zmq_ctx_new();
        Shard a, b;
        ShardMap *m1 = map_of(&job, 1, 1, "inproc://shard-a"), *m2 = map_of(&job, 2, 2, "inproc://shard-b");
        if (uv_loop_init(&loop) < 0 || !zctx || !m1 || !m2 || shard_open(&a, zctx, 1, "inproc://shard-a") < 0 ||
            shard_open(&b, zctx, 2, "inproc://shard-b") < 0)
                return CHECK(false, "the fake shards"), tap_done();
        float *grads[4], *params[4];
        for (uint32_t t = 0; t < job.ntensors; t++) {
                grads[t] = calloc(job.tensors[t].numel, sizeof(float));
                params[t] = calloc(job.tensors[t].numel, sizeof(float));
        }
        Client *c = NULL;
        int r = client_new(&loop, zctx, &job, m1, 7, NULL, NULL, &c);
        CHECK(r == 0 && job.ntensors == 4, "a client of the job (%lu keys) on shard a", (unsigned long) job_nkeys(&job));

        a.value = 0.5f;
        r = round_of(c, grads, params);
        CHECK(r == 0 && a.pushes == 1 && a.pulls == 1 && all(params, &job, 0.5f),
              "a round: one push, one pull of every key, the values the shard sent");

        a.script = UNAVAILABLE_ONCE;
        a.value = 0.25f;
        r = round_of(c, grads, params);
        CHECK(r == 0 && a.pushes == 3 && a.pulls == 3 && all(params, &job, 0.25f),
              "UNAVAILABLE: both asked again, then the round completes");
        a.script = NO_JOB_ONCE;
        a.refused = 0;
        a.value = 0.125f;
        r = round_of(c, grads, params);
        CHECK(r == 0 && a.pushes == 5 && all(params, &job, 0.125f), "NO_JOB (a shard without its job yet): the same");

        a.script = STALE;
        r = round_of(c, grads, params);
        CHECK(r == -ESTALE, "STALE: -ESTALE, the worker is no member (%d)", r);

        a.script = SILENT;
        client_set_timeout(c, 300);
        r = round_of(c, grads, params);
        CHECK(r == -ETIMEDOUT, "a shard that does not answer: -ETIMEDOUT after the round's time-out (%d)", r);
        client_set_timeout(c, 10000);

        a.script = WRONG_KEY;
        r = round_of(c, grads, params);
        CHECK(r == -EPROTO, "an answer naming another key: -EPROTO (%d)", r);

        a.script = MOVED;
        a.moved_epoch = 2;
        r = round_of(c, grads, params);
        CHECK(r == -EAGAIN && client_need_epoch(c) == 2, "MOVED under map epoch 2: -EAGAIN, waiting for epoch %lu",
              (unsigned long) client_need_epoch(c));
        b.value = 2.0f;
        r = client_set_map(c, m2);
        if (r == 0)
                r = round_of(c, grads, params);
        CHECK(r == 0 && client_map_epoch(c) == 2 && b.pushes == 1 && b.pulls == 1 && all(params, &job, 2.0f),
              "the round again under epoch 2 reaches shard b");

        c = client_free(c);
        a.sock = netsock_close(a.sock);
        b.sock = netsock_close(b.sock);
        uv_run(&loop, UV_RUN_DEFAULT);
        (void) uv_loop_close(&loop);
        zmq_ctx_term(zctx);
        shardmap_free(m1);
        shardmap_free(m2);
        for (uint32_t t = 0; t < job.ntensors; t++) {
                free(grads[t]);
                free(params[t]);
        }
        return tap_done();
}
