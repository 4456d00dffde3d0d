/* SPDX-License-Identifier: Apache-2.0 */
/* See keys.h. Key files are read with inih (the daemons' config parser);
 * keys are Z85 as libzmq writes them; fingerprints use libsodium's SHA-256. */
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>
#include "endpoint.h"
#include "keys.h"
#include "log.h"
#include "macro.h"

static const struct {
        Psnet__Role role;
        const char *name;
} roles[] = {
        { PSNET__ROLE__ROLE_ADMIN, "admin" },
        { PSNET__ROLE__ROLE_SERVER, "server" },
        { PSNET__ROLE__ROLE_WORKER, "worker" },
        { PSNET__ROLE__ROLE_EDGE, "edge" },
        { PSNET__ROLE__ROLE_GATEWAY, "gateway" },
        { PSNET__ROLE__ROLE_STRATEGY, "strategy" },
};

int role_from_name(const char *s, Psnet__Role *ret) {
        for (size_t i = 0; s && i < ELEMENTSOF(roles); i++)
                if (strcmp(s, roles[i].name) == 0) {
                        *ret = roles[i].role;
                        return 0;
                }
        return -EINVAL;
}

const char *role_name(Psnet__Role r) {
        for (size_t i = 0; i < ELEMENTSOF(roles); i++)
                if (roles[i].role == r)
                        return roles[i].name;
        return "none";
}

/* libsodium wants sodium_init() before use; it is cheap once done. */
static void keys_sodium(void) {
        if (sodium_init() < 0)
                abort(); /* no usable random source: nothing cryptographic can work */
}

void keys_fingerprint(const uint8_t key[32], char out[KEYS_FINGERPRINT_LEN]) {
        uint8_t h[crypto_hash_sha256_BYTES];
        keys_sodium();
        crypto_hash_sha256(h, key, 32);
        for (int i = 0; i < 8; i++)
                snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* A 40-character Z85 key into 32 bytes. */
static int z85_key(const char *s, uint8_t out[32]) {
        if (!s || strlen(s) != 40 || !zmq_z85_decode(out, s))
                return -EINVAL;
        return 0;
}

typedef struct KeyFile {
        char name[64], role[16], pub[48], sec[48];
        bool unknown;
} KeyFile;

static int keyfile_handler(void *user, const char *section, const char *name, const char *value) {
        KeyFile *k = user;
        (void) section;
        if (strcmp(name, "name") == 0)
                snprintf(k->name, sizeof k->name, "%s", value);
        else if (strcmp(name, "role") == 0)
                snprintf(k->role, sizeof k->role, "%s", value);
        else if (strcmp(name, "public") == 0)
                snprintf(k->pub, sizeof k->pub, "%s", value);
        else if (strcmp(name, "secret") == 0)
                snprintf(k->sec, sizeof k->sec, "%s", value);
        else
                k->unknown = true;
        return 1;
}

static int keyfile_read(const char *path, KeyFile *k, char *err, size_t errlen) {
        memset(k, 0, sizeof *k);
        int r = ini_parse(path, keyfile_handler, k);
        if (r == -1)
                return reason_set(err, errlen, -errno ? -errno : -ENOENT, "cannot read %s: %s", path, strerror(errno));
        if (r != 0 || k->unknown)
                return reason_set(err, errlen, -EINVAL, "%s: not a psnet key file (line %d)", path, r);
        return 0;
}

int keys_load_pair(const char *dir, const char *name, NetKeyPair *ret, Psnet__Role *ret_role, char *err,
                   size_t errlen) {
        char path[4096];
        KeyFile k;
        snprintf(path, sizeof path, "%s/%s.key", dir, name);
        struct stat st;
        if (stat(path, &st) < 0)
                return reason_set(err, errlen, -errno, "no key %s (make one: psctl keys gen %s --role ROLE --dir %s)",
                                path, name, dir);
        /* Group-readable is allowed (0640, 0440): Kubernetes mounts a Secret
         * that way for a pod's fsGroup. Others, or a writing group, are not. */
        if (st.st_mode & 0037)
                return reason_set(err, errlen, -EACCES,
                                "%s is open to others (mode %03o): a secret key must be 0600 or 0640 (chmod 600 %s)",
                                path, (unsigned) (st.st_mode & 0777), path);
        int r = keyfile_read(path, &k, err, errlen);
        if (r < 0)
                return r;
        Psnet__Role role;
        if (z85_key(k.pub, ret->public_key) < 0 || z85_key(k.sec, ret->secret_key) < 0)
                return reason_set(err, errlen, -EINVAL, "%s: public and secret must be 40-character Z85 keys", path);
        if (role_from_name(k.role, &role) < 0)
                return reason_set(err, errlen, -EINVAL, "%s: unknown role '%s' (admin, server, worker, edge, gateway, strategy)", path,
                                k.role);
        /* The public key must be the secret key's. */
        char pub[41], derived[41];
        zmq_z85_encode(pub, ret->public_key, 32);
        if (zmq_curve_public(derived, k.sec) < 0 || strcmp(pub, derived) != 0)
                return reason_set(err, errlen, -EINVAL, "%s: the public key is not the secret key's", path);
        if (ret_role)
                *ret_role = role;
        return 0;
}

int keys_load_public(const char *dir, const char *name, uint8_t ret[32], char *err, size_t errlen) {
        char path[4096], line[256];
        snprintf(path, sizeof path, "%s/%s.pub", dir, name);
        FILE *f = fopen(path, "re");
        if (f) {
                char role[16], pub[48];
                int ok = fgets(line, sizeof line, f) && sscanf(line, "%15s %47s", role, pub) == 2 &&
                         z85_key(pub, ret) == 0;
                fclose(f);
                return ok ? 0 : reason_set(err, errlen, -EINVAL, "%s: expected 'ROLE PUBLIC-KEY NAME'", path);
        }
        KeyFile k;
        snprintf(path, sizeof path, "%s/%s.key", dir, name);
        if (keyfile_read(path, &k, NULL, 0) == 0 && z85_key(k.pub, ret) == 0)
                return 0;
        return reason_set(err, errlen, -ENOENT, "no public key of %s in %s (%s.pub or %s.key)", name, dir, name, name);
}

int allowlist_load(const char *dir, AllowList *ret, char *err, size_t errlen) {
        char path[4096], line[512];
        snprintf(path, sizeof path, "%s/allow", dir);
        FILE *f = fopen(path, "re");
        if (!f)
                return reason_set(err, errlen, -errno, "cannot read the allow-list %s: %s", path, strerror(errno));
        AllowList a = { 0 };
        size_t cap = 0;
        int lineno = 0, r = 0;
        while (fgets(line, sizeof line, f)) {
                lineno++;
                char *p = line + strspn(line, " \t");
                if (*p == '#' || *p == '\n' || *p == '\0')
                        continue;
                char role[16], pub[48], name[64] = "";
                AllowEntry e = { 0 };
                if (sscanf(p, "%15s %47s %63s", role, pub, name) < 2 || role_from_name(role, &e.role) < 0 ||
                    z85_key(pub, e.key) < 0) {
                        r = reason_set(err, errlen, -EINVAL,
                                     "%s:%d: expected 'ROLE PUBLIC-KEY NAME' (role admin, server, worker, edge, gateway or strategy, a "
                                     "40-character Z85 key)", path, lineno);
                        break;
                }
                snprintf(e.name, sizeof e.name, "%s", name);
                if (a.n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        AllowEntry *ne = realloc(a.entries, ncap * sizeof *ne);
                        if (!ne) {
                                r = -ENOMEM;
                                break;
                        }
                        a.entries = ne;
                        cap = ncap;
                }
                a.entries[a.n++] = e;
        }
        fclose(f);
        if (r < 0) {
                allowlist_done(&a);
                return r;
        }
        allowlist_done(ret);
        *ret = a;
        return 0;
}

void allowlist_done(AllowList *a) {
        free(a->entries);
        a->entries = NULL;
        a->n = 0;
}

const AllowEntry *allowlist_find(const AllowList *a, const uint8_t key[32]) {
        keys_sodium();
        for (size_t i = 0; i < a->n; i++)
                if (sodium_memcmp(a->entries[i].key, key, 32) == 0)
                        return &a->entries[i];
        return NULL;
}

/* Writes data to path (created with mode, never overwriting when excl). */
static int write_file(const char *path, const char *data, mode_t mode, bool excl, bool append) {
        int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (excl ? O_EXCL : 0) | (append ? O_APPEND : O_TRUNC);
        int fd = open(path, flags, mode);
        if (fd < 0)
                return -errno;
        size_t n = strlen(data);
        ssize_t w = write(fd, data, n);
        int r = w == (ssize_t) n ? 0 : w < 0 ? -errno : -EIO;
        if (r == 0 && fsync(fd) < 0)
                r = -errno;
        if (close(fd) < 0 && r == 0)
                r = -errno;
        return r;
}

/* mkdir -p: the parents 0755, dir itself 0700 (a key directory). */
static int mkdir_parents(const char *dir) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s", dir) >= (int) sizeof p) {
                errno = ENAMETOOLONG;
                return -1;
        }
        for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
                *s = '\0';
                if (mkdir(p, 0755) < 0 && errno != EEXIST)
                        return -1;
                *s = '/';
        }
        return mkdir(p, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

int keys_generate(const char *dir, const char *name, Psnet__Role role, const char **ret_line, char *err,
                  size_t errlen) {
        static char line[160];
        char pub[41], sec[41], path[4096], body[512];
        if (!name[0] || strlen(name) > 60 || strchr(name, '/') || strchr(name, ' ') || name[0] == '.')
                return reason_set(err, errlen, -EINVAL, "bad key name '%s' (1..60 characters, no '/' or spaces)", name);
        if (mkdir_parents(dir) < 0)
                return reason_set(err, errlen, -errno, "cannot create %s: %s", dir, strerror(errno));
        if (zmq_curve_keypair(pub, sec) < 0)
                return reason_set(err, errlen, -errno, "cannot make a key pair: %s (libzmq without CURVE?)",
                                zmq_strerror(errno));
        snprintf(path, sizeof path, "%s/%s.key", dir, name);
        snprintf(body, sizeof body,
                 "# psnet CURVE key pair: keep this file secret (mode 0600)\nname = %s\nrole = %s\npublic = %s\n"
                 "secret = %s\n",
                 name, role_name(role), pub, sec);
        int r = write_file(path, body, 0600, true, false);
        sodium_memzero(sec, sizeof sec);
        sodium_memzero(body, sizeof body);
        if (r == -EEXIST)
                return reason_set(err, errlen, r, "%s exists: remove it first to make a new key", path);
        if (r < 0)
                return reason_set(err, errlen, r, "cannot write %s: %s", path, strerror(-r));
        snprintf(line, sizeof line, "%s %s %s\n", role_name(role), pub, name);
        snprintf(path, sizeof path, "%s/%s.pub", dir, name);
        r = write_file(path, line, 0644, false, false);
        if (r == 0) {
                snprintf(path, sizeof path, "%s/allow", dir);
                r = write_file(path, line, 0644, false, true);
        }
        if (r < 0)
                return reason_set(err, errlen, r, "cannot write %s: %s", path, strerror(-r));
        *ret_line = line;
        return 0;
}

int keys_identity_load(NetIdentity *id, const char *dir, const char *key_name, const char *coord_name,
                       Psnet__Role want_role, char *err, size_t errlen) {
        memset(id, 0, sizeof *id);
        int r = keys_load_pair(dir, key_name, &id->keys, &id->role, err, errlen);
        if (r < 0)
                return r;
        if (want_role != PSNET__ROLE__ROLE_NONE && id->role != want_role)
                return reason_set(err, errlen, -EINVAL, "%s/%s.key has role %s; this program needs a %s key", dir,
                                key_name, role_name(id->role), role_name(want_role));
        if (coord_name) {
                r = keys_load_public(dir, coord_name, id->coord_key, err, errlen);
                if (r < 0)
                        return r;
                id->has_coord_key = true;
        }
        id->enabled = true;
        return 0;
}

int keys_check_listen(const char *endpoint, const NetIdentity *id, bool insecure, char *err, size_t errlen) {
        if (id->enabled || insecure || !endpoint_is_tcp(endpoint) || endpoint_is_loopback_tcp(endpoint))
                return 0;
        return reason_set(err, errlen, -EPERM,
                        "refusing to listen on %s without encryption: anyone who can reach it could join, push "
                        "gradients or stop the job. Use --keys DIR (keys from psctl keys gen), a loopback address, "
                        "or --insecure on a network you trust", endpoint);
}
