/* SPDX-License-Identifier: Apache-2.0 */
/* How psctl prints pscoord's answers: aligned tables for people, one JSON
 * object per answer for scripts. JSON is built with jansson, so it is always
 * valid: a number that is not finite (a loss that diverged) is null. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "endpoint.h"
#include "job.h"
#include "macro.h"
#include "psctl.h"
#include "wire-job.h"


const char *psctl_state_of(Psnet__JobState s) {
        JobState st;
        return job_state_from_proto(s, &st) < 0 ? "?" : job_state_name(st);
}

const char *psctl_mode_of(const Psnet__JobSpec *j, char *buf, size_t n) {
        ConsistencyMode m;
        uint32_t st;
        if (!j || mode_from_proto(j->mode, &m, &st) < 0)
                return "-";
        return mode_string(m, st, buf, n);
}

/* The model's name (a JSON model's text is long): mlp:..., cnn, vit or its "name". */
const char *psctl_model_of(const Psnet__JobSpec *j, char *buf, size_t n) {
        ModelDesc *d;
        if (!j || !j->model)
                return "-";
        d = malloc(sizeof *d);
        if (d && modeldesc_parse(j->model, d, NULL, 0) == 0)
                snprintf(buf, n, "%s", d->name);
        else
                snprintf(buf, n, "?");
        free(d);
        return buf;
}

static const char *human_bytes(uint64_t b, char *buf, size_t n) {
        if (b >= (1ull << 30))
                snprintf(buf, n, "%.1f GiB", (double) b / (double) (1ull << 30));
        else if (b >= (1ull << 20))
                snprintf(buf, n, "%.1f MiB", (double) b / (double) (1ull << 20));
        else
                snprintf(buf, n, "%.1f KiB", (double) b / 1024.0);
        return buf;
}

/* The job's --lr-schedule (constant when not said). */
static LrSchedule schedule_of(const Psnet__JobSpec *j) {
        return j && j->has_lr_schedule ? (LrSchedule) j->lr_schedule : LR_SCHEDULE_CONSTANT;
}

void print_status_table(const Psnet__StatusRep *s) {
        const Psnet__JobSpec *j = s->job;
        char b[32], mode[32], model[128];
        printf("coordinator  %s  up %.1f s\n", s->coord_endpoint ? s->coord_endpoint : "?",
               (double) s->uptime_ms / 1000.0);
        printf("job %u  %s  mode=%s  state=%s  epochs=%u  batch=%u  map_epoch=%lu  members_epoch=%lu",
               j ? j->id : 0, psctl_model_of(j, model, sizeof model), psctl_mode_of(j, mode, sizeof mode),
               psctl_state_of(s->job_state), j ? j->epochs : 0, j ? j->batch : 0, (unsigned long) s->map_epoch, (unsigned long) s->members_epoch);
        printf("  replicas=%u  failovers=%u", j && j->has_replicas ? j->replicas : 1, s->failovers);
        if (s->has_accuracy)
                printf("  accuracy=%.4f", s->accuracy);
        if (s->has_weights_digest)
                printf("  weights=%016llx", (unsigned long long) s->weights_digest);
        if (s->reason)
                printf("  reason=\"%s\"", s->reason);
        if (s->restored_from)
                printf("  restored_from=%s", s->restored_from);
        if (j && j->init)
                printf("  init=%s", j->init);
        if (schedule_of(j) != LR_SCHEDULE_CONSTANT)
                printf("  lr_schedule=%s", lr_schedule_name(schedule_of(j)));
        if (j && j->has_sparsify && j->sparsify > 0.0f)
                printf("  sparsify=%g", (double) j->sparsify);
        TableConf tables[JOB_MAX_TABLES];
        size_t ntables = 0;
        if (j && j->tables && tables_parse(j->tables, tables, JOB_MAX_TABLES, &ntables, NULL, 0) == 0 && ntables) {
                /* Each table's name, dim and optimizer (every figure: --json). */
                printf("\ntables");
                for (size_t i = 0; i < ntables; i++)
                        printf(" %s:%u:%s", tables[i].name, tables[i].dim, table_optim_name(tables[i].optim));
        }
        if (s->fed)
                printf("\nrounds %u/%u  phase=%s  round_number=%lu  sampled=%u  answered=%u  available=%u  failed=%lu  "
                       "late=%lu", s->fed->rounds_done, s->fed->rounds, s->fed->phase ? s->fed->phase : "?",
                       (unsigned long) s->fed->number, s->fed->sampled, s->fed->answered, s->fed->available,
                       (unsigned long) s->fed->failed, (unsigned long) s->fed->late);
        if (s->fed && s->fed->has_epsilon)
                printf("\nprivacy spent: epsilon=%.4f at delta=%g", s->fed->epsilon, s->fed->dp_delta);
        /* Accuracy by epoch: the last ten (all with --json). */
        if (s->n_epochs) {
                size_t from = s->n_epochs > 10 ? s->n_epochs - 10 : 0;
                bool auc = false; /* a binary model's (lr:D, dlrm): its own column */
                for (size_t k = from; k < s->n_epochs; k++)
                        auc |= s->epochs[k]->has_auc;
                printf("\n\n%-6s %8s %9s %10s %8s %8s%s\n", "EPOCH", "ACCURACY", "TEST_LOSS", "TRAIN_LOSS", "CLOCK",
                       "SECONDS", auc ? "      AUC" : "");
                if (from)
                        printf("(%zu earlier epochs: psctl --json status)\n", from);
                for (size_t k = from; k < s->n_epochs; k++) {
                        const Psnet__EpochRecord *e = s->epochs[k];
                        printf("%-6u %8.4f %9.4f %10.4f %8ld %8.1f", e->epoch, e->accuracy,
                               e->has_test_loss ? e->test_loss : NAN, e->has_train_loss ? e->train_loss : NAN,
                               (long) e->clock, e->seconds);
                        if (auc)
                                printf(" %8.4f", e->has_auc ? e->auc : NAN);
                        printf("\n");
                }
        }
        if (s->last_checkpoint)
                printf("\ncheckpoint %s  clock=%ld  %s  age %.0f s", s->last_checkpoint->name,
                       (long) s->last_checkpoint->clock, human_bytes(s->last_checkpoint->bytes, b, sizeof b),
                       (double) (unix_ms() - MIN(unix_ms(), s->last_checkpoint->created_ms)) / 1000.0);
        if (s->checkpointing)
                printf("%scheckpoint %s being written", s->last_checkpoint ? "  " : "\n", s->checkpointing);
        /* PRIMARY: keys led here; BACKUP: copies of other shards' keys;
         * INCOMING: copies on their way (moving, or a backup being rebuilt). */
        printf("\n\n%-6s %-36s %7s %6s %10s %8s %9s %8s %8s %6s %8s %s\n", "SHARD", "ENDPOINT", "PRIMARY",
               "BACKUP", "BYTES", "CLOCK", "LR", "PUSHES", "PULLS", "ERRORS", "INCOMING", "MAP");
        for (size_t i = 0; i < s->n_shards; i++) {
                const Psnet__ShardInfo *h = s->shards[i];
                char lr[16] = "-";
                if (h->has_lr)
                        snprintf(lr, sizeof lr, "%.3g", (double) h->lr);
                printf("%-6u %-36s %7lu %6lu %10s %8ld %9s %8lu %8lu %6lu %8lu %s%s\n", h->id,
                       h->endpoint ? h->endpoint : "?", (unsigned long) (h->keys - h->backup_keys),
                       (unsigned long) h->backup_keys, human_bytes(h->bytes, b, sizeof b), (long) h->clock, lr,
                       (unsigned long) h->pushes, (unsigned long) h->pulls, (unsigned long) h->errors,
                       (unsigned long) h->incoming, h->in_map ? "in" : "standby",
                       h->has_acknowledging && !h->acknowledging ? "  (lease lost: not acknowledging)" : "");
        }
        bool rows = false;
        for (size_t i = 0; i < s->n_shards; i++)
                rows |= s->shards[i]->has_rows;
        if (rows) {
                /* The job's sparse tables, all together: rows held, made,
                 * filtered (ids not admitted yet), refused (past max-rows),
                 * evicted (ttl, max-rows). */
                printf("\n%-6s %10s %10s %10s %10s %10s %10s\n", "SHARD", "ROWS", "ROW-BYTES", "ADMITTED", "FILTERED",
                       "REFUSED", "EVICTED");
                for (size_t i = 0; i < s->n_shards; i++) {
                        const Psnet__ShardInfo *h = s->shards[i];
                        if (h->has_rows)
                                printf("%-6u %10lu %10s %10lu %10lu %10lu %10lu\n", h->id, (unsigned long) h->rows,
                                       human_bytes(h->rows_bytes, b, sizeof b), (unsigned long) h->rows_admitted,
                                       (unsigned long) h->rows_filtered, (unsigned long) h->rows_refused,
                                       (unsigned long) h->rows_evicted);
                }
        }
        printf("\n%-6s %4s %8s %8s %6s %8s %8s %10s %8s\n", "WORKER", "RANK", "PID", "CLOCK", "EPOCH", "STEP",
               "STEPS/S", "SAMPLES/S", "LOSS");
        for (size_t i = 0; i < s->n_workers; i++) {
                const Psnet__WorkerInfo *w = s->workers[i];
                printf("%-6u %4u %8u %8ld %6u %8lu %8.1f %10.0f %8.4f%s\n", w->id, w->rank, w->pid, (long) w->clock,
                       w->epoch, (unsigned long) w->step, w->steps_per_s, w->samples_per_s, w->loss,
                       w->done ? "  done" : "");
        }
}

void print_watch(const Psnet__StatusRep *s) {
        char mode[32];
        printf("t=%.1fs job=%u mode=%s state=%s members_epoch=%lu workers=%zu", (double) s->uptime_ms / 1000.0,
               s->job ? s->job->id : 0, psctl_mode_of(s->job, mode, sizeof mode), psctl_state_of(s->job_state),
               (unsigned long) s->members_epoch, s->n_workers);
        if (s->has_accuracy)
                printf(" accuracy=%.4f", s->accuracy);
        printf("\n");
        for (size_t i = 0; i < s->n_workers; i++) {
                const Psnet__WorkerInfo *w = s->workers[i];
                printf("  worker=%u rank=%u epoch=%u clock=%ld end_clock=%ld progress=%.3f samples_per_s=%.0f "
                       "loss=%.4f\n", w->id, w->rank, w->epoch, (long) w->clock, (long) w->end_clock, w->progress,
                       w->samples_per_s, w->loss);
        }
        fflush(stdout);
}

/* --- JSON ------------------------------------------------------------------------ */

static json_t *jnum(double v) {
        return isfinite(v) ? json_real(v) : json_null();
}

static json_t *jstr(const char *s) {
        return s ? json_string(s) : json_null();
}

/* Prints o (taking it) on one line; -ENOMEM when it could not be built. */
static int emit(json_t *o) {
        if (!o)
                return -ENOMEM;
        int r = json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(6));
        json_decref(o);
        if (r < 0)
                return -EIO;
        putchar('\n');
        return 0;
}

/* The number of keys (chunks) of a job spec. */
static uint64_t spec_keys(const Psnet__JobSpec *j) {
        uint64_t n = 0;
        for (size_t t = 0; j && j->chunk_floats && t < j->n_tensors; t++) {
                uint64_t numel = 1;
                for (size_t d = 0; d < j->tensors[t]->n_shape; d++)
                        numel *= j->tensors[t]->shape[d];
                n += (numel + j->chunk_floats - 1) / j->chunk_floats;
        }
        return n;
}

int print_status_json(const Psnet__StatusRep *s) {
        const Psnet__JobSpec *j = s->job;
        char mode[32];
        json_t *shards = json_array(), *workers = json_array();
        for (size_t i = 0; shards && i < s->n_shards; i++) {
                const Psnet__ShardInfo *h = s->shards[i];
                json_array_append_new(shards, json_pack("{s:I,s:o,s:I,s:I,s:I,s:I,s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:I,s:I,s:o}",
                        "id", (json_int_t) h->id, "endpoint", jstr(h->endpoint), "keys", (json_int_t) h->keys,
                        "min_steps", (json_int_t) h->min_steps, "max_steps", (json_int_t) h->max_steps,
                        "backup_keys", (json_int_t) h->backup_keys,
                        "acknowledging", (int) (!h->has_acknowledging || h->acknowledging),
                        "bytes", (json_int_t) h->bytes, "clock", (json_int_t) h->clock,
                        "pushes", (json_int_t) h->pushes, "pulls", (json_int_t) h->pulls,
                        "errors", (json_int_t) h->errors, "incoming", (json_int_t) h->incoming,
                        "in_map", (int) h->in_map, "map_epoch", (json_int_t) h->map_epoch,
                        "parked", (json_int_t) h->parked, "lr", h->has_lr ? jnum(h->lr) : json_null()));
                if (h->has_rows)
                        json_object_update_new(json_array_get(shards, json_array_size(shards) - 1),
                                               json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "rows", (json_int_t) h->rows,
                                                         "rows_bytes", (json_int_t) h->rows_bytes, "rows_admitted",
                                                         (json_int_t) h->rows_admitted, "rows_filtered",
                                                         (json_int_t) h->rows_filtered, "rows_refused",
                                                         (json_int_t) h->rows_refused, "rows_evicted",
                                                         (json_int_t) h->rows_evicted));
                if (h->has_rows_whole_epoch) /* the map epoch since which its rows are on all their copies */
                        json_object_set_new(json_array_get(shards, json_array_size(shards) - 1), "rows_whole_epoch",
                                            json_integer((json_int_t) h->rows_whole_epoch));
        }
        for (size_t i = 0; workers && i < s->n_workers; i++) {
                const Psnet__WorkerInfo *w = s->workers[i];
                json_array_append_new(workers, json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:b,s:o,s:o}",
                        "id", (json_int_t) w->id, "rank", (json_int_t) w->rank, "pid", (json_int_t) w->pid,
                        "clock", (json_int_t) w->clock, "epoch", (json_int_t) w->epoch,
                        "step", (json_int_t) w->step, "steps_per_s", jnum(w->steps_per_s),
                        "samples_per_s", jnum(w->samples_per_s), "loss", jnum(w->loss), "done", (int) w->done,
                        "progress", w->has_progress ? jnum(w->progress) : json_null(),
                        "end_clock", w->has_end_clock ? json_integer((json_int_t) w->end_clock) : json_null()));
        }
        if (!shards || !workers) {
                json_decref(shards);
                json_decref(workers);
                return -ENOMEM;
        }
        json_t *job = json_pack("{s:I,s:o,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:I,s:I,s:o}",
                "id", (json_int_t) (j ? j->id : 0), "model", jstr(j ? j->model : NULL),
                "mode", psctl_mode_of(j, mode, sizeof mode), "state", psctl_state_of(s->job_state),
                "epochs", (json_int_t) (j ? j->epochs : 0), "batch", (json_int_t) (j ? j->batch : 0),
                "chunk_floats", (json_int_t) (j ? j->chunk_floats : 0), "keys", (json_int_t) spec_keys(j),
                "map_epoch", (json_int_t) s->map_epoch, "members_epoch", (json_int_t) s->members_epoch,
                "accuracy", s->has_accuracy ? jnum(s->accuracy) : json_null(), "reason", jstr(s->reason),
                "replicas", (json_int_t) (j && j->has_replicas ? j->replicas : 1), "failovers", (json_int_t) s->failovers,
                "weights_digest", s->has_weights_digest ? json_sprintf("%016llx", (unsigned long long) s->weights_digest)
                                                        : json_null());
        const Psnet__CheckpointInfo *lc = s->last_checkpoint;
        if (job && json_object_set_new(job, "last_checkpoint", lc ? json_pack("{s:s,s:I,s:I,s:I}", "name", lc->name,
                        "clock", (json_int_t) lc->clock, "bytes", (json_int_t) lc->bytes, "age_ms",
                        (json_int_t) (unix_ms() - MIN(unix_ms(), lc->created_ms))) : json_null()) < 0)
                job = NULL;
        if (job && s->fed && json_object_set_new(job, "fed", json_pack("{s:I,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:o,s:o}",
                        "rounds_done", (json_int_t) s->fed->rounds_done, "rounds", (json_int_t) s->fed->rounds,
                        "phase", s->fed->phase ? s->fed->phase : "?", "number", (json_int_t) s->fed->number,
                        "available", (json_int_t) s->fed->available, "failed", (json_int_t) s->fed->failed,
                        "late", (json_int_t) s->fed->late, "answered", (json_int_t) s->fed->answered,
                        "epsilon", s->fed->has_epsilon ? json_real(s->fed->epsilon) : json_null(),
                        "dp_delta", s->fed->has_dp_delta ? json_real(s->fed->dp_delta) : json_null())) < 0)
                job = NULL;
        if (job && (json_object_set_new(job, "checkpointing", jstr(s->checkpointing)) < 0 ||
                    json_object_set_new(job, "restored_from", jstr(s->restored_from)) < 0 ||
                    json_object_set_new(job, "init", jstr(j ? j->init : NULL)) < 0 ||
                    json_object_set_new(job, "lr_schedule", json_string(lr_schedule_name(schedule_of(j)))) < 0 ||
                    json_object_set_new(job, "sparsify",
                                        json_real(j && j->has_sparsify ? (double) j->sparsify : 0.0)) < 0 ||
                    json_object_set_new(job, "tables", jstr(j ? j->tables : NULL)) < 0))
                job = NULL;
        json_t *epochs = json_array();
        for (size_t k = 0; epochs && k < s->n_epochs; k++) {
                const Psnet__EpochRecord *e = s->epochs[k];
                if (json_array_append_new(epochs, json_pack("{s:I,s:o,s:o,s:o,s:I,s:o,s:I}", "epoch",
                                (json_int_t) e->epoch, "accuracy", jnum(e->accuracy),
                                "test_loss", e->has_test_loss ? jnum(e->test_loss) : json_null(),
                                "train_loss", e->has_train_loss ? jnum(e->train_loss) : json_null(),
                                "clock", (json_int_t) e->clock, "seconds", jnum(e->seconds),
                                "worker", (json_int_t) e->worker)) < 0 ||
                    json_object_set_new(json_array_get(epochs, json_array_size(epochs) - 1), "auc",
                                        e->has_auc ? jnum(e->auc) : json_null()) < 0) {
                        json_decref(epochs);
                        epochs = NULL;
                }
        }
        return emit(json_pack("{s:{s:o,s:I},s:o,s:o,s:o,s:{s:o}}",
                "coordinator", "endpoint", jstr(s->coord_endpoint), "uptime_ms", (json_int_t) s->uptime_ms,
                "job", job, "shards", shards, "workers", workers, "history", "epochs", epochs));
}

static json_t *round_json(const Psnet__RoundRecord *r) {
        json_t *o = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:o,s:I,s:I,s:o}", "number",
                         (json_int_t) r->number, "round",
                         (json_int_t) r->round, "sampled", (json_int_t) r->sampled, "answered", (json_int_t) r->answered,
                         "late", (json_int_t) r->late, "dropped", (json_int_t) r->dropped, "refused",
                         (json_int_t) r->refused, "available",
                         (json_int_t) r->available, "loss", jnum(r->loss), "seconds", jnum(r->seconds), "epsilon",
                         r->has_epsilon ? json_real(r->epsilon) : json_null(), "note", jstr(r->note), "bytes_up",
                         (json_int_t) r->bytes_up, "bytes_raw", (json_int_t) r->bytes_raw, "accuracy",
                         r->has_accuracy ? json_real(r->accuracy) : json_null());
        /* --fraction-evaluate: the clients' own tests of the model after it. */
        if (o && (json_object_set_new(o, "fed_accuracy",
                                      r->has_fed_accuracy ? json_real(r->fed_accuracy) : json_null()) < 0 ||
                  json_object_set_new(o, "fed_loss", r->has_fed_loss ? json_real(r->fed_loss) : json_null()) < 0 ||
                  json_object_set_new(o, "fed_examples", json_integer((json_int_t) r->fed_examples)) < 0 ||
                  json_object_set_new(o, "fed_clients", json_integer((json_int_t) r->fed_clients)) < 0)) {
                json_decref(o);
                return NULL;
        }
        return o;
}

int print_rounds(const Psnet__StatusRep *s, bool history, bool json) {
        const Psnet__FedStatus *f = s->fed;
        if (!f) {
                fprintf(stderr, "psctl: job %u is not federated (mode fed): it has no rounds\n", s->job ? s->job->id : 0);
                return -EINVAL;
        }
        if (json) {
                json_t *h = json_array();
                for (size_t i = 0; h && history && i < f->n_history; i++)
                        if (json_array_append_new(h, round_json(f->history[i])) < 0)
                                return -ENOMEM;
                if (!h)
                        return -ENOMEM;
                if (history)
                        return emit(h);
                json_decref(h);
                return emit(json_pack("{s:s,s:I,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o}", "state",
                                      psctl_state_of(s->job_state), "rounds_done", (json_int_t) f->rounds_done, "rounds",
                                      (json_int_t) f->rounds, "phase", f->phase ? f->phase : "?", "number",
                                      (json_int_t) f->number, "sampled", (json_int_t) f->sampled, "answered",
                                      (json_int_t) f->answered, "available", (json_int_t) f->available, "failed",
                                      (json_int_t) f->failed, "late", (json_int_t) f->late, "refused",
                                      (json_int_t) f->refused, "round_ms",
                                      (json_int_t) f->round_ms, "epsilon",
                                      f->has_epsilon ? json_real(f->epsilon) : json_null(), "sampling",
                                      f->sampling ? json_string(f->sampling) : json_null(), "accountant",
                                      f->accountant ? json_string(f->accountant) : json_null()));
        }
        if (!history) {
                printf("job %u  state=%s  rounds %u/%u  phase=%s\n", s->job ? s->job->id : 0, psctl_state_of(s->job_state),
                       f->rounds_done, f->rounds, f->phase ? f->phase : "?");
                printf("round number %lu: sampled=%u answered=%u (%.1f s)  available=%u  failed=%lu  late=%lu  "
                       "refused=%lu\n",
                       (unsigned long) f->number, f->sampled, f->answered, (double) f->round_ms / 1000.0, f->available,
                       (unsigned long) f->failed, (unsigned long) f->late, (unsigned long) f->refused);
                if (f->sampling)
                        printf("sampling: %s\n", f->sampling);
                if (f->has_epsilon)
                        printf("privacy spent: epsilon=%.4f at delta=%g\naccountant: %s\n", f->epsilon, f->dp_delta,
                               f->accountant ? f->accountant : "?");
                return 0;
        }
        printf("%-7s %-6s %7s %8s %5s %7s %7s %8s %8s %8s %8s %8s %9s  %s\n", "NUMBER", "ROUND", "SAMPLED",
               "ANSWERED", "LATE", "DROPPED", "REFUSED", "LOSS", "FED_ACC", "ACCURACY", "SECONDS", "EPSILON", "MIB_UP", "NOTE");
        for (size_t i = 0; i < f->n_history; i++) {
                const Psnet__RoundRecord *r = f->history[i];
                char round[16], eps[16], acc[16], facc[16];
                if (r->has_fed_accuracy)
                        snprintf(facc, sizeof facc, "%.4f", r->fed_accuracy);
                else
                        snprintf(facc, sizeof facc, "-");
                if (r->has_accuracy)
                        snprintf(acc, sizeof acc, "%.4f", r->accuracy);
                else
                        snprintf(acc, sizeof acc, "-");
                snprintf(round, sizeof round, "%u", r->round);
                if (r->has_epsilon)
                        snprintf(eps, sizeof eps, "%.4f", r->epsilon);
                else
                        snprintf(eps, sizeof eps, "-");
                printf("%-7lu %-6s %7u %8u %5u %7u %7u %8.4f %8s %8s %8.2f %8s %9.2f  %s\n",
                       (unsigned long) r->number, r->round ? round : "-", r->sampled, r->answered, r->late, r->dropped,
                       r->refused, r->loss, facc, acc,
                       r->seconds,
                       eps,
                       (double) r->bytes_up / 1048576.0, r->note ? r->note : "");
        }
        return 0;
}

int print_json_strings(const char *key, ...) {
        json_t *o = json_object();
        va_list ap;
        va_start(ap, key);
        for (const char *k = key; o && k; k = va_arg(ap, const char *)) {
                const char *v = va_arg(ap, const char *);
                if (json_object_set_new(o, k, jstr(v)) < 0) {
                        json_decref(o);
                        o = NULL;
                }
        }
        va_end(ap);
        return emit(o);
}

int print_json_result(const char *state, bool has_accuracy, float accuracy) {
        return emit(json_pack("{s:s,s:o}", "state", state, "accuracy", has_accuracy ? jnum(accuracy) : json_null()));
}

int print_checkpoint_saved(const Psnet__CheckpointRep *r, bool json) {
        char b[32];
        if (json)
                return emit(json_pack("{s:o,s:I,s:I,s:I,s:I,s:I}", "name", jstr(r->name), "clock",
                                      (json_int_t) r->clock, "bytes", (json_int_t) r->bytes, "chunks",
                                      (json_int_t) r->chunks, "rows", (json_int_t) r->rows, "ms", (json_int_t) r->ms));
        char rows[48] = "";
        if (r->has_rows)
                snprintf(rows, sizeof rows, ", %llu table rows", (unsigned long long) r->rows);
        printf("checkpoint %s saved: clock %ld, %u chunks%s, %s in %.2f s\n", r->name ? r->name : "?", (long) r->clock,
               r->chunks, rows, human_bytes(r->bytes, b, sizeof b), (double) r->ms / 1000.0);
        return 0;
}

int print_checkpoint_list(const Psnet__CheckpointList *l, bool json) {
        char b[32], when[32];
        if (json) {
                json_t *a = json_array();
                for (size_t i = 0; a && i < l->n_checkpoints; i++) {
                        const Psnet__CheckpointInfo *c = l->checkpoints[i];
                        if (json_array_append_new(a, json_pack("{s:s,s:I,s:I,s:I,s:o,s:o,s:I,s:o,s:b}", "name",
                                        c->name, "clock", (json_int_t) c->clock, "bytes", (json_int_t) c->bytes,
                                        "created_ms", (json_int_t) c->created_ms, "model", jstr(c->model), "mode",
                                        jstr(c->mode), "files", (json_int_t) c->files, "error", jstr(c->error),
                                        "checked", c->has_checked && c->checked)) < 0) {
                                json_decref(a);
                                a = NULL;
                        }
                }
                return emit(json_pack("{s:o}", "checkpoints", a ? a : json_null()));
        }
        printf("%-24s %8s %10s %6s %-20s %-8s %-8s %s\n", "NAME", "CLOCK", "BYTES", "FILES", "CREATED (UTC)",
               "CHECKED", "MODE", "MODEL");
        for (size_t i = 0; i < l->n_checkpoints; i++) {
                const Psnet__CheckpointInfo *c = l->checkpoints[i];
                if (c->error) {
                        printf("%-24s  cannot be restored: %s\n", c->name, c->error);
                        continue;
                }
                time_t t = (time_t) (c->created_ms / 1000u);
                struct tm tm;
                if (!gmtime_r(&t, &tm) || !strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm))
                        snprintf(when, sizeof when, "?");
                printf("%-24s %8ld %10s %6u %-20s %-8s %-8s %s\n", c->name, (long) c->clock,
                       human_bytes(c->bytes, b, sizeof b), c->files, when, c->has_checked && c->checked ? "yes" : "not yet",
                       c->mode ? c->mode : "?", c->model ? c->model : "?");
        }
        return 0;
}
