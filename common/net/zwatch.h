/* SPDX-License-Identifier: Apache-2.0 */
/* A ZeroMQ socket on a libuv loop. ZeroMQ signals "something may have
 * changed" through the socket's ZMQ_FD, edge-triggered: the fd is cleared by
 * any operation on the socket, sends included. So the watch polls the fd with
 * uv_poll, then asks ZMQ_EVENTS and calls on_readable while POLLIN holds (up to
 * a budget per loop turn, the rest on the next turn through a uv_idle), and
 * re-checks after every send (zwatch_kick). Nothing waits.
 *
 * The watch owns the ZeroMQ socket: zwatch_close closes it, also from inside
 * its own callback (the close then happens when the callback returns), and
 * frees the watch from libuv's close callbacks. */
#pragma once
#include <stdbool.h>
#include <uv.h>

typedef struct ZWatch ZWatch;

/* Called while the socket has a message to read; it should read one (reading
 * none is harmless: the watch asks ZMQ_EVENTS again). */
typedef void (*ZWatchFn)(ZWatch *w, void *ud);

/* Watches sock (which it now owns) on loop. -errno on failure (the socket is
 * then still the caller's). */
int zwatch_new(uv_loop_t *loop, void *sock, ZWatchFn on_readable, void *ud, ZWatch **ret);
/* After a send (or anything else done to the socket outside on_readable):
 * check ZMQ_EVENTS again on the next loop turn. */
void zwatch_kick(ZWatch *w);
void *zwatch_socket(const ZWatch *w);
/* Stops watching, closes the socket with the linger it was given, frees the
 * watch once libuv is done with it. NULL is fine. Returns NULL. */
ZWatch *zwatch_close(ZWatch *w);
/* Whether the watch is inside its own on_readable (a close now is finished
 * when that returns: the socket stays open until then). */
bool zwatch_in_dispatch(const ZWatch *w);
