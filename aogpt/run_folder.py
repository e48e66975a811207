"""The run folder: where a training run keeps everything in its out_dir, and which checkpoint is
the newest complete one.

    out_dir/
        config.yaml                     the run's resolved config, as it began
        config_changes.jsonl            what each relaunch with other settings changed, and when
        metrics.jsonl                   one JSON record per logged step
        wandb_id                        the wandb run that a resumed run continues
        run.lock                        held by the training running in it (trainer/run_lock.py)
        rollbacks.json                  the run's rollbacks through bad steps (trainer/recovery.py)
        skipped_samples.json            the dataset indices they skipped, by step
        samples/step_00001000.jsonl     samples drawn while training (trainer/training_samples.py)
        data_cache/                     shards of a remote dataset, copied (trainer/data.py)
        previous/20250101-120000/       an earlier run's files, set aside by a new start from
                                        step 0 (trainer/out_dir.py)
        final/                          the finished run's consolidated checkpoint:
            model.safetensors           raw + EMA weights, their model config in the header
            model.json                  the same header, indented, for people and tools
        checkpoints/
            latest                      the newest complete tag's name, written last
            step_00001000/              a tag: the step it was saved at, 8 digits
                model.safetensors       the consolidated checkpoint of that step, as in final/
                model.json
                ...                     the trainer's own files (trainer/checkpoint.py)
                complete.json           every file of the tag with its size, written last
            step_00001000.partial/      a save not yet complete (or interrupted)
            universal/                  an elastic resume's conversion, removed once loaded

The trainer writes this layout; load_checkpoint, the experiments, the demo and the benchmarks read
it. A tag is complete when complete.json lists its files at their sizes. A resume takes the tag
`latest` names when it is complete, and otherwise the newest complete tag, with a warning.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from aogpt import UsageError

WEIGHTS_FILE = "model.safetensors"  # the format of both files: model/checkpoint.py
CONFIG_FILE = "model.json"
LATEST = "latest"
COMPLETE = "complete.json"
PARTIAL = ".partial"
TAG_PATTERN = re.compile(r"step_(\d+)$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def step_of(tag: str) -> int:
    return int(TAG_PATTERN.match(tag).group(1))


def complete_record(folder: Path, tag: str) -> dict:
    """What complete.json holds for a tag whose files are all in `folder`: each one's size."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    return {"tag": tag, "files": files}


def named_tag(checkpoints: Path) -> str | None:
    """The tag that CHECKPOINTS/latest names, as written (not checked); None without that file."""
    latest = Path(checkpoints) / LATEST
    return latest.read_text().strip() if latest.is_file() else None


def check_not_a_run(folder: str | os.PathLike, flag: str, instead: str) -> None:
    """UsageError, naming what makes `folder` a training run, when it is one: a tool told to
    write its output there must never replace or mix into a run. `instead` says what to do."""
    entries = RunFolder(folder).run_entries()
    if entries:
        raise UsageError(f"{flag} {folder} is a training run (it holds {', '.join(entries)}): "
                         f"{instead}")


def describe_run_file(path: str | os.PathLike) -> str | None:
    """What `path` (existing or not) is among a training run's own files ("the metrics of training
    run runs/x", "a file of the final weights (final/) of training run runs/x"); None when it is
    none of them (a file a user put in a run's folder is not)."""
    path = Path(path)
    for depth, run in enumerate(list(path.parents)[:4]):
        folder = RunFolder(run)
        if not folder.run_entries():
            continue
        entry = run / path.relative_to(run).parts[0]
        what = folder.own_entries().get(entry)
        if what is None:
            return None
        return (f"{what} of training run {run}" if depth == 0 else
                f"a file of {what} ({entry.name}/) of training run {run}")
    return None


class RunFolder:
    """The paths of one run's out_dir, and the checks of its checkpoint tags."""

    def __init__(self, out_dir: str | os.PathLike):
        self.root = Path(out_dir)
        self.config_file = self.root / "config.yaml"
        self.config_changes_file = self.root / "config_changes.jsonl"
        self.metrics_file = self.root / "metrics.jsonl"
        self.wandb_id_file = self.root / "wandb_id"
        self.lock_file = self.root / "run.lock"
        self.rollbacks_file = self.root / "rollbacks.json"
        self.skipped_samples_file = self.root / "skipped_samples.json"
        self.final = self.root / "final"
        self.final_weights = self.final / WEIGHTS_FILE
        self.checkpoints = self.root / "checkpoints"
        self.latest_file = self.checkpoints / LATEST
        self.universal = self.checkpoints / "universal"
        self.samples = self.root / "samples"
        self.data_cache = self.root / "data_cache"
        self.previous = self.root / "previous"

    def own_entries(self) -> dict[Path, str]:
        """Every file and folder the trainer writes here, with what it is (for messages)."""
        return {self.config_file: "the config", self.config_changes_file: "the config changes",
                self.metrics_file: "the metrics", self.wandb_id_file: "the wandb run id",
                self.lock_file: "the lock", self.rollbacks_file: "the rollbacks",
                self.skipped_samples_file: "the skipped samples", self.final: "the final weights",
                self.checkpoints: "the checkpoints",
                self.samples: "the samples drawn while training",
                self.data_cache: "the data cache", self.previous: "the earlier runs set aside"}

    def run_entries(self) -> list[str]:
        """What the trainer writes here that makes this folder a run (config.yaml, metrics.jsonl,
        checkpoints/), those present: a tool asked to write here must refuse to replace it."""
        return [path.name + ("/" if path.is_dir() else "")
                for path in (self.config_file, self.metrics_file, self.checkpoints)
                if path.exists()]

    def samples_file(self, step: int) -> Path:
        """The round of samples drawn while training at `step` (trainer/training_samples.py)."""
        return self.samples / f"{tag_for(step)}.jsonl"

    def set_aside_folder(self, stamp: str) -> Path:
        """Where a start from step 0 moves what an earlier attempt left (trainer/out_dir.py)."""
        return self.previous / stamp

    def tag_dir(self, tag: str) -> Path:
        return self.checkpoints / tag

    def partial_dir(self, tag: str) -> Path:
        """Where a save of `tag` writes until it is complete."""
        return self.checkpoints / f"{tag}{PARTIAL}"

    def complete_file(self, tag: str) -> Path:
        return self.tag_dir(tag) / COMPLETE

    def tags(self) -> list[str]:
        """Every step_* folder (complete or not, never .partial), oldest first."""
        found = [p.name for p in self.checkpoints.glob("step_*") if TAG_PATTERN.match(p.name)]
        return sorted(found, key=step_of)

    def problem(self, tag: str) -> str | None:
        """Why `tag` is not a complete checkpoint (None when it is)."""
        folder = self.tag_dir(tag)
        if not folder.is_dir():
            return f"{folder} does not exist"
        try:
            record = json.loads(self.complete_file(tag).read_text())
        except FileNotFoundError:
            return f"{folder} has no {COMPLETE} (its save did not finish)"
        except (OSError, json.JSONDecodeError) as err:
            return f"{self.complete_file(tag)} is unreadable ({err})"
        for name, size in record["files"].items():
            path = folder / name
            if not path.is_file():
                return f"{path} is missing"
            if path.stat().st_size != size:
                return f"{path} has {path.stat().st_size} bytes, {size} were written"
        return None

    def resume_tag(self) -> tuple[str | None, str | None]:
        """(the tag to resume from, a warning when it is not the one `latest` names).

        None when there is nothing to resume; a UsageError when checkpoints exist and none is
        complete (starting over would overwrite the run's metrics)."""
        named = named_tag(self.checkpoints)
        complete = [tag for tag in reversed(self.tags()) if self.problem(tag) is None]
        if named is not None and self.problem(named) is None:
            return named, None
        if named is None and not complete:
            return None, None
        if not complete:
            raise UsageError(f"no complete checkpoint in {self.checkpoints} ({LATEST} names "
                             f"{named!r}: {self.problem(named)}): pass --start-over to set this "
                             f"run aside in {self.previous}/ and start from step 0")
        why = f"{LATEST} names {named!r}: {self.problem(named)}" if named else f"no {LATEST} file"
        return complete[0], f"{why}; resuming from {complete[0]}, the newest complete checkpoint"

    def latest_tag(self) -> str | None:
        """The tag a resume starts from (see resume_tag)."""
        return self.resume_tag()[0]
