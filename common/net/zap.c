/* SPDX-License-Identifier: Apache-2.0 */
/* See zap.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "endpoint.h"
#include "log.h"
#include "zap.h"
#include "zwatch.h"

#define ZAP_LOG_WINDOW_MS 10000
#define ZAP_LOG_PER_WINDOW 10

struct Zap {
        ZWatch *watch;
        char *dir;
        unsigned roles;
        AllowList allow;
        uint64_t window_start;
        unsigned logged, suppressed;
        uint64_t admitted, refused;
};

/* Logs a refusal unless this window's lines are spent (then counts it). */
static void zap_log_refusal(Zap *z, const char *fmt, const char *a, const char *b, const char *c) {
        uint64_t now = now_ms();
        if (now - z->window_start > ZAP_LOG_WINDOW_MS) {
                if (z->suppressed)
                        log_warning("refused connections not logged count=%u seconds=%u", z->suppressed,
                                    ZAP_LOG_WINDOW_MS / 1000);
                z->window_start = now;
                z->logged = z->suppressed = 0;
        }
        if (z->logged++ < ZAP_LOG_PER_WINDOW)
                log_warning(fmt, a, b, c);
        else
                z->suppressed++;
}

static int send_part(void *s, const void *data, size_t n, bool more) {
        return zmq_send(s, data, n, more ? ZMQ_SNDMORE : 0) < 0 ? -errno : 0;
}

/* One ZAP request: version, request id, domain, address, identity, mechanism,
 * credentials. */
static void zap_readable(ZWatch *w, void *ud) {
        Zap *z = ud;
        void *s = zwatch_socket(w);
        zmq_msg_t part[8];
        size_t n = 0;
        bool more = true;
        while (more) {
                zmq_msg_t m;
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
                        zmq_msg_close(&m);
                        if (n == 0)
                                return;
                        break;
                }
                more = zmq_msg_more(&m);
                if (n < 8)
                        part[n++] = m;
                else
                        zmq_msg_close(&m);
        }
        const char *status = "400", *text = "not admitted";
        char user[200] = "";
        if (n >= 7 && zmq_msg_size(&part[5]) == 5 && memcmp(zmq_msg_data(&part[5]), "CURVE", 5) == 0 &&
            zmq_msg_size(&part[6]) == 32) {
                const uint8_t *key = zmq_msg_data(&part[6]);
                char fp[KEYS_FINGERPRINT_LEN], addr[64];
                keys_fingerprint(key, fp);
                snprintf(addr, sizeof addr, "%.*s", (int) MIN(zmq_msg_size(&part[3]), sizeof addr - 1),
                         (const char *) zmq_msg_data(&part[3]));
                const AllowEntry *e = allowlist_find(&z->allow, key);
                if (!e) {
                        zap_log_refusal(z, "refused a connection: key not in the allow-list key=%s address=%s%s", fp,
                                        addr[0] ? addr : "local", "");
                        text = "key not in the allow-list";
                } else if (!(z->roles & WIRE_ROLE(e->role))) {
                        zap_log_refusal(z, "refused a connection: role %s is not served here key=%s name=%s",
                                        role_name(e->role), fp, e->name);
                        text = "role not served here";
                } else {
                        char z85[41];
                        zmq_z85_encode(z85, key, 32);
                        status = "200";
                        text = "OK";
                        snprintf(user, sizeof user, "%s %s %s %s", role_name(e->role), fp,
                                 e->name[0] ? e->name : "-", z85);
                }
        } else {
                zap_log_refusal(z, "refused a connection: it does not use CURVE%s%s%s", "", "", "");
                text = "CURVE required";
        }
        if (status[0] == '2')
                z->admitted++;
        else
                z->refused++;
        int r = 0;
        if (n >= 2) {
                r |= send_part(s, "1.0", 3, true);
                r |= send_part(s, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), true);
                r |= send_part(s, status, 3, true);
                r |= send_part(s, text, strlen(text), true);
                r |= send_part(s, user, strlen(user), true);
                r |= send_part(s, "", 0, false);
        }
        if (r < 0)
                log_warning("Failed to answer a ZAP request");
        zwatch_kick(w);
        for (size_t i = 0; i < n; i++)
                zmq_msg_close(&part[i]);
}

int zap_new(uv_loop_t *loop, void *zctx, const char *dir, unsigned roles, Zap **ret, char *err, size_t errlen) {
        Zap *z = calloc(1, sizeof *z);
        if (!z)
                return -ENOMEM;
        z->roles = roles;
        z->dir = strdup(dir);
        if (!z->dir) {
                free(z);
                return -ENOMEM;
        }
        int r = allowlist_load(dir, &z->allow, err, errlen);
        void *s = NULL;
        if (r == 0) {
                s = zmq_socket(zctx, ZMQ_REP);
                int zero = 0;
                if (!s || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) < 0 ||
                    zmq_bind(s, "inproc://zeromq.zap.01") < 0) {
                        r = -errno;
                        snprintf(err, errlen, "cannot start the ZAP handler: %s", zmq_strerror(errno));
                }
        }
        if (r == 0)
                r = zwatch_new(loop, s, zap_readable, z, &z->watch);
        if (r < 0) {
                if (s)
                        zmq_close(s);
                zap_free(z);
                return r;
        }
        *ret = z;
        return 0;
}

int zap_reload(Zap *z, char *err, size_t errlen) {
        return allowlist_load(z->dir, &z->allow, err, errlen);
}

void zap_sighup(Zap *z) {
        char err[256];
        if (!z)
                log_info("SIGHUP: nothing to reload (no --keys)");
        else if (zap_reload(z, err, sizeof err) < 0)
                log_error("SIGHUP: the allow-list did not load; the old one stays reason=\"%s\"", err);
        else
                log_info("SIGHUP: allow-list reloaded keys=%zu", zap_keys(z));
}

int zap_daemon_keys(uv_loop_t *loop, void *zctx, const char *keys_dir, const char *key_name,
                    const char *server_key_name, Psnet__Role role, unsigned roles, const char *listen, bool insecure,
                    NetIdentity *id, Zap **ret) {
        char err[512];
        if (keys_dir) {
                int r = keys_identity_load(id, keys_dir, key_name, server_key_name, role, err, sizeof err);
                if (r == 0)
                        r = zap_new(loop, zctx, keys_dir, roles, ret, err, sizeof err);
                if (r < 0) {
                        log_error("cannot use the keys reason=\"%s\"", err);
                        return -EINVAL;
                }
        }
        if (keys_check_listen(listen, id, insecure, err, sizeof err) < 0) {
                log_error("%s", err);
                return -EINVAL;
        }
        if (!id->enabled && listen && endpoint_is_loopback_tcp(listen))
                log_warning("listening on %s without --keys: any user of this host can connect, join, push "
                            "gradients or stop the job (an ipc:// address in a folder of your own, or --keys, "
                            "keeps them out)", listen);
        return 0;
}

size_t zap_keys(const Zap *z) {
        return z->allow.n;
}

Zap *zap_free(Zap *z) {
        if (!z)
                return NULL;
        zwatch_close(z->watch);
        allowlist_done(&z->allow);
        free(z->dir);
        free(z);
        return NULL;
}

/* --- which role sends what: the message table's (wire.c) ---------------------------- */

static unsigned allowed_roles(int type, bool at_coord) {
        const WireType *t = wire_type(type);
        return !t ? 0 : at_coord ? t->at_coord : t->at_shard;
}

bool zap_may_send(Psnet__Role role, int type, bool at_coord) {
        if (role == PSNET__ROLE__ROLE_NONE)
                return true;
        return (allowed_roles(type, at_coord) & WIRE_ROLE(role)) != 0;
}

const char *zap_roles_for(int type, bool at_coord, char *buf, size_t n) {
        unsigned m = allowed_roles(type, at_coord);
        static const Psnet__Role order[] = { PSNET__ROLE__ROLE_ADMIN, PSNET__ROLE__ROLE_SERVER,
                                             PSNET__ROLE__ROLE_WORKER, PSNET__ROLE__ROLE_EDGE,
                                             PSNET__ROLE__ROLE_STRATEGY };
        size_t k = 0;
        buf[0] = '\0';
        for (size_t i = 0; i < ELEMENTSOF(order); i++)
                if (m & WIRE_ROLE(order[i]))
                        k += (size_t) snprintf(buf + k, k < n ? n - k : 0, "%s%s", k ? " or " : "", role_name(order[i]));
        if (!m)
                snprintf(buf, n, "no one");
        return buf;
}

int zap_authorize(const NetIdentity *id, const WireMsg *m, bool at_coord, char *reason, size_t n) {
        char roles[64];
        if (!id || !id->enabled)
                return 0;
        if (m->peer.role == PSNET__ROLE__ROLE_NONE) {
                snprintf(reason, n, "the connection is not authenticated");
                return -EACCES;
        }
        int type = m->hdr ? (int) m->hdr->type : -1;
        if (zap_may_send(m->peer.role, type, at_coord))
                return 0;
        snprintf(reason, n, "role %s may not send %s (%s only)", role_name(m->peer.role), wire_type_name(type),
                 zap_roles_for(type, at_coord, roles, sizeof roles));
        return -EACCES;
}
