# SPDX-License-Identifier: Apache-2.0
"""Baseline of psnet's end-to-end GPU benchmark (tests/bench/e2e-gpu.sh): a plain
single-process PyTorch training loop of the same model (an MLP's widths, or
cnn/vit: tests/bench/torch_models_step.py's copies of psnet's), batch, optimizer and
epochs, over Fashion-MNIST held on the GPU: SGD with momentum, or with --optim adam
Adam (what deploy/local/demo gives cnn and vit; e2e-gpu.sh passes it for them).
No per-step host sync (the loss is read once per epoch), so this is PyTorch at its
plain-loop best.
Prints one JSON line: samples_per_s over the training loop, seconds, accuracy."""
import argparse, gzip, json, os, time
import numpy as np
import torch

import torch_models_step  # beside this file


def idx(path, header):
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)


def load(d, split):
    x = idx(os.path.join(d, f"{split}-images-idx3-ubyte.gz"), 16).reshape(-1, 784)
    y = idx(os.path.join(d, f"{split}-labels-idx1-ubyte.gz"), 8)
    return (torch.tensor(x, dtype=torch.float32, device="cuda") / 255.0,
            torch.tensor(y, dtype=torch.int64, device="cuda"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--model", default="784-256-10")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=None, help="default 0.02 for sgd, 0.001 for adam")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--optim", choices=("sgd", "adam"), default="sgd",
                    help="sgd (with --lr, --momentum) or adam (lr 0.001 unless --lr is given)")
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(1)
    model = torch_models_step.model(a.model if a.model in ("cnn", "vit") else "mlp:" + a.model).cuda()
    if a.optim == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=a.lr if a.lr is not None else 1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr if a.lr is not None else 0.02, momentum=a.momentum)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    if a.model in ("cnn", "vit"):
        xtr, xte = xtr.reshape(-1, 1, 28, 28), xte.reshape(-1, 1, 28, 28)
    n, steps = xtr.shape[0], xtr.shape[0] // a.batch
    lossf = torch.nn.CrossEntropyLoss()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        perm = torch.randperm(n, device="cuda")
        for s in range(steps):
            i = perm[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(xtr[i]), ytr[i])
            loss.backward()
            opt.step()
        last = loss.item()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "model": a.model, "optim": a.optim, "batch": a.batch,
                      "epochs": a.epochs, "steps": steps * a.epochs, "seconds": round(secs, 3),
                      "samples_per_s": round(steps * a.epochs * a.batch / secs),
                      "last_loss": round(last, 4), "accuracy": round(acc, 4)}))


if __name__ == "__main__":
    main()
