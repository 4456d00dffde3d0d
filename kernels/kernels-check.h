/* Argument checks shared by the backends, so every backend refuses the same
 * shapes the same way. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "kernels.h"

/* The number of rows x cols elements, or 0 when either is not positive. */
static inline size_t numel(int rows, int cols) {
        if (rows <= 0 || cols <= 0)
                return 0;
        return (size_t) rows * (size_t) cols;
}

static inline bool act_valid(KAct act) {
        return act == KACT_NONE || act == KACT_RELU;
}
