/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's shard map: built when the job starts, changed by psctl shard
 * add/remove, and published with the job and the membership to every peer. */
#include "coord-internal.h"

/* Sends job, map, membership and state to one peer. */
static int send_config(Coord *c, Peer *p, Psnet__JobSpec *spec, Psnet__ShardMap *pm,
                       Psnet__Membership *mem, uint32_t nworkers) {
        Psnet__Header h;
        Psnet__Config ctl = PSNET__CONFIG__INIT;
        Psnet__Membership prev = PSNET__MEMBERSHIP__INIT;
        ctl.job = spec;
        ctl.map = pm;
        ctl.members = mem;
        ctl.job_state = job_state_to_proto(c->state);
        if (p->role == PSNET__ROLE__ROLE_WORKER) {
                ctl.has_rank = ctl.has_nworkers = ctl.has_start_clock = true;
                ctl.rank = p->rank;
                ctl.nworkers = nworkers;
                ctl.start_clock = p->start_clock;
                ctl.has_drain = p->drain;
                ctl.drain = p->drain;
        }
        if (p->role == PSNET__ROLE__ROLE_SERVER && pm) {
                ctl.has_first_map = true;
                ctl.first_map = c->map_epoch == c->first_map_epoch;
        }
        Psnet__Checkpoint rs = PSNET__CHECKPOINT__INIT;
        if (c->restore.active && p->role == PSNET__ROLE__ROLE_SERVER) {
                rs.name = (char *) c->restore.name;
                rs.dir = (char *) c->restore.dir;
                rs.has_clock = true;
                rs.clock = c->restore.clock;
                ctl.restore = &rs;
        }
        if (c->switch_clock > 0 && p->role == PSNET__ROLE__ROLE_SERVER) {
                prev.epoch = mem->epoch;
                prev.n_workers = c->nprev;
                prev.workers = c->prev_ids;
                ctl.prev_members = &prev;
        }
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &ctl;
        return coord_reply_hdr(c, &p->route, &h, 0);
}

/* Publishes the current job, map and membership to every shard and worker. */
/* Sends the job, map and membership to every peer, or to only. */
static void publish(Coord *c, Peer *only) {
        Psnet__JobSpec *spec = NULL;
        size_t nw = 0;
        _cleanup_free_ Peer **workers = coord_sorted_workers(c, &nw);
        _cleanup_free_ uint32_t *ids = ps_malloc((nw ? nw : 1) * sizeof *ids);
        _cleanup_free_ int64_t *starts = ps_malloc((nw ? nw : 1) * sizeof *starts);
        _cleanup_free_ ProtobufCBinaryData *keys = ps_calloc(nw ? nw : 1, sizeof *keys);
        Psnet__ShardMap *pm = NULL;
        Psnet__Membership mem = PSNET__MEMBERSHIP__INIT;

        if (!workers || !ids || !starts || !keys || job_to_proto(&c->job, &spec) < 0) {
                log_error("out of memory while publishing the configuration");
                return;
        }
        for (size_t i = 0; i < nw; i++) {
                ids[i] = workers[i]->id;
                starts[i] = workers[i]->start_clock;
                keys[i] = (ProtobufCBinaryData) { .len = 32, .data = workers[i]->public_key };
                workers[i]->rank = (uint32_t) i;
        }
        mem.epoch = c->members_epoch;
        mem.n_workers = nw;
        mem.workers = ids;
        mem.n_start_clocks = nw;
        mem.start_clocks = starts;
        /* With CURVE the shards check that a push comes from the member's own key. */
        mem.n_keys = c->id.enabled ? nw : 0;
        mem.keys = keys;
        mem.has_from_clock = true;
        mem.from_clock = c->switch_clock;
        mem.has_base_clock = mem.has_samples_before = true;
        mem.base_clock = c->sched.base_clock;
        mem.samples_before = c->sched.samples_before;
        if (c->map && shardmap_to_proto(c->map, &pm) < 0) {
                log_error("out of memory while publishing the configuration");
                job_proto_free(spec);
                return;
        }
        /* Shards first, so a worker's first request finds its shard configured. */
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < c->npeers; i++) {
                        Peer *p = &c->peers[i];
                        /* A federated job's strategy process (--strategy custom) is
                         * told as an edge worker is: the job and the map. */
                        bool edge = (p->role == PSNET__ROLE__ROLE_EDGE || p->role == PSNET__ROLE__ROLE_STRATEGY) &&
                                    c->job.mode == MODE_FED;
                        if ((p->role != (pass == 0 ? PSNET__ROLE__ROLE_SERVER : PSNET__ROLE__ROLE_WORKER) &&
                             !(pass == 1 && edge)) ||
                            (only && p != only) || p->detached)
                                continue;
                        if (p->role == PSNET__ROLE__ROLE_WORKER && !p->member)
                                continue; /* joins at the next boundary */
                        /* Edge workers of a federated job: the job and the map, no
                         * membership (the rounds say who trains, coord-fed.c). */
                        int r = send_config(c, p, c->map ? spec : NULL, pm, edge ? NULL : &mem, (uint32_t) nw);
                        if (r < 0)
                                log_warning_errno(r, "Failed to send configuration to peer=%u: %m", p->id);
                }
        job_proto_free(spec);
        shardmap_proto_free(pm);
}

void coord_publish(Coord *c) { publish(c, NULL); }
void coord_publish_peer(Coord *c, Peer *p) { publish(c, p); }

int coord_build_map(Coord *c) {
        size_t n = coord_count_role(c, PSNET__ROLE__ROLE_SERVER), j = 0;
        _cleanup_free_ ShardDesc *d = ps_calloc(n ? n : 1, sizeof *d);
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER) {
                        d[j].id = c->peers[i].id;
                        d[j].endpoint = c->peers[i].endpoint;
                        memcpy(d[j].public_key, c->peers[i].public_key, 32);
                        d[j].has_public_key = c->peers[i].has_key;
                        j++;
                }
        ShardMap *m;
        int r = shardmap_place(++c->map_epoch, d, n, &c->job, &m);
        if (r < 0)
                return r;
        shardmap_set_replicas(m, coord_replicas(c, n));
        shardmap_free(c->map);
        c->map = m;
        return 0;
}

/* A new map epoch over the current map's shards plus add (0: none) minus
 * remove (0: none); endpoints come from the registered peers, else the old map. */
int coord_remap(Coord *c, uint32_t add, uint32_t remove) {
        size_t n = c->map ? shardmap_size(c->map) : 0, j = 0;
        _cleanup_free_ ShardDesc *d = ps_calloc(n + 1, sizeof *d);
        if (!d)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const ShardDesc *sd = shardmap_shard(c->map, i);
                if (sd->id == remove)
                        continue;
                Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, sd->id);
                d[j] = *sd;
                if (p) {
                        d[j].endpoint = p->endpoint;
                        memcpy(d[j].public_key, p->public_key, 32);
                        d[j].has_public_key = p->has_key;
                }
                j++;
        }
        if (add) {
                Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, add);
                if (!p)
                        return -ENOENT;
                d[j].id = add;
                d[j].endpoint = p->endpoint;
                memcpy(d[j].public_key, p->public_key, 32);
                d[j].has_public_key = p->has_key;
                j++;
        }
        ShardMap *m;
        int r = shardmap_change(c->map, c->map_epoch + 1, d, j, &c->job, &m);
        if (r < 0)
                return r;
        shardmap_set_replicas(m, coord_replicas(c, j));
        /* Table rows move to a new shard, and from a removed one where they
         * have one copy (else its backups take over, as at a fail-over). */
        if (c->job.ntables > 0 && (add || (c->map && shardmap_replicas(c->map) < 2))) {
                c->rows_moves++;
                c->rows_move_epoch = c->map_epoch + 1;
                c->rows_leaving = remove;
        }
        c->map_epoch++;
        shardmap_free(c->map);
        c->map = m;
        return 0;
}

uint32_t coord_replicas(const Coord *c, size_t n) {
        /* A federated job keeps one copy unless --replicas asks for more
         * (each round's close then copies the chunks to their backups). */
        uint32_t r = c->job.replicas ? c->job.replicas : n >= 2 && c->job.mode != MODE_FED ? 2 : 1;
        return (size_t) r > n ? (uint32_t) n : r;
}

bool coord_rows_whole(const Coord *c, uint32_t shard) {
        for (size_t i = 0; i < c->nrows_whole; i++)
                if (c->rows_whole[i].shard == shard)
                        return c->rows_whole[i].epoch >= c->map_epoch;
        return c->failovers == 0 && c->rows_moves == 0;
}

bool coord_rows_settled(const Coord *c) {
        for (size_t i = 0; c->map && i < shardmap_size(c->map); i++)
                if (!coord_rows_whole(c, shardmap_shard(c->map, i)->id))
                        return false;
        return true;
}

const char *coord_rows_unmovable(const Coord *c) {
        if (c->ckpt.active)
                return "a checkpoint is being written: ask again once it is done";
        if (!coord_rows_settled(c))
                return "table rows still move or are copied after the last map change (psctl status --json: "
                       "rows_whole_epoch): ask again shortly";
        return NULL;
}

/* Whether the table rows a shard would hold once shard is added (its
 * share) or removed (the shards left, sharing its rows) pass its
 * --memory-limit, by what the shards last said they hold (their own rows'
 * bytes, each row on R copies, shared evenly); why in need. */
static bool rows_over_limit(const Coord *c, uint32_t shard, bool add, char *need, size_t n) {
        size_t ns = shardmap_size(c->map), after = add ? ns + 1 : ns - 1;
        uint64_t bytes = 0;
        for (size_t i = 0; i < ns; i++) {
                const Peer *q = coord_find_peer((Coord *) c, PSNET__ROLE__ROLE_SERVER, shardmap_shard(c->map, i)->id);
                bytes += q && q->shard.has_rows_bytes ? q->shard.rows_bytes : 0;
        }
        if (after == 0)
                return false;
        uint64_t share = bytes * coord_replicas(c, after) / after;
        for (size_t i = 0; i < (add ? 1 : ns); i++) { /* the new shard; each shard left */
                uint32_t id = add ? shard : shardmap_shard(c->map, i)->id;
                if (!add && id == shard)
                        continue;
                const Peer *p = coord_find_peer((Coord *) c, PSNET__ROLE__ROLE_SERVER, id);
                if (!p || !p->memory_limit || share <= p->memory_limit)
                        continue;
                char a[32], l[32];
                if (add)
                        snprintf(need, n, "its share of the table rows, about %s, passes its --memory-limit %s",
                                 bytes_human(share, a, sizeof a), bytes_human(p->memory_limit, l, sizeof l));
                else
                        snprintf(need, n, "shard %u's share of the table rows once it is gone, about %s, passes its "
                                 "--memory-limit %s", id, bytes_human(share, a, sizeof a),
                                 bytes_human(p->memory_limit, l, sizeof l));
                return true;
        }
        return false;
}

void coord_handle_shard_change(Coord *c, WireMsg *m, bool add) {
        char reason[256];
        const Psnet__ShardRef *ctl = m->hdr->shard;
        uint32_t id = ctl->has_id ? ctl->id : 0;
        if (ctl->endpoint) /* named by address: the registered shard advertising it */
                for (size_t i = 0; i < c->npeers; i++)
                        if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER && c->peers[i].endpoint &&
                            strcmp(c->peers[i].endpoint, ctl->endpoint) == 0)
                                id = c->peers[i].id;
        if (id == 0) {
                snprintf(reason, sizeof reason, "no registered shard %s%.64s",
                         ctl->endpoint ? "at " : "", ctl->endpoint ? ctl->endpoint : "(give an id or address)");
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        bool in_map = c->map && shardmap_find(c->map, id) >= 0;
        const char *why = NULL;
        if (c->state != JOB_RUNNING && c->state != JOB_WAITING)
                why = "no job is running";
        else if (!c->map)
                why = "the job has not started yet (no shard map)";
        else if (add && in_map)
                why = "that shard is already in the map";
        else if (add && !coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, id))
                why = "no such shard is registered (start psd with that --id first)";
        else if (!add && !in_map)
                why = "that shard is not in the map";
        else if (!add && shardmap_size(c->map) < 2)
                why = "the last shard of the map cannot be removed";
        else if (c->job.ntables > 0)
                why = coord_rows_unmovable(c);
        char need[128];
        if (!why && c->job.ntables > 0 && rows_over_limit(c, id, add, need, sizeof need))
                why = need;
        if (why) {
                snprintf(reason, sizeof reason, "shard %u: %s", id, why);
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        /* A new shard first gets the map without itself: the map its rows
         * move from (psd-rows.h, "rows moved"). */
        if (add && c->job.ntables > 0)
                coord_publish_peer(c, coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, id));
        int r = coord_remap(c, add ? id : 0, add ? 0 : id);
        if (r < 0) {
                snprintf(reason, sizeof reason, "cannot build the new map: %s", strerror(-r));
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        c->migrate_start_ms = now_ms();
        log_info("shard %s shard_id=%u map_epoch=%lu shards=%zu", add ? "added" : "removed", id,
                 (unsigned long) c->map_epoch, shardmap_size(c->map));
        coord_todo(c, TODO_PUBLISH);
        (void) coord_reply_job(c, &m->route, m->hdr->seq, "migrating");
}

/* Whether the shards can hold the job under c->map: each shard's share of the
 * values and optimizer state within its memory, the largest frame within its
 * limit. On failure writes why into reason. */
bool coord_job_fits(Coord *c, char *reason, size_t n) {
        size_t ns = shardmap_size(c->map);
        _cleanup_free_ uint64_t *share = ps_calloc(ns, sizeof *share);
        if (!share) {
                snprintf(reason, n, "out of memory");
                return false;
        }
        shardmap_bytes(c->map, &c->job, share);
        uint64_t frame = (uint64_t) job_max_frame(&c->job);
        for (size_t i = 0; i < ns; i++) {
                Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, shardmap_shard(c->map, i)->id);
                if (!p)
                        continue;
                if (p->memory_limit && share[i] > p->memory_limit) {
                        uint64_t total = 0;
                        for (size_t j = 0; j < ns; j++)
                                total += share[j];
                        char a[32], b[32], l[32];
                        snprintf(reason, n, "the model needs %s of values and optimizer state; shard %u would "
                                 "hold %s but has %s (add shards or use a smaller model)",
                                 bytes_human(total, a, sizeof a), p->id, bytes_human(share[i], b, sizeof b),
                                 bytes_human(p->memory_limit, l, sizeof l));
                        return false;
                }
                if (p->max_msg && frame > p->max_msg) {
                        snprintf(reason, n, "the job's chunks need frames of %lu bytes; shard %u accepts %lu "
                                 "(lower --chunk-kb or raise psd --max-msg)", (unsigned long) frame, p->id,
                                 (unsigned long) p->max_msg);
                        return false;
                }
                if (p->max_msg && c->job.ntables > 0 && p->max_msg < WIRE_ROWS_PART_BYTES + 65536) {
                        snprintf(reason, n, "the job's tables send rows in frames of up to %u bytes; shard %u accepts "
                                 "%lu (raise psd --max-msg)", WIRE_ROWS_PART_BYTES + 65536, p->id,
                                 (unsigned long) p->max_msg);
                        return false;
                }
        }
        return true;
}
