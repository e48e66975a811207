"""Everything this stack claims about GPUs, checked and measured in one command: `make gpu-report`.

    python benchmarks/gpu_report.py [--out docs/gpu-report.md] [--paper .paper] [--budget 560]
        [--only checks,train,decode,paper,generation,race,e2e] [--train-filter KEY=VALUE]
        [--merge]
    python benchmarks/gpu_report.py --dry-run      (any machine: the plan, its estimates, its fit)
    python benchmarks/gpu_report.py --smoke [--out /tmp/report.md]      (CPU, minutes: what CI runs)

One GPU, one device call of 10 minutes: the report is a plan of items in order of value, each
with an estimate of its seconds on a GPU (the H200 call's own), and it must fit --budget (560 s:
the call's 600 less the wheels' install and the interpreter's start). In order:

  checks      `pytest -m gpu`, the correctness checks first (tests/model/test_gpu_checks.py:
              the order hash and the shuffle bitwise as on a CPU, eager and compiled; the
              float64 inverse CDF under Triton; the head's fp32-accumulating matmul against
              float64; the compiled sampler replayed as CUDA graphs against eager steps;
              tests/trainer/test_gpu_syncs.py: training steps 2..k under
              torch.cuda.set_sync_debug_mode("error") in autocast_bf16 and bf16), then every
              other GPU test (the speed levers' CUDA-only ones among them)
  train small training tokens/s, MFU (both ways) and peak memory of AO-GPT small at seq 1024 with
              the default recipe (ZeRO-1, autocast_bf16, compiled per block) through the real
              trainer (benchmarks/train_throughput.py: DeepSpeed engine, streaming loader, EMA),
              on data made on the spot from Python's own documentation (real English,
              data_prep); 2 more steps profiled, their GPU time per kernel class beside
              benchmarks/step_anatomy.py's prediction (docs/step-anatomy.json)
  decode      one decoder step as trainer/sample.py runs it (replayed as a CUDA graph, and
              compiled too for long runs) beside eager and compiled steps
              (benchmarks/decode_step.py): kernels per step and ms, the numbers that decide
              sample.py's --compile auto; its kernels' time per class beside the anatomy's
              prediction (docs/step-anatomy-decode.json)
  train medium  the default recipe for medium, its kernels' time per class beside the anatomy's
              (docs/step-anatomy-medium.json)
  levers      each speed lever against small's default recipe, one training row each: those of
              trainer/speed.py (one reduction per step, optimizer and EMA in one pass, compiled
              autograd, DeepCompile, CUDA graphs) and one compiled graph for the network (norm,
              AdaLN and residual fused across blocks)
and then, where the budget leaves room, the rest, named in the plan when it does not fit:
  paper       the paper's own trainer and sampler beside ours (benchmarks/paper_baseline.py), its
              code read from --paper (by default the git-ignored .paper/ of this checkout: its
              repository has no licence): both bare training steps compiled (each side's fastest
              on a GPU), and one generation of 32 x 1024 tokens at S = 1024 by each in a fresh
              process, compilation apart (measured on the H200; --merge keeps them)
  generation  the KV-cache decoder against the encoder baseline (benchmarks/generation_speed.py),
              batch 32, n = 1024, S = 64 and 1024, eager/eager and compiled/compiled
  race        the sampling race (benchmarks/sampling_race.py): an AO-GPT and a GPT of the first
              synthetic language (configs/synthetic.yaml, configs/gpt_synthetic.yaml) trained
              on the spot, both at once, then the GPT sampling itself one token per call
              against the AO-GPT's exact left-to-right speculative samples (K = 2 and 4, trees
              of 1 and 3), at batch 1 and 32, compiled and replayed as CUDA graphs
  e2e         `trainer/main.py` with the small recipe for 30 steps in two launches (the loss falls,
              a checkpoint is written, the second launch resumes from it)
  train ...   one change at a time from small's default recipe (flash-attn where installed,
              ZeRO-2 with one reduction per step, ZeRO-2, DeepSpeed's bf16, micro-batch 32, 8
              loader workers, eager), medium with ZeRO-2

--dry-run prints the plan with its estimates and refuses one that would drop a promised item
(the checks, small, decode, medium, the levers; with --only, every item named) or that has no
paper checkout to read when it plans the paper's side; the items it leaves to a second call are
named with the command that measures them (--only ... --merge). A run checks the same before it
starts. While it runs, an item whose estimate no longer fits what is left of the budget is
skipped and named, and no item may run past the budget (its process is ended there).

Every row is written the moment it is measured: the report (markdown, and the same numbers as
JSON next to it) is rewritten after each item, and while a benchmark runs its rows are read from
its JSON as it writes them (benchmarks/results.py), and the GPU tests' results from pytest's
output, line by line. A call cut short keeps every finished row. Every item runs in its own
process, so one failure is reported in its row and the rest still runs. --smoke runs every item
at tiny scale on whatever device there is, without a budget, to check the machinery (CI runs it
on CPU); it writes to --out or a new temporary folder, never to docs/, which holds a GPU's
measurements.

This command parses, checks and runs a plan; the plan (gpu_report_plan.py), the running of its
items (gpu_report_run.py) and the markdown (gpu_report_render.py) are library modules beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from gpu_report_plan import (
    DEFAULT_PAPER,
    PAPER_HOW,
    PARTS,
    check_plan,
    fit,
    paper_problem,
    plan,
    plan_lines,
)
from gpu_report_render import failed_parts, markdown
from gpu_report_run import REPO, Report, environment, run_items

from aogpt import UsageError, cli_entry

DEFAULT_OUT = REPO / "docs" / "gpu-report.md"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"the markdown report (default {DEFAULT_OUT} on a "
                        "GPU; a new temporary folder with --smoke)")
    parser.add_argument("--paper", type=Path, default=DEFAULT_PAPER,
                        help="a folder of the paper's code (github.com/scxue/AO-GPT-MDM), whose "
                             "trainer and sampler are measured beside ours (default .paper)")
    parser.add_argument("--budget", type=float, default=560,
                        help="seconds for the whole report (default 560: a 10-minute device call)")
    parser.add_argument("--only", help=f"comma list of {', '.join(PARTS)} (default: all, the "
                        "ones that do not fit the budget named and left out)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and its estimates, and whether it fits; run nothing")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device (CI)")
    parser.add_argument("--merge", action="store_true",
                        help="keep what is not measured now from the report's existing JSON")
    parser.add_argument("--train-filter", action="append", default=[], metavar="KEY=VALUE",
                        help="measure only the training rows with this setting, e.g. "
                             "precision=autocast_bf16 (repeatable; with --merge the others stay)")
    return check_args(parser.parse_args(argv))


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """The parts and budget asked for, and where the report goes (never over a GPU's report with
    a smoke run's numbers)."""
    args.parts = [p.strip() for p in (args.only or ",".join(PARTS)).split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        raise UsageError(f"--only: unknown part(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(PARTS)}")
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget}")
    args.paper = args.paper.resolve()  # the items run from the repository's root
    if args.dry_run:
        return args
    if not args.smoke and not torch.cuda.is_available():
        raise UsageError("no CUDA GPU here: the report measures GPUs (use --smoke to check it on "
                         "CPU, --dry-run to see its plan)")
    if args.out is None:  # a smoke run's numbers measure nothing: never over a GPU's report
        args.out = (Path(tempfile.mkdtemp(prefix="aogpt_gpu_report_smoke_")) / "gpu-report.md"
                    if args.smoke else DEFAULT_OUT)
    elif args.smoke and args.out.resolve() == DEFAULT_OUT.resolve():
        raise UsageError(f"--smoke --out {args.out}: that is the GPU's report; choose another file")
    if args.out.is_dir():
        raise UsageError(f"--out {args.out} is a folder: give a file name (e.g. report.md)")
    return args


def print_plan(args: argparse.Namespace, lines: list[str], kept: list) -> None:
    """--dry-run's output: the plan, and why a run would refuse to start."""
    print("\n".join(lines))
    problem = paper_problem(args.paper) if any(i.part == "paper" for i in kept) else None
    if problem:
        print(f"note: {problem}: a run would refuse to start ({PAPER_HOW})")


def first_data(args: argparse.Namespace, kept: list, left: list, existing: dict) -> dict:
    """The report's JSON before any item runs: the plan, and with --merge what stays."""
    data = {"smoke": args.smoke, "environment": environment(),
            "plan": [{"part": i.part, "item": i.name, "estimate_s": i.estimate_s} for i in kept],
            "left": [f"{i.name} (~{i.estimate_s:.0f} s)" for i in left], "skipped": []}
    return {**data, **{part: existing[part] for part in PARTS if part in existing}}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    budget = float("inf") if args.smoke else args.budget  # the estimates are a GPU's
    previous = (args.out or DEFAULT_OUT).with_suffix(".json")
    existing = json.loads(previous.read_text()) if args.merge and previous.is_file() else {}
    items = plan(args, existing)
    kept, left = fit(items, budget)
    lines = plan_lines(items, kept, left, args.budget)
    if args.dry_run:
        print_plan(args, lines, kept)
    check_plan(args, kept, left)  # after the plan: what it would drop is seen
    if args.dry_run:
        return 0
    data = first_data(args, kept, left, existing)
    print(f"GPU report on {data['environment']['device']}: {', '.join(args.parts)}, budget "
          f"{budget:.0f} s; writing {args.out}", flush=True)
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="aogpt_gpu_report_") as tmp:
        run_items(Report(args, Path(tmp), markdown, data), kept, budget, started)
    print(f"report: {args.out} and {args.out.with_suffix('.json')} ({data['seconds']:.0f} s)")
    failed = failed_parts(data)
    if failed:
        print(f"failed: {', '.join(failed)} (see the report)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
