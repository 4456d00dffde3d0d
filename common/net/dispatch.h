/* SPDX-License-Identifier: Apache-2.0 */
/* How a daemon serves the messages that reach its ROUTER: one table per
 * daemon, indexed by message type, each row naming the handler and what it
 * needs (Redis's command table checked once in processCommand is the
 * model). dispatch_message makes every check a row would otherwise repeat,
 * in one order: the sender's role against the message table (wire.c; with
 * --keys), a row for the type, the registered peer a row asks for; then it
 * calls the row's handler. Adding a message type: a row in wire.c's types[]
 * and one here, in the daemon that serves it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "keys.h"
#include "wire.h"

/* peer: what find_peer found for the message (NULL when the row needs none). */
typedef void (*DispatchFn)(void *d, WireMsg *m, void *peer);

typedef struct DispatchRow {
        DispatchFn fn;          /* NULL: the daemon does not serve the type (UNKNOWN_TYPE) */
        bool needs_peer;        /* only from a peer registered with the daemon (else UNKNOWN_PEER) */
        bool ignore;            /* taken and dropped without an answer (answers that belong elsewhere) */
} DispatchRow;

typedef struct DispatchTable {
        const char *daemon;     /* "pscoord", "psd": in reasons */
        bool at_coord;          /* whose roles of the message table apply: pscoord's or a shard's */
        const DispatchRow *rows;/* indexed by Psnet__MsgType */
        size_t nrows;
        /* The registered peer that sent m, or NULL (rows with needs_peer). */
        void *(*find_peer)(void *d, const WireMsg *m);
        const char *no_peer_reason;
} DispatchTable;

/* Serves m (decoded and validated) by t: OK (0) once a row's handler took it
 * or the row ignores it; else the status to answer with, and the reason in
 * reason: DENIED (the sender's role may not send this type here: with id
 * enabled), UNKNOWN_TYPE (no row), UNKNOWN_PEER (the row needs a
 * registered peer and find_peer found none). */
int dispatch_message(const DispatchTable *t, const NetIdentity *id, void *d, WireMsg *m, char *reason, size_t n);
/* The row of type in t, or NULL. */
const DispatchRow *dispatch_row(const DispatchTable *t, int type);
