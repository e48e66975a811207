"""The learning rate of every optimizer step: nanoGPT's schedule, which the paper kept.

Linear warm-up from exactly 0, cosine from the peak down to min_lr at decay_steps, min_lr after.
`step` is the 0-based index of the optimizer update (nanoGPT's iter_num), so the very first
update runs at lr 0 and only moves the AdamW moments.
"""

from __future__ import annotations

import math

from aogpt.trainer.config import OptimConfig


def learning_rate(step: int, optim: OptimConfig) -> float:
    if step < optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    if step > optim.decay_steps:
        return optim.min_lr
    span = optim.decay_steps - optim.warmup_steps
    progress = (step - optim.warmup_steps) / span if span else 1.0
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 -> 0
    return optim.min_lr + cosine * (optim.lr - optim.min_lr)
