"""A KV-cache sampler stopped in the middle of a generation, and the shape of its next call: what
benchmarks/decode_step.py times and benchmarks/step_anatomy.py counts."""

from __future__ import annotations

import torch

from aogpt.model import AOGPT
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.parallel import WHOLE_CACHE_ROWS
from aogpt.model.sampler.strategy import bucket, bucket_keys


def sampler_at_step(model: AOGPT, batch: int, seq_len: int, known: int, targets: int,
                    compiled: bool, graphs: bool) -> KVCacheSampler:
    """A sampler whose state is that of a generation with `known` tokens revealed, all samples
    alike: the step's inputs are the same, whatever their values."""
    b, n, c, r = batch, seq_len, known, targets
    sampler = KVCacheSampler(model, b, n, SamplingConfig(steps=n, seed=0), cuda_graphs=graphs,
                             compile=compiled)
    generator = torch.Generator().manual_seed(0)
    sampler.orders.copy_(torch.stack([torch.randperm(n, generator=generator) for _ in range(b)]))
    sampler.ordered[:, :n].copy_(torch.randint(0, 50257, (b, n), generator=generator))
    sampler.uniforms.copy_(torch.rand(b, n, generator=generator, dtype=torch.float64))
    sampler.strategy.bounds.copy_(torch.tensor([[c], [c], [c + r]]).expand(3, b))  # lo, c, hi
    return sampler


def step_shape(seq_len: int, known: int, targets: int, on_gpu: bool) -> tuple[int, int, int]:
    """(rows, targets, keys) as the sampler's bucketed plan gives them on a GPU or a CPU
    (model/sampler/parallel.py)."""
    rows = max(targets, 1)
    keys = bucket_keys(known + rows, seq_len)
    if not on_gpu and rows <= WHOLE_CACHE_ROWS:
        keys = seq_len + 1
    return bucket(rows, seq_len), bucket(targets, seq_len), keys
