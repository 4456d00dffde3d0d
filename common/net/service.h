/* SPDX-License-Identifier: Apache-2.0 */
/* What every psnet daemon's loop has besides its sockets:
 *  - signals (SIGTERM and SIGINT stop, SIGHUP reloads) through uv_signal, so a
 *    signal is an event on the loop like a message, whichever thread the
 *    kernel delivers it to;
 *  - systemd's notification protocol (libsystemd's sd_notify): READY=1 once
 *    the daemon serves, STATUS= every few seconds, WATCHDOG=1 at half the
 *    unit's WatchdogSec=, STOPPING=1; without NOTIFY_SOCKET these do nothing;
 *  - the HTTP endpoint (--http ADDR:PORT): /metrics (Prometheus text, from the
 *    daemon's metrics callback), /healthz (the loop answers) and /readyz (the
 *    daemon's ready callback: 200 or 503 with why). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>
#include "metrics.h"

typedef struct Service Service;

typedef struct ServiceOps {
        void (*stop)(void *ud, int signo);              /* SIGTERM, SIGINT */
        void (*reload)(void *ud);                       /* SIGHUP; NULL: logged and ignored */
        void (*metrics)(void *ud, MetricsBuf *b);       /* the daemon's own families */
        bool (*ready)(void *ud, char *why, size_t n);   /* NULL: ready once service_ready was called */
        void (*status)(void *ud, char *buf, size_t n);  /* a line for systemctl status; may be NULL */
} ServiceOps;

/* Installs the signal handlers on loop, ignores SIGPIPE, raises the open-files
 * limit to its hard maximum and starts the watchdog when systemd asks for one.
 * name ("psd", ...) is for logs and metrics. */
int service_new(uv_loop_t *loop, const char *name, const ServiceOps *ops, void *ud, Service **ret);
/* Serves HTTP on addr (NULL or "": nothing); -errno with a reason in err. */
int service_http(Service *s, const char *addr, char *err, size_t errlen);
/* The port the HTTP endpoint listens on, or -1. */
int service_http_port(const Service *s);
/* The daemon serves: READY=1 (once). */
void service_ready(Service *s);
/* The daemon is stopping: STOPPING=1. */
void service_stopping(Service *s);
/* Closes its handles; NULL is fine. Returns NULL. */
Service *service_free(Service *s);
