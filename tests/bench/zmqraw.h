/* SPDX-License-Identifier: Apache-2.0 */
/* The raw-ZeroMQ baselines for the benchmarks: how fast bare ZeroMQ moves
 * bytes one way between two processes, and in requests answered by replies of
 * the same size with several peers (the pattern of a push+pull round), so
 * psnet's push/pull figures can be read against what the transport alone
 * achieves. */
#pragma once
#include <stddef.h>

/* Forks a child that binds a ROUTER at endpoint ("ipc:///tmp/zmqraw.ipc",
 * "tcp://127.0.0.1:5599") and receives, while this process connects a DEALER
 * and sends total_bytes as ceil(total_bytes / msg_bytes) messages of msg_bytes
 * (the last one holds the remainder), zero-copy from one pre-faulted buffer.
 * The child acks every message with a few bytes and the sender keeps at most
 * 8 messages unacknowledged; the clock (CLOCK_MONOTONIC) runs from the first
 * send to the last ack, after a handshake that waits for the child to be up.
 * Each side uses its own context with one I/O thread.
 *
 * Call it from a process that holds no ZeroMQ context of its own (contexts do
 * not survive fork). Returns 0 and the goodput in GB/s (1e9 bytes/s) in
 * *ret_gbps; -EINVAL for a NULL argument or msg_bytes or total_bytes of 0,
 * -ENOMEM, -ETIMEDOUT if the child does not answer within 10 s, the child's
 * errno if it failed (e.g. -EADDRINUSE), -ECHILD if it died of a signal, or
 * another negative errno from ZeroMQ or fork. */
int zmqraw_measure(const char *endpoint, size_t msg_bytes, size_t total_bytes, double *ret_gbps);

/* The pattern of psnet's push+pull rounds without psnet: forks npeers
 * (1..ZMQRAW_MAX_PEERS) children, each binding a ROUTER at its endpoint and
 * answering every message with one of the same size (zero-copy from a buffer
 * of its own, as a shard's pull reply leaves); this process connects a DEALER
 * to each in one context with one I/O thread (as a worker does) and sends
 * total_bytes / 2 in whole messages of msg_bytes, spread evenly over the
 * peers, at most 8 unanswered per peer, receiving the replies without
 * copying them anywhere. Goodput = bytes sent + received (whole messages)
 * per second, from the first request to the last reply, after a handshake
 * with every peer. Errors as zmqraw_measure's; -EINVAL also for total_bytes
 * under two messages. */
#define ZMQRAW_MAX_PEERS 8
int zmqraw_exchange(const char *const *endpoints, size_t npeers, size_t msg_bytes, size_t total_bytes,
                    double *ret_gbps);
