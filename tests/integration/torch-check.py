#!/usr/bin/python3
"""PyTorch's side of tests/integration/test-export.sh (Debian's python3-torch).

  torch-check.py eval FILE IDX_DIR N
      Loads a psnet export (python/psnet/models.py) into its torch.nn model
      and prints its accuracy on the first N Fashion-MNIST test images
      (pixels scaled to [0, 1], as psnet reads them).
"""
import gzip
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from psnet.models import load  # noqa: E402


def idx(path, n):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)[:n]


def main():
    cmd = sys.argv[1]
    if cmd == "eval":
        path, src, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        model, meta = load(path)
        desc = __import__("json").loads(meta["psnet.model"])
        x = idx(os.path.join(src, "t10k-images-idx3-ubyte.gz"), n).astype(np.float32) / 255.0
        y = idx(os.path.join(src, "t10k-labels-idx1-ubyte.gz"), n).astype(np.int64)
        x = torch.from_numpy(x).reshape([len(x)] + desc["input"])
        torch.set_num_threads(2)
        with torch.no_grad():
            pred = torch.cat([model(x[i:i + 500]).argmax(1) for i in range(0, len(x), 500)])
        print(f"{(pred.numpy() == y).mean():.4f}")
    else:
        sys.exit(f"torch-check.py: unknown command {cmd}")


main()
