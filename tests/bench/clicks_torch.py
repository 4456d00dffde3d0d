# SPDX-License-Identifier: Apache-2.0
"""The baseline of tests/bench/clicks.sh: workerd's built-in click models as
plain PyTorch loops in one process, the same batches' size and epochs, BCE
with logits:
  lr    nn.EmbeddingBag(sparse=True) with torch.optim.Adagrad for the weights
        per id, nn.Linear with torch.optim.SGD for the dense part;
  dlrm  the paper's model (facebookresearch/dlrm, dlrm_s_pytorch.py): the
        fields' rows from one nn.EmbeddingBag(sparse=True) (Adagrad), bottom
        and top nn.Sequential MLPs (SGD), dot interactions by torch.bmm.
Prints "torch samples_per_s=... auc=... threads=...".

    clicks_torch.py MODEL DATA BATCH EPOCHS [SEED]    MODEL: lr:D or dlrm:F:BOT:TOP
"""
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def auc(scores, labels):
    """Mann-Whitney U by ranks (ties averaged)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / counts)[inv]
    npos, nneg = y.sum(), (~y).sum()
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def mlp(widths, relu_last):
    layers = []
    for i in range(1, len(widths)):
        layers.append(nn.Linear(widths[i - 1], widths[i]))
        if i + 1 < len(widths) or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class LR(nn.Module):
    def __init__(self, rows, dense):
        super().__init__()
        self.emb = nn.EmbeddingBag(rows + 1, 1, mode="sum", sparse=True, padding_idx=rows)
        self.lin = nn.Linear(dense, 1)
        nn.init.zeros_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)

    def forward(self, idx, dense):
        return self.emb(idx).squeeze(1) + self.lin(dense).squeeze(1)


class DLRM(nn.Module):
    def __init__(self, rows, model):
        super().__init__()
        _, f, bot, top = model.split(":")
        self.f, bot = int(f), [int(w) for w in bot.split("-")]
        self.dim = bot[-1]
        self.emb = nn.EmbeddingBag(rows + 1, self.dim, mode="sum", sparse=True, padding_idx=rows)
        self.bot = mlp(bot, True)
        self.top = mlp([self.dim + self.f * (self.f + 1) // 2] + [int(w) for w in top.split("-")], False)
        # psnet's initialiser of a Linear's weight ("he": N(0, 2 / fan_in)) and bias (zeros).
        for layer in [*self.bot, *self.top]:
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight)
                nn.init.zeros_(layer.bias)
        self.li = torch.tensor([i for i in range(self.f + 1) for j in range(i)])
        self.lj = torch.tensor([j for i in range(self.f + 1) for j in range(i)])

    def forward(self, idx, dense):
        z = self.bot(dense)
        ly = self.emb(idx.reshape(-1, 1)).view(-1, self.f, self.dim)
        t = torch.cat([z.unsqueeze(1), ly], dim=1)
        zz = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([z, zz[:, self.li, self.lj]], dim=1)).squeeze(1)


def main():
    model, data, batch, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    xs = np.load(f"{data}/train/sparse.npy")
    xd = torch.from_numpy(np.load(f"{data}/train/dense.npy").astype(np.float32))
    y = torch.from_numpy(np.load(f"{data}/train/label.npy").astype(np.float32))
    ts = np.load(f"{data}/test/sparse.npy")
    td = torch.from_numpy(np.load(f"{data}/test/dense.npy").astype(np.float32))
    ty = np.load(f"{data}/test/label.npy")
    vocab = np.unique(np.concatenate([xs[xs >= 0], ts[ts >= 0]]))
    # -1 (missing) goes to a row of its own that is never trained: index len(vocab), zeros.
    idx = torch.from_numpy(np.where(xs >= 0, np.searchsorted(vocab, xs), len(vocab)))
    tidx = torch.from_numpy(np.where(ts >= 0, np.searchsorted(vocab, ts), len(vocab)))
    torch.manual_seed(int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    m = LR(len(vocab), xd.shape[1]) if model.startswith("lr:") else DLRM(len(vocab), model)
    nn.init.uniform_(m.emb.weight, -0.01, 0.01)  # a psnet table's default init
    with torch.no_grad():
        m.emb.weight[len(vocab)] = 0
    dense = [p for n, p in m.named_parameters() if not n.startswith("emb.")]
    opt_rows = torch.optim.Adagrad(m.emb.parameters(), lr=0.1)
    opt_dense = torch.optim.SGD(dense, lr=0.02, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()
    n = (len(y) // batch) * batch
    t0 = time.perf_counter()
    for epoch in range(epochs):
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))[:n]
        for b in range(0, n, batch):
            i = perm[b:b + batch]
            opt_rows.zero_grad()
            opt_dense.zero_grad()
            loss = loss_fn(m(idx[i], xd[i]), y[i])
            loss.backward()
            opt_rows.step()
            opt_dense.step()
    secs = time.perf_counter() - t0
    with torch.no_grad():
        z = m(tidx, td).numpy()
    print(f"torch samples_per_s={epochs * n / secs:.0f} auc={auc(z, ty):.4f} threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
