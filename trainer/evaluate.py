"""Zero-shot evaluation of a checkpoint: left-to-right NLL, any-order bound, context-order ensemble.

    python trainer/evaluate.py --ckpt PATH --data DIR [--data DIR2 ...] [--orders l2r,random]
        [--num-orders K] [--ensemble M[,M2,...]] [--ensemble-targets N] [--weights ema|raw]
        [--json OUT [--force]] [--batch-size B] [--max-samples N] [--seed S]
        [--precision fp32|bf16] [--unigram-from PRETRAIN_DIR] [--planners margin,confidence]
    torchrun --nproc_per_node 8 trainer/evaluate.py ...      (or deepspeed, or srun)

--ckpt is a training out_dir (its final/ weights; a run that has not finished is read through its
latest checkpoint, which a line on stderr says), a checkpoint folder, a consolidated
model.safetensors, or a paper checkpoint converted by tools/import_official.py. The checkpoint
file read, its tag and its step are printed first. --data is a folder made by data_prep:
a pretraining folder is scored on its val split, an eval set on its only split. With several
processes each scores a disjoint strided slice of the samples and the sums are all-reduced.
Prints a table (nll in nats per token, ppl, tokens, cost) and writes the same as JSON (--json;
an existing file is replaced only with --force):
    {"checkpoint", "weights", "model": {...}, "precision", "precision_policy", "world_size",
     "settings": {...}, "provenance": {"checkpoint" (the file read), "tag", "step", "weights",
        "settings" (every flag), "aogpt_version", "git_sha", ...},
     "results": [{"data", "dataset", "split", "samples", "seq_len",
        "l2r": {"nll", "ppl", "tokens", "forwards", "token_forwards", "wall_s"},
        "random": {... same, "num_orders", "nll_std" (over the orders), "nll_per_order"},
        "unigram": {"nll", "ppl", "tokens", "counted_tokens", "counts_from"} (--unigram-from),
        "ensemble": {"base", "members", "targets_per_sequence", "tokens", "scored_targets",
                     "by_members": {"M": {"nll", "ppl", "nll_se"}}, "forwards",
                     "token_forwards", "paper_token_forwards", "wall_s"}}, ...]}
token_forwards counts the slots run through the network (the cost); paper_token_forwards is what
the paper's ensemble script would run for the same scores. What each score means and how the
ensemble is computed: trainer/evaluation.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import aogpt
from aogpt import UsageError, check_unique, cli_entry, comma_counts
from aogpt.files import OutputFile, check_output_file, write_json_atomic
from aogpt.model import AOGPT, load_checkpoint
from aogpt.model.checkpoint import (
    CheckpointSource,
    describe_provenance,
    locate_checkpoint,
    provenance,
)
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT, READING_WORDS, READINGS
from aogpt.model.precision import resolve_device
from aogpt.model.sampler.ways import named
from aogpt.trainer.dist_env import DistEnv, setup_distributed_env
from aogpt.trainer.evaluation import (
    PRECISIONS,
    EvalData,
    EvalSettings,
    Evaluator,
    unigram_reference,
)

# --json; an earlier report without made_by is known by its keys
REPORT = OutputFile("trainer/evaluate.py", "evaluation report", (".json",),
                    signature=("results", "settings", "precision_policy"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--data", required=True, action="append", metavar="DIR",
        help="data folder made by data_prep, or s3://BUCKET/PREFIX; repeat for several")
    add("--orders", default=None, help="comma list of "
        f"{', '.join(reading.spelled() for reading in READINGS)}; default: every reading "
        f"({LEFT_TO_RIGHT.word} for a left-to-right GPT); 'none' to run only the ensemble")
    add("--num-orders", type=int, default=4, help="K random orders per sequence (default 4)")
    add("--ensemble", default="", metavar="M[,M2,...]",
        help="context-order ensemble sizes, e.g. 1,2,4,8,16,32,64: the largest is run and "
        "every size is the average over its first members (default: no ensemble)")
    add("--ensemble-targets", type=int, default=None, metavar="N",
        help="score N targets per sequence, drawn uniformly without replacement (default: all); "
        "the mean NLL is then an unbiased estimate with a standard error (N >= 2)")
    add("--ensemble-base", default=ANY_ORDER.word,
        help=f"the order whose contexts are re-permuted: {' or '.join(READING_WORDS)} "
        f"(default {ANY_ORDER.word}, as the paper; aliases as for --orders)")
    add("--planners", default="", metavar="P[,P2,...]",
        help="also score each text along the order a planner takes revealing its own tokens "
             f"({', '.join(named('planner'))}): an exact likelihood, at about n^2/2 rows per "
             "sequence")
    add("--weights", choices=("ema", "raw"), default="ema", help="default ema (as the paper)")
    add("--unigram-from", type=Path, default=None, metavar="DIR",
        help="also score a context-free reference: the token frequencies of this pretraining "
        "folder's train split (the level a model reaches before it uses any context)")
    add("--json", type=Path, default=None, metavar="OUT", help="also write the results here")
    add("--force", action="store_true", help="replace the --json file if it exists")
    add("--batch-size", type=int, default=8,
        help="sequences per forward; ensemble forwards hold as many slots (default 8)")
    add("--max-samples", type=int, default=None, metavar="N",
        help="score only the first N samples of each folder")
    add("--seed", type=int, default=0, help="seed of the orders, members and targets (default 0)")
    add("--precision", choices=tuple(PRECISIONS), default="fp32",
        help="fp32 (default; the paper's AO-GPT evaluations) or bf16 autocast")
    add("--device", default="auto",
        help="auto (the local rank's GPU when there is one, else cpu), cpu, cuda, cuda:N")
    add("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    return parser.parse_args(argv)


def parse_sizes(text: str) -> tuple[int, ...]:
    """"1,2,4" -> (1, 2, 4): the ensemble sizes, ascending (each given once)."""
    return tuple(sorted(comma_counts(text, "--ensemble"))) if text else ()


def settings_from_args(args: argparse.Namespace, any_order: bool) -> EvalSettings:
    """The settings the flags ask for; a list that names a thing twice (an order, by any of its
    names; a planner; an ensemble size) is refused: it would be scored twice into one row."""
    if args.orders is None:
        orders = READING_WORDS if any_order else (LEFT_TO_RIGHT.word,)
    else:
        orders = tuple(kind for kind in args.orders.split(",") if kind not in ("", "none"))
    planners = tuple(p for p in args.planners.split(",") if p)
    check_unique(planners, "--planners", args.planners)
    settings = EvalSettings(orders=orders, num_orders=args.num_orders,
                            ensemble=parse_sizes(args.ensemble),
                            ensemble_targets=args.ensemble_targets,
                            ensemble_base=args.ensemble_base, batch_size=args.batch_size,
                            max_samples=args.max_samples, seed=args.seed,
                            precision=args.precision, planners=planners)
    check_unique(settings.orders, "--orders", args.orders or "")
    return settings


def describe_model(model, weights: str) -> str:
    c = model.config
    return (f"{c.family}, {c.n_layer} layers x {c.n_embd}, block "
            f"{c.block_size}, {model.num_params() / 1e6:.2f}M parameters, {weights} weights")


def format_table(results: list[dict]) -> str:
    """The results of every --data folder as a plain-text table."""
    header = (f"{'dataset':<14} {'kind':<14} {'nll':>8} {'ppl':>10} {'± (nll)':>9} {'tokens':>11} "
              f"{'forwards':>10} {'token-fwd':>13} {'time s':>8}")
    lines = [header, "-" * len(header)]
    for result in results:
        name = result["dataset"]
        planned = [kind for kind in result if kind.startswith("planner ")]
        for kind in ("unigram", *READING_WORDS, *planned, "ensemble"):
            if kind not in result:
                continue
            row = result[kind]
            if kind == "unigram":
                lines.append(_line(name, "unigram (ref)", row["nll"], row["ppl"], None,
                                   row["tokens"], ""))
                continue
            cost = (f"{row['forwards']:>10,} {row['token_forwards']:>13,} {row['wall_s']:>8.1f}")
            if kind == "ensemble":
                for m, score in row["by_members"].items():
                    lines.append(_line(name, f"ensemble M={m}", score["nll"], score["ppl"],
                                       score["nll_se"], row["tokens"], cost))
                    cost = ""  # the cost is that of all sizes together
                continue
            label = f"{kind} x{row['num_orders']}" if kind == ANY_ORDER.word else kind
            spread = row.get("nll_std")
            lines.append(_line(name, label, row["nll"], row["ppl"], spread, row["tokens"], cost))
    lines.append(f"nll: nats per token. {ANY_ORDER.word} and ensemble average over orders: their "
                 f"ppl is an upper bound. ±: std over the orders ({ANY_ORDER.word}), standard "
                 "error of the target sampling (ensemble). unigram (ref): token frequencies of the "
                 "training data, no context. planner: the exact likelihood along the order the "
                 "planner takes, revealing the text's own tokens")
    return "\n".join(lines)


def _line(name: str, label: str, nll: float, ppl: float, spread: float | None, tokens: int,
          cost: str) -> str:
    spread_text = "" if spread is None else f"{spread:.4f}"
    return f"{name:<14} {label:<14} {nll:>8.4f} {ppl:>10.3f} {spread_text:>9} {tokens:>11,} {cost}"


def report_costs(results: list[dict]) -> str:
    lines = []
    for result in results:
        ensemble = result.get("ensemble")
        if ensemble and ensemble["members"] > 1:
            ratio = ensemble["paper_token_forwards"] / ensemble["token_forwards"]
            lines.append(f"{result['dataset']} ensemble cost: {ensemble['token_forwards']:,} "
                         f"token-forwards for {ensemble['scored_targets']:,} targets x "
                         f"{ensemble['members']} members; the paper's script: "
                         f"{ensemble['paper_token_forwards']:,} ({ratio:.1f}x more), "
                         "with all logits")
    return "\n".join(lines)


def open_data(folder: str, block_size: int, max_samples: int | None,
              vocab_size: int | None = None) -> EvalData:
    data = EvalData(folder, block_size, max_samples, vocab_size=vocab_size)
    if data.num_samples == 0:
        raise UsageError(f"--data {folder}: its {data.split} split holds no samples, so there "
                         "is nothing to score: rebuild the folder from more text, or for a "
                         "pretraining folder with a larger --val-fraction")
    return data


@dataclass
class EvalPlan:
    """Everything checked before any process group exists, to score with."""

    device: torch.device
    source: CheckpointSource
    model: AOGPT  # on the device
    settings: EvalSettings
    data: list[EvalData]
    unigrams: list[dict | None]  # by folder of `data`, with --unigram-from


def preflight(args: argparse.Namespace, dist_env: DistEnv) -> EvalPlan:
    """Every check that can fail on user input, before any process group exists."""
    if args.json is not None:
        check_output_file(args.json, "--json", args.force, REPORT)
    device = resolve_device(args.device, own=dist_env.device)
    source = locate_checkpoint(args.ckpt)
    model = load_checkpoint(source.file, weights=args.weights)
    settings = settings_from_args(args, model.config.any_order)
    settings.validate(model)
    data = [open_data(folder, model.config.block_size, settings.max_samples,
                      model.config.vocab_size)
            for folder in args.data]
    per_example = [d.name for d in data if d.manifest.get("settings", {}).get("packing")
                   == "per_example"]
    if settings.planners and per_example:
        raise UsageError(f"--planners scores whole sequences; {', '.join(per_example)} holds "
                         "padded per-example samples (a planner would read the padding, and with "
                         "it each text's length, first): score them with --orders")
    unigrams = [None if args.unigram_from is None else unigram_reference(args.unigram_from, folder)
                for folder in data]
    return EvalPlan(device, source, model.to(device), settings, data, unigrams)


def join_processes(device: torch.device, dist_env: DistEnv) -> None:
    """With several processes, the group whose sums make every score."""
    if dist_env.world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def announce(plan: EvalPlan, args: argparse.Namespace, world_size: int) -> dict:
    """Rank 0: says what is scored, how and where; the provenance the report records."""
    origin = provenance(plan.source, args.weights, vars(args), made_by=REPORT.made_by)
    if plan.source.unfinished:
        print(plan.source.unfinished_note(), file=sys.stderr, flush=True)
    print(f"evaluating {plan.source.file} ({describe_provenance(origin)}): "
          f"{describe_model(plan.model, args.weights)}\n"
          f"on {world_size} x {plan.device.type}, precision {plan.settings.precision} "
          f"({PRECISIONS[plan.settings.precision]}), seed {plan.settings.seed}", flush=True)
    return origin


def score(plan: EvalPlan, dist_env: DistEnv) -> list[dict]:
    """The results of every --data folder (collective), with its unigram reference."""
    evaluator = Evaluator(plan.model, plan.settings, plan.device, dist_env.rank,
                          dist_env.world_size)
    results = [evaluator.score_data(folder, progress=dist_env.is_main) for folder in plan.data]
    for result, unigram in zip(results, plan.unigrams, strict=True):
        if unigram is not None:
            result["unigram"] = unigram
    return results


def report(results: list[dict], plan: EvalPlan, args: argparse.Namespace, origin: dict,
           world_size: int) -> None:
    """Rank 0: the table, the ensemble's cost, and the --json report."""
    print(format_table(results))
    costs = report_costs(results)
    if costs:
        print(costs)
    if args.json is None:
        return
    c, settings = plan.model.config, plan.settings
    write_json_atomic({
        "checkpoint": str(args.ckpt), "weights": args.weights,
        "model": {"kind": c.family, **{
            name: getattr(c, name) for name in
            ("target_injection", "n_layer", "n_head", "n_embd", "block_size")},
            "params": plan.model.num_params()},
        "precision": settings.precision, "precision_policy": PRECISIONS[settings.precision],
        "device": plan.device.type, "world_size": world_size,
        "settings": dataclasses.asdict(settings), "provenance": origin,
        "results": results,
        "aogpt_version": aogpt.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }, args.json)
    print(f"wrote {args.json}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist_env = setup_distributed_env()
    try:
        plan = preflight(args, dist_env)
    except UsageError:
        if dist_env.rank != 0:
            return 2  # every rank sees the same problem: rank 0 alone says it
        raise
    join_processes(plan.device, dist_env)
    origin = announce(plan, args, dist_env.world_size) if dist_env.is_main else {}
    results = score(plan, dist_env)
    if dist_env.is_main:
        report(results, plan, args, origin, dist_env.world_size)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
