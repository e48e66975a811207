"""benchmarks/model_throughput.py runs end to end on a tiny size and reports both loss paths."""

import json

from conftest import run_cli


def test_throughput_benchmark_compares_chunked_and_full_logits(tmp_path):
    result = run_cli("benchmarks/model_throughput.py", "--presets", "tiny", "--batch-size", "2",
                     "--seq-len", "16", "--steps", "1", "--warmup", "0",
                     "--json", str(tmp_path / "out.json"))
    assert result.returncode == 0, result.stderr
    assert "chunked / full: speed" in result.stdout
    paths = json.loads((tmp_path / "out.json").read_text())["tiny"]["paths"]
    assert set(paths) == {"full logits", "chunked (8)"}
    assert all(row["tokens_per_s"] > 0 and row["peak_bytes"] > 0 for row in paths.values())


def test_throughput_benchmark_rejects_an_unknown_preset():
    result = run_cli("benchmarks/model_throughput.py", "--presets", "huge")
    assert result.returncode == 2 and "unknown ['huge']" in result.stderr


def test_cpu_loss_benchmark_refuses_zero_tokens():
    """No ratios over zero tokens."""
    result = run_cli("benchmarks/cpu_loss.py", "--tokens", "0", "--no-compiled")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: --tokens must be at least 1, got 0"]
