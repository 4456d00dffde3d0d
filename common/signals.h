/* Signals as file descriptors: daemons block SIGTERM, SIGINT and SIGHUP and
 * poll a signalfd beside their sockets, so a signal is an event like a message. */
#pragma once

/* Blocks SIGTERM, SIGINT, SIGHUP and returns a non-blocking signalfd for them,
 * or a negative errno. */
int signals_open(void);
