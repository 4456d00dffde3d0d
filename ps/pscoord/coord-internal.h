/* SPDX-License-Identifier: Apache-2.0 */
/* pscoord's state, shared by its files (not installed, not used outside
 * ps/pscoord/). The files form layers, each calling only the ones below it
 * (tests/layout-check.py checks the order; docs/ARCHITECTURE.md, "pscoord"):
 *
 *   boundary.c          a fence's arithmetic: the clock boundary (pure)
 *   coord-reply.c       answers and messages to one peer
 *   coord-peers.c       the member registry: find, count, sort, remove
 *   coord-history.c     the job's accuracy by epoch and its heartbeats
 *   coord-map.c         the shard map: building it, adding and removing
 *                       shards, the CONFIG every peer is sent
 *   coord-rounds.c      a federated job's rounds as data: records, views,
 *                       restoring, sending a round to shards and edges
 *   coord-state.c       pscoord's own state on disk (--state-dir)
 *   coord-boundary.c    fences and the boundaries they pick
 *   coord-job.c         the job's lifecycle: start, fail, done, stop, replace
 *   coord-secagg.c      secure aggregation's exchanges within a round
 *   coord-fedasync.c    fedasync's tasks and buffers
 *   coord-checkpoint.c  checkpoints: save, --checkpoint-every, list, restore
 *   coord-fed.c         a federated job's rounds, driven
 *   coord-members.c     registration, leases, heartbeats, results, drains,
 *                       stragglers, membership changes, a shard lost
 *   coord-admin.c       psctl's status and mode; /metrics
 *   coord.c             the loop: the control socket, the handler table,
 *                       the tick, and the flush of the loop turn's flags
 *
 * A lower file that needs something of a higher one done sets a flag
 * (coord_todo: save the state, publish, drive the rounds, step a
 * checkpoint), and coord.c does it once per loop turn, in one order
 * (Redis's clusterBeforeSleep with its flags is the model): a burst of
 * events saves and publishes once. */
#pragma once
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>
#include "alloc.h"
#include "boundary.h"
#include "coord.h"
#include "dispatch.h"
#include "endpoint.h"
#include "errors.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "netsock.h"
#include "rdp.h"
#include "schedule.h"
#include "service.h"
#include "shardmap.h"
#include "wire.h"
#include "wire-job.h"
#include "zap.h"

#define COORD_MAX_PEERS 4096
#define COORD_MAX_FRAME (256 << 10)  /* control messages are small: a job spec is a few KiB */
#define COORD_MAX_MESSAGE (4u * COORD_MAX_FRAME) /* its frames together (fdguard_message_bound) */
#define COORD_MAX_STRAGGLERS 64

typedef struct Peer {
        uint32_t id;
        Psnet__Role role;
        zmq_msg_t route;
        char *endpoint;
        uint8_t public_key[32];     /* shards with --keys: the key workers expect */
        bool has_key;
        uint64_t last_seen;
        uint64_t sole_warned;       /* shards: the silence already logged as waited out (holding a sole copy) */
        uint32_t pid;
        char host[64];              /* the peer's host name, as it registered */
        uint32_t rank;
        Psnet__ShardInfo shard;     /* last reported stats (endpoint and stragglers not owned: NULL) */
        uint32_t stragglers[COORD_MAX_STRAGGLERS];  /* shards: members the others wait on */
        size_t nstragglers;
        uint64_t stalled_ms;
        uint64_t memory_limit, max_msg; /* shards: from their registration */
        Psnet__WorkerInfo worker;
        bool done;
        bool member;                /* counted by the shards' gates */
        int64_t start_clock;        /* clock it started at */
        bool drain;
        bool detached;              /* known from the state file, not registered with this pscoord yet */
        uint64_t rejoin_until;      /* ms: a detached peer's lease runs out then */
        int64_t hist_clock;         /* workers: the clock of its last sample in the history */
        uint32_t hist_seq;          /* workers: heartbeats with a new clock this job (coord-history.c) */
} Peer;

/* A change agreed at a clock boundary: pscoord fences the shards, learns their
 * clocks, picks the boundary and publishes the change with it. */
typedef struct Fence {
        bool active;
        uint64_t seq, deadline, retry_at;
        size_t replies, expected;
        FenceClocks clocks;         /* the shards' answers so far */
        bool mode_change;
        ConsistencyMode mode;
        uint32_t staleness;
        bool checkpoint;            /* for a checkpoint: its boundary, no change published */
} Fence;

/* A checkpoint being saved (coord-checkpoint.c). */
typedef struct CkptSave {
        bool active, automatic, dir_made;
        bool fed_wait;              /* a federated job's: waits for the round under way to end */
        char name[65];
        int64_t clock;              /* its boundary, once the fence answered */
        uint64_t seq, started, deadline;
        size_t expected, replies;
        Psnet__CheckpointFile *files;
        size_t nfiles;
        zmq_msg_t route;            /* psctl waiting for the answer */
        bool has_route;
        uint64_t route_seq;
        enum { FENCE_NONE, FENCE_ANSWERED, FENCE_GAVE_UP } fence; /* its fence's outcome, for coord_checkpoint_step */
        FenceClocks clocks;         /* the shards' answers to it */
        char abandoned[65];         /* a save the last pscoord left unfinished (state file): its files go */
} CkptSave;

/* psctl checkpoint list's check of every byte of each checkpoint against its
 * checksums (coord-checkpoint.c): in the thread pool, one checkpoint at a
 * time, so pscoord's loop never waits on the disk. A checkpoint never changes
 * once its manifest is written, so a result is kept by name and creation time. */
#define COORD_CKPT_CHECKS 64
typedef struct CkptCheck {
        char name[65];
        uint64_t created_ms;
        enum { CHECK_PENDING, CHECK_OK, CHECK_BAD } state;
        char error[320];            /* CHECK_BAD: the file and what is wrong */
} CkptCheck;

typedef struct CkptChecks {
        CkptCheck known[COORD_CKPT_CHECKS];
        size_t n;
        bool busy;                  /* the thread pool checks known[at] */
        size_t at;
        uv_work_t work;
        char dir[4096];             /* known[at]'s folder: the thread's input */
        int result;                 /* the thread's output: 0, or negative with why */
        char why[320];
} CkptChecks;

/* The checkpoint the job was restored from: the shards load it. */
typedef struct RestoreFrom {
        bool active;
        char name[65];
        char dir[4096];
        int64_t clock, base_clock;
        uint64_t samples_before;
        uint32_t workers;
} RestoreFrom;

/* The job's test accuracy after each epoch (coord-history.c). */
#define COORD_EPOCH_HISTORY 1024
typedef struct EpochRec {
        uint32_t epoch, worker;     /* after epoch epochs, evaluated by worker */
        float accuracy, test_loss, train_loss; /* the losses NaN when not reported */
        float auc;                  /* NaN when not reported (a model of classes, not a binary one) */
        float seconds;              /* since the job started */
        int64_t clock;              /* of the weights evaluated */
} EpochRec;

/* The job's heartbeats (coord-history.c): the last COORD_CLOCK_HISTORY, all
 * of the job thinned out evenly (ClockSample in psnet.proto). */
#define COORD_CLOCK_HISTORY 4096
typedef struct ClockRec {
        uint32_t worker, seq;       /* seq: the worker's Peer.hist_seq */
        int64_t clock, spread;
        float seconds, loss, samples_per_s; /* loss NaN when not finite */
        float lr;                   /* NaN: no shard applied an update yet */
} ClockRec;

/* A federated job's rounds (coord-fed.c). A shard opening or closing one is
 * waited for at least FED_SHARD_WAIT_MS. */
#define FED_SHARD_WAIT_MS 30000u
#define COORD_FED_HISTORY 1024
/* FED_SCORING (krum, multi-krum): between TRAINING and CLOSING, the shards
 * send the squared distances between the updates over their chunks;
 * pscoord adds them up, picks by Krum score and closes with those kept.
 * FED_TESTING: after an aggregated round, sampled clients test its model on
 * their own data (--fraction-evaluate), then WAITING. FED_AGGREGATING
 * (--strategy custom): between TRAINING and CLOSING, the job's strategy
 * process reads the updates from the shards and pushes the round's delta. */
typedef enum { FED_WAITING, FED_OPENING, FED_TRAINING, FED_UNMASKING, FED_CLOSING, FED_EVALUATING, FED_DONE,
               FED_TESTING, FED_SCORING, FED_AGGREGATING } FedPhase;

/* A --secagg round's exchanges (coord-secagg.c), by the clients' places in
 * FedRounds.clients (n of them). U1: sent keys; U2: sent their shares; the
 * survivors: answered with an update (FedRounds.answered). */
typedef struct FedSecAgg {
        uint32_t stage;             /* 1 keys, 2 shares, 3 masked updates (FED_TRAINING), 4 unmask (FED_UNMASKING) */
        uint64_t deadline;          /* of stages 1, 2 and 4 */
        uint32_t t;                 /* shares that rebuild a seed */
        size_t n, n1, n2, nrevealed;
        uint64_t weight;            /* W of secagg.h: over U2 */
        bool *u1, *u2, *revealed;
        uint8_t *x;                 /* Shamir x of each member of U1 (its place in U1 + 1) */
        uint8_t (*mask_pk)[32], (*share_pk)[32];
        uint64_t *examples;         /* said at stage 1 */
        uint8_t *boxes;             /* [from * n + to]: SECAGG_BOX bytes each */
        bool *has_box;
        uint8_t (*shares)[32];      /* [revealer * n + of] */
} FedSecAgg;

typedef struct FedRecord {
        uint64_t number;
        uint32_t round, sampled, answered, late, dropped, available, refused;
        float loss, seconds;
        double epsilon;             /* after this round (private jobs; < 0: none) */
        uint64_t bytes_up, bytes_raw; /* the answered updates' frames as sent, and as f32 */
        float accuracy;             /* the model after it, tested by an edge worker (< 0: not tested) */
        float fed_accuracy, fed_loss; /* tested by clients on their own data, example-weighted (< 0: not) */
        uint64_t fed_examples;
        uint32_t fed_clients;
        char note[96];
} FedRecord;

/* --mode fedasync: a client's task (the model version it trains on) and,
 * once answered, its update waiting in the buffer (coord-fedasync.c). */
typedef struct FedTask {
        uint32_t client;
        uint64_t number;
        uint32_t version;           /* aggregations done when it was given */
        uint64_t started_ms;
        uint64_t examples, bytes;
        float loss;
        uint8_t key[32];            /* its CURVE key when given */
} FedTask;

typedef struct FedRounds {
        FedPhase phase;
        uint64_t number;            /* the round open, or the last one opened (0: none yet) */
        uint32_t done;              /* rounds aggregated */
        uint32_t *clients;          /* sampled, ascending id */
        bool *answered;
        bool *declined;             /* sent no update, and said why (MSG_ROUND_REP decline) */
        uint64_t *examples;
        float *loss;
        size_t nclients, nanswered;
        bool *shard_replied;        /* opening, closing: parallel to shard_ids */
        uint32_t *shard_ids;        /* the shards the opening or close went to (the map then) */
        size_t replies, expected;
        uint64_t shard_number;      /* the number of the opening or close the shards answer */
        bool aggregate;             /* the close aggregates (else it drops the updates) */
        uint8_t *closing;           /* that close, packed, until the round is recorded (on disk first) */
        size_t closing_len;
        uint64_t opened_ms, deadline, shard_deadline, retry_at;
        uint32_t shard_failures;    /* closes in a row a shard refused */
        uint64_t failed, late, refused;
        /* FED_SCORING: the updates scored (their places in clients) and the
         * squared distances summed so far ([a * nscored + b]) */
        size_t *scored, nscored;
        double *dist;
        /* FED_AGGREGATING: the strategy process asked (its id; 0: none yet) */
        uint32_t strategy_asked;
        bool said_strategy;
        /* FED_TESTING: the answers so far, example-weighted */
        double test_acc, test_loss;
        uint64_t test_examples;
        uint32_t test_round;
        bool said_waiting, said_shards;
        FedRecord hist[COORD_FED_HISTORY]; /* a ring: the last nhist records end at hist_end */
        size_t nhist, hist_end;
        RdpAccount privacy;         /* --dp-noise: the aggregated rounds' RDP (common/rdp.h) */
        double epsilon;             /* spent so far, at the job's dp_delta */
        FedSecAgg sa;
        /* fedasync */
        FedTask *tasks, *buf;       /* given and not answered; answered and not applied */
        size_t ntasks, cap_tasks, nbuf, cap_buf;
        size_t applying;            /* the first of buf, in the close under way */
        uint64_t last_apply_ms;
        bool said_async;
} FedRounds;

typedef struct Coord {
        const CoordConfig *cfg;
        void *zctx;
        Job job;
        JobState state;
        Peer *peers;
        size_t npeers;
        uint32_t next_worker_id;
        ShardMap *map;
        uint64_t map_epoch, members_epoch;
        uint64_t first_map_epoch;   /* the job's first map: its copies start from the seed */
        uint32_t *prev_ids;         /* membership before the pending boundary */
        size_t nprev;
        int64_t switch_clock;       /* 0: no boundary pending */
        Fence fence;
        uint64_t fence_seq;
        float accuracy;
        bool has_accuracy;
        Schedule sched;             /* the job's epochs in clocks (common/schedule.h) */
        bool sched_lost;            /* a member left before finishing: count again */
        uint32_t evaluator;         /* the worker evaluating the final weights (0: none) */
        size_t finished;            /* workers that reported reaching the job's end */
        char fail_reason[512];      /* why the job failed (state FAILED) */
        char left_reason[232];      /* "worker N: why", of the last worker that left failing */
        struct { uint32_t pid; char host[64]; } evicted[COORD_MAX_STRAGGLERS]; /* not admitted again this job */
        size_t nevicted;
        uint64_t evicted_ms;         /* the job's last eviction: new workers wait (coord_join_wait_ms) */
        uint64_t registrations, expiries, evictions, requests, refused;
        uint64_t hb_gap_max[2];      /* ms: the longest silence between heartbeats, [0] workers, [1] shards */
        uint64_t sole_waits;         /* shards silent past their lease, waited on for holding a sole copy */
        AllocPurge purge;            /* freed memory given back after connections closed, messages refused */
        uint64_t closed;             /* control connections closed */
        LogWindow closed_lines;      /* their log lines */
        LogWindow join_lines;        /* registrations refused while new workers wait after an eviction */
        uint32_t failovers;         /* this job's: shards lost and replaced by their backups */
        uint32_t lost_shards;       /* of those, not yet replaced by a shard that registered (--keep-standby) */
        /* Each shard's last word on its table rows (ShardInfo.rows_whole_epoch),
         * kept past its lease: a shard lost while it was still putting a
         * fail-over's rows back on all their copies may have held a row's last. */
        struct RowsWhole {
                uint32_t shard;
                uint64_t epoch;
        } *rows_whole;
        size_t nrows_whole;
        uint32_t rows_moves;        /* map changes that moved table rows (psctl shard add/remove) */
        uint64_t rows_move_epoch;   /* the map epoch of the last */
        uint32_t rows_leaving;      /* the shard it removed, handing its rows over (one copy; 0: none) */
        uint64_t failover_ms;       /* when the last one was published */
        uint64_t weights_digest;    /* of the final weights, from the evaluator (0: none) */
        CkptSave ckpt;
        RestoreFrom restore;
        CkptChecks checks;
        FedRounds fed;
        EpochRec epochs[COORD_EPOCH_HISTORY]; /* ascending epochs: the last nepochs */
        size_t nepochs;
        ClockRec *clocks;           /* COORD_CLOCK_HISTORY of them, allocated with the first */
        size_t nclocks;
        uint32_t clock_stride;      /* a worker's every stride-th heartbeat is recorded (a power of 2) */
        struct { bool valid; char name[65]; int64_t clock; uint64_t bytes, created_ms; } last_ckpt;
        int64_t ckpt_next_clock;    /* --checkpoint-every: the clock the next one waits for */
        uint64_t ckpt_retry_at;
        uint64_t checkpoints, checkpoint_failures;
        int state_lock;             /* --state-dir: the lock's descriptor (-1: none) */
        uint64_t state_writes, state_failures;
        Histogram latency;          /* handling a control request */
        uint64_t start_ms, job_start_ms, job_end_ms, migrate_start_ms;
        uint64_t last_tick;         /* ms: a longer gap between ticks means pscoord itself stalled */
        uint64_t errors;
        LogLimitBy refusals;        /* the "refused request" lines a flood would repeat, by peer and reason */
        unsigned todo;              /* TODO_* flags: what this loop turn still has to do (coord_flush) */
        uv_loop_t loop;
        uv_timer_t tick;
        uv_prepare_t flush_prepare; /* the flush, before the loop waits for I/O ... */
        uv_check_t flush_check;     /* ... and right after the I/O callbacks */
        NetSock *ctl;
        Service *service;
        NetIdentity id;
        Zap *zap;
} Coord;

/* --- what a loop turn still has to do (coord.c flushes them, in this order) */
enum {
        TODO_SAVE = 1u << 0,            /* the state file (--state-dir); a coord_state_save done clears it */
        TODO_PUBLISH = 1u << 1,         /* the job, map and membership to every peer (saved first) */
        TODO_PUBLISH_STATE = 1u << 2,   /* and the job's state to the workers not yet members */
        TODO_CHECKPOINT = 1u << 3,      /* a save's fence answered or gave up; a save left by a restart */
        TODO_FED_POLL = 1u << 4,        /* drive a federated job's rounds */
};
static inline void coord_todo(Coord *c, unsigned flags) {
        if (flags & (TODO_PUBLISH | TODO_PUBLISH_STATE))
                flags |= TODO_SAVE; /* on disk before any peer acts on it */
        c->todo |= flags;
}

/* --- answers and messages to one peer (coord-reply.c) */
/* Sends h (type and body set by the caller) to route, echoing seq. */
int coord_reply_hdr(Coord *c, const zmq_msg_t *route, Psnet__Header *h, uint64_t seq);
/* A reply of this type without a body. */
int coord_reply(Coord *c, const zmq_msg_t *route, Psnet__MsgType type, uint64_t seq);
/* MSG_JOB_REP with the job's state and, optionally, a message. */
int coord_reply_job(Coord *c, const zmq_msg_t *route, uint64_t seq, const char *message);
/* MSG_ERROR, counted and logged. */
int coord_reply_error(Coord *c, const zmq_msg_t *route, uint64_t seq, int status, const char *reason);

/* --- the member registry (coord-peers.c) */
size_t coord_count_role(const Coord *c, Psnet__Role role);
/* "shard", "worker", "edge" (log lines). */
const char *coord_role_noun(Psnet__Role role);
Peer *coord_find_peer(Coord *c, Psnet__Role role, uint32_t id);
/* The peer that sent a message: matched by its ZeroMQ identity. */
Peer *coord_find_route(Coord *c, const zmq_msg_t *route);
void coord_peer_done(Peer *p);
void coord_remove_peer(Coord *c, Peer *p);
/* Workers in id order (ranks follow this order); only members when
 * members_only. Caller frees. */
Peer **coord_sorted_workers_sel(Coord *c, bool members_only, size_t *ret_n);
Peer **coord_sorted_workers(Coord *c, size_t *ret_n);

/* --- the job's history: accuracy by epoch (coord-history.c) */
void coord_history_reset(Coord *c);
/* Records the evaluations wi reports (epochs' ends, the final weights')
 * that pscoord has not heard yet: true when any was. One outside the job's
 * epochs or with an accuracy outside [0, 1] is logged, counted as an error
 * and ends the look at wi (the ones after it are not recorded either). */
bool coord_history_epoch(Coord *c, uint32_t worker, const Psnet__WorkerInfo *wi);
/* Samples worker p's heartbeat (wi, already in p->worker) when its clock
 * moved since its last sample: clock, loss, samples/s, the spread of the
 * members' clocks and the shards' learning rate. Not kept in the state file: a restarted pscoord starts
 * them again. */
void coord_history_sample(Coord *c, Peer *p);
/* MSG_HISTORY (psctl report): the samples, oldest first. */
void coord_handle_history(Coord *c, WireMsg *m);
/* The records as psctl status and the state file carry them. -ENOMEM, or 0:
 * free with coord_history_view_free. */
typedef struct HistoryView {
        Psnet__EpochRecord *recs, **recp;
        size_t n;
} HistoryView;
int coord_history_view(const Coord *c, HistoryView *v);
void coord_history_view_free(HistoryView *v);
/* Records from the state file: -EBADMSG (err says why) for records out of
 * order or range. */
int coord_history_restore(Coord *c, Psnet__EpochRecord *const *recs, size_t n, char *err, size_t errlen);

/* --- the shard map and the CONFIG it goes out in (coord-map.c) */
/* Sends the job, map and membership to every peer (the flush's: others set
 * TODO_PUBLISH). */
void coord_publish(Coord *c);
/* The same to one peer (one that registered again): nothing changed. */
void coord_publish_peer(Coord *c, Peer *p);
int coord_build_map(Coord *c);
int coord_remap(Coord *c, uint32_t add, uint32_t remove);
/* The copies of every key the job asks for over n shards. */
uint32_t coord_replicas(const Coord *c, size_t n);
void coord_handle_shard_change(Coord *c, WireMsg *m, bool add);
/* Whether shard's table rows were all on their copies under the current
 * map, as it last said (never said: only if no fail-over or move came
 * before); whether every shard of the map said so. */
bool coord_rows_whole(const Coord *c, uint32_t shard);
bool coord_rows_settled(const Coord *c);
/* Why table rows cannot move between shards now (NULL: they can). */
const char *coord_rows_unmovable(const Coord *c);
bool coord_job_fits(Coord *c, char *reason, size_t n);

/* --- a federated job's rounds as data (coord-rounds.c) */
/* The job (re)starts: no round yet. */
void coord_fed_reset(Coord *c);
void coord_fed_free(Coord *c);
/* The open round's sample, answers and exchanges go. */
void coord_rounds_clear(FedRounds *f);
/* Frees (and wipes) the round's secure aggregation exchanges. */
void coord_secagg_clear(FedRounds *f);
void coord_fedasync_free(FedRounds *f);
/* The rounds as psctl sees them (pointers into c, valid until the next
 * event; its records allocated for the history held): for psctl status, the
 * state file and a checkpoint's manifest. -ENOMEM, or 0: free with
 * coord_fed_view_free. */
typedef struct FedView {
        Psnet__FedStatus fs;
        Psnet__RoundRecord *recs, **recp;
        char sampling[96];
} FedView;
int coord_fed_status(Coord *c, FedView *v);

void coord_fed_view_free(FedView *v);
/* A message that keeps a federated job (CoordState, CheckpointManifest): its
 * rounds (v) and the privacy accountant's RDP. */
#define COORD_FED_KEEP(msg, c, v)                               \
        do {                                                    \
                (msg).fed = &(v)->fs;                           \
                (msg).n_fed_rdp = RDP_NORDERS;                  \
                (msg).fed_rdp = (c)->fed.privacy.rdp;           \
                (msg).has_fed_rdp_steps = true;                 \
                (msg).fed_rdp_steps = (c)->fed.privacy.steps;   \
        } while (0)
/* A restarted pscoord takes the rounds from its state file (coord-state.c):
 * counts, history and the privacy spent; the round that was open is gone
 * (the next one gets a higher number), unless its aggregating close had
 * left (CoordState.fed_closing: coord_fed_closing): that close is sent again
 * once the shards are back. 0, or -EBADMSG with the reason. */
int coord_fed_restore(Coord *c, const Psnet__FedStatus *s, const double *rdp, size_t nrdp, uint64_t rdp_steps,
                      char *err, size_t n);
/* A shard of a federated job's map was lost (its backups lead its chunks
 * now): the round in progress is dropped and runs again, or, when it was
 * closing, completes without that shard. */
void coord_fed_shard_lost(Coord *c, uint32_t id);
/* The close a restarted pscoord sends again (CoordState.fed_closing): kept
 * when it is one of round s->number's. 0, or -EBADMSG with the reason. */
int coord_fed_closing(Coord *c, const ProtobufCBinaryData *closing, char *err, size_t n);
/* A federated job restored from a checkpoint starts: its rounds and privacy
 * spent from the checkpoint's manifest (c->restore). */
int coord_fed_resume(Coord *c, char *reason, size_t n);
/* Sends MSG_ROUND to every shard of the map: the round's sample (open) or the
 * clients whose updates count (close; none: drop them), with the seeds of a
 * --secagg close (sa). An aggregating close is written into the state file
 * first (coord-state.c: CoordState.fed_closing). */
int coord_fed_send_shards(Coord *c, bool close, const uint32_t *ids, size_t n, Psnet__SecAgg *sa);
/* Sends rd to every shard of the map; their answers come to shard_rep. */
int coord_fed_send_round(Coord *c, Psnet__Round *rd);
/* rd to one edge worker (p NULL: -ENOTCONN). */
int coord_fed_send_edge(Coord *c, const Peer *p, Psnet__Round *rd);
/* A new round record (the history's ring); the record of a round's number (NULL: none). */
FedRecord *coord_fed_record_new(FedRounds *f);
FedRecord *coord_fed_record_find(FedRounds *f, uint64_t number);
/* An edge worker that can take part (registered, not detached). */
bool coord_fed_available(const Peer *p);
/* --eval-every: asks an edge worker to test the model of the rounds done. */
void coord_fed_evaluate_round(Coord *c);
/* An edge worker tested the model after this many aggregated rounds: the
 * accuracy joins that round's record. */
void coord_fed_accuracy(Coord *c, uint32_t round, float accuracy);

/* --- pscoord's state on disk, --state-dir (coord-state.c) */
/* Locks the directory and loads its state: 1 loaded, 0 none (or no
 * --state-dir), negative errno with err saying why (pscoord does not start). */
int coord_state_open(Coord *c, char *err, size_t n);
/* Writes the state now; a failure is logged and counted. For a change that
 * must be on disk before it is said (a line in the log); others set TODO_SAVE.
 * Written, it clears TODO_SAVE: the file holds every change asked for so far,
 * so the flush does not write it again. */
void coord_state_save(Coord *c);
void coord_state_close(Coord *c);
/* The state in buf (a whole state file) applied to c, which holds none yet:
 * 0 with *ret (free with psnet__coord_state__free_unpacked), or a negative
 * errno with why; c may hold part of it either way (coord_state_forget). */
int coord_state_parse(Coord *c, const uint8_t *buf, size_t n, Psnet__CoordState **ret, char *why, size_t whyn);
/* Frees the peers, membership and map a parse put in c (the fuzz target's). */
void coord_state_forget(Coord *c);

/* --- fences and clock boundaries (coord-boundary.c) */
void coord_fence_start(Coord *c, bool mode_change, ConsistencyMode mode, uint32_t staleness);
void coord_fence_commit(Coord *c);
/* A shard's answer; a checkpoint's fence, answered by all, sets
 * c->ckpt.fenced and TODO_CHECKPOINT. */
void coord_handle_fence_rep(Coord *c, WireMsg *m);
void coord_fence_tick(Coord *c);

/* --- the job's lifecycle (coord-job.c) */
/* The job ends as failed: says why to the log, psctl and every peer. */
void coord_job_fail(Coord *c, const char *reason);
/* Starts the job once the expected shards and workers are there. */
void coord_maybe_start(Coord *c);
/* The evaluating worker (or edge) p reported the final accuracy: the job is done. */
void coord_job_done(Coord *c, Peer *p, const Psnet__WorkerInfo *wi);
/* job becomes the job (numbered after the last one), waiting for its shards
 * and workers; what was known of the last one (failure, evictions, accuracy,
 * the checkpoint it came from) goes. */
void coord_job_replace(Coord *c, const Job *job);
/* The job's state to every peer: the members with the job and map (publish),
 * workers not yet members of anything with the state alone (the flush's). */
void coord_publish_state(Coord *c);
void coord_handle_job_submit(Coord *c, WireMsg *m);
void coord_handle_job_stop(Coord *c, WireMsg *m);

/* --- secure aggregation's exchanges within a round (coord-secagg.c) */
/* The round's clients were told to train: stage 1 starts (keys). */
int coord_secagg_start(Coord *c);
/* Moves the exchanges on at their deadlines or once every client answered:
 * false, or true when the round must close without its updates (stage 1 or 2
 * fell short; why says so) — coord-fed.c closes it. */
bool coord_secagg_poll(Coord *c, uint64_t now, char *why, size_t n);
/* An edge worker's answer in stage 1, 2 or 4 (i: its place in the sample). */
void coord_secagg_rep(Coord *c, WireMsg *m, Peer *p, size_t i);
/* Whether sampled client i may send an update (stage 3, a member of U2 with
 * the example count it said); reason when not. */
bool coord_secagg_may_count(Coord *c, size_t i, uint64_t examples, char *reason, size_t n);
/* Training is over with the survivors in FedRounds.answered: stage 4 asks
 * them for the shares that unmask the sum. */
void coord_secagg_unmask(Coord *c);

/* --- fedasync (coord-fedasync.c) */
/* Hands tasks to idle edge workers, drops tasks past --round-timeout, and
 * applies a buffer on the shards once it holds --buffer updates. Sets the
 * phase to WAITING once the job's rounds are done (the final evaluation). */
void coord_fedasync_poll(Coord *c, uint64_t now);
/* An edge worker's answer to its task. */
void coord_fedasync_rep(Coord *c, WireMsg *m, Peer *p);
/* Every shard answered a buffer's close (aggregate: all applied it). */
void coord_fedasync_closed(Coord *c);

/* --- checkpoints (coord-checkpoint.c) */
int coord_checkpoint_start(Coord *c, const char *name, bool automatic, char *reason, size_t n);
void coord_checkpoint_fenced(Coord *c);
/* A federated job between rounds (coord_fed_poll): a save waiting for that
 * starts. Whether a save holds the next round (or buffer) back. */
bool coord_checkpoint_fed_cut(Coord *c);
void coord_checkpoint_fail(Coord *c, int status, const char *reason);
void coord_checkpoint_tick(Coord *c);
/* Where the job stands for --checkpoint-every: a federated job's rounds
 * aggregated, else its slowest member's clock (-1: no member); and
 * (ret_finishing, may be NULL) whether a member finished training. */
int64_t coord_checkpoint_progress(const Coord *c, bool *ret_finishing);
/* TODO_CHECKPOINT: the fence of a save answered (or gave up), a save a
 * restarted pscoord found unfinished. */
void coord_checkpoint_step(Coord *c);
int coord_checkpoint_restore(Coord *c, const char *name, char *reason, size_t n);
void coord_handle_checkpoint(Coord *c, WireMsg *m);
void coord_handle_checkpoint_rep(Coord *c, WireMsg *m, Peer *p);
void coord_handle_checkpoint_list(Coord *c, WireMsg *m);
void coord_handle_checkpoint_restore(Coord *c, WireMsg *m);

/* --- federated rounds, driven (coord-fed.c) */
/* Drives the rounds: opens one when enough edge workers are connected, closes
 * it when every sampled client answered (or left) or at its time-out, asks for
 * the final evaluation. The flush's (TODO_FED_POLL): the tick and every event
 * that may move the rounds set it. A no-op unless a federated job runs. */
void coord_fed_poll(Coord *c);
/* MSG_ROUND_REP from a shard (a round opened or closed) or an edge worker
 * (its update is on every shard). */
void coord_handle_round_rep(Coord *c, WireMsg *m, Peer *p);
/* Closes the round (phase CLOSING): aggregates when the updates it counts
 * suffice, else drops them; why goes to the log and the round's note. */
void coord_fed_close(Coord *c, const char *why);
/* Rounds sample by Poisson sampling (a private job), not a fixed number. */
bool coord_fed_poisson(const Coord *c);

/* --- membership (coord-members.c) */
void coord_membership_changed(Coord *c);
bool coord_pick_evaluator(Coord *c, Peer *self);
void coord_handle_register(Coord *c, WireMsg *m);
void coord_handle_heartbeat(Coord *c, WireMsg *m, Peer *p);
void coord_handle_result(Coord *c, WireMsg *m, Peer *p);
void coord_handle_drain(Coord *c, WireMsg *m);
/* A peer leaves (MSG_DEREGISTER): answered, removed, and what its leaving changes. */
void coord_handle_deregister(Coord *c, WireMsg *m, Peer *p);
void coord_expire_leases(Coord *c);
void coord_evict_stragglers(Coord *c);
/* Shard id left the cluster (why: for the log): if the map holds it, its
 * keys go to their first backups (a new map epoch, published), or the job
 * fails at once when a key had no other copy. */
void coord_shard_lost(Coord *c, uint32_t id, const char *why);

/* --- psctl's status and mode; /metrics (coord-admin.c) */
void coord_handle_status(Coord *c, WireMsg *m);
void coord_handle_job_mode(Coord *c, WireMsg *m);
void coord_metrics(void *ud, MetricsBuf *b);
void coord_status(void *ud, char *buf, size_t n);

/* --- the loop (coord.c) */
/* Its handler table (dispatch.h), one row per message type it serves. */
extern const DispatchTable coord_dispatch;
/* Does what the loop turn's flags ask (also on a loop of its own, for tests). */
void coord_flush(Coord *c);
