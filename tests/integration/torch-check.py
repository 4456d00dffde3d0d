#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's side of tests/integration/test-export.sh (Debian's python3-torch).

  torch-check.py eval FILE IDX_DIR N
      Loads a psnet export (python/psnet/models.py) into its torch.nn model
      and prints its accuracy on the first N Fashion-MNIST test images
      (pixels scaled to [0, 1], as psnet reads them).
  torch-check.py pretrain DESC.json IDX_DIR NTRAIN NTEST OUT
      Builds the model of a psnet description in torch.nn, trains it (SGD,
      2 epochs on the first NTRAIN training images), saves its state_dict as
      safetensors for a job's --init and prints its accuracy on NTEST.
  torch-check.py variant SRC DIR KIND...
      A broken copy of SRC per KIND, as DIR/KIND.safetensors: f64 (every tensor float64), drop (its last tensor
      missing), extra (a tensor more), reshape (the first tensor transposed),
      nan (a NaN in the first tensor), other (the same shapes, other values).
  torch-check.py diff A B
      The largest absolute difference between the tensors of A and B (the
      same names and shapes), or an error.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from psnet import data as psnet_data  # noqa: E402
from psnet.models import build, load, read_safetensors, save, write_safetensors  # noqa: E402


def images(src, split, n, shape):
    """The first n images of split ("train" or "test") as psnet reads them
    (psnet.data: pixels scaled to [0, 1]), shaped [n] + shape."""
    x, y = psnet_data.load(src, split, n)
    return torch.from_numpy(x).reshape([len(x)] + shape), torch.from_numpy(y)


def accuracy(model, x, y):
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 500]).argmax(1) for i in range(0, len(x), 500)])
    return (pred == y).double().mean().item()


def pretrain(desc_path, src, ntrain, ntest, out):
    with open(desc_path) as f:
        text = f.read()
    desc = json.loads(text)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = build(desc)
    x, y = images(src, "train", ntrain, desc["input"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(2):
        order = torch.randperm(len(x))
        for i in range(0, len(x), 64):
            b = order[i:i + 64]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
    model.eval()
    tx, ty = images(src, "test", ntest, desc["input"])
    save(model, text, out)
    print(f"{accuracy(model, tx, ty):.4f}")


def write_f64(path, tensors, meta):
    header, chunks, off = {"__metadata__": meta}, [], 0
    for name, t in tensors.items():
        raw = t.to(torch.float64).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F64", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(chunks))


def variant(src, out, kind):
    tensors, meta = read_safetensors(src)
    names = list(tensors)
    if kind == "f64":
        return write_f64(out, tensors, meta)
    if kind == "drop":
        del tensors[names[-1]]
    elif kind == "extra":
        tensors["head.weight"] = torch.zeros(3)
    elif kind == "reshape":
        first = tensors[names[0]]
        tensors[names[0]] = first.reshape(first.shape[0], -1).t().contiguous()
    elif kind == "nan":
        tensors[names[0]].view(-1)[7] = float("nan")
    elif kind == "other":
        tensors = {k: v + 0.01 for k, v in tensors.items()}
    else:
        sys.exit(f"torch-check.py: unknown variant {kind}")
    write_safetensors(out, tensors, meta)


def diff(a, b):
    ta, _ = read_safetensors(a)
    tb, _ = read_safetensors(b)
    if sorted(ta) != sorted(tb) or any(ta[k].shape != tb[k].shape for k in ta):
        sys.exit(f"torch-check.py: {a} and {b} hold other tensors")
    print(max((ta[k] - tb[k]).abs().max().item() for k in ta))


def main():
    cmd = sys.argv[1]
    if cmd == "eval":
        path, src, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        model, meta = load(path)
        x, y = images(src, "test", n, json.loads(meta["psnet.model"])["input"])
        torch.set_num_threads(2)
        print(f"{accuracy(model, x, y):.4f}")
    elif cmd == "pretrain":
        pretrain(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif cmd == "variant":
        # One process for them all: importing torch is most of the time.
        for kind in sys.argv[4:]:
            variant(sys.argv[2], os.path.join(sys.argv[3], kind + ".safetensors"), kind)
    elif cmd == "diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"torch-check.py: unknown command {cmd}")


main()
