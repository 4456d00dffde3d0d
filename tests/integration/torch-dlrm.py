# SPDX-License-Identifier: Apache-2.0
"""The checks of test-dlrm.sh that run in Python: workerd's built-in
dlrm:F:BOT:TOP against the DLRM of the paper's PyTorch reference
(facebookresearch/dlrm, dlrm_s_pytorch.py: bottom and top nn.Sequential,
dot interactions of the bottom's output and the fields' embeddings by
torch.bmm, the strictly lower triangle in row order), trained by PyTorch.

    torch-dlrm.py init MODEL OUT             writes OUT, a start for --init
    torch-dlrm.py steps DATA MODEL INIT EXPORT STEPS LR AUC
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

from psnet.models import read_safetensors, write_safetensors
from pychecks import check_logged_auc, fail, say

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from clicks_torch import mlp  # noqa: E402  the Sequential MLPs of tests/bench's PyTorch DLRM


def arch(model):
    """dlrm:F:D-...-E:T1-...-1 -> F, the bottom's widths, the top's."""
    _, f, bot, top = model.split(":")
    f, bot = int(f), [int(w) for w in bot.split("-")]
    e = bot[-1]
    return f, bot, [e + f * (f + 1) // 2] + [int(w) for w in top.split("-")]


class DLRM(nn.Module):
    def __init__(self, model, rows):
        super().__init__()
        self.f, bot, top = arch(model)
        self.bot, self.top = mlp(bot, True), mlp(top, False)
        self.emb = nn.Parameter(rows)  # [ids, E], the table's rows by index

    def forward(self, idx, mask, dense):
        z = self.bot(dense)
        ly = self.emb[idx] * mask.unsqueeze(2)         # [B, F, E], zeros where missing
        t = torch.cat([z.unsqueeze(1), ly], dim=1)     # [B, F + 1, E]
        zz = torch.bmm(t, t.transpose(1, 2))
        li = torch.tensor([i for i in range(self.f + 1) for j in range(i)])
        lj = torch.tensor([j for i in range(self.f + 1) for j in range(i)])
        return self.top(torch.cat([z, zz[:, li, lj]], dim=1)).squeeze(1)


def load(data, split):
    sparse = np.load(f"{data}/{split}/sparse.npy")
    dense = torch.from_numpy(np.load(f"{data}/{split}/dense.npy").astype(np.float32))
    return sparse, dense, torch.from_numpy(np.load(f"{data}/{split}/label.npy").astype(np.float32))


def check_init(model, out):
    """torch.nn.Linear's own initial values for every tensor of the model."""
    torch.manual_seed(3)
    m = DLRM(model, torch.zeros(1, arch(model)[1][-1]))
    write_safetensors(out, {k: v.detach() for k, v in m.state_dict().items() if k != "emb"})
    say(f"an --init of {len(m.state_dict()) - 1} tensors, torch.nn.Linear's initial values")


def vocabularies(xs, tables):
    """Each field's ids (a table per field), or every field's (one table),
    sorted: the rows PyTorch's embedding holds, table after table."""
    fields = range(xs.shape[1])
    vocab = [np.unique(xs[:, f][xs[:, f] >= 0]) for f in fields] if tables > 1 else [np.unique(xs[xs >= 0])]
    return vocab


def places(vocab, xs):
    """(index [N, F] into the rows of the vocabularies, one after the other;
    mask [N, F]: 1 where the id is one of its table's)."""
    idx, known, off = np.zeros(xs.shape, dtype=np.int64), np.zeros(xs.shape, dtype=bool), 0
    for f in range(xs.shape[1]):
        v = vocab[f] if len(vocab) > 1 else vocab[0]
        at = np.searchsorted(v, xs[:, f]).clip(0, max(len(v) - 1, 0))
        known[:, f] = (xs[:, f] >= 0) & (v[at] == xs[:, f]) if len(v) else False
        idx[:, f] = at + (off if len(vocab) > 1 else 0)
        off += len(v)
    return torch.from_numpy(idx), torch.from_numpy(known).float()


def check_steps(data, model, init, export, steps, lr, logged_auc, auc_tol="2e-3"):
    """Full-batch SGD steps (the whole training set each step: no order of
    samples matters), rows starting at 0, the dense layers at INIT: the
    exported rows and tensors against PyTorch's after the same steps, and
    workerd's logged test AUC against that of PyTorch's weights. The job's
    rows are in one table for every field ("ids") or in a table per field
    (f0, f1, ...: the same id in two fields is two rows)."""
    steps, lr, logged_auc = int(steps), float(lr), float(logged_auc)
    got, _ = read_safetensors(export)
    xs, xd, y = load(data, "train")
    names = ["ids"] if "ids.ids" in got else [f"f{f}" for f in range(xs.shape[1])]
    vocab = vocabularies(xs, len(names))
    parts = []
    for name, v in zip(names, vocab):
        ids, rows = got[f"{name}.ids"].numpy(), got[f"{name}.rows"].numpy()
        order = np.argsort(ids)
        if not np.array_equal(ids[order], v):
            fail(f"table {name} holds {ids.size} ids, the training set {v.size}")
        parts.append(rows[order])
    rows = np.concatenate(parts)
    start, _ = read_safetensors(init)
    m = DLRM(model, torch.zeros(len(rows), rows.shape[1]))
    m.load_state_dict({**start, "emb": m.emb.detach()})
    idx, mask = places(vocab, xs)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(m(idx, mask, xd), y).backward()
        opt.step()
    d_rows = float(np.abs(rows - m.emb.detach().numpy()).max())
    d_dense = max(float(np.abs(got[k].numpy() - v.detach().numpy()).max()) for k, v in m.state_dict().items()
                  if k != "emb")
    scale = max(float(np.abs(m.emb.detach().numpy()).max()), 1e-30)
    if not (d_rows < 1e-5 and d_dense < 1e-5):
        fail(f"workerd's dlrm after {steps} steps is {d_rows:.3g} (rows, largest {scale:.3g}) and {d_dense:.3g} "
             f"(dense) from PyTorch's")
    say(f"workerd's {model}: {len(rows)} rows of {rows.shape[1]} in {len(names)} table(s) (largest {scale:.3g}) and "
        f"{len(start)} tensors after {steps} full-batch SGD steps within {d_rows:.2g} and {d_dense:.2g} of PyTorch's")
    ts, td, ty = load(data, "test")
    tidx, tmask = places(vocab, ts)  # a test id never trained reads as its initial row, zeros
    with torch.no_grad():
        z = m(tidx, tmask, td)
    check_logged_auc(z.numpy(), ty.numpy(), logged_auc, float(auc_tol))


def main():
    check, args = sys.argv[1], sys.argv[2:]
    {"init": check_init, "steps": check_steps}[check](*args)


if __name__ == "__main__":
    main()
