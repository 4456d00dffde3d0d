# SPDX-License-Identifier: Apache-2.0
"""A large table filled, checkpointed and read back (tests/bench/rows-scale.sh).

    rows_scale.py run COORD ROWS SAMPLE.npz PSCTL NAME   pushes ROWS distinct
        ids (2^18 a push, one clock each) and keeps a sample of their rows;
        then runs psctl checkpoint save NAME while it trains on (each clock a
        pull and a push of 4,096 other rows): how long the save took and the
        longest step meanwhile (the tables are frozen while they are
        written). One JSON line.
    rows_scale.py check COORD SAMPLE.npz   after a restore: the sample reads
        back bit for bit. One JSON line.
    rows_scale.py failover COORD ROWS DIR   a BSP job with two copies of each
        row: pushes ROWS ids as run does and keeps a sample of 10,000 rows,
        writes DIR/filled, then trains on (a pull and a push of 4,096 other
        rows a clock) until DIR/stop exists, while a shard is killed: the
        steps meanwhile and the longest, and whether the sample reads back
        bit for bit from the survivors (nothing acknowledged lost). One JSON
        line.
"""
import os
import json
import subprocess
import sys
import threading
import time

import numpy as np

from psnet.client import Worker

PUSH = 1 << 18  # ids a push: 16 MiB of rows over the 3 shards


def ids_of(k, n):
    """Push k's ids: spread over the int64 range, distinct (an odd multiplier mod 2^63)."""
    base = np.arange(k * PUSH, k * PUSH + n, dtype=np.uint64)
    return ((base * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(1)).astype(np.int64)


def worker(coord):
    w = Worker(coord)
    w.wait_job(60)
    name, (index, dim) = next(iter(w.tables().items()))
    return w, name, dim


def step(w, clock, zeros):
    """The dense half of a step, as a model's worker does after its rows:
    zero gradients of the job's tensors pushed for clock, clock + 1 pulled."""
    w.push_pull(zeros, clock, clock + 1)


def fill(coord, rows):
    """A worker of the job, and the table filled with rows ids (PUSH a
    clock): the worker, table, dim, next clock, zero gradients, seconds."""
    w, table, dim = worker(coord)
    clock = w.info()["start_clock"]
    w.pull(clock)
    zeros = {name: np.zeros(n, dtype=np.float32) for name, n in w.tensors()}
    t0 = time.perf_counter()
    done = 0
    while done < rows:
        n = min(PUSH, rows - done)
        w.push_rows(table, ids_of(done // PUSH, n), np.full((n, dim), 0.01, dtype=np.float32), clock)
        step(w, clock, zeros)
        clock += 1
        done += n
    return w, table, dim, clock, zeros, time.perf_counter() - t0


def train_step(w, table, ids, g, clock, zeros):
    """A step on rows of their own (a sample kept stays as it is): its seconds."""
    t = time.perf_counter()
    w.pull_rows(table, ids, clock)
    w.push_rows(table, ids, g, clock)
    step(w, clock, zeros)
    return time.perf_counter() - t


def run(coord, rows, sample, psctl, name):
    rows = int(rows)
    w, table, dim, clock, zeros, fill_s = fill(coord, rows)
    pick = ids_of(0, 1000)[::10]
    np.savez(sample, ids=pick, rows=w.pull_rows(table, pick, clock))

    ids = ids_of(1 << 30, 4096)
    g = np.full((ids.size, dim), 0.001, dtype=np.float32)
    out, steps, longest = {}, 0, 0.0

    def save():
        t = time.perf_counter()
        p = subprocess.run([psctl, "--coord", coord, "checkpoint", "save", name], capture_output=True, text=True)
        out.update(rc=p.returncode, text=(p.stdout + p.stderr).strip(), s=time.perf_counter() - t)

    th = threading.Thread(target=save)
    th.start()
    while th.is_alive():
        longest = max(longest, train_step(w, table, ids, g, clock, zeros))
        steps += 1
        clock += 1
    th.join()
    print(json.dumps({"rows": rows, "dim": dim, "fill_s": round(fill_s, 2), "fill_rows_per_s": round(rows / fill_s),
                      "save_rc": out["rc"], "save_s": round(out["s"], 2), "psctl": out["text"],
                      "steps_meanwhile": steps, "longest_step_s": round(longest, 3)}))
    w.close()
    return 0 if out["rc"] == 0 else 1


def failover(coord, rows, d):
    rows = int(rows)
    w, table, dim, clock, zeros, fill_s = fill(coord, rows)
    pick = np.concatenate([ids_of(k, 100) for k in range(0, max(rows // PUSH, 1))])[:10000]
    before = w.pull_rows(table, pick, clock)
    open(os.path.join(d, "filled"), "w").close()
    ids = ids_of(1 << 30, 4096)
    g = np.full((ids.size, dim), 0.001, dtype=np.float32)
    steps, longest, t1 = 0, 0.0, time.perf_counter()
    while not os.path.exists(os.path.join(d, "stop")):
        longest = max(longest, train_step(w, table, ids, g, clock, zeros))
        steps += 1
        clock += 1
    train_s = time.perf_counter() - t1
    same = bool(np.array_equal(w.pull_rows(table, pick, clock), before))
    print(json.dumps({"rows": rows, "dim": dim, "fill_s": round(fill_s, 2), "fill_rows_per_s": round(rows / fill_s),
                      "steps_meanwhile": steps, "steps_per_s": round(steps / train_s, 1),
                      "longest_step_s": round(longest, 3), "sample_rows": int(pick.size),
                      "sample_same_bit_for_bit": same}))
    w.close()
    return 0 if same else 1


def check(coord, sample):
    w, name, dim = worker(coord)
    s = np.load(sample)
    got = w.pull_rows(name, s["ids"], w.info()["start_clock"])
    same = bool(np.array_equal(got, s["rows"]))
    print(json.dumps({"sample_rows": int(s["ids"].size), "same_bit_for_bit": same}))
    w.close()
    return 0 if same else 1


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    sys.exit({"run": run, "check": check, "failover": failover}[what](*args) or 0)
