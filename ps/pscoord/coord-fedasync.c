/* SPDX-License-Identifier: Apache-2.0 */
/* Asynchronous federated training, --mode fedasync (FedBuff: Nguyen et al.,
 * "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022).
 * No round waits for anyone: every idle edge worker gets a task (MSG_ROUND:
 * train on the model as it is now; number = the task, round = the
 * aggregations done + 1), pulls, trains, pushes its delta under the task's
 * number and answers; the answered updates fill a buffer, and once it holds
 * --buffer of them pscoord tells every shard to apply those (client, task)
 * updates (MSG_ROUND close with tasks and staleness: the aggregations done
 * since each task was given), each weighing its examples x (1 + s)^-A,
 * --staleness-exp A. Meanwhile the other clients train on, and the ones just
 * applied get new tasks. A task not answered within --round-timeout is
 * dropped (its late answer is refused and counted, and the shards drop its
 * update with the next buffer: every close carries the lowest task still
 * live as a watermark). A buffer applied counts as a round for --rounds,
 * the round history and --eval-every; then one edge worker evaluates the
 * final model, as in mode fed. */
#include "coord-internal.h"

static int push_task(FedTask **v, size_t *n, size_t *cap, const FedTask *t) {
        int r = ps_grow(v, cap, *n + 1, sizeof **v, 16);
        if (r == 0)
                (*v)[(*n)++] = *t;
        return r;
}

static bool has_task(const FedRounds *f, uint32_t id) {
        for (size_t i = 0; i < f->ntasks; i++)
                if (f->tasks[i].client == id)
                        return true;
        return false;
}

static void give_task(Coord *c, Peer *p, uint64_t now) {
        FedRounds *f = &c->fed;
        FedTask t = { .client = p->id, .number = ++f->number, .version = f->done, .started_ms = now };
        memcpy(t.key, p->public_key, sizeof t.key); /* with CURVE, the shards check the update came over it */
        if (push_task(&f->tasks, &f->ntasks, &f->cap_tasks, &t) < 0) {
                coord_job_fail(c, "out of memory giving a fedasync task");
                return;
        }
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = t.number;
        rd.has_round = rd.has_timeout_ms = true;
        rd.round = f->done + 1;
        rd.timeout_ms = c->job.fed.round_timeout_ms;
        int r = coord_fed_send_edge(c, p, &rd);
        if (r < 0)
                log_warning_errno(r, "Failed to send task %lu to edge=%u: %m", (unsigned long) t.number, p->id);
}

/* The first buffer's worth of answered updates goes to the shards. */
static void apply(Coord *c, size_t navail) {
        FedRounds *f = &c->fed;
        size_t k = c->job.fed.buffer;
        _cleanup_free_ uint32_t *ids = ps_malloc(k * sizeof *ids);
        _cleanup_free_ uint64_t *tasks = ps_malloc(k * sizeof *tasks);
        _cleanup_free_ uint32_t *stale = ps_malloc(k * sizeof *stale);
        _cleanup_free_ ProtobufCBinaryData *keys = ps_calloc(k, sizeof *keys);
        if (!ids || !tasks || !stale || !keys) {
                coord_job_fail(c, "out of memory applying a fedasync buffer");
                return;
        }
        double loss = 0, smean = 0;
        uint64_t examples = 0, bytes = 0, watermark = f->number + 1;
        uint32_t smax = 0;
        for (size_t i = 0; i < k; i++) {
                const FedTask *t = &f->buf[i];
                ids[i] = t->client;
                tasks[i] = t->number;
                stale[i] = f->done - t->version;
                smax = MAX(smax, stale[i]);
                smean += stale[i];
                loss += (double) t->loss * (double) t->examples;
                examples += t->examples;
                bytes += t->bytes;
                keys[i] = (ProtobufCBinaryData) { .len = 32, .data = (uint8_t *) t->key };
        }
        /* Updates of tasks below the live ones are stale leftovers: dropped. */
        for (size_t i = 0; i < f->ntasks; i++)
                watermark = MIN(watermark, f->tasks[i].number);
        for (size_t i = k; i < f->nbuf; i++)
                watermark = MIN(watermark, f->buf[i].number);
        Psnet__Round rd = PSNET__ROUND__INIT;
        rd.number = f->number;
        rd.has_round = rd.has_close = rd.close = rd.has_watermark = true;
        rd.round = f->done + 1;
        rd.n_clients = rd.n_tasks = rd.n_staleness = k;
        rd.clients = ids;
        rd.tasks = tasks;
        rd.staleness = stale;
        rd.watermark = watermark;
        rd.n_keys = c->id.enabled ? k : 0;
        rd.keys = keys;
        FedRecord *rec = coord_fed_record_new(f);
        rec->number = f->number;
        rec->sampled = rec->answered = (uint32_t) k;
        rec->available = (uint32_t) navail;
        rec->loss = examples ? (float) (loss / (double) examples) : 0.0f;
        rec->bytes_up = bytes;
        rec->bytes_raw = (uint64_t) k * job_nfloats(&c->job) * sizeof(float);
        rec->epsilon = -1;
        rec->accuracy = -1;
        snprintf(rec->note, sizeof rec->note, "staleness mean %.2f max %u", smean / (double) k, smax);
        f->applying = k;
        f->aggregate = true;
        f->phase = FED_CLOSING;
        log_info("buffer applying round=%u/%u updates=%zu staleness_mean=%.2f staleness_max=%u training=%zu",
                 f->done + 1, c->job.fed.rounds, k, smean / (double) k, smax, f->ntasks);
        int r = coord_fed_send_round(c, &rd);
        if (r < 0) {
                char reason[160];
                snprintf(reason, sizeof reason, "cannot apply a buffer on the shards: %s", strerror(-r));
                coord_job_fail(c, reason);
        }
}

void coord_fedasync_poll(Coord *c, uint64_t now) {
        FedRounds *f = &c->fed;
        const FedConf *fc = &c->job.fed;
        /* Tasks past their time-out, or of clients that left, are dropped. */
        for (size_t i = 0; i < f->ntasks;) {
                FedTask *t = &f->tasks[i];
                bool gone = !coord_find_peer(c, PSNET__ROLE__ROLE_EDGE, t->client);
                if (gone || now - t->started_ms > fc->round_timeout_ms) {
                        log_info("task dropped edge=%u task=%lu why=\"%s\"", t->client, (unsigned long) t->number,
                                 gone ? "the client left" : "--round-timeout");
                        f->tasks[i] = f->tasks[--f->ntasks];
                } else
                        i++;
        }
        if (f->phase == FED_CLOSING)
                goto tasks; /* a buffer is being applied: the others train on */
        if (f->done >= fc->rounds) {
                f->phase = FED_WAITING; /* coord_fed_poll asks for the final evaluation */
                return;
        }
        if (f->nbuf >= fc->buffer && !c->ckpt.active) { /* a checkpoint being written holds it */
                size_t navail = 0;
                for (size_t i = 0; i < c->npeers; i++)
                        navail += coord_fed_available(&c->peers[i]);
                apply(c, navail);
                return;
        }
tasks:;
        size_t navail = 0;
        for (size_t i = 0; i < c->npeers; i++)
                navail += coord_fed_available(&c->peers[i]);
        if (f->phase == FED_WAITING) {
                if (navail < fc->min_available) {
                        if (!f->said_async)
                                log_info("fedasync waits for edge workers available=%zu min_available=%u", navail,
                                         fc->min_available);
                        f->said_async = true;
                        return;
                }
                f->phase = FED_TRAINING;
                f->last_apply_ms = now;
        }
        if (f->done + (f->phase == FED_CLOSING) >= fc->rounds)
                return; /* the last buffer is being applied: no more tasks */
        for (size_t i = 0; i < c->npeers && c->state == JOB_RUNNING; i++) {
                Peer *p = &c->peers[i];
                if (coord_fed_available(p) && !has_task(f, p->id))
                        give_task(c, p, now);
        }
}

void coord_fedasync_rep(Coord *c, WireMsg *m, Peer *p) {
        FedRounds *f = &c->fed;
        const Psnet__Round *rd = m->hdr->round;
        char reason[192];
        size_t i = 0;
        while (i < f->ntasks && (f->tasks[i].client != p->id || f->tasks[i].number != rd->number))
                i++;
        if (c->state != JOB_RUNNING || i == f->ntasks) {
                f->late++;
                snprintf(reason, sizeof reason, "task %lu of edge %u is not live (it ran past --round-timeout %u s, "
                         "or the rounds are done): its update is not counted", (unsigned long) rd->number, p->id,
                         c->job.fed.round_timeout_ms / 1000);
                log_info("late update edge=%u task=%lu", p->id, (unsigned long) rd->number);
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_STALE, reason);
                coord_todo(c, TODO_FED_POLL); /* it is idle: a new task */
                return;
        }
        if (rd->decline) {
                /* Its client sends no update for it: the task ends, the client gets another. */
                f->refused++;
                log_warning("update refused by its client edge=%u task=%lu reason=\"%s\"", p->id,
                            (unsigned long) rd->number, rd->decline);
                f->tasks[i] = f->tasks[--f->ntasks];
                (void) coord_reply_job(c, &m->route, m->hdr->seq, "declined");
                coord_todo(c, TODO_FED_POLL);
                return;
        }
        if (!rd->has_examples || rd->examples == 0 || (rd->has_loss && !isfinite(rd->loss))) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_INVALID,
                                  "an update's answer carries its example count (>= 1) and a finite loss");
                return;
        }
        FedTask t = f->tasks[i];
        t.examples = rd->examples;
        t.loss = rd->has_loss ? rd->loss : 0.0f;
        t.bytes = rd->has_bytes ? rd->bytes : job_nfloats(&c->job) * sizeof(float);
        if (push_task(&f->buf, &f->nbuf, &f->cap_buf, &t) < 0) {
                coord_reply_error(c, &m->route, m->hdr->seq, PSNET__STATUS__STATUS_RESOURCE, "out of memory");
                return;
        }
        f->tasks[i] = f->tasks[--f->ntasks];
        (void) coord_reply_job(c, &m->route, m->hdr->seq, "counted");
        coord_todo(c, TODO_FED_POLL);
}

void coord_fedasync_closed(Coord *c) {
        FedRounds *f = &c->fed;
        uint64_t now = now_ms();
        /* The buffer's record is the newest: apply made it, nothing since. */
        FedRecord *rec = f->nhist ? &f->hist[(f->hist_end + COORD_FED_HISTORY - 1) % COORD_FED_HISTORY] : NULL;
        if (f->aggregate) {
                f->done++;
                if (rec) {
                        rec->round = f->done;
                        rec->seconds = (float) (now - f->last_apply_ms) / 1000.0f;
                }
                log_info("round done round=%u/%u updates=%zu seconds=%.2f loss=%.4f", f->done, c->job.fed.rounds,
                         f->applying, rec ? rec->seconds : 0.0, rec ? rec->loss : 0.0);
                uint32_t every = c->job.fed.eval_every;
                if (every && f->done % every == 0 && f->done < c->job.fed.rounds)
                        coord_fed_evaluate_round(c);
        } else {
                f->failed++;
                log_warning("buffer not applied: a shard refused it; its updates are dropped");
        }
        f->last_apply_ms = now;
        memmove(f->buf, f->buf + f->applying, (f->nbuf - f->applying) * sizeof *f->buf);
        f->nbuf -= f->applying;
        f->applying = 0;
        f->phase = FED_TRAINING;
        coord_todo(c, TODO_SAVE); /* the buffers applied, kept across a restart */
}
