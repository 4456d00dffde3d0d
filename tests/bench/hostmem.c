/* SPDX-License-Identifier: Apache-2.0 */
/* Host memory the GPU copies from and to, three ways, side by side in one
 * run (printed, never pass/fail): the backend's host_alloc (cudaMallocHost:
 * page-locked from the start), memory shared with the shards as workerd has
 * it (a memfd mapped MAP_SHARED, then host_register: cudaHostRegister) and
 * plain pageable malloc memory. For each size: the time to get the memory
 * page-locked (allocate, or register and unregister), and host-to-device and
 * device-to-host bandwidth, with the registered memory's ratio to
 * cudaMallocHost's (the target: 1.0, so that the shared memory costs the GPU
 * nothing).
 *
 *   build-dir/tests/bench-hostmem [--reps N] [--max-mib M]
 *
 * Without a usable CUDA device it says so and exits 0. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "kernels.h"

static double now_s(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* Seconds per copy host -> device (h2d) and back, as the best of reps. */
static int copies(KBackend *kb, void *dev, void *host, size_t bytes, int reps, bool pinned, double *h2d,
                  double *d2h) {
        *h2d = *d2h = 1e30;
        for (int i = 0; i < reps; i++) {
                double t = now_s();
                int r = kb->ops->upload(kb, dev, host, bytes);
                if (r == 0)
                        r = kb->ops->sync(kb);
                if (r < 0)
                        return r;
                double u = now_s() - t;
                *h2d = u < *h2d ? u : *h2d;
                t = now_s();
                r = pinned ? kb->ops->download_async(kb, host, dev, bytes, 0) : kb->ops->download(kb, host, dev, bytes);
                if (r == 0 && pinned)
                        r = kb->ops->wait_slot(kb, 0);
                if (r < 0)
                        return r;
                u = now_s() - t;
                *d2h = u < *d2h ? u : *d2h;
        }
        return 0;
}

int main(int argc, char **argv) {
        int reps = 10;
        size_t max_mib = 256;
        for (int i = 1; i < argc; i++) {
                if (!strcmp(argv[i], "--reps") && i + 1 < argc)
                        reps = atoi(argv[++i]);
                else if (!strcmp(argv[i], "--max-mib") && i + 1 < argc)
                        max_mib = (size_t) atol(argv[++i]);
                else {
                        fprintf(stderr, "usage: bench-hostmem [--reps N] [--max-mib M]\n");
                        return 2;
                }
        }
        KBackend *kb = NULL;
        char err[256] = "";
        if (!kbackend_cuda_built() || kbackend_new("cuda", 0, &kb, err, sizeof err) != 0) {
                printf("bench-hostmem: no CUDA device here (%s): nothing measured\n",
                       kbackend_cuda_built() ? err : "a build without CUDA");
                return 0;
        }
        printf("%8s %10s %10s %10s | %8s %8s %8s | %8s %8s %8s | %6s %6s\n", "MiB", "alloc_ms", "reg_ms",
               "unreg_ms", "h2d_pin", "h2d_reg", "h2d_page", "d2h_pin", "d2h_reg", "d2h_page", "h2d_r", "d2h_r");
        int rc = 0;
        for (size_t mib = 1; mib <= max_mib && rc == 0; mib *= 4) {
                size_t bytes = mib << 20;
                void *dev = NULL, *pin = NULL, *page = NULL;
                int r = kb->ops->alloc(kb, bytes, &dev);
                double t = now_s();
                if (r == 0)
                        r = kb->ops->host_alloc(kb, bytes, &pin);
                double alloc_ms = (now_s() - t) * 1e3;
                int fd = memfd_create("bench-hostmem", MFD_CLOEXEC);
                void *shared = MAP_FAILED;
                if (r == 0 && fd >= 0 && ftruncate(fd, (off_t) bytes) == 0)
                        shared = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                page = malloc(bytes);
                if (r < 0 || shared == MAP_FAILED || !page) {
                        fprintf(stderr, "bench-hostmem: %zu MiB: no memory (%d)\n", mib, r);
                        rc = 1;
                } else {
                        memset(pin, 1, bytes);
                        memset(shared, 1, bytes); /* its pages exist, as the shards' writes make them */
                        memset(page, 1, bytes);
                        t = now_s();
                        r = kb->ops->host_register(kb, shared, bytes);
                        double reg_ms = (now_s() - t) * 1e3;
                        double hp, dp, hr, dr, hg, dg;
                        if (r == 0)
                                r = copies(kb, dev, pin, bytes, reps, true, &hp, &dp);
                        if (r == 0)
                                r = copies(kb, dev, shared, bytes, reps, true, &hr, &dr);
                        t = now_s();
                        if (r == 0)
                                kb->ops->host_unregister(kb, shared);
                        double unreg_ms = (now_s() - t) * 1e3;
                        if (r == 0)
                                r = copies(kb, dev, page, bytes, reps, false, &hg, &dg);
                        if (r < 0) {
                                fprintf(stderr, "bench-hostmem: %zu MiB: a copy failed (%s)\n", mib, strerror(-r));
                                rc = 1;
                        } else {
                                double gb = (double) bytes / 1e9;
                                printf("%8zu %10.2f %10.2f %10.2f | %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %6.3f %6.3f\n",
                                       mib, alloc_ms, reg_ms, unreg_ms, gb / hp, gb / hr, gb / hg, gb / dp, gb / dr,
                                       gb / dg, hp / hr, dp / dr);
                        }
                }
                if (shared != MAP_FAILED)
                        munmap(shared, bytes);
                if (fd >= 0)
                        close(fd);
                free(page);
                if (pin)
                        kb->ops->host_free(kb, pin);
                if (dev)
                        kb->ops->free(kb, dev);
        }
        printf("bandwidth in GB/s (best of %d); h2d_r, d2h_r: registered shared memory against cudaMallocHost's "
               "(1.0: the same)\n", reps);
        kbackend_free(kb);
        return rc;
}
