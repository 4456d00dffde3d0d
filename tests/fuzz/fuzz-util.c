/* SPDX-License-Identifier: Apache-2.0 */
/* See fuzz-util.h. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include "fuzz-util.h"

const char *fuzz_file(const uint8_t *data, size_t n) {
        static int fd = -1;
        static char path[64];
        if (fd < 0) {
                fd = memfd_create("fuzz-input", MFD_CLOEXEC);
                if (fd < 0)
                        return NULL;
                snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        }
        if (ftruncate(fd, 0) < 0)
                return NULL;
        size_t done = 0;
        while (done < n) {
                ssize_t k = pwrite(fd, data + done, n - done, (off_t) done);
                if (k <= 0)
                        return NULL;
                done += (size_t) k;
        }
        return path;
}
