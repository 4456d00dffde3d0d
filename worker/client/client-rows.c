/* SPDX-License-Identifier: Apache-2.0 */
/* A table's rows pulled or pushed by id (client.h, client_rows): the ids cut
 * by the shard holding each (rendezvous hashing over the map's shards,
 * shardmap_row_holder), one request per shard, answers matched by sequence
 * number; asked again where a shard says it cannot answer yet (UNAVAILABLE,
 * MIGRATING, NO_JOB: nothing was applied), ended with -EAGAIN where it
 * routes by a newer map. A shard's share goes in parts of at most
 * WIRE_ROWS_PART_BYTES of rows, one after the other (a push's parts name
 * their part; the shard counts the push once every part is in). It uses the
 * round's timers, never beside a round. */
#include <errno.h>
#include <string.h>
#include "alloc.h"
#include "client-internal.h"
#include "endpoint.h"
#include "errors.h"
#include "hash.h"
#include "log.h"

typedef struct RowsReq {
        ReqState state;
        uint32_t tab;           /* the op's table it is of */
        uint64_t seq, at;
        uint64_t cursor;        /* a scan: where this shard's next page starts */
        int64_t *ids;           /* this shard's ids, in the caller's order */
        size_t *pos;            /* their places in the caller's arrays */
        size_t n;
        /* Sent in parts of at most per rows (WIRE_ROWS_PART_BYTES), one after
         * the other: part is the one in hand. */
        size_t per, part, parts;
} RowsReq;

/* The ids of q's part in hand: q->ids[*from .. *from + *count). */
static void part_range(const RowsReq *q, size_t *from, size_t *count) {
        *from = q->part * q->per;
        *count = MIN(q->per, q->n - *from);
}

/* One of an exchange's tables. */
typedef struct RowsTab {
        uint32_t table, dim;
        float *out;             /* pull: the caller's rows, in the order of its ids */
        float *grads;           /* push: a copy, n x dim */
} RowsTab;

struct RowsOp {
        bool push;
        int64_t clock;
        RowsTab *tabs;
        size_t ntabs;
        RowsReq *reqs;          /* per table, then per shard: tabs x shards */
        size_t nreqs;
        ClientRowsFn cb;
        ClientRowsPageFn page;  /* a scan (client_rows_scan): each page of rows */
        void *ud;
};

/* A table's hot-row cache: the rows this client pulled, each with the clock
 * it was pulled for, read again while a pull's clock is at most cache past
 * it. Slots taken in turn (the oldest written goes when all are used), found
 * by open addressing over their numbers (at most half full). */
struct RowCache {
        uint32_t dim, rows;     /* rows: slots */
        uint64_t staleness;
        int64_t *ids, *clocks;
        float *values;
        uint32_t *index;        /* slot + 1 of the id hashed there; 0 empty */
        size_t cap, used, next;
};

static void cache_free(RowCache *k) {
        if (!k)
                return;
        ps_free(k->ids);
        ps_free(k->clocks);
        ps_free(k->values);
        ps_free(k->index);
        ps_free(k);
}

void client_rows_free(Client *c) {
        for (size_t i = 0; i < JOB_MAX_TABLES; i++) {
                cache_free(c->caches[i]);
                c->caches[i] = NULL;
        }
}

/* Table t's cache, made on first use (NULL: the table has none, or out of memory). */
static RowCache *cache_of(Client *c, uint32_t t) {
        const TableConf *tc = &c->job.tables[t];
        if (!tc->cache || c->caches[t])
                return c->caches[t];
        RowCache *k = ps_calloc(1, sizeof *k);
        if (!k)
                return NULL;
        k->dim = tc->dim;
        k->rows = (uint32_t) (tc->cache_rows ? tc->cache_rows : TABLE_DEFAULT_CACHE_ROWS);
        k->staleness = tc->cache;
        for (k->cap = 16; k->cap < 2 * (size_t) k->rows;)
                k->cap *= 2;
        k->ids = ps_malloc(k->rows * sizeof *k->ids);
        k->clocks = ps_malloc(k->rows * sizeof *k->clocks);
        k->values = ps_malloc((size_t) k->rows * k->dim * sizeof *k->values);
        k->index = ps_calloc(k->cap, sizeof *k->index);
        if (!k->ids || !k->clocks || !k->values || !k->index) {
                cache_free(k);
                return NULL;
        }
        c->caches[t] = k;
        return k;
}

/* The index slot of id, or of the empty place it would take. */
static size_t cache_probe(const RowCache *k, int64_t id) {
        uint64_t x = (uint64_t) id;
        size_t i = (size_t) splitmix64_next(&x) & (k->cap - 1);
        while (k->index[i] && k->ids[k->index[i] - 1] != id)
                i = (i + 1) & (k->cap - 1);
        return i;
}

/* id's row if it was pulled for a clock at most staleness before clock. */
static const float *cache_get(const RowCache *k, int64_t id, int64_t clock) {
        size_t i = cache_probe(k, id);
        if (!k->index[i])
                return NULL;
        uint32_t s = k->index[i] - 1;
        return clock - k->clocks[s] <= (int64_t) k->staleness ? k->values + (size_t) s * k->dim : NULL;
}

/* Empties index slot i, shifting back the ids after it that probed past it. */
static void cache_unindex(RowCache *k, size_t i) {
        size_t mask = k->cap - 1, j = i;
        k->index[i] = 0;
        for (;;) {
                j = (j + 1) & mask;
                if (!k->index[j])
                        return;
                uint64_t x = (uint64_t) k->ids[k->index[j] - 1];
                size_t home = (size_t) splitmix64_next(&x) & mask;
                if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
                        continue;
                k->index[i] = k->index[j];
                k->index[j] = 0;
                i = j;
        }
}

/* Keeps id's row as pulled for clock. */
static void cache_put(RowCache *k, int64_t id, int64_t clock, const void *row) {
        size_t i = cache_probe(k, id);
        uint32_t s;
        if (k->index[i])
                s = k->index[i] - 1;
        else {
                if (k->used < k->rows)
                        s = (uint32_t) k->used++;
                else {
                        s = (uint32_t) k->next;
                        k->next = (k->next + 1) % k->rows;
                        cache_unindex(k, cache_probe(k, k->ids[s]));
                        i = cache_probe(k, id);
                }
                k->ids[s] = id;
                k->index[i] = s + 1;
        }
        k->clocks[s] = clock;
        memcpy(k->values + (size_t) s * k->dim, row, k->dim * sizeof *k->values);
}

static void op_free(RowsOp *op) {
        if (!op)
                return;
        for (size_t i = 0; i < op->nreqs; i++) {
                ps_free(op->reqs[i].ids);
                ps_free(op->reqs[i].pos);
        }
        ps_free(op->reqs);
        for (size_t t = 0; t < op->ntabs; t++)
                ps_free(op->tabs[t].grads);
        ps_free(op->tabs);
        ps_free(op);
}

static void rows_end(Client *c, int r) {
        RowsOp *op = c->rows;
        if (!op)
                return;
        c->rows = NULL;
        (void) uv_timer_stop(&c->deadline);
        (void) uv_timer_stop(&c->retry);
        ClientRowsFn cb = op->cb;
        void *ud = op->ud;
        op_free(op);
        if (cb)
                cb(c, r, ud);
}

void client_rows_abort(Client *c) {
        if (!c->rows)
                return;
        c->rows->cb = NULL;
        rows_end(c, -ECANCELED);
}

/* Sends request i (shard i % shards): 0, or a negative errno. */
static int send_req(Client *c, size_t i) {
        RowsOp *op = c->rows;
        RowsReq *q = &op->reqs[i];
        const RowsTab *tb = &op->tabs[q->tab];
        ShardConn *s = &c->shards[i % c->nshards];
        Psnet__Header h;
        wire_header_init(&h, op->page ? PSNET__MSG_TYPE__MSG_ROWS_SCAN
                             : op->push ? PSNET__MSG_TYPE__MSG_ROWS_PUSH : PSNET__MSG_TYPE__MSG_ROWS_PULL);
        h.has_job = h.has_sender = h.has_seq = h.has_clock = h.has_table = true;
        h.job = c->job.id;
        h.sender = c->worker_id;
        h.seq = q->seq = ++c->seq;
        h.clock = op->clock;
        h.table = tb->table;
        h.has_members_epoch = c->members_epoch != 0;
        h.members_epoch = c->members_epoch;
        if (op->page) {
                h.has_cursor = true;
                h.cursor = q->cursor;
                int r = netsock_send(s->sock, NULL, &h, NULL, 0);
                if (r == 0)
                        q->state = REQ_SENT;
                return r;
        }
        zmq_msg_t f[2];
        size_t from, cnt;
        part_range(q, &from, &cnt);
        size_t idb = cnt * sizeof *q->ids, gb = cnt * tb->dim * sizeof(float);
        if (op->push) {
                /* The map it was cut for: a push sent again after a fail-over
                 * is told from the first (the shards keep what it holds that
                 * they applied already). */
                h.has_epoch = true;
                h.epoch = c->map_epoch;
        }
        if (op->push && q->parts > 1) {
                h.has_part = h.has_parts = true;
                h.part = (uint32_t) q->part;
                h.parts = (uint32_t) q->parts;
        }
        if (zmq_msg_init_size(&f[0], idb) < 0)
                return -ENOMEM;
        memcpy(zmq_msg_data(&f[0]), q->ids + from, idb);
        if (op->push) {
                if (zmq_msg_init_size(&f[1], gb) < 0) {
                        zmq_msg_close(&f[0]);
                        return -ENOMEM;
                }
                float *g = zmq_msg_data(&f[1]);
                for (size_t k = 0; k < cnt; k++)
                        memcpy(g + k * tb->dim, tb->grads + q->pos[from + k] * tb->dim, tb->dim * sizeof *g);
        }
        int r = netsock_send(s->sock, NULL, &h, f, op->push ? 2 : 1);
        if (r < 0)
                return r;
        q->state = REQ_SENT;
        if (op->push)
                c->stats.bytes_pushed += gb;
        return 0;
}

static void retry_cb(uv_timer_t *t);

/* Sends what is due; arms the retry timer for what waits. */
static int pump(Client *c) {
        RowsOp *op = c->rows;
        uint64_t now = now_ms(), next = UINT64_MAX;
        for (size_t i = 0; i < op->nreqs; i++) {
                RowsReq *q = &op->reqs[i];
                if (q->state == REQ_RETRY && q->at <= now)
                        q->state = REQ_TODO;
                if (q->state == REQ_TODO) {
                        int r = send_req(c, i);
                        if (r == -EAGAIN) { /* the shard's queue is full: shortly */
                                q->state = REQ_RETRY;
                                q->at = now + 20;
                        } else if (r < 0)
                                return r;
                }
                if (q->state == REQ_RETRY)
                        next = MIN(next, q->at);
        }
        if (next != UINT64_MAX)
                (void) uv_timer_start(&c->retry, retry_cb, next > now ? next - now : 1, 0);
        return 0;
}

/* Whether request q is still to be answered. */
static bool open_req(const RowsReq *q) {
        return q->state != REQ_NONE && q->state != REQ_DONE;
}

static void check_done(Client *c) {
        RowsOp *op = c->rows;
        for (size_t i = 0; i < op->nreqs; i++)
                if (open_req(&op->reqs[i]))
                        return;
        rows_end(c, 0);
}

static void retry_cb(uv_timer_t *t) {
        Client *c = t->data;
        if (!c->rows)
                return;
        int r = pump(c);
        if (r < 0)
                rows_end(c, r);
        else
                check_done(c);
}

static void deadline_cb(uv_timer_t *t) {
        Client *c = t->data;
        if (!c->rows)
                return;
        for (size_t i = 0; i < c->rows->nreqs; i++)
                if (open_req(&c->rows->reqs[i])) {
                        const ShardConn *s = &c->shards[i % c->nshards];
                        log_error_errno(ETIMEDOUT, "shard %u at %s did not answer a rows request within %u s", s->id,
                                        s->endpoint, c->timeout_ms / 1000);
                        break;
                }
        rows_end(c, -ETIMEDOUT);
}

/* One answer to request q of shard s: 0, or a negative errno ending the exchange. */
static int handle(Client *c, ShardConn *s, RowsReq *q, const WireMsg *m) {
        RowsOp *op = c->rows;
        const RowsTab *tb = &op->tabs[q->tab];
        const Psnet__Header *h = m->hdr;
        int st = h->has_status ? (int) h->status : PSNET__STATUS__STATUS_OK;
        if (st == PSNET__STATUS__STATUS_MOVED && h->has_epoch && h->epoch > c->map_epoch) {
                c->need_epoch = MAX(c->need_epoch, h->epoch);
                return -EAGAIN;
        }
        if (st == PSNET__STATUS__STATUS_MOVED || st == PSNET__STATUS__STATUS_MIGRATING ||
            st == PSNET__STATUS__STATUS_UNAVAILABLE || st == PSNET__STATUS__STATUS_NO_JOB) {
                /* Nothing was applied: ask again shortly. */
                if (st == PSNET__STATUS__STATUS_UNAVAILABLE)
                        c->stats.unavailable++;
                q->state = REQ_RETRY;
                q->at = now_ms() + (st == PSNET__STATUS__STATUS_NO_JOB ? 50 : 20);
                return 0;
        }
        if (st == PSNET__STATUS__STATUS_STALE) {
                log_warning("shard refused a rows request shard=%u status=stale reason=\"%s\"", s->id,
                            h->reason ? h->reason : "");
                return -ESTALE;
        }
        if (h->type == PSNET__MSG_TYPE__MSG_ERROR ||
            (h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK && st != PSNET__STATUS__STATUS_OK &&
             st != PSNET__STATUS__STATUS_DUPLICATE)) {
                log_error("shard refused a rows request shard=%u endpoint=%s status=%s reason=\"%s\"", s->id,
                          s->endpoint, status_name(st), h->reason ? h->reason : "");
                return -EPROTO;
        }
        if (op->push != (h->type == PSNET__MSG_TYPE__MSG_PUSH_ACK) ||
            (!op->push && h->type != PSNET__MSG_TYPE__MSG_ROWS_PULL_REP)) {
                log_error("shard %u answered a rows request with %s", s->id, wire_type_name(h->type));
                return -EPROTO;
        }
        if (op->page) {
                size_t ib = zmq_msg_size((zmq_msg_t *) &m->frames[0]), n = ib / sizeof(int64_t);
                if (h->table != tb->table || m->nframes != 2 ||
                    zmq_msg_size((zmq_msg_t *) &m->frames[1]) != n * tb->dim * sizeof(float)) {
                        log_error("shard %u answered a scan of table %u with other rows", s->id, tb->table);
                        return -EPROTO;
                }
                int r = op->page(c, zmq_msg_data((zmq_msg_t *) &m->frames[0]),
                                 zmq_msg_data((zmq_msg_t *) &m->frames[1]), n, op->ud);
                if (r < 0)
                        return r;
                c->stats.bytes_pulled += zmq_msg_size((zmq_msg_t *) &m->frames[1]);
                q->cursor = h->has_cursor ? h->cursor : 0;
                q->state = h->has_cursor ? REQ_TODO : REQ_DONE;
                return 0;
        }
        size_t from, cnt;
        part_range(q, &from, &cnt);
        if (!op->push) {
                size_t idb = cnt * sizeof(int64_t), rb = cnt * tb->dim * sizeof(float);
                if (h->table != tb->table || m->nframes != 2 || zmq_msg_size((zmq_msg_t *) &m->frames[0]) != idb ||
                    memcmp(zmq_msg_data((zmq_msg_t *) &m->frames[0]), q->ids + from, idb) != 0 ||
                    zmq_msg_size((zmq_msg_t *) &m->frames[1]) != rb) {
                        log_error("shard %u answered other rows than the %zu of table %u asked", s->id, cnt,
                                  tb->table);
                        return -EPROTO;
                }
                const float *rows = zmq_msg_data((zmq_msg_t *) &m->frames[1]);
                RowCache *cache = c->caches[tb->table];
                for (size_t k = 0; k < cnt; k++) {
                        const char *row = (const char *) rows + k * tb->dim * sizeof(float);
                        memcpy(tb->out + q->pos[from + k] * tb->dim, row, tb->dim * sizeof(float));
                        if (cache)
                                cache_put(cache, q->ids[from + k], op->clock, row);
                }
                c->stats.bytes_pulled += rb;
        }
        /* The next part, or done. */
        q->state = ++q->part < q->parts ? REQ_TODO : REQ_DONE;
        return 0;
}

bool client_rows_reply(Client *c, ShardConn *s, WireMsg *m) {
        RowsOp *op = c->rows;
        size_t i = (size_t) (s - c->shards);
        if (!op || i >= c->nshards || !m->hdr)
                return false;
        /* The shard's request (of one of the tables) this answers. */
        while (i < op->nreqs && (op->reqs[i].state != REQ_SENT || op->reqs[i].seq != m->hdr->seq))
                i += c->nshards;
        if (i >= op->nreqs)
                return false;
        int r = handle(c, s, &op->reqs[i], m);
        if (r == 0)
                r = pump(c);
        if (r < 0)
                rows_end(c, r);
        else
                check_done(c);
        return true;
}

/* An exchange of the rows of ntabs tables with a request slot per table
 * and shard (NULL: out of memory). */
static RowsOp *op_new(Client *c, size_t ntabs, ClientRowsFn cb, void *ud) {
        RowsOp *op = ps_calloc(1, sizeof *op);
        if (!op)
                return NULL;
        op->cb = cb;
        op->ud = ud;
        op->ntabs = ntabs;
        op->nreqs = ntabs * c->nshards;
        op->tabs = ps_calloc(MAX(ntabs, (size_t) 1), sizeof *op->tabs);
        op->reqs = ps_calloc(MAX(op->nreqs, (size_t) 1), sizeof *op->reqs);
        if (!op->tabs || !op->reqs) {
                op_free(op);
                return NULL;
        }
        for (size_t i = 0; i < op->nreqs; i++)
                op->reqs[i].tab = (uint32_t) (i / c->nshards);
        return op;
}

/* Sends op's first requests and arms its deadline: 0, or a negative errno (op freed). */
static int op_start(Client *c, RowsOp *op) {
        c->rows = op;
        int r = pump(c);
        if (r < 0) {
                c->rows = NULL;
                op_free(op);
                return r;
        }
        (void) uv_timer_start(&c->deadline, deadline_cb, c->timeout_ms, 0);
        /* The callback never runs inside this call: nothing may be sent, or all answered later. */
        (void) uv_timer_start(&c->retry, retry_cb, 0, 0);
        return 0;
}

/* Table k of op: in's ids cut by shard into op's requests of the table
 * (a pull reads what the table's cache holds fresh enough): 0, or a
 * negative errno. */
static int tab_setup(Client *c, RowsOp *op, size_t k, const ClientRowsTable *in) {
        RowsTab *tb = &op->tabs[k];
        tb->table = in->table;
        tb->dim = c->job.tables[in->table].dim;
        tb->out = in->out;
        size_t n = in->n;
        const int64_t *ids = in->ids;
        size_t *count = ps_calloc(c->nshards, sizeof *count);
        int *at = ps_malloc(MAX(n, (size_t) 1) * sizeof *at);
        int r = count && at ? 0 : -ENOMEM;
        /* at[k] < 0: read from the cache, not fetched. */
        RowCache *cache = !op->push ? cache_of(c, in->table) : NULL;
        if (r == 0 && op->push && !(tb->grads = ps_malloc(MAX(n, (size_t) 1) * tb->dim * sizeof(float))))
                r = -ENOMEM;
        for (size_t j = 0; r == 0 && j < n; j++) {
                const float *hit = cache ? cache_get(cache, ids[j], op->clock) : NULL;
                if (hit) {
                        memcpy(tb->out + j * tb->dim, hit, tb->dim * sizeof *tb->out);
                        c->stats.cache_hits++;
                        at[j] = -1;
                        continue;
                }
                c->stats.cache_misses += cache != NULL;
                at[j] = shardmap_row_holder(c->map, in->table, ids[j], 0);
                if (at[j] < 0 || (size_t) at[j] >= c->nshards)
                        r = -EINVAL;
                else
                        count[at[j]]++;
        }
        /* A push goes to every shard, empty where it holds none of the ids: a
         * shard closes a BSP clock, and cuts a checkpoint in any mode, once
         * every member pushed it. */
        bool every = op->push;
        RowsReq *reqs = op->reqs + k * c->nshards;
        for (size_t i = 0; r == 0 && i < c->nshards; i++) {
                RowsReq *q = &reqs[i];
                if (!count[i] && !every)
                        continue;
                q->ids = ps_malloc(MAX(count[i], (size_t) 1) * sizeof *q->ids);
                q->pos = ps_malloc(MAX(count[i], (size_t) 1) * sizeof *q->pos);
                if (!q->ids || !q->pos)
                        r = -ENOMEM;
                q->state = REQ_TODO;
                /* Parts of at most WIRE_ROWS_PART_BYTES of rows: any shard's
                 * --max-msg that holds the job takes them. */
                q->per = MAX((size_t) 1, MIN((size_t) WIRE_MAX_ROWS, WIRE_ROWS_PART_BYTES / (tb->dim * sizeof(float))));
                q->parts = MAX((size_t) 1, (count[i] + q->per - 1) / q->per);
                if (op->push && q->parts > WIRE_MAX_ROWS_PARTS) {
                        log_error("a push of %zu rows of table %u to shard %u takes %zu parts of %u MiB, more than %u: "
                                  "push fewer rows at once", count[i], in->table, c->shards[i].id, q->parts,
                                  WIRE_ROWS_PART_BYTES >> 20, WIRE_MAX_ROWS_PARTS);
                        r = -EMSGSIZE;
                }
        }
        for (size_t j = 0; r == 0 && j < n; j++) {
                if (at[j] < 0)
                        continue; /* read from the cache */
                RowsReq *q = &reqs[at[j]];
                q->ids[q->n] = ids[j];
                q->pos[q->n++] = j;
        }
        if (r == 0 && op->push)
                memcpy(tb->grads, in->grads, n * tb->dim * sizeof(float));
        ps_free(count);
        ps_free(at);
        return r;
}

int client_rows_many(Client *c, const ClientRowsTable *tabs, size_t ntabs, bool push, int64_t clock, ClientRowsFn cb,
                     void *ud) {
        if (c->busy || c->prefetching || c->rows)
                return -EBUSY;
        if (ntabs == 0 || !c->map)
                return -EINVAL;
        for (size_t k = 0; k < ntabs; k++)
                for (size_t j = 0; j <= k; j++)
                        if (tabs[k].table >= c->job.ntables || (push ? !tabs[k].grads : !tabs[k].out) ||
                            (tabs[k].n > 0 && !tabs[k].ids) || (j < k && tabs[j].table == tabs[k].table))
                                return -EINVAL;
        RowsOp *op = op_new(c, ntabs, cb, ud);
        if (!op)
                return -ENOMEM;
        op->push = push;
        op->clock = clock;
        int r = 0;
        for (size_t k = 0; r == 0 && k < ntabs; k++)
                r = tab_setup(c, op, k, &tabs[k]);
        if (r < 0) {
                op_free(op);
                return r;
        }
        return op_start(c, op);
}

int client_rows(Client *c, uint32_t table, const int64_t *ids, size_t n, const float *grads, int64_t clock,
                float *out, ClientRowsFn cb, void *ud) {
        const ClientRowsTable t = { .table = table, .ids = ids, .n = n, .grads = grads, .out = out };
        return client_rows_many(c, &t, 1, grads != NULL, clock, cb, ud);
}

int client_rows_scan(Client *c, uint32_t table, ClientRowsPageFn page, ClientRowsFn cb, void *ud) {
        if (c->busy || c->prefetching || c->rows)
                return -EBUSY;
        if (table >= c->job.ntables || !page || !c->map)
                return -EINVAL;
        RowsOp *op = op_new(c, 1, cb, ud);
        if (!op)
                return -ENOMEM;
        op->page = page;
        op->tabs[0].table = table;
        op->tabs[0].dim = c->job.tables[table].dim;
        for (size_t i = 0; i < c->nshards; i++)
                op->reqs[i] = (RowsReq) { .state = REQ_TODO, .per = 1, .parts = 1, .tab = 0 };
        return op_start(c, op);
}
