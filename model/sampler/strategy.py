"""What a way of choosing tokens is to the engine: the Strategy protocol, what a generation
returns to the engine (Finished), and the call shapes every strategy buckets alike.

The engine (engine.py) owns the order, the cache and the network call; a strategy decides which
slots each call feeds and reads, draws or accepts their tokens, and says when it is done. It is
built once per KVCacheSampler, `strategy(sampler)`, and the engine then calls

    generate(sample_ids, given_mask, on_step, forced_tokens)   once per batch, on the host: plans
                                                                 and makes the calls
    step(rows, targets, keys)                                  inside generate, through
                                                                 sampler.call: one network call
                                                                 and its draws, on the device
                                                                 only (compiled, captured as a
                                                                 CUDA graph and replayed)

Who writes what. The engine fills `orders` (each sample's order, drawn up front), `ordered` (the
given tokens in order) and `uniforms` (each position's Stream.TOKEN uniform) before generate; a
strategy reads them. Its step then writes, in place:
  - `ordered`: the tokens of the slots it decides (drafts too), nowhere else;
  - the cache: through sampler.network (each fed row's keys and values in its slot);
  - the engine tensors it names in `writes` besides: the planner's `orders` (it decides the order
    as it goes) and `cache` (it copies the chosen row's keys and values into its slot);
  - its own tensors, which `state()` lists (those a call changes).
Nothing else: a CUDA graph's warm-up run is undone by restoring exactly these (engine._snapshot),
and tests/model/test_ways.py checks that a call changes no engine tensor it did not
declare. `uniforms` belong to the engine: a strategy that needs other streams keeps its own.

Two seams a strategy may use besides:
  - a draft tree (--tree C, an option of the speculative way; speculative.py) feeds rows the mask
    cannot describe (a candidate must not see the other candidates of its position): its step
    lays out the engine's rows (sampler.lay_out), extends them with its own (Rows.extended) and
    feeds them all in one call with sampler.feed, the engine's call below sampler.network; the
    slots its candidates write besides the order's come from CacheLayout.scratch (the cache grows
    by that many slots after the trash slot).
  - call recording (generate's record_calls, recording.py: per call, the positions made final,
    the drafts and their fate, a planner's candidates and scores) reads what a step decided from
    tensors the strategy keeps (Decided: written in place by step, so a replayed CUDA graph
    refreshes them too), handed on in the StepOutput each generate gives on_step after every call.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch

if TYPE_CHECKING:
    from aogpt.model.sampler.config import SamplingConfig

KEY_BLOCK = 128  # CUDA graphs attend over a multiple of this many cache slots
# the engine tensors a strategy's step may write (see above)
ENGINE_STATE = frozenset({"ordered", "orders", "cache"})


def bucket(size: int, cap: int) -> int:
    """A call's rows or targets rounded up to a power of two (at most cap), so that a compiled or
    captured sampler meets few call shapes, one graph each."""
    return min(1 << (max(size, 1) - 1).bit_length(), cap)


def bucket_keys(keys: int, seq_len: int) -> int:
    """Cache slots attended, rounded up to a multiple of KEY_BLOCK (at most seq_len)."""
    return min(-(-keys // KEY_BLOCK) * KEY_BLOCK, seq_len)


@dataclass
class Decided:
    """Where a strategy's calls have brought each sample, as it keeps it on the device (views of
    its state, written in place by step, so that a replayed CUDA graph refreshes them too). Read
    after each call by a call recorder (recording.py), which tells from two of them what the call
    did; None where a strategy keeps no such thing.

        final       (b,) entries of the order that are final (`ordered` holds their tokens)
        pending     (b,) drafts pending after them, in the next entries' slots of `ordered`
        accepted    (b,) drafts accepted so far; decided (b,) drafts accepted or rejected so far
        candidates  (b, k) the last call's best candidate positions, best first (-1: none), and
        scores      (b, k) their scores (the planner's rule: higher first)
    """

    final: torch.Tensor
    pending: torch.Tensor | None = None
    accepted: torch.Tensor | None = None
    decided: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    scores: torch.Tensor | None = None


@dataclass
class StepOutput:
    """Handed to generate's on_step after every call; tensors may be reused by the next call."""

    call: int
    logits: torch.Tensor  # (b, r, vocab) float, the unfiltered logits of the targets
    target_slots: torch.Tensor  # (b, r): targets are orders[:, slot]; slot >= hi is padding
    valid: torch.Tensor  # (b, r) bool
    bounds: torch.Tensor  # (3, b): lo, c, hi of this call
    decided: Decided  # where the calls so far have brought each sample


@dataclass
class Finished:
    """What a strategy's generate returns: the calls the batch made, the rows per sequence they
    fed (padding included), each sample's own calls (b,) and stats of each sample ((b,) tensors:
    a planner's log_likelihood, speculative drafts decided and accepted)."""

    network_calls: int
    rows: int
    sample_calls: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheLayout:
    """How a strategy wants the static cache: keys stored transposed (keys_last, see cache.py),
    and scratch slots after the trash slot for rows outside the order (a draft tree's
    candidates)."""

    keys_last: bool = False
    scratch: int = 0


class Strategy(Protocol):
    """A way of choosing tokens on the engine's cache (the rules above), built as
    `Strategy(sampler)` with the KVCacheSampler it works for. Strategies subclass it, inheriting
    the defaults of the optional members; ways.py refuses at import a class that does not, or
    that leaves an abstract member undefined."""

    # engine tensors its step writes besides `ordered` (ENGINE_STATE)
    writes: ClassVar[frozenset[str]] = frozenset({"ordered"})
    # generate takes forced tokens (teacher forcing: each revealed position takes the given
    # text's token instead of a drawn one), eager calls only
    takes_forced: ClassVar[bool] = False

    @abstractmethod
    def generate(self, sample_ids: torch.Tensor, given_mask: torch.Tensor,
                 on_step: Callable[[StepOutput], None] | None,
                 forced_tokens: torch.Tensor | None) -> Finished:
        """Makes every call of one batch (sample_ids (b,), given_mask (b, n) on the device;
        forced_tokens (b, n) only where takes_forced), calling on_step after each."""

    @abstractmethod
    def step(self, rows: int, targets: int, keys: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One call of this shape: network's logits, target slots and valid mask, after drawing
        or accepting the tokens and moving the state on (device work only: no host reads)."""

    @abstractmethod
    def state(self) -> list[torch.Tensor]:
        """Its own tensors a call changes (restored after a CUDA graph's warm-up run)."""

    @abstractmethod
    def decided(self) -> Decided:
        """Where the calls so far have brought each sample (what generate hands on_step)."""

    def cache_layout(self) -> CacheLayout:
        return CacheLayout()

    @staticmethod
    def order_reading(config: SamplingConfig) -> str:
        """The reading (model/orders.py word) that orders the positions not given before the
        first call: config.order unless the strategy needs another."""
        return config.order
