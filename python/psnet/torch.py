# SPDX-License-Identifier: Apache-2.0
"""Any PyTorch model on psnet: the shards hold its tensors and run the
optimizer; forward and backward stay PyTorch's.

    import psnet, psnet.torch
    with psnet.LocalCluster(shards=2) as cluster:
        opt = psnet.torch.Optimizer(model, coord=cluster, optim="adam", lr=1e-3, mode="bsp")
        for x, y in loader:                # split with opt.sampler(len(dataset))
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step(loss=loss)            # push the gradients, pull the new weights into the model
        opt.finish()

The first Optimizer registers the job from model.state_dict() (names, shapes)
when no job runs; the others join it, and a model whose tensors differ is
refused naming the first that differs. Parameters are trained on the shards
with the job's optimizer (sgd or adam, with the job flags' schedules);
buffers (BatchNorm's running statistics, any state_dict entry that is not a
trained parameter) are kept on the shards as the workers' mean, so that an
export holds them. See docs/python.md."""
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from .client import EV_STOP, PsnetError, Stale, Worker
from .cluster import LocalCluster, psctl, status
from .models import read_safetensors, write_safetensors

__all__ = ["Optimizer", "Sampler", "EmbeddingBag", "EmbeddingBagCollection", "state_dict", "describe", "JobMismatch"]


class JobMismatch(ValueError):
    """The model's tensors are not the running job's."""


def _endpoint(coord):
    return coord.coord if isinstance(coord, LocalCluster) else str(coord)


def _shape(t):
    """The shape psnet keeps for a tensor: 1 to 4 dimensions (a scalar is [1];
    dimensions past the fourth are folded into it)."""
    s = list(t.shape) or [1]
    if len(s) > 4:
        s = s[:3] + [int(np.prod(s[3:]))]
    return s


def _init(t, trained):
    """The initialiser a shard fills the tensor with when the job does not
    start from the model's values: a constant tensor keeps its constant,
    weights of 2 dimensions or more get he, the rest zeros."""
    if t.numel() and bool((t == 0).all()):
        return "zeros"
    if t.numel() and bool((t == 1).all()):
        return "ones"
    return "he" if trained and t.dim() >= 2 else "zeros"


def _entries(model):
    """[(name, tensor, trained)] of model.state_dict(), each storage once
    (tied weights are one tensor, under their first name)."""
    params = {id(p): p.requires_grad for p in model.parameters()}
    out, seen = [], set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        trained = params.get(id(t), False)
        integer = not t.is_floating_point() and not t.is_complex()
        if not (t.is_floating_point() or (not trained and integer)):
            raise TypeError(f"tensor '{name}' is {t.dtype}: psnet trains floating-point parameters "
                            "(integer and bool buffers, such as num_batches_tracked, are kept as floats)")
        out.append((name, t, trained))
    if not any(tr for _, _, tr in out):
        raise ValueError("the model has no parameter that requires a gradient")
    return out


class EmbeddingBag(torch.nn.Module):
    """A bag of rows of a psnet sparse table (docs/tables.md), as
    torch.nn.EmbeddingBag: forward(ids) takes int64 ids [batch, fields] (-1:
    missing; any 64-bit id, no vocabulary to declare) and gives each sample's
    rows summed (mode "sum") or averaged ("mean"), [batch, dim]. The rows live
    on the shards, not in the model: forward pulls the batch's distinct ids,
    and Optimizer.step pushes one gradient row per id, applied there with the
    table's optimizer (adagrad, adam, ftrl or sgd; lr, init and the
    optimizer's figures as --tables names them, e.g. l1=1.0 for ftrl; and the
    table's bounds and cache: max_rows, admit, ttl, cache, cache_rows).

    The Optimizer given the model declares its tables with the job (mode
    "bsp": the workers' rows of a step are averaged, as the dense gradients;
    "asp": each worker's applied as it comes; "ssp:K": as they come, a pull
    waiting while the slowest worker is more than K clocks behind) and binds
    them; a model's dense layers stay torch's, trained as any other."""

    def __init__(self, table, dim, mode="sum", optim="adagrad", lr=0.01, init=0.01, **options):
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode {mode!r}: sum or mean")
        self.table, self.dim, self.mode = str(table), int(dim), mode
        extra = "".join(f":{k.replace('_', '-')}={v}" for k, v in sorted(options.items()))
        self.spec = f"{self.table}:{self.dim}:{optim}:lr={float(lr)!r}:init={float(init)!r}{extra}"
        self._opt = None
        self._pending = None

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.dim}, mode={self.mode!r}"

    def _bound(self):
        """The Optimizer this bag is bound to, running."""
        if self._opt is None or self._opt.w is None:
            raise RuntimeError(f"EmbeddingBag {self.table!r} is not bound to a running job: give its model to a "
                               "psnet.torch.Optimizer (one not finished or closed)")
        return self._opt

    @staticmethod
    def _prepare(ids):
        """A batch's ids [batch] or [batch, k] (-1: missing): its distinct
        ids, where each present id is among them, and each sample's offset."""
        ids = torch.as_tensor(ids, dtype=torch.int64).cpu()
        if ids.dim() == 1:
            ids = ids.unsqueeze(1)
        present = ids >= 0
        uniq, inverse = torch.unique(ids[present], return_inverse=True)
        counts = present.sum(1)
        return uniq, inverse, torch.cumsum(counts, 0) - counts

    def _bag(self, prepared, rows):
        """Each sample's rows summed or averaged, from the rows of its
        distinct ids (kept for step's push while training)."""
        uniq, inverse, offsets = prepared
        weight = torch.from_numpy(rows).requires_grad_(self.training and torch.is_grad_enabled())
        out = torch.nn.functional.embedding_bag(inverse, weight, offsets, mode=self.mode)
        if weight.requires_grad:
            self._pending = (uniq.numpy(), weight)
        return out

    def forward(self, ids):
        opt = self._bound()
        prepared = self._prepare(ids)
        uniq = prepared[0]
        rows = opt.w.pull_rows(self.table, uniq.numpy(), opt.clock) if uniq.numel() else \
            np.zeros((0, self.dim), dtype=np.float32)
        return self._bag(prepared, rows)

    def _push(self):
        """This step's push of its gradient rows, (table, ids, grads); empty
        where the step touched no row (forward did not run, or no gradient
        reached them): under BSP a shard closes a clock, and in any mode
        cuts a checkpoint, once every worker pushed every table."""
        pending, self._pending = self._pending, None
        if pending is None or pending[1].grad is None or not len(pending[0]):
            return self.table, np.zeros(0, dtype=np.int64), np.zeros((0, self.dim), dtype=np.float32)
        return self.table, pending[0], pending[1].grad.numpy()


class EmbeddingBagCollection(torch.nn.Module):
    """Several EmbeddingBags looked up together, as a model with a table per
    categorical field does (TorchRec's EmbeddingBagCollection plays the
    same part): forward(ids) takes one batch of ids per bag, a sequence of
    [batch] or [batch, k] tensors or one [batch, len(bags)] tensor whose
    column f goes to bag f, and gives each bag's [batch, dim] output, in
    order. Every table's rows come in one exchange with the shards rather
    than one a table; each bag's gradients are pushed by Optimizer.step
    as any EmbeddingBag's. The bags are its modules (collection.bags)."""

    def __init__(self, bags):
        super().__init__()
        self.bags = torch.nn.ModuleList(bags)
        if not len(self.bags) or not all(isinstance(b, EmbeddingBag) for b in self.bags):
            raise ValueError("an EmbeddingBagCollection holds one psnet.torch.EmbeddingBag or more")
        if len({b.table for b in self.bags}) != len(self.bags):
            raise ValueError("the bags of an EmbeddingBagCollection use tables of their own")

    def forward(self, ids):
        if torch.is_tensor(ids) and ids.dim() == 2:
            if ids.shape[1] != len(self.bags):
                raise ValueError(f"ids of {ids.shape[1]} column{'' if ids.shape[1] == 1 else 's'} for "
                                 f"{len(self.bags)} bags")
            ids = ids.unbind(1)
        if len(ids) != len(self.bags):
            raise ValueError(f"{len(ids)} batches of ids for {len(self.bags)} bags")
        opts = {id(b._opt) for b in self.bags}
        opt = self.bags[0]._bound()
        if len(opts) != 1:
            raise RuntimeError("the bags of an EmbeddingBagCollection are bound to different Optimizers")
        prepared = [b._prepare(x) for b, x in zip(self.bags, ids)]
        pulls = [(b.table, p[0].numpy()) for b, p in zip(self.bags, prepared) if p[0].numel()]
        got = iter(opt.w.pull_rows_many(pulls, opt.clock))
        return [b._bag(p, next(got) if p[0].numel() else np.zeros((0, b.dim), dtype=np.float32))
                for b, p in zip(self.bags, prepared)]


def _tables(model):
    """The model's EmbeddingBags by table: one module a table (a step pushes
    each table once)."""
    out = {}
    for m in model.modules():
        if isinstance(m, EmbeddingBag):
            if out.setdefault(m.table, m) is not m:
                raise ValueError(f"two EmbeddingBags use table {m.table!r}: give each its own table")
    return out


def describe(model, name=None):
    """The job's model for model: psnet's JSON list of tensors (docs/models.md)."""
    return _describe(model, _entries(model), name)


def _describe(model, entries, name):
    tensors = []
    for n, t, trained in entries:
        e = {"name": n, "shape": _shape(t), "init": _init(t.detach(), trained)}
        if not trained:
            e["buffer"] = True
        tensors.append(e)
    name = name or type(model).__name__
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:127] or "model"
    return {"name": name, "tensors": tensors}


def _first_difference(mine, theirs):
    """None, or what differs first between two model descriptions' tensors."""
    a, b = mine.get("tensors"), theirs.get("tensors")
    if b is None:
        return f"the running job's model is {theirs.get('name')!r}, built from layers, not a list of tensors"
    for i in range(max(len(a), len(b))):
        if i >= len(a):
            return f"the job has a tensor '{b[i]['name']}' {b[i]['shape']} that the model lacks"
        if i >= len(b):
            return f"the model's tensor '{a[i]['name']}' {a[i]['shape']} is not in the job"
        if a[i]["name"] != b[i]["name"]:
            return f"tensor {i} is '{a[i]['name']}' in the model, '{b[i]['name']}' in the job"
        if list(a[i]["shape"]) != list(b[i]["shape"]):
            return f"tensor '{a[i]['name']}' is {a[i]['shape']} in the model, {b[i]['shape']} in the job"
        if bool(a[i].get("buffer")) != bool(b[i].get("buffer")):
            return f"tensor '{a[i]['name']}' is a {'buffer' if a[i].get('buffer') else 'parameter'} in the model, " \
                   f"not in the job"
    return None


class _Progress:
    """A line per step: tqdm's bar where installed, else a plain line on
    stderr at most every 2 seconds."""

    def __init__(self, enabled, rank):
        self.enabled, self.bar, self.last = enabled and rank == 0, None, 0.0
        if self.enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(desc="psnet", unit="step", dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def update(self, step, clock, loss, rate):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}", clock=clock, refresh=False)
            return
        now = time.monotonic()
        if now - self.last >= 2.0:
            self.last = now
            ls = f" loss={loss:.4f}" if loss is not None else ""
            print(f"psnet: step={step} clock={clock}{ls} steps/s={rate:.1f}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Optimizer:
    """model's training on a psnet cluster (see the module's text).

    coord: pscoord's endpoint, or a LocalCluster. optim: "sgd" or "adam", with
    lr, momentum, weight_decay, betas, eps: the shards' optimizer when this
    Optimizer registers the job (adam's betas and eps are the shards' fixed
    0.9, 0.999 and 1e-8) (joining a running job takes its settings).
    mode: "bsp", "asp" or "ssp:K". workers: the job starts once this many
    workers joined (more may join and leave while it runs). lr_scaling:
    "none" (default: lr applies to the mean gradient of all workers' batches,
    as DDP's), "linear", "sqrt" or "auto". lr_schedule: "constant" or
    "cosine" (with total_steps). init: "model" (default) starts the job from
    the model's own values, None from the shards' initialisers, or a
    state_dict; the values travel as a file in init_dir, which pscoord and
    every shard must read (a LocalCluster's own directory by default; without
    one, the shards' initialisers are used and a line says so). chunk_kb:
    the size of the keys tensors are cut into. progress: a line or tqdm bar
    per step on rank 0. keys: CURVE keys directory (psctl keys gen).
    timeout: seconds to wait for pscoord and the job; round_timeout: seconds
    a step waits for the shards before it raises (libpsnet's default: 120)."""

    def __init__(self, model, coord, optim="sgd", lr=0.01, momentum=0.0, weight_decay=0.0, betas=(0.9, 0.999),
                 eps=1e-8, mode="bsp", workers=1, lr_scaling="none", lr_schedule="constant", total_steps=None,
                 init="model", init_dir=None, chunk_kb=None, name=None, progress=True, keys=None,
                 timeout=60.0, round_timeout=None):
        self.model = model
        self.coord = _endpoint(coord)
        self.keys = keys
        self.entries = _entries(model)
        self.desc = _describe(model, self.entries, name)
        self.tables = _tables(model)
        if self.tables and not (mode in ("bsp", "asp") or str(mode).startswith("ssp:")):
            raise ValueError(f"a model with psnet tables ({', '.join(self.tables)}) trains with mode 'bsp', 'asp' "
                             "or 'ssp:K'")
        if init_dir is None and isinstance(coord, LocalCluster):
            init_dir = coord.dir
        self._submit_if_needed(optim, lr, momentum, weight_decay, betas, eps, mode, workers, lr_scaling,
                               lr_schedule, total_steps, init, init_dir, chunk_kb, timeout)
        self.w = Worker(self.coord, keys_dir=keys, connect_timeout_ms=int(timeout * 1000),
                        round_timeout_ms=int(round_timeout * 1000) if round_timeout else 0)
        try:
            self.w.wait_job(timeout)
            diff = _first_difference(self.desc, self.w.model())
            if diff:
                raise JobMismatch(f"the model does not match the job running at {self.coord}: {diff}")
            have = self.w.tables()
            for t, m in self.tables.items():
                if have.get(t, (0, None))[1] != m.dim:
                    raise JobMismatch(f"the job running at {self.coord} has no table {t!r} of {m.dim} floats a row "
                                      f"(its tables: {have or 'none'})")
                m._opt = self
            self._bind()
            self._total_steps = total_steps
            self._start()
        except BaseException:
            self._close_worker(leave=True)
            raise
        self.steps, self.samples, self.t0 = 0, 0, time.monotonic()
        self._progress = _Progress(progress, self.rank)

    # --- the job
    def _submit_if_needed(self, optim, lr, momentum, weight_decay, betas, eps, mode, workers, lr_scaling,
                          lr_schedule, total_steps, init, init_dir, chunk_kb, timeout):
        s = status(self.coord, keys=self.keys, timeout=min(timeout, 10.0))
        job = s.get("job") or {}
        text = json.dumps(self.desc, separators=(",", ":"))
        if job.get("state") == "running":
            return  # joined, then checked against the job's tensors
        if job.get("state") == "waiting" and job.get("model") == text:
            return  # another worker of ours registered it
        args = ["job", "submit", "--model", text, "--mode", mode, "--optim", optim, "--lr", repr(float(lr)),
                "--momentum", repr(float(momentum)), "--weight-decay", repr(float(weight_decay)),
                "--workers", str(int(workers)), "--lr-scaling", lr_scaling, "--lr-schedule", lr_schedule,
                "--shards", str(max(len(s.get("shards") or []), 1))]
        if optim == "adam" and (tuple(betas) != (0.9, 0.999) or eps != 1e-8):
            raise ValueError("adam on the shards runs with betas (0.9, 0.999) and eps 1e-8")
        if lr_schedule != "constant":
            if not total_steps:
                raise ValueError("lr_schedule: give total_steps, the steps of the whole job")
            # The job's length in samples: one "sample" per step, so its progress is steps / total.
            args += ["--epochs", "1", "--batch", "1"]
        if chunk_kb:
            args += ["--chunk-kb", str(int(chunk_kb))]
        if self.tables:
            args += ["--tables", ",".join(m.spec for m in self.tables.values())]
        path = self._init_file(init, init_dir)
        if path:
            args += ["--init", path]
        rc, out, err = psctl(self.coord, *args, keys=self.keys, timeout=min(timeout, 30.0))
        if rc != 0:
            msg = (err or out).strip().replace("psctl: ", "").replace("pscoord refused: ", "")
            if "a job is running" in msg:
                return  # another worker's job started meanwhile: join it, then check
            raise PsnetError(22, f"pscoord at {self.coord} refused the job: {msg}")

    def _init_file(self, init, init_dir):
        if init is None:
            return None
        if init_dir is None:
            print("psnet: the job starts from the shards' initialisers (he, zeros, ones): pass init_dir=, a "
                  "directory pscoord and every shard read, to start from the model's values", file=sys.stderr)
            return None
        sd = self.model.state_dict() if isinstance(init, str) and init == "model" else init
        tensors = {}
        for n, t, _ in self.entries:
            v = sd[n] if n in sd else None
            if v is None:
                raise KeyError(f"init: the state_dict has no tensor '{n}'")
            if tuple(v.shape) != tuple(t.shape):
                raise ValueError(f"init: tensor '{n}' is {list(v.shape)}, the model's is {list(t.shape)}")
            tensors[n] = v.detach().to("cpu", torch.float32).reshape(_shape(t))
        os.makedirs(init_dir, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="init-", suffix=".safetensors", dir=init_dir)
        os.close(fd)
        os.chmod(path, 0o644)
        write_safetensors(path, tensors, {"format": "pt"})
        return os.path.abspath(path)

    # --- the model's tensors and libpsnet's buffers
    def _bind(self):
        """Parameters on the CPU in float32 become views of the buffers a pull
        writes (and their gradients views of the arrays a push reads, in
        memory shared with the shards on this host where it can); anything
        else is copied in and out each step."""
        shared = self.w.shared()
        self.values, self.grads = {}, {}
        self._views, self._copied = [], []
        for n, t, trained in self.entries:
            numel = int(np.prod(_shape(t)))
            self.values[n] = shared[1][n] if shared else np.zeros(numel, dtype=np.float32)
            self.grads[n] = shared[0][n] if shared else np.zeros(numel, dtype=np.float32)
            view = t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
            if view:
                t.data = torch.from_numpy(self.values[n]).view(t.shape)
                self._views.append((n, t, trained))
            else:
                self._copied.append((n, t, trained))
        self._hooks = []
        self._ready = set()
        self._cuda = any(t.device.type == "cuda" for _, t, _ in self.entries)
        if self._cuda:
            self._bind_cuda()

    def _bind_cuda(self):
        """Each gradient goes to page-locked memory as soon as autograd has
        it (a hook on its accumulation), while the rest of the backward pass
        runs, as Horovod and BytePS do; step() waits for the copies."""
        self._pinned = {}
        self._stream = torch.cuda.Stream()
        for n, t, trained in self._copied:
            if not trained or t.device.type != "cuda":
                continue
            self._pinned[n] = torch.empty(t.numel(), dtype=torch.float32, pin_memory=True)
            acc = t.expand_as(t).grad_fn.next_functions[0][0]

            def hook(*_, n=n, t=t):
                if t.grad is None:
                    return
                self._stream.wait_stream(torch.cuda.current_stream(t.device))
                with torch.cuda.stream(self._stream):
                    self._pinned[n].copy_(t.grad.detach().reshape(-1).float(), non_blocking=True)
                self._ready.add(n)
            acc.register_hook(hook)
            self._hooks.append(acc)  # the node must live as long as the hook

    def _start(self):
        """From the clock the job admitted this worker at."""
        self.clock = self.w.info()["start_clock"]
        if self._total_steps:
            # The job's progress for --lr-schedule: a step is a clock, and a
            # clock is world_size samples of the job's batch of 1.
            self.w.schedule(self.clock, int(self._total_steps) * self.world_size)
        self._pull(self.clock)

    def _pull(self, clock):
        self._round(None, 0, clock)
        self._copy_in()

    def _round(self, grads, push_clock, pull_clock):
        """libpsnet's round, on a thread of its own while this one waits for
        it: Ctrl-C (KeyboardInterrupt) reaches Python at once, and the round
        goes on to its end; the next call settles it first, so nothing of it
        is lost or applied twice."""
        self._settle()
        box, done = {}, threading.Event()

        def run():
            try:
                # Ctrl-C is the waiting thread's; libpsnet's call goes on.
                signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
                self.w.round(grads, push_clock, self.values, pull_clock)
            except BaseException as e:  # handed to the caller
                box["error"] = e
            finally:
                done.set()

        t = threading.Thread(target=run, name="psnet-round", daemon=True)
        try:
            t.start()
            self._inflight = t
            done.wait()
        except KeyboardInterrupt:
            if t.ident is not None:  # it runs: settled by the next call
                self._pending = (done, box, grads is not None)
            raise
        finally:
            self._inflight = None
        if "error" in box:
            raise box["error"]

    @property
    def in_flight(self):
        """True after a Ctrl-C (KeyboardInterrupt) left a step's push under
        way: it counts, and the next call takes its outcome. False when the
        interrupt came before the step was sent: that batch did not count."""
        return getattr(self, "_pending", None) is not None and self._pending[2]

    def _settle(self):
        """Waits for a round a Ctrl-C left running, and takes its outcome: a
        step that went through counts (its clock and the pulled weights)."""
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is None:
            return
        done, box, pushed = pending
        done.wait()
        if "error" not in box and pushed:
            self.clock += 1
            self.steps += 1
        self._copy_in()

    def _copy_in(self):
        with torch.no_grad():
            for n, t, _ in self._copied:
                t.copy_(torch.from_numpy(self.values[n]).view(t.shape).to(t.device, t.dtype), non_blocking=False)

    def _gather(self):
        """The push: each parameter's gradient (zeros where it has none) and
        each buffer's value, into self.grads."""
        if self._cuda:
            self._stream.synchronize()
        with torch.no_grad():
            for n, t, trained in self._views + self._copied:
                g = self.grads[n]
                dst = torch.from_numpy(g).view(t.shape)
                if not trained:
                    dst.copy_(t.detach().to("cpu", torch.float32))
                elif n in self._ready:
                    dst.copy_(self._pinned[n].view(t.shape))
                elif t.grad is None:
                    dst.zero_()
                elif t.grad.data_ptr() != g.ctypes.data:
                    dst.copy_(t.grad.detach().to("cpu", torch.float32))
        self._ready.clear()

    # --- what a torch.optim.Optimizer offers
    def zero_grad(self, set_to_none=False):
        """Gradients to zero; on the CPU they are views of the push's arrays,
        which backward then fills in place (set_to_none drops them instead)."""
        for n, t, trained in self._views:
            if not trained:
                continue
            if set_to_none:
                t.grad = None
            else:
                t.grad = torch.from_numpy(self.grads[n]).view(t.shape)
                t.grad.zero_()
        for _, t, trained in self._copied:
            if trained and t.grad is not None:
                if set_to_none:
                    t.grad = None
                else:
                    t.grad.zero_()

    def step(self, closure=None, loss=None, samples=None):
        """Pushes this step's gradients (and buffers) and leaves the next
        clock's weights in the model. closure: as torch.optim's (computes and
        returns the loss); loss: the step's loss, for the progress line and
        psctl report; samples: the batch's size, for the samples/s psctl
        status shows. Raises PsnetError (the cluster did not take the step:
        the reason is in the message; calling step again retries it)."""
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._settle()
        self._gather()
        try:
            # every table's gradients in one exchange
            self.w.push_rows_many([m._push() for m in self.tables.values()], self.clock)
            self._round(self.grads, self.clock, self.clock + 1)
        except Stale:
            # Left the membership (its lease ran out) and admitted again: this
            # step did not count; on from the job's clock.
            self._start()
            return loss
        except PsnetError as e:
            raise PsnetError(e.errno, f"step at clock {self.clock} failed: {e.strerror}; "
                             f"{self._cluster_says()}") from None
        self.clock += 1
        self.steps += 1
        self.samples += int(samples or 0)
        self._copy_in()
        lv = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        dt = max(time.monotonic() - self.t0, 1e-9)
        self.w.progress(self.clock, 1, self.steps, self.samples, lv if lv is not None and math.isfinite(lv) else 0.0,
                        self.steps / dt, self.samples / dt, 0.0, 0)
        self._progress.update(self.steps, self.clock, lv, self.steps / dt)
        return loss

    def _cluster_says(self):
        """What pscoord says of the job and its shards, for an error."""
        try:
            st = status(self.coord, keys=self.keys, timeout=2.0)
        except (PsnetError, OSError, ValueError) as e:
            return f"and pscoord does not answer either ({e})"
        job = st.get("job") or {}
        shards = ", ".join(f"{s['id']} at {s['endpoint']}" for s in st.get("shards") or []) or "none"
        if job.get("state") == "running":
            return (f"the job is running, with shards {shards}: step() again retries the step from the shards' "
                    "state")
        return f"pscoord: the job is {job.get('state')}: {job.get('reason') or 'no reason given'} (shards: {shards})"

    def stopping(self):
        """True when the operator stopped the job (psctl job stop) or this
        worker was drained: leave the training loop and call finish()."""
        return bool(self.w.events(EV_STOP) & EV_STOP)

    # --- membership
    @property
    def rank(self):
        return self.w.info()["rank"]

    @property
    def world_size(self):
        return max(self.w.info()["workers"], 1)

    def sampler(self, n, shuffle=True, seed=0):
        """A torch.utils.data Sampler of this worker's share of n samples."""
        return Sampler(self, n, shuffle, seed)

    # --- the end
    def finish(self, evaluate=None):
        """This worker is done training: tells pscoord, and when it asks this
        worker to evaluate the final weights (the last to finish), pulls them
        into the model and reports evaluate()'s accuracy (a float in 0..1;
        without evaluate the job ends done with no accuracy). Then leaves
        the job."""
        if self.w is None:
            return
        try:
            self._settle()
            if self.w.result():
                # The last to finish: the job ends with evaluate()'s accuracy,
                # or none (NaN) for a model that has no accuracy.
                self._pull(self.clock)
                self.w.result(float(evaluate()) if evaluate is not None else float("nan"))
        finally:
            self._close_worker(leave=True)

    def close(self):
        """Leaves the job without reporting (the others train on)."""
        self._close_worker(leave=True)

    def _close_worker(self, leave):
        try:
            if getattr(self, "w", None) is not None:
                self._settle()
        except BaseException:
            pass
        w, self.w = getattr(self, "w", None), None
        if getattr(self, "_progress", None):
            self._progress.close()
        if w is None:
            return
        try:
            if leave:
                w.leave()
        except PsnetError:
            pass
        finally:
            w.close()
        # The model keeps its values, in memory of its own.
        for n, t, _ in getattr(self, "_views", []):
            t.data = t.data.clone()
            if t.grad is not None:
                t.grad = t.grad.clone()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._close_worker(leave=True)
        except Exception:
            pass


class Sampler(torch.utils.data.Sampler):
    """This worker's share of n samples, as DistributedSampler's: sample i
    goes to rank i mod world_size; shuffled per epoch (set_epoch) with a seed
    all workers share. Rank and size are read at each epoch's start, so a
    worker that joined or left changes the split from the next epoch."""

    def __init__(self, opt, n, shuffle=True, seed=0):
        self.opt, self.n, self.shuffle, self.seed, self.epoch = opt, n, shuffle, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _split(self):
        rank, size = self.opt.rank, self.opt.world_size
        order = np.arange(self.n)
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.n)
        return order[rank % size::size]

    def __iter__(self):
        return iter(self._split().tolist())

    def __len__(self):
        return len(self._split())


def state_dict(coord, model=None, keys=None, timeout=60.0):
    """The job's current values as a state_dict (after the job: its final
    ones). With model: shaped and typed as the model's own, ready for
    model.load_state_dict; without, float32 tensors as the shards keep them."""
    with tempfile.TemporaryDirectory(prefix="psnet-export-") as d:
        path = os.path.join(d, "model.safetensors")
        rc, out, err = psctl(_endpoint(coord), "export", path, keys=keys, timeout=timeout)
        if rc != 0:
            raise PsnetError(5, f"psctl export: {(err or out).strip()}")
        tensors, _ = read_safetensors(path)
    if model is None:
        return tensors
    own = model.state_dict()
    out = {}
    for n, t in own.items():
        if n not in tensors:
            # A tied weight, kept once under its first name.
            same = [m for m, u in own.items() if u.data_ptr() == t.data_ptr() and m in tensors]
            if not same:
                raise JobMismatch(f"the job has no tensor '{n}'")
            n_src = same[0]
        else:
            n_src = n
        out[n] = tensors[n_src].reshape(t.shape).to(t.dtype)
    return out
