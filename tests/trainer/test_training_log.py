"""What a run leaves in its out_dir and its log, launch after launch: real trainings of
trainer/main.py in one process, their output going to a file as under nohup or SLURM."""

import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from trainer_testing import MAIN, REPO, TINY_RUN

from aogpt.trainer.metrics import read_metrics

# one micro-batch of 8 x 64 tokens per step
ONE_PROCESS = [*TINY_RUN, "train.tokens_per_step=512", "eval.every=3", "train.log_every=2",
               "checkpoint.every=3"]


def command(data, out, *overrides: str) -> list[str]:
    return [sys.executable, MAIN, "--ds_config", "ds_configs/cpu.json", "--config",
            "configs/tiny.yaml", f"data.path={data}", f"out_dir={out}", *ONE_PROCESS, *overrides]


def train(data, out, *overrides: str) -> str:
    """The run's output, as a log file holds it."""
    log = out.parent / f"{out.name}.log"
    with log.open("w") as sink:
        done = subprocess.run(command(data, out, *overrides), cwd=REPO, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=300)
    output = log.read_text()
    assert done.returncode == 0, output[-3000:]
    return output


def start(data, out, log, *overrides: str, records: int) -> subprocess.Popen:
    """A training in the background, its output in `log`, once it has logged `records` steps."""
    with log.open("w") as sink:
        proc = subprocess.Popen(command(data, out, *overrides), cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT)
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and len(read_metrics(metrics)) >= records):
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    return proc


@pytest.fixture(scope="module")
def logged(text_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "logged"
    return out, train(text_data, out, "train.max_steps=6")


def test_a_log_file_holds_plain_lines_and_no_progress_bar(logged):
    out, output = logged
    assert "\r" not in output
    step = (r"step {step}/6 \| {tokens} tokens \| loss \d+\.\d{{4}}( \((left to right "
            r"\d+\.\d{{4}}, )?any order \d+\.\d{{4}}\))? \| lr \d\.\d\de[-+]\d\d \| "
            r"grad norm [\d.e+-]+ \| [\d,]+ tokens/s")
    lines = output.splitlines()
    for number in (1, 2, 4):
        assert any(re.fullmatch(step.format(step=number, tokens=f"{512 * number:,}")
                                + r" \| \d+ (s|min \d\d s) left", line) for line in lines), number
    assert any(re.fullmatch(step.format(step=6, tokens="3,072"), line) for line in lines)
    for number in (3, 6):
        assert any(re.fullmatch(rf"step {number} \| validation \(ema weights\): left to right "
                                r"\d+\.\d{4} \(ppl [\d,]+\.\d\d\), any order \d+\.\d{4} "
                                r"\(ppl [\d,]+\.\d\d\)",
                                line) for line in lines), number


def test_the_run_ends_with_a_summary(logged):
    out, output = logged
    last = [line for line in output.splitlines() if not line.startswith("[20")][-3:]
    assert re.fullmatch(r"done: 6 steps, 3,072 tokens; this launch \d+ s, [\d,]+ tokens/s", last[0])
    assert re.fullmatch(r"last step: loss \d+\.\d{4}( \(.*\))?; validation \(ema weights\): "
                        r"left to right \d+\.\d{4} \(ppl .*\), any order \d+\.\d{4} \(ppl .*\)",
                        last[1])
    assert last[2] == (f"weights: {out / 'final' / 'model.safetensors'} (raw and EMA); metrics: "
                       f"{out / 'metrics.jsonl'}")


@pytest.mark.slow
def test_a_relaunch_with_other_settings_keeps_the_config_and_records_the_change(text_data,
                                                                                tmp_path):
    """Resumed at step 3 with twice the tokens per step: tokens are counted at the rate of each
    step, config.yaml stays as the run began, config_changes.jsonl says what changed when."""
    out = tmp_path / "run"
    train(text_data, out, "train.max_steps=3")
    began = (out / "config.yaml").read_text()
    output = train(text_data, out, "train.max_steps=5", "train.tokens_per_step=1024")
    assert (out / "config.yaml").read_text() == began
    assert ("config changed since the run began: train.max_steps 3 -> 5, train.tokens_per_step "
            f"512 -> 1024 (recorded in {out / 'config_changes.jsonl'})") in output
    (change,) = [yaml.safe_load(line) for line in (out / "config_changes.jsonl").read_text()
                 .splitlines()]
    assert change["from_step"] == 3 and change["changed"] == {
        "train.max_steps": [3, 5], "train.tokens_per_step": [512, 1024]}
    tokens = {r["step"]: r["tokens_seen"] for r in read_metrics(out / "metrics.jsonl")
              if "tokens_seen" in r}
    assert tokens[2] == 1024 and tokens[4] == 3 * 512 + 1024 and tokens[5] == 3 * 512 + 2 * 1024
    assert "done: 5 steps, 3,584 tokens" in output
    train(text_data, out, "train.max_steps=5", "train.tokens_per_step=1024")  # nothing new
    assert len((out / "config_changes.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_a_rerun_after_an_attempt_without_checkpoint_starts_the_metrics_afresh(text_data,
                                                                               tmp_path):
    out = tmp_path / "run"
    proc = start(text_data, out, tmp_path / "killed.log", "checkpoint.every=100",
                 "train.max_steps=100", records=2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    output = train(text_data, out, "train.max_steps=4")
    assert (f"starting from step 0: {out} holds no checkpoint, so the files of an earlier attempt "
            "are replaced (metrics.jsonl, config.yaml)") in output
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert "warning: taking over" in output  # the killed attempt's lock


@pytest.mark.slow
def test_a_second_training_into_a_live_out_dir_is_refused_and_the_first_goes_on(text_data,
                                                                              tmp_path):
    out = tmp_path / "run"
    first = start(text_data, out, tmp_path / "first.log", "train.max_steps=8", records=1)
    second = subprocess.run(command(text_data, out, "train.max_steps=8"), cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert second.returncode == 2
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: out_dir {out} is in use by another training (process {first.pid} on ")
    # steps 1 and every log_every=2, and the evaluations' 3 and 6: each once
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4, 6, 8]
    assert not (out / "run.lock").exists()  # released at the end
