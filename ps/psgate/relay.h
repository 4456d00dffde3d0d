/* SPDX-License-Identifier: Apache-2.0 */
/* psgate's relay: the edge clients' one front door (docs/federated.md, "One
 * front door"). A client dials psgate alone, over CURVE, and sends each
 * message with a 4-byte first frame naming its far end: pscoord
 * (NETMUX_COORD) or a shard by id (netsock.h, NetMux). psgate checks it
 * (a message an edge client may send there, its role as its handshake
 * admitted it), stamps the client's key and name on it (Header.relay_key:
 * pscoord and the shards take it as the client's own, from a gateway's key
 * only) and sends it on a connection of that client's own to that end, so
 * that pscoord and the shards see one peer per client, as without psgate.
 * The answers come back the same way with the same first frame.
 *
 * Where the shards are, psgate learns from the shard maps pscoord sends its
 * clients (CONFIG), and it strips their addresses and keys before the
 * clients see them: the shards' addresses never leave the cluster. A
 * client silent for idle_s is forgotten (its connections closed); pscoord
 * has dropped its session by then. */
#pragma once
#include <stdint.h>
#include <uv.h>
#include "keys.h"
#include "metrics.h"

typedef struct RelayConfig {
        const char *listen;             /* the front door (clients dial it) */
        const char *coord;              /* pscoord */
        const NetIdentity *id;          /* psgate's keys and pscoord's (NULL: no CURVE) */
        unsigned max_clients;           /* clients at once; more are refused */
        unsigned idle_s;                /* a client silent this long is forgotten */
        uint64_t max_msg;               /* the largest frame a client may send */
} RelayConfig;

typedef struct Relay Relay;

/* Binds the front door on loop (zctx made by the caller, its ZAP handler
 * first when id is set). */
int relay_new(uv_loop_t *loop, void *zctx, const RelayConfig *cfg, Relay **ret);
Relay *relay_free(Relay *r);
void relay_metrics(const Relay *r, MetricsBuf *b);
/* One line for systemctl status. */
void relay_status(const Relay *r, char *buf, size_t n);
