# SPDX-License-Identifier: Apache-2.0
"""same-rows.py A B: two psctl exports (safetensors) of a job with tables
(NAME.ids and NAME.rows each) hold the same tables, each with the same ids
and the same rows, bit for bit, and the same dense tensors; exit status 0 if
so (and more than 1000 rows in all)."""
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
tables = sorted(k[:-len(".ids")] for k in a if k.endswith(".ids"))
same, rows = sorted(tables) == sorted(k[:-len(".ids")] for k in b if k.endswith(".ids")), 0
for t in tables if same else []:
    ia, ib = np.argsort(a[t + ".ids"]), np.argsort(b[t + ".ids"])
    same = same and (np.array_equal(a[t + ".ids"][ia], b[t + ".ids"][ib]) and
                     np.array_equal(a[t + ".rows"][ia].view(np.uint32), b[t + ".rows"][ib].view(np.uint32)))
    rows += len(ia)
inrows = tuple(t + s for t in tables for s in (".ids", ".rows"))
dense = all(np.array_equal(a[k], b[k]) for k in a if k not in inrows)
print(f"{rows} rows of {len(tables)} table{'' if len(tables) == 1 else 's'} {'equal' if same else 'differ'}, "
      f"dense tensors {'equal' if dense else 'differ'}")
sys.exit(0 if same and dense and rows > 1000 else 1)
