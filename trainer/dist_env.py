"""Who this process is, whatever launched it: deepspeed, torchrun, srun, or plain python.

    deepspeed launcher   sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, MASTER_ADDR/PORT, but not
                         LOCAL_WORLD_SIZE, which streaming needs to count nodes: copied here
    torchrun             sets everything
    srun (no launcher)   sets only SLURM_*: mapped to the torch names when RANK is unset;
                         MASTER_ADDR and MASTER_PORT must then be exported by the job script
    plain python         a world of one on 127.0.0.1 and a free port

Each process takes the GPU at its LOCAL_RANK when it sees all of the node's, or the only one it
sees when the launcher gave it one (srun --gpus-per-task=1): see local_gpu_index.

Nothing here loads DeepSpeed but init_process_group (the trainer's): evaluate.py, the benchmarks
and the tools read their rank here without paying its import (seconds) or needing it to work.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch

from aogpt import UsageError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            index = local_gpu_index(self.local_rank, self.local_world_size,
                                    torch.cuda.device_count(),
                                    os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
            return torch.device("cuda", index)
        return torch.device("cpu")


def local_gpu_index(local_rank: int, local_world_size: int, device_count: int,
                    visible_devices: str = "unset") -> int:
    """The CUDA device this process trains on, from what the launcher gave it.

    torchrun, deepspeed and `srun --gpus-per-node` show every process all of the node's GPUs: it
    takes the one at its LOCAL_RANK. `srun --gpus-per-task=1` (or one GPU in CUDA_VISIBLE_DEVICES)
    shows each process only its own: device 0. Anything else cannot be mapped one GPU per process.
    visible_devices (CUDA_VISIBLE_DEVICES) only goes into the error message.
    """
    if local_rank < device_count and device_count >= local_world_size:
        return local_rank
    if device_count == 1:
        return 0
    raise UsageError(
        f"LOCAL_RANK {local_rank} of {local_world_size} processes on this node, but this process "
        f"sees {device_count} GPUs (CUDA_VISIBLE_DEVICES={visible_devices}): give each task one "
        "GPU (srun --gpus-per-task=1) or all of the node's"
    )


def setup_distributed_env(environ: os._Environ | dict | None = None) -> DistEnv:
    """Fills in RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/MASTER_* in `environ` (default
    os.environ)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        _map_slurm(env)
    if "RANK" not in env:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    if env.get("WORLD_SIZE") == "1":  # nobody to meet: any free local port will do
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(free_port()))
    if "LOCAL_WORLD_SIZE" not in env:
        if "LOCAL_SIZE" in env:  # the deepspeed launcher's name for it
            env["LOCAL_WORLD_SIZE"] = env["LOCAL_SIZE"]
        elif env.get("WORLD_SIZE") == "1":
            env["LOCAL_WORLD_SIZE"] = "1"
        else:
            raise UsageError("LOCAL_WORLD_SIZE is not set (processes per node, needed by the data "
                             "loader): launch with deepspeed, torchrun or srun, or export it")
    env.setdefault("LOCAL_RANK", "0")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in env]
    if missing:
        raise UsageError(f"{' and '.join(missing)} not set: export the address and a free port of "
                         "the first node (e.g. MASTER_ADDR=$(scontrol show hostnames | head -n1))")
    try:
        dist_env = DistEnv(rank=int(env["RANK"]), local_rank=int(env["LOCAL_RANK"]),
                           world_size=int(env["WORLD_SIZE"]),
                           local_world_size=int(env["LOCAL_WORLD_SIZE"]))
    except (KeyError, ValueError) as err:
        raise UsageError(f"bad distributed environment variable: {err}") from None
    if not 0 <= dist_env.rank < dist_env.world_size:
        raise UsageError(f"RANK={dist_env.rank} is outside WORLD_SIZE={dist_env.world_size}")
    return dist_env


def _map_slurm(env) -> None:
    env["RANK"] = env["SLURM_PROCID"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["WORLD_SIZE"] = env.get("SLURM_NTASKS", "1")
    # SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; SLURM_TASKS_PER_NODE is always
    # there but compressed ("8(x2)" = 8 on each of 2 nodes).
    per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
    env["LOCAL_WORLD_SIZE"] = re.match(r"\d+", per_node).group(0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_process_group(timeout_s: float) -> None:
    """The process group, every collective of which fails after timeout_s instead of waiting
    forever for a dead or hung rank: the default group, and the groups DeepSpeed creates later
    with new_group(), which would otherwise take torch's default (30 minutes, 10 for NCCL)."""
    timeout = timedelta(seconds=timeout_s)
    c10d = torch.distributed.distributed_c10d
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    import deepspeed  # the trainer's engine; loaded only by the process that trains

    from aogpt.trainer import lean_start

    lean_start.skip_unused_costs(deepspeed)
    deepspeed.init_distributed(timeout=timeout)


def all_reduce_sum(values: list[float] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum over ranks of a small vector (float64 so that token counts stay exact). Collective,
    over the default group (DeepSpeed's too: deepspeed.comm is torch.distributed underneath)."""
    tensor = torch.as_tensor(values, dtype=torch.float64, device=device).clone()
    torch.distributed.all_reduce(tensor)
    return tensor


def host_group() -> torch.distributed.ProcessGroup | None:
    """A gloo group over all ranks for host values (a signal received): agreeing on them over it
    never waits for a GPU, as a collective over NCCL would. None in a world of one.
    Collective: every rank calls it, at the same point."""
    if torch.distributed.get_world_size() == 1:
        return None
    return torch.distributed.new_group(backend="gloo")


def any_rank(flag: bool, group: torch.distributed.ProcessGroup | None) -> bool:
    """Whether `flag` is set on any rank: an all-reduce of a host tensor over host_group()."""
    if group is None:
        return flag
    value = torch.tensor([float(flag)])  # on the host whatever the training device
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=group)
    return value.item() > 0
