/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the safetensors parser (common/safetensors.c), as psctl
 * and psd read a file to start a job from. Any input gets 0 with tensors
 * whose bytes lie inside the input and whose shapes give their sizes, or
 * -EBADMSG / -ENOMEM with a reason; never a crash or a read out of bounds.
 * Seeds: files written by st_write (tests/fuzz/corpus/safetensors). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        StFile f;
        char err[256] = "";
        int r = st_parse(data, size, &f, err, sizeof err);
        if (r == 0) {
                volatile float sum = 0;
                for (size_t i = 0; i < f.ntensors; i++) {
                        const StTensor *t = &f.tensors[i];
                        uint64_t n = 1;
                        for (unsigned k = 0; k < t->ndim; k++)
                                n *= t->shape[k];
                        if (n != t->numel || (const uint8_t *) t->data < data ||
                            (const uint8_t *) t->data + n * sizeof(float) > data + size || st_find(&f, t->name) == NULL)
                                abort();
                        for (uint64_t k = 0; k < n; k++) {
                                float v;
                                memcpy(&v, (const uint8_t *) t->data + k * sizeof v, sizeof v);
                                sum += v;
                        }
                }
                (void) sum;
                for (size_t i = 0; i < f.nmeta; i++)
                        if (st_meta(&f, f.meta[2 * i]) == NULL)
                                abort();
                st_free(&f);
        } else if ((r != -EBADMSG && r != -ENOMEM) || !err[0])
                abort();
        return 0;
}
