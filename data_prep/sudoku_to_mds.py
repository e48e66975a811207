"""Build Sudoku data: solved grids -> MDS train/ and val/, and held-out puzzles with unique
solutions in the manifest, for benchmarks/sudoku_planners.py.

    python data_prep/sudoku_to_mds.py --out data/sudoku [--box 2x3] [--train-grids 200000]
        [--val-grids 2000] [--givens 10,14,18,22] [--puzzles 200] [--seed 0] [--overwrite]
        [--staging DIR]

A sample is one solved grid of N x N cells (N = the box's cells; 6 x 6 of 2 x 3 boxes by
default), row by row, each cell's digit d as token id d - 1: a model of it has N token ids and
block size N * N. A model learns from solved grids only, in any order; solving a puzzle is then
infilling its blanks given its clues (data_prep/sudoku.py says why the order matters).

The manifest holds the held-out puzzles: --puzzles for each count of --givens, each with its
unique solution and the simplest technique that solves it (naked singles, singles, search). A
train or val grid that is a puzzle's solution is skipped (and counted), so a model never trained
on the grid it must find. Each grid is drawn from its own random stream (data_prep/sudoku.py's
grid_rng): the same --seed gives the same folder.

An interrupted run resumes (or restarts) like the other builders; a finished folder is left
alone unless --overwrite. --out s3://BUCKET/PREFIX builds in a local --staging folder, then
uploads (data_prep/remote.py).
"""

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

import aogpt
from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep.cli import build_output, builder_parser, check_out, split_lines
from aogpt.data_prep.manifest import new_manifest
from aogpt.data_prep.packing import write_rows
from aogpt.data_prep.remote import open_output
from aogpt.data_prep.sudoku import PUZZLES_FORMAT, Sudoku, grid_rng, parse_box
from aogpt.progress import duration, progress

SPLITS = {"train": 1, "val": 2}  # each split's grids are drawn from streams of this number
PUZZLE_STREAM = 3
# fractions of the cells: fewer givens, longer chains of deduction (a tiny model solves puzzles of
# many givens first, so the range shows where the order starts to matter)
DEFAULT_GIVENS = (0.28, 0.39, 0.5, 0.61)
GRIDS_PER_PUZZLE = 100  # grids tried for one puzzle before its givens count is called too few


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = builder_parser("python data_prep/sudoku_to_mds.py", __doc__, "grids' data")
    add = parser.add_argument
    add("--box", default="2x3", help="box rows x columns: 2x2, 2x3 (default), 3x3, ...")
    add("--train-grids", type=int, default=200_000, help="solved grids in train/ (default 200000)")
    add("--val-grids", type=int, default=2_000, help="solved grids in val/ (default 2000)")
    add("--givens", help="the held-out puzzles' given cells, a comma list (default 28%%, 39%%, "
        "50%% and 61%% of the cells: 10,14,18,22 for 6 x 6, 23,32,40,49 for 9 x 9)")
    add("--puzzles", type=int, default=200, help="held-out puzzles per givens count (default 200)")
    add("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_counts(args, "train_grids", "val_grids", "puzzles")
    args.sudoku = Sudoku(*parse_box(args.box))
    args.givens = parse_givens(args.givens or ",".join(
        str(round(fraction * args.sudoku.cells)) for fraction in DEFAULT_GIVENS), args.sudoku)
    check_out(args.out, args.staging)
    return args


def parse_givens(text: str, sudoku: Sudoku) -> list[int]:
    try:
        givens = sorted({int(value) for value in text.split(",")})
    except ValueError:
        raise UsageError(f"--givens takes a comma list of whole numbers, e.g. 10,12,14, got "
                         f"{text!r}") from None
    if givens[0] < 1 or givens[-1] >= sudoku.cells:
        raise UsageError(f"--givens must be in 1..{sudoku.cells - 1} (a {sudoku.name} box's grid "
                         f"has {sudoku.cells} cells, and a puzzle a blank), got {text!r}")
    return givens


def draw_puzzles(sudoku: Sudoku, givens: list[int], per_count: int, seed: int) -> list[dict]:
    """--puzzles puzzles of each givens count, each from its own stream: records of the puzzle,
    its solution (as text), its givens and its technique. UsageError when a count is below
    what the grids allow (no unique puzzle in GRIDS_PER_PUZZLE grids)."""
    records = []
    with progress(total=len(givens) * per_count, desc="puzzles", unit="puzzle") as bar:
        for count in givens:
            for index in range(per_count):
                rng = grid_rng(seed, PUZZLE_STREAM, count * 1_000_003 + index)
                puzzle = next(filter(None, (sudoku.make_puzzle(sudoku.random_grid(rng), count, rng)
                                            for _ in range(GRIDS_PER_PUZZLE))), None)
                if puzzle is None:
                    raise UsageError(
                        f"--givens {count}: no {sudoku.size} x {sudoku.size} puzzle of {count} "
                        f"givens with a unique solution in {GRIDS_PER_PUZZLE} grids: "
                        "give more givens")
                records.append({"puzzle": sudoku.to_text(puzzle.grid),
                                "solution": sudoku.to_text(puzzle.solution), "givens": count,
                                "technique": sudoku.technique(puzzle.grid)})
                bar.update(1)
    return records


def draw_grids(sudoku: Sudoku, count: int, seed: int, stream: int, held_out: set[bytes],
               bar) -> tuple[np.ndarray, int]:
    """(count, cells) solved grids of a split, none of them a held-out solution; how many grids
    were skipped for being one."""
    rows, skipped, index = np.empty((count, sudoku.cells), dtype=np.int64), 0, 0
    for row in range(count):
        while True:
            grid = sudoku.random_grid(grid_rng(seed, stream, index))
            index += 1
            if grid.tobytes() not in held_out:
                break
            skipped += 1
        rows[row] = grid
        bar.update(1)
    return rows, skipped


def build(args: argparse.Namespace, counts: dict[str, int], folder: Path) -> dict:
    """The held-out puzzles, then each split's grids (none of them a puzzle's solution) as MDS in
    folder/<split>; the manifest."""
    sudoku = args.sudoku
    print(f"drawing {args.puzzles} held-out {sudoku.size} x {sudoku.size} puzzles for each of "
          f"{', '.join(map(str, args.givens))} givens", flush=True)
    puzzles = draw_puzzles(sudoku, args.givens, args.puzzles, args.seed)
    held_out = {sudoku.from_text(record["solution"], "a solution").tobytes()
                for record in puzzles}
    splits, skipped = {}, {}
    with progress(total=sum(counts.values()), desc="grids", unit="grid") as bar:
        for name, stream in SPLITS.items():
            rows, skipped[name] = draw_grids(sudoku, counts[name], args.seed, stream, held_out,
                                             bar)
            splits[name] = {"path": name, **write_rows(folder / name, rows)}
    return new_manifest(
        "pretrain", "sudoku", f"solved {sudoku.size} x {sudoku.size} Sudoku grids of "
        f"{sudoku.name} boxes (seed {args.seed})", sudoku.cells, sudoku.describe(), splits,
        puzzles={"format": PUZZLES_FORMAT, "box": sudoku.name, "givens": args.givens,
                 "per_givens": args.puzzles, "seed": args.seed,
                 "solutions_skipped_in_splits": skipped, "items": puzzles})


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    sudoku = args.sudoku
    counts = {"train": args.train_grids, "val": args.val_grids}
    settings = {"tool": "sudoku_to_mds", "tool_version": aogpt.__version__, "box": sudoku.name,
                "grids": counts, "givens": args.givens, "puzzles": args.puzzles,
                "seed": args.seed}
    out = open_output(args.out, args.staging, tuple(SPLITS))
    manifest = build_output(out, args.out, settings, args.overwrite, "grids",
                            lambda: build(args, counts, out.out))
    if manifest is None:
        return 0
    puzzles = manifest["puzzles"]["items"]
    skipped = manifest["puzzles"]["solutions_skipped_in_splits"]
    techniques = Counter((record["givens"], record["technique"]) for record in puzzles)
    print(f"done in {duration(time.perf_counter() - wall_start)}: {len(puzzles)} held-out "
          f"puzzles (" + ", ".join(f"{count} givens {technique}: {number}" for
                                   (count, technique), number in sorted(techniques.items()))
          + f"); grids equal to a puzzle's solution skipped: {sum(skipped.values())}")
    print("\n".join(split_lines(args.out, manifest, "grids")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
