"""DeepSpeed's optimizer step without waiting for the device.

A GPU runs ahead of the host only while the host never reads a device value: every read
(`.item()`, `bool(tensor)`, a blocking copy of a host value to the device) drains the queue, and
the GPU then idles while the host prepares the next micro-batch. The trainer reads the device
only at log, evaluation and checkpoint boundaries (trainer/loop.py). DeepSpeed 0.19.8's ZeRO
step reads it at every optimizer step, in three helpers:

    is_invalid_grad_norm(norm)          bool() of the norm: skip the step if it is inf/NaN
    clip_tensors_by_global_norm(...)    `if clip_coef < 1:` on a device tensor (bf16 ZeRO-1)
    mask_nan_or_inf_with_val_inplace    torch.tensor(-1.0, device=...): a blocking copy

`install()` replaces them, in the DeepSpeed modules that call them, with device-side equivalents:
the norm's inf/NaN is marked -1 in place with a Python scalar; clipping multiplies by DeepSpeed's
own coefficient where it is below 1 and by exactly 1.0 elsewhere, decided on the device (so the
gradients are bit for bit those of the original, whatever the norm); and DeepSpeed no longer
decides on the host to skip a step whose gradient norm is not finite. Instead the trainer's check
of bad steps (trainer/recovery.py) notes every step's gradient norm with its loss, on the device,
and reads both at its next boundary, before any save: train.on_nonfinite=stop ends the run there,
rollback goes back to the last complete checkpoint before the step; no checkpoint ever holds
weights that a non-finite step updated. (With bf16 or fp32 gradients, which do not overflow, a
non-finite norm means a non-finite loss or a broken step: there is nothing to skip and go on
from.)

The other syncs of a ZeRO step are settings (trainer/ds_config.py and docs/performance.md):
the throughput timer, bf16's overflow check, and overlap_comm's stream waits.

Only DeepSpeed 0.19.8 is patched (the pinned version, whose code these replacements were
written against), and only while the three functions replaced still have the source they were
written against (REPLACED pins a hash of each); another version, or a patched copy of this one, is
left alone with a one-line warning. tests/trainer/test_sync_free.py pins also where DeepSpeed
calls them, and checks each replacement against the original on a grid of norms.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import sys

import deepspeed
import torch

PATCHED_VERSION = "0.19.8"
# sha256 (its first 16 hex digits) of the source of each function replaced, as
# deepspeed/runtime/utils.py 0.19.8 has it
REPLACED = {
    "mask_nan_or_inf_with_val_inplace": "9728853d4df6cd69",
    "is_invalid_grad_norm": "6afd483e2c88e25e",
    "clip_tensors_by_global_norm": "7acb1d9576311c93",
}
_originals: dict = {}  # DeepSpeed's functions, kept when install() replaces them
_installed = False


def _mask_nan_or_inf_with_val_inplace(input: torch.Tensor, device=None, val: float = -1.0) -> None:
    input.masked_fill_(~torch.isfinite(input), val)  # a Python scalar: no copy to the device


def _is_invalid_grad_norm_on_host(norm) -> bool:
    """A device norm is never read here (the trainer checks it at its next boundary); a host
    number is checked as DeepSpeed does."""
    if torch.is_tensor(norm):
        return False
    return not math.isfinite(float(norm)) or norm < 0


def _clip_tensors_by_global_norm(input_tensors, max_norm=1.0, global_norm=None, mpu=None,
                                 eps=1e-6):
    """DeepSpeed's clip without its host branch (`if clip_coef < 1:` on a device tensor): the same
    coefficient, max_norm / (norm + eps), applied where it is below 1 and 1.0 (an exact no-op)
    elsewhere, decided on the device. So the gradients are bit for bit the original's for every
    norm: the original's own skip (a NaN coefficient) multiplies by 1 here, and the invalid
    marker -1 flips their sign as the original's does (the trainer's check then stops the step's
    run or rolls it back: its weights are never saved)."""
    from deepspeed.runtime.utils import get_global_norm_of_tensors

    if global_norm is None:
        global_norm = get_global_norm_of_tensors(input_tensors, mpu=mpu)
    if not torch.is_tensor(global_norm):  # a host number: the original reads nothing
        return originals()["clip_tensors_by_global_norm"](input_tensors, max_norm, global_norm,
                                                          mpu, eps)
    coefficient = max_norm / (global_norm + eps)
    coefficient = torch.where(coefficient < 1, coefficient, 1.0)
    torch._foreach_mul_([t.detach() for t in input_tensors], coefficient)
    return global_norm


def originals() -> dict:
    """DeepSpeed's own functions that install() replaces (or has replaced), by name."""
    from deepspeed.runtime import utils

    return {name: _originals.get(name, getattr(utils, name)) for name in REPLACED}


def source_hash(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def changed_since_pinned() -> list[str]:
    """The replaced functions whose source is not the one the replacements were written for."""
    return [name for name, function in originals().items()
            if source_hash(function) != REPLACED[name]]


def install() -> None:
    """Makes DeepSpeed's ZeRO optimizer steps sync-free (process-wide, idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    if deepspeed.__version__ != PATCHED_VERSION or changed_since_pinned():
        what = (f"DeepSpeed {deepspeed.__version__} is not {PATCHED_VERSION}"
                if deepspeed.__version__ != PATCHED_VERSION else
                f"DeepSpeed's {', '.join(changed_since_pinned())} changed")
        print(f"warning: {what}, whose optimizer step aogpt makes sync-free: each optimizer step "
              "may wait for the device", file=sys.stderr, flush=True)
        return
    from deepspeed.runtime import bf16_optimizer, utils
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    _originals.update(originals())
    replacements = {
        "mask_nan_or_inf_with_val_inplace": (_mask_nan_or_inf_with_val_inplace,
                                             (utils, stage_1_and_2, stage3, bf16_optimizer)),
        "is_invalid_grad_norm": (_is_invalid_grad_norm_on_host,
                                 (stage_1_and_2, stage3, bf16_optimizer)),
        "clip_tensors_by_global_norm": (_clip_tensors_by_global_norm, (bf16_optimizer,)),
    }
    for name, (function, modules) in replacements.items():
        for module in modules:
            if hasattr(module, name):  # a module that does not import it does not call it
                setattr(module, name, function)
