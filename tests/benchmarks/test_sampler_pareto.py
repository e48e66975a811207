"""benchmarks/sampler_pareto.py end to end on a tiny model of a tiny synthetic language: every
family of rows, the exact judge's numbers, the JSON, table and plot."""

import json
import sys
from pathlib import Path

import pytest

from aogpt.data_prep.manifest import read_manifest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "trainer"))
import sampler_pareto  # noqa: E402
from test_synthetic_judge import N, build, model_of  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pareto")
    language = build(root / "language", seed=0)
    model = model_of(root / "model", read_manifest(language)["tokenizer"])
    out = root / "rows.json"
    code = sampler_pareto.main([
        "--ckpt", str(model), "--weights", "raw", "--judge", str(language), "--num-samples", "4",
        "--batch-sizes", "1,2", "--timed-batches", "1", "--steps", f"4,{N}", "--drafts", "2",
        "--trees", "1,2", "--tree-depths", "0,5", "--predrafts", "0,9",
        "--planners", "confidence", "--thresholds", "0.5", "--json", str(out),
        "--table", str(root / "table.md"), "--plot", str(root / "plot.png")])
    assert code == 0
    return json.loads(out.read_text()), root


def test_every_family_is_measured_and_judged_exactly(run):
    data, root = run
    rows = {row["label"]: row for row in data["rows"]}
    assert list(rows) == [f"parallel S={N}", "parallel S=4", "parallel binomial S=4",
                          "speculative K=2", "speculative K=2 R=2", "speculative tree K=2 C=2",
                          "speculative tree K=2 C=2 R=2", "speculative tree K=2 C=2 L=1",
                          "speculative tree K=2 C=2 L=1 R=2", "l2r S=n",
                          "planner confidence",
                          "planner threshold 0.5"]
    assert rows[f"parallel S={N}"]["calls_per_token"] == 1.0
    assert rows["parallel S=4"]["calls_per_token"] == 4 / N
    assert rows["speculative K=2"]["calls_per_token"] <= 1.0
    assert rows["speculative tree K=2 C=2"]["settings"]["tree"] == 2
    assert rows["speculative tree K=2 C=2 L=1"]["settings"]["tree_depth"] == 1  # 5: K - 1 at most
    assert rows["speculative K=2 R=2"]["settings"]["predraft"] == 2  # 9: K at most
    assert rows["planner confidence"]["calls_per_token"] == 1.0  # one position per call
    assert 1 / N <= rows["planner threshold 0.5"]["calls_per_token"] <= 1.0
    for row in rows.values():
        judged = row["judge"]
        assert judged["true_nll"] > 0 and judged["entropy_rate"] > 0
        assert 0 <= judged["repetition"] <= 1 and judged["entropy"] > 0
        assert set(row["seconds_per_token"]) == {"1", "2"}
    assert "planner threshold 0.5" in (root / "table.md").read_text()
    assert (root / "plot.png").stat().st_size > 1000


@pytest.mark.parametrize("flags, message", [
    (["--steps", "4,4"], "--steps 4,4: 4 is given twice (each is run once): give each once"),
    (["--drafts", "2,1,2"], "--drafts 2,1,2: 2 is given twice"),
    (["--tree-depths", "0,-1"], "--tree-depths values must be >= 0, got '0,-1'"),
    (["--planners", "order"], "--planners takes confidence, margin, entropy"),
    (["--planners", "threshold"], "--planners takes"),
    (["--thresholds", "1.5"], "--thresholds values must be in (0, 1)"),
])
def test_bad_planner_settings_are_one_line(capsys, flags, message):
    assert sampler_pareto.main(["--ckpt", "nowhere", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("flag, values, most", [("--steps", f"4,{N + 1}", N),
                                               ("--drafts", f"2,{N}", N - 1)])
def test_settings_beyond_the_sample_length_are_refused_not_dropped(run, capsys, flag, values,
                                                                     most):
    _, root = run
    assert sampler_pareto.main(["--ckpt", str(root / "model"), "--weights", "raw", flag,
                                values]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (f"{flag} {values}: {values.split(',')[1]} is more than a "
                                     f"sample of n = {N} tokens allows ({most} at most)") in err


def test_force_replaces_the_benchmarks_own_json_and_plot_and_nothing_else(run, tmp_path):
    from aogpt import UsageError
    from aogpt.files import check_output_file

    _, root = run
    for name, output in (("rows.json", sampler_pareto.JSON), ("plot.png", sampler_pareto.PLOT)):
        check_output_file(root / name, "--x", True, output)  # its own: replaced with --force
    other = tmp_path / "other.json"
    other.write_text('{"results": []}')
    with pytest.raises(UsageError, match="choose another name"):
        check_output_file(other, "--json", True, sampler_pareto.JSON)
