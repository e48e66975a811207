"""Training throughput: tokens/s of the training step and of the data loader alone, same config.

    python benchmarks/train_throughput.py --ds_config ds_configs/zero2.json \\
        --config configs/ao_gpt_small.yaml [--steps 20] [--warmup 3] [key.sub=value ...]
    deepspeed --num_gpus 8 benchmarks/train_throughput.py ...     (or torchrun)

Builds the real trainer (DeepSpeed engine, streaming loader, EMA) from the same flags as
trainer/main.py, times `--steps` full optimizer steps after `--warmup` ones (data wait included,
as in training), then times the same loader alone for `--loader-batches` micro-batches, and
prints both rates with their ratio: the loader must deliver at least 10x what a step consumes,
or the GPUs would wait for data. On a GPU it also reports MFU against the device's bf16 peak.
Nothing is written to the config's out_dir: the run goes to a scratch folder under the temp dir.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from roofline import measured_classes

from aogpt import cli_entry
from aogpt.files import write_json_atomic
from aogpt.trainer.dist_env import DistEnv, all_reduce_sum, setup_distributed_env
from aogpt.trainer.ds_config import zero_stage
from aogpt.trainer.loop import Trainer
from aogpt.trainer.preflight import Plan, preflight

NEEDED_RATIO = 10.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ds_config", required=True, help="DeepSpeed JSON (ds_configs/*.json)")
    parser.add_argument("--config", required=True, help="run preset (configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--loader-batches", type=int, default=200,
                        help="micro-batches timed for the loader alone")
    parser.add_argument("--json", type=Path, help="also write the results here (rank 0)")
    parser.add_argument("--profile", type=Path,
                        help="write a table of the GPU kernels of 2 more steps here "
                             "(torch.profiler), and their time per kernel class of "
                             "benchmarks/step_anatomy.py into --json")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(trainer: Trainer, warmup: int, steps: int) -> tuple[float, float]:
    """Seconds for `steps` optimizer steps after `warmup`, and the part spent waiting for data."""
    for update in range(warmup):
        trainer.train_step(update)
    synchronize(trainer.device)
    start, data_wait = time.perf_counter(), 0.0
    for update in range(warmup, warmup + steps):
        data_wait += trainer.train_step(update)[1]
    synchronize(trainer.device)
    return time.perf_counter() - start, data_wait


def profile_steps(trainer: Trainer, first_update: int, path: Path) -> dict:
    """The kernels (and host ops) of 2 optimizer steps, most time first, as a text table; returns
    their GPU time per step by kernel class (roofline.measured_classes)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if trainer.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for update in range(first_update, first_update + 2):
            trainer.train_step(update)
        synchronize(trainer.device)
    sort = "cuda_time_total" if trainer.device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=80)
    path.write_text(table)
    return measured_classes(prof.events(), runs=2)


def time_loader(trainer: Trainer, batches: int) -> float:
    """Seconds for the training loader to hand over `batches` micro-batches (to the device)."""
    for _ in range(2 * max(trainer.cfg.data.num_workers, 1)):  # what the workers prefetched
        next(trainer.batches)
    synchronize(trainer.device)
    start = time.perf_counter()
    for _ in range(batches):
        next(trainer.batches)
    synchronize(trainer.device)
    return time.perf_counter() - start


def scratch_plan(args: argparse.Namespace, dist_env: DistEnv) -> Plan:
    """The run --config and the overrides describe, checked as trainer/main.py checks it, in a
    scratch out_dir (nothing to resume) with no evaluation (none of the zero-shot sets a preset
    names needs to exist)."""
    scratch = Path(tempfile.gettempdir()) / "aogpt_train_throughput"
    if dist_env.is_main:
        shutil.rmtree(scratch, ignore_errors=True)
    overrides = [*args.overrides, f"out_dir={scratch}", "eval.every=0", "eval.sets=[]"]
    return preflight(args.config, args.ds_config, overrides, dist_env)


@dataclass
class Timing:
    """The timed steps and loader batches, each in seconds averaged over the ranks."""

    step_seconds: float
    data_wait: float  # of step_seconds
    loader_seconds: float
    classes: dict | None = None  # the profiled steps' GPU time per kernel class (--profile)

    @classmethod
    def of(cls, trainer: Trainer, args: argparse.Namespace) -> Timing:
        """Times the steps (and profiles 2 more with --profile), then the loader (collective)."""
        classes = None
        try:
            step_seconds, data_wait = time_steps(trainer, args.warmup, args.steps)
            if args.profile and trainer.env.is_main:
                classes = profile_steps(trainer, args.warmup + args.steps, args.profile)
            loader_seconds = time_loader(trainer, args.loader_batches)
        finally:
            trainer.close()  # loader workers ignore SIGTERM: they would hold the exit
        totals = all_reduce_sum([step_seconds, data_wait, loader_seconds], trainer.device)
        return cls(*(float(t) / trainer.env.world_size for t in totals), classes=classes)


def report(trainer: Trainer, args: argparse.Namespace, timing: Timing) -> tuple[list[str], dict]:
    """The lines printed and the --json record."""
    cfg, world, device = trainer.cfg, trainer.env.world_size, trainer.device
    step_tokens = args.steps * cfg.train.tokens_per_step / timing.step_seconds  # all ranks
    loader_tokens = (args.loader_batches * cfg.train.micro_batch_size * cfg.model.block_size
                     / timing.loader_seconds)
    # per rank: what one loader gives vs one rank eats
    ratio = loader_tokens / (step_tokens / world)
    mfu = trainer.mfu(step_tokens)
    mfu_line = (f"{mfu['mfu']:.1%} (causal attention halved: {mfu['mfu_causal']:.1%})"
                if mfu["mfu"] is not None else "n/a (no GPU peak known)")
    compiled = ", compiled" if cfg.train.compile else ""
    verdict = "ok" if ratio >= NEEDED_RATIO else f"TOO SLOW: needs >= {NEEDED_RATIO:.0f}x"
    lines = [
        f"config: {args.config} {' '.join(args.overrides)}".rstrip(),
        f"setup: {cfg.model.n_layer} layers x {cfg.model.n_embd} "
        f"({trainer.num_params / 1e6:.1f}M parameters), seq {cfg.model.block_size}, "
        f"{cfg.sequences_per_step} sequences/step, "
        f"ZeRO-{zero_stage(trainer.ds_config)} {cfg.train.precision}{compiled}, world {world}, "
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
        f"attention {trainer.attention_backend}",
        f"training step: {step_tokens:,.0f} tokens/s ({step_tokens / world:,.0f} per device), "
        f"{timing.step_seconds / args.steps:.3f} s/step, data wait "
        f"{timing.data_wait / timing.step_seconds:.1%}, "
        f"MFU {mfu_line}",
        f"data loader alone: {loader_tokens:,.0f} tokens/s per rank "
        f"({args.loader_batches} micro-batches of {cfg.train.micro_batch_size}, "
        f"{cfg.data.num_workers} workers)",
        f"loader / step: {ratio:,.1f}x ({verdict})"]
    record = {
        "config": args.config, "overrides": args.overrides, "world_size": world,
        "zero_stage": zero_stage(trainer.ds_config), "precision": cfg.train.precision,
        "compile": cfg.train.compile, "attention": trainer.attention_backend,
        "micro_batch_size": cfg.train.micro_batch_size, "seq_len": cfg.model.block_size,
        "params": trainer.num_params, "tokens_per_s": step_tokens,
        "tokens_per_s_per_device": step_tokens / world,
        "step_s": timing.step_seconds / args.steps,
        "data_wait_fraction": timing.data_wait / timing.step_seconds, **mfu,
        "peak_memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                            if device.type == "cuda" else None),
        "loader_ratio": ratio, "classes": timing.classes}
    return lines, record


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist_env = setup_distributed_env()
    trainer = Trainer(scratch_plan(args, dist_env), dist_env)
    timing = Timing.of(trainer, args)
    if not dist_env.is_main:
        return 0
    lines, record = report(trainer, args, timing)
    print(*lines, sep="\n")
    if args.json:
        write_json_atomic(record, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
