"""Per-token cross-entropy without the full logits tensor.

A batch of 16 x 1024 tokens over the 50304-word vocabulary has 824M logits: 3.3 GB in fp32,
several times that once log-softmax and gradients join. Here the logits are made chunk by chunk
from the final hidden states, scored in fp32, and each chunk runs under activation
checkpointing, so no chunk's logits outlive its own forward or backward. The price is one extra
lm_head matmul in the backward pass (measured in benchmarks/model_throughput.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _chunk_nll(lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(lm_head(hidden).float(), targets, reduction="none")


def token_nll(hidden: torch.Tensor, lm_head: nn.Module, targets: torch.Tensor,
              chunk_size: int) -> torch.Tensor:
    """-log p(targets) per token, fp32, shaped like targets; hidden is (*targets.shape, d).

    chunk_size = 0 computes all logits at once (the straightforward path, kept as the baseline).
    """
    flat_hidden = hidden.reshape(-1, hidden.size(-1))  # (b*t, d)
    flat_targets = targets.reshape(-1)
    if chunk_size == 0:
        return _chunk_nll(lm_head, flat_hidden, flat_targets).view_as(targets)
    recompute = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    pieces = [
        checkpoint(_chunk_nll, lm_head, h, t, use_reentrant=False) if recompute
        else _chunk_nll(lm_head, h, t)
        for h, t in zip(flat_hidden.split(chunk_size), flat_targets.split(chunk_size), strict=True)
    ]
    return torch.cat(pieces).view_as(targets)
