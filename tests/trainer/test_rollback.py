"""Through bad steps with train.on_nonfinite=rollback: real runs of trainer/main.py (2 processes
under torchrun, or under the deepspeed launcher where they are killed; or one), bad data made by
the test-only hook AOGPT_TEST_POISON (the loss of chosen dataset samples multiplied by NaN or a
factor wherever the stream hands them out), on the synthetic language (conftest.synthetic_data:
GPT-2's 50,257-row head would be most of the work). The rules themselves (spike window,
learning-rate windows, skips) are checked without a run."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from trainer_testing import (
    MAIN,
    REPO,
    SYNTHETIC_RUN,
    Launcher,
    losses,
    step_samples,
)

from aogpt import UsageError
from aogpt.model import AOGPT
from aogpt.model import config as model_presets
from aogpt.model.checkpoint import read_consolidated
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import RecoveryConfig, load_config
from aogpt.trainer.failsafe import EXIT_FAILED
from aogpt.trainer.lr_schedule import learning_rate
from aogpt.trainer.metrics import read_metrics
from aogpt.trainer.recovery import (
    POISON_VARIABLE,
    BadStep,
    PoisonedSamples,
    Rollbacks,
    SpikeRule,
)

BAD_STEP = 6  # its data is poisoned; checkpoints at 4 and 8: the rollback goes back to step 4
STEPS = 9
RECOVERY = ["train.on_nonfinite=rollback", "recovery.lr_factor=0.5", "recovery.lr_steps=2",
            "eval.every=0", f"train.max_steps={STEPS}"]


def poisoned(spec: str) -> dict:
    """The environment of a 2-process run whose data `spec` poisons."""
    return Launcher.environment(**{POISON_VARIABLE: spec})


def run_args(data, out, *overrides: str) -> list[str]:
    return ["--ds_config", "ds_configs/cpu.json", "--config", "configs/tiny.yaml",
            f"data.path={data}", f"out_dir={out}", *SYNTHETIC_RUN, *RECOVERY, *overrides]


def error_lines(output: str) -> list[str]:
    return [line[line.index("error: "):] for line in output.splitlines() if "error: " in line]


def record_of(out) -> tuple[list[dict], dict]:
    return (json.loads((out / "rollbacks.json").read_text())["rollbacks"],
            json.loads((out / "skipped_samples.json").read_text()))


@pytest.fixture(scope="module")
def bad_samples(synthetic_data):
    """The samples the loader deals to BAD_STEP: the bad data (its first one is poisoned)."""
    return step_samples([f"data.path={synthetic_data}", *SYNTHETIC_RUN], BAD_STEP)[BAD_STEP]


@pytest.fixture(scope="module")
def recovered(launcher, synthetic_data, bad_samples, tmp_path_factory):
    """2 processes, ZeRO-1 fp32, never interrupted: the loss of step 6 is NaN."""
    out = tmp_path_factory.mktemp("runs") / "recovered"
    result = subprocess.run(launcher.command("torchrun", run_args(synthetic_data, out)), cwd=REPO,
                            env=poisoned(str(bad_samples[0])), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout


@pytest.mark.slow
def test_a_rollback_skips_the_bad_data_and_reaches_max_steps(recovered, bad_samples):
    out, output = recovered
    rollbacks, skipped = record_of(out)
    assert rollbacks == [{"rollback": 1, "bad_step": BAD_STEP, "bad_steps": 1,
                          "why": f"the loss is not finite at step {BAD_STEP}",
                          "found_at_step": BAD_STEP, "rolled_back_to": "step_00000004",
                          "from_step": 4, "lr_factor": 0.5, "lr_until_step": BAD_STEP + 2}]
    assert skipped == {str(BAD_STEP): bad_samples}  # every sample of the bad step, no other
    checkpoint = out / "checkpoints" / "step_00000004"
    assert (f"the loss is not finite at step {BAD_STEP}: rolling back to {checkpoint} (rollback 1 "
            f"of at most 3); the data of step {BAD_STEP} will be skipped; optim.lr x0.5 until "
            f"step {BAD_STEP + 2}") in output
    assert (f"step {BAD_STEP}: skipped 32 samples, the data of 1 bad step (their indices in "
            f"{out / 'skipped_samples.json'})") in output
    (done,) = [line for line in output.splitlines() if line.startswith("done: ")]
    assert done.endswith(f"; 1 rollback, 32 samples skipped ({out / 'rollbacks.json'}, "
                         f"{out / 'skipped_samples.json'})")
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # the bad step's line is gone
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)
    assert [r.get("skipped_samples") for r in records] == [
        32 if r["step"] == BAD_STEP else None for r in records]
    # the learning rate is halved from the checkpoint rolled back to until 2 steps past the bad one
    optim = load_config(REPO / "configs" / "tiny.yaml", SYNTHETIC_RUN).optim
    for r in records:
        factor = 0.5 if 4 < r["step"] <= BAD_STEP + 2 else 1.0
        assert r["lr"] == pytest.approx(learning_rate(r["step"] - 1, optim) * factor, rel=1e-12)
    weights = read_consolidated(out / "final")["weights"]
    assert all(torch.isfinite(w).all() for kind in ("raw", "ema") for w in weights[kind].values())


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["rolled back", "skipped"])
def test_a_kill_9_during_the_recovery_resumes_into_the_same_run(recovered, launcher,
                                                                 synthetic_data, bad_samples,
                                                                 moment, tmp_path):
    """Every process killed right after the rollback was recorded (the run is on its way back to
    the bad step), or right after the stream moved past the bad data (no checkpoint holds that
    yet); the same command again ends where the uninterrupted recovery did."""
    out_ref, _ = recovered
    out = tmp_path / "killed"
    args, env = run_args(synthetic_data, out), poisoned(str(bad_samples[0]))
    mark = out / ("rollbacks.json" if moment == "rolled back" else "skipped_samples.json")
    with (tmp_path / "killed.log").open("w") as log:
        # the deepspeed launcher keeps its ranks in its process group, which the kill ends
        # (torchrun starts each rank in a session of its own)
        proc = subprocess.Popen(launcher.command("deepspeed", args), cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while not mark.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log"
                                                                          ).read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert max(r["step"] for r in read_metrics(out / "metrics.jsonl")) < STEPS  # killed mid-way
    rerun = subprocess.run(launcher.command("torchrun", args), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert record_of(out) == record_of(out_ref)
    # The same steps on the same weights and data, one thread per process: the same numbers
    for key in ("loss", "grad_norm", "lr", "skipped_samples"):
        assert losses(out, key) == pytest.approx(losses(out_ref, key), abs=1e-6), key
    for kind in ("raw", "ema"):
        expected = read_consolidated(out_ref / "final")["weights"][kind]
        for name, value in read_consolidated(out / "final")["weights"][kind].items():
            torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6)


# ---- one process: the ends of a recovery --------------------------------------------------------

# 8 sequences (one micro-batch) per step
ONE_PROCESS = [*SYNTHETIC_RUN, "train.tokens_per_step=512", "data.num_workers=0"]


def one_process_run(data, out, poison: str, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, MAIN, *run_args(data, out, *ONE_PROCESS, *overrides)]
    return subprocess.run(command, cwd=REPO, env={**os.environ, POISON_VARIABLE: poison},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def one_process_samples(synthetic_data):
    return step_samples([f"data.path={synthetic_data}", *ONE_PROCESS], 8)


@pytest.mark.slow
def test_the_run_gives_up_after_max_rollbacks(synthetic_data, one_process_samples, tmp_path):
    """Steps 6 and 7 both hold bad data: past the skipped samples of step 6, step 6 is given
    those of step 7, and is bad again."""
    out = tmp_path / "run"
    poison = f"{one_process_samples[6][0]},{one_process_samples[7][0]}"
    result = one_process_run(synthetic_data, out, poison, "recovery.max_rollbacks=1")
    assert result.returncode == EXIT_FAILED, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert error_lines(result.stderr) == [
        f"error: the loss is not finite at step 6, after 1 rollback (recovery.max_rollbacks=1, "
        f"listed in {out / 'rollbacks.json'}): stopped without saving this step; the last "
        f"complete checkpoint is {out / 'checkpoints' / 'step_00000004'}"]
    assert [r["bad_step"] for r in record_of(out)[0]] == [6]


@pytest.mark.slow
def test_a_rollback_with_no_checkpoint_before_the_bad_step_stops(synthetic_data,
                                                                  one_process_samples, tmp_path):
    out = tmp_path / "run"
    result = one_process_run(synthetic_data, out, str(one_process_samples[2][0]))
    assert result.returncode == EXIT_FAILED, result.stdout[-3000:] + result.stderr[-3000:]
    assert error_lines(result.stderr) == [
        "error: the loss is not finite at step 2, and train.on_nonfinite=rollback has no complete "
        "checkpoint before it to roll back to: stopped without saving this step; the last "
        "complete checkpoint is none yet (a smaller checkpoint.every saves one sooner; a larger "
        "checkpoint.keep_last keeps one from before a spike)"]
    assert not (out / "rollbacks.json").exists() and not (out / "checkpoints").exists()


@pytest.mark.slow
def test_a_loss_spike_is_rolled_back_like_a_non_finite_loss(synthetic_data, one_process_samples,
                                                            tmp_path):
    """One sample of step 6 weighs 200 times its loss: the step's loss is ~26x the median of the
    steps before it, and the spike rule (3x, over 3 steps) finds it."""
    out = tmp_path / "run"
    result = one_process_run(synthetic_data, out, f"{one_process_samples[6][0]}:200",
                             "recovery.spike_factor=3", "recovery.spike_window=3",
                             "recovery.spike_steps=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (rollback,), skipped = record_of(out)
    assert rollback["bad_step"] == 6 and rollback["rolled_back_to"] == "step_00000004"
    assert re.fullmatch(r"the loss spiked at step 6 \(\d+\.?\d* > 3 x the median 4\.\d+ of "
                        r"the 3 steps before it\)", rollback["why"]), rollback["why"]
    assert skipped == {"6": one_process_samples[6]}
    # no spike left in the record of the run (the first steps' ~log 128 = 4.85 is its highest)
    assert max(losses(out).values()) < 5.5


@pytest.mark.slow
def test_the_heads_bf16_copy_is_never_stale_across_steps_or_a_rollback(synthetic_data,
                                                                       one_process_samples,
                                                                       tmp_path):
    """Under autocast_bf16 the head casts its weights once per step and reuses the copy for the
    step's later micro-batches; a rollback reloads earlier weights. Every forward is checked
    (tests/trainer/run_checking_head_cast.py): the copy it used is the weights it held, cast."""
    out, log = tmp_path / "run", tmp_path / "casts.json"
    command = [sys.executable, str(REPO / "tests" / "trainer" / "run_checking_head_cast.py"),
               "--cast-log", str(log),
               *run_args(synthetic_data, out, *ONE_PROCESS, "train.precision=autocast_bf16",
                         "train.micro_batch_size=4",  # 2 micro-batches per step
                         # the steps up to the rollback's replay: bf16 math is emulated (slow)
                         # on CPUs without AVX512-BF16
                         f"train.max_steps={BAD_STEP + 1}")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, POISON_VARIABLE: str(one_process_samples[6][0])})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [r["bad_step"] for r in record_of(out)[0]] == [6]  # rolled back to step 4
    forwards = json.loads(log.read_text())
    steps = [f["step"] for f in forwards]
    assert steps.count(4) == 2 and steps.count(5) == steps.count(6) == 4  # 5, 6 ran twice
    assert all(f["current"] for f in forwards), [f for f in forwards if not f["current"]]
    # each step's second micro-batch reuses the copy its first one made
    assert [f["reused"] for f in forwards] == [False, True] * (len(forwards) // 2)


# ---- the rules ----------------------------------------------------------------------------------


def spike_rule(**settings) -> SpikeRule:
    return SpikeRule(RecoveryConfig(**{"spike_factor": 2.0, "spike_window": 4, "spike_steps": 2,
                                       **settings}))


def test_the_spike_rule_names_the_first_of_the_steps_in_a_row_once_its_window_is_full():
    rule = spike_rule()
    assert [rule.add(step, 50.0 if step == 2 else 1.0) for step in range(1, 5)] == [None] * 4
    assert rule.add(5, 3.0) is None  # one step above 2x the median (1.0): not yet
    bad = rule.add(6, 4.5)  # above 2x the median of (50, 1, 1, 3): every finite loss counts
    assert (bad.step, bad.steps) == (5, 2)
    assert bad.why == ("the loss spiked at step 5 (3 > 2 x the median 1 of the 4 steps before it, "
                       "2 steps in a row)")


def test_the_spike_rule_restarts_its_count_after_a_normal_step_and_ignores_non_finite_losses():
    rule = spike_rule()
    for step in range(1, 5):
        rule.add(step, 1.0)
    assert [rule.add(5, 3.0), rule.add(6, 1.0), rule.add(7, 3.0),
            rule.add(8, float("nan"))] == [None] * 4
    assert list(rule.window) == [1.0, 3.0, 1.0, 3.0]  # NaN is FirstNonFinite's to report


def test_the_spike_rule_resumes_from_its_state_as_if_never_stopped():
    run, resumed = spike_rule(), spike_rule()
    for step in range(1, 6):
        run.add(step, 3.0 if step == 5 else 1.0)
    resumed.load_state_dict(json.loads(json.dumps(run.state_dict())))  # as a checkpoint keeps it
    assert run.add(6, 4.0) == resumed.add(6, 4.0) is not None


def test_rollback_records_give_the_skips_and_learning_rates_of_the_steps_after_them(tmp_path):
    cfg = RecoveryConfig(lr_factor=0.5, lr_steps=3)
    rollbacks = Rollbacks(RunFolder(tmp_path), cfg)
    rollbacks.add(BadStep(6, 2, "spike"), found_at=7, rolled_back_to="step_00000004", to_step=4)
    rollbacks.add(BadStep(6, 1, "NaN"), found_at=9, rolled_back_to="step_00000004", to_step=4)
    assert [rollbacks.steps_to_skip(step) for step in (5, 6, 7)] == [0, 3, 0]
    assert [rollbacks.lr_factor(step) for step in (4, 5, 9, 10)] == [1.0, 0.25, 0.25, 1.0]
    assert len(Rollbacks(RunFolder(tmp_path), cfg)) == 2  # a rerun reads them back


def test_an_unreadable_rollback_record_is_one_line(tmp_path):
    (tmp_path / "rollbacks.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"rollbacks.json is unreadable .*: restore it, or delete "
                                        r"it to resume without the skips it records"):
        Rollbacks(RunFolder(tmp_path), RecoveryConfig())


def test_the_poison_hook_wraps_the_steps_forward_only_when_asked(monkeypatch):
    """AOGPT_TEST_POISON wraps the step's forward (the step holds no branch for it): the loss of
    the samples it names is multiplied by their factor (NaN by default), the others' untouched;
    without it the forward is the step's own."""
    model = AOGPT(replace(model_presets.tiny(), vocab_size=64, block_size=16)).eval()
    idx = torch.randint(0, 64, (3, 16))  # (micro, t)
    orders = torch.stack([torch.randperm(16) for _ in range(3)])

    def forward(idx, orders, sample_ids):
        return model(idx, orders, return_mean=True)

    monkeypatch.delenv(POISON_VARIABLE, raising=False)
    assert PoisonedSamples.around(forward, torch.device("cpu")) is forward
    monkeypatch.setenv(POISON_VARIABLE, "11,12:3")
    poisoned = PoisonedSamples.around(forward, torch.device("cpu"))
    with torch.no_grad():
        nll, _ = forward(idx, orders, torch.tensor([10, 11, 12]))
        bad_nll, bad_loss = poisoned(idx, orders, torch.tensor([10, 11, 12]))  # (micro, t)
    assert torch.equal(bad_nll[0], nll[0]) and bad_nll[1].isnan().all()
    assert torch.allclose(bad_nll[2], 3 * nll[2]) and bad_loss.isnan()
