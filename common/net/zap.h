/* SPDX-License-Identifier: Apache-2.0 */
/* Who may talk to a psnet daemon that runs with --keys: the ZAP handler (ZeroMQ's
 * authentication protocol, RFC 27) admits a CURVE connection only when its key
 * is in the allow-list with one of the roles this daemon serves, and stamps
 * the connection's User-Id with "ROLE FINGERPRINT NAME KEY", which wire_recv hands
 * to every message (WireMsg.peer). zap_may_send then says, per message type,
 * which roles may send it. Refusals are logged with the key's fingerprint,
 * at most 10 lines per 10 s (then a count). */
#pragma once
#include <stdbool.h>
#include <uv.h>
#include "keys.h"
#include "wire.h"

typedef struct Zap Zap;

/* Binds the ZAP endpoint in zctx (before the daemon's sockets bind) and loads
 * dir/allow. roles: WIRE_ROLE(...) of the roles this daemon admits. */
int zap_new(uv_loop_t *loop, void *zctx, const char *dir, unsigned roles, Zap **ret, char *err, size_t errlen);
/* Reads the allow-list again (SIGHUP); the old one stays on error. */
int zap_reload(Zap *z, char *err, size_t errlen);
/* A daemon's SIGHUP: zap_reload, its outcome logged (z NULL: no --keys,
 * nothing to reload, said so). */
void zap_sighup(Zap *z);
/* A daemon's CURVE identity and allow-list from --keys keys_dir (NULL: none):
 * its key key_name in role, the public key of the server it dials
 * (server_key_name; NULL: none) into id, the ZAP handler admitting roles into
 * *ret; then whether it may listen on `listen` (keys_check_listen, insecure).
 * -EINVAL, logged with the reason, for a configuration that cannot run. */
int zap_daemon_keys(uv_loop_t *loop, void *zctx, const char *keys_dir, const char *key_name,
                    const char *server_key_name, Psnet__Role role, unsigned roles, const char *listen, bool insecure,
                    NetIdentity *id, Zap **ret);
size_t zap_keys(const Zap *z);
Zap *zap_free(Zap *z);

/* May a peer of this role send this message type to pscoord (at_coord) or to
 * psd, as the message table (wire.c) says? Without keys (role NONE)
 * everything may. */
bool zap_may_send(Psnet__Role role, int type, bool at_coord);
/* The daemon's check on every message: without keys (id NULL or disabled)
 * anything is allowed; with keys the sender's role must be one that may send
 * this type. -EACCES with a reason naming the role and the message. */
int zap_authorize(const NetIdentity *id, const WireMsg *m, bool at_coord, char *reason, size_t n);

/* The roles that may send it, for a refusal's reason ("admin", "server or
 * worker"). */
const char *zap_roles_for(int type, bool at_coord, char *buf, size_t n);
