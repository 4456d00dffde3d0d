/* SPDX-License-Identifier: Apache-2.0 */
/* A federated job's rounds on the shard; see psd-fedround.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>
#include "alloc.h"
#include "log.h"
#include "psd-fedround.h"
#include "psd-gate.h"
#include "secagg.h"

#define FED_ASYNC_MAX_UPDATES 4096u /* fedasync: updates a shard buffers at most */

/* fedasync: one client's update for one task, until a close names it. */
typedef struct AsyncUpdate {
        uint32_t client;
        uint64_t task;
        uint8_t key[32];            /* with CURVE: the connection's key of its first push */
        bool has_key;
        uint64_t examples;
        float **upd;                /* per slot: NULL until pushed */
} AsyncUpdate;

struct FedShard {
        uint64_t number;            /* the round open (0: none) */
        bool open;
        uint64_t aggregated;        /* the last round this shard aggregated (0: none) */
        uint32_t *clients;          /* ascending, as pscoord sent them */
        uint8_t (*keys)[32];        /* with CURVE, parallel to clients */
        size_t nclients;
        Chunk **slots;              /* the chunks this shard leads, when the round opened */
        size_t nslots;
        float **upd;                /* [client * nslots + slot]: NULL until pushed */
        uint64_t *examples;         /* per client (0: nothing pushed yet) */
        double *sq;                 /* per client: the squared L2 norm of what it pushed here */
        float **delta;              /* --strategy custom: the strategy's delta per slot (NULL until pushed) */
        uint64_t bytes;
        AsyncUpdate *au;            /* fedasync: the updates not aggregated yet */
        size_t nau, cap_au;
};

int fedshard_new(FedShard **ret) {
        *ret = ps_calloc(1, sizeof **ret);
        return *ret ? 0 : -ENOMEM;
}

static void async_drop(FedShard *f, size_t i) {
        AsyncUpdate *u = &f->au[i];
        for (size_t k = 0; u->upd && k < f->nslots; k++)
                if (u->upd[k]) {
                        f->bytes -= (uint64_t) f->slots[k]->len * sizeof(float);
                        ps_free(u->upd[k]);
                }
        ps_free(u->upd);
        f->au[i] = f->au[--f->nau];
}

void fedshard_reset(FedShard *f) {
        while (f->nau)
                async_drop(f, f->nau - 1);
        ps_free(f->au);
        f->au = NULL;
        f->cap_au = 0;
        for (size_t i = 0; f->upd && i < f->nclients * f->nslots; i++)
                ps_free(f->upd[i]);
        ps_free(f->upd);
        for (size_t i = 0; f->delta && i < f->nslots; i++)
                ps_free(f->delta[i]);
        ps_free(f->delta);
        f->delta = NULL;
        ps_free(f->clients);
        ps_free(f->keys);
        ps_free(f->slots);
        ps_free(f->examples);
        ps_free(f->sq);
        f->sq = NULL;
        f->upd = NULL;
        f->clients = NULL;
        f->keys = NULL;
        f->slots = NULL;
        f->examples = NULL;
        f->nclients = f->nslots = 0;
        f->bytes = 0;
        f->open = false;
}

FedShard *fedshard_free(FedShard *f) {
        if (f) {
                fedshard_reset(f);
                ps_free(f);
        }
        return NULL;
}

uint64_t fedshard_number(const FedShard *f) { return f->open ? f->number : 0; }
uint64_t fedshard_bytes(const FedShard *f) { return f->bytes; }

static void count_slot(Store *s, Chunk *c, void *ud) {
        FedShard *f = ud;
        (void) s;
        if (!c->backup) {
                if (f->slots)
                        f->slots[f->nslots] = c;
                c->fed_slot = (uint32_t) f->nslots;
                f->nslots++;
        }
}

/* fedasync: the chunks this shard leads, taken again whenever no update is
 * buffered (a chunk moved in meanwhile joins then). */
static int async_slots(FedShard *f, Store *s) {
        ps_free(f->slots);
        f->slots = NULL;
        f->nslots = 0;
        store_foreach(s, count_slot, f); /* counts */
        size_t nslots = f->nslots;
        f->nslots = 0;
        f->slots = ps_malloc((nslots ? nslots : 1) * sizeof *f->slots);
        if (!f->slots)
                return -ENOMEM;
        store_foreach(s, count_slot, f); /* fills */
        return 0;
}

static int round_open(FedShard *f, Store *s, const Psnet__Round *rd, uint64_t memory_limit, char *reason, size_t n) {
        fedshard_reset(f);
        if (rd->n_keys && rd->n_keys != rd->n_clients) {
                snprintf(reason, n, "round %lu names %zu clients and %zu keys", (unsigned long) rd->number,
                         rd->n_clients, rd->n_keys);
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        for (size_t i = 1; i < rd->n_clients; i++)
                if (rd->clients[i] <= rd->clients[i - 1]) {
                        snprintf(reason, n, "round %lu's clients are not in ascending order", (unsigned long) rd->number);
                        return PSNET__STATUS__STATUS_MALFORMED;
                }
        store_foreach(s, count_slot, f); /* counts */
        size_t nslots = f->nslots;
        uint64_t floats = 0;
        f->nslots = 0;
        f->slots = ps_malloc((nslots ? nslots : 1) * sizeof *f->slots);
        if (!f->slots)
                goto nomem;
        store_foreach(s, count_slot, f); /* fills */
        for (size_t i = 0; i < f->nslots; i++)
                floats += f->slots[i]->len;
        uint64_t need = floats * sizeof(float) * rd->n_clients;
        if (memory_limit && s->stats.bytes + need > memory_limit) {
                snprintf(reason, n, "round %lu's %zu updates need %.1f MiB on this shard beyond its %.1f MiB of "
                         "values; its memory limit is %.1f MiB (sample fewer clients, or add shards)",
                         (unsigned long) rd->number, rd->n_clients, (double) need / 1048576.0,
                         (double) s->stats.bytes / 1048576.0, (double) memory_limit / 1048576.0);
                fedshard_reset(f);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        size_t nc = rd->n_clients;
        f->clients = ps_malloc((nc ? nc : 1) * sizeof *f->clients);
        f->examples = ps_calloc(nc ? nc : 1, sizeof *f->examples);
        f->sq = ps_calloc(nc ? nc : 1, sizeof *f->sq);
        f->upd = ps_calloc(MAX(nc * f->nslots, (size_t) 1), sizeof *f->upd);
        if (rd->n_keys)
                f->keys = ps_malloc(nc * sizeof *f->keys);
        bool custom = s->job.fed.strategy.kind == FED_CUSTOM;
        if (custom)
                f->delta = ps_calloc(MAX(f->nslots, (size_t) 1), sizeof *f->delta);
        if (!f->clients || !f->examples || !f->sq || !f->upd || (rd->n_keys && !f->keys) || (custom && !f->delta))
                goto nomem;
        for (size_t i = 0; i < nc; i++) {
                f->clients[i] = rd->clients[i];
                if (rd->n_keys) {
                        if (rd->keys[i].len != 32) {
                                snprintf(reason, n, "round %lu: client %u's key is not 32 bytes",
                                         (unsigned long) rd->number, rd->clients[i]);
                                fedshard_reset(f);
                                return PSNET__STATUS__STATUS_MALFORMED;
                        }
                        memcpy(f->keys[i], rd->keys[i].data, 32);
                }
        }
        f->nclients = nc;
        f->number = rd->number;
        f->open = true;
        log_info("round open number=%lu clients=%zu chunks=%zu", (unsigned long) f->number, nc, f->nslots);
        return PSNET__STATUS__STATUS_OK;
nomem:
        fedshard_reset(f);
        snprintf(reason, n, "out of memory opening round %lu", (unsigned long) rd->number);
        return PSNET__STATUS__STATUS_RESOURCE;
}

/* A push's decoded frames (--compress) until the update keeps them. */
typedef struct Decoded {
        float **v;
        size_t n;
} Decoded;

static void decoded_freep(Decoded *d) {
        for (size_t i = 0; d->v && i < d->n; i++)
                ps_free(d->v[i]);
        ps_free(d->v);
}

static ssize_t client_index(const FedShard *f, uint32_t id) {
        size_t lo = 0, hi = f->nclients;
        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (f->clients[mid] == id)
                        return (ssize_t) mid;
                if (f->clients[mid] < id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return -1;
}

/* client_index of a client a request names, with the reason when the round
 * did not sample it. */
static ssize_t sampled_index(const FedShard *f, uint32_t id, char *reason, size_t n) {
        ssize_t ci = client_index(f, id);
        if (ci < 0)
                snprintf(reason, n, "client %u was not sampled for round %lu", id, (unsigned long) f->number);
        return ci;
}

/* n draws of N(0, 1) for a private round's noise: Box-Muller over uniforms
 * from libsodium's CSPRNG, so that no one can predict (and subtract) it. */
static void gaussian(float *out, size_t n) {
        for (size_t i = 0; i < n; i += 2) {
                uint64_t b[2];
                randombytes_buf(b, sizeof b);
                double u1 = (double) ((b[0] >> 11) + 1) * 0x1p-53, u2 = (double) (b[1] >> 11) * 0x1p-53;
                double r = sqrt(-2 * log(u1)), t = 2 * M_PI * u2;
                out[i] = (float) (r * cos(t));
                if (i + 1 < n)
                        out[i + 1] = (float) (r * sin(t));
        }
}

/* The seeds of a securely aggregated close, checked: every counted client
 * (survivor) is a peer of the mask stage with its self seed, every other
 * peer has its mask key (which must match its public key), and no client
 * has both (that would unmask it). seeds[i], parallel to peers: the self
 * seed of a survivor, the mask key of a dropped peer. */
static int secagg_seeds(const Psnet__Round *rd, const Psnet__SecAgg *sa, bool *surv, uint8_t (*seeds)[SECAGG_KEY],
                        char *reason, size_t n) {
        size_t np = sa->n_peers;
        _cleanup_free_ bool *have = ps_calloc(np ? np : 1, sizeof *have);
        if (!have)
                return PSNET__STATUS__STATUS_RESOURCE;
        for (size_t i = 0; i < np; i++) {
                const Psnet__SecAggPeer *pe = sa->peers[i];
                if (!pe->has_mask_key || pe->mask_key.len != SECAGG_KEY || (i && pe->client <= sa->peers[i - 1]->client)) {
                        snprintf(reason, n, "secure close of round %lu: peer %zu has no 32-byte mask key or is out of "
                                 "order", (unsigned long) rd->number, i);
                        return PSNET__STATUS__STATUS_MALFORMED;
                }
                surv[i] = false;
                for (size_t j = 0; j < rd->n_clients; j++)
                        surv[i] |= rd->clients[j] == pe->client;
        }
        size_t found = 0;
        for (size_t j = 0; j < rd->n_clients; j++)
                for (size_t i = 0; i < np; i++)
                        found += sa->peers[i]->client == rd->clients[j];
        if (found != rd->n_clients || rd->n_clients < 2) {
                snprintf(reason, n, "secure close of round %lu: %zu counted clients, %zu of them among the %zu peers "
                         "(at least 2, all peers)", (unsigned long) rd->number, rd->n_clients, found, np);
                return PSNET__STATUS__STATUS_INVALID;
        }
        for (size_t k = 0; k < sa->n_secrets; k++) {
                const Psnet__SecAggSecret *x = sa->secrets[k];
                size_t i = 0;
                while (i < np && sa->peers[i]->client != x->client)
                        i++;
                if (i == np || x->value.len != SECAGG_KEY || have[i]) {
                        snprintf(reason, n, "secure close of round %lu: secret %zu (client %u) is not one 32-byte "
                                 "secret of a peer", (unsigned long) rd->number, k, x->client);
                        return PSNET__STATUS__STATUS_MALFORMED;
                }
                if (x->self != surv[i]) {
                        snprintf(reason, n, "secure close of round %lu: client %u %s, but its %s came: refused (that "
                                 "would unmask it)", (unsigned long) rd->number, x->client,
                                 surv[i] ? "counts" : "does not count", x->self ? "self seed" : "mask key");
                        return PSNET__STATUS__STATUS_INVALID;
                }
                if (!x->self && !secagg_key_matches(x->value.data, sa->peers[i]->mask_key.data)) {
                        snprintf(reason, n, "secure close of round %lu: the mask key rebuilt for client %u does not "
                                 "match its public key", (unsigned long) rd->number, x->client);
                        return PSNET__STATUS__STATUS_INVALID;
                }
                memcpy(seeds[i], x->value.data, SECAGG_KEY);
                have[i] = true;
        }
        for (size_t i = 0; i < np; i++)
                if (!have[i]) {
                        snprintf(reason, n, "secure close of round %lu: no %s for client %u", (unsigned long) rd->number,
                                 surv[i] ? "self seed" : "mask key", sa->peers[i]->client);
                        return PSNET__STATUS__STATUS_INVALID;
                }
        return PSNET__STATUS__STATUS_OK;
}

/* A securely aggregated close: per chunk, the sum of the survivors' masked
 * updates mod 2^32, less their self masks and the pairwise masks they share
 * with the peers that dropped, read as int32, is sum_i q_i; over S and the
 * survivors' weight it is the (weighted) mean delta (common/secagg.h), noised
 * in a private job, and the strategy's server step takes it. idx/ex: the
 * survivors' places here and their example counts. */
static int secagg_close(FedShard *f, Store *s, const Psnet__Round *rd, const ssize_t *idx, const uint64_t *ex,
                        float *noise, char *reason, size_t n) {
        const Psnet__SecAgg *sa = rd->secagg;
        const FedConf *fc = &s->job.fed;
        size_t k = rd->n_clients;
        if (!sa || !sa->has_weight || sa->weight == 0 || sa->n_peers < k || sa->n_peers > SECAGG_MAX_CLIENTS) {
                snprintf(reason, n, "round %lu closes securely (--secagg): its peers, their seeds and weight come "
                         "with the close", (unsigned long) rd->number);
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        size_t np = sa->n_peers;
        _cleanup_free_ bool *surv = ps_calloc(np, sizeof *surv);
        _cleanup_free_ uint8_t (*seeds)[SECAGG_KEY] = ps_calloc(np, SECAGG_KEY);
        if (!surv || !seeds) {
                snprintf(reason, n, "out of memory closing round %lu", (unsigned long) rd->number);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        int st = secagg_seeds(rd, sa, surv, seeds, reason, n);
        if (st != PSNET__STATUS__STATUS_OK) {
                sodium_memzero(seeds, np * SECAGG_KEY);
                return st;
        }
        /* The pairwise seeds of each dropped peer with each survivor. */
        size_t nd = np - k;
        _cleanup_free_ uint8_t (*pair)[SECAGG_KEY] = ps_calloc(MAX(nd * k, (size_t) 1), SECAGG_KEY);
        _cleanup_free_ bool *sub = ps_calloc(MAX(nd * k, (size_t) 1), sizeof *sub);
        _cleanup_free_ size_t *spos = ps_calloc(k, sizeof *spos); /* survivor i's place among the peers */
        uint32_t maxlen = 0;
        for (size_t j = 0; j < f->nslots; j++)
                maxlen = MAX(maxlen, f->slots[j]->len);
        _cleanup_free_ uint32_t *acc = ps_malloc(MAX(maxlen, 1u) * sizeof *acc);
        _cleanup_free_ float *d = ps_malloc(MAX(maxlen, 1u) * sizeof *d);
        if (!pair || !sub || !spos || !acc || !d) {
                sodium_memzero(seeds, np * SECAGG_KEY);
                snprintf(reason, n, "out of memory closing round %lu", (unsigned long) rd->number);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        for (size_t i = 0; i < k; i++)
                for (size_t p = 0; p < np; p++)
                        if (sa->peers[p]->client == rd->clients[i])
                                spos[i] = p;
        size_t m = 0;
        for (size_t p = 0; p < np && st == PSNET__STATUS__STATUS_OK; p++) {
                if (surv[p])
                        continue;
                for (size_t i = 0; i < k; i++, m++) {
                        /* Survivor i added +PRG(s) for a peer with a larger id, -PRG(s) otherwise. */
                        sub[m] = rd->clients[i] < sa->peers[p]->client;
                        if (secagg_pair_seed(seeds[p], sa->peers[p]->mask_key.data,
                                             sa->peers[spos[i]]->mask_key.data, pair[m]) < 0) {
                                snprintf(reason, n, "secure close of round %lu: client %u's mask key gives no "
                                         "agreement", (unsigned long) rd->number, rd->clients[i]);
                                st = PSNET__STATUS__STATUS_INVALID;
                                break;
                        }
                }
        }
        if (st != PSNET__STATUS__STATUS_OK) {
                sodium_memzero(seeds, np * SECAGG_KEY);
                sodium_memzero(pair, nd * k * SECAGG_KEY);
                return st;
        }
        bool dp = fc->strategy.dp_clip > 0;
        double scale = secagg_scale(sa->weight, fc->secagg_clip), w3 = 0;
        for (size_t i = 0; i < k; i++)
                w3 += dp ? 1.0 : (double) ex[i];
        double sd = noise ? (double) fc->strategy.dp_noise * fc->strategy.dp_clip : 0;
        for (size_t j = 0; j < f->nslots; j++) {
                Chunk *c = f->slots[j];
                uint64_t off = (uint64_t) c->chunk * s->job.chunk_floats;
                memset(acc, 0, (size_t) c->len * sizeof *acc);
                for (size_t i = 0; i < k; i++) {
                        const unsigned char *y = (const unsigned char *) f->upd[(size_t) idx[i] * f->nslots + j];
                        for (uint32_t q = 0; q < c->len; q++) {
                                uint32_t v;
                                memcpy(&v, y + (size_t) q * sizeof v, sizeof v);
                                acc[q] += v;
                        }
                        secagg_mask(acc, c->len, off, seeds[spos[i]], rd->number, c->tensor, true);
                }
                for (size_t q = 0; q < nd * k; q++)
                        secagg_mask(acc, c->len, off, pair[q], rd->number, c->tensor, sub[q]);
                if (noise)
                        gaussian(noise, c->len);
                for (uint32_t q = 0; q < c->len; q++) {
                        double sum = (double) (int32_t) acc[q] / scale;
                        d[q] = (float) ((sum + sd * (noise ? noise[q] : 0)) / w3);
                }
                int r = store_fed_step(s, c, d);
                if (r < 0) {
                        snprintf(reason, n, "round %lu: aggregating key %u/%u failed: %s", (unsigned long) rd->number,
                                 c->tensor, c->chunk, strerror(-r));
                        st = PSNET__STATUS__STATUS_INTERNAL;
                        break;
                }
        }
        sodium_memzero(seeds, np * SECAGG_KEY);
        sodium_memzero(pair, MAX(nd * k, (size_t) 1) * SECAGG_KEY);
        if (st == PSNET__STATUS__STATUS_OK)
                log_info("round unmasked number=%lu survivors=%zu dropped=%zu weight=%lu", (unsigned long) rd->number,
                         k, nd, (unsigned long) sa->weight);
        else
                fedshard_reset(f);
        return st;
}

static int round_close(FedShard *f, Store *s, const Psnet__Round *rd, char *reason, size_t n) {
        if (!f->open && rd->number == f->aggregated && rd->n_clients > 0) {
                /* The close again, from a pscoord restarted before it recorded
                 * the round: it was applied once, here, and that stands. */
                log_info("round closed again: aggregated already number=%lu", (unsigned long) rd->number);
                return PSNET__STATUS__STATUS_OK;
        }
        if (!f->open || rd->number != f->number) {
                snprintf(reason, n, "round %lu is not open on this shard (%s %lu)", (unsigned long) rd->number,
                         f->open ? "it has round" : "last round", (unsigned long) f->number);
                return PSNET__STATUS__STATUS_INVALID;
        }
        size_t k = rd->n_clients;
        if (k == 0) {
                log_info("round dropped number=%lu", (unsigned long) f->number);
                fedshard_reset(f);
                return PSNET__STATUS__STATUS_OK;
        }
        _cleanup_free_ ssize_t *idx = ps_malloc(k * sizeof *idx);
        _cleanup_free_ const float **u = ps_malloc(k * sizeof *u);
        _cleanup_free_ uint64_t *ex = ps_malloc(k * sizeof *ex);
        uint32_t maxlen = 0;
        for (size_t j = 0; j < f->nslots; j++)
                maxlen = MAX(maxlen, f->slots[j]->len);
        bool noisy = s->job.fed.strategy.dp_noise > 0;
        _cleanup_free_ float *scratch = ps_malloc(((size_t) MAX(k, (size_t) 1) * 2 + maxlen) * sizeof *scratch);
        _cleanup_free_ float *noise = noisy ? ps_malloc(MAX(maxlen, 1u) * sizeof *noise) : NULL;
        if (noisy && sodium_init() < 0) {
                snprintf(reason, n, "round %lu: libsodium, the noise's random source, failed to start",
                         (unsigned long) f->number);
                return PSNET__STATUS__STATUS_INTERNAL;
        }
        if (!idx || !u || !ex || !scratch || (noisy && !noise)) {
                snprintf(reason, n, "out of memory closing round %lu", (unsigned long) f->number);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        /* Every named client has its whole update here, or nothing changes. */
        for (size_t i = 0; i < k; i++) {
                idx[i] = client_index(f, rd->clients[i]);
                if (idx[i] < 0) {
                        snprintf(reason, n, "round %lu: client %u was not sampled", (unsigned long) f->number,
                                 rd->clients[i]);
                        return PSNET__STATUS__STATUS_INVALID;
                }
                ex[i] = f->examples[idx[i]];
                for (size_t j = 0; j < f->nslots; j++)
                        if (!f->upd[(size_t) idx[i] * f->nslots + j]) {
                                snprintf(reason, n, "round %lu: client %u's update of key %u/%u never came here",
                                         (unsigned long) f->number, rd->clients[i], f->slots[j]->tensor,
                                         f->slots[j]->chunk);
                                return PSNET__STATUS__STATUS_INVALID;
                        }
        }
        if (s->job.fed.secagg) {
                int st = secagg_close(f, s, rd, idx, ex, noise, reason, n);
                if (st != PSNET__STATUS__STATUS_OK)
                        return st;
        }
        bool custom = s->job.fed.strategy.kind == FED_CUSTOM;
        for (size_t j = 0; custom && j < f->nslots; j++)
                if (!f->delta[j]) {
                        snprintf(reason, n, "round %lu: the strategy's delta of key %u/%u never came here",
                                 (unsigned long) f->number, f->slots[j]->tensor, f->slots[j]->chunk);
                        return PSNET__STATUS__STATUS_INVALID;
                }
        for (size_t j = 0; custom && j < f->nslots; j++) {
                int r = store_fed_step(s, f->slots[j], f->delta[j]);
                if (r < 0) {
                        snprintf(reason, n, "round %lu: applying the strategy's delta to key %u/%u failed: %s",
                                 (unsigned long) f->number, f->slots[j]->tensor, f->slots[j]->chunk, strerror(-r));
                        fedshard_reset(f);
                        return PSNET__STATUS__STATUS_INTERNAL;
                }
        }
        for (size_t j = 0; !s->job.fed.secagg && !custom && j < f->nslots; j++) {
                for (size_t i = 0; i < k; i++)
                        u[i] = f->upd[(size_t) idx[i] * f->nslots + j];
                if (noisy)
                        gaussian(noise, f->slots[j]->len);
                int r = store_fed_apply(s, f->slots[j], u, ex, k, noise, scratch);
                if (r < 0) {
                        /* Checked as they came: only a bug or memory gets here. */
                        snprintf(reason, n, "round %lu: aggregating key %u/%u failed: %s", (unsigned long) f->number,
                                 f->slots[j]->tensor, f->slots[j]->chunk, strerror(-r));
                        fedshard_reset(f);
                        return PSNET__STATUS__STATUS_INTERNAL;
                }
        }
        f->aggregated = f->number;
        log_info("round aggregated number=%lu round=%u clients=%zu chunks=%zu strategy=%s dp_clip=%g dp_noise=%g",
                 (unsigned long) f->number, rd->has_round ? rd->round : 0, k, f->nslots,
                 fed_strategy_name(s->job.fed.strategy.kind), (double) s->job.fed.strategy.dp_clip,
                 (double) s->job.fed.strategy.dp_noise);
        fedshard_reset(f);
        return PSNET__STATUS__STATUS_OK;
}

/* fedasync: applies the named (client, task) updates, each weighing its
 * examples x (1 + staleness)^-A (the robust strategies: unweighted), and
 * drops them, and any update of a task below the watermark. */
static int async_close(FedShard *f, Store *s, const Psnet__Round *rd, char *reason, size_t n) {
        size_t k = rd->n_clients;
        if (rd->n_tasks != k || rd->n_staleness != k || (rd->n_keys && rd->n_keys != k)) {
                snprintf(reason, n, "a fedasync close names %zu clients, %zu tasks, %zu staleness figures and %zu keys",
                         k, rd->n_tasks, rd->n_staleness, rd->n_keys);
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        _cleanup_free_ size_t *idx = ps_malloc(MAX(k, (size_t) 1) * sizeof *idx);
        _cleanup_free_ double *w = ps_malloc(MAX(k, (size_t) 1) * sizeof *w);
        _cleanup_free_ uint64_t *ex = ps_malloc(MAX(k, (size_t) 1) * sizeof *ex);
        _cleanup_free_ const float **u = ps_malloc(MAX(k, (size_t) 1) * sizeof *u);
        _cleanup_free_ bool *drop = ps_calloc(MAX(f->nau, (size_t) 1), sizeof *drop);
        uint32_t maxlen = 0;
        for (size_t j = 0; j < f->nslots; j++)
                maxlen = MAX(maxlen, f->slots[j]->len);
        _cleanup_free_ float *scratch = ps_malloc(((size_t) MAX(k, (size_t) 1) * 2 + maxlen) * sizeof *scratch);
        if (!idx || !w || !ex || !u || !drop || !scratch) {
                snprintf(reason, n, "out of memory applying a buffer");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        double wsum = 0;
        uint32_t smax = 0;
        for (size_t i = 0; i < k; i++) {
                size_t e = 0;
                while (e < f->nau && (f->au[e].client != rd->clients[i] || f->au[e].task != rd->tasks[i]))
                        e++;
                bool whole = e < f->nau;
                for (size_t j = 0; whole && j < f->nslots; j++)
                        whole = f->au[e].upd[j] != NULL;
                if (!whole || drop[e]) {
                        snprintf(reason, n, "client %u's update of task %lu %s", rd->clients[i],
                                 (unsigned long) rd->tasks[i], e < f->nau && drop[e] ? "is named twice" :
                                 "never came here whole");
                        return PSNET__STATUS__STATUS_INVALID;
                }
                if (rd->n_keys && (rd->keys[i].len != 32 || !f->au[e].has_key ||
                                   memcmp(rd->keys[i].data, f->au[e].key, 32) != 0)) {
                        snprintf(reason, n, "client %u's update of task %lu came over another key", rd->clients[i],
                                 (unsigned long) rd->tasks[i]);
                        return PSNET__STATUS__STATUS_INVALID;
                }
                drop[e] = true;
                idx[i] = e;
                ex[i] = f->au[e].examples;
                w[i] = (double) ex[i] * pow(1.0 + rd->staleness[i], -(double) s->job.fed.staleness_exp);
                wsum += w[i];
                smax = MAX(smax, rd->staleness[i]);
        }
        bool robust = s->job.fed.strategy.kind == FED_MEDIAN || s->job.fed.strategy.kind == FED_TRIMMED_MEAN;
        for (size_t j = 0; k > 0 && j < f->nslots; j++) {
                Chunk *c = f->slots[j];
                for (size_t i = 0; i < k; i++)
                        u[i] = f->au[idx[i]].upd[j];
                int r;
                if (robust)
                        r = store_fed_apply(s, c, u, ex, k, NULL, scratch);
                else {
                        for (uint32_t q = 0; q < c->len; q++) {
                                double sum = 0;
                                for (size_t i = 0; i < k; i++)
                                        sum += w[i] * u[i][q];
                                scratch[q] = (float) (sum / wsum);
                        }
                        r = store_fed_step(s, c, scratch);
                }
                if (r < 0) {
                        snprintf(reason, n, "applying a buffer to key %u/%u failed: %s", c->tensor, c->chunk,
                                 strerror(-r));
                        return PSNET__STATUS__STATUS_INTERNAL;
                }
        }
        size_t old = 0;
        for (size_t e = f->nau; e-- > 0;)
                if (drop[e] || (rd->has_watermark && f->au[e].task < rd->watermark)) {
                        old += !drop[e];
                        async_drop(f, e);
                }
        log_info("buffer applied round=%u updates=%zu staleness_max=%u dropped_old=%zu buffered=%zu",
                 rd->has_round ? rd->round : 0, k, smax, old, f->nau);
        return PSNET__STATUS__STATUS_OK;
}

int fedshard_score(FedShard *f, Store *s, const Psnet__Round *rd, double **ret, size_t *ret_n, char *reason,
                   size_t n) {
        *ret = NULL;
        *ret_n = 0;
        if (!s->has_job || s->job.mode != MODE_FED || s->job.fed.async || !fed_is_krum(s->job.fed.strategy.kind)) {
                snprintf(reason, n, "this shard's job does not pick updates by Krum scores");
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (!f->open || rd->number != f->number) {
                snprintf(reason, n, "round %lu is not open on this shard (%s %lu)", (unsigned long) rd->number,
                         f->open ? "it has round" : "last round", (unsigned long) f->number);
                return PSNET__STATUS__STATUS_INVALID;
        }
        size_t k = rd->n_clients;
        if (k < 1 || k > f->nclients) {
                snprintf(reason, n, "round %lu: %zu clients to score, of %zu sampled", (unsigned long) rd->number, k,
                         f->nclients);
                return PSNET__STATUS__STATUS_INVALID;
        }
        _cleanup_free_ ssize_t *idx = ps_malloc(k * sizeof *idx);
        size_t npairs = k * (k - 1) / 2;
        double *d = ps_calloc(MAX(npairs, (size_t) 1), sizeof *d);
        if (!idx || !d) {
                ps_free(d);
                snprintf(reason, n, "out of memory scoring round %lu", (unsigned long) rd->number);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        for (size_t i = 0; i < k; i++) {
                idx[i] = client_index(f, rd->clients[i]);
                bool whole = idx[i] >= 0;
                for (size_t j = 0; whole && j < f->nslots; j++)
                        whole = f->upd[(size_t) idx[i] * f->nslots + j] != NULL;
                if (!whole) {
                        ps_free(d);
                        snprintf(reason, n, "round %lu: client %u's update is not whole here", (unsigned long) f->number,
                                 rd->clients[i]);
                        return PSNET__STATUS__STATUS_INVALID;
                }
        }
        /* Squared distances over this shard's chunks, summed in double. */
        size_t q = 0;
        for (size_t a = 0; a < k; a++)
                for (size_t b = a + 1; b < k; b++, q++)
                        for (size_t j = 0; j < f->nslots; j++) {
                                const float *x = f->upd[(size_t) idx[a] * f->nslots + j];
                                const float *y = f->upd[(size_t) idx[b] * f->nslots + j];
                                double sum = 0;
                                for (uint32_t v = 0; v < f->slots[j]->len; v++) {
                                        double e = (double) x[v] - y[v];
                                        sum += e * e;
                                }
                                d[q] += sum;
                        }
        log_info("round scored number=%lu clients=%zu chunks=%zu", (unsigned long) f->number, k, f->nslots);
        *ret = d;
        *ret_n = npairs;
        return PSNET__STATUS__STATUS_OK;
}

int fedshard_round(FedShard *f, Store *s, const Psnet__Round *rd, uint64_t memory_limit, char *reason, size_t n) {
        if (!s->has_job || s->job.mode != MODE_FED) {
                snprintf(reason, n, "this shard has no federated job");
                return PSNET__STATUS__STATUS_NO_JOB;
        }
        if (s->job.fed.async) {
                if (rd->has_close && rd->close)
                        return async_close(f, s, rd, reason, n);
                snprintf(reason, n, "a fedasync job has no rounds to open: updates come as clients finish");
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (rd->has_evaluate && rd->evaluate) {
                snprintf(reason, n, "a shard does not evaluate");
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (rd->has_close && rd->close)
                return round_close(f, s, rd, reason, n);
        if (store_incoming(s) > 0) {
                snprintf(reason, n, "%lu keys have not arrived here yet", (unsigned long) store_incoming(s));
                return PSNET__STATUS__STATUS_MIGRATING;
        }
        return round_open(f, s, rd, memory_limit, reason, n);
}

/* One client's push into row (its update, one buffer per slot), in the
 * codec the job takes (fedshard_push checked it): every frame checked (decoded, finite, the private norm)
 * before anything is kept; DUPLICATE when row holds every key already. sq:
 * the squares this client pushed here so far (private jobs), or NULL. */
static int take_update(FedShard *f, Store *s, const Psnet__Header *h, Chunk **chunks, const zmq_msg_t *frames,
                       float **row, double *sq_so_far, uint32_t client, char *reason, size_t n) {
        bool masked = h->codec == PSNET__CODEC__CODEC_MASKED;
        /* The strategy's delta comes RAW whatever the clients' --compress. */
        CompressKind ck = h->strategy_delta ? COMPRESS_NONE : s->job.fed.compress;
        /* Compressed frames are decoded first; the decoded values are kept. */
        _cleanup_(decoded_freep) Decoded dec = { .n = ck != COMPRESS_NONE ? h->n_keys : 0 };
        if (dec.n && !(dec.v = ps_calloc(dec.n, sizeof *dec.v))) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        /* Checked whole before anything is kept. A masked update is uniformly
         * random here: no value or norm to check (the client clamped it). */
        bool dup = true;
        double sq = 0, clip = masked || !sq_so_far ? 0 : s->job.fed.strategy.dp_clip;
        for (size_t i = 0; i < h->n_keys; i++) {
                Chunk *c = chunks[i];
                if (c->fed_slot >= f->nslots || f->slots[c->fed_slot] != c) {
                        snprintf(reason, n, "key %u/%u came here after the round (or buffer) opened", c->tensor,
                                 c->chunk);
                        return PSNET__STATUS__STATUS_UNAVAILABLE;
                }
                if (dec.n) {
                        size_t fs = zmq_msg_size((zmq_msg_t *) &frames[i]);
                        if (!(dec.v[i] = ps_malloc((size_t) c->len * sizeof(float)))) {
                                snprintf(reason, n, "out of memory");
                                return PSNET__STATUS__STATUS_RESOURCE;
                        }
                        int r = compress_decode(ck, zmq_msg_data((zmq_msg_t *) &frames[i]), fs, c->len, dec.v[i]);
                        if (r < 0) {
                                snprintf(reason, n, "key %u/%u: a %s frame of %zu bytes for %u values: %s", c->tensor,
                                         c->chunk, compress_name(ck), fs, c->len,
                                         r == -ERANGE ? "a value is not finite" : r == -EINVAL ?
                                         "an index is out of order or range" : "its size cannot be");
                                return r == -ERANGE ? PSNET__STATUS__STATUS_NOT_FINITE : r == -EINVAL ?
                                       PSNET__STATUS__STATUS_INVALID : PSNET__STATUS__STATUS_SIZE;
                        }
                } else if (zmq_msg_size((zmq_msg_t *) &frames[i]) != (size_t) c->len * sizeof(float)) {
                        snprintf(reason, n, "key %u/%u: frame of %zu bytes, the key has %u floats", c->tensor, c->chunk,
                                 zmq_msg_size((zmq_msg_t *) &frames[i]), c->len);
                        return PSNET__STATUS__STATUS_SIZE;
                }
                bool have = row[c->fed_slot] != NULL;
                dup &= have;
                const unsigned char *v = dec.n ? (const unsigned char *) dec.v[i]
                                               : (const unsigned char *) zmq_msg_data((zmq_msg_t *) &frames[i]);
                size_t at = masked || dec.n ? c->len : gate_first_nonfinite(v, c->len);
                if (at < c->len) {
                        snprintf(reason, n, "key %u/%u: value %zu is not finite", c->tensor, c->chunk, at);
                        return PSNET__STATUS__STATUS_NOT_FINITE;
                }
                /* Private rounds: the squares, read through memcpy (a frame may sit
                 * anywhere in ZeroMQ's receive buffer). */
                for (uint32_t k = 0; clip > 0 && !have && k < c->len; k++) {
                        float x;
                        memcpy(&x, v + (size_t) k * sizeof x, sizeof x);
                        sq += (double) x * x;
                }
        }
        if (dup)
                return PSNET__STATUS__STATUS_DUPLICATE;
        /* Private rounds: what reaches this shard is part of the update, so its
         * norm is at most the whole one's, which the client clipped to C (with
         * the float rounding of its scaling). */
        if (clip > 0 && sqrt(*sq_so_far + sq) > clip * (1 + 1e-4)) {
                snprintf(reason, n, "client %u's update has L2 norm %.6g on this shard alone, above the job's clip "
                         "norm %g (--dp-clip): a private round takes only clipped updates",
                         client, sqrt(*sq_so_far + sq), clip);
                return PSNET__STATUS__STATUS_INVALID;
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                Chunk *c = chunks[i];
                float **slot = &row[c->fed_slot];
                if (*slot)
                        continue;
                if (dec.n) {
                        *slot = dec.v[i];
                        dec.v[i] = NULL;
                        f->bytes += (uint64_t) c->len * sizeof(float);
                        continue;
                }
                *slot = ps_malloc((size_t) c->len * sizeof(float));
                if (!*slot) {
                        snprintf(reason, n, "out of memory");
                        return PSNET__STATUS__STATUS_RESOURCE;
                }
                memcpy(*slot, zmq_msg_data((zmq_msg_t *) &frames[i]), (size_t) c->len * sizeof(float));
                f->bytes += (uint64_t) c->len * sizeof(float);
        }
        if (sq_so_far)
                *sq_so_far += sq;
        s->stats.pushes++;
        return PSNET__STATUS__STATUS_OK;
}

/* fedasync: the update of (client, task), made when its first push comes. */
static int async_entry(FedShard *f, Store *s, const Psnet__Header *h, const uint8_t *key, uint64_t memory_limit,
                       AsyncUpdate **ret, char *reason, size_t n) {
        for (size_t i = 0; i < f->nau; i++)
                if (f->au[i].client == h->sender && f->au[i].task == (uint64_t) h->clock) {
                        if (f->au[i].has_key && (!key || memcmp(key, f->au[i].key, 32) != 0)) {
                                snprintf(reason, n, "the key of this connection is not that of client %u's first push",
                                         h->sender);
                                return PSNET__STATUS__STATUS_DENIED;
                        }
                        if (f->au[i].examples != h->examples) {
                                snprintf(reason, n, "client %u said %lu examples before, %lu now", h->sender,
                                         (unsigned long) f->au[i].examples, (unsigned long) h->examples);
                                return PSNET__STATUS__STATUS_INVALID;
                        }
                        *ret = &f->au[i];
                        return PSNET__STATUS__STATUS_OK;
                }
        if (f->nau == 0 && async_slots(f, s) < 0) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        uint64_t floats = 0;
        for (size_t i = 0; i < f->nslots; i++)
                floats += f->slots[i]->len;
        if (f->nau >= FED_ASYNC_MAX_UPDATES ||
            (memory_limit && s->stats.bytes + f->bytes + floats * sizeof(float) > memory_limit)) {
                snprintf(reason, n, "this shard buffers %zu updates (%.1f MiB) and can take no more (at most %u, "
                         "memory limit %.1f MiB): aggregate with a smaller --buffer, or add shards", f->nau,
                         (double) f->bytes / 1048576.0, FED_ASYNC_MAX_UPDATES, (double) memory_limit / 1048576.0);
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        if (ps_grow(&f->au, &f->cap_au, f->nau + 1, sizeof *f->au, 16) < 0) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        AsyncUpdate *u = &f->au[f->nau];
        memset(u, 0, sizeof *u);
        u->upd = ps_calloc(MAX(f->nslots, (size_t) 1), sizeof *u->upd);
        if (!u->upd) {
                snprintf(reason, n, "out of memory");
                return PSNET__STATUS__STATUS_RESOURCE;
        }
        u->client = h->sender;
        u->task = (uint64_t) h->clock;
        u->examples = h->examples;
        if (key) {
                memcpy(u->key, key, 32);
                u->has_key = true;
        }
        f->nau++;
        *ret = u;
        return PSNET__STATUS__STATUS_OK;
}

/* Whether a client's or the strategy's request names the round open here
 * (h->clock); if not, the reason says so (then more). */
static bool names_open_round(const FedShard *f, const Psnet__Header *h, const char *more, char *reason, size_t n) {
        if (f->open && (uint64_t) h->clock == f->number)
                return true;
        snprintf(reason, n, "round %ld is not open on this shard (%s %lu)%s", (long) h->clock,
                 f->open ? "round" : "last round", (unsigned long) f->number, more);
        return false;
}

/* --strategy custom: the strategy's delta for the open round. */
static int delta_push(FedShard *f, Store *s, const Psnet__Header *h, Chunk **chunks, const zmq_msg_t *frames,
                      char *reason, size_t n) {
        if (s->job.fed.strategy.kind != FED_CUSTOM) {
                snprintf(reason, n, "this job's strategy is %s: it takes no strategy's delta",
                         fed_strategy_name(s->job.fed.strategy.kind));
                return PSNET__STATUS__STATUS_INVALID;
        }
        if (h->dtype != PSNET__DTYPE__DTYPE_F32 || h->codec != PSNET__CODEC__CODEC_RAW) {
                snprintf(reason, n, "a strategy's delta comes as f32 (codec RAW)");
                return PSNET__STATUS__STATUS_DTYPE;
        }
        if (!names_open_round(f, h, "", reason, n))
                return PSNET__STATUS__STATUS_STALE;
        if (!f->delta) { /* opened before the job was a custom one's: a new job resets the round */
                snprintf(reason, n, "round %ld opened under another strategy", (long) h->clock);
                return PSNET__STATUS__STATUS_STALE;
        }
        /* The last delta pushed stands: a strategy that replaced one that left
         * mid-round pushes all of its own, and no chunk keeps the other's. */
        for (size_t i = 0; i < h->n_keys; i++) {
                Chunk *c = chunks[i];
                if (c->fed_slot < f->nslots && f->slots[c->fed_slot] == c && f->delta[c->fed_slot]) {
                        ps_free(f->delta[c->fed_slot]);
                        f->delta[c->fed_slot] = NULL;
                        f->bytes -= (uint64_t) c->len * sizeof(float);
                }
        }
        return take_update(f, s, h, chunks, frames, f->delta, NULL, h->sender, reason, n);
}

int fedshard_update_frames(FedShard *f, Store *s, const Psnet__Header *h, Chunk **chunks, zmq_msg_t *frames,
                           char *reason, size_t n) {
        if (s->job.fed.strategy.kind != FED_CUSTOM) {
                snprintf(reason, n, "this job's strategy is %s: no one reads a client's update",
                         fed_strategy_name(s->job.fed.strategy.kind));
                return PSNET__STATUS__STATUS_DENIED;
        }
        if (!names_open_round(f, h, "", reason, n))
                return PSNET__STATUS__STATUS_STALE;
        ssize_t ci = sampled_index(f, h->update_of, reason, n);
        if (ci < 0)
                return PSNET__STATUS__STATUS_INVALID;
        for (size_t i = 0; i < h->n_keys; i++) {
                Chunk *c = chunks[i];
                if (c->fed_slot >= f->nslots || f->slots[c->fed_slot] != c) {
                        snprintf(reason, n, "key %u/%u came here after the round opened", c->tensor, c->chunk);
                        return PSNET__STATUS__STATUS_UNAVAILABLE;
                }
                if (!f->upd[(size_t) ci * f->nslots + c->fed_slot]) {
                        snprintf(reason, n, "client %u's update of key %u/%u has not come here", h->update_of,
                                 c->tensor, c->chunk);
                        return PSNET__STATUS__STATUS_INVALID;
                }
        }
        for (size_t i = 0; i < h->n_keys; i++) {
                Chunk *c = chunks[i];
                size_t bytes = (size_t) c->len * sizeof(float);
                if (zmq_msg_init_size(&frames[i], bytes) < 0) {
                        for (size_t j = 0; j < i; j++)
                                zmq_msg_close(&frames[j]);
                        snprintf(reason, n, "out of memory");
                        return PSNET__STATUS__STATUS_RESOURCE;
                }
                memcpy(zmq_msg_data(&frames[i]), f->upd[(size_t) ci * f->nslots + c->fed_slot], bytes);
        }
        return PSNET__STATUS__STATUS_OK;
}

int fedshard_push(FedShard *f, Store *s, const Psnet__Header *h, Chunk **chunks, const zmq_msg_t *frames,
                  const uint8_t *key, uint64_t memory_limit, char *reason, size_t n) {
        if (h->has_strategy_delta && h->strategy_delta)
                return delta_push(f, s, h, chunks, frames, reason, n);
        if (!h->has_examples || h->examples == 0) {
                snprintf(reason, n, "a federated update carries its example count (>= 1)");
                return PSNET__STATUS__STATUS_MALFORMED;
        }
        /* Checked first: an update in the wrong form (plain in a secure or a
         * compressed job, ...) is refused as such, whatever else this client
         * sent before. */
        if (h->dtype != PSNET__DTYPE__DTYPE_F32) {
                snprintf(reason, n, "a federated update says how it is encoded with --compress, not a dtype");
                return PSNET__STATUS__STATUS_DTYPE;
        }
        bool masked = h->codec == PSNET__CODEC__CODEC_MASKED;
        if (masked != s->job.fed.secagg) {
                snprintf(reason, n, masked ? "a masked update, but this job does not aggregate securely"
                                           : "this job aggregates securely (--secagg): updates come masked");
                return PSNET__STATUS__STATUS_DTYPE;
        }
        CompressKind ck = s->job.fed.compress;
        int want_codec = ck == COMPRESS_NONE ? (masked ? PSNET__CODEC__CODEC_MASKED : PSNET__CODEC__CODEC_RAW)
                                             : PSNET__CODEC__CODEC_BF16 + (int) ck - COMPRESS_BF16;
        if ((int) h->codec != want_codec) {
                snprintf(reason, n, "this job's updates come %s (--compress); this one has codec %d",
                         compress_name(ck), (int) h->codec);
                return PSNET__STATUS__STATUS_DTYPE;
        }
        if (s->job.fed.async) {
                AsyncUpdate *u = NULL;
                int st = async_entry(f, s, h, key, memory_limit, &u, reason, n);
                if (st == PSNET__STATUS__STATUS_OK)
                        st = take_update(f, s, h, chunks, frames, u->upd, NULL, h->sender, reason, n);
                return st;
        }
        if (!names_open_round(f, h, ": a late update is not counted", reason, n))
                return PSNET__STATUS__STATUS_STALE;
        ssize_t ci = sampled_index(f, h->sender, reason, n);
        if (ci < 0)
                return PSNET__STATUS__STATUS_DENIED;
        if (f->keys && (!key || memcmp(key, f->keys[ci], 32) != 0)) {
                snprintf(reason, n, "the key of this connection is not client %u's", h->sender);
                return PSNET__STATUS__STATUS_DENIED;
        }
        if (f->examples[ci] && f->examples[ci] != h->examples) {
                snprintf(reason, n, "client %u said %lu examples before, %lu now", h->sender,
                         (unsigned long) f->examples[ci], (unsigned long) h->examples);
                return PSNET__STATUS__STATUS_INVALID;
        }
        int st = take_update(f, s, h, chunks, frames, &f->upd[(size_t) ci * f->nslots], &f->sq[ci], h->sender, reason,
                             n);
        if (st == PSNET__STATUS__STATUS_OK)
                f->examples[ci] = h->examples;
        return st;
}
