"""Context-order ensemble: batched prefix-only members against the paper's full forwards.

    python benchmarks/eval_ensemble.py [--presets tiny,small] [--ckpt PATH] [--data DIR]
        [--seq-len T] [--batch-size B] [--members M] [--targets N] [--precision fp32|bf16]
        [--repeats R] [--device auto] [--json OUT]

For each preset (random weights: the time does not depend on them) or the checkpoint given, in
one process, on the same weights, sequences, base orders, targets and members, it times the
NLL of every (sequence, target, member) pair, members 1..M-1 of N targets per sequence:
  straightforward  the paper's eval_ppl_AOGPT_ensemble loop: for each target i and member j, one
                   forward of the whole batch in the member's order, all logits, keep target i
  batched          trainer/ensemble.py: one forward per member over the slots up to its target
                   only, the head on the target's slot only, rows of all targets and members
                   packed longest first into forwards of B x T slots
It prints the wall time per pair of each (best of R runs), the ratio, the slots each ran
(token-forwards), and the largest NLL difference between the two, which compute the same numbers.
On a GPU the default shape is the paper's (4 sequences of 1024 tokens); on a CPU, 128 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch
from results import ResultsFile

from aogpt import UsageError, cli_entry
from aogpt.model import AOGPT, OrderConfig, OrderSampler, load_checkpoint
from aogpt.model.config import medium, small, tiny
from aogpt.model.orders import ANY_ORDER
from aogpt.model.precision import resolve_device
from aogpt.trainer.ensemble import ensemble_member_nll, straightforward_member_nll
from aogpt.trainer.evaluation import EvalData

PRESETS = {"tiny": tiny, "small": small, "medium": medium}
SEED = 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--presets", default="tiny,small", help="comma list of tiny, small, medium")
    add("--ckpt", default=None, help="benchmark this checkpoint instead of the presets")
    add("--data", default=None, help="a data folder to take the sequences from (default: "
        "random token ids, which time the same)")
    add("--seq-len", type=int, default=None, help="tokens per sequence (GPU 1024, CPU 128)")
    add("--batch-size", type=int, default=4, help="sequences (the paper's 4)")
    add("--members", type=int, default=8, help="ensemble size M (pairs use members 1..M-1)")
    add("--targets", type=int, default=8, help="targets per sequence, spread uniformly")
    add("--precision", choices=("fp32", "bf16"), default="fp32")
    add("--repeats", type=int, default=2, help="timed runs per path; the best counts")
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    add("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    for name in ("batch_size", "members", "targets", "repeats"):
        if getattr(args, name) < 1 or (name == "members" and args.members < 2):
            raise UsageError(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    unknown = [p for p in args.presets.split(",") if p not in PRESETS]
    if unknown and args.ckpt is None:
        raise UsageError(f"--presets: unknown {unknown}; use {', '.join(PRESETS)}")
    return args


class Case:
    """One model on one batch: the shared inputs of both paths."""

    def __init__(self, model: AOGPT, args: argparse.Namespace, device: torch.device):
        default_len = 1024 if device.type == "cuda" else 128
        n = min(args.seq_len or default_len, model.config.block_size)
        b = args.batch_size
        if args.data:
            data = EvalData(args.data, model.config.block_size, b)
            _, idx, _ = next(data.batches(0, 1, b))
            n = idx.shape[1]
        else:
            idx = torch.randint(0, 50257, (b, n), generator=torch.Generator().manual_seed(SEED))
        if args.targets > n:
            raise UsageError(f"--targets {args.targets} exceeds the sequence length {n}")
        self.model, self.device, self.members = model, device, args.members
        self.idx = idx.to(device)
        self.samples = torch.arange(len(idx), device=device)
        self.base = OrderSampler(OrderConfig(kind=ANY_ORDER.word), n, SEED)(0, self.samples)[0]
        # the same targets in every sequence, so that one full forward serves the whole batch
        shuffled = torch.randperm(n, generator=torch.Generator().manual_seed(SEED))
        self.targets = shuffled[:args.targets].sort().values.tolist()
        self.pairs = len(idx) * len(self.targets) * (args.members - 1)
        self.autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                         if args.precision == "bf16" else contextlib.nullcontext())

    def straightforward(self) -> tuple[torch.Tensor, int]:
        """(b, targets, members-1) NLL and the slots run."""
        out = torch.stack([torch.stack([
            straightforward_member_nll(self.model, self.idx, self.base, self.samples, i, j, SEED)
            for j in range(1, self.members)], dim=1) for i in self.targets], dim=1)
        n = self.idx.shape[1]
        return out, len(self.targets) * (self.members - 1) * len(self.idx) * n

    def batched(self) -> tuple[torch.Tensor, int]:
        b = len(self.idx)
        unit_sample = self.samples.repeat_interleave(len(self.targets))  # (b * targets,)
        unit_target = torch.tensor(self.targets, device=self.device).repeat(b)
        nll, _, slots = ensemble_member_nll(self.model, self.idx, self.base,
                                            self.samples[unit_sample], unit_sample,
                                            unit_target, self.members, SEED,
                                            slots_per_forward=b * self.idx.shape[1])
        return nll.view(b, len(self.targets), self.members - 1), slots

    @torch.inference_mode()
    def time(self, path: str, repeats: int) -> tuple[float, torch.Tensor, int]:
        """Best wall time of `repeats` runs, after one untimed run; the NLL; the slots."""
        run = getattr(self, path)
        best = float("inf")
        with self.autocast:
            for attempt in range(repeats + 1):
                self.sync()
                start = time.perf_counter()
                nll, slots = run()
                self.sync()
                if attempt:  # the first run warms up kernels and allocator
                    best = min(best, time.perf_counter() - start)
        return best, nll, slots

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def bench(name: str, model: AOGPT, args: argparse.Namespace, device: torch.device) -> dict:
    case = Case(model.to(device).eval(), args, device)
    b, n = case.idx.shape
    print(f"{name}: {model.num_params() / 1e6:.2f}M params, {device.type}, {args.precision}, "
          f"{b} sequences x {n} tokens, {len(case.targets)} targets each, "
          f"members 1..{args.members - 1}: "
          f"{case.pairs} (target, member) pairs", flush=True)
    rows = {}
    for path in ("straightforward", "batched"):
        seconds, nll, slots = case.time(path, args.repeats)
        rows[path] = {"seconds": seconds, "ms_per_pair": 1e3 * seconds / case.pairs,
                      "token_forwards": slots, "nll": nll}
        print(f"  {path:<16} {rows[path]['ms_per_pair']:9.3f} ms/pair  {seconds:8.2f} s  "
              f"{slots:>12,} token-forwards", flush=True)
    difference = (rows["batched"].pop("nll")
                  - rows["straightforward"].pop("nll")).abs().max().item()
    speedup = rows["straightforward"]["seconds"] / rows["batched"]["seconds"]
    fewer = rows["straightforward"]["token_forwards"] / rows["batched"]["token_forwards"]
    print(f"  batched / straightforward: speed {speedup:.2f}x, {fewer:.2f}x fewer token-forwards, "
          f"max |NLL difference| {difference:.2e}")
    return {"params": model.num_params(), "device": device.type, "precision": args.precision,
            "batch": b, "seq_len": n, "targets": len(case.targets), "members": args.members,
            "pairs": case.pairs, "paths": rows, "speedup": speedup,
            "token_forward_ratio": fewer, "max_nll_difference": difference}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    if args.precision == "fp32":
        torch.set_float32_matmul_precision("highest")  # as the evaluation: no TF32
    results = ResultsFile(args.json, {})  # by model, written after each
    if args.ckpt is not None:
        results.data[args.ckpt] = bench(args.ckpt, load_checkpoint(args.ckpt), args, device)
        results.row_done()
    else:
        for preset in args.presets.split(","):
            torch.manual_seed(SEED)
            results.data[preset] = bench(preset, AOGPT(PRESETS[preset]()), args, device)
            results.row_done()
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
