"""Adaptive order: the model chooses, call by call, which positions it generates next.

An any-order model scores any position as a target given the known tokens. Masked diffusion
models decode by confidence, margin or entropy (LLaDA, Dream; Kim et al., arXiv 2502.06768: the
top-probability margin takes Sudoku from under 7% to about 90% solved) or reveal every position
above a threshold (Fast-dLLM), but as encoders they re-encode everything at every step or
approximate a cache. On AO-GPT's cache it is exact. With c tokens of the sample's order final
(slot c holds the latest), a call feeds the candidates as copies of slot c's token, each asking
for its own position (engine.py's copy_targets): each row is p(x_t | the c known tokens), exactly
what slot c would compute were t the next position of the order. The planner scores them:

    confidence   the most likely token's probability          highest first
    margin       top-1 minus top-2 probability                  highest first
    entropy      the distribution's entropy                     lowest first
    threshold    every candidate whose top probability reaches the threshold, at least the best

and makes the best `reveal` (or the threshold's) positions the next of the order, each token
drawn from its own row. The chosen first row is slot c with its target decided: its keys and
values are copied into slot c, exactly what one-token-at-a-time decoding along the chosen order
writes, so nothing is recomputed; the others revealed in the same call are fed as real rows by
the next call, whose rows are then their exact conditionals along the order. The planner reads
the revealed tokens only (ties broken by a uniform keyed by the position), so the order a sample
took can be replayed: it is recorded, and each sample's exact log-likelihood along it is summed
from those rows (stats["log_likelihood"]; a last call with no candidates scores the final
reveals). With reveal = 1 each token is drawn from its exact conditional: the log-likelihood is
then that of the sample under the planner's own generative process.

Scoring a text along a planner's order (teacher forcing, generate's forced_tokens): each revealed
position takes the text's token instead of a drawn one. The planner still decides from the
revealed tokens only, so every text has exactly one path and the product of the conditionals
along it is a normalised distribution over texts: the log-likelihood is an exact likelihood (of
the model read in the planner's order), not a bound like the random-order average, whose exp is
an upper bound on the perplexity of the mixture over orders. With reveal = 1 it is exactly the
likelihood of what the planner's sampler draws; with reveal > 1 the sampler draws a call's
positions independently, and the likelihood is that of drawing them one after the other.

Candidates: every remaining position (about n^2 / 2 rows over a generation at reveal 1), or a
budget of the next `candidates` positions of the sample's order (random or left to right), or,
with `block`, the remaining positions of the current block of `block` positions, left to right
block after block (semi-autoregressive). A call costs its candidates' rows.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from aogpt.model.orders import LEFT_TO_RIGHT, Stream
from aogpt.model.sampler.draw import position_uniforms, sample_from_logits
from aogpt.model.sampler.strategy import Decided, Finished, StepOutput, Strategy, bucket

if TYPE_CHECKING:
    from aogpt.model.sampler.config import SamplingConfig
    from aogpt.model.sampler.engine import KVCacheSampler

BEST_KEPT = 16  # candidates of each call a call recorder sees (the best; all would be ~n^2 / 2)

def top_probability(probs: torch.Tensor) -> torch.Tensor:
    """(..., vocab) probabilities -> (...): the most likely token's probability."""
    return probs.amax(dim=-1)


def top_margin(probs: torch.Tensor) -> torch.Tensor:
    """(..., vocab) -> (...): top-1 minus top-2 probability."""
    top = probs.topk(2, dim=-1).values if probs.size(-1) > 1 else torch.cat(
        [probs, torch.zeros_like(probs)], dim=-1)
    return top[..., 0] - top[..., 1]


def negative_entropy(probs: torch.Tensor) -> torch.Tensor:
    """(..., vocab) -> (...): minus the distribution's entropy (nats)."""
    return (probs * probs.clamp(min=1e-30).log()).sum(dim=-1)


class PlannerSampling(Strategy):
    """What every planner shares; each planner is a subclass naming its `score` (how much each
    candidate should come next, (..., vocab) probabilities -> (...), higher first) and, unless it
    reveals config.reveal positions per call, how many it reveals (`reveals`, `per_call`).
    ways.py keys them by name."""

    writes = frozenset({"ordered", "orders", "cache"})  # it decides the order as it goes
    takes_forced = True

    def __init__(self, sampler: KVCacheSampler):
        self.sampler, self.config = sampler, sampler.config
        b, n, device = sampler.batch_size, sampler.seq_len, sampler.device
        state = {"dtype": torch.long, "device": device}
        self.final = torch.zeros(b, **state)  # tokens of the order that are final
        self.fed_from = torch.zeros(b, **state)  # the first slot that is not in the cache
        self.given = torch.zeros(b, **state)  # given tokens (not generated: not scored)
        self.log_likelihood = torch.zeros(b, dtype=torch.float64, device=device)
        self.calls = torch.zeros(b, **state)
        self.tie_breaks = torch.zeros(b, n, dtype=torch.float64, device=device)
        self.forced: torch.Tensor | None = None  # teacher forcing: (b, n) tokens, one generate
        # the last call's best candidates, best first, and their scores (Decided; -1: none)
        kept = min(BEST_KEPT, n)
        self.best_positions = torch.full((b, kept), -1, **state)
        self.best_scores = torch.zeros(b, kept, dtype=torch.float64, device=device)

    @staticmethod
    @abstractmethod
    def score(probs: torch.Tensor) -> torch.Tensor: ...

    def per_call(self) -> int | None:
        """The most positions a call reveals (None: any number)."""
        return self.config.reveal

    def reveals(self, row_score: torch.Tensor, is_candidate: torch.Tensor) -> torch.Tensor:
        """(b,) positions each sample reveals this call (before the cut at its candidates), given
        each candidate row's score (b, targets)."""
        return torch.full_like(is_candidate[:, 0], self.config.reveal, dtype=torch.long)

    @staticmethod
    def order_reading(config: SamplingConfig) -> str:
        # blocks: the tail in position order, so that each block's positions come together
        return LEFT_TO_RIGHT.word if config.block else config.order

    def state(self) -> list[torch.Tensor]:
        return [self.final, self.fed_from, self.log_likelihood, self.calls, self.best_positions,
                self.best_scores]

    def decided(self) -> Decided:
        return Decided(final=self.final, candidates=self.best_positions, scores=self.best_scores)

    def generate(self, sample_ids: torch.Tensor, given_mask: torch.Tensor,
                 on_step: Callable[[StepOutput], None] | None,
                 forced_tokens: torch.Tensor | None = None) -> Finished:
        sampler, config, n = self.sampler, self.config, self.sampler.seq_len
        self.forced = forced_tokens
        self.tie_breaks.copy_(position_uniforms(config, sample_ids, n, Stream.PLAN))
        given = given_mask.sum(dim=1)
        for tensor, value in ((self.final, given), (self.given, given), (self.fed_from, 0),
                              (self.log_likelihood, 0), (self.calls, 0)):
            tensor.copy_(value)
        calls, rows = 0, 0
        while True:
            final, fed_from = self.final.cpu(), self.fed_from.cpu()  # the plan of this call
            left = n - final
            if not (left > 0).any() and not (fed_from < final).any():
                break
            real = int((final - fed_from).max())  # rows re-fed: the last call's later reveals
            width = int(self.candidate_count(final, sampler.orders.cpu()).max())
            shape = (real + width, real + width, n + 1)
            if sampler.bucketed:  # few shapes whatever the state
                shape = (bucket(shape[0], 2 * n), bucket(shape[0], 2 * n), n + 1)
            logits, target_slots, valid = sampler.call(*shape)
            if on_step is not None:
                bounds = torch.stack([fed_from, final, final + left]).to(sampler.device)
                on_step(StepOutput(calls, logits, target_slots, valid, bounds, self.decided()))
            calls, rows = calls + 1, rows + shape[0]
        self.forced = None
        return Finished(calls, rows, self.calls.cpu(),
                        {"log_likelihood": self.log_likelihood.cpu()})

    def candidate_count(self, final: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
        """(b,) candidates each sample scores in its next call (0 when done): the order's next
        positions, all of them, the next `candidates`, or those of the current block (the tail
        is in position order then, so the block's remaining positions come first)."""
        n, config = self.sampler.seq_len, self.config
        left = n - final
        if config.block:
            k = torch.arange(n, device=orders.device)
            first = orders.gather(1, final[:, None].clamp(max=n - 1))  # the lowest remaining
            block_end = (first // config.block + 1) * config.block
            left = ((orders < block_end) & (k >= final[:, None])).sum(dim=1)
        if config.candidates:
            left = left.clamp(max=config.candidates)
        return left

    def score_re_fed_rows(self, logits: torch.Tensor, final: torch.Tensor,
                          fed_from: torch.Tensor, targets: int) -> None:
        """Adds the exact conditionals of the last call's later reveals, re-fed as the rows
        before the candidates (slots fed_from..final-1), to the log-likelihood. The first
        call's real rows are the given tokens: not generated, not scored. There are at most
        reveal - 1 of them (threshold: any number), so only those rows are read."""
        sampler = self.sampler
        per_call = self.per_call()
        count = targets if per_call is None else min(per_call - 1, targets)
        if count == 0:
            return
        row = final - fed_from - count + torch.arange(count, device=sampler.device)  # (b, count)
        slot = fed_from + row
        scored = (row >= 0) & (slot >= self.given[:, None])
        row_logits = logits.gather(1, row.clamp(min=0)[..., None].expand(-1, -1, logits.size(-1)))
        tokens = sampler.ordered.gather(1, slot.clamp(min=0, max=sampler.seq_len - 1))
        logp = row_logits.double().log_softmax(dim=-1).gather(2, tokens[..., None])[..., 0]
        self.log_likelihood += torch.where(scored, logp, 0.0).sum(dim=1)

    def step(self, rows: int, targets: int, keys: int):
        """One call: the re-fed rows' exact conditionals, the candidates' distributions, the
        planner's choice, the chosen tokens, and the order, cache and state moved on."""
        sampler, config, n = self.sampler, self.config, self.sampler.seq_len
        final, fed_from = self.final[:, None], self.fed_from[:, None]  # (b, 1)
        count = self.candidate_count(self.final, sampler.orders)[:, None]  # (b, 1)
        j = torch.arange(targets, device=sampler.device)
        # candidate i: the order's tail position final + i (its priority), a copy of slot final's
        # token asking for that position; the real rows fed_from..final-1 come before them
        tail = sampler.orders.gather(1, (final + j).clamp(max=n - 1))  # (b, targets)
        logits, target_slots, valid = sampler.network(fed_from, fed_from, final, final + count,
                                                      rows, targets, keys, copy_targets=tail)
        # Row r of the call is slot fed_from + r. Past the scores (one softmax per row), only
        # the rows a call draws from or scores are read over the whole vocabulary: copies of
        # every row's logits, in float64 too, made the confidence and margin planners 3-4x
        # slower at GPT-2's vocabulary (benchmarks/sampler_pareto.py, 4 x 128 tokens).
        self.score_re_fed_rows(logits, final, fed_from, targets)

        # the candidates' rows, best first by the planner's score (ties: a uniform per position)
        candidate_row = (final - fed_from + j).clamp(max=targets - 1)  # (b, targets)
        is_candidate = j < count  # (b, targets)
        confidence = logits[..., :sampler.vocab].float().softmax(dim=-1)
        row_score = self.score(confidence).gather(1, candidate_row)
        score = torch.where(is_candidate, row_score.double(), -torch.inf)
        by_tie = self.tie_breaks.gather(1, tail).argsort(dim=1)
        best = by_tie.gather(1, score.gather(1, by_tie).argsort(dim=1, descending=True,
                                                                stable=True))  # (b, targets)
        reveal = torch.minimum(self.reveals(row_score, is_candidate), count[:, 0])  # (b,): 0 when
        # the sample is done
        self.keep_best(tail, score, best)

        # the first `reveal` of `best` (never more than `most`), each token drawn from its own
        # row with its position's uniform
        most = targets if self.per_call() is None else min(self.per_call(), targets)
        positions = tail.gather(1, best[:, :most])
        chosen_rows = (final - fed_from + best[:, :most]).clamp(max=targets - 1)
        chosen_logits = logits.gather(1, chosen_rows[..., None].expand(-1, -1, logits.size(-1)))
        drawn = (sample_from_logits(chosen_logits, config, sampler.uniforms.gather(1, positions))
                 if self.forced is None else self.forced.gather(1, positions))
        first_logp = chosen_logits[:, 0].double().log_softmax(dim=-1)  # the model's own
        self.log_likelihood += torch.where(reveal > 0, first_logp.gather(
            1, drawn[:, :1])[:, 0], 0.0)
        sampler.ordered.scatter_(1, torch.where(j[:most] < reveal[:, None], final + j[:most], n),
                                 drawn)

        # the order's tail: the chosen best first, then the other candidates as they were
        rank = torch.empty_like(best).scatter_(1, best, j.expand_as(best))  # of candidate i
        key = torch.where(rank < reveal[:, None], rank, targets + j)
        arranged = tail.gather(1, key.argsort(dim=1))  # (b, targets): the candidates re-ordered
        k = torch.arange(n, device=sampler.device)
        in_tail = (k >= final) & (k < final + count)
        sampler.orders.copy_(torch.where(in_tail, arranged.gather(
            1, (k - final).clamp(min=0, max=targets - 1)), sampler.orders))

        # the best row is slot `final` of the decided order: its keys and values go there
        done = reveal == 0
        source = torch.where(done, n, self.final + best[:, 0])
        sampler.cache.copy_slot(source, torch.where(done, n, self.final))
        self.calls += ((count[:, 0] > 0) | (self.fed_from < self.final)).long()
        self.fed_from.copy_(torch.where(done, self.final, self.final + 1))
        self.final += reveal
        return logits, target_slots, valid


    def keep_best(self, tail: torch.Tensor, score: torch.Tensor, best: torch.Tensor) -> None:
        """The call's best candidates (b, kept) and their scores, for Decided: two small gathers
        a call, kept whether or not calls are recorded (a graph captured without them would
        replay stale ones)."""
        kept = min(self.best_positions.size(1), best.size(1))
        top = best[:, :kept]
        found = score.gather(1, top)
        self.best_positions[:, :kept].copy_(torch.where(found > -torch.inf, tail.gather(1, top),
                                                        -1))
        self.best_scores[:, :kept].copy_(found)
        self.best_positions[:, kept:].fill_(-1)


class ConfidencePlanner(PlannerSampling):
    """Reveals the config.reveal candidates whose most likely token is likeliest."""

    score = staticmethod(top_probability)


class MarginPlanner(PlannerSampling):
    """Reveals the config.reveal candidates of widest top-1 minus top-2 margin."""

    score = staticmethod(top_margin)


class EntropyPlanner(PlannerSampling):
    """Reveals the config.reveal candidates of lowest entropy."""

    score = staticmethod(negative_entropy)


class ThresholdPlanner(PlannerSampling):
    """Reveals every candidate whose top probability reaches config.threshold, at least the best
    one (Fast-dLLM's rule)."""

    score = staticmethod(top_probability)

    def per_call(self) -> int | None:
        return None

    def reveals(self, row_score: torch.Tensor, is_candidate: torch.Tensor) -> torch.Tensor:
        return ((row_score >= self.config.threshold) & is_candidate).sum(dim=1).clamp(min=1)
