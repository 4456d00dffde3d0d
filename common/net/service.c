/* See service.h. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "log.h"
#include "macro.h"
#include "service.h"

static const int service_signals[] = { SIGTERM, SIGINT, SIGHUP };

struct Service {
        uv_signal_t sig[ELEMENTSOF(service_signals)];
        unsigned nsig, open;
        ServiceOps ops;
        void *ud;
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

static void service_closed(uv_handle_t *h) {
        Service *s = h->data;
        if (--s->open == 0)
                free(s);
}

/* Every peer connection costs descriptors (a socket, and libzmq's mailbox):
 * the soft limit goes up to the hard one, so 2,000 connections do not run a
 * daemon out of descriptors inside libzmq at the common default of 1024. */
static void service_raise_nofile(void) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return;
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t) 1 << 20 : rl.rlim_max;
        if (rl.rlim_cur < want) {
                rl.rlim_cur = want;
                if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                        log_warning_errno(errno, "Cannot raise the open-files limit to %lu: %m", (unsigned long) want);
        }
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096)
                log_warning("open-files limit is %lu: raise it (LimitNOFILE=, ulimit -n) for more than a few "
                            "hundred peers", (unsigned long) rl.rlim_cur);
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
        service_raise_nofile();
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
        if (s->nsig == 0) {
                free(s);
                return NULL;
        }
        for (unsigned i = 0; i < s->nsig; i++)
                uv_close((uv_handle_t *) &s->sig[i], service_closed);
        return NULL;
}
