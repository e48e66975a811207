"""python -m aogpt.launch (aogpt/launch.py): DeepSpeed's launcher, whose Ctrl-C reaches the ranks
alone and ends in one line with status 130 once they have saved, with no traceback of the
launcher's; run for real, 2 DeepSpeed processes on the synthetic language, SIGINT sent to the
command's process group as a terminal's Ctrl-C is."""

import hashlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from trainer_testing import REPO, reference_args

from aogpt.model import load_checkpoint


def hashes(folder) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow  # 2 DeepSpeed processes, ~20 s of start-up
def test_ctrl_c_saves_a_checkpoint_then_ends_in_one_line_with_status_130(launcher, synthetic_data,
                                                                         tmp_path):
    out, data = tmp_path / "run", hashes(synthetic_data)
    status, log = launcher.run_and_signal("aogpt.launch", reference_args(synthetic_data, out), out,
                                          after_step=2, sig=signal.SIGINT)
    assert status == 130, log[-3000:]
    assert log.strip().splitlines()[-1] == ("interrupted: every rank saved a checkpoint and "
                                            "stopped; the same command resumes from it")
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
    assert log.count("Ctrl-C: saving a checkpoint at the end of this step, then stopping") == 1
    assert "on SIGINT" in log  # the trainer's own account of the stop
    tag = (out / "checkpoints" / "latest").read_text()
    assert int(tag.removeprefix("step_")) >= 2
    assert load_checkpoint(out / "checkpoints" / tag).config.n_layer == 2
    assert hashes(synthetic_data) == data  # the data it read is untouched


def test_ctrl_c_before_any_rank_has_started_ends_at_once_in_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    process = subprocess.Popen(
        [sys.executable, "-m", "aogpt.launch", "--num_gpus", "2", "trainer/main.py", "--config",
         "configs/tiny.yaml", f"out_dir={tmp_path / 'run'}"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(1.0)  # the launcher is importing DeepSpeed: seconds before it starts a rank
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert stderr.strip().splitlines() == ["interrupted: stopped before any rank had started "
                                           "(nothing to save)"]
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]
