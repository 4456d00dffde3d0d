/* SPDX-License-Identifier: Apache-2.0 */
/* Same-host shared memory between a worker and a shard. Where a shard listens
 * on ipc://PATH it also listens on the unix socket PATH.shm; a worker on the
 * same host creates a sealed memfd, maps it and hands it over there once
 * (SCM_RIGHTS) with a random token. Its PUSH and PULL then name the token and
 * an offset instead of carrying frames: the shard reads the gradients out of
 * that memory and writes the values into it before it answers
 * (docs/data-path.md, "Same-host shared memory"). The connection stays open
 * for the session's life: closing it ends the session. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "wire.h"

#define SHM_MAGIC "PSNSHM1"          /* 8 bytes with its NUL */
#define SHM_MAX_SIZE (64ull << 30)   /* the largest memory a shard maps for one session */
/* How a shard's refusal of a request naming a session it does not hold starts
 * (status INVALID): the worker opens another session and asks again (the shard
 * restarted, or ended the session); nothing was applied. */
#define SHM_NO_SESSION "no shared-memory session"


/* A hello's flags: the session's requests may place each key on its own
 * (Header.shm_keys); a shard that does not know this refuses the hello, and
 * the worker sends frames. */
#define SHM_HELLO_PLACED_KEYS 1u
#define SHM_HELLO_FLAGS SHM_HELLO_PLACED_KEYS

/* The one message a worker sends, with the memfd as ancillary data. */
typedef struct ShmHello {
        char magic[8];
        uint32_t worker;                /* the worker id its requests carry as sender */
        uint32_t flags;                 /* SHM_HELLO_*; a shard refuses others */
        uint8_t token[WIRE_SHM_TOKEN];  /* random: requests name the session with it */
        uint64_t size;                  /* the memfd's size, bytes */
} ShmHello;

/* The handover socket of an ipc:// endpoint, PATH.shm, into buf.
 * -EPROTONOSUPPORT for other schemes, -ENAMETOOLONG past a unix socket's
 * 107 bytes. */
int shm_socket_path(const char *endpoint, char *buf, size_t n);

/* A worker's side of one session. */
typedef struct ShmRegion {
        void *base;              /* NULL: none */
        size_t size;
        int conn;                /* the handover connection (-1: none) */
        bool shared;             /* base is an ShmMemory's (not unmapped on close) */
        uint8_t token[WIRE_SHM_TOKEN];
} ShmRegion;

#define SHM_REGION_INIT { .base = NULL, .size = 0, .conn = -1 }

/* Creates a memfd of size bytes sealed against shrinking and growing, maps it,
 * touches every page (they are the worker's memory) and hands it to the shard
 * at path for worker; waits up to timeout_ms for the shard's answer. On
 * failure reason says why (the caller falls back to frames). */
int shm_region_open(ShmRegion *r, const char *path, uint32_t worker, size_t size, unsigned timeout_ms,
                    char *reason, size_t n);
/* Ends the session (the shard unmaps it when it sees the connection close). */
void shm_region_close(ShmRegion *r);

/* Memory a worker shares with every shard on its host at once: the model's
 * own tensors (the caller's buffers), so that nothing is copied in or out
 * around a round (docs/data-path.md, "Same-host shared memory"). */
typedef struct ShmMemory {
        void *base;              /* NULL: none */
        size_t size;
        int fd;                  /* the memfd, handed to each shard's session */
} ShmMemory;

#define SHM_MEMORY_INIT { .base = NULL, .size = 0, .fd = -1 }

/* A memfd of size bytes sealed against shrinking and growing, mapped and
 * touched (the worker's memory), zeroed. On failure reason says why. */
int shm_memory_new(ShmMemory *m, size_t size, char *reason, size_t n);
void shm_memory_free(ShmMemory *m);
/* A session over memory m (which r then maps no copy of: closing r leaves m
 * as it is) with the shard at path, as shm_region_open. */
int shm_region_share(ShmRegion *r, const ShmMemory *m, const char *path, uint32_t worker, unsigned timeout_ms,
                     char *reason, size_t n);
/* Ends r's session and waits up to timeout_ms until the shard has ended its
 * end: from then on it neither reads nor writes that memory for any request
 * (a shard handles the close between requests). 0, or -ETIMEDOUT when the
 * shard did not answer (it may still touch the memory later). */
int shm_region_fence(ShmRegion *r, unsigned timeout_ms);

/* Whether fd is memory a shard may map: a memfd on shmem (not hugetlbfs,
 * where a fault past the reserve would kill the shard), sealed against
 * shrinking (so it cannot be truncated under the shard's mapping), of exactly
 * size bytes, at most SHM_MAX_SIZE. 0, or -EINVAL and reason. */
int shm_check_fd(int fd, uint64_t size, char *reason, size_t n);
