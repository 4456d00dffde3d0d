# SPDX-License-Identifier: Apache-2.0
"""The checks of test-tables.sh that run in Python: a sparse logistic
regression whose per-id weights live in a psnet table (psnet.torch
EmbeddingBag), trained on a synthetic click log against PyTorch's own
nn.EmbeddingBag(sparse=True) with torch.optim.Adagrad and a torch.optim.SGD
dense part, on the same batches in the same order.

    torch-tables.py CHECK [ARGS]   prints "ok" lines and exits 0, or says why and exits 1
"""
import copy
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn

import psnet.torch
from psnet.client import PsnetError
from pychecks import auc, check_logged_auc, fail, say, wait_for

BATCH, LR_ROWS, LR_DENSE = 256, 0.5, 0.05


def load(data, split):
    sparse = np.load(f"{data}/{split}/sparse.npy")
    dense = np.load(f"{data}/{split}/dense.npy").astype(np.float32)
    label = np.load(f"{data}/{split}/label.npy").astype(np.float32)
    return torch.from_numpy(sparse), torch.from_numpy(dense), torch.from_numpy(label)


class LR(nn.Module):
    """Sparse logistic regression: one weight per id (a psnet table), plus a
    linear part over the dense features."""

    def __init__(self, dense):
        super().__init__()
        self.w = psnet.torch.EmbeddingBag("w", 1, mode="sum", optim="adagrad", lr=LR_ROWS, init=0.01)
        self.dense = nn.Linear(dense, 1)

    def forward(self, sparse, dense):
        return self.w(sparse).squeeze(1) + self.dense(dense).squeeze(1)


class RefLR(nn.Module):
    """The same model in PyTorch alone: ids mapped to rows of an
    nn.EmbeddingBag with sparse gradients."""

    def __init__(self, vocab, dense_layer):
        super().__init__()
        self.w = nn.EmbeddingBag(len(vocab), 1, mode="sum", sparse=True)
        self.dense = dense_layer
        self.vocab = vocab

    def forward(self, sparse, dense):
        present = sparse >= 0
        idx = torch.from_numpy(np.searchsorted(self.vocab, sparse[present].numpy()))
        counts = present.sum(1)
        out = self.w(idx, torch.cumsum(counts, 0) - counts)
        return out.squeeze(1) + self.dense(dense).squeeze(1)


def poke(endpoint, case, **env):
    """pspoke's answer ("type=... status=... reason=...") to one hand-made message."""
    e = dict(os.environ, **{f"PSPOKE_{k.upper()}": str(v) for k, v in env.items()})
    r = subprocess.run([os.environ["PSPOKE"], endpoint, case], env=e, capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


def status_of(answer):
    return answer.split("status=")[1].split()[0] if "status=" in answer else answer


def check_pokes(opt, shards):
    """Bad rows messages, as this worker (a member) and as a stranger: each
    refused with its reason by the shard, nothing applied, and the shards
    go on serving."""
    me, clock = opt.w.info()["id"], opt.clock + 2
    before = opt.w.pull_rows("w", np.array([1, 2, 3, 4]))
    nan = sorted(status_of(poke(s, "rows-push", sender=me, clock=clock, count=1, value="nan")) for s in shards)
    if nan != ["moved", "not-finite"]:
        fail(f"a NaN row of id 1 from a member: {nan}")
    say(f"a NaN gradient row is refused by its shard (not-finite), the other says moved: {nan}")
    size = [poke(s, "rows-push", sender=me, clock=clock, rows_bytes=3) for s in shards]
    if not all(status_of(a) == "size" and "rows frame" in a for a in size):
        fail(f"a rows frame of 3 bytes: {size}")
    say(f"a rows frame of 3 bytes is refused by the wire: {size[0]}")
    table = [poke(s, "rows-push", sender=me, clock=clock, table=7) for s in shards]
    if not all(status_of(a) == "unknown-key" for a in table):
        fail(f"table 7: {table}")
    say(f"a push to table 7 of 1 is refused: {table[0]}")
    wide = [poke(s, "rows-push", sender=me, clock=clock, count=1, dim=4) for s in shards]
    if not all(status_of(a) == "size" and "rows of 1 floats" in a for a in wide):
        fail(f"rows of 4 floats for a table of 1: {wide}")
    say(f"rows of 4 floats for a table of 1 are refused: {wide[0]}")
    stranger = [poke(s, "rows-push", sender=999, clock=clock) for s in shards]
    if not all(status_of(a) == "stale" and "not a member" in a for a in stranger):
        fail(f"a stranger's push: {stranger}")
    say(f"a push of rows from a worker id that is no member is refused: {stranger[0]}")
    after = opt.w.pull_rows("w", np.array([1, 2, 3, 4]))
    if not np.array_equal(before, after):
        fail(f"rows changed by refused pushes: {before.ravel()} {after.ravel()}")
    say("nothing of the refused pushes was applied, and both shards still answer")


BSP_STEPS = 20


def check_bsp_worker(coord, data, out):
    """One of two BSP workers: each step trains its half of a batch of
    2 x BATCH; the first and last values of the rows and the dense layer go
    to out (.npz) for bsp-compare."""
    torch.manual_seed(3)
    xs, xd, y = load(data, "train")
    model = LR(xd.shape[1])
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode="bsp", workers=2, progress=False)
    vocab = np.unique(xs[xs >= 0].numpy())
    rows0 = opt.w.pull_rows("w", vocab)
    dense0 = [p.detach().clone().numpy() for p in model.dense.parameters()]
    loss_fn = nn.BCEWithLogitsLoss()
    for i in range(BSP_STEPS):
        b = slice((2 * i + opt.rank) * BATCH, (2 * i + opt.rank + 1) * BATCH)
        opt.zero_grad()
        loss = loss_fn(model(xs[b], xd[b]), y[b])
        loss.backward()
        opt.step(loss=loss)
    rows = opt.w.pull_rows("w", vocab, opt.clock)
    dense = [p.detach().clone().numpy() for p in model.dense.parameters()]
    np.savez(out, vocab=vocab, rows0=rows0, rows=rows, w0=dense0[0], b0=dense0[1], w=dense[0], b=dense[1])
    rank = opt.rank
    opt.finish()
    say(f"worker {rank} trained {BSP_STEPS} BSP steps")


CKPT_STEPS, CKPT_PAUSE = 24, 8


def check_ckpt_worker(coord, data, out, mode, pause_dir=""):
    """One of two workers of a job saved mid-run or restored: it trains
    from the job's clock to CKPT_STEPS, the batch of each step chosen by the
    clock (so a restored run takes the batches the first took); with
    pause_dir, the first waits at clock CKPT_PAUSE (it writes pause_dir/at,
    waits for pause_dir/go) while the test starts a checkpoint. The rows of
    every id and the dense layer at the end go to out (.npz)."""
    xs, xd, y = load(data, "train")
    model = LR(xd.shape[1])
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode=mode, workers=2, progress=False)
    vocab = np.unique(xs[xs >= 0].numpy())
    loss_fn = nn.BCEWithLogitsLoss()
    first = opt.clock
    while opt.clock < CKPT_STEPS:
        if pause_dir and opt.rank == 0 and opt.clock == CKPT_PAUSE:
            open(f"{pause_dir}/at", "w").close()
            if not wait_for(lambda: os.path.exists(f"{pause_dir}/go"), 120):
                fail(f"no {pause_dir}/go within 120 s: the test did not start the checkpoint")
        b = slice((2 * opt.clock + opt.rank) * BATCH, (2 * opt.clock + opt.rank + 1) * BATCH)
        opt.zero_grad()
        loss_fn(model(xs[b], xd[b]), y[b]).backward()
        opt.step()
    rows = opt.w.pull_rows("w", vocab, opt.clock)
    dense = [p.detach().clone().numpy() for p in model.dense.parameters()]
    np.savez(out, rows=rows, w=dense[0], b=dense[1])
    rank = opt.rank
    opt.finish()
    say(f"worker {rank} trained clocks {first} to {CKPT_STEPS} ({mode})")


def check_ckpt_compare(a, b, what):
    """Two runs end with the same rows and dense layer, bit for bit."""
    A, B = np.load(a), np.load(b)
    diff = [k for k in ("rows", "w", "b") if not np.array_equal(A[k], B[k])]
    if diff:
        fail(f"{what}: {', '.join(diff)} differ (rows by up to {float(np.abs(A['rows'] - B['rows']).max()):.3g})")
    say(f"{what}: the same {A['rows'].shape[0]} rows and dense layer at the end, bit for bit")


def check_big(coord):
    """A pull and a push of 600,000 rows of 16 floats (about 19 MiB a shard,
    past psd's 16 MiB --max-msg): sent in parts, each row moved once."""
    from psnet.client import Worker
    w = Worker(coord)
    w.wait_job(60)
    clock = w.info()["start_clock"]
    ids = (np.arange(600_000, dtype=np.int64) * 7919 + 11) * 1_000_003
    before = w.pull_rows("e", ids, clock)
    g = np.random.default_rng(4).standard_normal((ids.size, 16)).astype(np.float32)
    w.push_rows("e", ids, g, clock)
    after = w.pull_rows("e", ids, clock + 1)
    want = before - np.float32(0.5) * g
    if not np.array_equal(after, want):
        fail(f"600,000 rows in parts: {int((after != want).any(axis=1).sum())} rows differ from w - lr g")
    say(f"a push and pulls of {ids.size:,} rows of 16 floats ({ids.size * 64 / 2**20:.0f} MiB, past a shard's "
        "16 MiB frame limit) go in parts: every row moved by -lr g once, exactly")
    w.close()


def check_ssp_worker(coord, data, *shards):
    """One of two SSP workers (staleness 1): both train BSP_STEPS steps; the
    first asks its shard, as itself, for rows far ahead of the slowest
    worker (told to wait) and for rows of clock 0 (answered)."""
    xs, xd, y = load(data, "train")
    model = LR(xd.shape[1])
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode="ssp:1", workers=2, progress=False)
    loss_fn = nn.BCEWithLogitsLoss()
    rank = opt.rank
    for i in range(BSP_STEPS):
        b = slice((2 * i + rank) * BATCH, (2 * i + rank + 1) * BATCH)
        opt.zero_grad()
        loss_fn(model(xs[b], xd[b]), y[b]).backward()
        opt.step()
        if rank == 0 and i == 5:
            me = opt.w.info()["id"]
            ahead = poke(shards[0], "rows-pull", sender=me, clock=opt.clock + 50, count=1)
            now = sorted(status_of(poke(s, "rows-pull", sender=me, clock=0, count=1)) for s in shards)
            if not (status_of(ahead) == "unavailable" and "slowest member" in ahead and now == ["moved", "ok"]):
                fail(f"ssp:1 rows pulls: clock {opt.clock + 50}: {ahead}; clock 0: {now}")
            say(f"ssp:1: a rows pull 50 clocks past the slowest worker waits ({ahead.split('reason=')[-1]}); one of "
                "clock 0 is answered by its shard")
    opt.finish()
    say(f"SSP worker {rank} trained {BSP_STEPS} steps with a table")


def check_bsp_compare(data, a, b):
    """Both workers end with the same values, and with PyTorch's on the
    combined batches from the same first values."""
    A, B = np.load(a), np.load(b)
    if not (np.array_equal(A["rows"], B["rows"]) and np.array_equal(A["w"], B["w"])):
        fail("the two workers pulled different values at the end")
    say("both BSP workers end with the same rows and dense layer")
    xs, xd, y = load(data, "train")
    dense = nn.Linear(xd.shape[1], 1)
    with torch.no_grad():
        dense.weight.copy_(torch.from_numpy(A["w0"]))
        dense.bias.copy_(torch.from_numpy(A["b0"]))
    ref = RefLR(A["vocab"], dense)
    with torch.no_grad():
        ref.w.weight.copy_(torch.from_numpy(A["rows0"]))
    ropt_rows = torch.optim.Adagrad([ref.w.weight], lr=LR_ROWS, eps=1e-10)
    ropt_dense = torch.optim.SGD(ref.dense.parameters(), lr=LR_DENSE)
    loss_fn = nn.BCEWithLogitsLoss()
    for i in range(BSP_STEPS):
        b = slice(2 * i * BATCH, (2 * i + 2) * BATCH)
        ropt_rows.zero_grad()
        ropt_dense.zero_grad()
        loss_fn(ref(xs[b], xd[b]), y[b]).backward()
        ropt_rows.step()
        ropt_dense.step()
    drow = float(np.abs(A["rows"] - ref.w.weight.detach().numpy()).max())
    ddense = max(float(np.abs(A["w"] - ref.dense.weight.detach().numpy()).max()),
                 float(np.abs(A["b"] - ref.dense.bias.detach().numpy()).max()))
    moved = int((np.abs(A["rows"] - A["rows0"]) > 1e-6).sum())
    if not (drow <= 1e-5 and ddense <= 1e-5 and moved > 1000):
        fail(f"BSP: rows differ from torch's on the combined batch by {drow:.3g}, dense by {ddense:.3g} ({moved} "
             "rows moved)")
    say(f"2 BSP workers x {BATCH} end with torch's rows and dense layer on the combined batch of {2 * BATCH} "
        f"(within {drow:.2g} and {ddense:.2g}; {moved} rows trained)")


class Bounded(nn.Module):
    """Tables with bounds: in b an id gets a row at its 2nd push and a shard
    holds at most 300 (the least recently pushed go); in t rows go after 2
    clocks unpushed."""

    def __init__(self, dense):
        super().__init__()
        self.w = psnet.torch.EmbeddingBag("b", 1, optim="sgd", lr=0.5, init=0.01, admit=2, max_rows=300)
        self.t = psnet.torch.EmbeddingBag("t", 1, optim="sgd", lr=0.5, init=0.01, ttl=2)
        self.dense = nn.Linear(dense, 1)

    def forward(self, sparse, dense):
        return (self.w(sparse) + self.t(sparse)).squeeze(1) + self.dense(dense).squeeze(1)


def check_bounds(coord, data):
    """An id pushed once stays at its initial value (not admitted); ids
    pushed more train; the shards' counts are read by test-tables."""
    xs, xd, y = load(data, "train")
    model = Bounded(xd.shape[1])
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode="asp", progress=False)
    steps = 30
    seen = np.unique(xs[: steps * BATCH][xs[: steps * BATCH] >= 0].numpy())
    init = opt.w.pull_rows("b", seen)
    pushes = {}
    loss_fn = nn.BCEWithLogitsLoss()
    for i in range(steps):
        b = slice(i * BATCH, (i + 1) * BATCH)
        for v in np.unique(xs[b][xs[b] >= 0].numpy()):
            pushes[v] = pushes.get(v, 0) + 1
        opt.zero_grad()
        loss_fn(model(xs[b], xd[b]), y[b]).backward()
        opt.step()
    rows = opt.w.pull_rows("b", seen)
    once = np.array([pushes.get(v, 0) == 1 for v in seen])
    moved = np.abs(rows - init).ravel() > 0
    if not (once.sum() > 100 and not moved[once].any() and moved[~once].sum() > 50):
        fail(f"admit=2: {once.sum()} ids pushed once, {moved[once].sum()} of them moved; "
             f"{moved[~once].sum()} of the others moved")
    say(f"admit=2: the {once.sum()} ids pushed once read their initial values, {moved[~once].sum()} of those pushed "
        "more have trained")
    opt.finish()


def check_export(path, pulled):
    """psctl export's table: the ids the shards hold, each with the row a pull gives."""
    from psnet.models import read_safetensors
    t, meta = read_safetensors(path)
    want = np.load(pulled)
    ids, rows = t["w.ids"].numpy(), t["w.rows"].numpy()
    order = np.argsort(ids)
    if not (np.array_equal(ids[order], want["ids"]) and np.array_equal(rows[order], want["rows"])):
        fail(f"the export's {ids.size} rows are not the {want['ids'].size} pulled")
    if not (meta.get("psnet.tables", "").startswith("w:1:adagrad:") and "dense.weight" in t):
        fail(f"the export's metadata or tensors: {sorted(t)} {meta.get('psnet.tables')}")
    say(f"psctl export writes table w's {ids.size} rows (w.ids int64, w.rows float32), each as a pull reads it, "
        "beside the dense tensors, with the tables' text")


class Cached(nn.Module):
    """A table whose rows a worker reads again for 2 clocks before it pulls them anew."""

    def __init__(self, dense):
        super().__init__()
        self.w = psnet.torch.EmbeddingBag("h", 1, optim="sgd", lr=0.5, init=0.01, cache=2)
        # Read only by the check: a cache of 256 rows that never go stale.
        self.k = psnet.torch.EmbeddingBag("k", 4, optim="sgd", init=0.5, cache=1000, cache_rows=256)
        self.dense = nn.Linear(dense, 1)

    def forward(self, sparse, dense):
        return self.w(sparse).squeeze(1) + self.dense(dense).squeeze(1)


def check_cache(coord, data):
    """The same batch 8 steps running with cache=2: its rows fetched at clocks
    0, 3 and 6, read from the cache at the others; what a hit reads is the
    row as fetched, not as the shards have it since."""
    xs, xd, y = load(data, "train")
    model = Cached(xd.shape[1])
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode="asp", progress=False)
    b = slice(0, BATCH)
    ids = np.unique(xs[b][xs[b] >= 0].numpy())
    loss_fn = nn.BCEWithLogitsLoss()
    c0 = opt.clock
    for _ in range(8):
        opt.zero_grad()
        loss_fn(model(xs[b], xd[b]), y[b]).backward()
        opt.step()
    st = opt.w.rows_cache()
    n = ids.size
    if not (st["hits"] == 5 * n and st["misses"] == 3 * n):
        fail(f"8 pulls of {n} rows with cache=2: {st}")
    say(f"cache=2, 8 steps of one batch's {n} rows: fetched 3 times, read from the cache 5 ({st['hit_rate']:.3f})")
    cached = opt.w.pull_rows("h", ids, c0 + 8)  # fetched at clock c0 + 6: a hit
    fresh = opt.w.pull_rows("h", ids, c0 + 100)  # past the staleness: fetched
    if not (np.abs(cached - fresh).max() > 0):
        fail("a hit read the shards' latest rows, not the ones fetched 2 clocks before")
    say("a hit reads the rows as they were fetched (the shards' have moved on since); a pull past the staleness "
        "fetches them anew")
    many = np.arange(1, 701, dtype=np.int64) * 7919
    first = opt.w.pull_rows("k", many)
    before = opt.w.rows_cache()
    again = opt.w.pull_rows("k", many[::-1].copy())[::-1]
    after = opt.w.rows_cache()
    hits = after["hits"] - before["hits"]
    if not (np.array_equal(first, again) and 0 < hits <= 256):
        fail(f"700 rows through a cache of 256, twice: {hits} hits, equal {np.array_equal(first, again)}")
    say(f"700 rows through a cache of 256 rows, twice: {hits} read from it, every row its own id's")
    # mode="mean" (and missing values, -1) against the rows pulled, averaged by hand.
    bag = psnet.torch.EmbeddingBag("k", 4, mode="mean")
    bag._opt = opt  # bound as the Optimizer binds the model's own
    ids2 = torch.tensor([[7919, 15838, -1], [-1, -1, 23757], [7919, 7919 * 4, 7919 * 5]])
    got = bag(ids2).detach().numpy()
    want = np.stack([opt.w.pull_rows("k", np.array([v for v in r if v >= 0])).mean(0) for r in ids2.tolist()])
    if not np.allclose(got, want, atol=1e-7):
        fail(f"mode=mean: {got} against {want}")
    say("EmbeddingBag mode='mean' is the mean of each sample's rows, missing ids (-1) left out")
    # A collection of two bags: their rows in one exchange, each output and
    # each gradient push that of the bag on its own.
    col = psnet.torch.EmbeddingBagCollection([psnet.torch.EmbeddingBag("h", 1), psnet.torch.EmbeddingBag("k", 4)])
    alone = [psnet.torch.EmbeddingBag("h", 1), psnet.torch.EmbeddingBag("k", 4)]
    for bag in list(col.bags) + alone:
        bag._opt = opt
    pair = torch.stack([xs[b][:, 0], torch.where(xs[b][:, 1] >= 0, xs[b][:, 1] % 700 * 7919 + 7919, -1)], dim=1)
    outs, outs_alone = col(pair), [bag(pair[:, f]) for f, bag in enumerate(alone)]
    sum(o.sum() * (f + 1) for f, o in enumerate(outs)).backward()
    sum(o.sum() * (f + 1) for f, o in enumerate(outs_alone)).backward()
    pushes, pushes_alone = [bag._push() for bag in col.bags], [bag._push() for bag in alone]
    same = all(torch.equal(a, c) for a, c in zip(outs, outs_alone)) and all(
        np.array_equal(p[1], q[1]) and np.array_equal(p[2], q[2]) and len(p[1]) > 0
        for p, q in zip(pushes, pushes_alone))
    if not same:
        fail("an EmbeddingBagCollection's outputs or gradients differ from its bags' own")
    try:
        col(pair[:, :1])
        fail("ids of 1 column for 2 bags were taken")
    except ValueError as e:
        why = str(e)
    say(f"an EmbeddingBagCollection pulls both tables at once: each output and gradient is its bag's own, "
        f"bit for bit; one column for two bags is refused ({why})")
    opt.finish()


def check_lr(coord, data, out, *shards):
    torch.manual_seed(3)
    xs, xd, y = load(data, "train")
    ts, td, ty = load(data, "test")
    model = LR(xd.shape[1])
    try:
        psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode="fed", progress=False)
        fail("a model with tables in a federated job was taken")
    except ValueError as e:
        if "'ssp:K'" not in str(e):
            fail(f"fed refused without saying what runs: {e}")
        say(f"a model with a table in a federated job is refused: {e}")
    opt = psnet.torch.Optimizer(model, coord, optim="sgd", lr=LR_DENSE, mode="asp", progress=False)
    dense0 = copy.deepcopy(model.dense)  # the job's first values, pulled into the model
    tables = opt.w.tables()
    if tables != {"w": (0, 1)}:
        fail(f"the job's tables are {tables}")
    say(f"the job declares the model's table: {tables}")

    vocab = np.unique(np.concatenate([xs[xs >= 0].numpy(), ts[ts >= 0].numpy()]))
    init_rows = opt.w.pull_rows("w", vocab)
    if not (np.abs(init_rows).max() <= 0.01 and np.abs(init_rows).max() > 0 and len(np.unique(init_rows)) > 1):
        fail(f"initial rows are not uniform in [-0.01, 0.01): {init_rows[:4].ravel()}")
    ref = RefLR(vocab, dense0)
    with torch.no_grad():
        ref.w.weight.copy_(torch.from_numpy(init_rows))
    ropt_rows = torch.optim.Adagrad([ref.w.weight], lr=LR_ROWS, eps=1e-10)
    ropt_dense = torch.optim.SGD(ref.dense.parameters(), lr=LR_DENSE)
    say(f"{len(vocab)} rows pulled before any push read as their initial values (within init=0.01)")

    loss_fn = nn.BCEWithLogitsLoss()
    steps = (len(y) + BATCH - 1) // BATCH
    for i in range(steps):
        b = slice(i * BATCH, (i + 1) * BATCH)
        opt.zero_grad()
        loss = loss_fn(model(xs[b], xd[b]), y[b])
        loss.backward()
        opt.step(loss=loss)
        ropt_rows.zero_grad()
        ropt_dense.zero_grad()
        rl = loss_fn(ref(xs[b], xd[b]), y[b])
        rl.backward()
        ropt_rows.step()
        ropt_dense.step()
    rows = opt.w.pull_rows("w", vocab)
    drow = float(np.abs(rows - ref.w.weight.detach().numpy()).max())
    ddense = max(float((a.detach() - b.detach()).abs().max())
                 for a, b in zip(model.dense.parameters(), ref.dense.parameters()))
    moved = int((np.abs(rows - init_rows) > 1e-6).sum())
    if not (drow <= 1e-4 and ddense <= 1e-4 and moved > len(vocab) // 10):
        fail(f"after {steps} steps: rows differ from torch's by {drow:.3g}, dense by {ddense:.3g} ({moved} rows moved)")
    say(f"after {steps} steps the {len(vocab)} rows are torch.optim.Adagrad's within {drow:.2g}, the dense layer "
        f"torch.optim.SGD's within {ddense:.2g} ({moved} rows trained)")

    with torch.no_grad():
        model.eval()
        a_psnet = auc(model(ts, td).numpy(), ty.numpy())
        a_ref = auc(ref(ts, td).numpy(), ty.numpy())
    if not (abs(a_psnet - a_ref) <= 0.002 and a_psnet > 0.6):
        fail(f"test AUC {a_psnet:.4f} against torch's {a_ref:.4f}")
    say(f"test AUC {a_psnet:.4f}, PyTorch's {a_ref:.4f} (within 0.002)")

    # The same table pushed twice for one clock: the second is not applied.
    ids = np.unique(xs[xs >= 0].numpy())[:8]  # rows the training pushed: the count of rows stays theirs
    before = opt.w.pull_rows("w", ids)
    g = np.full((8, 1), 0.5, dtype=np.float32)
    opt.w.push_rows("w", ids, g, opt.clock + 1)
    once = opt.w.pull_rows("w", ids)
    opt.w.push_rows("w", ids, g, opt.clock + 1)
    twice = opt.w.pull_rows("w", ids)
    if not (np.all(once < before) and np.array_equal(once, twice)):
        fail(f"a push of clock {opt.clock + 1} again changed the rows: {before.ravel()} {once.ravel()} "
             f"{twice.ravel()}")
    say("a push of a table for a clock it was pushed for is answered, and not applied again")
    try:
        opt.w.push_rows("w", np.array([5, 5]), np.ones((2, 1), np.float32), opt.clock + 2)
        fail("ids twice were taken")
    except ValueError as e:
        say(f"ids twice are refused before they leave: {e}")
    try:
        opt.w.pull_rows("nope", ids)
        fail("an unknown table was taken")
    except ValueError as e:
        say(f"an unknown table is refused, naming the job's: {e}")
    check_pokes(opt, shards)
    train_ids = np.unique(xs[xs >= 0].numpy())  # every id of the training set was pushed
    json.dump({"auc": a_psnet, "auc_torch": a_ref, "rows": int(len(vocab)), "trained": int(train_ids.size),
               "steps": steps}, open(out, "w"))
    np.savez(out + ".npz", ids=train_ids, rows=opt.w.pull_rows("w", train_ids))
    opt.finish()


def check_workerd_lr(data, export, steps, lr, logged_auc):
    """workerd's built-in lr:D, full-batch steps of plain SGD (rows and dense
    alike, zeros to start): the rows and the dense layer psctl exported against
    PyTorch's own steps on the same samples, and the test AUC workerd logged
    against the AUC of PyTorch's weights."""
    from psnet.models import read_safetensors
    steps, lr, logged_auc = int(steps), float(lr), float(logged_auc)
    t, meta = read_safetensors(export)
    ids, rows = t["ids.ids"].numpy(), t["ids.rows"].numpy()[:, 0]
    order = np.argsort(ids)
    ids, rows = ids[order], rows[order]
    xs, xd, y = load(data, "train")
    vocab = np.unique(xs[xs >= 0].numpy())
    if not np.array_equal(ids, vocab):
        fail(f"the table holds {ids.size} ids, the training set {vocab.size}")
    idx = torch.from_numpy(np.searchsorted(vocab, xs.numpy()))
    mask = (xs >= 0).float()
    emb = torch.zeros(len(vocab), requires_grad=True)
    lin = nn.Linear(xd.shape[1], 1)
    nn.init.zeros_(lin.weight)
    nn.init.zeros_(lin.bias)
    opt = torch.optim.SGD([emb, *lin.parameters()], lr=lr)

    def logits(s_idx, s_mask, d):
        return (emb[s_idx] * s_mask).sum(1) + lin(d).squeeze(1)

    for _ in range(steps):
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(logits(idx, mask, xd), y).backward()
        opt.step()
    d_rows = float(np.abs(rows - emb.detach().numpy()).max())
    d_dense = max(float(np.abs(t["0.weight"].numpy() - lin.weight.detach().numpy()).max()),
                  float(np.abs(t["0.bias"].numpy() - lin.bias.detach().numpy()).max()))
    if not (d_rows < 1e-5 and d_dense < 1e-5):
        fail(f"workerd's lr after {steps} steps is {d_rows:.3g} (rows) and {d_dense:.3g} (dense) from PyTorch's")
    say(f"workerd's lr:{xd.shape[1]}: {ids.size} rows and the dense layer after {steps} full-batch SGD steps within "
        f"{max(d_rows, d_dense):.2g} of PyTorch's")
    ts, td, ty = load(data, "test")
    known = np.isin(ts.numpy(), vocab)  # a test id never trained reads as its initial value, 0
    with torch.no_grad():
        z = logits(torch.from_numpy(np.searchsorted(vocab, ts.numpy()).clip(0, len(vocab) - 1)),
                   torch.from_numpy(known).float(), td)
    check_logged_auc(z.numpy(), ty.numpy(), logged_auc)


def main():
    check, args = sys.argv[1], sys.argv[2:]
    try:
        {"lr": check_lr, "bsp-worker": check_bsp_worker, "bsp-compare": check_bsp_compare, "ssp-worker": check_ssp_worker,
         "bounds": check_bounds, "export": check_export, "cache": check_cache, "ckpt-worker": check_ckpt_worker,
         "ckpt-compare": check_ckpt_compare, "big": check_big, "workerd-lr": check_workerd_lr}[check](*args)
    except PsnetError as e:
        fail(f"{check}: {e}")


if __name__ == "__main__":
    main()
