"""Sudoku: a task where the order of filling matters and every answer is checked exactly.

A grid of N x N cells (N = box_rows x box_cols) holds each of N digits once in every row, column
and box (box_rows x box_cols cells). A puzzle gives some cells; a solver fills the rest. With a
unique solution, a perfect model of solved grids fills any blank correctly in any order; a tiny one
does not: a cell that the givens force only through a long chain of deductions is hard to predict,
one whose row, column and box leave a single digit ("a naked single") is easy. Filling the easy
cells first makes the hard ones easy, so the order an any-order model fills a puzzle in decides
how many it solves (Kim et al., "Train for the Worst, Plan for the Best", arXiv 2502.06768: a
small masked diffusion model solves under 7% of hard 9 x 9 puzzles in random order, about 90%
choosing the next cell by the top-probability margin).

As tokens: cell r * N + c holds its digit d as token id d - 1 (a model's vocabulary is N ids);
a sequence is a grid's N * N cells, row by row. As text: the digits 1..N row by row, "." for a
blank ("1.3..." -- N <= 9).

    Sudoku(2, 3)                    the rules of 6 x 6 grids of 2 x 3 boxes
    .random_grid(rng)               a solved grid, near uniform (below)
    .solutions(grid)                the solutions of a partial grid (a generator; blanks are -1)
    .make_puzzle(solution, givens, rng)   a puzzle of that many givens with a unique solution
    .problems(grid, puzzle)         what is wrong with a filled grid ([] = it solves the puzzle)
    .technique(puzzle)              the simplest rule set that solves it: naked singles, singles,
                                    or search (guessing)

Randomness is numpy's Generator, seeded by the caller: the same seed draws the same grids and
puzzles (grid_rng gives each grid its own stream, so a grid does not depend on the others drawn).
A random grid is the first solution of a search that tries digits in random order, then a random
symmetry of Sudoku (relabelled digits, rows permuted within their band and bands among
themselves, likewise columns and stacks, and a transposition when boxes are square): uniform
within each class of grids equivalent under those symmetries, near uniform across classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from aogpt import UsageError
from aogpt.data_prep.manifest import read_manifest

BLANK = -1
NAME = "sudoku"  # the tokenizer name a data manifest records for it
PUZZLES_FORMAT = "aogpt-sudoku-puzzles"  # the held-out puzzles in a data manifest
TECHNIQUES = ("naked singles", "singles", "search")  # easiest first


def parse_box(text: str) -> tuple[int, int]:
    """'2x3' -> (2, 3): the box shape of 6 x 6 grids; refuses what makes no Sudoku of digits."""
    try:
        box_rows, box_cols = (int(side) for side in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--box takes ROWSxCOLS, e.g. 2x3 (6 x 6 grids) or 3x3, got "
                         f"{text!r}") from None
    if box_rows < 1 or box_cols < 1 or not 2 <= box_rows * box_cols <= 9:
        raise UsageError(f"--box {text}: a box must hold 2 to 9 cells (one digit each, 1..9)")
    return box_rows, box_cols


@dataclass(frozen=True)
class Puzzle:
    """A puzzle and its solution, (cells,) int64 token ids each (the puzzle's blanks are -1),
    and the simplest technique that solves it where known."""

    grid: np.ndarray
    solution: np.ndarray
    technique: str | None = None

    @property
    def given_mask(self) -> np.ndarray:
        return self.grid != BLANK

    @property
    def givens(self) -> int:
        return int(self.given_mask.sum())


class Sudoku:
    """The rules of N x N grids of box_rows x box_cols boxes."""

    def __init__(self, box_rows: int, box_cols: int):
        self.box_rows, self.box_cols = box_rows, box_cols
        self.size = n = box_rows * box_cols
        self.cells = n * n
        self.name = f"{box_rows}x{box_cols}"
        cell = np.arange(self.cells)
        row, col = cell // n, cell % n
        box = (row // box_rows) * box_rows + col // box_cols  # n // box_cols = box_rows across
        # each cell's row, column and box, numbered 0..3N-1 as units
        self.cell_units = np.stack([row, n + col, 2 * n + box], axis=1)
        self.units = [np.flatnonzero((self.cell_units == unit).any(axis=1))
                      for unit in range(3 * n)]
        self._row, self._col, self._box = row.tolist(), col.tolist(), box.tolist()
        self._all = (1 << n) - 1

    def describe(self) -> dict:
        """What a data manifest records as its tokenizer: N token ids, no text, the box shape."""
        return {"name": NAME, "n_vocab": self.size, "text": False, "box": self.name}

    # ---- text ---------------------------------------------------------------------------------

    def to_text(self, grid: np.ndarray) -> str:
        return "".join("." if digit == BLANK else str(digit + 1) for digit in grid.tolist())

    def from_text(self, text: str, what: str) -> np.ndarray:
        """A grid from its text (digits 1..N, "." or "0" for a blank); UsageError naming `what`."""
        if len(text) != self.cells:
            raise UsageError(f"{what} has {len(text)} cells, a {self.name} Sudoku {self.cells}")
        digits = {str(d + 1): d for d in range(self.size)} | {".": BLANK, "0": BLANK}
        try:
            return np.array([digits[char] for char in text], dtype=np.int64)
        except KeyError as err:
            raise UsageError(f"{what} holds {err.args[0]!r}: a {self.name} Sudoku's cells are "
                             f"1..{self.size} or '.'") from None

    # ---- search ---------------------------------------------------------------------------------

    def solutions(self, grid: np.ndarray, rng: np.random.Generator | None = None
                  ) -> Iterator[np.ndarray]:
        """Every solution of a partial grid (blanks -1), found by depth-first search on the cell
        with the fewest candidates; digits tried in random order when rng is given. A grid whose
        givens already break a rule has none."""
        cells = [int(digit) for digit in grid]
        used = [0] * (3 * self.size)  # the digits each unit holds, as bits
        for index, digit in enumerate(cells):
            if digit == BLANK:
                continue
            bit = 1 << digit
            units = (self._row[index], self.size + self._col[index],
                     2 * self.size + self._box[index])
            if any(used[unit] & bit for unit in units):
                return
            for unit in units:
                used[unit] |= bit
        blanks = [index for index, digit in enumerate(cells) if digit == BLANK]
        yield from self._search(cells, blanks, used, rng)

    def _search(self, cells: list[int], blanks: list[int], used: list[int],
                rng: np.random.Generator | None) -> Iterator[np.ndarray]:
        if not blanks:
            yield np.array(cells, dtype=np.int64)
            return
        n = self.size
        best, best_free, best_count = -1, 0, n + 1
        for position, index in enumerate(blanks):
            free = self._all & ~(used[self._row[index]] | used[n + self._col[index]]
                                 | used[2 * n + self._box[index]])
            count = free.bit_count()
            if count < best_count:
                best, best_free, best_count = position, free, count
                if count <= 1:
                    break
        if best_count == 0:
            return
        index = blanks[best]
        rest = blanks[:best] + blanks[best + 1:]
        digits = [d for d in range(n) if best_free >> d & 1]
        if rng is not None:
            digits = [digits[i] for i in rng.permutation(len(digits))]
        units = (self._row[index], n + self._col[index], 2 * n + self._box[index])
        for digit in digits:
            bit = 1 << digit
            cells[index] = digit
            for unit in units:
                used[unit] |= bit
            yield from self._search(cells, rest, used, rng)
            for unit in units:
                used[unit] &= ~bit
        cells[index] = BLANK

    def count_solutions(self, grid: np.ndarray, limit: int = 2) -> int:
        """How many solutions the partial grid has, counting no further than `limit`."""
        return sum(1 for _ in islice(self.solutions(grid), limit))

    # ---- drawing grids and puzzles -------------------------------------------------------------

    def random_grid(self, rng: np.random.Generator) -> np.ndarray:
        """A solved grid (cells,) int64, near uniform (the module's docstring says how)."""
        grid = next(self.solutions(np.full(self.cells, BLANK), rng))
        return self.random_symmetry(grid, rng)

    def random_symmetry(self, grid: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The grid under a random symmetry of Sudoku: it stays a solved grid."""
        n, r, c = self.size, self.box_rows, self.box_cols
        rows = np.concatenate([band * r + rng.permutation(r) for band in rng.permutation(c)])
        cols = np.concatenate([stack * c + rng.permutation(c) for stack in rng.permutation(r)])
        square = rng.permutation(n)[grid.reshape(n, n)][rows][:, cols]  # digits relabelled
        if r == c and rng.random() < 0.5:
            square = square.T
        return np.ascontiguousarray(square).reshape(-1)

    def make_puzzle(self, solution: np.ndarray, givens: int, rng: np.random.Generator,
                    attempts: int = 20) -> Puzzle | None:
        """A puzzle of `givens` given cells whose only solution is `solution`: cells are blanked
        in random order, each kept given when blanking it would allow a second solution, until
        `givens` are left; None when `attempts` random orders all got stuck above `givens` (the
        grid has no such puzzle along them: take another grid)."""
        for _ in range(attempts):
            grid, left = solution.copy(), self.cells
            for cell in rng.permutation(self.cells):
                if left == givens:
                    break
                grid[cell] = BLANK
                if self.count_solutions(grid) == 1:
                    left -= 1
                else:
                    grid[cell] = solution[cell]
            if left == givens:
                return Puzzle(grid, solution.copy())
        return None

    # ---- checking ------------------------------------------------------------------------------

    def problems(self, grid: np.ndarray, puzzle: np.ndarray | None = None) -> list[str]:
        """What keeps a filled grid from solving the puzzle, in words ([] = solved): a blank or
        a token that is no digit, a unit that repeats a digit, a given changed."""
        grid = np.asarray(grid)
        if grid.shape != (self.cells,):
            return [f"{grid.size} cells, not {self.cells}"]
        found = [f"cell {cell} is blank" if grid[cell] == BLANK else
                 f"cell {cell} holds {int(grid[cell])}, not a digit 0..{self.size - 1}"
                 for cell in np.flatnonzero((grid < 0) | (grid >= self.size))]
        if found:
            return found
        kinds = ("row", "column", "box")
        for unit, members in enumerate(self.units):
            if len(set(grid[members].tolist())) != self.size:
                found.append(f"{kinds[unit // self.size]} {unit % self.size} repeats a digit")
        if puzzle is not None:
            given = puzzle != BLANK
            found += [f"given cell {cell} changed"
                      for cell in np.flatnonzero(given & (grid != puzzle))]
        return found

    def wrong_cells(self, grid: np.ndarray, puzzle: np.ndarray) -> list[int]:
        """The cells problems() faults in a filled grid of the puzzle, sorted: a blank or a token
        that is no digit, a given changed, a filled cell whose digit its row, column or box
        repeats (a given that keeps its digit is never wrong). [] = solved."""
        grid, given = np.asarray(grid), np.asarray(puzzle) != BLANK
        digit = (grid >= 0) & (grid < self.size)
        wrong = ~digit | (given & (grid != puzzle))
        for members in self.units:
            digits = np.where(digit[members], grid[members], self.size)  # no digit: its own bin
            counts = np.bincount(digits, minlength=self.size + 1)
            wrong[members] |= (counts[digits] > 1) & (digits < self.size)
        return np.flatnonzero(wrong & ~(given & (grid == puzzle))).tolist()

    def solves(self, grid: np.ndarray, puzzle: np.ndarray) -> bool:
        return not self.problems(grid, puzzle)

    def technique(self, puzzle: np.ndarray) -> str:
        """The simplest of TECHNIQUES that fills the puzzle without guessing: "naked singles" (a
        cell whose row, column and box leave one digit), "singles" (also a digit that has one
        place left in a unit), else "search"."""
        for technique in TECHNIQUES[:-1]:
            grid = puzzle.copy()
            while (grid == BLANK).any() and self._fill_singles(grid, technique == "singles"):
                pass
            if not (grid == BLANK).any():
                return technique
        return TECHNIQUES[-1]

    def _fill_singles(self, grid: np.ndarray, hidden: bool) -> bool:
        """Fills every single the grid has now; whether it found any."""
        n = self.size
        present = np.zeros((3 * n, n), dtype=bool)  # unit x digit
        filled = grid != BLANK
        for column in range(3):
            present[self.cell_units[filled, column], grid[filled]] = True
        candidates = ~present[self.cell_units].any(axis=1)  # (cells, n)
        candidates[filled] = False
        naked = np.flatnonzero(candidates.sum(axis=1) == 1)
        grid[naked] = candidates[naked].argmax(axis=1)
        if hidden and not len(naked):
            for members in self.units:
                places = candidates[members]  # (n, digits)
                for digit in np.flatnonzero(places.sum(axis=0) == 1):
                    cell = members[places[:, digit].argmax()]
                    if grid[cell] == BLANK:
                        grid[cell] = digit
                        return True
        return len(naked) > 0


def load_puzzles(data_dir: str | Path, flag: str) -> tuple[Sudoku, list[Puzzle]]:
    """The rules and the held-out puzzles of a Sudoku data folder (data_prep/sudoku_to_mds.py);
    a UsageError naming `flag` for any other folder, or puzzles that are not what they claim."""
    manifest = read_manifest(data_dir)
    record = manifest.get("puzzles")
    if manifest["tokenizer"].get("name") != NAME or not isinstance(record, dict) or record.get(
            "format") != PUZZLES_FORMAT:
        raise UsageError(f"{flag} {data_dir} holds no Sudoku puzzles: build a folder with "
                         f"data_prep/sudoku_to_mds.py")
    sudoku = Sudoku(*parse_box(record["box"]))
    puzzles = []
    for number, item in enumerate(record["items"]):
        what = f"{flag} {data_dir}: puzzle {number}"
        puzzle = Puzzle(sudoku.from_text(item["puzzle"], what),
                        sudoku.from_text(item["solution"], f"{what}'s solution"), item["technique"])
        if puzzle.givens != item["givens"] or sudoku.problems(puzzle.solution, puzzle.grid):
            raise UsageError(f"{what} is damaged (its solution does not solve it, or its givens "
                             f"are not {item['givens']}): rebuild the folder")
        puzzles.append(puzzle)
    return sudoku, puzzles


def grid_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    """The random stream of grid `index` of `stream` (a split, the puzzles): independent of the
    grids drawn before it, so a build may draw them in any chunks."""
    return np.random.default_rng([seed, stream, index])
