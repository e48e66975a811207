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

Draft trees (tree = C > 1): each drafted position keeps C candidates, the draft d^0 and C - 1
more drawn from the same proposal p without replacement (d^c from p with d^0..d^{c-1} removed,
renormalised). The first candidates form the chain above; every other candidate d^c of a pending
position has a row of its own in the same call, which carries it at that position, sees the
final tokens and its ancestors (the first candidates before it) and nothing else, and writes a
scratch slot after the trash slot. The rule at a pending position whose target is q
(recursive rejection over the candidates, as in Jeon et al., arXiv 2402.14160):

    q_0 = q, p_0 = p
    for c = 0, 1, ..., C - 1:
        accept d^c if u_c p_c(d^c) < q_c(d^c)                       (probability min(1, q_c/p_c))
        else q_{c+1} = normalise(max(q_c - p_c, 0)),  p_{c+1} = normalise(p_c with d^c removed)
    none accepted: redraw from q_C

Proof sketch: stage c is one speculative sampling step whose proposal d^c ~ p_c is, given
everything before it, exactly the distribution it was drawn from (without replacement, d^c is
a draw from p with the earlier candidates removed) and whose uniform nothing has read. The lemma
then makes stage c's output distributed as q_c if its rejection branch outputs a draw from the
residual q_{c+1}; the fall-back draws one exactly, and stage c + 1 does by induction (from the
last stage down). So the position takes exactly q = q_0. A C of 1 is the chain, line for line.
When the position takes a candidate other than the first, its row saw only final tokens: the
position after it is drawn from that row exactly (as all P accepted gives one more token), the
row's keys and values are copied to the position's slot, and the drafts after stay pending.
Candidates after the first draw and accept with their own uniforms (Stream.TOKEN and
Stream.ACCEPT keyed by the candidate too). A greedy proposal has one token: its other
candidates are absent, and greedy decoding stays one token per call's.

Branches (tree_depth = L > 0): each candidate d^c of entry j after the first also has L rows
after its own, carrying the first candidates of entries j + 1 .. j + L and seeing the final
tokens, the first candidates before j, d^c and the branch's rows before them: the chain of
first candidates, as it would go on had entry j taken d^c. When entry j takes d^c, its branch
goes on where the call would otherwise stop: entry j + 1 + i is decided by the same rule
against the branch's row i (its target given the final tokens, now d^c among them), and while
it takes its first candidate, the next entry against row i + 1. The first entry that takes
another candidate, none, or that no row of the branch carries ends the call: it takes that
candidate, a draw from its residual, or a draw from its target exactly. The proof is the
chain's: each entry's target is its distribution given exactly the tokens final before it,
and its candidates and uniforms were read by nothing that decided those tokens (the chain's
own verdict on the entries after j, made against rows that saw d^0, is discarded unread). The
branch's rows of the entries made final are copied to their slots. A branch's own later
candidates have no rows: a tree of C candidates and depth L costs (C - 1) K (L + 1) rows, not
C^K.

Pre-drafts (predraft = R > 0): where a call stops at a redrawn position A + m, the drafts after
it came from rows that saw the rejected draft d_{A+m}. They are valid proposals, but poor ones
where a draft is rejected because the text went somewhere the draft did not: left to right on
the first synthetic language, even a perfect model of it accepts 47% of its drafts at K = 4 so,
85% with pre-drafts (benchmarks/perfect_drafts.py, docs/sampling-race.md). So each pending
entry's row has R copies in the same call, which carry its token at its position, see what it
sees but its own slot (the final tokens and the drafts before it), and ask for the R positions
after it: σ_{A+j+1} .. σ_{A+j+R}, each given exactly the tokens that are final if the call stops
at j. Where the call stops at a redrawn m, the first R drafts after it are drawn from m's
copies (Stream.TOKEN of their positions) instead, with those rows as their proposals. Exactness
is untouched: a draft may come from any proposal whose draw and acceptance uniforms nothing
final has read, and nothing final read those of the positions after m (the old drafts there were
drawn with the same Stream.TOKEN uniforms, but no row before them sees them, and this call's
verdicts on them are discarded unread). A call feeds draft * R rows more.

The cache: slots up to the last final token hold exactly what one-token-at-a-time decoding
writes (the same tokens, positions and targets); the next call feeds from the first slot that
does not. Every call has the same shape (2 draft + 1 rows, (tree - 1) draft (depth + 1)
candidate rows and draft R pre-draft rows, the whole cache as keys), the first one excepted
when a prompt is longer than `draft`: on a GPU that is one CUDA graph. The host reads one flag
per call, whether every sample is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from aogpt.model.orders import Stream, counter_uniform
from aogpt.model.sampler.draw import inverse_cdf, position_uniforms, token_probs
from aogpt.model.sampler.strategy import (
    CacheLayout,
    Decided,
    Finished,
    StepOutput,
    Strategy,
    bucket,
)

if TYPE_CHECKING:
    from aogpt.model.sampler.engine import KVCacheSampler


def residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """What a rejected draft's position is redrawn from: max(q - p, 0), (..., vocab), unnormalised
    (inverse_cdf normalises). A rejection (q(d) < p(d)) leaves mass where q > p, unless both sums
    round below it: then q itself."""
    excess = (q - p).clamp(min=0)
    return torch.where(excess.sum(dim=-1, keepdim=True) > 0, excess, q)


class SpeculativeSampling(Strategy):
    """ways.py's "speculative": drafts config.draft positions ahead per call, config.tree
    candidates for each."""

    # a candidate taken after the first: its row's keys and values go to the slot it decided
    writes = frozenset({"ordered", "cache"})

    def __init__(self, sampler: KVCacheSampler):
        self.sampler, self.config = sampler, sampler.config
        b, n, device = sampler.batch_size, sampler.seq_len, sampler.device
        self.window, self.tree = self.config.draft, self.config.tree  # drafts pending at most
        # each candidate after the first has a row of its own and `depth` more on its branch
        self.depth = self.config.branch_depth
        self.branch = 1 + self.depth
        self.siblings = (self.tree - 1) * self.window * self.branch  # rows after the order's
        self.predraft = self.config.fresh_drafts  # R copies of each pending entry's row
        self.predrafts = self.window * self.predraft  # rows after the candidates'
        self.extra = self.siblings + self.predrafts
        state = {"dtype": torch.long, "device": device}
        self.final = torch.zeros(b, **state)  # A: tokens of the order that are final
        self.pending = torch.zeros(b, **state)  # P: drafts after them
        self.fed_from = torch.zeros(b, **state)  # the first slot that is not in the cache
        self.draft_probs = torch.zeros(b, self.window, sampler.vocab, device=device)  # p of each
        # each pending position's candidates (the first is also in `ordered`), and whether each
        # is there (a proposal may have fewer tokens than the tree has room for)
        self.candidates = torch.zeros(b, self.window, self.tree, **state)
        self.present = torch.zeros(b, self.window, self.tree, dtype=torch.bool, device=device)
        uniforms = {"dtype": torch.float64, "device": device}
        self.accept_uniforms = torch.zeros(b, n, self.tree, **uniforms)
        self.residual_uniforms = torch.zeros(b, n, **uniforms)
        self.candidate_uniforms = torch.zeros(b, n, self.tree - 1, **uniforms)
        # per sample: calls it took part in, drafted positions decided, and accepted
        self.counters = torch.zeros(3, b, **state)

    def state(self) -> list[torch.Tensor]:
        """What a call changes besides the engine's `ordered` and the cache."""
        return [self.final, self.pending, self.fed_from, self.draft_probs, self.candidates,
                self.present, self.counters]

    def cache_layout(self) -> CacheLayout:
        return CacheLayout(scratch=self.extra)  # a slot for each candidate's and pre-draft's row

    def decided(self) -> Decided:
        return Decided(final=self.final, pending=self.pending, accepted=self.counters[2],
                       decided=self.counters[1])

    def generate(self, sample_ids: torch.Tensor, given_mask: torch.Tensor,
                 on_step: Callable[[StepOutput], None] | None,
                 forced_tokens: torch.Tensor | None = None) -> Finished:
        sampler, n = self.sampler, self.sampler.seq_len
        given = given_mask.sum(dim=1)
        self._draw_uniforms(sample_ids)
        for tensor, value in ((self.final, given), (self.pending, 0), (self.fed_from, 0),
                              (self.counters, 0), (self.present, False)):
            tensor.copy_(value)
        steady = 2 * self.window + 1  # rows and targets of every call after the first
        first_rows = max(steady, int(given.max()) + 1 + self.window)
        if sampler.bucketed and first_rows > steady:  # few shapes whatever the prompts
            first_rows = bucket(first_rows, n + self.window)
        keys = n + 1 + self.extra
        calls, rows = 0, 0
        while calls <= n and bool((self.final < n).any()):  # the one read of the device per call
            shape = ((first_rows if calls == 0 else steady) + self.extra, steady + self.extra,
                     keys)
            if on_step is not None:  # lo, c, hi of this call, before it moves them
                bounds = torch.stack([self.fed_from, self.final + self.pending,
                                      (self.final + self.pending + 1 + self.window).clamp(max=n)])
            logits, target_slots, valid = sampler.call(*shape)
            if on_step is not None:
                on_step(StepOutput(calls, logits[:, :steady], target_slots, valid, bounds,
                                   self.decided()))
            calls, rows = calls + 1, rows + shape[0]
        sample_calls, decided, accepted = self.counters.cpu()
        return Finished(calls, rows, sample_calls,
                        {"drafts_decided": decided, "drafts_accepted": accepted})

    def _draw_uniforms(self, sample_ids: torch.Tensor) -> None:
        """Every uniform a generation may read, keyed by (seed, sample id, position) and, for the
        candidates after the first, by the candidate: Stream.TOKEN draws a candidate, ACCEPT
        accepts it, RESIDUAL redraws a position none of whose candidates passed."""
        config, n = self.config, self.sampler.seq_len
        positions = torch.arange(n, device=sample_ids.device)[:, None]
        later = torch.arange(1, self.tree, device=sample_ids.device)  # candidates after the first
        self.accept_uniforms[..., 0].copy_(position_uniforms(config, sample_ids, n, Stream.ACCEPT))
        self.accept_uniforms[..., 1:].copy_(counter_uniform(
            config.seed, sample_ids[:, None, None], Stream.ACCEPT, positions, later))
        self.residual_uniforms.copy_(position_uniforms(config, sample_ids, n, Stream.RESIDUAL))
        self.candidate_uniforms.copy_(counter_uniform(
            config.seed, sample_ids[:, None, None], Stream.TOKEN, positions, later))

    def step(self, rows: int, targets: int, keys: int):
        """One call: verifies the pending drafts, makes final what the rule accepts (and one
        redrawn or exact token), drafts the positions after, and moves every sample's state."""
        sampler, n, window = self.sampler, self.sampler.seq_len, self.window
        final, pending = self.final[:, None], self.pending[:, None]  # (b, 1)
        active = final < n
        # fed: slot A (the last final token) and the pending drafts; targets: those rows, the
        # row after the drafts and `window` copies, up to the end of the order; then the rows
        # of the pending drafts' other candidates
        last_real = (final + pending).clamp(max=n - 1)
        end = (final + pending + 1 + window).clamp(max=n)
        lo = torch.where(active, self.fed_from[:, None], n)  # a finished sample only pads
        laid = sampler.lay_out(lo, final, last_real, end, rows - self.extra,
                               targets - self.extra, keys)
        if self.siblings:
            laid = laid.extended(*self._candidate_rows(keys))
        if self.predrafts:
            laid = laid.extended(*self._predraft_rows(keys))
        logits = sampler.feed(*laid.fed())
        target_slots, valid = laid.target_slots, laid.valid
        targets -= self.extra  # the order's; the candidates' and pre-drafts' rows come after
        probs = token_probs(logits, self.config)  # (b, targets + extra, vocab)
        probs, candidate_probs, predraft_probs = probs.split(
            [targets, self.siblings, self.predrafts], dim=1)
        index = target_slots.clamp(max=n - 1)  # target j is the order's position A + j
        positions = sampler.orders.gather(1, index)
        drawn = inverse_cdf(probs, sampler.uniforms.gather(1, positions))  # new drafts

        # the pending drafts j < P: each position takes the first of its candidates that the
        # recursive rule accepts (accept_candidates); m = the first that takes none, t = the
        # first that takes another than its first candidate: the positions before are final
        j = torch.arange(targets, device=sampler.device)
        is_pending = j < pending  # (b, targets)
        if self.siblings:
            drawn_candidates, drawn_present = self._more_candidates(probs, drawn, positions)
            candidates, present = self.candidates, self.present
        else:  # a chain: a pending position's one candidate is its draft, in `ordered`
            candidates = sampler.ordered.gather(1, index[:, :window])[..., None]
            present = is_pending[:, :window, None]
        taken, left = accept_candidates(
            probs[:, :window], self.draft_probs, candidates, present,
            self.accept_uniforms.gather(1, positions[:, :window, None].expand(-1, -1, self.tree)))
        taken = torch.where(is_pending[:, :window], taken, 0)  # past P: nothing to decide
        m = first_where(taken < 0, self.pending)  # (b,) P where none
        t = first_where(taken > 0, self.pending) if self.siblings else self.pending
        redrawn_at, other_at = m < t, t < m  # (b,): where the call stops, and why
        stop = torch.minimum(m, t)

        # write the new drafts (the row after the pending ones and the copies), then what the
        # rule decided: m is redrawn from its last residual, t takes its candidate
        at_stop = stop.clamp(max=window - 1)[:, None]
        u_m = self.residual_uniforms.gather(1, positions.gather(1, at_stop))[:, 0]
        redrawn = inverse_cdf(left.gather(1, at_stop[..., None].expand(-1, 1, left.size(-1))
                                          )[:, 0], u_m)
        ordered = sampler.ordered
        ordered.scatter_(1, torch.where(valid & ~is_pending, target_slots, n), drawn)
        ordered.scatter_(1, torch.where(redrawn_at, self.final + stop, n)[:, None],
                         redrawn[:, None])
        branch_final = branch_decided = branch_accepted = 0  # a chain has no branch
        if self.siblings:
            branch_final, branch_decided, branch_accepted = self._follow_branch(
                candidate_probs, taken, at_stop, other_at)

        # the entries up to the stop are final (and those on the branch of another candidate);
        # the ones after stay pending with their candidates and proposals: old drafts, then this
        # call's draws
        made_final = torch.minimum(stop + 1 + branch_final, n - self.final)
        drafted = (end[:, 0] - self.final) - made_final  # entries after the final ones
        self.counters += torch.stack([
            active[:, 0].long(), torch.minimum(stop + 1 + branch_decided, self.pending),
            stop + other_at.long() + branch_accepted]) * active[:, 0]
        keep = (made_final[:, None] + torch.arange(window, device=sampler.device)).clamp(
            max=targets - 1)  # (b, window)
        carried = [(self.draft_probs, probs)]
        if self.siblings:
            carried += [(self.candidates, drawn_candidates), (self.present, drawn_present)]
        for mine, new_ones in carried:
            padded = torch.cat([mine, new_ones[:, window:]], dim=1)  # (b, targets, ...)
            chosen = torch.where(is_pending[..., None], padded, new_ones)
            mine.copy_(chosen.gather(1, keep[..., None].expand(-1, -1, chosen.size(-1))))
        if self.predrafts:
            self._take_predrafts(predraft_probs, at_stop, redrawn_at, made_final)
        self.final += made_final
        self.pending.copy_(drafted.clamp(min=0, max=window))
        self.fed_from.copy_(self.final)
        return logits, target_slots, valid

    def _candidate_rows(self, keys: int) -> tuple[torch.Tensor, ...]:
        """The rows of the pending drafts' candidates after the first and of their branches,
        (b, siblings) each, `branch` rows per candidate: candidate c of entry j carries its token
        at position σ_{A+j}, asks for σ_{A+j+1}, and sees the slots up to A + j (the final
        tokens and its ancestors, the first candidates of the entries before it) and its own
        scratch slot after the trash slot; the i-th row of its branch carries entry j + i's
        first candidate, asks for σ_{A+j+i+1}, and sees what the candidate's row sees and the
        branch's rows up to its own. Rows of absent candidates, or past the pending drafts, pad
        (the trash slot)."""
        sampler, n, device = self.sampler, self.sampler.seq_len, self.sampler.device
        per_entry = (self.tree - 1) * self.branch
        entry = torch.arange(self.window, device=device).repeat_interleave(per_entry)
        which = torch.arange(1, self.tree, device=device).repeat_interleave(self.branch).repeat(
            self.window)
        depth = torch.arange(self.branch, device=device).repeat(self.window * (self.tree - 1))
        carried = entry + depth  # the entry whose token the row carries
        at = self.final[:, None] + carried  # (b, siblings): the order's index of each
        fed = (carried < self.pending[:, None]) & self.present[:, entry, which]
        tokens = self.candidates[:, entry, which]
        if self.depth:  # the branches' rows carry the first candidates of the entries after
            first = self.candidates[:, carried.clamp(max=self.window - 1), 0]
            tokens = torch.where(depth == 0, tokens, first)
        positions = sampler.orders.gather(1, at.clamp(max=n - 1))
        target_positions = sampler.orders.gather(1, (at + 1).clamp(max=n - 1))
        own = n + 1 + torch.arange(self.siblings, device=device)  # each row's scratch slot
        write = torch.where(fed, own, n)
        key = torch.arange(keys, device=device)
        ancestors = key <= (self.final[:, None] + entry)[..., None]  # (b, siblings, keys)
        on_branch = (key >= (own - depth)[:, None]) & (key <= own[:, None])  # (siblings, keys)
        mask = (key == write[..., None]) | (fed[..., None] & (ancestors | on_branch))
        return tokens, positions, target_positions, write, mask[:, None]

    def _predraft_rows(self, keys: int) -> tuple[torch.Tensor, ...]:
        """The pre-draft rows, (b, predrafts) each, R per pending entry: entry j's carry the token
        its row carries (σ_{A+j-1}'s, at slot A + j), ask for σ_{A+j+1} .. σ_{A+j+R}, and see the
        slots before A + j and their own scratch slot (after the candidates'). Rows of entries
        that are not pending, or that ask past the order, pad (the trash slot)."""
        sampler, n, device = self.sampler, self.sampler.seq_len, self.sampler.device
        entry = torch.arange(self.window, device=device).repeat_interleave(self.predraft)
        gap = torch.arange(1, self.predraft + 1, device=device).repeat(self.window)
        source = self.final[:, None] + entry  # (b, predrafts): the slot whose token each carries
        asked = source + gap  # the order's index of the position each asks for
        fed = (entry < self.pending[:, None]) & (asked < n)
        tokens, positions = sampler.slot_inputs(source)
        target_positions = sampler.orders.gather(1, asked.clamp(max=n - 1))
        own = n + 1 + self.siblings + torch.arange(self.predrafts, device=device)
        write = torch.where(fed, own, n)
        key = torch.arange(keys, device=device)
        mask = (key == write[..., None]) | (fed[..., None] & (key < source[..., None]))
        return tokens, positions, target_positions, write, mask[:, None]

    def _take_predrafts(self, probs: torch.Tensor, at_stop: torch.Tensor,
                        redrawn_at: torch.Tensor, made_final: torch.Tensor) -> None:
        """Where the call stopped at a redrawn entry m (redrawn_at), the first R pending entries
        after it become m's pre-drafts: drawn from its pre-draft rows `probs` (b, predrafts,
        vocab), which saw exactly the tokens final before m, with them as their proposals (and
        a tree's other candidates drawn from them)."""
        sampler, n, device = self.sampler, self.sampler.seq_len, self.sampler.device
        vocab, r = probs.size(-1), self.predraft
        gap = torch.arange(r, device=device)
        rows = (at_stop * r + gap)[..., None].expand(-1, -1, vocab)  # (b, R, vocab)
        fresh = probs.gather(1, rows)
        at = (self.final + made_final)[:, None] + gap  # the order's index of each new draft
        positions = sampler.orders.gather(1, at.clamp(max=n - 1))
        tokens = inverse_cdf(fresh, sampler.uniforms.gather(1, positions))
        use = redrawn_at[:, None] & (at < n)  # (b, R)
        sampler.ordered.scatter_(1, torch.where(use, at, n), tokens)
        self.draft_probs[:, :r] = torch.where(use[..., None], fresh, self.draft_probs[:, :r])
        if self.siblings:
            candidates, present = self._more_candidates(fresh, tokens, positions)
            self.candidates[:, :r] = torch.where(use[..., None], candidates,
                                                 self.candidates[:, :r])
            self.present[:, :r] = torch.where(use[..., None], present, self.present[:, :r])

    def _more_candidates(self, probs: torch.Tensor, drawn: torch.Tensor,
                         positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every drafted entry's candidates (b, targets, tree): the draft `drawn`, then tree - 1
        more drawn without replacement from the same proposal (Stream.TOKEN keyed by the
        candidate too), and whether each is there (a proposal with no mass left has none)."""
        candidates, present = [drawn], [torch.ones_like(drawn, dtype=torch.bool)]
        left = probs
        for later in range(1, self.tree):
            left = without(left, candidates[-1][..., None])
            u = self.candidate_uniforms[..., later - 1].gather(1, positions)
            candidates.append(inverse_cdf(left, u))
            present.append(left.sum(dim=-1) > 0)
        return torch.stack(candidates, dim=-1), torch.stack(present, dim=-1)

    def _follow_branch(self, candidate_probs: torch.Tensor, taken: torch.Tensor,
                       at_stop: torch.Tensor, other_at: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where entry t took candidate `taken` > 0 (other_at): that candidate is final, and the
        entries after it are decided on its branch, whose rows saw it instead of the first
        candidate. Entry t + 1 + i's target is the branch's row i. While a row of the branch
        carries the entry (i < depth, and the entry is pending), the entry is decided by the
        rule (accept_candidates) against that target, and its first candidate taken goes on to
        the next; the first entry that takes another candidate or none, or that no row carries,
        ends the branch: it takes that candidate, a draw from its residual, or (no row carries
        it) a draw from its target exactly (Stream.TOKEN of its position, as one token per call
        would: the row saw only final tokens). The branch's rows of the entries made final go to
        their slots. Returns the entries after t made final, decided by the rule, and accepted,
        (b,) each (zeros where no other candidate was taken)."""
        sampler, n, device = self.sampler, self.sampler.seq_len, self.sampler.device
        vocab = candidate_probs.size(-1)
        t = at_stop[:, 0]
        which = taken.gather(1, at_stop)[:, 0]  # (b,) the candidate taken at t
        other = self.candidates[torch.arange(len(t), device=device), t, which.clamp(min=0)]
        base = (t * (self.tree - 1) + (which - 1).clamp(min=0)) * self.branch  # its own row
        i = torch.arange(self.branch, device=device)
        entry = t[:, None] + 1 + i  # (b, branch): the entry each row of the branch asks for
        rows = (base[:, None] + i)[..., None].expand(-1, -1, vocab)
        targets = candidate_probs.gather(1, rows)  # (b, branch, vocab)
        positions = sampler.orders.gather(1, (self.final[:, None] + entry).clamp(max=n - 1))
        s, ruled_s = torch.zeros_like(t), torch.zeros_like(other_at)  # depth 0: entry t + 1
        accepted_s, decided = ruled_s, None
        if self.depth:
            s, ruled_s, accepted_s, decided = self._decide_on_branch(targets, entry, positions)
        at_s = s[:, None]
        exact = inverse_cdf(targets.gather(1, at_s[..., None].expand(-1, 1, vocab))[:, 0],
                            sampler.uniforms.gather(1, positions.gather(1, at_s))[:, 0])
        token = exact if decided is None else torch.where(ruled_s, decided, exact)

        ordered, start = sampler.ordered, self.final + t  # the order's index of entry t
        ordered.scatter_(1, torch.where(other_at, start, n)[:, None], other[:, None])
        last = start + 1 + s
        ordered.scatter_(1, torch.where(other_at & (last < n), last, n)[:, None], token[:, None])
        for row in range(self.branch):  # entry t + row's slot is A + t + row + 1
            moved = other_at & (row <= s)
            sampler.cache.copy_slot(torch.where(moved, n + 1 + base + row, n),
                                    torch.where(moved, start + 1 + row, n))
        return ((s + 1) * other_at, (s + ruled_s.long()) * other_at,
                (s + accepted_s.long()) * other_at)

    def _decide_on_branch(self, targets: torch.Tensor, entry: torch.Tensor,
                          positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rule along a branch (_follow_branch): for entries `entry` (b, branch) at
        `positions`, with targets (b, branch, vocab), the index s (b,) of the entry that ends
        the branch, whether the rule decided it (ruled: a row carries it and it is pending) and
        accepted a candidate, and the token the rule gave it (a candidate, or a draw from its
        residual)."""
        i = torch.arange(self.branch, device=entry.device)
        ruled = (entry < self.pending[:, None]) & (i < self.depth)
        held = entry.clamp(max=self.window - 1)

        def pending(state: torch.Tensor) -> torch.Tensor:  # each entry's (b, branch, ...)
            return state.gather(1, held[..., None].expand(-1, -1, state.size(-1)))

        candidates = pending(self.candidates)
        taken, left = accept_candidates(
            targets, pending(self.draft_probs), candidates,
            pending(self.present) & ruled[..., None],
            self.accept_uniforms.gather(1, positions[..., None].expand(-1, -1, self.tree)))
        follows = ruled & (taken == 0)  # the entry took the candidate its row carries
        s = first_where(~follows, torch.full_like(entry[:, 0], self.depth))
        at_s = s[:, None]
        ruled_s, taken_s = ruled.gather(1, at_s)[:, 0], taken.gather(1, at_s)[:, 0]
        redrawn = inverse_cdf(left.gather(1, at_s[..., None].expand(-1, 1, left.size(-1)))[:, 0],
                              self.residual_uniforms.gather(1, positions.gather(1, at_s))[:, 0])
        candidate = candidates.gather(1, at_s[..., None].expand(-1, 1, self.tree))[:, 0]
        candidate = candidate.gather(1, taken_s.clamp(min=0)[:, None])[:, 0]
        return s, ruled_s, ruled_s & (taken_s > 0), torch.where(taken_s < 0, redrawn, candidate)


def first_where(mask: torch.Tensor, otherwise: torch.Tensor) -> torch.Tensor:
    """(b,): the first index where mask (b, k) holds, else `otherwise`."""
    return torch.where(mask.any(dim=1), mask.long().argmax(dim=1), otherwise)


def accept_candidates(q: torch.Tensor, p: torch.Tensor, candidates: torch.Tensor,
                      present: torch.Tensor, uniforms: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The multi-candidate rule (the module's opening), for positions whose target is q and
    whose candidates (..., C), drawn without replacement from p (..., vocab), are tried in turn
    with `uniforms` (..., C). Returns the candidate each position takes ((...) int64, -1 for
    none) and what a position that takes none is redrawn from (..., vocab), unnormalised.
    Candidate 0 alone is the speculative sampling rule, exactly: u p(d) < q(d), else the residual
    max(q - p, 0)."""
    taken = torch.full(candidates.shape[:-1], -1, dtype=torch.long, device=q.device)
    target, proposal = q, p
    for c in range(candidates.size(-1)):
        if c:  # what is left of both after the earlier candidates' rejections
            target, proposal = renormalised(target), renormalised(proposal)
        d = candidates[..., c:c + 1]
        trying = present[..., c] & (taken < 0)
        passed = trying & (uniforms[..., c] * proposal.gather(-1, d)[..., 0]
                           < target.gather(-1, d)[..., 0])
        taken = torch.where(passed, c, taken)
        failed = (trying & ~passed)[..., None]
        target = torch.where(failed, residual(target, proposal), target)
        proposal = torch.where(failed, without(proposal, d), proposal)
    return taken, target


def renormalised(mass: torch.Tensor) -> torch.Tensor:
    """A distribution (..., vocab) from what is left of one (a candidate's mass removed)."""
    return mass / mass.sum(dim=-1, keepdim=True).clamp(min=1e-30)


def without(p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The proposal of the candidates after d (..., 1), drawn without replacement: p with d's
    mass removed (unnormalised)."""
    return p.scatter(-1, d, 0.0)
