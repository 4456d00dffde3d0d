/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's checkpoints: save (fence, boundary, every shard writes, then the
 * manifest), --checkpoint-every with --checkpoint-keep, list, and restore (the
 * job from a manifest, its shards loading their keys). See
 * docs/durability.md, "Checkpoints". */
#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ckpt-file.h"
#include "ckpt-manifest.h"
#include "coord-internal.h"

static void ckpt_path(const Coord *c, const char *name, char *buf, size_t n) {
        snprintf(buf, n, "%s/%s", c->cfg->checkpoint_dir, name);
}

/* Removes a checkpoint's files: the manifest first, so that it stops being
 * one before anything else goes. */
static void ckpt_remove(const Coord *c, const char *name) {
        char dir[PATH_MAX], path[PATH_MAX + 300];
        ckpt_path(c, name, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        (void) unlink(path);
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
                if (strncmp(e->d_name, "shard-", 6) != 0 && strncmp(e->d_name, CKPT_MANIFEST, 8) != 0)
                        continue;
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                (void) unlink(path);
        }
        if (d)
                closedir(d);
        if (rmdir(dir) < 0 && errno != ENOENT)
                log_warning("could not remove %s: %s", dir, strerror(errno));
}

static void abandon(Coord *c, const char *name) {
        char dir[PATH_MAX], path[PATH_MAX + 16];
        struct stat st;
        if (!c->cfg->checkpoint_dir)
                return;
        ckpt_path(c, name, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        if (stat(path, &st) == 0)
                return; /* it was finished: the manifest comes last */
        log_warning("checkpoint abandoned name=%s: pscoord stopped while it was being written; its files are removed",
                    name);
        c->checkpoint_failures++;
        ckpt_remove(c, name);
}

static void reply_save(Coord *c, int status, const char *reason, const Psnet__CheckpointRep *rep) {
        CkptSave *k = &c->ckpt;
        if (!k->has_route)
                return;
        if (status != PSNET__STATUS__STATUS_OK)
                (void) coord_reply_error(c, &k->route, k->route_seq, status, reason);
        else {
                Psnet__Header h;
                wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT_REP);
                h.body_case = PSNET__HEADER__BODY_CHECKPOINT_REP;
                h.checkpoint_rep = (Psnet__CheckpointRep *) rep;
                (void) coord_reply_hdr(c, &k->route, &h, k->route_seq);
        }
        zmq_msg_close(&k->route);
        k->has_route = false;
}

static void save_end(Coord *c) {
        CkptSave *k = &c->ckpt;
        for (size_t i = 0; i < k->nfiles; i++)
                ps_free(k->files[i].file);
        ps_free(k->files);
        k->files = NULL;
        k->nfiles = 0;
        k->active = false;
}

/* A save failed: every shard's fence ends, nothing of it stays on disk. */
void coord_checkpoint_fail(Coord *c, int status, const char *reason) {
        CkptSave *k = &c->ckpt;
        if (!k->active)
                return;
        log_error("checkpoint failed name=%s clock=%ld reason=\"%s\"", k->name[0] ? k->name : "-", (long) k->clock,
                  reason);
        c->checkpoint_failures++;
        if (k->dir_made)
                ckpt_remove(c, k->name);
        reply_save(c, status, reason, NULL);
        save_end(c);
        c->ckpt_retry_at = now_ms() + 5000;
        coord_todo(c, TODO_PUBLISH);
}

int coord_checkpoint_start(Coord *c, const char *name, bool automatic, char *reason, size_t n) {
        CkptSave *k = &c->ckpt;
        if (!c->cfg->checkpoint_dir) {
                snprintf(reason, n, "pscoord has no --checkpoint-dir");
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (c->state != JOB_RUNNING || !c->map) {
                snprintf(reason, n, "job %u is not running (it is %s)", c->job.id, job_state_name(c->state));
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (k->active) {
                snprintf(reason, n, "checkpoint %s is being written: wait for it", k->name[0] ? k->name : "(unnamed)");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        if (c->fence.active) {
                snprintf(reason, n, "a membership change is being agreed: try again in a moment");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        if (name && name[0]) {
                char dir[PATH_MAX];
                struct stat st;
                if (!ckpt_name_valid(name)) {
                        snprintf(reason, n, "bad checkpoint name '%.64s' (1-64 of A-Z a-z 0-9 . _ -, not starting "
                                 "with '.')", name);
                        return PSNET__STATUS__STATUS_INVALID;
                }
                ckpt_path(c, name, dir, sizeof dir);
                if (stat(dir, &st) == 0) {
                        snprintf(reason, n, "checkpoint %s exists", name);
                        return PSNET__STATUS__STATUS_INVALID;
                }
        }
        *k = (CkptSave) { .active = true, .automatic = automatic, .started = now_ms() };
        snprintf(k->name, sizeof k->name, "%s", name ? name : "");
        if (c->job.mode == MODE_FED) {
                /* No fence: the cut is between two rounds (or buffers), which
                 * coord_fed_poll holds back until every shard has written. */
                k->fed_wait = true;
                return PSNET__STATUS__STATUS_OK;
        }
        coord_fence_start(c, false, c->job.mode, c->job.staleness);
        c->fence.checkpoint = true;
        return PSNET__STATUS__STATUS_OK;
}

/* Every shard answered the fence: pick the boundary and ask them to write. */
void coord_checkpoint_fenced(Coord *c) {
        CkptSave *k = &c->ckpt;
        const FenceClocks *f = &c->ckpt.clocks;
        char dir[PATH_MAX], reason[PATH_MAX + 64];
        bool fed = c->job.mode == MODE_FED;
        k->clock = fed ? (int64_t) c->fed.done : c->job.mode == MODE_BSP ? f->max_clock + 1 : f->max_wclock + 2;
        if (!k->name[0])
                snprintf(k->name, sizeof k->name, "%s-%ld", k->automatic ? "auto" : fed ? "round" : "clock",
                         (long) k->clock);
        ckpt_path(c, k->name, dir, sizeof dir);
        if (mkdir(c->cfg->checkpoint_dir, 0700) < 0 && errno != EEXIST) {
                snprintf(reason, sizeof reason, "creating %s: %s", c->cfg->checkpoint_dir, strerror(errno));
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_INTERNAL, reason);
                return;
        }
        if (mkdir(dir, 0700) < 0) {
                snprintf(reason, sizeof reason, "creating %s: %s", dir, strerror(errno));
                coord_checkpoint_fail(c, errno == EEXIST ? PSNET__STATUS__STATUS_INVALID
                                                         : PSNET__STATUS__STATUS_INTERNAL, reason);
                return;
        }
        k->dir_made = true;
        coord_state_save(c); /* so that a restart removes it if it never ends */
        k->seq = ++c->fence_seq;
        k->deadline = now_ms() + (uint64_t) c->cfg->checkpoint_timeout * 1000u;
        Psnet__Checkpoint ck = PSNET__CHECKPOINT__INIT;
        ck.name = k->name;
        ck.dir = dir;
        ck.has_clock = true;
        ck.clock = k->clock;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT);
        h.body_case = PSNET__HEADER__BODY_CHECKPOINT;
        h.checkpoint = &ck;
        size_t ns = shardmap_size(c->map);
        k->files = ps_calloc(ns ? ns : 1, sizeof *k->files);
        if (!k->files) {
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        for (size_t i = 0; i < ns; i++) {
                Peer *p = coord_find_peer(c, PSNET__ROLE__ROLE_SERVER, shardmap_shard(c->map, i)->id);
                int r = p ? coord_reply_hdr(c, &p->route, &h, k->seq) : -ENOTCONN;
                if (r < 0) {
                        snprintf(reason, sizeof reason, "cannot reach shard %u: %s", shardmap_shard(c->map, i)->id,
                                 strerror(-r));
                        coord_checkpoint_fail(c, PSNET__STATUS__STATUS_UNAVAILABLE, reason);
                        return;
                }
                k->expected++;
        }
        log_info("checkpoint started name=%s clock=%ld shards=%zu", k->name, (long) k->clock, k->expected);
}

/* Whether --checkpoint-every may start a save now (when one is due). */
static bool automatic_allowed(const Coord *c, uint64_t now) {
        return !c->ckpt.active && c->cfg->checkpoint_every && c->state == JOB_RUNNING && now >= c->ckpt_retry_at &&
               !c->fence.active;
}

static void start_automatic(Coord *c, uint64_t now);

bool coord_checkpoint_fed_cut(Coord *c) {
        CkptSave *k = &c->ckpt;
        uint64_t now = now_ms();
        /* --checkpoint-every N: after every N rounds aggregated, short of the last. */
        if (automatic_allowed(c, now) && c->fed.done < c->job.fed.rounds &&
            (int64_t) c->fed.done >= c->ckpt_next_clock)
                start_automatic(c, now);
        if (k->active && k->fed_wait) {
                k->fed_wait = false;
                coord_checkpoint_fenced(c);
        }
        return k->active;
}

/* Calls fn with every checkpoint in --checkpoint-dir (a directory with a
 * manifest, being written or not: those without one are skipped): m is its
 * manifest, or NULL with err saying why it does not read. fn returns false
 * to stop. */
typedef bool (*ScanFn)(void *ud, const char *name, const Psnet__CheckpointManifest *m, const char *err);
static void scan(const Coord *c, ScanFn fn, void *ud) {
        DIR *d = opendir(c->cfg->checkpoint_dir);
        struct dirent *e;
        bool more = true;
        while (d && more && (e = readdir(d))) {
                char dir[PATH_MAX], err[320];
                Psnet__CheckpointManifest *m = NULL;
                if (!ckpt_name_valid(e->d_name))
                        continue;
                ckpt_path(c, e->d_name, dir, sizeof dir);
                int r = ckpt_manifest_read(dir, &m, err, sizeof err);
                if (r == -ENOENT)
                        continue; /* being written, or a save that failed */
                more = fn(ud, e->d_name, r < 0 ? NULL : m, err);
                if (m)
                        psnet__checkpoint_manifest__free_unpacked(m, NULL);
        }
        if (d)
                closedir(d);
}

static uint64_t manifest_bytes(const Psnet__CheckpointManifest *m) {
        uint64_t b = 0;
        for (size_t i = 0; i < m->n_files; i++)
                b += m->files[i]->bytes;
        return b;
}

typedef struct Automatic {
        struct { char name[CKPT_NAME_MAX + 1]; uint64_t at; } found[256];
        size_t n;
} Automatic;

static bool find_automatic(void *ud, const char *name, const Psnet__CheckpointManifest *m, const char *err) {
        Automatic *a = ud;
        (void) err;
        if (m && m->has_automatic && m->automatic) {
                snprintf(a->found[a->n].name, sizeof a->found[a->n].name, "%.64s", name);
                a->found[a->n++].at = m->created_ms;
        }
        return a->n < ELEMENTSOF(a->found);
}

/* The automatic checkpoints beyond --checkpoint-keep go, oldest first. */
static void prune(Coord *c) {
        unsigned keep = c->cfg->checkpoint_keep;
        Automatic a = { .n = 0 };
        if (keep)
                scan(c, find_automatic, &a);
        while (a.n > keep) {
                size_t oldest = 0;
                for (size_t i = 1; i < a.n; i++)
                        if (a.found[i].at < a.found[oldest].at)
                                oldest = i;
                log_info("checkpoint pruned name=%s (--checkpoint-keep %u)", a.found[oldest].name, keep);
                ckpt_remove(c, a.found[oldest].name);
                a.found[oldest] = a.found[--a.n];
        }
}

/* Every shard's file is on disk: the manifest makes it a checkpoint. */
static void save_commit(Coord *c) {
        CkptSave *k = &c->ckpt;
        char dir[PATH_MAX], err[PATH_MAX + 160];
        Psnet__CheckpointManifest m = PSNET__CHECKPOINT_MANIFEST__INIT;
        _cleanup_free_ Psnet__CheckpointFile **fp = ps_calloc(k->nfiles ? k->nfiles : 1, sizeof *fp);
        Psnet__JobSpec *spec = NULL;
        if (!fp || job_to_proto(&c->job, &spec) < 0) {
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        uint64_t bytes = 0, rows = 0;
        uint32_t chunks = 0;
        for (size_t i = 0; i < k->nfiles; i++) {
                fp[i] = &k->files[i];
                bytes += k->files[i].bytes;
                chunks += k->files[i].chunks;
                rows += k->files[i].rows;
        }
        m.name = k->name;
        m.clock = k->clock;
        m.job = spec;
        m.created_ms = unix_ms();
        m.n_files = k->nfiles;
        m.files = fp;
        m.has_base_clock = m.has_samples_before = m.has_workers = m.has_map_epoch = m.has_automatic = true;
        m.base_clock = c->sched.base_clock;
        m.samples_before = c->sched.samples_before;
        m.workers = c->sched.workers;
        m.map_epoch = c->map_epoch;
        m.automatic = k->automatic;
        /* A federated job's rounds and privacy spent, as in the state file. */
        _cleanup_(coord_fed_view_free) FedView fv = { .recs = NULL };
        if (c->job.mode == MODE_FED) {
                if (coord_fed_status(c, &fv) < 0) {
                        job_proto_free(spec);
                        coord_checkpoint_fail(c, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                        return;
                }
                COORD_FED_KEEP(m, c, &fv);
        }
        ckpt_path(c, k->name, dir, sizeof dir);
        int r = ckpt_manifest_write(dir, &m, err, sizeof err);
        job_proto_free(spec);
        if (r < 0) {
                coord_checkpoint_fail(c, r == -ENOSPC ? PSNET__STATUS__STATUS_RESOURCE : PSNET__STATUS__STATUS_INTERNAL,
                                      err);
                return;
        }
        uint64_t ms = now_ms() - k->started;
        log_info("checkpoint saved name=%s clock=%ld bytes=%lu chunks=%u rows=%lu files=%zu ms=%lu", k->name,
                 (long) k->clock, (unsigned long) bytes, chunks, (unsigned long) rows, k->nfiles, (unsigned long) ms);
        snprintf(c->last_ckpt.name, sizeof c->last_ckpt.name, "%s", k->name);
        c->last_ckpt.clock = k->clock;
        c->last_ckpt.bytes = bytes;
        c->last_ckpt.created_ms = m.created_ms;
        c->last_ckpt.valid = true;
        c->checkpoints++;
        c->ckpt_next_clock = k->clock + (int64_t) c->cfg->checkpoint_every;
        Psnet__CheckpointRep rep = PSNET__CHECKPOINT_REP__INIT;
        rep.name = k->name;
        rep.has_clock = rep.has_bytes = rep.has_chunks = rep.has_ms = true;
        rep.clock = k->clock;
        rep.bytes = bytes;
        rep.chunks = chunks;
        rep.has_rows = rows > 0;
        rep.rows = rows;
        rep.ms = ms;
        reply_save(c, PSNET__STATUS__STATUS_OK, NULL, &rep);
        bool automatic = k->automatic;
        save_end(c);
        if (automatic)
                prune(c);
        coord_todo(c, TODO_SAVE | TODO_FED_POLL); /* a federated job's next round, held for the save */
}

void coord_handle_checkpoint_rep(Coord *c, WireMsg *m, Peer *p) {
        const Psnet__CheckpointRep *rep = m->hdr->checkpoint_rep;
        const char *reason = m->hdr->reason ? m->hdr->reason : "no reason given";
        char msg[512];
        bool ok = !m->hdr->has_status || m->hdr->status == PSNET__STATUS__STATUS_OK;
        if (rep->has_init && rep->init) {
                /* A shard built its chunks from the job's --init file, or could not. */
                if (c->state != JOB_RUNNING || !rep->has_job || rep->job != c->job.id)
                        return;
                if (ok) {
                        log_info("shard loaded the initial values shard=%u file=%s keys=%u bytes=%lu ms=%lu", p->id,
                                 c->job.init, rep->chunks, (unsigned long) rep->bytes, (unsigned long) rep->ms);
                        return;
                }
                snprintf(msg, sizeof msg, "shard %u cannot start from the init file: %s", p->id, reason);
                coord_job_fail(c, msg);
                return;
        }
        if (rep->has_restore && rep->restore) {
                if (!c->restore.active || c->state != JOB_RUNNING || !rep->name || strcmp(rep->name, c->restore.name))
                        return;
                if (ok) {
                        log_info("shard restored shard=%u name=%s keys=%u rows=%lu bytes=%lu ms=%lu", p->id,
                                 rep->name, rep->chunks, (unsigned long) rep->rows, (unsigned long) rep->bytes,
                                 (unsigned long) rep->ms);
                        return;
                }
                snprintf(msg, sizeof msg, "shard %u cannot load checkpoint %s: %s", p->id, rep->name, reason);
                coord_job_fail(c, msg);
                return;
        }
        CkptSave *k = &c->ckpt;
        if (!k->active || !k->expected || m->hdr->seq != k->seq)
                return; /* a save given up already */
        if (!ok) {
                snprintf(msg, sizeof msg, "shard %u: %s", p->id, reason);
                coord_checkpoint_fail(c, m->hdr->status, msg);
                return;
        }
        char want[64];
        ckpt_shard_file(p->id, want, sizeof want);
        if (!rep->file || strcmp(rep->file, want) != 0 || !rep->has_bytes || !rep->has_index_crc || k->replies >= k->expected) {
                snprintf(msg, sizeof msg, "shard %u answered for another file", p->id);
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_MALFORMED, msg);
                return;
        }
        Psnet__CheckpointFile *f = &k->files[k->nfiles];
        psnet__checkpoint_file__init(f);
        f->shard = p->id;
        f->file = ps_strdup(want);
        f->bytes = rep->bytes;
        f->index_crc = rep->index_crc;
        f->chunks = rep->chunks;
        f->has_rows = rep->has_rows;
        f->rows = rep->rows;
        if (!f->file) {
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        k->nfiles++;
        if (++k->replies == k->expected)
                save_commit(c);
}

static void start_automatic(Coord *c, uint64_t now) {
        char reason[192];
        int st = coord_checkpoint_start(c, NULL, true, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK) {
                log_warning("automatic checkpoint not started reason=\"%s\"", reason);
                c->ckpt_retry_at = now + 5000;
        }
}

/* Each tick: a save that takes too long is given up; --checkpoint-every starts one. */
void coord_checkpoint_tick(Coord *c) {
        CkptSave *k = &c->ckpt;
        uint64_t now = now_ms();
        if (k->active && k->fed_wait && c->state != JOB_RUNNING) {
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_UNAVAILABLE, "the job ended before its round did");
                return;
        }
        if (k->active && k->expected && now > k->deadline) {
                char reason[160];
                snprintf(reason, sizeof reason, "%zu of %zu shards wrote their file within --checkpoint-timeout %u s",
                         k->replies, k->expected, c->cfg->checkpoint_timeout);
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_UNAVAILABLE, reason);
                return;
        }
        if (!automatic_allowed(c, now) || c->job.mode == MODE_FED)
                return; /* a federated job's: between two rounds, coord_checkpoint_fed_cut */
        /* Every member past the next checkpoint's clock, and still short of the job's end. */
        bool finishing;
        int64_t slowest = coord_checkpoint_progress(c, &finishing);
        if (slowest < 0 || finishing || slowest < c->ckpt_next_clock)
                return;
        start_automatic(c, now);
}

int64_t coord_checkpoint_progress(const Coord *c, bool *ret_finishing) {
        bool finishing = false;
        int64_t at = c->job.mode == MODE_FED ? (int64_t) c->fed.done : -1;
        for (size_t i = 0; c->job.mode != MODE_FED && i < c->npeers; i++) {
                const Peer *p = &c->peers[i];
                if (p->role != PSNET__ROLE__ROLE_WORKER || !p->member)
                        continue;
                finishing |= p->done;
                if (at < 0 || (int64_t) p->worker.clock < at)
                        at = (int64_t) p->worker.clock;
        }
        if (ret_finishing)
                *ret_finishing = finishing;
        return at;
}

void coord_handle_checkpoint(Coord *c, WireMsg *m) {
        char reason[256];
        const char *name = m->hdr->checkpoint->name;
        int st = coord_checkpoint_start(c, name, false, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK) {
                coord_reply_error(c, &m->route, m->hdr->seq, st, reason);
                return;
        }
        CkptSave *k = &c->ckpt;
        zmq_msg_init(&k->route);
        if (zmq_msg_copy(&k->route, &m->route) == 0) {
                k->has_route = true;
                k->route_seq = m->hdr->seq;
        }
        coord_todo(c, TODO_FED_POLL); /* a federated job between rounds: the cut is now */
}

enum { MAX_LISTED = 1024 };

/* --- checking every byte (psctl checkpoint list) --------------------------------- */

/* In the thread pool: every file of the checkpoint in dir at the size and
 * index checksum its manifest says, every record against its CRC. Touches
 * nothing of pscoord's but its input and output. */
static int check_checkpoint(const char *dir, char *why, size_t n) {
        Psnet__CheckpointManifest *m = NULL;
        char path[PATH_MAX + 80];
        void *buf = NULL;
        uint64_t cap = 0;
        int r = ckpt_manifest_read(dir, &m, why, n);
        if (r < 0)
                return r;
        for (size_t f = 0; r == 0 && f < m->n_files; f++) {
                CkptReader *rd = NULL;
                snprintf(path, sizeof path, "%s/%s", dir, m->files[f]->file);
                r = ckpt_open(path, &rd, why, n);
                if (r < 0)
                        break;
                const CkptHeader *h = ckpt_header(rd);
                if (h->index_crc != m->files[f]->index_crc) {
                        snprintf(why, n, "%.200s: not the file its manifest names (index checksum %08x, manifest "
                                 "%08x)", m->files[f]->file, h->index_crc, m->files[f]->index_crc);
                        r = -EBADMSG;
                }
                for (size_t i = 0; r == 0 && i < h->nrec; i++) {
                        uint64_t bytes = ckpt_entry(rd, i)->bytes;
                        if (bytes > cap) {
                                ps_free(buf);
                                cap = bytes;
                                if (!(buf = ps_malloc(cap))) {
                                        snprintf(why, n, "out of memory");
                                        cap = 0;
                                        r = -ENOMEM;
                                        break;
                                }
                        }
                        r = ckpt_read(rd, i, buf, why, n);
                }
                ckpt_close(rd);
        }
        ps_free(buf);
        psnet__checkpoint_manifest__free_unpacked(m, NULL);
        return r;
}

static void check_work(uv_work_t *req) {
        CkptChecks *k = &((Coord *) req->data)->checks;
        k->why[0] = '\0';
        k->result = check_checkpoint(k->dir, k->why, sizeof k->why);
}

static void check_next(Coord *c);

static void check_done(uv_work_t *req, int status) {
        Coord *c = req->data;
        CkptChecks *k = &c->checks;
        CkptCheck *e = &k->known[k->at];
        k->busy = false;
        if (status < 0) /* cancelled: checked again at the next list */
                return;
        if (k->result == -ENOMEM) { /* not the checkpoint's fault: again at the next list */
                log_warning("cannot check checkpoint name=%s reason=\"%s\"", e->name, k->why);
                return;
        }
        if (k->result < 0) {
                e->state = CHECK_BAD;
                snprintf(e->error, sizeof e->error, "%s", k->why);
                log_warning("checkpoint is damaged name=%s reason=\"%s\"", e->name, e->error);
        } else
                e->state = CHECK_OK;
        check_next(c);
}

/* Starts checking the next checkpoint not checked yet (one at a time). */
static void check_next(Coord *c) {
        CkptChecks *k = &c->checks;
        if (k->busy)
                return;
        for (size_t i = 0; i < k->n; i++) {
                if (k->known[i].state != CHECK_PENDING)
                        continue;
                ckpt_path(c, k->known[i].name, k->dir, sizeof k->dir);
                k->at = i;
                k->work.data = c;
                int r = uv_queue_work(&c->loop, &k->work, check_work, check_done);
                if (r < 0)
                        log_warning("cannot check checkpoint name=%s reason=\"%s\"", k->known[i].name,
                                    uv_strerror(r));
                else
                        k->busy = true;
                return;
        }
}

/* The check of checkpoint name made at created_ms: found, or a new one
 * (pending) in a free slot or in place of the oldest result. */
/* The check of checkpoint name made at created_ms, or NULL. */
static CkptCheck *check_find(CkptChecks *k, const char *name, uint64_t created_ms) {
        for (size_t i = 0; i < k->n; i++)
                if (strcmp(k->known[i].name, name) == 0 && k->known[i].created_ms == created_ms)
                        return &k->known[i];
        return NULL;
}

static CkptCheck *check_of(Coord *c, const char *name, uint64_t created_ms) {
        CkptChecks *k = &c->checks;
        CkptCheck *e = check_find(k, name, created_ms);
        if (e)
                return e;
        size_t i = k->n;
        if (i == COORD_CKPT_CHECKS) {
                i = SIZE_MAX;
                for (size_t j = 0; j < k->n; j++)
                        if (!(k->busy && j == k->at) && (i == SIZE_MAX || k->known[j].created_ms < k->known[i].created_ms))
                                i = j;
                if (i == SIZE_MAX)
                        return NULL;
        } else
                k->n++;
        e = &k->known[i];
        *e = (CkptCheck) { .created_ms = created_ms, .state = CHECK_PENDING };
        snprintf(e->name, sizeof e->name, "%.64s", name);
        return e;
}

typedef struct Listing {
        Psnet__CheckpointInfo info[MAX_LISTED];
        Psnet__CheckpointInfo *ip[MAX_LISTED];
        struct { char name[CKPT_NAME_MAX + 1], model[128], mode[32], error[320]; } text[MAX_LISTED];
        size_t n;
        Coord *c;
} Listing;

static bool list_one(void *ud, const char *name, const Psnet__CheckpointManifest *m, const char *err) {
        Listing *l = ud;
        Psnet__CheckpointInfo *in = &l->info[l->n];
        typeof(l->text[0]) *t = &l->text[l->n];
        psnet__checkpoint_info__init(in);
        snprintf(t->name, sizeof t->name, "%.64s", name);
        in->name = t->name;
        if (!m) {
                snprintf(t->error, sizeof t->error, "%s", err);
                in->error = t->error;
        } else {
                const CkptCheck *k = check_of(l->c, name, m->created_ms);
                if (k && k->state == CHECK_BAD) {
                        snprintf(t->error, sizeof t->error, "%s", k->error);
                        in->error = t->error;
                }
                in->has_checked = true;
                in->checked = k && k->state == CHECK_OK;
                Job j;
                char jerr[160];
                in->has_clock = in->has_bytes = in->has_created_ms = in->has_files = true;
                in->clock = m->clock;
                in->created_ms = m->created_ms;
                in->files = (uint32_t) m->n_files;
                in->bytes = manifest_bytes(m);
                if (job_from_proto(m->job, &j, jerr, sizeof jerr) == 0) {
                        in->mode = (char *) job_mode_string(&j, t->mode, sizeof t->mode);
                        snprintf(t->model, sizeof t->model, "%s", j.model_name);
                        in->model = t->model;
                }
        }
        l->ip[l->n] = in;
        return ++l->n < MAX_LISTED;
}

void coord_handle_checkpoint_list(Coord *c, WireMsg *m) {
        if (!c->cfg->checkpoint_dir) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "pscoord has no --checkpoint-dir");
                return;
        }
        _cleanup_free_ Listing *l = ps_calloc(1, sizeof *l);
        if (!l) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        l->c = c;
        scan(c, list_one, l);
        check_next(c);
        size_t n = l->n;
        Psnet__CheckpointInfo **ip = l->ip;
        /* Oldest first. */
        for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && ip[j]->created_ms < ip[j - 1]->created_ms; j--) {
                        Psnet__CheckpointInfo *t = ip[j];
                        ip[j] = ip[j - 1];
                        ip[j - 1] = t;
                }
        Psnet__CheckpointList list = PSNET__CHECKPOINT_LIST__INIT;
        list.n_checkpoints = n;
        list.checkpoints = ip;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT_LIST_REP);
        h.body_case = PSNET__HEADER__BODY_CHECKPOINT_LIST;
        h.checkpoint_list = &list;
        int r = coord_reply_hdr(c, &m->route, &h, m->hdr->seq);
        if (r < 0)
                log_warning_errno(r, "Failed to answer checkpoint list: %m");
}

int coord_checkpoint_restore(Coord *c, const char *name, char *reason, size_t n) {
        char dir[PATH_MAX], err[PATH_MAX + 200], path[PATH_MAX + 80];
        Psnet__CheckpointManifest *m = NULL;
        if (!c->cfg->checkpoint_dir) {
                snprintf(reason, n, "pscoord has no --checkpoint-dir");
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (c->state == JOB_RUNNING) {
                snprintf(reason, n, "job %u is running: stop it first (psctl job stop)", c->job.id);
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (!ckpt_name_valid(name)) {
                snprintf(reason, n, "bad checkpoint name '%.64s'", name ? name : "");
                return PSNET__STATUS__STATUS_INVALID;
        }
        ckpt_path(c, name, dir, sizeof dir);
        int r = ckpt_manifest_read(dir, &m, err, sizeof err);
        if (r < 0) {
                snprintf(reason, n, "checkpoint %s: %s", name, r == -ENOENT ? "no such checkpoint (no manifest)" : err);
                return r == -ENOENT ? PSNET__STATUS__STATUS_INVALID : PSNET__STATUS__STATUS_MALFORMED;
        }
        const CkptCheck *k = check_find(&c->checks, name, m->created_ms);
        if (k && k->state == CHECK_BAD) {
                snprintf(reason, n, "checkpoint %s is damaged: %s", name, k->error);
                psnet__checkpoint_manifest__free_unpacked(m, NULL);
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        /* Every file there with the size the manifest says; the shards check the contents. */
        for (size_t i = 0; i < m->n_files; i++) {
                struct stat st;
                snprintf(path, sizeof path, "%s/%s", dir, m->files[i]->file);
                if (stat(path, &st) < 0 || (uint64_t) st.st_size != m->files[i]->bytes) {
                        snprintf(reason, n, "checkpoint %s: %s: %s", name, path,
                                 errno == ENOENT ? "missing" : "not the size its manifest says");
                        psnet__checkpoint_manifest__free_unpacked(m, NULL);
                        return PSNET__STATUS__STATUS_MALFORMED;
                }
        }
        Job job;
        if (job_from_proto(m->job, &job, err, sizeof err) < 0) {
                snprintf(reason, n, "checkpoint %s: its job: %s", name, err);
                psnet__checkpoint_manifest__free_unpacked(m, NULL);
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        if (job.mode == MODE_FED && (!m->fed || (m->n_fed_rdp && m->n_fed_rdp != RDP_NORDERS &&
                                                   m->n_fed_rdp != RDP_NINT))) {
                snprintf(reason, n, "checkpoint %s: a federated job's checkpoint without its rounds", name);
                psnet__checkpoint_manifest__free_unpacked(m, NULL);
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        /* This cluster's expectations, the checkpoint's job. The job starts
         * when as many workers as the checkpoint's members have joined (each
         * takes the share of the samples its rank had, so a BSP job ends with
         * the weights of the uninterrupted run), unless pscoord was given
         * --workers: then that many. */
        job.expect_shards = c->job.expect_shards;
        job.expect_workers = c->job.expect_workers ? c->job.expect_workers : m->workers;
        coord_job_replace(c, &job);
        c->restore = (RestoreFrom) { .active = true, .clock = m->clock, .base_clock = m->base_clock,
                                     .samples_before = m->samples_before, .workers = m->workers };
        snprintf(c->restore.name, sizeof c->restore.name, "%s", name);
        snprintf(c->restore.dir, sizeof c->restore.dir, "%s", dir);
        snprintf(c->last_ckpt.name, sizeof c->last_ckpt.name, "%s", name);
        c->last_ckpt.clock = m->clock;
        c->last_ckpt.created_ms = m->created_ms;
        c->last_ckpt.bytes = manifest_bytes(m);
        c->last_ckpt.valid = true;
        psnet__checkpoint_manifest__free_unpacked(m, NULL);
        char mode[32];
        log_info("job restored job=%u name=%s clock=%ld model=%s mode=%s workers=%u", c->job.id, name,
                 (long) c->restore.clock, c->job.model_name, job_mode_string(&c->job, mode, sizeof mode),
                 MAX(c->job.expect_workers, 1u));
        return PSNET__STATUS__STATUS_OK;
}

void coord_handle_checkpoint_restore(Coord *c, WireMsg *m) {
        char reason[PATH_MAX + 300], msg[128];
        int st = coord_checkpoint_restore(c, m->hdr->checkpoint->name, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK) {
                coord_reply_error(c, &m->route, m->hdr->seq, st, reason);
                return;
        }
        snprintf(msg, sizeof msg, "job %u restored from %s at clock %ld", c->job.id, c->restore.name,
                 (long) c->restore.clock);
        coord_state_save(c);
        (void) coord_reply_job(c, &m->route, m->hdr->seq, msg);
        coord_maybe_start(c);
}

void coord_checkpoint_step(Coord *c) {
        CkptSave *k = &c->ckpt;
        if (k->abandoned[0]) {
                abandon(c, k->abandoned);
                k->abandoned[0] = '\0';
        }
        int fence = k->fence;
        k->fence = FENCE_NONE;
        if (!k->active)
                return;
        if (fence == FENCE_ANSWERED)
                coord_checkpoint_fenced(c);
        else if (fence == FENCE_GAVE_UP)
                coord_checkpoint_fail(c, PSNET__STATUS__STATUS_UNAVAILABLE, "a shard did not answer the fence within 2 s");
}
