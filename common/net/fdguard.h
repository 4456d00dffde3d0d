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

/* Messages bounded as they arrive. libzmq hands a multipart message over only
 * once all of it has come, and bounds a frame but not the frames of a
 * message: one message of many frames each under the limit was held whole
 * (2 GiB into pscoord). The same file takes recv() in front of libzmq, for
 * the connections accepted here: it follows their ZMTP 3 framing (greeting,
 * then each frame's flags and size) and, as soon as a frame's size takes the
 * message begun past the bound (fdguard_message_bound), fails the read with
 * ECONNRESET: libzmq drops the connection and what it held, before the
 * frame's body is read. With CURVE every frame is sealed on its own and its
 * MORE flag is inside: there a message is bounded frame by frame (by
 * --max-msg), and only holders of an allowed key get that far. A peer that
 * does not speak ZMTP 3 (1.0 and 2.0 frame otherwise) is dropped. */
#define FDGUARD_FRAME_COST 64u /* counted for each frame beyond its bytes: libzmq's zmq_msg_t */
#define FDGUARD_MIN_RATE 4096u /* bytes a second a message begun must average once past its time */
#define FDGUARD_MIN_RATE_TEXT "4 KiB a second"

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
/* The largest message (its frames' bytes, FDGUARD_FRAME_COST each more) a
 * connection accepted here may send; 0: no bound. Set as the job changes. */
void fdguard_message_bound(uint64_t bytes);
uint64_t fdguard_bound(void);
/* A message begun more than ms ago (0: never) must have come at
 * FDGUARD_MIN_RATE bytes a second on average, else its connection is dropped
 * at its next bytes: a peer that trickles a byte now and then keeps the idle
 * time-out from firing (a slow link's message comes far faster; a silent
 * peer is the idle time-out's). The daemons pass --idle-timeout. Frame by
 * frame under CURVE, as the bound. */
void fdguard_message_time(uint64_t ms);
/* Connections dropped for a message past the bound, or for not speaking ZMTP 3. */
uint64_t fdguard_dropped(void);
/* fd, just accepted, is not libzmq's (a shared-memory hello): not read as ZMTP. */
void fdguard_forget(int fd);
