/* SPDX-License-Identifier: Apache-2.0 */
/* See zwatch.h. */
#include <errno.h>
#include <stdlib.h>
#include <zmq.h>
#include "log.h"
#include "zwatch.h"

/* Messages read per loop turn before the watch yields to the other handles. */
#define ZWATCH_BUDGET 64

struct ZWatch {
        uv_poll_t poll;
        uv_idle_t idle;
        void *sock;
        ZWatchFn on_readable;
        void *ud;
        unsigned in_dispatch;   /* nesting depth of on_readable calls */
        unsigned handles;       /* uv handles not yet closed */
        bool closing;
};

static void zwatch_handle_closed(uv_handle_t *h) {
        ZWatch *w = h->data;
        if (--w->handles == 0)
                free(w);
}

static void zwatch_finish_close(ZWatch *w) {
        if (w->sock) {
                zmq_close(w->sock);
                w->sock = NULL;
        }
        uv_close((uv_handle_t *) &w->poll, zwatch_handle_closed);
        uv_close((uv_handle_t *) &w->idle, zwatch_handle_closed);
}

static void zwatch_idle_cb(uv_idle_t *h);

/* Reads while ZMQ_EVENTS says POLLIN, up to the budget. */
static void zwatch_dispatch(ZWatch *w) {
        w->in_dispatch++;
        bool more = false;
        for (unsigned n = 0; !w->closing; n++) {
                int ev = 0;
                size_t sz = sizeof ev;
                if (zmq_getsockopt(w->sock, ZMQ_EVENTS, &ev, &sz) < 0) {
                        if (errno != ETERM)
                                log_debug_errno(errno, "ZMQ_EVENTS failed: %m");
                        break;
                }
                if (!(ev & ZMQ_POLLIN))
                        break;
                if (n == ZWATCH_BUDGET) {
                        more = true;
                        break;
                }
                w->on_readable(w, w->ud);
        }
        w->in_dispatch--;
        if (w->closing) {
                if (w->in_dispatch == 0)
                        zwatch_finish_close(w);
                return;
        }
        if (more)
                (void) uv_idle_start(&w->idle, zwatch_idle_cb);
        else
                (void) uv_idle_stop(&w->idle);
}

static void zwatch_idle_cb(uv_idle_t *h) {
        zwatch_dispatch(h->data);
}

static void zwatch_poll_cb(uv_poll_t *h, int status, int events) {
        ZWatch *w = h->data;
        (void) events;
        if (status < 0)
                log_debug("poll on a ZeroMQ socket failed: %s", uv_strerror(status));
        zwatch_dispatch(w);
}

int zwatch_new(uv_loop_t *loop, void *sock, ZWatchFn on_readable, void *ud, ZWatch **ret) {
        int fd;
        size_t sz = sizeof fd;
        if (zmq_getsockopt(sock, ZMQ_FD, &fd, &sz) < 0)
                return -errno;
        ZWatch *w = calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->sock = sock;
        w->on_readable = on_readable;
        w->ud = ud;
        int r = uv_poll_init(loop, &w->poll, fd);
        if (r < 0) {
                free(w);
                return r;
        }
        w->poll.data = w;
        w->handles = 1;
        r = uv_idle_init(loop, &w->idle);
        if (r == 0) {
                w->idle.data = w;
                w->handles++;
                r = uv_poll_start(&w->poll, UV_READABLE, zwatch_poll_cb);
        }
        if (r < 0) {
                /* Give the socket back: close only the handles. */
                w->sock = NULL;
                w->closing = true;
                uv_close((uv_handle_t *) &w->poll, zwatch_handle_closed);
                if (w->handles == 2)
                        uv_close((uv_handle_t *) &w->idle, zwatch_handle_closed);
                return r;
        }
        /* Messages may already be queued: look once the loop runs. */
        (void) uv_idle_start(&w->idle, zwatch_idle_cb);
        *ret = w;
        return 0;
}

void zwatch_kick(ZWatch *w) {
        if (w && !w->closing)
                (void) uv_idle_start(&w->idle, zwatch_idle_cb);
}

void *zwatch_socket(const ZWatch *w) {
        return w->sock;
}

bool zwatch_in_dispatch(const ZWatch *w) { return w && w->in_dispatch > 0; }

ZWatch *zwatch_close(ZWatch *w) {
        if (!w || w->closing)
                return NULL;
        w->closing = true;
        (void) uv_poll_stop(&w->poll);
        (void) uv_idle_stop(&w->idle);
        if (w->in_dispatch == 0)
                zwatch_finish_close(w);
        return NULL;
}
