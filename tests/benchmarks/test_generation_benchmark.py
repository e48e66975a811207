"""benchmarks/generation_speed.py runs end to end on a tiny size and reports both samplers."""

import json
import sys

import pytest
import torch
from conftest import REPO, run_cli

from aogpt.model.precision import cpu_has_native_bf16

sys.path.insert(0, str(REPO / "benchmarks"))
import generation_speed  # noqa: E402


def test_generation_benchmark_times_decoder_and_encoder_per_step_count(tmp_path):
    out = tmp_path / "speed.json"
    result = run_cli("benchmarks/generation_speed.py", "--preset", "tiny", "--device", "cpu",
                     "--batch-size", "1", "--seq-len", "8", "--steps", "2,8", "--dtype", "fp32",
                     "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "ratio" in result.stdout
    rows = json.loads(out.read_text())["results"]
    assert [r["steps"] for r in rows] == [2, 8]
    for r in rows:
        assert r["decoder_s"] > 0 and r["encoder_s"] > 0
        assert r["ratio"] == r["encoder_s"] / r["decoder_s"]
        assert r["encoder_rows"] == r["steps"] * 8
    # the decoder feeds each token once plus one copy per parallel target: below 2n rows
    assert rows[0]["decoder_rows"] == 4 + 7 and rows[1]["decoder_rows"] == 8


def test_generation_benchmark_rejects_more_steps_than_tokens(run_main):
    code, _, err = run_main(generation_speed.main, "--preset", "tiny", "--device", "cpu",
                            "--seq-len", "8", "--steps", "16")
    assert code == 2 and "--steps must each be in 1..8" in err


def test_generation_benchmark_defaults_to_bf16_only_where_the_cpu_runs_it_natively(tmp_path):
    """An AVX2-only CPU emulates bf16 matmuls ~50x slower: the default there is fp32."""
    out = tmp_path / "speed.json"
    result = run_cli("benchmarks/generation_speed.py", "--preset", "tiny", "--device", "cpu",
                     "--batch-size", "1", "--seq-len", "8", "--steps", "8", "--json", str(out))
    assert result.returncode == 0, result.stderr
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert json.loads(out.read_text())["dtype"] == str(expected)


@pytest.mark.parametrize("flag", ["--batch-size", "--seq-len", "--repeats"])
def test_generation_benchmark_refuses_zero_rather_than_reading_it_as_the_default(run_main, flag):
    argv = ["--preset", "tiny", "--device", "cpu", "--steps", "4", flag, "0"]
    if flag == "--batch-size":  # the command's one refusal as a user meets it: a real process
        result = run_cli("benchmarks/generation_speed.py", *argv)
        code, err = result.returncode, result.stderr
    else:  # the others in this process, without a process's seconds of imports each
        code, _, err = run_main(generation_speed.main, *argv)
    assert code == 2
    assert err.splitlines() == [f"error: {flag} must be at least 1, got 0"]
