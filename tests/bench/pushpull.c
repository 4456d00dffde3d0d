/* SPDX-License-Identifier: Apache-2.0 */
/* bench-pushpull: push/pull goodput of one worker against two shards (three
 * with --replicas 3), printed
 * beside what bare ZeroMQ moves between two processes on the same transport.
 *
 * For each consistency mode (asp, then bsp) it starts pscoord and two psd as
 * child processes (logs and ipc sockets in a mkdtemp directory), joins the job
 * as its one worker through libpsnet's public API (worker/client/psnet.h, as
 * workerd does): a warm-up, then N rounds that push a gradient for
 * every key and pull every key back, then N pull-only rounds, each timed with
 * CLOCK_MONOTONIC. Goodput is tensor bytes moved (pushed + pulled) per second,
 * headers excluded; the figures are the median and the best round.
 *
 * With --wire bf16 the job sends half the bytes: goodput counts the bytes on
 * the wire, tensor_gbps the f32 tensor bytes they carry (twice as many), and
 * the raw baseline sends messages of the bf16 frames' size.
 *
 * The raw baseline is zmqraw_measure on the same transport: chunk-sized
 * zero-copy messages (1 MiB by default), as many bytes as the timed push+pull
 * rounds, 3 runs (one before each mode, the rest after, each while this
 * process holds no ZeroMQ context), median. ratio = push+pull median / raw.
 * Next to each, the same pattern as a push+pull round without psnet
 * (zmqraw_exchange: one DEALER per shard in one I/O thread, chunk-sized
 * requests answered by replies of the same size, as many bytes both ways);
 * exchange_ratio = push+pull median / its median.
 *
 * Two more figures say how to read the others on a small machine: CPU seconds
 * per GB moved (this process and the daemons, read from /proc; for raw, both
 * of its processes), and how much CPU other processes took meanwhile (from
 * /proc/stat minus our own), since on a shared 2-vCPU VM that often decides
 * the goodput more than psnet does.
 *
 * After the rounds it reads the shards' memory from /proc (VmRSS, RssAnon:
 * their own, RssShmem: the workers' shared pages they touched) beside the
 * values and optimizer state they hold (issue: RssAnon at most 1.1 x the
 * state + 64 MiB per shard).
 *
 * With --sparsify F the pushes carry the largest share F of each chunk as
 * (index, value) pairs: goodput counts the bytes sent, so compare median_ms
 * (the round's time) with a dense run's.
 *
 * On ipc the worker and the shards share memory for the tensors unless
 * --shm off (common/net/shm.h): then the second baseline is single-thread
 * memcpy of the model's bytes in this process, measured in the same run
 * (median of 5 copies, next to each raw run); memcpy_ratio = push+pull median
 * / memcpy. The worker's tensors live in that shared memory
 * (psnet_worker_memory: pushed and pulled in place) unless --in-place off
 * (its own buffers, copied in and out). Targets (printed, never enforced; the exit status says only
 * whether the measurement ran): 0.9 of raw ZeroMQ over tcp, 0.95 over ipc
 * frames, 0.5 of memcpy through shared memory.
 *
 *   build-bench/tests/bench-pushpull [--transport ipc|tcp] [--rounds N] ... */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "alloc.h"
#include "psnet-internal.h"
#include "config.h"
#include "endpoint.h"
#include "job.h"
#include "log.h"
#include "shardmap.h"
#include "wire.h"
#include "wire-job.h"
#include "zmqraw.h"

#define BENCH_MAX_SHARDS 3 /* 2, or R with --replicas R > 2 */
#define BENCH_NDAEMONS (1 + BENCH_MAX_SHARDS)
#define BENCH_RAW_MAX 9
#define BENCH_START_MS 30000      /* daemons up, registered and the job running */
#define BENCH_STOP_MS 5000        /* SIGTERM grace, then SIGKILL */
#define BENCH_ROUND_MS 60000      /* a round that takes longer has failed */
#define BENCH_LEASE_MS 10000      /* generous: two busy cores must not expire anyone */
#define BENCH_MAX_ROUNDS 100000

typedef struct Opts {
        const char *build, *transport, *model, *mode, *wire, *shm, *in_place, *sparsify;
        unsigned rounds, chunk_kb, raw_runs, replicas, psd_threads;
} Opts;

typedef struct Daemon {
        char name[16];
        char log[PATH_MAX];
        pid_t pid;                /* 0: not running (never started or reaped) */
        int pidfd;                /* readable once the process has exited; -1: none */
        int wstatus;
} Daemon;

/* One run of the cluster: pscoord and the shards, for one consistency mode. */
typedef struct Cluster {
        const char *dir;
        char coord_ep[PATH_MAX + 8];
        char shard_ep[BENCH_MAX_SHARDS][PATH_MAX + 8];
        Daemon d[BENCH_NDAEMONS]; /* [0] pscoord, [1..nshards] psd */
        size_t nshards, nd;       /* shards, daemons (1 + nshards) */
} Cluster;

/* This process as the job's worker. */
typedef struct Bench {
        Cluster *cl;
        uv_loop_t loop;
        uv_timer_t watch;         /* looks at the daemons every 100 ms */
        PsnetWorker *w;
        const Job *job;
        bool joined, left;
        bool failed;              /* a daemon died, pscoord refused us, or a deadline passed */
        bool round_done;
        int round_r;
} Bench;

/* Timed rounds of one kind. */
typedef struct Figures {
        double med_gbps, best_gbps, med_ms;
        double cpu_s_per_gb;            /* CPU of this process and the daemons per GB moved */
        uint64_t round_bytes;
        size_t n;
} Figures;

typedef struct ModeResult {
        const char *mode;
        Figures pushpull, pull;
        size_t shm_shards;        /* shards reached through shared memory */
        /* The shards' memory after the rounds, MiB, summed: VmRSS, and of it
         * RssAnon (their own) and RssShmem (the workers' shared pages they
         * touched); the values and optimizer state they hold. */
        double rss_mib, anon_mib, shmem_mib, state_mib;
} ModeResult;

static double mono_s(void) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
                return 0; /* CLOCK_MONOTONIC cannot fail on Linux */
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* snprintf that reports truncation as -ENAMETOOLONG. */
static int fmt(char *buf, size_t len, const char *f, ...) _printf_(3, 4);
static int fmt(char *buf, size_t len, const char *f, ...) {
        va_list ap;
        va_start(ap, f);
        int n = vsnprintf(buf, len, f, ap);
        va_end(ap);
        if (n < 0)
                return -EINVAL;
        return (size_t) n >= len ? -ENAMETOOLONG : 0;
}

/* --- child processes ---------------------------------------------------------- */

/* Starts path with argv (argv[0] included), stdout+stderr to dir/NAME.log.
 * The child gets SIGTERM should this process die, so no daemon outlives it. */
static int daemon_start(Daemon *d, const char *name, const char *dir, const char *path, char *const argv[]) {
        int r;
        *d = (Daemon) { .pidfd = -1 };
        if ((r = fmt(d->name, sizeof d->name, "%s", name)) < 0 ||
            (r = fmt(d->log, sizeof d->log, "%s/%s.log", dir, name)) < 0)
                return r;
        int logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (logfd < 0)
                return -errno;
        int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (nullfd < 0) {
                r = -errno;
                (void) close(logfd);
                return r;
        }
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid == 0) {
                /* Only async-signal-safe calls until exec. */
                static const char msg[] = "bench-pushpull: cannot start the daemon (exec failed)\n";
                sigset_t none;
                if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
                        _exit(127);
                if (dup2(nullfd, STDIN_FILENO) < 0 || dup2(logfd, STDOUT_FILENO) < 0 ||
                    dup2(logfd, STDERR_FILENO) < 0)
                        _exit(127);
                if (sigemptyset(&none) < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0)
                        _exit(127);
                execv(path, argv);
                if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0)
                        _exit(126);
                _exit(127);
        }
        r = pid < 0 ? -errno : 0;
        if (close(logfd) < 0 && r == 0)
                r = -errno;
        if (close(nullfd) < 0 && r == 0)
                r = -errno;
        if (pid < 0)
                return r;
        d->pid = pid;
        d->pidfd = pidfd_open(pid, 0);
        if (d->pidfd < 0) {
                r = -errno;
                (void) kill(pid, SIGKILL);
                while (waitpid(pid, &d->wstatus, 0) < 0 && errno == EINTR)
                        ;
                d->pid = 0;
                return r;
        }
        return r;
}

/* Reaps d if it has exited. Returns 1 if it has (or was never running), 0 if it runs. */
static int daemon_reap(Daemon *d) {
        if (d->pid == 0)
                return 1;
        pid_t p = waitpid(d->pid, &d->wstatus, WNOHANG);
        if (p == 0)
                return 0;
        if (p < 0 && errno != ECHILD)
                return -errno;
        d->pid = 0;
        if (d->pidfd >= 0 && close(d->pidfd) < 0)
                log_warning_errno(errno, "Failed to close pidfd of %s: %m", d->name);
        d->pidfd = -1;
        return 1;
}

static void daemon_describe_exit(const Daemon *d, char *buf, size_t len) {
        int r;
        if (WIFEXITED(d->wstatus))
                r = fmt(buf, len, "exited with status %d", WEXITSTATUS(d->wstatus));
        else if (WIFSIGNALED(d->wstatus))
                r = fmt(buf, len, "killed by signal %s", strsignal(WTERMSIG(d->wstatus)));
        else
                r = fmt(buf, len, "ended (wait status %#x)", (unsigned) d->wstatus);
        if (r < 0 && len > 0)
                buf[0] = '\0';
}

/* Prints the end of a daemon's log to stderr. */
static void daemon_print_log(const Daemon *d) {
        char buf[4096];
        struct stat st;
        FILE *f = fopen(d->log, "re");
        if (!f) {
                fprintf(stderr, "  (cannot read %s: %s)\n", d->log, strerror(errno));
                return;
        }
        long from = 0;
        if (fstat(fileno(f), &st) == 0 && st.st_size > (off_t) sizeof buf - 1)
                from = (long) (st.st_size - (off_t) sizeof buf + 1);
        size_t n = fseek(f, from, SEEK_SET) == 0 ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[n] = '\0';
        if (fclose(f) != 0)
                n = 0;
        fprintf(stderr, "--- end of %s ---\n%s%s", d->log, n ? buf : "", n && buf[n - 1] != '\n' ? "\n" : "");
}

/* SIGTERM to every daemon still running, waits (on the pidfds) up to
 * BENCH_STOP_MS, then SIGKILL for the rest and another bounded wait. Returns 0
 * when every daemon stopped on SIGTERM with status 0, -ETIMEDOUT if one needed
 * SIGKILL (or would not die), -ECHILD if one failed. */
static int daemons_stop(Daemon *d, size_t n) {
        int ret = 0;
        for (int sig = SIGTERM;; sig = SIGKILL) {
                size_t left = 0;
                for (size_t i = 0; i < n; i++) {
                        if (daemon_reap(&d[i]) != 0)
                                continue;
                        if (kill(d[i].pid, sig) < 0 && errno != ESRCH)
                                log_warning_errno(errno, "Failed to signal %s: %m", d[i].name);
                        left++;
                }
                if (left > 0 && sig == SIGKILL)
                        ret = -ETIMEDOUT;
                uint64_t deadline = now_ms() + BENCH_STOP_MS;
                while (left > 0) {
                        struct pollfd fds[BENCH_NDAEMONS];
                        size_t k = 0;
                        for (size_t i = 0; i < n && k < ELEMENTSOF(fds); i++)
                                if (d[i].pid)
                                        fds[k++] = (struct pollfd) { .fd = d[i].pidfd, .events = POLLIN };
                        uint64_t now = now_ms();
                        if (now >= deadline)
                                break;
                        int r = poll(fds, k, (int) (deadline - now));
                        if (r < 0 && errno != EINTR)
                                return -errno;
                        left = 0;
                        for (size_t i = 0; i < n; i++) {
                                int rr = daemon_reap(&d[i]);
                                if (rr < 0)
                                        return rr;
                                left += rr == 0;
                        }
                }
                if (left == 0)
                        break;
                if (sig == SIGKILL) {
                        for (size_t i = 0; i < n; i++)
                                if (d[i].pid)
                                        log_error("%s (pid %d) does not die, left behind", d[i].name, (int) d[i].pid);
                        return -ETIMEDOUT;
                }
                log_warning("daemons did not stop within %u s of SIGTERM: SIGKILL", BENCH_STOP_MS / 1000);
        }
        for (size_t i = 0; i < n && ret == 0; i++)
                if (!WIFEXITED(d[i].wstatus) || WEXITSTATUS(d[i].wstatus) != 0)
                        ret = -ECHILD;
        return ret;
}

/* Binds n TCP sockets to 127.0.0.1 port 0 at once, so the kernel hands out n
 * distinct free ports, and releases them for the daemons to bind. */
static int free_tcp_ports(size_t n, unsigned *ports) {
        int fds[BENCH_NDAEMONS], r = 0;
        size_t opened = 0;
        if (n > ELEMENTSOF(fds))
                return -EINVAL;
        for (; opened < n; opened++) {
                struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
                socklen_t len = sizeof sa;
                fds[opened] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fds[opened] < 0) {
                        r = -errno;
                        break;
                }
                if (bind(fds[opened], (struct sockaddr *) &sa, sizeof sa) < 0 ||
                    getsockname(fds[opened], (struct sockaddr *) &sa, &len) < 0) {
                        r = -errno;
                        opened++;
                        break;
                }
                ports[opened] = ntohs(sa.sin_port);
        }
        for (size_t i = 0; i < opened; i++)
                if (close(fds[i]) < 0 && r == 0)
                        r = -errno;
        return r;
}

/* --- the cluster ---------------------------------------------------------------- */

static int cluster_endpoints(Cluster *cl, const char *transport, const char *mode) {
        int r;
        if (strcmp(transport, "tcp") == 0) {
                unsigned ports[BENCH_NDAEMONS];
                if ((r = free_tcp_ports(cl->nd, ports)) < 0)
                        return r;
                if ((r = fmt(cl->coord_ep, sizeof cl->coord_ep, "tcp://127.0.0.1:%u", ports[0])) < 0)
                        return r;
                for (size_t i = 0; i < cl->nshards; i++)
                        if ((r = fmt(cl->shard_ep[i], sizeof cl->shard_ep[i], "tcp://127.0.0.1:%u", ports[1 + i])) < 0)
                                return r;
                return 0;
        }
        if ((r = fmt(cl->coord_ep, sizeof cl->coord_ep, "ipc://%s/coord-%s.sock", cl->dir, mode)) < 0)
                return r;
        for (size_t i = 0; i < cl->nshards; i++)
                if ((r = fmt(cl->shard_ep[i], sizeof cl->shard_ep[i], "ipc://%s/psd-%zu-%s.sock", cl->dir, i + 1,
                             mode)) < 0)
                        return r;
        /* A unix socket path holds at most 107 bytes. */
        if (strlen(cl->coord_ep) - 6 > 107 || strlen(cl->shard_ep[0]) - 6 > 107)
                return -ENAMETOOLONG;
        return 0;
}

static int cluster_start(Cluster *cl, const Opts *o, const char *mode) {
        char path[PATH_MAX], name[32], chunk[16], id[16], lease[16], replicas[16], shards[16], threads[16];
        int r;
        for (size_t i = 0; i < BENCH_NDAEMONS; i++)
                cl->d[i] = (Daemon) { .pidfd = -1 };
        if ((r = cluster_endpoints(cl, o->transport, mode)) < 0)
                return log_error_errno(r, "Failed to choose endpoints: %m");
        if ((r = fmt(path, sizeof path, "%s/ps/pscoord/pscoord", o->build)) < 0 ||
            (r = fmt(chunk, sizeof chunk, "%u", o->chunk_kb)) < 0 ||
            (r = fmt(lease, sizeof lease, "%u", BENCH_LEASE_MS)) < 0 ||
            (r = fmt(replicas, sizeof replicas, "%u", o->replicas)) < 0 ||
            (r = fmt(threads, sizeof threads, "%u", o->psd_threads)) < 0 ||
            (r = fmt(shards, sizeof shards, "%zu", cl->nshards)) < 0 ||
            (r = fmt(name, sizeof name, "pscoord-%s", mode)) < 0)
                return r;
        char *coord_argv[] = {
                path, "--listen", cl->coord_ep, "--workers", "1", "--shards", shards, "--mode", (char *) mode,
                "--model", (char *) o->model, "--chunk-kb", chunk, "--lease-ms", lease, "--shard-lease-ms", lease,
                "--replicas", replicas, "--wire", (char *) o->wire, "--sparsify", (char *) o->sparsify, NULL,
        };
        if ((r = daemon_start(&cl->d[0], name, cl->dir, path, coord_argv)) < 0)
                return log_error_errno(r, "Failed to start %s: %m", path);
        if ((r = fmt(path, sizeof path, "%s/ps/psd/psd", o->build)) < 0)
                return r;
        for (size_t i = 0; i < cl->nshards; i++) {
                if ((r = fmt(id, sizeof id, "%zu", i + 1)) < 0 ||
                    (r = fmt(name, sizeof name, "psd-%zu-%s", i + 1, mode)) < 0)
                        return r;
                char *psd_argv[] = { path, "--id", id, "--listen", cl->shard_ep[i], "--coord", cl->coord_ep,
                                     "--threads", threads, NULL };
                if ((r = daemon_start(&cl->d[1 + i], name, cl->dir, path, psd_argv)) < 0)
                        return log_error_errno(r, "Failed to start %s: %m", path);
        }
        return 0;
}

/* Checks that no daemon has exited; if one has, says which and shows its log. */
static int cluster_check(Cluster *cl) {
        for (size_t i = 0; i < cl->nd; i++) {
                if (cl->d[i].pid == 0)
                        continue;
                int r = daemon_reap(&cl->d[i]);
                if (r < 0)
                        return log_error_errno(r, "Failed to check on %s: %m", cl->d[i].name);
                if (r == 0)
                        continue;
                char how[64];
                daemon_describe_exit(&cl->d[i], how, sizeof how);
                log_error("%s %s", cl->d[i].name, how);
                daemon_print_log(&cl->d[i]);
                return -ECHILD;
        }
        return 0;
}

/* --- the worker side: libpsnet ---------------------------------------------------- */

static void bench_on_job(PsnetWorker *w, void *ud) {
        Bench *b = ud;
        b->job = psnet_worker_job(w);
        b->joined = true;
}

static void bench_on_stop(PsnetWorker *w, const char *why, void *ud) {
        Bench *b = ud;
        (void) w;
        log_error("pscoord stopped this worker reason=\"%s\"", why);
        b->failed = true;
}

static void bench_on_failed(PsnetWorker *w, int err, const char *reason, void *ud) {
        Bench *b = ud;
        (void) w;
        log_error_errno(err, "Could not join the job: %m reason=\"%s\"", reason);
        b->failed = true;
}

static void bench_watch(uv_timer_t *t) {
        Bench *b = t->data;
        if (cluster_check(b->cl) < 0)
                b->failed = true;
}

/* Runs the loop until *flag or a failure, for at most ms. */
static int bench_run_until(Bench *b, const bool *flag, unsigned ms, const char *what) {
        uint64_t deadline = now_ms() + ms;
        while (!*flag && !b->failed) {
                if (now_ms() >= deadline)
                        return log_error_errno(ETIMEDOUT, "%s did not happen within %u s", what, ms / 1000);
                uv_run(&b->loop, UV_RUN_ONCE);
        }
        return b->failed ? -ECHILD : 0;
}

/* Joins the job as a worker, with a deadline; a daemon that fails to start
 * ends the wait at once (the watch timer). */
static int bench_join(Bench *b) {
        int r = uv_loop_init(&b->loop);
        if (r == 0)
                r = uv_timer_init(&b->loop, &b->watch);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the event loop: %s", uv_strerror(r));
        b->watch.data = b;
        (void) uv_timer_start(&b->watch, bench_watch, 100, 100);
        const PsnetWorkerOptions o = { .coord = b->cl->coord_ep, .connect_timeout_ms = BENCH_START_MS,
                                       .round_timeout_ms = BENCH_ROUND_MS };
        const PsnetWorkerEvents ev = { .job = bench_on_job, .stop = bench_on_stop, .failed = bench_on_failed };
        r = psnet_worker_new(&b->loop, &o, &ev, b, &b->w);
        if (r < 0)
                return log_error_errno(r, "Failed to join pscoord at %s: %m", b->cl->coord_ep);
        r = bench_run_until(b, &b->joined, BENCH_START_MS, "the job's start");
        if (r < 0)
                for (size_t i = 0; i < b->cl->nd; i++)
                        daemon_print_log(&b->cl->d[i]);
        return r;
}

static void bench_round_done(PsnetWorker *w, int r, void *ud) {
        Bench *b = ud;
        (void) w;
        b->round_r = r;
        b->round_done = true;
}

/* One round, run to its end; *ret_clock gets the clock of the weights pulled. */
static int bench_round(Bench *b, const float *const *grads, int64_t push_clock, float *const *params,
                       int64_t pull_clock, int64_t *ret_clock) {
        b->round_done = false;
        int r = psnet_worker_round(b->w, grads, push_clock, params, pull_clock, bench_round_done, b);
        if (r < 0)
                return r;
        r = bench_run_until(b, &b->round_done, BENCH_ROUND_MS + 1000, "a round");
        if (r < 0)
                return r;
        *ret_clock = psnet_worker_round_clock(b->w);
        return b->round_r;
}

static void bench_left(PsnetWorker *w, void *ud) {
        Bench *b = ud;
        (void) w;
        b->left = true;
}

static void bench_leave(Bench *b) {
        if (!b->watch.data)
                return; /* never joined */
        if (b->w && !b->failed && psnet_worker_leave(b->w, bench_left, b) == 0)
                (void) bench_run_until(b, &b->left, 2000, "leaving the job");
        b->w = psnet_worker_free(b->w);
        uv_close((uv_handle_t *) &b->watch, NULL);
        uv_run(&b->loop, UV_RUN_NOWAIT);
        if (uv_loop_close(&b->loop) < 0)
                log_warning("the benchmark's event loop closed with handles open");
}

/* --- measuring ----------------------------------------------------------------- */

/* CPU seconds (user + system) of this process and its reaped children. */
static int rusage_s(double *ret) {
        struct rusage self, kids;
        if (getrusage(RUSAGE_SELF, &self) < 0 || getrusage(RUSAGE_CHILDREN, &kids) < 0)
                return -errno;
        *ret = (double) (self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec + kids.ru_stime.tv_sec) +
               (double) (self.ru_utime.tv_usec + self.ru_stime.tv_usec + kids.ru_utime.tv_usec + kids.ru_stime.tv_usec) *
                       1e-6;
        return 0;
}

/* CPU seconds (user + system) of a running child, from /proc/PID/stat. */
static int proc_cpu_s(pid_t pid, double *ret) {
        char path[64], buf[1024];
        unsigned long long ut, st;
        long hz = sysconf(_SC_CLK_TCK);
        int r = fmt(path, sizeof path, "/proc/%d/stat", (int) pid);
        if (r < 0)
                return r;
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        if (fclose(f) != 0 || n == 0 || hz <= 0)
                return -EIO;
        buf[n] = '\0';
        /* Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15. */
        const char *p = strrchr(buf, ')');
        if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                return -EIO;
        *ret = (double) (ut + st) / (double) hz;
        return 0;
}

/* CPU seconds used so far by this process, its reaped children and the
 * daemons of cl (NULL: none); 10 ms resolution for the daemons. */
static int cpu_used_s(const Cluster *cl, double *ret) {
        double sum;
        int r = rusage_s(&sum);
        if (r < 0)
                return r;
        for (size_t i = 0; cl && i < cl->nd; i++) {
                double d;
                if (cl->d[i].pid == 0)
                        continue;
                if ((r = proc_cpu_s(cl->d[i].pid, &d)) < 0)
                        return r;
                sum += d;
        }
        *ret = sum;
        return 0;
}

/* Adds pid's VmRSS, RssAnon and RssShmem (MiB) to ret[0..2]. */
static int proc_rss_mib(pid_t pid, double ret[3]) {
        char path[64], line[256];
        static const char *const keys[3] = { "VmRSS:", "RssAnon:", "RssShmem:" };
        snprintf(path, sizeof path, "/proc/%ld/status", (long) pid);
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        while (fgets(line, sizeof line, f))
                for (int k = 0; k < 3; k++)
                        if (strncmp(line, keys[k], strlen(keys[k])) == 0)
                                ret[k] += strtod(line + strlen(keys[k]), NULL) / 1024.0;
        fclose(f);
        return 0;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, size_t n) {
        qsort(v, n, sizeof *v, cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Goodput of each round is bytes[i] / secs[i]; median, best and median time;
 * cpu_s: CPU seconds all the rounds took. */
static int figures_from(const double *secs, const uint64_t *bytes, size_t n, double cpu_s, Figures *ret) {
        _cleanup_free_ double *g = calloc(n, sizeof *g);
        _cleanup_free_ double *t = calloc(n, sizeof *t);
        if (!g || !t)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                g[i] = (double) bytes[i] / (secs[i] > 0 ? secs[i] : 1e-9) / 1e9;
                t[i] = secs[i] * 1e3;
        }
        ret->med_gbps = median(g, n);
        ret->best_gbps = g[n - 1]; /* median() sorted g */
        ret->med_ms = median(t, n);
        ret->round_bytes = bytes[0];
        ret->n = n;
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++)
                total += bytes[i];
        ret->cpu_s_per_gb = total ? cpu_s / ((double) total / 1e9) : 0;
        return 0;
}

/* Runs the timed rounds: push+pull, then pull only. */
static int bench_rounds(Bench *b, float *const *params, const float *const *grads, unsigned rounds,
                        ModeResult *ret) {
        bool bsp = b->job->mode == MODE_BSP;
        uint64_t pushed, pulled, nrounds;
        double wait_s;
        _cleanup_free_ double *secs = calloc(rounds, sizeof *secs);
        _cleanup_free_ uint64_t *bytes = calloc(rounds, sizeof *bytes);
        int64_t clock = 0, got = 0;
        int r;
        if (!secs || !bytes)
                return -ENOMEM;

        /* Warm-up: a pull (as a joining worker does) and one push+pull round, so
         * that every buffer on both sides has been touched once. */
        if ((r = bench_round(b, NULL, 0, params, 0, &got)) < 0)
                return r;
        clock = bsp ? got : 0;
        for (int pass = 0; pass < 2; pass++) {
                unsigned n = pass == 0 ? rounds + 1 : rounds;
                double cpu0 = 0, cpu1 = 0;
                if (pass == 1 && (r = cpu_used_s(b->cl, &cpu0)) < 0)
                        return log_error_errno(r, "Failed to read CPU times: %m");
                for (unsigned i = 0; i < n; i++) {
                        psnet_worker_traffic(b->w, &pushed, &pulled, &nrounds, &wait_s);
                        uint64_t before = pushed + pulled;
                        bool push = pass == 0;
                        /* BSP: push for clock c, pull c+1 (it closes with our push).
                         * ASP: push clocks only go up (shards drop repeats); pulls never wait. */
                        int64_t pull_clock = bsp ? (push ? clock + 1 : clock) : 0;
                        double t0 = mono_s();
                        r = bench_round(b, push ? grads : NULL, clock, params, pull_clock, &got);
                        double t1 = mono_s();
                        if (r < 0)
                                return r;
                        if (push)
                                clock = bsp ? got : clock + 1;
                        if (bsp && got != pull_clock)
                                return log_error_errno(EPROTO, "shards answered clock %ld for %ld", (long) got,
                                                       (long) pull_clock);
                        if (push && i == 0) {
                                /* The warm-up push+pull round: not counted. */
                                if ((r = cpu_used_s(b->cl, &cpu0)) < 0)
                                        return log_error_errno(r, "Failed to read CPU times: %m");
                                continue;
                        }
                        secs[push ? i - 1 : i] = t1 - t0;
                        psnet_worker_traffic(b->w, &pushed, &pulled, &nrounds, &wait_s);
                        bytes[push ? i - 1 : i] = pushed + pulled - before;
                }
                if ((r = cpu_used_s(b->cl, &cpu1)) < 0)
                        return log_error_errno(r, "Failed to read CPU times: %m");
                r = figures_from(secs, bytes, rounds, cpu1 - cpu0, pass == 0 ? &ret->pushpull : &ret->pull);
                if (r < 0)
                        return r;
        }
        /* A push refused as stale still moved its bytes, but was not applied:
         * that would be a bug in the shards (or here), not a figure. */
        ret->shm_shards = psnet_worker_shm_shards(b->w);
        double rss[3] = { 0, 0, 0 };
        for (size_t i = 1; i < b->cl->nd; i++)
                if (b->cl->d[i].pid > 0 && (r = proc_rss_mib(b->cl->d[i].pid, rss)) < 0)
                        return log_error_errno(r, "Failed to read a shard's memory: %m");
        ret->rss_mib = rss[0];
        ret->anon_mib = rss[1];
        ret->shmem_mib = rss[2];
        ret->state_mib = (double) job_nfloats(b->job) * sizeof(float) * (double) (1 + optim_state_per_value(&b->job->optim)) *
                         (double) MAX(b->job->replicas, 1u) / (1 << 20);
        uint64_t stale = psnet_worker_stale_pushes(b->w);
        if (stale > 0)
                return log_error_errno(EPROTO, "%lu pushes were refused as stale", (unsigned long) stale);
        return 0;
}

/* One mode: cluster up, join, measure, leave, cluster down. */
static int bench_mode(const Opts *o, const char *dir, const char *mode, uint64_t nfloats, ModeResult *ret) {
        Cluster cl = { .dir = dir, .nshards = MAX(o->replicas, 2u) };
        cl.nd = 1 + cl.nshards;
        Bench b = { .cl = &cl };
        _cleanup_free_ float **params = NULL;
        _cleanup_free_ float **grads = NULL;
        _cleanup_free_ float **shared = NULL;
        size_t nt = 0;
        int r, rs;

        ret->mode = mode;
        /* Fork the daemons before this process has a ZeroMQ context. */
        r = cluster_start(&cl, o, mode);
        if (r < 0)
                goto out;
        r = bench_join(&b);
        if (r < 0)
                goto out;
        if (job_nfloats(b.job) != nfloats || b.job->mode != (strcmp(mode, "bsp") == 0 ? MODE_BSP : MODE_ASP) ||
            shardmap_size(psnet_worker_map(b.w)) != cl.nshards) {
                r = log_error_errno(EPROTO, "pscoord runs another job than asked (model %s, %zu shards)", b.job->model,
                                    shardmap_size(psnet_worker_map(b.w)));
                goto out;
        }

        nt = b.job->ntensors;
        params = calloc(nt, sizeof *params);
        grads = calloc(nt, sizeof *grads);
        if (!params || !grads) {
                r = log_error_errno(ENOMEM, "Out of memory");
                goto out;
        }
        if (strcmp(o->in_place, "on") == 0) {
                /* The tensors in the memory shared with the shards: set 0 the
                 * gradients, set 1 the values. */
                shared = calloc(2 * nt, sizeof *shared);
                if (!shared) {
                        r = log_error_errno(ENOMEM, "Out of memory");
                        goto out;
                }
                r = psnet_worker_memory(b.w, 2, shared);
                if (r < 0) {
                        log_error_errno(r, "No shared memory for the tensors: %m");
                        goto out;
                }
        }
        for (size_t t = 0; t < nt; t++) {
                size_t n = b.job->tensors[t].numel;
                params[t] = shared ? shared[nt + t] : ps_malloc_aligned(n * sizeof(float));
                grads[t] = shared ? shared[t] : ps_malloc_aligned(n * sizeof(float));
                if (!params[t] || !grads[t]) {
                        r = log_error_errno(ENOMEM, "Out of memory for %zu floats", n);
                        goto out;
                }
                /* Touch every page now: first-touch faults are not the wire's cost. */
                memset(params[t], 0, n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                        grads[t][i] = 1e-4f;
        }

        r = bench_rounds(&b, params, (const float *const *) grads, o->rounds, ret);
        if (r < 0)
                log_error_errno(r, "Measuring %s failed: %m", mode);

out:
        bench_leave(&b);
        for (size_t t = 0; params && !shared && t < nt; t++)
                ps_free(params[t]);
        for (size_t t = 0; grads && !shared && t < nt; t++)
                ps_free(grads[t]);
        rs = daemons_stop(cl.d, cl.nd);
        if (rs < 0 && r == 0) {
                /* The figures stand, but a daemon that fails its shutdown is a bug to look at. */
                log_error("the daemons of the %s run did not stop cleanly (%s)", mode,
                          rs == -ETIMEDOUT ? "SIGKILL needed" : "non-zero exit");
                for (size_t i = 0; i < cl.nd; i++)
                        if (cl.d[i].log[0])
                                daemon_print_log(&cl.d[i]);
                r = rs;
        }
        return r;
}

/* Single-thread memcpy of bytes between two buffers touched beforehand:
 * the median of 5 copies, GB/s of bytes copied. */
static int bench_memcpy(size_t bytes, double *ret_gbps) {
        _cleanup_free_ void *a = ps_malloc_aligned(bytes), *b = ps_malloc_aligned(bytes);
        if (!a || !b)
                return -ENOMEM;
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        double g[5];
        for (size_t i = 0; i < ELEMENTSOF(g); i++) {
                double t0 = mono_s();
                memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
                double t1 = mono_s();
                g[i] = t1 > t0 ? (double) bytes / (t1 - t0) / 1e9 : 0;
        }
        *ret_gbps = median(g, ELEMENTSOF(g));
        return 0;
}

/* One run of the raw ZeroMQ baselines on the benchmark's transport: one way
 * (zmqraw_measure), and the exchange with as many peers as the job has shards
 * (zmqraw_exchange: requests answered by replies of the same size). */
static int bench_raw(const Opts *o, const char *dir, size_t npeers, size_t msg_bytes, size_t total_bytes,
                     double *ret_gbps, double *ret_cpu_s_per_gb, double *ret_xchg_gbps) {
        /* ep[0]: the one-way baseline's; ep[1..npeers]: the exchange's peers. */
        char ep[1 + BENCH_MAX_SHARDS][PATH_MAX + 8];
        const char *eps[1 + BENCH_MAX_SHARDS];
        unsigned ports[1 + BENCH_MAX_SHARDS] = { 0 };
        bool tcp = strcmp(o->transport, "tcp") == 0;
        double cpu0, cpu1;
        int r;
        if (tcp && (r = free_tcp_ports(1 + npeers, ports)) < 0)
                return r;
        for (size_t i = 0; i <= npeers; i++) {
                r = tcp      ? fmt(ep[i], sizeof ep[i], "tcp://127.0.0.1:%u", ports[i])
                    : i == 0 ? fmt(ep[i], sizeof ep[i], "ipc://%s/zmqraw.sock", dir)
                             : fmt(ep[i], sizeof ep[i], "ipc://%s/zmqraw-%zu.sock", dir, i);
                if (r < 0)
                        return r;
                eps[i] = ep[i];
        }
        /* Both sides: this process sends, a reaped child receives. */
        if ((r = rusage_s(&cpu0)) < 0)
                return r;
        r = zmqraw_measure(ep[0], msg_bytes, total_bytes, ret_gbps);
        if (r < 0)
                return log_error_errno(r, "Raw ZeroMQ measurement over %s failed: %m", ep[0]);
        if ((r = rusage_s(&cpu1)) < 0)
                return r;
        *ret_cpu_s_per_gb = (cpu1 - cpu0) / ((double) total_bytes / 1e9);
        r = zmqraw_exchange(eps + 1, npeers, msg_bytes, total_bytes, ret_xchg_gbps);
        if (r < 0)
                return log_error_errno(r, "Raw ZeroMQ exchange over %s failed: %m", ep[1]);
        return 0;
}

/* CPU time spent on the machine, and by this process and its reaped children,
 * so that the run can say how much of the CPUs other work took meanwhile: on
 * a shared 2-vCPU machine that, not psnet, often decides the figures. */
typedef struct CpuMark {
        double t, busy, steal, ours;   /* seconds: wall, all CPUs busy, stolen by the host, ours */
} CpuMark;

static int cpu_mark(CpuMark *m) {
        unsigned long long v[8] = { 0 };
        long hz = sysconf(_SC_CLK_TCK);
        int r;
        FILE *f = fopen("/proc/stat", "re");
        if (!f)
                return -errno;
        int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                       &v[6], &v[7]);
        if (fclose(f) != 0 || n != 8 || hz <= 0)
                return -EIO;
        if ((r = rusage_s(&m->ours)) < 0)
                return r;
        /* user nice system idle iowait irq softirq steal: interrupt time is left
         * out, as loopback traffic (ours) is partly accounted there. */
        m->t = mono_s();
        m->busy = (double) (v[0] + v[1] + v[2]) / (double) hz;
        m->steal = (double) v[7] / (double) hz;
        return 0;
}

/* Removes the daemons' logs and the temp directory (sockets are removed by
 * their owners, stale ones here). Leaves everything when keep is set. */
static void bench_cleanup(const char *dir, bool keep) {
        static const char *const kinds[] = { "pscoord-%s.log", "psd-1-%s.log", "psd-2-%s.log", "psd-3-%s.log",
                                             "coord-%s.sock", "psd-1-%s.sock", "psd-2-%s.sock", "psd-3-%s.sock" };
        static const char *const modes[] = { "asp", "bsp" };
        char name[64], path[PATH_MAX];
        if (keep) {
                fprintf(stderr, "bench-pushpull: logs are in %s\n", dir);
                return;
        }
        for (size_t m = 0; m < ELEMENTSOF(modes); m++)
                for (size_t k = 0; k < ELEMENTSOF(kinds); k++) {
                        /* Formats are from the table above; names are short. */
                        if (fmt(name, sizeof name, kinds[k], modes[m]) < 0 ||
                            fmt(path, sizeof path, "%s/%s", dir, name) < 0)
                                continue;
                        if (unlink(path) < 0 && errno != ENOENT)
                                log_warning_errno(errno, "Failed to remove %s: %m", path);
                }
        if (fmt(path, sizeof path, "%s/zmqraw.sock", dir) == 0 && unlink(path) < 0 && errno != ENOENT)
                log_warning_errno(errno, "Failed to remove %s: %m", path);
        for (unsigned i = 1; i <= BENCH_MAX_SHARDS; i++)
                if (fmt(path, sizeof path, "%s/zmqraw-%u.sock", dir, i) == 0 && unlink(path) < 0 && errno != ENOENT)
                        log_warning_errno(errno, "Failed to remove %s: %m", path);
        if (rmdir(dir) < 0)
                log_warning_errno(errno, "Failed to remove %s: %m", dir);
}

/* Default --build: the build folder that holds this program's tests/ folder. */
static int default_build(const char *argv0, char **ret) {
        char self[PATH_MAX], path[PATH_MAX + 8];
        int r;
        if (strchr(argv0, '/'))
                r = fmt(self, sizeof self, "%s", argv0);
        else {
                ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
                if (n < 0)
                        return -errno;
                self[n] = '\0';
                r = 0;
        }
        if (r < 0)
                return r;
        char *slash = strrchr(self, '/');
        *slash = '\0';
        if ((r = fmt(path, sizeof path, "%s/..", self[0] ? self : "/")) < 0)
                return r;
        *ret = strdup(path);
        return *ret ? 0 : -ENOMEM;
}

static void print_figures(const char *mode, const char *kind, const Figures *f) {
        printf("%-5s %-10s %4zu %9.1f %9.2f %11.2f %9.2f %8.2f\n", mode, kind, f->n, (double) f->round_bytes / (1 << 20),
               f->med_ms, f->med_gbps, f->best_gbps, f->cpu_s_per_gb);
}

int main(int argc, char **argv) {
        Opts o = { .rounds = 20, .chunk_kb = 1024, .raw_runs = 3, .replicas = 1, .psd_threads = 1 };
        char *build = NULL, *transport = NULL, *model = NULL, *mode = NULL, *wire = NULL, *shm = NULL, *sparsify = NULL,
             *in_place = NULL;
        _cleanup_free_ char *build_default = NULL;
        const Option opts[] = {
                { "build", OPT_STR, &build, "DIR", "build folder holding ps/pscoord/pscoord and ps/psd/psd (default: the one holding this program)" },
                { "transport", OPT_STR, &transport, "T", "ipc or tcp (loopback) (default ipc)" },
                { "rounds", OPT_UINT, &o.rounds, "N", "timed rounds of each kind" },
                { "chunk-kb", OPT_UINT, &o.chunk_kb, "KIB", "tensor chunk (key) size = raw message size" },
                { "model", OPT_STR, &model, "SPEC", "job model (default mlp:4096-4096-10, about 64 MiB of f32)" },
                { "mode", OPT_STR, &mode, "MODE", "asp, bsp or both (default both)" },
                { "replicas", OPT_UINT, &o.replicas, "R",
                  "copies of every chunk (1 to 3: the cost of replication on one host; 3 runs three shards)" },
                { "wire", OPT_STR, &wire, "DTYPE", "what the worker pushes and pulls: f32 or bf16 (default f32)" },
                { "sparsify", OPT_STR, &sparsify, "F",
                  "the job's --sparsify: pushes carry the largest share F of each chunk (default 0: dense)" },
                { "shm", OPT_STR, &shm, "on|off",
                  "ipc: tensors through shared memory (on, the default) or in frames (off; PSNET_SHM=off)" },
                { "in-place", OPT_STR, &in_place, "on|off",
                  "the worker's tensors in the memory it shares with the shards (on, the default: pushed and "
                  "pulled where they lie) or its own buffers (off: copied in and out); off with --shm off" },
                { "psd-threads", OPT_UINT, &o.psd_threads, "N", "each shard's psd --threads (default 1)" },
                { "raw-runs", OPT_UINT, &o.raw_runs, "N",
                  "raw ZeroMQ runs, median taken (0: psnet only, e.g. under perf)" },
        };
        const ProgramInfo prog = {
                .name = "bench-pushpull",
                .summary = "push/pull goodput of one worker and 2 shards against raw ZeroMQ",
                .usage = "[OPTIONS]",
                .epilog = "Starts pscoord and 2 psd from --build, acts as the one worker, and prints the\n"
                          "goodput (tensor bytes pushed + pulled per second), the raw ZeroMQ throughput\n"
                          "for chunk-sized messages on the same transport, and their ratio (targets: tcp 0.9\n"
                          "of raw, ipc frames 0.95; through shared memory 0.5 of memcpy). cpu_ratio is raw\n"
                          "ZeroMQ's CPU seconds per GB over psnet's: the ratio the two would reach where\n"
                          "the CPUs are the limit.",
        };
        char dir[PATH_MAX];
        const char *modes[2];
        size_t nmodes = 0;
        ModeResult res[2] = { 0 };
        bool made_dir = false;
        int optind_ = 0, r;

        log_setup("bench-pushpull");
        if (!getenv("PSNET_LOG_LEVEL"))
                log_set_level(LOG_WARNING);
        r = config_parse(&prog, opts, ELEMENTSOF(opts), argc, argv, &optind_);
        if (r != 0) {
                config_free_strings(opts, ELEMENTSOF(opts));
                return r > 0 ? EXIT_SUCCESS : 2;
        }
        if (optind_ < argc) {
                fprintf(stderr, "bench-pushpull: unexpected argument '%s' (see --help)\n", argv[optind_]);
                r = -EINVAL;
                goto out;
        }
        o.wire = wire ? wire : "f32";
        o.shm = shm ? shm : "on";
        o.in_place = in_place ? in_place : "on";
        o.sparsify = sparsify ? sparsify : "0";
        if (strcmp(o.shm, "on") != 0 && strcmp(o.shm, "off") != 0) {
                fprintf(stderr, "bench-pushpull: --shm is on or off, not '%s'\n", o.shm);
                r = -EINVAL;
                goto out;
        }
        if (strcmp(o.in_place, "on") != 0 && strcmp(o.in_place, "off") != 0) {
                fprintf(stderr, "bench-pushpull: --in-place is on or off, not '%s'\n", o.in_place);
                r = -EINVAL;
                goto out;
        }
        if (strcmp(o.shm, "off") == 0)
                o.in_place = "off"; /* no shared memory for the tensors to lie in */
        /* The client library reads it when it connects to the shards. */
        if (setenv("PSNET_SHM", o.shm, 1) < 0) {
                r = log_error_errno(errno, "Cannot set PSNET_SHM: %m");
                goto out;
        }
        if (strcmp(o.wire, "f32") != 0 && strcmp(o.wire, "bf16") != 0) {
                fprintf(stderr, "bench-pushpull: --wire is f32 or bf16, not '%s'\n", o.wire);
                r = -EINVAL;
                goto out;
        }
        if (o.replicas < 1 || o.replicas > BENCH_MAX_SHARDS) {
                fprintf(stderr, "bench-pushpull: --replicas is 1 to %d, not %u\n", BENCH_MAX_SHARDS, o.replicas);
                r = -EINVAL;
                goto out;
        }
        o.transport = transport ? transport : "ipc";
        o.model = model ? model : "mlp:4096-4096-10";
        o.mode = mode ? mode : "both";
        if (!build && (r = default_build(argv[0], &build_default)) < 0) {
                log_error_errno(r, "Cannot find the build folder: %m (use --build)");
                goto out;
        }
        o.build = build ? build : build_default;
        if (strcmp(o.transport, "ipc") != 0 && strcmp(o.transport, "tcp") != 0) {
                fprintf(stderr, "bench-pushpull: --transport is ipc or tcp, not '%s'\n", o.transport);
                r = -EINVAL;
                goto out;
        }
        if (strcmp(o.mode, "both") == 0) {
                modes[nmodes++] = "asp";
                modes[nmodes++] = "bsp";
        } else if (strcmp(o.mode, "asp") == 0 || strcmp(o.mode, "bsp") == 0)
                modes[nmodes++] = strcmp(o.mode, "asp") == 0 ? "asp" : "bsp";
        else {
                fprintf(stderr, "bench-pushpull: --mode is asp, bsp or both, not '%s'\n", o.mode);
                r = -EINVAL;
                goto out;
        }
        if (o.rounds == 0 || o.rounds > BENCH_MAX_ROUNDS || o.chunk_kb == 0 || o.chunk_kb > 65536 ||
            o.raw_runs > BENCH_RAW_MAX) {
                fprintf(stderr, "bench-pushpull: --rounds is 1..%u, --chunk-kb 1..65536, --raw-runs 0..%u\n",
                        BENCH_MAX_ROUNDS, BENCH_RAW_MAX);
                r = -EINVAL;
                goto out;
        }
        for (size_t i = 0; i < 2; i++) {
                char path[PATH_MAX];
                if ((r = fmt(path, sizeof path, "%s/%s", o.build, i ? "ps/psd/psd" : "ps/pscoord/pscoord")) < 0)
                        goto out;
                if (access(path, X_OK) < 0) {
                        r = log_error_errno(errno, "Cannot run %s: %m (build first, or pass --build)", path);
                        goto out;
                }
        }

        /* The job as pscoord will build it: chunk size first, then the model. */
        Job job;
        job_defaults(&job);
        job.chunk_floats = o.chunk_kb * 1024u / 4u;
        if (job_set_model(&job, o.model) < 0) {
                fprintf(stderr, "bench-pushpull: bad --model '%s' (expected mlp:D0-D1-...-Dn)\n", o.model);
                r = -EINVAL;
                goto out;
        }
        uint64_t nfloats = job_nfloats(&job), model_bytes = nfloats * sizeof(float);
        double model_mib = (double) model_bytes / (1 << 20);

        /* $TMPDIR, if short enough for ipc socket paths (107 bytes) to fit below it. */
        const char *tmp = getenv("TMPDIR");
        if (!tmp || tmp[0] != '/' || strlen(tmp) > 48)
                tmp = "/tmp";
        if ((r = fmt(dir, sizeof dir, "%s/psnet-bench.XXXXXX", tmp)) < 0)
                goto out;
        if (!mkdtemp(dir)) {
                r = log_error_errno(errno, "Failed to create a temporary directory: %m");
                goto out;
        }
        made_dir = true;

        printf("# bench-pushpull: 1 worker (this process), %d shards, transport=%s, allocator=%s, %ld CPUs\n",
               o.replicas > 2 ? (int) o.replicas : 2, o.transport, alloc_name(), sysconf(_SC_NPROCESSORS_ONLN));
        printf("# model %s: %llu floats x 4 B = %llu B = %.1f MiB in %llu keys of <= %u KiB; optimizer %s\n",
               o.model, (unsigned long long) nfloats, (unsigned long long) model_bytes, model_mib,
               (unsigned long long) job_nkeys(&job), o.chunk_kb, optim_kind_name(job.optim.kind));
        fflush(stdout);

        /* The baseline moves as many bytes as the timed push+pull rounds do, and
         * its runs are spread over the benchmark (one before each mode, the rest
         * after), so that a machine whose load drifts skews both sides alike.
         * Each runs while this process holds no ZeroMQ context (zmqraw forks). */
        size_t per = strcmp(o.wire, "bf16") == 0 ? 2 : 1; /* tensor bytes per wire byte */
        size_t msg_bytes = (size_t) o.chunk_kb * 1024u / per;
        size_t total = (size_t) (2 * model_bytes) * o.rounds / per;
        double raw_runs[BENCH_RAW_MAX] = { 0 }, raw_sorted[BENCH_RAW_MAX], raw = 0;
        double raw_cpu[BENCH_RAW_MAX] = { 0 }, raw_cpu_med = 0;
        double xchg_runs[BENCH_RAW_MAX] = { 0 }, xchg = 0;
        size_t npeers = MAX(o.replicas, 2u); /* the shards a round talks to */
        double mc_runs[BENCH_RAW_MAX] = { 0 }, mc = 0;
        CpuMark m0 = { 0 }, m1 = { 0 };
        bool marked = cpu_mark(&m0) == 0;
        size_t nraw = 0;
        for (size_t i = 0; i < nmodes; i++) {
                if (nraw < o.raw_runs) {
                        if ((r = bench_raw(&o, dir, npeers, msg_bytes, total, &raw_runs[nraw], &raw_cpu[nraw],
                                       &xchg_runs[nraw])) < 0 ||
                            (r = bench_memcpy(model_bytes, &mc_runs[nraw])) < 0)
                                goto out;
                        nraw++;
                }
                r = bench_mode(&o, dir, modes[i], nfloats, &res[i]);
                if (r < 0)
                        goto out;
        }
        for (; nraw < o.raw_runs; nraw++)
                if ((r = bench_raw(&o, dir, npeers, msg_bytes, total, &raw_runs[nraw], &raw_cpu[nraw],
                                       &xchg_runs[nraw])) < 0 ||
                    (r = bench_memcpy(model_bytes, &mc_runs[nraw])) < 0)
                        goto out;
        if (nraw > 0) {
                memcpy(raw_sorted, raw_runs, sizeof raw_runs);
                raw = median(raw_sorted, nraw);
                memcpy(raw_sorted, raw_cpu, sizeof raw_cpu);
                raw_cpu_med = median(raw_sorted, nraw);
                memcpy(raw_sorted, mc_runs, sizeof mc_runs);
                mc = median(raw_sorted, nraw);
                memcpy(raw_sorted, xchg_runs, sizeof xchg_runs);
                xchg = median(raw_sorted, nraw);
        }

        printf("%-5s %-10s %4s %9s %9s %11s %9s %8s\n", "mode", "kind", "n", "MiB/round", "median_ms", "median_GB/s",
               "best_GB/s", "cpu_s/GB");
        for (size_t i = 0; i < nmodes; i++) {
                print_figures(res[i].mode, "push+pull", &res[i].pushpull);
                print_figures(res[i].mode, "pull", &res[i].pull);
        }
        if (nraw > 0) {
                printf("%-5s %-10s %4zu %9.1f %9s %11.2f %9s %8.2f  (msg %zu KiB, DEALER->ROUTER; runs:", "raw", "zmq",
                       nraw, (double) total / (1 << 20), "-", raw, "-", raw_cpu_med, msg_bytes / 1024);
                for (size_t i = 0; i < nraw; i++)
                        printf(" %.2f", raw_runs[i]);
                printf(")\n");
                printf("%-5s %-10s %4zu %9.1f %9s %11.2f %9s %8s  (%zu peers, requests answered by replies of "
                       "the same size; runs:", "raw", "zmq-xchg", nraw, (double) total / (1 << 20), "-", xchg, "-", "-",
                       npeers);
                for (size_t i = 0; i < nraw; i++)
                        printf(" %.2f", xchg_runs[i]);
                printf(")\n");
                printf("%-5s %-10s %4zu %9.1f %9s %11.2f %9s %8s  (single thread, this process)\n", "base", "memcpy",
                       nraw, model_mib, "-", mc, "-", "-");
        }
        printf("# cpu_s/GB: CPU seconds of all the processes involved per GB moved (2 CPUs here)\n");
        if (marked && cpu_mark(&m1) == 0 && m1.t > m0.t) {
                double dt = m1.t - m0.t, others = (m1.busy - m0.busy - (m1.ours - m0.ours)) / dt;
                double steal = (m1.steal - m0.steal) / dt;
                printf("# meanwhile other processes used %.2f CPUs and the host stole %.2f (of %ld)%s\n",
                       others > 0 ? others : 0.0, steal, sysconf(_SC_NPROCESSORS_ONLN),
                       others + steal > 0.1 ? ": the figures are disturbed, run again on a quiet machine" : "");
        }
        for (size_t i = 0; i < nmodes; i++) {
                const Figures *pp = &res[i].pushpull, *pl = &res[i].pull;
                bool shm_used = res[i].shm_shards > 0;
                printf("pushpull transport=%s shm=%s in_place=%s mode=%s replicas=%u psd_threads=%u wire=%s model_mib=%.1f chunk_kib=%u rounds=%u "
                       "push+pull_gbps=%.2f push+pull_best_gbps=%.2f pull_gbps=%.2f tensor_gbps=%.2f cpu_s_per_gb=%.3f",
                       o.transport, shm_used ? "on" : "off", o.in_place, res[i].mode, o.replicas, o.psd_threads, o.wire, model_mib,
                       o.chunk_kb,
                       o.rounds, pp->med_gbps, pp->best_gbps, pl->med_gbps, pp->med_gbps * (double) per,
                       pp->cpu_s_per_gb);
                printf(" shards_rss_mib=%.0f shards_anon_mib=%.0f shards_shmem_mib=%.0f shards_state_mib=%.0f "
                       "rss_over_state=%.2f", res[i].rss_mib, res[i].anon_mib, res[i].shmem_mib, res[i].state_mib,
                       res[i].state_mib > 0 ? res[i].anon_mib / res[i].state_mib : 0.0);
                if (nraw > 0)
                        printf(" raw_zmq_gbps=%.2f raw_cpu_s_per_gb=%.3f ratio=%.2f pull_ratio=%.2f raw_exchange_gbps=%.2f "
                               "exchange_ratio=%.2f memcpy_gbps=%.2f memcpy_ratio=%.2f cpu_ratio=%.2f target=%s", raw, raw_cpu_med,
                               pp->med_gbps / raw, pl->med_gbps / raw, xchg, xchg > 0 ? pp->med_gbps / xchg : 0.0,
                               mc, mc > 0 ? pp->med_gbps / mc : 0.0,
                               pp->cpu_s_per_gb > 0 ? raw_cpu_med / pp->cpu_s_per_gb : 0.0,
                               shm_used ? "0.5_of_memcpy" : strcmp(o.transport, "tcp") == 0 ? "0.9_of_raw" : "0.95_of_raw");
                printf("\n");
        }
        if (fflush(stdout) != 0)
                r = -errno;
out:
        if (made_dir)
                bench_cleanup(dir, r < 0);
        config_free_strings(opts, ELEMENTSOF(opts));
        return r < 0 ? (r == -EINVAL ? 2 : EXIT_FAILURE) : EXIT_SUCCESS;
}
