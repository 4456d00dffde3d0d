# SPDX-License-Identifier: Apache-2.0
"""A PyTorch model of your own on psnet, in one process: a small CNN with
BatchNorm and a residual connection trains on Fashion-MNIST with the shards
holding its weights and running Adam.

    python examples/quickstart.py                  # a LocalCluster on this host
    python examples/quickstart.py --coord ipc:///tmp/psnet/coord.sock   # a running cluster

(Debian's Fashion-MNIST: apt install dataset-fashion-mnist; --data DIR for
another copy of its IDX files.)"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import psnet
import psnet.torch
from psnet.data import load


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                   nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32))
        self.head = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 2)
        x = F.relu(x + self.block(x))
        return self.head(F.max_pool2d(x, 2).flatten(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coord", help="pscoord's endpoint (default: start a LocalCluster)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, default=0, help="train on the first N images (0: all)")
    args = p.parse_args()
    torch.manual_seed(0)
    x, y = load(args.data, "train", args.limit)
    tx, ty = load(args.data, "test", 2000)
    x, tx = torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(tx).reshape(-1, 1, 28, 28)
    y, ty = torch.from_numpy(y), torch.from_numpy(ty)
    model = Net()

    def evaluate():
        model.eval()
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        model.train()
        return acc

    cluster = psnet.LocalCluster(shards=2).start() if not args.coord else None
    try:
        opt = psnet.torch.Optimizer(model, coord=cluster or args.coord, optim="adam", lr=2e-3)
        sampler = opt.sampler(len(x))
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for idx in torch.tensor(list(sampler)).split(64):
                opt.zero_grad()
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                opt.step(loss=loss, samples=len(idx))
            print(f"epoch {epoch + 1}: test accuracy {evaluate():.4f}", flush=True)
        opt.finish(evaluate=evaluate)
    finally:
        if cluster:
            cluster.close()


if __name__ == "__main__":
    main()
