"""Device discipline on the CPU: the `meta` device stands in for a GPU.

A meta tensor has a shape, a dtype and a device but no data. Whatever needs its values on the
host (.item(), bool(), .tolist(), .cpu(), printing) raises, and so does an op that mixes it with
a CPU tensor of one or more dimensions, as it would with a CUDA tensor. `DeviceCrossings` also
records what a GPU runs without complaint but pays a copy for: `.to(device)` of a CPU tensor,
indexing with a CPU index; and the ops that make a CUDA device wait although they involve no
host value in the code (`cuda_sync`): boolean-mask indexing, nonzero, repeat_interleave without
output_size... A CPU runs them without waiting, and meta runs some of them (a boolean-mask
assignment) without complaint. Code that runs every micro-step or generation step must pass all.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from aogpt.model import AOGPT, ModelConfig

META = torch.device("meta")
aten = torch.ops.aten
# ops whose output's size depends on the values of their input: a CUDA device computes it, then
# the host waits for the size to allocate the output
SIZED_BY_DATA = {aten.nonzero.default, aten.masked_select.default, aten._unique.default,
                 aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
                 aten.bincount.default}
# ops that return a value to the host
HOST_VALUE = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
            aten._index_put_impl_.default}
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


def cuda_sync(func, args, kwargs) -> str | None:
    """Why a CUDA device would make the host wait in this op (as it reaches the dispatcher), or
    None: what torch.cuda.set_sync_debug_mode("error") stops, found on any device."""
    if func in HOST_VALUE:
        return "returns a value to the host"
    if func in SIZED_BY_DATA:
        return "its output's size depends on the data"
    if func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor) \
            and kwargs.get("output_size") is None:
        return "repeat_interleave without output_size: its output's size depends on the data"
    if func in INDEXING and any(isinstance(index, torch.Tensor)
                                and index.dtype in (torch.bool, torch.uint8) for index in args[1]):
        return "indexing with a boolean mask (a nonzero)"
    return None


def _devices_of(value) -> set[torch.device]:
    return set().union(*(_devices(v) for v in tree_flatten(value)[0]))


class DeviceCrossings(TorchDispatchMode):
    """Records every op whose tensors, results or `device=` span more than one device (a
    host<->device copy, explicit or implicit), and every op a CUDA device would wait in
    (cuda_sync). `with DeviceCrossings() as crossings: ...`, then crossings.ops lists them as
    "aten.op: cpu & meta"-like strings."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        waits = cuda_sync(func, args, kwargs)
        if waits:  # recorded before it runs: meta raises in some of them
            self.ops.append(f"{func}: {waits}")
        inputs = _devices_of((args, kwargs))
        if len(inputs) > 1:  # recorded before it runs too: a copy out of meta raises
            self._crossing(func, inputs)
        out = func(*args, **kwargs)
        if len(inputs) <= 1 and len(inputs | _devices_of(out)) > 1:
            self._crossing(func, inputs | _devices_of(out))
        return out

    def _crossing(self, func, devices: set[torch.device]) -> None:
        self.ops.append(f"{func}: {' & '.join(sorted(d.type for d in devices))}")

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
