"""docs/findings: the committed report is what its committed data rebuild, byte for byte."""

import json
import shutil

from conftest import REPO, run_cli

FINDINGS = REPO / "docs" / "findings"


def test_the_committed_report_is_rebuilt_byte_for_byte_from_the_committed_data(tmp_path):
    copy = tmp_path / "findings"
    shutil.copytree(FINDINGS, copy)
    (copy / "report.md").unlink()
    result = run_cli("experiments/run.py", "--report-only", "--out", str(copy))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (copy / "report.md").read_bytes() == (FINDINGS / "report.md").read_bytes()


def test_the_committed_suite_ran_from_a_clean_commit_with_every_run_kept():
    suite = json.loads((FINDINGS / "suite.json").read_text())
    assert not suite["git_commit"].endswith("+dirty")
    for name, run in suite["runs"].items():
        assert run["done"], name
        assert (FINDINGS / "runs" / name / "metrics.jsonl").is_file(), name
        assert (FINDINGS / "runs" / name / "config.yaml").is_file(), name
        assert (FINDINGS / "evals" / f"{name}.json").is_file(), name
    assert (FINDINGS / "speed.json").is_file()
