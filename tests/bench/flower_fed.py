#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Flower side of tests/bench/fed-flower.sh: the job psnet's
tests/bench/fed-noniid.sh runs, in Flower (the flwr package, installed in a
virtual environment by the benchmark only).

  flower_fed.py server  --split DIR --data DIR --address HOST:PORT --rounds R
                        --strategy fedavg|fedprox|fedadam [--prox-mu MU]
                        [--server-lr LR] [--clients 100] [--fraction 0.1]
                        --out FILE.json
  flower_fed.py clients --split DIR --data DIR --address HOST:PORT
                        [--local-epochs 5] [--batch 32] [--lr 0.05]
                        [--slow N --slow-address HOST:PORT] [--part K/N]

The split and the initial weights are psnet's own (bench-fedsplit writes
them), so both frameworks train the same clients from the same model: an MLP
(ReLU, softmax cross-entropy) of the shapes in DIR/model.txt. Clients train
with plain mini-batch SGD in NumPy (FedProx: plus mu (w - w0), as psnet's
edge workers do), all of them as threads of one process (like
workerd --edge --simulate); the server tests the model on the 10,000 test
images (the first --test-limit of them) after every round (Flower's
centralised evaluation) and writes
[{"round": r, "accuracy": a, "t": seconds since the first evaluation}] to
--out. With --slow N the last N clients dial --slow-address (another link
to the same server, tests/bench/fed-slowlink.sh); with --part K/N this
process runs only the clients whose index is K modulo N (several processes
share the GIL's load).
"""
import argparse
import gzip
import json
import math
import os
import socket
import sys
import threading
import time

import numpy as np

import flwr
from flwr.client import NumPyClient, start_client
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import Server, ServerConfig, SimpleClientManager, start_server
from flwr.server.strategy import FedAdam, FedAvg, FedProx


def read_idx(path):
    opener = gzip.open if os.path.exists(path + ".gz") else open
    with opener(path + ".gz" if opener is gzip.open else path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data, name):
    x = read_idx(os.path.join(data, f"{name}-images-idx3-ubyte"))
    y = read_idx(os.path.join(data, f"{name}-labels-idx1-ubyte"))
    return x.reshape(len(x), -1).astype(np.float32) / np.float32(255), y.astype(np.int64)


def load_model(split):
    arrays = []
    with open(os.path.join(split, "model.txt")) as f:
        for line in f:
            name, *shape = line.split()
            a = np.fromfile(os.path.join(split, name + ".f32"), dtype=np.float32)
            arrays.append(a.reshape([int(s) for s in shape]))
    return arrays


def forward(params, x):
    """Logits and the layer inputs (for the backward pass)."""
    acts = [x]
    for i in range(0, len(params), 2):
        z = acts[-1] @ params[i].T + params[i + 1]
        if i + 2 < len(params):
            z = np.maximum(z, 0)
        acts.append(z)
    return acts


def sgd_step(params, x, y, lr, mu, w0):
    acts = forward(params, x)
    z = acts[-1]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    d = p / np.float32(len(y))
    for i in range(len(params) - 2, -1, -2):
        a = acts[i // 2]
        gw, gb = d.T @ a, d.sum(axis=0)
        if i > 0:
            d = (d @ params[i]) * (a > 0)
        if mu:
            gw += mu * (params[i] - w0[i])
            gb += mu * (params[i + 1] - w0[i + 1])
        params[i] -= lr * gw
        params[i + 1] -= lr * gb


class Client(NumPyClient):
    def __init__(self, cid, x, y, args):
        self.cid, self.x, self.y, self.args = cid, x, y, args
        self.rounds = 0

    def get_parameters(self, config):
        raise RuntimeError("the server has the initial parameters")

    def fit(self, parameters, config):
        params = [np.array(p, dtype=np.float32) for p in parameters]
        w0 = [p.copy() for p in params] if config.get("proximal_mu") else None
        mu = np.float32(config.get("proximal_mu", 0.0))
        lr, batch = np.float32(self.args.lr), self.args.batch
        rng = np.random.default_rng((self.cid << 20) + self.rounds)
        self.rounds += 1
        for _ in range(self.args.local_epochs):
            order = rng.permutation(len(self.y))
            for s in range(0, len(order), batch):
                b = order[s:s + batch]
                sgd_step(params, self.x[b], self.y[b], lr, mu, w0)
        return params, len(self.y), {}


def wait_for_server(address, seconds=120):
    """Flower's legacy client gives up on a refused connection: wait until the
    server listens."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"flower_fed: no server at {address} after {seconds} s")
            time.sleep(0.1)  # poll interval of a condition with a deadline


def clients(args):
    x, y = load(args.data, "train")
    wait_for_server(args.address)
    with open(os.path.join(args.split, "split.txt")) as f:
        shares = [np.array(line.split(), dtype=np.int64) for line in f]
    threads = []
    part, nparts = (int(v) for v in args.part.split("/"))
    for cid, idx in enumerate(shares):
        if cid % nparts != part:
            continue  # another process's client
        c = Client(cid, x[idx], y[idx], args).to_client()
        address = args.slow_address if args.slow and cid >= len(shares) - args.slow else args.address
        t = threading.Thread(target=start_client, kwargs=dict(server_address=address, client=c, insecure=True),
                             daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def server(args):
    # A client that never connects would hold the first round for ever.
    deadline = threading.Timer(args.deadline, lambda: os._exit(3))
    deadline.daemon = True
    deadline.start()
    tx, ty = load(args.data, "t10k")
    tx, ty = tx[:args.test_limit], ty[:args.test_limit]
    history, t0 = [], []

    def evaluate(rnd, parameters, config):
        params = [np.asarray(p, dtype=np.float32) for p in parameters]
        z = forward(params, tx)[-1]
        acc = float((z.argmax(axis=1) == ty).mean())
        now = time.monotonic()
        if not t0:
            t0.append(now)
        history.append({"round": rnd, "accuracy": acc, "t": now - t0[0]})
        print(f"flower round={rnd} accuracy={acc:.4f}", file=sys.stderr, flush=True)
        return 0.0, {"accuracy": acc}

    # psnet's round size: max(min_clients, ceil(fraction x available)).
    k = max(1, math.ceil(args.fraction * args.clients - 1e-9))
    common = dict(fraction_fit=args.fraction, fraction_evaluate=0.0, min_fit_clients=k,
                  min_evaluate_clients=0, min_available_clients=args.clients, evaluate_fn=evaluate,
                  initial_parameters=ndarrays_to_parameters(load_model(args.split)))
    if args.strategy == "fedavg":
        strategy = FedAvg(**common)
    elif args.strategy == "fedprox":
        strategy = FedProx(proximal_mu=args.prox_mu, **common)
    else:
        strategy = FedAdam(eta=args.server_lr, **common)
    # Flower's server sends a round to at most max_workers clients at a time
    # (its default: min(32, cores + 4)); over slow links that is the round.
    server = Server(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(args.max_workers)
    start_server(server_address=args.address, config=ServerConfig(num_rounds=args.rounds), server=server)
    with open(args.out, "w") as f:
        json.dump({"flwr": flwr.__version__, "history": history}, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["server", "clients"])
    ap.add_argument("--split", required=True)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--address", required=True)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--strategy", choices=["fedavg", "fedprox", "fedadam"], default="fedavg")
    ap.add_argument("--prox-mu", type=float, default=0.01)
    ap.add_argument("--server-lr", type=float, default=0.01)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--local-epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--part", default="0/1", help="clients: run those whose index is K modulo N (K/N)")
    ap.add_argument("--slow", type=int, default=0, help="clients: the last N dial --slow-address")
    ap.add_argument("--slow-address")
    ap.add_argument("--test-limit", type=int, default=10000, help="server: test on the first N test images")
    ap.add_argument("--max-workers", type=int, help="server: clients served at once (default: Flower's)")
    ap.add_argument("--out")
    ap.add_argument("--deadline", type=float, default=3600, help="server: give up after this many seconds")
    args = ap.parse_args()
    if args.role == "server":
        if not args.out:
            ap.error("server needs --out")
        server(args)
    else:
        clients(args)


if __name__ == "__main__":
    main()
