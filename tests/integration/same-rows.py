# SPDX-License-Identifier: Apache-2.0
"""same-rows.py A B: two psctl exports (safetensors) of a job with a table
named ids hold the same ids with the same rows, bit for bit, and the same
dense tensors; exit status 0 if so (and more than 1000 rows)."""
import json, struct, sys
import numpy as np
def load(path):
    b = open(path, "rb").read()
    n, = struct.unpack_from("<Q", b, 0)
    head = json.loads(b[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        out[name] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype=dt).reshape(t["shape"])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
ia, ib = np.argsort(a["ids.ids"]), np.argsort(b["ids.ids"])
same = (np.array_equal(a["ids.ids"][ia], b["ids.ids"][ib]) and
        np.array_equal(a["ids.rows"][ia].view(np.uint32), b["ids.rows"][ib].view(np.uint32)))
dense = all(np.array_equal(a[k], b[k]) for k in a if not k.startswith("ids."))
print(f"{len(ia)} rows {'equal' if same else 'differ'}, dense tensors {'equal' if dense else 'differ'}")
sys.exit(0 if same and dense and len(ia) > 1000 else 1)
