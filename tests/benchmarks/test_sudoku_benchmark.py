"""benchmarks/sudoku_planners.py end to end on untrained tiny models: every method at every
budget, its JSON written row by row and its table; two arms compared on the same puzzles; a model
of other grids refused in one line."""

import json
import sys

import pytest
import torch
from conftest import REPO, run_cli

from aogpt.model import AOGPT, ModelConfig, save_consolidated

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
