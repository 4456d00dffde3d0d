/* SPDX-License-Identifier: Apache-2.0 */
/* See endpoint.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "endpoint.h"

uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

uint64_t unix_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

/* Tries a connection to the unix socket at path (shorter than sun_path):
 * *err is 0 when one is taken, else connect's errno. -errno when no socket
 * could be made to try with. */
static int unix_try_connect(const char *path, int *err) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        *err = connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0 ? errno : 0;
        close(fd);
        return 0;
}

int endpoint_prepare(const char *endpoint) {
        if (strncmp(endpoint, "ipc://", 6) != 0)
                return 0;
        const char *path = endpoint + 6;
        char dir[108];
        if (strlen(path) >= sizeof dir)
                return -ENAMETOOLONG;
        snprintf(dir, sizeof dir, "%s", path);
        for (char *p = dir + 1; *p; p++) {
                if (*p != '/')
                        continue;
                *p = 0;
                if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                        return -errno;
                *p = '/';
        }
        /* A socket file left by a killed daemon: remove it only if nothing answers. */
        struct stat st;
        if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
                int err, r = unix_try_connect(path, &err);
                if (r < 0)
                        return r;
                if (err == 0)
                        return -EADDRINUSE;
                (void) unlink(path);
        }
        return 0;
}

int endpoint_probe(const char *endpoint, char *why, size_t n) {
        if (strncmp(endpoint, "ipc://", 6) != 0)
                return 0;
        const char *path = endpoint + 6;
        if (strlen(path) >= sizeof(((struct sockaddr_un *) 0)->sun_path)) {
                snprintf(why, n, "the socket path %s is too long", path);
                return -ENAMETOOLONG;
        }
        int err;
        if (unix_try_connect(path, &err) < 0)
                return 0; /* cannot tell */
        switch (err) {
        case 0:
                return 0;
        case ENOENT:
        case ENOTDIR:
                snprintf(why, n, "no socket at %s: nothing listens there (not started, or another address)", path);
                return -ENOENT;
        case ECONNREFUSED:
                snprintf(why, n, "nobody listens on %s: a socket left by a process that stopped", path);
                return -ECONNREFUSED;
        case EACCES:
        case EPERM:
                snprintf(why, n, "permission denied on %s: its folder or socket belongs to another user", path);
                return -EACCES;
        default:
                return 0; /* busy (EAGAIN: its backlog is full) or else: cannot tell */
        }
}

bool endpoint_is_tcp(const char *endpoint) {
        return strncmp(endpoint, "tcp://", 6) == 0;
}

bool endpoint_is_loopback_tcp(const char *endpoint) {
        if (!endpoint_is_tcp(endpoint))
                return false;
        char host[128];
        const char *h = endpoint + 6, *end;
        if (*h == '[') { /* [v6]:port */
                end = strchr(h, ']');
                if (!end)
                        return false;
                h++;
        } else
                end = strrchr(h, ':');
        if (!end || (size_t) (end - h) >= sizeof host)
                return false;
        memcpy(host, h, (size_t) (end - h));
        host[end - h] = '\0';
        if (strcmp(host, "localhost") == 0)
                return true;
        struct in_addr a4;
        struct in6_addr a6;
        if (inet_pton(AF_INET, host, &a4) == 1)
                return (ntohl(a4.s_addr) >> 24) == 127;
        if (inet_pton(AF_INET6, host, &a6) == 1)
                return IN6_IS_ADDR_LOOPBACK(&a6);
        return false;
}

int hostname_ordinal(const char *host, unsigned *ret) {
        const char *dash = host ? strrchr(host, '-') : NULL;
        if (!dash || dash == host || dash[1] == '\0')
                return -EINVAL;
        unsigned long n = 0;
        for (const char *p = dash + 1; *p; p++) {
                if (*p < '0' || *p > '9' || n > 1000000)
                        return -EINVAL;
                n = n * 10 + (unsigned long) (*p - '0');
        }
        if (n > 1000000)
                return -EINVAL;
        *ret = (unsigned) n;
        return 0;
}
