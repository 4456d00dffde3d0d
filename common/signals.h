/* Signals as file descriptors: daemons block SIGTERM, SIGINT and SIGHUP and
 * poll a signalfd beside their sockets, so a signal is an event like a message. */
#pragma once
#include <stdbool.h>

/* Blocks SIGTERM, SIGINT, SIGHUP and returns a non-blocking signalfd for them,
 * or a negative errno. */
int signals_open(void);

/* Reads every signal pending on fd. Returns the number of the last stopping
 * signal (SIGTERM, SIGINT) or 0; *ret_hup tells whether SIGHUP came. */
int signals_read(int fd, bool *ret_hup);
