"""Sudoku solved by an any-order model: how many puzzles each way of choosing the next cell solves,
at equal network calls.

    python benchmarks/sudoku_planners.py --ckpt RUN --data data/sudoku [--puzzles 200]
        [--temperatures 0,1] [--threshold 0.9] [--batch-size 200] [--device auto]
        [--json OUT] [--table docs/sudoku-planners.md] [--force] [--smoke]

The model (configs/sudoku.yaml) learned solved grids in any order; a puzzle is solved by infilling
its blanks given its clues (the sampler's given tokens), one cell at a time, and is solved when
the filled grid solves the puzzle (data_prep/sudoku.py's verifier: every row, column and box
holds each digit once, and no given changed). The held-out puzzles of the data folder
(data_prep/sudoku_to_mds.py) come in groups of equal givens, so every puzzle of a batch has the
same blanks. Each method fills them:

    random order    the order drawn up front, uniformly (the paper's sampler, planner=order)
    left to right   row by row
    confidence      next, the blank whose most likely digit is most likely (planner=confidence)
    margin          ... whose top two digits' probabilities differ most (Kim et al.'s choice)
    entropy         ... whose distribution has the least entropy
    threshold       every blank whose top probability reaches --threshold, at least one per call

at two budgets: one network call per blank (the planners reveal 1 cell a call; the fixed orders
run the parallel sampler at steps = blanks), and half of that (reveal 2; steps = blanks / 2);
threshold takes the calls it takes (reported). Each at temperature 0 (the most likely digit) and,
with --temperatures, sampled. A row reports the solved rate overall, by givens and by the
technique a puzzle needs (naked singles, singles, search), the mean calls and rows a puzzle cost
(each sample's own: a planner scores every remaining blank in a call, so its calls are wider),
the cells filled right, and its ratio to random order at the same budget and temperature.
Every method sees the same puzzles with the same sample ids (the same random order, the same
uniforms). The JSON is rewritten after every row; --table writes the markdown table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import ResultsFile  # noqa: E402

from aogpt import UsageError, check_counts, cli_entry  # noqa: E402
from aogpt.data_prep.sudoku import NAME, TECHNIQUES, Puzzle, Sudoku, load_puzzles  # noqa: E402
from aogpt.files import OutputFile, check_output_file, write_text_atomic  # noqa: E402
from aogpt.model import load_checkpoint  # noqa: E402
from aogpt.model.checkpoint import locate_checkpoint, provenance  # noqa: E402
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT  # noqa: E402
from aogpt.model.precision import device_name, reproducible_dtype, resolve_device  # noqa: E402
from aogpt.model.sampler import KVCacheSampler, SamplingConfig  # noqa: E402
from aogpt.model.sampler.ways import THRESHOLD, WAYS, named  # noqa: E402
from aogpt.progress import duration  # noqa: E402

RANDOM_ORDER, LEFT_TO_RIGHT_ORDER = "random order", LEFT_TO_RIGHT.label  # orders drawn up front
FIXED_ORDERS = {RANDOM_ORDER: ANY_ORDER.word, LEFT_TO_RIGHT_ORDER: LEFT_TO_RIGHT.word}
METHODS = (RANDOM_ORDER, LEFT_TO_RIGHT_ORDER, *named("planner"))
BUDGETS = ("1 call per blank", "1 call per 2 blanks", "threshold's own")
SMOKE_PUZZLES = 3  # per givens count
# its outputs: --force replaces only what this benchmark wrote (a table carries no record: it is
# never replaced)
OUTPUTS = {"json": OutputFile("benchmarks/sudoku_planners.py", "rows", (".json",)),
           "table": OutputFile("benchmarks/sudoku_planners.py", "table", (".md",))}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/sudoku_planners.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--weights", choices=("ema", "raw"), default="ema")
    add("--data", required=True, help="the Sudoku data folder (data_prep/sudoku_to_mds.py)")
    add("--puzzles", type=int, help="puzzles per givens count (default all the folder holds)")
    add("--temperatures", default="0", help="comma list; 0 = greedy (default 0)")
    add("--threshold", type=float, default=0.9, help="the threshold planner's (default 0.9)")
    add("--batch-size", type=int, default=200, help="puzzles per generate call (default 200)")
    add("--seed", type=int, default=0)
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    add("--json", type=Path, help="write the rows here (rewritten after every row)")
    add("--table", type=Path, help="the markdown table")
    add("--force", action="store_true", help="replace --json and --table if they exist")
    add("--smoke", action="store_true",
        help=f"a quick check: {SMOKE_PUZZLES} puzzles per givens count, greedy only")
    args = parser.parse_args(argv)
    check_counts(args, "puzzles", "batch_size")
    try:
        args.temperatures = [float(value) for value in args.temperatures.split(",")]
    except ValueError:
        raise UsageError(f"--temperatures takes a comma list of numbers, got "
                         f"{args.temperatures!r}") from None
    if min(args.temperatures) < 0:
        raise UsageError(f"--temperatures must be >= 0 (0 = greedy), got {args.temperatures}")
    if not 0.0 < args.threshold < 1.0:
        raise UsageError(f"--threshold must be in (0, 1), got {args.threshold}")
    if args.smoke:
        args.puzzles, args.temperatures = SMOKE_PUZZLES, [0.0]
    for flag in ("json", "table"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}", args.force, OUTPUTS[flag])
    return args


def method_fields(method: str, budget: str, blanks: int, threshold: float) -> dict | None:
    """SamplingConfig fields of a method at a budget for puzzles of `blanks` blanks (None: the
    method does not run at that budget)."""
    by_threshold = method in WAYS and WAYS[method].reads(THRESHOLD)  # its own number of calls
    if by_threshold != (budget == BUDGETS[2]):
        return None
    if by_threshold:
        return {"planner": method, "threshold": threshold}
    per_call = 1 if budget == BUDGETS[0] else 2
    if method in FIXED_ORDERS:
        return {"order": FIXED_ORDERS[method], "steps": math.ceil(blanks / per_call)}
    return {"planner": method, "reveal": per_call}


def check_model_matches(model, sudoku: Sudoku, origin: dict, args) -> None:
    """The model must have a position per cell and a token id per digit, and have been trained on
    Sudoku of these boxes when its checkpoint records what it learned."""
    config, n = model.config, sudoku.size
    if config.block_size != sudoku.cells or config.vocab_size < n:
        raise UsageError(
            f"--ckpt {args.ckpt} is a model of {config.block_size} positions and "
            f"{config.vocab_size} token ids; --data {args.data} holds {n} x {n} grids ("
            f"{sudoku.cells} cells of {n} digits): benchmark a model trained on them "
            f"(configs/sudoku.yaml with model.block_size={sudoku.cells} model.vocab_size={n})")
    learned = origin.get("data_tokenizers") or []
    if learned and not any(t.get("name") == NAME and t.get("box") == sudoku.name
                           for t in learned):
        what = ", ".join(f"{t.get('name')} {t.get('box') or ''}".strip() for t in learned)
        raise UsageError(f"--ckpt {args.ckpt} was trained on {what} data, not Sudoku of "
                         f"{sudoku.name} boxes: benchmark a model trained on --data's grids")


def solve(model, puzzles: list[Puzzle], ids: list[int], fields: dict, temperature: float, args,
          device: torch.device) -> dict:
    """Fills every puzzle (all of `blanks` blanks) in batches: per puzzle, whether it is solved,
    its cells right, its calls and rows."""
    sudoku_cells = len(puzzles[0].grid)
    config = SamplingConfig(seed=args.seed, temperature=temperature, **fields)
    sampler = KVCacheSampler(model, min(args.batch_size, len(puzzles)), sudoku_cells, config)
    out = {"tokens": [], "calls": [], "rows": []}
    for first in range(0, len(puzzles), args.batch_size):
        batch = puzzles[first:first + args.batch_size]
        mask = torch.tensor([p.given_mask.tolist() for p in batch])
        given = torch.tensor([p.grid.clip(min=0).tolist() for p in batch])
        generation = sampler.generate(torch.tensor(ids[first:first + len(batch)]), given, mask)
        out["tokens"] += generation.tokens.tolist()
        out["calls"] += generation.sample_calls.tolist()
        out["rows"] += [generation.rows] * len(batch)
    return out


def measure(model, sudoku: Sudoku, groups: dict[int, list], method: str, budget: str,
            temperature: float, args, device: torch.device) -> dict | None:
    """One row: a method at a budget and temperature over every givens group."""
    start = time.perf_counter()
    solved, right, calls, rows, settings = {}, [], [], [], {}
    by_technique: dict[str, list[bool]] = {}
    for givens, (puzzles, ids) in groups.items():
        blanks = sudoku.cells - givens
        fields = method_fields(method, budget, blanks, args.threshold)
        if fields is None:
            return None
        out = solve(model, puzzles, ids, fields, temperature, args, device)
        settings[givens] = asdict(SamplingConfig(seed=args.seed, temperature=temperature,
                                                 **fields))
        verdicts = [sudoku.solves(torch.tensor(tokens).numpy(), puzzle.grid)
                    for tokens, puzzle in zip(out["tokens"], puzzles, strict=True)]
        solved[givens] = verdicts
        for verdict, puzzle in zip(verdicts, puzzles, strict=True):
            by_technique.setdefault(puzzle.technique, []).append(verdict)
        right += [sum(t == s for t, s, g in zip(tokens, puzzle.solution, puzzle.given_mask,
                                                strict=True) if not g) / blanks
                  for tokens, puzzle in zip(out["tokens"], puzzles, strict=True)]
        calls += [count / blanks for count in out["calls"]]
        rows += out["rows"]
    everything = [v for verdicts in solved.values() for v in verdicts]
    return {"method": method, "budget": budget, "temperature": temperature,
            "puzzles": len(everything), "solved": sum(everything) / len(everything),
            "solved_by_givens": {g: {"solved": sum(v) / len(v), "puzzles": len(v)}
                                 for g, v in solved.items()},
            "solved_by_technique": {t: {"solved": sum(v) / len(v), "puzzles": len(v)}
                                    for t in TECHNIQUES if (v := by_technique.get(t))},
            "cells_right": sum(right) / len(right),
            "calls_per_blank": sum(calls) / len(calls), "rows_per_puzzle": sum(rows) / len(rows),
            "seconds": time.perf_counter() - start, "settings_by_givens": settings}


def add_ratios(rows: list[dict]) -> None:
    """Each row's solved rate over random order's at its budget and temperature."""
    for row in rows:
        reference = next((r for r in rows if r["method"] == RANDOM_ORDER and
                          r["temperature"] == row["temperature"] and r["budget"] == (
                              BUDGETS[0] if row["budget"] == BUDGETS[2] else row["budget"])),
                         None)
        row["x_random"] = (row["solved"] / reference["solved"]
                           if reference and reference["solved"] else None)


def table(rows: list[dict], givens: list[int]) -> str:
    """One line per row: solved overall, by givens and by technique, calls, x random order."""
    techniques = [t for t in TECHNIQUES if any(t in row["solved_by_technique"] for row in rows)]
    first = rows[0]
    head = (["temperature", "budget", "method", "calls per blank", "rows per puzzle", "solved",
             "x random order", "cells right"]
            + [f"{g} givens (n={first['solved_by_givens'][g]['puzzles']})" for g in givens]
            + [f"{t} (n={first['solved_by_technique'][t]['puzzles']})" for t in techniques])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in rows:
        ratio = "" if row["x_random"] is None else f"{row['x_random']:.2f}x"
        cells = [f"{row['temperature']:g}", row["budget"], row["method"],
                 f"{row['calls_per_blank']:.2f}", f"{row['rows_per_puzzle']:.0f}",
                 f"**{row['solved']:.1%}**", ratio,
                 f"{row['cells_right']:.1%}"]
        cells += [f"{row['solved_by_givens'][g]['solved']:.1%}" for g in givens]
        cells += [f"{row['solved_by_technique'][t]['solved']:.1%}"
                  if t in row["solved_by_technique"] else "" for t in techniques]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    sudoku, puzzles = load_puzzles(args.data, "--data")
    device = resolve_device(args.device)
    source = locate_checkpoint(args.ckpt)
    origin = provenance(source, args.weights, vars(args), data=str(args.data),
                        made_by=OUTPUTS["json"].made_by)
    model = load_checkpoint(source.file, weights=args.weights, map_location=device)
    model = model.to(reproducible_dtype(device)).eval()
    check_model_matches(model, sudoku, origin, args)
    groups: dict[int, tuple[list[Puzzle], list[int]]] = {}
    for number, puzzle in enumerate(puzzles):  # a puzzle's number is its sample id
        chosen, ids = groups.setdefault(puzzle.givens, ([], []))
        if args.puzzles is None or len(chosen) < args.puzzles:
            chosen.append(puzzle)
            ids.append(number)
    givens = sorted(groups, reverse=True)  # easiest first
    groups = {g: groups[g] for g in givens}
    header = {"device": device_name(device), "dtype": str(next(model.parameters()).dtype),
              "box": sudoku.name, "givens": givens,
              "puzzles_per_givens": {g: len(groups[g][0]) for g in givens},
              "model": {"parameters": model.num_params(), "n_layer": model.config.n_layer,
                        "n_embd": model.config.n_embd, "step": origin.get("step")},
              "provenance": origin, "results": []}
    results = ResultsFile(args.json, header)
    print(f"{sum(header['puzzles_per_givens'].values())} {sudoku.size} x {sudoku.size} puzzles "
          f"({', '.join(f'{g} givens' for g in givens)}), model of "
          f"{model.num_params() / 1e6:.2f}M parameters at step {origin.get('step')}, "
          f"{header['device']}", flush=True)
    rows = results.data["results"]
    with torch.no_grad():
        for temperature in args.temperatures:
            for budget in BUDGETS:
                for method in METHODS:
                    row = measure(model, sudoku, groups, method, budget, temperature, args,
                                  device)
                    if row is None:
                        continue
                    rows.append(row)
                    add_ratios(rows)
                    results.row_done()
                    print(f"T={temperature:g} {budget:20s} {method:14s} solved "
                          f"{row['solved']:6.1%}, cells right {row['cells_right']:6.1%}, "
                          f"{row['calls_per_blank']:.2f} calls per blank, "
                          f"{row['seconds']:.1f} s", flush=True)
    results.finish()
    text = table(rows, givens)
    print("\n" + text + f"done in {duration(time.perf_counter() - wall_start)}")
    if args.table:
        write_text_atomic(args.table, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
