/* SPDX-License-Identifier: Apache-2.0 */
/* psctl probe: a daemon's /healthz or /readyz over HTTP/1.0, for a health
 * check where no HTTP client is installed (the image's HEALTHCHECK). See
 * psctl.h. */
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "endpoint.h"
#include "macro.h"
#include "psctl.h"

/* The daemons' HTTP ports of the port scheme (deploy/README.md): pscoord, psd, workerd. */
static const char *const scheme[] = { "127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102" };

/* Waits until fd is ready for events (POLLIN, POLLOUT) before deadline (a
 * monotonic time in ms): 0, or -ETIMEDOUT, or a negative errno. */
static int wait_fd(int fd, short events, uint64_t deadline) {
        uint64_t now = now_ms();
        struct pollfd p = { .fd = fd, .events = events };
        int n = poll(&p, 1, now >= deadline ? 0 : (int) MIN(deadline - now, (uint64_t) INT32_MAX));
        return n > 0 ? 0 : n == 0 ? -ETIMEDOUT : -errno;
}

/* The address's host and port: HOST:PORT, :PORT (this host), [V6]:PORT,
 * each perhaps after http:// and before a path. 0, or -EINVAL. */
static int split_address(const char *address, char *host, size_t hn, char *port, size_t pn) {
        const char *s = strncmp(address, "http://", 7) == 0 ? address + 7 : address;
        size_t len = strcspn(s, "/"), hl = len;
        while (hl > 0 && s[hl - 1] != ':')
                hl--;
        if (hl == 0)
                return -EINVAL; /* no port */
        const char *p = s + hl;
        size_t pl = len - hl;
        hl--; /* the host, before the colon */
        if (pl == 0 || pl >= pn || strspn(p, "0123456789") < pl)
                return -EINVAL;
        if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
                s++;
                hl -= 2;
        }
        if (hl >= hn)
                return -EINVAL;
        if (hl)
                snprintf(host, hn, "%.*s", (int) hl, s);
        else
                snprintf(host, hn, "127.0.0.1");
        snprintf(port, pn, "%.*s", (int) pl, p);
        return 0;
}

/* GET path at address: the HTTP status (> 0), or a negative errno; the
 * first line of the body into body. */
static int get(const char *address, const char *path, unsigned timeout_s, char *where, size_t wn, char *body,
               size_t bn) {
        char host[256], port[16];
        if (split_address(address, host, sizeof host, port, sizeof port) < 0)
                return -EINVAL;
        snprintf(where, wn, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
        if (getaddrinfo(host, port, &hints, &res) != 0 || !res)
                return -EHOSTUNREACH;
        uint64_t deadline = now_ms() + 1000ull * timeout_s;
        int r = -ECONNREFUSED, fd = -1;
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
                fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
                if (fd < 0) {
                        r = -errno;
                        continue;
                }
                if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
                        r = -errno;
                        close(fd);
                        fd = -1;
                        continue;
                }
                int e = 0;
                socklen_t el = sizeof e;
                r = wait_fd(fd, POLLOUT, deadline);
                if (r == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
                        r = -errno;
                if (r == 0 && e)
                        r = -e;
                if (r < 0) {
                        close(fd);
                        fd = -1;
                }
        }
        freeaddrinfo(res);
        if (fd < 0)
                return r;
        char req[512], resp[1024];
        int qn = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s:%s\r\nUser-Agent: psctl/" PSNET_VERSION
                          "\r\n\r\n", path, host, port);
        size_t sent = 0, got = 0;
        r = 0;
        while (r == 0 && sent < (size_t) qn) {
                ssize_t w = send(fd, req + sent, (size_t) qn - sent, MSG_NOSIGNAL);
                if (w > 0)
                        sent += (size_t) w;
                else if (w < 0 && errno == EAGAIN)
                        r = wait_fd(fd, POLLOUT, deadline);
                else
                        r = w < 0 ? -errno : -EPIPE;
        }
        /* HTTP/1.0: the answer ends where the daemon closes the connection. */
        while (r == 0 && got < sizeof resp - 1) {
                ssize_t k = recv(fd, resp + got, sizeof resp - 1 - got, 0);
                if (k > 0)
                        got += (size_t) k;
                else if (k == 0)
                        break;
                else if (errno == EAGAIN)
                        r = wait_fd(fd, POLLIN, deadline);
                else
                        r = -errno;
        }
        close(fd);
        if (r < 0)
                return r;
        resp[got] = '\0';
        int status = 0;
        if (sscanf(resp, "HTTP/1.%*1[01] %3d", &status) != 1 || status < 100)
                return -EPROTO;
        const char *b = strstr(resp, "\r\n\r\n");
        snprintf(body, bn, "%.*s", b ? (int) strcspn(b + 4, "\r\n") : 0, b ? b + 4 : "");
        return status;
}

int psctl_probe(const char *address, bool ready, unsigned timeout_s, bool json) {
        const char *path = ready ? "/readyz" : "/healthz";
        const char *const *try = address ? &address : scheme;
        size_t n = address ? 1 : ELEMENTSOF(scheme);
        char body[160] = "", at[300] = "", where[300];
        int status = -ECONNREFUSED;
        for (size_t i = 0; i < n && status != 200; i++) {
                int s = get(try[i], path, timeout_s, where, sizeof where, body, sizeof body);
                if (s == -EINVAL) {
                        fprintf(stderr, "psctl probe: '%s' is no HTTP address (HOST:PORT, :PORT or http://HOST:PORT, "
                                "as the daemons' --http)\n", try[i]);
                        return -EINVAL;
                }
                /* Another port's answer, or a refusal where none answered. */
                if (s > 0 || status < 0) {
                        status = s;
                        snprintf(at, sizeof at, "%s", where);
                }
        }
        if (!address && status < 0)
                snprintf(at, sizeof at, "127.0.0.1:9100,9101,9102");
        if (json) {
                json_t *o = status > 0 ? json_pack("{s:s,s:s,s:i,s:s}", "address", at, "path", path, "status", status,
                                                   "body", body)
                                       : json_pack("{s:s,s:s,s:n,s:s}", "address", at, "path", path, "status", "error",
                                                   strerror(-status));
                char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
                json_decref(o);
                if (!t)
                        return -ENOMEM;
                printf("%s\n", t);
                free(t);
        } else if (status > 0)
                printf("%s%s: %d %s\n", at, path, status, body);
        else if (address)
                fprintf(stderr, "psctl probe: %s%s: %s\n", at, path, strerror(-status));
        else
                fprintf(stderr, "psctl probe: nothing answers %s on 127.0.0.1:9100, 9101 or 9102 (%s): give the "
                        "daemon's --http address\n", path, strerror(-status));
        return status == 200 ? 0 : -EIO;
}
