# SPDX-License-Identifier: Apache-2.0
"""The checks of test-torch.sh that run in Python: psnet.torch training
models psnet cannot describe as layers, against PyTorch's own optimizers.

    torch-any.py CHECK [ARGS]   prints "ok" lines and exits 0, or says why and exits 1
"""
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import psnet
import psnet.torch
from psnet.client import PsnetError
from pychecks import fail, say, wait_for

DATA = os.environ.get("PSNET_DATA", "/usr/share/datasets/fashion-mnist")


def fashion(split, n):
    from psnet.data import load
    x, y = load(DATA, split, n)
    return torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y)


class ResNetSmall(nn.Module):
    """BatchNorm, a residual connection and a custom head: nothing psnet's
    layer descriptions can say."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.stem(x))), 2)
        x = F.relu(x + self.block(x))  # the residual
        return self.head(F.max_pool2d(x, 2).flatten(1))


def custom_loss(logits, y):
    """Label smoothing plus a penalty on the logits' size: a loss of the user's own."""
    return F.cross_entropy(logits, y, label_smoothing=0.1) + 1e-3 * logits.pow(2).mean()


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def check_anymodel(coord, out, init_dir):
    """Trains ResNetSmall with a custom loss to an accuracy, then the export
    loaded into a fresh model gives the accuracy psnet reported."""
    torch.manual_seed(1)
    x, y = fashion("train", 6000)
    tx, ty = fashion("test", 1000)
    model = ResNetSmall()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = psnet.torch.Optimizer(model, coord=coord, optim="adam", lr=2e-3, progress=False, init_dir=init_dir)
    same = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    if not same:
        fail("the job did not start from the model's own values")
    say("the job starts from the model's own values (init='model')")
    g = torch.Generator().manual_seed(0)
    for epoch in range(2):
        for idx in torch.randperm(len(x), generator=g).split(64):
            opt.zero_grad()
            loss = custom_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step(loss=loss, samples=len(idx))
    acc = accuracy(model, tx, ty)
    opt.finish(evaluate=lambda: accuracy(model, tx, ty))
    with open(out, "w") as f:
        json.dump({"accuracy": acc, "steps": opt.steps}, f)
    if acc < 0.80:
        fail(f"accuracy {acc:.4f} after 2 epochs of 6000 images, below 0.80")
    say(f"BatchNorm + residual + custom loss train to {acc:.4f} (>= 0.80) in {opt.steps} steps")
    fresh = ResNetSmall()
    sd = psnet.torch.state_dict(coord, fresh)
    fresh.load_state_dict(sd, strict=True)
    acc2 = accuracy(fresh, tx, ty)
    if abs(acc2 - acc) > 1e-6:
        fail(f"the exported state_dict gives {acc2:.4f}, the trained model {acc:.4f}")
    if not torch.allclose(sd["bn1.running_mean"], model.bn1.running_mean):
        fail("the export's running mean is not the model's")
    say(f"the exported state_dict loads into a fresh model (strict) and gives the same accuracy {acc2:.4f}, "
        "BatchNorm's running statistics included")


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(784, 64)
        self.b = nn.Linear(64, 10)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x.flatten(1))))


BSP_STEPS, BSP_BATCH = 12, 128
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)


def bsp_batches():
    x, y = fashion("train", BSP_STEPS * BSP_BATCH)
    return x.reshape(BSP_STEPS, BSP_BATCH, 1, 28, 28), y.reshape(BSP_STEPS, BSP_BATCH)


def check_bsp_worker(coord, out, init_dir):
    """One of two BSP workers: its half of each batch."""
    torch.manual_seed(7)
    model = Mlp()
    opt = psnet.torch.Optimizer(model, coord=coord, optim="sgd", workers=2, progress=False, init_dir=init_dir,
                                **SGD)
    xs, ys = bsp_batches()
    r, w = opt.rank, opt.world_size
    if w != 2:
        fail(f"world_size {w}, not 2")
    half = BSP_BATCH // 2
    for s in range(BSP_STEPS):
        opt.zero_grad()
        xb, yb = xs[s, r * half:(r + 1) * half], ys[s, r * half:(r + 1) * half]
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    torch.save(model.state_dict(), out)
    opt.finish(evaluate=lambda: 0.0)


def check_bsp_compare(a, b):
    """Both workers' final weights equal torch.optim.SGD's on the whole batch."""
    torch.manual_seed(7)
    ref = Mlp()
    o = torch.optim.SGD(ref.parameters(), **SGD)
    xs, ys = bsp_batches()
    for s in range(BSP_STEPS):
        o.zero_grad()
        F.cross_entropy(ref(xs[s]), ys[s]).backward()
        o.step()
    worst = 0.0
    for path in (a, b):
        got = torch.load(path)
        for k, v in ref.state_dict().items():
            d = (got[k] - v).abs().max().item() / max(v.abs().max().item(), 1e-12)
            worst = max(worst, d)
    if worst > 1e-5:
        fail(f"two BSP workers differ from torch.optim.SGD on the combined batch by {worst:.3g} (relative)")
    say(f"two BSP workers end with torch.optim.SGD's weights on the combined batch ({BSP_STEPS} steps, momentum, "
        f"weight decay): largest relative difference {worst:.2g} <= 1e-5")


def check_errors():
    with psnet.LocalCluster(shards=1, memory_limit=1 << 20) as c:
        big = nn.Linear(1024, 1024)  # 4 MiB of values alone
        try:
            psnet.torch.Optimizer(big, coord=c, progress=False)
            fail("a model larger than the shards' memory was taken")
        except PsnetError as e:
            if "MiB of values" not in e.strerror or "refused the job" not in e.strerror:
                fail(f"too large: unclear error: {e}")
            say(f"a model too large for the shards is refused before it starts: {e.strerror}")
    with psnet.LocalCluster(shards=1) as c:
        model = Mlp()
        running = psnet.torch.Optimizer(model, coord=c, mode="asp", progress=False)
        other = Mlp()
        other.b = nn.Linear(64, 12)
        try:
            psnet.torch.Optimizer(other, coord=c, progress=False, timeout=10)
            fail("a model of other tensors joined the job")
        except psnet.torch.JobMismatch as e:
            if "'b.weight' is [12, 64] in the model, [10, 64] in the job" not in str(e):
                fail(f"the mismatch does not name the first differing tensor: {e}")
            say(f"a model whose tensors differ is refused, naming the first: {e}")
        st = psnet.cluster.status(c.coord)
        if st["job"]["state"] != "running" or len(st["workers"]) != 1:
            fail(f"the refused model left the job {st['job']['state']} with {len(st['workers'])} workers")
        say("the running job goes on with its one worker")
        running.close()

        class Complex(nn.Module):
            def __init__(self):
                super().__init__()
                self.z = nn.Parameter(torch.zeros(3, dtype=torch.complex64))
        try:
            psnet.torch.Optimizer(Complex(), coord=c, progress=False)
            fail("a complex parameter was taken")
        except TypeError as e:
            if "'z' is torch.complex64" not in str(e):
                fail(f"unclear dtype error: {e}")
            say(f"a non-float parameter is refused by name: {e}")


def check_interrupt(coord, role, run):
    """Ctrl-C during a step: one of two BSP workers (a) is interrupted while
    its step of clock 10 waits for the other (b, which holds its push of
    clock 10 back until a was interrupted); the KeyboardInterrupt comes at
    once, the interrupted step still counts when b goes on, and both end with
    the same weights after the same steps."""
    import threading
    torch.manual_seed(11)
    model = Mlp()
    opt = psnet.torch.Optimizer(model, coord=coord, workers=2, progress=False, lr=0.05, init=None)
    xs, ys = bsp_batches()
    steps, interrupted = 30, None
    if role == "a":
        # A shell starts background jobs with SIGINT ignored; a terminal or a
        # notebook gives Python its KeyboardInterrupt handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def interrupter():
            # a's round of clock 10 cannot end before b pushes clock 10: Ctrl-C then
            # (never, if that does not come: the comparison then fails).
            if not wait_for(lambda: os.path.exists(os.path.join(run, "b-at-10")) and opt.clock == 10 and
                            opt._inflight is not None, 60):
                return
            with open(os.path.join(run, "a-sigint"), "w") as f:
                f.write(repr(time.monotonic()))
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupter, daemon=True).start()
    s = 0
    while s < steps:
        try:
            opt.zero_grad()
            F.cross_entropy(model(xs[s % BSP_STEPS]), ys[s % BSP_STEPS]).backward()
            if role == "b" and s == 10:
                open(os.path.join(run, "b-at-10"), "w").close()
                # Its push held back until a was interrupted.
                wait_for(lambda: os.path.exists(os.path.join(run, "a-interrupted")), 60)
            opt.step()
        except KeyboardInterrupt:
            t = time.monotonic()
            sent = float(open(os.path.join(run, "a-sigint")).read())
            interrupted = t - sent
            with open(os.path.join(run, "a-interrupted"), "w") as f:
                f.write(f"{interrupted:.3f} in_flight={opt.in_flight}")
            if not opt.in_flight:
                continue  # the interrupt came before the step was sent: the batch again
        s += 1
    opt.finish(evaluate=lambda: 0.5)
    torch.save({"state": model.state_dict(), "steps": opt.steps, "interrupted": interrupted},
               os.path.join(run, f"int-{role}.pt"))


def check_interrupt_compare(run):
    a, b = torch.load(os.path.join(run, "int-a.pt")), torch.load(os.path.join(run, "int-b.pt"))
    if a["interrupted"] is None or a["interrupted"] > 1.0:
        fail(f"Ctrl-C reached the step after {a['interrupted']} s")
    say(f"Ctrl-C during a BSP step that waits for the other worker raises KeyboardInterrupt after "
        f"{a['interrupted']:.3f} s")
    same = all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    if not same or a["steps"] != b["steps"]:
        fail(f"after the interrupt the workers differ: steps {a['steps']} and {b['steps']}, same weights {same}")
    say(f"the interrupted step still counted: both workers end after {a['steps']} steps with the same weights")


def check_schedule():
    """lr_schedule="cosine": 20 steps on the shards end with the weights of
    torch.optim.SGD under CosineAnnealingLR over the same 20 steps."""
    total = 20
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

    def loss_of(m):
        return (m(x) ** 2).mean()

    torch.manual_seed(5)
    ref = nn.Linear(4, 2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=total)
    for _ in range(total):
        ref_opt.zero_grad()
        loss_of(ref).backward()
        ref_opt.step()
        sched.step()
    with psnet.LocalCluster(shards=1) as c:
        torch.manual_seed(5)
        m = nn.Linear(4, 2)
        opt = psnet.torch.Optimizer(m, coord=c, progress=False, lr=0.1, lr_schedule="cosine", total_steps=total)
        for _ in range(total):
            opt.zero_grad()
            loss_of(m).backward()
            opt.step()
        worst = max((m.state_dict()[k] - v).abs().max().item() for k, v in ref.state_dict().items())
        opt.finish()
    if worst > 1e-6:
        fail(f"cosine schedule: the weights differ from SGD under CosineAnnealingLR by {worst:.3g}")
    say(f"lr_schedule='cosine' over total_steps={total}: the weights are torch.optim.SGD's under "
        f"CosineAnnealingLR (largest difference {worst:.2g})")


def check_gone(cluster_dir):
    """The shards die mid-job: step raises, naming the reason, in bounded time."""
    c = psnet.LocalCluster(shards=1, dir=cluster_dir, keep=True).start()
    try:
        model = Mlp()
        opt = psnet.torch.Optimizer(model, coord=c, progress=False, round_timeout=3)
        x, y = fashion("train", 64)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        c.procs["psd-1"].send_signal(signal.SIGKILL)
        c.procs["psd-1"].wait()
        t0 = time.monotonic()
        try:
            for _ in range(5):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            fail("steps went on with the shard dead")
        except PsnetError as e:
            took = time.monotonic() - t0
            if "step at clock" not in e.strerror or took > 30:
                fail(f"unclear or late ({took:.1f} s): {e}")
            say(f"the shard killed mid-job: step raises PsnetError after {took:.1f} s: {e.strerror}")
        opt.close()
    finally:
        c.close()
    # Two shards keep each key twice: one killed, its backup takes over.
    with psnet.LocalCluster(shards=2) as c:
        model = Mlp()
        opt = psnet.torch.Optimizer(model, coord=c, progress=False, round_timeout=30)
        x, y = fashion("train", 64)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        c.procs["psd-2"].send_signal(signal.SIGKILL)
        c.procs["psd-2"].wait()
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        st = psnet.cluster.status(c)
        if st["job"]["state"] != "running" or len(st["shards"]) != 1:
            fail(f"after a shard's death: job {st['job']['state']}, {len(st['shards'])} shards")
        say(f"with two shards, one killed mid-job: its backup takes over and 5 more steps go on "
            f"(failovers {st['job']['failovers']})")
        opt.close()


def check_join(coord, role, out):
    """A BSP job of one worker that a second joins while it runs."""
    torch.manual_seed(3)
    model = Mlp()
    opt = psnet.torch.Optimizer(model, coord=coord, workers=1, progress=False, lr=0.01)
    x, y = fashion("train", 64)
    seen = set()
    end = time.monotonic() + 120
    # The first trains until the second has joined and both trained a while;
    # the second trains 40 steps.
    while time.monotonic() < end:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seen.add(opt.world_size)
        if role == "first" and opt.steps == 20:
            open(out + ".ready", "w").close()  # the second may come now
        if role == "second" and opt.steps >= 40:
            break
        if role == "first" and os.path.exists(out + ".second-done"):
            break
    with open(out, "w") as f:
        json.dump({"sizes": sorted(seen), "steps": opt.steps, "rank": opt.rank}, f)
    opt.finish(evaluate=lambda: accuracy(model, x.reshape(-1, 1, 28, 28), y))
    if role == "second":
        open(out.replace("join-2", "join-1") + ".second-done", "w").close()


def check_cuda():
    """A model on the GPU: psnet.torch's gradients through page-locked
    memory against torch.optim.SGD on the same GPU (TF32 off: float32
    products on both sides)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    xs, ys = bsp_batches()
    xs, ys = xs.to(dev), ys.to(dev)
    torch.manual_seed(7)
    ref = Mlp().to(dev)
    o = torch.optim.SGD(ref.parameters(), **SGD)
    for s in range(BSP_STEPS):
        o.zero_grad()
        F.cross_entropy(ref(xs[s]), ys[s]).backward()
        o.step()
    with psnet.LocalCluster(shards=2) as c:
        torch.manual_seed(7)
        model = Mlp().to(dev)
        opt = psnet.torch.Optimizer(model, coord=c, progress=False, **SGD)
        for s in range(BSP_STEPS):
            opt.zero_grad()
            F.cross_entropy(model(xs[s]), ys[s]).backward()
            opt.step()
        if any(p.device.type != "cuda" for p in model.parameters()):
            fail("the model's parameters left the GPU")
        worst = max(((model.state_dict()[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item()
                    for k, v in ref.state_dict().items())
        opt.finish()
    if worst > 1e-5:
        fail(f"a model on CUDA differs from torch.optim.SGD on the GPU by {worst:.3g} (relative)")
    say(f"a model on CUDA trains as torch.optim.SGD on the GPU ({BSP_STEPS} steps): largest relative "
        f"difference {worst:.2g} <= 1e-5")


def main():
    check, args = sys.argv[1], sys.argv[2:]
    if check == "anymodel":
        check_anymodel(args[0], args[1], args[2])
    elif check == "bsp-worker":
        check_bsp_worker(args[0], args[1], args[2])
    elif check == "bsp-compare":
        check_bsp_compare(args[0], args[1])
    elif check == "errors":
        check_errors()
    elif check == "interrupt":
        check_interrupt(args[0], args[1], args[2])
    elif check == "interrupt-compare":
        check_interrupt_compare(args[0])
    elif check == "schedule":
        check_schedule()
    elif check == "gone":
        check_gone(args[0])
    elif check == "cuda":
        check_cuda()
    elif check == "join":
        check_join(args[0], args[1], args[2])
    else:
        fail(f"unknown check {check}")


if __name__ == "__main__":
    main()
