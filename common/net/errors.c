/* Names of the wire's Status codes and the mapping from our negative-errno
 * convention to the status a daemon sends back in an error reply. */
#include <errno.h>
#include <stdlib.h>
#include "errors.h"

const char *status_name(int status) {
        switch (status) {
        case PSNET__STATUS__STATUS_OK: return "ok";
        case PSNET__STATUS__STATUS_MALFORMED: return "malformed";
        case PSNET__STATUS__STATUS_VERSION: return "version";
        case PSNET__STATUS__STATUS_UNKNOWN_KEY: return "unknown-key";
        case PSNET__STATUS__STATUS_MOVED: return "moved";
        case PSNET__STATUS__STATUS_SIZE: return "size";
        case PSNET__STATUS__STATUS_DTYPE: return "dtype";
        case PSNET__STATUS__STATUS_NO_JOB: return "no-job";
        case PSNET__STATUS__STATUS_DUPLICATE: return "duplicate";
        case PSNET__STATUS__STATUS_STALE: return "stale";
        case PSNET__STATUS__STATUS_UNKNOWN_TYPE: return "unknown-type";
        case PSNET__STATUS__STATUS_INVALID: return "invalid";
        case PSNET__STATUS__STATUS_UNKNOWN_PEER: return "unknown-peer";
        case PSNET__STATUS__STATUS_SHUTTING_DOWN: return "shutting-down";
        case PSNET__STATUS__STATUS_MIGRATING: return "migrating";
        }
        return "unknown";
}

/* The errnos psnet's code uses for each status:
 *   EBADMSG, EPROTO             malformed message
 *   EPROTONOSUPPORT             other protocol version
 *   ENOENT                      key not in the job
 *   EREMCHG, EXDEV              key moved to another shard
 *   EMSGSIZE, E2BIG             frame size / length mismatch
 *   EPROTOTYPE, EMEDIUMTYPE     dtype or codec not supported
 *   ENODATA                     no job configured yet
 *   EALREADY, EEXIST            duplicate push
 *   ESTALE                      clock already closed
 *   EOPNOTSUPP (= ENOTSUP)      message type not served here
 *   ESRCH                       sender not registered
 *   ESHUTDOWN, ECANCELED        shutting down
 * 0 is OK; anything else (EINVAL, ERANGE, ENOMEM, ...) is INVALID.
 * Positive values are accepted as well. */
int status_from_errno(int err) {
        switch (abs(err)) {
        case 0: return PSNET__STATUS__STATUS_OK;
        case EBADMSG:
        case EPROTO: return PSNET__STATUS__STATUS_MALFORMED;
        case EPROTONOSUPPORT: return PSNET__STATUS__STATUS_VERSION;
        case ENOENT: return PSNET__STATUS__STATUS_UNKNOWN_KEY;
        case EREMCHG:
        case EXDEV: return PSNET__STATUS__STATUS_MOVED;
        case EMSGSIZE:
        case E2BIG: return PSNET__STATUS__STATUS_SIZE;
        case EPROTOTYPE:
        case EMEDIUMTYPE: return PSNET__STATUS__STATUS_DTYPE;
        case ENODATA: return PSNET__STATUS__STATUS_NO_JOB;
        case EALREADY:
        case EEXIST: return PSNET__STATUS__STATUS_DUPLICATE;
        case ESTALE: return PSNET__STATUS__STATUS_STALE;
        case EOPNOTSUPP: return PSNET__STATUS__STATUS_UNKNOWN_TYPE;
        case ESRCH: return PSNET__STATUS__STATUS_UNKNOWN_PEER;
        case ESHUTDOWN:
        case ECANCELED: return PSNET__STATUS__STATUS_SHUTTING_DOWN;
        }
        return PSNET__STATUS__STATUS_INVALID;
}
