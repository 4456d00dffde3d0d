/* SPDX-License-Identifier: Apache-2.0 */
/* The wire's status codes and psnet's negative-errno convention: one table maps
 * each status to its name and to the errno our code uses for it, both ways. */
#pragma once
#include "psnet.pb-c.h"

/* "ok", "malformed", "version", ... for logs and psctl; "unknown" otherwise. */
const char *status_name(int status);
/* The status a daemon answers for a negative (or positive) errno: the table's
 * errnos map to their status, 0 to OK; anything else is INTERNAL. */
int status_from_errno(int err);
/* The negative errno a client returns for a status: -EPROTO for an unknown one. */
int status_to_errno(int status);
