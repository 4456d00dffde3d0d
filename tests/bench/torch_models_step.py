# SPDX-License-Identifier: Apache-2.0
"""Baseline of tests/bench/models-cpu.sh: one training step (forward, softmax
cross-entropy, backward into every parameter's .grad) of PyTorch's version of
psnet's built-in models on the CPU, the work of bench-kernels' step on psnet's
CPU backend. Prints one JSON line per model: the median ms per step.

  /usr/bin/python3 tests/bench/torch_models_step.py --models cnn,vit --batch 64 --threads 2
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="cnn,vit", help="comma-separated: cnn, vit, mlp:D0-...-Dn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    for name in a.models.split(","):
        m = model(name)
        x = torch.rand(a.batch, 784) if name.startswith("mlp:") else torch.rand(a.batch, 1, 28, 28)
        y = torch.randint(0, 10, (a.batch,))
        loss_fn = nn.CrossEntropyLoss()
        times = []
        for i in range(5 + a.steps):
            t0 = time.perf_counter()
            for p in m.parameters():
                p.grad = None
            loss = loss_fn(m(x), y)
            loss.backward()
            if i >= 5:
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        print(json.dumps({"model": name, "batch": a.batch, "threads": a.threads, "torch": torch.__version__,
                          "ms_per_step": round(times[len(times) // 2], 3)}))


if __name__ == "__main__":
    main()
