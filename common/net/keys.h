/* SPDX-License-Identifier: Apache-2.0 */
/* CURVE keys and the allow-list, as `psctl keys gen` writes them into a keys
 * directory:
 *
 *   DIR/NAME.key   this peer's key pair (mode 0600): lines "name = ...",
 *                  "role = ...", "public = <Z85>", "secret = <Z85>"
 *   DIR/NAME.pub   its allow-list line (mode 0644)
 *   DIR/allow      the allow-list: one "ROLE PUBLIC-KEY-Z85 NAME" per line
 *                  ('#' comments); pscoord and psd admit these keys only
 *
 * Clients find pscoord's public key in DIR/pscoord.pub (or DIR/pscoord.key).
 * Roles: admin (psctl), server (psd, pscoord, shard-to-shard), worker, edge. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "netsock.h"
#include "psnet.pb-c.h"

#define KEYS_FINGERPRINT_LEN 17 /* 16 hex digits and a NUL */

typedef struct AllowEntry {
        Psnet__Role role;
        uint8_t key[32];
        char name[64];
} AllowEntry;

typedef struct AllowList {
        AllowEntry *entries;
        size_t n;
} AllowList;

/* "admin", "server", "worker", "edge", "gateway" <-> roles; -EINVAL for anything else. */
int role_from_name(const char *s, Psnet__Role *ret);
const char *role_name(Psnet__Role r);

/* The first 8 bytes of SHA-256(key) in hex: how logs name a key. */
void keys_fingerprint(const uint8_t key[32], char out[KEYS_FINGERPRINT_LEN]);

/* Loads DIR/NAME.key. On failure writes why into err (a missing file names the
 * psctl command that makes it); -ENOENT, -EINVAL, -EACCES. */
int keys_load_pair(const char *dir, const char *name, NetKeyPair *ret, Psnet__Role *ret_role, char *err,
                   size_t errlen);
/* pscoord's public key from DIR/NAME.pub or DIR/NAME.key. */
int keys_load_public(const char *dir, const char *name, uint8_t ret[32], char *err, size_t errlen);
/* Parses DIR/allow. err names the file and line of a bad entry. */
int allowlist_load(const char *dir, AllowList *ret, char *err, size_t errlen);
void allowlist_done(AllowList *a);
const AllowEntry *allowlist_find(const AllowList *a, const uint8_t key[32]);

/* A program's CURVE identity with --keys: its key pair and role, pscoord's
 * public key (for clients of pscoord). */
typedef struct NetIdentity {
        bool enabled;
        NetKeyPair keys;
        Psnet__Role role;
        uint8_t coord_key[32];
        bool has_coord_key;
} NetIdentity;

/* Loads DIR/key_name.key and, when coord_name is given, pscoord's public key.
 * want_role (NONE: any) must be the key's role. Writes why into err. */
int keys_identity_load(NetIdentity *id, const char *dir, const char *key_name, const char *coord_name,
                       Psnet__Role want_role, char *err, size_t errlen);

/* Whether a daemon may listen on endpoint: with keys anything goes; without,
 * tcp:// only on a loopback address unless insecure. -EPERM with a reason. */
int keys_check_listen(const char *endpoint, const NetIdentity *id, bool insecure, char *err, size_t errlen);

/* Makes a key pair NAME with role in dir (created 0700 if missing): writes
 * NAME.key (0600, refusing to overwrite), NAME.pub and appends to DIR/allow.
 * *ret_line gets the allow-list line (static storage). */
int keys_generate(const char *dir, const char *name, Psnet__Role role, const char **ret_line, char *err,
                  size_t errlen);
