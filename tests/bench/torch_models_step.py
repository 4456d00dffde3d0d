# SPDX-License-Identifier: Apache-2.0
"""Baseline of tests/bench/models-cpu.sh and of the GPU step times in
tests/gpu/device-run: one training step (forward, softmax cross-entropy,
backward into every parameter's .grad) of PyTorch's version of psnet's built-in
models, the work of bench-kernels' step. On the CPU a plain loop; with
--device cuda the step is captured once as a CUDA graph and replayed (PyTorch
at its fastest for a fixed shape; --no-graph: a plain loop), fp32 unless
--tf32 (matmuls and cuDNN convolutions). Prints one JSON line per model: the
median ms per step, and TFLOP/s for MLPs (6 x batch x sum of in x out, as
bench-kernels counts).

  /usr/bin/python3 tests/bench/torch_models_step.py --models cnn,vit --batch 64 --threads 2
  python3 tests/bench/torch_models_step.py --device cuda --models cnn,vit,mlp:784-1024-1024-10 --batch 512
"""
import argparse, json, time
import torch
from torch import nn


class Tokens(nn.Module):  # [B, C, H, W] -> [B, H*W, C]
    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


class PosEmbed(nn.Module):
    def __init__(self, t, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(t, d) * 0.02)

    def forward(self, x):
        return x + self.weight


class Mean(nn.Module):
    def forward(self, x):
        return x.mean(1)


def model(name):
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "vit":
        blocks = [nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True) for _ in range(3)]
        return nn.Sequential(nn.Conv2d(1, 64, 7, stride=7), Tokens(), PosEmbed(16, 64), *blocks, nn.LayerNorm(64),
                             Mean(), nn.Linear(64, 10))
    if name.startswith("mlp:"):
        dims = [int(v) for v in name[4:].split("-")]
        layers = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)
    raise SystemExit(f"unknown model {name}")


def step_times(m, x, y, steps, device, graph):
    loss_fn = nn.CrossEntropyLoss()

    def step():
        for p in m.parameters():
            p.grad = None
        loss = loss_fn(m(x), y)
        loss.backward()
        return loss

    cuda = device == "cuda"
    run = step
    if cuda and graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        for p in m.parameters():
            p.grad = None
        with torch.cuda.graph(g):
            loss_fn(m(x), y).backward()
        run = g.replay
    times = []
    for i in range(5 + steps):
        t0 = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="cnn,vit", help="comma-separated: cnn, vit, mlp:D0-...-Dn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--no-graph", action="store_true", help="cuda: a plain loop, no CUDA graph")
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(1)
    for name in a.models.split(","):
        m = model(name).to(a.device)
        shape = (a.batch, int(name[4:].split("-")[0])) if name.startswith("mlp:") else (a.batch, 1, 28, 28)
        x = torch.rand(*shape, device=a.device)
        y = torch.randint(0, 10, (a.batch,), device=a.device)
        ms = step_times(m, x, y, a.steps, a.device, not a.no_graph)
        out = {"model": name, "batch": a.batch, "device": a.device, "torch": torch.__version__,
               "ms_per_step": round(ms, 3)}
        if a.device == "cpu":
            out["threads"] = a.threads
        else:
            out.update(gpu=torch.cuda.get_device_name(0), graph=not a.no_graph, tf32=a.tf32)
        if name.startswith("mlp:"):
            dims = [int(v) for v in name[4:].split("-")]
            flop = 6 * a.batch * sum(dims[i] * dims[i + 1] for i in range(len(dims) - 1))
            out["tflops"] = round(flop / (ms * 1e-3) / 1e12, 1)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
