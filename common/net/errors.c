/* SPDX-License-Identifier: Apache-2.0 */
/* The table between the wire's Status codes, their names and the errnos
 * psnet's code returns; see errors.h. Each status has one primary errno (used
 * both ways) and may have aliases (errno -> status only). */
#include <errno.h>
#include <stdlib.h>
#include "errors.h"
#include "macro.h"

static const struct {
        int status;
        const char *name;
        int err;            /* primary errno */
        int alias[2];       /* more errnos that mean this status (0: none) */
} table[] = {
        { PSNET__STATUS__STATUS_OK, "ok", 0, { 0, 0 } },
        { PSNET__STATUS__STATUS_MALFORMED, "malformed", EBADMSG, { EPROTO, 0 } },
        { PSNET__STATUS__STATUS_VERSION, "version", EPROTONOSUPPORT, { 0, 0 } },
        { PSNET__STATUS__STATUS_UNKNOWN_KEY, "unknown-key", ENOENT, { 0, 0 } },
        { PSNET__STATUS__STATUS_MOVED, "moved", EREMCHG, { EXDEV, 0 } },
        { PSNET__STATUS__STATUS_SIZE, "size", EMSGSIZE, { E2BIG, 0 } },
        { PSNET__STATUS__STATUS_DTYPE, "dtype", EPROTOTYPE, { EMEDIUMTYPE, 0 } },
        { PSNET__STATUS__STATUS_NO_JOB, "no-job", ENODATA, { 0, 0 } },
        { PSNET__STATUS__STATUS_DUPLICATE, "duplicate", EALREADY, { EEXIST, 0 } },
        { PSNET__STATUS__STATUS_STALE, "stale", ESTALE, { 0, 0 } },
        { PSNET__STATUS__STATUS_UNKNOWN_TYPE, "unknown-type", EOPNOTSUPP, { 0, 0 } },
        { PSNET__STATUS__STATUS_INVALID, "invalid", EINVAL, { ERANGE, EDOM } },
        { PSNET__STATUS__STATUS_UNKNOWN_PEER, "unknown-peer", ESRCH, { 0, 0 } },
        { PSNET__STATUS__STATUS_SHUTTING_DOWN, "shutting-down", ESHUTDOWN, { ECANCELED, 0 } },
        { PSNET__STATUS__STATUS_MIGRATING, "migrating", EAGAIN, { 0, 0 } },
        { PSNET__STATUS__STATUS_INTERNAL, "internal", EIO, { EFAULT, 0 } },
        { PSNET__STATUS__STATUS_RESOURCE, "resource", ENOMEM, { ENOBUFS, ENOSPC } },
        { PSNET__STATUS__STATUS_DENIED, "denied", EACCES, { EPERM, 0 } },
        { PSNET__STATUS__STATUS_NOT_FINITE, "not-finite", EILSEQ, { 0, 0 } },
        { PSNET__STATUS__STATUS_UNAVAILABLE, "unavailable", EHOSTDOWN, { 0, 0 } },
};

const char *status_name(int status) {
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (table[i].status == status)
                        return table[i].name;
        return "unknown";
}

int status_from_errno(int err) {
        err = abs(err);
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (table[i].err == err || (err && (table[i].alias[0] == err || table[i].alias[1] == err)))
                        return table[i].status;
        return PSNET__STATUS__STATUS_INTERNAL;
}

int status_to_errno(int status) {
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (table[i].status == status)
                        return -table[i].err;
        return -EPROTO;
}
