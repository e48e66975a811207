"""What a generation returns, and what each of its network calls shows a caller (on_step)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Generation:
    tokens: torch.Tensor  # (b, n) int64, at their original positions
    orders: torch.Tensor  # (b, n) int64, the order each sample was generated in
    network_calls: int  # calls the batch made
    rows: int  # token rows per sequence pushed through the network (padding included)
    # (b,) int64: the calls each sample needed (a batch runs until its last sample is done)
    sample_calls: torch.Tensor | None = None
    # speculative: (b,) int64 drafts verified and accepted per sample
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class StepOutput:
    """Handed to generate's on_step after every call; tensors may be reused by the next call."""

    call: int
    logits: torch.Tensor  # (b, r, vocab) float, the unfiltered logits of the targets
    target_slots: torch.Tensor  # (b, r): targets are orders[:, slot]; slot >= hi is padding
    valid: torch.Tensor  # (b, r) bool
    bounds: torch.Tensor  # (3, b): lo, c, hi of this call
