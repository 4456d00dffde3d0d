# SPDX-License-Identifier: Apache-2.0
"""psnet.torch against plain PyTorch on the same host, in the same run
(printed ratios, never pass/fail):

  speed     one psnet.torch worker (a LocalCluster of 2 shards, tensors in
            shared memory) against a plain torch.optim loop, same model, batch,
            optimizer and threads; runs interleaved, the median of --runs;
            samples/s and their ratio, for psnet's demo CNN and ResNet-18
  exchange  the ms one step's push and pull adds for ResNet-18 (45 MB of
            values), against numpy copies of the same bytes (gradients out,
            values in)
  accuracy  ResNet-18 (examples/resnet18_fashion.py's), 2 workers under BSP
            against one plain process on the combined batch, same initial
            weights, order and optimizer, on --limit images for --epochs; and
            against the plain process with BatchNorm over each half batch
            (what two workers compute: the difference BatchNorm makes)
  trajectory  ResNet-18's weights after --steps steps of the two, against the
            same plain loop on 1 thread and on 2 (the float-order noise floor)

    PYTHONPATH=python /usr/bin/python3 tests/bench/torch_any.py [speed] [exchange] [accuracy]
        [--runs 3] [--steps 30] [--limit 2048] [--epochs 1] [--threads 1] [--device cpu|cuda]
"""
import argparse
import importlib.util
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import psnet
import psnet.torch
from psnet.data import load
from psnet.models import build

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = os.environ.get("PSNET_DATA", "/usr/share/datasets/fashion-mnist")


def resnet18():
    spec = importlib.util.spec_from_file_location("ex", os.path.join(TOP, "examples", "resnet18_fashion.py"))
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    return ex.resnet18()


MODELS = {
    "cnn": lambda: build({"name": "cnn", "input": [1, 28, 28], "layers": [
        {"type": "conv2d", "out": 32, "kernel": 3, "padding": 1}, {"type": "relu"}, {"type": "maxpool", "kernel": 2},
        {"type": "conv2d", "out": 64, "kernel": 3, "padding": 1}, {"type": "relu"}, {"type": "maxpool", "kernel": 2},
        {"type": "flatten"}, {"type": "linear", "out": 128}, {"type": "relu"}, {"type": "linear", "out": 10}]}),
    "resnet18": resnet18,
}


def batches(n_steps, batch, seed=0, device="cpu"):
    x, y = load(DATA, "train", n_steps * batch)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(x), generator=g)
    x, y = torch.from_numpy(x).reshape(-1, 1, 28, 28)[idx], torch.from_numpy(y)[idx]
    return [(x[i * batch:(i + 1) * batch].to(device), y[i * batch:(i + 1) * batch].to(device))
            for i in range(n_steps)]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _rate(model, opt, data, device):
    """Samples/s of SGD steps over data, after one step's warm-up (psnet's
    first step connects and pulls)."""
    xb, yb = data[0]
    F.cross_entropy(model(xb), yb).backward()
    sync(device)
    t0 = time.perf_counter()
    for xb, yb in data:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    sync(device)
    return sum(len(b[1]) for b in data) / (time.perf_counter() - t0)


def plain(make, data, device):
    torch.manual_seed(0)
    model = make().to(device)
    return _rate(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), data, device)


def on_psnet(make, data, cluster, device):
    torch.manual_seed(0)
    model = make().to(device)
    opt = psnet.torch.Optimizer(model, coord=cluster, lr=0.01, momentum=0.9, progress=False)
    rate = _rate(model, opt, data, device)
    opt.finish()
    return rate


def speed(args):
    print(f"== speed on {args.device}: samples/s, one worker against a plain loop (SGD momentum, batch "
          f"{args.batch}, {args.threads} torch thread(s), median of {args.runs} interleaved runs)")
    torch.set_num_threads(args.threads)
    for name, make in MODELS.items():
        if name not in args.models.split(","):
            continue
        steps = args.steps if name == "cnn" or args.device == "cuda" else max(args.steps // 5, 4)
        data = batches(steps, args.batch, device=args.device)
        a, b = [], []
        try:
            make()
        except ImportError as e:
            print(f"{name:9s} failed: {e}", flush=True)
            continue
        with psnet.LocalCluster(shards=2) as cluster:
            for _ in range(args.runs):
                a.append(plain(make, data, args.device))
                b.append(on_psnet(make, data, cluster, args.device))
        pa, pb = statistics.median(a), statistics.median(b)
        print(f"{name:9s} plain {pa:8.1f}  psnet.torch {pb:8.1f}  ratio {pb / pa:.3f}  ({steps} steps)", flush=True)


def exchange(args):
    print("== exchange: ms a step's push and pull adds (ResNet-18), against numpy copies of the same bytes")
    torch.set_num_threads(args.threads)
    model = resnet18()
    nbytes = sum(t.numel() * 4 for t in model.state_dict().values())
    with psnet.LocalCluster(shards=2) as cluster:
        opt = psnet.torch.Optimizer(model, coord=cluster, lr=1e-9, progress=False)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.zero_grad()
        steps = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            opt.step()
            steps.append(time.perf_counter() - t0)
        opt.finish()
    src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
    copies = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        np.copyto(dst, src)  # the gradients out
        np.copyto(src, dst)  # the values in
        copies.append(time.perf_counter() - t0)
    s, c = statistics.median(steps) * 1e3, statistics.median(copies) * 1e3
    print(f"resnet18 {nbytes / 1e6:.1f} MB: step's exchange {s:.1f} ms, two memcpy {c:.1f} ms, "
          f"ratio {s / c:.2f} (median of {args.steps})", flush=True)


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)


def _plain(nsteps, batch, epochs, halves):
    """ResNet-18 trained by one plain process on nsteps batches for epochs:
    on the whole batch, or (halves) with BatchNorm over each half batch and
    the gradients averaged, what two BSP workers compute (DDP without
    SyncBatchNorm too)."""
    torch.manual_seed(0)
    model = resnet18()
    opt, half = _sgd(model), batch // 2
    data = batches(nsteps, batch)
    for _ in range(epochs):
        for xb, yb in data:
            opt.zero_grad()
            if halves:
                for h in range(2):
                    (F.cross_entropy(model(xb[h * half:(h + 1) * half]), yb[h * half:(h + 1) * half]) / 2).backward()
            else:
                F.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model


def _worker(args, coord, init_dir, nsteps, epochs, report, q):
    """One of two BSP workers, its half of each batch; puts (rank, its test
    accuracy) or (rank, its state_dict as numpy) as report says."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = resnet18()
    opt = psnet.torch.Optimizer(model, coord=coord, lr=0.05, momentum=0.9, weight_decay=5e-4, workers=2,
                                init_dir=init_dir, progress=False)
    half, r = args.batch // 2, opt.rank
    data = batches(nsteps, args.batch)
    for _ in range(epochs):
        for xb, yb in data:
            opt.zero_grad()
            F.cross_entropy(model(xb[r * half:(r + 1) * half]), yb[r * half:(r + 1) * half]).backward()
            opt.step()
    q.put((r, test_acc(model) if report == "accuracy" else {k: v.numpy().copy() for k, v in model.state_dict().items()}))
    opt.finish()


def _two_workers(args, nsteps, epochs, report):
    """{rank: what each of two worker processes reported} on a LocalCluster."""
    with psnet.LocalCluster(shards=2) as cluster:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        ps = [ctx.Process(target=_worker, args=(args, cluster.coord, cluster.dir, nsteps, epochs, report, q))
              for _ in range(2)]
        for p in ps:
            p.start()
        got = dict(q.get() for _ in ps)
        for p in ps:
            p.join()
    return got


def test_acc(model):
    tx, ty = load(DATA, "test", 2000)
    tx, ty = torch.from_numpy(tx).reshape(-1, 1, 28, 28), torch.from_numpy(ty)
    model.eval()
    with torch.no_grad():
        return sum((model(tx[i:i + 500]).argmax(1) == ty[i:i + 500]).sum().item()
                   for i in range(0, len(tx), 500)) / len(tx)


def accuracy(args):
    print(f"== accuracy: ResNet-18, 2 BSP workers (batch {args.batch // 2} each) against one plain process "
          f"(batch {args.batch}), {args.limit} images, {args.epochs} epoch(s), 2000 test images")
    torch.set_num_threads(args.threads)
    nsteps = args.limit // args.batch
    t0 = time.monotonic()
    ref, t_ref = test_acc(_plain(nsteps, args.batch, args.epochs, False)), time.monotonic() - t0
    t0 = time.monotonic()
    ghost, t_ghost = test_acc(_plain(nsteps, args.batch, args.epochs, True)), time.monotonic() - t0
    t0 = time.monotonic()
    got = _two_workers(args, nsteps, args.epochs, "accuracy")
    print(f"plain {ref:.4f} ({t_ref:.0f} s)  plain, BatchNorm over each half {ghost:.4f} ({t_ghost:.0f} s)  "
          f"psnet.torch 2 workers {got[0]:.4f} ({time.monotonic() - t0:.0f} s)  difference {100 * (got[0] - ref):+.2f} "
          f"points ({100 * (got[0] - ghost):+.2f} against the halves)", flush=True)


def _worst(a, b):
    """The largest relative difference of the trained tensors, and its name."""
    return max((((a[k].float() - v.float()).abs().max() / v.float().abs().max().clamp_min(1e-12)).item(), k)
               for k, v in b.items() if "running" not in k and "num_batches" not in k)


def trajectory(args):
    print(f"== trajectory: ResNet-18 weights after {args.steps} steps, 2 BSP workers against the plain loop "
          f"with BatchNorm over each half batch; the noise floor: that loop on 1 thread against 2")

    def halves(threads):
        torch.set_num_threads(threads)
        return _plain(args.steps, args.batch, 1, True).state_dict()

    ref = halves(2)
    got = {k: torch.from_numpy(v) for k, v in _two_workers(args, args.steps, 1, "state")[0].items()}
    w, k = _worst(got, ref)
    n, nk = _worst(halves(1), ref)
    print(f"psnet.torch against the halves loop: {w:.3g} ({k}); 1 thread against 2: {n:.3g} ({nk})", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", nargs="*", default=["speed", "exchange", "accuracy"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--limit", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="speed: cpu or cuda")
    p.add_argument("--models", default="cnn,resnet18", help="speed: which models")
    args = p.parse_args()
    for w in args.what:
        {"speed": speed, "exchange": exchange, "accuracy": accuracy, "trajectory": trajectory}[w](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
