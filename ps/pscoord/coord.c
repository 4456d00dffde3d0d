/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord: the loop. One thread, one uv_loop: the control ROUTER and its
 * handler table, a timer for leases, stragglers and fences, signals and the
 * HTTP endpoint (service.c), and the flush of what each loop turn asked for
 * (coord_todo): the state saved, the job, map and membership pushed to the
 * peers as MSG_CONFIG (coord-map.c), a checkpoint stepped, the rounds
 * driven. See coord-internal.h for the other files and their order. */
#include <time.h>
#include "coord-internal.h"
#include "fdguard.h"

/* --- the messages pscoord serves: its handler table ------------------------------------ */

#define ROW(name) static void name##_row(void *d, WireMsg *m, void *p) { (void) p; name(d, m); }
#define PEER_ROW(name) static void name##_row(void *d, WireMsg *m, void *p) { name(d, m, p); }
ROW(coord_handle_register)
ROW(coord_handle_status)
ROW(coord_handle_job_submit)
ROW(coord_handle_job_stop)
ROW(coord_handle_drain)
ROW(coord_handle_job_mode)
ROW(coord_handle_fence_rep)
ROW(coord_handle_checkpoint)
ROW(coord_handle_checkpoint_list)
ROW(coord_handle_checkpoint_restore)
ROW(coord_handle_history)
PEER_ROW(coord_handle_heartbeat)
PEER_ROW(coord_handle_checkpoint_rep)
PEER_ROW(coord_handle_result)
PEER_ROW(coord_handle_round_rep)
PEER_ROW(coord_handle_deregister)
static void shard_add_row(void *d, WireMsg *m, void *p) { (void) p; coord_handle_shard_change(d, m, true); }
static void shard_remove_row(void *d, WireMsg *m, void *p) { (void) p; coord_handle_shard_change(d, m, false); }
#undef ROW
#undef PEER_ROW

static void *find_peer(void *d, const WireMsg *m) {
        return coord_find_route(d, &m->route);
}

#define T(x) [PSNET__MSG_TYPE__MSG_##x]
static const DispatchRow rows[] = {
        T(REGISTER) = { coord_handle_register_row },
        T(STATUS) = { coord_handle_status_row },
        T(JOB_SUBMIT) = { coord_handle_job_submit_row },
        T(JOB_STOP) = { coord_handle_job_stop_row },
        T(DRAIN) = { coord_handle_drain_row },
        T(JOB_MODE) = { coord_handle_job_mode_row },
        T(FENCE_REP) = { coord_handle_fence_rep_row },
        T(SHARD_ADD) = { shard_add_row },
        T(SHARD_REMOVE) = { shard_remove_row },
        T(CHECKPOINT) = { coord_handle_checkpoint_row },
        T(CHECKPOINT_LIST) = { coord_handle_checkpoint_list_row },
        T(CHECKPOINT_RESTORE) = { coord_handle_checkpoint_restore_row },
        T(HISTORY) = { coord_handle_history_row },
        T(HEARTBEAT) = { coord_handle_heartbeat_row, .needs_peer = true },
        T(CHECKPOINT_REP) = { coord_handle_checkpoint_rep_row, .needs_peer = true },
        T(RESULT) = { coord_handle_result_row, .needs_peer = true },
        T(ROUND_REP) = { coord_handle_round_rep_row, .needs_peer = true },
        T(DEREGISTER) = { coord_handle_deregister_row, .needs_peer = true },
};
#undef T

const DispatchTable coord_dispatch = {
        .daemon = "pscoord", .at_coord = true, .rows = rows, .nrows = ELEMENTSOF(rows), .find_peer = find_peer,
        .no_peer_reason = "not registered (or the lease expired): register first",
};

static void handle_message(Coord *c, WireMsg *m) {
        char reason[160];
        int st = dispatch_message(&coord_dispatch, &c->id, c, m, reason, sizeof reason);
        if (st == PSNET__STATUS__STATUS_DENIED) {
                c->errors++;
                if (log_limit_by(&c->refusals, wire_refusal_key(&m->route, st), "refused requests"))
                        log_warning("refused request reason=\"%s\" status=denied key=%s name=%s", reason,
                                    m->peer.fingerprint[0] ? m->peer.fingerprint : "-",
                                    m->peer.name[0] ? m->peer.name : "-");
                (void) netsock_send_error(c->ctl, &m->route, st, m->hdr->seq, reason);
        } else if (st != PSNET__STATUS__STATUS_OK)
                coord_reply_error(c, &m->route, m->hdr->seq, st, reason);
}

static double mono_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void coord_on_msg(NetSock *ns, WireMsg *m, int r, void *ud) {
        Coord *c = ud;
        (void) ns;
        c->requests++;
        if (r == 0) {
                uint64_t errors = c->errors;
                double t0 = mono_s();
                handle_message(c, m);
                histogram_observe(&c->latency, mono_s() - t0);
                c->refused += c->errors != errors;
        }
        else {
                alloc_purge_soon(&c->purge, now_ms()); /* what the refused message held */
                if (m->has_route) {
                        c->refused++;
                        coord_reply_error(c, &m->route, m->hdr ? m->hdr->seq : 0, m->status, m->reason);
                }
        }
}

/* A control connection closed: what it held (a message begun, frames over
 * the limit) is freed by libzmq about now. */
static void coord_on_ctl_event(NetSock *ns, int event, int value, const char *why, void *ud) {
        Coord *c = ud;
        (void) ns, (void) value, (void) why;
        if (event != ZMQ_EVENT_DISCONNECTED)
                return;
        uint64_t now = now_ms();
        alloc_purge_soon(&c->purge, now);
        c->closed++;
        /* libzmq drops a connection that sends a frame over the limit as if
         * its peer left: both logged, with the limit, 10 lines per 10 s. */
        if (log_window(&c->closed_lines, now))
                log_info("connection closed (the peer left, or sent a frame over the control limit of %d bytes)",
                         COORD_MAX_FRAME);
}

static void coord_on_tick(uv_timer_t *t) {
        Coord *c = t->data;
        uint64_t now = now_ms(), gap = c->last_tick ? now - c->last_tick : 0;
        c->last_tick = now;
        if (gap > MIN(c->cfg->lease_ms, c->cfg->shard_lease_ms) / 2) {
                /* pscoord itself did not run (stopped, starved): the heartbeats
                 * waiting in its queue are not read yet, so silence proves nothing.
                 * Every lease starts again; the peers' own (shorter) leases keep
                 * them from acknowledging meanwhile. */
                log_warning("pscoord did not run for %lu ms: every lease starts again", (unsigned long) gap);
                for (size_t i = 0; i < c->npeers; i++)
                        c->peers[i].last_seen = now;
        }
        /* jemalloc keeps freed pages: what refused messages and closed
         * connections held would stay resident for good. */
        (void) alloc_purge_due(&c->purge, now, "connections closed or messages refused");
        coord_expire_leases(c);
        coord_evict_stragglers(c);
        coord_fence_tick(c);
        coord_checkpoint_tick(c);
        coord_todo(c, TODO_FED_POLL);
}

/* --- the loop turn's flags -------------------------------------------------------------- */

void coord_flush(Coord *c) {
        /* What a pass does may ask for more (a round done is saved): a few
         * passes, then the next turn. Publishing comes before driving the
         * rounds, so that edge workers know the job before its first round. */
        for (int pass = 0; c->todo && pass < 4; pass++) {
                unsigned t = c->todo;
                c->todo = 0;
                if (t & TODO_SAVE)
                        coord_state_save(c); /* on disk before any peer acts on it */
                if (t & TODO_PUBLISH_STATE)
                        coord_publish_state(c);
                else if (t & TODO_PUBLISH)
                        coord_publish(c);
                if (t & TODO_CHECKPOINT)
                        coord_checkpoint_step(c);
                if (t & TODO_FED_POLL)
                        coord_fed_poll(c);
        }
}

/* Before the loop waits (what timers asked for), and right after the I/O
 * callbacks (what messages asked for): whichever comes first. */
static void on_prepare(uv_prepare_t *h) {
        coord_flush(h->data);
}

static void on_check(uv_check_t *h) {
        coord_flush(h->data);
}

static void coord_stop(void *ud, int signo) {
        Coord *c = ud;
        (void) signo;
        service_stopping(c->service);
        uv_stop(&c->loop);
}

/* SIGHUP: the allow-list is read again (a key added or withdrawn). */
static void coord_reload(void *ud) {
        zap_sighup(((Coord *) ud)->zap);
}

int coord_run(const CoordConfig *cfg) {
        Coord c = { .cfg = cfg, .job = cfg->job, .state = JOB_WAITING, .state_lock = -1, .clock_stride = 1 };
        char mode[32];
        int r;

        c.start_ms = now_ms();
        r = uv_loop_init(&c.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        const ServiceOps sops = { .stop = coord_stop, .reload = coord_reload, .metrics = coord_metrics,
                                  .status = coord_status };
        r = service_new(&c.loop, "pscoord", &sops, &c, &c.service);
        if (r < 0) {
                log_error_errno(r, "Failed to set up signals: %m");
                goto finish;
        }
        /* A control message is a header: one begun past a few frames' worth
         * is dropped before it is read whole (it was held whole: 2 GiB). */
        fdguard_message_bound(COORD_MAX_MESSAGE);
        fdguard_message_time(cfg->idle_timeout * 1000ull);
        c.zctx = zmq_ctx_new();
        if (!c.zctx) {
                r = log_error_errno(errno, "Failed to create ZeroMQ context: %m");
                goto finish;
        }
        (void) zmq_ctx_set(c.zctx, ZMQ_IO_THREADS, 1);
        char err[512];
        /* -EINVAL: a configuration error, exit status 2. */
        r = zap_daemon_keys(&c.loop, c.zctx, cfg->keys, cfg->key ? cfg->key : "pscoord", NULL, PSNET__ROLE__ROLE_SERVER,
                            wire_roles_at(false), cfg->listen, cfg->insecure, &c.id, &c.zap);
        if (r < 0)
                goto finish;
        /* Control messages are small (a job spec is a few KiB) and few per peer. */
        const NetSockConf nc = { .type = ZMQ_ROUTER, .name = "control", .max_msg = COORD_MAX_FRAME, .sndhwm = 64,
                                 .rcvhwm = 64, .heartbeat_ms = cfg->idle_timeout * 1000u / 3u,
                                 .keys = c.id.enabled ? &c.id.keys : NULL, .curve_server = true,
                                 .zap_domain = c.id.enabled ? "psnet" : NULL };
        r = netsock_new(&c.loop, c.zctx, &nc, coord_on_msg, &c, &c.ctl);
        if (r == 0)
                r = netsock_monitor(c.ctl, ZMQ_EVENT_DISCONNECTED, coord_on_ctl_event);
        if (r < 0) {
                log_error_errno(r, "Failed to create the control socket: %m");
                goto finish;
        }
        r = netsock_bind(c.ctl, cfg->listen);
        if (r < 0) {
                log_error_errno(r, "Failed to bind %s: %m", cfg->listen);
                goto finish;
        }
        if (cfg->http && (r = service_http(c.service, cfg->http, err, sizeof err)) < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto finish;
        }
        r = uv_prepare_init(&c.loop, &c.flush_prepare);
        if (r == 0)
                r = uv_check_init(&c.loop, &c.flush_check);
        if (r == 0) {
                c.flush_prepare.data = c.flush_check.data = &c;
                r = uv_prepare_start(&c.flush_prepare, on_prepare);
        }
        if (r == 0)
                r = uv_check_start(&c.flush_check, on_check);
        if (r == 0)
                r = uv_timer_init(&c.loop, &c.tick);
        if (r == 0) {
                c.tick.data = &c;
                unsigned every = MAX(MIN(cfg->lease_ms, cfg->shard_lease_ms) / 8, 20u);
                r = uv_timer_start(&c.tick, coord_on_tick, every, every);
        }
        if (r < 0) {
                log_error_errno(r, "Failed to start the lease timer: %m");
                goto finish;
        }
        r = coord_state_open(&c, err, sizeof err);
        if (r < 0) {
                log_error("cannot use the state directory reason=\"%s\"", err);
                r = -EINVAL;
                goto finish;
        }
        bool loaded = r > 0;
        if (loaded && cfg->restore)
                log_warning("--restore %s ignored: the state directory holds job %u (%s), which goes on", cfg->restore,
                            c.job.id, job_state_name(c.state));
        if (cfg->restore && !loaded) {
                char why[4400];
                if (coord_checkpoint_restore(&c, cfg->restore, why, sizeof why) != PSNET__STATUS__STATUS_OK) {
                        log_error("cannot restore reason=\"%s\"", why);
                        r = -EINVAL;
                        goto finish;
                }
        }
        service_ready(c.service);
        log_info("listening endpoint=%s job=%u model=%s mode=%s expect_shards=%u expect_workers=%u security=%s",
                 cfg->listen, c.job.id, c.job.model_name, job_mode_string(&c.job, mode, sizeof mode),
                 c.job.expect_shards, c.job.expect_workers, c.id.enabled ? "curve" : "none");
        r = uv_run(&c.loop, UV_RUN_DEFAULT);
        r = r < 0 ? r : 0;
finish:
        if (c.ckpt.has_route)
                zmq_msg_close(&c.ckpt.route);
        for (size_t i = 0; i < c.ckpt.nfiles; i++)
                ps_free(c.ckpt.files[i].file);
        ps_free(c.ckpt.files);
        for (size_t i = 0; i < c.npeers; i++)
                coord_peer_done(&c.peers[i]);
        ps_free(c.peers);
        ps_free(c.rows_whole);
        ps_free(c.clocks);
        ps_free(c.prev_ids);
        shardmap_free(c.map);
        coord_state_close(&c);
        coord_fed_free(&c);
        c.ctl = netsock_close(c.ctl);
        c.zap = zap_free(c.zap);
        c.service = service_free(c.service);
        if (uv_is_active((uv_handle_t *) &c.tick) || c.tick.data)
                uv_close((uv_handle_t *) &c.tick, NULL);
        if (c.flush_prepare.data)
                uv_close((uv_handle_t *) &c.flush_prepare, NULL);
        if (c.flush_check.data)
                uv_close((uv_handle_t *) &c.flush_check, NULL);
        uv_run(&c.loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
        if (uv_loop_close(&c.loop) < 0)
                log_debug("event loop closed with handles open");
        if (c.zctx)
                zmq_ctx_term(c.zctx);
        return r;
}
