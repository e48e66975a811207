"""What recording the calls costs (trainer/sample.py --record-calls, the replay page's data):
generation with and without it, side by side in one process.

    python benchmarks/record_calls.py [--preset tiny] [--batch-size 8] [--seq-len 128]
        [--repeats 3] [--device auto] [--json OUT]

Recording reads, after each network call, where the strategy has brought each sample (a few
(b,) tensors and the engine's order and tokens, copied to the host) and turns the change into
each sample's record of the call (model/sampler/recording.py). Its cost is per call and per
sample, so it weighs most where calls are cheapest: a small model, one token per call. Each way
below generates the same batch (the same sample ids, so the same tokens) on the same sampler,
alternately without and with recording, --repeats times after one warm-up of each; a row reports
the best wall time and the best CPU time of this process of each, their ratios (with / without:
1.05 would be 5% more), and the share of the recording generations' time spent inside the
recorder (its own cost, timed around its methods: on a machine shared with other jobs, whose
load makes the ratios vary by several percent from one run to the next, trust this one):

    parallel S = n       the paper's sampler, one position per call (the most calls)
    parallel S = n / 8   eight positions per call
    speculative K = 4    drafts four ahead (its records hold drafts and their fate)
    margin R = 1         a planner (its records hold its 16 best candidates per call)

Defaults: the tiny model (2 layers x 64, GPT-2's vocabulary), batch 8, n = 128 on a CPU; the
paper's small model, batch 32, n = 1024 on a GPU. The model's weights are random: what a call
costs does not depend on them.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from results import ResultsFile

from aogpt import UsageError, check_counts, cli_entry
from aogpt.model import AOGPT
from aogpt.model.config import small, tiny
from aogpt.model.precision import device_name, reproducible_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.recording import CallRecorder

PRESETS = {"tiny": tiny, "small": small}


def ways(n: int) -> dict[str, dict]:
    return {"parallel S = n": {"steps": n}, "parallel S = n / 8": {"steps": max(1, n // 8)},
            "speculative K = 4": {"sampler": "speculative", "draft": 4},
            "margin R = 1": {"planner": "margin"}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/record_calls.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--preset", choices=sorted(PRESETS), help="small on a GPU, tiny on a CPU")
    add("--batch-size", type=int, help="default 32 on a GPU, 8 on a CPU")
    add("--seq-len", type=int, help="default 1024 on a GPU, 128 on a CPU")
    add("--repeats", type=int, default=3, help="timed generations of each kind (default 3)")
    add("--device", default="auto")
    add("--json", help="write the rows here")
    args = parser.parse_args(argv)
    check_counts(args, "batch_size", "seq_len", "repeats")
    on_gpu = resolve_device(args.device).type == "cuda"
    args.preset = args.preset or ("small" if on_gpu else "tiny")
    args.batch_size = args.batch_size or (32 if on_gpu else 8)
    args.seq_len = args.seq_len or (1024 if on_gpu else 128)
    if args.seq_len > PRESETS[args.preset]().block_size:
        raise UsageError(f"--seq-len {args.seq_len} exceeds the {args.preset} block size")
    return args


class RecorderClock:
    """The wall time spent inside CallRecorder (its per-call copies and its read-back after the
    last call), summed: the recording's own cost, which other jobs on the machine inflate no
    more than they inflate the generation around it."""

    def __init__(self):
        self.seconds = 0.0
        self.call, self.calls = CallRecorder.__call__, CallRecorder.calls.fget
        CallRecorder.__call__ = self.timed(self.call)
        CallRecorder.calls = property(self.timed(self.calls))

    def timed(self, method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return run


def timed(sampler: KVCacheSampler, ids: torch.Tensor, record: bool) -> tuple[float, float, object]:
    """A generation's wall time and the CPU time this process spent on it (on a CPU shared with
    other jobs the second varies far less: time waiting for a core is not counted)."""
    device = sampler.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    out = sampler.generate(ids, record_calls=record)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu_start, out


def measure(model: AOGPT, settings: dict, args, clock: RecorderClock) -> dict:
    """One way: the best of --repeats generations without and with recording, alternated."""
    sampler = KVCacheSampler(model, args.batch_size, args.seq_len, SamplingConfig(**settings))
    ids = torch.arange(args.batch_size)
    wall, cpu, inside = {False: [], True: []}, {False: [], True: []}, []
    for repeat in range(args.repeats + 1):  # the first of each warms up
        for record in (False, True):
            before = clock.seconds
            seconds, cpu_seconds, out = timed(sampler, ids, record)
            if repeat:
                wall[record].append(seconds)
                cpu[record].append(cpu_seconds)
                if record:
                    inside.append((clock.seconds - before) / seconds)
    calls = sum(len(calls) for calls in out.calls) / args.batch_size
    return {"network_calls": out.network_calls, "recorded_calls_per_sample": calls,
            "seconds": min(wall[False]), "seconds_recording": min(wall[True]),
            "ratio": min(wall[True]) / min(wall[False]), "cpu_seconds": min(cpu[False]),
            "cpu_seconds_recording": min(cpu[True]), "cpu_ratio": min(cpu[True]) / min(cpu[False]),
            "recorder_share": min(inside), "recorder_shares": inside,
            "times": {"plain": wall[False], "recording": wall[True]},
            "cpu_times": {"plain": cpu[False], "recording": cpu[True]}}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    clock = RecorderClock()
    model = AOGPT(PRESETS[args.preset]()).to(device, reproducible_dtype(device)).eval()
    results = ResultsFile(args.json, {"device": device_name(device), "preset": args.preset,
                                      "batch_size": args.batch_size, "seq_len": args.seq_len,
                                      "repeats": args.repeats, "results": []})
    print(f"{args.preset} model, batch {args.batch_size} x {args.seq_len} tokens, "
          f"{device_name(device)}, best of {args.repeats}", flush=True)
    for name, settings in ways(args.seq_len).items():
        row = {"way": name, **measure(model, settings, args, clock)}
        results.data["results"].append(row)
        results.row_done()
        print(f"{name:20s} {row['network_calls']:5d} calls: wall {row['seconds']:7.3f} s, "
              f"recording {row['seconds_recording']:7.3f} s, ratio {row['ratio']:.3f}; CPU "
              f"{row['cpu_seconds']:7.3f} s, recording {row['cpu_seconds_recording']:7.3f} s, "
              f"ratio {row['cpu_ratio']:.3f}; inside the recorder "
              f"{row['recorder_share']:.2%} of the time", flush=True)
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
