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
not listed. Without record_calls there is no recorder: nothing is read back and nothing costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aogpt.model.sampler.strategy import Decided, StepOutput

if TYPE_CHECKING:
    from aogpt.model.sampler.engine import KVCacheSampler

SCORE_DIGITS = 6  # significant digits of a candidate's score in a record


class CallRecorder:
    """on_step for one generate call of `sampler` whose first b samples are kept; given (b,) the
    given positions of each (the order's entries that are final before the first call)."""

    def __init__(self, sampler: KVCacheSampler, given: torch.Tensor):
        self.sampler = sampler
        b = len(given)
        self.final = given.tolist()
        self.pending, self.accepted, self.decided = [0] * b, [0] * b, [0] * b
        self.drafts: list[dict[int, int]] = [{} for _ in range(b)]  # pending: position -> token
        self.calls: list[list[dict]] = [[] for _ in range(b)]

    def __call__(self, step: StepOutput) -> None:
        now = step.decided
        b = len(self.calls)
        orders = self.sampler.orders[:b].cpu()  # (b, n)
        ordered = self.sampler.ordered[:b].cpu()  # (b, n + 1)
        final = now.final[:b].tolist()
        for i in range(b):
            call = {}
            if final[i] > self.final[i]:
                call["final"] = orders[i, self.final[i]:final[i]].tolist()
            if now.pending is not None:
                call.update(self.drafts_decided(i, now, orders[i], ordered[i], final[i]))
            if now.candidates is not None:
                call.update(candidates(now.candidates[i], now.scores[i]))
            self.final[i] = final[i]
            if call:
                self.calls[i].append(call)

    def drafts_decided(self, i: int, now: Decided, orders: torch.Tensor, ordered: torch.Tensor,
                       final: int) -> dict:
        """Sample i's drafts this call accepted, rejected and made (speculative): the first
        `accepted` pending ones were accepted, the next rejected when more were decided, and the
        entries after the ones pending before, up to the new pending ones, are new drafts."""
        done = {}
        start, pending = self.final[i], self.pending[i]
        accepted = int(now.accepted[i]) - self.accepted[i]
        decided = int(now.decided[i]) - self.decided[i]
        if accepted:
            done["accepted"] = orders[start:start + accepted].tolist()
            for position in done["accepted"]:
                del self.drafts[i][position]
        if decided > accepted:
            position = int(orders[start + accepted])
            done["rejected"] = [[position, self.drafts[i].pop(position)]]
        self.accepted[i], self.decided[i] = accepted + self.accepted[i], decided + self.decided[i]
        self.pending[i] = int(now.pending[i])
        new = slice(max(start + pending, final), final + self.pending[i])
        drafted = list(zip(orders[new].tolist(), ordered[new].tolist(), strict=True))
        if drafted:
            done["drafts"] = [list(draft) for draft in drafted]
            self.drafts[i].update(drafted)
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
