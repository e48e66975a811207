"""Sudoku solved by an any-order model: how many puzzles each way of choosing the next cell solves,
at equal network calls.

    python benchmarks/sudoku_planners.py --ckpt [NAME=]RUN [--ckpt NAME=RUN ...]
        --data data/sudoku [--puzzles 200] [--temperatures 0,1] [--methods margin,...]
        [--threshold 0.9] [--batch-size 200] [--device auto] [--json OUT] [--table TABLE.md]
        [--html PAGE.html [--html-puzzles 8]] [--force] [--smoke]

Each --ckpt is a training arm (a model trained with other orders, or a checkpoint of another
step: NAME=RUN names it, else the folder's name does), measured on the same puzzles with the
same sample ids; rows compare arms at equal network calls.

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
the cells filled right, its ratio to random order at the same budget and temperature, and to
the first arm's same method. The puzzles that need search are named apart (which arm and method
solved which). Every method sees the same puzzles with the same sample ids (the same random
order, the same uniforms). The JSON is rewritten after every row; --table writes the markdown
table.

--html writes the replay page (aogpt.trainer.replay: one file, no network) of --html-puzzles
puzzles, spread over the givens counts, solved by each arm's methods at one call per blank (the
threshold planner at its own) and the first temperature: each puzzle on a grid, cell by cell as
the method filled it, with the planner's candidates and their scores at each call, and the cells
the verifier faults (a digit its row, column or box repeats) marked red as they are filled. The
puzzles are solved again for the page, one at a time, their calls recorded (the rows' timings
never include recording), with the rows' sample ids: the same orders and digits as in the rows.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass
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
from aogpt.trainer.replay import write_page  # noqa: E402

RANDOM_ORDER, LEFT_TO_RIGHT_ORDER = "random order", LEFT_TO_RIGHT.label  # orders drawn up front
FIXED_ORDERS = {RANDOM_ORDER: ANY_ORDER.word, LEFT_TO_RIGHT_ORDER: LEFT_TO_RIGHT.word}
METHODS = (RANDOM_ORDER, LEFT_TO_RIGHT_ORDER, *named("planner"))
BUDGETS = ("1 call per blank", "1 call per 2 blanks", "threshold's own")
SMOKE_PUZZLES = 3  # per givens count
HTML_PUZZLES = 8  # on the replay page, per arm and method
# its outputs: --force replaces only what this benchmark wrote (a table carries no record: it is
# never replaced)
OUTPUTS = {"json": OutputFile("benchmarks/sudoku_planners.py", "rows", (".json",)),
           "table": OutputFile("benchmarks/sudoku_planners.py", "table", (".md",)),
           "html": OutputFile("benchmarks/sudoku_planners.py", "replay page", (".html",))}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/sudoku_planners.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, action="append", metavar="[NAME=]RUN",
        help="a training arm: out_dir, checkpoint folder or model.safetensors (repeatable)")
    add("--weights", choices=("ema", "raw"), default="ema")
    add("--data", required=True, help="the Sudoku data folder (data_prep/sudoku_to_mds.py)")
    add("--puzzles", type=int, help="puzzles per givens count (default all the folder holds)")
    add("--temperatures", default="0", help="comma list; 0 = greedy (default 0)")
    add("--methods", default=",".join(METHODS),
        help=f"comma list of {', '.join(METHODS)} (default all)")
    add("--threshold", type=float, default=0.9, help="the threshold planner's (default 0.9)")
    add("--batch-size", type=int, default=200, help="puzzles per generate call (default 200)")
    add("--seed", type=int, default=0)
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    add("--json", type=Path, help="write the rows here (rewritten after every row)")
    add("--table", type=Path, help="the markdown table")
    add("--html", type=Path, help="the replay page: puzzles being solved, call by call")
    add("--html-puzzles", type=int, default=HTML_PUZZLES,
        help=f"puzzles on the replay page, per arm and method (default {HTML_PUZZLES})")
    add("--force", action="store_true", help="replace --json and --table if they exist")
    add("--smoke", action="store_true",
        help=f"a quick check: {SMOKE_PUZZLES} puzzles per givens count, greedy only")
    args = parser.parse_args(argv)
    check_counts(args, "puzzles", "batch_size", "html_puzzles")
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
    args.methods = [method.strip() for method in args.methods.split(",")]
    if unknown := [method for method in args.methods if method not in METHODS]:
        raise UsageError(f"--methods: {', '.join(map(repr, unknown))} unknown: use "
                         f"{', '.join(METHODS)}")
    args.ckpt = arm_names(args.ckpt)
    for flag in ("json", "table", "html"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}", args.force, OUTPUTS[flag])
    return args


def arm_names(values: list[str]) -> dict[str, str]:
    """--ckpt values -> {arm name: checkpoint}: NAME=RUN, or RUN named by its folder."""
    arms: dict[str, str] = {}
    for value in values:
        name, _, path = value.rpartition("=") if "=" in value else ("", "", value)
        name = name or Path(path.rstrip("/")).name
        if name in arms:
            raise UsageError(f"--ckpt {value}: two arms named {name!r}: give NAME=RUN")
        arms[name] = path
    return arms


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


def check_model_matches(model, sudoku: Sudoku, origin: dict, ckpt: str, args) -> None:
    """The model must have a position per cell and a token id per digit, and have been trained on
    Sudoku of these boxes when its checkpoint records what it learned."""
    config, n = model.config, sudoku.size
    if config.block_size != sudoku.cells or config.vocab_size < n:
        raise UsageError(
            f"--ckpt {ckpt} is a model of {config.block_size} positions and "
            f"{config.vocab_size} token ids; --data {args.data} holds {n} x {n} grids ("
            f"{sudoku.cells} cells of {n} digits): benchmark a model trained on them "
            f"(configs/sudoku.yaml with model.block_size={sudoku.cells} model.vocab_size={n})")
    learned = origin.get("data_tokenizers") or []
    if learned and not any(t.get("name") == NAME and t.get("box") == sudoku.name
                           for t in learned):
        what = ", ".join(f"{t.get('name')} {t.get('box') or ''}".strip() for t in learned)
        raise UsageError(f"--ckpt {ckpt} was trained on {what} data, not Sudoku of "
                         f"{sudoku.name} boxes: benchmark a model trained on --data's grids")


def solve(model, puzzles: list[Puzzle], ids: list[int], fields: dict, temperature: float, args,
          device: torch.device, record: bool = False) -> dict:
    """Fills every puzzle (all of `blanks` blanks) in batches: per puzzle, its tokens, calls and
    rows; with `record`, also the order it was filled in and what each call did (recording.py)."""
    sudoku_cells = len(puzzles[0].grid)
    config = SamplingConfig(seed=args.seed, temperature=temperature, **fields)
    sampler = KVCacheSampler(model, min(args.batch_size, len(puzzles)), sudoku_cells, config)
    out = {"tokens": [], "calls": [], "rows": [], "orders": [], "recorded": []}
    for first in range(0, len(puzzles), args.batch_size):
        batch = puzzles[first:first + args.batch_size]
        mask = torch.tensor([p.given_mask.tolist() for p in batch])
        given = torch.tensor([p.grid.clip(min=0).tolist() for p in batch])
        generation = sampler.generate(torch.tensor(ids[first:first + len(batch)]), given, mask,
                                      record_calls=record)
        out["tokens"] += generation.tokens.tolist()
        if record:
            out["orders"] += generation.orders.tolist()
            out["recorded"] += generation.calls
        out["calls"] += generation.sample_calls.tolist()
        out["rows"] += [generation.rows] * len(batch)
    return out


@dataclass
class Arm:
    """A model measured: a training arm, or one of its checkpoints."""

    name: str
    ckpt: str
    model: torch.nn.Module
    origin: dict  # provenance: the checkpoint, its step, the code


Groups = dict[int, tuple[list[Puzzle], list[int]]]  # givens -> puzzles, their sample ids


def measure(arm: Arm, sudoku: Sudoku, groups: Groups, method: str, budget: str,
            temperature: float, args, device: torch.device) -> dict:
    """One row: an arm's method at a budget and temperature over every givens group."""
    start = time.perf_counter()
    solved, right, calls, rows, settings, search = {}, [], [], [], {}, []
    by_technique: dict[str, list[bool]] = {}
    for givens, (puzzles, ids) in groups.items():
        blanks = sudoku.cells - givens
        fields = method_fields(method, budget, blanks, args.threshold)
        out = solve(arm.model, puzzles, ids, fields, temperature, args, device)
        settings[givens] = asdict(SamplingConfig(seed=args.seed, temperature=temperature,
                                                 **fields))
        verdicts = [sudoku.solves(torch.tensor(tokens).numpy(), puzzle.grid)
                    for tokens, puzzle in zip(out["tokens"], puzzles, strict=True)]
        solved[givens] = verdicts
        for verdict, puzzle, number in zip(verdicts, puzzles, ids, strict=True):
            by_technique.setdefault(puzzle.technique, []).append(verdict)
            if verdict and puzzle.technique == TECHNIQUES[-1]:
                search.append(number)
        right += [sum(t == s for t, s, g in zip(tokens, puzzle.solution, puzzle.given_mask,
                                                strict=True) if not g) / blanks
                  for tokens, puzzle in zip(out["tokens"], puzzles, strict=True)]
        calls += [count / blanks for count in out["calls"]]
        rows += out["rows"]
    everything = [v for verdicts in solved.values() for v in verdicts]
    return {"arm": arm.name, "step": arm.origin.get("step"), "method": method, "budget": budget,
            "temperature": temperature, "puzzles": len(everything),
            "solved": sum(everything) / len(everything),
            "solved_by_givens": {g: {"solved": sum(v) / len(v), "puzzles": len(v)}
                                 for g, v in solved.items()},
            "solved_by_technique": {t: {"solved": sum(v) / len(v), "puzzles": len(v)}
                                    for t in TECHNIQUES if (v := by_technique.get(t))},
            "search_solved": search, "cells_right": sum(right) / len(right),
            "calls_per_blank": sum(calls) / len(calls), "rows_per_puzzle": sum(rows) / len(rows),
            "seconds": time.perf_counter() - start, "settings_by_givens": settings}


def add_ratios(rows: list[dict]) -> None:
    """Each row's solved rate over random order's at its budget and temperature (in its arm),
    and over the first arm's same method there."""
    def ratio(row: dict, reference: dict | None) -> float | None:
        return row["solved"] / reference["solved"] if reference and reference["solved"] else None

    for row in rows:
        same = [r for r in rows if r["temperature"] == row["temperature"]]
        row["x_random"] = ratio(row, next((r for r in same if r["arm"] == row["arm"] and (
            r["method"] == RANDOM_ORDER and r["budget"] == (
                BUDGETS[0] if row["budget"] == BUDGETS[2] else row["budget"]))), None))
        row["x_first_arm"] = ratio(row, next((r for r in same if r["arm"] == rows[0]["arm"]
                                              and r["method"] == row["method"]
                                              and r["budget"] == row["budget"]), None))


def table(rows: list[dict], givens: list[int]) -> str:
    """One line per row: solved overall, by givens and by technique, calls, x random order and
    x the first arm."""
    techniques = [t for t in TECHNIQUES if any(t in row["solved_by_technique"] for row in rows)]
    first = rows[0]
    head = (["arm", "step", "temperature", "budget", "method", "calls per blank",
             "rows per puzzle", "solved", "x random order", f"x {first['arm']}", "cells right"]
            + [f"{g} givens (n={first['solved_by_givens'][g]['puzzles']})" for g in givens]
            + [f"{t} (n={first['solved_by_technique'][t]['puzzles']})" for t in techniques])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in rows:
        cells = [row["arm"], str(row["step"]), f"{row['temperature']:g}", row["budget"],
                 row["method"], f"{row['calls_per_blank']:.2f}", f"{row['rows_per_puzzle']:.0f}",
                 f"**{row['solved']:.1%}**", _times(row["x_random"]),
                 _times(row["x_first_arm"]), f"{row['cells_right']:.1%}"]
        cells += [f"{row['solved_by_givens'][g]['solved']:.1%}" for g in givens]
        cells += [f"{row['solved_by_technique'][t]['solved']:.1%}"
                  if t in row["solved_by_technique"] else "" for t in techniques]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def search_puzzles(rows: list[dict], groups: Groups) -> str:
    """The puzzles that need search, by sample id, and which rows solved each."""
    needing = [number for puzzles, ids in groups.values()
               for puzzle, number in zip(puzzles, ids, strict=True)
               if puzzle.technique == TECHNIQUES[-1]]
    if not needing:
        return "No puzzle needs search.\n"
    solvers = {number: [f"{row['arm']} {row['method']} ({row['budget']}, T={row['temperature']:g})"
                        for row in rows if number in row["search_solved"]] for number in needing}
    return (f"Puzzles that need search (n={len(needing)}): " + "; ".join(
        f"#{number}: {', '.join(solved) or 'unsolved'}" for number, solved in solvers.items())
        + ".\n")


# ---- the replay page ---------------------------------------------------------------------------


class Digits:
    """The replay page's pieces of a Sudoku: token d is the digit d + 1 (data_prep/sudoku.py)."""

    join = "words"

    @staticmethod
    def piece(token: int) -> str:
        return str(token + 1)


def replay_puzzles(groups: Groups, count: int) -> list[tuple[Puzzle, int]]:
    """`count` puzzles (and their sample ids) spread evenly from the most givens to the fewest."""
    every = [(puzzle, number) for puzzles, ids in groups.values()
             for puzzle, number in zip(puzzles, ids, strict=True)]
    if count >= len(every):
        return every
    step = (len(every) - 1) / max(count - 1, 1)
    return [every[round(k * step)] for k in range(count)]


def replay_record(arm: Arm, sudoku: Sudoku, method: str, puzzle: Puzzle, number: int,
                  fields: dict, temperature: float, args, device: torch.device) -> dict:
    """One puzzle solved again by an arm's method, its calls recorded: a sample record of the
    replay page (aogpt.trainer.replay), the cells the verifier faults as `wrong`."""
    out = solve(arm.model, [puzzle], [number], fields, temperature, args, device, record=True)
    grid = torch.tensor(out["tokens"][0]).numpy()
    wrong = sudoku.wrong_cells(grid, puzzle.grid)
    verdict = "solved" if sudoku.solves(grid, puzzle.grid) else f"{len(wrong)} cells wrong"
    return {"sample": number, "tokens": out["tokens"][0], "order": out["orders"][0],
            "given_positions": puzzle.given_mask.nonzero()[0].tolist(),
            "calls": out["recorded"][0], "network_calls": out["calls"][0],
            "text": sudoku.to_text(grid), "wrong": wrong,
            "label": f"{arm.name} · {method} · puzzle #{number} ({puzzle.givens} givens, "
                     f"{puzzle.technique}): {verdict}",
            "settings": asdict(SamplingConfig(seed=args.seed, temperature=temperature, **fields)),
            "step": arm.origin.get("step"), "weights": args.weights, "provenance": arm.origin}


def write_replay(arms: list[Arm], sudoku: Sudoku, groups: Groups, args,
                 device: torch.device) -> None:
    """--html: the page of --html-puzzles puzzles solved by every arm's methods, at one call per
    blank (threshold: its own) and the first temperature."""
    chosen, temperature = replay_puzzles(groups, args.html_puzzles), args.temperatures[0]
    records = []
    for arm in arms:
        for method in args.methods:
            for puzzle, number in chosen:
                blanks = sudoku.cells - puzzle.givens
                fields = next(f for budget in BUDGETS if (
                    f := method_fields(method, budget, blanks, args.threshold)) is not None)
                records.append(replay_record(arm, sudoku, method, puzzle, number, fields,
                                             temperature, args, device))
    solved = sum(record["wrong"] == [] for record in records)
    write_page(args.html, records, Digits(), title=f"{sudoku.size} x {sudoku.size} Sudoku solved "
               "cell by cell", about=f"{len(chosen)} held-out puzzles x {len(args.methods)} "
               f"methods x {len(arms)} arms ({solved} of {len(records)} solved), one network call "
               f"per blank, temperature {temperature:g}: each call's cells appear where the "
               "method put them; red cells are those the verifier faults", origin=arms[0].origin,
               grid=(sudoku.size, sudoku.size, sudoku.box_rows, sudoku.box_cols))
    print(f"wrote {args.html}: {len(records)} puzzles solved call by call; open it in a browser")


# ---- the command's steps: parse, check, plan, run, report -----------------------------------


def puzzle_groups(args) -> tuple[Sudoku, Groups]:
    """The held-out puzzles by givens count, easiest first: at most --puzzles of each, each
    with its number in the folder as its sample id."""
    sudoku, puzzles = load_puzzles(args.data, "--data")
    groups: Groups = {}
    for number, puzzle in enumerate(puzzles):
        chosen, ids = groups.setdefault(puzzle.givens, ([], []))
        if args.puzzles is None or len(chosen) < args.puzzles:
            chosen.append(puzzle)
            ids.append(number)
    return sudoku, {g: groups[g] for g in sorted(groups, reverse=True)}


def load_arms(args, sudoku: Sudoku, device: torch.device) -> list[Arm]:
    """Every --ckpt loaded and checked against the puzzles, before any is measured."""
    arms = []
    for name, ckpt in args.ckpt.items():
        source = locate_checkpoint(ckpt)
        origin = provenance(source, args.weights, vars(args), data=str(args.data),
                            made_by=OUTPUTS["json"].made_by)
        model = load_checkpoint(source.file, weights=args.weights, map_location=device)
        model = model.to(reproducible_dtype(device)).eval()
        check_model_matches(model, sudoku, origin, ckpt, args)
        arms.append(Arm(name, ckpt, model, origin))
    return arms


def planned_rows(arms: list[Arm], args) -> list[tuple[Arm, float, str, str]]:
    """(arm, temperature, budget, method) of every row, in the table's order."""
    return [(arm, temperature, budget, method) for arm in arms
            for temperature in args.temperatures for budget in BUDGETS for method in args.methods
            if method_fields(method, budget, 1, args.threshold) is not None]


def header(arms: list[Arm], sudoku: Sudoku, groups: Groups, device: torch.device) -> dict:
    model = arms[0].model
    return {"device": device_name(device), "dtype": str(next(model.parameters()).dtype),
            "box": sudoku.name, "givens": list(groups),
            "puzzles_per_givens": {g: len(puzzles) for g, (puzzles, _) in groups.items()},
            "arms": {arm.name: {"parameters": arm.model.num_params(),
                                "n_layer": arm.model.config.n_layer,
                                "n_embd": arm.model.config.n_embd, "step": arm.origin.get("step"),
                                "provenance": arm.origin} for arm in arms},
            "results": []}


def row_line(row: dict) -> str:
    return (f"{row['arm']} T={row['temperature']:g} {row['budget']:20s} {row['method']:14s} "
            f"solved {row['solved']:6.1%}, cells right {row['cells_right']:6.1%}, "
            f"{row['calls_per_blank']:.2f} calls per blank, {row['seconds']:.1f} s")


def report(rows: list[dict], groups: Groups, args, wall_start: float) -> None:
    """The table and the search puzzles, printed and (--table) written."""
    text = table(rows, list(groups)) + "\n" + search_puzzles(rows, groups)
    print("\n" + text + f"done in {duration(time.perf_counter() - wall_start)}")
    if args.table:
        write_text_atomic(args.table, text)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    sudoku, groups = puzzle_groups(args)
    device = resolve_device(args.device)
    arms = load_arms(args, sudoku, device)
    results = ResultsFile(args.json, header(arms, sudoku, groups, device))
    print(f"{sum(len(p) for p, _ in groups.values())} {sudoku.size} x {sudoku.size} puzzles "
          f"({', '.join(f'{g} givens' for g in groups)}), arms: " + ", ".join(
              f"{arm.name} ({arm.model.num_params() / 1e6:.2f}M parameters, step "
              f"{arm.origin.get('step')})" for arm in arms) + f", {device_name(device)}",
          flush=True)
    rows = results.data["results"]
    with torch.no_grad():
        for arm, temperature, budget, method in planned_rows(arms, args):
            rows.append(measure(arm, sudoku, groups, method, budget, temperature, args, device))
            add_ratios(rows)
            results.row_done()
            print(row_line(rows[-1]), flush=True)
        if args.html:
            write_replay(arms, sudoku, groups, args, device)
    results.finish()
    report(rows, groups, args, wall_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
