"""SamplingConfig: every setting of a generation, for every way of choosing tokens (ways.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from aogpt import UsageError
from aogpt.model.config import require_choices
from aogpt.model.orders import ANY_ORDER, READING_WORDS, reading_named
from aogpt.model.sampler.ways import (
    DEFAULT_SAMPLER,
    FIXED_ORDER,
    OPTIONS,
    PLANNERS,
    SAMPLERS,
    IncompleteWay,
    way_of,
)


@dataclass
class SamplingConfig:
    # The way tokens are chosen (ways.py WAYS says what each is and which fields it reads): a
    # sampler along the order drawn up front (`order`: random or left to right), "parallel" (the
    # paper's) or "speculative" (exact, fewer calls); or a planner, the model choosing the next
    # positions call by call from its distributions over the candidates (confidence, margin,
    # entropy, threshold); planner "order" leaves the order to the sampler.
    sampler: Literal[SAMPLERS] = DEFAULT_SAMPLER
    steps: int = 256  # parallel: network calls at most; steps = n is exact ancestral sampling
    # speculative: positions drafted ahead of the known ones in each call; a call then yields up
    # to draft + 1 tokens and feeds up to 2 * draft + 1 rows per sample
    draft: int = 4
    # speculative: candidate tokens kept for each drafted position, verified together in one call
    # (a draft tree); 1 = one per position (a chain). A call then feeds (tree - 1) * draft rows
    # more, and accepts a position whenever one of its candidates passes
    tree: int = 1
    # speculative trees: drafted positions verified along the branch of a candidate other than
    # the first (its descendants: the first candidates of the positions after it, each a row of
    # its own, seeing that candidate instead of the first), so that taking it does not end the
    # call's run; 0 = the candidate's own row only. A call feeds (tree - 1) * draft * depth rows
    # more (depth at most draft - 1)
    tree_depth: int = 0
    # speculative: where a call redraws a rejected position, the first `predraft` drafts after it
    # are drawn from rows that saw only the final tokens (each pending position's row has that
    # many copies asking for the positions after it), not from rows that saw the rejected draft;
    # 0 = those drafts stay pending. A call feeds draft * predraft rows more (at most draft)
    predraft: int = 0
    # parallel: revealed fraction after step i of S: "linear" i/S, "cosine" 1 - cos(i/S * pi/2)
    schedule: Literal["linear", "cosine"] = "linear"
    # parallel: "deterministic": the paper's counts (at least one token per step); "binomial": each
    # masked token is revealed with the schedule's probability, exactly as in Lemma 1
    counts: Literal["deterministic", "binomial"] = "deterministic"
    order: Literal[READING_WORDS] = ANY_ORDER.word  # of the positions that are not given
    planner: Literal[PLANNERS] = FIXED_ORDER
    reveal: int = 1  # confidence, margin, entropy: positions revealed per call
    threshold: float = 0.9  # the threshold planner's
    candidates: int | None = None  # positions a planner scores per call: None = all remaining
    # a planner's blocks: None = the whole sequence; B = the positions in blocks of B, left to
    # right, the planner choosing within the current one (semi-autoregressive)
    block: int | None = None
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    # which tokens the nucleus keeps: "standard" (as transformers and most samplers) the smallest
    # set of most likely tokens whose mass reaches top_p (mass >= top_p); "paper" (the AO-GPT
    # paper's code) every token up to where the cumulative mass exceeds top_p, at least the most
    # likely one (mass <= top_p). "paper" keeps one token fewer whenever the mass does not hit
    # top_p exactly, so its samples are a little less diverse, and its generative perplexity lower.
    top_p_rule: Literal["standard", "paper"] = "standard"
    top_k: int = 0  # 0 = off
    seed: int = 0

    def __post_init__(self):
        self.order = reading_named(self.order, "order").word  # an alias is kept as its word

    @property
    def branch_depth(self) -> int:
        """tree_depth as the speculative sampler uses it (branch_depth())."""
        return branch_depth(self.draft, self.tree, self.tree_depth)

    @property
    def fresh_drafts(self) -> int:
        """predraft as the speculative sampler uses it (fresh_drafts())."""
        return fresh_drafts(self.draft, self.predraft)

    def validate(self) -> None:
        """UsageError for a setting that cannot run: the way's own (its options) and the
        common ones."""
        require_choices(self, ("sampler", "schedule", "counts", "top_p_rule", "planner"))
        way_of(self).check(self)
        if not self.temperature >= 0 or math.isinf(self.temperature):  # nan fails >= too
            raise UsageError(f"temperature must be a finite number >= 0 (0 = greedy), got "
                             f"{self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0 (0 = off), got {self.top_k}")



def branch_depth(draft: int, tree: int, tree_depth: int) -> int:
    """The positions verified on a branch: tree_depth, at most draft - 1 (a branch runs over the
    drafted positions after its candidate), and none without a tree (nothing to branch from)."""
    return min(tree_depth, draft - 1) if tree > 1 else 0


def fresh_drafts(draft: int, predraft: int) -> int:
    """The drafts after a redrawn position that its pre-draft rows draw: predraft, at most draft
    (no more are pending)."""
    return min(predraft, draft)


_unknown = [option.field for option in OPTIONS
            if option.field not in {f.name for f in dataclasses.fields(SamplingConfig)}]
if _unknown:  # a way's option must be a setting: refused at import, as an incomplete way is
    raise IncompleteWay(f"model/sampler/ways.py: options {', '.join(_unknown)} are no "
                        "SamplingConfig field: add them to model/sampler/config.py")
