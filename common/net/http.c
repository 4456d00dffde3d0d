/* SPDX-License-Identifier: Apache-2.0 */
/* See http.h. A connection reads into a fixed buffer, feeds http-parser,
 * answers once the request is complete (or malformed), and closes after the
 * answer is written. The server is freed when its listener and every
 * connection have closed. */
#include <errno.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "http.h"
#include "log.h"

#define HTTP_MAX_CONNS 64
#define HTTP_MAX_HEADERS 8192
#define HTTP_TIMEOUT_MS 5000
#define HTTP_MAX_URL 256

typedef struct HttpConn {
        uv_tcp_t tcp;
        uv_timer_t timer;
        uv_write_t write;
        http_parser parser;
        struct HttpServer *srv;
        char buf[4096];
        char url[HTTP_MAX_URL + 1];
        size_t url_len;
        bool url_too_long, answered;
        char *out;
        unsigned open;          /* handles not yet closed */
        struct HttpConn *next;
} HttpConn;

struct HttpServer {
        uv_tcp_t listener;
        HttpHandler fn;
        void *ud;
        HttpConn *conns;
        size_t nconns;
        bool closing;
        unsigned open;          /* the listener, and the connections */
};

static http_parser_settings settings;

static void server_release(HttpServer *s) {
        if (--s->open == 0)
                free(s);
}

static void conn_closed(uv_handle_t *h) {
        HttpConn *c = h->data;
        if (--c->open > 0)
                return;
        HttpServer *s = c->srv;
        for (HttpConn **p = &s->conns; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        s->nconns--;
        free(c->out);
        free(c);
        server_release(s);
}

static void conn_close(HttpConn *c) {
        if (uv_is_closing((uv_handle_t *) &c->tcp))
                return;
        uv_close((uv_handle_t *) &c->timer, conn_closed);
        uv_close((uv_handle_t *) &c->tcp, conn_closed);
}

static void conn_written(uv_write_t *w, int status) {
        (void) status;
        conn_close(w->data);
}

static const char *reason_of(int status) {
        switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 414: return "URI Too Long";
        case 431: return "Request Header Fields Too Large";
        case 503: return "Service Unavailable";
        default: return "Error";
        }
}

static void conn_answer(HttpConn *c, HttpReply *r) {
        if (c->answered) {
                free(r->body);
                return;
        }
        c->answered = true;
        (void) uv_read_stop((uv_stream_t *) &c->tcp);
        char head[256];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                         r->status, reason_of(r->status), r->type ? r->type : "text/plain; charset=utf-8", r->len);
        c->out = malloc((size_t) n + r->len);
        if (!c->out) {
                free(r->body);
                conn_close(c);
                return;
        }
        memcpy(c->out, head, (size_t) n);
        if (r->len)
                memcpy(c->out + n, r->body, r->len);
        free(r->body);
        uv_buf_t b = uv_buf_init(c->out, (unsigned) ((size_t) n + r->len));
        c->write.data = c;
        if (uv_write(&c->write, (uv_stream_t *) &c->tcp, &b, 1, conn_written) < 0)
                conn_close(c);
}

void http_reply_text(HttpReply *r, int status, const char *text) {
        r->status = status;
        r->type = "text/plain; charset=utf-8";
        r->len = strlen(text);
        r->body = malloc(r->len ? r->len : 1);
        if (r->body)
                memcpy(r->body, text, r->len);
        else
                r->len = 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
        HttpConn *c = p->data;
        if (c->url_len + len > HTTP_MAX_URL) {
                c->url_too_long = true;
                return 1;
        }
        memcpy(c->url + c->url_len, at, len);
        c->url_len += len;
        c->url[c->url_len] = '\0';
        return 0;
}

static int on_message_complete(http_parser *p) {
        HttpConn *c = p->data;
        HttpReply r = { 0 };
        if (p->method != HTTP_GET && p->method != HTTP_HEAD)
                http_reply_text(&r, 405, "only GET\n");
        else {
                char *q = strchr(c->url, '?');
                if (q)
                        *q = '\0';
                c->srv->fn(c->srv->ud, c->url, &r);
                if (p->method == HTTP_HEAD) {
                        free(r.body);
                        r.body = NULL; /* Content-Length says what GET would send */
                }
        }
        conn_answer(c, &r);
        return 1; /* one request per connection */
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
        HttpConn *c = h->data;
        (void) suggested;
        *b = uv_buf_init(c->buf, sizeof c->buf);
}

static void conn_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
        HttpConn *c = st->data;
        if (n < 0) {
                conn_close(c);
                return;
        }
        if (n == 0 || c->answered)
                return;
        size_t done = http_parser_execute(&c->parser, &settings, b->base, (size_t) n);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->answered || (done == (size_t) n && e == HPE_OK))
                return;
        HttpReply r = { 0 };
        if (c->url_too_long)
                http_reply_text(&r, 414, "the path is too long\n");
        else if (e == HPE_HEADER_OVERFLOW)
                http_reply_text(&r, 431, "request headers too large\n");
        else
                http_reply_text(&r, 400, "not an HTTP request\n");
        conn_answer(c, &r);
}

static void conn_timeout(uv_timer_t *t) {
        conn_close(t->data);
}

static void on_connection(uv_stream_t *l, int status) {
        HttpServer *s = l->data;
        if (status < 0 || s->closing)
                return;
        HttpConn *c = calloc(1, sizeof *c);
        if (!c)
                return;
        c->srv = s;
        if (uv_tcp_init(l->loop, &c->tcp) < 0) {
                free(c);
                return;
        }
        c->tcp.data = c;
        c->open = 1;
        c->next = s->conns;
        s->conns = c;
        s->nconns++;
        s->open++;
        if (uv_timer_init(l->loop, &c->timer) == 0) {
                c->timer.data = c;
                c->open++;
        }
        if (uv_accept(l, (uv_stream_t *) &c->tcp) < 0 || c->open < 2 || s->nconns > HTTP_MAX_CONNS) {
                /* Over the bound (or a failure): the connection is closed at once. */
                if (c->open < 2)
                        uv_close((uv_handle_t *) &c->tcp, conn_closed);
                else
                        conn_close(c);
                return;
        }
        http_parser_init(&c->parser, HTTP_REQUEST);
        c->parser.data = c;
        (void) uv_timer_start(&c->timer, conn_timeout, HTTP_TIMEOUT_MS, 0);
        if (uv_read_start((uv_stream_t *) &c->tcp, conn_alloc, conn_read) < 0)
                conn_close(c);
}

static int parse_addr(const char *spec, struct sockaddr_storage *ss, char *err, size_t n) {
        char host[128];
        const char *colon = strrchr(spec, ':');
        if (!colon || colon[1] == '\0') {
                snprintf(err, n, "bad --http address '%s' (expected HOST:PORT, [V6]:PORT or :PORT)", spec);
                return -EINVAL;
        }
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 0 || port > 65535) {
                snprintf(err, n, "bad port in --http '%s'", spec);
                return -EINVAL;
        }
        size_t hl = (size_t) (colon - spec);
        if (hl >= sizeof host) {
                snprintf(err, n, "bad --http address '%s'", spec);
                return -EINVAL;
        }
        memcpy(host, spec, hl);
        host[hl] = '\0';
        if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
                host[hl - 1] = '\0';
                if (uv_ip6_addr(host + 1, (int) port, (struct sockaddr_in6 *) ss) == 0)
                        return 0;
        } else if (uv_ip4_addr(hl ? host : "0.0.0.0", (int) port, (struct sockaddr_in *) ss) == 0)
                return 0;
        snprintf(err, n, "bad --http address '%s' (a numeric IPv4 or [IPv6] address)", spec);
        return -EINVAL;
}

int http_start(uv_loop_t *loop, const char *addr, HttpHandler fn, void *ud, HttpServer **ret, char *err,
               size_t errlen) {
        struct sockaddr_storage ss;
        int r = parse_addr(addr, &ss, err, errlen);
        if (r < 0)
                return r;
        settings = (http_parser_settings) { .on_url = on_url, .on_message_complete = on_message_complete };
        http_parser_set_max_header_size(HTTP_MAX_HEADERS);
        HttpServer *s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->fn = fn;
        s->ud = ud;
        r = uv_tcp_init(loop, &s->listener);
        if (r < 0) {
                free(s);
                return r;
        }
        s->listener.data = s;
        s->open = 1;
        r = uv_tcp_bind(&s->listener, (const struct sockaddr *) &ss, 0);
        if (r == 0)
                r = uv_listen((uv_stream_t *) &s->listener, 64, on_connection);
        if (r < 0) {
                snprintf(err, errlen, "cannot listen on %s: %s", addr, uv_strerror(r));
                http_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

int http_port(const HttpServer *s) {
        struct sockaddr_storage ss;
        int len = sizeof ss;
        if (uv_tcp_getsockname(&s->listener, (struct sockaddr *) &ss, &len) < 0)
                return -1;
        return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *) &ss)->sin6_port)
                                        : ntohs(((struct sockaddr_in *) &ss)->sin_port);
}

static void listener_closed(uv_handle_t *h) {
        server_release(h->data);
}

HttpServer *http_free(HttpServer *s) {
        if (!s || s->closing)
                return NULL;
        s->closing = true;
        for (HttpConn *c = s->conns; c; c = c->next)
                conn_close(c);
        uv_close((uv_handle_t *) &s->listener, listener_closed);
        return NULL;
}
