"""The paper's sampler: S network calls, each revealing several positions independently.

Each sample reveals N_i tokens after step i = 1..S (N_0 = the given count, N_S = n): the
schedule (linear or cosine) fixes the fraction revealed, the counts are the paper's
deterministic ones (at least one per step) or exact Binomial ones (Lemma 1). A step with
c = N_{i-1} known feeds the real slots not yet cached and, as targets, slot c and the copies
c+1..N_i - 1 (engine.py's parallel generation mask): every target is drawn given the c known
tokens only, independently of the others. S = n is exact ancestral sampling; S < n departs from
the model's joint as the tokens revealed together depend on each other.

Everything is planned on the host before the first call (plan_steps), so a call never waits on
the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aogpt.model.orders import Stream, counter_uniform
from aogpt.model.sampler.draw import sample_from_logits
from aogpt.model.sampler.strategy import (
    CacheLayout,
    Decided,
    Finished,
    StepOutput,
    Strategy,
    bucket,
    bucket_keys,
)

if TYPE_CHECKING:
    from aogpt.model.sampler.config import SamplingConfig
    from aogpt.model.sampler.engine import KVCacheSampler

# On a CPU, calls of up to this many rows attend to the whole cache (plan_steps). Small model,
# bf16, batch 4, n = 1024 on a 2-core AVX512-BF16 EPYC: generation at S = 1024 (1 row a call)
# 36.9 -> 27.7 s, S = 256 (~8 rows) 11.9 -> 11.3 s, S = 128 (~16) 9.4 -> 9.1 s; at S = 64 (~32)
# the whole cache is slower (6.5 -> 7.9 s).
WHOLE_CACHE_ROWS = 16


def revealed_fraction(schedule: str, steps: int) -> torch.Tensor:
    """(steps + 1,) float64: the fraction of masked tokens revealed after each step, 0 ... 1."""
    t = torch.arange(steps + 1, dtype=torch.float64) / steps
    fraction = t if schedule == "linear" else 1 - torch.cos(t * math.pi / 2)
    fraction[-1] = 1.0  # cos(pi/2) is not exactly 0 in floating point
    return fraction


def reveal_counts(config: SamplingConfig, given: torch.Tensor, seq_len: int,
                  sample_ids: torch.Tensor) -> torch.Tensor:
    """(b, steps + 1) int64 on the CPU: N_i, the tokens known after step i (N_0 = given count).

    given (b,): positions given per sample. "deterministic" reveals floor(fraction * masked) but at
    least one more token per step while any is masked; "binomial" draws each masked token's
    reveal independently (the counts are then Binomial, and a step may reveal none).
    """
    given, sample_ids = given.cpu(), sample_ids.cpu()
    masked = (seq_len - given)[:, None]  # (b, 1)
    fraction = revealed_fraction(config.schedule, config.steps)
    if config.counts == "deterministic":
        base = torch.floor(masked * fraction + 1e-9).long()  # exact for linear fractions i/S
        steps = torch.arange(config.steps + 1)
        revealed = (base - steps).cummax(dim=1).values + steps  # N_i >= N_{i-1} + 1
    else:
        # a token is revealed by step i iff its uniform u <= fraction_i: count them per step
        positions = torch.arange(seq_len)
        u = counter_uniform(config.seed, sample_ids[:, None], Stream.REVEAL, positions)
        u = torch.where(positions < masked, u, 2.0).sort(dim=1).values
        revealed = torch.searchsorted(u, fraction.expand(len(u), -1).contiguous(), right=True)
    return (given[:, None] + revealed.clamp(max=masked)).long()


@dataclass
class StepPlan:
    """The network calls of one generation. bounds (calls, 3, b): lo, c, hi per sample (the rows
    fed are slots lo..max(hi, c+1)-1, the targets slots c..hi-1); shapes: (rows, targets, keys)
    per call, after bucketing."""

    bounds: torch.Tensor
    shapes: list[tuple[int, int, int]]


def plan_steps(counts: torch.Tensor, seq_len: int, bucketed: bool,
               whole_cache: bool = False) -> StepPlan:
    """Turns the reveal counts (b, S+1) into network calls, skipping steps that reveal nothing.

    bucketed: round the shapes up (strategy.py's bucket and bucket_keys) so that few distinct
    shapes occur, one CUDA graph each. whole_cache: a call of at most
    WHOLE_CACHE_ROWS rows attends to all seq_len + 1 slots (those it may not see are masked): a
    CPU's bf16 matmul copies a strided slice of the cache first, which costs a few-row call more
    than the masked slots do.
    """
    known, reveal = counts[:, :-1].T, counts[:, 1:].T  # (S, b): c and hi of every step
    active = (reveal > known).any(dim=1)
    c, hi = known[active], reveal[active]
    # real rows up to c are in the cache after a call; a sample that revealed nothing at the
    # last call still needs row c again (as a query) when its targets come
    fed = torch.cat([torch.zeros_like(c[:1]), c[:-1] + 1])
    lo = torch.minimum(fed, c)
    end = torch.maximum(hi, c + 1).clamp(max=seq_len)
    rows = (end - lo).amax(dim=1).tolist()
    targets = (hi - c).amax(dim=1).tolist()
    keys = end.amax(dim=1).tolist()
    if bucketed:
        rows = [bucket(r, seq_len) for r in rows]
        targets = [bucket(r, seq_len) for r in targets]
        keys = [bucket_keys(k, seq_len) for k in keys]
    if whole_cache:
        keys = [seq_len + 1 if r <= WHOLE_CACHE_ROWS else k
                for r, k in zip(rows, keys, strict=True)]
    return StepPlan(torch.stack([lo, c, hi], dim=1), list(zip(rows, targets, keys, strict=True)))


class ParallelSampling(Strategy):
    """The paper's S-step sampler on the engine's cache (ways.py's "parallel")."""

    def __init__(self, sampler: KVCacheSampler):
        self.sampler, self.config = sampler, sampler.config
        self.bounds = torch.zeros(3, sampler.batch_size, dtype=torch.long, device=sampler.device)

    def state(self) -> list[torch.Tensor]:
        return []  # a call changes only the engine's `ordered` (and the cache)

    def decided(self) -> Decided:
        return Decided(final=self.bounds[2])  # a call makes its targets c..hi-1 final

    def cache_layout(self) -> CacheLayout:
        # a CPU's calls of more than WHOLE_CACHE_ROWS rows (about 2 n / S per sample) attend to a
        # slice of the cache, where keys stored last save a copy (small, batch 4, n = 1024: S = 64
        # 9.3 -> 9.0 s); calls of fewer attend to all of it, where they cost (S = 1024: 42 -> 47 s)
        sampler = self.sampler
        return CacheLayout(keys_last=sampler.device.type == "cpu"
                           and 2 * sampler.seq_len > WHOLE_CACHE_ROWS * self.config.steps)

    def generate(self, sample_ids: torch.Tensor, given_mask: torch.Tensor,
                 on_step: Callable[[StepOutput], None] | None,
                 forced_tokens: torch.Tensor | None = None) -> Finished:
        sampler, n = self.sampler, self.sampler.seq_len
        counts = reveal_counts(self.config, given_mask.sum(dim=1), n, sample_ids)
        plan = plan_steps(counts, n, bucketed=sampler.bucketed,
                          whole_cache=sampler.device.type == "cpu")
        bounds = plan.bounds.to(sampler.device)
        for call, shape in enumerate(plan.shapes):
            self.bounds.copy_(bounds[call])
            logits, target_slots, valid = sampler.call(*shape)
            if on_step is not None:
                on_step(StepOutput(call, logits, target_slots, valid, self.bounds,
                                   self.decided()))
        lo, c, hi = plan.bounds.unbind(dim=1)
        return Finished(len(plan.shapes), sum(r for r, _, _ in plan.shapes), (hi > c).sum(dim=0))

    def step(self, rows: int, targets: int, keys: int):
        """One call on the planned bounds: draws every target of this step into the engine's
        `ordered`, each from its own row's distribution."""
        sampler, n = self.sampler, self.sampler.seq_len
        lo, c, hi = self.bounds[0, :, None], self.bounds[1, :, None], self.bounds[2, :, None]
        logits, target_slots, valid = sampler.network(lo, c, c, hi, rows, targets, keys)
        drawn_positions = sampler.orders.gather(1, target_slots.clamp(max=n - 1))
        drawn = sample_from_logits(logits, self.config, sampler.uniforms.gather(1, drawn_positions))
        sampler.ordered.scatter_(1, torch.where(valid, target_slots, n), drawn)
        return logits, target_slots, valid
