"""A run never hangs: a damaged shard, a non-finite loss, a lost rank or a signal that no step can
answer ends it with one line naming the cause, a non-zero status, within a bounded time, and no
process of it left behind. Real runs of trainer/main.py on the synthetic language's shards (built
by synthetic_to_mds.py: the failures do not depend on what the data says)."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from device_testing import META, DeviceCrossings
from trainer_testing import MAIN, REPO, SYNTHETIC_RUN, Launcher, losses

from aogpt import RunFailure
from aogpt.data_prep.manifest import read_manifest
from aogpt.trainer.config import load_config
from aogpt.trainer.data import TrainBatches, validation_loader
from aogpt.trainer.dist_env import free_port, setup_distributed_env
from aogpt.trainer.failsafe import EXIT_FAILED, EXIT_PREEMPTED, PreemptionFlag
from aogpt.trainer.metrics import read_metrics
from aogpt.trainer.recovery import FirstNonFinite

CPU = torch.device("cpu")
# one process, one micro-batch of 8 x 64 tokens per step, of the synthetic language
# (conftest.synthetic_data): the failures asserted here do not depend on what the data says
ONE_PROCESS = [*SYNTHETIC_RUN, "train.tokens_per_step=512", "eval.every=0", "checkpoint.every=100",
               "train.max_steps=1000"]


@pytest.fixture(autouse=True)
def no_run_left_behind():
    """A test that fails part-way leaves no run of it behind: the 1,000-step run of a test that
    failed before it could signal it trained on beside the rest of the suite, a core's worth."""
    yield
    while Run.started:
        Run.started.pop().kill()


@pytest.fixture
def data(synthetic_data, tmp_path):
    """A copy of the data to damage."""
    return shutil.copytree(synthetic_data, tmp_path / "data")


def train_command(data: Path, out: Path, *overrides: str) -> list[str]:
    return [sys.executable, MAIN, "--ds_config", "ds_configs/cpu.json", "--config",
            "configs/tiny.yaml", f"data.path={data}", f"out_dir={out}", *ONE_PROCESS, *overrides]


def error_lines(output: str) -> list[str]:
    """Every `error: ...` line (from where it starts: another rank's progress bar may precede
    it)."""
    return [line[line.index("error: "):] for line in output.splitlines() if "error: " in line]


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as file:
        file.truncate(size)


def command_line(process: psutil.Process) -> list[str] | None:
    """A process's command line; None once it has ended: a short-lived child of the trainer may
    be a zombie, which has none, by the time it is looked at."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:  # ZombieProcess is one
        return None


class Run:
    """trainer/main.py in the background, its output in a file, its process tree remembered."""

    started: list[Run] = []  # what no_run_left_behind ends after each test

    def __init__(self, command: list[str], log: Path, env: dict | None = None):
        self.log = log
        with log.open("w") as sink:
            self.proc = subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                         env=env)
        self.process = psutil.Process(self.proc.pid)
        self.tree: list[psutil.Process] = [self.process]
        Run.started.append(self)

    def kill(self) -> None:
        """Ends whatever of the run still runs: the processes remembered and those there now."""
        with contextlib.suppress(psutil.NoSuchProcess):
            self.tree += self.process.children(recursive=True)
        for process in self.tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.proc.wait()
        psutil.wait_procs(self.tree, timeout=10)

    def wait_for(self, ready, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"never {what}: {self.output()}"
            time.sleep(0.1)
        self.tree = [self.process, *self.process.children(recursive=True)]

    def wait_for_step(self, out: Path, step: int = 1) -> None:
        metrics = out / "metrics.jsonl"
        self.wait_for(lambda: metrics.is_file() and any(r["step"] >= step
                                                        for r in read_metrics(metrics)),
                      f"reached step {step}")

    def loader_worker(self) -> psutil.Process:
        """The training loader's worker: a fork of the trainer (the same command line)."""
        found = []

        def forked() -> bool:
            found[:] = [child for child in self.process.children()
                        if command_line(child) == self.process.cmdline()]
            return bool(found)

        self.wait_for(forked, "started a loader worker")
        return found[0]

    def finish(self, timeout: float) -> tuple[int, float]:
        """(exit status, seconds it took); every process of the run must be gone by then."""
        start = time.monotonic()
        returncode = self.proc.wait(timeout=timeout)
        _, alive = psutil.wait_procs(self.tree, timeout=10)
        assert not alive, f"left behind: {alive}"
        return returncode, time.monotonic() - start

    def output(self) -> str:
        return self.log.read_text()


# ---- bad shards ---------------------------------------------------------------------------------


def test_a_truncated_shard_is_refused_before_the_run_with_one_line(data, tmp_path):
    """The user's report: `truncate -s 5000 train/shard.00000.mds`, as a full disk leaves it."""
    shard = data / "train" / "shard.00000.mds"
    size, samples = shard.stat().st_size, read_manifest(data)["splits"]["train"]["samples"]
    truncate(shard, 5000)  # less than the table of sample offsets: no sample is whole
    result = subprocess.run(train_command(data, tmp_path / "run"), cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert error_lines(result.stderr) == [
        f"error: shard {shard} is 5,000 bytes, the index says {size:,} (truncated: samples 0 to "
        f"{samples - 1:,} are cut off): re-copy the file, or rebuild the dataset with "
        f"`python data_prep/synthetic_to_mds.py --out {data} --overwrite`; `python "
        f"data_prep/verify.py {data}` checks every shard"]  # the tool that made it
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_shard_truncated_during_the_run_ends_it_with_one_line_naming_file_and_sample(data,
                                                                                      tmp_path):
    out = tmp_path / "run"
    run = Run(train_command(data, out), tmp_path / "run.log")
    run.wait_for_step(out)
    shard = data / "train" / "shard.00000.mds"
    size = shard.stat().st_size
    truncate(shard, size * 6 // 10)  # the offsets table stays whole: streaming names the sample
    returncode, seconds = run.finish(timeout=120)
    output = run.output()
    assert returncode == EXIT_FAILED, output
    assert "Traceback" not in output
    (error,) = error_lines(output)
    assert error.startswith("error: the training data loader cannot read sample ")
    assert f" of shard {shard}: {size * 6 // 10:,} bytes, the index says {size:,}" in error
    assert ("re-copy the file, or rebuild the dataset with `python data_prep/synthetic_to_mds.py "
            f"--out {data} --overwrite`") in error
    assert seconds < 60


@pytest.fixture
def one_process(monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    yield setup_distributed_env()
    gc.collect()  # streaming frees its shared memory when the dataset object goes


def loader_config(data: Path, *overrides: str):
    return load_config(REPO / "configs" / "tiny.yaml",
                       [f"data.path={data}", *ONE_PROCESS, "data.num_workers=1", *overrides])


def test_the_training_loader_names_the_shard_and_ends_its_workers(data, one_process):
    cfg = loader_config(data)
    manifests = {str(data): read_manifest(data)}  # as the pre-flight found them, before the damage
    batches = TrainBatches(cfg, manifests, one_process, CPU)
    truncate(data / "train" / "shard.00000.mds", 5000)
    try:
        with pytest.raises(RunFailure, match=r"the training data loader cannot read sample "
                                             r"[\d,]+ of shard .*train/shard.00000.mds: 5,000 "
                                             r"bytes, the index says"):
            for _ in range(20):
                next(batches)
        workers = [child for child in psutil.Process().children()
                   if child.name() == "pt_data_worker"]
        assert len(workers) == 1  # data.num_workers=1, alive after the failure
    finally:
        batches.close()  # else the worker, which ignores SIGTERM, holds pytest's exit
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []  # close() ended it


def test_the_validation_loader_names_the_shard(data, one_process):
    cfg = loader_config(data, "eval.every=10")
    manifests = {str(data): read_manifest(data)}
    val = validation_loader(cfg, manifests, one_process, CPU)
    shard = data / "val" / "shard.00000.mds"
    truncate(shard, shard.stat().st_size - 1000)
    with pytest.raises(RunFailure, match=r"the validation data loader cannot read sample [\d,]+ "
                                         rf"of shard {re.escape(str(shard))}: .* \(truncated: "):
        list(val)
    val.close()


# ---- non-finite loss ----------------------------------------------------------------------------


def test_noting_non_finite_steps_stays_on_the_device():
    watch = FirstNonFinite(META)
    with DeviceCrossings() as crossings:
        for step, norm in ((1, torch.ones((), device=META)), (2, None), (3, float("inf")),
                           (4, 2.0)):
            watch.note(step, torch.zeros(4, dtype=torch.float64, device=META), norm)
    assert crossings.ops == [] and watch.steps.device == META and watch.steps.shape == (2,)


@pytest.mark.parametrize("steps, first", [
    ([(1.0, 0.5), (2.0, 0.5)], (None, None)),
    ([(1.0, 0.5), (float("nan"), 0.5), (1.0, 0.5), (float("inf"), 0.5)], (2, None)),
    ([(1.0, 0.5), (1.0, -1.0), (1.0, float("nan"))], (None, 2)),  # -1: DeepSpeed's mark of inf/NaN
    ([(1.0, 0.5), (1.0, float("inf")), (float("nan"), 0.5)], (3, 2)),
], ids=["finite", "loss", "gradient-norm", "both"])
def test_the_first_non_finite_loss_and_gradient_norm_steps_are_kept(steps, first):
    watch = FirstNonFinite(CPU)
    for step, (loss, norm) in enumerate(steps, start=1):
        watch.note(step, torch.tensor([loss, 64.0, 2.0, 64.0], dtype=torch.float64),
                   torch.tensor(norm))
    assert watch.check() == first


def test_a_non_finite_loss_ends_the_run_without_saving_that_step(synthetic_data, tmp_path):
    """An absurd learning rate: step 1 (initial weights) is finite and saved, its update sends the
    weights past float32's range, and step 2's loss is NaN."""
    out = tmp_path / "run"
    command = train_command(synthetic_data, out, "optim.lr=1e30", "optim.grad_clip=0",
                            "optim.warmup_steps=0", "checkpoint.every=1", "train.max_steps=5")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == EXIT_FAILED, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert error_lines(result.stderr) == [
        f"error: the loss is not finite at step 2: stopped without saving this step; the last "
        f"complete checkpoint is {out / 'checkpoints' / 'step_00000001'} (lower optim.lr or raise "
        "optim.warmup_steps if it happens again, or set train.on_nonfinite=rollback)"]
    assert [p.name for p in (out / "checkpoints").glob("step_*")] == ["step_00000001"]
    assert losses(out)[2] is None  # logged as not a number
    assert not (out / "final").exists()


# ---- signals ------------------------------------------------------------------------------------


WATCHDOG = """
import os, signal, sys, time
from aogpt.trainer.failsafe import PreemptionFlag, SignalWatchdog
flag, watchdog = PreemptionFlag(), SignalWatchdog(1.0, lambda: "CHECKPOINT")
mode = sys.argv[1]
if mode == "no signal":
    sys.exit(0)
if mode.startswith("ctrl-c"):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT if mode == "ctrl-c twice" else signal.SIGTERM)
    time.sleep(0.2)
    if mode == "ctrl-c, then the launcher's SIGTERM":  # the loop answers, as for one signal
        watchdog.saved()
        sys.exit(75)
    time.sleep(60)
os.kill(os.getpid(), signal.SIGUSR1)
if mode == "saved in time":  # the loop answers the signal: saves, then exits with 75
    time.sleep(0.3)
    watchdog.saved()
    sys.exit(75)
if mode == "saved, exit hangs":
    watchdog.saved()
time.sleep(60)  # no step finishes
"""


@pytest.mark.parametrize("mode, status, line", [
    ("stuck", EXIT_FAILED, "error: no checkpoint could be saved within checkpoint.signal_grace_s=1 "
                           "s of SIGUSR1 (no step or save finished): stopped without one; the last "
                           "complete checkpoint is CHECKPOINT"),
    ("saved in time", EXIT_PREEMPTED, None),
    ("saved, exit hangs", EXIT_PREEMPTED, "the process did not exit within "
                                          "checkpoint.signal_grace_s=1 s of SIGUSR1 after saving "
                                          "its checkpoint: ended"),
    ("no signal", 0, None),
    ("ctrl-c twice", 130, ["Ctrl-C: saving a checkpoint at the end of this step, then stopping "
                           "(press Ctrl-C again to stop at once without saving)",
                           "a second Ctrl-C: stopped at once without saving; the steps after the "
                           "last complete checkpoint are lost, a re-run resumes from it: "
                           "CHECKPOINT"]),
    ("ctrl-c, then the launcher's SIGTERM", EXIT_PREEMPTED,
     ["Ctrl-C: saving a checkpoint at the end of this step, then stopping (press Ctrl-C again to "
      "stop at once without saving)"]),
])
def test_the_signal_watchdog_bounds_the_time_to_exit(mode, status, line):
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", WATCHDOG, mode], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == status, result.stderr
    lines = line if isinstance(line, list) else [line] if line else []
    assert [text for text in result.stderr.splitlines() if text] == lines
    assert time.monotonic() - start < 30  # the import takes most of it


def test_a_ctrl_c_names_the_stop_even_after_the_launchers_sigterm_reached_the_rank_first():
    """Ctrl-C reaches the launcher and its ranks at once, and the launcher forwards a SIGTERM:
    under load a rank can see that SIGTERM first (a full test run logged "on SIGTERM")."""
    saved = {sig: signal.getsignal(sig) for sig in PreemptionFlag.SIGNALS}
    try:
        for first, then, named in ((signal.SIGTERM, signal.SIGINT, "SIGINT"),
                                   (signal.SIGINT, signal.SIGTERM, "SIGINT"),
                                   (signal.SIGUSR1, signal.SIGTERM, "SIGUSR1")):
            flag = PreemptionFlag(announce=False)
            os.kill(os.getpid(), first)
            os.kill(os.getpid(), then)
            assert flag.received == named, (first, then)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.fixture
def terminal_ctrl_c():
    """The commands started in the test get Ctrl-C as a terminal's foreground gives it: a suite
    run in the background (`make test-all &` in a script) ignores SIGINT, its commands inherit
    that, and a command leaves an ignored SIGINT ignored (both tests below then failed: the run
    trained to its end). A handler is not inherited: the commands start with the default."""
    inherited = signal.getsignal(signal.SIGINT)
    if inherited is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def test_ctrl_c_while_the_trainer_starts_up_is_one_line_and_status_130(synthetic_data, tmp_path,
                                                                       terminal_ctrl_c):
    """Ctrl-C while the imports load (torch has just been mapped, deepspeed and streaming are
    still to come): before the command's main runs, where cli_entry cannot answer it (aogpt's
    handler until then: a KeyboardInterrupt raised inside an import can be lost)."""
    proc = subprocess.Popen(train_command(synthetic_data, tmp_path / "run"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    maps = Path(f"/proc/{proc.pid}/maps")
    while "libtorch_cpu" not in maps.read_text():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # a run that lost the signal trains on: not past the test
    assert proc.returncode == 130 and err.splitlines()[-1:] == ["interrupted"], err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "run").exists()


def test_ctrl_c_ends_a_start_up_that_loses_the_keyboard_interrupt(terminal_ctrl_c):
    """The race behind a rare hang of the test above: Ctrl-C is answered before main by aogpt's
    handler itself, not by a KeyboardInterrupt that the code running at that moment may lose."""
    proc = subprocess.Popen([sys.executable,
                             str(REPO / "tests" / "trainer" / "run_losing_ctrl_c.py")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")


def test_sigterm_ends_a_run_that_no_step_can_answer_within_the_grace(synthetic_data, tmp_path):
    """The loader's worker hangs (stopped, as on a dead filesystem) before step 1 can finish: no
    step ever answers SIGTERM, and the watchdog ends the run after checkpoint.signal_grace_s."""
    out = tmp_path / "run"
    # 256 micro-batches of one sequence per step (seconds on any CPU): neither the batches
    # prefetched before the worker stops nor those a busy machine lets the trainer take while
    # the test looks for the worker can finish a step (with 32, a loaded run once finished two)
    command = train_command(synthetic_data, out, "train.micro_batch_size=1",
                            "train.tokens_per_step=16384", "checkpoint.signal_grace_s=3")
    run = Run(command, tmp_path / "run.log")
    worker = run.loader_worker()
    worker.suspend()
    time.sleep(1)
    run.tree = [run.process, *run.process.children(recursive=True)]
    run.proc.send_signal(signal.SIGTERM)
    returncode, seconds = run.finish(timeout=60)
    output = run.output()
    assert returncode == EXIT_FAILED, output
    assert error_lines(output) == [
        "error: no checkpoint could be saved within checkpoint.signal_grace_s=3 s of SIGTERM (no "
        "step or save finished): stopped without one; the last complete checkpoint is none yet"]
    assert 3 <= seconds < 20
    assert not worker.is_running()  # the stopped worker was killed, not left behind


# ---- several processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hung_rank_fails_the_others_collectives_within_the_timeout(synthetic_data, tmp_path):
    """Two ranks started as srun starts them (no launcher); rank 1 stops for good mid-run. Rank 0
    waits in a collective for train.collective_timeout_s, then ends with one line."""
    out, port = tmp_path / "run", free_port()
    command = train_command(synthetic_data, out, "train.tokens_per_step=1024",
                            "train.collective_timeout_s=20")
    ranks = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(Run(command, tmp_path / f"rank{rank}.log", env))
    ranks[0].wait_for_step(out, 2)
    ranks[1].tree = [ranks[1].process, *ranks[1].process.children(recursive=True)]
    for process in ranks[1].tree:
        process.suspend()  # ended by no_run_left_behind
    returncode, seconds = ranks[0].finish(timeout=120)
    output = ranks[0].output()
    assert returncode == EXIT_FAILED, output
    assert "Traceback" not in output
    (error,) = error_lines(output)
    assert error.startswith("error: rank 0 lost the other ranks at step ")
    assert "Timed out waiting 20000ms" in error
    assert error.endswith("the last complete checkpoint is none yet")
    assert seconds < 20 + 30


@pytest.mark.slow
def test_a_shard_truncated_under_the_deepspeed_launcher_ends_every_rank(synthetic_data, tmp_path):
    """`deepspeed --num_gpus 2`: the rank that meets the damaged shard says so and exits, the
    launcher ends the other, and nothing of the job is left. (A copy of the synthetic language's
    data: its model's steps cost a sixth of GPT-2 text's.)"""
    data = shutil.copytree(synthetic_data, tmp_path / "data")
    out, launcher = tmp_path / "run", Launcher()
    args = ["--ds_config", "ds_configs/cpu.json", "--config", "configs/tiny.yaml",
            f"data.path={data}", f"out_dir={out}", *SYNTHETIC_RUN, "eval.every=0",
            "checkpoint.every=100", "train.max_steps=1000"]
    run = Run(launcher.command("deepspeed", args), tmp_path / "run.log", launcher.environment())
    run.wait_for_step(out)
    shard = data / "train" / "shard.00000.mds"
    size = shard.stat().st_size
    truncate(shard, size * 6 // 10)
    returncode, seconds = run.finish(timeout=180)
    output = run.output()
    assert returncode == EXIT_FAILED, output
    assert "Traceback" not in output
    errors = error_lines(output)
    assert any(error.startswith("error: the training data loader cannot read sample ")
               and f" of shard {shard}: {size * 6 // 10:,} bytes" in error
               for error in errors), output
    # the other rank met the shard too, or lost its peer: one line each, no more
    assert len(errors) <= 2 and all("data loader cannot read" in error or "lost the other ranks"
                                    in error for error in errors), errors
    assert seconds < 90
