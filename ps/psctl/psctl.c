/* psctl: the operator's tool. Asks pscoord for the cluster's status, submits,
 * stops and waits for jobs. Human tables by default, --json for scripts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "coordlink.h"
#include "errors.h"
#include "job-flags.h"
#include "log.h"

typedef struct Ctl {
        char *coord;
        unsigned timeout;
        bool json;
        void *zctx;
        CoordLink *link;
} Ctl;

static void json_str(const char *s) {
        putchar('"');
        for (; s && *s; s++) {
                unsigned char ch = (unsigned char) *s;
                if (ch == '"' || ch == '\\')
                        printf("\\%c", ch);
                else if (ch < 0x20)
                        printf("\\u%04x", ch);
                else
                        putchar(ch);
        }
        putchar('"');
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

static int ctl_request(Ctl *c, Psnet__MsgType type, Psnet__Control *ctl, Psnet__MsgType want, WireMsg *ret) {
        int r = coordlink_request(c->link, type, ctl, want, c->timeout * 1000u, NULL, NULL, ret);
        if (r == -ETIMEDOUT)
                fprintf(stderr, "psctl: pscoord at %s did not answer within %u s (is it running?)\n", c->coord,
                        c->timeout);
        else if (r == -ECONNREFUSED) {
                fprintf(stderr, "psctl: pscoord refused: %s (%s)\n", ret->hdr->reason ? ret->hdr->reason : "?",
                        status_name(ret->hdr->status));
                wire_msg_done(ret);
        } else if (r < 0)
                fprintf(stderr, "psctl: request to pscoord at %s failed: %s\n", c->coord, strerror(-r));
        return r;
}

static void print_status_json(const Psnet__Control *s) {
        const Psnet__JobSpec *j = s->job;
        printf("{\"coordinator\":{\"endpoint\":");
        json_str(s->coord_endpoint);
        printf(",\"uptime_ms\":%lu},", (unsigned long) s->uptime_ms);
        printf("\"job\":{\"id\":%u,\"model\":", j ? j->id : 0);
        json_str(j ? j->model : "");
        printf(",\"mode\":");
        json_str(j ? j->mode : "");
        printf(",\"state\":");
        json_str(s->job_state);
        printf(",\"epochs\":%u,\"batch\":%u", j ? j->epochs : 0, j ? j->batch : 0);
        if (s->has_accuracy)
                printf(",\"accuracy\":%.4f", s->accuracy);
        printf(",\"map_epoch\":%lu,\"members_epoch\":%lu},", (unsigned long) (s->map ? s->map->epoch : 0),
               (unsigned long) (s->members ? s->members->epoch : 0));
        printf("\"shards\":[");
        for (size_t i = 0; s->map && i < s->map->n_shards; i++) {
                const Psnet__ShardInfo *h = s->map->shards[i];
                printf("%s{\"id\":%u,\"endpoint\":", i ? "," : "", h->id);
                json_str(h->endpoint);
                printf(",\"keys\":%lu,\"bytes\":%lu,\"clock\":%ld,\"pushes\":%lu,\"pulls\":%lu,\"errors\":%lu,"
                       "\"incoming\":%lu,\"in_map\":%s,\"map_epoch\":%lu}",
                       (unsigned long) h->keys, (unsigned long) h->bytes, (long) h->clock, (unsigned long) h->pushes,
                       (unsigned long) h->pulls, (unsigned long) h->errors, (unsigned long) h->incoming,
                       h->in_map ? "true" : "false", (unsigned long) h->map_epoch);
        }
        printf("],\"workers\":[");
        for (size_t i = 0; i < s->n_workers; i++) {
                const Psnet__WorkerInfo *w = s->workers[i];
                printf("%s{\"id\":%u,\"rank\":%u,\"pid\":%u,\"clock\":%ld,\"epoch\":%u,\"step\":%lu,"
                       "\"steps_per_s\":%.2f,\"samples_per_s\":%.1f,\"loss\":%.4f,\"done\":%s}",
                       i ? "," : "", w->id, w->rank, w->pid, (long) w->clock, w->epoch, (unsigned long) w->step,
                       w->steps_per_s, w->samples_per_s, w->loss, w->done ? "true" : "false");
        }
        printf("]}\n");
}

static void print_status_table(const Psnet__Control *s) {
        const Psnet__JobSpec *j = s->job;
        char b[32];
        printf("coordinator  %s  up %.1f s\n", s->coord_endpoint ? s->coord_endpoint : "?",
               (double) s->uptime_ms / 1000.0);
        printf("job %u  %s  mode=%s  state=%s  epochs=%u  batch=%u  map_epoch=%lu  members_epoch=%lu",
               j ? j->id : 0, j ? j->model : "-", j ? j->mode : "-", s->job_state ? s->job_state : "?",
               j ? j->epochs : 0, j ? j->batch : 0, (unsigned long) (s->map ? s->map->epoch : 0),
               (unsigned long) (s->members ? s->members->epoch : 0));
        if (s->has_accuracy)
                printf("  accuracy=%.4f", s->accuracy);
        printf("\n\n%-6s %-36s %6s %10s %8s %8s %8s %6s %8s %s\n", "SHARD", "ENDPOINT", "KEYS", "BYTES", "CLOCK",
               "PUSHES", "PULLS", "ERRORS", "INCOMING", "MAP");
        for (size_t i = 0; s->map && i < s->map->n_shards; i++) {
                const Psnet__ShardInfo *h = s->map->shards[i];
                printf("%-6u %-36s %6lu %10s %8ld %8lu %8lu %6lu %8lu %s\n", h->id, h->endpoint, (unsigned long) h->keys,
                       human_bytes(h->bytes, b, sizeof b), (long) h->clock, (unsigned long) h->pushes,
                       (unsigned long) h->pulls, (unsigned long) h->errors, (unsigned long) h->incoming,
                       h->in_map ? "in" : "standby");
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

static int cmd_status(Ctl *c) {
        WireMsg m;
        int r = ctl_request(c, PSNET__MSG_TYPE__MSG_STATUS, NULL, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
        if (r < 0)
                return r;
        if (!m.hdr->ctl) {
                fprintf(stderr, "psctl: pscoord answered without a status body\n");
                wire_msg_done(&m);
                return -EBADMSG;
        }
        if (c->json)
                print_status_json(m.hdr->ctl);
        else
                print_status_table(m.hdr->ctl);
        wire_msg_done(&m);
        return 0;
}

static int cmd_job_stop(Ctl *c) {
        WireMsg m;
        int r = ctl_request(c, PSNET__MSG_TYPE__MSG_JOB_STOP, NULL, PSNET__MSG_TYPE__MSG_JOB_REP, &m);
        if (r < 0)
                return r;
        printf(c->json ? "{\"state\":\"%s\"}\n" : "job stopped (state=%s)\n",
               m.hdr->ctl && m.hdr->ctl->job_state ? m.hdr->ctl->job_state : "?");
        wire_msg_done(&m);
        return 0;
}

static int cmd_job_submit(Ctl *c, int argc, char **argv) {
        JobFlags jf;
        Option opts[JOBFLAGS_NOPTS];
        const ProgramInfo prog = { .name = "psctl job submit", .summary = "submit a new job to pscoord",
                                   .usage = "[JOB OPTIONS]" };
        char err[192];
        Job job;
        int optind_ = 0;
        jobflags_init(&jf);
        size_t n = jobflags_options(&jf, opts);
        int r = config_parse(&prog, opts, n, argc, argv, &optind_);
        if (r == 0 && optind_ < argc) {
                fprintf(stderr, "psctl job submit: unexpected argument '%s'\n", argv[optind_]);
                r = -EINVAL;
        }
        if (r == 0 && jobflags_to_job(&jf, &job, err, sizeof err) < 0) {
                fprintf(stderr, "psctl job submit: %s\n", err);
                r = -EINVAL;
        }
        config_free_strings(opts, n);
        if (r != 0)
                return r > 0 ? 0 : r;
        Psnet__JobSpec *spec;
        r = job_to_proto(&job, &spec);
        if (r < 0)
                return r;
        Psnet__Control ctl = PSNET__CONTROL__INIT;
        ctl.job = spec;
        WireMsg m;
        r = ctl_request(c, PSNET__MSG_TYPE__MSG_JOB_SUBMIT, &ctl, PSNET__MSG_TYPE__MSG_JOB_REP, &m);
        job_proto_free(spec);
        if (r < 0)
                return r;
        printf(c->json ? "{\"state\":\"%s\"}\n" : "job submitted (state=%s)\n",
               m.hdr->ctl && m.hdr->ctl->job_state ? m.hdr->ctl->job_state : "?");
        wire_msg_done(&m);
        return 0;
}

/* Parses a worker or shard id (1..2^32-1); complains on stderr otherwise. */
static int parse_id(const char *cmd, const char *what, const char *id, unsigned long *ret) {
        char *end;
        errno = 0;
        unsigned long v = id ? strtoul(id, &end, 10) : 0;
        if (!id || errno || *end || v == 0 || v > UINT32_MAX) {
                fprintf(stderr, "%s: expected a %s id, got '%s'\n", cmd, what, id ? id : "");
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static int cmd_drain(Ctl *c, const char *id) {
        unsigned long v;
        if (parse_id("psctl worker drain", "worker", id, &v) < 0)
                return -EINVAL;
        Psnet__Control ctl = PSNET__CONTROL__INIT;
        ctl.has_assigned_id = true;
        ctl.assigned_id = (uint32_t) v;
        WireMsg m;
        int r = ctl_request(c, PSNET__MSG_TYPE__MSG_DRAIN, &ctl, PSNET__MSG_TYPE__MSG_JOB_REP, &m);
        if (r < 0)
                return r;
        printf(c->json ? "{\"worker\":%lu,\"state\":\"draining\"}\n" : "worker %lu is draining\n", v);
        wire_msg_done(&m);
        return 0;
}

static int cmd_shard(Ctl *c, bool add, const char *id) {
        unsigned long v = 0;
        Psnet__Control ctl = PSNET__CONTROL__INIT;
        if (id && strstr(id, "://"))
                ctl.endpoint = (char *) id; /* the shard's advertised address */
        else if (parse_id(add ? "psctl shard add" : "psctl shard remove", "shard", id, &v) < 0)
                return -EINVAL;
        else {
                ctl.has_assigned_id = true;
                ctl.assigned_id = (uint32_t) v;
        }
        WireMsg m;
        int r = ctl_request(c, add ? PSNET__MSG_TYPE__MSG_SHARD_ADD : PSNET__MSG_TYPE__MSG_SHARD_REMOVE, &ctl,
                            PSNET__MSG_TYPE__MSG_JOB_REP, &m);
        if (r < 0)
                return r;
        printf(c->json ? "{\"shard\":\"%s\",\"state\":\"migrating\"}\n"
                       : "shard %s %s; chunks are moving (psctl status shows INCOMING)\n",
               id, add ? "added" : "removed");
        wire_msg_done(&m);
        return 0;
}

static int cmd_job_mode(Ctl *c, const char *mode) {
        if (!mode) {
                fprintf(stderr, "psctl job mode: expected bsp, asp or ssp:S\n");
                return -EINVAL;
        }
        Psnet__Control ctl = PSNET__CONTROL__INIT;
        ctl.mode = (char *) mode;
        WireMsg m;
        int r = ctl_request(c, PSNET__MSG_TYPE__MSG_JOB_MODE, &ctl, PSNET__MSG_TYPE__MSG_JOB_REP, &m);
        if (r < 0)
                return r;
        printf(c->json ? "{\"mode\":\"%s\",\"state\":\"%s\"}\n" : "mode %s: %s\n", mode,
               m.hdr->ctl && m.hdr->ctl->job_state ? m.hdr->ctl->job_state : "?");
        wire_msg_done(&m);
        return 0;
}

/* Prints one line per worker and interval until the job ends (or Ctrl-C). */
static int cmd_watch(Ctl *c, unsigned interval_ms) {
        for (;;) {
                WireMsg m;
                int r = ctl_request(c, PSNET__MSG_TYPE__MSG_STATUS, NULL, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
                if (r < 0)
                        return r;
                const Psnet__Control *s = m.hdr->ctl;
                const char *state = s && s->job_state ? s->job_state : "?";
                double up = s ? (double) s->uptime_ms / 1000.0 : 0;
                printf("t=%.1fs job=%u mode=%s state=%s members_epoch=%lu workers=%zu", up,
                       s && s->job ? s->job->id : 0, s && s->job ? s->job->mode : "?", state,
                       (unsigned long) (s && s->members ? s->members->epoch : 0), s ? s->n_workers : 0);
                if (s && s->has_accuracy)
                        printf(" accuracy=%.4f", s->accuracy);
                printf("\n");
                for (size_t i = 0; s && i < s->n_workers; i++) {
                        const Psnet__WorkerInfo *w = s->workers[i];
                        printf("  worker=%u rank=%u epoch=%u clock=%ld samples_per_s=%.0f loss=%.4f\n", w->id,
                               w->rank, w->epoch, (long) w->clock, w->samples_per_s, w->loss);
                }
                fflush(stdout);
                bool end = strcmp(state, "running") != 0 && strcmp(state, "waiting") != 0;
                wire_msg_done(&m);
                if (end)
                        return 0;
                zmq_pollitem_t it = { .socket = c->link->sock, .events = ZMQ_POLLIN };
                (void) zmq_poll(&it, 1, (long) interval_ms);
        }
}

/* Polls the status until the job is done or stopped, then prints one result line. */
static int cmd_job_wait(Ctl *c, unsigned wait_s) {
        uint64_t deadline = now_ms() + (uint64_t) wait_s * 1000u;
        for (;;) {
                WireMsg m;
                int r = ctl_request(c, PSNET__MSG_TYPE__MSG_STATUS, NULL, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
                if (r < 0)
                        return r;
                const Psnet__Control *s = m.hdr->ctl;
                const char *state = s && s->job_state ? s->job_state : "?";
                if (strcmp(state, "done") == 0 || strcmp(state, "stopped") == 0 || strcmp(state, "failed") == 0) {
                        if (c->json)
                                printf("{\"state\":\"%s\",\"accuracy\":%.4f}\n", state, s->has_accuracy ? s->accuracy : 0.0);
                        else if (s->has_accuracy)
                                printf("state=%s accuracy=%.4f\n", state, s->accuracy);
                        else
                                printf("state=%s\n", state);
                        r = strcmp(state, "done") == 0 ? 0 : -ECANCELED;
                        wire_msg_done(&m);
                        return r;
                }
                if (wait_s && now_ms() >= deadline) {
                        fprintf(stderr, "psctl: job still %s after %u s\n", state, wait_s);
                        wire_msg_done(&m);
                        return -ETIMEDOUT;
                }
                wire_msg_done(&m);
                /* Wait for the next poll on the socket itself: nothing else should arrive. */
                zmq_pollitem_t it = { .socket = c->link->sock, .events = ZMQ_POLLIN };
                (void) zmq_poll(&it, 1, 250);
        }
}

int main(int argc, char **argv) {
        Ctl c = { .timeout = 5 };
        unsigned wait_s = 0, interval_ms = 1000;
        const Option opts[] = {
                { "coord", OPT_STR, &c.coord, "ENDPOINT", "pscoord endpoint (default ipc:///tmp/psnet/coord.sock)" },
                { "timeout", OPT_UINT, &c.timeout, "SECONDS", "how long to wait for pscoord's answer" },
                { "json", OPT_BOOL, &c.json, NULL, "machine-readable output" },
                { "wait", OPT_UINT, &wait_s, "SECONDS", "job wait: give up after this long (0: never)" },
                { "interval-ms", OPT_UINT, &interval_ms, "MS", "watch: time between updates" },
        };
        const ProgramInfo prog = {
                .name = "psctl", .summary = "psnet administration", .usage = "[OPTIONS] COMMAND [ARGS]",
                .epilog = "Commands:\n"
                          "  status                 coordinator, shards and workers\n"
                          "  watch                  live progress until the job ends\n"
                          "  worker drain ID        the worker leaves the job after its current step\n"
                          "  shard add ID|ADDRESS   put a registered (standby) psd into the map; chunks move to it\n"
                          "  shard remove ID|ADDRESS  move a shard's chunks to the others, take it out of the map\n"
                          "  job submit [OPTIONS]   submit a job (psctl job submit --help)\n"
                          "  job mode MODE          switch to bsp, asp or ssp:S at the next clock boundary\n"
                          "  job stop               stop the running job\n"
                          "  job wait               wait until the job is done; prints its accuracy\n"
                          "                         (exit 1 when it failed or was stopped)",
        };
        int optind_ = 0, r;

        log_setup("psctl");
        log_set_level(LOG_WARNING);
        r = config_parse(&prog, opts, ELEMENTSOF(opts), argc, argv, &optind_);
        if (r != 0) {
                config_free_strings(opts, ELEMENTSOF(opts));
                return r > 0 ? EXIT_SUCCESS : 2;
        }
        const char *cmd = optind_ < argc ? argv[optind_] : NULL;
        const char *sub = optind_ + 1 < argc ? argv[optind_ + 1] : NULL;
        const char *arg = optind_ + 2 < argc ? argv[optind_ + 2] : NULL;
        static const char *const known[] = { "status", "watch", "worker drain", "job submit", "job stop",
                                             "job wait", "job mode", "shard add", "shard remove" };
        char full[64];
        snprintf(full, sizeof full, "%s%s%s", cmd ? cmd : "", sub && cmd && (!strcmp(cmd, "job") || !strcmp(cmd, "worker") || !strcmp(cmd, "shard")) ? " " : "",
                 sub && cmd && (!strcmp(cmd, "job") || !strcmp(cmd, "worker") || !strcmp(cmd, "shard")) ? sub : "");
        bool ok = false;
        for (size_t i = 0; i < ELEMENTSOF(known); i++)
                ok |= strcmp(full, known[i]) == 0;
        if (!ok) {
                if (cmd)
                        fprintf(stderr, "psctl: unknown command '%s' (see psctl --help)\n", full);
                else
                        fprintf(stderr, "psctl: missing command (see psctl --help)\n");
                config_free_strings(opts, ELEMENTSOF(opts));
                return 2;
        }
        const char *endpoint = c.coord ? c.coord : "ipc:///tmp/psnet/coord.sock";
        char *owned = c.coord;
        c.coord = (char *) endpoint;
        c.zctx = zmq_ctx_new();
        if (!c.zctx || coordlink_open(c.zctx, endpoint, &c.link) < 0) {
                fprintf(stderr, "psctl: cannot connect to '%s' (bad endpoint?)\n", endpoint);
                r = -EINVAL;
        } else if (strcmp(full, "status") == 0)
                r = cmd_status(&c);
        else if (strcmp(full, "watch") == 0)
                r = cmd_watch(&c, interval_ms);
        else if (strcmp(full, "worker drain") == 0)
                r = cmd_drain(&c, arg);
        else if (strcmp(full, "job mode") == 0)
                r = cmd_job_mode(&c, arg);
        else if (strcmp(full, "shard add") == 0 || strcmp(full, "shard remove") == 0)
                r = cmd_shard(&c, strcmp(full, "shard add") == 0, arg);
        else if (strcmp(sub, "stop") == 0)
                r = cmd_job_stop(&c);
        else if (strcmp(sub, "wait") == 0)
                r = cmd_job_wait(&c, wait_s);
        else
                r = cmd_job_submit(&c, argc - optind_ - 1, argv + optind_ + 1);
        c.coord = owned;
        coordlink_free(c.link);
        if (c.zctx)
                zmq_ctx_term(c.zctx);
        config_free_strings(opts, ELEMENTSOF(opts));
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
