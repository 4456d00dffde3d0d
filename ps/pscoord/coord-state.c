/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's state on disk (--state-dir): the job, the shard map and its
 * epochs, the members and their start clocks, the schedule, the checkpoints.
 * One sealed file (common/ckpt-file.h: magic, CRC-32, length, one CoordState
 * message), written atomically before every change pscoord publishes: the
 * peers never act on a map or a membership that a restarted pscoord would not
 * know. Changes are rare (joins, leaves, fail-overs, boundaries, the job's
 * lifecycle, checkpoints), so one small file rewritten whole is simpler than
 * a journal and as safe. A lock on DIR/lock keeps a second pscoord off the
 * same directory. See docs/durability.md, "pscoord's state". */
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ckpt-file.h"
#include "ckpt-manifest.h"
#include "coord-internal.h"

#define STATE_FILE "pscoord.state"
#define STATE_LOCK "lock"
#define STATE_MAGIC "PSNETCS1"
#define STATE_MAX (64u << 20)

/* How long a peer known from the state file has to register again before
 * its lease counts as run out: long enough for its session to notice the new
 * pscoord (a heartbeat refused, a registration), and never less than two
 * leases. */
static uint64_t rejoin_grace_ms(const Coord *c, const Peer *p) {
        unsigned lease = p->role == PSNET__ROLE__ROLE_WORKER ? c->cfg->lease_ms : c->cfg->shard_lease_ms;
        return MAX(5000u, 2u * lease);
}

static uint64_t job_ms(const Coord *c) {
        if (!c->job_start_ms)
                return 0;
        uint64_t end = c->job_end_ms >= c->job_start_ms ? c->job_end_ms : now_ms();
        return end - c->job_start_ms;
}

/* --- writing ------------------------------------------------------------------------ */

static int build(Coord *c, Psnet__CoordState *st, Psnet__CoordPeer *pv, Psnet__CoordPeer **pp,
                 Psnet__CheckpointInfo *last, Psnet__Checkpoint *rf) {
        int r = job_to_proto(&c->job, &st->job);
        if (r < 0)
                return r;
        if (c->map && (r = shardmap_to_proto(c->map, &st->map)) < 0)
                return r;
        st->state = job_state_to_proto(c->state);
        st->fail_reason = c->fail_reason[0] ? c->fail_reason : NULL;
        st->has_map_epoch = st->has_members_epoch = st->has_next_worker_id = true;
        st->map_epoch = c->map_epoch;
        st->members_epoch = c->members_epoch;
        st->next_worker_id = c->next_worker_id;
        size_t np = 0;
        for (size_t i = 0; i < c->npeers; i++) {
                const Peer *p = &c->peers[i];
                /* Edge workers (and a strategy process) are not kept: they register again as new clients
                 * (the rounds, their history and the privacy spent are kept). */
                if (p->role == PSNET__ROLE__ROLE_EDGE || p->role == PSNET__ROLE__ROLE_STRATEGY)
                        continue;
                Psnet__CoordPeer *q = &pv[np];
                psnet__coord_peer__init(q);
                q->role = p->role;
                q->id = p->id;
                q->endpoint = p->endpoint;
                if (p->has_key) {
                        q->has_public_key = true;
                        q->public_key = (ProtobufCBinaryData) { .len = 32, .data = (uint8_t *) p->public_key };
                }
                q->has_pid = q->has_member = q->has_start_clock = q->has_done = q->has_drain = true;
                q->pid = p->pid;
                q->host = (char *) p->host;
                q->member = p->member;
                q->start_clock = p->start_clock;
                q->done = p->done;
                q->drain = p->drain;
                q->has_memory_limit = q->has_max_msg = true;
                q->memory_limit = p->memory_limit;
                q->max_msg = p->max_msg;
                pp[np++] = q;
        }
        st->n_peers = np;
        st->peers = pp;
        st->n_prev_members = c->nprev;
        st->prev_members = c->prev_ids;
        st->has_switch_clock = st->has_base_clock = st->has_samples_before = st->has_sched_workers = true;
        st->switch_clock = c->switch_clock;
        st->base_clock = c->sched.base_clock;
        st->samples_before = c->sched.samples_before;
        st->sched_workers = c->sched.workers;
        st->has_sched_lost = st->has_evaluator = st->has_finished = st->has_failovers = st->has_weights_digest = true;
        st->sched_lost = c->sched_lost;
        st->evaluator = c->evaluator;
        st->finished = (uint32_t) c->finished;
        st->failovers = c->failovers;
        st->has_lost_shards = st->has_first_map_epoch = true;
        st->lost_shards = c->lost_shards;
        st->first_map_epoch = c->first_map_epoch;
        st->weights_digest = c->weights_digest;
        st->has_accuracy = c->has_accuracy;
        st->accuracy = c->accuracy;
        if (c->restore.active) {
                rf->name = c->restore.name;
                rf->dir = c->restore.dir;
                rf->has_clock = true;
                rf->clock = c->restore.clock;
                st->restored_from = rf;
                st->has_restore_base_clock = st->has_restore_samples_before = st->has_restore_workers = true;
                st->restore_base_clock = c->restore.base_clock;
                st->restore_samples_before = c->restore.samples_before;
                st->restore_workers = c->restore.workers;
        }
        if (c->last_ckpt.valid) {
                last->name = c->last_ckpt.name;
                last->has_clock = last->has_bytes = last->has_created_ms = true;
                last->clock = c->last_ckpt.clock;
                last->bytes = c->last_ckpt.bytes;
                last->created_ms = c->last_ckpt.created_ms;
                st->last_checkpoint = last;
        }
        st->has_checkpoint_next_clock = true;
        st->checkpoint_next_clock = c->ckpt_next_clock;
        if (c->ckpt.active && c->ckpt.dir_made)
                st->checkpoint_writing = c->ckpt.name;
        st->has_job_ms = st->has_written_ms = st->has_checkpoints = st->has_checkpoint_failures = true;
        st->job_ms = job_ms(c);
        st->written_ms = unix_ms();
        st->checkpoints = c->checkpoints;
        st->checkpoint_failures = c->checkpoint_failures;
        return 0;
}

void coord_state_save(Coord *c) {
        if (!c->cfg->state_dir)
                return;
        Psnet__CoordState st = PSNET__COORD_STATE__INIT;
        /* A federated job: its rounds, as psctl sees them, and the privacy spent. */
        _cleanup_(coord_fed_view_free) FedView fv = { .recs = NULL };
        if (c->job.mode == MODE_FED) {
                if (coord_fed_status(c, &fv) < 0) {
                        c->state_failures++;
                        log_error("state not written: out of memory");
                        return;
                }
                COORD_FED_KEEP(st, c, &fv);
                st.has_fed_closing = c->fed.closing != NULL;
                st.fed_closing.len = c->fed.closing_len;
                st.fed_closing.data = c->fed.closing;
        }
        _cleanup_(coord_history_view_free) HistoryView hv = { .recs = NULL };
        if (coord_history_view(c, &hv) < 0) {
                c->state_failures++;
                log_error("state not written: out of memory");
                return;
        }
        st.n_epochs = hv.n;
        st.epochs = hv.recp;
        Psnet__CheckpointInfo last = PSNET__CHECKPOINT_INFO__INIT;
        Psnet__Checkpoint rf = PSNET__CHECKPOINT__INIT;
        _cleanup_free_ Psnet__CoordPeer *pv = ps_calloc(c->npeers ? c->npeers : 1, sizeof *pv);
        _cleanup_free_ Psnet__CoordPeer **pp = ps_calloc(c->npeers ? c->npeers : 1, sizeof *pp);
        char err[PATH_MAX + 160];
        uint8_t *buf = NULL;
        int r = pv && pp ? build(c, &st, pv, pp, &last, &rf) : -ENOMEM;
        size_t len = r == 0 ? psnet__coord_state__get_packed_size(&st) : 0;
        if (r == 0 && (len > STATE_MAX || !(buf = ps_malloc(len ? len : 1))))
                r = -ENOMEM;
        if (r == 0) {
                psnet__coord_state__pack(&st, buf);
                r = ckpt_sealed_write(c->cfg->state_dir, STATE_FILE, STATE_MAGIC, buf, len, err, sizeof err);
        } else
                snprintf(err, sizeof err, "out of memory (or over %u bytes)", STATE_MAX);
        ps_free(buf);
        job_proto_free(st.job);
        shardmap_proto_free(st.map);
        if (r < 0) {
                /* The change goes out all the same: holding a fail-over back
                 * would cost more than a restart that starts from an older state. */
                c->state_failures++;
                log_error("state not written: a pscoord restarted now would go back to the last state written "
                          "reason=\"%s\"", err);
                return;
        }
        c->state_writes++;
        c->todo &= ~TODO_SAVE;
}

/* --- reading ------------------------------------------------------------------------ */

static int load_peer(Coord *c, const Psnet__CoordPeer *q, uint64_t now, char *err, size_t n) {
        if ((q->role != PSNET__ROLE__ROLE_SERVER && q->role != PSNET__ROLE__ROLE_WORKER) || q->id == 0 ||
            (q->has_public_key && q->public_key.len != 32) || (q->endpoint && strlen(q->endpoint) > 255) ||
            (q->host && strlen(q->host) >= sizeof c->peers[0].host) ||
            coord_find_peer(c, q->role, q->id)) {
                snprintf(err, n, "a peer (role %d, id %u) is not valid or appears twice", q->role, q->id);
                return -EBADMSG;
        }
        Peer *np = ps_realloc(c->peers, (c->npeers + 1) * sizeof *np);
        if (!np)
                return -ENOMEM;
        c->peers = np;
        Peer *p = &c->peers[c->npeers];
        memset(p, 0, sizeof *p);
        p->id = q->id;
        p->role = q->role;
        zmq_msg_init(&p->route); /* empty: it has not registered with this pscoord yet */
        p->endpoint = q->endpoint ? ps_strdup(q->endpoint) : NULL;
        if (q->endpoint && !p->endpoint)
                return -ENOMEM;
        c->npeers++;
        if (q->has_public_key) {
                memcpy(p->public_key, q->public_key.data, 32);
                p->has_key = true;
        }
        p->pid = q->pid;
        snprintf(p->host, sizeof p->host, "%s", q->host ? q->host : "");
        p->member = q->member;
        p->start_clock = q->start_clock;
        p->done = q->done;
        p->drain = q->drain;
        p->memory_limit = q->memory_limit;
        p->max_msg = q->max_msg;
        p->detached = true;
        p->last_seen = now;
        p->rejoin_until = now + rejoin_grace_ms(c, p);
        psnet__shard_info__init(&p->shard);
        psnet__worker_info__init(&p->worker);
        return 0;
}

static int apply(Coord *c, const Psnet__CoordState *st, char *err, size_t n) {
        Job job;
        char why[192];
        JobState js;
        if (job_from_proto(st->job, &job, why, sizeof why) < 0) {
                snprintf(err, n, "its job: %s", why);
                return -EBADMSG;
        }
        if (job_state_from_proto(st->state, &js) < 0) {
                snprintf(err, n, "job state %d", st->state);
                return -EBADMSG;
        }
        ShardMap *map = NULL;
        if (st->map && (shardmap_from_proto(st->map, &map) < 0 || !shardmap_fits_job(map, &job))) {
                shardmap_free(map);
                snprintf(err, n, "its shard map does not fit its job");
                return -EBADMSG;
        }
        if (js == JOB_RUNNING && !map) {
                shardmap_free(map);
                snprintf(err, n, "a running job without a shard map");
                return -EBADMSG;
        }
        c->job = job;
        c->state = js;
        c->map = map;
        snprintf(c->fail_reason, sizeof c->fail_reason, "%s", st->fail_reason ? st->fail_reason : "");
        c->map_epoch = st->map_epoch;
        c->members_epoch = st->members_epoch;
        c->next_worker_id = st->next_worker_id;
        uint64_t now = now_ms();
        for (size_t i = 0; i < st->n_peers; i++) {
                int r = load_peer(c, st->peers[i], now, err, n);
                if (r < 0) {
                        if (r == -ENOMEM)
                                snprintf(err, n, "out of memory");
                        return r;
                }
                c->next_worker_id = MAX(c->next_worker_id, st->peers[i]->id);
        }
        if (st->n_prev_members) {
                c->prev_ids = ps_malloc(st->n_prev_members * sizeof *c->prev_ids);
                if (!c->prev_ids) {
                        snprintf(err, n, "out of memory");
                        return -ENOMEM;
                }
                memcpy(c->prev_ids, st->prev_members, st->n_prev_members * sizeof *c->prev_ids);
                c->nprev = st->n_prev_members;
        }
        c->switch_clock = st->switch_clock;
        c->sched = (Schedule) { .base_clock = st->base_clock, .samples_before = st->samples_before,
                                .workers = st->sched_workers, .batch = c->job.batch };
        c->sched_lost = st->sched_lost;
        c->evaluator = st->evaluator;
        c->finished = st->finished;
        c->failovers = st->failovers;
        c->lost_shards = st->lost_shards;
        c->first_map_epoch = st->has_first_map_epoch ? st->first_map_epoch : st->map_epoch;
        c->weights_digest = st->weights_digest;
        c->has_accuracy = st->has_accuracy;
        c->accuracy = st->accuracy;
        int hr = coord_history_restore(c, st->epochs, st->n_epochs, err, n);
        if (hr < 0)
                return hr;
        if (c->job.mode == MODE_FED && st->fed) {
                int r = coord_fed_restore(c, st->fed, st->fed_rdp, st->n_fed_rdp, st->fed_rdp_steps, err, n);
                if (r == 0 && st->has_fed_closing)
                        r = coord_fed_closing(c, &st->fed_closing, err, n);
                if (r < 0)
                        return r;
                log_info("federated rounds from the state file rounds_done=%u number=%lu records=%zu epsilon=%.4f",
                         c->fed.done, (unsigned long) c->fed.number, c->fed.nhist, c->fed.epsilon);
        }
        const Psnet__Checkpoint *rf = st->restored_from;
        if (rf && rf->name && rf->dir && ckpt_name_valid(rf->name)) {
                c->restore = (RestoreFrom) { .active = true, .clock = rf->clock, .base_clock = st->restore_base_clock,
                                             .samples_before = st->restore_samples_before,
                                             .workers = st->restore_workers };
                snprintf(c->restore.name, sizeof c->restore.name, "%s", rf->name);
                snprintf(c->restore.dir, sizeof c->restore.dir, "%s", rf->dir);
        }
        const Psnet__CheckpointInfo *last = st->last_checkpoint;
        if (last && ckpt_name_valid(last->name)) {
                c->last_ckpt.valid = true;
                snprintf(c->last_ckpt.name, sizeof c->last_ckpt.name, "%s", last->name);
                c->last_ckpt.clock = last->clock;
                c->last_ckpt.bytes = last->bytes;
                c->last_ckpt.created_ms = last->created_ms;
        }
        c->ckpt_next_clock = st->checkpoint_next_clock;
        c->checkpoints = st->checkpoints;
        c->checkpoint_failures = st->checkpoint_failures;
        if (st->has_job_ms && (js != JOB_WAITING || st->job_ms)) {
                c->job_start_ms = now - MIN(st->job_ms, now);
                if (js != JOB_RUNNING && js != JOB_WAITING)
                        c->job_end_ms = now;
        }
        return 0;
}

int coord_state_parse(Coord *c, const uint8_t *buf, size_t n, Psnet__CoordState **ret, char *why, size_t whyn) {
        const uint8_t *payload;
        size_t plen;
        int r = ckpt_sealed_open(buf, n, STATE_MAGIC, "pscoord state", &payload, &plen, why, whyn);
        if (r < 0)
                return r;
        Psnet__CoordState *st = psnet__coord_state__unpack(NULL, plen, payload);
        if (!st) {
                snprintf(why, whyn, "the state does not decode");
                return -EBADMSG;
        }
        r = apply(c, st, why, whyn);
        if (r < 0) {
                psnet__coord_state__free_unpacked(st, NULL);
                return r;
        }
        *ret = st;
        return 0;
}

void coord_state_forget(Coord *c) {
        for (size_t i = 0; i < c->npeers; i++)
                coord_peer_done(&c->peers[i]);
        ps_free(c->peers);
        ps_free(c->rows_whole);
        c->rows_whole = NULL;
        c->nrows_whole = 0;
        c->peers = NULL;
        c->npeers = 0;
        ps_free(c->prev_ids);
        c->prev_ids = NULL;
        c->nprev = 0;
        c->map = shardmap_free(c->map);
}

/* Takes DIR/lock, or says which process holds it. */
static int take_lock(Coord *c, char *err, size_t n) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/" STATE_LOCK, c->cfg->state_dir);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
                int e = -errno;
                snprintf(err, n, "%s: %s", path, strerror(-e));
                return e;
        }
        struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
        if (fcntl(fd, F_SETLK, &fl) < 0) {
                int e = -errno;
                struct flock who = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
                if (fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK)
                        snprintf(err, n, "%s is in use by another pscoord (pid %ld): one pscoord per state directory",
                                 c->cfg->state_dir, (long) who.l_pid);
                else
                        snprintf(err, n, "%s: cannot lock: %s", path, strerror(-e));
                (void) close(fd);
                return -EBUSY;
        }
        char pid[32];
        int len = snprintf(pid, sizeof pid, "%ld\n", (long) getpid());
        if (ftruncate(fd, 0) < 0 || ckpt_pwrite_all(fd, pid, (uint64_t) len, 0) < 0)
                log_warning("could not write the pid into %s: %m", path);
        c->state_lock = fd;
        return 0;
}

int coord_state_open(Coord *c, char *err, size_t n) {
        char path[PATH_MAX], why[PATH_MAX + 200];
        c->state_lock = -1;
        if (!c->cfg->state_dir)
                return 0;
        if (mkdir(c->cfg->state_dir, 0700) < 0 && errno != EEXIST) {
                int e = -errno;
                snprintf(err, n, "cannot create %s: %s", c->cfg->state_dir, strerror(-e));
                return e;
        }
        int r = take_lock(c, err, n);
        if (r < 0)
                return r;
        snprintf(path, sizeof path, "%s/" STATE_FILE, c->cfg->state_dir);
        uint8_t *buf = NULL;
        size_t len = 0;
        r = ckpt_sealed_read(path, STATE_MAX, &buf, &len, why, sizeof why);
        if (r == -ENOENT) {
                log_info("no state yet: a new cluster state=%s", path);
                return 0;
        }
        Psnet__CoordState *st = NULL;
        if (r == 0)
                r = coord_state_parse(c, buf, len, &st, why, sizeof why);
        ps_free(buf);
        if (r < 0) {
                snprintf(err, n, "%s: %s (move it away to start a new cluster state)", path, why);
                return r;
        }
        char mode[32];
        size_t shards = coord_count_role(c, PSNET__ROLE__ROLE_SERVER),
               workers = coord_count_role(c, PSNET__ROLE__ROLE_WORKER);
        log_info("state loaded job=%u state=%s mode=%s map_epoch=%lu members_epoch=%lu shards=%zu workers=%zu "
                 "written_ms_ago=%ld path=%s",
                 c->job.id, job_state_name(c->state), job_mode_string(&c->job, mode, sizeof mode),
                 (unsigned long) c->map_epoch, (unsigned long) c->members_epoch, shards, workers,
                 (long) ((int64_t) unix_ms() - (int64_t) st->written_ms), path);
        if (st->checkpoint_writing && ckpt_name_valid(st->checkpoint_writing)) {
                /* Its files go once the loop runs (coord-checkpoint.c). */
                snprintf(c->ckpt.abandoned, sizeof c->ckpt.abandoned, "%s", st->checkpoint_writing);
                coord_todo(c, TODO_CHECKPOINT);
        }
        psnet__coord_state__free_unpacked(st, NULL);
        return 1;
}

void coord_state_close(Coord *c) {
        if (c->state_lock >= 0)
                (void) close(c->state_lock);
        c->state_lock = -1;
}

/* --- a federated round's close, written ahead ---------------------------------------- */

/* An aggregating close is written down before it leaves: the shards may
 * apply it before pscoord records the round done. */
static void closing_write_ahead(Coord *c, const Psnet__Round *rd) {
        FedRounds *f = &c->fed;
        size_t len = psnet__round__get_packed_size(rd);
        uint8_t *b = ps_malloc(MAX(len, (size_t) 1));
        if (!b) {
                log_warning("out of memory: round %lu's close is not written ahead", (unsigned long) rd->number);
                return;
        }
        psnet__round__pack(rd, b);
        ps_free(f->closing);
        f->closing = b;
        f->closing_len = len;
        coord_state_save(c);
}

int coord_fed_closing(Coord *c, const ProtobufCBinaryData *closing, char *err, size_t n) {
        FedRounds *f = &c->fed;
        Psnet__Round *rd = psnet__round__unpack(NULL, closing->len, closing->data);
        bool ok = rd && rd->has_close && rd->close && rd->number == f->number && rd->n_clients > 0;
        if (rd)
                psnet__round__free_unpacked(rd, NULL);
        if (!ok) {
                snprintf(err, n, "its round close in writing is not one of round %lu", (unsigned long) f->number);
                return -EBADMSG;
        }
        f->closing = ps_malloc(MAX(closing->len, (size_t) 1));
        if (!f->closing) {
                snprintf(err, n, "out of memory");
                return -EBADMSG;
        }
        memcpy(f->closing, closing->data, closing->len);
        f->closing_len = closing->len;
        return 0;
}

int coord_fed_send_shards(Coord *c, bool close, const uint32_t *ids, size_t n, Psnet__SecAgg *sa) {
        FedRounds *f = &c->fed;
        _cleanup_free_ ProtobufCBinaryData *keys = ps_calloc(n ? n : 1, sizeof *keys);
        if (!keys)
                return -ENOMEM;
        for (size_t i = 0; c->id.enabled && !close && i < n; i++) {
                Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, ids[i]);
                keys[i] = (ProtobufCBinaryData) { .len = 32, .data = p ? p->public_key : NULL };
                if (!p)
                        return -ENOENT;
        }
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_round = true;
        rd.round = f->done + 1;
        rd.n_clients = n;
        rd.clients = (uint32_t *) ids;
        rd.has_close = close;
        rd.close = close;
        rd.n_keys = c->id.enabled && !close ? n : 0;
        rd.keys = keys;
        rd.secagg = close && n ? sa : NULL;
        if (close && n > 0 && !c->job.fed.async)
                closing_write_ahead(c, &rd);
        return coord_fed_send_round(c, &rd);
}
