/* SPDX-License-Identifier: Apache-2.0 */
/* The job's lifecycle, in one file: it starts (once the expected shards and
 * workers are there), fails, is done, is stopped or replaced (psctl job
 * submit, a restore). Each transition tells the other parts from here: the
 * history and the rounds start again, and the peers hear of it (the flags
 * coord.c flushes once per loop turn). */
#include "coord-internal.h"
#include "job-init.h"

/* The job's state to every peer: the members with the job and map (publish),
 * workers not yet members of anything with the state alone. */
void coord_publish_state(Coord *c) {
        coord_publish(c);
        Psnet__Header h;
        Psnet__Config cfg = PSNET__CONFIG__INIT;
        cfg.job_state = job_state_to_proto(c->state);
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CONFIG);
        h.body_case = PSNET__HEADER__BODY_CONFIG;
        h.config = &cfg;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER && !c->peers[i].member)
                        (void) coord_reply_hdr(c, &c->peers[i].route, &h, 0);
}

/* The job ends as failed: says why to the log, psctl and every peer. */
void coord_job_fail(Coord *c, const char *reason) {
        c->state = JOB_FAILED;
        c->job_end_ms = now_ms();
        snprintf(c->fail_reason, sizeof c->fail_reason, "%s", reason);
        log_error("job failed job=%u reason=\"%s\"", c->job.id, reason);
        coord_todo(c, TODO_PUBLISH_STATE);
}

/* Starts the job once the expected shards and workers are there. */
void coord_maybe_start(Coord *c) {
        char mode[32], reason[256];
        if (c->state != JOB_WAITING)
                return;
        bool fed = c->job.mode == MODE_FED;
        size_t ns = coord_count_role(c, PSNET__ROLE__ROLE_SERVER),
               nw = coord_count_role(c, fed ? PSNET__ROLE__ROLE_EDGE : PSNET__ROLE__ROLE_WORKER);
        /* A federated job starts with --min-available edge workers (its rounds
         * wait for them again whenever fewer are connected). */
        if (ns == 0 || ns < MAX(c->job.expect_shards, 1u) ||
            nw < (fed ? c->job.fed.min_available : MAX(c->job.expect_workers, 1u)))
                return;
        /* Chunks small enough that every shard gets its fair share of the bytes
         * (within 10%): a model of a few large tensors is cut finer. A restored
         * job keeps the chunks of its checkpoint. */
        uint32_t fair = job_fair_chunk(&c->job, ns);
        if (fair < c->job.chunk_floats && !c->restore.active) {
                uint32_t was = c->job.chunk_floats;
                if (job_set_chunk(&c->job, fair) == 0)
                        log_info("chunks cut for an even placement chunk_floats=%u was=%u keys=%lu shards=%zu", fair,
                                 was, (unsigned long) job_nkeys(&c->job), ns);
        }
        int r = coord_build_map(c);
        if (r < 0) {
                log_error_errno(r, "Failed to build the shard map: %m");
                return;
        }
        c->first_map_epoch = c->map_epoch;
        if (!coord_job_fits(c, reason, sizeof reason)) {
                coord_job_fail(c, reason);
                return;
        }
        c->state = JOB_RUNNING;
        c->members_epoch++;
        c->switch_clock = 0;
        c->nprev = 0;
        int64_t start = c->restore.active ? c->restore.clock : 0;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_WORKER) {
                        c->peers[i].member = true;
                        c->peers[i].start_clock = start;
                }
        c->job_start_ms = now_ms();
        c->has_accuracy = false;
        coord_history_reset(c);
        c->failovers = 0;
        c->lost_shards = 0;
        c->nrows_whole = 0;
        c->rows_moves = 0;
        c->rows_move_epoch = 0;
        c->rows_leaving = 0;
        c->weights_digest = 0;
        c->evaluator = 0;
        c->finished = 0;
        c->sched_lost = false;
        c->sched = (Schedule) { .workers = (uint32_t) nw, .batch = c->job.batch };
        if (c->restore.active) {
                /* The checkpoint's schedule; with another number of workers, theirs from its clock on. */
                c->sched.base_clock = c->restore.base_clock;
                c->sched.samples_before = c->restore.samples_before;
                c->sched.workers = c->restore.workers ? c->restore.workers : (uint32_t) nw;
                if (c->sched.workers != nw)
                        schedule_rebase(&c->sched, c->restore.clock, (uint32_t) nw);
                c->ckpt_next_clock = c->restore.clock + (int64_t) c->cfg->checkpoint_every;
        } else
                c->ckpt_next_clock = (int64_t) c->cfg->checkpoint_every;
        log_info("job started job=%u model=%s mode=%s optim=%s lr=%g lr_schedule=%s sparsify=%g shards=%zu workers=%zu "
                 "map_epoch=%lu replicas=%u%s%s",
                 c->job.id, c->job.model_name, job_mode_string(&c->job, mode, sizeof mode),
                 optim_kind_name(c->job.optim.kind), (double) c->job.optim.lr, lr_schedule_name(c->job.lr_schedule),
                 (double) c->job.sparsify, ns, nw, (unsigned long) c->map_epoch, shardmap_replicas(c->map), c->restore.active ? " restored_from=" : "",
                 c->restore.active ? c->restore.name : "");
        coord_fed_reset(c);
        if (fed && c->restore.active && coord_fed_resume(c, reason, sizeof reason) < 0) {
                coord_job_fail(c, reason);
                return;
        }
        coord_todo(c, TODO_PUBLISH | TODO_FED_POLL);
}

void coord_job_replace(Coord *c, const Job *job) {
        uint32_t id = c->job.id + 1;
        c->job = *job;
        c->job.id = id;
        c->restore.active = false;
        c->fail_reason[0] = '\0';
        c->left_reason[0] = '\0';
        c->nevicted = 0;
        c->state = JOB_WAITING;
        c->has_accuracy = false;
}

void coord_handle_job_submit(Coord *c, WireMsg *m) {
        char err[192];
        Job job;
        if (c->state == JOB_RUNNING) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                            "a job is running: stop it first (psctl job stop)");
                return;
        }
        if (job_from_proto(m->hdr->submit, &job, err, sizeof err) < 0) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, err);
                return;
        }
        /* The values to start from: read here, in the loop (no job is running;
         * a model of 100 MiB takes about 0.1 s), so that psctl hears what is
         * wrong with the file, and its size and digest go to the shards. */
        if (job.init[0]) {
                char why[sizeof err + 320];
                if (job_init_check(&job, job.init, why, sizeof why) < 0) {
                        coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, why);
                        return;
                }
        }
        /* A model the registered shards cannot hold between them is refused now. */
        uint64_t limit = 0, need = job_model_bytes(&job);
        size_t shards = 0;
        for (size_t i = 0; i < c->npeers; i++)
                if (c->peers[i].role == PSNET__ROLE__ROLE_SERVER && c->peers[i].memory_limit) {
                        limit += c->peers[i].memory_limit;
                        shards++;
                }
        if (shards && shards >= MAX(job.expect_shards, 1u) && need > limit) {
                char a[32], b[32];
                snprintf(err, sizeof err, "the model needs %s of values and optimizer state; the %zu shard%s "
                         "hold%s %s between them (--memory-limit)", bytes_human(need, a, sizeof a), shards,
                         shards == 1 ? "" : "s", shards == 1 ? "s" : "", bytes_human(limit, b, sizeof b));
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, err);
                return;
        }
        coord_job_replace(c, &job);
        char mode[32];
        log_info("job submitted job=%u model=%s mode=%s%s%s", c->job.id, job.model_name,
                 job_mode_string(&job, mode, sizeof mode), job.init[0] ? " init=" : "", job.init);
        coord_state_save(c);
        (void) coord_reply_job(c, &m->route, m->hdr->seq, NULL);
        coord_maybe_start(c);
}

void coord_handle_job_stop(Coord *c, WireMsg *m) {
        if (c->state != JOB_RUNNING && c->state != JOB_WAITING) {
                char reason[96];
                snprintf(reason, sizeof reason, "job %u is not running (it is %s)", c->job.id,
                         job_state_name(c->state));
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        c->state = JOB_STOPPED;
        c->job_end_ms = now_ms();
        log_info("job stopped job=%u", c->job.id);
        (void) coord_reply_job(c, &m->route, m->hdr->seq, NULL);
        coord_todo(c, TODO_PUBLISH);
}


void coord_job_done(Coord *c, Peer *p, const Psnet__WorkerInfo *wi) {
        bool edge = p->role == PSNET__ROLE__ROLE_EDGE;
        c->has_accuracy = isfinite(wi->accuracy); /* not so for a model of tensors alone without one */
        c->accuracy = c->has_accuracy ? wi->accuracy : 0.0f;
        c->state = JOB_DONE;
        c->job_end_ms = now_ms();
        c->weights_digest = wi->has_weights_digest ? wi->weights_digest : 0;
        log_info("job done job=%u accuracy=%.4f seconds=%.1f worker=%u weights=%016llx failovers=%u%s "
                 "shard_heartbeat_gap_max_ms=%lu", c->job.id, c->accuracy,
                 (double) (c->job_end_ms - c->job_start_ms) / 1000.0, p->id, (unsigned long long) c->weights_digest,
                 c->failovers, edge ? " federated=1" : "", (unsigned long) c->hb_gap_max[1]);
        if (edge) {
                c->fed.phase = FED_DONE;
                coord_fed_accuracy(c, c->fed.done, wi->accuracy);
                if (c->job.fed.strategy.dp_noise > 0)
                        log_info("job privacy job=%u rounds=%u epsilon=%.4f delta=%g noise=%g clip=%g", c->job.id,
                                 c->fed.done, c->fed.epsilon, (double) c->job.fed.dp_delta,
                                 (double) c->job.fed.strategy.dp_noise, (double) c->job.fed.strategy.dp_clip);
        }
        coord_todo(c, TODO_PUBLISH_STATE); /* the waiting members leave */
}
