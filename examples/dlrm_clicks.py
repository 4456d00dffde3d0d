# SPDX-License-Identifier: Apache-2.0
"""Your own DLRM-style click model on psnet: each categorical field of a click
log looks its ids up in a table of its own (psnet.torch.EmbeddingBag: the
rows live on the shards, keyed by any 64-bit id, created on first touch;
an EmbeddingBagCollection pulls every field's rows in one exchange), the
dense layers and the dot interactions are plain torch; the test AUC is
printed after each epoch.

    psnet-clicklog --out clicks                     # a synthetic log (docs/tables.md)
    python examples/dlrm_clicks.py --data clicks    # a LocalCluster on this host
    python examples/dlrm_clicks.py --data clicks --coord ipc:///tmp/psnet/coord.sock

DIR/{train,test}/sparse.npy (int64 [N, F], -1 missing), dense.npy (float32
[N, D]) and label.npy ([N] of 0 and 1), as psnet-clicklog writes them."""
import argparse

import numpy as np
import torch
import torch.nn as nn

import psnet
import psnet.torch


class DLRM(nn.Module):
    """Bottom MLP over the dense features, a table per field, the pairwise
    dot products of their vectors, a top MLP to the logit."""

    def __init__(self, fields, dense, dim=8):
        super().__init__()
        self.tables = psnet.torch.EmbeddingBagCollection(
            [psnet.torch.EmbeddingBag(f"field{f}", dim, optim="adagrad", lr=0.1) for f in range(fields)])
        self.bot = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        n = fields + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1))
        self.pairs = torch.tril_indices(n, n, offset=-1)

    def forward(self, sparse, dense):
        z = self.bot(dense)
        t = torch.stack([z] + self.tables(sparse), dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)


def load(data, split):
    return (torch.from_numpy(np.load(f"{data}/{split}/sparse.npy")),
            torch.from_numpy(np.load(f"{data}/{split}/dense.npy").astype(np.float32)),
            torch.from_numpy(np.load(f"{data}/{split}/label.npy").astype(np.float32)))


def auc(scores, labels):
    """The area under the ROC curve (Mann-Whitney U, ties given their mean rank)."""
    _, inv, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inv]
    y = labels > 0.5
    npos, nneg = y.sum(), (~y).sum()
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a click log's directory (psnet-clicklog --out DIR)")
    p.add_argument("--coord", help="pscoord's endpoint (default: start a LocalCluster)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--limit", type=int, default=0, help="train on the first N samples (0: all)")
    args = p.parse_args()
    torch.manual_seed(0)
    xs, xd, y = load(args.data, "train")
    if args.limit:
        xs, xd, y = xs[:args.limit], xd[:args.limit], y[:args.limit]
    ts, td, ty = load(args.data, "test")
    model = DLRM(xs.shape[1], xd.shape[1])
    cluster = psnet.LocalCluster(shards=2).start() if not args.coord else None
    try:
        opt = psnet.torch.Optimizer(model, coord=cluster or args.coord, optim="sgd", lr=0.02, momentum=0.9,
                                    mode="asp", progress=False)
        loss_fn = nn.BCEWithLogitsLoss()

        def test_auc():
            model.eval()
            with torch.no_grad():
                z = torch.cat([model(ts[i:i + 4096], td[i:i + 4096]) for i in range(0, len(ty), 4096)])
            model.train()
            return auc(z.numpy(), ty.numpy())

        for epoch in range(args.epochs):
            for idx in torch.randperm(len(y)).split(args.batch):
                opt.zero_grad()
                loss = loss_fn(model(xs[idx], xd[idx]), y[idx])
                loss.backward()
                opt.step(loss=loss)
            print(f"epoch {epoch + 1}: test AUC {test_auc():.4f}", flush=True)
        opt.finish()
    finally:
        if cluster:
            cluster.close()


if __name__ == "__main__":
    main()
