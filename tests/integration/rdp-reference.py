#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The privacy a federated job spent, computed apart from psnet's own
accountant (common/rdp.c) for tests/integration/test-fed-privacy.sh:
exact decimal arithmetic instead of sums of logarithms.

  rdp-reference.py SIGMA DELTA RATE...   (RATE: sampled/available, one per round)

prints epsilon at DELTA: min over the integer orders a in 2..64, 128, 256 of
  sum over rounds of log(A_a(q)) / (a - 1)  +  log(1 / DELTA) / (a - 1),
  A_a(q) = sum_k C(a, k) (1 - q)^(a - k) q^k exp((k^2 - k) / (2 SIGMA^2))
(the subsampled Gaussian mechanism, Mironov, Talwar and Zhang 2019)."""
import sys
from decimal import Decimal, getcontext
from fractions import Fraction
from math import comb

getcontext().prec = 60


def log_a(q, sigma, a):
    qd = Decimal(q.numerator) / Decimal(q.denominator)
    s2 = 2 * Decimal(sigma) ** 2
    total = Decimal(0)
    for k in range(a + 1):
        # Decimal refuses 0 ** 0 (q = 1: every client sampled), which is 1 here.
        stay = (1 - qd) ** (a - k) if a > k else Decimal(1)
        total += Decimal(comb(a, k)) * stay * qd ** k * (Decimal(k * k - k) / s2).exp()
    return total.ln()


def main():
    sigma, delta = Decimal(sys.argv[1]), Decimal(sys.argv[2])
    rates = [Fraction(r) for r in sys.argv[3:]]
    orders = list(range(2, 65)) + [128, 256]
    best = None
    for a in orders:
        rdp = sum(log_a(q, sigma, a) for q in rates) / (a - 1)
        eps = rdp + (1 / delta).ln() / (a - 1)
        best = eps if best is None or eps < best else best
    print(f"{best:.12f}" if rates else "0")


if __name__ == "__main__":
    main()
