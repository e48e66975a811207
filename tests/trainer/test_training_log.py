"""What a run leaves in its out_dir and its log, launch after launch: real trainings of
trainer/main.py in one process, their output going to a file as under nohup or SLURM."""

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import run_cli
from trainer_testing import REPO, logged_command, train_logged

from aogpt.data_prep.manifest import read_manifest
from aogpt.trainer.metrics import read_metrics


def start(data, out, log, *overrides: str, records: int) -> subprocess.Popen:
    """A training in the background, its output in `log`, once it has logged `records` steps."""
    with log.open("w") as sink:
        proc = subprocess.Popen(logged_command(data, out, *overrides), cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT)
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and len(read_metrics(metrics)) >= records):
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    return proc


@pytest.fixture
def logged(finished_run):
    return finished_run


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


def test_the_start_says_the_data_size_and_how_many_epochs_the_run_makes(logged, synthetic_data):
    _, output = logged
    samples = read_manifest(synthetic_data)["splits"]["train"]["samples"]
    assert (f"data: {samples:,} training samples of 64 tokens in {synthetic_data} | 6 steps x 8 "
            f"sequences = 48 samples, {48 / samples:,.2f} epochs") in output.splitlines()


def test_the_run_ends_with_a_summary(logged):
    out, output = logged
    last = [line for line in output.splitlines() if not line.startswith("[20")][-3:]
    # a loaded machine takes over a minute: "1 min 16 s", as the step lines' time left
    assert re.fullmatch(r"done: 6 steps, 3,072 tokens; this launch \d+ (s|min \d\d s), [\d,]+ "
                        r"tokens/s", last[0]), last[0]
    assert re.fullmatch(r"last step: loss \d+\.\d{4}( \(.*\))?; validation \(ema weights\): "
                        r"left to right \d+\.\d{4} \(ppl .*\), any order \d+\.\d{4} \(ppl .*\)",
                        last[1])
    assert last[2] == (f"weights: {out / 'final' / 'model.safetensors'} (raw and EMA); metrics: "
                       f"{out / 'metrics.jsonl'}")


@pytest.mark.slow
def test_a_relaunch_with_other_settings_keeps_the_config_and_records_the_change(synthetic_data,
                                                                                tmp_path):
    """Resumed at step 3 with twice the tokens per step: tokens are counted at the rate of each
    step, config.yaml stays as the run began, config_changes.jsonl says what changed when."""
    out = tmp_path / "run"

    def train(*overrides: str) -> str:
        return train_logged(synthetic_data, out, *overrides)

    train("train.max_steps=3")
    began = (out / "config.yaml").read_text()
    output = train("train.max_steps=5", "train.tokens_per_step=1024")
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
    train("train.max_steps=5", "train.tokens_per_step=1024")  # nothing new
    assert len((out / "config_changes.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_a_rerun_after_an_attempt_without_checkpoint_sets_its_files_aside(synthetic_data,
                                                                               tmp_path):
    out = tmp_path / "run"
    proc = start(synthetic_data, out, tmp_path / "killed.log", "checkpoint.every=100",
                 "train.max_steps=100", records=2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = read_metrics(out / "metrics.jsonl")
    output = train_logged(synthetic_data, out, "train.max_steps=4")
    (aside,) = (out / "previous").iterdir()
    assert ("starting from step 0 (it holds no checkpoint): the earlier run's files are set aside "
            f"in {aside}/ (config.yaml, metrics.jsonl)") in output
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert read_metrics(aside / "metrics.jsonl") == killed  # nothing lost
    assert "warning: taking over" in output  # the killed attempt's lock


@pytest.mark.slow
def test_a_second_training_into_a_live_out_dir_is_refused_and_the_first_goes_on(synthetic_data,
                                                                              tmp_path):
    out = tmp_path / "run"
    first = start(synthetic_data, out, tmp_path / "first.log", "train.max_steps=8", records=1)
    # paused (as by Ctrl-Z) while the second starts: on a loaded machine the first finished its 8
    # steps before the second, still importing, reached the lock
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(logged_command(synthetic_data, out, "train.max_steps=8"), cwd=REPO,
                                capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert second.returncode == 2
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: out_dir {out} is in use by another training (process {first.pid} on ")
    # steps 1 and every log_every=2, and the evaluations' 3 and 6: each once
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4, 6, 8]
    assert not (out / "run.lock").exists()  # released at the end


# ---- nothing of a run, a dataset or a corpus is replaced -----------------------------------------


def one_line_refusal(result: subprocess.CompletedProcess) -> str:
    """The refusal of a command that must stop before any work: status 2, one `error:` line."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return error.removeprefix("error: ")


FORCED = {  # an output flag given --force, pointed at a file of a run, a dataset or a corpus
    "evaluate --json RUN/config.yaml": (
        ["trainer/evaluate.py", "--ckpt", "{run}", "--data", "{data}", "--json",
         "{run}/config.yaml"], "{run}/config.yaml is the config of training run {run}",
        "an earlier evaluation report of trainer/evaluate.py"),
    "sample --out RUN/metrics.jsonl": (
        ["trainer/sample.py", "--ckpt", "{run}", "--out", "{run}/metrics.jsonl"],
        "{run}/metrics.jsonl is the metrics of training run {run}",
        "an earlier sample file of trainer/sample.py"),
    "plot_metrics --out RUN/final/model.safetensors": (
        ["tools/plot_metrics.py", "--run", "{run}", "--out", "{run}/final/model.safetensors"],
        "{run}/final/model.safetensors is a file of the final weights (final/) of training run "
        "{run}", "an earlier plot of tools/plot_metrics.py"),
    "genppl --json corpus.jsonl": (
        ["trainer/genppl.py", "--samples", "{run}/samples.jsonl", "--judge", "{run}", "--json",
         "{corpus}"], "{corpus} is a file that trainer/genppl.py did not write",
        "an earlier generative-perplexity report of trainer/genppl.py"),
    "evaluate --json DATA/manifest.json": (
        ["trainer/evaluate.py", "--ckpt", "{run}", "--data", "{data}", "--json",
         "{data}/manifest.json"], "{data}/manifest.json is the manifest of dataset {data}",
        "an earlier evaluation report of trainer/evaluate.py"),
}


@pytest.mark.parametrize("case", FORCED)
def test_force_replaces_only_what_the_same_command_wrote(case, logged, synthetic_data, tmp_path):
    out, _ = logged
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a document of my corpus"}\n')
    argv, what, own = FORCED[case]
    places = {"run": out, "data": synthetic_data, "corpus": corpus}
    argv = [arg.format(**places) for arg in argv]
    target = Path(argv[-1])
    before = target.read_bytes()
    error = one_line_refusal(run_cli(*argv, "--force"))
    flag = argv[-2]
    assert error == (f"{flag} {what.format(**places)}: choose another name (--force replaces "
                     f"only {own})")
    assert target.read_bytes() == before


def test_an_output_in_a_folder_the_trainer_writes_is_refused(logged):
    out, _ = logged
    samples = out / "samples" / "mine.jsonl"
    error = one_line_refusal(run_cli("trainer/sample.py", "--ckpt", str(out),
                                     "--out", str(samples)))
    assert error == (f"--out {samples} would be a file of the samples drawn while training "
                     f"(samples/) of training run {out}: choose a name outside the trainer's files")


@pytest.fixture
def finished_without_checkpoints(logged, tmp_path):
    """A copy of the finished run whose checkpoints were deleted to save disk."""
    out = tmp_path / "finished"
    shutil.copytree(logged[0], out)
    shutil.rmtree(out / "checkpoints")
    return out


def test_a_finished_run_is_never_replaced_by_a_fresh_start(finished_without_checkpoints,
                                                           synthetic_data):
    out = finished_without_checkpoints
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    result = subprocess.run(logged_command(synthetic_data, out, "train.max_steps=6"), cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert one_line_refusal(result) == (
        f"out_dir {out} holds a finished run ({out / 'final'}/), and no checkpoint to resume "
        f"from: a new run there would replace it. Pass --start-over to set its files aside in "
        f"{out / 'previous'}/ and start from step 0, or choose another out_dir")
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


@pytest.mark.slow
def test_start_over_sets_the_finished_run_aside_and_trains_from_step_0(
        finished_without_checkpoints, synthetic_data):
    out = finished_without_checkpoints
    before = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    output = train_logged(synthetic_data, out, "train.max_steps=2", "--start-over")
    (aside,) = (out / "previous").iterdir()
    assert ("starting from step 0 (as asked): the earlier run's files are set aside in "
            f"{aside}/ (config.yaml, metrics.jsonl, final/)") in output
    assert {path.relative_to(aside): path.read_bytes() for path in aside.rglob("*")
            if path.is_file()} == before  # nothing lost
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize("case", ["a dataset", "a folder of other files"])
def test_an_out_dir_that_holds_a_dataset_or_other_files_is_refused(case, synthetic_data, tmp_path):
    if case == "a dataset":
        out, what = synthetic_data, "a dataset (data_prep's)"
    else:
        out, what = tmp_path / "notes", "a file the trainer did not write (todo.txt)"
        out.mkdir()
        (out / "todo.txt").write_text("my notes")
    before = sorted(out.rglob("*"))
    result = subprocess.run(logged_command(synthetic_data, out), cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert one_line_refusal(result) == (
        f"out_dir {out} holds {what}: a training writes into a new or empty folder, or its own "
        "earlier run: choose another out_dir")
    assert sorted(out.rglob("*")) == before
