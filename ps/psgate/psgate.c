/* SPDX-License-Identifier: Apache-2.0 */
/* psgate: the edge clients' one front door. Edge clients (workerd --edge
 * --gateway, psnet.fed.start_client(gateway=...)) dial it alone; it relays
 * their messages to pscoord and the shards (relay.c). A daemon of its own,
 * not a role of pscoord: it holds no state, so any number of them run
 * behind one DNS name; it sits where the clients can reach it while pscoord
 * and the shards stay inside; and the bytes of every update pass through it,
 * on cores of its own rather than the coordinator's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>
#include "config.h"
#include "keys.h"
#include "log.h"
#include "macro.h"
#include "program.h"
#include "relay.h"
#include "service.h"
#include "zap.h"

typedef struct Gate {
        uv_loop_t loop;
        void *zctx;
        Service *service;
        Zap *zap;
        Relay *relay;
        NetIdentity id;
} Gate;

static void gate_stop(void *ud, int signo) {
        Gate *g = ud;
        (void) signo;
        service_stopping(g->service);
        uv_stop(&g->loop);
}

/* SIGHUP: the allow-list is read again (a client's key added or withdrawn). */
static void gate_reload(void *ud) {
        zap_sighup(((Gate *) ud)->zap);
}

static void gate_metrics(void *ud, MetricsBuf *b) {
        const Gate *g = ud;
        if (g->relay)
                relay_metrics(g->relay, b);
}

static void gate_status(void *ud, char *buf, size_t n) {
        const Gate *g = ud;
        if (g->relay)
                relay_status(g->relay, buf, n);
        else
                snprintf(buf, n, "starting");
}

typedef struct GateOptions {
        char *listen, *coord, *keys, *key, *coord_key, *http;
        bool insecure;
        unsigned max_clients, idle_s, io_threads;
        uint64_t max_msg_mib;
} GateOptions;

static int gate_run(const GateOptions *o) {
        Gate g = { 0 };
        char err[512];
        int r = uv_loop_init(&g.loop);
        if (r < 0)
                return log_error_errno(r, "Failed to start the event loop: %s", uv_strerror(r));
        const ServiceOps sops = { .stop = gate_stop, .reload = gate_reload, .metrics = gate_metrics,
                                  .status = gate_status };
        r = service_new(&g.loop, "psgate", &sops, &g, &g.service);
        if (r < 0) {
                log_error_errno(r, "Failed to set up signals: %m");
                goto finish;
        }
        g.zctx = zmq_ctx_new();
        if (!g.zctx) {
                r = log_error_errno(errno, "Failed to create ZeroMQ context: %m");
                goto finish;
        }
        /* CURVE runs on the I/O threads: every update is decrypted from its
         * client and encrypted again to its shard there. Each client has a
         * connection in and one per far end out. */
        (void) zmq_ctx_set(g.zctx, ZMQ_IO_THREADS, (int) MAX(o->io_threads, 1u));
        (void) zmq_ctx_set(g.zctx, ZMQ_MAX_SOCKETS, (int) MIN((uint64_t) o->max_clients * 8 + 64, (uint64_t) 1 << 20));
        r = zap_daemon_keys(&g.loop, g.zctx, o->keys, o->key ? o->key : "psgate", o->coord_key ? o->coord_key : "pscoord",
                            PSNET__ROLE__ROLE_GATEWAY, WIRE_ROLE(PSNET__ROLE__ROLE_EDGE), o->listen, o->insecure, &g.id,
                            &g.zap);
        if (r < 0)
                goto finish;
        const RelayConfig rc = { .listen = o->listen, .coord = o->coord, .id = &g.id, .max_clients = o->max_clients,
                                 .idle_s = o->idle_s, .max_msg = o->max_msg_mib << 20 };
        r = relay_new(&g.loop, g.zctx, &rc, &g.relay);
        if (r < 0) {
                r = r == -ENOMEM ? r : -EINVAL; /* an address it cannot bind: a configuration error */
                goto finish;
        }
        if (o->http && (r = service_http(g.service, o->http, err, sizeof err)) < 0) {
                log_error("%s", err);
                r = -EINVAL;
                goto finish;
        }
        service_ready(g.service);
        log_info("listening endpoint=%s coord=%s max_clients=%u security=%s", o->listen, o->coord, o->max_clients,
                 g.id.enabled ? "curve" : "none");
        r = uv_run(&g.loop, UV_RUN_DEFAULT);
        r = r < 0 ? r : 0;
finish:
        g.relay = relay_free(g.relay);
        g.zap = zap_free(g.zap);
        g.service = service_free(g.service);
        uv_run(&g.loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
        if (uv_loop_close(&g.loop) < 0)
                log_debug("event loop closed with handles open");
        if (g.zctx)
                zmq_ctx_term(g.zctx);
        return r;
}

int main(int argc, char **argv) {
        GateOptions o = { .max_clients = 10000, .idle_s = 60, .io_threads = 2, .max_msg_mib = 64 };
        const Option opts[] = {
                { "listen", OPT_STR, &o.listen, "ENDPOINT",
                  "the front door edge clients dial (e.g. tcp://0.0.0.0:7100; required)" },
                { "coord", OPT_STR, &o.coord, "ENDPOINT", "pscoord (default " PSNET_DEFAULT_COORD ")" },
                { "keys", OPT_STR, &o.keys, "DIR",
                  "CURVE encryption; admit only the edge keys of DIR/allow; this daemon's key has role gateway, "
                  "which pscoord's and the shards' allow-lists must list (psctl keys gen)" },
                { "key", OPT_STR, &o.key, "NAME", "this daemon's key in --keys (default psgate)" },
                { "coord-key", OPT_STR, &o.coord_key, "NAME", "pscoord's public key in --keys (default pscoord)" },
                { "insecure", OPT_BOOL, &o.insecure, NULL,
                  "allow a non-loopback tcp:// --listen without --keys (anyone who reaches it can join)" },
                { "max-clients", OPT_UINT, &o.max_clients, "N",
                  "clients at once; more are refused with a reason (default 10000)" },
                { "idle-timeout", OPT_UINT, &o.idle_s, "SECONDS",
                  "a client silent this long is forgotten and its connections closed (default 60; its session "
                  "with pscoord heartbeats every second or so)" },
                { "max-msg", OPT_U64, &o.max_msg_mib, "MIB", "the largest frame a client may send (default 64)" },
                { "io-threads", OPT_UINT, &o.io_threads, "N",
                  "ZeroMQ I/O threads, which also encrypt and decrypt (default 2)" },
                { "http", OPT_STR, &o.http, "ADDR:PORT", "serve /metrics, /healthz and /readyz over HTTP (empty: off)" },
        };
        const ProgramInfo prog = {
                .name = "psgate", .summary = "psnet edge gateway: the edge clients' one front door", .usage = "[OPTIONS]",
                .epilog = "Edge clients dial psgate alone (workerd --edge --gateway ENDPOINT); it relays their\n"
                          "messages to pscoord and the shards, whose addresses they never learn.\n"
                          "Config file: --config /etc/psnet/psgate.conf (keys as the long options).",
        };
        Program p;
        int r = program_start(&p, &prog, opts, ELEMENTSOF(opts), argc, argv);
        if (r != 0)
                goto out;
        if (!o.listen) {
                fprintf(stderr, "psgate: --listen ENDPOINT is required (where edge clients dial)\n");
                r = -1;
                goto out;
        }
        if (o.max_clients == 0 || o.idle_s == 0 || o.max_msg_mib == 0 || o.max_msg_mib > 4096) {
                fprintf(stderr, "psgate: --max-clients and --idle-timeout must be >= 1, --max-msg 1 to 4096 MiB\n");
                r = -1;
                goto out;
        }
        GateOptions run = o;
        run.coord = o.coord ? o.coord : (char *) PSNET_DEFAULT_COORD;
        r = gate_run(&run);
out:
        program_done(&p);
        return program_exit(r);
}
