"""Whole training runs on 2 processes (real DeepSpeed on gloo, real streaming, real MDS shards),
launched the way users launch them: `deepspeed --num_gpus 2 trainer/main.py ...` and torchrun. They
train on the synthetic language (conftest.synthetic_data): what they check is how a run runs, and a
head of its 128 ids instead of GPT-2's 50,257 leaves a step a sixth of the arithmetic (the demo and
the docs' commands train on real text).

One uninterrupted reference run (the session's, conftest.reference_run, which the S3 tests share)
is compared with: ZeRO-2 and ZeRO-3 runs (same first steps), and a run stopped by SIGTERM and re-run
(the same run, step for step). Each launch costs ~15-20 s on 2 cores, so assertions share runs.
"""

import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from trainer_testing import (
    MAIN,
    REFERENCE_STEPS,
    REPO,
    SYNTHETIC_VOCAB,
    losses,
    reference_args,
)

from aogpt.data_prep.shared_memory import SHM, STREAMING_BLOCK
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import read_consolidated
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import load_config
from aogpt.trainer.failsafe import EXIT_PREEMPTED, SECOND_CTRL_C
from aogpt.trainer.main import main
from aogpt.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
STEPS = REFERENCE_STEPS


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.fixture(scope="module")
def reference(reference_run):
    """The session's reference run (conftest.reference_run): the user command, deepspeed
    launcher, 2 processes, ZeRO-1 fp32, 18 steps."""
    out, output, port = reference_run
    # DeepSpeed's CPU backend would map a 66 MiB all-reduce workspace per rank in /dev/shm and
    # never unlink it, but the trainer skips the op that makes it (trainer/lean_start.py)
    leftovers = list(Path("/dev/shm").glob(f"deepspeed_*_{port}_*"))
    assert not leftovers, f"the run left DeepSpeed's buffers in memory: {leftovers}"
    return out, output


def final_weights(out_dir, kind):
    return read_consolidated(out_dir / "final")["weights"][kind]


def test_loss_goes_down_from_the_uniform_guess(reference):
    out, _ = reference
    loss = losses(out)
    assert sorted(loss) == list(range(1, STEPS + 1))
    # an untrained model guesses ~uniformly over the language's 128 ids (log 128 = 4.85 nats);
    # 18 steps learn its token statistics (~0.65 nats below, ~2.6 above the language's entropy)
    assert loss[1] == pytest.approx(math.log(SYNTHETIC_VOCAB), abs=0.05)
    assert sum(loss[s] for s in (16, 17, 18)) / 3 < loss[1] - 0.5
    val_l2r, val_ao = losses(out, "val_loss_l2r"), losses(out, "val_loss_ao")
    assert sorted(val_l2r) == [6, 12, 18]
    assert val_l2r[18] < val_l2r[6] and val_ao[18] < val_ao[6]


def test_metrics_report_every_field_and_both_order_kinds(reference):
    out, _ = reference
    records = read_metrics(out / "metrics.jsonl")
    for record in records:
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "samples_seen", "tokens_seen",
                    "step_time", "data_wait"):
            assert record[key] is not None, key
        assert "loss_l2r" in record and "loss_ao" in record and record["mfu"] is None  # CPU
    assert records[0]["lr"] == 0.0 and records[-1]["tokens_seen"] == STEPS * 2048
    # 10% left-to-right per sample: some steps have none, then loss_l2r is null
    assert all(r["loss_ao"] is not None for r in records)
    assert any(r["loss_l2r"] is not None for r in records)


def test_start_banner_and_resolved_config(reference):
    out, output = reference
    banner = next(line for line in output.splitlines() if line.startswith("model:"))
    for fact in ("parameters", "attention sdpa", "ZeRO-1 fp32", "world size 2",
                 "8 sequences x 2 accumulation x 2 ranks"):
        assert fact in banner
    assert load_config(out / "config.yaml").train.max_steps == STEPS


def test_checkpoints_keep_the_last_two_and_load_without_deepspeed(reference):
    out, _ = reference
    root = out / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000016", "step_00000018"]
    assert (root / "latest").read_text() == "step_00000018"
    state = json.loads((root / "step_00000018" / "trainer_state.json").read_text())
    assert state["step"] == STEPS and state["world_size"] == 2 and state["git_sha"]
    for path in (root / "step_00000018", out):  # a checkpoint folder, a training out_dir
        for weights in ("ema", "raw"):
            model = load_checkpoint(path, weights=weights)
            assert model.config.block_size == 64 and not model.training
    assert not torch.equal(final_weights(out, "ema")["lm_head.weight"],
                           final_weights(out, "raw")["lm_head.weight"])


def test_resuming_with_another_model_shape_is_refused(reference, synthetic_data, monkeypatch,
                                                      capsys):
    out, _ = reference
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(REPO)
    assert main(reference_args(synthetic_data, out, "ds_configs/cpu.json", "model.n_layer=3")) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("error: the checkpoint in ")
    assert "model.n_layer 2 -> 3" in error


def fp32_zero_config(stage: int, folder: Path) -> Path:
    """ds_configs/cpu.json (fp32) with ZeRO stage `stage`, written into `folder`."""
    base = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    path = folder / f"zero{stage}_fp32.json"
    path.write_text(json.dumps({**base, "zero_optimization": {"stage": stage}}))
    return path


@pytest.fixture(scope="module")
def zero2_first_steps(launcher, synthetic_data, tmp_path_factory) -> Path:
    """The reference's settings under ZeRO-2 for 4 steps (torchrun, 2 processes): the ZeRO-stage
    test compares them with the reference, the elastic test resumes a copy of them."""
    folder = tmp_path_factory.mktemp("zero2")
    out = folder / "run"
    assert_ok(launcher.run("torchrun", reference_args(
        synthetic_data, out, fp32_zero_config(2, folder), "train.max_steps=4")))
    return out


def test_zero_stages_agree_on_the_first_steps(reference, zero2_first_steps, launcher,
                                              synthetic_data, tmp_path):
    out, _ = reference
    runs = {2: zero2_first_steps, 3: tmp_path / "zero3"}
    assert_ok(launcher.run("torchrun", reference_args(
        synthetic_data, runs[3], fp32_zero_config(3, tmp_path), "train.max_steps=4")))
    for stage, run in runs.items():
        for key in ("loss", "grad_norm"):
            expected = {s: v for s, v in losses(out, key).items() if s <= 4}
            assert losses(run, key) == pytest.approx(expected, abs=1e-5), (stage, key)
    for name, value in final_weights(runs[2], "ema").items():  # flat vs per-parameter shards
        torch.testing.assert_close(final_weights(runs[3], "ema")[name], value, rtol=0, atol=1e-5)


def test_elastic_resume_on_another_world_size_and_stage_continues_the_same_run(
        reference, zero2_first_steps, launcher, synthetic_data, tmp_path):
    """2 processes under ZeRO-2 (a copy of zero2_first_steps), resumed as 1 process under ZeRO-1,
    then as 2 under ZeRO-2 again: the same samples, orders and EMA as the uninterrupted run (2
    processes, ZeRO-1)."""
    out_ref, _ = reference
    out = shutil.copytree(zero2_first_steps, tmp_path / "elastic")
    zero2 = fp32_zero_config(2, tmp_path)
    for launch, (ds_config, stop) in enumerate([("ds_configs/cpu.json", 8), (zero2, 12)]):
        args = reference_args(synthetic_data, out, ds_config, f"train.max_steps={stop}")
        result = (launcher.run("torchrun", args) if launch else subprocess.run(
            [sys.executable, MAIN, *args], cwd=REPO, capture_output=True, text=True, timeout=600))
        assert_ok(result)
        assert "elastic resume: step_0000000" in result.stdout
        assert not (out / "checkpoints" / "universal").exists()  # removed once loaded
    # fp32 throughout: other partitions sum gradients in another order (~1e-7 relative), as
    # in the ZeRO-stage test above.
    for key in ("loss", "grad_norm"):
        expected = {s: v for s, v in losses(out_ref, key).items() if s <= 12}
        assert losses(out, key) == pytest.approx(expected, abs=1e-5), key
    # Validation reads eval.batches per rank: at step 12 the run is on 2 processes again, like
    # the reference, and its EMA weights (resharded twice) must score the same.
    for key in ("val_loss_l2r", "val_loss_ao"):
        assert losses(out, key)[12] == pytest.approx(losses(out_ref, key)[12], abs=1e-5), key


def test_signals_and_kill_9_at_any_moment_cost_no_step_and_the_run_stays_the_same(
        reference, launcher, synthetic_data, tmp_path):
    """One run stopped four times, each launch resuming the one before: SIGTERM (scancel, a
    preemption) and Ctrl-C (SIGINT to the terminal's whole process group, the launcher included,
    which forwards SIGTERM to the ranks) each save a checkpoint at the next step; then a node lost
    mid-save (kill -9 of every process at random moments, with a save every step so most kills
    land in one) never costs more than the steps after the last complete tag. The finished run is
    the uninterrupted reference, loss for loss and weight for weight. (One run serves the three
    ways of stopping: each launch of 2 processes costs ~20 s of start-up. The launches that are
    signalled or killed go through the deepspeed launcher, which forwards the signals and keeps
    its ranks in its process group; the last one runs under torchrun, whose one process costs
    less than the launcher's two.)"""
    out_ref, _ = reference
    out = tmp_path / "interrupted"
    args = reference_args(synthetic_data, out)
    latest, stopped_at = out / "checkpoints" / "latest", 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        _, log = launcher.run_and_signal("deepspeed", args, out, after_step=stopped_at + 2,
                                         sig=sig)
        assert "stopping at step" in log and f"on {sig.name}" in log
        if sig == signal.SIGINT:  # once, from rank 0
            assert log.count("Ctrl-C: saving a checkpoint at the end of this step, then stopping "
                             "(press Ctrl-C again to stop at once without saving)") == 1
        if stopped_at:
            assert f"resumed from {out / 'checkpoints' / f'step_{stopped_at:08d}'}" in log
        tag = int(latest.read_text().removeprefix("step_"))
        assert stopped_at + 2 <= tag < STEPS, (sig.name, tag)
        assert load_checkpoint(out / "checkpoints" / f"step_{tag:08d}").config.n_layer == 2
        stopped_at = tag

    args = reference_args(synthetic_data, out, "ds_configs/cpu.json", "checkpoint.every=1")
    run, resumed_at = RunFolder(out), stopped_at
    for attempt, delay in enumerate(random.Random(0).uniform(0.0, 2.0) for _ in range(2)):
        with (tmp_path / f"attempt{attempt}.log").open("w") as log:
            proc = subprocess.Popen(launcher.command("deepspeed", args), cwd=REPO,
                                    env=launcher.environment(), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 300
            while not (latest.is_file() and int(latest.read_text()[5:]) > resumed_at):
                assert proc.poll() is None and time.monotonic() < deadline, attempt
                time.sleep(0.05)  # wait for a checkpoint of this launch, then kill at random
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        tag, warning = run.resume_tag()
        assert tag is not None and run.problem(tag) is None, (attempt, warning)
        assert int(tag[5:]) > resumed_at  # never behind what was complete before
        resumed_at = int(tag[5:])

    rerun = launcher.run("torchrun", args)
    assert_ok(rerun)
    assert f"resumed from {out / 'checkpoints' / f'step_{resumed_at:08d}'}" in rerun.stdout
    for key in ("loss", "loss_l2r", "loss_ao", "grad_norm", "val_loss_l2r", "val_loss_ao"):
        assert losses(out, key) == pytest.approx(losses(out_ref, key), abs=1e-6), key
    for kind in ("raw", "ema"):
        reference_weights = final_weights(out_ref, kind)
        for name, value in final_weights(out, kind).items():
            torch.testing.assert_close(value, reference_weights[name], rtol=0, atol=1e-6)


def test_a_relaunch_of_a_finished_run_leaves_no_rank_while_another_loads_its_data_position(
        reference, launcher, synthetic_data, tmp_path):
    """The finished reference relaunched (nothing to do but publish final/), with rank 1 slow to
    load the loader's position: no rank goes on before every rank has loaded it. A rank that went
    on would exit at once and unlink streaming's shared block of that position while the other
    still attached to it (`make demo` run twice beside other trainings once died of it:
    FileNotFoundError '/000289_resume')."""
    out_ref, _ = reference
    out = shutil.copytree(out_ref, tmp_path / "finished")
    moments = tmp_path / "moments"
    command = launcher.command(
        "torchrun", ["--moments", str(moments), *reference_args(synthetic_data, out)],
        script=REPO / "tests" / "trainer" / "run_with_a_slow_rank_1_load.py")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=launcher.environment())
    assert_ok(result)
    assert f"already at step {STEPS} >= train.max_steps={STEPS}" in result.stdout
    ranks = [json.loads(Path(f"{moments}.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert max(r["loaded"] for r in ranks) <= min(r["fit"] for r in ranks), ranks


def launch_tree(proc: subprocess.Popen) -> list[psutil.Process]:
    launcher = psutil.Process(proc.pid)
    return [launcher, *launcher.children(recursive=True)]


def streaming_blocks_held(proc: subprocess.Popen) -> set[str]:
    """The streaming shared-memory blocks (/dev/shm/<prefix>_<name>) that a launch's processes
    hold open."""
    held = set()
    for process in launch_tree(proc):
        with contextlib.suppress(psutil.NoSuchProcess):  # a child that just ended (a zombie)
            held |= {file.path for file in process.open_files()
                     if STREAMING_BLOCK.fullmatch(Path(file.path).name)
                     and Path(file.path).parent == SHM}
    return held


def shared_memory_report(proc: subprocess.Popen, log: Path) -> str:
    """What a launch's processes hold in /dev/shm (unlinked blocks too), what /dev/shm has, and
    the end of its log: why no block was found held."""
    lines = [f"/dev/shm: {sorted(path.name for path in SHM.iterdir())}"]
    for process in launch_tree(proc):
        held = []
        with contextlib.suppress(OSError):
            for descriptor in Path(f"/proc/{process.pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    held.append(os.readlink(descriptor))
        with contextlib.suppress(psutil.NoSuchProcess):  # a zombie has no command line
            lines.append(f"{process.pid} {process.status()} {' '.join(process.cmdline())[-80:]}"
                         f": {sorted(path for path in held if path.startswith(str(SHM)))}")
    return "\n".join([*lines, log.read_text()[-3000:]])


def wait_for(condition, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def test_two_runs_on_one_host_started_at_once_and_one_killed_and_relaunched_both_finish(
        reference, launcher, synthetic_data, tmp_path):
    """Two trainings of the reference's settings, other out_dirs, launched at the same moment on
    this host. Once `a` has a checkpoint it is killed with kill -9 and relaunched while `b` holds
    its streaming shared memory (stopped with SIGSTOP from its first step on, so the relaunch
    surely starts beside it): the relaunch removes none of b's blocks (streaming's global cleanup
    did, and broke the runs beside it), and both end with the reference's metrics of their 12
    steps (the schedule does not depend on max_steps; validations at 6 and 12, as the
    reference's)."""
    out_ref, _ = reference
    steps = 12
    outs = {name: tmp_path / name for name in ("a", "b")}
    logs = {name: tmp_path / f"{name}.log" for name in outs}

    # Each its own temporary folder, as SLURM gives each job: streaming's lock files there then
    # keep no two runs apart, only the blocks in /dev/shm do. Short paths in the system's
    # temporary folder: the loader workers' sockets live there, and a Unix socket's path has at
    # most 107 bytes (tmp_path under a pytest-xdist worker was too long: "AF_UNIX path too long").
    tmps = {name: Path(tempfile.mkdtemp(prefix=f"aogpt-{name}-")) for name in outs}

    def launch(name: str) -> subprocess.Popen:
        tmp = tmps[name]
        args = reference_args(synthetic_data, outs[name], "ds_configs/cpu.json",
                              f"train.max_steps={steps}")
        with logs[name].open("a") as log:
            return subprocess.Popen(launcher.command("deepspeed", args),
                                    cwd=REPO, env=launcher.environment(TMPDIR=str(tmp)),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    procs = {name: launch(name) for name in outs}
    try:
        latest, b_metrics = outs["a"] / "checkpoints" / "latest", outs["b"] / "metrics.jsonl"
        # b is stopped once its datasets are all open (it starts its first step), before a is
        # waited for: it is then surely mid-run when a is killed and relaunched (on a loaded host
        # the two runs' pace differs, and b could otherwise end before a's first checkpoint)
        wait_for(b_metrics.is_file, procs["b"], logs["b"])
        os.killpg(procs["b"].pid, signal.SIGSTOP)
        b_blocks = streaming_blocks_held(procs["b"])
        assert b_blocks, shared_memory_report(procs["b"], logs["b"])
        wait_for(latest.is_file, procs["a"], logs["a"])
        os.killpg(procs["a"].pid, signal.SIGKILL)
        procs["a"].wait()
        procs["a"] = launch("a")
        wait_for(lambda: "resumed from" in logs["a"].read_text(), procs["a"], logs["a"])
        assert {path for path in b_blocks if not Path(path).exists()} == set()
        os.killpg(procs["b"].pid, signal.SIGCONT)
        for name, proc in procs.items():
            assert proc.wait(timeout=600) == 0, logs[name].read_text()[-3000:]
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for tmp in tmps.values():
            shutil.rmtree(tmp, ignore_errors=True)
    for out in outs.values():
        for key in ("loss", "loss_l2r", "loss_ao", "grad_norm", "val_loss_l2r", "val_loss_ao"):
            theirs = {step: value for step, value in losses(out_ref, key).items() if step <= steps}
            assert losses(out, key) == pytest.approx(theirs, abs=1e-6), (out, key)


# A run whose disk fills up while it writes the checkpoint of step 4 (every write into that tag
# fails the way a full disk fails), in one process.
FULL_DISK_RUN = """
import errno, sys, torch
from aogpt.trainer.main import main
real_save = torch.save
def save(obj, f, *args, **kwargs):
    if "step_00000004" in str(f):
        raise OSError(errno.ENOSPC, "No space left on device")
    return real_save(obj, f, *args, **kwargs)
torch.save = save
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_during_a_save_ends_the_run_and_keeps_the_last_checkpoint(synthetic_data,
                                                                              tmp_path):
    out = tmp_path / "full"
    args = reference_args(synthetic_data, out, "ds_configs/cpu.json", "train.tokens_per_step=512",
                          "checkpoint.every=2", "train.max_steps=6")
    result = subprocess.run([sys.executable, "-c", FULL_DISK_RUN, *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    intact = out / "checkpoints" / "step_00000002"
    assert result.stderr.strip().splitlines()[-1] == (
        "error: saving checkpoint step_00000004 failed (No space left on device): "
        f"{intact} is intact, free space and re-run to resume from it")
    assert RunFolder(out).tags() == [intact.name]  # step 4's partial folder is gone
    assert not list((out / "checkpoints").glob("*.partial"))
    rerun = subprocess.run([sys.executable, MAIN, *args], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert_ok(rerun)
    assert f"resumed from {intact} at step 2" in rerun.stdout


def test_sigusr1_stops_a_single_process_run_with_its_own_exit_status(synthetic_data, tmp_path):
    out, log = tmp_path / "single", tmp_path / "single.log"
    args = [sys.executable, MAIN, *reference_args(synthetic_data, out, "ds_configs/cpu.json",
                                                  "train.tokens_per_step=512",
                                                  "checkpoint.every=100")]
    with log.open("w") as sink:
        proc = subprocess.Popen(args, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and read_metrics(metrics)):
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=120) == EXIT_PREEMPTED, log.read_text()
    assert "on SIGUSR1" in log.read_text() and (out / "checkpoints" / "latest").is_file()


def test_a_second_ctrl_c_stops_at_once_and_says_what_is_lost(synthetic_data, tmp_path):
    """Steps of 256 micro-batches (seconds each on any CPU); the second Ctrl-C follows the first's
    answer at once, so it comes long before the step could end. (With a fixed half second
    between them and steps of 64, a fast CPU finished the step first, saved and was exiting.)"""
    out, log = tmp_path / "single", tmp_path / "single.log"
    args = [sys.executable, MAIN, *reference_args(synthetic_data, out, "ds_configs/cpu.json",
                                                  "train.micro_batch_size=1",
                                                  "train.tokens_per_step=16384",
                                                  "checkpoint.every=1")]
    with log.open("w") as sink:
        proc = subprocess.Popen(args, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        latest = out / "checkpoints" / "latest"
        while not latest.is_file():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        while SECOND_CTRL_C not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
    assert latest.read_text() == "step_00000001"  # nothing saved after the first Ctrl-C
    assert ("a second Ctrl-C: stopped at once without saving; the steps after the last complete "
            "checkpoint are lost, a re-run resumes from it: "
            f"{out / 'checkpoints' / 'step_00000001'}") in log.read_text()


def test_launcher_reports_bad_input_once_with_status_2(launcher, synthetic_data, tmp_path):
    ds_config = tmp_path / "disagrees.json"
    ds_config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4,
                                     "zero_optimization": {"stage": 1}}))
    result = launcher.run("deepspeed", reference_args(synthetic_data, tmp_path / "run", ds_config),
                                                      timeout=120)
    assert result.returncode == 2
    errors = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith("error:")]
    assert errors == ["error: the DeepSpeed config sets train_micro_batch_size_per_gpu=4 but the "
                      "YAML gives 8 (from train.micro_batch_size): set "
                      "train_micro_batch_size_per_gpu to \"auto\" in the JSON and change the YAML "
                      "instead"]
    assert not (tmp_path / "run").exists()  # nothing written before the checks


def test_compiled_zero3_run_with_checkpointing_matches_eager_and_resumes(reference, synthetic_data,
                                                                         tmp_path):
    """train.compile with the hardest company: ZeRO-3's parameter gathering hooks, activation
    checkpointing, the EMA, and a resume (a new process compiles again), in one process against
    the eager reference run on 2 (the orders and samples of a step do not depend on the world
    size). ZeRO-3 gathers a block's weights around the whole block, so its compiled forward
    holds no DeepSpeed hook: no graph break, and no DeepSpeed code compiled (with a hook on each
    layer: 5 graph breaks, 28 graphs instead of 5, DeepSpeed's hooks recompiled on every guard)."""
    out_ref, _ = reference
    ds_config = fp32_zero_config(3, tmp_path)
    out = tmp_path / "compiled"
    dynamo_logs = {**os.environ, "TORCH_LOGS": "graph_breaks,recompiles"}
    for stop in (2, 4):  # stopped at 2, resumed to 4
        args = reference_args(synthetic_data, out, ds_config, "model.activation_checkpointing=true",
                              "train.compile=true", f"train.max_steps={stop}")
        result = subprocess.run([sys.executable, MAIN, *args], cwd=REPO, capture_output=True,
                                text=True, timeout=600, env=dynamo_logs)
        assert_ok(result)
        # the one recompilation: the loss's chunk math once more for validation (no gradient)
        recompiled = set(re.findall(r"Recompiling function (\w+)", result.stderr))
        assert "Graph break" not in result.stderr and recompiled == {"fused_chunk_math"}, (
            result.stderr[-3000:])
    assert "resumed from" in result.stdout and ", compiled per block |" in result.stdout
    # fp32 both ways: the compiled kernels and another partitioning sum in another order (a few
    # ulps), which AdamW's normalized steps can carry into lr-sized moves of the smallest
    # gradient components only; a real difference (a lost gradient, a wrong scale, another
    # order) moves the loss by >1e-2.
    for key in ("loss", "grad_norm"):
        expected = {s: v for s, v in losses(out_ref, key).items() if s <= 4}
        assert losses(out, key) == pytest.approx(expected, abs=1e-4), key
