/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's member registry: the peers (shards, workers, edge workers) by
 * role, id and route, counted, sorted, removed. Below every handler: it
 * knows nothing of the job, the map or the rounds. */
#include "coord-internal.h"

const char *coord_role_noun(Psnet__Role role) {
        return role == PSNET__ROLE__ROLE_SERVER     ? "shard"
               : role == PSNET__ROLE__ROLE_EDGE     ? "edge"
               : role == PSNET__ROLE__ROLE_STRATEGY ? "strategy"
                                                    : "worker";
}

size_t coord_count_role(const Coord *c, Psnet__Role role) {
        size_t n = 0;
        for (size_t i = 0; i < c->npeers; i++)
                n += c->peers[i].role == role;
        return n;
}

Peer *coord_find_peer(Coord *c, Psnet__Role role, uint32_t id) {
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == role && c->peers[i].id == id)
                        return &c->peers[i];
        return NULL;
}

/* The peer that sent a message: matched by its ZeroMQ identity. */
Peer *coord_find_route(Coord *c, const zmq_msg_t *route) {
        size_t n = zmq_msg_size((zmq_msg_t *) route);
        for (size_t i = 0; i < c->npeers; i++) {
                zmq_msg_t *r = &c->peers[i].route;
                if (zmq_msg_size(r) == n && memcmp(zmq_msg_data(r), zmq_msg_data((zmq_msg_t *) route), n) == 0)
                        return &c->peers[i];
        }
        return NULL;
}

void coord_peer_done(Peer *p) {
        zmq_msg_close(&p->route);
        ps_free(p->endpoint);
}

void coord_remove_peer(Coord *c, Peer *p) {
        size_t i = (size_t) (p - c->peers);
        if (p->role == PSNET__ROLE__ROLE_WORKER && p->member && !p->done)
                c->sched_lost = true; /* its share of the epochs goes to the others */
        if (p->role == PSNET__ROLE__ROLE_WORKER && p->id == c->evaluator)
                c->evaluator = 0;
        if (p->role == PSNET__ROLE__ROLE_WORKER)
                for (size_t j = 0; j < c->nprev; j++)
                        if (c->prev_ids[j] == p->id) {
                                memmove(&c->prev_ids[j], &c->prev_ids[j + 1], (c->nprev - j - 1) * sizeof *c->prev_ids);
                                c->nprev--;
                                break;
                        }
        coord_peer_done(p);
        memmove(&c->peers[i], &c->peers[i + 1], (c->npeers - i - 1) * sizeof *p);
        c->npeers--;
}

static int cmp_peer_id(const void *a, const void *b) {
        const Peer *const *x = a, *const *y = b;
        return (*x)->id < (*y)->id ? -1 : (*x)->id > (*y)->id;
}

/* Workers in id order (ranks follow this order); only members when
 * members_only. Caller frees. */
Peer **coord_sorted_workers_sel(Coord *c, bool members_only, size_t *ret_n) {
        size_t n = coord_count_role(c, PSNET__ROLE__ROLE_WORKER), j = 0;
        Peer **v = ps_malloc((n ? n : 1) * sizeof *v);
        if (!v)
                return NULL;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER && (!members_only || c->peers[i].member))
                        v[j++] = &c->peers[i];
        qsort(v, j, sizeof *v, cmp_peer_id);
        *ret_n = j;
        return v;
}

Peer **coord_sorted_workers(Coord *c, size_t *ret_n) {
        return coord_sorted_workers_sel(c, true, ret_n);
}

