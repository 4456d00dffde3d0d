/* SPDX-License-Identifier: Apache-2.0 */
/* psd's event loop: the data-plane ROUTER (PULL/PUSH from workers, chunk
 * states from other shards), the pscoord session (registration, heartbeats,
 * job/map/membership updates, fences) and signals. The store (psd-store.h),
 * the gate (psd-gate.h) and migration (psd-migrate.h) hold the logic. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct PsdConfig {
        char *listen;              /* data-plane endpoint to bind */
        char *advertise;           /* endpoint workers should use (default: listen) */
        char *coord;               /* pscoord endpoint */
        unsigned id;               /* shard id (>= 1) */
        unsigned connect_timeout;  /* seconds to wait for pscoord at start */
        uint64_t max_msg;          /* largest frame accepted, bytes (a job's own, lower, limit applies once known) */
        uint64_t memory_limit;     /* bytes of values + optimizer state this shard may hold (0: MemAvailable) */
        unsigned park_timeout;     /* seconds a pull may wait for its clock */
        char *http;                /* --http ADDR:PORT for /metrics, /healthz, /readyz (NULL: none) */
        char *keys;                /* --keys DIR (NULL: no CURVE) */
        char *key;                 /* this shard's key name (default psd) */
        char *coord_key;           /* pscoord's key name in keys (default pscoord) */
        bool insecure;             /* listen on a non-loopback tcp:// without keys */
        bool no_shm;               /* --no-shm: no shared memory beside an ipc:// --listen */
        unsigned threads;          /* --threads: threads applying an update (1..PFOR_MAX_THREADS) */
        unsigned idle_timeout;     /* s: a connection silent this long after a ZMTP ping is dropped (0: never) */
} PsdConfig;

/* Runs until SIGTERM/SIGINT. Returns 0 after a clean shutdown, or a negative
 * errno after logging why it could not start or go on. */
int psd_run(const PsdConfig *cfg);

/* The messages a shard's data socket serves (dispatch.h): PULL and PUSH from
 * workers, edges and operators, chunk states and replicated pushes from
 * other shards. */
typedef struct DispatchTable DispatchTable;
extern const DispatchTable psd_dispatch;
