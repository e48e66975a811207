"""Checkpoint layout, atomic saves with a `latest` pointer, keep-last-K retention, preemption.

    out_dir/checkpoints/
        latest                          the newest complete tag (DeepSpeed writes it last)
        step_00001000/
            model.pt                    consolidated raw + EMA weights (aogpt.model.load_checkpoint)
            trainer_state.json          step, tokens, world size, model and run config, git SHA
            trainer_rank00000.pt ...    per rank: its EMA shard and RNG states
            mp_rank_00_model_states.pt  DeepSpeed's own files: module, optimizer partitions and
            *_optim_states.pt           client_state (loader position, step, configs)

A save writes everything of the tag first and DeepSpeed's `latest` last (after its commit), so
`latest` never names a half-written tag; an interrupted save leaves a stray folder that the next
save of that step replaces and that retention deletes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import torch

from aogpt import UsageError
from aogpt.model.config import ModelConfig

LATEST = "latest"
TAG_PATTERN = re.compile(r"step_(\d+)$")
RUN_STATE = "trainer_state.json"
EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after a checkpoint, re-run to resume

# ModelConfig fields that may change between a run and its resumption: they do not change the
# weights' shapes or meaning (kernels, memory savers, dropout, how the weights were initialized).
RESUMABLE_MODEL_FIELDS = {"attn_impl", "activation_checkpointing", "loss_chunk_size", "dropout",
                          "init", "init_std", "adaln_zero_init"}


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def rank_state_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"trainer_rank{rank:05d}.pt"


class CheckpointDir:
    def __init__(self, out_dir: str | os.PathLike):
        self.root = Path(out_dir) / "checkpoints"

    def latest_tag(self) -> str | None:
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        tag = pointer.read_text().strip()
        if not (self.root / tag).is_dir():
            raise UsageError(f"{pointer} names {tag!r}, which is not in {self.root}: "
                             "point it at an existing step_* folder or delete it to start over")
        return tag

    def run_state(self, tag: str) -> dict:
        path = self.root / tag / RUN_STATE
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UsageError(f"checkpoint {self.root / tag} is unreadable ({err}): point "
                             f"{self.root / LATEST} at an older step_* folder") from None

    def tags(self) -> list[str]:
        """Every step_* folder, oldest first."""
        found = [p.name for p in self.root.glob("step_*") if TAG_PATTERN.match(p.name)]
        return sorted(found, key=lambda tag: int(TAG_PATTERN.match(tag).group(1)))

    def prune(self, keep_last: int) -> None:
        """Deletes all but the newest `keep_last` tags up to `latest` (rank 0, after a save)."""
        latest = self.latest_tag()
        if latest is None:
            return
        step_of = {tag: int(TAG_PATTERN.match(tag).group(1)) for tag in self.tags()}
        committed = [tag for tag in step_of if step_of[tag] <= step_of.get(latest, -1)]
        keep = set(committed[-keep_last:])
        for tag in step_of:
            if tag not in keep:
                shutil.rmtree(self.root / tag, ignore_errors=True)


def check_resumable(state: dict, cfg_model: ModelConfig, world_size: int, zero_stage: int,
                    where: Path) -> None:
    """UsageError if this run cannot continue the checkpoint described by `state`."""
    saved = state["model_config"]
    current = dataclasses.asdict(cfg_model)
    differing = [f"{name} {saved.get(name)!r} -> {current[name]!r}" for name in current
                 if name not in RESUMABLE_MODEL_FIELDS and saved.get(name) != current[name]]
    if differing:
        raise UsageError(f"the checkpoint in {where} has another model shape: "
                         f"{', '.join('model.' + d for d in differing)}: use another out_dir or "
                         "the checkpoint's model settings")
    if state["world_size"] != world_size or state["zero_stage"] != zero_stage:
        raise UsageError(
            f"the checkpoint in {where} was written by {state['world_size']} processes under "
            f"ZeRO-{state['zero_stage']}, this run has {world_size} under ZeRO-{zero_stage}: resume "
            "with the same world size and stage (or convert it with DeepSpeed's ds_to_universal.py)"
        )


def rng_states() -> dict:
    states = {"python": random.getstate(), "numpy": np.random.get_state(),
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def save_torch_atomic(obj, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save(obj, partial)
    partial.replace(path)


def write_json_atomic(obj: dict, path: Path) -> None:
    """Strict JSON (no NaN) at `path`, never half-written: a temp file in its folder, renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    partial.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")
    os.replace(partial, path)


def git_sha() -> str | None:
    """The commit of this code ("+dirty" with uncommitted changes); None outside a git checkout."""
    repo = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


class PreemptionFlag:
    """Set by SIGTERM/SIGUSR1; the training loop saves at the next step boundary and exits."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received: str | None = None
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        # Only a flag: saving needs every rank at the same point, which a handler cannot ensure.
        self.received = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.received is not None
