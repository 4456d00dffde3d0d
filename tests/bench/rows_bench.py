# SPDX-License-Identifier: Apache-2.0
"""The rows of a psnet table over the wire (tests/bench/rows.sh): one worker
pulls and pushes the distinct ids of batches of 4,096 x 26 Zipf(1.1) ids
(10^5 ids a field) through libpsnet (psnet.client.Worker.pull_rows and
push_rows), timed per batch; beside it, in the same run, the limit: the same
gather and Adagrad scatter in this process's memory, on a NumPy array
indexed by the ids' ranks (no lookup at all). Prints one JSON line a table.

    rows_bench.py COORD SHARDS [BATCHES]
"""
import json
import sys
import time

import numpy as np

from psnet.client import Worker

FIELDS, BATCH, VOCAB, ZIPF = 26, 4096, 100_000, 1.1


def batches(n, rng):
    """n batches' distinct ids (field f's ranks offset by f x VOCAB)."""
    p = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF
    p /= p.sum()
    out = []
    for _ in range(n):
        ranks = rng.choice(VOCAB, size=(BATCH, FIELDS), p=p)
        out.append(np.unique(ranks + np.arange(FIELDS) * VOCAB).astype(np.int64))
    return out


def in_memory(bs, dim, lr=0.01, eps=1e-10):
    """Seconds to gather, then Adagrad-scatter, each batch's rows in a dense array."""
    w = np.zeros((FIELDS * VOCAB, dim), dtype=np.float32)
    a = np.zeros_like(w)
    pull = push = 0.0
    for ids in bs:
        g = np.full((ids.size, dim), 0.01, dtype=np.float32)
        t0 = time.perf_counter()
        rows = w[ids]
        t1 = time.perf_counter()
        a[ids] += g * g
        w[ids] -= lr * g / (np.sqrt(a[ids]) + eps)
        t2 = time.perf_counter()
        pull += t1 - t0
        push += t2 - t1
        del rows
    return pull, push


def main():
    coord, shards = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    rng = np.random.default_rng(1)
    bs = batches(n + 3, rng)
    w = Worker(coord)
    w.wait_job(60)
    clock = w.info()["start_clock"]
    for name, (index, dim) in sorted(w.tables().items(), key=lambda kv: kv[1][1]):
        g = {ids.size: None for ids in bs}
        pull = push = 0.0
        rows_n = 0
        for k, ids in enumerate(bs):
            grads = np.full((ids.size, dim), 0.01, dtype=np.float32)
            t0 = time.perf_counter()
            w.pull_rows(name, ids, clock)
            t1 = time.perf_counter()
            w.push_rows(name, ids, grads, clock)
            t2 = time.perf_counter()
            clock += 1
            if k >= 3:  # the first three warm up
                pull += t1 - t0
                push += t2 - t1
                rows_n += ids.size
        del g
        mp, ms = in_memory(bs[3:], dim)
        print(json.dumps({
            "table": name, "dim": dim, "shards": shards, "batches": n, "rows_per_batch": rows_n // n,
            "pull_rows_per_s": rows_n / pull, "push_rows_per_s": rows_n / push,
            "pull_rows_per_s_per_shard": rows_n / pull / shards, "push_rows_per_s_per_shard": rows_n / push / shards,
            "in_memory_pull_rows_per_s": rows_n / mp, "in_memory_push_rows_per_s": rows_n / ms,
            "pull_ratio": (rows_n / pull) / (rows_n / mp), "push_ratio": (rows_n / push) / (rows_n / ms),
        }), flush=True)
    w.result()
    w.leave()
    w.close()


if __name__ == "__main__":
    main()
