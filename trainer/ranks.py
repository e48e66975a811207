"""Work spread over the ranks of a launch (torchrun, deepspeed or srun; one node or many), merged
back in its one-process order: what trainer/sample.py, trainer/genppl.py and the sampling race
use to draw and judge their samples on every process a job has.

    share = RankShare.join()               # a world of one without a launcher
    mine = share.mine(batches)             # batches rank, rank + W, rank + 2W, ...
    done = share.gather([work(b) for b in mine])   # rank 0: every batch's result, in order
    if share.is_main: ...                  # the others get None

The items are whole batches, the ones one process would make: a sample's tokens depend only on
its id (its randomness is keyed by it, model/orders.py), and a batch's only on its samples, so
each batch's result, and the merged list, are the one-process run's, byte for byte. Results
travel as Python objects over a gloo group (host memory only: a GPU launch gathers the same way).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from aogpt import UsageError
from aogpt.trainer.dist_env import DistEnv, setup_distributed_env

T = TypeVar("T")

# a rank waits for the others' share at the gather: as long as the slowest share takes
GATHER_TIMEOUT = timedelta(hours=6)


@dataclass(frozen=True)
class RankShare:
    env: DistEnv

    @classmethod
    def join(cls) -> RankShare:
        """This process's place in its launch, with the process group the gathers use (none in a
        world of one)."""
        variables = dict(os.environ)
        env = setup_distributed_env(variables)
        if env.world_size > 1:
            # a launched process: the group meets through them (srun's mapped to torch's names)
            os.environ.update(variables)
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=GATHER_TIMEOUT)
                # left at exit, each rank on its own (no collective: the others may still be
                # writing): a process that ends with gloo's threads alive can abort ("terminate
                # called without an active exception") though its work is done
                atexit.register(leave_process_group)
        # a world of one leaves the environment as it found it: a launch started later from this
        # process (a test's, a notebook's) must not inherit WORLD_SIZE=1 and LOCAL_WORLD_SIZE=1
        return cls(env)

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def world_size(self) -> int:
        return self.env.world_size

    def checked(self, check: Callable[[], T]) -> T:
        """check()'s result; a UsageError it raises (every rank meets the same one) is said by
        rank 0 alone, the others exit with status 2 without a word."""
        try:
            return check()
        except UsageError:
            if self.is_main:
                raise
            raise SystemExit(2) from None

    def mine(self, items: list) -> list:
        """This rank's items: rank, rank + world_size, ..."""
        return items[self.env.rank::self.env.world_size]

    def agree(self, value: Any) -> Any:
        """Rank 0's value, on every rank (a decision one rank makes for all). Collective."""
        if self.env.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, results: list[Any]) -> list[Any] | None:
        """Rank 0: the results of every rank's mine(items), in the items' order; other ranks:
        None. Collective: every rank calls it once per spread."""
        world = self.env.world_size
        if world == 1:
            return results
        parts = [None] * world if self.is_main else None
        dist.gather_object(results, parts, dst=0)
        if not self.is_main:
            return None
        total = sum(len(part) for part in parts)
        return [parts[k % world][k // world] for k in range(total)]


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
