/* The raw-ZeroMQ baseline for the benchmarks: how fast bare ZeroMQ moves bytes
 * one way between two processes, so psnet's push/pull figures can be read
 * against what the transport alone achieves. */
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
