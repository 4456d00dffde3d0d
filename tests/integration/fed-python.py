# SPDX-License-Identifier: Apache-2.0
"""Checks of psnet.fed (Python federated clients) for test-fed-python.sh,
each printing "ok: ..." lines (a failed check prints "FAIL: ..." and exits 1).

    fed-python.py sim COORD N FIRST OF OUT [bad|byzantine]
        N virtual clients (partitions FIRST..FIRST+N-1 of OF, IID) training the
        job's MLP mlp:784-64-10 with their own PyTorch fit(); with "bad", the
        clients with index 1 and 2 return a wrong shape and NaN in their
        first rounds; with "byzantine", client 1 sends its update turned
        around (x -10) and client 2 blown up (x 100) in every round. Writes the
        run's stats to OUT (JSON).
    fed-python.py refuse
        what fit and evaluate return that cannot be taken, refused here with
        the reason
    fed-python.py strategy COORD N OUT [KEYS]
        a --strategy custom job (with KEYS, the keys edge and strategy there): a psnet.fed.Strategy (the coordinate-wise
        median, in NumPy) in a thread of this process aggregates the rounds
        of N simulated clients; its first answer is NaN (the round is
        dropped and runs again); what it is given is what the clients
        returned, and the shards apply exactly what it returns. A second
        strategy process is refused while it is connected.
    fed-python.py strategy-die COORD | strategy-serve COORD
        a strategy process that dies (exit 3) when first asked to aggregate,
        and one that aggregates (the median) until the job ends"""
import json
import os
import sys
import threading
import traceback

import numpy as np
import torch
from torch import nn

from psnet import data, fed

DATA = os.environ.get("PSNET_DATA", "/usr/share/datasets/fashion-mnist")
TRAIN_LIMIT, TEST_LIMIT = 12000, 2000


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print(f"ok: {msg}", flush=True)


def mlp():
    return nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def set_weights(net, params):
    sd = net.state_dict()
    for (k, v), p in zip(sd.items(), params):
        v.copy_(torch.from_numpy(np.asarray(p)).reshape(v.shape))


def get_weights(net):
    return [v.detach().cpu().numpy().copy() for v in net.state_dict().values()]


def train(net, x, y, epochs, batch, lr, seed):
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    total, n = 0.0, 0
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for s in range(0, len(x) - batch + 1, batch):
            idx = perm[s:s + batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            n += len(idx)
    return total / max(n, 1)


def test(net, x, y):
    with torch.no_grad():
        out = net(x)
        return nn.functional.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


class MlpClient(fed.NumPyClient):
    def __init__(self, part, of, xs, ys, xt, yt, bad=None):
        n = len(xs) // of
        self.x, self.y = xs[part * n:(part + 1) * n], ys[part * n:(part + 1) * n]
        self.xt, self.yt, self.part, self.bad = xt, yt, part, bad
        self.net = mlp()

    def num_examples(self):
        return len(self.x)

    def fit(self, parameters, config):
        set_weights(self.net, parameters)
        loss = train(self.net, self.x, self.y, config["local_epochs"], config["batch_size"], config["lr"],
                     1000 * config["number"] + self.part)
        w = get_weights(self.net)
        if self.bad in ("flip", "scale"):
            # An attacker: its update turned around (x -10) or blown up (x 100).
            k = -10.0 if self.bad == "flip" else 100.0
            w = [p + k * (a - p) for a, p in zip(w, parameters)]
        if self.bad == "shape" and config["round"] <= 2:
            w[0] = w[0][:10]
        if self.bad == "nan" and config["round"] <= 2:
            w[1][3] = np.nan
        return w, len(self.x), {"loss": loss}

    def evaluate(self, parameters, config):
        set_weights(self.net, parameters)
        loss, acc = test(self.net, self.xt, self.yt)
        return loss, len(self.xt), {"accuracy": acc}


def load():
    xs, ys = data.load(DATA, "train", TRAIN_LIMIT)
    xt, yt = data.load(DATA, "test", TEST_LIMIT)
    return (torch.from_numpy(xs.reshape(len(xs), -1)), torch.from_numpy(ys),
            torch.from_numpy(xt.reshape(len(xt), -1)), torch.from_numpy(yt))


def sim(coord, n, first, of, out, bad=False, byz=False):
    torch.set_num_threads(1)
    xs, ys, xt, yt = load()
    made = {}

    def client_fn(cid):
        i = int(cid)
        made[i] = made.get(i, 0) + 1
        kind = {1: "shape", 2: "nan"}.get(i) if bad else {1: "flip", 2: "scale"}.get(i) if byz else None
        return MlpClient(first + i, of, xs, ys, xt, yt, kind)

    st = fed.simulate(client_fn, n, coord=coord, timeout_s=240)
    with open(out, "w") as f:
        json.dump(dict(st, made=made), f)
    check(st["state"] == "done", f"{n} simulated Python clients served the job to its end (state {st['state']})")
    check(st["counted"] > 0 and st["failed"] == 0,
          f"their updates were counted ({st['counted']} counted, {st['late']} late, {st['failed']} failed)")
    check(st["fit_s"] > 0 and 0 < st["fit_cpu_s"] <= st["cpu_s"],
          f"the Stats say where the CPU went: {st['fit_cpu_s']:.3f} s of {st['cpu_s']:.3f} s in fit() "
          f"({st['fit_s']:.3f} s of wall time)")
    if byz:
        with open(out + ".attackers", "w") as f:
            f.write(",".join(str(st["ids"][i]) for i in (1, 2)))
    if bad:
        check(st["refused"] == 4, f"the wrong shape and the NaN were refused in their two rounds each "
              f"({st['refused']} refused)")


class Fixed(fed.NumPyClient):
    def __init__(self, res):
        self.res = res

    def fit(self, parameters, config):
        return self.res(parameters)


def refuse():
    shapes = [("w", (3, 2)), ("b", (3,))]
    w0 = [np.zeros((3, 2), np.float32), np.zeros(3, np.float32)]
    good = [np.ones((3, 2), np.float32), np.ones(3, np.float32)]
    u, n, loss = fed._as_update((good, 5, {"loss": 0.5}), shapes, w0)
    check(n == 5 and loss == 0.5 and all(np.array_equal(a, b) for a, b in zip(u, good)),
          "a good result becomes its update (returned minus pulled), count and loss")
    u, n, loss = fed._as_update(([g.astype(np.float64) for g in good], 5, None), shapes, w0)
    check(u[0].dtype == np.float32 and loss == 0.0, "float64 arrays are taken as float32; no metrics is no loss")
    cases = [
        ((good, 5), "not (parameters, num_examples, metrics)"),
        ((good, -3, {}), "num_examples is -3"),
        ((good, 0, {}), "num_examples is 0"),
        ((good, True, {}), "num_examples is True"),
        ((good, 2.5, {}), "num_examples is 2.5"),
        ((good[:1], 5, {}), "returned 1 arrays; the job's model has 2 tensors"),
        (([good[0].T, good[1]], 5, {}), "has shape [2, 3]; the job's is [3, 2]"),
        (([good[0].astype(np.int32), good[1]], 5, {}), "is int32, not floating point"),
        (([good[0], np.array([1, np.nan, 0], np.float32)], 5, {}), "holds NaN or infinity"),
        (([good[0], np.array([1, np.inf, 0], np.float32)], 5, {}), "holds NaN or infinity"),
        (([good[0], np.array([1e300, 0, 0])], 5, {}), "overflows float32"),
        ((good, 5, ["loss"]), "metrics are a list, not a dict"),
    ]
    for res, why in cases:
        try:
            fed._as_update(res, shapes, w0)
            fail(f"{why}: taken")
        except fed.Refused as e:
            if why not in str(e):
                fail(f"refused with {e!r}, expected {why!r}")
    check(True, f"{len(cases)} results that are no update are refused, each with its reason")
    check(fed._as_test((0.5, 10, {"accuracy": 0.8})) == (0.8, 0.5, 10), "a test's result is (accuracy, loss, examples)")
    tests = [((0.5, 10), "not (loss, num_examples, metrics)"), ((0.5, 0, {}), "num_examples is 0"),
             ((float("nan"), 10, {}), "a finite number >= 0"), ((-1.0, 10, {}), "a finite number >= 0"),
             (("x", 10, {}), "not a number"), ((0.5, 10, 3), "not a dict")]
    for res, why in tests:
        try:
            fed._as_test(res)
            fail(f"{why}: taken")
        except fed.Refused as e:
            if why not in str(e):
                fail(f"refused with {e!r}, expected {why!r}")
    check(True, f"{len(tests)} test results that cannot be weighed are refused, each with its reason")


class Median(fed.Strategy):
    """The coordinate-wise median of the clients' models; NaN in its first answer."""

    def __init__(self, coord=None, key=None, nan_first=True):
        self.asked, self.seen, self.returned, self.coord, self.key, self.second = 0, [], [], coord, key, None
        self.nan_first = nan_first

    def aggregate_fit(self, server_round, results, parameters):
        self.asked += 1
        if self.asked == 1 and self.coord:
            # A second strategy process while this one is connected: refused.
            try:
                fed.start_strategy(coord=self.coord, strategy=Median(), key=self.key, connect_timeout_s=3,
                                   timeout_s=10)
                self.second = "joined"
            except OSError as e:
                self.second = str(e)
        new = [np.median(np.stack([r.parameters[t] for r in results]), axis=0) for t in range(len(parameters))]
        self.seen.append((server_round, parameters, results))
        if self.asked == 1 and self.nan_first:
            new[1] = new[1].copy()
            new[1][0] = np.nan
        else:
            self.returned.append(new)
        return new


def strategy(coord, n, out, keys=None):
    torch.set_num_threads(1)
    xs, ys, xt, yt = load()
    sent = {}  # round number -> the models the clients returned

    class Recording(MlpClient):
        def fit(self, parameters, config):
            res = super().fit(parameters, config)
            sent.setdefault(config["number"], []).append([np.asarray(a, np.float32) for a in res[0]])
            return res

    skey = keys and os.path.join(keys, "strategy.key")
    med, box = Median(coord, skey), {}

    def run():
        try:
            box["st"] = fed.start_strategy(coord=coord, strategy=med, key=skey, timeout_s=240)
        except Exception as e:  # reported below
            traceback.print_exc()
            box["err"] = e

    th = threading.Thread(target=run)
    th.start()
    st = fed.simulate(lambda cid: Recording(int(cid), n, xs, ys, xt, yt), n, coord=coord, timeout_s=240,
                      key=keys and os.path.join(keys, "edge.key"))
    th.join()
    with open(out, "w") as f:
        json.dump({"clients": st, "strategy": box.get("st"), "second": med.second}, f)
    if "err" in box:
        fail(f"the strategy failed: {box['err']!r}")
    s = box["st"]
    check(st["state"] == "done" and s["state"] == "done",
          f"{n} clients and the strategy served the job to its end (clients {st['state']}, strategy {s['state']})")
    check("connected already" in (med.second or ""),
          f"a second strategy process is refused while one is connected ({med.second})")
    check(s["refused"] == 1 and s["counted"] == med.asked - 1 and s["failed"] == 0,
          f"the strategy's NaN was refused here, its other {med.asked - 1} answers taken ({s})")
    # What it was given: the clients' returned models, each once, per round.
    worst = 0.0
    for rnd, before, results in med.seen:
        number = [k for k, v in sent.items() if len(v) == len(results)]
        models = None
        for k in number:
            got = sorted(sent[k], key=lambda m: float(m[0].sum()))
            mine = sorted([r.parameters for r in results], key=lambda m: float(m[0].sum()))
            if all(np.allclose(a, b, atol=1e-5) for x, y in zip(got, mine) for a, b in zip(x, y)):
                models = (got, mine)
        if models is None:
            fail(f"round {rnd}: the strategy's {len(results)} results are not the models the clients returned")
        worst = max(worst, max(float(np.max(np.abs(a - b))) for x, y in zip(*models) for a, b in zip(x, y)))
    check(True, f"in each of its {len(med.seen)} rounds the strategy got the models the clients returned "
          f"(max difference {worst:.2g}, the float32 rounding of w + (w' - w))")
    # What the shards applied: the model before round r + 1 is what it returned for round r.
    gaps = []
    for k in range(1, len(med.returned)):
        before = med.seen[k + 1][1]
        gaps.append(max(float(np.max(np.abs(a - b))) for a, b in zip(before, med.returned[k - 1])))
    check(len(gaps) >= 2 and max(gaps) < 1e-5,
          f"the shards applied what the strategy returned, round after round (max difference {max(gaps or [1]):.2g})")


class Dies(fed.Strategy):
    def aggregate_fit(self, server_round, results, parameters):
        print("dying", flush=True)
        os._exit(3)


def main():
    cmd = sys.argv[1]
    if cmd == "sim":
        sim(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6],
            len(sys.argv) > 7 and sys.argv[7] == "bad", len(sys.argv) > 7 and sys.argv[7] == "byzantine")
    elif cmd == "refuse":
        refuse()
    elif cmd == "strategy":
        strategy(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    elif cmd == "strategy-die":
        fed.start_strategy(coord=sys.argv[2], strategy=Dies(), timeout_s=120)
    elif cmd == "strategy-serve":
        med = Median(nan_first=False)
        st = fed.start_strategy(coord=sys.argv[2], strategy=med, connect_timeout_s=20, timeout_s=120)
        check(st["state"] == "done" and st["counted"] == med.asked,
              f"a strategy started after the first died served the job to its end ({st})")
    else:
        fail(f"unknown check {cmd}")


if __name__ == "__main__":
    main()
