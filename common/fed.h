/* SPDX-License-Identifier: Apache-2.0 */
/* Federated aggregation on the shard, per chunk: what a round's client updates
 * do to the global values (issue "Federated edge workers"). Each client sends
 * its update as a delta, d_i = (its weights after local training) - (the
 * round's global weights), with the number of examples it trained on, n_i.
 * Each shard aggregates the chunks it leads, so no one server limits the
 * model's size: at the close of each federated round (ps/psd/psd-fedround.c).
 * Checked against values worked out by hand (tests/unit/test-fed.c).
 *
 * With D = sum(n_i d_i) / sum(n_i) (FedAvg's weighted mean) and server lr eta
 * (Reddi et al., "Adaptive Federated Optimization", ICLR 2021; the defaults
 * follow Flower's strategies):
 *   FEDAVG       w += eta D                                     (eta 1)
 *   FEDAVGM      m = beta m + D; w += eta m                     (eta 1, beta 0.9)
 *   FEDADAGRAD   m = b1 m + (1-b1) D; v = v + D^2;
 *                w += eta m / (sqrt(v) + tau)                   (eta 0.1, b1 0, tau 1e-9)
 *   FEDADAM      m as above; v = b2 v + (1-b2) D^2; same step   (eta 0.1, b1 0.9, b2 0.99, tau 1e-9)
 *   FEDYOGI      m as above; v = v - (1-b2) D^2 sign(v - D^2)   (eta 0.01, b1 0.9, b2 0.99, tau 1e-3)
 *   MEDIAN       w += eta median_i(d_i), coordinate by coordinate, unweighted
 *                (the mean of the two middle ones for an even count)
 *   TRIMMED_MEAN w += eta mean of d_i without the k largest and k smallest
 *                of each coordinate, k = floor(trim n) (trim 0.1), unweighted
 *   KRUM         w += eta d_k for the one update d_k whose summed squared
 *                distance to its n - f - 2 nearest others is least
 *                (Blanchard et al., NeurIPS 2017), f = floor(byzantine n)
 *   MULTIKRUM    w += eta mean of the m = n - f updates of least such score,
 *                unweighted (El Mhamdi et al., ICML 2018; Flower's Krum
 *                with to_keep)
 * Median and the trimmed mean resist a few bad clients (Yin et al., ICML
 * 2018); the Krums, against updates scaled or turned around, too. Their
 * scores need every update whole: each shard sums the squared distances
 * over the chunks it holds, pscoord adds them up and picks (fed_krum_select),
 * and the close names the clients kept; the shards then take their mean.
 *
 * Differential privacy (DP-FedAvg, McMahan et al., ICLR 2018; Flower's
 * fixed-clipping wrappers): with dp_clip C > 0 every client clips its whole
 * update to L2 norm C before sending it (the shards refuse a part above C),
 * and D is the unweighted mean plus Gaussian noise of noise multiplier z:
 *   D = (sum_i d_i + z C N(0, I)) / n
 * so that one client changes the sum by at most C whatever it sends; the
 * server step above then takes D as for any round. Examples do not weight a
 * private round (they would let one client count more than C). The robust
 * strategies take no noise (their sensitivity is not C / n). */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum FedStrategy {
        FED_AVG,
        FED_AVGM,
        FED_ADAGRAD,
        FED_ADAM,
        FED_YOGI,
        FED_MEDIAN,
        FED_TRIMMED_MEAN,
        FED_KRUM,
        FED_MULTIKRUM,
        FED_CUSTOM,     /* the user's: a strategy process (ROLE_STRATEGY) computes each round's delta */
} FedStrategy;
#define FED_LAST FED_CUSTOM

typedef struct FedParams {
        FedStrategy kind;
        float eta;       /* server learning rate */
        float beta;      /* FedAvgM's momentum */
        float beta1, beta2, tau;
        float trim;      /* trimmed mean: the fraction dropped at each end, in [0, 0.5) */
        float dp_clip;   /* > 0: every update's L2 norm is at most this, and the mean is unweighted */
        float dp_noise;  /* the Gaussian noise's multiplier z (std z x dp_clip on the sum); needs dp_clip */
        float byzantine; /* the Krums: the share of a round's updates assumed bad, in [0, 0.5) */
} FedParams;

/* The defaults above for kind (no clipping, no noise). */
void fed_params_default(FedStrategy kind, FedParams *ret);
/* "fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi", "median",
 * "trimmed-mean", "krum", "multi-krum", "custom" (-EINVAL otherwise). */
int fed_strategy_from_string(const char *s, FedStrategy *ret);
const char *fed_strategy_name(FedStrategy kind);
/* Checks the parameters of p (ranges, finite): 0 or -EINVAL with err. */
int fed_params_check(const FedParams *p, char *err, size_t errn);

/* The server state each strategy keeps per value (0, 1 or 2 floats). */
size_t fed_state_per_value(FedStrategy kind);

/* Applies one round to w (len values): updates[i] is client i's delta
 * (len floats), examples[i] its example count (weights for the means; the
 * robust ones and private rounds ignore them). noise: len draws of N(0, 1)
 * when p->dp_noise > 0 (NULL adds none). state has fed_state_per_value * len
 * floats, zero before the first round; scratch at least MAX(n, 1) * 2 + len
 * floats. -EINVAL, with nothing changed, for no update, no examples at all
 * (the weighted strategies) or a NaN or infinity in an update; 0 otherwise. */
int fed_aggregate(const FedParams *p, float *w, float *state, uint32_t len, const float *const *updates,
                  const uint64_t *examples, size_t n, const float *noise, float *scratch);

/* Whether the strategy picks clients by Krum scores before its close. */
static inline int fed_is_krum(FedStrategy kind) { return kind == FED_KRUM || kind == FED_MULTIKRUM; }
/* Krum's pick among n updates from d2, their squared distances ([i * n +
 * j], symmetric, the diagonal ignored): keep[i] set for the one (KRUM) or
 * the n - f (MULTIKRUM) of least score, ties to the lower index; returns how
 * many were kept (0 for n == 0). scratch and scores: n doubles each (the
 * scores out). */
size_t fed_krum_select(const FedParams *p, const double *d2, size_t n, double *scratch, double *scores,
                       unsigned char *keep);

/* The strategy's server step (the part of fed_aggregate after the mean)
 * with the round's mean delta d given: a securely aggregated round
 * (common/secagg.h) has only the sum of the updates. */
void fed_server_step(const FedParams *p, float *w, float *state, uint32_t len, const float *d);

/* A client's local SGD step (the edge worker's, worker/workerd/edge.c) on n
 * values: w -= lr (g + mu (w - w0)), mu > 0 for FedProx's proximal term
 * towards the round's weights w0. */
void fed_client_step(float *w, const float *w0, const float *g, size_t n, float lr, float mu);

/* The L2 norm of len values, summed in double. */
double fed_norm2(const float *v, size_t len);
