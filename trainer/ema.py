"""An fp32 exponential moving average of the weights, sharded exactly like ZeRO's fp32 master copy.

Every ZeRO stage keeps the fp32 master weights as a few flat tensors per rank, each rank
holding only its own partition. The EMA keeps one fp32 tensor of the same shape next to each of
them, so an update is a single `torch._foreach_lerp_` over a handful of flat tensors: no gather,
no per-parameter Python loop, the same cost and memory split under ZeRO-1, 2 and 3. The flat
tensors are found on the DeepSpeed optimizer (names checked against DeepSpeed 0.19):

    ZeRO-1/2                     DeepSpeedZeroOptimizer.single_partition_of_fp32_groups
    ZeRO-1 + bf16, fp32 accum    BF16_Optimizer.fp32_groups_flat_partition
    ZeRO-3                       DeepSpeedZeroOptimizer_Stage3.fp32_partitioned_groups_flat

Full EMA weights (for evaluation and export) are assembled with DeepSpeed's own gather,
`safe_get_full_fp32_param`, after briefly swapping the EMA into the master partition; the
swap is undone before training continues. Decay follows SEDD's EMA (which the paper copied):
d_n = min(decay, (1 + n) / (10 + n)) where n counts updates, starting at 1 for the first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

from aogpt import UsageError

MASTER_PARTITION_ATTRIBUTES = (
    "single_partition_of_fp32_groups",
    "fp32_groups_flat_partition",
    "fp32_partitioned_groups_flat",
)


def master_partitions(ds_optimizer) -> list[torch.Tensor]:
    """This rank's flat fp32 master tensors on a DeepSpeed ZeRO optimizer."""
    for name in MASTER_PARTITION_ATTRIBUTES:
        partitions = getattr(ds_optimizer, name, None)
        if partitions:
            return list(partitions)
    raise TypeError(f"{type(ds_optimizer).__name__} keeps no fp32 master partition that the EMA "
                    f"knows ({', '.join(MASTER_PARTITION_ATTRIBUTES)}): is ZeRO enabled?")


class ShardedEMA:
    def __init__(self, engine, decay: float):
        self.engine = engine
        self.decay = decay
        self.num_updates = 0
        self.master = master_partitions(engine.optimizer)
        self.shadow = [t.detach().clone() for t in self.master]
        self.fused = False  # updated by the optimizer's step (fuse_into)

    @torch.no_grad()
    def restart(self) -> None:
        """Starts the average afresh from the current weights (a resume from a checkpoint saved
        without an EMA)."""
        torch._foreach_copy_(self.shadow, self.master)
        self.num_updates = 0

    def current_decay(self) -> float:
        return self.decay_at(self.num_updates)

    def decay_at(self, update: int) -> float:
        """The decay of the update-th update (counted from 1)."""
        return min(self.decay, (1 + update) / (10 + update))

    @torch.no_grad()
    def update(self) -> None:
        """Call after every optimizer step: shadow <- shadow + (1 - d) (master - shadow)."""
        self.num_updates += 1
        if not self.fused:  # else the optimizer's step averaged already (fuse_into)
            torch._foreach_lerp_(self.shadow, self.master, 1.0 - self.current_decay())

    def fuse_into(self, optimizer: torch.optim.Optimizer) -> None:
        """The average updated inside `optimizer`'s step, whose parameters are the master
        partitions: its update and the lerp compiled together, one pass over each partition
        instead of two (speed.fused_optimizer_ema). DeepSpeed's ZeRO-1/2 step the optimizer one
        parameter group at a time: each call averages the partitions of the groups it holds, with
        the weight of the update to come (1 - d, a device tensor filled each call, so that the
        compiled function never recompiles); update() then only counts."""
        index = {id(t): n for n, t in enumerate(self.master)}
        if {id(p) for group in optimizer.param_groups for p in group["params"]} != set(index):
            raise TypeError("the optimizer's parameters are not the EMA's master partitions")
        plain_step = optimizer.step
        weight = torch.zeros((), device=self.master[0].device)

        @torch.compile(dynamic=False)
        def step_and_average(shadow: list[torch.Tensor], master: list[torch.Tensor]) -> None:
            plain_step()
            with torch.no_grad():  # shadow + weight (master - shadow), as lerp for weight < 0.5
                torch._foreach_add_(shadow, torch._foreach_mul(
                    torch._foreach_sub(master, shadow), weight))

        def step(closure=None) -> None:
            held = [index[id(p)] for group in optimizer.param_groups for p in group["params"]]
            weight.fill_(1.0 - self.decay_at(self.num_updates + 1))
            step_and_average([self.shadow[n] for n in held], [self.master[n] for n in held])

        optimizer.step = step
        self.fused = True

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside, the fp32 master partition holds the EMA (the bf16 working copy is untouched)."""
        with torch.no_grad():
            saved = [t.clone() for t in self.master]
            torch._foreach_copy_(self.master, self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.master, saved)

    def state_dict(self) -> dict:
        """This rank's shard: save one per rank."""
        return {"num_updates": self.num_updates, "decay": self.decay,
                "shadow": [t.detach().cpu() for t in self.shadow]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        shapes = [tuple(t.shape) for t in state["shadow"]]
        expected = [tuple(t.shape) for t in self.shadow]
        if shapes != expected:
            raise UsageError(f"the EMA shard in the checkpoint has shapes {shapes}, this run's "
                             f"partition has {expected}: resume with the same world size and "
                             "ZeRO stage as the run that wrote it")
        for shadow, saved in zip(self.shadow, state["shadow"], strict=True):
            shadow.copy_(saved)
        self.num_updates = state["num_updates"]


@torch.no_grad()
def load_full_ema(ema: ShardedEMA, weights: dict[str, torch.Tensor], num_updates: int) -> None:
    """Fills `ema` from full (consolidated) EMA weights, whatever partitioning wrote them: each
    weight is scattered into the master partition with DeepSpeed's own setter, the partition is
    copied into the shadow, and the master weights are put back. Collective."""
    saved = [t.clone() for t in ema.master]
    for name, param in ema.engine.module.named_parameters():
        safe_set_full_fp32_param(param, weights[name].to(param.device))
    torch._foreach_copy_(ema.shadow, ema.master)
    torch._foreach_copy_(ema.master, saved)
    ema.num_updates = num_updates


@torch.no_grad()
def gather_full_weights(engine, keep: bool = True) -> dict[str, torch.Tensor]:
    """The model's full fp32 state dict from the master partition (CPU tensors; {} if not `keep`).

    Collective: every rank must call it, only those that `keep` hold the result. Tied parameters
    appear under each of their names, so it loads into a plain model with strict=True.
    """
    module = engine.module
    full_by_param = {}
    for param in module.parameters():
        full = safe_get_full_fp32_param(param)  # every rank takes part in the gather
        if keep:
            full_by_param[id(param)] = full.detach().cpu().clone()
    if not keep:
        return {}
    state = {name: full_by_param[id(param)]
             for name, param in module.named_parameters(remove_duplicate=False)}
    persistent = module.state_dict(keep_vars=True).keys()  # placeholders under ZeRO-3: cheap
    for name, buffer in module.named_buffers():
        if name in persistent:
            state[name] = buffer.detach().cpu().clone()
    return state


def full_weights(engine, ema: ShardedEMA | None, use_ema: bool,
                 keep: bool = True) -> dict[str, torch.Tensor]:
    """The full fp32 weights, the EMA's when `use_ema` and there is one (collective: see
    gather_full_weights; {} where not `keep`)."""
    if use_ema and ema is not None:
        with ema.swapped_in():
            return gather_full_weights(engine, keep)
    return gather_full_weights(engine, keep)
