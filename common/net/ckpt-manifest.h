/* SPDX-License-Identifier: Apache-2.0 */
/* A checkpoint's manifest (CheckpointManifest in psnet.proto), the file that
 * makes a directory of shard files a checkpoint: pscoord writes it last,
 * atomically, once every shard's file is on disk. On disk: "PSNETMF1", the
 * CRC-32 of the message, its length, then the message (protobuf). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "psnet.pb-c.h"

#define CKPT_MANIFEST "MANIFEST"
#define CKPT_NAME_MAX 64
#define CKPT_MANIFEST_MAX (16u << 20)

/* Whether name is a checkpoint name: 1..64 of [A-Za-z0-9._-], not starting
 * with '.' (so never a path). */
bool ckpt_name_valid(const char *name);
/* The shard file's name in a checkpoint ("shard-ID.ckpt"). */
void ckpt_shard_file(unsigned shard, char *buf, size_t n);

/* Writes dir/MANIFEST atomically (tmp, fsync, rename, fsync dir): 0 or a
 * negative errno with err saying what failed. */
int ckpt_manifest_write(const char *dir, const Psnet__CheckpointManifest *m, char *err, size_t errn);
/* Reads and checks dir/MANIFEST (magic, length, CRC, protobuf): free with
 * psnet__checkpoint_manifest__free_unpacked. -ENOENT when there is none. */
int ckpt_manifest_read(const char *dir, Psnet__CheckpointManifest **ret, char *err, size_t errn);
/* The same from bytes (the fuzz target's entry). */
int ckpt_manifest_parse(const uint8_t *buf, size_t n, Psnet__CheckpointManifest **ret, char *err, size_t errn);
