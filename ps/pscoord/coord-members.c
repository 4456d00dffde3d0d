/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's membership: peers (shards and workers) by route and id, their
 * leases, registration, heartbeats, results, drains, and the stragglers the
 * shards report. A change of the workers ends in coord_membership_changed. */
#include "coord-internal.h"

/* Where the job's clock is now, as the members last reported it: the
 * furthest under BSP (they move together), the mean under ASP and SSP (the
 * clocks the members have trained between them). */
static int64_t current_clock(Coord *c, Peer **members, size_t nw) {
        int64_t max = 0, sum = 0;
        size_t n = 0;
        for (size_t i = 0; i < nw; i++)
                if (members[i]->worker.has_clock) {
                        max = MAX(max, members[i]->worker.clock);
                        sum += members[i]->worker.clock;
                        n++;
                }
        if (!n)
                return c->sched.base_clock;
        return c->job.mode == MODE_BSP ? max : sum / (int64_t) n;
}

/* Every member has finished training and nobody evaluates yet: one of them
 * (first the one reporting now, else the lowest id) pulls and evaluates the
 * final weights. Returns true when that is self. */
bool coord_pick_evaluator(Coord *c, Peer *self) {
        if (c->state != JOB_RUNNING || c->has_accuracy || c->evaluator)
                return false;
        Peer *pick = self;
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role != PSNET__ROLE__ROLE_WORKER || !p->member)
                        continue;
                if (!p->done)
                        return false;
                if (!pick || p->id < pick->id)
                        pick = p;
        }
        if (!pick)
                return false;
        c->evaluator = pick->id;
        log_info("every member finished training: worker %u evaluates the final weights", pick->id);
        if (pick == self)
                return true;
        Psnet__Header h;
        Psnet__Config cfg = PSNET__CONFIG__INIT;
        cfg.job_state = job_state_to_proto(c->state);
        cfg.has_evaluate = cfg.evaluate = true;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &cfg;
        if (coord_reply_hdr(c, &pick->route, &h, 0) < 0) {
                log_warning("Failed to ask worker=%u to evaluate", pick->id);
                c->evaluator = 0;
        }
        return false;
}

void coord_membership_changed(Coord *c) {
        if (c->state != JOB_RUNNING || c->job.mode == MODE_FED) {
                coord_maybe_start(c);
                return;
        }
        c->members_epoch++;
        size_t nw = 0;
        _cleanup_free_ Peer **members = coord_sorted_workers(c, &nw);
        bool joining = false;
        for (size_t i = 0; i < c->npeers; i++)
                joining |= c->peers[i].role == PSNET__ROLE__ROLE_WORKER && !c->peers[i].member;
        if (members && c->sched_lost) {
                /* A member left before the end: the others train its share. */
                int64_t at = current_clock(c, members, nw);
                schedule_rebase(&c->sched, at, (uint32_t) nw);
                c->sched_lost = false;
                log_info("schedule base_clock=%ld samples_before=%lu workers=%zu", (long) c->sched.base_clock,
                         (unsigned long) c->sched.samples_before, nw);
        }
        log_info("membership epoch=%lu workers=%zu", (unsigned long) c->members_epoch, nw);
        if (nw == 0 && !joining) {
                /* Every worker left before the final weights were evaluated: the
                 * job cannot finish by itself (workers failed, were killed, or
                 * stopped). Failing it publishes the new state. */
                char why[sizeof c->fail_reason];
                snprintf(why, sizeof why, "%s%s%s",
                         c->finished ? "every worker left before the final weights were evaluated (some finished "
                                       "training)"
                                     : "every worker left without finishing",
                         c->left_reason[0] ? "; the last to fail said: " : "", c->left_reason);
                coord_job_fail(c, why);
                return;
        }
        coord_todo(c, TODO_PUBLISH);
        (void) coord_pick_evaluator(c, NULL);
}

/* Whether p, a registered shard out of the map, may take the place of a
 * shard lost to a fail-over (pscoord --keep-standby: never by itself). */
static bool lost_place_open(const Coord *c, const Peer *p) {
        return p->role == PSNET__ROLE__ROLE_SERVER && c->state == JOB_RUNNING && c->map && c->lost_shards > 0 &&
               !c->cfg->keep_standby && !p->detached && shardmap_find(c->map, p->id) < 0;
}

/* p takes a lost shard's place, empty: the keys it gets come from their
 * primaries, as with psctl shard add, and so do a job's table rows, once
 * they can move (coord_rows_unmovable). Whether it did. */
static bool take_lost_place(Coord *c, Peer *p) {
        if (!lost_place_open(c, p) || c->ckpt.active || (c->job.ntables > 0 && coord_rows_unmovable(c)))
                return false;
        int r = coord_remap(c, p->id, 0);
        if (r < 0) {
                log_warning_errno(r, "Failed to put shard %u in the map: %m (it waits on standby)", p->id);
                return false;
        }
        c->lost_shards--;
        c->migrate_start_ms = now_ms();
        log_info("shard takes a lost shard's place shard_id=%u map_epoch=%lu shards=%zu", p->id,
                 (unsigned long) c->map_epoch, shardmap_size(c->map));
        coord_todo(c, TODO_PUBLISH);
        return true;
}

static int reply_registered(Coord *c, WireMsg *m, uint32_t id, Psnet__Role role) {
        Psnet__Header rh;
        Psnet__RegisterRep rep = PSNET__REGISTER_REP__INIT;
        rep.assigned_id = id;
        rep.lease_ms = role == PSNET__ROLE__ROLE_SERVER ? c->cfg->shard_lease_ms : c->cfg->lease_ms;
        rep.job_state = job_state_to_proto(c->state);
        wire_header_init(&rh, PSNET__MSG_TYPE__MSG_REGISTER_REP);
        rh.body_case = PSNET__HEADER__BODY_REG_REP;
        rh.reg_rep = &rep;
        int r = coord_reply_hdr(c, &m->route, &rh, m->hdr->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer registration: %m");
        c->registrations++;
        return r;
}

/* A peer this pscoord knows from its state file (a restart) registers again:
 * the same process (pid and host, and key with CURVE) takes its place back
 * with its id, membership and start clock; nothing changes for the others,
 * it gets the configuration again (a shard fenced by the previous pscoord is
 * released by it). So does an edge client whose connection moved (psgate
 * restarted, or another psgate behind the same name took it): the rounds
 * that sampled it keep it. False when it is not such a peer. */
static bool rejoin(Coord *c, WireMsg *m) {
        const Psnet__Register *reg = m->hdr->reg;
        Peer *p = coord_find_peer(c, reg->role, reg->want_id);
        bool moved = p && !p->detached && reg->role == PSNET__ROLE__ROLE_EDGE;
        if (!p || !(p->detached || moved) || !reg->has_pid || p->pid != reg->pid ||
            strcmp(p->host, reg->name ? reg->name : "") != 0 ||
            (c->id.enabled && (!p->has_key || memcmp(p->public_key, m->peer.key, 32) != 0)))
                return false;
        if (reg->role == PSNET__ROLE__ROLE_SERVER && (!p->endpoint || strcmp(p->endpoint, reg->endpoint) != 0))
                return false;
        (void) zmq_msg_copy(&p->route, &m->route);
        p->detached = false;
        p->last_seen = now_ms();
        p->memory_limit = reg->has_memory_limit ? reg->memory_limit : p->memory_limit;
        p->max_msg = reg->has_max_msg ? reg->max_msg : p->max_msg;
        if (reply_registered(c, m, p->id, reg->role) < 0)
                return true;
        bool in_map = reg->role == PSNET__ROLE__ROLE_SERVER && c->map && shardmap_find(c->map, p->id) >= 0;
        log_info("registered again after %s role=%s id=%u pid=%u%s",
                 moved ? "its connection moved" : "pscoord's restart", coord_role_noun(reg->role), p->id, p->pid,
                 in_map ? " in_map=1" : p->member ? " member=1" : "");
        bool fed = (reg->role == PSNET__ROLE__ROLE_EDGE || reg->role == PSNET__ROLE__ROLE_STRATEGY) &&
                   c->job.mode == MODE_FED && c->state == JOB_RUNNING;
        if (in_map || (reg->role == PSNET__ROLE__ROLE_WORKER && p->member) || fed)
                coord_publish_peer(c, p);
        else if (reg->role == PSNET__ROLE__ROLE_WORKER && c->state == JOB_RUNNING)
                coord_fence_start(c, false, c->job.mode, c->job.staleness);
        return true;
}

/* How long a new worker still waits before a running job admits it: after
 * the job's k-th eviction of a worker that stalled the others, --stall-timeout
 * times 2^(k-1) from that eviction (at most a day). Each newcomer that never
 * pushes stalls the members for --stall-timeout before it is evicted; a
 * stream of them (new processes, a stolen key) would hold the job at a
 * standstill, and now holds it for a vanishing share of the time. */
static uint64_t coord_join_wait_ms(const Coord *c, uint64_t now) {
        if (!c->nevicted || c->state != JOB_RUNNING || !c->cfg->stall_timeout)
                return 0;
        uint64_t wait = MIN(1000ull * c->cfg->stall_timeout << MIN(c->nevicted - 1, (size_t) 16), 86400000ull);
        return now < c->evicted_ms + wait ? c->evicted_ms + wait - now : 0;
}

void coord_handle_register(Coord *c, WireMsg *m) {
        Psnet__Header *h = m->hdr;
        const Psnet__Register *reg = h->reg;
        char reason[320];
        if (reg->role != PSNET__ROLE__ROLE_SERVER && reg->role != PSNET__ROLE__ROLE_WORKER &&
            reg->role != PSNET__ROLE__ROLE_EDGE && reg->role != PSNET__ROLE__ROLE_STRATEGY) {
                snprintf(reason, sizeof reason, "role %d cannot register (servers, workers, edge workers and a "
                         "strategy process can)", reg->role);
                coord_reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        if (c->id.enabled && m->peer.role != reg->role) {
                snprintf(reason, sizeof reason, "a key of role %s cannot register as a %s", role_name(m->peer.role),
                         coord_role_noun(reg->role));
                log_warning("refused registration reason=\"%s\" key=%s name=%s", reason, m->peer.fingerprint,
                            m->peer.name);
                c->errors++;
                (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_DENIED, h->seq, reason);
                return;
        }
        if (reg->role == PSNET__ROLE__ROLE_SERVER &&
            (!reg->has_want_id || reg->want_id == 0 || !reg->endpoint || !reg->endpoint[0] ||
             strlen(reg->endpoint) > 255)) {
                coord_reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID,
                            "a shard registers with its id (>= 1) and endpoint");
                return;
        }
        if (reg->role == PSNET__ROLE__ROLE_WORKER && c->job.mode == MODE_FED) {
                snprintf(reason, sizeof reason, "job %u is federated: its clients are edge workers (workerd --edge)",
                         c->job.id);
                coord_reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        if (c->npeers >= COORD_MAX_PEERS) {
                coord_reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_INVALID, "too many peers");
                return;
        }
        for (size_t i = 0; reg->role == PSNET__ROLE__ROLE_WORKER && i < c->nevicted; i++)
                if (reg->has_pid && c->evicted[i].pid == reg->pid && strcmp(c->evicted[i].host, reg->name ? reg->name : "") == 0) {
                        snprintf(reason, sizeof reason, "this worker (pid %u) was evicted from job %u: the others waited "
                                 "on it too long; a restarted worker may join", reg->pid, c->job.id);
                        log_warning("refused registration reason=\"%s\"", reason);
                        (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_DENIED, h->seq, reason);
                        return;
                }
        Peer *p = coord_find_route(c, &m->route);
        if (p) /* the same connection registers again: start over */
                coord_remove_peer(c, p);
        for (size_t i = 0; reg->role == PSNET__ROLE__ROLE_STRATEGY && i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_STRATEGY && !c->peers[i].detached &&
                    !(reg->has_want_id && reg->want_id == c->peers[i].id)) {
                        /* One process computes a round's delta: two would race. */
                        snprintf(reason, sizeof reason, "a strategy process is connected already (id %u, pid %u on "
                                 "%.64s): one runs a job's rounds", c->peers[i].id, c->peers[i].pid, c->peers[i].host);
                        log_warning("refused registration reason=\"%s\"", reason);
                        (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_RESOURCE, h->seq, reason);
                        return;
                }
        if (reg->has_want_id && reg->want_id && rejoin(c, m))
                return;
        uint64_t wait = reg->role == PSNET__ROLE__ROLE_WORKER ? coord_join_wait_ms(c, now_ms()) : 0;
        if (wait) {
                /* RESOURCE: the worker asks again (until its --connect-timeout). */
                snprintf(reason, sizeof reason, "job %u evicted %zu worker%s that stalled the others; new workers "
                         "are admitted again in %lu s (each eviction doubles the wait)", c->job.id, c->nevicted,
                         c->nevicted == 1 ? "" : "s", (unsigned long) ((wait + 999) / 1000));
                if (log_window(&c->join_lines, now_ms()))
                        log_warning("refused registration reason=\"%s\"", reason);
                c->errors++;
                (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_RESOURCE, h->seq, reason);
                return;
        }
        uint32_t id;
        if (reg->role == PSNET__ROLE__ROLE_SERVER) {
                id = reg->want_id;
                Peer *old = coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, id);
                uint64_t now = now_ms(), silent = old && !old->detached ? now - old->last_seen : 0;
                if (old && (old->detached ? now <= old->rejoin_until : silent <= c->cfg->shard_lease_ms)) {
                        /* Another process holds the id and keeps its lease: taking it over
                         * would make the two flap. A restarted shard gets in once the old
                         * lease runs out (it registers again meanwhile). */
                        snprintf(reason, sizeof reason,
                                 "shard id %u is held by a live shard at %.64s (pid %u, heard %lu ms ago); stop it "
                                 "or choose another --id", id, old->endpoint ? old->endpoint : "?", old->pid,
                                 (unsigned long) silent);
                        log_warning("refused registration reason=\"%s\"", reason);
                        c->errors++;
                        (void) netsock_send_error(c->ctl, &m->route, PSNET__STATUS__STATUS_RESOURCE, h->seq, reason);
                        return;
                }
                if (old) {
                        /* Its lease ran out: whatever it held is no longer its own
                         * (its backups lead now); it comes back empty. */
                        log_warning("shard re-registered (restart?) shard_id=%u", id);
                        coord_remove_peer(c, old);
                        coord_shard_lost(c, id, "its lease ran out");
                }
        } else {
                /* Workers, edge workers and a strategy share the ids shards see as senders. */
                id = reg->has_want_id && reg->want_id && !coord_find_peer(c, PSNET__ROLE__ROLE_WORKER, reg->want_id) &&
                                     !coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, reg->want_id) &&
                                     !coord_find_peer(c, PSNET__ROLE__ROLE_STRATEGY, reg->want_id)
                             ? reg->want_id
                             : ++c->next_worker_id;
                c->next_worker_id = MAX(c->next_worker_id, id);
        }
        Peer *np = ps_realloc(c->peers, (c->npeers + 1) * sizeof *np);
        if (!np) {
                coord_reply_error(c, &m->route, h->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        c->peers = np;
        p = &c->peers[c->npeers++];
        memset(p, 0, sizeof *p);
        p->id = id;
        p->role = reg->role;
        zmq_msg_init(&p->route);
        (void) zmq_msg_copy(&p->route, &m->route);
        p->endpoint = ps_strdup(reg->endpoint);
        p->pid = reg->has_pid ? reg->pid : 0;
        snprintf(p->host, sizeof p->host, "%s", reg->name ? reg->name : "");
        p->memory_limit = reg->has_memory_limit ? reg->memory_limit : 0;
        p->max_msg = reg->has_max_msg ? reg->max_msg : 0;
        if (c->id.enabled) {
                memcpy(p->public_key, m->peer.key, 32);
                p->has_key = true;
        }
        p->last_seen = now_ms();
        psnet__shard_info__init(&p->shard);
        psnet__worker_info__init(&p->worker);

        (void) reply_registered(c, m, id, reg->role);
        log_info("registered role=%s id=%u pid=%u endpoint=%s", coord_role_noun(reg->role), id, p->pid,
                 reg->endpoint ? reg->endpoint : "-");
        if (reg->role == PSNET__ROLE__ROLE_STRATEGY) {
                /* It gets the job and the map (coord-map.c); a round waiting
                 * for a strategy asks it (coord-fed.c). */
                if (c->job.mode == MODE_FED && c->state == JOB_RUNNING)
                        coord_publish_peer(c, p);
                coord_todo(c, TODO_FED_POLL);
                return;
        }
        if (reg->role == PSNET__ROLE__ROLE_EDGE) {
                /* Rounds sample it from now on; it gets the job once there is one. */
                if (c->job.mode == MODE_FED && c->state == JOB_RUNNING)
                        coord_publish_peer(c, p);
                coord_maybe_start(c);
                return;
        }
        if (reg->role == PSNET__ROLE__ROLE_SERVER && c->map && shardmap_find(c->map, id) >= 0) {
                /* A shard of the current map came back: give it the job again. */
                coord_todo(c, TODO_PUBLISH);
                return;
        }
        /* A shard lost to a fail-over is missing from the map. First it gets
         * the map without itself, so that a shard that comes back (cut off,
         * stopped) drops what it held before it is given keys again. */
        if (lost_place_open(c, p)) {
                coord_publish_peer(c, p);
                if (take_lost_place(c, p))
                        return;
                const char *no_rows = c->job.ntables == 0 ? NULL : coord_rows_unmovable(c);
                if (no_rows)
                        log_info("shard %u waits on standby: %s (it takes the lost shard's place once the rows are "
                                 "whole)", id, no_rows);
        }
        if (reg->role == PSNET__ROLE__ROLE_WORKER && c->state == JOB_RUNNING) {
                /* Joins at the next clock boundary. */
                coord_fence_start(c, false, c->job.mode, c->job.staleness);
                return;
        }
        coord_membership_changed(c);
}

/* A shard's last word on its table rows (Coord.rows_whole). */
static void note_rows_whole(Coord *c, uint32_t shard, uint64_t epoch) {
        for (size_t i = 0; i < c->nrows_whole; i++)
                if (c->rows_whole[i].shard == shard) {
                        c->rows_whole[i].epoch = epoch;
                        return;
                }
        struct RowsWhole *a = ps_realloc(c->rows_whole, (c->nrows_whole + 1) * sizeof *a);
        if (!a)
                return; /* unknown: a loss of it counts as unsafe once a fail-over happened */
        c->rows_whole = a;
        a[c->nrows_whole++] = (struct RowsWhole) { shard, epoch };
}


void coord_handle_heartbeat(Coord *c, WireMsg *m, Peer *p) {
        Psnet__Header *h = m->hdr;
        uint64_t now = now_ms();
        if (p->role == PSNET__ROLE__ROLE_WORKER || p->role == PSNET__ROLE__ROLE_SERVER) {
                uint64_t *gap = &c->hb_gap_max[p->role == PSNET__ROLE__ROLE_SERVER];
                *gap = MAX(*gap, now - p->last_seen);
        }
        if (p->sole_warned && p->sole_warned == p->last_seen)
                log_info("shard heard from again; it keeps its keys shard_id=%u silent_ms=%lu", p->id,
                         (unsigned long) (now - p->last_seen));
        p->last_seen = now;
        if (h->heartbeat->shard && p->role == PSNET__ROLE__ROLE_SERVER) {
                const Psnet__ShardInfo *s = h->heartbeat->shard;
                p->shard = *s;
                p->shard.base = (ProtobufCMessage) PROTOBUF_C_MESSAGE_INIT(&psnet__shard_info__descriptor);
                p->shard.endpoint = NULL;
                p->shard.n_stragglers = 0;
                p->shard.stragglers = NULL;
                p->nstragglers = MIN(s->n_stragglers, (size_t) COORD_MAX_STRAGGLERS);
                if (p->nstragglers)
                        memcpy(p->stragglers, s->stragglers, p->nstragglers * sizeof *p->stragglers);
                p->stalled_ms = s->has_stalled_ms ? s->stalled_ms : 0;
                if (s->has_rows_whole_epoch) {
                        note_rows_whole(c, p->id, s->rows_whole_epoch);
                        /* The rows whole again after a fail-over: a shard that
                         * registered meanwhile takes the lost one's place now. */
                        for (size_t i = 0; c->job.ntables > 0 && c->lost_shards > 0 && i < c->npeers; i++)
                                if (take_lost_place(c, &c->peers[i]))
                                        break;
                }
        }
        if (h->heartbeat->worker && p->role == PSNET__ROLE__ROLE_WORKER) {
                if (c->state == JOB_RUNNING && p->member && coord_history_epoch(c, p->id, h->heartbeat->worker))
                        coord_todo(c, TODO_SAVE);
                p->worker = *h->heartbeat->worker;
                p->worker.base = (ProtobufCMessage) PROTOBUF_C_MESSAGE_INIT(&psnet__worker_info__descriptor);
                p->worker.n_evals = 0; /* they live in the message, kept in the history */
                p->worker.evals = NULL;
                coord_history_sample(c, p);
        }
        int r = coord_reply(c, &m->route, PSNET__MSG_TYPE__MSG_HEARTBEAT_REP, h->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer heartbeat: %m");
}

/* A worker finished training (RESULT without an accuracy): the last member to
 * finish evaluates the final weights. Or it evaluated them (RESULT with the
 * accuracy): the job is done, and the members still waiting leave. */
void coord_handle_result(Coord *c, WireMsg *m, Peer *p) {
        const Psnet__WorkerInfo *wi = m->hdr->result->worker;
        bool edge = p->role == PSNET__ROLE__ROLE_EDGE && c->job.mode == MODE_FED;
        if (p->role != PSNET__ROLE__ROLE_WORKER && !edge) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "RESULT comes from workers (and the edge worker evaluating a federated job's model)");
                return;
        }
        if (edge && !wi->has_accuracy) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "an edge worker reports an accuracy it was asked for, nothing else");
                return;
        }
        /* A model of tensors alone may have no accuracy: its evaluator sends NaN. */
        bool none = c->job.external && isnan(wi->accuracy);
        if (wi->has_accuracy && (p->id != c->evaluator || c->state != JOB_RUNNING || (!isfinite(wi->accuracy) && !none))) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "an accuracy comes only from the worker asked to evaluate the final weights");
                return;
        }
        p->worker = *wi;
        p->worker.base = (ProtobufCMessage) PROTOBUF_C_MESSAGE_INIT(&psnet__worker_info__descriptor);
        p->worker.n_evals = 0; /* they live in the message, kept in the history */
        p->worker.evals = NULL;
        /* The last epoch-end evaluation may come with the result, before a
         * heartbeat carried it; the final one always does. */
        if (!edge && c->state == JOB_RUNNING)
                (void) coord_history_epoch(c, p->id, wi);
        c->finished += !p->done;
        p->done = true;
        Psnet__Header h;
        Psnet__ResultRep rr = PSNET__RESULT_REP__INIT;
        if (wi->has_accuracy) {
                coord_job_done(c, p, wi);
        } else {
                log_info("worker finished training worker=%u clock=%ld", p->id, (long) wi->clock);
                rr.has_evaluate = true;
                rr.evaluate = coord_pick_evaluator(c, p);
        }
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_RESULT_REP);
        h.body_case = PSNET__HEADER__BODY_RESULT_REP;
        h.result_rep = &rr;
        (void) coord_reply_hdr(c, &m->route, &h, m->hdr->seq);
}

void coord_handle_drain(Coord *c, WireMsg *m) {
        char reason[96];
        uint32_t wid = m->hdr->worker->id;
        Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_WORKER, wid);
        if (!p) {
                snprintf(reason, sizeof reason, "no worker %u", wid);
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        p->drain = true;
        log_info("draining worker=%u", p->id);
        Psnet__Header h;
        Psnet__Config c2 = PSNET__CONFIG__INIT;
        c2.has_drain = c2.drain = true;
        c2.job_state = job_state_to_proto(c->state);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &c2;
        int r = coord_reply_hdr(c, &p->route, &h, 0);
        if (r < 0)
                log_warning_errno(r, "Failed to tell worker=%u to drain: %m", p->id);
        (void) coord_reply_job(c, &m->route, m->hdr->seq, "draining");
}

/* Whether the job would fail were shard id lost now: it holds a key no other
 * shard of the map keeps (one copy, or its backups already gone). */
static bool holds_sole_copy(const Coord *c, uint32_t id) {
        ShardMap *m = NULL;
        if (!c->map || shardmap_find(c->map, id) < 0 || (c->state != JOB_RUNNING && c->state != JOB_WAITING))
                return false;
        int r = shardmap_failover(c->map, c->map_epoch + 1, &id, 1, &m, NULL, NULL);
        shardmap_free(m);
        return r == -ENODATA;
}

/* How long a peer may be silent before it has left. A shard's short lease
 * exists for its fail-over; one holding the only copy of a key has nobody to
 * fail over to, and its loss fails the job: it is given the workers' lease
 * (when longer), so that a host too busy to run it for a moment (a heartbeat
 * 641 ms late on a loaded 2-core machine) costs a pause, not the job. */
static uint64_t lease_of(Coord *c, Peer *p, uint64_t silent) {
        if (p->role != PSNET__ROLE__ROLE_SERVER)
                return c->cfg->lease_ms;
        if (silent <= c->cfg->shard_lease_ms || c->cfg->lease_ms <= c->cfg->shard_lease_ms ||
            !holds_sole_copy(c, p->id))
                return c->cfg->shard_lease_ms;
        if (p->sole_warned != p->last_seen) {
                p->sole_warned = p->last_seen;
                c->sole_waits++;
                log_warning("shard silent past its lease, holding the only copy of a key: waiting up to --lease-ms "
                            "before failing the job shard_id=%u silent_ms=%lu lease_ms=%u", p->id,
                            (unsigned long) silent, c->cfg->lease_ms);
        }
        return c->cfg->lease_ms;
}

void coord_expire_leases(Coord *c) {
        uint64_t now = now_ms();
        bool changed = false, edge_gone = false;
        for (size_t i = 0; i < c->npeers;) {
                Peer *p = &c->peers[i];
                bool worker = p->role == PSNET__ROLE__ROLE_WORKER, shard = p->role == PSNET__ROLE__ROLE_SERVER;
                if (p->detached ? now <= p->rejoin_until : now - p->last_seen <= lease_of(c, p, now - p->last_seen)) {
                        i++;
                        continue;
                }
                uint32_t id = p->id;
                c->expiries++;
                if (p->detached)
                        log_warning("lease expired role=%s id=%u: it did not register again after pscoord's restart",
                                    coord_role_noun(p->role), p->id);
                else
                        log_warning("lease expired role=%s id=%u silent_ms=%lu", coord_role_noun(p->role), p->id,
                                    (unsigned long) (now - p->last_seen));
                coord_remove_peer(c, p);
                if (shard)
                        coord_shard_lost(c, id, "its lease ran out");
                changed |= worker;
                edge_gone |= !worker && !shard;
        }
        if (changed)
                coord_membership_changed(c);
        if (edge_gone)
                coord_todo(c, TODO_FED_POLL);
}

/* A member the others have waited on for --stall-timeout leaves the
 * membership as if its lease had run out: it still heartbeats (a fake or a
 * stuck worker), but holds the BSP barrier or the SSP bound. */
void coord_evict_stragglers(Coord *c) {
        if (!c->cfg->stall_timeout || c->state != JOB_RUNNING)
                return;
        uint32_t evict[COORD_MAX_STRAGGLERS];
        uint64_t waited[COORD_MAX_STRAGGLERS];
        size_t n = 0;
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *s = &c->peers[i];
                if (s->role != PSNET__ROLE__ROLE_SERVER || s->stalled_ms < 1000ull * c->cfg->stall_timeout)
                        continue;
                for (size_t k = 0; k < s->nstragglers && n < COORD_MAX_STRAGGLERS; k++) {
                        waited[n] = s->stalled_ms;
                        evict[n++] = s->stragglers[k];
                }
                s->nstragglers = 0;
                s->stalled_ms = 0;
        }
        bool changed = false;
        for (size_t k = 0; k < n; k++) {
                Peer *w = coord_find_peer(c, PSNET__ROLE__ROLE_WORKER, evict[k]);
                if (!w || !w->member)
                        continue; /* gone already, or reported by two shards */
                log_warning("evicted a worker the others waited on for %lu s (--stall-timeout %u s) worker=%u",
                            (unsigned long) (waited[k] / 1000), c->cfg->stall_timeout, w->id);
                c->evicted_ms = now_ms();
                if (c->nevicted < COORD_MAX_STRAGGLERS) {
                        c->evicted[c->nevicted].pid = w->pid;
                        snprintf(c->evicted[c->nevicted].host, sizeof c->evicted[0].host, "%s", w->host);
                        c->nevicted++;
                }
                coord_remove_peer(c, w);
                c->evictions++;
                changed = true;
        }
        if (changed)
                coord_membership_changed(c);
}

/* A leaving worker's reason, kept printable and short: it reaches the log,
 * the job's state and psctl. */
static void keep_left_reason(Coord *c, uint32_t id, const char *reason) {
        char text[201];
        size_t n = 0;
        for (; reason[n] && n < sizeof text - 1; n++)
                text[n] = reason[n] >= 0x20 && reason[n] < 0x7f ? reason[n] : '?';
        text[n] = '\0';
        snprintf(c->left_reason, sizeof c->left_reason, "worker %u: %s", id, text);
}

void coord_handle_deregister(Coord *c, WireMsg *m, Peer *p) {
        Psnet__Role role = p->role;
        uint32_t id = p->id;
        if (role == PSNET__ROLE__ROLE_WORKER && m->hdr->reason && m->hdr->reason[0]) {
                keep_left_reason(c, id, m->hdr->reason);
                log_warning("a worker left failing worker=%u reason=\"%s\"", id, c->left_reason);
        }
        log_info("deregistered role=%s id=%u", coord_role_noun(role), id);
        (void) coord_reply(c, &m->route, PSNET__MSG_TYPE__MSG_DEREGISTER_REP, m->hdr->seq);
        coord_remove_peer(c, p);
        if (role == PSNET__ROLE__ROLE_WORKER)
                coord_membership_changed(c);
        else if (role == PSNET__ROLE__ROLE_EDGE || role == PSNET__ROLE__ROLE_STRATEGY)
                coord_todo(c, TODO_FED_POLL); /* a round it was sampled (or asked) for need not wait for it */
        else /* it stopped acknowledging before it said goodbye */
                coord_shard_lost(c, id, "it stopped");
}

void coord_shard_lost(Coord *c, uint32_t id, const char *why) {
        char reason[256] = "";
        bool running = c->map && (c->state == JOB_RUNNING || c->state == JOB_WAITING);
        /* Table rows move after psctl shard add or remove: any shard may
         * hold a row's last copy until every one says its rows are whole. */
        bool moving = c->job.ntables > 0 && c->rows_move_epoch == c->map_epoch && !coord_rows_settled(c);
        if (running && moving && id && id == c->rows_leaving)
                snprintf(reason, sizeof reason, "shard %u left (%s) before it had handed over the table rows it held "
                         "the only copy of (psctl shard remove, --replicas 1)", id, why);
        else if (!running || shardmap_find(c->map, id) < 0)
                return;
        else if (c->job.ntables > 0 && shardmap_replicas(c->map) < 2)
                snprintf(reason, sizeof reason, "shard %u left (%s) holding the only copy of its table rows: the job "
                         "keeps 1 copy of each row (--replicas)", id, why);
        else if (moving)
                snprintf(reason, sizeof reason, "shard %u left (%s) while table rows moved after the change to map "
                         "epoch %lu (psctl shard add/remove): a row may have lost every copy", id, why,
                         (unsigned long) c->map_epoch);
        else if (c->job.ntables > 0 && !coord_rows_whole(c, id))
                /* The rows it leads since an earlier fail-over, not yet all
                 * on their new copies when it last said, may have had their
                 * last copy here. */
                snprintf(reason, sizeof reason, "shard %u left (%s) before it had put the table rows it leads since "
                         "the fail-over to map epoch %lu back on %u copies: a row may have lost every copy", id, why,
                         (unsigned long) c->map_epoch, shardmap_replicas(c->map));
        if (reason[0]) {
                log_error("%s", reason);
                coord_job_fail(c, reason);
                return;
        }
        uint32_t t = 0, k = 0;
        ShardMap *m;
        int r = shardmap_failover(c->map, c->map_epoch + 1, &id, 1, &m, &t, &k);
        if (r == -ENODATA) {
                snprintf(reason, sizeof reason,
                         "shard %u left (%s) holding the only copy of key (%u,%u): the job keeps %u cop%s of each "
                         "key (--replicas)", id, why, t, k, shardmap_replicas(c->map),
                         shardmap_replicas(c->map) == 1 ? "y" : "ies");
                log_error("%s", reason);
                coord_job_fail(c, reason);
                return;
        }
        if (r < 0) {
                snprintf(reason, sizeof reason, "shard %u left (%s) and no new map could be built: %s", id, why,
                         strerror(-r));
                coord_job_fail(c, reason);
                return;
        }
        c->map_epoch++;
        shardmap_free(c->map);
        c->map = m;
        c->failovers++;
        c->lost_shards++;
        c->failover_ms = now_ms();
        coord_todo(c, TODO_PUBLISH);
        coord_state_save(c); /* the publish's save, now (TODO_SAVE cleared) */
        /* Logged once the new map is on disk (--state-dir); it leaves at the end of this loop turn. */
        log_warning("fail-over shard_id=%u reason=\"%s\" map_epoch=%lu shards=%zu replicas=%u", id, why,
                    (unsigned long) c->map_epoch, shardmap_size(m), shardmap_replicas(m));
        coord_fed_shard_lost(c, id);
}

