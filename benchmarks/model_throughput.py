"""Training throughput of the model (forward + backward), chunked cross-entropy vs full logits.

    python benchmarks/model_throughput.py [--presets tiny,small] [--batch-size B] [--seq-len T]

For each preset, in one process on the same weights and batch, times a forward+backward step
with the logits made all at once (the paper's code: b x t x 50304 fp32 logits, the baseline) and
with the chunked loss of model/loss.py, and measures the peak memory of one step. Prints
tokens/s, step time, peak memory, MFU on a GPU (bf16 autocast, against the device's dense bf16
peak) and the chunked/full ratios. On CPU it uses short sequences so it ends in a minute or two.
"""

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
from results import ResultsFile
from torch.profiler import ProfilerActivity, profile

from aogpt import UsageError, cli_entry
from aogpt.model import AOGPT
from aogpt.model.config import medium, small, tiny
from aogpt.model.precision import resolve_device
from aogpt.trainer import metrics as trainer_metrics

PRESETS = {"tiny": tiny, "small": small, "medium": medium}
# (batch, seq_len) when not given: the paper's shape on a GPU, a minute's work on a CPU
GPU_SHAPE = (16, 1024)
CPU_SHAPES = {"tiny": (8, 128), "small": (4, 128), "medium": (2, 128)}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return trainer_metrics.peak_flops(torch.cuda.get_device_name(device))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,small", help="comma list of tiny, small, medium")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    parser.add_argument("--batch-size", type=int,
                        help="sequences per step (GPU 16; CPU 8 tiny, 4 small)")
    parser.add_argument("--seq-len", type=int,
                        help="tokens per sequence (GPU 1024, CPU 128; <= block size)")
    parser.add_argument("--loss-chunk-size", type=int,
                        help="tokens per loss chunk (default: the config's, at most a quarter of "
                             "the batch)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per path")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


@contextlib.contextmanager
def _quiet_stderr():
    """Silences the profiler's native start/stop chatter (written to file descriptor 2)."""
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class Bench:
    """One preset on one device: runs forward+backward steps with a given loss chunk size."""

    def __init__(self, preset: str, device: torch.device, batch: int, seq_len: int):
        config = PRESETS[preset]()
        if seq_len > config.block_size:
            seq_len = config.block_size
        self.device, self.seq_len, self.batch = device, seq_len, batch
        torch.manual_seed(0)
        self.model = AOGPT(config).to(device).train()
        self.idx = torch.randint(0, 50257, (batch, seq_len), device=device)
        self.orders = torch.rand(batch, seq_len, device=device).argsort(dim=1)
        self.autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda")

    def step(self, chunk: int) -> float:
        self.model.config.loss_chunk_size = chunk  # read at every forward
        self.model.zero_grad(set_to_none=True)
        self._sync()
        start = time.perf_counter()
        with self.autocast:
            loss = self.model(self.idx, self.orders).mean()
        loss.backward()
        self._sync()
        return time.perf_counter() - start

    def peak_memory(self, chunk: int) -> float:
        """Bytes allocated at the peak of one step, above what was allocated before it."""
        self.model.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self.step(chunk)
            return torch.cuda.max_memory_allocated() - before
        # CPU: replay the profiler's allocation and free events in time order
        with (_quiet_stderr(),
              profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof):
            self.step(chunk)
        current = peak = 0
        for event in sorted(prof.events(), key=lambda e: e.time_range.start):
            current += event.self_cpu_memory_usage
            peak = max(peak, current)
        return peak

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def run_preset(preset: str, args: argparse.Namespace, device: torch.device) -> dict:
    on_gpu = device.type == "cuda"
    batch, seq_len = GPU_SHAPE if on_gpu else CPU_SHAPES[preset]
    bench = Bench(preset, device, args.batch_size or batch, args.seq_len or seq_len)
    tokens = bench.batch * bench.seq_len
    chunk = args.loss_chunk_size or min(bench.model.config.loss_chunk_size, max(tokens // 4, 1))
    paths = {"full logits": 0, f"chunked ({chunk})": chunk}
    for size in paths.values():
        for _ in range(args.warmup):
            bench.step(size)
    times = {name: [] for name in paths}
    for _ in range(args.steps):  # interleaved, so that load from elsewhere hits both alike
        for name, size in paths.items():
            times[name].append(bench.step(size))
    model = bench.model
    flops_per_step = model.flops_per_token(bench.seq_len) * tokens
    peak = peak_flops(device)
    print(f"\n{preset}: {model.num_params() / 1e6:.2f}M params, "
          f"attention {model.attention_backend}, "
          f"batch {bench.batch} x {bench.seq_len} tokens, {device.type} "
          f"{'bf16 autocast' if on_gpu else 'fp32'}, best of {args.steps} steps")
    print(f"  {'path':<18}{'tokens/s':>12}{'step ms':>10}{'peak MiB':>10}{'MFU':>8}")
    rows = {}
    for name, size in paths.items():
        seconds = min(times[name])  # the least disturbed run: other work only ever adds time
        row = {"loss_chunk_size": size, "step_s": seconds, "tokens_per_s": tokens / seconds,
               "peak_bytes": bench.peak_memory(size),
               "mfu": flops_per_step / seconds / peak if peak else None}
        rows[name] = row
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
        print(f"  {name:<18}{row['tokens_per_s']:>12,.0f}{seconds * 1e3:>10.1f}"
              f"{row['peak_bytes'] / 2**20:>10.0f}{mfu:>8}")
    full, chunked = rows["full logits"], rows[f"chunked ({chunk})"]
    print(f"  chunked / full: speed {chunked['tokens_per_s'] / full['tokens_per_s']:.2f}x, "
          f"peak memory {chunked['peak_bytes'] / full['peak_bytes']:.2f}x")
    return {"params": model.num_params(), "batch": bench.batch, "seq_len": bench.seq_len,
            "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
            "attention": model.attention_backend, "paths": rows}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        raise UsageError(f"--presets: unknown {unknown}, choose from {', '.join(PRESETS)}")
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    results = ResultsFile(args.json, {})  # by preset, written after each
    for preset in presets:
        results.data[preset] = run_preset(preset, args, device)
        results.row_done()
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
