"""The ways of choosing tokens, one closed table (WAYS): the words SamplingConfig.sampler and
.planner take, and everything each way owns besides its strategy's code.

A way is named by one SamplingConfig field, its `picked_by`: "sampler" for a way along the order
drawn up front (parallel, speculative), "planner" for one where the model orders the positions
call by call (planner = FIXED_ORDER leaves the order to the sampler). Each entry owns
    strategy   the class that makes its calls (strategy.py's Strategy protocol)
    about      one line: what it is (help texts, messages)
    options    the SamplingConfig fields it reads beyond the common ones (order, temperature,
               top_p, top_p_rule, top_k, seed), each with its flag, help and check
    fit        its settings fitted to the positions a generation makes: the defaults that depend
               on them, the checks against them (a command's: messages name flags)
    calls      the network calls a batch makes to generate `positions` positions (its time)
    summary    the line trainer/sample.py prints of its samples
    any_order  whether it asks for other positions than the order's next one, which a
               left-to-right GPT cannot give
An entry that lacks a part, or whose strategy lacks a member of the protocol, stops the import of
this module with one line naming what is missing (IncompleteWay), as model/orders.py's
per_reading does for readings. Nothing outside model/sampler/ compares a way's name: callers ask
the table (way_of, WAYS[name], reading, named).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aogpt import UsageError
from aogpt.model.sampler.parallel import ParallelSampling
from aogpt.model.sampler.planners import (
    ConfidencePlanner,
    EntropyPlanner,
    MarginPlanner,
    ThresholdPlanner,
)
from aogpt.model.sampler.speculative import SpeculativeSampling
from aogpt.model.sampler.strategy import ENGINE_STATE, Strategy

if TYPE_CHECKING:
    from aogpt.model.sampler.config import SamplingConfig

PICKERS = ("sampler", "planner")  # the SamplingConfig fields that name a way
FIXED_ORDER = "order"  # planner: none, the order drawn up front (SamplingConfig.order)


class IncompleteWay(Exception):
    """A way of the table lacks a part: a programming error, raised at import."""


def _at_least_one(value: Any) -> bool:
    return value >= 1


@dataclass(frozen=True)
class Option:
    """A SamplingConfig field that some ways read, and its command-line flag."""

    field: str
    help: str  # the flag's (argparse's) help
    type: Callable[[str], Any] = int
    valid: Callable[[Any], bool] = _at_least_one
    must: str = ">= 1"  # what `valid` asks, in a message: "{name} must be {must}, got {value}"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None  # the flag's value in help texts

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def check(self, value: Any, name: str) -> None:
        """UsageError if `value` (None: not given) is out of range; name: the field or flag."""
        if value is not None and not self.valid(value):
            raise UsageError(f"{name} must be {self.must}, got {value}")


def _choice(field_name: str, choices: tuple[str, ...], help: str) -> Option:
    return Option(field_name, help, str, lambda value: value in choices,
                  f"one of {', '.join(choices)}", choices)


def _count(field_name: str, metavar: str, help: str, meaning: str = "") -> Option:
    return Option(field_name, help, must=f">= 1{meaning}", metavar=metavar)


def _count_from_zero(field_name: str, metavar: str, help: str, meaning: str) -> Option:
    return Option(field_name, help, valid=lambda value: value >= 0, must=f">= 0{meaning}",
                  metavar=metavar)


STEPS = _count("steps", "S", "network calls (default: one per position to generate, exact "
                             "ancestral sampling)")
SCHEDULE = _choice("schedule", ("linear", "cosine"),
                   "revealed fraction after step i of S: linear i/S (default) or cosine")
COUNTS = _choice("counts", ("deterministic", "binomial"),
                 "tokens revealed per step: the paper's fixed counts (default) or Lemma 1's "
                 "Binomial ones")
DRAFT = _count("draft", "K", "positions drafted ahead per call (default 4); a call yields at most "
                            "K + 1 tokens", " (positions drafted ahead per call)")
TREE = _count("tree", "C", "candidate tokens kept for each drafted position, verified together "
                         "(a draft tree; default 1: a chain); a call feeds (C - 1) K rows more",
              " (candidates per drafted position)")
TREE_DEPTH = _count_from_zero("tree_depth", "L", "with --tree C > 1: the drafted positions after "
                              "a candidate other than the first also verified on its branch, up "
                              "to L of them (default 0: that candidate ends the call's run); a "
                              "call feeds (C - 1) K L rows more (L at most K - 1)",
                              " (positions verified on a branch)")
PREDRAFT = _count_from_zero("predraft", "R", "where a call redraws a rejected position, draw the "
                            "first R drafts after it from rows that saw only the final tokens, "
                            "not the rejected draft (default 0: they stay pending); a call feeds "
                            "K R rows more (R at most K)", " (fresh drafts after a rejection)")
REVEAL = _count("reveal", "R", "positions revealed per call (default 1)",
                " (positions revealed per call)")
THRESHOLD = Option("threshold", "reveal every candidate whose top probability reaches P, in (0, 1) "
                                "(default 0.9)", float, lambda value: 0.0 < value < 1.0,
                   "in (0, 1) (a top probability)", metavar="P")
CANDIDATES = _count("candidates", "C", "score the next C positions of the sample's order per "
                                       "call (default all)", " (unset: all)")
BLOCK = _count("block", "B", "choose within blocks of B positions, left to right (default: one "
                             "block)", " (unset: one block)")


@dataclass(frozen=True)
class Room:
    """The positions a generation makes: at most `most` in one generate call (the whole text, or
    a sliding window's first chunk) and `each` in every call (per chunk when `chunked`)."""

    most: int
    each: int
    chunked: bool = False

    def __str__(self) -> str:
        return f"the {self.each} positions to generate{' per chunk' if self.chunked else ''}"


_MISSING: Any = object()


@dataclass(frozen=True)
class Way:
    """One way of choosing tokens: the parts above, every one required."""

    name: str
    picked_by: str = field(default=_MISSING)
    strategy: type[Strategy] = field(default=_MISSING)
    about: str = field(default=_MISSING)
    options: tuple[Option, ...] = field(default=_MISSING)
    # (config, the option fields given, room) -> (config, a note to print or None)
    fit: Callable[[SamplingConfig, set[str], Room], tuple[SamplingConfig, str | None]] = field(
        default=_MISSING)
    calls: Callable[[SamplingConfig, int], int] = field(default=_MISSING)
    # (config, sample records, positions generated per sample) -> one line
    summary: Callable[[SamplingConfig, list[dict], int], str] = field(default=_MISSING)
    any_order: bool = field(default=_MISSING)

    def __post_init__(self):
        missing = [part for part in PARTS if getattr(self, part) is _MISSING]
        if missing:
            self._refuse(f"has no {', '.join(missing)}")
        if self.picked_by not in PICKERS:
            self._refuse(f"is picked by {self.picked_by!r}, none of {', '.join(PICKERS)}")
        if Strategy not in getattr(self.strategy, "__mro__", ()):
            self._refuse(f"has a strategy, {self.strategy!r}, that is no strategy.Strategy")
        undefined = sorted(self.strategy.__abstractmethods__)
        if undefined:
            self._refuse(f"has a strategy, {self.strategy.__name__}, that does not define "
                         f"{', '.join(undefined)}")
        if not self.strategy.writes <= ENGINE_STATE or "ordered" not in self.strategy.writes:
            self._refuse(f"has a strategy that writes {sorted(self.strategy.writes)}: it writes "
                         f"`ordered` and may write {', '.join(sorted(ENGINE_STATE))} only")

    def _refuse(self, what: str) -> None:
        raise IncompleteWay(f"model/sampler/ways.py: the way {self.name!r} {what}: every way owns "
                            f"{', '.join(PARTS)} (docs/extending.md, 'A new way of choosing "
                            "tokens')")

    @property
    def spelled(self) -> str:
        """How a command's flags name it: --sampler parallel, --planner margin."""
        return f"--{self.picked_by} {self.name}"

    def reads(self, option: Option) -> bool:
        return option in self.options

    def check(self, config: SamplingConfig) -> None:
        """UsageError for a field it reads that is out of range (named as the field)."""
        for option in self.options:
            option.check(getattr(config, option.field), option.field)


# the parts a way owns: every field of Way but its name, each required
PARTS = tuple(part.name for part in dataclasses.fields(Way) if part.default is _MISSING)


# ---- the parts ---------------------------------------------------------------------------------

def _fit_steps(config: SamplingConfig, given: set[str], room: Room):
    """Steps given must fit the positions of every call; left out, one per position."""
    if STEPS.field not in given:
        return dataclasses.replace(config, steps=room.most), None
    if config.steps > room.each:
        raise UsageError(f"{STEPS.flag} must be in 1..{room.each} ({room}), got {config.steps}")
    return config, None


def _fit_speculative(config: SamplingConfig, given: set[str], room: Room):
    """A draft reaching past the positions of a call is clipped, and said; branches asked for
    without a tree to branch from are refused."""
    if TREE_DEPTH.field in given and config.tree_depth > 0 and config.tree == 1:
        raise UsageError(f"{TREE_DEPTH.flag} {config.tree_depth} branches from the candidates "
                         f"after the first of each drafted position: give {TREE.flag} C > 1 too")
    if config.draft < room.each:
        return config, None
    draft = max(1, room.each - 1)
    return (dataclasses.replace(config, draft=draft),
            f"note: {DRAFT.flag} {config.draft} reaches past {room}: drafting {draft}")


def _fit_within(config: SamplingConfig, given: set[str], room: Room):
    """A planner's counts of positions (--reveal, --candidates, --block) must fit the positions
    of a call: beyond them each would mean all of them, which is said by leaving it out."""
    for option in (REVEAL, CANDIDATES, BLOCK):
        value = getattr(config, option.field)
        if option.field in given and value > room.each:
            raise UsageError(f"{option.flag} must be in 1..{room.each} ({room}), got {value}")
    return config, None


def _planner_calls(config: SamplingConfig, positions: int) -> int:
    """A call per `reveal` positions of each block, and one more scoring the last call's later
    reveals (given positions inside the blocks aside)."""
    reveal = min(config.reveal, config.candidates or config.reveal)
    block = config.block or positions
    spans = [block] * (positions // block) + ([positions % block] if positions % block else [])
    return sum(-(-span // reveal) for span in spans) + ((spans[-1] - 1) % reveal != 0)


def _mean_calls(records: list[dict]) -> float:
    return sum(r["network_calls"] for r in records) / len(records)


def _parallel_summary(config: SamplingConfig, records: list[dict], positions: int) -> str:
    if "seams" in records[0]:  # a sliding window: steps per chunk
        return f"{_mean_calls(records):.1f} network calls per sample"
    return f"{config.steps} steps"


def _speculative_summary(config: SamplingConfig, records: list[dict], positions: int) -> str:
    decided = sum(r["drafts_decided"] for r in records)
    accepted = sum(r["drafts_accepted"] for r in records)
    tree = f", tree {config.tree}" if config.tree > 1 else ""
    if config.branch_depth:
        tree += f" depth {config.branch_depth}"
    if config.fresh_drafts:
        tree += f", predraft {config.fresh_drafts}"
    return (f"speculative (draft {config.draft}{tree}): {_mean_calls(records) / positions:.3f} "
            f"network calls per token, {accepted / max(decided, 1):.0%} of {decided:,} drafts "
            "accepted")


def _planner_summary(config: SamplingConfig, records: list[dict], positions: int) -> str:
    nll = -sum(r["log_likelihood"] for r in records) / len(records) / positions
    return (f"{config.planner} planner: {_mean_calls(records):.1f} network calls per sample, "
            f"{nll:.4f} nats per generated token along the orders taken")


def _planner(name: str, strategy: type[Strategy], about: str, option: Option,
             calls: Callable[[SamplingConfig, int], int] = _planner_calls) -> Way:
    return Way(name, "planner", strategy, about, (option, CANDIDATES, BLOCK), _fit_within, calls,
               _planner_summary, any_order=True)


def _table(*ways: Way) -> dict[str, Way]:
    names = [way.name for way in ways]
    twice = {name for name in names if names.count(name) > 1} | ({FIXED_ORDER} & set(names))
    if twice:
        raise IncompleteWay(f"model/sampler/ways.py names {', '.join(sorted(twice))} twice (or "
                            f"as the fixed order, {FIXED_ORDER!r}): each way has one name")
    return {way.name: way for way in ways}


WAYS = _table(
    Way("parallel", "sampler", ParallelSampling,
        "the paper's: S network calls, several positions drawn independently per call",
        (STEPS, SCHEDULE, COUNTS), _fit_steps,
        lambda config, positions: min(config.steps, positions), _parallel_summary,
        any_order=False),
    Way("speculative", "sampler", SpeculativeSampling,
        "exact (the joint of one token per call) in fewer calls: drafts K positions ahead and "
        "verifies them (arXiv 2504.20456)",
        (DRAFT, TREE, TREE_DEPTH, PREDRAFT), _fit_speculative, lambda config, positions: positions,
        _speculative_summary,
        any_order=True),
    _planner("confidence", ConfidencePlanner,
             "reveals the positions whose most likely token is likeliest", REVEAL),
    _planner("margin", MarginPlanner,
             "reveals the positions of widest top-1 minus top-2 margin", REVEAL),
    _planner("entropy", EntropyPlanner, "reveals the positions of lowest entropy", REVEAL),
    _planner("threshold", ThresholdPlanner,
             "reveals every position whose top probability reaches P (at least one)", THRESHOLD,
             lambda config, positions: positions),  # at most: fewer as several reach it
)
# every option once, in the table's order
OPTIONS = tuple(dict.fromkeys(option for way in WAYS.values() for option in way.options))


def named(picked_by: str) -> tuple[str, ...]:
    """The names of the ways one SamplingConfig field picks, in the table's order."""
    return tuple(name for name, way in WAYS.items() if way.picked_by == picked_by)


def reading(option: Option) -> tuple[Way, ...]:
    """The ways that read an option."""
    return tuple(way for way in WAYS.values() if way.reads(option))


SAMPLERS = named("sampler")
PLANNERS = (FIXED_ORDER, *named("planner"))
CHOICES = {"sampler": SAMPLERS, "planner": PLANNERS}  # of each picker
DEFAULT_SAMPLER = SAMPLERS[0]  # SamplingConfig's; a planner runs with it, which it ignores


def way_of(config: SamplingConfig) -> Way:
    """The way config picks: its planner's unless that is FIXED_ORDER, else its sampler's.
    UsageError for a name of no way, or a planner with another sampler than the default."""
    for picker in PICKERS:
        name = getattr(config, picker)
        if name not in CHOICES[picker]:
            raise UsageError(f"{picker}={name!r} is unknown: use one of "
                             f"{', '.join(CHOICES[picker])}")
    if config.planner == FIXED_ORDER:
        return WAYS[config.sampler]
    if config.sampler != DEFAULT_SAMPLER:
        raise UsageError(f"planner={config.planner!r} orders the positions call by call, "
                         f"sampler={config.sampler!r} along an order fixed up front: "
                         f"planner={config.planner!r} needs sampler={DEFAULT_SAMPLER!r}")
    return WAYS[config.planner]
