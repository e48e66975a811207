"""Where numbers go: one JSON object per line in out_dir/metrics.jsonl, wandb when enabled, and
what a training launch says of them (TrainingLog: the step bar and the log lines step_line,
validation_line, summary_lines); read back for plots by run_records and curve. The devices' peaks
that MFU and the decode step's floor are measured against are kept here too.

Only rank 0 writes. wandb is optional: "auto" turns it on only when WANDB_API_KEY is set, and it
never prompts or waits on the network for a login. The wandb run id is kept in out_dir so a
resumed (or requeued) job continues the same run.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from aogpt import UsageError
from aogpt.files import write_text_atomic
from aogpt.model.orders import READINGS, Reading
from aogpt.progress import PlainProgress, duration, progress
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import LoggingConfig


def loss_key(reading: Reading, validation: bool = False) -> str:
    """A reading's loss in the metrics: loss_l2r, loss_ao (training), val_loss_l2r, val_loss_ao
    (validation): names that plots and earlier runs' files rely on."""
    return f"{'val_' if validation else ''}loss_{reading.metric}"


def wandb_mode(setting: str) -> str:
    """The wandb mode a LoggingConfig.wandb setting means on this machine ("disabled" when off)."""
    if setting == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "disabled"
    return "disabled" if setting == "off" else setting


class MetricsLogger:
    def __init__(self, out_dir: str | os.PathLike, rank: int, logging: LoggingConfig,
                 run_config: dict | None = None):
        self.enabled = rank == 0
        self.run_folder = RunFolder(out_dir)
        self.path = self.run_folder.metrics_file
        self._wandb_run = None
        if not self.enabled:
            return
        self.run_folder.root.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1)
        mode = wandb_mode(logging.wandb)
        if mode != "disabled":
            self._wandb_run = self._start_wandb(mode, logging, run_config)

    def _start_wandb(self, mode: str, logging: LoggingConfig, run_config: dict | None):
        try:
            import wandb
        except ImportError:
            raise UsageError("logging.wandb is on but wandb is not installed: "
                             "pip install wandb") from None
        id_file = self.run_folder.wandb_id_file
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id)
        return wandb.init(
            project=logging.wandb_project,
            name=logging.wandb_run_name,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=str(self.run_folder.root),
            config=run_config,
            settings=wandb.Settings(silent=True),
        )

    def log(self, step: int, **metrics: Any) -> None:
        """Appends {"step": step, "time": ..., **metrics}; non-finite floats become null."""
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3)}
        record.update({k: _json_safe(v) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        if self._wandb_run is not None:
            self._wandb_run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def reopen(self) -> None:
        """After metrics.jsonl was cut back to a checkpoint's step (a rollback: truncate_metrics
        replaces the file): append to the new file. wandb keeps what it was sent (it takes no
        step twice): metrics.jsonl is the record of the run."""
        if self.enabled:
            self._file.close()
            self._file = self.path.open("a", buffering=1)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl file; a torn last line (a killed writer) is skipped."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def run_records(out_dir: str | os.PathLike) -> list[dict]:
    """A training run's records in step order, the last one of each step (a resumed run repeats
    the steps after its checkpoint)."""
    path = RunFolder(out_dir).metrics_file
    if not path.is_file():
        raise UsageError(f"{path} does not exist: give a training out_dir")
    by_step = {record["step"]: record for record in read_metrics(path) if "step" in record}
    if not by_step:
        raise UsageError(f"{path} holds no records yet")
    return [by_step[step] for step in sorted(by_step)]


def curve(records: list[dict], key: str, x: str = "step",
          smooth: float = 0.0) -> tuple[list[float], list[float]]:
    """(x, y) of the records that have `key` (loss_l2r is null in steps without such samples),
    x = "step" or "tokens", exponentially smoothed by `smooth` in [0, 1)."""
    xs, ys, average = [], [], None
    for record in records:
        value = record.get(key)
        if value is None:
            continue
        average = value if average is None else smooth * average + (1 - smooth) * value
        xs.append(record["tokens_seen"] if x == "tokens" else record["step"])
        ys.append(average)
    return xs, ys


def training_bar(rank: int, total: int, initial: int) -> tqdm | PlainProgress:
    """The step bar: on rank 0 at a terminal only. In a log file (SLURM, nohup) the log lines
    below say everything, and a bar's carriage returns would make one unreadable line of them."""
    return progress(total=total, initial=initial, desc="train", unit="step",
                    disable=rank != 0, every_s=math.inf)


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def training_loss(record: dict) -> str:
    """'loss 6.5124 (left to right 5.4021, any order 6.6343)': a step's loss and its readings'."""
    readings = [f"{reading.label} {_loss(record[loss_key(reading)])}" for reading in READINGS
                if record.get(loss_key(reading)) is not None]
    return f"loss {_loss(record.get('loss'))}" + (f" ({', '.join(readings)})" if readings else "")


def step_line(record: dict, step: int, max_steps: int, seconds_left: float | None) -> str:
    """The log line of a log step, from its metrics record:

    step 120/400 | 491,520 tokens | loss 6.5124 (left to right 5.4021, any order 6.6343) |
    lr 4.80e-03 | grad norm 0.412 | 2,812 tokens/s | MFU 38.1% (causal 35.2%) | 13 min 02 s left

    MFU counts attention whole (6N + 12 L d T per token); "causal" halves it, as Megatron and
    MaxText count causal attention.
    """
    parts = [f"step {step}/{max_steps}", f"{record['tokens_seen']:,} tokens",
             training_loss(record), f"lr {record['lr']:.2e}"]
    if record.get("grad_norm") is not None:
        parts.append(f"grad norm {record['grad_norm']:.3g}")
    parts.append(f"{record['tokens_per_s']:,.0f} tokens/s")
    if record.get("mfu") is not None:
        causal = (f" (causal {100 * record['mfu_causal']:.1f}%)"
                  if record.get("mfu_causal") is not None else "")
        parts.append(f"MFU {100 * record['mfu']:.1f}%{causal}")
    if record.get("skipped_samples"):
        parts.append(f"{record['skipped_samples']} samples skipped")
    if record.get("planner_s") is not None:  # order.kind=planner's no-grad passes, in step_time
        parts.append(f"planner {record['planner_s']:.2f} s/step")
    if seconds_left is not None and step < max_steps:
        parts.append(f"{duration(seconds_left)} left")
    return " | ".join(parts)


def validation_losses(record: dict, weights: str) -> str:
    """validation (ema weights): left to right 5.4021 (ppl 221.89), any order 6.6343 (ppl 761.2)"""
    keys = {reading.label: loss_key(reading, validation=True) for reading in READINGS}
    readings = [f"{label} {record[key]:.4f} (ppl {math.exp(record[key]):,.2f})"
                for label, key in keys.items() if record.get(key) is not None]
    return f"validation ({weights} weights): {', '.join(readings)}"


def validation_line(record: dict, step: int, weights: str) -> str:
    """step 200 | validation (ema weights): left to right 5.4021 (ppl 221.89), any order 6.6343
    (ppl 761.2)"""
    return f"step {step} | {validation_losses(record, weights)}"


def summary_lines(run: RunFolder, progress, launch: Window, last: dict,
                  validation: str | None) -> list[str]:
    """The closing lines of a run: what it did (progress: trainer/checkpoint.py's Progress), its
    last losses (validation: the last validation_losses), where its results are."""
    losses = [training_loss(last)] if last else []
    if validation:
        losses.append(validation)
    return [f"done: {progress.step} steps, {progress.tokens_seen:,} tokens; this launch "
            f"{duration(launch.seconds)}, "
            f"{launch.tokens / max(launch.seconds, 1e-9):,.0f} tokens/s",
            *([f"last step: {'; '.join(losses)}"] if losses else []),
            f"weights: {run.final_weights} (raw and EMA); metrics: {run.metrics_file}"]


class TrainingLog:
    """What a training launch tells: the step records in metrics.jsonl (and wandb), the step bar
    and the log lines on rank 0, and the throughput of the log interval (`window`: its steps'
    own time) and of the launch (all of it). A step is logged every train.log_every steps, at
    the first and the last, and whenever the loop asks (a step that skipped data)."""

    def __init__(self, cfg, rank: int, step: int, run_config: dict | None = None):
        """cfg: the run's RunConfig; step: where the launch starts."""
        self.every, self.max_steps = cfg.train.log_every, cfg.train.max_steps
        self.tokens_per_step = cfg.train.tokens_per_step
        self.logger = MetricsLogger(cfg.out_dir, rank, cfg.logging, run_config)
        self.bar = training_bar(rank, self.max_steps, step)
        self.is_main = rank == 0
        self.window, self.launch = Window(), Window()
        self.last: dict = {}  # the last step record, for the summary

    def say(self, line: str) -> None:
        """A line of the log, on rank 0, above the bar."""
        if self.is_main:
            self.bar.write(line)

    def begin_step(self) -> None:
        """A step starts: the log interval's clock runs again (see `advance`)."""
        self.window.go()

    def advance(self, step: int, data_wait: float, asked: bool = False) -> bool:
        """One more step done (data_wait: the seconds it waited for data); whether it is logged.
        The interval's clock stops until the next step begins (`begin_step`): evaluations,
        samples and checkpoints are timed on their own (eval_s, sample_s) and would make the
        interval after them look slow (tokens_per_s, step_time, mfu). A logged step's clock runs
        on until its record is made (`step`), which waits for the device to finish its steps."""
        self.window.add(self.tokens_per_step, data_wait)
        self.launch.add(self.tokens_per_step, data_wait)
        self.bar.update(1)
        logged = step % self.every == 0 or step == 1 or step == self.max_steps or asked
        if not logged:
            self.window.stop()
        return logged

    def step(self, step: int, record: dict) -> dict:
        """A logged step's record (trainer/loop.py's step_metrics over `window`): said, and the
        next window begins, its clock stopped until the next step. Written by `write`, with what
        else the step adds."""
        self.last, self.window = record, Window(running=False)
        self.say(step_line(record, step, self.max_steps,
                           self.launch.seconds_per_step * (self.max_steps - step)))
        return record

    def write(self, step: int, record: dict, lines: list[str]) -> None:
        """The step's lines said and its record (if any) appended to metrics.jsonl."""
        for line in lines:
            self.say(line)
        if record:
            self.logger.log(step, **record)

    def restart(self, progress) -> None:
        """After a rollback to `progress` (trainer/checkpoint.py's Progress): the bar goes back,
        metrics.jsonl was cut back to its step, the interval starts again with the next step."""
        self.window = Window(running=False)
        self.logger.reopen()
        self.bar.reset(total=self.max_steps)
        self.bar.update(progress.step)

    def summary(self, run: RunFolder, progress, validation: str | None) -> list[str]:
        return summary_lines(run, progress, self.launch, self.last, validation)

    def close(self) -> None:
        self.bar.close()
        self.logger.close()

    def __enter__(self) -> TrainingLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Window:
    """Steps, tokens and time since it began: the throughput of a log interval, or of a launch.
    A log interval's clock can be stopped (`stop`, `go`), so that the work between two steps
    (evaluations, samples, checkpoints) does not count as a step's time."""

    def __init__(self, running: bool = True):
        self.steps, self.tokens, self.data_wait = 0, 0, 0.0
        self._counted = 0.0  # seconds before the clock last stopped
        self._since: float | None = time.perf_counter() if running else None

    def add(self, tokens: int, data_wait: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.data_wait += data_wait

    def stop(self) -> None:
        if self._since is not None:
            self._counted += time.perf_counter() - self._since
            self._since = None

    def go(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    @property
    def seconds(self) -> float:
        running = 0.0 if self._since is None else time.perf_counter() - self._since
        return self._counted + running

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(self.steps, 1)


def _json_safe(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# Dense bf16 peak FLOP/s per device (no sparsity), matched in order against the CUDA device name:
# the more specific names first. MFU against the wrong peak misleads (nanoGPT#464 showed "104%").
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
    ("L4", 121e12),
)


# Peak memory (HBM/GDDR) bandwidth in bytes/s, matched the same way: the floor of a step that
# must read its weights and KV cache (benchmarks/generation_speed.py).
PEAK_MEMORY_BANDWIDTH = (
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # SXM, HBM3
    ("GH200", 4.0e12),
    ("H200", 4.8e12),
    ("H800", 3.35e12),
    ("B200", 8.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB", 1.935e12),  # PCIe
    ("A100", 1.555e12),  # 40GB
    ("L40S", 0.864e12),
    ("A10G", 0.6e12),
    ("L4", 0.3e12),
)


def _look_up(table: tuple[tuple[str, float], ...], device_name: str) -> float | None:
    for name, value in table:
        if name.lower() in device_name.lower():
            return value
    return None


def peak_flops(device_name: str) -> float | None:
    """The device's dense bf16 peak, or None for an unknown device (then MFU is not reported)."""
    return _look_up(PEAK_BF16_FLOPS, device_name)


def peak_memory_bandwidth(device_name: str) -> float | None:
    """The device's memory bandwidth in bytes/s, or None for an unknown device."""
    return _look_up(PEAK_MEMORY_BANDWIDTH, device_name)


def truncate_metrics(path: str | os.PathLike, last_step: int) -> None:
    """Drops records after `last_step` (logged by a run killed after its last checkpoint), so a
    resumed run's file reads as one run. Atomic: temp file, then rename."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
