# SPDX-License-Identifier: Apache-2.0
"""A psnet job's data set in NumPy, read as workerd reads it (docs/data.md):
Fashion-MNIST's IDX files (gzip or raw), or NumPy pairs x_train.npy,
y_train.npy, x_test.npy, y_test.npy; uint8 features scaled to [0, 1],
float32 ones as they are; the first `limit` samples (0: all)."""
import gzip
import os

import numpy as np


def _idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] or data[1] or data[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _idx_file(d, kind):
    for name in (f"{kind}.gz", kind):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    raise FileNotFoundError(f"{d}: no {kind}.gz or {kind} (nor NumPy x_train.npy)")


def load(d, split, limit=0):
    """(x, y) of split "train" or "test": x float32 [N, ...], y int64 [N]."""
    if os.path.exists(os.path.join(d, "x_train.npy")):
        x = np.load(os.path.join(d, f"x_{split}.npy"), mmap_mode="r")
        y = np.load(os.path.join(d, f"y_{split}.npy"), mmap_mode="r")
    else:
        s = "train" if split == "train" else "t10k"
        x = _idx(_idx_file(d, f"{s}-images-idx3-ubyte"))
        y = _idx(_idx_file(d, f"{s}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / np.float32(255.0)
    elif x.dtype != np.float32:
        raise ValueError(f"{d}: features of type {x.dtype}; psnet reads float32 or uint8")
    return np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)


def shuffle(a, seed, rank, epoch_pass):
    """Shuffles list a in place as workerd shuffles its partition at the
    start of each pass (a is the share in ascending order every pass, so a
    pass's order depends on seed, rank and pass alone): Fisher-Yates with
    splitmix64 from seed * 1000003 + rank * 7919 + pass."""
    mask = (1 << 64) - 1
    x = (seed * 1000003 + ((rank * 7919) & 0xFFFFFFFF) + epoch_pass) & mask
    for i in range(len(a), 1, -1):
        x = (x + 0x9E3779B97F4A7C15) & mask
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        j = z % i
        a[i - 1], a[j] = a[j], a[i - 1]
    return a
