# SPDX-License-Identifier: Apache-2.0
"""psnet from Python.

    import psnet, psnet.torch
    with psnet.LocalCluster(shards=2) as cluster:              # or coord="tcp://host:7000"
        opt = psnet.torch.Optimizer(model, coord=cluster, lr=0.1)   # any torch.nn.Module
        ...  loss.backward(); opt.step(loss=loss)  ...

psnet.torch trains any PyTorch model, the shards holding its tensors and
running the optimizer; psnet.LocalCluster (psnet.cluster) starts pscoord and
shards on this host. Below them: a worker over libpsnet (psnet.client,
ctypes), psnet's own models as torch.nn (psnet.models), the job's data
(psnet.data) and a ready worker program for psnet's models (python3 -m
psnet.worker). See docs/python.md."""
from .client import PsnetError, Stale, Worker  # noqa: F401
from .cluster import LocalCluster  # noqa: F401

try:  # meson.build's version, as pip installed it
    from importlib.metadata import PackageNotFoundError, version as _version
    __version__ = _version("psnet")
except (ImportError, PackageNotFoundError):
    try:  # as meson installed it without pip (the container image's python target)
        from ._version import version as __version__
    except ImportError:
        __version__ = "source tree"
