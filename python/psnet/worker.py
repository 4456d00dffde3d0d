# SPDX-License-Identifier: Apache-2.0
"""A psnet worker in Python and PyTorch (Debian's python3-torch), the
counterpart of workerd --backend cpu on the same job:

    PYTHONPATH=python /usr/bin/python3 -m psnet.worker --coord ipc:///tmp/psnet/coord.sock

It joins the job, builds the job's model in torch.nn (psnet.models), reads
the job's data (psnet.data), and trains its share as workerd does: the same
partition (sample i to rank i mod W), the same order of batches, a push and
pull per step (psnet.trainer), the test accuracy at epoch ends (rank 0), and
the final evaluation when pscoord asks for it. It runs beside workerd
processes in one job. Exit status 0 when the job is done, 1 otherwise."""
import argparse
import sys
import time

import numpy as np
import torch

from .client import (EV_EVALUATE, EV_STOP, PsnetError, Stale, Worker)
from .data import load, shuffle
from .models import build
from .trainer import TorchTrainer


def log(msg, **kv):
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    print(f"ts={time.strftime('%Y-%m-%dT%H:%M:%S')} level=info daemon=psnet.worker msg=\"{msg}\" {fields}",
          file=sys.stderr, flush=True)


def epoch_of(samples, per_epoch, epochs):
    return min(samples // per_epoch + 1, max(epochs, 1)) if per_epoch else 1


class Run:
    def __init__(self, w, args):
        self.w, self.args = w, args
        info = w.info()
        self.info, self.desc = info, w.model()
        self.model = build(self.desc)
        d = args.data or info["dataset"]
        x, self.y = load(d, "train", info["train_limit"])
        tx, self.ty = load(d, "test", info["test_limit"])
        shape = list(self.desc["input"])
        self.x = torch.from_numpy(x.reshape([len(x)] + shape))
        self.tx = torch.from_numpy(tx.reshape([len(tx)] + shape))
        self.y, self.ty = torch.from_numpy(self.y), torch.from_numpy(self.ty)
        log("data loaded", dir=d, train=len(self.x), test=len(self.tx), sample=shape)
        self.t = TorchTrainer(w, self.model)
        if self.t.grads is not None:
            log("tensors in shared memory", note="pushed and pulled in place on this host")
        self.n = len(self.x)
        self.total = info["epochs"] * self.n
        self.batch, self.seed = info["batch"], info["seed"]
        self.part = None
        self.step_n, self.samples, self.losses = 0, 0, []

    def start(self):
        info = self.w.info()
        self.clock = info["start_clock"]
        self.resume = self.clock - info["base_clock"]
        self.pass_n, self.step_in_pass, self.pass_open = 0, 0, False
        self.t.pull(self.clock)

    def share(self):
        """This worker's samples (i mod workers == rank), ascending."""
        return list(range(self.part[0], self.n, self.part[1]))

    def partition(self):
        info = self.w.info()
        self.part = (info["rank"], max(info["workers"], 1))
        self.perm = self.share()
        self.steps_per_pass = len(self.perm) // self.batch
        log("partition", rank=f"{self.part[0]}/{self.part[1]}", images=len(self.perm))

    def where(self):
        done, self.end_clock = self.w.schedule(self.clock, self.total)
        self.epoch = epoch_of(done, self.n, self.info["epochs"])
        return done

    def evaluate(self, epoch, final):
        acc, loss = self.t.evaluate(self.tx, self.ty)
        train_loss = float(np.mean(self.losses[-50:])) if self.losses else 0.0
        log("evaluated epoch end" if not final else "evaluated", epoch=epoch, accuracy=f"{acc:.4f}",
            test_loss=f"{loss:.4f}", clock=self.clock)
        self.w.evaluated(epoch, acc, loss, train_loss, self.clock)
        return acc

    def train(self):
        self.start()
        self.partition()
        self.where()
        seen = self.epoch - 1
        t0 = time.monotonic()
        while True:
            if self.w.events(EV_STOP) & EV_STOP:
                log("stopping", reason=self.w.reason())
                return False
            self.where()
            if self.clock >= self.end_clock:
                break
            if not self.pass_open:
                info = self.w.info()
                if (info["rank"], max(info["workers"], 1)) != self.part:
                    self.partition()
                if self.resume > 0 and self.steps_per_pass > 0:
                    self.pass_n += self.resume // self.steps_per_pass
                    self.resume %= self.steps_per_pass
                self.perm = self.share()  # each pass from the share's own order, as workerd
                shuffle(self.perm, self.seed, self.part[0], self.pass_n)
                self.step_in_pass, self.resume, self.pass_open = max(self.resume, 0), 0, True
            s = self.step_in_pass
            idx = torch.tensor(self.perm[s * self.batch:(s + 1) * self.batch])
            try:
                loss = self.t.step(self.x[idx], self.y[idx])
            except Stale:
                log("admitted again", clock=self.w.info()["start_clock"])
                self.start()
                continue
            self.clock = self.t.clock
            self.step_n += 1
            self.samples += self.batch
            self.losses.append(loss)
            self.step_in_pass += 1
            if self.step_in_pass >= self.steps_per_pass:
                self.pass_open = False
                self.pass_n += 1
            done = self.where()
            dt = max(time.monotonic() - t0, 1e-9)
            self.w.progress(self.clock, self.epoch, self.step_n, self.samples, loss, self.step_n / dt,
                            self.samples / dt, min(done / max(self.total, 1), 1.0), self.end_clock)
            if self.clock < self.end_clock and self.epoch - 1 > seen:
                seen = self.epoch - 1
                if self.part[0] == 0:
                    self.evaluate(seen, False)
        log("trained", steps=self.step_n, seconds=f"{time.monotonic() - t0:.2f}", clock=self.clock)
        return True

    def final(self):
        """Pulls the final weights, evaluates them, reports the accuracy."""
        self.t.pull(self.clock)
        acc = self.evaluate(self.info["epochs"], True)
        self.w.result(acc)
        return acc


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m psnet.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--coord", required=True, help="pscoord's endpoint, e.g. ipc:///tmp/psnet/coord.sock")
    p.add_argument("--data", help="the data set's directory (default: the job's --data)")
    p.add_argument("--threads", type=int, default=1, help="torch's CPU threads (default 1)")
    p.add_argument("--keys", help="CURVE: the directory of psctl keys gen")
    p.add_argument("--key-name", help="CURVE: this worker's key in --keys (default worker)")
    p.add_argument("--connect-timeout", type=float, default=30.0,
                   help="seconds to wait for pscoord's answer, and then for the job (default 30)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        w = Worker(args.coord, keys_dir=args.keys, key_name=args.key_name,
                   connect_timeout_ms=int(args.connect_timeout * 1000))
    except PsnetError as e:
        print(f"psnet.worker: {e.strerror}", file=sys.stderr)
        return 1
    ok = False
    try:
        w.wait_job(None)
        run = Run(w, args)
        if run.train():
            if w.result():
                run.final()
                ok = True
            else:
                log("finished training; waiting for the job to end (the last member to finish evaluates)")
                while True:
                    ev = w.events(EV_STOP | EV_EVALUATE, None)
                    if ev & EV_EVALUATE:
                        run.final()
                    if ev & EV_STOP:
                        break
                ok = w.info()["state"] == "done"
        w.leave()
    except PsnetError as e:
        print(f"psnet.worker: {e.strerror}", file=sys.stderr)
    finally:
        w.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
