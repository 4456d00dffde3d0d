# SPDX-License-Identifier: Apache-2.0
"""psnet's models in PyTorch, and the safetensors files psnet reads and writes.

psnet names and lays out its tensors as the state_dict of the torch.nn
model built here from the same description (docs/models.md), so an export
loads with load_state_dict as it is:

    from psnet.models import load
    model, meta = load("model.safetensors")   # torch.nn.Module, eval mode
    model(x)                                  # x: [N, C, H, W] float32

The description is the JSON `psctl export` stores in the file's metadata
("psnet.model"), the same as a --model JSON file. Reading and writing
safetensors needs only the standard library and torch (Debian's
python3-torch; no safetensors package).
"""
import json
import struct

import torch
from torch import nn


def read_safetensors(path):
    """The tensors (name -> torch.Tensor: float32, and int64 for a psnet
    table's ids, psctl export's NAME.ids) and metadata of a file."""
    with open(path, "rb") as f:
        blob = f.read()
    (hl,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hl])
    meta = header.pop("__metadata__", {})
    data = blob[8 + hl:]
    tensors = {}
    for name, e in header.items():
        dtype = {"F32": torch.float32, "I64": torch.int64}.get(e["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} is {e['dtype']}, not F32 (or I64)")
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtype)
        tensors[name] = t.reshape(e["shape"])
    return tensors, meta


def write_safetensors(path, tensors, meta=None):
    """Writes name -> tensor (as float32, C order) with string metadata."""
    header, chunks, off = {}, [], 0
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    for name, t in tensors.items():
        raw = t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


class Tokens(nn.Module):
    """[N, C, H, W] -> [N, H*W, C]: each position a token."""

    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


class PosEmbed(nn.Module):
    """Adds a learned [T, D] position embedding."""

    def __init__(self, t, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(t, d))

    def forward(self, x):
        return x + self.weight


class Mean(nn.Module):
    """[N, T, D] -> [N, D]: the mean over the tokens."""

    def forward(self, x):
        return x.mean(dim=1)


class Block(nn.TransformerEncoderLayer):
    """psnet's transformer block: pre-norm, GELU, no dropout; causal masks
    each token's attention to the tokens before it."""

    def __init__(self, d, heads, hidden, causal):
        super().__init__(d, heads, hidden, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.causal = causal

    def forward(self, x):
        mask = None
        if self.causal:
            t = x.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        return super().forward(x, src_mask=mask)


def _out_hw(h, k, s, p):
    return (h + 2 * p - k) // s + 1


def build(desc):
    """The torch.nn.Sequential of a psnet model description (dict or JSON
    text, as the export's "psnet.model" metadata holds it)."""
    if isinstance(desc, str):
        desc = json.loads(desc)
    shape = list(desc["input"])
    layers = []
    for i, l in enumerate(desc["layers"]):
        k = l["type"]
        if k == "linear":
            layers.append(nn.Linear(shape[-1] if len(shape) > 0 else 1, l["out"]))
            shape = shape[:-1] + [l["out"]]
        elif k == "conv2d":
            c, h, w = shape
            s, p = l.get("stride", 1), l.get("padding", 0)
            layers.append(nn.Conv2d(c, l["out"], l["kernel"], stride=s, padding=p))
            shape = [l["out"], _out_hw(h, l["kernel"], s, p), _out_hw(w, l["kernel"], s, p)]
        elif k in ("maxpool", "avgpool"):
            c, h, w = shape
            kk = l["kernel"]
            s, p = l.get("stride", kk) or kk, l.get("padding", 0)
            cls = nn.MaxPool2d if k == "maxpool" else nn.AvgPool2d
            layers.append(cls(kk, stride=s, padding=p))
            shape = [c, _out_hw(h, kk, s, p), _out_hw(w, kk, s, p)]
        elif k == "flatten":
            layers.append(nn.Flatten())
            n = 1
            for d in shape:
                n *= d
            shape = [n]
        elif k == "tokens":
            layers.append(Tokens())
            c, h, w = shape
            shape = [h * w, c]
        elif k == "relu":
            layers.append(nn.ReLU())
        elif k == "gelu":
            layers.append(nn.GELU())
        elif k == "dropout":
            layers.append(nn.Dropout(l["p"]))
        elif k == "layernorm":
            layers.append(nn.LayerNorm(shape[-1], eps=l.get("eps", 1e-5)))
        elif k == "embedding":
            layers.append(nn.Embedding(l["vocab"], l["out"]))
            shape = shape + [l["out"]]
        elif k == "posembed":
            layers.append(PosEmbed(shape[0], shape[1]))
        elif k == "transformer":
            layers.append(Block(shape[-1], l["heads"], l["hidden"], l.get("causal", False)))
        elif k == "mean":
            layers.append(Mean())
            shape = shape[1:]
        else:
            raise ValueError(f"layer {i}: psnet.models does not know the type {k!r}")
    return nn.Sequential(*layers)


def load(path):
    """The model of a psnet export with its weights (eval mode), and the
    file's metadata."""
    tensors, meta = read_safetensors(path)
    model = build(meta["psnet.model"])
    model.load_state_dict(tensors, strict=True)
    return model.eval(), meta


def save(model, desc, path):
    """Writes model's state_dict for a psnet job to start from (--init), with
    its description."""
    if not isinstance(desc, str):
        desc = json.dumps(desc)
    write_safetensors(path, model.state_dict(), {"format": "pt", "psnet.model": desc})
