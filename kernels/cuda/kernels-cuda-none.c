/* SPDX-License-Identifier: Apache-2.0 */
/* Stand-in for the CUDA backend in builds without nvcc: the constructor says why
 * there is no device backend, so "--backend cuda" fails with a clear reason and
 * "auto" falls back to the CPU. */
#include <errno.h>
#include <stdio.h>
#include "kernels.h"

int kbackend_cuda_new(KBackend **ret, char *err, size_t errlen) {
        (void) ret;
        if (err && errlen > 0)
                snprintf(err, errlen,
                         "this build of psnet has no CUDA backend (nvcc was not found at build time)");
        return -ENODEV;
}

bool kbackend_cuda_built(void) {
        return false;
}
