/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: model descriptions (common/modeldesc.c), as a job's
 * --model text reaches pscoord and every shard: mlp strings, built-in names,
 * the click models (lr:D, dlrm:F:BOT:TOP), JSON of layers or of tensors alone. Any text is parsed or refused with
 * -EINVAL and a reason, never a crash; a model that parses writes a
 * canonical text that parses again to the same tensors. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "modeldesc.h"

static ModelDesc a, b;
static char text[MD_MAX_TEXT];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char *s = malloc(size + 1), err[256];
        if (!s)
                abort();
        memcpy(s, data, size);
        s[size] = '\0';
        int r = modeldesc_parse(s, &a, err, sizeof err);
        free(s);
        if (r != 0 && (r != -EINVAL || err[0] == '\0'))
                abort(); /* refused without a reason, or with another error */
        if (r != 0)
                return 0;
        if (a.ntensors < 1 || a.ntensors > MD_MAX_TENSORS)
                abort();
        r = modeldesc_format(&a, text, sizeof text);
        if (r == -ENOSPC)
                return 0; /* a description file's model may not fit a job's text */
        if (r != 0 || modeldesc_parse(text, &b, err, sizeof err) != 0 || b.ntensors != a.ntensors ||
            b.external != a.external || b.click != a.click || b.click_dim != a.click_dim ||
            b.click_fields != a.click_fields || b.dlrm_bottom != a.dlrm_bottom)
                abort();
        for (size_t i = 0; i < a.ntensors; i++)
                if (strcmp(a.tensors[i].name, b.tensors[i].name) != 0 || a.tensors[i].numel != b.tensors[i].numel ||
                    a.tensors[i].buffer != b.tensors[i].buffer || a.tensors[i].init != b.tensors[i].init)
                        abort();
        return 0;
}
