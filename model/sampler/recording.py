"""Call recording: what each network call did to each sample, for the replay page
(trainer/replay, trainer/sample.py --record-calls, the samples drawn while training).

KVCacheSampler.generate(record_calls=True) hands a CallRecorder every call's StepOutput; it reads
the strategy's Decided (where the calls have brought each sample) and the engine's `orders` and
`ordered`, and tells from the last call's Decided what this one did. Each sample gets a list of
the calls that changed it, one dict each, with the keys that apply:

    final        positions made final, in the order made final (over all calls: the sample's
                 generated order)
    drafts       [position, token] drafted (speculative)
    accepted     positions whose pending draft was accepted (speculative)
    rejected     [position, token] drafts rejected; each position is drawn again from the
                 residual, its final token in `final`
    candidates   [position, score] the planner's best candidates (planners.BEST_KEPT), best first

The speculative sampler accepts the first drafts pending and rejects at most one (the next): a
call's accepted and decided counts say which, and the recorder remembers each draft's token until
it is decided. A planner's last call, which only scores the last reveals, changes nothing and is
not listed. Each call's state is copied on the device and read back once, after the last call.
Without record_calls there is no recorder: nothing is copied, nothing read back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aogpt.model.sampler.strategy import StepOutput

if TYPE_CHECKING:
    from aogpt.model.sampler.engine import KVCacheSampler

SCORE_DIGITS = 6  # significant digits of a candidate's score in a record


class CallRecorder:
    """on_step for one generate call of `sampler` whose first b samples are kept (given (b,): the
    given positions of each, the order's entries final before the first call). Each call it
    copies, on the device, where the strategy has brought each sample and the tokens of the
    drafts pending; nothing is read back until `calls`, after the last call, so that recording
    adds no wait for the device to a sampler that makes none (the parallel sampler, CUDA graphs
    replayed back to back)."""

    def __init__(self, sampler: KVCacheSampler, given: torch.Tensor):
        self.sampler, self.given = sampler, given.tolist()
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def __call__(self, step: StepOutput) -> None:
        now, b = step.decided, len(self.given)
        counts = [now.final] if now.pending is None else [now.final, now.pending, now.accepted,
                                                          now.decided]
        snapshot = {"counts": torch.stack([count[:b] for count in counts])}  # (1 or 4, b)
        if now.pending is not None:  # the slots after the final ones: the drafts pending
            slots = now.final[:b, None] + torch.arange(self.sampler.config.draft,
                                                       device=now.final.device)
            snapshot["pending"] = self.sampler.ordered[:b].gather(
                1, slots.clamp(max=self.sampler.seq_len))
        if now.candidates is not None:
            snapshot["candidates"] = now.candidates[:b].clone()
            snapshot["scores"] = now.scores[:b].clone()
        self.snapshots.append(snapshot)

    @property
    def calls(self) -> list[list[dict]]:
        """Each sample's calls (the module's docstring), read back from the copies: the order's
        entries made final by a call are fixed from then on, so the final order says which."""
        orders = self.sampler.orders[:len(self.given)].cpu()
        history = {key: torch.stack([snapshot[key] for snapshot in self.snapshots]).cpu()
                   for key in self.snapshots[0]} if self.snapshots else {}
        return [self.sample_calls(i, orders[i].tolist(), history) for i in range(len(self.given))]

    def sample_calls(self, i: int, order: list[int], history: dict) -> list[dict]:
        calls, final, drafts = [], self.given[i], Drafts()
        for c, counts in enumerate(history.get("counts", [])):
            now = int(counts[0, i])
            call = {"final": order[final:now]} if now > final else {}
            if "pending" in history:
                call |= drafts.changes(order, final, now, counts[1:, i].tolist(),
                                       history["pending"][c, i].tolist())
            if "candidates" in history:
                call |= candidates(history["candidates"][c, i], history["scores"][c, i])
            final = now
            if call:
                calls.append(call)
        return calls


class Drafts:
    """One sample's speculative drafts, call after call: which are pending (their tokens), and
    how many were pending, accepted and decided before this call."""

    def __init__(self):
        self.tokens: dict[int, int] = {}  # position -> token of each draft pending
        self.pending = self.accepted = self.decided = 0

    def changes(self, order: list[int], final: int, now: int, counts: list[int],
                pending_tokens: list[int]) -> dict:
        """What a call that took the sample from `final` to `now` entries final did to its
        drafts: the first ones pending were accepted, the next rejected when more were decided
        than accepted, and the entries after those pending before, up to the ones pending now,
        are new drafts (their tokens: pending_tokens, from entry `now` on)."""
        pending, accepted, decided = counts
        done, newly_accepted = {}, accepted - self.accepted
        if newly_accepted:
            done["accepted"] = order[final:final + newly_accepted]
            for position in done["accepted"]:
                del self.tokens[position]
        if decided - self.decided > newly_accepted:
            position = order[final + newly_accepted]
            done["rejected"] = [[position, self.tokens.pop(position)]]
        start = max(final + self.pending, now)
        drafted = [[order[k], pending_tokens[k - now]] for k in range(start, now + pending)]
        if drafted:
            done["drafts"] = drafted
            self.tokens.update(drafted)
        self.pending, self.accepted, self.decided = pending, accepted, decided
        return done


def candidates(positions: torch.Tensor, scores: torch.Tensor) -> dict:
    """A planner's best candidates of the call, [position, score] best first (none: {})."""
    kept = [[p, float(f"{s:.{SCORE_DIGITS}g}")] for p, s in zip(
        positions.tolist(), scores.tolist(), strict=True) if p >= 0]
    return {"candidates": kept} if kept else {}


def shifted(call: dict, offset: int) -> dict:
    """A call of a window's chunk with its positions moved to the text's (offset: the chunk's
    start)."""
    moved = {key: [p + offset for p in call[key]] for key in ("final", "accepted") if key in call}
    moved |= {key: [[p + offset, value] for p, value in call[key]]
              for key in ("drafts", "rejected", "candidates") if key in call}
    return moved


def cut_calls(calls: list[dict], length: int) -> list[dict]:
    """The calls of a text cut to `length` tokens (a stop rule): what they did before the cut;
    a call that did nothing there is left out."""
    kept = []
    for call in calls:
        inside = {key: [p for p in call[key] if p < length] for key in ("final", "accepted")
                  if key in call}
        inside |= {key: [entry for entry in call[key] if entry[0] < length]
                   for key in ("drafts", "rejected", "candidates") if key in call}
        inside = {key: value for key, value in inside.items() if value}
        if inside:
            kept.append(inside)
    return kept
