"""Streaming's shared memory on a host that several runs share: nothing of a live run is removed.

    python -m aogpt.data_prep.shared_memory     # removes the blocks of runs that are gone

MosaicML Streaming 0.13 gives every StreamingDataset a number, its prefix, and keeps the dataset's
state between the ranks and loader workers of a node in shared-memory blocks named
/dev/shm/<prefix:06>_<name> (locals, barrier, next_epoch, resume, ...), beside two lock files
<tmp>/<prefix:06>_{barrier,cache}_filelock. A new dataset takes a prefix none of whose blocks or
lock files exist (streaming/base/shared/prefix.py), and its local leader then creates that
prefix's `locals` block. On a host that runs more than one training (two experiments on one 8-GPU
node, a CPU job beside a GPU job) this goes wrong twice:
- a run killed with SIGKILL leaves its blocks behind, and streaming's remedy,
  clean_stale_shared_memory, unlinks every streaming block on the host with no owner check, the
  live runs' too: a dataset opened next can then take a live run's names, and each run's blocks
  are the other's to unlink (a relaunch died with FileNotFoundError '/000000_locals' beside a
  running training);
- two datasets that look for a prefix at the same moment find the same one, and one of them dies
  (FileExistsError '/000001_locals', mosaicml/streaming#884).

The remedy here keeps streaming's numbering and fixes both (the other choice, a prefix of our own
per run, would still leave a killed run's blocks behind for ever, and would need the other ranks
of a node to learn a number that streaming has them find by scanning):
- a block is removed only when no running process holds it. The kernel records the owners: every
  process that uses a block keeps a descriptor of it open (Python's SharedMemory keeps one, and
  its mmap a duplicate), listed in /proc/PID/fd. A prefix of which no block is held belongs to a
  dataset whose processes are all gone, and its blocks go (remove_dead_blocks). Its lock files
  stay, as streaming leaves them (the prefix is then not taken again): /tmp may be shared where
  /dev/shm is not (the nodes of slurm/dev/local_cluster.sh), and a lock file may be another
  node's. Processes outside this host's process namespace cannot be seen: containers that share
  /dev/shm but not their process ids must not share it with these commands;
- a dataset's local leader registers its prefix under a host-wide lock (registration), held from
  before its ranks look for a free prefix until the `locals` block that claims it exists, so two
  datasets never look at the same moment; dead runs' blocks are removed under the same lock first.
Every StreamingDataset opened through aogpt.data_prep.streaming_compat registers this way.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from torch import distributed as dist

SHM = Path("/dev/shm")
# the blocks of one dataset: streaming 0.13's SHM_TO_CLEAN (streaming/base/constant.py), written
# out so that this module needs no streaming (streaming_compat imports it to register datasets);
# tests/data_prep/test_shared_memory.py checks it against the installed streaming
BLOCK_NAMES = ("locals", "barrier", "next_epoch", "cache_usage", "shard_states",
               "shard_access_times", "resume", "epoch_shape", "epoch_data")
# <prefix>_<name>, as streaming.base.shared.prefix._get_path names them
STREAMING_BLOCK = re.compile(rf"(\d{{6,}})_({'|'.join(BLOCK_NAMES)})")
REGISTRATION_LOCK = "aogpt-streaming-registration.lock"
# A wait this long for the lock means a deadlock across nodes (two multi-node jobs sharing two
# nodes, each holding one node's lock while its ranks wait for the other's): go on without it.
LOCK_WAIT_S = 60.0


def lock_folder() -> Path:
    """Where the registration lock lives: beside the blocks, in the host's shared memory."""
    return SHM if SHM.is_dir() else Path(tempfile.gettempdir())


def held_files() -> set[str]:
    """The paths that running processes hold open (their /proc/PID/fd links), of the processes
    this user may look at (all of them for root; a block made by a user is readable by that user
    alone, so the others' processes cannot hold it)."""
    held = set()
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            descriptors = list((process / "fd").iterdir())
        except OSError:  # ended, or another user's
            continue
        for descriptor in descriptors:
            with contextlib.suppress(OSError):  # closed in the meantime
                held.add(os.readlink(descriptor))
    return held


@dataclass
class Sweep:
    """What remove_dead_blocks found, by prefix."""

    removed: dict[str, list[str]] = field(default_factory=dict)  # prefix -> file names
    in_use: list[str] = field(default_factory=list)
    not_ours: list[str] = field(default_factory=list)  # another user's, which we cannot remove

    def describe(self) -> str:
        removed = sum(len(names) for names in self.removed.values())
        parts = [f"removed {removed} blocks of {len(self.removed)} streaming datasets whose "
                 f"processes are gone ({', '.join(self.removed)})" if self.removed else
                 "no streaming shared memory of a dataset whose processes are gone"]
        if self.in_use:
            parts.append(f"left {len(self.in_use)} in use alone ({', '.join(self.in_use)})")
        if self.not_ours:
            parts.append(f"{len(self.not_ours)} of another user ({', '.join(self.not_ours)})")
        return "; ".join(parts)


def streaming_blocks() -> dict[str, list[Path]]:
    """Streaming's shared-memory blocks in /dev/shm, by prefix."""
    found: dict[str, list[Path]] = {}
    with contextlib.suppress(OSError):
        for path in SHM.iterdir():
            match = STREAMING_BLOCK.fullmatch(path.name)
            if match:
                found.setdefault(match[1], []).append(path)
    return found


def remove_dead_blocks() -> Sweep:
    """Removes the blocks of every streaming prefix that no running process holds (see the
    module's docstring). Call it under `registration`'s lock, or a dataset being registered at
    that moment could lose its first block."""
    sweep, held = Sweep(), held_files()
    for prefix, paths in sorted(streaming_blocks().items()):
        if any(str(path) in held for path in paths):
            sweep.in_use.append(prefix)
            continue
        removed = []
        for path in paths:
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:
                pass
            except PermissionError:
                sweep.not_ours.append(prefix)
                break
        if removed:
            sweep.removed[prefix] = removed
    return sweep


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """The host's registration lock, held for the block. One not had within LOCK_WAIT_S is gone
    without, with a warning: the block then runs as it would with streaming alone."""
    path = lock_folder() / REGISTRATION_LOCK
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):  # every user's datasets take the same lock
            os.fchmod(fd, 0o666)
        deadline = time.monotonic() + LOCK_WAIT_S
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                print(f"warning: {path} has been held for {LOCK_WAIT_S:.0f} s: registering a "
                      "streaming dataset without it", file=sys.stderr, flush=True)
                break
            time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # releases the lock


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def registration(is_local_leader: bool) -> Iterator[None]:
    """Around streaming's get_shm_prefix (collective, as it is): the node's local leader holds the
    host lock, removes what dead runs left, and only then do the node's ranks look for a free
    prefix; the lock goes once the leader has created the prefix's first block."""
    with host_lock() if is_local_leader else contextlib.nullcontext():
        if is_local_leader:
            remove_dead_blocks()
        _barrier()
        yield
