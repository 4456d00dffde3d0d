/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's answers to the operator that change no job (psctl status and
 * job mode, whose change is agreed at a fence), the /metrics text and the
 * status line. */
#include <math.h>
#include "coord-internal.h"

void coord_handle_status(Coord *c, WireMsg *m) {
        size_t ns = coord_count_role(c, PSNET__ROLE__ROLE_SERVER), nw = 0, j = 0;
        _cleanup_free_ Psnet__ShardInfo *si = ps_calloc(ns ? ns : 1, sizeof *si);
        _cleanup_free_ Psnet__ShardInfo **sip = ps_calloc(ns ? ns : 1, sizeof *sip);
        _cleanup_free_ Peer **workers = coord_sorted_workers(c, &nw);
        _cleanup_free_ Psnet__WorkerInfo *wi = ps_calloc(nw ? nw : 1, sizeof *wi);
        _cleanup_free_ Psnet__WorkerInfo **wip = ps_calloc(nw ? nw : 1, sizeof *wip);
        Psnet__JobSpec *spec = NULL;
        Psnet__StatusRep ctl = PSNET__STATUS_REP__INIT;
        Psnet__Header h;

        if (!si || !sip || !workers || !wi || !wip || job_to_proto(&c->job, &spec) < 0) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        for (size_t i = 0; i < c->npeers; i++) {
                Peer *p = &c->peers[i];
                if (p->role != PSNET__ROLE__ROLE_SERVER)
                        continue;
                si[j] = p->shard;
                si[j].id = p->id;
                si[j].endpoint = p->endpoint;
                si[j].has_in_map = true;
                si[j].in_map = c->map && shardmap_find(c->map, p->id) >= 0;
                sip[j] = &si[j];
                j++;
        }
        for (size_t i = 0; i < nw; i++) {
                wi[i] = workers[i]->worker;
                wi[i].id = workers[i]->id;
                wi[i].has_rank = wi[i].has_pid = wi[i].has_done = true;
                wi[i].rank = workers[i]->rank;
                wi[i].pid = workers[i]->pid;
                wi[i].done = workers[i]->done;
                wip[i] = &wi[i];
        }
        if (c->map) { /* the copies the map keeps */
                spec->has_replicas = true;
                spec->replicas = shardmap_replicas(c->map);
        }
        ctl.job = spec;
        ctl.has_map_epoch = ctl.has_members_epoch = true;
        ctl.map_epoch = c->map_epoch;
        ctl.members_epoch = c->members_epoch;
        ctl.n_shards = j;
        ctl.shards = sip;
        ctl.n_workers = nw;
        ctl.workers = wip;
        ctl.job_state = job_state_to_proto(c->state);
        ctl.coord_endpoint = c->cfg->listen;
        ctl.has_uptime_ms = true;
        ctl.uptime_ms = now_ms() - c->start_ms;
        ctl.has_accuracy = c->has_accuracy;
        ctl.accuracy = c->accuracy;
        ctl.reason = c->state == JOB_FAILED && c->fail_reason[0] ? c->fail_reason : NULL;
        ctl.has_weights_digest = c->weights_digest != 0;
        ctl.weights_digest = c->weights_digest;
        ctl.has_failovers = true;
        ctl.failovers = c->failovers;
        Psnet__CheckpointInfo last = PSNET__CHECKPOINT_INFO__INIT;
        if (c->last_ckpt.valid) {
                last.name = c->last_ckpt.name;
                last.has_clock = last.has_bytes = last.has_created_ms = true;
                last.clock = c->last_ckpt.clock;
                last.bytes = c->last_ckpt.bytes;
                last.created_ms = c->last_ckpt.created_ms;
                ctl.last_checkpoint = &last;
        }
        ctl.checkpointing = c->ckpt.active ? (c->ckpt.name[0] ? c->ckpt.name : (char *) "(unnamed)") : NULL;
        ctl.restored_from = c->restore.active ? c->restore.name : NULL;
        _cleanup_(coord_history_view_free) HistoryView hv = { .recs = NULL };
        if (coord_history_view(c, &hv) < 0) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                job_proto_free(spec);
                return;
        }
        ctl.n_epochs = hv.n;
        ctl.epochs = hv.recp;
        Psnet__ShardMap *pm = NULL;
        if (c->map && shardmap_to_proto(c->map, &pm) < 0) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                job_proto_free(spec);
                return;
        }
        ctl.map = pm;
        _cleanup_(coord_fed_view_free) FedView fv = { .recs = NULL };
        if (c->job.mode == MODE_FED) {
                if (coord_fed_status(c, &fv) < 0) {
                        coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                        job_proto_free(spec);
                        return;
                }
                ctl.fed = &fv.fs;
        }
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_STATUS_REP);
        h.body_case = PSNET__HEADER__BODY_STATUS_REP;
        h.status_rep = &ctl;
        int r = coord_reply_hdr(c, &m->route, &h, m->hdr->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer status: %m");
        shardmap_proto_free(pm);
        job_proto_free(spec);
}

void coord_handle_job_mode(Coord *c, WireMsg *m) {
        char reason[128];
        Job j = c->job;
        char mode[32];
        if (mode_from_proto(m->hdr->mode, &j.mode, &j.staleness) < 0) {
                snprintf(reason, sizeof reason, "bad mode %d, staleness %u (expected bsp, asp or ssp:0..%u)",
                         (int) m->hdr->mode->mode, m->hdr->mode->staleness, JOB_MAX_STALENESS);
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID, reason);
                return;
        }
        const char *msg = NULL;
        if ((j.mode == MODE_FED) != (c->job.mode == MODE_FED)) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "a job switches between bsp, asp and ssp; a federated job is submitted as one "
                                  "(psctl job submit --mode fed)");
                return;
        }
        if (c->job.ntables > 0 && j.mode != c->job.mode) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "a job with tables keeps its mode for now: its shards' parked table rows do not "
                                  "switch between bsp and asp");
                return;
        }
        if (c->ckpt.active) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE,
                                  "a checkpoint is being written: try again when it is done");
                return;
        }
        if (c->state == JOB_RUNNING) {
                coord_fence_start(c, true, j.mode, j.staleness);
                msg = "switching at the next clock boundary";
        } else {
                c->job.mode = j.mode;
                c->job.staleness = j.staleness;
        }
        log_info("mode change requested mode=%s", job_mode_string(&j, mode, sizeof mode));
        (void) coord_reply_job(c, &m->route, m->hdr->seq, msg);
}

static size_t rejoining(const Coord *c) {
        size_t n = 0;
        for (size_t i = 0; i < c->npeers; i++)
                n += c->peers[i].detached;
        return n;
}

void coord_metrics(void *ud, MetricsBuf *b) {
        Coord *c = ud;
        char mode[32], id[16];
        metrics_family(b, "psnet_pscoord_job_state", "gauge", "The job's state (1 for the current one).");
        static const JobState states[] = { JOB_WAITING, JOB_RUNNING, JOB_DONE, JOB_STOPPED, JOB_FAILED };
        for (size_t i = 0; i < ELEMENTSOF(states); i++)
                metrics_sample(b, "psnet_pscoord_job_state", c->state == states[i] ? 1 : 0, "state",
                               job_state_name(states[i]), NULL);
        metrics_family(b, "psnet_pscoord_job_info", "gauge", "The job (always 1).");
        snprintf(id, sizeof id, "%u", c->job.id);
        metrics_sample(b, "psnet_pscoord_job_info", 1, "job", id, "model", c->job.model_name, "mode",
                       job_mode_string(&c->job, mode, sizeof mode), NULL);
        size_t members = 0, shards_in_map = c->map ? shardmap_size(c->map) : 0;
        for (size_t i = 0; i < c->npeers; i++)
                members += c->peers[i].role == PSNET__ROLE__ROLE_WORKER && c->peers[i].member;
        metrics_one(b, "psnet_pscoord_shards", "gauge", "Shards registered.", (double) coord_count_role(c, PSNET__ROLE__ROLE_SERVER));
        metrics_one(b, "psnet_pscoord_shards_in_map", "gauge", "Shards in the current map.", (double) shards_in_map);
        metrics_one(b, "psnet_pscoord_workers", "gauge", "Workers registered.", (double) coord_count_role(c, PSNET__ROLE__ROLE_WORKER));
        metrics_one(b, "psnet_pscoord_members", "gauge", "Workers in the membership.", (double) members);
        metrics_one(b, "psnet_pscoord_map_epoch", "gauge", "The shard map's epoch.", (double) c->map_epoch);
        metrics_one(b, "psnet_pscoord_members_epoch", "gauge", "The membership's epoch.", (double) c->members_epoch);
        metrics_one(b, "psnet_pscoord_state_writes_total", "counter", "Writes of pscoord's state (--state-dir).",
                    (double) c->state_writes);
        metrics_one(b, "psnet_pscoord_state_write_failures_total", "counter",
                    "Writes of pscoord's state that failed (a restart would go back to the last one written).",
                    (double) c->state_failures);
        metrics_one(b, "psnet_pscoord_peers_rejoining", "gauge",
                    "Peers known from the state file that have not registered again since pscoord started.",
                    (double) rejoining(c));
        metrics_one(b, "psnet_pscoord_checkpoints_total", "counter", "Checkpoints saved.", (double) c->checkpoints);
        metrics_one(b, "psnet_pscoord_fed_rounds_total", "counter", "A federated job's aggregated rounds.",
                    (double) c->fed.done);
        if (c->job.mode == MODE_FED && c->job.fed.strategy.dp_noise > 0)
                metrics_one(b, "psnet_pscoord_fed_epsilon", "gauge",
                            "The privacy a private federated job has spent so far (epsilon at its --dp-delta).",
                            c->fed.epsilon);
        metrics_one(b, "psnet_pscoord_fed_rounds_failed_total", "counter",
                    "Federated rounds that ran again (too few updates).", (double) c->fed.failed);
        metrics_one(b, "psnet_pscoord_fed_late_updates_total", "counter",
                    "Federated updates that came after their round closed (refused).", (double) c->fed.late);
        metrics_one(b, "psnet_pscoord_fed_refused_updates_total", "counter",
                    "Federated updates their clients declined (training failed or made no usable update).",
                    (double) c->fed.refused);
        metrics_one(b, "psnet_pscoord_checkpoint_failures_total", "counter", "Checkpoint saves given up.",
                    (double) c->checkpoint_failures);
        /* Series that have no value yet are left out, not NaN (an alert's
         * comparison with NaN is never true). */
        if (c->last_ckpt.valid) {
                metrics_one(b, "psnet_pscoord_checkpoint_clock", "gauge", "The clock of the newest checkpoint.",
                            (double) c->last_ckpt.clock);
                metrics_one(b, "psnet_pscoord_checkpoint_timestamp_seconds", "gauge",
                            "When the newest checkpoint was made (seconds since the epoch): its age is time() - this.",
                            (double) c->last_ckpt.created_ms / 1000.0);
        }
        if (c->cfg->checkpoint_every && c->state == JOB_RUNNING) {
                /* How far the job is past the checkpoint that was due. */
                int64_t at = coord_checkpoint_progress(c, NULL);
                metrics_one(b, "psnet_pscoord_checkpoint_every", "gauge",
                            "--checkpoint-every: clocks (rounds of a federated job) between checkpoints.",
                            (double) c->cfg->checkpoint_every);
                metrics_one(b, "psnet_pscoord_checkpoint_overdue", "gauge",
                            "Clocks (rounds) the job is past the one its next checkpoint was due at (0: none due).",
                            at > c->ckpt_next_clock ? (double) (at - c->ckpt_next_clock) : 0.0);
        }
        metrics_one(b, "psnet_pscoord_failovers_total", "counter",
                    "Shards lost by this job and replaced by their backups.", (double) c->failovers);
        if (c->has_accuracy)
                metrics_one(b, "psnet_pscoord_accuracy", "gauge", "The job's test accuracy (left out before it is known).",
                            c->accuracy);
        metrics_one(b, "psnet_pscoord_registrations_total", "counter", "Registrations accepted.", (double) c->registrations);
        metrics_one(b, "psnet_pscoord_lease_expiries_total", "counter", "Peers dropped for silence.", (double) c->expiries);
        metrics_one(b, "psnet_pscoord_connections_closed_total", "counter",
                    "Control connections closed: peers that left, or sent a frame over the control limit.",
                    (double) c->closed);
        metrics_one(b, "psnet_pscoord_memory_purged_bytes_total", "counter",
                    "Freed memory given back to the system after connections closed or messages were refused.",
                    (double) c->purge.purged);
        metrics_family(b, "psnet_pscoord_heartbeat_gap_max_seconds", "gauge",
                       "The longest silence between two heartbeats of a peer (choose leases above it).");
        metrics_sample(b, "psnet_pscoord_heartbeat_gap_max_seconds", (double) c->hb_gap_max[0] / 1000.0, "role",
                       "worker", NULL);
        metrics_sample(b, "psnet_pscoord_heartbeat_gap_max_seconds", (double) c->hb_gap_max[1] / 1000.0, "role",
                       "shard", NULL);
        metrics_one(b, "psnet_pscoord_sole_copy_waits_total", "counter",
                    "Shards silent past --shard-lease-ms given --lease-ms instead: they held the only copy of a key.",
                    (double) c->sole_waits);
        metrics_one(b, "psnet_pscoord_evictions_total", "counter", "Workers evicted for stalling the others.",
                    (double) c->evictions);
        metrics_one(b, "psnet_pscoord_requests_total", "counter", "Control messages received.", (double) c->requests);
        metrics_one(b, "psnet_pscoord_refused_total", "counter", "Control messages refused.", (double) c->refused);
        metrics_histogram(b, "psnet_pscoord_request_seconds", "Time to handle a control message.", &c->latency);
        /* Per worker, from its heartbeats. Rates are PromQL's: rate(psnet_pscoord_worker_samples_total[1m]). */
        static const struct { const char *name, *type, *help; } wm[] = {
                { "psnet_pscoord_worker_clock", "gauge", "A worker's clock (steps completed)." },
                { "psnet_pscoord_worker_steps_total", "counter", "Steps a worker trained since it joined." },
                { "psnet_pscoord_worker_samples_total", "counter", "Samples a worker trained on since it joined." },
                { "psnet_pscoord_worker_loss", "gauge", "A worker's recent training loss (left out until it has one)." },
                { "psnet_pscoord_worker_epoch", "gauge", "The epoch a worker is in." },
        };
        for (size_t k = 0; k < ELEMENTSOF(wm); k++) {
                metrics_family(b, wm[k].name, wm[k].type, wm[k].help);
                for (size_t i = 0; i < c->npeers; i++) {
                        const Peer *p = &c->peers[i];
                        if (p->role != PSNET__ROLE__ROLE_WORKER || (k == 3 && (!p->worker.has_loss || !isfinite(p->worker.loss))))
                                continue;
                        double v = k == 0 ? (double) p->worker.clock : k == 1 ? (double) p->worker.step
                                   : k == 2 ? (double) p->worker.samples : k == 3 ? p->worker.loss : (double) p->worker.epoch;
                        snprintf(id, sizeof id, "%u", p->id);
                        metrics_sample(b, wm[k].name, v, "worker", id, NULL);
                }
        }
}

void coord_status(void *ud, char *buf, size_t n) {
        Coord *c = ud;
        snprintf(buf, n, "job %u %s: %zu shards, %zu workers", c->job.id, job_state_name(c->state),
                 coord_count_role(c, PSNET__ROLE__ROLE_SERVER), coord_count_role(c, PSNET__ROLE__ROLE_WORKER));
}
