"""Text longer than the block, judged exactly: is a sliding window's text as good at its seams as
elsewhere, and as good as one block's?

    python benchmarks/long_generation.py --ckpt RUN --judge DATA [--blocks 4] [--windows 16,64]
        [--num-samples 64] [--sampler speculative] [--seam-tokens 16] [--json OUT] [--table OUT]

On a synthetic language (data_prep/synthetic_to_mds.py), whose data folder is the judge, every
sample's true conditional NLL per position, -log p(x_t | x_<t) under the language (the forward
algorithm, exact), says where a text goes wrong. For each window W it draws --num-samples texts
of --blocks blocks (model/sampler/window.py: each chunk keeps the last W tokens and generates the
next block - W) and one-block texts with the same sampler, and reports
- the NLL per token of the long texts and of the one-block texts, and their ratio;
- at the seams: the first --seam-tokens positions each later chunk generates (where the network
  sees only the window), against the rest of the later chunks; and their ratio.
Exact samplers (speculative by default: the model's joint, in fewer calls) keep the sampler's own
error out of it. The goal (GOAL): each ratio within 10% of 1; docs/long-generation.md has the
measured ones.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from results import show_table
from sampling_model import sampling_model

from aogpt import UsageError, check_counts, check_unique, cli_entry
from aogpt.data_prep.synthetic import load_language
from aogpt.files import OutputFile, check_output_file, write_json_atomic
from aogpt.model.precision import device_name
from aogpt.model.sampler import SAMPLERS, KVCacheSampler, SamplingConfig
from aogpt.model.sampler.window import check_window, chunks, generate_long
from aogpt.trainer.judge import check_judge_matches

# its outputs: --force replaces only what this benchmark wrote (a table can carry no record:
# it is never replaced)
JSON = OutputFile("benchmarks/long_generation.py", "rows", (".json",))
TABLE = OutputFile("benchmarks/long_generation.py", "table", (".md",))
OUTPUTS = {"json": JSON, "table": TABLE}
GOAL = 0.10  # each ratio within 10% of 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--judge", required=True, help="the synthetic language's data folder")
    add("--weights", choices=("ema", "raw"), default="ema")
    add("--blocks", type=int, default=4,
        help="the long texts' length in blocks, at least 2 (default 4)")
    add("--windows", default="16,64", help="window sizes W, comma list (default 16,64)")
    add("--num-samples", type=int, default=64, help="texts per setting (default 64)")
    add("--batch-size", type=int, default=32)
    add("--sampler", choices=SAMPLERS, default="speculative",
        help="speculative (default: exact, fewer calls) or parallel (S = n per chunk, exact)")
    add("--seam-tokens", type=int, default=16, help="positions after a seam that count as its "
        "own, fewer than a chunk generates (default 16)")
    add("--seed", type=int, default=0)
    add("--device", default="auto")
    add("--json", type=Path)
    add("--table", type=Path)
    add("--force", action="store_true", help="replace --json and --table if they exist")
    args = parser.parse_args(argv)
    check_counts(args, "blocks", "num_samples", "batch_size", "seam_tokens")
    if args.blocks < 2:
        raise UsageError(f"--blocks {args.blocks}: a text of one block has no seam to judge: "
                         f"give --blocks 2 or more")
    try:
        windows = [int(w) for w in args.windows.split(",")]
    except ValueError:
        raise UsageError(f"--windows takes a comma list of whole numbers, got "
                         f"{args.windows!r}") from None
    check_unique(windows, "--windows", args.windows)
    args.windows = windows
    for flag in ("json", "table"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}", args.force,
                              OUTPUTS[flag])
    return args


def check_seams(block: int, window: int, seam_tokens: int) -> None:
    """Refuses seams that would take a whole chunk: nothing would be left to compare them with."""
    if seam_tokens >= block - window:
        raise UsageError(f"--seam-tokens {seam_tokens}: a chunk of window {window} generates "
                         f"{block - window} tokens (block {block} less the window), all of them "
                         f"at its seam: give --seam-tokens below {block - window}, or smaller "
                         f"--windows")


def texts(model, config: SamplingConfig, args, length: int, window: int) -> tuple[list, int]:
    """--num-samples texts of `length` tokens (a window past the block) and the network calls
    each sample made, summed."""
    block, samplers, made, calls = model.config.block_size, {}, [], 0

    def sampler_for(positions: int) -> KVCacheSampler:
        if positions not in samplers:
            samplers[positions] = KVCacheSampler(model, args.batch_size, positions, config)
        return samplers[positions]

    for first in range(0, args.num_samples, args.batch_size):
        ids = torch.arange(first, min(first + args.batch_size, args.num_samples))
        given = torch.zeros(len(ids), length, dtype=torch.long)
        out = generate_long(sampler_for, block, ids, length, window, given, given.bool())
        made += out.texts
        calls += sum(out.sample_calls)
    return made, calls


def measure(model, language, args, window: int) -> dict:
    n = model.config.block_size
    config = SamplingConfig(sampler=args.sampler, steps=n, seed=args.seed)
    length = args.blocks * n
    short, short_calls = texts(model, config, args, n, window)
    long, long_calls = texts(model, config, args, length, window)
    short_nll = language.conditional_nll(np.array(short))  # (samples, n)
    long_nll = language.conditional_nll(np.array(long))  # (samples, length)
    seams = [start + window for start, _ in chunks(length, n, window)[1:]]
    at_seam = np.zeros(length, dtype=bool)
    for seam in seams:
        at_seam[seam:seam + args.seam_tokens] = True
    later = np.arange(length) >= n  # the chunks after the first
    row = {"window": window, "length": length, "seams": seams,
           "nll_one_block": float(short_nll.mean()), "nll_long": float(long_nll.mean()),
           "nll_seams": float(long_nll[:, at_seam].mean()),
           "nll_rest_of_later_chunks": float(long_nll[:, later & ~at_seam].mean()),
           "nll_first_block_of_long": float(long_nll[:, :n].mean()),
           "calls_per_token_long": long_calls / len(long) / length,
           "calls_per_token_one_block": short_calls / len(short) / n}
    row["long_over_one_block"] = row["nll_long"] / row["nll_one_block"]
    row["seams_over_rest"] = row["nll_seams"] / row["nll_rest_of_later_chunks"]
    row["meets_goals"] = all(abs(row[k] - 1) <= GOAL
                             for k in ("long_over_one_block", "seams_over_rest"))
    return row


def table(rows: list[dict], header: dict) -> str:
    lines = ["| window W | length | NLL/token, one block | NLL/token, long | long / one block | "
             "NLL at seams (first {} tokens) | NLL, rest of later chunks | seams / rest | "
             "calls/token (long) |".format(header["seam_tokens"]), "|---" * 9 + "|"]
    for r in rows:
        lines.append(f"| {r['window']} | {r['length']} | {r['nll_one_block']:.4f} | "
                     f"{r['nll_long']:.4f} | {r['long_over_one_block']:.3f} | "
                     f"{r['nll_seams']:.4f} | {r['nll_rest_of_later_chunks']:.4f} | "
                     f"{r['seams_over_rest']:.3f} | {r['calls_per_token_long']:.3f} |")
    return "\n".join(lines) + "\n"


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, device, origin = sampling_model(args, JSON.made_by)
    check_judge_matches(args.judge, origin)
    language = load_language(args.judge, "--judge")
    for window in args.windows:
        check_window(model.config.block_size, window)
        check_seams(model.config.block_size, window, args.seam_tokens)
    header = {"device": device_name(device), "block_size": model.config.block_size,
              "blocks": args.blocks, "num_samples": args.num_samples, "sampler": args.sampler,
              "seam_tokens": args.seam_tokens,
              "settings": asdict(SamplingConfig(sampler=args.sampler)),
              "provenance": origin}
    rows = []
    for window in args.windows:
        rows.append(measure(model, language, args, window))
        r = rows[-1]
        print(f"W = {window}: long / one block {r['long_over_one_block']:.3f}, seams / rest "
              f"{r['seams_over_rest']:.3f}", flush=True)
        if args.json:
            write_json_atomic({**header, "rows": rows}, args.json, indent=2)
    show_table(table(rows, header), args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
