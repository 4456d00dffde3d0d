/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's fences: a change of membership or mode is agreed at a clock
 * boundary. pscoord fences the shards, learns their clocks, picks the
 * boundary (boundary.c) and publishes the change with it. A checkpoint's
 * fence ends in c->ckpt.fence, for coord-checkpoint.c (TODO_CHECKPOINT). */
#include "coord-internal.h"

/* Asks every shard of the map for its clocks and to hold still past the next
 * one; coord_fence_commit picks the boundary when all have answered. */
void coord_fence_start(Coord *c, bool mode_change, ConsistencyMode mode, uint32_t staleness) {
        Fence *f = &c->fence;
        if (f->active) {
                if (mode_change) {
                        f->mode_change = true;
                        f->mode = mode;
                        f->staleness = staleness;
                }
                return;
        }
        *f = (Fence) { .active = true, .seq = ++c->fence_seq, .deadline = now_ms() + 2000,
                       .mode_change = mode_change, .mode = mode, .staleness = staleness,
                       .clocks = FENCE_CLOCKS_INIT };
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role != PSNET__ROLE__ROLE_SERVER || !c->map || shardmap_find(c->map, p->id) < 0)
                        continue;
                int r = coord_reply(c, &p->route, PSNET__MSG_TYPE__MSG_FENCE, f->seq);
                if (r < 0)
                        log_warning_errno(r, "Failed to send a fence to shard=%u: %m", p->id);
                else
                        f->expected++;
        }
        log_info("fence seq=%lu shards=%zu", (unsigned long) f->seq, f->expected);
}

/* All shards answered: pick the boundary, admit the joiners, switch the mode. */
void coord_fence_commit(Coord *c) {
        Fence *f = &c->fence;
        ConsistencyMode next = f->mode_change ? f->mode : c->job.mode;
        Boundary b = boundary_pick(c->job.mode, next, &f->clocks);
        int64_t from = b.from, start = b.start;

        size_t nw = 0;
        _cleanup_free_ Peer **members = coord_sorted_workers(c, &nw);
        uint32_t *prev = ps_realloc(c->prev_ids, (nw ? nw : 1) * sizeof *prev);
        if (!prev || !members) {
                log_error("out of memory at a fence commit");
                return;
        }
        c->prev_ids = prev;
        c->nprev = nw;
        for (size_t i = 0; i < nw; i++)
                prev[i] = members[i]->id;
        size_t joined = 0;
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role == PSNET__ROLE__ROLE_WORKER && !p->member) {
                        p->member = true;
                        p->start_clock = start;
                        joined++;
                }
        }
        if (f->mode_change) {
                c->job.mode = next;
                c->job.staleness = f->staleness;
        }
        c->switch_clock = from;
        f->active = false;
        if (joined) {
                /* The job's schedule: the clocks before the boundary are the old
                 * members'; from it on, each clock trains one batch per member. */
                schedule_rebase(&c->sched, from > 0 ? from : start, (uint32_t) (nw + joined));
        }
        char mode[32];
        log_info("boundary from_clock=%ld joined=%zu start_clock=%ld mode=%s", (long) from, joined, (long) start,
                 job_mode_string(&c->job, mode, sizeof mode));
        c->members_epoch++;
        coord_todo(c, TODO_PUBLISH);
}

void coord_handle_fence_rep(Coord *c, WireMsg *m) {
        Fence *f = &c->fence;
        const Psnet__FenceRep *si = m->hdr->fence_rep;
        if (!f->active || m->hdr->seq != f->seq)
                return;
        fence_clocks_add(&f->clocks, si->max_clock, si->max_worker_clock, si->min_worker_clock);
        if (++f->replies < f->expected)
                return;
        if (f->checkpoint) {
                f->active = false;
                c->ckpt.fence = FENCE_ANSWERED;
                c->ckpt.clocks = f->clocks;
                coord_todo(c, TODO_CHECKPOINT);
        } else
                coord_fence_commit(c);
}

/* Called on every loop turn: gives up on a fence a shard did not answer (the
 * shards are released by republishing) and starts one for waiting joiners. */
void coord_fence_tick(Coord *c) {
        Fence *f = &c->fence;
        uint64_t now = now_ms();
        if (f->active && now > f->deadline) {
                log_warning("fence seq=%lu got %zu of %zu answers; released, will retry", (unsigned long) f->seq,
                            f->replies, f->expected);
                f->active = false;
                if (f->checkpoint) {
                        c->ckpt.fence = FENCE_GAVE_UP;
                        coord_todo(c, TODO_CHECKPOINT);
                        return;
                }
                f->retry_at = now + 1000;
                coord_todo(c, TODO_PUBLISH);
                return;
        }
        if (f->active || now < f->retry_at || c->state != JOB_RUNNING || c->ckpt.active)
                return;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER && !c->peers[i].member) {
                        coord_fence_start(c, false, c->job.mode, c->job.staleness);
                        return;
                }
}
