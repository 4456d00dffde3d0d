# SPDX-License-Identifier: Apache-2.0
"""The baseline of tests/bench/lr.sh: workerd's lr:D written as a plain
PyTorch loop in one process (nn.EmbeddingBag(sparse=True) with
torch.optim.Adagrad for the weights per id, nn.Linear with torch.optim.SGD
for the dense part, BCE with logits), the same batches' size and epochs.
Prints "torch samples_per_s=... auc=... threads=...".

    lr_torch.py DATA BATCH EPOCHS
"""
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def auc(scores, labels):
    """Mann-Whitney U by ranks (ties averaged)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / counts)[inv]
    npos, nneg = y.sum(), (~y).sum()
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def main():
    data, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    xs = np.load(f"{data}/train/sparse.npy")
    xd = torch.from_numpy(np.load(f"{data}/train/dense.npy").astype(np.float32))
    y = torch.from_numpy(np.load(f"{data}/train/label.npy").astype(np.float32))
    ts = np.load(f"{data}/test/sparse.npy")
    td = torch.from_numpy(np.load(f"{data}/test/dense.npy").astype(np.float32))
    ty = np.load(f"{data}/test/label.npy")
    vocab = np.unique(np.concatenate([xs[xs >= 0], ts[ts >= 0]]))
    # -1 (missing) goes to a row of its own that is never trained: index len(vocab), weight 0.
    idx = torch.from_numpy(np.where(xs >= 0, np.searchsorted(vocab, xs), len(vocab)))
    tidx = torch.from_numpy(np.where(ts >= 0, np.searchsorted(vocab, ts), len(vocab)))
    emb = nn.EmbeddingBag(len(vocab) + 1, 1, mode="sum", sparse=True, padding_idx=len(vocab))
    nn.init.uniform_(emb.weight, -0.01, 0.01)
    with torch.no_grad():
        emb.weight[len(vocab)] = 0
    lin = nn.Linear(xd.shape[1], 1)
    nn.init.zeros_(lin.weight)
    nn.init.zeros_(lin.bias)
    opt_rows = torch.optim.Adagrad(emb.parameters(), lr=0.1)
    opt_dense = torch.optim.SGD(lin.parameters(), lr=0.02, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()
    n = (len(y) // batch) * batch
    t0 = time.perf_counter()
    for epoch in range(epochs):
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))[:n]
        for b in range(0, n, batch):
            i = perm[b:b + batch]
            opt_rows.zero_grad()
            opt_dense.zero_grad()
            loss = loss_fn(emb(idx[i]).squeeze(1) + lin(xd[i]).squeeze(1), y[i])
            loss.backward()
            opt_rows.step()
            opt_dense.step()
    secs = time.perf_counter() - t0
    with torch.no_grad():
        z = (emb(tidx).squeeze(1) + lin(td).squeeze(1)).numpy()
    print(f"torch samples_per_s={epochs * n / secs:.0f} auc={auc(z, ty):.4f} threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
