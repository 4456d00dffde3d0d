# SPDX-License-Identifier: Apache-2.0
"""A psnet cluster on this host, for notebooks, tests and first runs:

    with psnet.LocalCluster(shards=2) as cluster:
        opt = psnet.torch.Optimizer(model, coord=cluster, lr=0.1)
        ...

starts pscoord and the shards (psd) on unix sockets in a private directory
and stops them on exit, also after an exception or Ctrl-C; `.coord` is
pscoord's endpoint. The same code runs against a real cluster with
coord="tcp://host:7000" (or its ipc:// endpoint).

The programs are found beside the Python interpreter (pip install puts them
in the environment's bin/), then in the source tree's build/, then on PATH;
$PSNET_BIN names their directory, or $PSNET_BUILD a meson build directory,
to look there first."""
import atexit
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .client import PsnetError

_PR_SET_PDEATHSIG = 1


def find_program(name):
    """The path of pscoord, psd, psctl or workerd (see the module's text)."""
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.join(here, "..", "..", "build")
    sub = {"pscoord": "ps/pscoord", "psd": "ps/psd", "psctl": "ps/psctl", "workerd": "worker/workerd"}[name]
    places = []
    if os.environ.get("PSNET_BIN"):
        places.append(os.path.join(os.environ["PSNET_BIN"], name))
    if os.environ.get("PSNET_BUILD"):
        places.append(os.path.join(os.environ["PSNET_BUILD"], sub, name))
    places += [os.path.join(os.path.dirname(sys.executable), name), os.path.join(tree, sub, name)]
    for p in places:
        if os.access(p, os.X_OK):
            return os.path.abspath(p)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"psnet: cannot find the program {name} (looked in {', '.join(places)} and PATH); "
                            "pip install psnet puts it beside python, or set PSNET_BIN")


def _die_with_parent():
    """In the child: a SIGTERM when the Python process that started it dies,
    even by SIGKILL (Linux's PR_SET_PDEATHSIG), so no daemon outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    os.setpgrp()  # Ctrl-C at the terminal reaches Python only: it stops them in order


def psctl(coord, *args, keys=None, timeout=10.0):
    """Runs psctl against coord (an endpoint or a LocalCluster); (exit
    status, stdout, stderr)."""
    cmd = [find_program("psctl"), "--coord", str(coord), "--timeout", str(max(int(timeout), 1))]
    if keys:
        cmd += ["--keys", keys]
    p = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout + 30)
    return p.returncode, p.stdout, p.stderr


def status(coord, keys=None, timeout=5.0):
    """pscoord's psctl status, as a dict (PsnetError when it does not answer)."""
    rc, out, err = psctl(coord, "--json", "status", keys=keys, timeout=timeout)
    if rc != 0:
        raise PsnetError(111, f"pscoord at {coord} does not answer: {err.strip() or out.strip()}")
    return json.loads(out)


class LocalCluster:
    """pscoord and `shards` psd processes on this host (see the module's text).

    shards: how many psd; memory_limit: bytes of model state each shard may
    hold (pscoord refuses a job that does not fit); dir: where the sockets and
    logs go (default: a new private directory, removed on close unless
    keep=True); timeout: seconds to wait for the shards to register."""

    def __init__(self, shards=2, memory_limit=None, dir=None, keep=False, timeout=30.0, log_level="warning"):
        if shards < 1:
            raise ValueError("shards: at least 1")
        self.shards, self.memory_limit, self.timeout, self.keep = shards, memory_limit, timeout, keep
        self.log_level = log_level
        self._own_dir = dir is None
        if dir:
            os.makedirs(dir, mode=0o700, exist_ok=True)
        self.dir = dir or tempfile.mkdtemp(prefix="psnet-")
        os.chmod(self.dir, 0o700)
        self.coord = f"ipc://{self.dir}/coord.sock"
        self.procs = {}
        self._logs = []
        self.running = False

    # --- life
    def start(self):
        if self.running:
            return self
        atexit.register(self.close)
        try:
            self._spawn("pscoord", ["--listen", self.coord, "--shards", str(self.shards)])
            for i in range(1, self.shards + 1):
                args = ["--id", str(i), "--listen", f"ipc://{self.dir}/psd-{i}.sock", "--coord", self.coord]
                if self.memory_limit:
                    args += ["--memory-limit", str(int(self.memory_limit))]
                self._spawn(f"psd-{i}", args, program="psd")
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.running = True
        return self

    def _spawn(self, name, args, program=None):
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        self._logs.append(log)
        cmd = [find_program(program or name), "--log-level", self.log_level] + args
        self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            preexec_fn=_die_with_parent, close_fds=True)

    def _wait_ready(self):
        end = time.monotonic() + self.timeout
        last = None
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise PsnetError(5, f"{name} exited with status {p.returncode} at start: {self.log_tail(name)}")
            try:
                s = status(self.coord, timeout=2.0)
                if len(s.get("shards") or []) >= self.shards:
                    return
                last = f"{len(s.get('shards') or [])} of {self.shards} shards registered"
            except PsnetError as e:
                last = e.strerror
            time.sleep(0.05)
        raise PsnetError(110, f"the local cluster did not start in {self.timeout:.0f} s: {last}")

    def log_tail(self, name, lines=5):
        try:
            with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self):
        """Stops the daemons (SIGTERM, then SIGKILL after 10 s) and removes the directory."""
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 10.0
        for p in self.procs.values():
            try:
                p.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = {}
        for log in self._logs:
            log.close()
        self._logs = []
        self.running = False
        if self._own_dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "procs", None):
            self.close()

    def __str__(self):
        return self.coord

    def __repr__(self):
        return f"LocalCluster(shards={self.shards}, coord={self.coord!r}, running={self.running})"
