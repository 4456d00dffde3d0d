/* SPDX-License-Identifier: Apache-2.0 */
/* The shard's half of same-host shared memory (common/net/shm.h): the PATH.shm
 * socket beside an ipc:// data endpoint, the sessions handed over on it (one
 * connection and one mapping each, ended when the connection closes), and
 * the lookup a PUSH or PULL naming a session goes through. Bounded: at most
 * PSD_SHM_MAX_SESSIONS connections, each of which must say hello within
 * PSD_SHM_HELLO_MS. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include "psnet.pb-c.h"

#define PSD_SHM_MAX_SESSIONS 256
#define PSD_SHM_HELLO_MS 5000

typedef struct ShmServer ShmServer;

/* Listens beside listen_endpoint (ipc://PATH: PATH.shm, with the data socket's
 * permissions). Other schemes: 0 and *ret NULL (no shared memory there). */
int shm_server_new(uv_loop_t *loop, const char *listen_endpoint, ShmServer **ret);
ShmServer *shm_server_free(ShmServer *s);

/* Closes connections that have not said hello in time (call it from a timer). */
void shm_server_tick(ShmServer *s, uint64_t now);

/* The bytes [offset, offset + bytes) of worker's session token, or NULL with
 * a reason: no such session (or another worker's), or outside its memory. */
uint8_t *shm_server_at(ShmServer *s, ProtobufCBinaryData token, uint32_t worker, uint64_t offset, uint64_t bytes,
                       char *reason, size_t n);

/* Where each of a shared-memory request's keys (esize-byte values) lies: at
 * its own place (h->shm_keys: a worker's own tensors) or one after another
 * from h->shm_offset. An array of h->n_keys pointers to free, or NULL with
 * reason (the request's bytes must lie in the sender's session). */
uint8_t **shm_server_keys(ShmServer *s, const Psnet__Header *h, size_t esize, char *reason, size_t n);

size_t shm_server_sessions(const ShmServer *s);
uint64_t shm_server_refused(const ShmServer *s);
