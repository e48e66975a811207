"""Every benchmark with a --json writes it the moment a row is measured (benchmarks/results.py):
a run cut short by a time limit (a device call's 10 minutes) keeps every row it finished. Each is
stopped right after its first row, as a limit would stop it (the test-only
AOGPT_TEST_STOP_AFTER_ROWS), and its JSON must hold that row, marked incomplete."""

import json
import os
import sys

import pytest
from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "benchmarks"))
from results import STOP_VARIABLE, STOPPED  # noqa: E402

STANDIN = REPO / "tests" / "benchmarks" / "paper_standin"
BY_MODEL = lambda data: [data[model] for model in ("tiny", "small") if model in data]  # noqa: E731
# benchmark: its arguments for a run of two rows or more, and the rows in its JSON
BENCHMARKS = {
    "decode_step": (["--preset", "tiny", "--batch-size", "2", "--seq-len", "32", "--repeats", "1"],
                    lambda data: data["results"]),
    "generation_speed": (["--preset", "tiny", "--device", "cpu", "--batch-size", "1", "--seq-len",
                          "8", "--steps", "2,8", "--dtype", "fp32"], lambda data: data["results"]),
    "paper_baseline": (["--paper", str(STANDIN), "--smoke", "--device", "cpu", "--part",
                        "train,generation", "--accumulation", "1", "--train-steps", "1",
                        "--train-modes", "eager,compiled"], lambda data: data["train"]),
    "model_throughput": (["--presets", "tiny,small", "--batch-size", "2", "--seq-len", "16",
                          "--steps", "1", "--warmup", "0"], BY_MODEL),
    "eval_ensemble": (["--presets", "tiny,small", "--seq-len", "16", "--batch-size", "2",
                       "--targets", "3", "--members", "3", "--repeats", "1"], BY_MODEL),
    "record_calls": (["--batch-size", "2", "--seq-len", "16", "--repeats", "1"],
                     lambda data: data["results"]),
}
# ~30 s each: model builds, a training step; record_calls: GPT-2's vocabulary, 4 generations
SLOW = {"paper_baseline", "eval_ensemble", "record_calls"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW
                                  else name for name in BENCHMARKS])
def test_a_benchmark_cut_after_its_first_row_leaves_that_row_in_its_json(name, tmp_path):
    arguments, rows_of = BENCHMARKS[name]
    out = tmp_path / "out.json"
    result = run_cli(f"benchmarks/{name}.py", *arguments, "--json", str(out),
                     env={**os.environ, STOP_VARIABLE: "1"})
    assert result.returncode == STOPPED, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["complete"] is False and len(rows_of(data)) == 1
