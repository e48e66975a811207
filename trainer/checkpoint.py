"""Checkpoint layout, saves that are complete or absent, keep-last-K retention, preemption.

    out_dir/checkpoints/
        latest                          the newest complete tag, written last
        step_00001000/
            model.safetensors           consolidated raw + EMA weights (aogpt.model.load_checkpoint)
            model.json                  their model config and run metadata, readable
            trainer_state.json          step, tokens, world size, model and run config, git SHA
            trainer_rank00000.pt ...    per rank: its EMA shard and RNG states
            mp_rank_00_model_states.pt  DeepSpeed's own files: module, optimizer partitions and
            *_optim_states.pt           client_state (loader position, step, configs)
            complete.json               every file above with its size, written last

A save writes the tag into step_X.partial/. Every rank fsyncs the files it wrote; after a
barrier rank 0 records the files and their sizes in complete.json, renames the folder to step_X
and replaces `latest` (each step durable: fsync, rename, fsync of the folder). A node lost
at any moment leaves either the new complete tag or the previous one, plus a .partial folder
that the next save or retention removes. DeepSpeed's own `latest` is not used: it is written by
rank 0 before the other ranks have finished their files.

Resuming takes the tag `latest` names if complete.json matches its files, and otherwise the
newest tag that is complete, saying what was wrong with the other. On another number of
processes or another ZeRO stage, the tag is first converted to DeepSpeed's universal checkpoint
(checkpoints/universal/, removed once loaded), whose per-parameter fp32 weights and Adam moments
any partitioning can load; the EMA is resharded from the tag's consolidated model.safetensors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import torch

from aogpt import UsageError
from aogpt.files import fsync_path, write_atomic, write_json_atomic, write_text_atomic
from aogpt.model.config import ModelConfig

LATEST = "latest"
TAG_PATTERN = re.compile(r"step_(\d+)$")
RUN_STATE = "trainer_state.json"
COMPLETE = "complete.json"
PARTIAL = ".partial"
EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal after a checkpoint, re-run to resume

# ModelConfig fields that may change between a run and its resumption: they do not change the
# weights' shapes or meaning (kernels, memory savers, dropout, how the weights were initialized).
RESUMABLE_MODEL_FIELDS = {"attn_impl", "activation_checkpointing", "loss_chunk_size", "dropout",
                          "init", "init_std", "adaln_zero_init"}


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def rank_state_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"trainer_rank{rank:05d}.pt"


def rank_files(tag_dir: Path, rank: int) -> list[Path]:
    """The files of a tag that `rank` writes: its own per-rank files (DeepSpeed's
    *zero_pp_rank_R_* and ours), and for rank 0 also every file that belongs to no rank."""
    own = re.compile(rf"(^|_)pp_rank_{rank}_|^trainer_rank{rank:05d}\.pt$")
    anyone = re.compile(r"(^|_)pp_rank_\d+_|^trainer_rank\d+\.pt$")
    return sorted(p for p in tag_dir.iterdir() if p.is_file() and (
        own.search(p.name) or (rank == 0 and not anyone.search(p.name))))


class CheckpointDir:
    def __init__(self, out_dir: str | os.PathLike):
        self.root = Path(out_dir) / "checkpoints"

    # ---- reading --------------------------------------------------------------------------------

    def problem(self, tag: str) -> str | None:
        """Why `tag` is not a complete checkpoint (None when it is)."""
        folder = self.root / tag
        if not folder.is_dir():
            return f"{folder} does not exist"
        try:
            record = json.loads((folder / COMPLETE).read_text())
        except FileNotFoundError:
            return f"{folder} has no {COMPLETE} (its save did not finish)"
        except (OSError, json.JSONDecodeError) as err:
            return f"{folder / COMPLETE} is unreadable ({err})"
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
        pointer = self.root / LATEST
        named = pointer.read_text().strip() if pointer.is_file() else None
        complete = [tag for tag in reversed(self.tags()) if self.problem(tag) is None]
        if named is not None and self.problem(named) is None:
            return named, None
        if named is None and not complete:
            return None, None
        if not complete:
            raise UsageError(f"no complete checkpoint in {self.root} ({LATEST} names {named!r}: "
                             f"{self.problem(named)}): delete {self.root} to start over")
        why = f"{LATEST} names {named!r}: {self.problem(named)}" if named else f"no {LATEST} file"
        return complete[0], f"{why}; resuming from {complete[0]}, the newest complete checkpoint"

    def latest_tag(self) -> str | None:
        """The tag a resume starts from (see resume_tag)."""
        return self.resume_tag()[0]

    def run_state(self, tag: str) -> dict:
        path = self.root / tag / RUN_STATE
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UsageError(f"checkpoint {self.root / tag} is unreadable ({err}): point "
                             f"{self.root / LATEST} at an older step_* folder") from None

    def tags(self) -> list[str]:
        """Every step_* folder (complete or not, never .partial), oldest first."""
        found = [p.name for p in self.root.glob("step_*") if TAG_PATTERN.match(p.name)]
        return sorted(found, key=lambda tag: int(TAG_PATTERN.match(tag).group(1)))

    # ---- writing --------------------------------------------------------------------------------

    def partial_dir(self, tag: str) -> Path:
        """Where a save of `tag` writes until it is complete."""
        return self.root / f"{tag}{PARTIAL}"

    def commit(self, tag: str) -> None:
        """Rank 0, after every rank has fsynced its files of partial_dir(tag): records them,
        renames the folder to `tag` and points `latest` at it, each step durable."""
        work, final = self.partial_dir(tag), self.root / tag
        files = {p.name: p.stat().st_size for p in sorted(work.iterdir()) if p.is_file()}
        write_json_atomic({"tag": tag, "files": files}, work / COMPLETE, durable=True)
        if final.exists():  # an incomplete tag of this step from an earlier, interrupted run
            shutil.rmtree(final)
        os.replace(work, final)
        fsync_path(self.root)
        write_text_atomic(self.root / LATEST, tag, durable=True)

    def prune(self, keep_last: int) -> None:
        """Rank 0, after a save: keeps the newest `keep_last` complete tags up to `latest` (and
        any complete one after it); deletes older ones, incomplete tags and the leftovers of
        interrupted saves."""
        latest = self.latest_tag()
        if latest is None:
            return
        step_of = {tag: int(TAG_PATTERN.match(tag).group(1)) for tag in self.tags()}
        complete = [tag for tag in step_of if self.problem(tag) is None]
        up_to_latest = [tag for tag in complete if step_of[tag] <= step_of[latest]]
        keep = set(up_to_latest[-keep_last:]) | {latest} | {
            tag for tag in complete if step_of[tag] > step_of[latest]}
        for tag in step_of:
            if tag not in keep:
                shutil.rmtree(self.root / tag, ignore_errors=True)
        for leftover in self.root.glob(f"*{PARTIAL}"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def check_resumable(state: dict, cfg_model: ModelConfig, world_size: int, zero_stage: int,
                    where: Path) -> bool:
    """Whether this run continues the checkpoint described by `state` elastically (on another
    number of processes or ZeRO stage: through a universal checkpoint, see trainer/loop.py);
    UsageError if it cannot continue it at all (another model shape)."""
    saved = state["model_config"]
    current = dataclasses.asdict(cfg_model)
    differing = [f"{name} {saved.get(name)!r} -> {current[name]!r}" for name in current
                 if name not in RESUMABLE_MODEL_FIELDS and saved.get(name) != current[name]]
    if differing:
        raise UsageError(f"the checkpoint in {where} has another model shape: "
                         f"{', '.join('model.' + d for d in differing)}: use another out_dir or "
                         "the checkpoint's model settings")
    return state["world_size"] != world_size or state["zero_stage"] != zero_stage


def universal_dir(root: Path) -> Path:
    """Where an elastic resume converts a tag to DeepSpeed's universal form (deleted after it)."""
    return root / "universal"


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
    write_atomic(path, lambda partial: torch.save(obj, partial))


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
