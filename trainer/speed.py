"""The training step's speed levers (RunConfig.speed), each a switch, each off until a GPU
measures it faster than the default (benchmarks/gpu_report.py measures every one against it;
docs/performance.md says what each removes, as benchmarks/step_anatomy.py counts it).

A lever changes no number beyond its arithmetic: tests/trainer/test_speed_levers.py trains
with it and without it from the same weights and data and finds the same losses and the same
EMA, within the rounding the changed arithmetic allows; its constraints on the rest of the
configuration are checked with the DeepSpeed JSON (trainer/ds_config.py). A lever that cannot
run on this device (a CUDA-only one on a CPU) is named in one warning line, and the step runs
without it.

    coalesce_grad_reduction  DeepSpeed reduces the micro-steps' summed gradients once per
                             optimizer step (engine.coalesce_grad_reduction), instead of handling
                             them at every micro-step (ZeRO-2: a reduce-scatter per micro-step)
    fused_optimizer_ema      AdamW's update and the EMA's lerp in one compiled function over the
                             fp32 master partitions: one pass over each, not two
    engine_compile           DeepSpeed's engine.compile of the whole model, its backward through
                             compiled autograd ("compiled_autograd") or DeepCompile ("deepcompile",
                             CUDA only), in place of train.compile_scope's graphs
    cuda_graphs              the compiled graphs replayed as CUDA graphs (inductor's
                             reduce-overhead mode; CUDA only)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from aogpt.trainer.config import RunConfig


def unavailable(cfg: RunConfig, device: torch.device) -> list[str]:
    """One warning line for each lever asked for that cannot run on `device`."""
    if device.type == "cuda":
        return []
    lines = []
    if cfg.speed.cuda_graphs:
        lines.append("speed.cuda_graphs needs a CUDA GPU: the compiled graphs run as they are")
    if cfg.speed.engine_compile == "deepcompile":
        lines.append("speed.engine_compile=deepcompile needs a CUDA GPU: the model is compiled "
                     "as train.compile_scope says instead")
    return lines


def engine_compiles(cfg: RunConfig, device: torch.device) -> bool:
    """Whether DeepSpeed's engine.compile compiles the model (rather than compile_for_training)."""
    mode = cfg.speed.engine_compile
    return bool(cfg.train.compile) and (
        mode == "compiled_autograd" or (mode == "deepcompile" and device.type == "cuda"))


def replays_cuda_graphs(cfg: RunConfig, device: torch.device) -> bool:
    """Whether train.compile_scope's graphs replay as CUDA graphs (speed.cuda_graphs)."""
    return (cfg.speed.cuda_graphs and device.type == "cuda" and bool(cfg.train.compile)
            and not engine_compiles(cfg, device))


def compile_model(model, cfg: RunConfig, device: torch.device) -> None:
    """train.compile_scope's graphs, before the engine is built (unless the engine compiles)."""
    if not cfg.train.compile or engine_compiles(cfg, device):
        return
    model.compile_for_training(cfg.train.compile_scope, mode="reduce-overhead"
                               if replays_cuda_graphs(cfg, device) else None)


def micro_step_begins(engine, cfg: RunConfig, device: torch.device) -> None:
    """speed.cuda_graphs, before each micro-step's forward: a new step for inductor's CUDA-graph
    trees, and every parameter's .grad allocated (zeros where it is None). Without a .grad to add
    into, autograd installs the backward graph's output buffer itself as .grad, and the next
    micro-step's replay overwrites that buffer while it still holds the sum: gradient
    accumulation fails on CUDA graphs (pytorch/pytorch#169545, seen on the H200 in
    'accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run').
    With one allocated, each micro-step's gradient is added into it in place."""
    if not replays_cuda_graphs(cfg, device):
        return
    torch.compiler.cudagraph_mark_step_begin()
    allocate_grads(engine.module)


def allocate_grads(module: torch.nn.Module) -> None:
    """A zero .grad for each trainable parameter that has none (micro_step_begins)."""
    for parameter in module.parameters():
        if parameter.requires_grad and parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)


def engine_ds_config(ds_config: dict, cfg: RunConfig, device: torch.device) -> dict:
    """The DeepSpeed JSON with DeepCompile turned on where it runs."""
    if cfg.speed.engine_compile == "deepcompile" and engine_compiles(cfg, device):
        return {**ds_config, "compile": {**ds_config.get("compile", {}), "deepcompile": True}}
    return ds_config


def compile_engine(engine, cfg: RunConfig, device: torch.device) -> None:
    """DeepSpeed's engine.compile of the whole model, with compiled autograd if asked."""
    if engine_compiles(cfg, device):
        from aogpt.model.loss import compile_chunk_math

        engine.compile(compile_kwargs={"dynamic": False},
                       compiled_autograd_enabled=cfg.speed.engine_compile == "compiled_autograd")
        compile_chunk_math()


def adamw(model, cfg: RunConfig) -> torch.optim.AdamW:
    """The optimizer: torch's fused AdamW (one kernel per step, its step count on the device);
    for speed.fused_optimizer_ema its multi-tensor form with the learning rate a device tensor,
    which torch.compile traces into one pass with the EMA (fuse_ema) without recompiling when
    the learning rate changes."""
    o = cfg.optim
    groups, betas = model.param_groups(o.weight_decay), (o.beta1, o.beta2)
    if cfg.speed.fused_optimizer_ema:
        device = next(model.parameters()).device
        return torch.optim.AdamW(groups, lr=torch.tensor(o.lr, device=device), betas=betas,
                                 eps=o.eps, foreach=True, capturable=True)
    return torch.optim.AdamW(groups, lr=o.lr, betas=betas, eps=o.eps, fused=True)


def set_lr(optimizer, lr: float) -> None:
    """Every group's learning rate (in place where it is a device tensor: no recompilation, no
    copy from the host)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def fuse_ema(engine, ema, cfg: RunConfig) -> None:
    """speed.fused_optimizer_ema: the EMA updated inside the optimizer's step, both compiled
    together (trainer/ema.py's ShardedEMA.fuse_into)."""
    if cfg.speed.fused_optimizer_ema and ema is not None:
        ema.fuse_into(engine.optimizer.optimizer)  # the torch optimizer inside DeepSpeed's


class Reduction:
    """When the micro-steps' gradients are reduced: at every micro-step as DeepSpeed does by
    default (engine.step() after each backward, the optimizer stepping at the last), or once for
    all of them (speed.coalesce_grad_reduction).

        with reduction.micro_steps():
            for ...: engine.backward(loss); reduction.after_backward()
    """

    def __init__(self, engine, coalesce: bool):
        self.engine, self.coalesce = engine, coalesce

    @contextlib.contextmanager
    def micro_steps(self) -> Iterator[None]:
        if not self.coalesce:
            yield
            return
        self.engine.set_gradient_accumulation_boundary(False)  # no micro-step is the last
        with self.engine.coalesce_grad_reduction():  # reduces once, on leaving
            yield
        self.engine.set_gradient_accumulation_boundary(True)  # the step the block makes
        try:
            self.engine.step()
        finally:
            self.engine.set_gradient_accumulation_boundary(False)

    def after_backward(self) -> None:
        if not self.coalesce:
            self.engine.step()  # DeepSpeed steps the optimizer on the last micro-step only
