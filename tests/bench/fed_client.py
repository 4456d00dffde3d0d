# SPDX-License-Identifier: Apache-2.0
"""One Python federated client for tests/bench/fed-python-vs-c.sh: the job's
model built from psnet's JSON of layers (psnet.models.build), trained on its
own partition (a directory of NumPy pairs) as workerd --edge trains it: plain
SGD at the job's lr, its batch, a fresh shuffle each local epoch, the last
batch smaller.

    fed_client.py COORD DATA_DIR MODEL_JSON [channels_last]

channels_last: the model's tensors in that memory layout (one line of the
user's code; torch's convolutions on a CPU run faster so). Prints the run's
psnet.fed Stats as JSON."""
import json
import sys

import torch
import torch.nn.functional as F

import psnet.fed
from psnet import data, models


class Client(psnet.fed.NumPyClient):
    def __init__(self, net, x, y, tx, ty):
        self.net, self.x, self.y, self.tx, self.ty = net, x, y, tx, ty

    def _set(self, parameters):
        sd = self.net.state_dict()
        self.net.load_state_dict({k: torch.from_numpy(p).reshape(v.shape) for (k, v), p in zip(sd.items(), parameters)})

    def fit(self, parameters, config):
        self._set(parameters)
        g = torch.Generator().manual_seed(config["seed"] * 1000003 + config["number"] * 7919)
        total, n = 0.0, 0
        opt = torch.optim.SGD(self.net.parameters(), lr=config["lr"])  # plain SGD, as workerd's local step
        for _ in range(config["local_epochs"]):
            for idx in torch.randperm(len(self.x), generator=g).split(config["batch_size"]):
                opt.zero_grad()
                loss = F.cross_entropy(self.net(self.x[idx]), self.y[idx])
                loss.backward()
                opt.step()
                total += loss.detach() * len(idx)
                n += len(idx)
        total = float(total)
        return [v.detach().numpy().copy() for v in self.net.state_dict().values()], len(self.x), {"loss": total / n}

    def evaluate(self, parameters, config):
        self._set(parameters)
        with torch.no_grad():
            out = self.net(self.tx)
            return F.cross_entropy(out, self.ty).item(), len(self.tx), {
                "accuracy": (out.argmax(1) == self.ty).float().mean().item()}


def main():
    coord, d, model = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    with open(model) as f:
        net = models.build(json.load(f))
    if sys.argv[4:] == ["channels_last"]:
        net = net.to(memory_format=torch.channels_last)
    x, y = data.load(d, "train")
    tx, ty = data.load(d, "test")
    shape = (-1, 1, 28, 28)
    c = Client(net, torch.from_numpy(x).reshape(shape), torch.from_numpy(y), torch.from_numpy(tx).reshape(shape),
               torch.from_numpy(ty))
    st = psnet.fed.start_client(coord=coord, client=c)
    print(json.dumps(st))


if __name__ == "__main__":
    main()
