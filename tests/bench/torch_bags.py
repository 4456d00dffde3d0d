# SPDX-License-Identifier: Apache-2.0
"""A DLRM-style model with a table per field (examples/dlrm_clicks.py's) in
three forms, on the same click log, batches and steps: PyTorch alone
(nn.EmbeddingBag(sparse=True) per field, Adagrad for the tables, SGD with
momentum for the dense layers), psnet.torch with its EmbeddingBags looked
up one after the other (a round trip to the shards per table in forward),
and psnet.torch with them in one EmbeddingBagCollection (one round trip for
all). Prints samples/s of each, and each psnet form's ratio to PyTorch's
and to the other. Never pass/fail.

    psnet-clicklog --out DIR --fields 8 --dense 4 --train-rows 60000
    tests/bench/torch_bags.py DIR [--steps 200] [--batch 256] [--shards 2]

Needs PYTHONPATH=python, and PSNET_BUILD (or PSNET_BIN) for the daemons
that psnet.LocalCluster starts."""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn

import psnet
import psnet.torch

DIM = 8


class Dense(nn.Module):
    def __init__(self, fields, dense):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, DIM), nn.ReLU())
        n = fields + 1
        self.top = nn.Sequential(nn.Linear(DIM + n * (n - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1))
        self.pairs = torch.tril_indices(n, n, offset=-1)

    def head(self, z, vectors):
        t = torch.stack([z] + vectors, dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)


class Torch(Dense):
    """PyTorch alone: a vocabulary per field, ids mapped to it first."""

    def __init__(self, fields, dense, vocab):
        super().__init__(fields, dense)
        self.tables = nn.ModuleList(nn.EmbeddingBag(v + 1, DIM, mode="sum", sparse=True) for v in vocab)
        for t in self.tables:
            nn.init.uniform_(t.weight, -0.01, 0.01)

    def forward(self, sparse, dense):
        return self.head(self.bot(dense), [t(sparse[:, f:f + 1]) for f, t in enumerate(self.tables)])


class Separate(Dense):
    def __init__(self, fields, dense):
        super().__init__(fields, dense)
        self.tables = nn.ModuleList(psnet.torch.EmbeddingBag(f"s{f}", DIM, optim="adagrad", lr=0.1)
                                    for f in range(fields))

    def forward(self, sparse, dense):
        return self.head(self.bot(dense), [t(sparse[:, f]) for f, t in enumerate(self.tables)])


class Collection(Dense):
    def __init__(self, fields, dense):
        super().__init__(fields, dense)
        self.tables = psnet.torch.EmbeddingBagCollection(
            [psnet.torch.EmbeddingBag(f"c{f}", DIM, optim="adagrad", lr=0.1) for f in range(fields)])

    def forward(self, sparse, dense):
        return self.head(self.bot(dense), self.tables(sparse))


def batches(n, batch, steps):
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(n, generator=g)
    return [order[(i * batch) % (n - batch):][:batch] for i in range(steps)]


def run_torch(xs, xd, y, idx, fields):
    vocab, mapped = [], torch.empty_like(xs)
    for f in range(fields):
        u, inv = torch.unique(xs[:, f], return_inverse=True)
        vocab.append(len(u))
        mapped[:, f] = torch.where(xs[:, f] >= 0, inv, len(u))  # -1: a row of its own, never trained
    m = Torch(fields, xd.shape[1], vocab)
    sparse_opt = torch.optim.Adagrad([t.weight for t in m.tables], lr=0.1)
    dense_opt = torch.optim.SGD([p for n, p in m.named_parameters() if not n.startswith("tables")], lr=0.02,
                                momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    for b in idx:
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss_fn(m(mapped[b], xd[b]), y[b]).backward()
        sparse_opt.step()
        dense_opt.step()
    return len(idx) * len(idx[0]) / (time.perf_counter() - t0)


def run_psnet(model, cluster, xs, xd, y, idx):
    opt = psnet.torch.Optimizer(model, coord=cluster, optim="sgd", lr=0.02, momentum=0.9, mode="asp", progress=False)
    loss_fn = nn.BCEWithLogitsLoss()
    warm = 10
    for k, b in enumerate(idx):
        if k == warm:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(xs[b], xd[b]), y[b]).backward()
        opt.step()
    sps = (len(idx) - warm) * len(idx[0]) / (time.perf_counter() - t0)
    opt.finish()
    return sps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--shards", type=int, default=2)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    xs = torch.from_numpy(np.load(f"{a.data}/train/sparse.npy"))
    xd = torch.from_numpy(np.load(f"{a.data}/train/dense.npy").astype(np.float32))
    y = torch.from_numpy(np.load(f"{a.data}/train/label.npy").astype(np.float32))
    fields = xs.shape[1]
    idx = batches(len(y), a.batch, a.steps)
    ref = run_torch(xs, xd, y, idx, fields)
    got = {}
    for name, cls in (("one table after another", Separate), ("EmbeddingBagCollection", Collection)):
        with psnet.LocalCluster(shards=a.shards) as cluster:
            got[name] = run_psnet(cls(fields, xd.shape[1]), cluster, xs, xd, y, idx)
    print(f"torch_bags: {fields} fields of dim {DIM}, batch {a.batch}, {a.steps} steps, {a.shards} shards, ASP, "
          f"one psnet.torch worker")
    print(f"torch_bags: PyTorch alone samples_per_s={ref:.0f}")
    for name, sps in got.items():
        print(f"torch_bags: psnet.torch, {name}: samples_per_s={sps:.0f} ({sps / ref:.2f} x PyTorch's)")
    a_, b_ = got["EmbeddingBagCollection"], got["one table after another"]
    print(f"torch_bags: the collection against one table after another: {a_ / b_:.2f} x")


if __name__ == "__main__":
    main()
