"""benchmarks/paper_baseline.py times the paper's trainer and sampler beside ours. CI has no
checkout of the paper's code (its repository has no licence): the tests run it against a stand-in
of its files with the same interface (tests/benchmarks/paper_standin/). Its smoke run, both
parts, is the one that benchmarks/gpu_report.py --smoke makes (tests/benchmarks/
test_gpu_report.py checks its rows there): the two commands compile the same four training loops.
"""

import shutil
import sys

import pytest
from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "benchmarks"))
import paper_baseline  # noqa: E402

STANDIN = REPO / "tests" / "benchmarks" / "paper_standin"


def test_a_folder_without_the_papers_files_is_one_line(tmp_path):
    """The command's one refusal run as a real process, as a user meets it: its bad options run
    in this process (run_main), without a process's seconds of imports each."""
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
def test_bad_options_are_one_line_errors(run_main, args, message):
    code, _, err = run_main(paper_baseline.main, "--paper", STANDIN, *args)
    assert code == 2 and err.startswith(f"error: {message}"), err
