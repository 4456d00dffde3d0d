"""psnet from Python: models exported by psnet (safetensors) as torch.nn
modules, and state_dicts written for a job to start from (psnet.models)."""
