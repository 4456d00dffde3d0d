/* SPDX-License-Identifier: Apache-2.0 */
/* A minimal test harness for unit tests: each check prints one TAP line and
 * tap_done() returns the exit status (non-zero if any check failed). */
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

bool tap_check(bool ok, const char *file, int line, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
int tap_done(void);

/* CHECK(cond, "what is being checked %d", x) */
#define CHECK(cond, ...) tap_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
/* Relative-or-absolute closeness: |a-b| <= tol * max(1, |b|). */
#define CHECK_CLOSE(a, b, tol, ...)                                                   \
        tap_check(fabs((double) (a) - (double) (b)) <= (tol) * fmax(1.0, fabs((double) (b))), \
                  __FILE__, __LINE__, __VA_ARGS__)
