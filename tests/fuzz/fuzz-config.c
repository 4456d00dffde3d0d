/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the config file parser (common/config.c, inih) with an
 * option of every type, as `--config FILE` reads it. Any text gets 0 or a
 * clear refusal (-EINVAL), never a crash, and what it sets has its type's
 * range. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include "config.h"
#include "fuzz-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *path = fuzz_file(data, size);
        if (!path)
                abort();
        char *s = NULL, *t = NULL;
        int i = 0;
        unsigned u = 0;
        uint64_t u64 = 0;
        float f = 0;
        bool b = false;
        Option opts[] = {
                { "listen", OPT_STR, &s, "ENDPOINT", "a string" },
                { "keys", OPT_STR, &t, "DIR", "another string" },
                { "level", OPT_INT, &i, "N", "an int" },
                { "lease-ms", OPT_UINT, &u, "MS", "an unsigned" },
                { "memory", OPT_U64, &u64, "BYTES", "a 64-bit size" },
                { "lr", OPT_FLOAT, &f, "LR", "a float" },
                { "insecure", OPT_BOOL, &b, NULL, "a flag" },
        };
        const ProgramInfo prog = { .name = "fuzz", .summary = "config fuzz target", .usage = "[OPTIONS]" };
        char *argv[] = { (char *) "fuzz", (char *) "--config", (char *) path, NULL };
        int optind_ = 0;
        int r = config_parse(&prog, opts, sizeof opts / sizeof opts[0], 3, argv, &optind_);
        if (r != 0 && r != -EINVAL && r != 1)
                abort();
        config_free_strings(opts, sizeof opts / sizeof opts[0]);
        return 0;
}
