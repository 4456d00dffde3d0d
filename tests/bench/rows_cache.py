# SPDX-License-Identifier: Apache-2.0
"""The hot-row cache's bytes and its cost in AUC (tests/bench/rows.sh): a
sparse logistic regression (a psnet table of one float an id, Adagrad, and a
dense layer) trained one epoch on a click log by one psnet.torch worker,
with the table's cache=S; prints the bytes pulled per step, the cache's hit
rate and the test AUC (by ranks) as one JSON line.

    rows_cache.py COORD DATA S
"""
import json
import sys
import time

import numpy as np
import torch
import torch.nn as nn

import psnet.torch

BATCH = 256


def auc(s, y):
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    pos = y > 0.5
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


class LR(nn.Module):
    def __init__(self, dense, cache):
        super().__init__()
        self.w = psnet.torch.EmbeddingBag("w", 1, optim="adagrad", lr=0.5, init=0.01, cache=cache)
        self.dense = nn.Linear(dense, 1)

    def forward(self, sparse, dense):
        return self.w(sparse).squeeze(1) + self.dense(dense).squeeze(1)


def main():
    coord, data, cache = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ld = lambda s, f: torch.from_numpy(np.load(f"{data}/{s}/{f}.npy"))
    xs, xd, y = ld("train", "sparse"), ld("train", "dense").float(), ld("train", "label").float()
    ts, td, ty = ld("test", "sparse"), ld("test", "dense").float(), ld("test", "label").float()
    torch.manual_seed(1)
    model = LR(xd.shape[1], cache)
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=0.05, mode="asp", progress=False)
    loss_fn = nn.BCEWithLogitsLoss()
    steps = len(y) // BATCH
    t0 = time.monotonic()
    for i in range(steps):
        b = slice(i * BATCH, (i + 1) * BATCH)
        opt.zero_grad()
        loss_fn(model(xs[b], xd[b]), y[b]).backward()
        opt.step()
    seconds = time.monotonic() - t0
    st = opt.w.rows_cache()
    with torch.no_grad():
        model.eval()
        a = auc(model(ts, td).numpy(), ty.numpy())
    print(json.dumps({"cache": cache, "steps": steps, "pulled_bytes_per_step": st["pulled_bytes"] / steps,
                      "hit_rate": st["hit_rate"], "auc": a, "seconds": seconds}), flush=True)
    opt.finish()


if __name__ == "__main__":
    main()
