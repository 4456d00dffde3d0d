/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the IDX reader (worker/data/idx.c), raw or gzip, as
 * workerd reads a data set. Any file gets 0 with dimensions whose product is
 * what was read, or a clear error; never a crash or a read out of bounds. */
#include <errno.h>
#include <stdlib.h>
#include "fuzz-util.h"
#include "idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *path = fuzz_file(data, size);
        if (!path)
                abort();
        uint8_t *out = NULL;
        uint32_t dims[3] = { 0 };
        unsigned nd = 0;
        int r = idx_read(path, &out, dims, &nd);
        if (r == 0) {
                if (nd < 1 || nd > 3 || !out)
                        abort();
                size_t n = 1;
                for (unsigned k = 0; k < nd; k++)
                        n *= dims[k];
                volatile uint8_t sum = 0;
                for (size_t k = 0; k < n; k++) /* every byte it says it read is there */
                        sum += out[k];
                (void) sum;
        } else if (r != -EBADMSG && r != -ENOMEM && r != -EIO && r != -EFBIG)
                abort();
        free(out);
        return 0;
}
