"""The DeepSpeed JSON and the YAML run config, reconciled in one place.

The YAML owns everything about the optimization (batch sizes, accumulation, clipping, the
optimizer and its schedule, the precision); the JSON owns how DeepSpeed runs it (ZeRO stage,
buckets, communication). A YAML-owned key in the JSON is either "auto" (filled here) or a
value that agrees with the YAML: anything else, or an optimizer/scheduler block, is a UsageError
before any heavy work starts, so the two files can never silently disagree.

DeepSpeed's own instruments stay off unless the JSON asks for them: its throughput timer (on by
default) waits for the device at the start of every forward and at every engine.step(), twice
per micro-step, which drains the GPU's queue while the host prepares the next micro-batch; the
trainer's metrics already give tokens/s and step time without waiting. A JSON that turns a
synchronising instrument on gets a one-line warning (sync_warnings).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from aogpt import UsageError, check_input_file
from aogpt.trainer.config import RunConfig

AUTO = "auto"


def load_ds_config(path: str | os.PathLike) -> dict:
    path = Path(path)
    check_input_file(path, "DeepSpeed config", "a JSON file (presets are in ds_configs/)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UsageError(f"DeepSpeed config {path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise UsageError(f"DeepSpeed config {path} must be a JSON object")
    return config


def yaml_owned_values(cfg: RunConfig, world_size: int) -> dict[str, tuple[Any, str]]:
    """JSON key -> (the value the YAML implies, the YAML field that owns it)."""
    return {
        "train_batch_size": (cfg.sequences_per_step, "train.tokens_per_step / model.block_size"),
        "train_micro_batch_size_per_gpu": (cfg.train.micro_batch_size, "train.micro_batch_size"),
        "gradient_accumulation_steps": (
            cfg.gradient_accumulation_steps(world_size),
            "train.tokens_per_step / (train.micro_batch_size x block_size x world size)",
        ),
        "gradient_clipping": (cfg.optim.grad_clip, "optim.grad_clip"),
    }


def resolve_ds_config(ds_config: dict, cfg: RunConfig, world_size: int) -> dict:
    """A copy of `ds_config` with the YAML-owned values filled in; UsageError if they disagree."""
    resolved = copy.deepcopy(ds_config)
    for block in ("optimizer", "scheduler"):
        if block in resolved:
            raise UsageError(
                f"the DeepSpeed config has a \"{block}\" block, but the optimizer and LR schedule "
                f"come from the YAML (optim.*): delete the \"{block}\" block"
            )
    for key, (value, owner) in yaml_owned_values(cfg, world_size).items():
        given = resolved.get(key, AUTO)
        if given == AUTO:
            resolved[key] = value
        elif given != value:
            raise UsageError(
                f"the DeepSpeed config sets {key}={given!r} but the YAML gives {value!r} "
                f"(from {owner}): set {key} to \"auto\" in the JSON and change the YAML instead"
            )
    _resolve_precision(resolved, cfg.train.precision)
    # absent means DeepSpeed's default, which is a timer that synchronises: off unless asked for
    resolved.setdefault("timers", {}).setdefault("throughput", {}).setdefault("enabled", False)
    if resolved.get("fp16", {}).get("enabled"):
        raise UsageError("fp16 is not supported (no loss scaling here): use bf16 (zero*.json) "
                         "or fp32 (cpu.json)")
    if bf16_enabled(resolved):
        # ZeRO accumulates gradients in the model's dtype unless data_types says otherwise:
        # summing micro-batch gradients in bf16 loses the small ones.
        data_types = resolved.setdefault("data_types", {})
        accum = data_types.setdefault("grad_accum_dtype", "fp32")
        if accum != "fp32":
            raise UsageError(f"data_types.grad_accum_dtype is {accum!r}: with bf16 it must be "
                             "\"fp32\" (or absent), bf16 accumulation drops small gradients")
        # bf16 has fp32's range, so gradients do not overflow; ZeRO-2's check of every gradient
        # for inf/NaN reads the device at each optimizer step. The trainer checks the loss and
        # the gradient norm itself, at its log, evaluation and checkpoint boundaries
        # (trainer/recovery.py).
        resolved["bf16"].setdefault("check_grad_overflow", False)
    stage = zero_stage(resolved)
    if stage == 3 and cfg.train.compile is True and cfg.train.compile_scope == "network":
        raise UsageError("train.compile_scope=network needs ZeRO-1 or 2: ZeRO-3 gathers each "
                         "block's weights in hooks around it, which one graph cannot hold "
                         "(use train.compile_scope=block)")
    if stage not in (1, 2, 3):
        raise UsageError(f"zero_optimization.stage is {stage}: "
                         "use 1, 2 or 3 (ds_configs/zero*.json); "
                         "the EMA follows the fp32 master partition that ZeRO keeps")
    _check_speed_levers(cfg, resolved)
    leftover = [key for key, value in _walk(resolved) if value == AUTO]
    if leftover:
        raise UsageError(f"the DeepSpeed config has \"auto\" for {', '.join(leftover)}, which this "
                         "trainer does not fill: give a concrete value")
    return resolved


def _check_speed_levers(cfg: RunConfig, resolved: dict) -> None:
    """Refuses a speed lever (trainer/speed.py) that cannot run with this engine."""
    speed = cfg.speed
    if speed.coalesce_grad_reduction and bf16_enabled(resolved):
        raise UsageError("speed.coalesce_grad_reduction needs DeepSpeed's fp32 engine "
                         "(train.precision=autocast_bf16 or fp32): its bf16 optimizer wrapper "
                         "reduces gradients its own way")
    if speed.engine_compile != "off":
        if zero_stage(resolved) == 3:
            raise UsageError(f"speed.engine_compile={speed.engine_compile} is for ZeRO-1/2: ZeRO-3 "
                             "gathers each block's weights around it (train.compile_scope=block)")
        if cfg.train.compile is False:
            raise UsageError(f"speed.engine_compile={speed.engine_compile} compiles the model: "
                             "set train.compile=true")


def _resolve_precision(resolved: dict, precision: str) -> None:
    """The engine's precision follows train.precision. bf16: DeepSpeed's bf16 mode. autocast_bf16:
    an fp32 engine with DeepSpeed's torch_autocast section, which runs the forward pass under
    torch.autocast (the engine switches off any autocast opened around it, so it must be this
    section); its gradients stay fp32 in communication unless the JSON names modules whose
    gradients may travel in bf16 (lower_precision_safe_modules)."""
    if precision == "auto":
        raise ValueError("resolve train.precision for the device first (resolve_device_choices)")
    for section, want in (("bf16", precision == "bf16"),
                          ("torch_autocast", precision == "autocast_bf16")):
        block = resolved.setdefault(section, {})
        given = block.get("enabled", AUTO)
        if given == AUTO:
            block["enabled"] = want
        elif bool(given) != want:
            raise UsageError(
                f"the DeepSpeed config sets {section}.enabled={str(given).lower()} but "
                f"train.precision is {precision} (which needs {str(want).lower()}): set "
                f"{section}.enabled to \"auto\" in the JSON and choose with train.precision "
                "(autocast_bf16, bf16 or fp32)"
            )
    autocast = resolved["torch_autocast"]
    if autocast["enabled"]:
        autocast.setdefault("dtype", "bfloat16")
        autocast.setdefault("lower_precision_safe_modules", [])  # fp32 gradients, as the paper


def sync_warnings(ds_config: dict) -> list[str]:
    """One line for each setting of the resolved JSON that makes DeepSpeed wait for the device
    inside every micro-step or optimizer step (the trainer itself never does: trainer/loop.py)."""
    warnings = []
    throughput = ds_config.get("timers", {}).get("throughput", {})
    if throughput.get("enabled", True) and throughput.get("synchronized", True):
        warnings.append("the DeepSpeed config enables timers.throughput with synchronized=true: it "
                        "waits for the device twice per micro-step (set \"synchronized\": false or "
                        "\"enabled\": false; metrics.jsonl has tokens_per_s and step_time anyway)")
    if ds_config.get("wall_clock_breakdown"):
        warnings.append("the DeepSpeed config sets wall_clock_breakdown=true: its timers wait for "
                        "the device around every forward, backward and step (for profiling only)")
    if bf16_enabled(ds_config) and ds_config["bf16"].get("check_grad_overflow"):
        warnings.append("the DeepSpeed config sets bf16.check_grad_overflow=true: every optimizer "
                        "step then reads an overflow flag from the device (bf16 does not overflow)")
    if zero_stage(ds_config) in (1, 2) and ds_config["zero_optimization"].get("overlap_comm"):
        warnings.append("the DeepSpeed config sets zero_optimization.overlap_comm=true: "
                        "ZeRO-1/2 then wait for the whole device before each gradient bucket's "
                        "reduction "
                        "(docs/performance.md: false is faster on one node)")
    return warnings


def zero_stage(ds_config: dict) -> int:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def bf16_enabled(ds_config: dict) -> bool:
    return bool(ds_config.get("bf16", {}).get("enabled", False))


def _walk(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _walk(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
