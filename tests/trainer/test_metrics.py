"""metrics.jsonl on rank 0, wandb only when configured, progress bars on rank 0."""

import json

from aogpt.trainer.config import LoggingConfig
from aogpt.trainer.metrics import MetricsLogger, read_metrics, training_bar, wandb_mode


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
