/* SPDX-License-Identifier: Apache-2.0 */
/* psd: a parameter-server shard. Holds a slice of the job's parameters and
 * their optimizer state, serves PULL and PUSH from workers, and follows
 * pscoord's job, shard map and membership. Logic lives in psd-server.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "endpoint.h"
#include "config.h"
#include "log.h"
#include "pfor.h"
#include "program.h"
#include "psd-server.h"

int main(int argc, char **argv) {
        PsdConfig cfg = {
                .listen = NULL, .coord = NULL, .id = 1, .connect_timeout = 10,
                .max_msg = 16ull << 20, .park_timeout = 300, .threads = 1, .idle_timeout = 30,
        };
        bool id_from_host = false;
        const Option opts[] = {
                { "id", OPT_UINT, &cfg.id, "N", "shard id, unique in the cluster (>= 1)" },
                { "id-from-hostname", OPT_BOOL, &id_from_host, NULL,
                  "take the id from a StatefulSet pod's hostname NAME-N: N + 1 (psd-0 is shard 1)" },
                { "listen", OPT_STR, &cfg.listen, "ENDPOINT",
                  "data-plane endpoint to bind (default ipc:///tmp/psnet/psd-ID.sock)" },
                { "advertise", OPT_STR, &cfg.advertise, "ENDPOINT",
                  "endpoint workers use to reach this shard (default: --listen)" },
                { "coord", OPT_STR, &cfg.coord, "ENDPOINT",
                  "pscoord endpoint (default " PSNET_DEFAULT_COORD ")" },
                { "connect-timeout", OPT_UINT, &cfg.connect_timeout, "SECONDS",
                  "give up when pscoord does not answer within this time" },
                { "max-msg", OPT_U64, &cfg.max_msg, "BYTES",
                  "largest frame accepted; a job's own limit (its largest chunk) applies once known" },
                { "memory-limit", OPT_U64, &cfg.memory_limit, "BYTES",
                  "model state (values + optimizer) this shard may hold; pscoord refuses bigger jobs "
                  "(default: the memory available at start, or the container's cgroup limit, v1 or v2, when lower)" },
                { "park-timeout", OPT_UINT, &cfg.park_timeout, "SECONDS", "how long a pull may wait for its clock" },
                { "http", OPT_STR, &cfg.http, "ADDR:PORT",
                  "serve /metrics, /healthz and /readyz over HTTP (e.g. 127.0.0.1:9101, :9101 for all addresses; empty: off)" },
                { "keys", OPT_STR, &cfg.keys, "DIR",
                  "CURVE encryption; admit only the keys of DIR/allow, each in its role (psctl keys gen)" },
                { "key", OPT_STR, &cfg.key, "NAME", "this shard's key in --keys (default psd)" },
                { "coord-key", OPT_STR, &cfg.coord_key, "NAME", "pscoord's key in --keys (default pscoord)" },
                { "insecure", OPT_BOOL, &cfg.insecure, NULL,
                  "allow a non-loopback tcp:// --listen without --keys (anyone who reaches it can push)" },
                { "no-shm", OPT_BOOL, &cfg.no_shm, NULL,
                  "do not offer same-host shared memory on PATH.shm beside an ipc://PATH --listen (workers on "
                  "this host then send their tensors in frames)" },
                { "idle-timeout", OPT_UINT, &cfg.idle_timeout, "SECONDS",
                  "drop a connection that sends nothing for this long, a frame begun and never finished "
                  "included (ZeroMQ pings it every third of that; live peers answer by themselves; 0: never)" },
                { "threads", OPT_UINT, &cfg.threads, "N",
                  "threads that apply an update (1-64): each chunk's optimizer step, checks and shared-memory "
                  "copies are cut into N parts; the same result with any N" },
        };
        const ProgramInfo prog = {
                .name = "psd", .summary = "psnet parameter-server shard", .usage = "[OPTIONS]",
                .epilog = "Config file: --config /etc/psnet/psd.conf (keys as the long options).\n"
                          "Signals: SIGTERM/SIGINT leave the cluster and stop.",
        };
        Program p;
        char listen[128];
        int r = program_start(&p, &prog, opts, ELEMENTSOF(opts), argc, argv);
        if (r != 0)
                goto out;
        if (id_from_host) {
                char host[256] = "";
                unsigned n;
                if (gethostname(host, sizeof host - 1) < 0 || hostname_ordinal(host, &n) < 0) {
                        fprintf(stderr, "psd: --id-from-hostname: hostname '%s' does not end in -N "
                                        "(a StatefulSet pod's name)\n", host);
                        r = -EINVAL;
                        goto out;
                }
                cfg.id = n + 1;
        }
        if (cfg.id == 0) {
                fprintf(stderr, "psd: --id must be >= 1\n");
                r = -EINVAL;
                goto out;
        }
        if (cfg.max_msg < 1024) {
                fprintf(stderr, "psd: --max-msg must be at least 1024 bytes (got %llu): it bounds every frame, "
                                "a job's chunks included\n", (unsigned long long) cfg.max_msg);
                r = -EINVAL;
                goto out;
        }
        if (cfg.threads < 1 || cfg.threads > PFOR_MAX_THREADS) {
                fprintf(stderr, "psd: --threads must be 1 to %d\n", PFOR_MAX_THREADS);
                r = -EINVAL;
                goto out;
        }
        snprintf(listen, sizeof listen, "ipc:///tmp/psnet/psd-%u.sock", cfg.id);
        PsdConfig run = cfg;
        if (!run.listen)
                run.listen = listen;
        if (!run.coord)
                run.coord = (char *) PSNET_DEFAULT_COORD;
        char fields[32];
        snprintf(fields, sizeof fields, "shard=%u", cfg.id);
        log_set_fields(fields);

        r = psd_run(&run);
out:
        program_done(&p);
        /* A configuration error (keys, listen address) exits 2: restarting will not help. */
        return program_exit(r);
}
