/* SPDX-License-Identifier: Apache-2.0 */
/* The HTTP endpoint every daemon serves on its own loop (--http ADDR:PORT):
 * GET only, one request per connection, answered by the daemon's handler
 * (/metrics, /healthz, /readyz). Requests are parsed by http-parser; the
 * server is bounded: 64 connections at once, 8 KiB of request headers, 5 s per
 * connection. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

typedef struct HttpServer HttpServer;

typedef struct HttpReply {
        int status;             /* 200, 404, 503, ... */
        const char *type;       /* Content-Type (default text/plain) */
        char *body;             /* malloc'd, freed by the server (may be NULL) */
        size_t len;
} HttpReply;

/* Fills r for a GET of path (the query string removed). */
typedef void (*HttpHandler)(void *ud, const char *path, HttpReply *r);

/* Listens on addr: "HOST:PORT", "[V6]:PORT" or ":PORT" (all addresses).
 * -EINVAL with a reason for a bad address, else -errno. */
int http_start(uv_loop_t *loop, const char *addr, HttpHandler fn, void *ud, HttpServer **ret, char *err,
               size_t errlen);
/* The port it listens on (useful with port 0). */
int http_port(const HttpServer *s);
/* Closes the listener and every connection; frees once libuv is done. NULL is
 * fine. Returns NULL. */
HttpServer *http_free(HttpServer *s);

/* A reply with a copy of text. */
void http_reply_text(HttpReply *r, int status, const char *text);
