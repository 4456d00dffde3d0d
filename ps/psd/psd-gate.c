/* SPDX-License-Identifier: Apache-2.0 */
/* The consistency gate; see psd-gate.h. Pushes: admission, de-duplication,
 * BSP parking and the closing of clocks, ASP/SSP application. Pulls: when they
 * may be answered, and the bounded list of those that wait. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alloc.h"
#include "endpoint.h"
#include "errors.h"
#include "log.h"
#include "macro.h"
#include "psd-gate.h"
#include "psd-store.h"
#include "wire.h"

#define GATE_MAX_WORKER_ID 65535u
/* A pull may ask for a clock at most this far past the worker's completed
 * clocks: its next one (after its push), or the one after (a prefetch). */
#define GATE_PULL_AHEAD 2
/* A push may be for a clock at most this far past the sender's last push of
 * the same key: its next one, or the one after (one lost on the way, the
 * worker gone on). Further would make every later push of the worker's a
 * duplicate here (dropped), and claims steps it never took. */
#define GATE_PUSH_AHEAD 2

/* The slot of a per-worker-id clock table, growing it (new slots -1) as needed;
 * NULL when out of memory. */
static int64_t *clock_slot(int64_t **tab, size_t *n, uint32_t worker) {
        if (worker >= *n) {
                size_t m = MAX((size_t) worker + 1, *n * 2);
                int64_t *p = ps_realloc(*tab, m * sizeof *p);
                if (!p)
                        return NULL;
                for (size_t i = *n; i < m; i++)
                        p[i] = -1;
                *tab = p;
                *n = m;
        }
        return &(*tab)[worker];
}

/* A per-worker-id clock table's slot, read: -1 for a worker it has none of. */
static int64_t clock_peek(const int64_t *tab, size_t n, uint32_t worker) {
        return worker < n ? tab[worker] : -1;
}

/* A worker's completed clocks here are at least clock + 1. */
static void clock_reached(int64_t *wc, int64_t clock) {
        if (*wc < clock + 1)
                *wc = clock + 1;
}

static int64_t *worker_clock(Gate *g, uint32_t worker) {
        return clock_slot(&g->wclock, &g->nwclock, worker);
}

static int64_t *chunk_last_clock(Chunk *c, uint32_t worker) {
        return clock_slot(&c->last_clock, &c->nlast, worker);
}

/* --- push requests ------------------------------------------------------------------ */

int pushreq_new(const zmq_msg_t *route, uint64_t seq, uint32_t worker, int64_t clock, PushReq **ret) {
        PushReq *r = ps_calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        zmq_msg_init(&r->route);
        if (route && zmq_msg_copy(&r->route, (zmq_msg_t *) route) < 0) {
                zmq_msg_close(&r->route);
                ps_free(r);
                return -errno;
        }
        r->seq = seq;
        r->worker = worker;
        r->clock = clock;
        r->progress = -1.0f;
        r->remaining = 1;
        r->status = PSNET__STATUS__STATUS_OK;
        r->arrived = now_ms();
        *ret = r;
        return 0;
}

static void pushreq_note(PushReq *req, int status) {
        if (status != PSNET__STATUS__STATUS_OK && req->status == PSNET__STATUS__STATUS_OK)
                req->status = status;
}

void pushreq_settle(Gate *g, PushReq *req, int status) {
        pushreq_note(req, status);
        if (--req->remaining > 0)
                return;
        if (g->hooks.ack && !req->replica)
                g->hooks.ack(g->hooks.ud, req);
        zmq_msg_close(&req->route);
        ps_free(req);
}

/* --- the gate and its store ---------------------------------------------------------- */

static void chunk_leaving(Gate *g, Chunk *c);
static void chunk_demoted(Gate *g, Chunk *c);

/* The pushes parked on a chunk the store lets go (its release hook). */
static void chunk_released(void *ud, Chunk *c, StoreRelease why) {
        Gate *g = ud;
        if (why == STORE_LEAVING)
                chunk_leaving(g, c);
        else if (why == STORE_DEMOTED)
                chunk_demoted(g, c);
        else {
                for (size_t i = 0; i < c->npending; i++) {
                        zmq_msg_close(&c->pending[i].grad);
                        if (c->pending[i].req)
                                pushreq_settle(g, c->pending[i].req, PSNET__STATUS__STATUS_SHUTTING_DOWN);
                }
                c->npending = 0;
        }
}

static void drop_pending(Store *s, Chunk *c, void *ud) {
        (void) s;
        if (c->npending)
                chunk_released(ud, c, STORE_DROPPED);
}

int gate_new(Store *s, const GateHooks *hooks, Gate **ret) {
        Gate *g = ps_calloc(1, sizeof *g);
        if (!g)
                return -ENOMEM;
        g->store = s;
        g->hooks = *hooks;
        g->limits = (GateLimits) { .max_parked = 1024, .max_parked_per_worker = GATE_PARKED_PER_WORKER,
                                   .park_timeout_ms = GATE_DEFAULT_PARK_TIMEOUT_MS };
        store_set_release(s, chunk_released, g);
        *ret = g;
        return 0;
}

Gate *gate_free(Gate *g) {
        if (!g)
                return NULL;
        for (size_t i = 0; i < g->nparked; i++) {
                if (g->hooks.answer)
                        g->hooks.answer(g->hooks.ud, &g->parked[i].route, g->parked[i].hdr, NULL,
                                  PSNET__STATUS__STATUS_SHUTTING_DOWN, "the shard is stopping", g->parked[i].since);
                zmq_msg_close(&g->parked[i].route);
                psnet__header__free_unpacked(g->parked[i].hdr, NULL);
        }
        g->parked = mfree(g->parked);
        g->nparked = g->cparked = 0;
        ps_free(g->prev.members);
        ps_free(g->prev.keys);
        ps_free(g->cur.members);
        ps_free(g->cur.keys);
        ps_free(g->wclock);
        g->prev = g->cur = (GateCfg) { 0 };
        g->wclock = NULL;
        g->nwclock = 0;
        g->parts_in = mfree(g->parts_in);
        g->nparts_in = 0;
        store_foreach(g->store, drop_pending, g); /* refused SHUTTING_DOWN */
        store_set_release(g->store, NULL, NULL);
        ps_free(g);
        return NULL;
}

Store *gate_store(const Gate *g) {
        return g->store;
}

int gate_configure(Gate *g, const Job *job, const ShardMap *map) {
        int fresh = store_configure(g->store, job, map);
        if (fresh < 0)
                return fresh;
        if (fresh) {
                g->cur.mode = g->prev.mode = job->mode;
                g->cur.staleness = g->prev.staleness = job->staleness;
        }
        int r = gate_settle(g);
        return r < 0 ? r : fresh;
}

int gate_install_image(Gate *g, const ChunkImage *im) {
        Chunk *c;
        int r = store_install_image(g->store, im, &c);
        for (size_t i = 0; r == 0 && i < im->npending; i++)
                r = gate_park_copy(g, c, im->pending_workers[i], im->pending_progress ? im->pending_progress[i] : -1.0f,
                                   zmq_msg_data((zmq_msg_t *) &im->pending[i]),
                                   zmq_msg_size((zmq_msg_t *) &im->pending[i]));
        if (r < 0)
                return r;
        return gate_settle(g);
}

int64_t gate_worker_clock(const Gate *g, uint32_t worker) {
        return clock_peek(g->wclock, g->nwclock, worker);
}

int64_t gate_clock(const Gate *g) {
        if (!g->store->has_job || !g->store->chunks)
                return 0;
        if (g->cur.mode == MODE_BSP)
                return store_min_clock(g->store);
        /* ASP/SSP: the fastest member's progress. */
        int64_t m = 0;
        for (size_t i = 0; i < g->cur.nmembers; i++) {
                uint32_t w = g->cur.members[i];
                if (w < g->nwclock && g->wclock[w] > m)
                        m = g->wclock[w];
        }
        return m;
}

/* --- configurations -------------------------------------------------------------------- */

/* Sets c to these members (sorted, with their keys when given). */
static int cfg_set(GateCfg *c, ConsistencyMode mode, uint32_t staleness, const uint32_t *w, const uint8_t (*keys)[32],
                   size_t n) {
        uint32_t *m = ps_malloc((n ? n : 1) * sizeof *m);
        uint8_t (*k)[32] = keys ? ps_malloc((n ? n : 1) * sizeof *k) : NULL;
        if (!m || (keys && !k)) {
                ps_free(m);
                ps_free(k);
                return -ENOMEM;
        }
        /* Sort ids and keys together: a selection of the smallest each time is
         * fine for the few dozen members a job has. */
        bool *used = ps_calloc(n ? n : 1, sizeof *used);
        if (!used) {
                ps_free(m);
                ps_free(k);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                size_t best = SIZE_MAX;
                for (size_t j = 0; j < n; j++)
                        if (!used[j] && (best == SIZE_MAX || w[j] < w[best]))
                                best = j;
                used[best] = true;
                m[i] = w[best];
                if (k)
                        memcpy(k[i], keys[best], 32);
        }
        ps_free(used);
        ps_free(c->members);
        ps_free(c->keys);
        c->members = m;
        c->keys = k;
        c->nmembers = n;
        c->mode = mode;
        c->staleness = staleness;
        return 0;
}

static int cfg_copy(GateCfg *dst, const GateCfg *src) {
        return cfg_set(dst, src->mode, src->staleness, src->members, (const uint8_t(*)[32]) src->keys, src->nmembers);
}

const GateCfg *gate_cfg(const Gate *g, int64_t clock) {
        return clock < g->switch_clock ? &g->prev : &g->cur;
}

/* Index of worker in cfg's members, or -1. */
static ssize_t member_index(const GateCfg *cfg, uint32_t worker) {
        const uint32_t *p = bsearch(&worker, cfg->members, cfg->nmembers, sizeof(uint32_t), cmp_u32);
        return p ? p - cfg->members : -1;
}

static bool is_member(const GateCfg *cfg, uint32_t worker) {
        return member_index(cfg, worker) >= 0;
}

static int chunk_flush_async(Gate *g, Chunk *c);

int gate_set_config(Gate *g, ConsistencyMode mode, uint32_t staleness, const uint32_t *workers,
                    const int64_t *start, const uint8_t (*keys)[32], size_t n, const uint32_t *prev, size_t nprev,
                    int64_t from_clock, uint64_t epoch) {
        Store *s = g->store;
        ConsistencyMode old_mode = g->cur.mode;
        int r;
        if (prev) {
                /* The old set, with the keys the old configuration knew for them. */
                GateCfg old = { 0 };
                r = cfg_copy(&old, &g->cur);
                if (r == 0) {
                        uint32_t *ids = ps_malloc((nprev ? nprev : 1) * sizeof *ids);
                        uint8_t (*k)[32] = old.keys ? ps_calloc(nprev ? nprev : 1, sizeof *k) : NULL;
                        if (!ids || (old.keys && !k))
                                r = -ENOMEM;
                        for (size_t i = 0; r == 0 && i < nprev; i++) {
                                ids[i] = prev[i];
                                ssize_t j = member_index(&old, prev[i]);
                                if (k && j >= 0)
                                        memcpy(k[i], old.keys[j], 32);
                        }
                        if (r == 0)
                                r = cfg_set(&g->prev, old.mode, old.staleness, ids, (const uint8_t(*)[32]) k, nprev);
                        ps_free(ids);
                        ps_free(k);
                }
                ps_free(old.members);
                ps_free(old.keys);
        } else
                r = cfg_set(&g->prev, mode, staleness, workers, keys, n);
        if (r < 0)
                return r;
        r = cfg_set(&g->cur, mode, staleness, workers, keys, n);
        if (r < 0)
                return r;
        g->switch_clock = prev ? from_clock : 0;
        g->members_epoch = epoch;
        g->fenced = false;
        for (size_t i = 0; start && i < n; i++) {
                int64_t *wc = worker_clock(g, workers[i]);
                if (!wc)
                        return -ENOMEM;
                if (*wc < start[i])
                        *wc = start[i];
        }
        if (s->has_job && s->chunks) {
                for (size_t t = 0; t < s->job.ntensors; t++)
                        for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                                Chunk *c = s->chunks[t][k];
                                if (!c)
                                        continue;
                                /* Entering BSP: chunk clocks count closed clocks from the boundary on. */
                                if (mode == MODE_BSP && old_mode != MODE_BSP)
                                        c->clock = from_clock;
                                /* Leaving BSP: what was parked for a clock now governed otherwise is applied. */
                                if (gate_cfg(g, c->clock)->mode != MODE_BSP && c->npending) {
                                        r = chunk_flush_async(g, c);
                                        if (r < 0)
                                                return r;
                                }
                        }
        }
        return gate_settle(g);
}

int gate_set_members(Gate *g, const uint32_t *workers, size_t n, uint64_t epoch) {
        return gate_set_config(g, g->cur.mode, g->cur.staleness, workers, NULL, NULL, n, NULL, 0, 0, epoch);
}

void gate_worker_clocks(const Gate *g, int64_t *ret_min_worker, int64_t *ret_max_worker) {
        int64_t slowest = -1, fastest = 0;
        for (size_t i = 0; i < g->cur.nmembers; i++) {
                uint32_t w = g->cur.members[i];
                int64_t wc = clock_peek(g->wclock, g->nwclock, w);
                if (wc >= 0 && (slowest < 0 || wc < slowest))
                        slowest = wc;
                if (wc > fastest)
                        fastest = wc;
        }
        *ret_min_worker = slowest < 0 ? 0 : slowest;
        *ret_max_worker = fastest;
}

int64_t gate_fence(Gate *g, int64_t *ret_min_worker, int64_t *ret_max_worker) {
        Store *s = g->store;
        int64_t maxc = store_max_clock(s);
        gate_worker_clocks(g, ret_min_worker, ret_max_worker);
        g->fenced = true;
        g->fence_limit = maxc + 1;
        g->fence_pull_limit = *ret_max_worker + 1;
        return maxc;
}

/* The slowest member's completed clocks under cfg (members with no push yet count as 0). */
static int64_t slowest_member(const Gate *g, const GateCfg *cfg) {
        int64_t slowest = -1;
        for (size_t i = 0; i < cfg->nmembers; i++) {
                uint32_t w = cfg->members[i];
                int64_t wc = MAX(clock_peek(g->wclock, g->nwclock, w), 0);
                if (slowest < 0 || wc < slowest)
                        slowest = wc;
        }
        return slowest;
}

/* --- pushes ------------------------------------------------------------------------ */

/* The index of the first value whose bits are NaN or infinity (exponent all
 * ones), or n. An all-ones exponent plus one carries into bit 31, so a block
 * ORs (b & exponent) + (1 << 23) and tests the sign bit once: it vectorises
 * (measured 38 GB/s over a 1 MiB chunk here, about 2% of a push round).
 * Frames may be unaligned, hence memcpy (the compiler makes plain loads). */
size_t gate_first_nonfinite(const unsigned char *p, size_t n) {
        size_t i = 0;
        for (; i + 64 <= n; i += 64) {
                uint32_t acc = 0;
                for (size_t k = 0; k < 64; k++) {
                        uint32_t b;
                        memcpy(&b, p + 4 * (i + k), 4);
                        acc |= (b & 0x7f800000u) + 0x00800000u;
                }
                if (acc & 0x80000000u)
                        break;
        }
        for (; i < n; i++) {
                uint32_t b;
                memcpy(&b, p + 4 * i, 4);
                if ((b & 0x7f800000u) == 0x7f800000u)
                        return i;
        }
        return n;
}

int gate_admit_sender(Gate *g, const Psnet__Header *h, const uint8_t *sender_key, char *reason, size_t n) {
        const GateCfg *cfg = gate_cfg(g, h->clock);
        ssize_t mi = member_index(cfg, h->sender);
        if (mi < 0) {
                g->refused_stale++;
                snprintf(reason, n, "worker %u is not a member of clock %ld (membership epoch %lu)", h->sender,
                         (long) h->clock, (unsigned long) g->members_epoch);
                return PSNET__STATUS__STATUS_STALE;
        }
        if (sender_key && cfg->keys && memcmp(cfg->keys[mi], sender_key, 32) != 0) {
                g->refused_denied++;
                snprintf(reason, n, "this connection's key is not worker %u's", h->sender);
                return PSNET__STATUS__STATUS_DENIED;
        }
        if (h->has_progress && !(h->progress >= 0.0f && h->progress <= 1.0f)) {
                snprintf(reason, n, "progress %g is not a share of the job (0 to 1)", (double) h->progress);
                return PSNET__STATUS__STATUS_INVALID;
        }
        return PSNET__STATUS__STATUS_OK;
}

/* Values per thread below which a loop over a chunk stays on one thread. */
#define GATE_MIN_PART (32u << 10)

/* gate_first_nonfinite over parts of a frame in parallel: the lowest index
 * any part found. */
typedef struct FiniteLoop {
        const unsigned char *p;
        _Atomic size_t first;
} FiniteLoop;

static void finite_range(void *arg, size_t lo, size_t hi) {
        FiniteLoop *l = arg;
        size_t at = lo + gate_first_nonfinite(l->p + 4 * lo, hi - lo);
        if (at == hi)
                return;
        size_t cur = atomic_load(&l->first);
        while (at < cur && !atomic_compare_exchange_weak(&l->first, &cur, at))
                ;
}

static size_t first_nonfinite_par(Pfor *pool, const unsigned char *p, size_t n) {
        FiniteLoop l = { .p = p };
        atomic_init(&l.first, n);
        pfor_run(pool, n, GATE_MIN_PART, finite_range, &l);
        return atomic_load(&l.first);
}

/* Key i of h, len floats at p: OK, or NOT_FINITE with the reason. */
static int admit_key(Gate *g, const Psnet__Header *h, size_t i, const unsigned char *p, size_t len, char *reason,
                     size_t n) {
        Store *s = g->store;
        size_t at = first_nonfinite_par(s->pool, p, len);
        if (at == len)
                return PSNET__STATUS__STATUS_OK;
        g->refused_nonfinite++;
        snprintf(reason, n, "the gradient of key (%u,%u) holds NaN or infinity at value %zu (the job refuses "
                 "non-finite gradients)", h->keys[i]->tensor, h->keys[i]->chunk, at);
        return PSNET__STATUS__STATUS_NOT_FINITE;
}

/* The sum of the squares of n floats at p (unaligned), in double: a 3e38
 * gradient's square does not overflow to infinity and pass for a bound. */
static double sum_squares(const unsigned char *p, size_t n) {
        double s[4] = { 0 };
        size_t i = 0;
        for (; i + 4 <= n; i += 4)
                for (size_t k = 0; k < 4; k++) {
                        float v;
                        memcpy(&v, p + 4 * (i + k), 4);
                        s[k] += (double) v * v;
                }
        for (; i < n; i++) {
                float v;
                memcpy(&v, p + 4 * i, 4);
                s[0] += (double) v * v;
        }
        return s[0] + s[1] + s[2] + s[3];
}

/* The job's --max-grad-norm against the push's values here (every key). */
static int admit_norm(Gate *g, const Psnet__Header *h, double sumsq, char *reason, size_t n) {
        double norm = sqrt(sumsq), bound = g->store->job.max_grad_norm;
        if (!(norm > bound)) /* NaN cannot get here: the non-finite check came first, or the job allows them */
                return PSNET__STATUS__STATUS_OK;
        g->refused_norm++;
        snprintf(reason, n, "the push's gradients here have an L2 norm of %.4g, above the job's --max-grad-norm %.4g "
                            "(%zu keys, worker %u)", norm, bound, h->n_keys, h->sender);
        return PSNET__STATUS__STATUS_INVALID;
}

/* Key i's values: frame i, or (frames NULL) read in place at at[i]. */
static const unsigned char *key_values(const Psnet__Header *h, const zmq_msg_t *frames, uint8_t *const *at, size_t i,
                                       size_t *len) {
        if (!frames) {
                *len = h->keys[i]->len;
                return at[i];
        }
        *len = zmq_msg_size((zmq_msg_t *) &frames[i]) / sizeof(float);
        return zmq_msg_data((zmq_msg_t *) &frames[i]);
}

/* Every key's values finite (unless the job allows otherwise), then all of
 * them within the job's --max-grad-norm (when it has one): one pass each. */
static int admit_values(Gate *g, const Psnet__Header *h, const zmq_msg_t *frames, uint8_t *const *at, char *reason,
                        size_t n) {
        const Job *job = &g->store->job;
        bool norm = job->max_grad_norm > 0.0f;
        double sumsq = 0;
        for (size_t i = 0; i < h->n_keys; i++) {
                size_t len;
                const unsigned char *p = key_values(h, frames, at, i, &len);
                int st = job->allow_nonfinite ? PSNET__STATUS__STATUS_OK : admit_key(g, h, i, p, len, reason, n);
                if (st != PSNET__STATUS__STATUS_OK)
                        return st;
                if (norm)
                        sumsq += sum_squares(p, len);
        }
        return norm ? admit_norm(g, h, sumsq, reason, n) : PSNET__STATUS__STATUS_OK;
}

int gate_admit_values(Gate *g, const Psnet__Header *h, const zmq_msg_t *frames, char *reason, size_t n) {
        return admit_values(g, h, frames, NULL, reason, n);
}

int gate_admit_keys(Gate *g, const Psnet__Header *h, uint8_t *const *at, char *reason, size_t n) {
        return admit_values(g, h, NULL, at, reason, n);
}

size_t gate_zero_nonfinite(Gate *g, float *v, size_t n) {
        Store *s = g->store;
        if (s->job.allow_nonfinite)
                return 0;
        size_t zeroed = 0;
        for (size_t at = first_nonfinite_par(s->pool, (const unsigned char *) v, n); at < n; at++)
                if (!isfinite(v[at])) {
                        v[at] = 0.0f;
                        zeroed++;
                }
        return zeroed;
}

int gate_admit_push(Gate *g, const Psnet__Header *h, const zmq_msg_t *frames, const uint8_t *sender_key,
                    char *reason, size_t n) {
        int st = gate_admit_sender(g, h, sender_key, reason, n);
        return st != PSNET__STATUS__STATUS_OK ? st : gate_admit_values(g, h, frames, reason, n);
}

/* Gradient data of a frame as aligned floats (copied into scratch if needed). */
static const float *grad_data(const zmq_msg_t *m, float *scratch, uint32_t len) {
        const float *g = wire_frame_f32(m);
        if (g)
                return g;
        memcpy(scratch, zmq_msg_data((zmq_msg_t *) m), (size_t) len * sizeof(float));
        return scratch;
}

/* One pass of a BSP mean over a chunk, in parts run by the pool (each value
 * alone, so the same bits with any number of threads). */
typedef enum SumOp {
        SUM_COPY,      /* sum = g */
        SUM_ADD,       /* sum += g */
        SUM_ADD_SCALE, /* sum = (sum + g) * k */
} SumOp;

typedef struct SumLoop {
        SumOp op;
        float *restrict sum;
        const float *restrict g;
        float k;
} SumLoop;

static void sum_range(void *arg, size_t lo, size_t hi) {
        const SumLoop *l = arg;
        float *restrict sum = l->sum;
        const float *restrict g = l->g;
        float k = l->k;
        switch (l->op) {
        case SUM_COPY:
                memcpy(sum + lo, g + lo, (hi - lo) * sizeof(float));
                break;
        case SUM_ADD:
                for (size_t j = lo; j < hi; j++)
                        sum[j] += g[j];
                break;
        case SUM_ADD_SCALE:
                for (size_t j = lo; j < hi; j++)
                        sum[j] = (sum[j] + g[j]) * k;
                break;
        }
}

static void sum_pass(Pfor *pool, SumOp op, float *sum, const float *g, float k, size_t n) {
        SumLoop l = { .op = op, .sum = sum, .g = g, .k = k };
        pfor_run(pool, n, GATE_MIN_PART, sum_range, &l);
}

static int cmp_pending(const void *a, const void *b) {
        const Pending *x = a, *y = b;
        return x->worker < y->worker ? -1 : x->worker > y->worker;
}

/* Closes c's clock if every member has pushed for it. Non-members' gradients
 * parked for the closing clock are refused (STALE), never silently dropped. */
static int chunk_settle(Gate *g, Chunk *c) {
        Store *s = g->store;
        const GateCfg *cfg = gate_cfg(g, c->clock);
        if (cfg->mode != MODE_BSP || c->npending == 0 || cfg->nmembers == 0)
                return 0;
        if (g->fenced && c->clock >= g->fence_limit)
                return 0;
        size_t have = 0;
        for (size_t i = 0; i < c->npending; i++) {
                /* Values a pull may see must be the backups' too: a push whose
                 * forwards are unanswered holds its clock open. */
                if (c->pending[i].req && c->pending[i].req->forwards > 0)
                        return 0;
                if (is_member(cfg, c->pending[i].worker))
                        have++;
        }
        if (have < cfg->nmembers)
                return 0;

        qsort(c->pending, c->npending, sizeof *c->pending, cmp_pending);
        /* Sum in worker-id order, scaled by 1/W in the same pass as the last term
         * ((g1 + g2) + g3) * (1/3): the result depends on nothing but the inputs.
         * A single member's aligned frame is used as it is (x * 1 == x). */
        float *sum = s->sum;
        const float *mean = sum;
        float inv = 1.0f / (float) have;
        float progress = -1.0f; /* the furthest any member's push says: the same under BSP */
        size_t used = 0;
        for (size_t i = 0; i < c->npending; i++) {
                Pending *p = &c->pending[i];
                if (!is_member(cfg, p->worker))
                        continue;
                progress = MAX(progress, p->progress);
                const float *g = wire_frame_f32(&p->grad);
                bool last = used + 1 == have;
                if (!g) {
                        /* Unaligned frame: accumulate through memcpy. */
                        float tmp;
                        const char *raw = zmq_msg_data(&p->grad);
                        for (uint32_t j = 0; j < c->len; j++) {
                                memcpy(&tmp, raw + (size_t) j * sizeof tmp, sizeof tmp);
                                float v = used ? sum[j] + tmp : tmp;
                                sum[j] = last ? v * inv : v;
                        }
                } else if (used == 0 && last)
                        mean = g;
                else
                        sum_pass(s->pool, used == 0 ? SUM_COPY : last ? SUM_ADD_SCALE : SUM_ADD, sum, g, inv,
                                 c->len);
                used++;
        }
        int r = store_apply(s, c, mean, 1.0f, MODE_BSP, used, c->clock, progress);
        c->clock++;

        /* Take the list before settling: acks may run arbitrary code. */
        Pending *list = c->pending;
        size_t n = c->npending;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        for (size_t i = 0; i < n; i++) {
                int st = r < 0 ? status_from_errno(r)
                         : is_member(cfg, list[i].worker) ? PSNET__STATUS__STATUS_OK : PSNET__STATUS__STATUS_STALE;
                zmq_msg_close(&list[i].grad);
                if (list[i].req)
                        pushreq_settle(g, list[i].req, st);
        }
        ps_free(list);
        return r;
}

/* Applies one worker's gradient on arrival (ASP, SSP), as 1/W of a step. */
static int chunk_apply_scaled(Gate *g, Chunk *c, const zmq_msg_t *grad, const GateCfg *cfg, int64_t clock,
                              float progress) {
        Store *s = g->store;
        const float *v = grad_data(grad, s->sum, c->len);
        /* Scaled in the optimizer's loop (g * 1 == g). The chunk clock is left
         * alone: it counts BSP clocks only (c->steps counts updates). */
        size_t w = MAX(cfg->nmembers, (size_t) 1);
        return store_apply(s, c, v, 1.0f / (float) w, cfg->mode, w, clock, progress);
}

/* Applies and acknowledges pushes parked under BSP whose clock is now governed by
 * ASP or SSP (a mode switch at a boundary). */
static int chunk_flush_async(Gate *g, Chunk *c) {
        Pending *list = c->pending;
        size_t n = c->npending;
        int r = 0;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        qsort(list, n, sizeof *list, cmp_pending);
        for (size_t i = 0; i < n; i++) {
                if (r == 0)
                        r = chunk_apply_scaled(g, c, &list[i].grad, gate_cfg(g, list[i].clock), list[i].clock,
                                               list[i].progress);
                zmq_msg_close(&list[i].grad);
                if (list[i].req)
                        pushreq_settle(g, list[i].req, r < 0 ? status_from_errno(r) : PSNET__STATUS__STATUS_OK);
        }
        ps_free(list);
        return r;
}

/* A new slot at the end of c's pending list, or NULL when out of memory. */
static Pending *pending_add(Chunk *c) {
        if (c->npending == c->cpending) {
                size_t n = c->cpending ? c->cpending * 2 : 4;
                Pending *p = ps_realloc(c->pending, n * sizeof *p);
                if (!p)
                        return NULL;
                c->pending = p;
                c->cpending = n;
        }
        if (c->npending == 0)
                c->pending_since = now_ms(); /* how long the others wait for the rest (gate_stragglers) */
        return &c->pending[c->npending++];
}

int gate_park_copy(Gate *g, Chunk *c, uint32_t worker, float progress, const void *grad, size_t bytes) {
        if (worker > GATE_MAX_WORKER_ID || bytes != (size_t) c->len * sizeof(float))
                return -EINVAL;
        int64_t *last = chunk_last_clock(c, worker), *wc = worker_clock(g, worker);
        if (!last || !wc)
                return -ENOMEM;
        Pending *p = pending_add(c);
        if (!p)
                return -ENOMEM;
        *p = (Pending) { .req = NULL, .worker = worker, .clock = c->clock, .progress = progress };
        if (zmq_msg_init_size(&p->grad, bytes) < 0) {
                c->npending--;
                return -ENOMEM;
        }
        memcpy(zmq_msg_data(&p->grad), grad, bytes);
        if (*last < c->clock)
                *last = c->clock;
        /* A primary's chunk moved here: its parked pushes were sent to this
         * chunk's owner. A backup's copy is not the worker's push to this shard
         * (see advance_worker). */
        if (!c->backup)
                clock_reached(wc, c->clock);
        return 0;
}

/* A worker's clock here counts the pushes it sent this shard itself. A copy
 * forwarded by another shard's primary says nothing of them: the worker's own
 * push of that clock to this shard may still be on its way, and a pull, an SSP
 * bound or a checkpoint's cut that took the copy for it would miss an update. */
static void advance_worker(int64_t *wc, const PushReq *req) {
        if (!req->replica && req->parts < 2)
                clock_reached(wc, req->clock);
}

_Static_assert(WIRE_MAX_PARTS % 64 == 0, "PartsIn.in holds a bit per part");

int gate_push_part(Gate *g, const PushReq *req) {
        if (req->replica || req->parts < 2 || req->parts > WIRE_MAX_PARTS || req->part >= req->parts ||
            req->worker > GATE_MAX_WORKER_ID)
                return 0;
        size_t had = g->nparts_in;
        if (ps_grow(&g->parts_in, &g->nparts_in, (size_t) req->worker + 1, sizeof *g->parts_in, 8) < 0)
                return -ENOMEM;
        for (size_t i = had; i < g->nparts_in; i++)
                g->parts_in[i] = (PartsIn) { .clock = -1 };
        g->push_parts++;
        PartsIn *t = &g->parts_in[req->worker];
        if (req->clock < t->clock || (req->clock == t->clock && req->epoch < t->epoch))
                return 0; /* a late copy of a push this worker has gone past */
        if (req->clock != t->clock || req->epoch != t->epoch || req->parts != t->parts)
                *t = (PartsIn) { .clock = req->clock, .epoch = req->epoch, .parts = req->parts };
        uint64_t bit = UINT64_C(1) << (req->part % 64);
        if (!(t->in[req->part / 64] & bit)) {
                t->in[req->part / 64] |= bit;
                t->nin++;
        }
        if (t->nin < t->parts)
                return 0;
        int64_t *wc = worker_clock(g, req->worker);
        if (!wc)
                return -ENOMEM;
        clock_reached(wc, req->clock);
        return 0;
}

int gate_push(Gate *g, Chunk *c, PushReq *req, zmq_msg_t *grad) {
        Store *s = g->store;
        if (req->worker > GATE_MAX_WORKER_ID || req->clock < 0) {
                pushreq_note(req, PSNET__STATUS__STATUS_INVALID);
                return 0;
        }
        int64_t *last = chunk_last_clock(c, req->worker);
        if (!last)
                return -ENOMEM;
        s->stats.pushes++;
        if (req->clock <= *last) {
                g->duplicates++;
                pushreq_note(req, PSNET__STATUS__STATUS_DUPLICATE);
                return 0;
        }
        int64_t *wc = worker_clock(g, req->worker);
        if (!wc)
                return -ENOMEM;
        const GateCfg *cfg = gate_cfg(g, req->clock);

        if (cfg->mode != MODE_BSP) {
                /* Each push counts as 1/W of a step, so W workers make one step's worth
                 * of progress per round, as under BSP (and the same lr suits both). */
                int r = chunk_apply_scaled(g, c, grad, cfg, req->clock, req->progress);
                if (r < 0)
                        return r;
                *last = req->clock;
                advance_worker(wc, req);
                return 0;
        }

        if (req->clock != c->clock) {
                /* Behind: that clock has closed without it. Ahead: not possible for a
                 * worker that pulled first; refuse rather than guess. */
                pushreq_note(req, PSNET__STATUS__STATUS_STALE);
                return 0;
        }
        Pending *p = pending_add(c);
        if (!p)
                return -ENOMEM;
        *p = (Pending) { .req = req->replica ? NULL : req, .worker = req->worker, .clock = req->clock,
                         .progress = req->progress };
        zmq_msg_init(&p->grad);
        zmq_msg_move(&p->grad, grad);
        if (!req->replica)
                req->remaining++;
        *last = req->clock;
        advance_worker(wc, req);
        return chunk_settle(g, c);
}

/* What a push's header says of it beyond its route, seq, sender and clock. */
static void pushreq_from_header(PushReq *req, const Psnet__Header *h) {
        if (h->has_progress)
                req->progress = h->progress;
        if (h->has_parts) {
                req->part = h->part;
                req->parts = h->parts;
                req->epoch = h->epoch;
        }
}

/* Key i of a push read where it lies (p->at): copied into a frame of its own
 * just before the gate takes it, so that what is applied is what was read
 * whatever the worker writes meanwhile. It was admitted finite; a value the
 * worker turned non-finite since (it owns the memory) is applied as 0 and
 * counted: the model never holds it. */
static int push_copied(Gate *g, Push *p, size_t i, PushReq *req) {
        size_t len = p->h->keys[i]->len;
        zmq_msg_t f;
        if (zmq_msg_init_size(&f, len * sizeof(float)) < 0) {
                log_error("Failed to apply push: out of memory for key (%u,%u)", p->h->keys[i]->tensor,
                          p->h->keys[i]->chunk);
                pushreq_note(req, PSNET__STATUS__STATUS_RESOURCE);
                return 0;
        }
        pfor_copy(g->store->pool, zmq_msg_data(&f), p->at[i], len * sizeof(float), STORE_MIN_COPY);
        p->zeroed += gate_zero_nonfinite(g, zmq_msg_data(&f), len);
        int r = gate_push(g, p->chunks[i], req, &f);
        zmq_msg_close(&f);
        return r;
}

/* The push's clock against the sender's last push of each of its keys here,
 * or the clock pscoord says it starts at (a worker it moved on, one that
 * joined) if that is later. A key it never pushed, or one that came with no
 * record of it: any clock. */
static int gate_admit_clock(Gate *g, const Push *p, char *reason, size_t n) {
        const Psnet__Header *h = p->h;
        int64_t own = clock_peek(g->wclock, g->nwclock, h->sender) - 1;
        for (size_t i = 0; i < h->n_keys; i++) {
                const Chunk *c = p->chunks[i];
                int64_t last = clock_peek(c->last_clock, c->nlast, h->sender);
                if (last < 0)
                        continue;
                last = MAX(last, own);
                if (h->clock > last + GATE_PUSH_AHEAD) {
                        g->refused_clock++;
                        snprintf(reason, n, "push for clock %ld is %ld clocks ahead of worker %u's last push of key "
                                            "(%u,%u), %ld (at most %d)",
                                 (long) h->clock, (long) (h->clock - last), h->sender, c->tensor, c->chunk,
                                 (long) last, GATE_PUSH_AHEAD);
                        return PSNET__STATUS__STATUS_INVALID;
                }
        }
        return PSNET__STATUS__STATUS_OK;
}

int gate_push_request(Gate *g, Push *p, char *reason, size_t n) {
        Store *s = g->store;
        const Psnet__Header *h = p->h;
        /* Admitted whole or not at all: first the sender (membership, its key,
         * its clock), before anything is decoded for it; then every value. */
        int st = gate_admit_sender(g, h, p->sender_key, reason, n);
        if (st == PSNET__STATUS__STATUS_OK)
                st = gate_admit_clock(g, p, reason, n);
        if (st == PSNET__STATUS__STATUS_OK && p->decode)
                st = p->decode(p, p->decode_ud, reason, n);
        if (st == PSNET__STATUS__STATUS_OK)
                st = p->frames ? gate_admit_values(g, h, p->frames, reason, n) : gate_admit_keys(g, h, p->at, reason, n);
        if (st != PSNET__STATUS__STATUS_OK)
                return st;
        uint32_t backups[JOB_MAX_REPLICAS];
        if (!p->frames && g->hooks.forward && store_backups(s, backups, ELEMENTSOF(backups)) > 0) {
                snprintf(reason, n, "internal: a push read in place cannot be forwarded to backups");
                return PSNET__STATUS__STATUS_INTERNAL;
        }
        PushReq *req;
        if (pushreq_new(p->route, h->seq, h->sender, h->clock, &req) < 0) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        pushreq_from_header(req, h);
        /* To the backups first (sharing the frames): acknowledged once they answer. */
        if (g->hooks.forward && p->frames) {
                st = g->hooks.forward(g->hooks.ud, req, h, p->forward ? p->forward : p->frames,
                                      p->forward ? p->forward_bf16 : false);
                if (st != PSNET__STATUS__STATUS_OK) {
                        pushreq_settle(g, req, st);
                        return PSNET__STATUS__STATUS_OK; /* taken: its answer says what became of it */
                }
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                int r = p->frames ? gate_push(g, p->chunks[i], req, &p->frames[i]) : push_copied(g, p, i, req);
                if (r < 0) {
                        log_error_errno(r, "Failed to apply push: %m");
                        pushreq_note(req, status_from_errno(r));
                }
        }
        int r = gate_push_part(g, req);
        if (r < 0) {
                log_error_errno(r, "Failed to count a push's part: %m");
                pushreq_note(req, status_from_errno(r));
        }
        pushreq_settle(g, req, PSNET__STATUS__STATUS_OK);
        return PSNET__STATUS__STATUS_OK;
}

int gate_settle(Gate *g) {
        Store *s = g->store;
        /* Only BSP clocks close (chunk_settle); every backup's answer comes here. */
        if (!s->has_job || !s->chunks || (g->cur.mode != MODE_BSP && g->prev.mode != MODE_BSP))
                return 0;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++)
                        if (s->chunks[t][k]) {
                                int r = chunk_settle(g, s->chunks[t][k]);
                                if (r < 0)
                                        return r;
                        }
        return 0;
}

static void chunk_leaving(Gate *g, Chunk *c) {
        Pending *list = c->pending;
        size_t n = c->npending;
        c->pending = NULL;
        c->npending = c->cpending = 0;
        for (size_t i = 0; i < n; i++) {
                uint32_t w = list[i].worker;
                if (w < c->nlast && c->last_clock[w] >= c->clock)
                        c->last_clock[w] = c->clock - 1; /* not applied: may come again */
                zmq_msg_close(&list[i].grad);
                if (list[i].req)
                        pushreq_settle(g, list[i].req, PSNET__STATUS__STATUS_MOVED);
        }
        ps_free(list);
}

static void chunk_demoted(Gate *g, Chunk *c) {
        for (size_t i = 0; i < c->npending; i++) {
                PushReq *req = c->pending[i].req;
                c->pending[i].req = NULL;
                if (req)
                        pushreq_settle(g, req, PSNET__STATUS__STATUS_MOVED);
        }
}

/* --- pulls ---------------------------------------------------------------------------- */

bool gate_pull_ready(Gate *g, Chunk *const *chunks, size_t n, int64_t clock, int64_t *ret_slowest) {
        const GateCfg *cfg = gate_cfg(g, clock);
        int64_t slowest = slowest_member(g, cfg);
        if (ret_slowest)
                *ret_slowest = slowest;
        if (cfg->mode != MODE_BSP && g->fenced && clock > g->fence_pull_limit)
                return false;
        switch (cfg->mode) {
        case MODE_ASP:
                return true;
        case MODE_SSP:
                return cfg->nmembers == 0 || slowest >= clock - (int64_t) cfg->staleness;
        case MODE_BSP:
        default:
                for (size_t i = 0; i < n; i++)
                        if (chunks[i]->clock < clock)
                                return false;
                /* Also every member of the previous clock pushed it (matters right
                 * after a switch from ASP/SSP, where pushes are applied on arrival). */
                if (clock > 0) {
                        const GateCfg *pc = gate_cfg(g, clock - 1);
                        if (pc->mode != MODE_BSP && pc->nmembers && slowest_member(g, pc) < clock)
                                return false;
                }
                return true;
        }
}

static size_t parked_by(const Gate *g, uint32_t worker) {
        size_t n = 0;
        for (size_t i = 0; i < g->nparked; i++)
                n += g->parked[i].hdr->sender == worker;
        return n;
}

int gate_pull(Gate *g, const zmq_msg_t *route, Psnet__Header **hdr, Chunk **chunks, uint64_t now, char *reason,
              size_t n) {
        Psnet__Header *h = *hdr;
        int64_t slowest;
        bool ready = gate_pull_ready(g, chunks, h->n_keys, h->clock, &slowest);
        if (ready) {
                if (gate_cfg(g, h->clock)->mode == MODE_SSP)
                        /* The SSP bound, observable by the tests: clock - slowest <= staleness. */
                        log_debug("ssp pull worker=%u clock=%ld slowest=%ld staleness=%u", h->sender, (long) h->clock,
                                  (long) slowest, gate_cfg(g, h->clock)->staleness);
                g->hooks.answer(g->hooks.ud, route, h, chunks, PSNET__STATUS__STATUS_OK, NULL, now);
                return 0;
        }
        /* It would wait: only a member may, for a clock it can reach, within bounds. */
        const GateCfg *cfg = gate_cfg(g, h->clock);
        if (!is_member(cfg, h->sender) && !is_member(&g->cur, h->sender)) {
                g->refused_pulls++;
                snprintf(reason, n, "worker %u is not a member of clock %ld: it may not wait for it", h->sender,
                         (long) h->clock);
                return PSNET__STATUS__STATUS_DENIED;
        }
        int64_t own = MAX(clock_peek(g->wclock, g->nwclock, h->sender), 0);
        /* A key that moved here carries its clock: a worker whose pushes have
         * not reached this shard yet (its push of the same round was answered
         * MIGRATING just before the key arrived) pulls within reach of it. */
        int64_t keys_at = -1; /* the least clock of the keys asked for */
        for (size_t i = 0; i < h->n_keys; i++)
                keys_at = keys_at < 0 ? chunks[i]->clock : MIN(keys_at, chunks[i]->clock);
        own = MAX(own, keys_at);
        if (h->clock > own + GATE_PULL_AHEAD) {
                g->refused_pulls++;
                snprintf(reason, n, "pull for clock %ld is %ld clocks ahead of worker %u's (at most %d)",
                         (long) h->clock, (long) (h->clock - own), h->sender, GATE_PULL_AHEAD);
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (g->nparked >= g->limits.max_parked || parked_by(g, h->sender) >= g->limits.max_parked_per_worker) {
                g->refused_pulls++;
                snprintf(reason, n, "too many pulls waiting (%zu in all, at most %zu; at most %zu per worker)",
                         g->nparked, g->limits.max_parked, g->limits.max_parked_per_worker);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        if (ps_grow(&g->parked, &g->cparked, g->nparked + 1, sizeof *g->parked, 8) < 0) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        ParkedPull *pp = &g->parked[g->nparked++];
        zmq_msg_init(&pp->route);
        zmq_msg_copy(&pp->route, (zmq_msg_t *) route);
        pp->hdr = h;
        pp->since = now;
        *hdr = NULL;
        return 0;
}

void gate_wake(Gate *g) {
        Store *s = g->store;
        char reason[192];
        size_t j = 0;
        for (size_t i = 0; i < g->nparked; i++) {
                ParkedPull *pp = &g->parked[i];
                Psnet__Header *h = pp->hdr;
                Chunk *stack[64], **chunks = h->n_keys <= 64 ? stack : ps_malloc(h->n_keys * sizeof *chunks);
                bool done = true;
                if (!chunks) {
                        g->parked[j++] = *pp;
                        continue;
                }
                int st = store_lookup_keys(s, h, chunks, reason, sizeof reason);
                if (st != PSNET__STATUS__STATUS_OK)
                        g->hooks.answer(g->hooks.ud, &pp->route, h, NULL, st, reason, pp->since); /* moved away meanwhile */
                else if (gate_pull_ready(g, chunks, h->n_keys, h->clock, NULL)) {
                        if (gate_cfg(g, h->clock)->mode == MODE_SSP) {
                                int64_t slowest;
                                (void) gate_pull_ready(g, chunks, h->n_keys, h->clock, &slowest);
                                log_debug("ssp pull worker=%u clock=%ld slowest=%ld staleness=%u", h->sender,
                                          (long) h->clock, (long) slowest, gate_cfg(g, h->clock)->staleness);
                        }
                        g->hooks.answer(g->hooks.ud, &pp->route, h, chunks, PSNET__STATUS__STATUS_OK, NULL, pp->since);
                } else
                        done = false;
                if (chunks != stack)
                        ps_free(chunks);
                if (done) {
                        zmq_msg_close(&pp->route);
                        psnet__header__free_unpacked(h, NULL);
                } else
                        g->parked[j++] = *pp;
        }
        g->nparked = j;
}

void gate_expire(Gate *g, uint64_t now) {
        char reason[128];
        size_t j = 0;
        for (size_t i = 0; i < g->nparked; i++) {
                ParkedPull *pp = &g->parked[i];
                if (now - pp->since < g->limits.park_timeout_ms) {
                        g->parked[j++] = *pp;
                        continue;
                }
                g->expired_pulls++;
                snprintf(reason, sizeof reason, "pull for clock %ld waited %lu s, longer than the shard keeps a pull",
                         (long) pp->hdr->clock, (unsigned long) ((now - pp->since) / 1000));
                g->hooks.answer(g->hooks.ud, &pp->route, pp->hdr, NULL, PSNET__STATUS__STATUS_RESOURCE, reason, pp->since);
                zmq_msg_close(&pp->route);
                psnet__header__free_unpacked(pp->hdr, NULL);
        }
        g->nparked = j;
}

size_t gate_stragglers(Gate *g, uint64_t now, uint32_t *ids, size_t max, uint64_t *ret_ms) {
        Store *s = g->store;
        size_t n = 0;
        *ret_ms = 0;
        if (!s->has_job || !s->chunks)
                return 0;
        /* BSP: the open clock with pushes parked longest, and the members missing from it. */
        Chunk *oldest = NULL;
        for (size_t t = 0; t < s->job.ntensors; t++)
                for (uint32_t k = 0; s->chunks[t] && k < s->job.tensors[t].nchunks; k++) {
                        Chunk *c = s->chunks[t][k];
                        if (!c || !c->npending)
                                continue;
                        if (!oldest || c->pending_since < oldest->pending_since)
                                oldest = c;
                }
        if (oldest) {
                const GateCfg *cfg = gate_cfg(g, oldest->clock);
                for (size_t i = 0; i < cfg->nmembers && n < max; i++) {
                        bool pushed = false;
                        for (size_t k = 0; k < oldest->npending && !pushed; k++)
                                pushed = oldest->pending[k].worker == cfg->members[i];
                        if (!pushed)
                                ids[n++] = cfg->members[i];
                }
                *ret_ms = now - oldest->pending_since;
                return n;
        }
        /* SSP: the oldest pull parked on the bound, and the members behind it. */
        const ParkedPull *oldest_pull = NULL;
        for (size_t i = 0; i < g->nparked; i++)
                if (gate_cfg(g, g->parked[i].hdr->clock)->mode == MODE_SSP &&
                    (!oldest_pull || g->parked[i].since < oldest_pull->since))
                        oldest_pull = &g->parked[i];
        if (!oldest_pull)
                return 0;
        const GateCfg *cfg = gate_cfg(g, oldest_pull->hdr->clock);
        int64_t need = oldest_pull->hdr->clock - (int64_t) cfg->staleness;
        for (size_t i = 0; i < cfg->nmembers && n < max; i++) {
                uint32_t w = cfg->members[i];
                int64_t wc = MAX(clock_peek(g->wclock, g->nwclock, w), 0);
                if (wc < need)
                        ids[n++] = w;
        }
        *ret_ms = n ? now - oldest_pull->since : 0;
        return n;
}

