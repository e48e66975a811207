"""metrics.jsonl on rank 0, wandb only when configured, progress bars on rank 0, the metrics'
names, the log interval's time."""

import json
import time

from aogpt.model.orders import ANY_ORDER, READINGS
from aogpt.trainer.config import LoggingConfig, RunConfig
from aogpt.trainer.metrics import (
    MetricsLogger,
    TrainingLog,
    loss_key,
    read_metrics,
    step_line,
    training_bar,
    validation_line,
    wandb_mode,
)
from aogpt.trainer.zero_shot import metric_name


def test_rank0_writes_one_json_object_per_step(tmp_path):
    with MetricsLogger(tmp_path, rank=0, logging=LoggingConfig(wandb="off")) as log:
        log.log(1, loss=3.5, lr=1e-4)
        log.log(2, loss=float("nan"), lr=2e-4)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first["step"] == 1 and first["loss"] == 3.5 and "time" in first
    assert second["loss"] is None  # NaN is not valid JSON


def test_other_ranks_write_nothing(tmp_path):
    with MetricsLogger(tmp_path, rank=1, logging=LoggingConfig(wandb="off")) as log:
        log.log(1, loss=1.0)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_appends_across_restarts_and_skips_a_torn_line(tmp_path):
    with MetricsLogger(tmp_path, rank=0, logging=LoggingConfig(wandb="off")) as log:
        log.log(1, loss=1.0)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "lo')  # a writer killed mid-line
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]


def test_wandb_is_off_without_a_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_mode("auto") == "disabled"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online"
    assert wandb_mode("off") == "disabled" and wandb_mode("offline") == "offline"


def test_wandb_offline_run_keeps_its_id_across_restarts(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggingConfig(wandb="offline", wandb_project="aogpt-test")
    with MetricsLogger(tmp_path, rank=0, logging=cfg, run_config={"a": 1}) as log:
        log.log(1, loss=2.0)
    first_id = (tmp_path / "wandb_id").read_text()
    with MetricsLogger(tmp_path, rank=0, logging=cfg) as log:
        log.log(2, loss=1.0)
    assert (tmp_path / "wandb_id").read_text() == first_id
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{first_id}"))


def test_the_step_bar_shows_on_rank0_only_and_never_writes_its_own_lines_in_a_log(capsys):
    assert training_bar(rank=1, total=3, initial=0).disable
    bar = training_bar(rank=0, total=3, initial=0)  # stderr is not a terminal under pytest
    assert not bar.disable
    bar.update(3)
    bar.write("step 3/3 | ...")
    bar.close()
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("step 3/3 | ...\n", "")


def test_metric_names_and_log_labels_come_from_the_readings():
    """The keys are a public interface (plots, earlier runs' files): the table builds them as
    they have always been; the log lines say each reading in words."""
    assert [loss_key(r) for r in READINGS] == ["loss_l2r", "loss_ao"]
    assert [loss_key(r, validation=True) for r in READINGS] == ["val_loss_l2r", "val_loss_ao"]
    assert metric_name("lambada", "ema", ANY_ORDER.metric, "ppl") == "eval/lambada/ema/ao_ppl"
    record = {"loss": 6.5, "loss_l2r": 5.4, "loss_ao": 6.6, "tokens_seen": 512, "lr": 1e-3,
              "tokens_per_s": 100.0, "val_loss_l2r": 5.0, "val_loss_ao": None}
    assert step_line(record, 1, 2, None).startswith(
        "step 1/2 | 512 tokens | loss 6.5000 (left to right 5.4000, any order 6.6000) |")
    assert validation_line(record, 1, "ema") == (
        "step 1 | validation (ema weights): left to right 5.0000 (ppl 148.41)")


def test_the_log_line_gives_mfu_both_ways():
    """Attention counted whole (6N + 12 L d T), and halved for causal attention (Megatron's and
    MaxText's count), each named."""
    record = {"loss": 6.5, "tokens_seen": 512, "lr": 1e-3, "tokens_per_s": 100.0,
              "mfu": 0.381, "mfu_causal": 0.352}
    assert "| MFU 38.1% (causal 35.2%) |" in step_line(record, 1, 2, None) + " |"


def test_the_work_between_steps_stays_out_of_the_log_intervals_time(tmp_path):
    """Evaluations, samples and checkpoints run between steps and are timed on their own: a log
    interval's seconds (tokens_per_s, step_time, mfu) are its steps' alone, the interval after a
    boundary does not carry it, and the launch's rate counts everything."""
    cfg = RunConfig(out_dir=str(tmp_path))
    cfg.train.log_every, cfg.train.max_steps, cfg.logging.wandb = 2, 4, "off"
    step_s, between_s = 0.02, 0.5  # a step, then the work before the next (after every step)
    intervals = []
    with TrainingLog(cfg, rank=0, step=0) as log:
        for step in range(1, 5):
            log.begin_step()
            time.sleep(step_s)
            if log.advance(step, data_wait=0.0):
                window = log.window
                intervals.append((window.steps, window.seconds))
                log.step(step, {"loss": 5.0, "lr": 1e-3, "tokens_seen": step * 512,
                                "tokens_per_s": window.tokens / window.seconds})
            time.sleep(between_s)
        launch = log.launch.seconds
    assert [steps for steps, _ in intervals] == [1, 1, 2]  # steps 1, 2, and 3-4
    for steps, seconds in intervals:  # a sleep's overrun, not a boundary's 0.5 s
        assert steps * step_s <= seconds < steps * step_s + between_s, intervals
    assert launch >= 4 * (step_s + between_s)
