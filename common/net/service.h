/* What every psnet daemon's loop has besides its sockets: signals (SIGTERM and
 * SIGINT stop, SIGHUP reloads) through uv_signal, so a signal is an event on
 * the loop like a message, whichever thread the kernel delivers it to. */
#pragma once
#include <uv.h>

typedef struct Service Service;

typedef struct ServiceOps {
        void (*stop)(void *ud, int signo);   /* SIGTERM, SIGINT */
        void (*reload)(void *ud);            /* SIGHUP; may be NULL (logged and ignored) */
} ServiceOps;

/* Installs the signal handlers on loop, ignores SIGPIPE and raises the
 * open-files limit to its hard maximum. name is for logs. */
int service_new(uv_loop_t *loop, const char *name, const ServiceOps *ops, void *ud, Service **ret);
/* Closes its handles; NULL is fine. Returns NULL. */
Service *service_free(Service *s);
