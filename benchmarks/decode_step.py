"""One network call of the KV-cache sampler, eager against compiled: operations and time.

    python benchmarks/decode_step.py [--preset small] [--batch-size B] [--seq-len N]
        [--known C] [--targets R] [--repeats K] [--json OUT]

A decode step feeds a few rows per sequence through the whole network: its cost is the number
of operations it launches more than their arithmetic (each eager op is a kernel launch on a GPU,
~4 us even inside a CUDA graph). In one process, on the same model and sampler state (C tokens
known, R targets drawn, keys padded as the sampler pads them), this runs model/sampler/'s step (parallel.py)
eager and compiled (torch.compile with inductor, as the sampler does on a GPU) and prints

- operations per step, as torch.profiler records them: eager, every aten op the Python code calls
  (views, which launch nothing, left out); compiled, every kernel inductor generated and every
  library call it kept (matmul, attention, cumsum);
- the best of --repeats step times, and their ratio;
- how far the compiled step's logits are from the eager ones (the rounding of the model's dtype:
  inductor fuses and reorders the same arithmetic), and whether they drew the same tokens.

Defaults: the paper's small model, batch 32, n = 1024, C = 512, R = 1 on a GPU; the tiny model,
batch 4, n = 128, C = 64 on a CPU (where inductor writes C++ and takes a minute to compile).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config
from torch.profiler import ProfilerActivity, profile

from aogpt import UsageError, check_counts, cli_entry
from aogpt.files import write_json_atomic
from aogpt.model import AOGPT
from aogpt.model.config import medium, small, tiny
from aogpt.model.precision import auto_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.parallel import KEY_BLOCK, WHOLE_CACHE_ROWS

# Inductor's C++ kernels are then named in the profile (its GPU kernels are, always)
torch._inductor.config.cpp.enable_kernel_profile = True
PRESETS = {"tiny": tiny, "small": small, "medium": medium}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="small on a GPU, tiny on a CPU")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    parser.add_argument("--batch-size", type=int, help="sequences (GPU 32, CPU 4)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (GPU 1024, CPU 128)")
    parser.add_argument("--known", type=int, help="tokens known before the step (default n / 2)")
    parser.add_argument("--targets", type=int, default=1, help="tokens drawn by the step")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps, the best kept")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    args.device = resolve_device(args.device)
    on_gpu = args.device.type == "cuda"
    args.preset = args.preset or ("small" if on_gpu else "tiny")
    args.batch_size = args.batch_size if args.batch_size is not None else (32 if on_gpu else 4)
    args.seq_len = args.seq_len if args.seq_len is not None else (1024 if on_gpu else 128)
    args.known = args.known if args.known is not None else args.seq_len // 2
    check_counts(args, "batch_size", "seq_len", "targets", "repeats")
    if not 1 <= args.known <= args.seq_len - args.targets:
        raise UsageError(f"--known must be in 1..{args.seq_len - args.targets} "
                         f"(--seq-len minus --targets), got {args.known}")
    if args.seq_len > PRESETS[args.preset]().block_size:
        raise UsageError(f"--seq-len {args.seq_len} exceeds the {args.preset} block size")
    if args.json and args.json.is_dir():
        raise UsageError(f"--json {args.json} is a folder: give a file name")
    return args


def sampler_at_step(model: AOGPT, args: argparse.Namespace, compiled: bool) -> KVCacheSampler:
    """A sampler whose state is that of a generation with `known` tokens revealed, all samples
    alike: the step's inputs are the same, whatever their values."""
    b, n, c, r = args.batch_size, args.seq_len, args.known, args.targets
    sampler = KVCacheSampler(model, b, n, SamplingConfig(steps=n, seed=0), cuda_graphs=False,
                             compile=compiled)
    generator = torch.Generator().manual_seed(0)
    sampler.orders.copy_(torch.stack([torch.randperm(n, generator=generator) for _ in range(b)]))
    sampler.ordered[:, :n].copy_(torch.randint(0, 50257, (b, n), generator=generator))
    sampler.uniforms.copy_(torch.rand(b, n, generator=generator, dtype=torch.float64))
    sampler.strategy.bounds.copy_(torch.tensor([[c], [c], [c + r]]).expand(3, b))  # lo, c, hi
    return sampler


def step_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """(rows, targets, keys) as the sampler's bucketed plan gives them (model/sampler/parallel.py)."""
    rows = max(args.targets, 1)
    keys = min(-(-(args.known + rows) // KEY_BLOCK) * KEY_BLOCK, args.seq_len)
    if args.device.type == "cpu" and rows <= WHOLE_CACHE_ROWS:
        keys = args.seq_len + 1
    bucket = lambda size: min(1 << (size - 1).bit_length(), args.seq_len)  # noqa: E731
    return bucket(rows), bucket(args.targets), keys


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_view(name: str) -> bool:
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    return packet is not None and any(getattr(packet, o).is_view for o in packet.overloads())


def operations(run, device: torch.device) -> int:
    """The operations of one run that launch work: top-level aten ops (not inside another aten
    op) that are not views, and the kernels inductor generated (recorded by name)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        synchronize(device)
    count = 0
    for event in prof.events():
        inside_op = event.cpu_parent is not None and event.cpu_parent.name.startswith("aten::")
        if event.name.startswith("aten::") and not inside_op and not _is_view(event.name):
            count += 1
        elif event.name.startswith(("graph_", "triton_")) and "fused" in event.name:
            count += 1
    return count


def measure(model: AOGPT, args: argparse.Namespace, compiled: bool) -> dict:
    sampler = sampler_at_step(model, args, compiled)
    shape = step_shape(args)
    ordered = sampler.ordered.clone()
    with torch.no_grad():
        def step():
            sampler.ordered.copy_(ordered)  # the step writes its draws: start each run alike
            return sampler.call(*shape)

        compile_start = time.perf_counter()
        logits, target_slots, _ = step()  # warm-up (and compilation)
        synchronize(args.device)
        warm_up_s = time.perf_counter() - compile_start
        launched = operations(step, args.device)
        best = float("inf")
        for _ in range(args.repeats):
            synchronize(args.device)
            start = time.perf_counter()
            step()
            synchronize(args.device)
            best = min(best, time.perf_counter() - start)
        drawn = sampler.ordered.gather(1, target_slots.clamp(max=args.seq_len - 1))
    return {"compiled": compiled, "operations": launched, "step_ms": best * 1e3,
            "warm_up_s": warm_up_s, "logits": logits.clone(), "drawn": drawn.clone()}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    dtype = auto_dtype(args.device)
    model = AOGPT(PRESETS[args.preset]()).to(device=args.device, dtype=dtype).eval()
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    rows, targets, keys = step_shape(args)
    print(f"{args.preset} on {name} ({dtype}), {torch.get_num_threads()} threads: batch "
          f"{args.batch_size}, n = {args.seq_len}, {args.known} known, {args.targets} drawn "
          f"(step shape: {rows} rows, {targets} targets, {keys} keys), best of {args.repeats}")
    eager, compiled = measure(model, args, False), measure(model, args, True)
    scale = eager["logits"].abs().max().item()
    difference = (compiled["logits"] - eager["logits"]).abs().max().item()
    same_tokens = torch.equal(compiled["drawn"], eager["drawn"])
    print(f"{'':>10}{'operations':>12}{'ms/step':>10}{'warm-up s':>11}")
    for row in (eager, compiled):
        print(f"{'compiled' if row['compiled'] else 'eager':>10}{row['operations']:>12}"
              f"{row['step_ms']:>10.3f}{row['warm_up_s']:>11.1f}")
    print(f"compiled / eager: {eager['operations'] / compiled['operations']:.1f}x fewer "
          f"operations, {eager['step_ms'] / compiled['step_ms']:.2f}x faster; logits differ by "
          f"{difference:.2e} (max |logit| {scale:.2f}); same tokens: {same_tokens}")
    if args.json:
        rows_out = [{k: v for k, v in row.items() if k not in ("logits", "drawn")}
                    for row in (eager, compiled)]
        write_json_atomic({"preset": args.preset, "device": name, "dtype": str(dtype),
                           "batch_size": args.batch_size, "seq_len": args.seq_len,
                           "known": args.known, "targets": args.targets,
                           "step_shape": [rows, targets, keys], "results": rows_out,
                           "max_logit_difference": difference, "same_tokens": same_tokens},
                          args.json, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
