"""Training orders that follow the planner (order.kind=planner), and every other kind's.

A planner (model/sampler/planners.py) decodes by choosing the next position from the model's own
distributions: the most confident, the widest margin, the least entropy. Trained on uniformly
random orders, a network spends most of its capacity on orders that no planner takes. PUMA (arXiv
2602.10314) trains a masked diffusion model on the masks its confidence unmasking produces and
reaches the same loss about 2.5x sooner; here AO-GPT gets the same alignment exactly: a sequence's
training order is the order the planner takes on that sequence given the current weights.

The sampler makes it: KVCacheSampler.generate with forced_tokens decodes the sequence with each
revealed position taking the sequence's own token (teacher forcing), so the planner chooses from
the model's distributions given the sequence's true tokens so far, and the order it took
(Generation.orders) is the training order. That is a no-grad pass of about n^2 / 2 rows per
sequence (n calls, each scoring every remaining position), batched over a micro-batch's planned
sequences; order.refresh = R reveals R positions per call (the R best), about R times cheaper.
Its cost is measured and logged: `planner_s` (seconds per optimizer step), `planner_rows`
(network rows per planned sequence; a training forward feeds n) and `planned_share`.

With probability order.p_planner a sequence takes the planner's order, else a uniformly random one
(OrderSampler's draw for order.kind=planner). A planned sequence has a uniform number of
positions in order.planner_givens = [min, max] given first: the first ones of its random order,
read in position order, as the sampler reads a prompt or a puzzle's clues; the planner orders
the rest (a batch's calls follow its sample with the fewest given, so a narrow range wastes
fewer rows).

Deterministic and resumable: the coin, the number given and the planner's tie breaks come from
counter_hash(seed, step, sample index, stream) (model/orders.py), and the planner reads the
weights at that step, which a resumed run restores; each rank plans the sequences of its own
micro-batches, identical on every rank, so the order of a sample does not depend on the rank
it lands on. The weights must be whole on every rank (ZeRO stage 0, 1 or 2, not 3).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aogpt import UsageError
from aogpt.model.gpt import AOGPT
from aogpt.model.orders import (
    ORDER_KINDS,
    OrderConfig,
    OrderSampler,
    Stream,
    counter_hash,
    counter_uniform,
    unshuffle,
)
from aogpt.model.sampler import KVCacheSampler, SamplingConfig


@dataclass
class PlannerCost:
    """What the planner passes cost since the last report."""

    seconds: float = 0.0
    sequences: int = 0  # sequences planned
    drawn: int = 0  # sequences whose order was drawn, planned or not
    rows: int = 0  # network rows fed, over all planned sequences

    def report(self, steps: int) -> dict[str, float]:
        """The metrics over the last `steps` optimizer steps, and a fresh count."""
        metrics = {"planner_s": self.seconds / max(steps, 1),
                   "planner_rows": self.rows / self.sequences if self.sequences else 0.0,
                   "planned_share": self.sequences / self.drawn if self.drawn else 0.0}
        self.seconds, self.sequences, self.drawn, self.rows = 0.0, 0, 0, 0
        return metrics


class TrainingOrders:
    """The orders of training's micro-batches: orders, is_l2r = orders(step, sample_indices,
    tokens). OrderSampler's draw, and for order.kind=planner a share replaced by the planner's
    order on each sequence's tokens, given `model` (the module being trained)."""

    def __init__(self, config: OrderConfig, seq_len: int, seed: int, model: AOGPT | None = None,
                 planner_model: Callable[[int], AOGPT] | None = None):
        """planner_model(step): the network the planner runs on at `step` where it is not
        `model` itself (order.planner_weights=ema: a copy of the EMA's weights, made on every
        rank at each step's first call, whether or not that rank plans then)."""
        self.config, self.seq_len, self.seed = config, seq_len, seed
        self.draw = OrderSampler(config, seq_len, seed)
        self.model = model if ORDER_KINDS[config.kind].planned else None
        self.planner_model = planner_model
        self.cost = PlannerCost()
        self.eager = contextlib.nullcontext  # the planner pass's compile stance (compile())
        if ORDER_KINDS[config.kind].planned:
            if model is None:
                raise ValueError(f"order.kind={config.kind} plans with the model: pass it")
            if planner_model is None and any(p.numel() == 0 for p in model.parameters()):
                raise UsageError(f"order.kind={config.kind} runs the planner on each rank's "
                                 "whole weights, which ZeRO-3 partitions: use ZeRO stage 1 or "
                                 "2 (e.g. --ds_config ds_configs/zero2.json)")

    @property
    def planned(self) -> bool:
        return self.model is not None

    def compile(self) -> None:
        """The draw compiled; the planner pass stays eager (its calls change shape every call,
        and teacher forcing runs eagerly), even through the network's compiled blocks."""
        self.draw.compile()
        if self.planned:
            self.eager = lambda: torch.compiler.set_stance("force_eager")

    def __call__(self, step: int, sample_indices: torch.Tensor, tokens: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(b,) global sample indices and their tokens (b, n) -> orders (b, n) int64 and is_l2r
        (b,) bool, on the indices' device. Without a model (or tokens), OrderSampler's draw."""
        orders, is_l2r = self.draw(step, sample_indices)
        if not self.planned or tokens is None:
            return orders, is_l2r
        self.cost.drawn += len(sample_indices)
        start = time.perf_counter()
        model = self.model if self.planner_model is None else self.planner_model(step)
        self.cost.seconds += time.perf_counter() - start  # the copy of the EMA's weights
        coin = counter_uniform(self.seed, step, sample_indices.to(torch.int64), Stream.PLANNED)
        rows = (coin < self.config.p_planner).nonzero()[:, 0]  # reads the device: planned ones
        if len(rows):
            start = time.perf_counter()
            orders[rows] = self.plan(model, step, sample_indices[rows], tokens[rows].long(),
                                     orders[rows])
            self.cost.seconds += time.perf_counter() - start  # the pass ends reading the device
            self.cost.sequences += len(rows)
        return orders, is_l2r

    @torch.no_grad()
    def plan(self, model: AOGPT, step: int, sample_indices: torch.Tensor, tokens: torch.Tensor,
             random_orders: torch.Tensor) -> torch.Tensor:
        """The planner's orders (p, n) on tokens (p, n), given `model`: the first `given`
        positions of each random order given (in position order), the rest in the order the
        planner reveals the sequence's own tokens in."""
        c, n = self.config, self.seq_len
        ids = sample_indices.to(torch.int64)
        low, high = c.planner_givens
        given = low + (counter_uniform(self.seed, step, ids, Stream.GIVEN)
                       * (high - low + 1)).long()  # (p,) uniform in low..high
        k = torch.arange(n, device=tokens.device)
        given_mask = unshuffle(k < given[:, None], random_orders)  # (p, n) at positions
        config = SamplingConfig(planner=c.planner, reveal=c.refresh, seed=self.seed)
        was_training = model.training
        model.eval()
        try:
            with self.eager():
                sampler = KVCacheSampler(model, len(ids), n, config, cuda_graphs=False,
                                         compile=False)
                out = sampler.generate(counter_hash(self.seed, step, ids, Stream.PLANNER_SAMPLE),
                                       tokens, given_mask, forced_tokens=tokens)
        finally:
            model.train(was_training)
        self.cost.rows += out.rows * len(ids)
        return out.orders.to(random_orders.device)
