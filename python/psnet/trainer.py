# SPDX-License-Identifier: Apache-2.0
"""PyTorch on psnet: a torch.nn model whose parameters live in the buffers
libpsnet pulls into, pushing its gradients after each step.

    w = psnet.client.Worker(coord); w.wait_job()
    model = psnet.models.build(w.model())
    t = TorchTrainer(w, model)
    t.pull(w.info()["start_clock"])      # the job's values, in the model
    loss = t.step(x, y)                  # forward, backward, push, pull the next clock

The model's parameter names must be the job's tensors (psnet names them as
PyTorch's state_dict: psnet.models.build makes the matching module). The
shards hold the optimizer: no torch.optim here."""
import numpy as np
import torch
import torch.nn.functional as F

from .client import Stale  # noqa: F401  (raised by step and pull)


class TorchTrainer:
    def __init__(self, worker, model):
        self.w, self.model = worker, model
        params = dict(model.named_parameters())
        job = dict(worker.tensors())
        if sorted(params) != sorted(job):
            raise ValueError(f"the model's parameters {sorted(params)} are not the job's tensors {sorted(job)}")
        # In the memory libpsnet shares with the shards on this host where it
        # can (rounds in place: nothing copied), else buffers of our own.
        shared = worker.shared()
        self.bufs, self.params = {}, params
        self.grads = shared[0] if shared else None
        for name, p in params.items():
            if p.numel() != job[name]:
                raise ValueError(f"parameter {name}: {p.numel()} values, the job's tensor has {job[name]}")
            self.bufs[name] = shared[1][name] if shared else np.zeros(job[name], dtype=np.float32)
            # The parameter is a view of the buffer: a pull writes the weights in place.
            p.data = torch.from_numpy(self.bufs[name]).view(p.shape)
        self.clock = None

    def pull(self, clock):
        """The job's values as of clock into the model."""
        self.w.round(None, 0, self.bufs, clock)
        self.clock = clock

    def step(self, x, y, loss_fn=F.cross_entropy):
        """One step at self.clock: the loss of the batch, its gradients pushed
        (the batch's mean, as workerd's), the next clock's values pulled."""
        self.model.train()
        for n, p in self.params.items():
            if self.grads is None:
                p.grad = None
            else:
                # backward accumulates into the gradient in shared memory, in place.
                p.grad = torch.from_numpy(self.grads[n]).view(p.shape)
                p.grad.zero_()
        loss = loss_fn(self.model(x), y)
        loss.backward()
        if self.grads is None:
            grads = {n: p.grad.detach().reshape(-1).contiguous().numpy() for n, p in self.params.items()}
        else:
            grads = self.grads
            for n, p in self.params.items():
                if p.grad.data_ptr() != self.grads[n].ctypes.data:  # torch put it elsewhere: copy it in
                    np.copyto(self.grads[n], p.grad.detach().reshape(-1).numpy())
        self.w.round(grads, self.clock, self.bufs, self.clock + 1)
        self.clock += 1
        return loss.item()

    def evaluate(self, x, y, batch=1000):
        """(accuracy, mean loss) of the model as it stands on x, y."""
        self.model.eval()
        correct, loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(x), batch):
                out = self.model(x[i:i + batch])
                loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
                correct += (out.argmax(1) == y[i:i + batch]).sum().item()
        return correct / max(len(x), 1), loss / max(len(x), 1)
