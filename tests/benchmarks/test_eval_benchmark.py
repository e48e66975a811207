"""benchmarks/eval_ensemble.py runs end to end on a tiny size: both paths, the same numbers."""

import json

from conftest import run_cli


def test_ensemble_benchmark_times_both_paths_on_the_same_pairs(tmp_path):
    result = run_cli("benchmarks/eval_ensemble.py", "--presets", "tiny", "--seq-len", "16",
                     "--batch-size", "2", "--targets", "3", "--members", "3", "--repeats", "1",
                     "--json", str(tmp_path / "out.json"))
    assert result.returncode == 0, result.stderr
    assert "batched / straightforward: speed" in result.stdout
    tiny = json.loads((tmp_path / "out.json").read_text())["tiny"]
    assert tiny["pairs"] == 2 * 3 * 2
    assert set(tiny["paths"]) == {"straightforward", "batched"}
    # fp32 NLLs of ~10.8 (ulp ~1e-6) from forwards of other shapes: an ulp or two apart on any
    # CPU; a wrong context or member moves them by ~0.1 or more
    assert tiny["max_nll_difference"] < 1e-4
    assert tiny["token_forward_ratio"] > 1  # counted slots, not timed: the same on any machine
    assert tiny["speedup"] > 0  # reported, never required: timings are not tested


def test_ensemble_benchmark_rejects_an_ensemble_of_one():
    result = run_cli("benchmarks/eval_ensemble.py", "--members", "1")
    assert result.returncode == 2 and "--members is too small" in result.stderr
