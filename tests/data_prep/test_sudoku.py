"""Sudoku (data_prep/sudoku.py) and its data folder (sudoku_to_mds.py): valid grids, puzzles whose
solution is unique (checked against every 4 x 4 grid, enumerated apart from the search), a verifier
that names each kind of error, and a folder a model of N token ids trains on."""

import itertools

import numpy as np
import pytest
from conftest import run_cli
from mds_testing import read_samples

from aogpt import UsageError
from aogpt.data_prep import sudoku_to_mds
from aogpt.data_prep.manifest import check_compatible, read_manifest
from aogpt.data_prep.sudoku import BLANK, TECHNIQUES, Sudoku, grid_rng, load_puzzles, parse_box

SUDOKU_TO_MDS = "data_prep/sudoku_to_mds.py"
SMALL = ["--train-grids", "300", "--val-grids", "20", "--givens", "12,16", "--puzzles", "4"]


def every_4x4_grid() -> np.ndarray:
    """All 288 solved 4 x 4 grids, by brute force over rows that are permutations: no search."""
    rows = np.array(list(itertools.permutations(range(4))))
    grids = rows[np.array(list(itertools.product(range(24), repeat=4)))].reshape(-1, 16)
    square = grids.reshape(-1, 4, 4)
    boxes = square.reshape(-1, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4).reshape(-1, 4, 4)
    distinct = lambda units: (np.sort(units, axis=2) == np.arange(4)).all(axis=(1, 2))  # noqa: E731
    return grids[distinct(square.transpose(0, 2, 1)) & distinct(boxes)]


@pytest.mark.parametrize("box", [(2, 2), (2, 3), (3, 3)])
def test_random_grids_are_solved_grids_and_a_seed_draws_the_same(box):
    sudoku = Sudoku(*box)
    grids = [sudoku.random_grid(grid_rng(0, 1, index)) for index in range(20)]
    assert all(sudoku.problems(grid) == [] for grid in grids)
    assert len({grid.tobytes() for grid in grids}) == 20
    assert np.array_equal(grids[7], sudoku.random_grid(grid_rng(0, 1, 7)))


def test_4x4_grids_are_drawn_from_all_288_near_uniformly():
    sudoku, every = Sudoku(2, 2), every_4x4_grid()
    assert len(every) == 288
    index = {grid.tobytes(): i for i, grid in enumerate(every)}
    counts = np.bincount([index[sudoku.random_grid(grid_rng(0, 0, i)).tobytes()]
                          for i in range(1440)], minlength=288)
    assert (counts > 0).sum() >= 280 and counts.max() < 20  # 5 expected of each


def test_puzzles_have_exactly_one_solution_among_every_4x4_grid():
    sudoku, every = Sudoku(2, 2), every_4x4_grid()
    for index in range(30):
        rng = grid_rng(3, 0, index)
        puzzle = sudoku.make_puzzle(sudoku.random_grid(rng), 4 + index % 6, rng)
        assert puzzle.givens == 4 + index % 6
        fits = (every[:, puzzle.given_mask] == puzzle.grid[puzzle.given_mask]).all(axis=1)
        assert fits.sum() == 1 and np.array_equal(every[fits][0], puzzle.solution)


def test_a_swappable_rectangle_has_two_solutions_and_no_puzzle_leaves_one():
    """Two rows of a band holding digits a, b at two columns as a b / b a: blanking those four
    cells lets the search find both fillings."""
    sudoku = Sudoku(2, 3)
    for index in itertools.count():
        grid = sudoku.random_grid(grid_rng(1, 0, index)).reshape(6, 6)
        pairs = [(c1, c2) for c1, c2 in itertools.combinations(range(6), 2)
                 if c1 // 3 != c2 // 3
                 and grid[0, c1] == grid[1, c2] and grid[0, c2] == grid[1, c1]]
        if pairs:
            break
    (c1, c2), puzzle = pairs[0], grid.reshape(-1).copy()
    puzzle[[c1, c2, 6 + c1, 6 + c2]] = BLANK
    assert sudoku.count_solutions(puzzle, limit=5) == 2
    made = sudoku.make_puzzle(grid.reshape(-1), 12, grid_rng(1, 1, 0))
    assert sudoku.count_solutions(made.grid, limit=5) == 1


def test_the_verifier_names_each_kind_of_error():
    sudoku = Sudoku(2, 3)
    rng = grid_rng(0, 2, 0)
    solution = sudoku.random_grid(rng)
    puzzle = sudoku.make_puzzle(solution, 12, rng)
    assert sudoku.problems(solution, puzzle.grid) == [] and sudoku.solves(solution, puzzle.grid)
    blank = solution.copy()
    blank[5] = BLANK
    assert sudoku.problems(blank) == ["cell 5 is blank"]
    assert sudoku.problems(np.where(np.arange(36) == 3, 6, solution)) == [
        "cell 3 holds 6, not a digit 0..5"]
    assert sudoku.problems(solution[:35]) == ["35 cells, not 36"]
    # cell 7 (row 1, column 1, box 0) takes its row neighbour's digit: row, column and box repeat
    wrong = solution.copy()
    wrong[7] = solution[8]
    assert sudoku.problems(wrong) == ["row 1 repeats a digit", "column 1 repeats a digit",
                                      "box 0 repeats a digit"]
    # a valid grid that is another solution: only the givens it changed are named
    other = Sudoku(2, 3).random_grid(grid_rng(0, 2, 1))
    changed = np.flatnonzero(puzzle.given_mask & (other != solution))
    assert sudoku.problems(other, puzzle.grid) == [f"given cell {c} changed" for c in changed]
    assert not sudoku.solves(other, puzzle.grid)


def test_wrong_cells_are_the_filled_cells_sharing_a_digit_in_a_unit_never_a_kept_given():
    sudoku = Sudoku(2, 3)
    rng = grid_rng(0, 2, 0)
    solution = sudoku.random_grid(rng)
    puzzle = sudoku.make_puzzle(solution, 12, rng)
    assert sudoku.wrong_cells(solution, puzzle.grid) == []
    cell = int(np.flatnonzero(~puzzle.given_mask)[0])
    row = cell // 6
    neighbour = next(c for c in range(row * 6, row * 6 + 6) if c != cell)
    wrong = solution.copy()
    wrong[cell] = solution[neighbour]
    peers = {int(c) for members in sudoku.units if cell in members for c in members
             if wrong[c] == wrong[cell]}  # every cell of cell's row, column and box with its digit
    expected = sorted(c for c in peers if not puzzle.given_mask[c])
    assert cell in expected and sudoku.wrong_cells(wrong, puzzle.grid) == expected
    changed = wrong.copy()
    given = int(np.flatnonzero(puzzle.given_mask)[0])
    changed[given] = BLANK
    assert given in sudoku.wrong_cells(changed, puzzle.grid)


def test_techniques_rank_puzzles_from_easiest():
    sudoku = Sudoku(2, 3)
    solution = sudoku.random_grid(grid_rng(0, 3, 0))
    one_blank = solution.copy()
    one_blank[0] = BLANK
    assert sudoku.technique(one_blank) == "naked singles"
    found = {sudoku.technique(sudoku.make_puzzle(sudoku.random_grid(rng), 10, rng).grid)
             for rng in (grid_rng(0, 4, i) for i in range(60))}
    assert found == set(TECHNIQUES)  # 10 givens: mostly naked singles, some need more


def test_text_round_trips_and_bad_text_is_one_line():
    sudoku = Sudoku(2, 2)
    grid = np.array([0, 1, 2, 3, 2, 3, 0, 1, 1, 0, 3, 2, 3, 2, 1, BLANK])
    assert sudoku.to_text(grid) == "123434122143432."
    assert np.array_equal(sudoku.from_text("123434122143432.", "grid"), grid)
    with pytest.raises(UsageError, match=r"grid holds '5': a 2x2 Sudoku's cells are 1..4 or"):
        sudoku.from_text("1234341221434325", "grid")
    with pytest.raises(UsageError, match="--box takes ROWSxCOLS"):
        parse_box("six")


# ---- the data folder --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sudoku_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("sudoku") / "data"
    result = run_cli(SUDOKU_TO_MDS, "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_the_folder_holds_solved_grids_and_held_out_puzzles(sudoku_data):
    out, log = sudoku_data
    manifest = read_manifest(out)
    sudoku, puzzles = load_puzzles(out, "--data")
    assert sudoku.name == "2x3" and manifest["seq_len"] == 36
    train, val = read_samples(out / "train"), read_samples(out / "val")
    assert train.shape == (300, 36) and val.shape == (20, 36)
    assert all(sudoku.problems(grid.astype(np.int64)) == []
               for grid in np.concatenate([train, val]))
    assert [p.givens for p in puzzles] == [12] * 4 + [16] * 4
    for puzzle in puzzles:
        assert sudoku.count_solutions(puzzle.grid) == 1
        assert sudoku.solves(puzzle.solution, puzzle.grid)
        assert puzzle.technique == sudoku.technique(puzzle.grid)
    solutions = {p.solution.astype(np.uint16).tobytes() for p in puzzles}
    assert not solutions & {grid.tobytes() for grid in np.concatenate([train, val])}
    check_compatible(manifest, 36, 6)  # a model of 6 token ids and 36 positions reads it
    with pytest.raises(UsageError, match="set model.vocab_size=6"):
        check_compatible(manifest, 36, 5)
    assert "done in" in log and "train: 300 samples of 36 tokens from 300 grids" in log


def test_a_second_run_finds_the_folder_complete_and_other_settings_are_refused(sudoku_data,
                                                                               run_main):
    out, _ = sudoku_data
    again = run_cli(SUDOKU_TO_MDS, "--out", str(out), *SMALL)
    assert again.returncode == 0 and "is complete already" in again.stdout
    code, _, err = run_main(sudoku_to_mds.main, "--out", out, *SMALL[:-1], "5")
    assert code == 2 and "built with other settings" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--box", "1x1"], "--box 1x1: a box must hold 2 to 9 cells"),
    (["--box", "2by3"], "--box takes ROWSxCOLS"),
    (["--givens", "0"], "--givens must be in 1..35"),
    (["--givens", "12,36"], "--givens must be in 1..35"),
    (["--givens", "twelve"], "--givens takes a comma list of whole numbers"),
    (["--box", "2x2", "--givens", "2", "--puzzles", "1"],
     "--givens 2: no 4 x 4 puzzle of 2 givens with a unique solution"),
    (["--train-grids", "0"], "--train-grids must be at least 1"),
])
def test_bad_input_is_one_line_before_any_work(run_main, flags, message, tmp_path):
    code, _, err = run_main(sudoku_to_mds.main, "--out", tmp_path / "out", *flags)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_out_path_that_is_a_file_is_refused(tmp_path):
    """The command's one refusal run as a real process, as a user meets it: its other refusals
    run in this process (run_main), without a process's seconds of imports each."""
    (tmp_path / "taken").write_text("a user's file")
    result = run_cli(SUDOKU_TO_MDS, "--out", str(tmp_path / "taken"), *SMALL)
    assert result.returncode == 2 and "--out" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "taken").read_text() == "a user's file"


@pytest.mark.parametrize("preset, box, folder", [("sudoku.yaml", (2, 3), "data/sudoku"),
                                                   ("sudoku9.yaml", (3, 3), "data/sudoku9")])
def test_each_preset_is_a_model_of_its_folders_grids(repo, preset, box, folder):
    from aogpt.trainer.config import load_config

    config, sudoku = load_config(repo / "configs" / preset), Sudoku(*box)  # --box 2x3, 3x3
    assert (config.model.vocab_size, config.model.block_size) == (sudoku.size, sudoku.cells)
    assert config.data.path == folder
    config.validate(world_size=1)
