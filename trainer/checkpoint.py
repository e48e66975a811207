"""The run's checkpoints: when to save, saves that are complete or absent, loading a tag back into
the run, consolidated weights (of each tag and of out_dir/final/), keep-last-K retention and the
checks that a tag can be resumed (Checkpointer, Progress).

Where a tag lives, when it is complete and which one `latest` means is the run folder's
(aogpt.run_folder). Besides its consolidated weights, a tag holds the trainer's own files:
    trainer_state.json          step, tokens, world size, model and run config, git SHA
    trainer_rank00000.pt ...    per rank: its EMA shard and RNG states
    mp_rank_00_model_states.pt  DeepSpeed's own files: module, optimizer partitions and
    *_optim_states.pt           client_state (loader position, bad-step rule, step, configs)

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
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed.comm as dist
import numpy as np
import torch

from aogpt import RunFailure, UsageError
from aogpt.files import (
    fsync_path,
    replace_folder,
    write_atomic,
    write_json_atomic,
    write_text_atomic,
)
from aogpt.model import save_consolidated
from aogpt.model.checkpoint import copy_consolidated, read_consolidated
from aogpt.model.config import ModelConfig
from aogpt.run_folder import (
    COMPLETE,
    PARTIAL,
    WEIGHTS_FILE,
    RunFolder,
    complete_record,
    step_of,
    tag_for,
)
from aogpt.trainer.config import RunConfig
from aogpt.trainer.dist_env import DistEnv
from aogpt.trainer.ds_config import zero_stage
from aogpt.trainer.ema import ShardedEMA, full_weights, load_full_ema
from aogpt.trainer.metrics import truncate_metrics

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


# The Checkpointer is the checkpoint folder's one writer: `latest` is written and tags are removed
# by the three functions below only (tests/trainer/test_loop.py scans the sources for another).


def commit_tag(run: RunFolder, tag: str) -> None:
    """Rank 0, after every rank has fsynced its files of run.partial_dir(tag): records them,
    renames the folder to `tag` and points `latest` at it, each step durable."""
    work, final = run.partial_dir(tag), run.tag_dir(tag)
    write_json_atomic(complete_record(work, tag), work / COMPLETE, durable=True)
    # over an incomplete tag of this step left by an earlier, interrupted run
    replace_folder(work, final, durable=True)
    write_text_atomic(run.latest_file, tag, durable=True)


def rewind_tags(run: RunFolder, before_step: int) -> str | None:
    """Rank 0: points `latest` at the newest complete tag saved before `before_step` and removes
    every tag after it, in that order (a kill in between leaves `latest` at a good tag); that
    tag, or None, with nothing changed, when there is none."""
    complete = [tag for tag in run.tags()
                if step_of(tag) < before_step and run.problem(tag) is None]
    if not complete:
        return None
    write_text_atomic(run.latest_file, complete[-1], durable=True)
    for later in run.tags():
        if step_of(later) > step_of(complete[-1]):
            shutil.rmtree(run.tag_dir(later))
    return complete[-1]


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


# ---- the run's checkpoints -----------------------------------------------------------------------


@dataclass
class Progress:
    """How far the run is: completed optimizer steps, and the tokens and samples they saw. Each
    step adds its own batch, so a run resumed with another train.tokens_per_step counts right."""

    step: int = 0
    tokens_seen: int = 0
    samples_seen: int = 0

    def advance(self, tokens: int, samples: int) -> None:
        self.step += 1
        self.tokens_seen += tokens
        self.samples_seen += samples

    @classmethod
    def of(cls, client_state: dict) -> Progress:
        return cls(*(client_state[name] for name in ("step", "tokens_seen", "samples_seen")))


class Checkpointer:
    """When to save, saving (complete or absent), loading a tag back into every part of the run,
    rewinding the folder for a rollback, and the consolidated weights of a tag and of
    out_dir/final/. It alone writes `latest` and removes tags.

    What else carries over a resume comes as `client` parts with state_dict()/load_state_dict()
    (the loader's position, the bad-step rule), saved in DeepSpeed's client state; each rank's own
    file holds its EMA shard and RNG states."""

    def __init__(self, cfg: RunConfig, env: DistEnv, engine, ema: ShardedEMA | None,
                 ds_config: dict, client: dict[str, Any], git_sha: str | None,
                 data_tokenizers: list[dict] | None = None,
                 host_group: torch.distributed.ProcessGroup | None = None):
        self.cfg, self.env, self.engine, self.ema = cfg, env, engine, ema
        self.host_group = host_group  # dist_env.host_group(): rank 0's folder decisions go over it
        self.ds_config, self.client, self.git_sha = ds_config, client, git_sha
        # what the training data's token ids mean (GPT-2, or which synthetic language): recorded
        # with the weights, so that a judge of another language is refused
        self.data_tokenizers = data_tokenizers or []
        self.run_folder = RunFolder(cfg.out_dir)

    def due(self, step: int, last: bool, preempted: bool) -> bool:
        """Whether `save` saves this step: every checkpoint.every steps, the last, a preemption."""
        return step % self.cfg.checkpoint.every == 0 or last or preempted

    def last_checkpoint(self) -> str:
        """The complete checkpoint a re-run resumes from, for messages."""
        tag = self.run_folder.latest_tag()
        return str(self.run_folder.tag_dir(tag)) if tag else "none yet"

    def run_meta(self, progress: Progress) -> dict:
        return {**dataclasses.asdict(progress), "git_sha": self.git_sha,
                "run_config": dataclasses.asdict(self.cfg), "data_tokenizers": self.data_tokenizers}

    # ---- saving ----------------------------------------------------------------------------------

    def save(self, progress: Progress, last: bool, preempted: bool) -> Path | None:
        """Collective, called after every step: when the step is due (see `due`), its tag,
        complete or absent; the tag's folder, or None when nothing was written (not due, or
        resumed from this very step). A failed write (a full disk) removes what it wrote and ends
        the run, naming the checkpoint still intact."""
        tag = tag_for(progress.step)
        if not self.due(progress.step, last, preempted) or self.run_folder.problem(tag) is None:
            return None
        work = self.run_folder.partial_dir(tag)
        if self.env.is_main and work.exists():
            shutil.rmtree(work)  # a save of this step that was interrupted earlier
        dist.barrier()
        try:
            self.write_tag(work, progress)
            for path in rank_files(work, self.env.rank):
                fsync_path(path)
        except OSError as err:
            if self.env.is_main:
                shutil.rmtree(work, ignore_errors=True)
            intact = self.run_folder.latest_tag()
            raise RunFailure(
                f"saving checkpoint {tag} failed ({err.strerror or err}): "
                + (f"{self.run_folder.tag_dir(intact)} is intact, free space and re-run to resume "
                   "from it" if intact else "no earlier checkpoint exists, free space and re-run")
            ) from None
        dist.barrier()  # every rank's files are on disk
        if self.env.is_main:
            commit_tag(self.run_folder, tag)
            prune_tags(self.run_folder, self.cfg.checkpoint.keep_last)
        dist.barrier()
        return self.run_folder.tag_dir(tag)

    def rewind(self, before_step: int) -> str | None:
        """Collective, a rollback's folder work: `latest` back to the newest complete tag saved
        before `before_step`, the tags after it removed (they may hold weights of the bad steps),
        as rank 0 does it; that tag, or None (nothing changed) when there is none. Loading it is
        `load`'s."""
        found = [rewind_tags(self.run_folder, before_step) if self.env.is_main else None]
        if self.host_group is not None:  # the others wait here for rank 0's folder work
            torch.distributed.broadcast_object_list(found, src=0, group=self.host_group)
        return found[0]

    def write_tag(self, folder: Path, progress: Progress) -> None:
        """Collective: every file of a checkpoint into `folder` (see the module's docstring)."""
        self.export(folder, progress)
        folder.mkdir(parents=True, exist_ok=True)
        rank_state = {"ema": self.ema.state_dict() if self.ema is not None else None,
                      "rng": rng_states()}
        save_torch_atomic(rank_state, rank_state_file(folder, self.env.rank))
        model_config = dataclasses.asdict(self.cfg.model)
        if self.env.is_main:
            write_json_atomic({**self.run_meta(progress), "world_size": self.env.world_size,
                               "zero_stage": zero_stage(self.ds_config),
                               "model_config": model_config}, folder / RUN_STATE)
        client_state = {**self.run_meta(progress), "model_config": model_config,
                        **{name: part.state_dict() for name, part in self.client.items()}}
        self.engine.save_checkpoint(str(folder.parent), tag=folder.name,
                                    client_state=client_state, save_latest=False)

    def export(self, folder: Path, progress: Progress) -> None:
        """Consolidated raw + EMA weights into `folder`, written by rank 0 (collective)."""
        raw = full_weights(self.engine, self.ema, use_ema=False, keep=self.env.is_main)
        ema = (full_weights(self.engine, self.ema, use_ema=True, keep=self.env.is_main)
               if self.ema is not None else None)
        if self.env.is_main:
            save_consolidated(folder, self.cfg.model, raw, ema, **self.run_meta(progress),
                              source="aogpt trainer")

    def publish_final(self, progress: Progress) -> None:
        """out_dir/final/: a copy of the last checkpoint's consolidated weights (collective only
        when that checkpoint is not of the current step and the weights must be gathered)."""
        saved = self.run_folder.tag_dir(tag_for(progress.step))
        if not (saved / WEIGHTS_FILE).is_file():
            self.export(self.run_folder.final, progress)
        elif self.env.is_main:
            copy_consolidated(saved, self.run_folder.final)

    # ---- loading ---------------------------------------------------------------------------------

    def load(self, tag: str, elastic: bool) -> Progress:
        """Collective: a complete tag back into the engine, the EMA, the client parts and the RNGs;
        elastic: written by another number of processes or ZeRO stage. The metrics after its step
        are dropped (logged by a run killed after its last checkpoint)."""
        folder = self.run_folder.tag_dir(tag)
        load_dir = self.universal_checkpoint(tag) if elastic else self.run_folder.checkpoints
        load_path, client = self.engine.load_checkpoint(str(load_dir), tag=tag)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {load_dir / tag}")
        if elastic:
            dist.barrier()  # every rank has read the universal form
            if self.env.is_main:
                shutil.rmtree(load_dir, ignore_errors=True)
        for name, part in self.client.items():
            part.load_state_dict(client.get(name))
        # another partitioning has other rank files: rank 0's carries what all ranks share
        rank_state = load_rank_state(rank_state_file(folder, 0 if elastic else self.env.rank))
        self.load_ema(folder, rank_state["ema"], elastic)
        # (elastically, each rank's RNG, used by dropout only, starts from the seed)
        if not elastic:
            restore_rng_states(rank_state["rng"])
        if self.env.is_main:
            truncate_metrics(self.run_folder.metrics_file, client["step"])
            print(f"resumed from {folder} at step {client['step']}", flush=True)
        return Progress.of(client)

    def load_ema(self, folder: Path, shard: dict | None, elastic: bool) -> None:
        if self.ema is None:
            return
        if shard is None:  # the run so far had ema.enabled=false
            self.ema.restart()
            if self.env.is_main:
                print("the checkpoint has no EMA: it starts now, from the resumed weights",
                      flush=True)
        elif elastic:  # the shard layout changed: reshard from the consolidated EMA
            ema = read_consolidated(folder, weights=("ema",))["weights"]["ema"]
            load_full_ema(self.ema, ema, shard["num_updates"])
        else:
            self.ema.load_state_dict(shard)

    def universal_checkpoint(self, tag: str) -> Path:
        """Rank 0 converts the tag with DeepSpeed's ds_to_universal; the folder to load from."""
        out = self.run_folder.universal
        if self.env.is_main:
            shutil.rmtree(out, ignore_errors=True)
            done = subprocess.run(
                [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                 "--input_folder", str(self.run_folder.tag_dir(tag)), "--output_folder",
                 str(out / tag), "--inject_missing_state",  # tags saved before this field existed
                 "--num_extract_workers", "2", "--num_merge_workers", "1"],
                capture_output=True, text=True)
            if done.returncode:
                lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
                raise RunFailure(f"converting {self.run_folder.tag_dir(tag)} to a universal "
                                 f"checkpoint failed: {lines[-1]}")
        dist.barrier()
        return out
