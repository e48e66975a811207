"""benchmarks/gpu_report.py: its --smoke run goes through every part on this machine (CI has no
GPU), writes the markdown and JSON, and bad input is one line."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

STANDIN = REPO / "tests" / "benchmarks" / "paper_standin"


@pytest.mark.slow  # trainer launches, both samplers, the paper's stand-in: ~3-5 min on 2 cores
def test_smoke_report_runs_every_part_and_writes_markdown_and_json(tmp_path):
    out = tmp_path / "report.md"
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--out", str(out), "--paper", str(STANDIN))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    (row,) = report["train"]
    assert row["tokens_per_s"] > 0 and row["precision"] == "fp32" and "error" not in row
    e2e = report["e2e"]
    assert e2e["ok"] and e2e["resumed"] and e2e["last_step"] == e2e["steps"]
    assert e2e["last_loss"] < e2e["first_loss"]
    assert [r["steps"] for r in report["generation"]["results"]] == [4, 32]
    assert [r["compiled"] for r in report["decode"]["results"]] == [False, True]
    assert report["paper"]["train"] and report["paper"]["generation"]
    assert report["tests"]["exit_code"] == 0 and report["skipped"] == []
    if not torch.cuda.is_available():
        assert "skipped" in report["tests"]["summary"]  # the GPU tests are collected, and skip
    text = out.read_text()
    for heading in ("# GPU report (smoke run", "## Goals", "## Training throughput",
                    "## End to end", "## Generation", "## One decoder step",
                    "## The paper's code beside ours", "## `pytest -m gpu`"):
        assert heading in text


def test_a_smoke_run_without_out_writes_to_a_temporary_folder_never_to_docs():
    committed = {name: (REPO / "docs" / name).read_bytes()
                 for name in ("gpu-report.md", "gpu-report.json")}
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--only", "decode")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = Path(re.search(r"writing (\S+gpu-report\.md)", result.stdout).group(1))
    assert written.is_file() and REPO not in written.parents
    assert "## One decoder step" in written.read_text()
    assert {name: (REPO / "docs" / name).read_bytes() for name in committed} == committed
    result = run_cli("benchmarks/gpu_report.py", "--smoke", "--only", "decode", "--out",
                     str(REPO / "docs" / "gpu-report.md"))
    assert result.returncode == 2 and "that is the GPU's report" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--smoke", "--only", "train,speed"], "--only: unknown part(s) speed"),
    (["--smoke", "--train-filter", "dtype=bf16"], "--train-filter dtype=bf16: use KEY=VALUE"),
])
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    result = run_cli("benchmarks/gpu_report.py", *args, "--out", str(tmp_path / "r.md"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr
    assert not (tmp_path / "r.md").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_only_the_smoke_run_is_offered(tmp_path):
    result = run_cli("benchmarks/gpu_report.py", "--out", str(tmp_path / "r.md"))
    assert result.returncode == 2
    assert "no CUDA GPU here" in result.stderr and "--smoke" in result.stderr
