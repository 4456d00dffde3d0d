/* SPDX-License-Identifier: Apache-2.0 */
/* Backend selection: maps the names a user types ("cpu", "cuda", "auto") to the
 * constructors in kernels/cpu and kernels/cuda, and frees whichever one it got.
 * See kernels.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "kernels.h"

int kbackend_new(const char *name, int threads, KBackend **ret, char *err, size_t errlen) {
        char cuda_err[256];
        int r;

        if (err && errlen > 0)
                err[0] = '\0';
        if (!ret) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "no place to return the compute backend");
                return -EINVAL;
        }
        if (!name) {
                if (err && errlen > 0)
                        snprintf(err, errlen, "no compute backend named (expected cpu, cuda or auto)");
                return -EINVAL;
        }

        if (strcmp(name, "cpu") == 0)
                return kbackend_cpu_new(threads, ret, err, errlen);
        if (strcmp(name, "cuda") == 0)
                return kbackend_cuda_new(ret, err, errlen);
        if (strcmp(name, "auto") == 0) {
                /* A missing device is the ordinary case on a CPU machine: say
                 * nothing and use the reference backend. */
                r = kbackend_cuda_new(ret, cuda_err, sizeof cuda_err);
                if (r == 0)
                        return 0;
                return kbackend_cpu_new(threads, ret, err, errlen);
        }

        if (err && errlen > 0)
                snprintf(err, errlen, "unknown compute backend '%s' (expected cpu, cuda or auto)", name);
        return -EINVAL;
}

KBackend *kbackend_free(KBackend *kb) {
        if (kb && kb->ops && kb->ops->destroy)
                kb->ops->destroy(kb);
        return NULL;
}
