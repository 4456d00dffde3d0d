/* SPDX-License-Identifier: Apache-2.0 */
/* An edge worker's side of secure aggregation (--secagg; the scheme in
 * common/secagg.h, pscoord's side in ps/pscoord/coord-secagg.c): one
 * client's keys, shares and masks for one round, as pure functions of the
 * messages pscoord sends, so that the protocol is tested without sockets
 * (tests/unit/test-secagg.c). edge.c sends what they build.
 *
 * The checks a client makes before it gives anything away (Bonawitz et al.,
 * section 4): every list pscoord sends is within the previous one and holds
 * this client, at least the threshold t of clients are in it, each box opens
 * and names its sender, receiver and round; it reveals its shares once per
 * round, and for each peer either the self seed's share (the peer counts)
 * or the mask key's (it dropped), never both. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "wire.h"
#include "secagg.h"

typedef struct EdgeSecAgg {
        uint64_t number;            /* the round (0: none) */
        uint32_t me;
        uint32_t stage;             /* the last stage answered */
        float clip;
        bool unweighted;            /* a private job: every client weighs 1 */
        uint64_t examples;
        SecAggKeys k;
        uint32_t t;
        size_t n1, mi;              /* U1 and this client's place in it */
        uint32_t *u1;
        uint8_t (*mask_pk)[SECAGG_KEY], (*share_pk)[SECAGG_KEY];
        uint8_t (*mask_share)[SECAGG_KEY], (*self_share)[SECAGG_KEY]; /* held from each member of U1 */
        bool *in2;                  /* U2, over U1 */
        uint8_t (*pair)[SECAGG_KEY];/* the pairwise seed with each member of U2 */
        size_t n2;
        uint64_t weight;
} EdgeSecAgg;

/* What a stage answers: sa, with the arrays it points into. */
typedef struct EdgeSecAggOut {
        Psnet__SecAgg sa;
        Psnet__SecAggBox *bx, **bp;
        Psnet__SecAggSecret *se, **sp;
        uint8_t *raw;
        size_t nraw;
} EdgeSecAggOut;

/* Wipes and frees the round's state (s stays usable). */
void edge_secagg_clear(EdgeSecAgg *s);
void edge_secagg_out_free(EdgeSecAggOut *o);

/* Stage 1: fresh keys for round number; out: the public keys and examples. */
int edge_secagg_keys(EdgeSecAgg *s, uint64_t number, uint32_t me, const Psnet__SecAgg *in, uint64_t examples,
                     bool unweighted, EdgeSecAggOut *out);
/* Stage 2: U1 and t; out: one sealed box of shares for each other member.
 * -EINVAL with err for a list that fails the checks. */
int edge_secagg_shares(EdgeSecAgg *s, uint64_t number, const Psnet__SecAgg *in, EdgeSecAggOut *out, char *err,
                       size_t errn);
/* Stage 3: U2, the boxes for this client, W. -EINVAL/-EBADMSG with err. */
int edge_secagg_peers(EdgeSecAgg *s, uint64_t number, const Psnet__SecAgg *in, char *err, size_t errn);
/* After stage 3: tensor's delta x (len values) quantised and masked into y
 * (x and y may be the same memory). Reads s only: for a worker thread. */
void edge_secagg_mask(const EdgeSecAgg *s, uint32_t tensor, const float *x, uint32_t *y, size_t len);
/* Stage 4: the survivors; out: this client's shares. -EINVAL with err. */
int edge_secagg_reveal(EdgeSecAgg *s, uint64_t number, const Psnet__SecAgg *in, EdgeSecAggOut *out, char *err,
                       size_t errn);
