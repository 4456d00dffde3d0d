/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the libFuzzer targets (tests/fuzz/): the input as a file the
 * code under test opens by path, as the daemons do. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Writes data into a memory file (one per process, rewritten per input) and
 * returns a path to it ("/proc/self/fd/N"), or NULL. */
const char *fuzz_file(const uint8_t *data, size_t n);
