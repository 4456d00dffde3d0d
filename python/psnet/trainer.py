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
        self.bufs, self.params = {}, params
        for name, p in params.items():
            if p.numel() != job[name]:
                raise ValueError(f"parameter {name}: {p.numel()} values, the job's tensor has {job[name]}")
            self.bufs[name] = np.zeros(job[name], dtype=np.float32)
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
        for p in self.params.values():
            p.grad = None
        loss = loss_fn(self.model(x), y)
        loss.backward()
        grads = {n: p.grad.detach().reshape(-1).contiguous().numpy() for n, p in self.params.items()}
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
