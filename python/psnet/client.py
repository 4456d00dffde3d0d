# SPDX-License-Identifier: Apache-2.0
"""A psnet worker from Python: ctypes bindings over libpsnet's blocking
client (psnet.h, "Blocking"; standard library only).

    from psnet.client import Worker
    w = Worker("ipc:///tmp/psnet/coord.sock")   # registers with pscoord
    w.wait_job()                                # a member of the running job
    params = w.pull(w.info()["start_clock"])    # {name: float32 numpy array}
    params = w.push_pull(grads, clock, clock + 1)   # grads: {name: array}
    w.result(); w.leave(); w.close()

libpsnet keeps the worker's lease on a thread of its own while Python
computes. The library is found through $PSNET_LIB (its path), then inside
the package (pip install), then in the source tree's build/ directory, then
where the system keeps libraries (libpsnet.so.0, installed with psnet). Failures raise PsnetError (an OSError
with the errno and libpsnet's reason)."""
import ctypes
import ctypes.util
import errno as _errno
import json
import os
import time

import numpy as np

EV_REGISTERED, EV_JOB, EV_MEMBERSHIP, EV_STOP, EV_EVALUATE, EV_FAILED = 1, 2, 4, 8, 16, 32
WAIT_FOREVER = 0xFFFFFFFF
JOB_STATES = ("waiting", "running", "done", "stopped", "failed")


class PsnetError(OSError):
    pass


class Stale(PsnetError):
    """The worker had left the membership and was admitted again: nothing of
    the round counted; train on from info()["start_clock"]."""


class _Options(ctypes.Structure):
    _fields_ = [("coord", ctypes.c_char_p), ("connect_timeout_ms", ctypes.c_uint),
                ("round_timeout_ms", ctypes.c_uint), ("keys_dir", ctypes.c_char_p),
                ("key_name", ctypes.c_char_p), ("coord_key_name", ctypes.c_char_p)]


class _Info(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("rank", ctypes.c_uint32), ("workers", ctypes.c_uint32),
                ("state", ctypes.c_int), ("start_clock", ctypes.c_int64), ("base_clock", ctypes.c_int64),
                ("round_clock", ctypes.c_int64), ("has_job", ctypes.c_bool), ("ntensors", ctypes.c_size_t),
                ("batch", ctypes.c_uint32), ("epochs", ctypes.c_uint32), ("train_limit", ctypes.c_uint32),
                ("test_limit", ctypes.c_uint32), ("seed", ctypes.c_uint64), ("dataset", ctypes.c_char * 256),
                ("model_name", ctypes.c_char * 128)]


class _Progress(ctypes.Structure):
    _fields_ = [("clock", ctypes.c_int64), ("epoch", ctypes.c_uint32), ("step", ctypes.c_uint64),
                ("samples", ctypes.c_uint64), ("steps_per_s", ctypes.c_float),
                ("samples_per_s", ctypes.c_float), ("loss", ctypes.c_float), ("progress", ctypes.c_float),
                ("end_clock", ctypes.c_int64)]


class _RowsTable(ctypes.Structure):  # PsnetRowsTable
    _fields_ = [("table", ctypes.c_size_t), ("ids", ctypes.c_void_p), ("n", ctypes.c_size_t),
                ("grads", ctypes.c_void_p), ("out", ctypes.c_void_p)]


class _Eval(ctypes.Structure):
    _fields_ = [("epoch", ctypes.c_uint32), ("accuracy", ctypes.c_float), ("test_loss", ctypes.c_float),
                ("train_loss", ctypes.c_float), ("clock", ctypes.c_int64), ("auc", ctypes.c_float)]


def _find_library():
    if os.environ.get("PSNET_LIB"):
        return os.environ["PSNET_LIB"]
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "libpsnet.so"),  # pip install: inside the package
              os.path.join(here, "..", "..", "build", "worker", "client", "libpsnet.so")):  # the source tree
        if os.path.exists(p):
            return p
    return ctypes.util.find_library("psnet") or "libpsnet.so.0"


_lib = None


def _load():
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(_find_library())
    P, I, U, FP = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "psnet_sync_new": ([ctypes.POINTER(_Options), FP], I),
        "psnet_sync_free": ([P], None),
        "psnet_sync_wait": ([P, U, U], I),
        "psnet_sync_reason": ([P, ctypes.c_char_p, ctypes.c_size_t], None),
        "psnet_sync_info": ([P, ctypes.POINTER(_Info)], I),
        "psnet_sync_tensor": ([P, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                               ctypes.POINTER(ctypes.c_uint64)], I),
        "psnet_sync_model_json": ([P, ctypes.c_char_p, ctypes.c_size_t], I),
        "psnet_sync_schedule": ([P, ctypes.c_int64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64),
                                 ctypes.POINTER(ctypes.c_int64)], I),
        "psnet_sync_round": ([P, FP, ctypes.c_int64, FP, ctypes.c_int64], I),
        "psnet_sync_progress": ([P, ctypes.POINTER(_Progress)], I),
        "psnet_sync_evaluated": ([P, ctypes.POINTER(_Eval)], I),
        "psnet_sync_result": ([P, ctypes.c_bool, ctypes.c_float, ctypes.POINTER(ctypes.c_bool)], I),
        "psnet_sync_leave": ([P], I),
        "psnet_sync_memory": ([P, ctypes.c_size_t, FP, FP], I),
        "psnet_memory_unref": ([P], None),
        "psnet_sync_table": ([P, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                              ctypes.POINTER(ctypes.c_uint32)], I),
        "psnet_sync_rows": ([P, ctypes.c_size_t, P, ctypes.c_size_t, P, ctypes.c_int64, P], I),
        "psnet_sync_rows_many": ([P, ctypes.POINTER(_RowsTable), ctypes.c_size_t, ctypes.c_bool, ctypes.c_int64], I),
        "psnet_sync_rows_cache": ([P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                   ctypes.POINTER(ctypes.c_uint64)], I),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    _lib = lib
    return lib


def _check(r, what):
    if r == -_errno.ESTALE:
        raise Stale(_errno.ESTALE, f"{what}: admitted again at a new clock")
    if r < 0:
        raise PsnetError(-r, f"{what}: {os.strerror(-r)}")
    return r


class _MemoryRef:
    """A reference to libpsnet's shared memory, held by every array over it:
    the memory stays mapped until the last of them is gone, the worker
    closed or not."""

    def __init__(self, ref):
        self._ref = ref

    def __del__(self):
        if _lib is not None and self._ref:
            _lib.psnet_memory_unref(self._ref)
            self._ref = None


class Worker:
    """One worker of a psnet job (libpsnet's PsnetSync)."""

    def __init__(self, coord, keys_dir=None, key_name=None, coord_key_name=None, connect_timeout_ms=0,
                 round_timeout_ms=0):
        lib = _load()
        enc = (lambda s: s.encode() if s is not None else None)
        self._opts = _Options(enc(coord), connect_timeout_ms, round_timeout_ms, enc(keys_dir), enc(key_name),
                              enc(coord_key_name))
        self._s = ctypes.c_void_p()
        _check(lib.psnet_sync_new(ctypes.byref(self._opts), ctypes.byref(self._s)), f"joining {coord}")
        self._names, self._numels, self._bufs, self._shared = None, None, None, None
        self._tabs = None  # the job's tables, as tables() read them once a request named one

    def close(self):
        """Stops libpsnet's thread (without leaving: see leave)."""
        if self._s:
            _lib.psnet_sync_free(self._s)
            self._s = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_s", None):
            self.close()

    # --- events and state
    def reason(self):
        buf = ctypes.create_string_buffer(256)
        _lib.psnet_sync_reason(self._s, buf, len(buf))
        return buf.value.decode(errors="replace")

    def events(self, mask=0xFF, timeout_s=0.0):
        """The events in mask that happened since last collected (EV_* bits),
        waiting at most timeout_s (None: no limit); 0 if none."""
        ms = WAIT_FOREVER if timeout_s is None else int(timeout_s * 1000)
        return _lib.psnet_sync_wait(self._s, mask, ms)

    def wait_job(self, timeout_s=None):
        """Waits until this worker is a member of the running job (in slices
        of a fifth of a second, so that Ctrl-C reaches Python meanwhile)."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        ev = 0
        while not ev:
            left = 0.2 if end is None else min(max(end - time.monotonic(), 0.0), 0.2)
            ev = self.events(EV_JOB | EV_FAILED | EV_STOP, left)
            if end is not None and time.monotonic() >= end:
                break
        if ev & EV_FAILED:
            raise PsnetError(_errno.ECONNREFUSED, f"could not join: {self.reason()}")
        if ev & EV_STOP:
            raise PsnetError(_errno.ECANCELED, f"stopped before the job started: {self.reason()}")
        if not ev & EV_JOB:
            raise PsnetError(_errno.ETIMEDOUT, "no job within the time given")
        self._tabs = None
        self._tensors()

    def info(self):
        i = _Info()
        _check(_lib.psnet_sync_info(self._s, ctypes.byref(i)), "info")
        d = {f: getattr(i, f) for f, _ in _Info._fields_}
        d["state"] = JOB_STATES[i.state] if 0 <= i.state < len(JOB_STATES) else str(i.state)
        d["dataset"] = i.dataset.decode()
        d["model_name"] = i.model_name.decode()
        return d

    def model(self):
        """The job's model description (docs/models.md), as a dict."""
        buf = ctypes.create_string_buffer(1 << 18)
        _check(_lib.psnet_sync_model_json(self._s, buf, len(buf)), "the model's description")
        return json.loads(buf.value)

    def schedule(self, clock, total):
        """(samples the job trained before clock, the clock by which it trained total)."""
        samples, end = ctypes.c_uint64(), ctypes.c_int64()
        _check(_lib.psnet_sync_schedule(self._s, clock, total, ctypes.byref(samples), ctypes.byref(end)),
               "schedule")
        return samples.value, end.value

    def _tensors(self):
        info = self.info()
        names, numels = [], []
        buf, n = ctypes.create_string_buffer(64), ctypes.c_uint64()
        for t in range(info["ntensors"]):
            _check(_lib.psnet_sync_tensor(self._s, t, buf, len(buf), ctypes.byref(n)), f"tensor {t}")
            names.append(buf.value.decode())
            numels.append(n.value)
        self._names, self._numels = names, numels
        shared = self.shared()
        self._bufs = shared[1] if shared else {k: np.zeros(v, dtype=np.float32) for k, v in zip(names, numels)}

    def shared(self):
        """({name: gradient array}, {name: values array}) in memory libpsnet
        shares with the shards on this host, or None (PSNET_SHM=off or copy,
        or no such memory). A round whose grads are these gradient arrays and
        whose params these value arrays runs in place: the shards read and
        write them where they lie, nothing is copied on this side. The arrays
        stay valid after close (the memory goes with the last of them)."""
        if self._shared is not None:
            return self._shared or None
        n = len(self._names)
        ptrs, ref = (ctypes.c_void_p * (2 * n))(), ctypes.c_void_p()
        if _lib.psnet_sync_memory(self._s, 2, ptrs, ctypes.byref(ref)) < 0:
            self._shared = ()
            return None
        holder = _MemoryRef(ref)
        sets = []
        for k in range(2):
            arrays = {}
            for i, (name, numel) in enumerate(zip(self._names, self._numels)):
                raw = (ctypes.c_float * numel).from_address(ptrs[k * n + i])
                raw._psnet_memory = holder  # the array keeps the memory mapped
                arrays[name] = np.ctypeslib.as_array(raw)
            sets.append(arrays)
        self._shared = tuple(sets)
        return self._shared

    def tensors(self):
        """The job's tensors: [(state_dict name, values)], in the job's order."""
        return list(zip(self._names, self._numels))

    # --- rounds
    def _ptrs(self, arrays, what):
        out = (ctypes.c_void_p * len(self._names))()
        for i, (name, numel) in enumerate(zip(self._names, self._numels)):
            a = arrays[name]
            if a.dtype != np.float32 or not a.flags["C_CONTIGUOUS"] or a.size != numel:
                raise ValueError(f"{what} '{name}': a contiguous float32 array of {numel} values")
            out[i] = a.ctypes.data
        return out

    def round(self, grads, push_clock, params, pull_clock):
        """Pushes grads ({name: array}, or None) as this worker's gradient of
        push_clock and pulls every tensor for pull_clock into params ({name:
        float32 array}, written in place). Raises Stale or PsnetError."""
        g = self._ptrs(grads, "gradient") if grads is not None else None
        p = self._ptrs(params, "buffer")
        _check(_lib.psnet_sync_round(self._s, g, push_clock, p, pull_clock), f"round of clock {pull_clock}")
        return params

    def pull(self, clock):
        """Every tensor as of clock: {name: float32 array} (reused by the next pull)."""
        return self.round(None, 0, self._bufs, clock)

    def push_pull(self, grads, push_clock, pull_clock):
        return self.round(grads, push_clock, self._bufs, pull_clock)

    # --- sparse tables (--tables, docs/tables.md)
    def tables(self):
        """The job's sparse tables: {name: (index, floats per row)}."""
        out, buf, dim = {}, ctypes.create_string_buffer(64), ctypes.c_uint32()
        i = 0
        while _lib.psnet_sync_table(self._s, i, buf, len(buf), ctypes.byref(dim)) == 0:
            out[buf.value.decode()] = (i, dim.value)
            i += 1
        return out

    def _table(self, table):
        """(index, dim) of the named table: the job's tables are read once
        (each read asks libpsnet's thread), and again for a name not among
        them."""
        if self._tabs is None or table not in self._tabs:
            self._tabs = self.tables()
        t = self._tabs.get(table) if isinstance(table, str) else None
        if t is None:
            raise ValueError(f"the job has no table {table!r} (it has {sorted(self.tables())})")
        return t

    @staticmethod
    def _ids(ids):
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and np.unique(ids).size != ids.size:
            raise ValueError("row ids must be distinct (numpy.unique them and sum their gradients)")
        return ids

    def pull_rows(self, table, ids, clock=0):
        """The rows of ids (distinct int64) of the named table, as a float32
        array [len(ids), dim]; rows never pushed read as their initial values."""
        index, dim = self._table(table)
        ids = self._ids(ids)
        out = np.empty((ids.size, dim), dtype=np.float32)
        _check(_lib.psnet_sync_rows(self._s, index, ids.ctypes.data, ids.size, None, clock, out.ctypes.data),
               f"pull of {ids.size} rows of table {table}")
        return out

    def pull_rows_many(self, pulls, clock=0):
        """pull_rows of several tables at once, [(table, ids), ...] (each
        table once): every table's requests in flight together, one round
        trip for all; their rows, in the same order."""
        return self._rows_many(pulls, False, clock)

    def _rows_many(self, items, push, clock):
        """psnet_sync_rows_many over items: [(table, ids)] pulled (their rows
        returned), or with push [(table, ids, grads)] pushed."""
        keep, outs, tabs = [], [], (_RowsTable * max(len(items), 1))()
        for k, item in enumerate(items):
            table = item[0]
            index, dim = self._table(table)
            ids = self._ids(item[1])
            keep.append(ids)
            if push:
                g = np.ascontiguousarray(item[2], dtype=np.float32)
                if g.shape != (ids.size, dim):
                    raise ValueError(f"gradients of table {table}: shape {g.shape}, want ({ids.size}, {dim})")
                keep.append(g)
                tabs[k] = _RowsTable(index, ids.ctypes.data, ids.size, g.ctypes.data, None)
            else:
                outs.append(np.empty((ids.size, dim), dtype=np.float32))
                tabs[k] = _RowsTable(index, ids.ctypes.data, ids.size, None, outs[-1].ctypes.data)
        if items:
            what = f"push of the rows of {len(items)} tables for clock {clock}" if push else \
                f"pull of the rows of {len(items)} tables for clock {clock}"
            _check(_lib.psnet_sync_rows_many(self._s, tabs, len(items), push, clock), what)
        return outs

    def push_rows(self, table, ids, grads, clock):
        """One gradient row per id (distinct int64; grads [len(ids), dim]) as
        this worker's for clock: the shards apply them with the table's
        optimizer as they come; a second push of the table for the same
        clock is not applied again. Push every table once each clock (ids
        empty where the step touched none of its rows): a BSP clock closes,
        and a checkpoint's cut comes, once every worker has."""
        index, dim = self._table(table)
        ids = self._ids(ids)
        g = np.ascontiguousarray(grads, dtype=np.float32)
        if g.shape != (ids.size, dim):
            raise ValueError(f"gradients of table {table}: shape {g.shape}, want ({ids.size}, {dim})")
        _check(_lib.psnet_sync_rows(self._s, index, ids.ctypes.data, ids.size, g.ctypes.data, clock, None),
               f"push of {ids.size} rows of table {table} for clock {clock}")

    def push_rows_many(self, pushes, clock):
        """push_rows of several tables at once, [(table, ids, grads), ...]
        (each table once): every table's requests in flight together, one
        round trip for all."""
        self._rows_many(pushes, True, clock)

    def rows_cache(self):
        """The tables' hot-row caches (a table's cache=S): rows pulls read from
        them (hits) and fetched (misses), the hit rate, and the bytes this
        worker pulled in all (rows and tensors)."""
        h, m, b = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        _check(_lib.psnet_sync_rows_cache(self._s, ctypes.byref(h), ctypes.byref(m), ctypes.byref(b)), "rows cache")
        total = h.value + m.value
        return {"hits": h.value, "misses": m.value, "hit_rate": h.value / total if total else 0.0,
                "pulled_bytes": b.value}

    # --- reports
    def progress(self, clock, epoch, step, samples, loss, steps_per_s=0.0, samples_per_s=0.0, progress=0.0,
                 end_clock=0):
        """What psctl status and /metrics show of this worker (sent with its heartbeats): call it
        after each step with that step's loss; a heartbeat carries the mean since the one before
        (the loss by clock of psctl report)."""
        p = _Progress(clock, epoch, step, samples, steps_per_s, samples_per_s, loss, progress, end_clock)
        _check(_lib.psnet_sync_progress(self._s, ctypes.byref(p)), "progress")

    def evaluated(self, epoch, accuracy, test_loss, train_loss, clock, auc=0.0):
        e = _Eval(epoch, accuracy, test_loss, train_loss, clock, auc)
        _check(_lib.psnet_sync_evaluated(self._s, ctypes.byref(e)), "evaluated")

    def result(self, accuracy=None):
        """Training finished (accuracy None) or the final weights' accuracy;
        returns whether pscoord asks this worker to evaluate now."""
        ev = ctypes.c_bool()
        _check(_lib.psnet_sync_result(self._s, accuracy is not None, accuracy or 0.0, ctypes.byref(ev)), "result")
        return ev.value

    def leave(self):
        _check(_lib.psnet_sync_leave(self._s), "leave")
