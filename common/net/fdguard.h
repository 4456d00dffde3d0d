/* SPDX-License-Identifier: Apache-2.0 */
/* Peer connections kept below the open-files limit. libzmq accepts them on
 * its own threads and aborts the process when accept() fails for want of
 * descriptors on an ipc endpoint ("Too many open files
 * (src/ipc_listener.cpp:325)"; on tcp it spins instead). A daemon linked
 * with this file (the service library) takes accept() and accept4() in
 * front of libzmq: a connection whose descriptor lands at or above the
 * budget (the lowest free descriptor is that high: the budget's worth are
 * in use) is closed at once, refused; one that cannot be accepted at all
 * (EMFILE) is taken on a spare descriptor kept for it and closed. libzmq
 * sees EAGAIN, which it expects, and serves on; the descriptors above the
 * budget stay for the daemon's own files and sockets. */
#pragma once
#include <stdint.h>

/* Raises the soft open-files limit to the hard one, sets the budget below it
 * (an eighth kept back, at least 32, at most 4,096) and opens the spare.
 * Called once, at start, by service_new. */
void fdguard_init(void);
/* The highest descriptor a peer connection may have, plus one (0: no guard). */
unsigned long fdguard_budget(void);
/* The soft open-files limit in force. */
unsigned long fdguard_limit(void);
/* Connections refused since start: past the budget, and with no descriptor left. */
uint64_t fdguard_refused(void);
