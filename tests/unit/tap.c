/* SPDX-License-Identifier: Apache-2.0 */
/* See tap.h. */
#include <stdarg.h>
#include "tap.h"

static int tap_n, tap_failed;

bool tap_check(bool ok, const char *file, int line, const char *fmt, ...) {
        va_list ap;
        tap_n++;
        printf("%s %d - ", ok ? "ok" : "not ok", tap_n);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
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
