/* psd's event loop: the data-plane ROUTER (PULL/PUSH from workers), the link to
 * pscoord (registration, heartbeats, job/map/membership updates) and signals. */
#pragma once
#include <stdint.h>

typedef struct PsdConfig {
        char *listen;              /* data-plane endpoint to bind */
        char *advertise;           /* endpoint workers should use (default: listen) */
        char *coord;               /* pscoord endpoint */
        unsigned id;               /* shard id (>= 1) */
        unsigned connect_timeout;  /* seconds to wait for pscoord at start */
        uint64_t max_msg;          /* largest message accepted, bytes */
        char *log_level;
} PsdConfig;

/* Runs until SIGTERM/SIGINT. Returns 0 after a clean shutdown, or a negative
 * errno after logging why it could not start or go on. */
int psd_run(const PsdConfig *cfg);
