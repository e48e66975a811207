"""benchmarks/long_generation.py end to end on a tiny model of a tiny synthetic language."""

import json
import sys
from pathlib import Path

import pytest

from aogpt.data_prep.manifest import read_manifest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "trainer"))
import long_generation  # noqa: E402
from test_synthetic_judge import N, build, model_of  # noqa: E402


def test_the_seams_and_the_long_texts_are_judged_exactly(tmp_path, capsys):
    language = build(tmp_path / "language", seed=0)
    model = model_of(tmp_path / "model", read_manifest(language)["tokenizer"])
    out = tmp_path / "rows.json"
    code = long_generation.main(["--ckpt", str(model), "--weights", "raw", "--judge",
                                 str(language), "--blocks", "3", "--windows", "4,8",
                                 "--num-samples", "4", "--batch-size", "2", "--seam-tokens", "2",
                                 "--json", str(out), "--table", str(tmp_path / "table.md")])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["window"] for r in rows] == [4, 8]
    assert rows[0]["seams"] == [N, 2 * N - 4, 3 * N - 8][:len(rows[0]["seams"])]
    for r in rows:
        assert r["length"] == 3 * N and r["nll_long"] > 0 and r["nll_seams"] > 0
        assert r["calls_per_token_long"] <= 1.0
        assert r["long_over_one_block"] == r["nll_long"] / r["nll_one_block"]
    assert "| 8 | 48 |" in (tmp_path / "table.md").read_text()


@pytest.fixture(scope="module")
def model_and_judge(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("long")
    language = build(root / "language", seed=0)
    model = model_of(root / "model", read_manifest(language)["tokenizer"])
    return ["--ckpt", str(model), "--weights", "raw", "--judge", str(language)]


@pytest.mark.parametrize("flags, message", [
    (["--windows", str(N)], f"--window must be in 1..{N - 1}"),
    (["--windows", "4", "--seam-tokens", str(N - 4)],
     f"--seam-tokens {N - 4}: a chunk of window 4 generates {N - 4} tokens"),
    (["--blocks", "1"], "--blocks 1: a text of one block has no seam to judge"),
    (["--windows", "4,8,4"], "--windows 4,8,4: 4 is given twice"),
], ids=["a window of the block", "seams of a whole chunk", "one block", "a window twice"])
def test_settings_that_would_leave_a_column_empty_are_one_line(model_and_judge, tmp_path, capsys,
                                                               flags, message):
    out = tmp_path / "rows.json"
    assert long_generation.main([*model_and_judge, *flags, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()
