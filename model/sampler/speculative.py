"""Any-subset speculative decoding on the KV cache: exactly the joint of one token per call
(ancestral sampling along each sample's order), in fewer calls.

An any-order model gives, in one call, the distribution of any position given the known tokens:
a draft of several positions at once. Guo & Ermon (arXiv 2504.20456) verify such drafts along
the order in one causal pass and accept them with the speculative sampling rule, so that the
output is distributed exactly as one-token-at-a-time sampling. On AO-GPT's cache both halves are
one call. With A tokens of a sample's order final and drafts d pending at σ_A..σ_{A+P-1}, each
drawn from a proposal p (a distribution the model gave for that position in an earlier call),
a call feeds slot A (holding the last final token) and the drafts as real rows, causally, and
`draft` copies after them (engine.py):

    row A+j, j < P     q_j = p(x[σ_{A+j}] | final tokens, d_A..d_{A+j-1})   verifies d_{A+j}
    row A+P            the distribution of x[σ_{A+P}] given all of them      a new draft
    copies             the next `draft` positions given all of them           new drafts

d_{A+j} is accepted while u_j p_j(d) < q_j(d) (with probability min(1, q/p)); the first one
rejected is redrawn from the residual max(q_j - p_j, 0), normalised, and is final. If all P are
accepted, row A+P saw only final tokens: its draw is exact, and final too. Every call therefore
makes at least one token final and at most P + 1 <= draft + 1.

Why it is exact: the speculative sampling lemma makes a position's final token distributed as
q given the final tokens before it, whatever its proposal p was, as long as the draw of the
draft and of its acceptance used uniforms nothing else had looked at. So the drafts after a
rejected one, though conditioned on the rejected token, are still valid proposals: they stay
pending (at most `draft`) and are verified in the next call instead of being thrown away. A
draft's uniforms (Stream.TOKEN to draw it, so that a draft from an exact row is the token of
one-token-at-a-time sampling; Stream.ACCEPT; Stream.RESIDUAL) are keyed by (seed, sample id,
position) and read once, when the position becomes final. Temperature, top-k and top-p shape p
and q alike (token_probs), so the output is the one-token-at-a-time sampler with those settings.

The cache: slots up to the last final token hold exactly what one-token-at-a-time decoding
writes (the same tokens, positions and targets); the next call feeds from the first slot that
does not. Every call has the same shape (2 draft + 1 rows, the whole cache as keys), the first
one excepted when a prompt is longer than `draft`: on a GPU that is one CUDA graph. The host
reads one flag per call, whether every sample is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from aogpt.model.orders import Stream
from aogpt.model.sampler.draw import inverse_cdf, position_uniforms, token_probs
from aogpt.model.sampler.strategy import Decided, Finished, StepOutput, Strategy, bucket

if TYPE_CHECKING:
    from aogpt.model.sampler.engine import KVCacheSampler


def residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """What a rejected draft's position is redrawn from: max(q - p, 0), (..., vocab), unnormalised
    (inverse_cdf normalises). A rejection (q(d) < p(d)) leaves mass where q > p, unless both sums
    round below it: then q itself."""
    excess = (q - p).clamp(min=0)
    return torch.where(excess.sum(dim=-1, keepdim=True) > 0, excess, q)


class SpeculativeSampling(Strategy):
    """ways.py's "speculative": drafts config.draft positions ahead per call."""

    def __init__(self, sampler: KVCacheSampler):
        self.sampler, self.config = sampler, sampler.config
        b, n, device = sampler.batch_size, sampler.seq_len, sampler.device
        self.window = self.config.draft  # drafts pending at most
        state = {"dtype": torch.long, "device": device}
        self.final = torch.zeros(b, **state)  # A: tokens of the order that are final
        self.pending = torch.zeros(b, **state)  # P: drafts after them
        self.fed_from = torch.zeros(b, **state)  # the first slot that is not in the cache
        self.draft_probs = torch.zeros(b, self.window, sampler.vocab, device=device)  # p of each
        self.accept_uniforms = torch.zeros(b, n, dtype=torch.float64, device=device)
        self.residual_uniforms = torch.zeros(b, n, dtype=torch.float64, device=device)
        # per sample: calls it took part in, drafts decided, drafts accepted
        self.counters = torch.zeros(3, b, **state)

    def state(self) -> list[torch.Tensor]:
        """What a call changes besides the engine's `ordered` and the cache."""
        return [self.final, self.pending, self.fed_from, self.draft_probs, self.counters]

    def decided(self) -> Decided:
        return Decided(final=self.final, pending=self.pending, accepted=self.counters[2],
                       decided=self.counters[1])

    def generate(self, sample_ids: torch.Tensor, given_mask: torch.Tensor,
                 on_step: Callable[[StepOutput], None] | None,
                 forced_tokens: torch.Tensor | None = None) -> Finished:
        sampler, config, n = self.sampler, self.config, self.sampler.seq_len
        given = given_mask.sum(dim=1)
        self.accept_uniforms.copy_(position_uniforms(config, sample_ids, n, Stream.ACCEPT))
        self.residual_uniforms.copy_(position_uniforms(config, sample_ids, n, Stream.RESIDUAL))
        for tensor, value in ((self.final, given), (self.pending, 0), (self.fed_from, 0),
                              (self.counters, 0)):
            tensor.copy_(value)
        steady = 2 * self.window + 1  # rows and targets of every call after the first
        first_rows = max(steady, int(given.max()) + 1 + self.window)
        if sampler.bucketed and first_rows > steady:  # few shapes whatever the prompts
            first_rows = bucket(first_rows, n + self.window)
        calls, rows = 0, 0
        while calls <= n and bool((self.final < n).any()):  # the one read of the device per call
            shape = (first_rows if calls == 0 else steady, steady, n + 1)
            if on_step is not None:  # lo, c, hi of this call, before it moves them
                bounds = torch.stack([self.fed_from, self.final + self.pending,
                                      (self.final + self.pending + 1 + self.window).clamp(max=n)])
            logits, target_slots, valid = sampler.call(*shape)
            if on_step is not None:
                on_step(StepOutput(calls, logits, target_slots, valid, bounds, self.decided()))
            calls, rows = calls + 1, rows + shape[0]
        sample_calls, decided, accepted = self.counters.cpu()
        return Finished(calls, rows, sample_calls,
                        {"drafts_decided": decided, "drafts_accepted": accepted})

    def step(self, rows: int, targets: int, keys: int):
        """One call: verifies the pending drafts, makes final what the rule accepts (and one
        redrawn or exact token), drafts the positions after, and moves every sample's state."""
        sampler, n, window = self.sampler, self.sampler.seq_len, self.window
        final, pending = self.final[:, None], self.pending[:, None]  # (b, 1)
        active = final < n
        # fed: slot A (the last final token) and the pending drafts; targets: those rows, the
        # row after the drafts and `window` copies, up to the end of the order
        last_real = (final + pending).clamp(max=n - 1)
        end = (final + pending + 1 + window).clamp(max=n)
        lo = torch.where(active, self.fed_from[:, None], n)  # a finished sample only pads
        logits, target_slots, valid = sampler.network(lo, final, last_real, end, rows, targets,
                                                      keys)
        probs = token_probs(logits, self.config)  # (b, targets, vocab)
        index = target_slots.clamp(max=n - 1)  # target j is the order's position A + j
        positions = sampler.orders.gather(1, index)
        drawn = inverse_cdf(probs, sampler.uniforms.gather(1, positions))  # new drafts

        # the pending drafts j < P: accepted while u p(d) < q(d); m = the first one rejected
        j = torch.arange(targets, device=sampler.device)
        is_pending = j < pending  # (b, targets)
        proposal = torch.cat([self.draft_probs, probs[:, window:].new_zeros(
            len(probs), targets - window, probs.size(-1))], dim=1)  # p per target (0 past P)
        drafts = sampler.ordered.gather(1, index)[..., None]  # (b, targets, 1)
        p, q = proposal.gather(2, drafts)[..., 0], probs.gather(2, drafts)[..., 0]
        u = self.accept_uniforms.gather(1, positions)
        rejected = is_pending & ~(u * p < q)
        m = torch.where(rejected.any(dim=1), rejected.long().argmax(dim=1), self.pending)  # (b,)
        was_rejected = m < self.pending

        # the rejected draft's position is redrawn from the normalised residual max(q - p, 0)
        at_m = m.clamp(max=targets - 1)[:, None]
        redraw_from = residual(probs.gather(1, at_m[..., None].expand(-1, 1, probs.size(-1))),
                               proposal.gather(1, at_m[..., None].expand(-1, 1, probs.size(-1))))
        u_m = self.residual_uniforms.gather(1, positions.gather(1, at_m))
        redrawn = inverse_cdf(redraw_from[:, 0], u_m[:, 0])

        # write the new drafts (the row after the pending ones and the copies), then the redraw
        ordered = sampler.ordered
        ordered.scatter_(1, torch.where(valid & ~is_pending, target_slots, n), drawn)
        redraw_at = torch.where(was_rejected, self.final + m, n)[:, None]
        ordered.scatter_(1, redraw_at, redrawn[:, None])

        # entries 0..m are final (m itself redrawn, or the exact row after the drafts); the
        # ones after stay pending with their proposals: old drafts, then this call's draws
        made_final = torch.minimum(m + 1, n - self.final)
        left = (end[:, 0] - self.final) - made_final  # drafted entries after the final ones
        self.counters += torch.stack([active[:, 0].long(), torch.minimum(m + 1, self.pending),
                                      m]) * active[:, 0]
        proposals = torch.where(is_pending[..., None], proposal, probs)  # (b, targets, vocab)
        keep = (made_final[:, None] + torch.arange(window, device=sampler.device)).clamp(
            max=targets - 1)
        self.draft_probs.copy_(proposals.gather(1, keep[..., None].expand(-1, -1, probs.size(-1))))
        self.final += made_final
        self.pending.copy_(left.clamp(min=0, max=window))
        self.fed_from.copy_(self.final)
        return logits, target_slots, valid
