"""Generation orders: which permutation of positions each training sequence is read in.

An order is a (b, t) int64 tensor whose row is a permutation of 0..t-1: orders[:, k] is the
original position of the k-th token read (the identity is left to right). `shuffle` puts a
sequence in its order, `unshuffle` puts per-order values back in their original positions.

OrderSampler draws them for training. Every random number is a counter-based hash of
(seed, step, sample index, position), so a sample's order depends on nothing else: not on the
batch it sits in, the world size, the rank or what was drawn before. Resuming or changing the
number of GPUs reproduces the same orders, and no per-sample Python loop or Generator is needed.

Two kinds need more than counters: order.kind=planner reads a share of the sequences in the
order a planner takes on them given the model (model/planned_orders.py: TrainingOrders wraps
this sampler, which draws the rest), and order.weighting=bell weighs the k-th prediction of every
order by how much of the sequence it sees (prediction_weights).

READINGS names the two ways a sequence is read (left to right, any order) once for every
command, ORDER_KINDS the ways training draws its orders, WEIGHTINGS how its predictions count,
and Stream numbers every independent stream of random numbers of the project. Each is a closed
vocabulary: a table defines its words, and every place that does something per word dispatches
through a table of its own that is checked against them at import (per_reading), so a new word
cannot fall through an `if` into another word's behaviour (docs/extending.md lists the tables).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import torch

from aogpt import UsageError, check_input_file

# ---- the readings: one vocabulary for every command ----------------------------------------------


@dataclass(frozen=True)
class Reading:
    """A way of reading a sequence, named once for training, evaluation, sampling and metrics."""

    # what commands take and write: order.kind, evaluate.py's --orders, --ensemble-base and its
    # JSON keys, sample.py's --order, lm-eval's order=, SamplingConfig.order
    word: str
    # the suffix of its metrics (loss_<metric>, val_loss_<metric>, eval/<set>/<weights>/<metric>_
    # <nll|ppl>): names in metrics.jsonl and wandb that must never change
    metric: str
    label: str  # its English, in messages and plots
    aliases: tuple[str, ...]  # other words every command accepts for it

    @property
    def names(self) -> tuple[str, ...]:
        return (self.word, *self.aliases)

    def spelled(self) -> str:
        """'l2r (also ltr, ...)': the word and its aliases, as messages and help texts list them."""
        return f"{self.word} (also {', '.join(self.aliases)})"


LEFT_TO_RIGHT = Reading("l2r", "l2r", "left to right", ("ltr", "left_to_right"))
# random orders drawn uniformly: the any-order (AO-AR) loss, the masked diffusion model's bound
ANY_ORDER = Reading("random", "ao", "any order", ("uniform", "ao", "any", "any_order"))
READINGS = (LEFT_TO_RIGHT, ANY_ORDER)
READING_WORDS = tuple(reading.word for reading in READINGS)
_BY_NAME = {name: reading for reading in READINGS for name in reading.names}
ALIASES = {alias: reading.word for reading in READINGS for alias in reading.aliases}


def reading_named(word: str, what: str) -> Reading:
    """The reading a word names (its canonical word or an alias); UsageError naming `what` (the
    flag or setting that gave it) and the accepted words otherwise."""
    if word not in _BY_NAME:
        raise UsageError(f"{what}: {word!r} names no order: use "
                         f"{' or '.join(reading.spelled() for reading in READINGS)}")
    return _BY_NAME[word]


# Every table outside this file that does something per reading, as "file NAME": each is built by
# per_reading, so that a reading added to READINGS fails at import until each of them has its
# entry (the sampler would otherwise read it left to right, the evaluator drop it).
READING_SITES = (
    "model/sampler/engine.py ORDER_KEYS",  # the order a sample's positions are generated in
    "trainer/evaluation.py READING_SCORES",  # the orders a text is scored along
    "trainer/lm_harness.py LM_EVAL_READINGS",  # scored by lm-eval, or refused with the reason
    "tools/plot_metrics.py STYLES",  # its curves' line style
)
_Entry = TypeVar("_Entry")


class UnhandledReading(Exception):
    """A table keyed by reading does not match READINGS: a programming error, raised at import."""


def per_reading(site: str, entries: dict[str, _Entry]) -> dict[str, _Entry]:
    """entries, a site's table keyed by reading word, checked to have one entry per reading of
    READINGS and no other; UnhandledReading naming every site to extend otherwise."""
    if site not in READING_SITES:
        raise UnhandledReading(f"{site} is keyed by reading but not listed in model/orders.py "
                               "READING_SITES: add it there, so that a new reading names it")
    missing = [word for word in READING_WORDS if word not in entries]
    unknown = [word for word in entries if word not in READING_WORDS]
    if missing or unknown:
        what = (f"has {', '.join(map(repr, missing))}, which {site} does not handle" if missing
                else f"has no {', '.join(map(repr, unknown))}, which {site} names")
        raise UnhandledReading(
            f"model/orders.py READINGS {what}: a reading needs an entry in each of "
            f"{', '.join(READING_SITES)} (docs/extending.md, 'A new reading')")
    return entries


# The planners a training order can follow (model/sampler/planners.py scores them): each reveals
# a fixed number of positions per call, so a sequence's order is a function of its tokens.
TRAINING_PLANNERS = ("confidence", "margin", "entropy")
# planner: whose weights the planner's pass runs on (order.planner_weights): the network being
# trained, or the EMA of its weights (a copy made once per optimizer step)
PLANNER_WEIGHTS = ("current", "ema")


@dataclass
class OrderConfig:
    """How the generation order of each training sequence is drawn."""

    # mixture: left-to-right with probability p_left_to_right, else any order (the paper, p = 0.1)
    # random (also uniform): any order; l2r: left to right; fixed: one random order for every
    # sample; blockwise: contiguous blocks of block_size, see block_mode; planner: the order
    # `planner` takes on the sequence given the model with probability p_planner, else any order.
    kind: Literal[KINDS] = field(default="mixture", metadata={"aliases": ALIASES})
    p_left_to_right: float = 0.1
    # p_left_to_right moves to p_left_to_right_end over schedule_steps (constant: never moves).
    schedule: Literal["constant", "linear", "step", "cosine"] = "constant"
    p_left_to_right_end: float = 0.0
    schedule_steps: int = 0
    fixed_seed: int = 0  # seed of the fixed order, recorded with the run
    fixed_file: str | None = None  # or a file holding the order (a permutation of 0..n-1)
    block_size: int = 64
    # within_blocks: blocks stay left to right, tokens inside each block in random order;
    # across_blocks: blocks in random order, tokens inside each block left to right.
    block_mode: Literal["within_blocks", "across_blocks"] = "within_blocks"
    # blockwise: True draws one block-structured order from fixed_seed for every sample (the
    # paper's "fixed block-wise random" of Fig. 2a); False draws a fresh one per sample and step.
    blockwise_fixed: bool = True
    # planner: whose order is trained, as the sampler's planner of that name picks the next
    # position (docs/orders.md)
    planner: Literal[TRAINING_PLANNERS] = "margin"
    p_planner: float = 0.5  # planner: the share of sequences read in the planner's order
    # planner: positions revealed between two scorings of the remaining ones (1: the order of one
    # call per position, as a planner decodes; R: about R times cheaper)
    refresh: int = 1
    # planner: how many positions are given first, [min, max]: a uniform number in that range,
    # read in position order, as the sampler reads a prompt or a puzzle's clues
    planner_givens: list[int] = field(default_factory=lambda: [0, 0])
    # planner: the weights the planner scores with: "current" (the network being trained) or
    # "ema" (the EMA's, the weights evaluation and sampling use: steadier orders, one copy of the
    # full weights per optimizer step, and it plans under ZeRO-3 too)
    planner_weights: Literal[PLANNER_WEIGHTS] = "current"
    # how the k-th prediction of an order counts in the loss: uniform (all alike: the any-order
    # loss, the paper's) or bell (a Gaussian in the share of the sequence it sees, (k + 1/2) / n,
    # centred on 1/2 with standard deviation bell_width, scaled to mean 1: docs/orders.md).
    weighting: Literal[WEIGHTING_NAMES] = "uniform"
    bell_width: float = 0.25  # bell: the Gaussian's standard deviation, in shares of the sequence

    def __post_init__(self):
        self.kind = ALIASES.get(self.kind, self.kind)  # an alias is kept as its reading's word

    def validate(self, seq_len: int) -> None:
        """Checks the fields against each other and against the sequence length orders permute."""
        for name in ("p_left_to_right", "p_left_to_right_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"order.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.schedule != "constant" and self.schedule_steps <= 0:
            raise UsageError(f"order.schedule={self.schedule} needs order.schedule_steps > 0")
        if self.block_size <= 0:
            raise UsageError(f"order.block_size must be positive, got {self.block_size}")
        if self.kind == "blockwise" and seq_len % self.block_size:
            raise UsageError(f"order.block_size ({self.block_size}) must divide the sequence "
                             f"length ({seq_len})")
        if self.fixed_file is not None and self.kind != "fixed":
            raise UsageError(f"order.fixed_file is only read by order.kind=fixed, not {self.kind}")
        if not 0.0 <= self.p_planner <= 1.0:
            raise UsageError(f"order.p_planner must be in [0, 1], got {self.p_planner}")
        if not 1 <= self.refresh <= seq_len:
            raise UsageError(f"order.refresh must be in 1..{seq_len} (positions the planner "
                             f"reveals per call), got {self.refresh}")
        givens = self.planner_givens
        if len(givens) != 2 or not 0 <= givens[0] <= givens[1] < seq_len:
            raise UsageError(f"order.planner_givens must be [min, max] with 0 <= min <= max < "
                             f"{seq_len} (at least one position is left to the planner), got "
                             f"{givens}")
        if self.bell_width <= 0:
            raise UsageError(f"order.bell_width must be positive, got {self.bell_width}")

    def describe(self) -> str:
        """The orders in a few words, for a run's banner."""
        return ORDER_KINDS[self.kind].describe(self) + WEIGHTINGS[self.weighting].describe(self)


def shuffle(x: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """x in generation order: out[:, k] = x[:, orders[:, k]]. x is (b, t) or (b, t, ...)."""
    index = orders.view(*orders.shape, *(1,) * (x.dim() - 2)).expand_as(x)
    return x.gather(1, index)


def unshuffle(x: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """Inverse of `shuffle`: values given in generation order back at their original positions."""
    index = orders.view(*orders.shape, *(1,) * (x.dim() - 2)).expand_as(x)
    return torch.empty_like(x).scatter_(1, index, x)


# ---- counter-based random numbers ----------------------------------------------------------------
# splitmix64's finalizer in int64 arithmetic: multiplication wraps modulo 2^64 as in C, and a
# logical right shift is an arithmetic one with the sign-extended bits masked off.

def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)


class Stream(IntEnum):
    """The ids that keep the project's streams of counter-based random numbers independent (so
    that e.g. the mixture's coin never correlates with the order it picks): each use hashes its
    own id among its counters. An id is never reused nor renumbered: its value is part of every
    order, sample and ensemble member drawn with it, and a change would change them all."""

    PERMUTATION = 1  # OrderSampler: a random order's keys (per block for blockwise within_blocks)
    COIN = 2  # OrderSampler: the mixture's coin, left to right or not, per sample and step
    BLOCKS = 3  # OrderSampler: blockwise across_blocks' order of the blocks
    PLANNED = 4  # TrainingOrders: the coin that gives a sample the planner's order, or not
    GIVEN = 5  # TrainingOrders: how many positions a planned sample has given first
    PLANNER_SAMPLE = 6  # TrainingOrders: the id of a planned sample in the sampler (tie breaks)
    SAMPLE_ORDER = 11  # KVCacheSampler: the order of the positions not given
    REVEAL = 12  # KVCacheSampler: the binomial counts, a uniform per position
    TOKEN = 13  # KVCacheSampler: the uniform each position's token (or draft) is drawn with
    ACCEPT = 14  # speculative sampling: the uniform that accepts or rejects a position's draft
    RESIDUAL = 15  # speculative sampling: the uniform that redraws a rejected draft's position
    PLAN = 16  # planners: the uniform that breaks a tie between two positions' scores
    ENSEMBLE_TARGETS = 101  # evaluation: the targets the context-order ensemble scores
    ENSEMBLE_MEMBERS = 102  # evaluation: the ensemble members' re-permuted contexts


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def _opaque(counter: torch.Tensor) -> torch.Tensor:
    """counter, the same bits, but a value Inductor cannot fold into an index expression. Without
    it, (arange + 1) * golden becomes the index arithmetic golden + golden * x, which Triton
    computes in int32 and refuses to compile (torch 2.11 on an H200: "Scalar
    -7046029254386353131 is out of range for type int32", every compiled training step). Inductor
    propagates only +, -, *, //, %, min, max and casts into indices; a bitwise or ends that."""
    return counter | 0


def counter_hash(*counters: int | torch.Tensor) -> torch.Tensor:
    """A 64-bit pseudo-random key per combination of the (broadcast) integer counters.

    The result lives on the device of the tensor counters (the CPU if all are Python ints), and
    Python ints never become tensors: no host-to-device copy, whatever their place in the list.
    """
    device = next((c.device for c in counters if isinstance(c, torch.Tensor)), None)
    z = torch.zeros((), dtype=torch.int64, device=device)
    for counter in counters:
        if isinstance(counter, torch.Tensor):
            z = _mix(z + _opaque(counter.to(torch.int64) + 1) * _GOLDEN)
        else:  # (counter + 1) * golden, wrapped to int64 as the tensor product wraps
            z = _mix(z + _int64(((counter + 1) * _GOLDEN) % (1 << 64)))
    return z


def counter_uniform(*counters: int | torch.Tensor) -> torch.Tensor:
    """Uniform float64 numbers in [0, 1), one per combination of the counters."""
    return _shift_right(counter_hash(*counters), 11).double() * 2.0**-53


def _random_permutations(keys: torch.Tensor) -> torch.Tensor:
    # stable: equal keys (probability ~2^-64) still sort the same on every device
    return torch.argsort(keys, dim=-1, stable=True)


# ---- the sampler ---------------------------------------------------------------------------------


def load_order_file(path: str | Path, seq_len: int) -> torch.Tensor:
    """Reads a fixed order from .txt (whitespace-separated), .json (a list) or .npy; checks it."""
    path = Path(path)
    check_input_file(path, "order.fixed_file", "a .txt, .json or .npy order")
    try:
        if path.suffix == ".npy":
            values = np.load(path, allow_pickle=False).tolist()
        elif path.suffix == ".json":
            values = json.loads(path.read_text())
        elif path.suffix == ".txt":
            values = [int(v) for v in path.read_text().split()]
        else:
            raise UsageError(f"order.fixed_file {path}: unknown format, use .txt, .json or .npy")
    except (ValueError, json.JSONDecodeError) as err:
        raise UsageError(f"order.fixed_file {path} is not a list of integers: {err}") from err
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise UsageError(f"order.fixed_file {path} must hold a flat list of integers")
    if sorted(values) != list(range(seq_len)):
        missing = sorted(set(range(seq_len)) - set(values))[:5]
        raise UsageError(
            f"order.fixed_file {path} is not a permutation of 0..{seq_len - 1} "
            f"({len(values)} entries, {len(set(values))} distinct, first missing: {missing}): "
            "write each position exactly once"
        )
    return torch.tensor(values, dtype=torch.int64)


class OrderSampler:
    """Draws the training orders: orders, is_l2r = sampler(step, sample_indices).

    sample_indices (b,) name the sequences, the same on every rank (the trainer passes each
    sample's index in the dataset), so the result for a sample depends only on (seed, step,
    sample index): not on the rank, micro-batch or world size it is trained in.
    """

    def __init__(self, config: OrderConfig, seq_len: int, seed: int):
        self.config = config
        self.seq_len = seq_len
        self.seed = seed
        config.validate(seq_len)
        self._fixed = self._fixed_order()  # (seq_len,) on the CPU for fixed kinds, else None
        self._fixed_on: dict[torch.device, torch.Tensor] = {}  # copied to each device once
        self._random_orders = self._random  # or its compiled form (compile())

    def compile(self) -> None:
        """Draws random orders through torch.compile: the ~100 small integer ops of the hash and
        the shuffle become a few fused kernels. The same bits as eager (integer arithmetic and a
        stable sort); the step and the mixture's probability enter as device scalars, so a new
        step never recompiles."""
        self._random_orders = torch.compile(self._random, dynamic=False, fullgraph=True)

    def _fixed_order(self) -> torch.Tensor | None:
        c = self.config
        if c.fixed_file is not None:  # order.kind=fixed's (validate refuses it elsewhere)
            return load_order_file(c.fixed_file, self.seq_len)
        if ORDER_KINDS[c.kind].fixed(c):
            return self._draw(c.fixed_seed, 0, torch.zeros(1, dtype=torch.int64))[0]
        return None

    def p_left_to_right(self, step: int) -> float:
        """The mixture's probability of a left-to-right sample at this optimizer step."""
        c = self.config
        start, end = c.p_left_to_right, c.p_left_to_right_end
        if c.schedule == "constant":
            return start
        progress = min(max(step, 0) / c.schedule_steps, 1.0)
        if c.schedule == "step":
            return start if step < c.schedule_steps else end
        if c.schedule == "linear":
            return start + (end - start) * progress
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine

    def __call__(self, step: int, sample_indices: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(b,) global sample indices -> orders (b, seq_len) int64, is_l2r (b,) bool (same
        device)."""
        sample_indices = sample_indices.to(torch.int64)
        b, device = sample_indices.numel(), sample_indices.device
        if self._fixed is not None:  # l2r's identity among them
            if device not in self._fixed_on:
                self._fixed_on[device] = self._fixed.to(device)
            orders = self._fixed_on[device].expand(b, -1).clone()
            identity = torch.arange(self.seq_len, device=device).expand(b, -1)
            return orders, (orders == identity).all(dim=1)
        # made on the device (a fill, no copy from the host): tensors, so a compiled draw is
        # one graph for every step
        step_on_device = torch.full((), step, dtype=torch.int64, device=device)
        p_on_device = torch.full((), self.p_left_to_right(step), dtype=torch.float64, device=device)
        return self._random_orders(step_on_device, sample_indices, p_on_device)

    def _random(self, step: torch.Tensor, sample_indices: torch.Tensor,
                p_left_to_right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Orders of a random kind, and is_l2r: step and p_left_to_right are 0-dim tensors."""
        b, device = sample_indices.numel(), sample_indices.device
        orders = self._draw(self.seed, step, sample_indices)
        if not ORDER_KINDS[self.config.kind].mixture:
            return orders, torch.zeros(b, dtype=torch.bool, device=device)
        is_l2r = counter_uniform(self.seed, step, sample_indices, Stream.COIN) < p_left_to_right
        identity = torch.arange(self.seq_len, device=device).expand(b, -1)
        return torch.where(is_l2r[:, None], identity, orders), is_l2r

    def _draw(self, seed: int, step: int | torch.Tensor, sample_indices: torch.Tensor
              ) -> torch.Tensor:
        """Orders of the configured kind, one per sample index: (b, seq_len)."""
        draw = ORDER_KINDS[self.config.kind].draw
        return draw(self.config, self.seq_len, seed, step, sample_indices[:, None])


# ---- the order kinds -----------------------------------------------------------------------------
# Each draw: (config, seq_len, seed, step, sample indices (b, 1)) -> orders (b, seq_len).

def _identity(config: OrderConfig, t: int, seed: int, step: int | torch.Tensor,
              samples: torch.Tensor) -> torch.Tensor:
    return torch.arange(t, device=samples.device).expand(len(samples), -1)


def _permutations(config: OrderConfig, t: int, seed: int, step: int | torch.Tensor,
                  samples: torch.Tensor) -> torch.Tensor:
    """Uniformly random orders."""
    positions = torch.arange(t, device=samples.device)
    return _random_permutations(counter_hash(seed, step, samples, Stream.PERMUTATION, positions))


def _blocks(config: OrderConfig, t: int, seed: int, step: int | torch.Tensor,
            samples: torch.Tensor) -> torch.Tensor:
    """Orders of contiguous blocks of config.block_size, as config.block_mode says."""
    device, size = samples.device, config.block_size
    n_blocks = t // size
    if config.block_mode == "across_blocks":
        blocks = torch.arange(n_blocks, device=device)
        keys = counter_hash(seed, step, samples, Stream.BLOCKS, blocks)
        block_order = _random_permutations(keys)
        within = torch.arange(size, device=device)
        return (block_order[:, :, None] * size + within).flatten(1)  # (b, n_blocks*size)
    positions = torch.arange(t, device=device).view(n_blocks, size)
    keys = counter_hash(seed, step, samples[:, :, None], Stream.PERMUTATION, positions)
    within = _random_permutations(keys)  # (b, n_blocks, size): a permutation per block
    offsets = torch.arange(n_blocks, device=device)[:, None] * size
    return (within + offsets).flatten(1)


def _always(config: OrderConfig) -> bool:
    return True


def _never(config: OrderConfig) -> bool:
    return False


def _kind_word(config: OrderConfig) -> str:
    return config.kind


def _mixture_words(c: OrderConfig) -> str:
    moves = f" -> {c.p_left_to_right_end}, {c.schedule}" if c.schedule != "constant" else ""
    return f"mixture (p_left_to_right {c.p_left_to_right}{moves})"


def _planner_words(c: OrderConfig) -> str:
    given = "-".join(map(str, sorted(set(c.planner_givens))))
    weights = ", EMA weights" if c.planner_weights == "ema" else ""
    return (f"planner {c.planner} (p_planner {c.p_planner}, refresh {c.refresh}, {given} given "
            f"first{weights})")


@dataclass(frozen=True)
class OrderKind:
    """What order.kind=<word> draws: the one definition of a kind, which OrderConfig accepts and
    OrderSampler follows."""

    draw: Callable[[OrderConfig, int, int, int | torch.Tensor, torch.Tensor], torch.Tensor]
    # one order for every sample and step (drawn once, from order.fixed_seed), or a fresh one each
    fixed: Callable[[OrderConfig], bool] = _never
    mixture: bool = False  # left to right with probability p_left_to_right, else `draw`
    # a share of the orders are a planner's, made from the tokens and the model by
    # model/planned_orders.py's TrainingOrders (`draw` gives the others, and every order where no
    # model is at hand)
    planned: bool = False
    describe: Callable[[OrderConfig], str] = _kind_word  # in a run's banner


ORDER_KINDS = {
    "mixture": OrderKind(_permutations, mixture=True, describe=_mixture_words),
    ANY_ORDER.word: OrderKind(_permutations),
    LEFT_TO_RIGHT.word: OrderKind(_identity, fixed=_always),
    "fixed": OrderKind(_permutations, fixed=_always),  # or order.fixed_file's
    "blockwise": OrderKind(_blocks, fixed=lambda config: config.blockwise_fixed),
    "planner": OrderKind(_permutations, planned=True, describe=_planner_words),
}
KINDS = tuple(ORDER_KINDS)  # order.kind's words


# ---- how the predictions of an order count in the loss -----------------------------------------


def seen_shares(n: int) -> torch.Tensor:
    """(n,) float64: the share of the sequence the k-th prediction of an order sees, (k + 1/2) / n
    (the midpoint of its step: prediction k knows k tokens, the next knows k + 1)."""
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n


def _bell(config: OrderConfig, n: int) -> torch.Tensor:
    """exp(-(u - 1/2)^2 / (2 width^2)) at u = seen_shares(n), divided by its mean: the loss keeps
    its scale, and predictions that see about half the sequence count most."""
    bell = torch.exp(-((seen_shares(n) - 0.5) ** 2) / (2 * config.bell_width ** 2))
    return (bell / bell.mean()).float()


@dataclass(frozen=True)
class Weighting:
    """What order.weighting=<word> does to the loss: the weight of each prediction of an order."""

    # (n,) float32 weights of predictions 0..n-1 of an order, mean 1, or None: every prediction
    # counts alike, the loss is the plain mean and is computed exactly as without weights
    weights: Callable[[OrderConfig, int], torch.Tensor | None]
    describe: Callable[[OrderConfig], str]  # appended to the kind's in a run's banner


WEIGHTINGS = {
    "uniform": Weighting(lambda config, n: None, lambda config: ""),
    "bell": Weighting(_bell, lambda config: f", bell-weighted (width {config.bell_width})"),
}
WEIGHTING_NAMES = tuple(WEIGHTINGS)  # order.weighting's words


def prediction_weights(config: OrderConfig, n: int) -> torch.Tensor | None:
    """The training loss's weight of the k-th prediction of every order of n positions, (n,)
    with mean 1; None for order.weighting=uniform (the model's plain mean, bit for bit)."""
    return WEIGHTINGS[config.weighting].weights(config, n)
