/* psnet status codes (the wire's Status enum) and their human names. */
#pragma once
#include "psnet.pb-c.h"

/* "ok", "malformed", "version", ... for logs and psctl. */
const char *status_name(int status);
/* Maps a negative errno from the codec to the wire status to send back. */
int status_from_errno(int err);
