"""The GPU report's plan (benchmarks/gpu_report.py): its items in order of value, each with an
estimate of its seconds on a GPU, fitted to the budget of one device call; what does not fit
is named for a second call, and a plan that would drop a promised item is refused."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gpu_report_run as run
from gpu_report_run import LEVERS, REPO, SETTING, Report, setting_of

from aogpt import UsageError

DEFAULT_PAPER = REPO / ".paper"
PAPER_FILES = ("model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py", "ema.py",
               "model_AOGPT_generate.py", "catsample.py")  # paper_baseline.py's PAPER_FILES
PARTS = ("checks", "train", "decode", "paper", "generation", "race", "e2e")
# What the report's commands import (setup.py's requirements that a GPU machine's image may lack:
# its first H200 run lost its training rows to a missing orjson)
NEEDED_MODULES = ("deepspeed", "streaming", "orjson", "xxhash", "zstd", "yaml", "tiktoken",
                  "transformers", "pytest")
# Seconds on one GPU, compilation included: the H200 report's items as they took (docs/
# gpu-report.md, "The call": checks 177, data 1, training rows 27-39 (a profiled one, 2 more
# steps under the profiler: 51-64), decode 41-48, the paper's trainer 116 and sampler 116),
# rounded; generation and e2e from the first H100 report (150, 94); the race not yet measured
# (two trainings of 1,500 small steps at once, then 12 compiled samplers). The report shows each
# item's real seconds beside its estimate: update these from it.
ESTIMATE_S = {"checks": 180, "data": 10, "train": 35, "train profiled": 55, "decode": 50,
              "paper train": 120, "paper generation": 120, "generation": 150, "race": 300,
              "e2e": 100}


def paper_problem(folder: Path) -> str | None:
    """Why `folder` cannot serve as the paper's code, or None."""
    if not folder.is_dir():
        return f"--paper {folder} is not a folder"
    missing = [name for name in PAPER_FILES if not (folder / name).is_file()]
    return f"--paper {folder} lacks {', '.join(missing)}" if missing else None


PAPER_HOW = ("export its files there: git -C AO-GPT-MDM show HEAD:FILE > .paper/FILE for "
             f"{', '.join(PAPER_FILES)} (github.com/scxue/AO-GPT-MDM; never commit them), or "
             "leave it out with --only")


@dataclass
class Item:
    part: str  # the --only word that selects it
    name: str
    estimate_s: float
    promised: bool  # the report is refused if it does not fit
    run: Callable[[Report, float], None]  # (report, seconds it may take)
    measured: Callable[[dict], bool]  # whether a report's JSON holds it, without an error


# each speed lever against small's default, those no H200 call has measured against it first:
# the norm + AdaLN + residual fusion across blocks (one compiled graph for the network,
# train.compile_scope), trainer/speed.py's untried ones, and micro-batches of 32 and 64 (the
# H200's profile found the GPU idle 8-24% of a step, waiting on the host's ~10,000 launches:
# twice the sequences per micro-step halves the launches per token, and 14.9 GiB of 141 leaves
# room). The levers measured slower (docs/performance.md) follow with the other changes.
LEVER_CHANGES = [{"scope": "network"}, {"lever": "cuda_graphs"}, {"micro": 32}, {"micro": 64},
                 {"lever": "compiled_autograd"}, {"lever": "deepcompile"}]
MEASURED_SLOWER = [{"lever": "coalesce_grad_reduction"}, {"lever": "fused_optimizer_ema"}]
assert {c["lever"] for c in LEVER_CHANGES + MEASURED_SLOWER if "lever" in c} == set(LEVERS)


def train_grid(smoke: bool) -> list[dict]:
    """The training configurations measured, most important first: the default recipe for small
    and medium (their kernels profiled per class of the anatomy), each speed lever against small's
    default, then one other change at a time from it."""
    if smoke:
        return [{"preset": "tiny", "zero": 1, "precision": "fp32", "compile": False, "attn": "sdpa",
                 "scope": "block", "micro": 4, "workers": 2, "lever": "", "profile": True}]
    from aogpt.model.attention import flash_attn_func

    default = {"zero": 1, "precision": "autocast_bf16", "compile": True, "attn": "sdpa",
               "scope": "block", "micro": 16, "workers": 2, "lever": ""}
    changes = [*MEASURED_SLOWER, {"zero": 2, "lever": "coalesce_grad_reduction"}, {"zero": 2},
               {"precision": "bf16"}, {"workers": 8}, {"compile": False}]
    if flash_attn_func is not None:  # not on the lent machines so far: not promised
        changes.insert(0, {"attn": "flash_attn"})
    grid = [{"preset": "small", **default, "profile": True},
            {"preset": "medium", **default, "profile": True}]
    grid += [{"preset": "small", **default, **change} for change in LEVER_CHANGES + changes]
    return grid + [{"preset": "medium", **default, "zero": 2}]


LEVER_ROWS = len(LEVER_CHANGES)  # after the two default rows


def selected(grid: list[dict], filters: list[str]) -> list[dict]:
    """The grid rows whose settings match every KEY=VALUE filter (compared as text; VALUE may
    list alternatives, KEY=A|B, and an empty one: lever=|cuda_graphs is the default row and that
    lever's)."""
    wanted = [f.split("=", 1) for f in filters]
    bad = [f for f, w in zip(filters, wanted, strict=True) if len(w) != 2 or w[0] not in SETTING]
    if bad:
        raise UsageError(f"--train-filter {bad[0]}: use KEY=VALUE with KEY in {', '.join(SETTING)}")
    for key, value in wanted:  # a value no row has (a typo) would leave the call nothing to do
        known = {str(setting_of(row, key)) for row in grid}
        if not set(value.split("|")) & known:
            raise UsageError(f"--train-filter {key}={value}: no training row has it; {key} is "
                             f"one of {', '.join(repr(v) for v in sorted(known))}")
    return [row for row in grid
            if all(str(setting_of(row, k)) in v.split("|") for k, v in wanted)]


def describe(setting: dict) -> str:
    """A training row's name: what it changes from small's default recipe."""
    default = train_grid(False)[0]
    changed = [f"{k} {setting[k]}" for k in SETTING[1:] if setting[k] != default[k]]
    changed = [change.removeprefix("lever ") for change in changed]
    return f"train {setting['preset']}" + (f" ({', '.join(changed)})" if changed
                                           else " (default recipe)")


def _holds(part: str) -> Callable[[dict], bool]:
    return lambda report: part in report and not report[part].get("error")


def _holds_row(setting: dict) -> Callable[[dict], bool]:
    return lambda report: any(all(setting_of(row, k) == setting[k] for k in SETTING)
                              and "error" not in row for row in report.get("train", []))


def _holds_paper(part: str) -> Callable[[dict], bool]:
    return lambda report: (bool(report.get("paper", {}).get(part))
                           and f"{part}_error" not in report["paper"])


def plan(args: argparse.Namespace, existing: dict) -> list[Item]:
    """Every item the selected parts hold, in order of value (all_items). With --merge (and no
    --only), the items `existing` (the report's JSON) holds are left out, save the rows
    --train-filter names: a second call measures the rest."""
    items = [item for item in all_items(args) if item.part in args.parts]
    if args.merge and args.only is None:
        filtered = bool(args.train_filter)
        items = [item for item in items
                 if not item.measured(existing) or (filtered and item.part == "train")]
    if any(item.part in ("train", "e2e") for item in items):  # before the first that needs it
        at = next(n for n, item in enumerate(items) if item.part in ("train", "e2e"))
        items.insert(at, Item("data", "data: Python's documentation, tokenized",
                              ESTIMATE_S["data"], True, run.make_data, lambda report: False))
    return items


def all_items(args: argparse.Namespace) -> list[Item]:
    """The checks; small's training (its kernels profiled per class), the decode step (the
    same), medium's training and each speed lever against small's default (promised: the plan
    must fit them); then the paper side and the rest. With --only, every item of the parts
    named is promised but the training grid beyond those rows (its rows are measured as the
    budget allows and the rest named for a --merge call: `--only train` runs, where refusing it
    would cost a device call), and with --train-filter every training row it selects."""
    chosen, filtered = args.only is not None, bool(args.train_filter)
    grid = selected(train_grid(args.smoke), args.train_filter)
    promised = 1 if args.smoke else 2 + LEVER_ROWS

    def train(settings: list[dict], promised: bool) -> list[Item]:
        return [Item("train", describe(s),
                     ESTIMATE_S["train profiled" if s.get("profile") else "train"],
                     promised or filtered,
                     run.train_row(s, describe(s)), _holds_row(s)) for s in settings]

    return [Item("checks", "checks: pytest -m gpu, correctness first", ESTIMATE_S["checks"],
                 True, run.checks, _holds("checks")),
            *train(grid[:1], True),
            Item("decode", "decode: one step as sample.py runs it, and the others",
                 ESTIMATE_S["decode"], True, run.decode, _holds("decode")),
            *train(grid[1:promised], True), *paper_items(chosen),
            Item("generation", "generation: decoder vs encoder, S = 64 and 1024",
                 ESTIMATE_S["generation"], chosen, run.generation, _holds("generation")),
            Item("race", "race: exact left-to-right samples against a GPT, batch 1 and 32",
                 ESTIMATE_S["race"], chosen, run.race, _holds("race")),
            Item("e2e", "e2e: trainer/main.py, 30 steps in two launches", ESTIMATE_S["e2e"],
                 chosen, run.end_to_end, lambda report: report.get("e2e", {}).get("ok", False)),
            *train(grid[promised:], False)]


def paper_items(promised: bool) -> list[Item]:
    """The paper's trainer and sampler beside ours: measured once on the H200 (docs/
    gpu-report.md) and kept by --merge, so promised only when named with --only."""
    return [Item("paper", "paper: both trainers' bare steps, compiled", ESTIMATE_S["paper train"],
                 promised, run.paper_part("train"), _holds_paper("train")),
            Item("paper", "paper: both samplers, fresh processes (32 x 1024 tokens, S = 1024)",
                 ESTIMATE_S["paper generation"], promised, run.paper_part("generation"),
                 _holds_paper("generation"))]


def fit(items: list[Item], budget: float) -> tuple[list[Item], list[Item]]:
    """The items that fit the budget in plan order, and those left out."""
    kept, left, total = [], [], 0.0
    for item in items:
        if total + item.estimate_s <= budget:
            kept.append(item)
            total += item.estimate_s
        else:
            left.append(item)
    return kept, left


def plan_lines(items: list[Item], kept: list[Item], left: list[Item], budget: float) -> list[str]:
    """The plan as --dry-run prints it: each kept item's estimate and running total, then what
    is left for a second call."""
    total = sum(item.estimate_s for item in kept)
    lines = [f"plan: {len(kept)} items, ~{total:.0f} s of a {budget:.0f} s budget "
             "(estimates: seconds on one GPU, compilation included)",
             f"  {'s':>5} {'by':>5}  item"]
    elapsed = 0.0
    for item in kept:
        elapsed += item.estimate_s
        lines.append(f"  {item.estimate_s:>5.0f} {elapsed:>5.0f}  {item.name}")
    if left:
        lines.append("left for a second call (make gpu-report REPORT_FLAGS=--merge measures what "
                     "the report lacks):")
        lines += [f"  {item.estimate_s:>5.0f}        {item.name}" for item in left]
    return lines


def check_plan(args: argparse.Namespace, kept: list[Item], left: list[Item]) -> None:
    """Refuses a plan that would drop a promised item, or read the paper's code from nowhere."""
    dropped = [item for item in left if item.promised]
    if dropped:
        raise UsageError(
            f"the plan does not fit --budget {args.budget:.0f} s: it would drop "
            f"{'; '.join(f'{i.name} (~{i.estimate_s:.0f} s)' for i in dropped)}; raise --budget "
            "or name fewer parts with --only")
    missing = [name for name in NEEDED_MODULES if importlib.util.find_spec(name) is None]
    if missing and not args.dry_run:  # found now, not after minutes of device time
        raise UsageError(
            f"this machine lacks the Python package(s) {', '.join(missing)} that the report's "
            "commands import: add their wheels to the folder you install from (on the lent GPU "
            "machine, .whl: pip download --no-deps --only-binary=:all: --python-version 3.12 "
            f"--platform manylinux2014_x86_64 -d .whl {' '.join(missing)})")
    problem = paper_problem(args.paper) if any(i.part == "paper" for i in kept) else None
    if problem and not args.dry_run:
        raise UsageError(f"{problem}: the paper's trainer and sampler cannot be measured; "
                         + PAPER_HOW)
