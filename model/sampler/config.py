"""SamplingConfig: every setting of a generation, for every way of choosing tokens (SAMPLERS)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from aogpt import UsageError
from aogpt.model.config import require_choices
from aogpt.model.orders import ANY_ORDER, READING_WORDS, reading_named

# How a call's tokens are chosen and accepted; each is a module of this package.
#   "parallel"     the paper's sampler (parallel.py): `steps` calls, several tokens revealed per
#                  call independently given the known ones (exact only at steps = n)
#   "speculative"  any-subset speculative decoding (speculative.py): drafts `draft` positions ahead,
#                  verifies them along the order in the next call; exactly the joint of one token
#                  per call, in fewer calls
SAMPLERS = ("parallel", "speculative")
# Which position comes next (planners.py): "order", the sample's order drawn up front (`order`:
# random or left to right), or chosen call by call from the model's distributions over the
# candidates: "confidence" (the most likely token's probability, highest first), "margin" (top-1
# minus top-2), "entropy" (lowest first), "threshold" (every candidate whose top probability
# reaches `threshold`, at least the best one)
PLANNERS = ("order", "confidence", "margin", "entropy", "threshold")


@dataclass
class SamplingConfig:
    sampler: Literal[SAMPLERS] = "parallel"
    steps: int = 256  # parallel: network calls at most; steps = n is exact ancestral sampling
    # speculative: positions drafted ahead of the known ones in each call; a call then yields up
    # to draft + 1 tokens and feeds up to 2 * draft + 1 rows per sample
    draft: int = 4
    # parallel: revealed fraction after step i of S: "linear" i/S, "cosine" 1 - cos(i/S * pi/2)
    schedule: Literal["linear", "cosine"] = "linear"
    # parallel: "deterministic": the paper's counts (at least one token per step); "binomial": each
    # masked token is revealed with the schedule's probability, exactly as in Lemma 1
    counts: Literal["deterministic", "binomial"] = "deterministic"
    order: Literal[READING_WORDS] = ANY_ORDER.word  # of the positions that are not given
    planner: Literal[PLANNERS] = "order"
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

    def validate(self) -> None:
        require_choices(self, ("sampler", "schedule", "counts", "top_p_rule", "planner"))
        if self.planner != "order" and self.sampler == "speculative":
            raise UsageError(f"the speculative sampler drafts along an order fixed up front: "
                             f"planner={self.planner!r} needs sampler='parallel'")
        if self.reveal < 1:
            raise UsageError(f"reveal must be >= 1 (positions revealed per call), got "
                             f"{self.reveal}")
        if not 0.0 < self.threshold < 1.0:
            raise UsageError(f"threshold must be in (0, 1), got {self.threshold}")
        for name in ("candidates", "block"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1 (None: all), got {getattr(self, name)}")
        if self.steps < 1:
            raise UsageError(f"steps must be >= 1, got {self.steps}")
        if self.draft < 1:
            raise UsageError(f"draft must be >= 1 (positions drafted ahead per call), got "
                             f"{self.draft}")
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
