/* SPDX-License-Identifier: Apache-2.0 */
/* See relay.h. The clients live in a hash table by their ROUTER identity;
 * each holds its links (a DEALER per far end it has used, made when it first
 * sends there). The shards' addresses are a table by id, merged from every
 * map pscoord sends: the newest map's address for an id wins, and a link
 * whose shard moved is made again on the next message. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "errors.h"
#include "hash.h"
#include "log.h"
#include "macro.h"
#include "netsock.h"
#include "relay.h"
#include "wire.h"

#define RELAY_MAX_SHARDS 4096

struct LinkRef;

typedef struct Link {
        uint32_t to;                    /* NETMUX_COORD or a shard id */
        NetSock *sock;
        char *endpoint;                 /* where it dialled */
        struct LinkRef *ref;            /* its socket's callback data */
} Link;

typedef struct RClient {
        struct RClient *next;           /* in its bucket */
        Relay *relay;
        zmq_msg_t route;
        uint64_t hash;
        WirePeer peer;                  /* as psgate's handshake admitted it */
        Link *links;
        size_t nlinks, cap;
        uint64_t last_ms;
} RClient;

typedef struct ShardAddr {
        uint32_t id;
        uint64_t epoch;                 /* of the map that said it */
        char *endpoint;
        uint8_t key[32];
        bool has_key;
} ShardAddr;

/* What a link's callback knows: its client and which link (by far end: the
 * array may move). */
typedef struct LinkRef {
        RClient *cl;
        uint32_t to;
} LinkRef;

static const size_t LINK_QUEUE_COORD = 64, LINK_QUEUE_SHARD = 8; /* a pull in 4 parts and an update fit */

struct Relay {
        uv_loop_t *loop;
        void *zctx;
        RelayConfig cfg;
        NetSock *front;
        RClient **buckets;
        size_t nbuckets, nclients;
        ShardAddr *shards;
        size_t nshards, shards_cap;
        uv_timer_t sweep;
        bool sweep_init;
        /* figures */
        uint64_t in_msgs, out_msgs, in_bytes, out_bytes, refused, forgotten, full, maps;
};

static uint64_t msg_bytes(const WireMsg *m) {
        uint64_t b = 0;
        for (size_t i = 0; i < m->nframes; i++)
                b += zmq_msg_size((zmq_msg_t *) &m->frames[i]);
        return b;
}

static uint64_t route_hash(const zmq_msg_t *route) {
        return fnv1a64(FNV1A64_INIT, zmq_msg_data((zmq_msg_t *) route), zmq_msg_size((zmq_msg_t *) route));
}

static bool route_equal(const zmq_msg_t *a, const zmq_msg_t *b) {
        size_t n = zmq_msg_size((zmq_msg_t *) a);
        return n == zmq_msg_size((zmq_msg_t *) b) &&
               memcmp(zmq_msg_data((zmq_msg_t *) a), zmq_msg_data((zmq_msg_t *) b), n) == 0;
}

/* --- the shards' addresses ------------------------------------------------------------ */

static const ShardAddr *shard_addr(const Relay *rl, uint32_t id) {
        for (size_t i = 0; i < rl->nshards; i++)
                if (rl->shards[i].id == id)
                        return &rl->shards[i];
        return NULL;
}

/* Takes the addresses of a map pscoord sent (the newest map's win). */
static void shards_learn(Relay *rl, const Psnet__ShardMap *map) {
        rl->maps++;
        for (size_t i = 0; i < map->n_shards; i++) {
                const Psnet__ShardRef *s = map->shards[i];
                if (!s->has_id || !s->endpoint || !s->endpoint[0])
                        continue;
                ShardAddr *a = (ShardAddr *) shard_addr(rl, s->id);
                if (!a) {
                        if (rl->nshards >= RELAY_MAX_SHARDS ||
                            ps_grow(&rl->shards, &rl->shards_cap, rl->nshards + 1, sizeof *rl->shards, 16) < 0) {
                                log_warning("no room for the address of shard %u: its clients' messages are refused",
                                            s->id);
                                continue;
                        }
                        a = &rl->shards[rl->nshards++];
                        memset(a, 0, sizeof *a);
                        a->id = s->id;
                } else if (map->epoch < a->epoch)
                        continue;
                if (!a->endpoint || strcmp(a->endpoint, s->endpoint) != 0) {
                        char *ep = ps_strdup(s->endpoint);
                        if (!ep)
                                continue;
                        if (a->endpoint)
                                log_info("shard moved shard=%u endpoint=%s epoch=%llu", a->id, ep,
                                         (unsigned long long) map->epoch);
                        ps_free(a->endpoint);
                        a->endpoint = ep;
                }
                a->epoch = map->epoch;
                a->has_key = s->has_public_key && s->public_key.len == 32;
                if (a->has_key)
                        memcpy(a->key, s->public_key.data, 32);
        }
}

/* --- links ---------------------------------------------------------------------------- */

static void link_close(Link *l) {
        l->sock = netsock_close(l->sock);
        l->endpoint = mfree(l->endpoint);
        l->ref = mfree(l->ref);
}

static void client_free(RClient *cl) {
        for (size_t i = 0; i < cl->nlinks; i++)
                link_close(&cl->links[i]);
        ps_free(cl->links);
        zmq_msg_close(&cl->route);
        ps_free(cl);
}

static void on_link_msg(NetSock *s, WireMsg *m, int r, void *ud);

static Link *client_link(RClient *cl, uint32_t to) {
        for (size_t i = 0; i < cl->nlinks; i++)
                if (cl->links[i].to == to)
                        return &cl->links[i];
        return NULL;
}

/* The client's link to `to`, dialled now when it has none (or when the
 * shard moved). NULL with why in reason. */
static Link *link_get(RClient *cl, uint32_t to, char *reason, size_t n) {
        Relay *rl = cl->relay;
        const char *endpoint = rl->cfg.coord;
        const uint8_t *server_key = rl->cfg.id && rl->cfg.id->enabled ? rl->cfg.id->coord_key : NULL;
        if (to != NETMUX_COORD) {
                const ShardAddr *a = shard_addr(rl, to);
                if (!a) {
                        snprintf(reason, n, "psgate has seen no shard map with shard %u", to);
                        return NULL;
                }
                if (rl->cfg.id && rl->cfg.id->enabled && !a->has_key) {
                        snprintf(reason, n, "the shard map has no key for shard %u", to);
                        return NULL;
                }
                endpoint = a->endpoint;
                server_key = rl->cfg.id && rl->cfg.id->enabled ? a->key : NULL;
        }
        Link *l = client_link(cl, to);
        if (l && strcmp(l->endpoint, endpoint) == 0)
                return l;
        if (l)
                link_close(l); /* the shard moved: dialled again below */
        else {
                if (ps_grow(&cl->links, &cl->cap, cl->nlinks + 1, sizeof *cl->links, 4) < 0) {
                        snprintf(reason, n, "out of memory");
                        return NULL;
                }
                l = &cl->links[cl->nlinks++];
                memset(l, 0, sizeof *l);
                l->to = to;
        }
        /* The socket's callback data apart from the link, which moves when
         * the array grows. A few messages queue per link: a client (or a far
         * end) that does not keep up is told UNAVAILABLE, psgate's memory
         * stays bounded. */
        l->ref = ps_calloc(1, sizeof *l->ref);
        l->endpoint = ps_strdup(endpoint);
        int q = (int) (to == NETMUX_COORD ? LINK_QUEUE_COORD : LINK_QUEUE_SHARD);
        const NetSockConf nc = { .type = ZMQ_DEALER, .name = to == NETMUX_COORD ? "pscoord" : "shard",
                                 .linger_ms = 0, .sndhwm = q, .rcvhwm = q,
                                 .keys = rl->cfg.id && rl->cfg.id->enabled ? &rl->cfg.id->keys : NULL };
        int r = -ENOMEM;
        if (l->ref && l->endpoint) {
                *l->ref = (LinkRef) { .cl = cl, .to = to };
                r = netsock_new(rl->loop, rl->zctx, &nc, on_link_msg, l->ref, &l->sock);
        }
        if (r == 0)
                r = netsock_connect(l->sock, endpoint, server_key);
        if (r < 0) {
                snprintf(reason, n, "psgate cannot connect to %s: %s", endpoint, strerror(-r));
                log_warning("%s", reason);
                link_close(l);
                *l = cl->links[--cl->nlinks]; /* the last link takes its place */
                return NULL;
        }
        return l;
}

/* --- clients ---------------------------------------------------------------------------- */

static RClient *client_find(Relay *rl, const zmq_msg_t *route, uint64_t h) {
        for (RClient *cl = rl->buckets[h & (rl->nbuckets - 1)]; cl; cl = cl->next)
                if (cl->hash == h && route_equal(&cl->route, route))
                        return cl;
        return NULL;
}

/* --- the answers: a far end to its client --------------------------------------------- */

static void on_link_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        LinkRef *ref = ud;
        RClient *cl = ref->cl;
        Relay *rl = cl->relay;
        (void) s;
        if (r < 0) {
                log_warning("a bad message from %s for client %s dropped reason=\"%s\"",
                            ref->to == NETMUX_COORD ? "pscoord" : "a shard", cl->peer.name[0] ? cl->peer.name : "-",
                            m->reason);
                return;
        }
        Psnet__Header *h = m->hdr;
        /* pscoord's map for this client: psgate learns where the shards are,
         * the client learns only their ids. */
        Psnet__ShardMap *map = ref->to == NETMUX_COORD && h->body_case == PSNET__HEADER__BODY_CONFIG ? h->config->map
                                                                                                    : NULL;
        char **eps = NULL;
        if (map) {
                shards_learn(rl, map);
                eps = ps_calloc(MAX(map->n_shards, (size_t) 1), sizeof *eps);
                if (!eps) {
                        log_warning("out of memory: a map for client %s dropped", cl->peer.name);
                        return;
                }
                for (size_t i = 0; i < map->n_shards; i++) {
                        eps[i] = map->shards[i]->endpoint;
                        map->shards[i]->endpoint = (char *) "psgate";
                        map->shards[i]->has_public_key = false;
                }
        }
        uint64_t bytes = msg_bytes(m);
        zmq_msg_t to;
        wire_address_init(&to, ref->to);
        int sr = netsock_send_to(rl->front, &cl->route, &to, h, m->frames, m->nframes);
        zmq_msg_close(&to);
        if (map) {
                for (size_t i = 0; i < map->n_shards; i++)
                        map->shards[i]->endpoint = eps[i]; /* the unpacked header frees its own */
                ps_free(eps);
        }
        if (sr < 0) {
                log_debug_errno(sr, "an answer for client %s dropped: %m", cl->peer.name);
                return;
        }
        rl->out_msgs++;
        rl->out_bytes += bytes;
        cl->last_ms = uv_now(rl->loop);
}

/* --- the front door: a client to a far end --------------------------------------------- */

/* An error for the sender, addressed as it came; a message without an
 * address (not a client of psgate's: a psnet peer dialling the wrong
 * place) gets a plain one it can read. */
static void refuse(Relay *rl, const WireMsg *m, int status, uint64_t seq, const char *reason) {
        rl->refused++;
        if (!m->has_route)
                return;
        uint32_t to;
        if (m->has_to && wire_address(&m->to, &to))
                (void) netsock_send_error_to(rl->front, &m->route, &m->to, status, seq, reason);
        else {
                char why[320];
                snprintf(why, sizeof why, "this is psgate, the edge clients' gateway: %s (edge clients dial it with "
                         "--gateway)", reason);
                (void) netsock_send_error(rl->front, &m->route, status, seq, why);
        }
}

/* What an edge client may send to this far end (the message table's, the
 * same with and without keys), and nothing that speaks for another. */
static int front_check(const WireMsg *m, uint32_t to, char *reason, size_t n) {
        const Psnet__Header *h = m->hdr;
        const WireType *t = wire_type(h->type);
        unsigned may = t ? (to == NETMUX_COORD ? t->at_coord : t->at_shard) : 0;
        if (!(may & WIRE_ROLE(PSNET__ROLE__ROLE_EDGE))) {
                snprintf(reason, n, "an edge client does not send %s to %s through psgate", wire_type_name(h->type),
                         to == NETMUX_COORD ? "pscoord" : "a shard");
                return PSNET__STATUS__STATUS_DENIED;
        }
        if (h->has_relay_key || h->relay_name) {
                snprintf(reason, n, "an edge client cannot speak for another (relay_key)");
                return PSNET__STATUS__STATUS_DENIED;
        }
        if (h->body_case == PSNET__HEADER__BODY_REG && h->reg->role != PSNET__ROLE__ROLE_EDGE) {
                snprintf(reason, n, "psgate admits edge clients only");
                return PSNET__STATUS__STATUS_DENIED;
        }
        return PSNET__STATUS__STATUS_OK;
}

static RClient *client_get(Relay *rl, const WireMsg *m, char *reason, size_t n) {
        uint64_t h = route_hash(&m->route);
        RClient *cl = client_find(rl, &m->route, h);
        if (cl)
                return cl;
        if (rl->nclients >= rl->cfg.max_clients) {
                rl->full++;
                snprintf(reason, n, "psgate serves %u clients at most (--max-clients); try another gateway or later",
                         rl->cfg.max_clients);
                return NULL;
        }
        cl = ps_calloc(1, sizeof *cl);
        if (!cl) {
                snprintf(reason, n, "out of memory");
                return NULL;
        }
        cl->relay = rl;
        cl->hash = h;
        cl->peer = m->peer;
        zmq_msg_init(&cl->route);
        (void) zmq_msg_copy(&cl->route, (zmq_msg_t *) &m->route);
        RClient **b = &rl->buckets[h & (rl->nbuckets - 1)];
        cl->next = *b;
        *b = cl;
        rl->nclients++;
        log_debug("client connected key=%s name=%s clients=%zu", cl->peer.fingerprint[0] ? cl->peer.fingerprint : "-",
                  cl->peer.name[0] ? cl->peer.name : "-", rl->nclients);
        return cl;
}

static void on_front_msg(NetSock *s, WireMsg *m, int r, void *ud) {
        Relay *rl = ud;
        char reason[192];
        (void) s;
        uint64_t seq = m->hdr && m->hdr->has_seq ? m->hdr->seq : 0;
        if (r < 0) {
                refuse(rl, m, m->status, seq, m->reason);
                return;
        }
        uint32_t to = 0;
        (void) wire_address(&m->to, &to); /* wire_recv_to refused a message without one */
        int st = front_check(m, to, reason, sizeof reason);
        RClient *cl = st == PSNET__STATUS__STATUS_OK ? client_get(rl, m, reason, sizeof reason) : NULL;
        if (st == PSNET__STATUS__STATUS_OK && !cl)
                st = PSNET__STATUS__STATUS_UNAVAILABLE;
        Link *l = cl ? link_get(cl, to, reason, sizeof reason) : NULL;
        if (cl && !l)
                st = PSNET__STATUS__STATUS_UNAVAILABLE;
        if (st != PSNET__STATUS__STATUS_OK) {
                refuse(rl, m, st, seq, reason);
                return;
        }
        cl->last_ms = uv_now(rl->loop);
        Psnet__Header *h = m->hdr;
        if (cl->peer.role != PSNET__ROLE__ROLE_NONE) {
                h->has_relay_key = true;
                h->relay_key.len = 32;
                h->relay_key.data = cl->peer.key;
                h->relay_name = cl->peer.name;
        }
        uint64_t bytes = msg_bytes(m);
        int sr = netsock_send(l->sock, NULL, h, m->frames, m->nframes);
        /* The header is the receiver's to free: nothing of ours stays in it. */
        h->has_relay_key = false;
        h->relay_key.len = 0;
        h->relay_key.data = NULL;
        h->relay_name = NULL;
        if (sr < 0) {
                snprintf(reason, sizeof reason, "psgate could not pass it on to %s: %s", l->endpoint, strerror(-sr));
                refuse(rl, m, PSNET__STATUS__STATUS_UNAVAILABLE, seq, reason);
                return;
        }
        rl->in_msgs++;
        rl->in_bytes += bytes;
}

/* --- life ------------------------------------------------------------------------------ */

static void on_sweep(uv_timer_t *t) {
        Relay *rl = t->data;
        uint64_t now = uv_now(rl->loop), idle = (uint64_t) rl->cfg.idle_s * 1000;
        for (size_t b = 0; b < rl->nbuckets; b++)
                for (RClient **p = &rl->buckets[b]; *p;) {
                        RClient *cl = *p;
                        if (now - cl->last_ms < idle) {
                                p = &cl->next;
                                continue;
                        }
                        *p = cl->next;
                        rl->nclients--;
                        rl->forgotten++;
                        log_debug("client forgotten (silent %us) name=%s", rl->cfg.idle_s,
                                  cl->peer.name[0] ? cl->peer.name : "-");
                        client_free(cl);
                }
}

int relay_new(uv_loop_t *loop, void *zctx, const RelayConfig *cfg, Relay **ret) {
        Relay *rl = ps_calloc(1, sizeof *rl);
        if (!rl)
                return -ENOMEM;
        rl->loop = loop;
        rl->zctx = zctx;
        rl->cfg = *cfg;
        rl->nbuckets = 64;
        while (rl->nbuckets < (size_t) cfg->max_clients * 2 && rl->nbuckets < (1u << 22))
                rl->nbuckets *= 2;
        rl->buckets = ps_calloc(rl->nbuckets, sizeof *rl->buckets);
        int r = rl->buckets ? 0 : -ENOMEM;
        bool keys = cfg->id && cfg->id->enabled;
        /* A client's queue is bounded: a slow or hostile one holds up no one
         * but itself; heartbeats drop a connection gone silent. */
        const NetSockConf nc = { .type = ZMQ_ROUTER, .name = "front", .addressed = true,
                                 .max_msg = (int64_t) cfg->max_msg, .sndhwm = 1000, .rcvhwm = 1000,
                                 .heartbeat_ms = 5000, .keys = keys ? &cfg->id->keys : NULL, .curve_server = true,
                                 .zap_domain = keys ? "psnet" : NULL };
        if (r == 0)
                r = netsock_new(loop, zctx, &nc, on_front_msg, rl, &rl->front);
        if (r == 0 && (r = netsock_bind(rl->front, cfg->listen)) < 0)
                log_error_errno(r, "Failed to bind %s: %m", cfg->listen);
        if (r == 0 && (r = uv_timer_init(loop, &rl->sweep)) == 0) {
                rl->sweep_init = true;
                rl->sweep.data = rl;
                uint64_t every = MAX((uint64_t) cfg->idle_s * 250, 250);
                r = uv_timer_start(&rl->sweep, on_sweep, every, every);
        }
        if (r < 0) {
                relay_free(rl);
                return r;
        }
        *ret = rl;
        return 0;
}

static void sweep_closed(uv_handle_t *h) {
        ps_free(h->data);
}

Relay *relay_free(Relay *rl) {
        if (!rl)
                return NULL;
        for (size_t b = 0; rl->buckets && b < rl->nbuckets; b++)
                while (rl->buckets[b]) {
                        RClient *cl = rl->buckets[b];
                        rl->buckets[b] = cl->next;
                        client_free(cl);
                }
        ps_free(rl->buckets);
        rl->front = netsock_close(rl->front);
        for (size_t i = 0; i < rl->nshards; i++)
                ps_free(rl->shards[i].endpoint);
        ps_free(rl->shards);
        if (rl->sweep_init) {
                rl->sweep.data = rl;
                uv_close((uv_handle_t *) &rl->sweep, sweep_closed);
        } else
                ps_free(rl);
        return NULL;
}

void relay_metrics(const Relay *rl, MetricsBuf *b) {
        metrics_one(b, "psnet_psgate_clients", "gauge", "Edge clients psgate relays for now.", (double) rl->nclients);
        metrics_one(b, "psnet_psgate_shards_known", "gauge", "Shards whose address psgate has from a map.",
                    (double) rl->nshards);
        metrics_family(b, "psnet_psgate_messages_total", "counter", "Messages relayed, by direction.");
        metrics_sample(b, "psnet_psgate_messages_total", (double) rl->in_msgs, "direction", "in", NULL);
        metrics_sample(b, "psnet_psgate_messages_total", (double) rl->out_msgs, "direction", "out", NULL);
        metrics_family(b, "psnet_psgate_bytes_total", "counter", "Tensor bytes relayed, by direction.");
        metrics_sample(b, "psnet_psgate_bytes_total", (double) rl->in_bytes, "direction", "in", NULL);
        metrics_sample(b, "psnet_psgate_bytes_total", (double) rl->out_bytes, "direction", "out", NULL);
        metrics_one(b, "psnet_psgate_refused_total", "counter",
                    "Client messages refused (malformed, not an edge client's, no room, a far end unknown).",
                    (double) rl->refused);
        metrics_one(b, "psnet_psgate_full_total", "counter", "New clients refused at --max-clients.", (double) rl->full);
        metrics_one(b, "psnet_psgate_forgotten_total", "counter", "Clients forgotten after --idle-timeout of silence.",
                    (double) rl->forgotten);
        metrics_one(b, "psnet_psgate_maps_total", "counter", "Shard maps psgate read on their way to clients.",
                    (double) rl->maps);
}

void relay_status(const Relay *rl, char *buf, size_t n) {
        snprintf(buf, n, "%zu clients, %zu shards known, %llu messages in, %llu out, %llu refused", rl->nclients,
                 rl->nshards, (unsigned long long) rl->in_msgs, (unsigned long long) rl->out_msgs,
                 (unsigned long long) rl->refused);
}
