# SPDX-License-Identifier: Apache-2.0
"""rows-once.py COORD DIR RANK STEPS: one worker of an ASP job whose only
table has SGD rows starting at 0 (test-table-failover). The worker pushes a
gradient of 1 for each of its own 400 ids (no other worker touches them)
each clock, STEPS clocks, writing its clock to DIR/clock-RANK after each
step; at clock 20 it waits (60 s at most) for DIR/killed, which the test
writes once it killed a shard (test-table-failover), so that the shard dies
mid-run and the worker's next exchange meets it dead, or once it asked for
a shard added or removed (test-table-move), so that the rows move while
the workers push. The rate the shards apply comes from the
first push (its rows read -lr); each row must end where STEPS steps of
w -= lr * 1, in float32 as a shard computes them, take it: once a push,
none lost, none twice, whatever shard died. Prints "ok: ..." or "FAIL ..."."""
import os
import sys
import time

import numpy as np

from psnet.client import Worker

coord, d, rank, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
w = Worker(coord)
w.wait_job(60)
name, (index, dim) = next(iter(w.tables().items()))
clock = w.info()["start_clock"]
w.pull(clock)
zeros = {n: np.zeros(k, dtype=np.float32) for n, k in w.tensors()}
ids = (np.arange(400, dtype=np.int64) + 1000 * (rank + 1)) * 7919
g = np.ones((ids.size, dim), dtype=np.float32)
lr = None
for s in range(steps):
    if s == 20:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(d, "killed")) and time.monotonic() < deadline:
            time.sleep(0.01)  # poll interval of a condition with a deadline
    w.push_rows(name, ids, g, clock)
    if lr is None:
        lr = np.float32(-w.pull_rows(name, ids[:1], clock)[0, 0])
    w.push_pull(zeros, clock, clock + 1)
    clock += 1
    with open(os.path.join(d, f"clock-{rank}"), "w") as f:
        f.write(str(clock))
want = np.float32(0)
for _ in range(steps):
    want = np.float32(want - lr * np.float32(1))
got = w.pull_rows(name, ids, clock)
w.close()
if lr > 0 and np.all(got == want):
    print(f"ok: worker {rank}: each of its {ids.size} rows took each of its {steps} pushes once "
          f"({float(want):.6g}, at rate {float(lr):.6g})")
else:
    bad = int(np.sum(got != want))
    print(f"FAIL worker {rank}: {bad} of {ids.size} rows are not {float(want):.6g} (rate {lr}): "
          f"{sorted(set(got.ravel().tolist()))[:6]}")
    sys.exit(1)
