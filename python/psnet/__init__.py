# SPDX-License-Identifier: Apache-2.0
"""psnet from Python: models exported by psnet (safetensors) as torch.nn
modules and state_dicts written for a job to start from (psnet.models); a
worker over libpsnet (psnet.client, ctypes), PyTorch training on it
(psnet.trainer), the job's data (psnet.data) and a ready worker program
(python3 -m psnet.worker)."""
