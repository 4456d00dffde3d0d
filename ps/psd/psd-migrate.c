/* See psd-migrate.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "errors.h"
#include "log.h"
#include "netsock.h"
#include "psd-migrate.h"
#include "psd-optim.h"

/* A DEALER to another shard, for chunks that move there. */
typedef struct PeerShard {
        char *endpoint;
        NetSock *sock;
} PeerShard;

struct Migrate {
        uv_loop_t *loop;
        void *zctx;
        const NetIdentity *id;
        Store *store;
        uint32_t shard_id;
        PeerShard *peers;
        size_t npeers;
        WireMsg *stash;         /* chunk states that arrived before the map that sends them here */
        size_t nstash;
        uint64_t moved_out, moved_in;
};

int migrate_new(uv_loop_t *loop, void *zctx, const NetIdentity *id, Store *store, uint32_t shard_id,
                Migrate **ret) {
        Migrate *m = ps_calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        *m = (Migrate) { .loop = loop, .zctx = zctx, .id = id, .store = store, .shard_id = shard_id };
        *ret = m;
        return 0;
}

Migrate *migrate_free(Migrate *m) {
        if (!m)
                return NULL;
        for (size_t i = 0; i < m->nstash; i++)
                wire_msg_done(&m->stash[i]);
        ps_free(m->stash);
        for (size_t i = 0; i < m->npeers; i++) {
                netsock_close(m->peers[i].sock);
                ps_free(m->peers[i].endpoint);
        }
        ps_free(m->peers);
        ps_free(m);
        return NULL;
}

uint64_t migrate_moved_out(const Migrate *mg) { return mg->moved_out; }
uint64_t migrate_moved_in(const Migrate *mg) { return mg->moved_in; }

/* --- out ----------------------------------------------------------------------------- */

/* Answers from other shards to the chunk states we sent: only refusals come back. */
static void on_peer_msg(NetSock *ns, WireMsg *m, int r, void *ud) {
        (void) ud;
        if (r == 0 && m->hdr->type == PSNET__MSG_TYPE__MSG_ERROR)
                log_error("shard at %s refused a chunk we sent status=%s reason=\"%s\"", netsock_name(ns),
                          status_name(m->hdr->status), m->hdr->reason ? m->hdr->reason : "");
        else if (r < 0)
                log_warning("bad answer from the shard at %s reason=\"%s\"", netsock_name(ns), m->reason);
}

static NetSock *peer_socket(Migrate *mg, const ShardDesc *dest) {
        for (size_t i = 0; i < mg->npeers; i++)
                if (strcmp(mg->peers[i].endpoint, dest->endpoint) == 0)
                        return mg->peers[i].sock;
        if (mg->id->enabled && !dest->has_public_key) {
                log_error("the map has no key for shard %u at %s", dest->id, dest->endpoint);
                return NULL;
        }
        PeerShard *n = ps_realloc(mg->peers, (mg->npeers + 1) * sizeof *n);
        if (!n)
                return NULL;
        mg->peers = n;
        char *ep = ps_strdup(dest->endpoint);
        NetSock *sock = NULL;
        /* A chunk state is values + optimizer state: unbounded queue, and up to
         * 5 s at close to deliver what is still queued. */
        const NetSockConf nc = { .type = ZMQ_DEALER, .name = dest->endpoint, .linger_ms = 5000,
                                 .keys = mg->id->enabled ? &mg->id->keys : NULL };
        int r = ep ? netsock_new(mg->loop, mg->zctx, &nc, on_peer_msg, mg, &sock) : -ENOMEM;
        if (r == 0)
                r = netsock_connect(sock, dest->endpoint, mg->id->enabled ? dest->public_key : NULL);
        if (r < 0) {
                sock = netsock_close(sock);
                ps_free(ep);
                return NULL;
        }
        mg->peers[mg->npeers++] = (PeerShard) { .endpoint = ep, .sock = sock };
        return sock;
}

void migrate_out(void *userdata, Chunk *c, const ShardDesc *dest) {
        Migrate *mg = userdata;
        Store *s = mg->store;
        size_t per = optim_state_per_value(&s->job.optim);
        zmq_msg_t frames[2];
        NetSock *sock = peer_socket(mg, dest);
        if (!sock) {
                log_error("cannot reach shard %u at %s: chunk (%u,%u) is lost", dest->id, dest->endpoint, c->tensor,
                          c->chunk);
                return;
        }
        if (store_value_msg(s, c, &frames[0]) < 0)
                return;
        if (zmq_msg_init_size(&frames[1], (size_t) c->len * per * sizeof(float)) < 0) {
                zmq_msg_close(&frames[0]);
                return;
        }
        if (per)
                memcpy(zmq_msg_data(&frames[1]), c->state, (size_t) c->len * per * sizeof(float));
        Psnet__Key key = PSNET__KEY__INIT, *keys[1] = { &key };
        key.tensor = c->tensor;
        key.chunk = c->chunk;
        key.len = c->len;
        Psnet__ChunkState cs = PSNET__CHUNK_STATE__INIT;
        cs.has_steps = true;
        cs.steps = c->steps;
        cs.n_last_clocks = c->nlast;
        cs.last_clocks = c->last_clock;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHUNK_STATE);
        h.has_job = h.has_epoch = h.has_clock = h.has_sender = true;
        h.job = s->job.id;
        h.epoch = shardmap_epoch(s->map);
        h.clock = c->clock;
        h.sender = mg->shard_id;
        h.n_keys = 1;
        h.keys = keys;
        h.body_case = PSNET__HEADER__BODY_CHUNK_STATE;
        h.chunk_state = &cs;
        int r = netsock_send(sock, NULL, &h, frames, 2);
        if (r < 0)
                log_error_errno(r, "Failed to send chunk (%u,%u) to shard %u: %m", c->tensor, c->chunk, dest->id);
        else {
                mg->moved_out++;
                log_debug("chunk moved out key=(%u,%u) to=%u clock=%ld", c->tensor, c->chunk, dest->id,
                          (long) c->clock);
        }
}

/* --- in ------------------------------------------------------------------------------ */

/* Installs a chunk state; returns a status for the acknowledgement. */
static int install(Migrate *mg, WireMsg *m) {
        const Psnet__Header *h = m->hdr;
        const Psnet__Key *k = h->keys[0];
        const Psnet__ChunkState *cs = h->chunk_state;
        size_t sbytes = zmq_msg_size(&m->frames[1]);
        /* Copied straight from the received frames into the new chunk. */
        int r = store_install(mg->store, k->tensor, k->chunk, zmq_msg_data(&m->frames[0]), k->len,
                              zmq_msg_data(&m->frames[1]), sbytes / sizeof(float), cs->has_steps ? cs->steps : 0,
                              h->clock, cs->last_clocks, cs->n_last_clocks);
        if (r == -EEXIST)
                return PSNET__STATUS__STATUS_DUPLICATE;
        if (r == -ENOENT)
                return PSNET__STATUS__STATUS_MOVED;
        if (r < 0)
                return r == -EINVAL ? PSNET__STATUS__STATUS_INVALID : status_from_errno(r);
        mg->moved_in++;
        log_debug("chunk moved in key=(%u,%u) clock=%ld", k->tensor, k->chunk, (long) h->clock);
        return PSNET__STATUS__STATUS_OK;
}

int migrate_in(Migrate *mg, WireMsg *m, char *reason, size_t n) {
        Store *s = mg->store;
        Psnet__Header *h = m->hdr;
        if (!s->has_job || h->job != s->job.id || !h->has_clock || h->clock < 0) {
                snprintf(reason, n, "chunk state for another job");
                return PSNET__STATUS__STATUS_INVALID;
        }
        int st = install(mg, m);
        if (st == PSNET__STATUS__STATUS_MOVED && s->map && h->epoch > shardmap_epoch(s->map)) {
                /* Sent under a map this shard has not received yet: keep it for then. */
                WireMsg *ns = ps_realloc(mg->stash, (mg->nstash + 1) * sizeof *ns);
                if (ns) {
                        mg->stash = ns;
                        mg->stash[mg->nstash++] = *m;
                        memset(m, 0, sizeof *m); /* ownership moved */
                        return PSNET__STATUS__STATUS_OK;
                }
        }
        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE) {
                snprintf(reason, n, "chunk (%u,%u) not installed", h->keys[0]->tensor, h->keys[0]->chunk);
                return st;
        }
        return PSNET__STATUS__STATUS_OK;
}

void migrate_retry(Migrate *mg) {
        Store *s = mg->store;
        size_t j = 0;
        for (size_t i = 0; i < mg->nstash; i++) {
                WireMsg *m = &mg->stash[i];
                int st = install(mg, m);
                if (st == PSNET__STATUS__STATUS_MOVED && s->map && m->hdr->epoch > shardmap_epoch(s->map))
                        mg->stash[j++] = *m;
                else {
                        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE)
                                log_error("stashed chunk (%u,%u) could not be installed status=%s",
                                          m->hdr->keys[0]->tensor, m->hdr->keys[0]->chunk, status_name(st));
                        wire_msg_done(m);
                }
        }
        mg->nstash = j;
}
