"""benchmarks/paper_baseline.py times the paper's trainer and sampler beside ours. CI has no
checkout of the paper's code (its repository has no licence): the tests run it against a stand-in
of its files with the same interface (tests/benchmarks/paper_standin/)."""

import json
import shutil

import pytest
from conftest import REPO, run_cli

STANDIN = REPO / "tests" / "benchmarks" / "paper_standin"


@pytest.mark.slow  # compiles both training loops and starts ~10 sampler processes: ~2-3 min
def test_smoke_run_reports_both_sides_and_their_ratios(tmp_path):
    out = tmp_path / "paper.json"
    result = run_cli("benchmarks/paper_baseline.py", "--paper", str(STANDIN), "--smoke",
                     "--device", "cpu", "--accumulation", "1", "--train-steps", "1",
                     "--json", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["complete"] is True
    assert [row["compiled"] for row in report["train"]] == [False, True]
    for row in report["train"]:
        assert row["paper_tokens_per_s"] > 0 and row["ours_tokens_per_s"] > 0
        assert row["ratio"] == row["ours_tokens_per_s"] / row["paper_tokens_per_s"]
        assert row["paper_first_step_s"] > 0 and row["ours_first_step_s"] > 0  # timed apart
    best = report["train_best"]  # each side's fastest mode against the other's
    assert best["paper_tokens_per_s"] == max(r["paper_tokens_per_s"] for r in report["train"])
    assert best["ours_tokens_per_s"] == max(r["ours_tokens_per_s"] for r in report["train"])
    assert best["ratio"] == best["ours_tokens_per_s"] / best["paper_tokens_per_s"]
    assert [row["steps"] for row in report["generation"]] == [4, 8]
    for row in report["generation"]:
        paper, ours = row["paper"], row["ours"]
        assert paper in row["paper_modes"] and len(row["paper_modes"]) in (2, 4)
        assert paper["generate_s"] == min(m["generate_s"] for m in row["paper_modes"])  # its best
        # the first samples come after the process's start-up and a first (compiling) call;
        # generation is a second call, timed alone
        assert ours["first_samples_s"] > ours["generate_s"] > 0
        assert row["ratio_generate"] == paper["generate_s"] / ours["generate_s"]
        assert row["ratio_first_samples"] == paper["first_samples_s"] / ours["first_samples_s"]
    assert "to the first samples" in result.stdout


def test_a_folder_without_the_papers_files_is_one_line(tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(STANDIN, partial)
    (partial / "ema.py").unlink()
    result = run_cli("benchmarks/paper_baseline.py", "--paper", str(partial), "--smoke")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --paper {partial} lacks ema.py: give a checkout of github.com/scxue/AO-GPT-MDM"]


@pytest.mark.parametrize("args, message", [
    (["--part", "speed"], "--part: unknown part(s) speed"),
    (["--steps", "2048"], "--steps must each be in 1..1024"),
    (["--samples", "0"], "--samples must be at least 1"),
    (["--train-modes", "fast"], "--train-modes: unknown mode(s) fast"),
])
def test_bad_options_are_one_line_errors(args, message):
    result = run_cli("benchmarks/paper_baseline.py", "--paper", str(STANDIN), *args)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {message}"), result.stderr
