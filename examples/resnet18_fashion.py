# SPDX-License-Identifier: Apache-2.0
"""torchvision's ResNet-18 (a 1-channel stem for 28x28 images) trained on
Fashion-MNIST by worker processes under BSP, the shards holding its 11 M
weights, BatchNorm statistics included, and running SGD with momentum.

    python examples/resnet18_fashion.py --workers 2             # a LocalCluster and 2 workers here
    python examples/resnet18_fashion.py --coord tcp://host:7000 --workers 2 --rank-of 1
                                        # one worker of 2 against a running cluster (run it once per worker)

Each worker trains its share of every epoch (opt.sampler, sample i to rank
i mod W) with batch --batch; the lr applies to the mean gradient of the W
batches, as one process on the combined batch (DDP's convention). Needs
torchvision (Debian's python3-torchvision or pip's)."""
import argparse
import multiprocessing as mp
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import psnet
import psnet.torch
from psnet.data import load


def resnet18():
    import torchvision
    m = torchvision.models.resnet18(num_classes=10)
    # 28x28 grey images: a 3x3 stem of stride 1 and no max-pool, as is usual for small images.
    m.conv1 = nn.Conv2d(1, 64, 3, stride=1, padding=1, bias=False)
    m.maxpool = nn.Identity()
    return m


def data(args):
    x, y = load(args.data, "train", args.limit)
    tx, ty = load(args.data, "test", args.test_limit)
    return (torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y),
            torch.from_numpy(tx).reshape(-1, 1, 28, 28), torch.from_numpy(ty))


def evaluate(model, tx, ty):
    model.eval()
    with torch.no_grad():
        acc = sum((model(tx[i:i + 500]).argmax(1) == ty[i:i + 500]).sum().item() for i in range(0, len(tx), 500))
    model.train()
    return acc / len(tx)


def worker(args, coord, init_dir):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the same initial weights in every worker (the first registers them)
    x, y, tx, ty = data(args)
    model = resnet18()
    opt = psnet.torch.Optimizer(model, coord=coord, optim="sgd", lr=args.lr, momentum=0.9, weight_decay=5e-4,
                                mode="bsp", workers=args.workers, init_dir=init_dir, progress=not args.quiet)
    sampler = opt.sampler(len(x), seed=args.seed)
    rank, world = opt.rank, opt.world_size  # as the job started (a worker that ends first leaves it)
    t0 = time.monotonic()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        steps = len(order) // args.batch  # every worker the same number of steps
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step(loss=loss, samples=len(idx))
        if opt.rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {evaluate(model, tx, ty):.4f} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    acc = evaluate(model, tx, ty)
    opt.finish(evaluate=lambda: evaluate(model, tx, ty))
    print(f"worker {rank} of {world}: final test accuracy {acc:.4f}, "
          f"{len(x) * args.epochs / world / (time.monotonic() - t0):.1f} samples/s", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coord", help="a running cluster's pscoord (default: start a LocalCluster)")
    p.add_argument("--workers", type=int, default=2, help="workers of the BSP job (default 2)")
    p.add_argument("--rank-of", type=int, default=None,
                   help="with --coord: run one worker (any number; the job gives ranks) instead of --workers here")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--limit", type=int, default=0, help="the first N training images (0: all 60,000)")
    p.add_argument("--test-limit", type=int, default=10000)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-dir", help="with --coord: a directory pscoord and the shards read, to start from "
                   "the model's own initial weights")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    if args.coord and args.rank_of is not None:
        worker(args, args.coord, args.init_dir)
        return 0
    cluster = None if args.coord else psnet.LocalCluster(shards=2).start()
    coord = args.coord or cluster.coord
    init_dir = args.init_dir or (cluster.dir if cluster else None)
    try:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=worker, args=(args, coord, init_dir)) for _ in range(args.workers)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
        return max(pr.exitcode for pr in procs)
    finally:
        if cluster:
            cluster.close()


if __name__ == "__main__":
    sys.exit(main())
