# SPDX-License-Identifier: Apache-2.0
"""A model with a loss of its own: an autoencoder of Fashion-MNIST images
(no labels, no classes) whose loss is the reconstruction error plus an L1
penalty on its code, trained on psnet: psnet holds and updates the tensors,
the loss is whatever the script computes.

    python examples/custom_loss.py                 # a LocalCluster on this host
    python examples/custom_loss.py --coord ipc:///tmp/psnet/coord.sock"""
import argparse

import torch
import torch.nn as nn

import psnet
import psnet.torch
from psnet.data import load


class AutoEncoder(nn.Module):
    def __init__(self, code=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(784, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, code))
        self.dec = nn.Sequential(nn.Linear(code, 256), nn.GELU(), nn.Linear(256, 784), nn.Sigmoid())

    def forward(self, x):
        z = self.enc(x)
        return self.dec(z), z


def loss_fn(x, out, z, sparsity=1e-3):
    """Reconstruction (mean squared error) plus an L1 penalty on the code."""
    return (out - x).pow(2).mean() + sparsity * z.abs().mean()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coord", help="pscoord's endpoint (default: start a LocalCluster)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--limit", type=int, default=10000)
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.from_numpy(load(args.data, "train", args.limit)[0]).reshape(-1, 784)
    model = AutoEncoder()
    cluster = psnet.LocalCluster(shards=2).start() if not args.coord else None
    try:
        opt = psnet.torch.Optimizer(model, coord=cluster or args.coord, optim="adam", lr=1e-3, progress=False)
        with torch.no_grad():
            first = loss_fn(x[:1000], *model(x[:1000])).item()
        print(f"loss before training {first:.4f}", flush=True)
        for epoch in range(args.epochs):
            for idx in torch.randperm(len(x)).split(128):
                opt.zero_grad()
                out, z = model(x[idx])
                loss = loss_fn(x[idx], out, z)
                loss.backward()
                opt.step(loss=loss)
            with torch.no_grad():
                print(f"epoch {epoch + 1}: loss {loss_fn(x[:1000], *model(x[:1000])).item():.4f}", flush=True)
        opt.finish()
    finally:
        if cluster:
            cluster.close()


if __name__ == "__main__":
    main()
