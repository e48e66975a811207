"""What a training may do with its out_dir: nothing of an earlier run, a dataset or another tool is
ever replaced.

    check_out_dir(out_dir)              before any work: a new or empty folder, a training run
                                        (resumed, or started over), or one holding only what a
                                        run keeps beside its own files; a dataset, an export, a
                                        checkpoint, other runs or other files are refused
    check_fresh_start(run)              a start from step 0 where the run finished (final/) or
                                        saved checkpoints that are gone: refused, naming START_OVER
    set_aside(run)                      what an earlier run left goes to out_dir/previous/<time>/

A run that starts from step 0 (no checkpoint to resume from) sets aside what an earlier attempt
left, so the new metrics never mix with its steps: automatically for an attempt that never
reached a checkpoint (stopped during its start-up or first steps, or on a node lost before it),
and only with START_OVER for a run that finished or whose checkpoints were deleted (to save disk,
as people do): its results would otherwise be replaced without a word.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import yaml

from aogpt import UsageError
from aogpt.data_folder import dataset_folder
from aogpt.files import file_record, provenance_of
from aogpt.run_folder import WEIGHTS_FILE, RunFolder
from aogpt.trainer.metrics import read_metrics

START_OVER = "--start-over"
LOG_SUFFIXES = (".log", ".out", ".err")  # a launch's own output, redirected into its out_dir
EXPORT_MARKER = "aogpt_export.json"  # tools/export_hf.py's


def check_out_dir(out_dir: str | os.PathLike) -> None:
    """UsageError, naming what is there, unless `out_dir` is absent, empty, a training run, or
    holds only what may sit beside a run's files: logs, hidden files and the outputs of this
    project's commands (they record which command wrote them)."""
    root = Path(out_dir)
    if root.exists() and not root.is_dir():
        raise UsageError(f"out_dir {root} is a file: give a folder for the run")
    if RunFolder(root).run_entries():
        return
    what = foreign_contents(root)
    if what:
        raise UsageError(f"out_dir {root} holds {what}: a training writes into a new or empty "
                         "folder, or its own earlier run: choose another out_dir")


def foreign_contents(root: Path) -> str | None:
    """What `root` (not a training run, new or not) holds or lies in that a training must not
    write beside, in words; None when nothing."""
    data = dataset_folder(root)
    if data is not None:
        return "a dataset (data_prep's)" if data == root else f"part of the dataset {data}"
    if not root.is_dir():
        return None
    entries = sorted(root.iterdir())
    if (root / EXPORT_MARKER).is_file():
        return f"an exported model ({EXPORT_MARKER})"
    if (root / WEIGHTS_FILE).is_file():
        return f"a checkpoint ({WEIGHTS_FILE})"
    runs = [entry.name for entry in entries if entry.is_dir() and RunFolder(entry).run_entries()]
    if runs:
        return f"training runs ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''})"
    own = set(RunFolder(root).own_entries())
    others = [entry.name for entry in entries if entry not in own and not may_sit_beside(entry)]
    if others:
        return (f"files the trainer did not write (e.g. {others[0]}; {len(others)} in all)"
                if len(others) > 1 else f"a file the trainer did not write ({others[0]})")
    return None


def may_sit_beside(entry: Path) -> bool:
    """A log, a hidden file (a writer's temporary), or an output of this project's commands."""
    if entry.name.startswith(".") or entry.suffix in LOG_SUFFIXES:
        return True
    record = file_record(entry) if entry.is_file() else None
    origin = provenance_of(record) if record is not None else None
    return isinstance(origin, dict) and "made_by" in origin


def check_fresh_start(run: RunFolder) -> None:
    """UsageError naming START_OVER when starting `run` from step 0 would replace the results of
    a run that finished or saved checkpoints (deleted since)."""
    why = finished_because(run)
    if why:
        raise UsageError(f"out_dir {run.root} holds {why}, and no checkpoint to resume from: a "
                         f"new run there would replace it. Pass {START_OVER} to set its files "
                         f"aside in {run.previous}/ and start from step 0, or choose another "
                         "out_dir")


def finished_because(run: RunFolder) -> str | None:
    """Why `run`'s files are results to keep: its final weights, or metrics up to its last step or
    past a checkpoint it saved; None for an attempt that never reached one."""
    if run.final.exists():
        return f"a finished run ({run.final}/)"
    records = read_metrics(run.metrics_file) if run.metrics_file.is_file() else []
    if not records or not run.config_file.is_file():
        return None
    try:
        config = yaml.safe_load(run.config_file.read_text()) or {}
        last_save = min(config["checkpoint"]["every"], config["train"]["max_steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    step = max(record.get("step", 0) for record in records)
    return f"a run trained to step {step} (its metrics)" if step >= last_save else None


def set_aside(run: RunFolder) -> tuple[Path, list[str]] | None:
    """Moves what an earlier run left in `run` (the trainer's files, not the lock or the data
    cache) to out_dir/previous/<UTC time>/; the folder and the names moved, None when nothing
    was there."""
    kept = {run.lock_file, run.data_cache, run.previous}
    entries = [path for path in run.own_entries() if path not in kept and path.exists()]
    if not entries:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = run.set_aside_folder(stamp)
    folder.mkdir(parents=True)
    for path in entries:
        path.rename(folder / path.name)
    return folder, [path.name + ("/" if (folder / path.name).is_dir() else "") for path in entries]
