"""benchmarks/long_generation.py end to end on a tiny model of a tiny synthetic language."""

import json
import sys
from pathlib import Path

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


def test_a_window_of_the_block_is_one_line(tmp_path, capsys):
    language = build(tmp_path / "language", seed=0)
    model = model_of(tmp_path / "model", read_manifest(language)["tokenizer"])
    assert long_generation.main(["--ckpt", str(model), "--weights", "raw", "--judge",
                                 str(language), "--windows", str(N)]) == 2
    err = capsys.readouterr().err
    assert f"--window must be in 1..{N - 1}" in err and err.count("\n") == 1
