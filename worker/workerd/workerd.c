/* SPDX-License-Identifier: Apache-2.0 */
/* workerd: a training worker. Pulls weights from the shards, computes gradients
 * on its data partition (CPU backend, or CUDA where built and present), pushes
 * them back. Its connection to the cluster is libpsnet (worker/client/), its
 * training loop trainer.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "edge-fleet.h"
#include "log.h"
#include "program.h"
#include "trainer.h"

int main(int argc, char **argv) {
        WorkerConfig cfg = { .threads = 1, .connect_timeout = 10, .round_timeout = 120, .progress_ms = 1000 };
        char *backend = NULL, *prefetch = NULL, *partition = NULL, *alpha = NULL;
        const Option opts[] = {
                { "coord", OPT_STR, &cfg.coord, "ENDPOINT", "pscoord endpoint (default " PSNET_DEFAULT_COORD ")" },
                { "backend", OPT_STR, &backend, "NAME", "compute backend: cpu, cuda or auto (default auto)" },
                { "data", OPT_STR, &cfg.data, "DIR", "Fashion-MNIST directory (default: the job's)" },
                { "threads", OPT_UINT, &cfg.threads, "N", "OpenBLAS threads for the cpu backend and dlrm" },
                { "connect-timeout", OPT_UINT, &cfg.connect_timeout, "SECONDS", "give up when pscoord does not answer" },
                { "round-timeout", OPT_UINT, &cfg.round_timeout, "SECONDS", "give up when shards do not answer" },
                { "progress-ms", OPT_UINT, &cfg.progress_ms, "MS", "interval of progress lines" },
                { "trace-pulls", OPT_BOOL, &cfg.trace_pulls, NULL,
                  "log a CRC-32 of the weights pulled at every clock (consistency checks)" },
                { "step-delay-ms", OPT_UINT, &cfg.step_delay_ms, "MS",
                  "test knob: wait before each push, to play a slow worker" },
                { "tf32", OPT_BOOL, &cfg.tf32, NULL,
                  "cuda: let gemm use TF32 tensor cores (10-bit mantissa products, fp32 sums)" },
                { "no-graphs", OPT_BOOL, &cfg.no_graphs, NULL,
                  "cuda: launch each op of a step instead of replaying a captured CUDA graph" },
                { "prefetch", OPT_STR, &prefetch, "WHEN",
                  "on: send the next clock's pull while the step computes (asp/ssp on a GPU: faster for large "
                  "models, one clock staler; see docs/bench-log.md), off (default)" },
                { "keys", OPT_STR, &cfg.keys, "DIR", "CURVE encryption with the keys of psctl keys gen in DIR" },
                { "key", OPT_STR, &cfg.key, "NAME", "this worker's key in --keys (default worker)" },
                { "coord-key", OPT_STR, &cfg.coord_key, "NAME", "pscoord's key in --keys (default pscoord)" },
                { "http", OPT_STR, &cfg.http, "ADDR:PORT",
                  "serve /metrics, /healthz and /readyz over HTTP (e.g. 127.0.0.1:9102, :9102 for all addresses; empty: off)" },
                { "edge", OPT_BOOL, &cfg.edge, NULL,
                  "a federated client (edge role) for jobs of mode fed: trains on its own data in the rounds "
                  "pscoord samples it for, pushes only the change of the weights (default backend cpu)" },
                { "partition", OPT_STR, &partition, "K/N",
                  "--edge: keep only share K (0-based) of N of the training set (default: all of --data)" },
                { "alpha", OPT_STR, &alpha, "A",
                  "--edge with --partition: split by label with Dirichlet(A) proportions per class (non-IID; "
                  "small A, few classes each), or iid (default)" },
                { "gateway", OPT_STR, &cfg.gateway, "ENDPOINT",
                  "--edge: dial psgate alone (the edge clients' front door), which relays to pscoord and the "
                  "shards; --coord is then unused" },
                { "gateway-key", OPT_STR, &cfg.gateway_key, "NAME", "--gateway: psgate's key in --keys (default psgate)" },
                { "simulate", OPT_UINT, &cfg.simulate, "N",
                  "--edge: N virtual clients in this process, each with its own session, id and share of the "
                  "data (shares K..K+N-1 of --partition K/M, else the N shares of N), sharing one dataset" },
                { "parallel", OPT_UINT, &cfg.parallel, "N",
                  "--simulate: N of the clients train at once, each on its own copy of the model and one core "
                  "(cpu backend; default: the cores of this machine)" },
        };
        const ProgramInfo prog = {
                .name = "workerd", .summary = "psnet training worker", .usage = "[OPTIONS]",
                .epilog = "Config file: --config /etc/psnet/workerd.conf (keys as the long options).\n"
                          "Signals: SIGTERM/SIGINT finish the current step, leave the job and stop.\n"
                          "Environment: PSNET_SHM=off sends tensors in frames to shards on this host too\n"
                          "(by default the model's tensors live in memory shared with shards that listen on\n"
                          "ipc://, pushed and pulled in place); PSNET_SHM=copy keeps them in the model's own\n"
                          "buffers, copied through that memory;\n"
                          "PSNET_PART_KIB=N sends a shard's keys in parts of at most N KiB (default 1024).",
        };
        Program p;
        int r = program_start(&p, &prog, opts, ELEMENTSOF(opts), argc, argv);
        if (r == 0 && backend && strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0 &&
            strcmp(backend, "auto") != 0) {
                fprintf(stderr, "workerd: --backend is cpu, cuda or auto, not '%s'\n", backend);
                r = -1;
        }
        if (r == 0 && prefetch && strcmp(prefetch, "on") != 0 && strcmp(prefetch, "off") != 0) {
                fprintf(stderr, "workerd: --prefetch is on or off, not '%s'\n", prefetch);
                r = -1;
        }
        if (r == 0 && cfg.round_timeout == 0) {
                fprintf(stderr, "workerd: --round-timeout must be >= 1\n");
                r = -1;
        }
        if (r == 0 && partition) {
                char *end;
                unsigned long k = strtoul(partition, &end, 10), n = 0;
                if (end != partition && *end == '/')
                        n = strtoul(end + 1, &end, 10);
                if (*end || n == 0 || n > 1000000 || k >= n) {
                        fprintf(stderr, "workerd: --partition is K/N with 0 <= K < N, not '%s'\n", partition);
                        r = -1;
                } else {
                        cfg.part = (unsigned) k;
                        cfg.part_n = (unsigned) n;
                }
        }
        if (r == 0 && alpha && strcmp(alpha, "iid") != 0) {
                char *end;
                cfg.alpha = strtod(alpha, &end);
                if (*end || !(cfg.alpha > 0) || cfg.alpha > 1e6) {
                        fprintf(stderr, "workerd: --alpha is a number > 0 or iid, not '%s'\n", alpha);
                        r = -1;
                }
        }
        if (r == 0 && (partition || alpha || cfg.simulate || cfg.gateway) && !cfg.edge) {
                fprintf(stderr, "workerd: --partition, --alpha, --simulate and --gateway are for edge workers (--edge)\n");
                r = -1;
        }
        if (r == 0 && alpha && !partition && cfg.simulate < 2) {
                fprintf(stderr, "workerd: --alpha splits the data among clients: give --partition K/N (or "
                        "--simulate N) too\n");
                r = -1;
        }
        if (r == 0 && cfg.parallel && !cfg.simulate) {
                fprintf(stderr, "workerd: --parallel is for virtual clients (--edge --simulate N)\n");
                r = -EINVAL;
        }
        if (r == 0 && cfg.parallel > 1024) {
                fprintf(stderr, "workerd: --parallel takes at most 1024\n");
                r = -EINVAL;
        }
        if (r == 0 && cfg.simulate > 100000) {
                fprintf(stderr, "workerd: --simulate takes at most 100000 clients\n");
                r = -1;
        }
        if (r == 0) {
                WorkerConfig run = cfg;
                run.coord = cfg.coord ? cfg.coord : (char *) PSNET_DEFAULT_COORD;
                run.backend = backend ? backend : (char *) (cfg.edge ? "cpu" : "auto");
                run.prefetch = prefetch && strcmp(prefetch, "on") == 0;
                r = cfg.edge ? edge_run(&run) : trainer_run(&run);
        }
        program_done(&p);
        return program_exit(r);
}
