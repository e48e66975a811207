"""docs/findings (Shakespeare) and docs/findings-synthetic (the synthetic language): each
committed report is what its committed data rebuild, byte for byte."""

import json
import shutil

import pytest
from conftest import REPO, run_cli

REPORTS = ("findings", "findings-synthetic")


# the rebuild draws every figure (~10 s on 2 cores): the fast suite rebuilds the Shakespeare one
@pytest.mark.parametrize("name", ["findings", pytest.param("findings-synthetic",
                                                           marks=pytest.mark.slow)])
def test_the_committed_report_is_rebuilt_byte_for_byte_from_the_committed_data(name, tmp_path):
    committed = REPO / "docs" / name
    copy = tmp_path / name
    shutil.copytree(committed, copy)
    (copy / "report.md").unlink()
    result = run_cli("experiments/run.py", "--report-only", "--out", str(copy))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (copy / "report.md").read_bytes() == (committed / "report.md").read_bytes()


@pytest.mark.parametrize("name", REPORTS)
def test_the_committed_suite_ran_from_a_clean_commit_with_every_run_kept(name):
    folder = REPO / "docs" / name
    suite = json.loads((folder / "suite.json").read_text())
    assert not suite["git_commit"].endswith("+dirty")
    for run_name, run in suite["runs"].items():
        assert run["done"], run_name
        assert (folder / "runs" / run_name / "metrics.jsonl").is_file(), run_name
        assert (folder / "runs" / run_name / "config.yaml").is_file(), run_name
        assert (folder / "evals" / f"{run_name}.json").is_file(), run_name
    assert (folder / "speed.json").is_file()
