/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the .npy parser (worker/data/npy.c), as a data set's
 * arrays are read. Any input gets 0 with a shape whose product is the count
 * and every byte of the data readable, or -EBADMSG / -EFBIG / -ENOMEM with a
 * reason; never a crash or a read out of bounds. Seeds: files written by
 * numpy.save (tests/fuzz/corpus/npy; format 1.0 and 2.0, each type). */
#include <errno.h>
#include <stdlib.h>
#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        NpyArray a;
        char err[256] = "";
        int r = npy_parse(data, size, 1u << 20, &a, err, sizeof err);
        if (r == 0) {
                uint64_t n = 1;
                for (unsigned k = 0; k < a.ndim; k++)
                        n *= a.shape[k];
                if (a.ndim < 1 || a.ndim > NPY_MAX_DIMS || n != a.count || !a.data)
                        abort();
                volatile uint8_t sum = 0;
                const uint8_t *p = a.data;
                for (uint64_t k = 0; k < n * npy_item_size(a.type); k++)
                        sum += p[k];
                (void) sum;
        } else if ((r != -EBADMSG && r != -EFBIG && r != -ENOMEM) || !err[0])
                abort();
        npy_free(&a);
        return 0;
}
