/* SPDX-License-Identifier: Apache-2.0 */
/* psctl: the operator's tool. A table of verbs ("status", "job submit", ...),
 * each with its arguments and options; global options (--coord, --json, ...)
 * go before or after the verb. Anything a verb does not understand is refused
 * with exit status 2. Answers print as tables, or as JSON with --json. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "config.h"
#include "endpoint.h"
#include "keys.h"
#include "errors.h"
#include "job-flags.h"
#include "log.h"
#include "program.h"
#include "rdp.h"
#include "psctl.h"
#include "session.h"
#include "wire-job.h"

#define PSCTL_MAX_OPTS (17 + JOBFLAGS_NOPTS)

typedef struct Ctl {
        char *coord;
        const char *coord_from;        /* where a --coord not given came from ($PSNET_COORD, a file) */
        char *log_level, *log_format;  /* --log-level, --log-format */
        unsigned timeout;
        bool json;
        char *keys, *key, *coord_key;  /* CURVE */
        char *role, *dir;              /* keys gen */
        char *format;                  /* export */
        char *out;                     /* report */
        char *dp_q, *dp_z, *dp_delta;  /* privacy */
        unsigned dp_rounds;
        bool dp_classic;
        bool ready;                    /* probe */
        NetIdentity id;
        unsigned wait_s, interval_ms;
        JobFlags jf;
        void *zctx;
        uv_loop_t loop;
        bool loop_init;
        Session *session;
        /* the request in flight */
        bool done, probe_due;
        int reply_r;
        Psnet__Header *reply;    /* taken from the session's message */
} Ctl;

typedef struct Verb {
        const char *name;      /* one or two words */
        const char *args;      /* placeholder for --help, "" for none */
        unsigned nargs;        /* positional arguments it takes, exactly (one more when optarg) */
        int (*run)(Ctl *c, char **args);
        size_t (*options)(Ctl *c, Option *opts); /* its own options (may be NULL) */
        const char *help;
        bool optarg;           /* a last positional argument that may be left out */
} Verb;

/* --- talking to pscoord ------------------------------------------------------------ */

/* " (from $PSNET_COORD)" and the like where --coord was not given, for
 * errors: a user who set it long ago sees why psctl looks there. */
static const char *coord_from(const Ctl *c) {
        static char buf[PATH_MAX + 16];
        if (!c->coord_from)
                return "";
        snprintf(buf, sizeof buf, " (from %s)", c->coord_from);
        return buf;
}

static int ctl_connect(Ctl *c) {
        int r = uv_loop_init(&c->loop);
        if (r < 0)
                return r;
        c->loop_init = true;
        char err[512];
        if (c->keys && keys_identity_load(&c->id, c->keys, c->key ? c->key : "admin",
                                          c->coord_key ? c->coord_key : "pscoord", PSNET__ROLE__ROLE_NONE, err,
                                          sizeof err) < 0) {
                fprintf(stderr, "psctl: %s\n", err);
                return -EINVAL;
        }
        c->zctx = zmq_ctx_new();
        const SessionConf sc = { .endpoint = c->coord, .role = PSNET__ROLE__ROLE_NONE,
                                 .keys = c->id.enabled ? &c->id.keys : NULL,
                                 .coord_key = c->id.enabled ? c->id.coord_key : NULL };
        const SessionOps so = { 0 };
        if (!c->zctx || session_new(&c->loop, c->zctx, &sc, &so, c, &c->session) < 0 ||
            session_start(c->session) < 0) {
                fprintf(stderr, "psctl: cannot connect to '%s'%s (bad endpoint?)\n", c->coord, coord_from(c));
                return -EINVAL;
        }
        return 0;
}

static void ctl_on_reply(Session *s, int r, WireMsg *m, void *ud) {
        Ctl *c = ud;
        (void) s;
        c->reply_r = r;
        if (m) {
                c->reply = m->hdr; /* taken: freed by ctl_request's caller */
                m->hdr = NULL;
        }
        c->done = true;
}

#define CTL_PROBE_MS 300   /* no answer this long: is anyone listening? */
#define CTL_STALE_MS 1000  /* a socket nobody listens on this long is a stale one */

static void ctl_probe_due(uv_timer_t *t) {
        ((Ctl *) t->data)->probe_due = true;
}

/* Sends h and waits (running the loop) for the reply of type want, which goes
 * to *ret (free with psnet__header__free_unpacked). Says on stderr why not. */
static int ctl_request(Ctl *c, Psnet__Header *h, Psnet__MsgType want, Psnet__Header **ret) {
        int r = c->session ? 0 : ctl_connect(c);
        if (r < 0)
                return r;
        c->done = false;
        c->reply = NULL;
        r = session_request(c->session, h, want, c->timeout * 1000u, ctl_on_reply, c);
        /* No answer at once: ask the socket file whether anyone listens at all
         * rather than wait out --timeout. Another user's socket fails at once;
         * one nobody listens on (left by a pscoord that stopped) once it has
         * stayed so for CTL_STALE_MS (a pscoord starting replaces it sooner);
         * none at all is said when the time is up (it may be starting). */
        uv_timer_t probe;
        bool probing = r == 0 && uv_timer_init(&c->loop, &probe) == 0;
        if (probing) {
                probe.data = c;
                c->probe_due = false;
                if (uv_timer_start(&probe, ctl_probe_due, CTL_PROBE_MS, CTL_PROBE_MS) < 0)
                        c->probe_due = false;
        }
        char why[320] = "";
        uint64_t refused_since = 0;
        while (r == 0 && !c->done) {
                uv_run(&c->loop, UV_RUN_ONCE);
                if (!c->probe_due || c->done)
                        continue;
                c->probe_due = false;
                why[0] = 0;
                int pr = endpoint_probe(c->coord, why, sizeof why);
                uint64_t now = now_ms();
                if (pr != -ECONNREFUSED)
                        refused_since = 0;
                else if (!refused_since)
                        refused_since = now;
                if (pr == -EACCES || pr == -ENAMETOOLONG || (refused_since && now - refused_since >= CTL_STALE_MS)) {
                        r = -EHOSTUNREACH;
                        break;
                }
        }
        if (probing) {
                uv_close((uv_handle_t *) &probe, NULL);
                uv_run(&c->loop, UV_RUN_NOWAIT);
        }
        if (r == 0)
                r = c->reply_r;
        const char *hs = session_handshake_error(c->session);
        if (r == -EHOSTUNREACH)
                fprintf(stderr, "psctl: cannot reach pscoord%s: %s\n", coord_from(c), why);
        else if (r == -ETIMEDOUT && hs[0])
                fprintf(stderr, "psctl: cannot talk to pscoord at %s%s: %s\n", c->coord, coord_from(c), hs);
        else if (r == -ETIMEDOUT && why[0])
                fprintf(stderr, "psctl: pscoord at %s%s did not answer within %u s: %s\n", c->coord, coord_from(c),
                        c->timeout, why);
        else if (r == -ETIMEDOUT)
                fprintf(stderr, "psctl: pscoord at %s%s did not answer within %u s (is it running?)\n", c->coord,
                        coord_from(c), c->timeout);
        else if (r == -ECONNREFUSED)
                fprintf(stderr, "psctl: pscoord refused: %s (%s)\n", c->reply && c->reply->reason ? c->reply->reason : "?",
                        status_name(c->reply ? (int) c->reply->status : -1));
        else if (r < 0)
                fprintf(stderr, "psctl: request to pscoord at %s%s failed: %s\n", c->coord, coord_from(c),
                        strerror(-r));
        if (r < 0) {
                if (c->reply)
                        psnet__header__free_unpacked(c->reply, NULL);
                c->reply = NULL;
                return r;
        }
        *ret = c->reply;
        c->reply = NULL;
        return 0;
}

static int ctl_request_type(Ctl *c, Psnet__MsgType type, Psnet__MsgType want, Psnet__Header **ret) {
        Psnet__Header h;
        wire_header_init(&h, type);
        return ctl_request(c, &h, want, ret);
}

static void ctl_wake(uv_timer_t *t) {
        Ctl *c = t->data;
        c->done = true;
}

/* Lets ms pass on the loop (the interval between two polls of watch and wait). */
static void ctl_pause(Ctl *c, unsigned ms) {
        uv_timer_t t;
        if (uv_timer_init(&c->loop, &t) < 0)
                return;
        t.data = c;
        c->done = false;
        if (uv_timer_start(&t, ctl_wake, ms, 0) == 0)
                while (!c->done)
                        uv_run(&c->loop, UV_RUN_ONCE);
        uv_close((uv_handle_t *) &t, NULL);
        uv_run(&c->loop, UV_RUN_NOWAIT);
}

static const char *job_rep_state(const Psnet__Header *m) {
        JobState st;
        return job_state_from_proto(m->job_rep->job_state, &st) < 0 ? "?" : job_state_name(st);
}

/* Prints a JOB_REP: "WHAT (state=S[, message])" or JSON. */
static int print_job_rep(Ctl *c, const Psnet__Header *m, const char *what) {
        const char *msg = m->job_rep->message;
        if (c->json)
                return print_json_strings("state", job_rep_state(m), "message", msg, NULL);
        printf("%s (state=%s%s%s)\n", what, job_rep_state(m), msg ? ", " : "", msg ? msg : "");
        return 0;
}

/* Sends h (type and body set), prints pscoord's JOB_REP as "WHAT (state=...)". */
static int ctl_job_request(Ctl *c, Psnet__Header *h, const char *what) {
        Psnet__Header *m;
        int r = ctl_request(c, h, PSNET__MSG_TYPE__MSG_JOB_REP, &m);
        if (r < 0)
                return r;
        r = print_job_rep(c, m, what);
        psnet__header__free_unpacked(m, NULL);
        return r;
}

/* --- verbs ---------------------------------------------------------------------- */

static int cmd_status(Ctl *c, char **args _unused_) {
        Psnet__Header *m;
        int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_STATUS, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
        if (r < 0)
                return r;
        if (c->json)
                r = print_status_json(m->status_rep);
        else
                print_status_table(m->status_rep);
        psnet__header__free_unpacked(m, NULL);
        return r;
}

static int cmd_export(Ctl *c, char **args) {
        if (c->format && strcmp(c->format, "safetensors") != 0) {
                fprintf(stderr, "psctl: export --format %s: the format is safetensors\n", c->format);
                return -EINVAL;
        }
        Psnet__Header *m;
        int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_STATUS, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
        if (r < 0)
                return r;
        r = psctl_export(&c->loop, c->zctx, c->id.enabled ? &c->id.keys : NULL, c->timeout, m->status_rep, args[0],
                         c->json);
        psnet__header__free_unpacked(m, NULL);
        return r;
}

static int cmd_report(Ctl *c, char **args _unused_) {
        if (!c->out || !c->out[0]) {
                fprintf(stderr, "psctl report: --out DIR says where to write it (see psctl report --help)\n");
                return -EINVAL;
        }
        Psnet__Header *m, *hm;
        int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_STATUS, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
        if (r < 0)
                return r;
        r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_HISTORY, PSNET__MSG_TYPE__MSG_HISTORY_REP, &hm);
        if (r == 0) {
                r = psctl_report(m->status_rep, hm->history, c->out, c->json);
                psnet__header__free_unpacked(hm, NULL);
        }
        psnet__header__free_unpacked(m, NULL);
        return r;
}

static int rounds(Ctl *c, bool history) {
        Psnet__Header *m;
        int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_STATUS, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
        if (r < 0)
                return r;
        r = print_rounds(m->status_rep, history, c->json);
        psnet__header__free_unpacked(m, NULL);
        return r;
}

static int cmd_round_status(Ctl *c, char **args _unused_) { return rounds(c, false); }
static int cmd_round_history(Ctl *c, char **args _unused_) { return rounds(c, true); }

static bool state_final(Psnet__JobState s) {
        JobState st;
        return job_state_from_proto(s, &st) < 0 || job_state_final(st);
}

/* One line per worker and interval until the job ends (or Ctrl-C). */
static int cmd_watch(Ctl *c, char **args _unused_) {
        for (;;) {
                Psnet__Header *m;
                int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_STATUS, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
                if (r < 0)
                        return r;
                if (c->json)
                        r = print_status_json(m->status_rep);
                else
                        print_watch(m->status_rep);
                bool end = state_final(m->status_rep->job_state);
                psnet__header__free_unpacked(m, NULL);
                if (r < 0 || end)
                        return r;
                ctl_pause(c, c->interval_ms);
        }
}

/* Polls the status until the job is done, stopped or failed; prints one line. */
static int cmd_job_wait(Ctl *c, char **args _unused_) {
        uint64_t deadline = now_ms() + (uint64_t) c->wait_s * 1000u;
        for (;;) {
                Psnet__Header *m;
                int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_STATUS, PSNET__MSG_TYPE__MSG_STATUS_REP, &m);
                if (r < 0)
                        return r;
                const Psnet__StatusRep *s = m->status_rep;
                JobState st = JOB_WAITING;
                (void) job_state_from_proto(s->job_state, &st);
                const char *state = job_state_name(st);
                if (job_state_final(st)) {
                        if (c->json)
                                r = print_json_result(state, s->has_accuracy, s->accuracy);
                        else if (s->has_accuracy)
                                printf("state=%s accuracy=%.4f\n", state, s->accuracy);
                        else
                                printf("state=%s%s%s%s\n", state, s->reason ? " reason=\"" : "",
                                       s->reason ? s->reason : "", s->reason ? "\"" : "");
                        if (r >= 0 && st != JOB_DONE)
                                r = -ECANCELED;
                        psnet__header__free_unpacked(m, NULL);
                        return r;
                }
                psnet__header__free_unpacked(m, NULL);
                if (c->wait_s && now_ms() >= deadline) {
                        fprintf(stderr, "psctl: job still %s after %u s\n", state, c->wait_s);
                        return -ETIMEDOUT;
                }
                ctl_pause(c, 250);
        }
}

static int cmd_job_stop(Ctl *c, char **args _unused_) {
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_JOB_STOP);
        return ctl_job_request(c, &h, "job stopped");
}

static int cmd_job_submit(Ctl *c, char **args _unused_) {
        char err[192];
        Job job;
        if (jobflags_to_job(&c->jf, &job, err, sizeof err) < 0) {
                fprintf(stderr, "psctl job submit: %s\n", err);
                return -EINVAL;
        }
        Psnet__JobSpec *spec;
        int r = job_to_proto(&job, &spec);
        if (r < 0)
                return r;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_JOB_SUBMIT);
        h.body_case = PSNET__HEADER__BODY_SUBMIT;
        h.submit = spec;
        r = ctl_job_request(c, &h, "job submitted");
        job_proto_free(spec);
        return r;
}

static int cmd_job_mode(Ctl *c, char **args) {
        Psnet__ModeSpec ms;
        ConsistencyMode mode;
        uint32_t staleness;
        if (mode_parse(args[0], &mode, &staleness) < 0) {
                fprintf(stderr, "psctl job mode: expected bsp, asp or ssp:S, not '%s'\n", args[0]);
                return -EINVAL;
        }
        mode_to_proto(mode, staleness, &ms);
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_JOB_MODE);
        h.body_case = PSNET__HEADER__BODY_MODE;
        h.mode = &ms;
        char what[64];
        snprintf(what, sizeof what, "mode %s", args[0]);
        return ctl_job_request(c, &h, what);
}

/* Parses a worker or shard id (1..2^32-1); complains on stderr otherwise. */
static int parse_id(const char *cmd, const char *what, const char *id, uint32_t *ret) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(id, &end, 10);
        if (id[0] < '0' || id[0] > '9' || errno || *end || v == 0 || v > UINT32_MAX) {
                fprintf(stderr, "%s: expected a %s id, got '%s'\n", cmd, what, id);
                return -EINVAL;
        }
        *ret = (uint32_t) v;
        return 0;
}

static int cmd_drain(Ctl *c, char **args) {
        Psnet__WorkerRef w = PSNET__WORKER_REF__INIT;
        if (parse_id("psctl worker drain", "worker", args[0], &w.id) < 0)
                return -EINVAL;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_DRAIN);
        h.body_case = PSNET__HEADER__BODY_WORKER;
        h.worker = &w;
        char what[64];
        snprintf(what, sizeof what, "worker %u is draining", w.id);
        return ctl_job_request(c, &h, what);
}

static int shard_change(Ctl *c, bool add, const char *arg) {
        Psnet__ShardRef ref = PSNET__SHARD_REF__INIT;
        if (strstr(arg, "://"))
                ref.endpoint = (char *) arg; /* the shard's advertised address */
        else if (parse_id(add ? "psctl shard add" : "psctl shard remove", "shard", arg, &ref.id) < 0)
                return -EINVAL;
        else
                ref.has_id = true;
        Psnet__Header h;
        wire_header_init(&h, add ? PSNET__MSG_TYPE__MSG_SHARD_ADD : PSNET__MSG_TYPE__MSG_SHARD_REMOVE);
        h.body_case = PSNET__HEADER__BODY_SHARD;
        h.shard = &ref;
        char what[192];
        snprintf(what, sizeof what, "shard %s %s; chunks are moving (psctl status shows INCOMING)", arg,
                 add ? "added" : "removed");
        return ctl_job_request(c, &h, what);
}

static int cmd_checkpoint_save(Ctl *c, char **args) {
        Psnet__Checkpoint ck = PSNET__CHECKPOINT__INIT;
        ck.name = args[0]; /* NULL: pscoord names it by its clock */
        Psnet__Header h, *m;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT);
        h.body_case = PSNET__HEADER__BODY_CHECKPOINT;
        h.checkpoint = &ck;
        unsigned was = c->timeout;
        c->timeout = c->wait_s ? c->wait_s : 600;
        int r = ctl_request(c, &h, PSNET__MSG_TYPE__MSG_CHECKPOINT_REP, &m);
        c->timeout = was;
        if (r < 0)
                return r;
        r = print_checkpoint_saved(m->checkpoint_rep, c->json);
        psnet__header__free_unpacked(m, NULL);
        return r;
}

static int cmd_checkpoint_list(Ctl *c, char **args _unused_) {
        Psnet__Header *m;
        int r = ctl_request_type(c, PSNET__MSG_TYPE__MSG_CHECKPOINT_LIST, PSNET__MSG_TYPE__MSG_CHECKPOINT_LIST_REP,
                                 &m);
        if (r < 0)
                return r;
        r = print_checkpoint_list(m->checkpoint_list, c->json);
        psnet__header__free_unpacked(m, NULL);
        return r;
}

static int cmd_checkpoint_restore(Ctl *c, char **args) {
        Psnet__Checkpoint ck = PSNET__CHECKPOINT__INIT;
        ck.name = args[0];
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT_RESTORE);
        h.body_case = PSNET__HEADER__BODY_CHECKPOINT;
        h.checkpoint = &ck;
        char what[128];
        snprintf(what, sizeof what, "restoring %s", args[0]);
        return ctl_job_request(c, &h, what);
}

static int cmd_keys_gen(Ctl *c, char **args) {
        Psnet__Role role;
        char err[512];
        const char *line;
        if (!c->role || role_from_name(c->role, &role) < 0) {
                fprintf(stderr, "psctl keys gen: --role is admin, server, worker, edge, gateway or strategy%s%s%s\n", c->role ? " (not '" : "",
                        c->role ? c->role : "", c->role ? "')" : "");
                return -EINVAL;
        }
        const char *dir = c->dir ? c->dir : c->keys ? c->keys : "/etc/psnet/keys";
        int r = keys_generate(dir, args[0], role, &line, err, sizeof err);
        if (r < 0) {
                fprintf(stderr, "psctl keys gen: %s\n", err);
                return r;
        }
        NetKeyPair kp;
        char fp[KEYS_FINGERPRINT_LEN], path[4096];
        if (keys_load_pair(dir, args[0], &kp, NULL, err, sizeof err) < 0) {
                fprintf(stderr, "psctl keys gen: %s\n", err);
                return -EIO;
        }
        keys_fingerprint(kp.public_key, fp);
        snprintf(path, sizeof path, "%s/%s.key", dir, args[0]);
        if (c->json)
                return print_json_strings("key", path, "role", role_name(role), "fingerprint", fp, "allow", line, NULL);
        printf("wrote %s (secret, mode 0600) and %s/%s.pub; fingerprint %s\nallow-list line (added to %s/allow):\n%s",
               path, dir, args[0], fp, dir, line);
        return 0;
}

/* A number option given as text (so that 0.1 is 0.1, not float's 0.100000001). */
static int number_opt(const char *name, const char *text, double lo, double hi, double *ret) {
        char *end;
        errno = 0;
        double v = text ? strtod(text, &end) : NAN;
        if (!text || errno || end == text || *end || !(v > lo && v <= hi)) {
                fprintf(stderr, "psctl privacy: --%s %s: a number in (%g, %g]\n", name, text ? text : "(missing)", lo,
                        hi);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static int cmd_privacy(Ctl *c, char **args _unused_) {
        double q, z, delta = 1e-5, eps, order;
        if (number_opt("fraction", c->dp_q, 0, 1, &q) < 0 || number_opt("dp-noise", c->dp_z, 0, 1e6, &z) < 0 ||
            (c->dp_delta && number_opt("dp-delta", c->dp_delta, 0, 0.999999, &delta) < 0))
                return -EINVAL;
        if (c->dp_rounds < 1) {
                fprintf(stderr, "psctl privacy: --rounds N: at least 1\n");
                return -EINVAL;
        }
        RdpConversion conv = c->dp_classic ? RDP_CLASSIC : RDP_TIGHT;
        if (rdp_epsilon(q, z, c->dp_rounds, delta, NULL, 0, conv, &eps, &order) < 0) {
                fprintf(stderr, "psctl privacy: the accountant refused q=%g noise=%g\n", q, z);
                return -EINVAL;
        }
        const char *how = c->dp_classic ? "classic conversion (Mironov 2017)" : RDP_ACCOUNTANT_TEXT;
        if (c->json) {
                json_t *o = json_pack("{s:f,s:f,s:f,s:I,s:f,s:f,s:s}", "epsilon", eps, "delta", delta, "q", q,
                                      "rounds", (json_int_t) c->dp_rounds, "noise", z, "order", order,
                                      "accountant", how);
                if (!o)
                        return -ENOMEM;
                char *t = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
                json_decref(o);
                if (!t)
                        return -ENOMEM;
                printf("%s\n", t);
                free(t);
                return 0;
        }
        printf("epsilon=%.6f at delta=%g after %u rounds of Poisson sampling q=%g with noise %g (order %g)\n"
               "accountant: %s\n", eps, delta, c->dp_rounds, q, z, order, how);
        return 0;
}

static int cmd_shard_add(Ctl *c, char **args) { return shard_change(c, true, args[0]); }
static int cmd_shard_remove(Ctl *c, char **args) { return shard_change(c, false, args[0]); }

/* --- options --------------------------------------------------------------------- */

static size_t global_options(Ctl *c, Option *o) {
        const Option t[] = {
                { "coord", OPT_STR, &c->coord, "ENDPOINT",
                  "pscoord endpoint (default $PSNET_COORD, else coord in ~/.config/psnet/psctl.conf, else "
                  PSNET_DEFAULT_COORD ")" },
                { "timeout", OPT_UINT, &c->timeout, "SECONDS", "how long to wait for pscoord's answer" },
                { "json", OPT_BOOL, &c->json, NULL, "machine-readable output (one JSON object per answer)" },
                { "keys", OPT_STR, &c->keys, "DIR",
                  "CURVE encryption with the keys of psctl keys gen in DIR (default $PSNET_KEYS, else keys in "
                  "~/.config/psnet/psctl.conf, else none)" },
                { "key", OPT_STR, &c->key, "NAME", "this tool's key in --keys (default admin)" },
                { "coord-key", OPT_STR, &c->coord_key, "NAME", "pscoord's key in --keys (default pscoord)" },
                program_log_option(&c->log_level),
                program_log_format_option(&c->log_format),
        };
        memcpy(o, t, sizeof t);
        return ELEMENTSOF(t);
}

static size_t watch_options(Ctl *c, Option *o) {
        o[0] = (Option) { "interval-ms", OPT_UINT, &c->interval_ms, "MS", "time between updates" };
        return 1;
}

static size_t wait_options(Ctl *c, Option *o) {
        o[0] = (Option) { "wait", OPT_UINT, &c->wait_s, "SECONDS", "give up after this long (0: never)" };
        return 1;
}

static size_t save_options(Ctl *c, Option *o) {
        o[0] = (Option) { "wait", OPT_UINT, &c->wait_s, "SECONDS", "how long to wait for the save (default 600)" };
        return 1;
}

static size_t submit_options(Ctl *c, Option *o) {
        return jobflags_options(&c->jf, o);
}

static size_t export_options(Ctl *c, Option *o) {
        o[0] = (Option) { "format", OPT_STR, &c->format, "FORMAT", "safetensors (the only one)" };
        return 1;
}

static size_t report_options(Ctl *c, Option *o) {
        o[0] = (Option) { "out", OPT_STR, &c->out, "DIR", "the directory to write (made if missing)" };
        return 1;
}

static size_t keys_options(Ctl *c, Option *o) {
        o[0] = (Option) { "role", OPT_STR, &c->role, "ROLE",
                          "admin (psctl), server (pscoord, psd), worker, edge, gateway (psgate) or strategy "
                          "(psnet.fed.start_strategy)" };
        o[1] = (Option) { "dir", OPT_STR, &c->dir, "DIR", "where to write (default: --keys, else /etc/psnet/keys)" };
        return 2;
}

static size_t privacy_options(Ctl *c, Option *o) {
        o[0] = (Option) { "fraction", OPT_STR, &c->dp_q, "Q", "each client's chance to be in a round (--fraction)" };
        o[1] = (Option) { "dp-noise", OPT_STR, &c->dp_z, "Z", "the noise multiplier (--dp-noise)" };
        o[2] = (Option) { "rounds", OPT_UINT, &c->dp_rounds, "N", "aggregated rounds" };
        o[3] = (Option) { "dp-delta", OPT_STR, &c->dp_delta, "D", "the delta of epsilon (default 1e-5)" };
        o[4] = (Option) { "classic", OPT_BOOL, &c->dp_classic, NULL,
                          "convert RDP with the classic bound (Mironov 2017), not Balle et al. 2020's" };
        return 5;
}

static int cmd_probe(Ctl *c, char **args) {
        return psctl_probe(args[0], c->ready, c->timeout, c->json);
}

static size_t probe_options(Ctl *c, Option *o) {
        o[0] = (Option) { "ready", OPT_BOOL, &c->ready, NULL, "GET /readyz (ready to serve), not /healthz (alive)" };
        return 1;
}

static int cmd_completion(Ctl *c, char **args);

/* Whether v is a command of group g (its first word, len bytes) of two words. */
static bool verb_in_group(const Verb *v, const char *g, size_t len) {
        return strncmp(v->name, g, len) == 0 && v->name[len] == ' ';
}

static const Verb verbs[] = {
        { "status", "", 0, cmd_status, NULL, "coordinator, shards and workers" },
        { "watch", "", 0, cmd_watch, watch_options, "live progress until the job ends" },
        { "worker drain", "ID", 1, cmd_drain, NULL, "the worker leaves the job after its current step" },
        { "shard add", "ID|ADDRESS", 1, cmd_shard_add, NULL, "put a registered (standby) psd into the map" },
        { "shard remove", "ID|ADDRESS", 1, cmd_shard_remove, NULL, "move a shard's chunks and table rows away, take it out" },
        { "job submit", "[JOB OPTIONS]", 0, cmd_job_submit, submit_options, "submit a job (psctl job submit --help)" },
        { "job mode", "MODE", 1, cmd_job_mode, NULL, "switch to bsp, asp or ssp:S at the next clock boundary" },
        { "job stop", "", 0, cmd_job_stop, NULL, "stop the running job" },
        { "checkpoint save", "[NAME]", 0, cmd_checkpoint_save, save_options,
          "save a consistent checkpoint of the running job (NAME: 1-64 of A-Z a-z 0-9 . _ -; default clock-N)",
          .optarg = true },
        { "checkpoint list", "", 0, cmd_checkpoint_list, NULL, "the checkpoints in pscoord's --checkpoint-dir" },
        { "round status", "", 0, cmd_round_status, NULL, "a federated job's rounds: done, the one open" },
        { "round history", "", 0, cmd_round_history, NULL,
          "a federated job's rounds, one line each: sampled, answered, late, dropped, refused, loss, seconds" },
        { "checkpoint restore", "NAME", 1, cmd_checkpoint_restore, NULL,
          "start checkpoint NAME's job from its clock (no job may be running)" },
        { "job wait", "", 0, cmd_job_wait, wait_options,
          "wait until the job ends; prints its accuracy (exit 1 unless it is done)" },
        { "export", "FILE", 1, cmd_export, export_options,
          "the job's values now, as FILE (safetensors, PyTorch state_dict names; a table's rows as NAME.ids and "
          "NAME.rows; docs/models.md, docs/tables.md)" },
        { "report", "", 0, cmd_report, report_options,
          "the job's curves (loss, accuracy, samples/s, staleness) as PNG, SVG and --out DIR/index.html" },
        { "privacy", "", 0, cmd_privacy, privacy_options,
          "the epsilon a private federated job spends (no pscoord needed): --fraction --dp-noise --rounds" },
        { "probe", "[ADDRESS]", 0, cmd_probe, probe_options,
          "GET a daemon's /healthz at its --http ADDRESS (default 127.0.0.1 on 9100, 9101, 9102): exit 0 on 200 "
          "(no pscoord needed; the image's health check)", .optarg = true },
        { "keys gen", "NAME", 1, cmd_keys_gen, keys_options,
          "write a CURVE key pair NAME.key and its allow-list line (--role R)" },
        { "completion", "bash", 1, cmd_completion, NULL,
          "print bash's completion of psctl's commands and options (installed with psctl; or source <(psctl "
          "completion bash))" },
};

/* Whether verbs[i] is the first command with its first word. */
static bool verb_first_word(size_t i) {
        size_t len = strcspn(verbs[i].name, " ");
        for (size_t k = 0; k < i; k++)
                if (strncmp(verbs[k].name, verbs[i].name, len) == 0 && strcspn(verbs[k].name, " ") == len)
                        return false;
        return true;
}

/* verbs' line in psctl --help and psctl GROUP --help. */
static void verb_line(const Verb *v, char *buf, size_t n) {
        char left[64];
        snprintf(left, sizeof left, "%s %s", v->name, v->args);
        snprintf(buf, n, "  %-28s %s\n", left, v->help);
}

/* Writes each option name of opts (n) to f as " --name", those that take a
 * value only when valued. */
static void completion_names(FILE *f, const Option *opts, size_t n, bool valued) {
        for (size_t i = 0; i < n; i++)
                if (opts[i].name && (!valued || opts[i].type != OPT_BOOL))
                        fprintf(f, " --%s", opts[i].name);
}

/* bash's completion, made from the tables above so that it never falls
 * behind them: the commands, each one's options (its own and the global
 * ones), and which options take a value (the word after one is not a
 * command). */
static int cmd_completion(Ctl *c, char **args) {
        if (strcmp(args[0], "bash") != 0) {
                fprintf(stderr, "psctl completion: no completion for shell '%s' (bash is the one there is)\n", args[0]);
                return -EINVAL;
        }
        Option opts[PSCTL_MAX_OPTS];
        size_t ng = global_options(c, opts);
        printf("# bash completion for psctl: psctl completion bash (psnet %s)\n", PSNET_VERSION);
        printf("_psctl_global=\"");
        completion_names(stdout, opts, ng, false);
        printf(" --config --help --version\"\n_psctl_valued=\"");
        completion_names(stdout, opts, ng, true);
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                if (verbs[i].options)
                        completion_names(stdout, opts + ng, verbs[i].options(c, opts + ng), true);
        printf(" --config \"\n_psctl_groups=\"");
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                if (verb_first_word(i))
                        printf(" %.*s", (int) strcspn(verbs[i].name, " "), verbs[i].name);
        printf("\"\ndeclare -gA _psctl_subs=(");
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++) {
                size_t len = strcspn(verbs[i].name, " ");
                if (!verbs[i].name[len] || !verb_first_word(i))
                        continue; /* one word, or its group was written */
                printf(" [%.*s]=\"", (int) len, verbs[i].name);
                for (size_t j = i; j < ELEMENTSOF(verbs); j++)
                        if (verb_in_group(&verbs[j], verbs[i].name, len))
                                printf(" %s", verbs[j].name + len + 1);
                printf("\"");
        }
        printf(")\ndeclare -gA _psctl_opts=(");
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++) {
                size_t n = verbs[i].options ? verbs[i].options(c, opts + ng) : 0;
                printf(" [\"%s\"]=\"", verbs[i].name);
                completion_names(stdout, opts, ng + n, false);
                printf(" --config --help\"");
        }
        printf(")\n%s", "_psctl() {\n"
               "        local cur=${COMP_WORDS[COMP_CWORD]} prev='' i w key cmd=()\n"
               "        ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}\n"
               "        for ((i = 1; i < COMP_CWORD; i++)); do\n"
               "                w=${COMP_WORDS[i]}\n"
               "                case $w in\n"
               "                --*=*) ;;\n"
               "                -*) [[ $_psctl_valued == *\" $w \"* ]] && ((i++)) ;;\n"
               "                *) cmd+=(\"$w\") ;;\n"
               "                esac\n"
               "        done\n"
               "        COMPREPLY=()\n"
               "        case $prev in\n"
               "        --config) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
               "        --keys | --dir | --out) COMPREPLY=($(compgen -d -- \"$cur\")); return ;;\n"
               "        esac\n"
               "        [[ $prev == -* && $_psctl_valued == *\" $prev \"* ]] && return\n"
               "        key=${cmd[0]:-}\n"
               "        [[ -n ${cmd[1]:-} && -n ${_psctl_opts[\"$key ${cmd[1]}\"]+x} ]] && key=\"$key ${cmd[1]}\"\n"
               "        if [[ $cur == -* ]]; then\n"
               "                if [[ -n $key && -n ${_psctl_opts[$key]+x} ]]; then\n"
               "                        COMPREPLY=($(compgen -W \"${_psctl_opts[$key]}\" -- \"$cur\"))\n"
               "                else\n"
               "                        COMPREPLY=($(compgen -W \"$_psctl_global\" -- \"$cur\"))\n"
               "                fi\n"
               "        elif ((${#cmd[@]} == 0)); then\n"
               "                COMPREPLY=($(compgen -W \"$_psctl_groups\" -- \"$cur\"))\n"
               "        elif ((${#cmd[@]} == 1)) && [[ -n ${_psctl_subs[$key]+x} ]]; then\n"
               "                COMPREPLY=($(compgen -W \"${_psctl_subs[$key]}\" -- \"$cur\"))\n"
               "        elif [[ $key == export && ${#cmd[@]} == 1 ]]; then\n"
               "                COMPREPLY=($(compgen -f -- \"$cur\"))\n"
               "        elif [[ $key == completion && ${#cmd[@]} == 1 ]]; then\n"
               "                COMPREPLY=($(compgen -W bash -- \"$cur\"))\n"
               "        fi\n"
               "}\n"
               "complete -F _psctl psctl\n");
        return fflush(stdout) == 0 ? 0 : -errno;
}

/* The defaults a user set for every call, below the flags and --config:
 * ~/.config/psnet/psctl.conf (or $XDG_CONFIG_HOME/psnet/psctl.conf; any of
 * the global options, as --config FILE takes them), then $PSNET_COORD and
 * $PSNET_KEYS over it. Returns 0, or -EINVAL after saying why. */
static int user_defaults(const ProgramInfo *prog, Ctl *c, const Option *opts, size_t n, char *path, size_t pn) {
        const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
        path[0] = 0;
        if (xdg && xdg[0] == '/')
                snprintf(path, pn, "%s/psnet/psctl.conf", xdg);
        else if (home && home[0])
                snprintf(path, pn, "%s/.config/psnet/psctl.conf", home);
        if (path[0] && access(path, F_OK) == 0) {
                int r = config_load_file(prog, opts, n, path);
                if (r < 0)
                        return r;
                if (c->coord)
                        c->coord_from = path;
        }
        static const struct { const char *env, *opt; } envs[] = { { "PSNET_COORD", "coord" }, { "PSNET_KEYS", "keys" } };
        for (size_t i = 0; i < ELEMENTSOF(envs); i++) {
                const char *v = getenv(envs[i].env);
                if (!v || !v[0])
                        continue;
                int r = config_set(prog, opts, n, envs[i].opt, v, envs[i].env);
                if (r < 0)
                        return r;
                if (i == 0)
                        c->coord_from = "$PSNET_COORD";
        }
        return 0;
}

/* The commands of group g ("job"): printed as psctl --help prints them all,
 * to f (NULL: not printed); false when no command starts with that word. */
static bool group_print(FILE *f, const char *g) {
        size_t len = strlen(g), n = 0;
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++) {
                if (!verb_in_group(&verbs[i], g, len) || (n++, !f))
                        continue;
                if (n == 1)
                        fprintf(f, "Usage: psctl %s COMMAND [ARGS] [OPTIONS]\n\nCommands:\n", g);
                char line[256];
                verb_line(&verbs[i], line, sizeof line);
                fputs(line, f);
        }
        if (n && f)
                fprintf(f, "Each command takes --help; psctl --help lists the options every command takes.\n");
        return n > 0;
}

/* The verb named by argv[0] (and argv[1] for two-word verbs); *ret_words is 1 or 2. */
static const Verb *verb_find(int argc, char **argv, int *ret_words) {
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++) {
                const char *sp = strchr(verbs[i].name, ' ');
                if (!sp && strcmp(argv[0], verbs[i].name) == 0) {
                        *ret_words = 1;
                        return &verbs[i];
                }
                if (sp && argc >= 2 && strncmp(argv[0], verbs[i].name, (size_t) (sp - verbs[i].name)) == 0 &&
                    argv[0][sp - verbs[i].name] == '\0' && strcmp(argv[1], sp + 1) == 0) {
                        *ret_words = 2;
                        return &verbs[i];
                }
        }
        return NULL;
}

static void usage_epilog(char *buf, size_t n) {
        size_t k = (size_t) snprintf(buf, n, "Commands (options may also follow the command):\n");
        for (size_t i = 0; i < ELEMENTSOF(verbs) && k < n; i++) {
                verb_line(&verbs[i], buf + k, n - k);
                k += strlen(buf + k);
        }
        if (k < n)
                snprintf(buf + k, n - k, "Each command takes --help.");
}

/* Parses the words after the verb: exactly v->nargs positional arguments and
 * the verb's options plus the global ones, in any order. Returns 0, 1 (help
 * shown), or -EINVAL after saying why on stderr. */
static int verb_parse(Ctl *c, const Verb *v, int argc, char **argv, char **args) {
        Option opts[PSCTL_MAX_OPTS];
        char prog_name[48], usage[96];
        size_t n = global_options(c, opts);
        if (v->options)
                n += v->options(c, opts + n);
        snprintf(prog_name, sizeof prog_name, "psctl %s", v->name);
        snprintf(usage, sizeof usage, "%s%s[OPTIONS]", v->args, v->args[0] ? " " : "");
        const ProgramInfo prog = { .name = prog_name, .summary = v->help, .usage = usage };
        /* Positional words out, options (and their values) kept for config_parse. */
        char **rest = calloc((size_t) argc + 2, sizeof *rest);
        if (!rest)
                return -ENOMEM;
        int nrest = 1;
        unsigned npos = 0;
        rest[0] = prog_name;
        int r = 0;
        for (int i = 0; i < argc && r == 0; i++) {
                const char *a = argv[i];
                if (a[0] == '-' && a[1] != '\0') {
                        rest[nrest++] = argv[i];
                        /* A value follows options that take one, unless given with '='. */
                        const Option *o = NULL;
                        for (size_t k = 0; k < n && a[1] == '-'; k++)
                                if (strcmp(a + 2, opts[k].name) == 0)
                                        o = &opts[k];
                        if (o && o->type != OPT_BOOL && i + 1 < argc)
                                rest[nrest++] = argv[++i];
                } else if (npos < v->nargs + (v->optarg ? 1u : 0u))
                        args[npos++] = argv[i];
                else {
                        fprintf(stderr, "psctl %s: unexpected argument '%s' (see psctl %s --help)\n", v->name, a,
                                v->name);
                        r = -EINVAL;
                }
        }
        if (r == 0) {
                int optind_ = 0;
                r = config_parse(&prog, opts, n, nrest, rest, &optind_);
                if (r == 0 && optind_ < nrest) {
                        fprintf(stderr, "psctl %s: unexpected argument '%s'\n", v->name, rest[optind_]);
                        r = -EINVAL;
                }
        }
        if (r == 0 && npos < v->nargs) {
                fprintf(stderr, "psctl %s: missing %s (see psctl %s --help)\n", v->name, v->args, v->name);
                r = -EINVAL;
        }
        free(rest);
        return r;
}

int main(int argc, char **argv) {
        Ctl c = { .timeout = 5, .interval_ms = 1000 };
        Option opts[PSCTL_MAX_OPTS];
        char epilog[4096];
        int optind_ = 0, words = 0, r;
        char *args[2] = { NULL, NULL };

        log_setup("psctl");
        log_set_level(LOG_WARNING);
        jobflags_init(&c.jf);
        usage_epilog(epilog, sizeof epilog);
        const ProgramInfo prog = {
                .name = "psctl", .summary = "psnet administration", .usage = "[OPTIONS] COMMAND [ARGS] [OPTIONS]",
                .epilog = epilog,
        };
        size_t n = global_options(&c, opts);
        char conf[PATH_MAX];
        r = user_defaults(&prog, &c, opts, n, conf, sizeof conf);
        char *preset = c.coord ? strdup(c.coord) : NULL; /* a --coord or --config below may replace it */
        if (r == 0 && c.coord && !preset)
                r = -ENOMEM;
        if (r == 0)
                r = config_parse(&prog, opts, n, argc, argv, &optind_);
        const Verb *v = NULL;
        if (r == 0 && optind_ >= argc) {
                fprintf(stderr, "psctl: missing command (see psctl --help)\n");
                r = -EINVAL;
        } else if (r == 0 && !(v = verb_find(argc - optind_, argv + optind_, &words))) {
                const char *next = optind_ + 1 < argc ? argv[optind_ + 1] : NULL;
                bool help = next && (strcmp(next, "--help") == 0 || strcmp(next, "-h") == 0);
                if (help && group_print(stdout, argv[optind_]))
                        r = 1;
                else if (!next && group_print(stderr, argv[optind_])) {
                        fprintf(stderr, "psctl %s: missing command (above)\n", argv[optind_]);
                        r = -EINVAL;
                } else {
                        bool group = next && group_print(NULL, argv[optind_]);
                        fprintf(stderr, "psctl: unknown command '%s%s%s' (see psctl %s%s--help)\n", argv[optind_],
                                next ? " " : "", next ? next : "", group ? argv[optind_] : "", group ? " " : "");
                        r = -EINVAL;
                }
        }
        if (r == 0)
                r = verb_parse(&c, v, argc - optind_ - words, argv + optind_ + words, args);
        if (!c.coord || !preset || strcmp(c.coord, preset) != 0)
                c.coord_from = NULL; /* given, or the built-in default */
        free(preset);
        if (r == 0)
                r = program_log_format("psctl", c.log_format);
        if (r == 0)
                r = program_log_level("psctl", c.log_level);
        if (r == 0) {
                if (!c.coord)
                        c.coord = strdup(PSNET_DEFAULT_COORD);
                r = c.coord ? v->run(&c, args) : -ENOMEM;
                r = r < 0 ? (r == -EINVAL ? 2 : EXIT_FAILURE) : EXIT_SUCCESS;
        } else
                r = r > 0 ? EXIT_SUCCESS : 2;
        c.session = session_free(c.session);
        if (c.loop_init) {
                uv_run(&c.loop, UV_RUN_NOWAIT);
                (void) uv_loop_close(&c.loop);
        }
        if (c.zctx)
                zmq_ctx_term(c.zctx);
        /* Strings set by parsing (the global table and the job flags). */
        size_t nj = global_options(&c, opts);
        nj += submit_options(&c, opts + nj);
        nj += keys_options(&c, opts + nj);
        nj += report_options(&c, opts + nj);
        nj += export_options(&c, opts + nj);
        config_free_strings(opts, nj);
        free(c.coord);
        return r;
}
