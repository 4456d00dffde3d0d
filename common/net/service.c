/* SPDX-License-Identifier: Apache-2.0 */
/* See service.h. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include "fdguard.h"
#include "http.h"
#include "log.h"
#include "macro.h"
#include "psnet-config.h"
#include "service.h"

#define SERVICE_STATUS_MS 5000

static const int service_signals[] = { SIGTERM, SIGINT, SIGHUP };

struct Service {
        uv_signal_t sig[ELEMENTSOF(service_signals)];
        unsigned nsig, open;
        uv_timer_t watchdog, status;
        bool watchdog_init, status_init;
        HttpServer *http;
        ServiceOps ops;
        void *ud;
        bool ready, notify;
        char name[16];
};

static void service_on_signal(uv_signal_t *h, int signo) {
        Service *s = h->data;
        if (signo == SIGHUP) {
                if (s->ops.reload)
                        s->ops.reload(s->ud);
                else
                        log_info("SIGHUP: %s has nothing to reload", s->name);
                return;
        }
        log_info("stopping signal=%s", strsignal(signo));
        if (s->ops.stop)
                s->ops.stop(s->ud, signo);
}

static void service_watchdog(uv_timer_t *t) {
        (void) t;
        (void) sd_notify(0, "WATCHDOG=1");
}

static void service_status(uv_timer_t *t) {
        Service *s = t->data;
        char line[256] = "";
        if (!s->ops.status)
                return;
        s->ops.status(s->ud, line, sizeof line);
        if (line[0])
                (void) sd_notifyf(0, "STATUS=%s", line);
}

void service_ready(Service *s) {
        if (s->ready)
                return;
        s->ready = true;
        (void) sd_notify(0, "READY=1");
        if (s->status_init)
                service_status(&s->status);
}

void service_stopping(Service *s) {
        (void) s;
        (void) sd_notify(0, "STOPPING=1");
}

static bool service_is_ready(Service *s, char *why, size_t n) {
        if (s->ops.ready)
                return s->ops.ready(s->ud, why, n);
        if (!s->ready)
                snprintf(why, n, "starting");
        return s->ready;
}

static void service_http_handler(void *ud, const char *path, HttpReply *r) {
        Service *s = ud;
        char why[192] = "";
        if (strcmp(path, "/metrics") == 0) {
                MetricsBuf b = { 0 };
                metrics_common(&b, s->name);
                metrics_one(&b, "psnet_ready", "gauge", "Whether the daemon serves (1) or not yet (0).",
                            service_is_ready(s, why, sizeof why) ? 1 : 0);
                metrics_one(&b, "psnet_open_files_limit", "gauge", "The open-files limit in force (soft, raised to the hard one).",
                            (double) fdguard_limit());
                metrics_one(&b, "psnet_connection_budget", "gauge",
                            "Descriptors peer connections may use; past them new connections are refused.",
                            (double) fdguard_budget());
                metrics_one(&b, "psnet_connections_refused_total", "counter",
                            "Connections closed as accepted: past the budget, or no descriptor left.",
                            (double) fdguard_refused());
                metrics_one(&b, "psnet_message_bound_bytes", "gauge",
                            "The largest message a peer may send here (0: none); past it its connection is dropped.",
                            (double) fdguard_bound());
                metrics_one(&b, "psnet_connections_dropped_total", "counter",
                            "Connections dropped as they began a message past the bound, or spoke no ZMTP 3.",
                            (double) fdguard_dropped());
                if (s->ops.metrics)
                        s->ops.metrics(s->ud, &b);
                if (b.failed) {
                        metrics_free(&b);
                        http_reply_text(r, 503, "out of memory\n");
                        return;
                }
                r->status = 200;
                r->type = "text/plain; version=0.0.4; charset=utf-8";
                r->body = b.data;
                r->len = b.len;
        } else if (strcmp(path, "/healthz") == 0)
                http_reply_text(r, 200, "ok\n");
        else if (strcmp(path, "/readyz") == 0) {
                if (service_is_ready(s, why, sizeof why))
                        http_reply_text(r, 200, "ready\n");
                else {
                        char text[224];
                        snprintf(text, sizeof text, "not ready: %s\n", why);
                        http_reply_text(r, 503, text);
                }
        } else
                http_reply_text(r, 404, "not found: /metrics, /healthz and /readyz are served\n");
}

int service_http(Service *s, const char *addr, char *err, size_t errlen) {
        if (!addr || !*addr)
                return 0; /* --http '' (a unit's empty default): off */
        int r = http_start(s->sig[0].loop, addr, service_http_handler, s, &s->http, err, errlen);
        if (r == 0)
                log_info("serving http address=%s port=%d paths=/metrics,/healthz,/readyz", addr, http_port(s->http));
        return r;
}

int service_http_port(const Service *s) {
        return s->http ? http_port(s->http) : -1;
}

static void service_closed(uv_handle_t *h) {
        Service *s = h->data;
        if (--s->open == 0)
                free(s);
}

int service_new(uv_loop_t *loop, const char *name, const ServiceOps *ops, void *ud, Service **ret) {
        Service *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->ops = *ops;
        s->ud = ud;
        snprintf(s->name, sizeof s->name, "%s", name);
        /* A peer that goes away mid-write must be an error, not the end of us. */
        signal(SIGPIPE, SIG_IGN);
        fdguard_init(); /* the open-files limit raised, connections kept below it */
        /* systemd's watchdog: a ping at half the interval it asked for. */
        uint64_t usec = 0;
        if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0 && uv_timer_init(loop, &s->watchdog) == 0) {
                s->watchdog.data = s;
                s->watchdog_init = true;
                s->open++;
                (void) uv_timer_start(&s->watchdog, service_watchdog, usec / 2000, usec / 2000);
        }
        if (getenv("NOTIFY_SOCKET") && ops->status && uv_timer_init(loop, &s->status) == 0) {
                s->status.data = s;
                s->status_init = true;
                s->open++;
                (void) uv_timer_start(&s->status, service_status, SERVICE_STATUS_MS, SERVICE_STATUS_MS);
        }
        for (size_t i = 0; i < ELEMENTSOF(service_signals); i++) {
                int r = uv_signal_init(loop, &s->sig[i]);
                if (r == 0) {
                        s->sig[i].data = s;
                        s->nsig++;
                        s->open++;
                        r = uv_signal_start(&s->sig[i], service_on_signal, service_signals[i]);
                }
                if (r < 0) {
                        service_free(s);
                        return r;
                }
        }
        *ret = s;
        return 0;
}

Service *service_free(Service *s) {
        if (!s)
                return NULL;
        s->http = http_free(s->http);
        if (s->open == 0) {
                free(s);
                return NULL;
        }
        if (s->watchdog_init)
                uv_close((uv_handle_t *) &s->watchdog, service_closed);
        if (s->status_init)
                uv_close((uv_handle_t *) &s->status, service_closed);
        for (unsigned i = 0; i < s->nsig; i++)
                uv_close((uv_handle_t *) &s->sig[i], service_closed);
        return NULL;
}
