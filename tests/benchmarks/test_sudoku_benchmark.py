"""benchmarks/sudoku_planners.py end to end on untrained tiny models: every method at every
budget, its JSON written row by row and its table; two arms compared on the same puzzles; a model
of other grids refused in one line; the replay page (--html) of puzzles solved cell by cell, in a
real browser too."""

import json
import re
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, run_cli

from aogpt.data_prep.sudoku import load_puzzles
from aogpt.model import (
    AOGPT,
    KVCacheSampler,
    ModelConfig,
    SamplingConfig,
    load_checkpoint,
    save_consolidated,
)

sys.path.insert(0, str(REPO / "benchmarks"))
from results import STOP_VARIABLE, STOPPED  # noqa: E402
from sudoku_planners import main as sudoku_planners  # noqa: E402


@pytest.fixture(scope="module")
def puzzles(tmp_path_factory):
    """A 4 x 4 Sudoku folder: 2 puzzles each of 6 and 10 givens."""
    out = tmp_path_factory.mktemp("sudoku") / "data"
    result = run_cli("data_prep/sudoku_to_mds.py", "--out", str(out), "--box", "2x2",
                     "--train-grids", "20", "--val-grids", "4", "--givens", "6,10",
                     "--puzzles", "2")
    assert result.returncode == 0, result.stderr
    return out


def checkpoint(folder, vocab: int, block: int, seed: int = 0):
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=block, cond_dim=8,
                         vocab_size=vocab)
    torch.manual_seed(seed)
    model = AOGPT(config)
    save_consolidated(folder, config, model.state_dict(), model.state_dict(), step=0)
    return folder


def test_the_smoke_run_writes_every_method_at_every_budget(puzzles, tmp_path):
    ckpt = checkpoint(tmp_path / "model", vocab=4, block=16)
    out, table = tmp_path / "rows.json", tmp_path / "table.md"
    assert sudoku_planners(["--ckpt", str(ckpt), "--data", str(puzzles), "--smoke", "--device",
                            "cpu", "--json", str(out), "--table", str(table)]) == 0
    data = json.loads(out.read_text())
    assert data["complete"] and data["givens"] == [10, 6]
    rows = data["results"]
    assert [(row["budget"], row["method"]) for row in rows] == [
        (budget, method) for budget in ("1 call per blank", "1 call per 2 blanks")
        for method in ("random order", "left to right", "confidence", "margin", "entropy")
    ] + [("threshold's own", "threshold")]
    for row in rows:
        assert row["puzzles"] == 4 and 0 <= row["solved"] <= row["cells_right"] <= 1
        assert row["solved_by_givens"]["6"]["puzzles"] == 2
    one_per_blank = [row for row in rows if row["budget"] == "1 call per blank"]
    assert all(row["calls_per_blank"] == 1 for row in one_per_blank)  # equal calls
    assert all(row["calls_per_blank"] <= 0.75 for row in rows if "2 blanks" in row["budget"])
    text = table.read_text()
    assert "| model | 0 | 0 | 1 call per blank | margin |" in text
    assert len([line for line in text.splitlines() if line.startswith("| model |")]) == len(rows)
    assert "Puzzles that need search" in text or "No puzzle needs search." in text


def test_arms_are_measured_on_the_same_puzzles_and_compared_with_the_first(puzzles, tmp_path):
    arms = [f"uniform={checkpoint(tmp_path / 'a', vocab=4, block=16)}",
            f"planner={checkpoint(tmp_path / 'b', vocab=4, block=16, seed=1)}"]
    out = tmp_path / "rows.json"
    assert sudoku_planners(["--ckpt", arms[0], "--ckpt", arms[1], "--data", str(puzzles),
                            "--smoke", "--device", "cpu", "--methods", "random order,margin",
                            "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert list(data["arms"]) == ["uniform", "planner"]
    rows = data["results"]
    assert [(row["arm"], row["budget"], row["method"]) for row in rows] == [
        (arm, budget, method) for arm in ("uniform", "planner")
        for budget in ("1 call per blank", "1 call per 2 blanks")
        for method in ("random order", "margin")]
    for row in rows:
        first = next(r for r in rows if r["arm"] == "uniform" and r["method"] == row["method"]
                     and r["budget"] == row["budget"])
        expected = row["solved"] / first["solved"] if first["solved"] else None
        assert row["x_first_arm"] == expected


def test_a_run_cut_after_its_first_row_keeps_it(puzzles, tmp_path, monkeypatch):
    ckpt = checkpoint(tmp_path / "model", vocab=4, block=16)
    out = tmp_path / "rows.json"
    monkeypatch.setenv(STOP_VARIABLE, "1")
    with pytest.raises(SystemExit) as stopped:
        sudoku_planners(["--ckpt", str(ckpt), "--data", str(puzzles), "--smoke", "--device",
                         "cpu", "--json", str(out)])
    assert stopped.value.code == STOPPED
    data = json.loads(out.read_text())
    assert data["complete"] is False and len(data["results"]) == 1


def test_a_model_of_other_grids_is_refused_in_one_line(puzzles, tmp_path, capsys):
    ckpt = checkpoint(tmp_path / "model", vocab=6, block=36)
    assert sudoku_planners(["--ckpt", str(ckpt), "--data", str(puzzles), "--smoke"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --ckpt {ckpt} is a model of 36 positions and 6 token ids; --data {puzzles} holds "
        "4 x 4 grids (16 cells of 4 digits): benchmark a model trained on them "
        "(configs/sudoku.yaml with model.block_size=16 model.vocab_size=4)"]


REPLAYED = {"planner": "margin", "reveal": 1}  # the margin planner at one call per blank


@pytest.fixture(scope="module")
def replay(puzzles, tmp_path_factory):
    """The replay page of 3 puzzles solved by the margin planner: its path, its data (the JSON it
    embeds) and the checkpoint."""
    folder = tmp_path_factory.mktemp("replay")
    ckpt, page = checkpoint(folder / "model", vocab=4, block=16), folder / "sudoku.html"
    assert sudoku_planners(["--ckpt", str(ckpt), "--data", str(puzzles), "--smoke", "--device",
                            "cpu", "--methods", "margin", "--html", str(page),
                            "--html-puzzles", "3"]) == 0
    found = re.search(r'<script type="application/json" id="replay-data">(.*?)</script>',
                      page.read_text(encoding="utf-8"), re.S)
    return page, json.loads(found[1]), ckpt


def rows_grids(ckpt, puzzles) -> dict[int, list[int]]:
    """Each held-out puzzle's grid as the benchmark's rows fill it: its givens group in one
    batch, the puzzle's number in the folder as its sample id."""
    sudoku, held_out = load_puzzles(puzzles, "--data")
    model = load_checkpoint(ckpt / "model.safetensors", weights="ema").eval()
    grids = {}
    for givens in {p.givens for p in held_out}:
        numbers = [i for i, p in enumerate(held_out) if p.givens == givens]
        sampler = KVCacheSampler(model, len(numbers), 16, SamplingConfig(seed=0, temperature=0,
                                                                         **REPLAYED))
        mask = torch.tensor(np.stack([held_out[i].given_mask for i in numbers]))
        given = torch.tensor(np.stack([held_out[i].grid.clip(min=0) for i in numbers]))
        tokens = sampler.generate(torch.tensor(numbers), given, mask).tokens
        grids |= dict(zip(numbers, tokens.tolist(), strict=True))
    return grids


def shown_grid(data: dict, sample: dict) -> list[int]:
    """A page sample's final digits as token ids (the page's pieces are the digits 1..N)."""
    return [int(data["pieces"][t]) - 1 for t in sample["tokens"]]


def test_the_replay_page_shows_each_puzzle_as_the_rows_solved_it_and_its_wrong_cells(
        replay, puzzles):
    _, data, ckpt = replay
    sudoku, held_out = load_puzzles(puzzles, "--data")
    assert data["grid"] == [4, 4, 2, 2]
    assert [sample["label"].split(" · ")[1] for sample in data["samples"]] == ["margin"] * 3
    grids = rows_grids(ckpt, puzzles)
    for sample in data["samples"]:
        number = int(re.search(r"puzzle #(\d+)", sample["label"])[1])
        puzzle, grid = held_out[number], shown_grid(data, sample)
        assert grid == grids[number]
        assert sample["given"] == np.flatnonzero(puzzle.given_mask).tolist()
        assert sorted(sample["given"] + sample["order"]) == list(range(16))
        assert sample["reveals"] == [1] * len(sample["order"])  # one call per blank
        assert all("c" in call for call in sample["events"])  # the candidates, at each call
        assert sample.get("wrong", []) == sudoku.wrong_cells(np.array(grid), puzzle.grid)
        assert ("solved" in sample["label"]) == sudoku.solves(np.array(grid), puzzle.grid)


@pytest.mark.slow
def test_the_grid_played_to_its_end_in_a_browser_is_the_grid_written(page, replay):
    path, data, _ = replay
    page.context.set_offline(True)
    page.goto(path.as_uri())
    page.wait_for_selector("#player[data-ready='1']")
    assert page.requests == [path.as_uri()]
    for index, sample in enumerate(data["samples"]):
        page.select_option(".picker", str(index))
        page.select_option(".speed", "1000")
        page.click(".play")
        page.wait_for_selector("#player[data-done='1'][data-playing='0']")
        shown = page.eval_on_selector_all(
            ".cells [data-p]", "cells => cells.map(c => [Number(c.dataset.p), c.textContent])")
        assert [int(text) - 1 for _, text in sorted(shown)] == shown_grid(data, sample)
        marked = page.eval_on_selector_all(".cells [data-wrong]",
                                           "cells => cells.map(c => Number(c.dataset.p))")
        assert sorted(marked) == sample.get("wrong", [])
