"""Samplers side by side: network calls and seconds per token against the quality of what they draw.

    python benchmarks/sampler_pareto.py --ckpt RUN [--judge DATA-or-MODEL] [--num-samples 256]
        [--batch-sizes 1,32] [--steps 8,16,32,64,N] [--drafts 1,2,4,8,16] [--trees 1,2,3]
        [--tree-depths 0,15] [--predrafts 0,4] [--seq-len N] [--order random|l2r]
        [--planners confidence,margin,entropy] [--thresholds 0.9,0.7,0.5,0.3]
        [--json OUT] [--plot docs/sampler-pareto.png] [--table docs/sampler-pareto.md]

In one process, on the same model, weights and device, every sampler and setting draws the same
sample ids (so each sample's order is the same for all of them; --order l2r: left to right, the
order a hard-to-draft language's drafts are judged in):
- parallel, the paper's sampler, at S network calls (--steps), with the deterministic counts and
  with the binomial ones; S = n (one token per call) is exact ancestral sampling, the reference;
- speculative at each draft length K (--drafts): exactly S = n's distribution, in fewer calls;
  and draft trees at each C > 1 of --trees (C candidates per drafted position); each of them
  with R = each of --predrafts pre-drafts (the drafts after a redrawn position from rows that
  saw only final tokens);
- left to right at S = n, and the planners (model/sampler/planners.py), which choose each next
  position by the model's own scores: confidence, margin and entropy at one position per call,
  threshold at each --thresholds (every position whose top probability reaches it per call).
  A planner does not draw from the model's joint: it prefers what the model is sure of, so its
  true NLL is not the whole story: the unigram entropy and repetition beside it say what it
  costs in diversity.
For each it reports network calls per token (each sample's own calls; and the batch's, which
runs until its slowest sample is done), seconds per generated token at each batch size (every
sampler warmed up first, the timed runs of all samplers interleaved so that load from other
processes hits them alike), and what the judge says of --num-samples samples: with a synthetic
language's data folder (data_prep/synthetic_to_mds.py) the exact true NLL per token, its standard
error and its gap to the language's entropy; with a language model (trainer/judge.py) the
generative perplexity; always the unigram entropy and the repetition rate. The JSON is rewritten
after every row; --plot draws calls per token against the judge's number, --table writes the
markdown table docs/ shows.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from results import show_table
from sampling_model import sampling_model, timed

from aogpt import UsageError, check_counts, cli_entry, comma_counts
from aogpt.files import (
    OutputFile,
    check_output_file,
    png_provenance,
    write_json_atomic,
)
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, reading_named
from aogpt.model.precision import device_name
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.config import branch_depth, fresh_drafts
from aogpt.model.sampler.ways import REVEAL, reading
from aogpt.trainer.judge import (
    Judge,
    check_judge_matches,
    diversity,
    generative_perplexity,
    headline,
)

# its outputs: --force replaces only what this benchmark wrote (a table can carry no record:
# it is never replaced)
JSON = OutputFile("benchmarks/sampler_pareto.py", "rows", (".json",))
TABLE = OutputFile("benchmarks/sampler_pareto.py", "table", (".md",))
PLOT = OutputFile("benchmarks/sampler_pareto.py", "plot", (".png",))
OUTPUTS = {"json": JSON, "table": TABLE, "plot": PLOT}
DEFAULT_DRAFTS = (1, 2, 4, 8, 16)  # those below n
# --planners: the planners that reveal one position per call (--reveal)
ONE_BY_ONE = tuple(way.name for way in reading(REVEAL))



def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--weights", choices=("ema", "raw"), default="ema")
    add("--judge", help="a synthetic language's data folder (exact), or a judge model")
    add("--num-samples", type=int, default=256, help="samples judged per setting (default 256)")
    add("--batch-sizes", default="1,32", help="batch sizes timed (default 1,32)")
    add("--timed-batches", type=int, default=2, help="batches timed per batch size (default 2)")
    add("--steps", help="the parallel sampler's network calls, each at most n (default n/16, "
        "n/8, n/4, n/2, n)")
    add("--drafts", help="the speculative sampler's K, each below n (default those of "
        "1,2,4,8,16 below n; '' none)")
    add("--trees", default="1", help="speculative: candidates per drafted position, C, at each "
        "K (default 1, the chain; 1,2,3: chains and trees)")
    add("--tree-depths", default="0", help="speculative trees: the positions verified on the "
        "branch of a candidate other than the first, L, at each K and C > 1, each at most K - 1 "
        "(default 0: that candidate ends the call's run)")
    add("--predrafts", default="0", help="speculative: the drafts after a redrawn position drawn "
        "from rows that saw only final tokens, R, at each K, C and L, each at most K (default 0)")
    add("--planners", default="confidence,margin,entropy",
        help="planners at one position per call (default confidence,margin,entropy; '' none)")
    add("--thresholds", default="0.9,0.7,0.5,0.3",
        help="the threshold planner's thresholds (default 0.9,0.7,0.5,0.3; '' none)")
    add("--seq-len", type=int, help="tokens per sample (default the model's block size)")
    add("--order", default=ANY_ORDER.word, help=f"the order of the samplers' rows: "
        f"{ANY_ORDER.word} (default) or {LEFT_TO_RIGHT.word} (the planners choose their own)")
    add("--seed", type=int, default=0)
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    add("--json", type=Path, help="write the rows here (rewritten after every row)")
    add("--plot", type=Path, help="calls per token against the judge's number (PNG)")
    add("--table", type=Path, help="the markdown table")
    add("--force", action="store_true", help="replace --json, --plot and --table if they exist")
    args = parser.parse_args(argv)
    check_counts(args, "num_samples", "timed_batches", "seq_len")
    args.batch_sizes = comma_counts(args.batch_sizes, "--batch-sizes")
    args.drafts = comma_counts(args.drafts, "--drafts") if args.drafts else args.drafts
    args.trees = comma_counts(args.trees, "--trees")
    args.tree_depths = comma_counts(args.tree_depths, "--tree-depths", minimum=0)
    args.predrafts = comma_counts(args.predrafts, "--predrafts", minimum=0)
    args.order = reading_named(args.order, "--order").word
    args.steps = comma_counts(args.steps, "--steps") if args.steps else None
    args.planners = [p for p in args.planners.split(",") if p]
    if set(args.planners) - set(ONE_BY_ONE):
        raise UsageError(f"--planners takes {', '.join(ONE_BY_ONE)}, got {args.planners}: the "
                         "threshold planner's rows come from --thresholds")
    args.thresholds = fractions(args.thresholds, "--thresholds")
    for flag in ("json", "plot", "table"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}", args.force,
                              OUTPUTS[flag])
    return args


def sample_length(args: argparse.Namespace, block: int) -> int:
    """n, the tokens per sample, with the settings that must fit in it checked."""
    n = args.seq_len or block
    if not 2 <= n <= block:
        raise UsageError(f"--seq-len must be in 2..{block}, got {n}")
    check_within(args.steps, n, "--steps", n)
    check_within(args.drafts, n - 1, "--drafts", n)
    return n


def check_within(values: list[int] | None, most: int, flag: str, n: int) -> None:
    """Refuses a value that a row could not take (rather than dropping or clamping it)."""
    beyond = [value for value in values or [] if value > most]
    if beyond:
        raise UsageError(f"{flag} {','.join(map(str, values))}: {beyond[0]} is more than a "
                         f"sample of n = {n} tokens allows ({most} at most): give values up to "
                         f"{most}, or a longer --seq-len")


def fractions(text: str, flag: str) -> list[float]:
    try:
        values = [float(value) for value in text.split(",") if value]
    except ValueError:
        raise UsageError(f"{flag} takes a comma list of numbers, got {text!r}") from None
    if any(not 0.0 < value < 1.0 for value in values):
        raise UsageError(f"{flag} values must be in (0, 1), got {text!r}")
    return values


def settings(n: int, steps: list[int] | None, drafts: list[int] | None, planners: list[str] = (),
             thresholds: list[float] = (), trees: list[int] = (1,),
             tree_depths: list[int] = (0,), predrafts: list[int] = (0,)
             ) -> list[tuple[str, dict]]:
    """(label, SamplingConfig fields) of every sampler measured; S = n first, the reference."""
    steps = sorted(steps or {s for s in [n // 16, n // 8, n // 4, n // 2, n] if s >= 1},
                   reverse=True)
    rows = [(f"parallel S={s}", {"sampler": "parallel", "steps": s, "counts": "deterministic"})
            for s in steps]
    rows += [(f"parallel binomial S={s}", {"sampler": "parallel", "steps": s, "counts": "binomial"})
             for s in steps if s < n]
    drafts = [k for k in (DEFAULT_DRAFTS if drafts is None else drafts) if k < n]
    fresh = {k: sorted({fresh_drafts(k, r) for r in predrafts}) for k in drafts}
    rows += [(f"speculative K={k}" + (f" R={r}" if r else ""),
              {"sampler": "speculative", "draft": k, "predraft": r})
             for k in drafts if 1 in trees for r in fresh[k]]
    rows += [(f"speculative tree K={k} C={c}" + (f" L={depth}" if depth else "")
              + (f" R={r}" if r else ""),
              {"sampler": "speculative", "draft": k, "tree": c, "tree_depth": depth,
               "predraft": r})
             for k in drafts for c in trees if c > 1
             for depth in sorted({branch_depth(k, c, d) for d in tree_depths}) for r in fresh[k]]
    if planners or thresholds:
        rows.append((f"{LEFT_TO_RIGHT.word} S=n", {"sampler": "parallel", "steps": n,
                                                     "order": LEFT_TO_RIGHT.word}))
    rows += [(f"planner {p}", {"planner": p}) for p in planners]
    rows += [(f"planner threshold {t:g}", {"planner": "threshold", "threshold": t})
             for t in thresholds]
    return rows


def measure(model, label: str, fields: dict, args, n: int, judge: Judge | None,
            device: torch.device) -> dict:
    """One setting's row: calls, seconds and the judge's numbers."""
    config = SamplingConfig(seed=args.seed, **{"order": args.order, **fields})
    widest = max(args.batch_sizes)
    sampler = KVCacheSampler(model, widest, n, config)
    tokens, calls, batch_calls, decided, accepted = [], [], [], 0, 0
    for first in range(0, args.num_samples, widest):
        out, _ = timed(sampler, torch.arange(first, min(first + widest, args.num_samples)), device)
        tokens += out.tokens.tolist()
        calls += out.sample_calls.tolist()
        batch_calls.append(out.network_calls)
        decided += int(out.stats.get("drafts_decided", torch.zeros(1)).sum())
        accepted += int(out.stats.get("drafts_accepted", torch.zeros(1)).sum())
    row = {"label": label, "settings": asdict(config),
           "calls_per_token": sum(calls) / len(calls) / n,
           "batch_calls_per_token": {widest: sum(batch_calls) / len(batch_calls) / n},
           "acceptance": accepted / decided if decided else None, "samples": len(tokens)}
    row["judge"] = (generative_perplexity(tokens, judge, progress=False) if judge is not None
                    else diversity(tokens))
    row["samplers"] = {size: KVCacheSampler(model, size, n, config) for size in args.batch_sizes}
    return row


def time_rows(rows: list[dict], args, n: int, device: torch.device) -> None:
    """Seconds per generated token of every row at every batch size: each sampler warmed up,
    then the timed batches of all rows interleaved (best of --timed-batches kept)."""
    for size in args.batch_sizes:
        ids = torch.arange(size)
        for row in rows:
            timed(row["samplers"][size], ids, device)  # warm-up (and, compiled, the compile)
        best = {id(row): math.inf for row in rows}
        for _ in range(args.timed_batches):
            for row in rows:
                out, seconds = timed(row["samplers"][size], ids, device)
                best[id(row)] = min(best[id(row)], seconds / (size * n))
                row.setdefault("batch_calls_per_token", {})[size] = out.network_calls / n
        for row in rows:
            row.setdefault("seconds_per_token", {})[size] = best[id(row)]


def quality(row: dict) -> tuple[float, float]:
    return headline(row["judge"])


def table(rows: list[dict], header: dict) -> str:
    reference = rows[0]
    sizes = header["batch_sizes"]
    exact = "true NLL (nats/token)" if header["exact_judge"] else "judge"
    lines = [f"| sampler | calls/token | batch {sizes[-1]} calls/token | " + " | ".join(
        f"ms/token, batch {b} (x S=n)" for b in sizes) + f" | {exact} | unigram entropy | "
        "repetition | drafts accepted |",
        "|---" * (7 + len(sizes)) + "|"]
    for row in rows:
        value, error = quality(row)
        times = " | ".join(
            f"{row['seconds_per_token'][b] * 1e3:.3f} "
            f"({reference['seconds_per_token'][b] / row['seconds_per_token'][b]:.2f}x)"
            for b in sizes)
        accepted = "" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
        lines.append(f"| {row['label']} | {row['calls_per_token']:.3f} | "
                     f"{row['batch_calls_per_token'][sizes[-1]]:.3f} | {times} | "
                     f"{value:.4f} +- {error:.4f} | {row['judge']['entropy']:.3f} | "
                     f"{row['judge']['repetition']:.3f} | {accepted} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], header: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    families = {"parallel S=": ("the paper's sampler, deterministic counts", "o-"),
                "parallel binomial": ("the paper's sampler, binomial counts", "s--"),
                "speculative tree": ("speculative draft trees (exact), K and C", "P-"),
                "speculative": ("speculative (exact), draft K", "D-"),
                "planner threshold": ("threshold planner (not the joint)", "v-"),
                "planner ": ("confidence, margin, entropy planners (not the joint)", "^"),
                f"{LEFT_TO_RIGHT.word} S=n": ("left to right, S = n", "x")}
    def family(row: dict) -> str:  # the first prefix of the label's ("planner threshold" first)
        return next(prefix for prefix in families if row["label"].startswith(prefix))

    for prefix, (name, style) in families.items():
        members = [row for row in rows if family(row) == prefix]
        if not members:
            continue
        x = [row["calls_per_token"] for row in members]
        y, errors = zip(*(quality(row) for row in members), strict=True)
        axes.errorbar(x, y, yerr=errors, fmt=style, label=name, markersize=4, capsize=2)
        for i, (row, xi, yi) in enumerate(zip(members, x, y, strict=True)):
            axes.annotate(row["label"].split()[-1], (xi, yi), textcoords="offset points",
                          xytext=(4, 5 if i % 2 else -11), fontsize=7)  # neighbours apart
    if header.get("entropy_rate") is not None:
        axes.axhline(header["entropy_rate"], color="gray", linestyle=":",
                     label="the language's entropy (a perfect model)")
    axes.set_xscale("log")
    axes.set_xlabel("network calls per token (each sample's own)")
    axes.set_ylabel("true NLL per token (nats)" if header["exact_judge"] else "judge's score")
    axes.set_title(header["title"], fontsize=9)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata=png_provenance(header["provenance"]))


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, device, origin = sampling_model(args, JSON.made_by)
    n = sample_length(args, model.config.block_size)
    judge = None
    if args.judge:
        check_judge_matches(args.judge, origin)
        judge = Judge(args.judge, device)
    header = {"device": device_name(device), "seq_len": n, "num_samples": args.num_samples,
              "batch_sizes": args.batch_sizes, "dtype": str(next(model.parameters()).dtype),
              "exact_judge": judge is not None and judge.language is not None,
              "provenance": origin}
    rows = []
    for label, fields in settings(n, args.steps, args.drafts, args.planners, args.thresholds,
                                  args.trees, args.tree_depths, args.predrafts):
        row = measure(model, label, fields, args, n, judge, device)
        rows.append(row)
        value, error = quality(row)
        print(f"{label:28s} {row['calls_per_token']:.3f} calls/token, judge {value:.4f} +- "
              f"{error:.4f}, entropy {row['judge']['entropy']:.3f}", flush=True)
        if args.json:
            write_json_atomic({**header, "rows": [strip(r) for r in rows]}, args.json, indent=2)
    time_rows(rows, args, n, device)
    if header["exact_judge"]:
        header["entropy_rate"] = rows[0]["judge"]["entropy_rate"]
    header["title"] = (f"{model.config.family} {model.num_params() / 1e6:.2f}M, n = {n}, "
                       f"{args.num_samples} samples per point, {header['device']}")
    rows = [strip(row) for row in rows]
    if args.json:
        write_json_atomic({**header, "rows": rows}, args.json, indent=2)
    show_table(table(rows, header), args.table)
    if args.plot:
        plot(rows, header, args.plot)
        print(f"wrote {args.plot}")
    return 0


def strip(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "samplers"}


if __name__ == "__main__":
    sys.exit(main())
