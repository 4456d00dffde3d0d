# SPDX-License-Identifier: Apache-2.0
"""Flower's PyTorch quickstart, ported to psnet: a small CNN trained by
federated clients on partitions of Fashion-MNIST, each client with its own
fit() and evaluate() (Flower's NumPyClient contract).

    python examples/fed_quickstart.py                 # LocalCluster + 10 virtual clients
    python examples/fed_quickstart.py --coord tcp://coord:7000 --client 3 --of 10 --key keys/edge.key
                                                     # one real client of a running job

What changes from Flower's quickstart: the import (psnet.fed instead of
flwr.client), the start call (psnet.fed.start_client / simulate), and the
server side, which is psnet's shards: the job is submitted with
psnet.fed.submit (rounds, fraction, strategy, local epochs and lr as
psctl job submit's options; the model's tensors from the Net itself).
(Debian's Fashion-MNIST: apt install dataset-fashion-mnist; --data DIR for
another copy of its IDX files.)"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import psnet
import psnet.fed
from psnet.data import load


class Net(nn.Module):
    """Flower's quickstart CNN, for Fashion-MNIST's 1x28x28 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def get_weights(net):
    return [val.cpu().numpy() for _, val in net.state_dict().items()]


def set_weights(net, parameters):
    state_dict = {k: torch.tensor(v) for k, v in zip(net.state_dict().keys(), parameters)}
    net.load_state_dict(state_dict, strict=True)


def train(net, x, y, epochs, batch, lr, seed):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    net.train()
    total = 0.0
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=g).split(batch):
            opt.zero_grad()
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
    return total / (epochs * len(x))


def test(net, x, y):
    net.eval()
    with torch.no_grad():
        out = net(x)
        return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


class FlowerClient(psnet.fed.NumPyClient):
    def __init__(self, x, y, tx, ty, seed):
        self.net, self.x, self.y, self.tx, self.ty, self.seed = Net(), x, y, tx, ty, seed

    def fit(self, parameters, config):
        set_weights(self.net, parameters)
        loss = train(self.net, self.x, self.y, config["local_epochs"], config["batch_size"], config["lr"],
                     self.seed + config["number"])
        return get_weights(self.net), len(self.x), {"loss": loss}

    def evaluate(self, parameters, config):
        set_weights(self.net, parameters)
        loss, accuracy = test(self.net, self.tx, self.ty)
        return loss, len(self.tx), {"accuracy": accuracy}


def partition(x, y, k, of):
    """IID partition k of `of` (Flower's IidPartitioner: contiguous shares of a shuffled set)."""
    n = len(x) // of
    return x[k * n:(k + 1) * n], y[k * n:(k + 1) * n]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coord", help="pscoord's endpoint of a running federated job (default: a LocalCluster)")
    p.add_argument("--client", type=int, help="with --coord: run as this one client (its partition)")
    p.add_argument("--of", type=int, default=10, help="partitions (virtual clients) (default 10)")
    p.add_argument("--key", help="this client's key file (psctl keys gen) for a cluster with --keys")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit", type=int, default=0, help="use the first N training images (0: all)")
    args = p.parse_args()
    torch.set_num_threads(1)  # many clients in one process: one thread each is the fair share
    x, y = load(args.data, "train", args.limit)
    tx, ty = load(args.data, "test", 2000)
    perm = np.random.default_rng(42).permutation(len(x))
    x = torch.from_numpy(x[perm]).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(y[perm])
    tx, ty = torch.from_numpy(tx).reshape(-1, 1, 28, 28), torch.from_numpy(ty)

    def client_fn(cid):
        k = int(cid)
        return FlowerClient(*partition(x, y, k, args.of), tx, ty, seed=1000 * k)

    t0 = time.monotonic()
    if args.coord and args.client is not None:
        st = psnet.fed.start_client(coord=args.coord, client=client_fn(str(args.client)), key=args.key)
    else:
        cluster = psnet.LocalCluster(shards=2).start() if not args.coord else None
        try:
            coord = cluster or args.coord
            if cluster:
                psnet.fed.submit(coord, Net(), rounds=args.rounds, fraction=0.5, min_clients=2,
                                 min_available=args.of, local_epochs=1, batch=32, lr=0.01, momentum=0.9,
                                 eval_every=1, fraction_evaluate=0.5)
            st = psnet.fed.simulate(client_fn, args.of, coord=coord)
            if cluster:
                _, hist, _ = psnet.cluster.psctl(cluster, "round", "history")
                print(hist, end="")
        finally:
            if cluster:
                cluster.close()
    print(f"job {st['state']}: {st['counted']} updates counted, {st['refused']} refused, "
          f"final accuracy {st['accuracy']}, {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
