"""Causal self-attention kernels: flash-attn, PyTorch SDPA, and an explicit reference.

All take q, k, v as (b, h, s, hd) and return (b, h, s_q, hd). Without a mask the attention is
causal (slot i sees slots 0..i); with a boolean mask (True = may attend, broadcastable to
(b, h, s_q, s_k)) it is whatever the mask says, which the KV-cache sampler uses for its
"parallel generation" steps; mask=BIDIRECTIONAL lets every slot see every slot (an encoder's
attention, run by the kernels' unmasked paths). A mask may also come as the additive bias
attention_bias makes of it, once for all layers of a network call (SDPA would convert a boolean
mask in every layer). Attention dropout is always 0, as in the paper.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from aogpt import UsageError

try:
    from flash_attn import flash_attn_func
except ImportError:  # not installed, or built for another torch/CUDA
    flash_attn_func = None

BACKENDS = ("auto", "sdpa", "flash_attn", "math")
BIDIRECTIONAL = "bidirectional"  # the `mask` of full attention, for which no mask tensor is made


class KVCache(Protocol):
    """What attention needs from a KV cache (the sampler implements it).

    update(layer, k, v) stores the new keys/values (b, h, s_new, hd) of that layer and returns
    all keys/values the new queries may see, (b, h, s_k, hd), with an explicit mask to match.
    """

    def update(self, layer: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ...


@functools.cache
def _flash_capable(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def flash_attn_supported(device: torch.device) -> bool:
    """flash-attn is installed and this is a CUDA device it has kernels for (sm80+)."""
    return flash_attn_func is not None and device.type == "cuda" and _flash_capable(device)


def check_backend(attn_impl: str) -> None:
    """Rejects an attn_impl that can never run in this process."""
    if attn_impl not in BACKENDS:
        raise UsageError(f"model.attn_impl={attn_impl!r} is unknown: "
                         f"use one of {', '.join(BACKENDS)}")
    if attn_impl == "flash_attn" and flash_attn_func is None:
        raise UsageError(
            "model.attn_impl=flash_attn but flash-attn is not installed: "
            "pip install flash-attn (CUDA, sm80+), or set model.attn_impl=auto"
        )


@dataclass(frozen=True)
class AttentionKernel:
    """The kernel attention runs for a setting on a device, decided once, when the model is
    built or moved (AOGPT._apply): a compiled graph cannot ask the device what it supports."""

    name: str  # "flash_attn", "sdpa" or "math"
    strict: bool = False  # asked for by name (model.attn_impl=flash_attn): no quiet fallback
    unavailable: str = ""  # why flash-attn cannot run on this device ("" = it can)


def attention_kernel(attn_impl: str, device: torch.device) -> AttentionKernel:
    """auto: flash-attn where it runs (sm80+ with flash-attn installed), else SDPA."""
    supported = flash_attn_supported(device)
    if attn_impl == "auto":
        return AttentionKernel("flash_attn" if supported else "sdpa")
    if attn_impl == "flash_attn" and not supported:
        return AttentionKernel(attn_impl, strict=True, unavailable=(
            f"the device {device} is not a CUDA GPU of compute capability 8.0+"))
    return AttentionKernel(attn_impl, strict=attn_impl == "flash_attn")


def resolve_backend(attn_impl: str, device: torch.device) -> str:
    """The kernel that causal training attention uses for this setting on this device."""
    return attention_kernel(attn_impl, device).name


def attention_bias(mask: torch.Tensor | str | None, x: torch.Tensor) -> torch.Tensor | str | None:
    """A boolean mask as the additive bias SDPA makes of it (0 where True, -inf where False), in
    the dtype attention runs in for activations x (autocast's, if on); anything else unchanged."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return mask
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    return torch.zeros(mask.shape, dtype=dtype,
                       device=mask.device).masked_fill_(~mask, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: AttentionKernel | str,
           mask: torch.Tensor | str | None = None) -> torch.Tensor:
    """Scaled dot-product attention with the chosen kernel (an AttentionKernel, or a setting
    decided here for q's device); causal when mask is None."""
    if isinstance(kernel, str):
        kernel = attention_kernel(kernel, q.device)
    backend = kernel.name
    if backend == "flash_attn":
        why_not = kernel.unavailable or _flash_attn_obstacle(q, mask)
        if why_not and kernel.strict:
            raise UsageError(f"model.attn_impl=flash_attn cannot run: {why_not}; "
                             "or set model.attn_impl=auto")
        if why_not:  # auto: flash-attn has no fp32 or masked kernel, SDPA has
            backend = "sdpa"
    causal = mask is None
    if backend == "flash_attn":
        # flash-attn wants (b, s, h, hd); these transposes are views of the projection output
        y = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        return y.transpose(1, 2)
    if backend == "sdpa":
        if causal or mask is BIDIRECTIONAL:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if not (q.device.type == "cpu" and q.dtype == torch.bfloat16):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # torch's CPU kernel takes ~7x the plain computation for a masked bf16 query row (1.35
        # vs 0.19 ms a layer at batch 4 and 640 keys on an AVX512-BF16 EPYC; the small model's
        # decode step: 37.9 -> 33.5 ms)
    if mask is BIDIRECTIONAL:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device)
    return math_attention(q, k, v, mask)


def _flash_attn_obstacle(q: torch.Tensor, mask: torch.Tensor | None) -> str:
    """Why flash-attn's kernel cannot compute this attention ("" when it can), on a device it
    runs on."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"activations are {q.dtype}, it needs bf16/fp16: use bf16 autocast"
    if mask is not None and mask is not BIDIRECTIONAL:
        return "it computes only causal or full attention, not an explicit mask"
    return ""


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """The textbook computation, softmax in fp32: the reference the kernels are tested against.
    mask: boolean (True = may attend) or an additive bias (attention_bias)."""
    s_q, s_k = q.size(-2), k.size(-2)
    if mask is None:
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.size(-1))  # (b, h, s_q, s_k)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores.softmax(dim=-1).to(v.dtype) @ v
