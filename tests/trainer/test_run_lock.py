"""out_dir/run.lock: one training at a time in a run folder, and a lock whose holder is gone taken
over with a warning. Real files and real processes (the holder of a stale lock has really ended)."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from aogpt import UsageError
from aogpt.trainer import run_lock
from aogpt.trainer.run_lock import RunLock, holder_record, stale_because


@pytest.fixture
def ended_process() -> int:
    """The id of a process that has run and ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_lock_on_the_folder_is_refused_until_the_first_is_released(tmp_path):
    first, second = RunLock(tmp_path / "run.lock"), RunLock(tmp_path / "run.lock")
    first.acquire()
    with pytest.raises(UsageError, match=rf"out_dir {tmp_path} is in use by another training "
                                         rf"\(process {os.getpid()} on "):
        second.acquire()
    first.release()
    assert not (tmp_path / "run.lock").exists()
    second.acquire()
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    second.release()


def test_a_lock_of_an_ended_process_on_this_host_is_taken_over(tmp_path, ended_process, capsys):
    (tmp_path / "run.lock").write_text(json.dumps({**holder_record(), "pid": ended_process,
                                                   "slurm_job": None}))
    lock = RunLock(tmp_path / "run.lock")
    lock.acquire()
    assert capsys.readouterr().err == (f"warning: taking over {tmp_path / 'run.lock'} from process "
                                       f"{ended_process} on this host, which has ended\n")
    assert json.loads((tmp_path / "run.lock").read_text()) == json.loads(json.dumps(lock.record))
    lock.release()


def test_a_lock_of_a_killed_process_not_yet_reaped_is_taken_over():
    """kill -9 leaves a zombie until its parent (or, once that died too, init) reaps it: the
    holder has ended, and a relaunch at once must not be refused."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = {**holder_record(), "pid": child.pid, "slurm_job": None,
                  "started": psutil.Process(child.pid).create_time()}
        me = {**holder_record(), "slurm_job": None}
        assert stale_because(holder, 0.0, me) is None  # running
        child.kill()
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # not reaped yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert stale_because(holder, 0.0, me) == (f"process {child.pid} on this host, which has "
                                                  "ended")
    finally:
        child.kill()
        child.wait()


def test_a_half_written_lock_is_taken_over_saying_what_it_was(tmp_path, capsys):
    (tmp_path / "run.lock").write_text("{\"host\": ")  # its maker was killed while writing it
    os.utime(tmp_path / "run.lock", (time.time() - 7200,) * 2)
    lock = RunLock(tmp_path / "run.lock")
    lock.acquire()
    assert capsys.readouterr().err == (
        f"warning: taking over {tmp_path / 'run.lock'} from an unreadable lock last written "
        "120 min ago (its maker was killed while writing it)\n")
    lock.release()


def test_release_leaves_a_lock_that_another_process_took_over(tmp_path):
    lock = RunLock(tmp_path / "run.lock")
    lock.acquire()
    (tmp_path / "run.lock").write_text(json.dumps({**lock.record, "pid": 1}))
    lock.release()
    assert (tmp_path / "run.lock").is_file()


@pytest.mark.parametrize("holder, age_s, stale", [
    ({"host": "elsewhere", "slurm_job": "77"}, 0, "an earlier attempt of SLURM job 77"),
    ({"host": "elsewhere", "slurm_job": None, "pid": 5}, 10, None),
    ({"host": "elsewhere", "slurm_job": None, "pid": 5}, 3600, "process 5 on elsewhere, silent "
                                                                 "for 60 min"),
], ids=["requeued-job", "other-host-beating", "other-host-silent"])
def test_which_locks_are_stale(holder, age_s, stale):
    me = {**holder_record(), "slurm_job": "77"}
    assert stale_because(holder, time.time() - age_s, me) == stale


def test_a_live_process_on_this_host_holds_its_lock_even_without_heartbeat():
    me = {**holder_record(), "slurm_job": None}
    parent = {**holder_record(), "pid": os.getppid(), "slurm_job": None,
              "started": psutil.Process(os.getppid()).create_time()}
    assert stale_because(parent, 0.0, me) is None
    # the id reused by a younger process: the holder itself has ended
    assert stale_because({**parent, "started": parent["started"] - 3600}, 0.0, me) is not None


def test_the_holder_keeps_its_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = RunLock(tmp_path / "run.lock")
    lock.acquire()
    os.utime(tmp_path / "run.lock", (0, 0))
    time.sleep(0.3)
    assert time.time() - (tmp_path / "run.lock").stat().st_mtime < 5
    lock.release()
