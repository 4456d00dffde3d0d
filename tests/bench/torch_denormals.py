# SPDX-License-Identifier: Apache-2.0
"""How much of an optimizer's state a long run leaves denormal: PyTorch on the
CPU trains one of psnet's built-in models (tests/bench/torch_models_step.py's
copies: cnn, vit, or mlp:784-256-10) on Fashion-MNIST with Adam (lr 0.001) or
momentum SGD (lr 0.04, 0.9), batch 64, and prints every --every steps how many
values of each state tensor (Adam's exp_avg and exp_avg_sq, SGD's
momentum_buffer) and of the gradients lie below FLT_MIN but above 0. The
figure behind psd's flush of denormals (docs/consistency.md, "Optimizers").
Not pass/fail. Run with /usr/bin/python3 (Debian's python3-torch).

  torch_denormals.py [--model cnn] [--optim adam|sgd] [--steps 1800] [--every 300]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_fmnist_loop  # noqa: E402  (the data loader)
import torch_models_step  # noqa: E402  (psnet's models in PyTorch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--optim", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--every", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    torch.manual_seed(1)
    d = a.data
    x = torch_fmnist_loop.idx(os.path.join(d, "train-images-idx3-ubyte.gz"), 16).reshape(-1, 784)
    y = torch_fmnist_loop.idx(os.path.join(d, "train-labels-idx1-ubyte.gz"), 8)
    x = torch.tensor(x, dtype=torch.float32) / 255.0
    y = torch.tensor(y, dtype=torch.int64)
    model = torch_models_step.model(a.model)
    if a.optim == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.04, momentum=0.9)
    image = a.model == "cnn"
    tiny = torch.finfo(torch.float32).tiny
    values = sum(p.numel() for p in model.parameters())
    perm = torch.randperm(x.shape[0])
    per_pass = x.shape[0] // a.batch
    for s in range(a.steps):
        i = perm[(s % per_pass) * a.batch:(s % per_pass + 1) * a.batch]
        xb = x[i].view(-1, 1, 28, 28) if image else x[i]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), y[i]).backward()
        opt.step()
        if (s + 1) % a.every:
            continue
        counts = {}
        for p in model.parameters():
            for k, v in list(opt.state[p].items()) + [("grad", p.grad)]:
                if torch.is_tensor(v) and v.numel() > 1:
                    m = v.abs()
                    counts[k] = counts.get(k, 0) + int(((m > 0) & (m < tiny)).sum())
        print(f"step={s + 1} values={values} " + " ".join(
            f"{k}_denormal={n} ({n / values:.1%})" for k, n in counts.items()), flush=True)


if __name__ == "__main__":
    main()
