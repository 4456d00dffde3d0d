/* SPDX-License-Identifier: Apache-2.0 */
/* ZeroMQ endpoints as psnet uses them (tcp://HOST:PORT, ipc://PATH), and the
 * monotonic clock the network layer's deadlines use. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Monotonic milliseconds. */
uint64_t now_ms(void);
/* Wall-clock milliseconds since 1970 (for dates shown to people). */
uint64_t unix_ms(void);

/* Before binding: for ipc:// endpoints, creates the socket's directory (0700:
 * only its owner enters it, so no other user of the host reaches the socket)
 * and removes a stale socket file nobody listens on (-EADDRINUSE when someone
 * does). Other schemes: no-op. */
int endpoint_prepare(const char *endpoint);

/* Whether anyone could be listening at an ipc:// endpoint, asked of the
 * socket file itself: 0 when a connection is taken (or the endpoint is not
 * ipc://: nothing to tell), else -ENOENT (no socket there), -ECONNREFUSED (a
 * socket nobody listens on, left by a process that stopped), -EACCES (its
 * folder or socket is another user's), with why in words. */
int endpoint_probe(const char *endpoint, char *why, size_t n);

/* tcp:// with a host that is a loopback address (127.0.0.0/8, ::1, localhost). */
bool endpoint_is_loopback_tcp(const char *endpoint);
/* tcp:// whatever the host. */
bool endpoint_is_tcp(const char *endpoint);

/* The ordinal N of a StatefulSet pod's hostname NAME-N (psd-0 -> 0); -EINVAL
 * when host does not end in -DIGITS or N > 1000000. */
int hostname_ordinal(const char *host, unsigned *ret);
