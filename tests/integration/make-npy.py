#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes NumPy data sets with numpy.save for tests/integration/test-data.sh.

  make-npy.py fmnist IDX_DIR OUT_DIR N_TRAIN N_TEST
      Fashion-MNIST's first images as float32 [N, 1, 28, 28], standardised
      (mean 0.286, std 0.353), labels int64.
  make-npy.py blobs OUT_DIR N_TRAIN N_TEST
      Three Gaussian blobs in 20 dimensions (float32 [N, 20]), labels int32.
  make-npy.py bad OUT_DIR KIND
      A small set with one defect: labels11 (a label of 11), float64
      features, or nan (a NaN feature).
"""
import gzip
import os
import sys

import numpy as np


def idx(path, n):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    a = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    return a[:n]


def save(out, split, x, y):
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, f"x_{split}.npy"), x)
    np.save(os.path.join(out, f"y_{split}.npy"), y)


def main():
    kind = sys.argv[1]
    if kind == "fmnist":
        src, out, ntr, nte = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        for split, prefix, n in (("train", "train", ntr), ("test", "t10k", nte)):
            x = idx(os.path.join(src, f"{prefix}-images-idx3-ubyte.gz"), n).astype(np.float32) / 255.0
            x = ((x - 0.286) / 0.353).reshape(-1, 1, 28, 28).astype(np.float32)
            y = idx(os.path.join(src, f"{prefix}-labels-idx1-ubyte.gz"), n).astype(np.int64)
            save(out, split, x, y)
    elif kind == "blobs":
        out, ntr, nte = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        rng = np.random.default_rng(7)
        centres = rng.normal(0, 3, size=(3, 20))
        for split, n in (("train", ntr), ("test", nte)):
            y = rng.integers(0, 3, size=n).astype(np.int32)
            x = (centres[y] + rng.normal(0, 1, size=(n, 20))).astype(np.float32)
            save(out, split, x, y)
    elif kind == "bad":
        out, defect = sys.argv[2], sys.argv[3]
        x = np.zeros((256, 784), dtype=np.float32)
        y = np.arange(256, dtype=np.int64) % 10
        if defect == "labels11":
            y[100] = 11
        elif defect == "float64":
            x = x.astype(np.float64)
        elif defect == "nan":
            x[7, 3] = np.nan
        save(out, "train", x, y)
        save(out, "test", x, y)
    else:
        sys.exit(f"make-npy.py: unknown kind {kind}")


main()
