"""Device discipline on the CPU: the `meta` device stands in for a GPU.

A meta tensor has a shape, a dtype and a device but no data. Whatever needs its values on the
host (.item(), bool(), .tolist(), .cpu(), printing) raises, and so does an op that mixes it with
a CPU tensor of one or more dimensions, as it would with a CUDA tensor. `DeviceCrossings` also
records what a GPU runs without complaint but pays a copy for: `.to(device)` of a CPU tensor,
indexing with a CPU index. Code that runs every micro-step or generation step must pass both.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from aogpt.model import AOGPT, ModelConfig

META = torch.device("meta")
TINY = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, cond_dim=8, loss_chunk_size=8)


def tiny_meta_model(**overrides) -> AOGPT:
    """A tiny AOGPT whose parameters live on the meta device (no memory, no data)."""
    config = ModelConfig(**{**TINY.__dict__, **overrides})
    with torch.device(META):
        return AOGPT(config)


def _devices(value) -> set[torch.device]:
    """The devices an op's argument or result lives on; a 0-dim CPU tensor is a scalar to any
    device (a GPU kernel takes its value as an argument, no copy), so it counts for none."""
    if isinstance(value, torch.Tensor):
        return set() if value.device.type == "cpu" and value.dim() == 0 else {value.device}
    if isinstance(value, torch.device):
        return {value}
    return set()


class DeviceCrossings(TorchDispatchMode):
    """Records every op whose tensors, results or `device=` span more than one device: a
    host<->device copy, explicit or implicit. `with DeviceCrossings() as crossings: ...`, then
    crossings.ops lists them as "aten.op: cpu -> meta"-like strings."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        devices = set()
        for value in tree_flatten((args, kwargs, out))[0]:
            devices |= _devices(value)
        if len(devices) > 1:
            self.ops.append(f"{func}: {' & '.join(sorted(d.type for d in devices))}")
        return out

    def __len__(self) -> int:
        return len(self.ops)


def let_meta_run_without_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Meta has no autocast state: torch.is_autocast_enabled("meta") and torch.autocast("meta")
    raise. Where that is so, they answer "off" for meta (a no-op, as on a GPU without autocast),
    so that code asking the tensors' device about autocast (model/loss.py) runs on meta."""
    if torch.amp.is_autocast_available("meta"):
        return
    is_enabled, autocast = torch.is_autocast_enabled, torch.autocast

    def is_autocast_enabled(*device):
        return False if device and str(device[0]) == "meta" else is_enabled(*device)

    def autocast_or_nothing(device_type, *args, **kwargs):
        if device_type == "meta":
            return contextlib.nullcontext()
        return autocast(device_type, *args, **kwargs)

    monkeypatch.setattr(torch, "is_autocast_enabled", is_autocast_enabled)
    monkeypatch.setattr(torch, "autocast", autocast_or_nothing)
