/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord: the coordinator. Owns membership (leases), the shard map and the job;
 * answers psctl. Logic lives in coord.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "config.h"
#include "coord.h"
#include "job-flags.h"
#include "job-init.h"
#include "log.h"
#include "macro.h"
#include "program.h"

int main(int argc, char **argv) {
        CoordConfig cfg = { .lease_ms = 3000, .shard_lease_ms = 600, .stall_timeout = 60, .checkpoint_keep = 3,
                            .checkpoint_timeout = 120, .idle_timeout = 30 };
        JobFlags jf;
        char *listen = NULL;
        Option opts[22 + JOBFLAGS_NOPTS] = {
                { "listen", OPT_STR, &listen, "ENDPOINT", "control endpoint to bind (default " PSNET_DEFAULT_COORD ")" },
                { "keys", OPT_STR, &cfg.keys, "DIR",
                  "CURVE encryption; admit only the keys of DIR/allow, each in its role (psctl keys gen)" },
                { "key", OPT_STR, &cfg.key, "NAME", "this daemon's key in --keys (default pscoord)" },
                { "insecure", OPT_BOOL, &cfg.insecure, NULL,
                  "allow a non-loopback tcp:// --listen without --keys (anyone who reaches it can join)" },
                { "http", OPT_STR, &cfg.http, "ADDR:PORT",
                  "serve /metrics, /healthz and /readyz over HTTP (e.g. 127.0.0.1:9100, :9100 for all addresses; empty: off)" },
                { "lease-ms", OPT_UINT, &cfg.lease_ms, "MS",
                  "a worker silent this long has left; so has a shard holding the only copy of a key (its loss "
                  "fails the job)" },
                { "shard-lease-ms", OPT_UINT, &cfg.shard_lease_ms, "MS",
                  "a shard silent this long has left: its backups take over its keys (a shard stops acknowledging "
                  "when its own lease runs out, before that); one without backups for a key is given --lease-ms" },
                { "idle-timeout", OPT_UINT, &cfg.idle_timeout, "SECONDS",
                  "drop a connection that sends nothing for this long, a message begun and never finished "
                  "included (ZeroMQ pings it every third of that; live peers answer by themselves; 0: never)" },
                { "stall-timeout", OPT_UINT, &cfg.stall_timeout, "SECONDS",
                  "a worker the others have waited on this long leaves the membership (0: never); after a job's k-th such "
                  "eviction new workers wait this long x 2^(k-1)" },
                { "checkpoint-dir", OPT_STR, &cfg.checkpoint_dir, "DIR",
                  "where checkpoints are written, one directory each (every shard must reach the same path: a "
                  "shared file system across hosts)" },
                { "checkpoint-every", OPT_UINT, &cfg.checkpoint_every, "CLOCKS",
                  "save a checkpoint every CLOCKS clocks; a federated job: every CLOCKS rounds (0: only when psctl checkpoint save asks)" },
                { "checkpoint-keep", OPT_UINT, &cfg.checkpoint_keep, "N",
                  "automatic checkpoints kept, the oldest removed first (0: all; named ones are never removed)" },
                { "checkpoint-timeout", OPT_UINT, &cfg.checkpoint_timeout, "SECONDS",
                  "a save not finished by then is given up (the previous checkpoints stay)" },
                { "restore", OPT_STR, &cfg.restore, "NAME",
                  "start with the job of checkpoint NAME in --checkpoint-dir, from its clock, instead of the job options" },
                { "keep-standby", OPT_BOOL, &cfg.keep_standby, NULL,
                  "a shard that registers after a fail-over waits on standby (psctl shard add brings it in) "
                  "instead of taking the lost shard's place in the map at once" },
                { "state-dir", OPT_STR, &cfg.state_dir, "DIR",
                  "keep the job, shard map and members in DIR (created if missing) so that a restart, here or on "
                  "another host with the same DIR, goes on where it stopped (default: none; systemd: "
                  "/var/lib/psnet/pscoord)" },
        };
        const ProgramInfo prog = {
                .name = "pscoord", .summary = "psnet coordinator: membership, shard map, job", .usage = "[OPTIONS]",
                .epilog = "The job options describe the job pscoord starts once the expected shards and\n"
                          "workers have registered; psctl job submit replaces it later.\n"
                          "Config file: --config /etc/psnet/pscoord.conf (keys as the long options).",
        };
        char err[192];
        Program p;
        int r;

        jobflags_init(&jf);
        /* The job's flags after pscoord's own (the first unset entry). */
        size_t own = 0;
        while (own < ELEMENTSOF(opts) - JOBFLAGS_NOPTS && opts[own].name)
                own++;
        size_t n = own + jobflags_options(&jf, opts + own);
        r = program_start(&p, &prog, opts, n, argc, argv);
        if (r != 0)
                goto out;
        if (cfg.checkpoint_dir && cfg.checkpoint_dir[0] != '/') {
                fprintf(stderr, "pscoord: --checkpoint-dir must be an absolute path (the shards are told it)\n");
                r = -1;
                goto out;
        }
        if ((cfg.restore || cfg.checkpoint_every) && !cfg.checkpoint_dir) {
                fprintf(stderr, "pscoord: --restore and --checkpoint-every need --checkpoint-dir\n");
                r = -1;
                goto out;
        }
        if (cfg.checkpoint_timeout == 0)
                cfg.checkpoint_timeout = 120;
        if (cfg.lease_ms < 100 || cfg.shard_lease_ms < 100) {
                fprintf(stderr, "pscoord: --lease-ms and --shard-lease-ms must be >= 100\n");
                r = -1;
                goto out;
        }
        if (jobflags_to_job(&jf, &cfg.job, err, sizeof err) < 0) {
                fprintf(stderr, "pscoord: %s\n", err);
                r = -1;
                goto out;
        }
        if (cfg.job.init[0] && job_init_check(&cfg.job, cfg.job.init, err, sizeof err) < 0) {
                fprintf(stderr, "pscoord: bad --init: %s\n", err);
                r = -1;
                goto out;
        }
        cfg.listen = listen ? listen : (char *) PSNET_DEFAULT_COORD;
        r = coord_run(&cfg);
out:
        program_done(&p);
        /* Usage and configuration errors (flags, keys, listen address) exit 2. */
        return program_exit(r);
}
