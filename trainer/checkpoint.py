"""Checkpoint saves that are complete or absent, keep-last-K retention, resume checks.

Where a tag lives, when it is complete and which one `latest` means is the run folder's
(aogpt.model.run_folder). Besides its consolidated weights, a tag holds the trainer's own files:
    trainer_state.json          step, tokens, world size, model and run config, git SHA
    trainer_rank00000.pt ...    per rank: its EMA shard and RNG states
    mp_rank_00_model_states.pt  DeepSpeed's own files: module, optimizer partitions and
    *_optim_states.pt           client_state (loader position, step, configs)

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
from pathlib import Path

import numpy as np
import torch

from aogpt import UsageError
from aogpt.files import fsync_path, write_atomic, write_json_atomic, write_text_atomic
from aogpt.model.config import ModelConfig
from aogpt.model.run_folder import COMPLETE, PARTIAL, RunFolder, complete_record, step_of

RUN_STATE = "trainer_state.json"

# ModelConfig fields that may change between a run and its resumption: they do not change the
# weights' shapes or meaning (kernels, memory savers, dropout, how the weights were initialized).
RESUMABLE_MODEL_FIELDS = {"attn_impl", "activation_checkpointing", "loss_chunk_size", "dropout",
                          "init", "init_std", "adaln_zero_init"}


def rank_state_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"trainer_rank{rank:05d}.pt"


def rank_files(tag_dir: Path, rank: int) -> list[Path]:
    """The files of a tag that `rank` writes: its own per-rank files (DeepSpeed's
    *zero_pp_rank_R_* and ours), and for rank 0 also every file that belongs to no rank."""
    own = re.compile(rf"(^|_)pp_rank_{rank}_|^trainer_rank{rank:05d}\.pt$")
    anyone = re.compile(r"(^|_)pp_rank_\d+_|^trainer_rank\d+\.pt$")
    return sorted(p for p in tag_dir.iterdir() if p.is_file() and (
        own.search(p.name) or (rank == 0 and not anyone.search(p.name))))


def read_run_state(run: RunFolder, tag: str) -> dict:
    """The trainer_state.json of a complete tag; a UsageError when it cannot be read."""
    try:
        return json.loads((run.tag_dir(tag) / RUN_STATE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(f"checkpoint {run.tag_dir(tag)} is unreadable ({err}): point "
                         f"{run.latest_file} at an older step_* folder") from None


def commit_tag(run: RunFolder, tag: str) -> None:
    """Rank 0, after every rank has fsynced its files of run.partial_dir(tag): records them,
    renames the folder to `tag` and points `latest` at it, each step durable."""
    work, final = run.partial_dir(tag), run.tag_dir(tag)
    write_json_atomic(complete_record(work, tag), work / COMPLETE, durable=True)
    if final.exists():  # an incomplete tag of this step from an earlier, interrupted run
        shutil.rmtree(final)
    os.replace(work, final)
    fsync_path(run.checkpoints)
    write_text_atomic(run.latest_file, tag, durable=True)


def prune_tags(run: RunFolder, keep_last: int) -> None:
    """Rank 0, after a save: keeps the newest `keep_last` complete tags up to `latest` (and any
    complete one after it); deletes older ones, incomplete tags and the leftovers of
    interrupted saves."""
    latest = run.latest_tag()
    if latest is None:
        return
    tags = run.tags()
    complete = [tag for tag in tags if run.problem(tag) is None]
    up_to_latest = [tag for tag in complete if step_of(tag) <= step_of(latest)]
    keep = set(up_to_latest[-keep_last:]) | {latest} | {
        tag for tag in complete if step_of(tag) > step_of(latest)}
    for tag in tags:
        if tag not in keep:
            shutil.rmtree(run.tag_dir(tag), ignore_errors=True)
    for leftover in run.checkpoints.glob(f"*{PARTIAL}"):
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


# The only globals a rank-state file holds besides torch's own are numpy's (np.random.get_state's
# key array), so it loads with torch.load(weights_only=True) and nothing else can be unpickled.
_NUMPY_ARRAY_GLOBALS = [np.zeros(1).__reduce__()[0],  # numpy's _reconstruct, wherever it lives
                        np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_rank_state(path: Path) -> dict:
    """A rank's EMA shard and RNG states, as written by the trainer (see rank_state_file)."""
    with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
        return torch.load(path, weights_only=True)


def save_torch_atomic(obj, path: Path) -> None:
    write_atomic(path, lambda partial: torch.save(obj, partial))
