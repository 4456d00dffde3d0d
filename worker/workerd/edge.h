/* SPDX-License-Identifier: Apache-2.0 */
/* workerd --edge: one federated client (edge.c), on libpsnet's edge API
 * (psnet.h, "Federated edge clients"). Its states, each left by an event:
 *
 *   JOINING  --the federated job-->  LOADING (the process loads the data
 *   once, edge-fleet.c)  -->  IDLE  --pscoord samples it-->  QUEUED (until
 *   the process lends it a model)  -->  PULLING (the round's model)  -->
 *   TRAINING (local epochs in the thread pool, edge-train.c; the model goes
 *   back after)  -->  PUSHING (libpsnet clips, encodes or masks, pushes and
 *   tells pscoord)  -->  IDLE ...
 *   --pscoord asks for a test-->  QUEUED  -->  EVALUATING  -->  IDLE;
 *   the job ends (or SIGTERM)  -->  LEAVING  -->  LEFT
 *
 * A request that comes while the client is busy waits for IDLE; a newer one
 * replaces it. The process (edge-fleet.c) holds one or many such clients
 * (--simulate) and lends each a model for a round or a test: the EdgeHost
 * calls below. The data never leaves the process: only the update does. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>
#include "dataset.h"
#include "model.h"
#include "psnet-internal.h"

typedef enum { E_JOINING, E_LOADING, E_IDLE, E_QUEUED, E_PULLING, E_TRAINING, E_PUSHING, E_EVALUATING, E_LEAVING,
               E_LEFT } EdgeState;
const char *edge_state_name(EdgeState s);

typedef struct Edge Edge;

/* A model the process lends a client for a round or a test: its host
 * params (what a pull writes) and a copy of the pulled weights. */
typedef struct EdgeSlot {
        Model *model;
        float **params, **w0;
} EdgeSlot;

/* What the process does for its clients (edge-fleet.c). */
typedef struct EdgeHost {
        /* e has its job: the data, then edge_data (or edge_fail). */
        void (*job)(Edge *e, const Job *job, void *ud);
        /* e wants a model (a request waits): edge_lend when one is free. */
        void (*want)(Edge *e, void *ud);
        /* e gives the model it was lent back. */
        void (*give_back)(Edge *e, EdgeSlot *s, void *ud);
        /* A round's pull: e wants a buffer to pull the model into
         * (edge_lend_pull when one is free), and gives it back once the model
         * it got holds the pull. NULL: rounds pull into the model lent. */
        void (*want_pull)(Edge *e, void *ud);
        void (*give_back_pull)(Edge *e, float **buf, void *ud);
        /* e has left (r < 0: the reason the process fails). */
        void (*gone)(Edge *e, int r, void *ud);
        void *ud;
} EdgeHost;

/* What a client counts (the process's /metrics and leaving line). */
typedef struct EdgeStats {
        uint64_t rounds, counted, late, clipped;
        uint64_t bytes_sent, bytes_raw;     /* its updates' frames as sent, and as f32 */
} EdgeStats;

/* A client of share part of nparts (of the training set and, for federated
 * evaluation, of the test set), registering with pscoord through opts. */
int edge_new(uv_loop_t *loop, const PsnetEdgeOptions *opts, uint32_t part, uint32_t nparts, const EdgeHost *host,
             Edge **ret);
/* The libpsnet client's context is shared by the process's later clients. */
PsnetEdge *edge_psnet(Edge *e);
/* Closes its libpsnet client: work in the thread pool may still end (run
 * the loop until it has), and the client does nothing more. */
void edge_close(Edge *e);
Edge *edge_free(Edge *e);

/* The data is loaded: mine (nmine indices into train, taken over) is this
 * client's share; test is for pscoord's tests. */
/* test: the test set (NULL: loaded from test_dir, test_limit when pscoord
 * first asks for a test of the global model); own_test: the client's share
 * of it (NULL: its slice of test, edge_test_share). */
void edge_data(Edge *e, const Dataset *train, const Dataset *test, const Dataset *own_test, const char *test_dir,
               uint32_t test_limit, uint32_t *mine, uint32_t nmine);
/* A client's own test samples: share part of nparts of n, contiguous. */
void edge_test_share(uint32_t n, uint32_t part, uint32_t nparts, uint32_t *start, uint32_t *count);
/* The client cannot go on (logged by the caller): it leaves, and r is the
 * process's exit status. */
void edge_fail(Edge *e, int r);
/* The process lends e the model it wanted: whether e took it (false: it
 * wants none any more). */
bool edge_lend(Edge *e, EdgeSlot *s);
/* The process lends e a pull buffer it wanted (a float array per tensor of
 * the job's model): whether e took it. A pull over a slow link holds this,
 * not a model: the model is lent once the pull is in. */
bool edge_lend_pull(Edge *e, float **buf);
/* Stop (SIGTERM): leave once the work under way is done. */
void edge_stop(Edge *e);

EdgeState edge_state(const Edge *e);
uint32_t edge_part(const Edge *e);
uint32_t edge_examples(const Edge *e);
const EdgeStats *edge_stats(const Edge *e);
/* Sets the log lines' fields to this client's (edge=ID, or part=K before registering). */
void edge_log(const Edge *e);
