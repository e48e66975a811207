"""The sampling race: an AO-GPT's exact left-to-right samples against a GPT of the same size, data
and steps sampling itself, side by side in one process.

    python benchmarks/sampling_race.py --ao RUN --gpt RUN [--judge DATA-or-MODEL]
        [--num-samples 256] [--batch-sizes 1,8,32] [--drafts 2,4] [--trees 1,3]
        [--tree-depths 0,3] [--predrafts 0,4] [--timed-batches 4] [--repeats 2]
        [--compile auto|on|off] [--threads T] [--seq-len N] [--seed 0]
        [--device auto] [--json OUT] [--table OUT.md] [--plot OUT.png] [--force]

It trains nothing: --ao is an AO-GPT run trained with the paper's mixture (10% of its orders left
to right: configs/synthetic.yaml), --gpt a left-to-right GPT of the same data, shape and steps
(configs/gpt_synthetic.yaml); the two must share their data and network shape. Every sampler
draws the same sample ids left to right, the order a GPT can read:
- GPT, one token per call: the baseline every speed-up is quoted against, at its best: its own
  static KV cache, the same batch, dtype and threads, and compiled where that is faster;
- AO-GPT, one token per call: the same network cost per token, for reference;
- AO-GPT speculative, K = each of --drafts, C = each of --trees (and L = each of --tree-depths
  for C > 1, R = each of --predrafts): `--order l2r --sampler speculative --draft K --tree C
  --tree-depth L --predraft R`, drafting the next K positions (C candidates each) from the
  AO-GPT's own marginals and verifying them in the next call. Its samples are exactly its
  one-token-per-call samples' distribution, in fewer calls.
For each it reports network calls per token (each sample's own; a batch runs until its slowest
sample is done), the drafts accepted, tokens per second at each batch size (each sampler eager
and compiled, per --compile, the faster kept; --timed-batches batches of other sample ids per
batch size, each the shortest of --repeats runs, the samplers interleaved so that load from other
processes hits them alike), and what the judge says of --num-samples samples: with a synthetic
language's data folder (data_prep/synthetic_to_mds.py) their exact true NLL per token, its
standard error and the language's entropy; always their unigram entropy and repetition rate.
The JSON is rewritten after every row (benchmarks/results.py); --table writes the markdown table
and --plot tokens per second against the judge's number, a panel per batch size
(docs/sampling-race.md shows both for the two synthetic languages). Under a launcher
(`torchrun --nproc-per-node N benchmarks/sampling_race.py ...`, trainer/ranks.py) every process
draws its share of the judged samples, the same samples as one process draws, and the first one
judges and times them alone.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from aogpt import UsageError, check_counts, cli_entry, comma_counts
from aogpt.files import OutputFile, check_output_file, png_provenance
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import locate_checkpoint, provenance, read_consolidated
from aogpt.model.orders import LEFT_TO_RIGHT
from aogpt.model.precision import device_name, reproducible_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.config import branch_depth, fresh_drafts
from aogpt.trainer.judge import (
    Judge,
    check_judge_matches,
    diversity,
    generative_perplexity,
)
from aogpt.trainer.ranks import RankShare

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race_table import BASELINE, quality, table  # noqa: E402
from results import ResultsFile, show_table  # noqa: E402
from sampling_model import timed  # noqa: E402

JSON = OutputFile("benchmarks/sampling_race.py", "race", (".json",))
TABLE = OutputFile("benchmarks/sampling_race.py", "table", (".md",))
PLOT = OutputFile("benchmarks/sampling_race.py", "plot", (".png",))
OUTPUTS = {"json": JSON, "table": TABLE, "plot": PLOT}
# what the two runs must share for the race to compare samplers, not models
SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


@dataclass(frozen=True)
class Contestant:
    label: str
    network: str  # "gpt" or "ao": which run samples
    fields: dict  # its SamplingConfig's settings


def contestants(n: int, drafts: list[int], trees: list[int], tree_depths: list[int] = (0,),
                predrafts: list[int] = (0,)) -> list[Contestant]:
    """The baseline first, then the AO-GPT one token per call, then speculative at each K, tree
    C, (C > 1) branch depth L and pre-drafts R."""
    one_per_call = {"steps": n, "order": LEFT_TO_RIGHT.word}

    def speculative(k: int, c: int, depth: int, r: int) -> Contestant:
        label = (f"AO-GPT speculative K={k}" + (f" C={c}" if c > 1 else "")
                 + (f" L={depth}" if depth else "") + (f" R={r}" if r else ""))
        return Contestant(label, "ao", {"sampler": "speculative", "draft": k, "tree": c,
                                        "tree_depth": depth, "predraft": r,
                                        "order": LEFT_TO_RIGHT.word})

    drafts = list(dict.fromkeys(min(k, n - 1) for k in drafts))
    return [Contestant(BASELINE, "gpt", one_per_call),
            Contestant("AO-GPT, one token per call", "ao", one_per_call),
            *(speculative(k, c, depth, r) for k in drafts for c in trees
              for depth in sorted({branch_depth(k, c, d) for d in tree_depths})
              for r in sorted({fresh_drafts(k, r) for r in predrafts}))]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    description, epilog = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ao", required=True, help="the AO-GPT: out_dir, checkpoint folder or model.safetensors")
    add("--gpt", required=True, help="the left-to-right GPT of the same data, shape and steps")
    add("--judge", help="a synthetic language's data folder (exact), or a judge model")
    add("--weights", choices=("ema", "raw"), default="ema", help="of both (default ema)")
    add("--num-samples", type=int, default=256, help="samples judged per sampler (default 256)")
    add("--batch-sizes", default="1,8,32", help="batch sizes timed (default 1,8,32)")
    add("--drafts", default="2,4", help="the AO-GPT's speculative K (default 2,4)")
    add("--trees", default="1,3", help="candidates per drafted position, C, at each K (default "
        "1,3; 1: a chain)")
    add("--tree-depths", default="0", help="trees: the positions verified on the branch of a "
        "candidate other than the first, L, at each K and C > 1, each at most K - 1 (default 0)")
    add("--predrafts", default="0", help="the drafts after a redrawn position drawn from rows "
        "that saw only final tokens, R, at each K, C and L, each at most K (default 0)")
    add("--timed-batches", type=int, default=4,
        help="batches of other sample ids timed per batch size (default 4)")
    add("--repeats", type=int, default=2, help="runs of each timed batch, the shortest kept "
        "(default 2)")
    add("--compile", choices=("auto", "on", "off"), default="auto",
        help="auto (default): each sampler eager and compiled (torch.compile), the faster kept; "
             "on: compiled only; off: eager only")
    add("--threads", type=int, help="torch threads for every sampler (default: torch's)")
    add("--seq-len", type=int, help="tokens per sample (default the models' block size)")
    add("--seed", type=int, default=0)
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    add("--json", type=Path, help="write the rows here (rewritten after every row)")
    add("--table", type=Path, help="the markdown table")
    add("--plot", type=Path, help="tokens per second against the judge's number (PNG)")
    add("--force", action="store_true", help="replace --json, --table and --plot if this "
        "benchmark wrote them")
    add("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    args = parser.parse_args(argv)
    check_counts(args, "num_samples", "timed_batches", "repeats", "threads", "seq_len")
    args.batch_sizes = comma_counts(args.batch_sizes, "--batch-sizes")
    args.drafts = comma_counts(args.drafts, "--drafts") if args.drafts else []
    args.trees = comma_counts(args.trees, "--trees")
    args.tree_depths = comma_counts(args.tree_depths, "--tree-depths", minimum=0)
    args.predrafts = comma_counts(args.predrafts, "--predrafts", minimum=0)
    for flag in OUTPUTS:
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}", args.force, OUTPUTS[flag])
    return args


# ---- the two runs ----------------------------------------------------------------------------


def load_run(path: str, flag: str, weights: str, device: torch.device) -> tuple:
    """(model in the sampling dtype, eval mode; its provenance; its training's order settings or
    None when the checkpoint records no run config)."""
    source = locate_checkpoint(path)
    if source.unfinished:
        print(f"{flag}: {source.unfinished_note()}", file=sys.stderr, flush=True)
    meta = read_consolidated(source.file, weights=())["meta"]
    model = load_checkpoint(source.file, weights=weights, map_location=device)
    model = model.to(reproducible_dtype(device)).eval()
    origin = provenance(source, weights, {}, made_by=JSON.made_by)
    return model, origin, (meta.get("run_config") or {}).get("order")


def check_pair(ao, gpt) -> None:
    """UsageError unless --ao reads any order and --gpt was trained left to right, on the same
    data, with the same network shape."""
    (ao_model, ao_origin, ao_order), (gpt_model, gpt_origin, gpt_order) = ao, gpt
    if not ao_model.config.any_order or (ao_order or {}).get("kind") == LEFT_TO_RIGHT.word:
        raise UsageError("--ao is a left-to-right model: give an AO-GPT run (trained with the "
                         "paper's mixture of orders, e.g. configs/synthetic.yaml)")
    if gpt_order is not None and gpt_order.get("kind") != LEFT_TO_RIGHT.word:
        raise UsageError(f"--gpt was trained on order.kind={gpt_order.get('kind')} orders, not "
                         f"left to right: give a GPT run (configs/gpt_*.yaml)")
    for name in SHAPE:
        theirs, ours = getattr(gpt_model.config, name), getattr(ao_model.config, name)
        if theirs != ours:
            raise UsageError(f"--ao has model.{name}={ours}, --gpt {theirs}: the race compares "
                             "samplers of networks of one size (configs/gpt_*.yaml are the "
                             "GPTs of the AO-GPT presets)")
    data = [[t.get("language_sha256") or t.get("name") for t in origin.get("data_tokenizers")
             or []] for origin in (ao_origin, gpt_origin)]
    if all(data) and data[0] != data[1]:
        raise UsageError(f"--ao was trained on {', '.join(map(str, data[0]))} data, --gpt on "
                         f"{', '.join(map(str, data[1]))}: give runs of the same data")


# ---- measuring -------------------------------------------------------------------------------


def judged(model, contestant: Contestant, args, n: int, judge: Judge | None,
           device: torch.device, share: RankShare) -> dict | None:
    """A contestant's row: its calls and what the judge says of --num-samples samples (drawn
    eagerly, at the widest batch; each rank of a launch draws its share of the batches, and rank
    0 alone gets the row, the others None)."""
    config = SamplingConfig(seed=args.seed, **contestant.fields)
    widest = max(args.batch_sizes)
    sampler = KVCacheSampler(model, widest, n, config, compile=False)
    drawn = []  # per batch of this rank's share: tokens, each sample's calls, drafts
    for first in share.mine(list(range(0, args.num_samples, widest))):
        out, _ = timed(sampler, torch.arange(first, min(first + widest, args.num_samples)), device)
        drawn.append((out.tokens.tolist(), out.sample_calls.tolist(),
                      int(out.stats.get("drafts_decided", torch.zeros(1)).sum()),
                      int(out.stats.get("drafts_accepted", torch.zeros(1)).sum())))
    drawn = share.gather(drawn)
    if drawn is None:
        return None
    tokens = [text for batch in drawn for text in batch[0]]
    calls = [count for batch in drawn for count in batch[1]]
    decided, accepted = sum(batch[2] for batch in drawn), sum(batch[3] for batch in drawn)
    return {"label": contestant.label, "network": contestant.network,
            "settings": asdict(config), "samples": len(tokens),
            "calls_per_token": sum(calls) / len(calls) / n,
            "acceptance": accepted / decided if decided else None,
            "judge": (generative_perplexity(tokens, judge, progress=False) if judge is not None
                      else diversity(tokens))}


def ways_to_run(args) -> list[str]:
    """'eager', 'compiled' or both, by --compile (auto: both, the faster kept)."""
    return {"on": ["compiled"], "off": ["eager"]}.get(args.compile, ["eager", "compiled"])


def time_rows(rows: list[dict], models: dict, args, n: int, device: torch.device) -> None:
    """Tokens per second of every row at every batch size, and its batch's calls per token."""
    ways = ways_to_run(args)
    for size in args.batch_sizes:
        samplers = {}
        for row in rows:
            for way in ways:
                sampler = KVCacheSampler(models[row["network"]], size, n,
                                         SamplingConfig(**row["settings"]),
                                         compile=way == "compiled")
                timed(sampler, torch.arange(size) + 10**6, device)  # warm-up (and compiling)
                samplers[row["label"], way] = sampler
                print(f"batch {size}: {row['label']}, {way} ready"
                      + (f" (compiled in {sampler.setup_seconds:.0f} s)" if sampler.compiled
                         else ""), flush=True)
        seconds = {key: 0.0 for key in samplers}
        calls, batch_calls = {row["label"]: 0 for row in rows}, {}
        for batch in range(args.timed_batches):
            ids = torch.arange(batch * size, (batch + 1) * size)
            best = {key: math.inf for key in samplers}
            for _ in range(args.repeats):
                for key, sampler in samplers.items():  # interleaved: load hits all alike
                    out, took = timed(sampler, ids, device)
                    best[key] = min(best[key], took)
                    batch_calls[key[0]] = out.network_calls  # the same each run: ids key draws
            for key in samplers:
                seconds[key] += best[key]
            for label in calls:
                calls[label] += batch_calls[label]
        tokens = size * n * args.timed_batches
        for row in rows:
            rates = {way: tokens / seconds[row["label"], way] for way in ways}
            fastest = max(rates, key=rates.get)
            row.setdefault("tokens_per_s", {})[size] = rates[fastest]
            row.setdefault("timing", {})[size] = {
                "tokens_per_s": rates, "fastest": fastest,
                "compiled": samplers[row["label"], ways[-1]].compiled,
                "compile_s": samplers[row["label"], ways[-1]].setup_seconds,
                "batch_calls_per_token": calls[row["label"]] / args.timed_batches / n}
        baseline = next(row for row in rows if row["label"] == BASELINE)["tokens_per_s"][size]
        for row in rows:
            row.setdefault("speedup", {})[size] = row["tokens_per_s"][size] / baseline
            print(f"batch {size}: {row['label']:32s} {row['tokens_per_s'][size]:10,.0f} tokens/s "
                  f"({row['speedup'][size]:.2f}x the GPT; {row['timing'][size]['fastest']})",
                  flush=True)


# ---- reporting -------------------------------------------------------------------------------


def plot(rows: list[dict], header: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = header["batch_sizes"]
    figure, panels = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes) + 1, 4), sharey=True,
                                  squeeze=False)
    for panel, size in zip(panels[0], sizes, strict=True):
        for row in rows:
            value, error = quality(row)
            style = ("ks" if row["label"] == BASELINE else "o" if row["network"] == "gpt"
                     or "one token" in row["label"] else "D")
            panel.errorbar(row["tokens_per_s"][size], value, yerr=error, fmt=style, capsize=2,
                           markersize=5, label=row["label"])
        if header.get("entropy_rate") is not None:
            panel.axhline(header["entropy_rate"], color="gray", linestyle=":",
                          label="the language's entropy")
        panel.set_xlabel(f"tokens/s, batch {size}")
        panel.set_title(f"batch {size}", fontsize=9)
    panels[0][0].set_ylabel("true NLL per token (nats)" if header["exact_judge"]
                            else "judge's score")
    panels[0][-1].legend(fontsize=7)
    figure.suptitle(header["title"], fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata=png_provenance(header["provenance"]))


def load_pair(args, device: torch.device) -> tuple:
    """The two runs, checked against each other, the sequence length and the judge."""
    ao = load_run(args.ao, "--ao", args.weights, device)
    gpt = load_run(args.gpt, "--gpt", args.weights, device)
    check_pair(ao, gpt)
    n = args.seq_len or ao[0].config.block_size
    if not 2 <= n <= ao[0].config.block_size:
        raise UsageError(f"--seq-len must be in 2..{ao[0].config.block_size}, got {n}")
    if args.judge:
        for origin in (ao[1], gpt[1]):
            check_judge_matches(args.judge, origin)
    return ao, gpt, n


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    share = RankShare.join()
    device = resolve_device(args.device, own=share.env.device)
    ao, gpt, n = share.checked(lambda: load_pair(args, device))
    models = {"ao": ao[0], "gpt": gpt[0]}
    judge = Judge(args.judge, device) if args.judge and share.is_main else None
    header = race_header(args, ao, gpt, n, judge, device, share)
    results = ResultsFile(args.json if share.is_main else None, {**header, "rows": []})
    rows = results.data["rows"]
    for contestant in contestants(n, args.drafts, args.trees, args.tree_depths, args.predrafts):
        row = judged(models[contestant.network], contestant, args, n, judge, device, share)
        if row is None:
            continue  # rank 0 judges and times: the others only draw their share
        rows.append(row)
        value, error = quality(row)
        print(f"{contestant.label:32s} {row['calls_per_token']:.3f} calls/token, judge "
              f"{value:.4f} +- {error:.4f}, unigram entropy {row['judge']['entropy']:.3f}",
              flush=True)
        results.row_done()
    if not share.is_main:
        return 0
    time_rows(rows, models, args, n, device)
    report(rows, results, header, args, ao[0], gpt[0])
    return 0


def race_header(args, ao: tuple, gpt: tuple, n: int, judge: Judge | None,
                device: torch.device, share: RankShare) -> dict:
    """What the JSON records besides the rows: the machine, the settings and the two runs (a
    note when they were saved at different steps)."""
    runs = {name: {"parameters": run[0].num_params(), "family": run[0].config.family,
                   "step": run[1].get("step"), "checkpoint": run[1].get("checkpoint"),
                   "order": run[2]} for name, run in (("ao", ao), ("gpt", gpt))}
    if share.is_main and runs["ao"]["step"] != runs["gpt"]["step"]:
        print(f"note: the AO-GPT was saved at step {runs['ao']['step']}, the GPT at "
              f"{runs['gpt']['step']}", file=sys.stderr, flush=True)
    return {"device": device_name(device), "threads": torch.get_num_threads(),
            "dtype": str(next(ao[0].parameters()).dtype), "seq_len": n,
            "num_samples": args.num_samples, "batch_sizes": args.batch_sizes,
            "exact_judge": judge is not None and judge.language is not None,
            "processes": share.world_size, "runs": runs,
            "provenance": provenance(None, args.weights, vars(args), made_by=JSON.made_by,
                                     ao=ao[1], gpt=gpt[1])}


def report(rows: list[dict], results: ResultsFile, header: dict, args, ao, gpt) -> None:
    """The JSON finished, the table printed and written, the picture drawn."""
    if header["exact_judge"]:
        results.data["entropy_rate"] = rows[0]["judge"]["entropy_rate"]
    results.data["title"] = (f"{ao.config.family} {ao.num_params() / 1e6:.2f}M against a "
                             f"{gpt.config.family} {gpt.num_params() / 1e6:.2f}M, n = "
                             f"{header['seq_len']}, {header['device']}")
    results.finish()
    show_table(table(rows, results.data), args.table)
    if args.plot:
        plot(rows, results.data, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
