/* SPDX-License-Identifier: Apache-2.0 */
/* Memory a worker shares with every shard on its host (common/net/shm.h):
 * one memfd handed to several sessions, and the fence a failed round waits
 * on. The shard's half (ps/psd/psd-shm.c) runs in a child process with a
 * loop of its own, as psd does. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "psd-shm.h"
#include "shm.h"
#include "tap.h"

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void on_term(uv_signal_t *h, int signo) {
        (void) signo;
        uv_stop(h->loop);
}

/* A shard's shared-memory listener on ipc://path until SIGTERM. */
static pid_t serve(const char *endpoint) {
        int ready[2];
        if (pipe(ready) < 0)
                return -1;
        pid_t pid = fork();
        if (pid != 0) {
                char b = 0;
                (void) close(ready[1]);
                ssize_t got = pid > 0 ? read(ready[0], &b, 1) : -1;
                (void) close(ready[0]);
                return got == 1 && b == 'y' ? pid : -1;
        }
        (void) close(ready[0]);
        uv_loop_t loop;
        ShmServer *s = NULL;
        uv_signal_t term;
        char ok = uv_loop_init(&loop) == 0 && shm_server_new(&loop, endpoint, &s) == 0 && s &&
                  uv_signal_init(&loop, &term) == 0 && uv_signal_start(&term, on_term, SIGTERM) == 0 ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1 || ok != 'y')
                _exit(1);
        (void) uv_run(&loop, UV_RUN_DEFAULT);
        shm_server_free(s);
        _exit(0);
}

static int stop(pid_t pid) {
        int st = 0;
        (void) kill(pid, SIGTERM);
        return waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
        char dir[] = "/tmp/psnet-shm-memory.XXXXXX", endpoint[128], path[128], reason[256] = "";
        if (!mkdtemp(dir))
                return 1;
        snprintf(endpoint, sizeof endpoint, "ipc://%s/psd.sock", dir);
        CHECK(shm_socket_path(endpoint, path, sizeof path) == 0, "the handover socket of %s is %s", endpoint, path);

        ShmMemory m;
        int r = shm_memory_new(&m, 3 << 20, reason, sizeof reason);
        CHECK(r == 0 && m.base && m.fd >= 0 && m.size == 3u << 20, "3 MiB of shared memory (%s)", reason);
        CHECK(r == 0 && shm_check_fd(m.fd, m.size, reason, sizeof reason) == 0, "a memfd a shard maps (%s)", reason);
        CHECK(r == 0 && ((const uint8_t *) m.base)[12345] == 0, "zeroed");
        ShmMemory none;
        CHECK(shm_memory_new(&none, 0, reason, sizeof reason) == -EINVAL, "no memory of 0 bytes (%s)", reason);

        pid_t shard = serve(endpoint);
        CHECK(shard > 0, "a shard listens on %s", path);
        ShmRegion a = SHM_REGION_INIT, b = SHM_REGION_INIT;
        reason[0] = '\0';
        r = shm_region_share(&a, &m, path, 7, 2000, reason, sizeof reason);
        CHECK(r == 0 && a.base == m.base && a.shared, "a session over the memory (%s)", reason);
        reason[0] = '\0';
        r = shm_region_share(&b, &m, path, 7, 2000, reason, sizeof reason);
        CHECK(r == 0 && b.base == m.base && memcmp(a.token, b.token, sizeof a.token) != 0,
              "a second session over the same memory, another token (%s)", reason);

        double t0 = now_s();
        r = shm_region_fence(&a, 2000);
        double took = now_s() - t0;
        CHECK(r == 0 && took < 1.0, "the fence returns once the shard ended the session (r=%d, %.3f s)", r, took);
        CHECK(a.conn == -1 && !a.base, "the session is closed on the worker's side too");
        ((volatile uint8_t *) m.base)[m.size - 1] = 0x5a;
        CHECK(((volatile uint8_t *) m.base)[m.size - 1] == 0x5a, "the memory stays mapped and writable");

        /* A shard that does not answer (stopped): the fence gives up in time. */
        reason[0] = '\0';
        r = shm_region_share(&a, &m, path, 7, 2000, reason, sizeof reason);
        CHECK(r == 0, "another session (%s)", reason);
        CHECK(kill(shard, SIGSTOP) == 0, "the shard stopped");
        t0 = now_s();
        r = shm_region_fence(&a, 300);
        took = now_s() - t0;
        CHECK(r == -ETIMEDOUT && took >= 0.29 && took < 2.0, "a stopped shard: -ETIMEDOUT after the 0.3 s asked "
              "(r=%d, %.3f s)", r, took);
        CHECK(kill(shard, SIGCONT) == 0, "the shard goes on");

        /* A shard that is gone: its end closed with it. */
        CHECK(stop(shard) == 0, "the shard stops cleanly");
        t0 = now_s();
        r = shm_region_fence(&b, 2000);
        took = now_s() - t0;
        CHECK(r == 0 && took < 1.0, "a shard gone: the fence returns at once (r=%d, %.3f s)", r, took);
        ShmRegion c = SHM_REGION_INIT;
        CHECK(shm_region_fence(&c, 10) == 0, "fencing no session is a no-op");

        shm_memory_free(&m);
        CHECK(!m.base && m.fd == -1, "the memory freed");
        (void) unlink(path);
        (void) rmdir(dir);
        return tap_done();
}
