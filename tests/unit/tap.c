/* SPDX-License-Identifier: Apache-2.0 */
/* See tap.h. */
#include <stdarg.h>
#include "tap.h"

static int tap_n, tap_failed;

bool tap_check(bool ok, const char *file, int line, const char *fmt, ...) {
        va_list ap;
        tap_n++;
        char desc[4096];
        va_start(ap, fmt);
        vsnprintf(desc, sizeof desc, fmt, ap);
        va_end(ap);
        /* A description is one line: a newline in it (a log line quoted
         * whole) would leave TAP a line it cannot read. */
        for (char *c = desc; *c; c++)
                if (*c == '\n' || *c == '\r')
                        *c = ' ';
        printf("%s %d - %s\n", ok ? "ok" : "not ok", tap_n, desc);
        if (!ok) {
                tap_failed++;
                printf("#   failed at %s:%d\n", file, line);
        }
        fflush(stdout);
        return ok;
}

int tap_done(void) {
        printf("1..%d\n", tap_n);
        if (tap_n == 0) {
                printf("# no checks ran\n");
                return 1;
        }
        return tap_failed ? 1 : 0;
}
