"""One network call of the KV-cache sampler, as trainer/sample.py runs it and in the other ways
the sampler can run it: kernels per step and time.

    python benchmarks/decode_step.py [--preset small] [--batch-size B] [--seq-len N]
        [--known C] [--targets R] [--repeats K] [--json OUT]

A decode step feeds a few rows per sequence through the whole network: its cost is the number
of kernels it launches more than their arithmetic (an eager op is a kernel launch, ~5 us of the
host's time; inside a CUDA graph a launch costs the GPU ~1-2 us and the host nothing). In one
process, on the same model and sampler state (C tokens known, R targets drawn, keys padded as
the sampler pads them), this runs model/sampler/'s step in each configuration of ROWS:

    eager               KVCacheSampler(compile=False, cuda_graphs=False): sample.py on a CPU
    compiled            compile=True: inductor's fused kernels, launched one by one
    graphs              cuda_graphs=True (GPU): the eager step captured once and replayed, what
                        trainer/sample.py runs on a GPU (--compile auto compiles only runs of
                        many calls: its COMPILE_PAYS_CALLS, an estimate these rows measure)
    compiled + graphs   compile=True, cuda_graphs=True (GPU): sample.py's long runs

and prints, for each,

- kernels per step: on a GPU every kernel the profiler sees run on the device (inside a graph's
  replay too; copies and memsets left out); on a CPU every operation launched, as torch.profiler
  records it (eager: the top-level aten ops that are not views; compiled: each kernel inductor
  generated and each library call it kept);
- the best of --repeats step times, each the step alone (its inputs are reset outside the timing)
  from the host's call until the device is done;
- the warm-up: the first call, which compiles and captures (reported apart, never timed); a
  configuration that fell back to eager (the sampler's one warning line) says so in its row;
- how far its logits are from the eager ones (the rounding of the model's dtype: inductor fuses
  and reorders the same arithmetic), and whether it drew the same tokens.

The JSON is written after every configuration (benchmarks/results.py). Defaults: the paper's
small model, batch 32, n = 1024, C = 512, R = 1 on a GPU; the tiny model, batch 4, n = 128,
C = 64 on a CPU (where inductor writes C++ and takes a minute to compile).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config
from decode_state import sampler_at_step, step_shape
from results import ResultsFile
from roofline import measured_classes
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from aogpt import UsageError, check_counts, cli_entry
from aogpt.model import AOGPT
from aogpt.model.config import medium, small, tiny
from aogpt.model.precision import auto_dtype, resolve_device

# Inductor's C++ kernels are then named in the profile (its GPU kernels are, always)
torch._inductor.config.cpp.enable_kernel_profile = True
PRESETS = {"tiny": tiny, "small": small, "medium": medium}
# (name, compile, cuda_graphs): eager first, the reference of the others' logits and tokens
ROWS = [("eager", False, False), ("compiled", True, False), ("graphs", False, True),
        ("compiled + graphs", True, True)]


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


def as_sample_py(row: str, device: torch.device) -> str:
    """When trainer/sample.py runs this configuration ("": never)."""
    if device.type == "cpu":
        return "on a CPU" if row == "eager" else ""
    return {"graphs": "on a GPU", "compiled + graphs": "on a GPU, long runs"}.get(row, "")


def call_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    return step_shape(args.seq_len, args.known, args.targets, args.device.type == "cuda")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_view(name: str) -> bool:
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    return packet is not None and any(getattr(packet, o).is_view for o in packet.overloads())


def kernels(run, device: torch.device) -> tuple[int, dict | None]:
    """What one run launches, and on a GPU the kernels' time per class of
    benchmarks/step_anatomy.py (roofline.measured_classes). On a GPU: the kernels the device ran
    (those of a graph's replay too), copies and memsets left out. On a CPU: the top-level aten
    ops (not inside another aten op) that are not views, and the kernels inductor generated
    (recorded by name)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        synchronize(device)
    if device.type == "cuda":
        return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA
                   and not event.name.startswith(("Memcpy", "Memset", "[memory]"))), \
            measured_classes(prof.events(), runs=1)
    return _cpu_operations(prof), None


def _cpu_operations(prof) -> int:
    count = 0
    for event in prof.events():
        inside_op = event.cpu_parent is not None and event.cpu_parent.name.startswith("aten::")
        if event.name.startswith("aten::") and not inside_op and not _is_view(event.name):
            count += 1
        elif event.name.startswith(("graph_", "triton_")) and "fused" in event.name:
            count += 1
    return count


def measure(model: AOGPT, args: argparse.Namespace, compiled: bool, graphs: bool) -> dict:
    sampler = sampler_at_step(model, args.batch_size, args.seq_len, args.known, args.targets,
                              compiled, graphs)
    shape = call_shape(args)
    ordered = sampler.ordered.clone()
    with torch.no_grad():
        def step():
            return sampler.call(*shape)

        def reset():  # the step writes its draws: every run starts alike, outside the timing
            sampler.ordered.copy_(ordered)
            synchronize(args.device)

        start = time.perf_counter()
        logits, target_slots, _ = step()  # warm-up: compilation, capture
        synchronize(args.device)
        warm_up_s = time.perf_counter() - start
        drawn = sampler.ordered.gather(1, target_slots.clamp(max=args.seq_len - 1)).clone()
        logits = logits.clone()
        reset()
        launched, classes = kernels(step, args.device)
        best = float("inf")
        for _ in range(args.repeats):
            reset()
            start = time.perf_counter()
            step()
            synchronize(args.device)
            best = min(best, time.perf_counter() - start)
    # the configuration that ran: a compiler or capture that failed left the sampler eager
    fell_back = (sampler.compiled, sampler.cuda_graphs) != (compiled, graphs)
    return {"compiled": sampler.compiled, "cuda_graphs": sampler.cuda_graphs,
            "fell_back": fell_back, "kernels": launched, "classes": classes,
            "step_ms": best * 1e3,
            "warm_up_s": warm_up_s, "logits": logits, "drawn": drawn}


def results_file(args: argparse.Namespace, dtype: torch.dtype) -> ResultsFile:
    """The --json file's header (the setting and the step's shape), also said."""
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    rows, targets, keys = call_shape(args)
    print(f"{args.preset} on {name} ({dtype}), {torch.get_num_threads()} threads: batch "
          f"{args.batch_size}, n = {args.seq_len}, {args.known} known, {args.targets} drawn "
          f"(step shape: {rows} rows, {targets} targets, {keys} keys), best of {args.repeats}")
    return ResultsFile(args.json, {
        "preset": args.preset, "device": name, "dtype": str(dtype), "batch_size": args.batch_size,
        "seq_len": args.seq_len, "known": args.known, "targets": args.targets,
        "step_shape": [rows, targets, keys],
        "kernels_are": "GPU kernels" if args.device.type == "cuda" else "CPU operations",
        "results": []})


def against_eager(row_name: str, row: dict, eager: dict, device: torch.device) -> dict:
    """A configuration's record: what `measure` found, its logits and tokens against eager's."""
    return {"name": row_name, **{k: v for k, v in row.items() if k not in ("logits", "drawn")},
            "max_logit_difference": (row["logits"] - eager["logits"]).abs().max().item(),
            "same_tokens": torch.equal(row["drawn"], eager["drawn"]),
            "as_sample_py": as_sample_py(row_name, device)}


def table_header(device: torch.device) -> str:
    return (f"{'':>18}{'kernels' if device.type == 'cuda' else 'operations':>12}"
            f"{'ms/step':>10}{'warm-up s':>11}{'logits vs eager':>17}{'same tokens':>13}")


def table_row(record: dict) -> str:
    return (f"{record['name']:>18}{record['kernels']:>12}{record['step_ms']:>10.3f}"
            f"{record['warm_up_s']:>11.1f}{record['max_logit_difference']:>17.2e}"
            f"{str(record['same_tokens']):>13}"
            + ("  (fell back to eager: see the warning)" if record["fell_back"] else ""))


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    dtype = auto_dtype(args.device)
    model = AOGPT(PRESETS[args.preset]()).to(device=args.device, dtype=dtype).eval()
    results = results_file(args, dtype)
    print(table_header(args.device))
    eager = None
    for row_name, compiled, graphs in ROWS:
        if graphs and args.device.type != "cuda":
            continue
        row = measure(model, args, compiled, graphs)
        eager = eager or row
        record = against_eager(row_name, row, eager, args.device)
        print(table_row(record), flush=True)
        results.data["results"].append(record)
        results.row_done()
    first, last = results.data["results"][0], results.data["results"][-1]
    print(f"{last['name']} / eager: {first['kernels'] / last['kernels']:.1f}x fewer kernels, "
          f"{first['step_ms'] / last['step_ms']:.2f}x faster (max |logit| "
          f"{eager['logits'].abs().max().item():.2f})")
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
