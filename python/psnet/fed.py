# SPDX-License-Identifier: Apache-2.0
"""Federated clients in Python: the user's own fit() and evaluate() in a
psnet federated job (--mode fed or fedasync), on libpsnet's edge client.

The contract is Flower's NumPyClient, so a Flower client ports by changing
its import and its start call:

    import psnet.fed

    class FlowerClient(psnet.fed.NumPyClient):
        def fit(self, parameters, config):          # parameters: [numpy arrays]
            set_weights(net, parameters); train(net, trainloader, config["local_epochs"])
            return get_weights(net), len(trainloader.dataset), {"loss": loss}
        def evaluate(self, parameters, config):
            set_weights(net, parameters); loss, accuracy = test(net, testloader)
            return loss, len(testloader.dataset), {"accuracy": accuracy}

    psnet.fed.start_client(coord="tcp://coord:7000", client=FlowerClient(), key="keys/edge.key")
    # or many virtual clients in one process:
    psnet.fed.simulate(client_fn, num_clients=100, coord="ipc:///tmp/psnet/coord.sock")

The parameters are the job's tensors, in its order, float32, shaped as its
model description says (psctl job show; a job of "tensors alone" for a
model the clients define: docs/federated.md). What the job asks of an update
is done by the library, not by fit(): clipping to --dp-clip, --compress with
error feedback, and --secagg's key exchange and masking, exactly as for
workerd --edge; C and Python clients mix in one round. The data never leaves
the process: only the update (the returned parameters minus the ones given)
goes out.

An update fit() returns that cannot be one (not a (parameters, count,
metrics) triple, the wrong number, shape or kind of arrays, NaN or infinity,
a count below 1) is refused for that round: the reason is logged, counted in
the client's stats and told to pscoord, which stops waiting for this client
and counts the round's refusals (psctl round history); the round goes on with
the others. An exception raised by fit() is handled the same way.

A job's aggregation of your own (--strategy custom) is a Strategy with
aggregate_fit, run by start_strategy beside pscoord (docs/federated.md, "A
strategy of your own")."""
import collections
import ctypes
import errno as _errno
import json
import logging
import math
import numbers
import os
import time

import numpy as np

from . import client as _client

log = logging.getLogger("psnet.fed")

EV_REGISTERED, EV_FAILED, EV_JOB, EV_ROUND, EV_PUSHED, EV_END = 1, 2, 3, 4, 5, 6
_WAIT_FOREVER = 0xFFFFFFFF


class NumPyClient:
    """A federated client: subclass it and define fit (and evaluate, for the
    rounds that test the model on the client's data). Flower's
    NumPyClient, method for method."""

    def get_parameters(self, config):
        """Unused by psnet (the shards hold the model from --init or the
        job's initialiser); kept so that Flower clients port as they are."""
        raise NotImplementedError

    def fit(self, parameters, config):
        """Trains on the client's data from parameters (a list of float32
        arrays). Returns (parameters after training, examples trained on,
        metrics dict; a "loss" in it is reported as the round's training
        loss)."""
        raise NotImplementedError

    def evaluate(self, parameters, config):
        """Tests parameters on the client's data. Returns (loss, examples
        tested, metrics dict; an "accuracy" in [0, 1] in it is what pscoord
        records)."""
        raise NotImplementedError

    def num_examples(self):
        """The training examples this client holds, when it knows before
        training: sent with the keys of a --secagg job (which needs it) and
        weighs the client in the strategy. None: fit's count is used."""
        return None


Client = NumPyClient


class _Opts(ctypes.Structure):
    _fields_ = [("coord", ctypes.c_char_p), ("connect_timeout_ms", ctypes.c_uint),
                ("round_timeout_ms", ctypes.c_uint), ("keys_dir", ctypes.c_char_p),
                ("key_name", ctypes.c_char_p), ("coord_key_name", ctypes.c_char_p),
                ("share", ctypes.c_void_p), ("clients", ctypes.c_uint), ("gateway", ctypes.c_char_p),
                ("gateway_key_name", ctypes.c_char_p), ("strategy", ctypes.c_bool)]


class _Round(ctypes.Structure):
    _fields_ = [("number", ctypes.c_uint64), ("round", ctypes.c_uint32), ("evaluate", ctypes.c_bool),
                ("timeout_ms", ctypes.c_uint), ("local", ctypes.c_bool), ("aggregate", ctypes.c_bool),
                ("nupdates", ctypes.c_uint32)]


class _PushInfo(ctypes.Structure):
    _fields_ = [("norm", ctypes.c_double), ("clipped", ctypes.c_bool), ("bytes", ctypes.c_uint64),
                ("bytes_raw", ctypes.c_uint64), ("reason", ctypes.c_char * 160)]


class _Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("client", ctypes.c_uint), ("r", ctypes.c_int), ("round", _Round),
                ("push", _PushInfo), ("reason", ctypes.c_char * 256)]


class _Info(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("has_job", ctypes.c_bool), ("async_", ctypes.c_bool),
                ("ntensors", ctypes.c_size_t), ("batch", ctypes.c_uint32), ("local_epochs", ctypes.c_uint32),
                ("rounds", ctypes.c_uint32), ("lr", ctypes.c_float), ("prox_mu", ctypes.c_float),
                ("seed", ctypes.c_uint64), ("model_name", ctypes.c_char * 128)]


_lib = None


def _load():
    global _lib
    if _lib is not None:
        return _lib
    lib = _client._load()
    P, I, U, FP = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "psnet_edge_sync_new": ([ctypes.POINTER(_Opts), U, FP], I),
        "psnet_edge_sync_free": ([P], None),
        "psnet_edge_sync_next": ([P, ctypes.POINTER(_Event), U], I),
        "psnet_edge_sync_info": ([P, U, ctypes.POINTER(_Info)], I),
        "psnet_edge_sync_tensor": ([P, U, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                    ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                                    ctypes.POINTER(ctypes.c_uint)], I),
        "psnet_edge_sync_model_json": ([P, U, ctypes.c_char_p, ctypes.c_size_t], I),
        "psnet_edge_sync_set_examples": ([P, U, ctypes.c_uint64], I),
        "psnet_edge_sync_pull": ([P, U, ctypes.c_uint64, FP, ctypes.POINTER(ctypes.c_int64)], I),
        "psnet_edge_sync_push": ([P, U, ctypes.c_uint64, FP, ctypes.c_uint64, ctypes.c_float], I),
        "psnet_edge_sync_decline": ([P, U, ctypes.c_uint64, ctypes.c_char_p], I),
        "psnet_edge_sync_report": ([P, U, ctypes.POINTER(_Round), ctypes.c_float, ctypes.c_float, ctypes.c_uint64],
                                   I),
        "psnet_edge_sync_leave": ([P, U], I),
        "psnet_edge_sync_round_update": ([P, U, ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32),
                                          ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_float)], I),
        "psnet_edge_sync_pull_update": ([P, U, ctypes.c_uint64, ctypes.c_uint32, FP], I),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    _lib = lib
    return lib


def _check(r, what):
    if r < 0:
        raise _client.PsnetError(-r, f"{what}: {os.strerror(-r)}")
    return r


def _key_args(key, keys_dir, coord_key):
    """key: the client's key file (DIR/NAME.key, from psctl keys gen), or a
    name in keys_dir. pscoord's public key is looked up in the same folder."""
    if key and (os.sep in key or key.endswith(".key")):
        d, f = os.path.split(key)
        keys_dir = keys_dir or d or "."
        key = f[:-4] if f.endswith(".key") else f
    return keys_dir, key, coord_key


class Fleet:
    """n federated clients of one process on libpsnet's thread (PsnetEdgeSync):
    one for a device, many for a simulation. Low level: start_client and
    simulate drive one."""

    def __init__(self, coord, n=1, key=None, keys_dir=None, coord_key=None, connect_timeout_s=10.0,
                 round_timeout_s=120.0, gateway=None, gateway_key=None, strategy=False):
        lib = _load()
        coord = getattr(coord, "coord", coord)  # a LocalCluster
        if coord is None and gateway is None:
            raise TypeError("give coord= (pscoord) or gateway= (psgate, the edge clients' front door)")
        keys_dir, key, coord_key = _key_args(key, keys_dir, coord_key)
        enc = (lambda s: s.encode() if s is not None else None)
        self._opts = _Opts(enc(coord), int(connect_timeout_s * 1000), int(round_timeout_s * 1000), enc(keys_dir),
                           enc(key), enc(coord_key), None, n, enc(gateway), enc(gateway_key), bool(strategy))
        self._s = ctypes.c_void_p()
        _check(lib.psnet_edge_sync_new(ctypes.byref(self._opts), n, ctypes.byref(self._s)),
               f"joining {gateway or coord}")
        self.n = n
        self._tensors = None
        self._pulled = {}

    def close(self):
        if self._s:
            _lib.psnet_edge_sync_free(self._s)
            self._s = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_s", None):
            self.close()

    def next(self, timeout_s=None):
        """The next event as a dict (kind, client, r, number, round, evaluate,
        timeout_ms, reason, push info), or None after timeout_s."""
        ev = _Event()
        ms = _WAIT_FOREVER if timeout_s is None else max(int(timeout_s * 1000), 0)
        if not _lib.psnet_edge_sync_next(self._s, ctypes.byref(ev), ms):
            return None
        rd = ev.round
        return {"kind": ev.kind, "client": ev.client, "r": ev.r, "number": rd.number, "round": rd.round,
                "evaluate": rd.evaluate, "timeout_ms": rd.timeout_ms, "local": rd.local,
                "aggregate": rd.aggregate, "nupdates": rd.nupdates,
                "reason": (ev.push.reason if ev.kind == EV_PUSHED else ev.reason).decode(errors="replace"),
                "norm": ev.push.norm, "clipped": ev.push.clipped, "bytes": ev.push.bytes,
                "bytes_raw": ev.push.bytes_raw}

    def info(self, i=0):
        x = _Info()
        _check(_lib.psnet_edge_sync_info(self._s, i, ctypes.byref(x)), "info")
        return {"id": x.id, "has_job": x.has_job, "async": x.async_, "ntensors": x.ntensors, "batch": x.batch,
                "local_epochs": x.local_epochs, "rounds": x.rounds, "lr": x.lr, "prox_mu": x.prox_mu,
                "seed": x.seed, "model_name": x.model_name.decode()}

    def tensors(self, i=0):
        """[(name, shape)] of the job's tensors, in its order."""
        if self._tensors is None:
            out = []
            name, numel = ctypes.create_string_buffer(128), ctypes.c_uint64()
            dims, ndim = (ctypes.c_uint32 * 4)(), ctypes.c_uint()
            for t in range(self.info(i)["ntensors"]):
                _check(_lib.psnet_edge_sync_tensor(self._s, i, t, name, len(name), ctypes.byref(numel), dims,
                                                   ctypes.byref(ndim)), f"tensor {t}")
                shape = tuple(dims[k] for k in range(ndim.value))
                if int(np.prod(shape, dtype=np.int64)) != numel.value:
                    shape = (numel.value,)
                out.append((name.value.decode(), shape))
            self._tensors = out
        return self._tensors

    def model(self, i=0):
        buf = ctypes.create_string_buffer(1 << 18)
        _check(_lib.psnet_edge_sync_model_json(self._s, i, buf, len(buf)), "the model's description")
        return json.loads(buf.value)

    def set_examples(self, i, n):
        _check(_lib.psnet_edge_sync_set_examples(self._s, i, int(n)), "examples")

    def pull(self, i, number):
        """The model of round number (0: as it is now) as a list of arrays,
        and the aggregated rounds in it. The arrays are kept until client
        i's next pull (a final report digests them)."""
        arrays = [np.empty(shape, dtype=np.float32) for _, shape in self.tensors(i)]
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        rounds = ctypes.c_int64()
        _check(_lib.psnet_edge_sync_pull(self._s, i, number, ptrs, ctypes.byref(rounds)),
               f"pulling round {number}")
        self._pulled[i] = arrays
        return arrays, rounds.value

    def push(self, i, number, update, examples, loss):
        """Starts pushing update (arrays, as the pull's): its end is an EV_PUSHED event."""
        ptrs = (ctypes.c_void_p * len(update))(*[a.ctypes.data for a in update])
        _check(_lib.psnet_edge_sync_push(self._s, i, number, ptrs, int(examples), float(loss)),
               f"pushing round {number}")

    def decline(self, i, number, reason):
        _check(_lib.psnet_edge_sync_decline(self._s, i, number, reason.encode()[:255]), f"declining round {number}")

    def report(self, i, ev, accuracy, loss, examples=0):
        rd = _Round(ev["number"], ev["round"], ev["evaluate"], ev["timeout_ms"], ev["local"])
        _check(_lib.psnet_edge_sync_report(self._s, i, ctypes.byref(rd), float(accuracy), float(loss), int(examples)),
               "report")

    def leave(self, i):
        _check(_lib.psnet_edge_sync_leave(self._s, i), "leave")

    def round_update(self, i, number, k):
        """A strategy: update k of round number: (client id, examples, loss)."""
        cid, ex, loss = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_float()
        _check(_lib.psnet_edge_sync_round_update(self._s, i, number, k, ctypes.byref(cid), ctypes.byref(ex),
                                                 ctypes.byref(loss)), f"update {k} of round {number}")
        return cid.value, ex.value, loss.value

    def pull_update(self, i, number, cid):
        """A strategy: client cid's update of round number, as arrays."""
        arrays = [np.empty(shape, dtype=np.float32) for _, shape in self.tensors(i)]
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        _check(_lib.psnet_edge_sync_pull_update(self._s, i, number, cid, ptrs),
               f"pulling client {cid}'s update of round {number}")
        return arrays


class Refused(ValueError):
    """What fit returned cannot be an update (the reason is the message)."""


def _deltas(who, params, shapes, base):
    """who's arrays (a model) minus base, tensor by tensor, as float32; raises
    Refused for the wrong count, kind or shape, NaN or infinity, or overflow."""
    if len(params) != len(shapes):
        raise Refused(f"{who} returned {len(params)} arrays; the job's model has {len(shapes)} tensors")
    out = []
    for k, (a, (name, shape), w0) in enumerate(zip(params, shapes, base)):
        a = np.asarray(a)
        if a.dtype.kind != "f":
            raise Refused(f"tensor {k} ({name}) is {a.dtype}, not floating point")
        if tuple(a.shape) != tuple(shape):
            raise Refused(f"tensor {k} ({name}) has shape {list(a.shape)}; the job's is {list(shape)}")
        if not np.all(np.isfinite(a)):
            raise Refused(f"tensor {k} ({name}) holds NaN or infinity")
        with np.errstate(over="ignore", invalid="ignore"):
            d = np.ascontiguousarray(a, dtype=np.float32) - w0
        if not np.all(np.isfinite(d)):
            raise Refused(f"tensor {k} ({name})'s update overflows float32")
        out.append(np.ascontiguousarray(d, dtype=np.float32))
    return out


def _as_update(res, shapes, pulled):
    """fit's (parameters, examples, metrics) → (update arrays, examples, loss); raises Refused."""
    if not isinstance(res, (tuple, list)) or len(res) != 3:
        raise Refused(f"fit returned {type(res).__name__}, not (parameters, num_examples, metrics)")
    params, n, metrics = res
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise Refused(f"fit's num_examples is {n!r}: a count of at least 1")
    if metrics is not None and not isinstance(metrics, dict):
        raise Refused(f"fit's metrics are a {type(metrics).__name__}, not a dict")
    update = _deltas("fit", list(params), shapes, pulled)
    loss = (metrics or {}).get("loss", 0.0)
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        loss = 0.0
    return update, int(n), loss if math.isfinite(loss) else 0.0


class Stats(dict):
    """What a run of clients did: rounds (asked to train), counted, late,
    refused (fit's or a federated evaluation's result refused here), failed
    (pulls or pushes that failed), evaluations (of the model pscoord tests:
    --eval-every, the final one), tests (federated evaluations on the
    clients' own data, --fraction-evaluate), pushed bytes as sent and as
    f32, ids: each client's id at pscoord (psctl and its log name
    clients by it), fit_s: the wall seconds spent in the user's fit(),
    fit_cpu_s: the process's CPU seconds meanwhile (all its threads: fit's,
    and psnet's own network threads serving other clients at the time), and
    cpu_s: the process's CPU seconds over the run (cpu_s - fit_cpu_s: what
    the rest of the run cost, psnet.fed's share of it at least)."""


def _config(info, ev):
    return {"round": ev["round"], "number": ev["number"], "local_epochs": info["local_epochs"],
            "batch_size": info["batch"], "lr": info["lr"], "proximal_mu": info["prox_mu"],
            "seed": info["seed"], "timeout_s": ev["timeout_ms"] / 1000.0}


def _run(fleet, client_of, fail_fast, timeout_s=None):
    """Serves fleet's clients until every one of them saw the job end (or
    failed): their rounds call client_of(i)'s fit and evaluate."""
    st = Stats(rounds=0, counted=0, late=0, refused=0, failed=0, evaluations=0, tests=0, bytes=0, bytes_raw=0,
               accuracy=None, state=None, fit_s=0.0, fit_cpu_s=0.0, cpu_s=0.0, ids={})
    ended, info, examples_said = set(), None, set()
    cpu0 = time.process_time()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while len(ended) < fleet.n:
        if deadline is not None and time.monotonic() > deadline:
            raise _client.PsnetError(_errno.ETIMEDOUT, "the job did not end within the time given")
        ev = fleet.next(0.2)  # slices: Ctrl-C reaches Python meanwhile
        if ev is None:
            continue
        i, kind = ev["client"], ev["kind"]
        if kind == EV_FAILED:
            msg = f"client {i} could not join: {ev['reason']} ({os.strerror(-ev['r'])})"
            if fail_fast:
                raise _client.PsnetError(-ev["r"], msg)
            log.error("%s", msg)
            ended.add(i)
        elif kind == EV_JOB:
            st["ids"][i] = fleet.info(i)["id"]
            if info is None:
                info = fleet.info(i)
                log.info("federated job: model %s, %d tensors, %d rounds", info["model_name"], info["ntensors"],
                         info["rounds"])
            n = getattr(client_of(i), "num_examples", lambda: None)()
            if n:
                fleet.set_examples(i, n)
                examples_said.add(i)
        elif kind == EV_ROUND and ev["evaluate"]:
            _evaluate(fleet, i, client_of(i), info, ev, st)
        elif kind == EV_ROUND:
            _fit(fleet, i, client_of(i), info, ev, st, examples_said)
        elif kind == EV_PUSHED:
            st["bytes"] += ev["bytes"]
            st["bytes_raw"] += ev["bytes_raw"]
            if ev["r"] == 0:
                st["counted"] += 1
            elif ev["r"] == -_errno.ESTALE:
                st["late"] += 1
                log.warning("client %d: update of round %d not counted: %s", i, ev["number"], ev["reason"] or "late")
            elif ev["r"] != -_errno.ECANCELED:
                st["failed"] += 1
                log.warning("client %d: update of round %d failed: %s %s", i, ev["number"],
                            os.strerror(-ev["r"]), ev["reason"])
        elif kind == EV_END:
            st["state"] = _client.JOB_STATES[ev["r"]] if 0 <= ev["r"] < len(_client.JOB_STATES) else str(ev["r"])
            ended.add(i)
            try:
                fleet.leave(i)
            except _client.PsnetError as e:
                log.debug("client %d: leaving: %s", i, e)
    st["cpu_s"] = time.process_time() - cpu0
    return st


def _refuse(fleet, i, ev, st, exc, fn, what):
    """What the user's fn (fit or evaluate) raised or returned refuses this
    request: counted, logged and declined to pscoord with the reason."""
    reason = str(exc) if isinstance(exc, Refused) else f"{fn} raised {type(exc).__name__}: {exc}"
    st["refused"] += 1
    log.warning("client %d: %s: %s", i, what, reason)
    try:
        fleet.decline(i, ev["number"], reason)
    except _client.PsnetError as e:
        log.debug("client %d: declining: %s", i, e)


def _fit(fleet, i, client, info, ev, st, examples_said):
    st["rounds"] += 1
    try:
        pulled, _ = fleet.pull(i, ev["number"])
    except _client.PsnetError as e:
        st["failed"] += 1
        log.warning("client %d: %s", i, e)
        return
    try:
        params = [a.copy() for a in pulled]
        t0, c0 = time.monotonic(), time.process_time()
        try:
            res = client.fit(params, _config(info, ev))
        finally:
            st["fit_s"] += time.monotonic() - t0
            st["fit_cpu_s"] += time.process_time() - c0
        update, n, loss = _as_update(res, [s for s in fleet.tensors(i)], pulled)
    except Exception as e:  # the user's code: whatever it raised refuses this round, not the process
        _refuse(fleet, i, ev, st, e, "fit", f"round {ev['number']} refused")
        return
    if i not in examples_said:
        fleet.set_examples(i, n)
    try:
        fleet.push(i, ev["number"], update, n, loss)
    except _client.PsnetError as e:
        if e.errno != _errno.ESTALE:
            st["failed"] += 1
        log.warning("client %d: %s", i, e)


def _as_test(res):
    """evaluate's (loss, examples, metrics) → (accuracy, loss, examples); raises Refused."""
    if not isinstance(res, (tuple, list)) or len(res) != 3:
        raise Refused(f"evaluate returned {type(res).__name__}, not (loss, num_examples, metrics)")
    loss, n, metrics = res
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise Refused(f"evaluate's num_examples is {n!r}: a count of at least 1")
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        raise Refused(f"evaluate's loss is {loss!r}, not a number") from None
    if not (math.isfinite(loss) and loss >= 0):
        raise Refused(f"evaluate's loss is {loss}: a finite number >= 0")
    if metrics is not None and not isinstance(metrics, dict):
        raise Refused(f"evaluate's metrics are a {type(metrics).__name__}, not a dict")
    try:
        acc = float((metrics or {}).get("accuracy", float("nan")))
    except (TypeError, ValueError):
        acc = float("nan")
    return acc, loss, int(n)


def _evaluate(fleet, i, client, info, ev, st):
    try:
        params, rounds = fleet.pull(i, 0)
    except _client.PsnetError as e:
        log.warning("client %d: pulling the model to test: %s", i, e)
        return
    if ev["local"]:
        _test_local(fleet, i, client, info, ev, st, params, rounds)
        return
    try:
        res = client.evaluate([a.copy() for a in params], dict(_config(info, ev), rounds=rounds))
        loss, n, metrics = res
        acc = float((metrics or {}).get("accuracy", float("nan")))
    except Exception as e:
        log.error("client %d: evaluate raised %s: %s", i, type(e).__name__, e)
        acc, loss = float("nan"), float("nan")
    if not (0.0 <= acc <= 1.0) and not (math.isnan(acc) and ev["round"] == 0):
        log.warning("client %d: evaluate gave no accuracy in [0, 1] (%r): not reported", i, acc)
        return
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        loss = float("nan")
    st["evaluations"] += 1
    if ev["round"] == 0:
        st["accuracy"] = acc
    log.info("client %d: tested the model of %d rounds: accuracy %.4f loss %.4f", i, rounds, acc, loss)
    try:
        fleet.report(i, ev, acc, loss)
    except _client.PsnetError as e:
        log.warning("client %d: %s", i, e)


def submit(coord, model, keys=None, mode="fed", timeout_s=30.0, **options):
    """Submits a federated job to pscoord at coord (an endpoint or a
    LocalCluster): model is a torch.nn.Module (its tensors, as
    psnet.torch.describe lists them: the clients define the model), a dict
    of psnet's model JSON, or a spec such as "mlp:784-64-10"; options are
    psctl job submit's, spelled in Python (rounds=5, fraction=0.5,
    min_clients=2, local_epochs=1, lr=0.01, strategy="fedavg", dp_clip=1.0,
    secagg=True, ...). Raises PsnetError with pscoord's reason if refused."""
    from .cluster import psctl
    if hasattr(model, "state_dict"):
        from .torch import describe
        model = describe(model)
    text = model if isinstance(model, str) else json.dumps(model, separators=(",", ":"))
    args = ["job", "submit", "--model", text, "--mode", mode]
    for k, v in options.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        elif v is not False and v is not None:
            args += [flag, str(v)]
    rc, out, err = psctl(coord, *args, keys=keys, timeout=timeout_s)
    if rc != 0:
        msg = (err or out).strip().replace("psctl: ", "")
        raise _client.PsnetError(_errno.EINVAL, f"pscoord at {coord} refused the job: {msg}")
    return out.strip()


def _test_local(fleet, i, client, info, ev, st, params, rounds):
    """A federated evaluation: the client's own data, its examples weighing it."""
    try:
        acc, loss, n = _as_test(client.evaluate([a.copy() for a in params], dict(_config(info, ev), rounds=rounds)))
        if not 0.0 <= acc <= 1.0:
            raise Refused(f"evaluate's metrics carry no accuracy in [0, 1] ({acc!r})")
    except Exception as e:  # the user's code: its failure declines this test, nothing more
        _refuse(fleet, i, ev, st, e, "evaluate", f"test of round {ev['round']} declined")
        return
    st["tests"] += 1
    try:
        fleet.report(i, ev, acc, loss, n)
    except _client.PsnetError as e:
        log.warning("client %d: %s", i, e)


def start_client(coord=None, client=None, key=None, keys_dir=None, coord_key=None, connect_timeout_s=10.0,
                 round_timeout_s=120.0, timeout_s=None, gateway=None, gateway_key=None):
    """Runs client (a NumPyClient) as one federated client of the job at
    coord until the job ends; returns its Stats (state: the job's end).
    key: its key file from psctl keys gen (DIR/NAME.key, pscoord's public
    key beside it) for a cluster with --keys. gateway: psgate's endpoint
    instead of coord, the client's one connection (psgate's public key
    beside the key, named gateway_key or psgate). Raises PsnetError when it
    cannot join."""
    if client is None:
        raise TypeError("start_client needs client= (a NumPyClient)")
    with Fleet(coord, 1, key=key, keys_dir=keys_dir, coord_key=coord_key, connect_timeout_s=connect_timeout_s,
               round_timeout_s=round_timeout_s, gateway=gateway, gateway_key=gateway_key) as fleet:
        return _run(fleet, lambda i: client, True, timeout_s)


def simulate(client_fn, num_clients, coord=None, key=None, keys_dir=None, coord_key=None, connect_timeout_s=10.0,
             round_timeout_s=120.0, timeout_s=None, gateway=None, gateway_key=None):
    """Runs num_clients virtual clients in this process (one ZeroMQ context,
    one key) until the job ends: each sampled client i is client_fn(str(i))
    (Flower's client_fn(cid); made for each round it is asked for, so that
    thousands of them hold no memory between rounds), its fit run in turn.
    Returns the Stats of all of them. gateway: through psgate, as
    start_client."""
    with Fleet(coord, num_clients, key=key, keys_dir=keys_dir, coord_key=coord_key,
               connect_timeout_s=connect_timeout_s, round_timeout_s=round_timeout_s, gateway=gateway,
               gateway_key=gateway_key) as fleet:
        return _run(fleet, lambda i: client_fn(str(i)), False, timeout_s)


FitResult = collections.namedtuple("FitResult", "cid parameters num_examples metrics")
FitResult.__doc__ = """One client's result in a round, as a strategy sees it: cid (its id at
pscoord, a str), parameters (the model it trained to: the round's model
plus its update, float32 arrays), num_examples, metrics ({"loss": its mean
training loss})."""


class Strategy:
    """A federated job's own aggregation (psctl job submit --strategy
    custom), for research users: subclass it and define aggregate_fit,
    then run it with start_strategy beside pscoord. Flower's
    Strategy.aggregate_fit, with the round's model given."""

    def aggregate_fit(self, server_round, results, parameters):
        """Aggregates one round: results, a list of FitResult (the clients
        whose updates count, ascending cid); parameters, the model before
        the round. Returns the model after it (a list of arrays shaped as
        parameters), or (that, metrics). Raising, or returning what cannot
        be a model (the wrong number, shape or kind of arrays, NaN or
        infinity), drops the round: it runs again with a fresh sample."""
        raise NotImplementedError


def _as_model(res, shapes, before):
    """aggregate_fit's result → the round's delta (new minus before); raises Refused."""
    if isinstance(res, tuple) and len(res) == 2 and not isinstance(res[0], np.ndarray):
        res = res[0]
    try:
        params = list(res)
    except TypeError:
        raise Refused(f"aggregate_fit returned {type(res).__name__}, not a list of arrays") from None
    return _deltas("aggregate_fit", params, shapes, before)


def _aggregate(fleet, strategy, ev, st):
    number = ev["number"]
    st["rounds"] += 1
    try:
        before, _ = fleet.pull(0, number)
        results, examples, loss = [], 0, 0.0
        for k in range(ev["nupdates"]):
            cid, n, l = fleet.round_update(0, number, k)
            upd = fleet.pull_update(0, number, cid)
            results.append(FitResult(str(cid), [w + u for w, u in zip(before, upd)], n, {"loss": l}))
            examples += n
            loss += l * n
    except _client.PsnetError as e:
        st["failed"] += 1
        log.warning("strategy: round %d: %s", number, e)
        reason = f"the strategy could not read the round's updates: {e}"
        try:
            fleet.decline(0, number, reason)
        except _client.PsnetError as e2:
            log.debug("strategy: declining: %s", e2)
        return
    try:
        res = strategy.aggregate_fit(ev["round"], results, [a.copy() for a in before])
        delta = _as_model(res, fleet.tensors(0), before)
    except Exception as e:  # the user's code: its failure drops this round, not the process
        _refuse(fleet, 0, ev, st, e, "aggregate_fit", f"round {number} not aggregated")
        return
    fleet.push(0, number, delta, max(examples, 1), loss / examples if examples else 0.0)


def start_strategy(coord=None, strategy=None, key=None, keys_dir=None, coord_key=None, connect_timeout_s=10.0,
                   round_timeout_s=120.0, timeout_s=None):
    """Runs strategy (a Strategy) as the aggregation of the --strategy
    custom job at coord until the job ends; returns its Stats (rounds asked,
    counted: rounds whose delta pscoord took, refused: aggregate_fit's
    failures, failed). It reads every client's update of a round from the
    shards, so it runs in the cluster, with a key of role strategy (psctl
    keys gen NAME --role strategy; key=DIR/NAME.key) where the cluster has
    --keys. One strategy process serves a job; a second is refused while
    the first is connected. Raises PsnetError when it cannot join."""
    if strategy is None:
        raise TypeError("start_strategy needs strategy= (a psnet.fed.Strategy)")
    st = Stats(rounds=0, counted=0, late=0, refused=0, failed=0, state=None)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with Fleet(coord, 1, key=key, keys_dir=keys_dir, coord_key=coord_key, connect_timeout_s=connect_timeout_s,
               round_timeout_s=round_timeout_s, strategy=True) as fleet:
        while st["state"] is None:
            if deadline is not None and time.monotonic() > deadline:
                raise _client.PsnetError(_errno.ETIMEDOUT, "the job did not end within the time given")
            ev = fleet.next(0.2)
            if ev is None:
                continue
            if ev["kind"] == EV_FAILED:
                raise _client.PsnetError(-ev["r"], f"the strategy could not join: {ev['reason']}")
            if ev["kind"] == EV_ROUND and ev["aggregate"]:
                _aggregate(fleet, strategy, ev, st)
            elif ev["kind"] == EV_PUSHED:
                if ev["r"] == 0:
                    st["counted"] += 1
                elif ev["r"] == -_errno.ESTALE:
                    st["late"] += 1
                    log.warning("strategy: round %d's delta came too late: %s", ev["number"], ev["reason"])
                else:
                    st["failed"] += 1
                    log.warning("strategy: round %d's delta failed: %s %s", ev["number"], os.strerror(-ev["r"]),
                                ev["reason"])
            elif ev["kind"] == EV_END:
                st["state"] = (_client.JOB_STATES[ev["r"]] if 0 <= ev["r"] < len(_client.JOB_STATES)
                               else str(ev["r"]))
                try:
                    fleet.leave(0)
                except _client.PsnetError as e:
                    log.debug("strategy: leaving: %s", e)
    return st
