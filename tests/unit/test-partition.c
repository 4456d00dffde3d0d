/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for worker/data/partition.c, the federated data splits: every
 * sample goes to exactly one client, the split is the same in every process
 * (a function of the labels, seed and client count), iid shares differ by at
 * most one, a small Dirichlet alpha concentrates each client on few classes
 * and a large one approaches an even split, and the Gamma sampler has its
 * mean and variance (shape, shape). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include "partition.h"
#include "tap.h"

#define N 6000u
#define CLIENTS 10u

/* Each sample counted once over all clients; the largest share of one class
 * in a client's data, averaged over clients. */
static int split_all(const int32_t *y, double alpha, uint64_t seed, uint32_t *ret_min, uint32_t *ret_max,
                     double *ret_top_class) {
        static uint8_t seen[N];
        uint32_t lo = N, hi = 0, total = 0;
        double top = 0;
        for (uint32_t i = 0; i < N; i++)
                seen[i] = 0;
        for (uint32_t k = 0; k < CLIENTS; k++) {
                uint32_t *idx, n, cls[10] = { 0 }, best = 0;
                if (partition_client(y, N, 10, CLIENTS, alpha, seed, k, &idx, &n) < 0)
                        return -1;
                for (uint32_t i = 0; i < n; i++) {
                        if (idx[i] >= N || seen[idx[i]]++ || (i && idx[i] <= idx[i - 1])) {
                                free(idx);
                                return -1;
                        }
                        cls[y[idx[i]]]++;
                }
                for (int c = 0; c < 10; c++)
                        best = cls[c] > best ? cls[c] : best;
                top += n ? (double) best / n : 0;
                lo = n < lo ? n : lo;
                hi = n > hi ? n : hi;
                total += n;
                free(idx);
        }
        *ret_min = lo;
        *ret_max = hi;
        *ret_top_class = top / CLIENTS;
        return total == N ? 0 : -1;
}

int main(void) {
        static int32_t y[N];
        for (uint32_t i = 0; i < N; i++)
                y[i] = (int32_t) ((i * 7u + i / 13u) % 10u);
        uint32_t lo, hi;
        double top;
        CHECK(split_all(y, 0, 42, &lo, &hi, &top) == 0, "iid: every sample in exactly one client, indices ascending");
        CHECK(hi - lo <= 1, "iid: shares of %u..%u samples", lo, hi);
        CHECK(top < 0.2, "iid: each client sees every class (largest class %.2f of its data)", top);
        CHECK(split_all(y, 0.1, 42, &lo, &hi, &top) == 0, "Dirichlet(0.1): every sample in exactly one client");
        CHECK(top > 0.5, "Dirichlet(0.1): a client's largest class is %.2f of its data (non-IID)", top);
        double top_small = top;
        CHECK(split_all(y, 1000, 42, &lo, &hi, &top) == 0, "Dirichlet(1000): every sample in exactly one client");
        CHECK(top < 0.2 && top < top_small && hi < 2 * lo, "Dirichlet(1000): near even (%u..%u, largest class %.2f)", lo,
              hi, top);

        /* The same split in every process; another seed, another split. */
        uint32_t *a, *b, na, nb;
        int r = partition_client(y, N, 10, CLIENTS, 0.5, 7, 3, &a, &na);
        int r2 = partition_client(y, N, 10, CLIENTS, 0.5, 7, 3, &b, &nb);
        int same = r == 0 && r2 == 0 && na == nb;
        for (uint32_t i = 0; same && i < na; i++)
                same = a[i] == b[i];
        CHECK(same, "the same labels, seed and clients give the same share (%u samples)", na);
        free(b);
        r2 = partition_client(y, N, 10, CLIENTS, 0.5, 8, 3, &b, &nb);
        same = r2 == 0 && na == nb;
        for (uint32_t i = 0; same && i < na; i++)
                same = a[i] == b[i];
        CHECK(r2 == 0 && !same, "another seed gives another share");
        free(a);
        free(b);

        CHECK(partition_client(y, N, 10, CLIENTS, 0.5, 7, CLIENTS, &a, &na) == -EINVAL, "client >= clients refused");
        y[5] = 10;
        CHECK(partition_client(y, N, 10, CLIENTS, 0.5, 7, 0, &a, &na) == -EINVAL, "a label out of range refused");

        /* Gamma(shape, 1): mean shape, variance shape. */
        const double shapes[] = { 0.3, 1.0, 4.5 };
        for (int s = 0; s < 3; s++) {
                uint64_t x = 99;
                double m = 0, v = 0;
                const int n = 200000;
                for (int i = 0; i < n; i++) {
                        double g = partition_gamma(shapes[s], &x);
                        m += g;
                        v += g * g;
                }
                m /= n;
                v = v / n - m * m;
                CHECK(fabs(m - shapes[s]) < 0.02 * shapes[s] + 0.01 && fabs(v - shapes[s]) < 0.05 * shapes[s] + 0.02,
                      "Gamma(%.1f): mean %.4f, variance %.4f", shapes[s], m, v);
        }
        return tap_done();
}
