/* See signals.h. */
#include <errno.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include "signals.h"

int signals_open(void) {
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGHUP);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return -errno;
        int fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        return fd < 0 ? -errno : fd;
}

int signals_read(int fd, bool *ret_hup) {
        struct signalfd_siginfo si;
        int stop = 0;
        *ret_hup = false;
        while (read(fd, &si, sizeof si) == (ssize_t) sizeof si) {
                if (si.ssi_signo == SIGHUP)
                        *ret_hup = true;
                else
                        stop = (int) si.ssi_signo;
        }
        return stop;
}
