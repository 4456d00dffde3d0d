/* SPDX-License-Identifier: Apache-2.0 */
/* The buffers on the backend a model owns (model-internal.h): allocated
 * here by model.c and layers.c alike, freed with the model. */
#include <errno.h>
#include "model-internal.h"

int model_buf(Model *m, size_t floats, float **ret) {
        int r;

        if (m->nbufs == MODEL_MAX_BUFS)
                return -ENOMEM;
        r = m->ops->alloc(m->kb, floats ? floats * sizeof(float) : sizeof(float), (void **) ret);
        if (r < 0)
                return r;
        m->bufs[m->nbufs++] = *ret;
        return 0;
}

