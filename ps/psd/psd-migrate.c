/* SPDX-License-Identifier: Apache-2.0 */
/* See psd-migrate.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "alloc.h"
#include "errors.h"
#include "log.h"
#include "netsock.h"
#include "psd-migrate.h"
#include "psd-optim.h"

#define MIGRATE_MAX_STASH 65536u

/* A push waiting for a backup's answer to the message of sequence seq. */
typedef struct Waiter {
        uint64_t seq;
        PushReq *req;
} Waiter;

/* The link to one other shard: its DEALER, the last sequence sent on it and
 * the pushes waiting for its answers, oldest first. */
typedef struct Link {
        Migrate *mg;
        uint32_t id;
        char *endpoint;
        NetSock *sock;
        uint64_t seq;
        uint64_t answered;      /* the last sequence answered */
        uint64_t mark;          /* migrate_mark's */
        uint64_t move_lo, move_hi; /* the ROWS_MOVE sent since migrate_mark, by sequence */
        Waiter *w;
        size_t head, n, cap;    /* waiting: w[head .. n) */
} Link;

struct Migrate {
        uv_loop_t *loop;
        void *zctx;
        const NetIdentity *id;
        Gate *gate;             /* the shard's (migrate_attach); its store is the chunks' */
        Store *store;
        Rows *rows;             /* the job's tables (migrate_attach_rows) */
        uint32_t shard_id;
        Link **links;
        size_t nlinks;
        WireMsg *stash;         /* messages sent under a map (or membership) not here yet, in arrival order */
        size_t nstash;
        uint64_t moved_out, moved_in, forwarded, forwarded_bytes, rows_copied;
        uint64_t rows_moved, moves_refused, copies_refused;
};

int migrate_new(uv_loop_t *loop, void *zctx, const NetIdentity *id, uint32_t shard_id, Migrate **ret) {
        Migrate *m = ps_calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        *m = (Migrate) { .loop = loop, .zctx = zctx, .id = id, .shard_id = shard_id };
        *ret = m;
        return 0;
}

void migrate_attach(Migrate *mg, Gate *g) {
        mg->gate = g;
        mg->store = gate_store(g);
}

void migrate_attach_rows(Migrate *mg, Rows *rows) { mg->rows = rows; }

uint64_t migrate_rows_copied(const Migrate *mg) { return mg->rows_copied; }

void migrate_mark(Migrate *mg) {
        for (size_t i = 0; i < mg->nlinks; i++)
                mg->links[i]->mark = mg->links[i]->seq;
}

bool migrate_marked_answered(const Migrate *mg) {
        for (size_t i = 0; i < mg->nlinks; i++)
                if (mg->links[i]->answered < mg->links[i]->mark)
                        return false;
        return true;
}

uint64_t migrate_rows_moved(const Migrate *mg) { return mg->rows_moved; }

uint64_t migrate_unanswered(const Migrate *mg) {
        uint64_t most = 0;
        for (size_t i = 0; i < mg->nlinks; i++)
                most = MAX(most, mg->links[i]->seq - MIN(mg->links[i]->answered, mg->links[i]->seq));
        return most;
}

uint64_t migrate_moves_refused(const Migrate *mg) { return mg->moves_refused; }

uint64_t migrate_copies_refused(const Migrate *mg) { return mg->copies_refused; }

void migrate_moves_end(Migrate *mg) {
        for (size_t i = 0; i < mg->nlinks; i++)
                mg->links[i]->move_lo = mg->links[i]->move_hi = 0;
        mg->moves_refused = 0;
}

/* Takes the oldest push off l: one forward fewer to wait for (the caller
 * settles it). */
static PushReq *link_pop(Link *l) {
        PushReq *req = l->w[l->head++].req;
        req->forwards--;
        return req;
}

/* Settles every push waiting on l with status. */
static void link_release(Link *l, int status) {
        Gate *g = l->mg->gate;
        bool any = l->head < l->n;
        while (l->head < l->n)
                pushreq_settle(g, link_pop(l), status);
        l->head = l->n = 0;
        if (any) /* BSP clocks held for these answers may close now */
                (void) gate_settle(g);
}

/* gone: the peer left (the map or its address), what is queued for it
 * is dropped now, not waited for at exit. */
static void link_free(Link *l, bool gone) {
        if (!l)
                return;
        link_release(l, PSNET__STATUS__STATUS_SHUTTING_DOWN);
        if (gone && l->sock && netsock_set_linger(l->sock, 0) < 0)
                log_debug("cannot set the link's linger shard=%u", l->id);
        netsock_close(l->sock);
        ps_free(l->endpoint);
        ps_free(l->w);
        ps_free(l);
}

Migrate *migrate_free(Migrate *m) {
        if (!m)
                return NULL;
        for (size_t i = 0; i < m->nstash; i++)
                wire_msg_done(&m->stash[i]);
        ps_free(m->stash);
        for (size_t i = 0; i < m->nlinks; i++)
                link_free(m->links[i], false);
        ps_free(m->links);
        ps_free(m);
        return NULL;
}

uint64_t migrate_moved_out(const Migrate *mg) { return mg->moved_out; }
uint64_t migrate_moved_in(const Migrate *mg) { return mg->moved_in; }
uint64_t migrate_forwarded(const Migrate *mg) { return mg->forwarded; }
uint64_t migrate_forwarded_bytes(const Migrate *mg) { return mg->forwarded_bytes; }

uint64_t migrate_waiting(const Migrate *mg) {
        uint64_t n = 0;
        for (size_t i = 0; i < mg->nlinks; i++)
                n += mg->links[i]->n - mg->links[i]->head;
        return n;
}

static int link_wait(Link *l, uint64_t seq, PushReq *req) {
        if (l->n == l->cap) {
                if (l->head > 0) {
                        memmove(l->w, l->w + l->head, (l->n - l->head) * sizeof *l->w);
                        l->n -= l->head;
                        l->head = 0;
                }
                if (l->n == l->cap) {
                        size_t cap = l->cap ? l->cap * 2 : 64;
                        Waiter *w = ps_realloc(l->w, cap * sizeof *w);
                        if (!w)
                                return -ENOMEM;
                        l->w = w;
                        l->cap = cap;
                }
        }
        l->w[l->n++] = (Waiter) { .seq = seq, .req = req };
        req->remaining++;
        req->forwards++;
        return 0;
}

/* --- out ----------------------------------------------------------------------------- */

static void on_link_msg(NetSock *ns, WireMsg *m, int r, void *ud);

/* The link to dest (made on first use). */
static Link *link_for(Migrate *mg, const ShardDesc *dest) {
        for (size_t i = 0; i < mg->nlinks; i++) {
                Link *l = mg->links[i];
                if (l->id != dest->id)
                        continue;
                if (strcmp(l->endpoint, dest->endpoint) == 0)
                        return l;
                /* The shard came back elsewhere: a new connection. */
                link_release(l, PSNET__STATUS__STATUS_UNAVAILABLE);
                link_free(l, true);
                mg->links[i] = mg->links[--mg->nlinks];
                break;
        }
        if (mg->id->enabled && !dest->has_public_key) {
                log_error("the map has no key for shard %u at %s", dest->id, dest->endpoint);
                return NULL;
        }
        Link **n = ps_realloc(mg->links, (mg->nlinks + 1) * sizeof *n);
        if (!n)
                return NULL;
        mg->links = n;
        Link *l = ps_calloc(1, sizeof *l);
        char *ep = ps_strdup(dest->endpoint);
        if (!l || !ep) {
                ps_free(l);
                ps_free(ep);
                return NULL;
        }
        *l = (Link) { .mg = mg, .id = dest->id, .endpoint = ep };
        /* Chunk states and forwarded pushes: unbounded queue, and up to 5 s at
         * close to deliver what is still queued. */
        const NetSockConf nc = { .type = ZMQ_DEALER, .name = dest->endpoint, .linger_ms = 5000,
                                 .keys = mg->id->enabled ? &mg->id->keys : NULL };
        int r = netsock_new(mg->loop, mg->zctx, &nc, on_link_msg, l, &l->sock);
        if (r == 0)
                r = netsock_connect(l->sock, dest->endpoint, mg->id->enabled ? dest->public_key : NULL);
        if (r < 0) {
                link_free(l, true);
                return NULL;
        }
        mg->links[mg->nlinks++] = l;
        return l;
}

/* Sends c's state on l; the sequence used goes to *ret_seq. */
static int send_state(Migrate *mg, Link *l, Chunk *c, bool replica, uint64_t *ret_seq) {
        Store *s = mg->store;
        size_t per = job_state_per_value(&s->job), nf = 2 + c->npending;
        _cleanup_free_ zmq_msg_t *frames = ps_malloc(nf * sizeof *frames);
        _cleanup_free_ uint32_t *workers = ps_malloc((c->npending ? c->npending : 1) * sizeof *workers);
        _cleanup_free_ float *progress = ps_malloc((c->npending ? c->npending : 1) * sizeof *progress);
        if (!frames || !workers || !progress)
                return -ENOMEM;
        int r = store_value_msg(s, c, &frames[0]);
        if (r < 0)
                return r;
        if (zmq_msg_init_size(&frames[1], (size_t) c->len * per * sizeof(float)) < 0) {
                zmq_msg_close(&frames[0]);
                return -ENOMEM;
        }
        if (per)
                memcpy(zmq_msg_data(&frames[1]), c->state, (size_t) c->len * per * sizeof(float));
        for (size_t i = 0; i < c->npending; i++) {
                zmq_msg_init(&frames[2 + i]);
                (void) zmq_msg_copy(&frames[2 + i], &c->pending[i].grad); /* shares the data */
                workers[i] = c->pending[i].worker;
                progress[i] = c->pending[i].progress;
        }
        Psnet__Key key = PSNET__KEY__INIT, *keys[1] = { &key };
        key.tensor = c->tensor;
        key.chunk = c->chunk;
        key.len = c->len;
        Psnet__ChunkState cs = PSNET__CHUNK_STATE__INIT;
        cs.has_steps = cs.has_replica = true;
        cs.steps = c->steps;
        cs.replica = replica;
        cs.n_last_clocks = c->nlast;
        cs.last_clocks = c->last_clock;
        cs.n_pending_workers = c->npending;
        cs.pending_workers = workers;
        cs.n_pending_progress = c->npending;
        cs.pending_progress = progress;
        Psnet__Header h;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHUNK_STATE);
        h.has_job = h.has_epoch = h.has_clock = h.has_sender = h.has_seq = true;
        h.job = s->job.id;
        h.epoch = shardmap_epoch(s->map);
        h.clock = c->clock;
        h.sender = mg->shard_id;
        h.seq = ++l->seq;
        h.n_keys = 1;
        h.keys = keys;
        h.body_case = PSNET__HEADER__BODY_CHUNK_STATE;
        h.chunk_state = &cs;
        r = netsock_send(l->sock, NULL, &h, frames, nf);
        if (r == 0)
                *ret_seq = h.seq;
        return r;
}

void migrate_out(void *userdata, Chunk *c, const ShardDesc *dest, bool replica) {
        Migrate *mg = userdata;
        uint64_t seq;
        Link *l = link_for(mg, dest);
        int r = l ? send_state(mg, l, c, replica, &seq) : -EHOSTUNREACH;
        if (r < 0) {
                log_error_errno(r, "Failed to send chunk (%u,%u) to shard %u at %s: %m", c->tensor, c->chunk, dest->id,
                                dest->endpoint);
                return;
        }
        mg->moved_out++;
        log_debug("chunk sent key=(%u,%u) to=%u clock=%ld parked=%zu as=%s", c->tensor, c->chunk, dest->id,
                  (long) c->clock, c->npending, replica ? "backup" : "primary");
}

typedef struct LedCopies {
        Migrate *mg;
        PushReq *req;
        Link *links[JOB_MAX_REPLICAS];
        size_t nlinks, sent;
} LedCopies;

static void copy_led(Store *s, Chunk *c, void *ud) {
        LedCopies *lc = ud;
        (void) s;
        if (c->backup)
                return;
        for (size_t b = 0; b < lc->nlinks; b++) {
                uint64_t seq;
                if (send_state(lc->mg, lc->links[b], c, true, &seq) < 0 || link_wait(lc->links[b], seq, lc->req) < 0) {
                        log_warning("chunk (%u,%u) of the round not copied to shard %u: its copy stays a round behind "
                                    "until the next", c->tensor, c->chunk, lc->links[b]->id);
                        continue;
                }
                lc->mg->moved_out++;
                lc->sent++;
        }
}

size_t migrate_replicate_led(Migrate *mg, PushReq *req) {
        Store *s = mg->store;
        uint32_t idx[JOB_MAX_REPLICAS];
        LedCopies lc = { .mg = mg, .req = req };
        size_t nb = store_backups(s, idx, JOB_MAX_REPLICAS);
        for (size_t b = 0; b < nb; b++) {
                Link *l = link_for(mg, shardmap_shard(s->map, idx[b]));
                if (l)
                        lc.links[lc.nlinks++] = l;
        }
        if (lc.nlinks)
                store_foreach(s, copy_led, &lc);
        return lc.sent;
}

int migrate_forward(Migrate *mg, PushReq *req, const Psnet__Header *h, const zmq_msg_t *frames_in, bool bf16) {
        Store *s = mg->store;
        uint32_t idx[JOB_MAX_REPLICAS];
        size_t nb = store_backups(s, idx, JOB_MAX_REPLICAS);
        if (nb == 0)
                return PSNET__STATUS__STATUS_OK;
        _cleanup_free_ zmq_msg_t *frames = ps_malloc(h->n_keys * sizeof *frames);
        if (!frames)
                return PSNET__STATUS__STATUS_RESOURCE;
        Psnet__Replicate rep = PSNET__REPLICATE__INIT;
        rep.worker = h->sender;
        rep.has_members_epoch = true;
        rep.members_epoch = mg->gate->members_epoch;
        for (size_t b = 0; b < nb; b++) {
                const ShardDesc *d = shardmap_shard(s->map, idx[b]);
                Link *l = link_for(mg, d);
                if (!l)
                        return PSNET__STATUS__STATUS_UNAVAILABLE;
                for (size_t i = 0; i < h->n_keys; i++) {
                        zmq_msg_init(&frames[i]);
                        (void) zmq_msg_copy(&frames[i], (zmq_msg_t *) &frames_in[i]); /* shares the data */
                }
                Psnet__Header f;
                wire_header_init(&f, PSNET__MSG_TYPE__MSG_REPLICATE);
                f.has_job = f.has_epoch = f.has_clock = f.has_sender = f.has_seq = true;
                f.job = h->job;
                f.epoch = shardmap_epoch(s->map);
                f.clock = h->clock;
                f.has_progress = h->has_progress;
                f.progress = h->progress;
                f.sender = mg->shard_id;
                f.seq = l->seq + 1;
                f.n_keys = h->n_keys;
                f.keys = h->keys;
                f.body_case = PSNET__HEADER__BODY_REPLICATE;
                f.replicate = &rep;
                f.has_dtype = bf16;
                f.dtype = bf16 ? PSNET__DTYPE__DTYPE_BF16 : PSNET__DTYPE__DTYPE_F32;
                uint64_t bytes = 0;
                for (size_t i = 0; i < h->n_keys; i++)
                        bytes += zmq_msg_size(&frames[i]);
                int r = netsock_send(l->sock, NULL, &f, frames, h->n_keys);
                if (r < 0) {
                        log_warning_errno(r, "Failed to forward a push to shard %u: %m", d->id);
                        return PSNET__STATUS__STATUS_UNAVAILABLE;
                }
                l->seq++;
                mg->forwarded++;
                mg->forwarded_bytes += bytes;
                if (link_wait(l, f.seq, req) < 0)
                        return PSNET__STATUS__STATUS_RESOURCE;
        }
        return PSNET__STATUS__STATUS_OK;
}

/* One shard's rows of a copy, in parts (at most 4 MiB each where 64
 * parts hold them): the last part's sequence into *ret_seq. */
/* A message of a table's rows (ROWS_COPY, ROWS_MOVE, ROWS_WANT), the next
 * on l: the job, the map's epoch, clock, this shard, table. */
static Psnet__Header rows_header(const Migrate *mg, const Link *l, Psnet__MsgType type, uint32_t table,
                                 int64_t clock) {
        Psnet__Header h;
        wire_header_init(&h, type);
        h.has_job = h.has_epoch = h.has_clock = h.has_sender = h.has_seq = h.has_table = true;
        h.job = mg->store->job.id;
        h.epoch = shardmap_epoch(mg->store->map);
        h.clock = clock;
        h.sender = mg->shard_id;
        h.seq = l->seq + 1;
        h.table = table;
        return h;
}

/* The frames of n ids and their rows, per floats each (rows NULL: an empty
 * second frame): 0, or -ENOMEM. */
static int rows_frames(zmq_msg_t *f, const int64_t *ids, const float *rows, size_t n, size_t per) {
        if (zmq_msg_init_size(&f[0], n * sizeof *ids) < 0)
                return -ENOMEM;
        if (zmq_msg_init_size(&f[1], rows ? n * per * sizeof *rows : 0) < 0) {
                zmq_msg_close(&f[0]);
                return -ENOMEM;
        }
        if (n)
                memcpy(zmq_msg_data(&f[0]), ids, n * sizeof *ids);
        if (n && rows)
                memcpy(zmq_msg_data(&f[1]), rows, n * per * sizeof *rows);
        return 0;
}

/* The link to shard id of the map (NULL: not in it, or out of memory). */
static Link *link_to(Migrate *mg, uint32_t shard) {
        const ShardMap *m = mg->store->map;
        int at = m ? shardmap_find(m, shard) : -1;
        return at >= 0 ? link_for(mg, shardmap_shard(m, (size_t) at)) : NULL;
}

/* A frame of n int64s from v: 0, -ENOMEM. */
static int i64_frame(zmq_msg_t *f, const int64_t *v, size_t n) {
        if (zmq_msg_init_size(f, n * sizeof *v) < 0)
                return -ENOMEM;
        if (n)
                memcpy(zmq_msg_data(f), v, n * sizeof *v);
        return 0;
}

/* A table clock's copy for one backup: its rows (ids, rows, per floats
 * each) and, for a bounded table (stamps not NULL), their stamps and the
 * ids dropped (gone), in parts; the last part's sequence into *ret_seq. */
static int send_copy(Migrate *mg, Link *l, uint32_t table, int64_t clock, int64_t origin, const int64_t *ids,
                     const float *rows, const int64_t *stamps, size_t n, size_t per, const int64_t *gone,
                     size_t ngone, uint64_t *ret_seq) {
        size_t each = MAX((size_t) WIRE_ROWS_PART_BYTES / (per * sizeof(float)), (size_t) 1);
        each = MAX(each, (n + WIRE_MAX_ROWS_PARTS - 1) / WIRE_MAX_ROWS_PARTS);
        size_t parts = MAX(n ? (n + each - 1) / each : 1, (ngone + WIRE_MAX_ROWS - 1) / WIRE_MAX_ROWS);
        size_t gone_each = (ngone + parts - 1) / parts;
        if (parts > WIRE_MAX_ROWS_PARTS)
                return -E2BIG; /* 64 x 2^20 ids dropped at one clock */
        for (size_t part = 0; part < parts; part++) {
                size_t from = part * each, cnt = MIN(each, n - MIN(from, n));
                size_t gfrom = part * gone_each, gcnt = MIN(gone_each, ngone - MIN(gfrom, ngone));
                zmq_msg_t f[4];
                size_t nf = stamps ? 4 : 2;
                if (rows_frames(f, ids + from, rows + from * per, cnt, per) < 0)
                        return -ENOMEM;
                if (stamps && i64_frame(&f[2], stamps + from, cnt) < 0) {
                        zmq_msg_close(&f[0]);
                        zmq_msg_close(&f[1]);
                        return -ENOMEM;
                }
                if (stamps && i64_frame(&f[3], gone + gfrom, gcnt) < 0) {
                        for (size_t k = 0; k < 3; k++)
                                zmq_msg_close(&f[k]);
                        return -ENOMEM;
                }
                Psnet__Header h = rows_header(mg, l, PSNET__MSG_TYPE__MSG_ROWS_COPY, table, clock);
                h.has_origin = origin >= 0;
                h.origin = origin >= 0 ? (uint32_t) origin : 0;
                h.has_part = h.has_parts = parts > 1;
                h.part = (uint32_t) part;
                h.parts = (uint32_t) parts;
                int r = netsock_send(l->sock, NULL, &h, f, nf);
                if (r < 0)
                        return r;
                l->seq++;
                *ret_seq = h.seq;
        }
        return 0;
}

/* Sends a ROWS_MOVE h of nf frames f on l, one of a move's (its answers
 * awaited by migrate_moves_answered). */
static int send_move(Link *l, Psnet__Header *h, zmq_msg_t *f, size_t nf) {
        int r = netsock_send(l->sock, NULL, h, f, nf);
        if (r < 0)
                return r;
        l->seq++;
        if (!l->move_lo)
                l->move_lo = h->seq;
        l->move_hi = h->seq;
        return 0;
}

int migrate_rows_move(Migrate *mg, uint32_t shard, uint32_t table, int64_t clock, const int64_t *ids,
                      const float *rows, const int64_t *stamps, size_t n, bool last) {
        Link *l = link_to(mg, shard);
        if (!l)
                return -EHOSTUNREACH;
        zmq_msg_t f[3];
        bool bounded = rows_bounded(mg->rows, table); /* its rows' stamps travel with them */
        if (rows_frames(f, ids, rows, n, rows_row_floats(mg->rows, table)) < 0)
                return -ENOMEM;
        if (bounded && i64_frame(&f[2], stamps, stamps && rows ? n : 0) < 0) {
                zmq_msg_close(&f[0]);
                zmq_msg_close(&f[1]);
                return -ENOMEM;
        }
        Psnet__Header h = rows_header(mg, l, PSNET__MSG_TYPE__MSG_ROWS_MOVE, table, clock);
        h.has_last = last;
        h.last = last;
        int r = send_move(l, &h, f, bounded ? 3 : 2);
        if (r == 0)
                mg->rows_moved += n;
        return r;
}

int migrate_rows_record(Migrate *mg, uint32_t shard, uint32_t table, uint32_t worker, int64_t clock, int64_t done,
                        const int64_t *ids, size_t n) {
        Link *l = link_to(mg, shard);
        if (!l)
                return -EHOSTUNREACH;
        zmq_msg_t f[2];
        if (rows_frames(f, ids, NULL, n, 1) < 0)
                return -ENOMEM;
        Psnet__Header h = rows_header(mg, l, PSNET__MSG_TYPE__MSG_ROWS_MOVE, table, clock);
        h.has_origin = h.has_done = true;
        h.origin = worker;
        h.done = done;
        return send_move(l, &h, f, 2);
}

void migrate_rows_want(Migrate *mg, uint32_t shard, uint32_t table, const int64_t *ids, size_t n) {
        Link *l = link_to(mg, shard);
        zmq_msg_t f;
        if (!l || zmq_msg_init_size(&f, n * sizeof *ids) < 0) {
                log_warning("cannot ask shard %u for %zu rows of table %u moving here (they come in their turn)", shard,
                            n, table);
                return;
        }
        memcpy(zmq_msg_data(&f), ids, n * sizeof *ids);
        Psnet__Header h = rows_header(mg, l, PSNET__MSG_TYPE__MSG_ROWS_WANT, table, 0);
        int r = netsock_send(l->sock, NULL, &h, &f, 1);
        if (r < 0) {
                log_warning_errno(r, "Failed to ask shard %u for rows of table %u moving here: %m", shard, table);
                return;
        }
        l->seq++;
}

/* RowsMoveFn over mg's links (rows_want's answers). */
static int move_to(void *ud, uint32_t shard, uint32_t table, int64_t clock, const int64_t *ids, const float *rows,
                   const int64_t *stamps, size_t n, bool last) {
        return migrate_rows_move(ud, shard, table, clock, ids, rows, stamps, n, last);
}

/* Whether shard index j backs the row whose backups (R - 1 of them) are h. */
static bool backs(const int32_t *h, uint32_t R, size_t j) {
        for (uint32_t i = 0; i + 1 < R; i++)
                if (h[i] == (int32_t) j)
                        return true;
        return false;
}

int migrate_rows_copy(Migrate *mg, PushReq *const *reqs, size_t nreqs, uint32_t table, int64_t clock,
                      int64_t origin, const int64_t *ids, size_t n, const int64_t *gone, size_t ngone) {
        const ShardMap *m = mg->store->map;
        uint32_t R = m ? shardmap_replicas(m) : 1;
        int me = m ? shardmap_find(m, mg->shard_id) : -1;
        if (R < 2 || me < 0 || !mg->rows)
                return PSNET__STATUS__STATUS_OK;
        bool bounded = rows_bounded(mg->rows, table);
        size_t per = rows_row_floats(mg->rows, table), ns = shardmap_size(m), nb = n + ngone;
        _cleanup_free_ int64_t *held = ps_malloc(MAX(n, (size_t) 1) * sizeof *held);
        _cleanup_free_ float *all = ps_malloc(MAX(n * per, (size_t) 1) * sizeof *all);
        _cleanup_free_ int64_t *stamps = ps_malloc(MAX(n, (size_t) 1) * sizeof *stamps);
        _cleanup_free_ int32_t *holders = ps_malloc(MAX(nb * (R - 1), (size_t) 1) * sizeof *holders);
        _cleanup_free_ int64_t *sel_ids = ps_malloc(MAX(nb, (size_t) 1) * sizeof *sel_ids);
        _cleanup_free_ float *sel_rows = ps_malloc(MAX(n * per, (size_t) 1) * sizeof *sel_rows);
        _cleanup_free_ int64_t *sel_stamps = ps_malloc(MAX(n, (size_t) 1) * sizeof *sel_stamps);
        if (!held || !all || !stamps || !holders || !sel_ids || !sel_rows || !sel_stamps)
                return PSNET__STATUS__STATUS_RESOURCE;
        n = rows_copy_rows(mg->rows, table, ids, n, held, all, stamps);
        for (size_t k = 0; k < n + ngone; k++)
                for (uint32_t i = 1; i < R; i++)
                        holders[k * (R - 1) + i - 1] =
                                shardmap_row_holder(m, table, k < n ? held[k] : gone[k - n], i);
        for (size_t j = 0; j < ns; j++) {
                if ((int) j == me)
                        continue;
                size_t sel = 0, gsel = 0;
                for (size_t k = 0; k < n; k++) {
                        if (!backs(holders + k * (R - 1), R, j))
                                continue;
                        sel_ids[sel] = held[k];
                        sel_stamps[sel] = stamps[k];
                        memcpy(sel_rows + sel * per, all + k * per, per * sizeof *all);
                        sel++;
                }
                for (size_t k = 0; k < ngone; k++) /* after the rows' ids */
                        if (backs(holders + (n + k) * (R - 1), R, j))
                                sel_ids[sel + gsel++] = gone[k];
                const ShardDesc *d = shardmap_shard(m, j);
                Link *l = link_for(mg, d);
                uint64_t seq = 0;
                int r = l ? send_copy(mg, l, table, clock, origin, sel_ids, sel_rows, bounded ? sel_stamps : NULL, sel,
                                      per, sel_ids + sel, gsel, &seq)
                          : -EHOSTUNREACH;
                if (r < 0) {
                        log_warning_errno(r, "Failed to copy %zu rows of table %u to shard %u: %m", sel, table, d->id);
                        return PSNET__STATUS__STATUS_UNAVAILABLE;
                }
                mg->rows_copied += sel;
                for (size_t q = 0; q < nreqs; q++)
                        if (link_wait(l, seq, reqs[q]) < 0)
                                return PSNET__STATUS__STATUS_RESOURCE;
        }
        return PSNET__STATUS__STATUS_OK;
}

static void link_answer_one(Link *l, uint64_t seq, int status, const Psnet__Header *h);
static void answer_req(Link *l, PushReq *req, int status, const Psnet__Header *h);

/* A backup answered seq: the push waiting on it goes on, and a BSP clock
 * held for it may close (and answer the pulls parked on it). */
static void link_answer(Link *l, uint64_t seq, int status, const Psnet__Header *h) {
        link_answer_one(l, seq, status, h);
        (void) gate_settle(l->mg->gate);
        gate_wake(l->mg->gate);
}

/* A backup answered seq with status; missing: the keys it lacks (MIGRATING). */
static void link_answer_one(Link *l, uint64_t seq, int status, const Psnet__Header *h) {
        Migrate *mg = l->mg;
        l->answered = MAX(l->answered, seq);
        /* Answers come in order: one older than seq is lost (a full queue at the
         * peer); its push is released for the worker to send again. */
        while (l->head < l->n && l->w[l->head].seq < seq)
                pushreq_settle(mg->gate, link_pop(l), PSNET__STATUS__STATUS_UNAVAILABLE);
        /* None waits: a chunk state's answer. Several: a copy of a table's
         * clock, which every push of the clock waits on. */
        while (l->head < l->n && l->w[l->head].seq == seq)
                answer_req(l, link_pop(l), status, h);
}

/* What push req, which waited on a backup's answer, does with it. */
static void answer_req(Link *l, PushReq *req, int status, const Psnet__Header *h) {
        Migrate *mg = l->mg;
        Store *s = mg->store;
        if (status == PSNET__STATUS__STATUS_OK || status == PSNET__STATUS__STATUS_DUPLICATE) {
                pushreq_settle(mg->gate, req, PSNET__STATUS__STATUS_OK);
                return;
        }
        if (req->rows_copy && status != PSNET__STATUS__STATUS_MOVED) {
                /* A backup did not take a table clock's copy: the clock is
                 * closed here, so the workers' retries are duplicates, and
                 * that backup lacks its rows until they are all sent again. */
                mg->copies_refused++;
                log_warning("shard %u did not take a copy of table rows status=%s reason=\"%s\"", l->id,
                            status_name(status), h->reason ? h->reason : "");
                pushreq_settle(mg->gate, req, PSNET__STATUS__STATUS_UNAVAILABLE);
                return;
        }
        if (status == PSNET__STATUS__STATUS_MIGRATING && s->map) {
                /* The backup lacks chunks (its copy is still on the way, or it
                 * lost it): send this shard's state, which includes the push,
                 * and let the push wait for that instead. */
                uint64_t last = 0;
                for (size_t i = 0; i < h->n_keys; i++) {
                        int st;
                        const Psnet__Key *k = h->keys[i];
                        Chunk *c = store_lookup(s, k->tensor, k->chunk, k->len, &st);
                        if (c && send_state(mg, l, c, true, &last) == 0)
                                mg->moved_out++;
                }
                if (last && link_wait(l, last, req) == 0) {
                        log_info("shard %u lacked %zu chunk(s): sent them", l->id, h->n_keys);
                        pushreq_settle(mg->gate, req, PSNET__STATUS__STATUS_OK); /* the wait above holds it */
                        return;
                }
        }
        if (status != PSNET__STATUS__STATUS_MOVED)
                log_warning("shard %u did not take a forwarded push status=%s reason=\"%s\"", l->id,
                            status_name(status), h->reason ? h->reason : "");
        /* MOVED: the backup acts on a newer map; the worker sends again under it. */
        pushreq_settle(mg->gate, req, status == PSNET__STATUS__STATUS_MOVED ? status : PSNET__STATUS__STATUS_UNAVAILABLE);
}

static void on_link_msg(NetSock *ns, WireMsg *m, int r, void *ud) {
        Link *l = ud;
        if (r < 0) {
                log_warning("bad answer from the shard at %s reason=\"%s\"", netsock_name(ns), m->reason);
                return;
        }
        const Psnet__Header *h = m->hdr;
        if (h->type == PSNET__MSG_TYPE__MSG_ERROR && h->status != PSNET__STATUS__STATUS_DUPLICATE)
                log_error("shard at %s refused what we sent status=%s reason=\"%s\"", netsock_name(ns),
                          status_name(h->status), h->reason ? h->reason : "");
        bool answer = h->has_seq && (h->type == PSNET__MSG_TYPE__MSG_REPLICATE_ACK ||
                                     h->type == PSNET__MSG_TYPE__MSG_CHUNK_ACK || h->type == PSNET__MSG_TYPE__MSG_ERROR);
        if (answer && l->move_lo && h->seq >= l->move_lo && h->seq <= l->move_hi &&
            h->status != PSNET__STATUS__STATUS_OK && h->status != PSNET__STATUS__STATUS_DUPLICATE)
                l->mg->moves_refused++; /* rows moved to it (or a copy sent among them) not taken */
        if (answer)
                link_answer(l, h->seq, h->status, h);
}

/* --- in ------------------------------------------------------------------------------ */

static int answer(NetSock *data, const WireMsg *m, Psnet__MsgType type, int status, const char *reason,
                  Psnet__Key **keys, size_t nkeys) {
        Psnet__Header h;
        wire_header_init(&h, type);
        h.has_seq = true;
        h.seq = m->hdr->seq;
        h.has_status = status != PSNET__STATUS__STATUS_OK;
        h.status = status;
        h.reason = (char *) reason;
        h.n_keys = nkeys;
        h.keys = keys;
        return netsock_send(data, &m->route, &h, NULL, 0);
}

/* Whether the sender is the shard the map names (with CURVE, by its key). */
static bool sender_known(Migrate *mg, const WireMsg *m) {
        Store *s = mg->store;
        int i = s->map ? shardmap_find(s->map, m->hdr->sender) : -1;
        if (i < 0)
                return false;
        const ShardDesc *d = shardmap_shard(s->map, (size_t) i);
        return !mg->id->enabled || (d->has_public_key && memcmp(d->public_key, m->peer.key, 32) == 0);
}

/* Whether the sender of a ROWS_MOVE is a shard of the map before the last
 * change (one that left it hands its rows over), with CURVE by its key. */
static bool sender_moves(Migrate *mg, const WireMsg *m) {
        const ShardDesc *d = mg->rows ? rows_prev_shard(mg->rows, m->hdr->sender) : NULL;
        return d && (!mg->id->enabled || (d->has_public_key && memcmp(d->public_key, m->peer.key, 32) == 0));
}

/* Installs a chunk state; returns a status for the answer. */
static int install(Migrate *mg, WireMsg *m, char *reason, size_t n) {
        const Psnet__Header *h = m->hdr;
        const Psnet__Key *k = h->keys[0];
        const Psnet__ChunkState *cs = h->chunk_state;
        ChunkImage im = {
                .tensor = k->tensor, .chunk = k->chunk, .len = k->len, .values = zmq_msg_data(&m->frames[0]),
                .state = zmq_msg_data(&m->frames[1]), .state_floats = zmq_msg_size(&m->frames[1]) / sizeof(float),
                .steps = cs->has_steps ? cs->steps : 0, .clock = h->clock, .last_clocks = cs->last_clocks,
                .nlast = cs->n_last_clocks, .pending_workers = cs->pending_workers,
                .pending_progress = cs->n_pending_progress ? cs->pending_progress : NULL, .pending = m->frames + 2,
                .npending = cs->n_pending_workers, .replica = cs->has_replica && cs->replica,
        };
        if (im.replica && shardmap_owner_id(mg->store->map, k->tensor, k->chunk) != h->sender) {
                snprintf(reason, n, "shard %u does not lead chunk (%u,%u) under map epoch %lu", h->sender, k->tensor,
                         k->chunk, (unsigned long) shardmap_epoch(mg->store->map));
                return PSNET__STATUS__STATUS_MOVED;
        }
        int r = gate_install_image(mg->gate, &im);
        if (r == -EEXIST)
                return PSNET__STATUS__STATUS_DUPLICATE;
        if (r < 0) {
                snprintf(reason, n, "chunk (%u,%u) not installed: %s", k->tensor, k->chunk,
                         r == -ENOENT ? "this shard does not hold it under its map" : strerror(-r));
                return r == -ENOENT ? PSNET__STATUS__STATUS_MOVED
                       : r == -EINVAL ? PSNET__STATUS__STATUS_INVALID : status_from_errno(r);
        }
        mg->moved_in++;
        log_debug("chunk installed key=(%u,%u) clock=%ld parked=%zu as=%s", k->tensor, k->chunk, (long) h->clock,
                  im.npending, im.replica ? "backup" : "primary");
        return PSNET__STATUS__STATUS_OK;
}

/* Applies a forwarded push to the copies held here; the keys not here yet go
 * to missing. Returns a status for the answer. */
static int replicate(Migrate *mg, WireMsg *m, Psnet__Key **missing, size_t *nmissing, char *reason, size_t n) {
        Store *s = mg->store;
        Psnet__Header *h = m->hdr;
        _cleanup_free_ Chunk **chunks = ps_malloc(h->n_keys * sizeof *chunks);
        if (!chunks)
                return PSNET__STATUS__STATUS_RESOURCE;
        for (size_t i = 0; i < h->n_keys; i++) {
                int st;
                const Psnet__Key *k = h->keys[i];
                chunks[i] = store_lookup_backup(s, k->tensor, k->chunk, k->len, h->sender, &st);
                if (st == PSNET__STATUS__STATUS_MIGRATING)
                        missing[(*nmissing)++] = h->keys[i];
                else if (st != PSNET__STATUS__STATUS_OK) {
                        snprintf(reason, n, "key (%u,%u): this shard is not a backup of shard %u for it under map "
                                 "epoch %lu", k->tensor, k->chunk, h->sender, (unsigned long) shardmap_epoch(s->map));
                        return st;
                }
        }
        /* A bf16 push forwarded as the worker sent it: widened exactly as its
         * primary widened it, so both apply the same values. */
        if (h->dtype == PSNET__DTYPE__DTYPE_BF16) {
                if (store_frames_to_f32(s, m->frames, h) < 0)
                        return PSNET__STATUS__STATUS_RESOURCE;
                h->dtype = PSNET__DTYPE__DTYPE_F32;
        }
        PushReq *req;
        if (pushreq_new(NULL, h->seq, h->replicate->worker, h->clock, &req) < 0)
                return PSNET__STATUS__STATUS_RESOURCE;
        req->replica = true;
        if (h->has_progress)
                req->progress = h->progress;
        for (size_t i = 0; i < h->n_keys; i++)
                if (chunks[i]) {
                        int r = gate_push(mg->gate, chunks[i], req, &m->frames[i]);
                        if (r < 0)
                                req->status = status_from_errno(r);
                }
        int st = req->status == PSNET__STATUS__STATUS_DUPLICATE ? PSNET__STATUS__STATUS_OK : req->status;
        pushreq_settle(mg->gate, req, PSNET__STATUS__STATUS_OK);
        if (st == PSNET__STATUS__STATUS_OK && *nmissing)
                st = PSNET__STATUS__STATUS_MIGRATING;
        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_MIGRATING)
                snprintf(reason, n, "the forwarded push of worker %u clock %ld was not taken", h->replicate->worker,
                         (long) h->clock);
        return st;
}

/* Handles m now; false when it must wait for a newer map or membership. */
static bool handle(Migrate *mg, NetSock *data, WireMsg *m) {
        Store *s = mg->store;
        Psnet__Header *h = m->hdr;
        char reason[192] = "";
        if (s->map && h->epoch > shardmap_epoch(s->map))
                return false;
        /* A shard that takes a lost shard's place gets its chunks from its
         * peers as soon as they have the new map, which may be before
         * pscoord's job and map reach it: kept until they come, as a
         * newer map's message is (refused, the chunk would never come). */
        if ((!s->has_job || !s->map) && h->epoch > 0)
                return false;
        if (h->type == PSNET__MSG_TYPE__MSG_REPLICATE && h->replicate->has_members_epoch &&
            h->replicate->members_epoch > mg->gate->members_epoch)
                return false;
        int st;
        bool rep = h->type == PSNET__MSG_TYPE__MSG_REPLICATE, copy = h->type == PSNET__MSG_TYPE__MSG_ROWS_COPY;
        bool move = h->type == PSNET__MSG_TYPE__MSG_ROWS_MOVE, want = h->type == PSNET__MSG_TYPE__MSG_ROWS_WANT;
        _cleanup_free_ Psnet__Key **missing = rep ? ps_malloc((h->n_keys ? h->n_keys : 1) * sizeof *missing) : NULL;
        size_t nmissing = 0;
        /* A copy of rows sent again (a rebuild) names the last clock its
         * primary closed: -1 before any (always under ASP and SSP). */
        if (!s->has_job || !s->map || h->job != s->job.id || !h->has_clock || h->clock < (copy ? -1 : 0) ||
            !h->has_seq) {
                snprintf(reason, sizeof reason, "not for this shard's job (or no job yet)");
                st = PSNET__STATUS__STATUS_INVALID;
        } else if (move && !sender_moves(mg, m)) {
                snprintf(reason, sizeof reason, "shard %u was not in this shard's map before the last change%s",
                         h->sender, mg->id->enabled ? ", or its key differs" : "");
                st = PSNET__STATUS__STATUS_DENIED;
        } else if (move)
                st = mg->rows ? rows_move_in(mg->rows, s->map, mg->shard_id, h, m->frames, m->nframes, reason,
                                             sizeof reason)
                              : PSNET__STATUS__STATUS_NO_JOB;
        else if (want && !sender_known(mg, m)) {
                snprintf(reason, sizeof reason, "shard %u is not in this shard's map (epoch %lu)%s", h->sender,
                         (unsigned long) shardmap_epoch(s->map), mg->id->enabled ? ", or its key differs" : "");
                st = PSNET__STATUS__STATUS_DENIED;
        } else if (want)
                st = mg->rows ? rows_want(mg->rows, h, m->frames, move_to, mg, reason, sizeof reason)
                              : PSNET__STATUS__STATUS_NO_JOB;
        else if ((rep || copy || (h->chunk_state->has_replica && h->chunk_state->replica)) && !sender_known(mg, m)) {
                /* A copy for a backup comes from a primary of this map (a moving
                 * chunk may come from a shard that just left it). */
                snprintf(reason, sizeof reason, "shard %u is not in this shard's map (epoch %lu)%s", h->sender,
                         (unsigned long) shardmap_epoch(s->map), mg->id->enabled ? ", or its key differs" : "");
                st = PSNET__STATUS__STATUS_DENIED;
        } else if (rep && !missing)
                st = PSNET__STATUS__STATUS_RESOURCE;
        else if (rep)
                st = replicate(mg, m, missing, &nmissing, reason, sizeof reason);
        else if (copy)
                st = mg->rows ? rows_copy_in(mg->rows, h, m->frames, m->nframes, reason, sizeof reason)
                              : PSNET__STATUS__STATUS_NO_JOB;
        else
                st = install(mg, m, reason, sizeof reason);
        if (st != PSNET__STATUS__STATUS_OK && st != PSNET__STATUS__STATUS_DUPLICATE &&
            st != PSNET__STATUS__STATUS_MIGRATING && st != PSNET__STATUS__STATUS_MOVED)
                log_warning("refused a message from shard %u type=%s status=%s reason=\"%s\"", h->sender,
                            wire_type_name(h->type), status_name(st), reason);
        int r = answer(data, m,
                       rep || copy || move || want ? PSNET__MSG_TYPE__MSG_REPLICATE_ACK : PSNET__MSG_TYPE__MSG_CHUNK_ACK, st,
                       reason[0] ? reason : NULL, missing, nmissing);
        if (r < 0)
                log_warning_errno(r, "Failed to answer shard %u: %m", h->sender);
        return true;
}

static bool stashed_from(const Migrate *mg, uint32_t sender) {
        for (size_t i = 0; i < mg->nstash; i++)
                if (mg->stash[i].hdr->sender == sender)
                        return true;
        return false;
}

void migrate_in(Migrate *mg, NetSock *data, WireMsg *m) {
        /* Behind anything of the same sender's that waits: its order is kept. */
        if (!stashed_from(mg, m->hdr->sender) && handle(mg, data, m))
                return;
        WireMsg *ns = mg->nstash < MIGRATE_MAX_STASH ? ps_realloc(mg->stash, (mg->nstash + 1) * sizeof *ns) : NULL;
        if (!ns) {
                (void) answer(data, m,
                              m->hdr->type == PSNET__MSG_TYPE__MSG_CHUNK_STATE ? PSNET__MSG_TYPE__MSG_CHUNK_ACK
                                                                                : PSNET__MSG_TYPE__MSG_REPLICATE_ACK,
                              PSNET__STATUS__STATUS_RESOURCE, "too many messages waiting for a newer map", NULL, 0);
                return;
        }
        mg->stash = ns;
        mg->stash[mg->nstash++] = *m;
        memset(m, 0, sizeof *m); /* ownership moved */
}

void migrate_map_changed(Migrate *mg, NetSock *data) {
        Store *s = mg->store;
        /* A shard that left the map holds no copies any more: nothing waits on it. */
        for (size_t i = 0; i < mg->nlinks;) {
                Link *l = mg->links[i];
                if (s->map && shardmap_find(s->map, l->id) < 0) {
                        if (l->n > l->head)
                                log_info("shard %u left the map: %zu push(es) no longer wait for it", l->id,
                                         l->n - l->head);
                        link_release(l, PSNET__STATUS__STATUS_OK);
                        link_free(l, true);
                        mg->links[i] = mg->links[--mg->nlinks];
                } else
                        i++;
        }
        /* What was kept, in order; a sender's later messages wait behind its first. */
        size_t j = 0;
        for (size_t i = 0; i < mg->nstash; i++) {
                WireMsg *m = &mg->stash[i];
                bool blocked = false;
                for (size_t k = 0; k < j && !blocked; k++)
                        blocked = mg->stash[k].hdr->sender == m->hdr->sender;
                if (!blocked && handle(mg, data, m))
                        wire_msg_done(m);
                else
                        mg->stash[j++] = *m;
        }
        mg->nstash = j;
}
