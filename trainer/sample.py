"""Generate text with an AO-GPT checkpoint: any-order sampling with a KV cache.

    python trainer/sample.py --ckpt PATH [--num-samples N] [--seq-len L | --length L [--window W]]
        [--stop-at-eos] [--stop-entropy H]
        [--sampler parallel [--steps S] [--schedule linear|cosine]
         [--counts deterministic|binomial]
         | --sampler speculative [--draft K] [--tree C [--tree-depth L]]]
        [--planner random|l2r|confidence|margin|entropy|threshold [--reveal R] [--threshold P]
         [--candidates C] [--block B]]
        [--temperature T] [--top-p P] [--top-k K] [--prompt TEXT] [--infill JSON-or-file]
        [--seed X] [--out FILE.jsonl] [--record-calls] [--html FILE.html] [--force]
        [--order random|l2r] [--weights ema|raw]
        [--batch-size B] [--judge PATH] [--long-run]
    torchrun --nproc-per-node N trainer/sample.py ...      # the batches spread over N processes

Every sample fixes its generation order up front (the prompt and infill positions first, then
the rest in random or left-to-right order). Two samplers (model/sampler/):
  parallel     (default) the paper's: reveals the rest in S network calls, several tokens per call
               drawn independently (linear or cosine schedule, the paper's deterministic counts or
               exact Binomial ones, Lemma 1). S = L is exact ancestral sampling; fewer calls depart
               from the model's joint distribution.
  speculative  exactly the joint of S = L (one token per call) in fewer calls: each call drafts K
               positions ahead from the model's own marginals and verifies the earlier drafts
               along the order (any-subset speculative decoding, arXiv 2504.20456), --tree C
               candidates for each drafted position. It decides its own number of calls: at most
               one per token, fewer as drafts are accepted. `--order l2r --sampler speculative`
               is left-to-right text (a GPT's kind) from an AO-GPT, exactly, in fewer calls.
Or the model chooses the order as it goes (--planner, model/sampler/planners.py): each call
scores candidate positions (every remaining one, --candidates C of them, or those of the current
--block of B positions) against the exact cache and reveals the --reveal R best by confidence (top
probability), margin (top-1 minus top-2) or entropy, or every candidate whose top probability
reaches --threshold P (threshold, at least one). --planner random and l2r are the fixed orders
(--order). A planner's sample records the order it took and its exact log-likelihood along it
(with R = 1 each token comes from its exact conditional, so it is the sample's log-probability
under the planner's own process). Each way takes its own flags only (model/sampler/ways.py: the
groups below); a flag of another way is refused.
Sample i's order and tokens depend only on (--seed, i), not on the batch size. Under a launcher
(torchrun, deepspeed or srun; trainer/ranks.py) each process draws its share of the batches, on
its own device, and the first writes --out: the one-process file's records (all but time_s,
each batch's own seconds), and judges them.
--length L past the block size slides a window (model/sampler/window.py): each chunk after the
first keeps the last --window W tokens (default half the block) as given tokens and generates the
next block - W positions, until L. --stop-at-eos ends a text after its second end-of-text token,
--stop-entropy H when the unigram entropy of its last 256 tokens falls below H nats (repetition);
records then carry length, seams (where each chunk began generating) and stopped (why).
Progress counts chunks (or batches), with the time left; a run of many network calls is timed
on one chunk first and its estimate said, and one estimated past a day needs --long-run.
A model of a synthetic language (data_prep/synthetic_to_mds.py) writes and reads its text as
token ids ("17 3 95"); judge its samples with --judge on its data folder (exact probabilities).

--infill places text at token positions: a JSON object (or a file holding one) mapping a start
position to a string or a list of token ids, e.g. '{"0": "The city of", "40": [13, 383]}'.
--prompt TEXT is the same as '{"0": TEXT}'.
--out writes one JSON object per sample (an existing file is replaced only with --force): sample,
tokens, text, order, given_positions, network_calls (the sample's own), batch_network_calls,
drafts_decided and drafts_accepted (speculative), log_likelihood (planners), time_s (seconds of
its batch), the sampler's settings, and provenance: the checkpoint file read (a run that has not
finished is read through its latest checkpoint, which a line on stderr says), its tag and step,
the weights, every flag and the code's version and commit. --record-calls adds each sample's
network calls: per call, the positions it made final, the speculative sampler's drafts and which
it accepted or rejected, a planner's best candidates and their scores (model/sampler/recording.py;
it costs < 5% of sampling, benchmarks/record_calls.py). --html writes a page that replays the
samples call by call in a browser, with no server and no network (docs/replay.md); it records the
calls too. --judge PATH also reports the generative perplexity (a local Hugging Face GPT-2 folder
or a checkpoint of this project; see trainer/genppl.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from aogpt import UsageError, check_counts, check_input_file, cli_entry
from aogpt.data_prep.synthetic import TokenIds
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.files import OutputFile, check_output_file, write_text_atomic
from aogpt.model import AOGPT, load_checkpoint
from aogpt.model.checkpoint import describe_provenance, locate_checkpoint, provenance
from aogpt.model.orders import ANY_ORDER, READING_WORDS, READINGS, reading_named
from aogpt.model.precision import reproducible_dtype, resolve_device
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, given_tokens, sample_records
from aogpt.model.sampler.ways import (
    DEFAULT_SAMPLER,
    FIXED_ORDER,
    OPTIONS,
    SAMPLERS,
    WAYS,
    Room,
    Way,
    named,
    reading,
)
from aogpt.model.sampler.window import (
    STOP_ENTROPY_TOKENS,
    StopRules,
    check_window,
    chunks,
    generate_long,
)
from aogpt.progress import duration, progress
from aogpt.trainer.judge import (
    Judge,
    check_judge,
    check_judge_matches,
    format_report,
    generative_perplexity,
)
from aogpt.trainer.ranks import RankShare
from aogpt.trainer.replay import Pieces, write_page

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# A run of this many network calls or more is timed on one chunk first and its length estimated:
# past a day it needs --long-run (a typo's extra zeros would otherwise sample for days, silent)
TIMED_FROM_CALLS = 2_000
LONG_RUN_S = 24 * 3600
# --compile auto's threshold: compiling costs seconds per call shape (a run has 10 to 20 of them)
# and saves a fraction of a millisecond per call on a GPU, so it pays over tens of thousands of
# calls; an estimate until benchmarks/gpu_report.py measures both on a GPU
COMPILE_PAYS_CALLS = 50_000
# --out; earlier samples without made_by are known by their records' keys
SAMPLES = OutputFile("trainer/sample.py", "sample file", (".jsonl",),
                     signature=("sample", "tokens", "network_calls", "settings"))
PAGE = OutputFile("trainer/sample.py", "replay page", (".html",))  # --html
# --planner: the fixed orders by their reading's word, then the model's planners
PLANNER_CHOICES = (ANY_ORDER.word, *(word for word in READING_WORDS if word != ANY_ORDER.word),
                   *named("planner"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--weights", choices=("ema", "raw"), default="ema", help="default ema (as the paper)")
    add("--num-samples", type=int, default=4, help="how many sequences (default 4)")
    add("--batch-size", type=int, default=None,
        help="sequences per batch (default: all, at most 32)")
    add("--seq-len", type=int, default=None, help="tokens per sequence (default: the block size)")
    add("--length", type=int, default=None,
        help="tokens per text, past the block size too (a sliding window; default --seq-len)")
    add("--window", type=int, default=None,
        help="--length past the block: tokens each chunk keeps from the text so far (default "
             "half the block)")
    add("--stop-at-eos", action="store_true", help="end each text after its second end-of-text")
    add("--stop-entropy", type=float, default=None, metavar="H",
        help=f"end a text when the unigram entropy of its last {STOP_ENTROPY_TOKENS} tokens "
             "falls below H nats")
    add("--order", default=None, help="order of the positions not given: "
        f"{' or '.join(reading.spelled() for reading in READINGS)} (default {ANY_ORDER.word})")
    add("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    add("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1 = off)")
    add("--top-p-rule", choices=("paper", "standard"), default="paper",
        help="paper (default, as the paper's generative perplexities): keep tokens up to where "
             "the mass exceeds P (nucleus mass <= P); standard: the smallest set reaching P")
    add("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0 = off)")
    add("--prompt", default=None, help="text the samples start with")
    add("--infill", default=None, metavar="JSON-or-file", help="text at given positions (above)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, default=None, metavar="FILE.jsonl", help="write the samples here")
    add("--record-calls", action="store_true",
        help="record each sample's network calls in its record (what each made final, drafted, "
             "accepted, rejected; a planner's best candidates)")
    add("--html", type=Path, default=None, metavar="FILE.html",
        help="write a page that replays the samples call by call (records the calls)")
    add("--force", action="store_true", help="replace the --out and --html files if they exist")
    add("--show", type=int, default=4, help="samples printed to the terminal (default 4)")
    add("--judge", default=None, help="also score the samples: local HF GPT-2 folder or checkpoint")
    add("--judge-weights", choices=("ema", "raw"), default="ema",
        help="weights of a project-checkpoint judge (default ema)")
    add("--judge-batch-size", type=int, default=8)
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    add("--dtype", choices=("auto", *DTYPES), default="auto", help="auto: bf16 on a GPU, else fp32")
    add("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
        help="capture each call shape once as a CUDA graph and replay it: auto (default) = on a "
             "GPU; a failed capture warns once and runs eagerly")
    add("--compile", choices=("auto", "on", "off"), default="auto",
        help="compile each call shape with torch.compile (inductor): faster calls for seconds of "
             f"compiling per shape; auto (default) = on a GPU for runs of at least "
             f"{COMPILE_PAYS_CALLS:,} network calls; a failure warns once and runs eagerly")
    add("--tokenizer-file", default=None, help="GPT-2 ranks file (offline tokenizer)")
    add("--long-run", action="store_true",
        help="start even when the run's estimate is over a day (else refused, with it)")
    add("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    add_way_flags(parser)
    return parser.parse_args(argv)


def spelled(ways: tuple[Way, ...]) -> str:
    """How flags name some ways: '--sampler parallel', '--planner confidence or margin'."""
    pickers = dict.fromkeys(way.picked_by for way in ways)
    return " or ".join(f"--{picker} " + " or ".join(way.name for way in ways
                                                    if way.picked_by == picker)
                       for picker in pickers)


def add_way_flags(parser: argparse.ArgumentParser) -> None:
    """--sampler and --planner, then each way's flags (model/sampler/ways.py), grouped by the
    ways that read them; left out, a flag is None (the way's default)."""
    pick = parser.add_argument_group("the way tokens are chosen (model/sampler/ways.py)")
    pick.add_argument("--sampler", choices=SAMPLERS, default=None, help="; ".join(
        f"{name}: {WAYS[name].about}" for name in SAMPLERS) + f" (default {DEFAULT_SAMPLER})")
    pick.add_argument("--planner", default=None, metavar="|".join(PLANNER_CHOICES), help=(
        f"who orders the positions: {' or '.join(READING_WORDS)} (fixed up front, as --order), "
        "or the model call by call: " + "; ".join(
            f"{name} {WAYS[name].about}" for name in named("planner")) + " (default: --order)"))
    groups: dict[tuple[Way, ...], argparse._ArgumentGroup] = {}
    for option in OPTIONS:
        readers = reading(option)
        if readers not in groups:
            groups[readers] = parser.add_argument_group(f"read by {spelled(readers)}")
        groups[readers].add_argument(option.flag, type=option.type, choices=option.choices,
                                     default=None, metavar=option.metavar, help=option.help)


INFILL_EXAMPLE = '\'{"0": "Once upon a time"}\''


def read_infill(spec: str) -> dict:
    """The --infill JSON object: the argument itself when it reads as JSON, else the file it
    names."""
    if spec.lstrip().startswith(("{", "[")):
        text, source = spec, "--infill"
    else:
        expected = f"a file holding a JSON object, or the object itself, e.g. {INFILL_EXAMPLE}"
        text, source = check_input_file(spec, "--infill", expected).read_text(), f"--infill {spec}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{source} is not valid JSON ({err}): give e.g. {INFILL_EXAMPLE}") from err
    if not isinstance(value, dict):
        raise UsageError("--infill must be a JSON object mapping start positions to text or ids")
    return value


def given_by_flags(encoding, length: int, prompt: str | None, infill: dict | None,
                   length_flag: str = "--seq-len") -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens and mask that --prompt and --infill give in a text of `length` tokens
    (given_tokens); what is wrong with them is said naming those flags."""
    try:
        return given_tokens(length, prompt, infill, encoding)
    except UsageError as err:
        flags = " and ".join(flag for flag, value in (("--prompt", prompt), ("--infill", infill))
                             if value is not None)
        raise UsageError(f"{flags} ({length_flag} {length}): {err}") from None


def window_summary(records: list[dict], length: int, window: int | None) -> str:
    stopped = [r["stopped"] for r in records if r["stopped"]]
    lengths = [r["length"] for r in records]
    return (f"{'sliding window of ' + str(window) + ' tokens, ' if window else ''}"
            f"lengths {min(lengths)}..{max(lengths)} of {length}"
            + (f"; {len(stopped)} stopped early ({', '.join(sorted(set(stopped)))})"
               if stopped else ""))


def readable(text: str) -> str:
    return text.replace("<|endoftext|>", "\n<|endoftext|>\n")


def check_args(args: argparse.Namespace) -> Way:
    """The checks that need no checkpoint, before any work: counts, the way and its flags, the
    order, the output file, the judge. Returns the way."""
    check_counts(args, "num_samples", "batch_size", "seq_len", "judge_batch_size", "length",
                 "window")
    if args.length is not None and args.seq_len is not None:
        raise UsageError("--length and --seq-len both set the text's length: give one")
    if args.stop_entropy is not None and not 0 < args.stop_entropy < math.inf:  # nan fails too
        raise UsageError(f"--stop-entropy must be a finite number of nats above 0, got "
                         f"{args.stop_entropy}")
    way = check_way(args)
    if args.show < 0:
        raise UsageError(f"--show must be >= 0 (0 prints none), got {args.show}")
    if args.out is not None:
        check_output_file(args.out, "--out", args.force, SAMPLES)
    if args.html is not None:
        check_output_file(args.html, "--html", args.force, PAGE)
        args.record_calls = True
    if args.judge is not None:
        check_judge(args.judge)
    return way


def check_way(args: argparse.Namespace) -> Way:
    """The way --sampler and --planner pick (--planner random|l2r is --order, which it must not
    contradict), and the flags of the ways (model/sampler/ways.py OPTIONS): one the way does not
    read is refused, the others checked by their entries. Sets args.order to its reading's word
    (records and provenance say the word)."""
    planner = args.planner
    if planner is not None and planner not in PLANNER_CHOICES:
        raise UsageError(f"--planner {planner!r} is none of {', '.join(PLANNER_CHOICES)}")
    order = None if args.order is None else reading_named(args.order, "--order").word
    if planner in READING_WORDS:
        word = reading_named(planner, "--planner").word
        if order not in (None, word):
            raise UsageError(f"--planner {planner} contradicts --order {args.order}: give one")
        order, planner = word, None
    args.order = order or ANY_ORDER.word
    way = WAYS[planner or args.sampler or DEFAULT_SAMPLER]
    if planner is not None and args.sampler not in (None, DEFAULT_SAMPLER):
        raise UsageError(f"{way.spelled} chooses positions call by call; the {args.sampler} "
                         f"sampler works along an order fixed up front: drop --sampler "
                         f"{args.sampler}")
    for option in OPTIONS:
        value = getattr(args, option.field)
        if value is not None and not way.reads(option):
            raise UsageError(f"{option.flag} is read by {spelled(reading(option))}, not by "
                             f"{way.spelled}")
        option.check(value, option.flag)
    args.sampler, args.planner = args.sampler or DEFAULT_SAMPLER, planner or FIXED_ORDER
    return way


@dataclass
class Plan:
    """What a run generates: texts of `length` tokens with these given ones (length,), in one
    block of the model's or a sliding window's chunks, with these settings."""

    length: int
    block: int
    window: int | None  # None: one block
    tokens: torch.Tensor
    mask: torch.Tensor
    to_generate: int  # positions generated per text
    config: SamplingConfig
    stop: StopRules
    batch_size: int
    calls: int  # network calls of the whole run (at most): --compile auto's estimate

    @property
    def long(self) -> bool:
        """Past one generate call: a sliding window, or texts that may stop early."""
        return (self.window is not None or self.stop.eos is not None
                or self.stop.entropy_below is not None)


def plan_run(args: argparse.Namespace, way: Way, model: AOGPT, encoding) -> Plan:
    """The text's length, window and given tokens, the way's settings fitted to them (a note on
    stderr when one is changed) and the stop rules; UsageError for what the model cannot do."""
    block = model.config.block_size
    length = next((v for v in (args.length, args.seq_len) if v is not None), block)
    if args.seq_len is not None and not 1 <= args.seq_len <= block:
        raise UsageError(f"--seq-len must be in 1..{block} (the model's block size), got "
                         f"{args.seq_len}: --length L generates past it")
    window = plan_window(args, block, length)
    infill = read_infill(args.infill) if args.infill else None
    tokens, mask = given_by_flags(encoding, length, args.prompt, infill,
                                  "--length" if args.length is not None else "--seq-len")
    to_generate = length - int(mask.sum())  # in the whole text
    if to_generate == 0:
        raise UsageError("the prompt and infill already fill every position: nothing to generate")
    room = (Room(to_generate, to_generate) if window is None  # per call, at most
            else Room(block, block - window, chunked=True))
    given = {option.field: getattr(args, option.field) for option in way.options
             if getattr(args, option.field) is not None}
    config, note = way.fit(SamplingConfig(
        **{way.picked_by: way.name}, **given, order=args.order, temperature=args.temperature,
        top_p=args.top_p, top_p_rule=args.top_p_rule, top_k=args.top_k, seed=args.seed),
        set(given), room)
    if note:
        print(note, file=sys.stderr, flush=True)
    if args.stop_at_eos and not model.config.reads_gpt2:
        raise UsageError("--stop-at-eos: this model's token ids have no end-of-text token (it "
                         "reads no GPT-2 text): use --stop-entropy H or a fixed --length")
    stop = StopRules(eos=EOS if args.stop_at_eos else None, entropy_below=args.stop_entropy)
    batch_size = args.batch_size if args.batch_size is not None else min(args.num_samples, 32)
    spans = ([to_generate] if window is None else
             [end - start - (window if k else 0)
              for k, (start, end) in enumerate(chunks(length, block, window))])
    calls = -(-args.num_samples // batch_size) * sum(way.calls(config, s) for s in spans)
    return Plan(length, block, window, tokens, mask, to_generate, config, stop, batch_size, calls)


def plan_window(args: argparse.Namespace, block: int, length: int) -> int | None:
    """The sliding window's tokens kept (None: the text fits in one block)."""
    if length > block:
        window = args.window if args.window is not None else block // 2
        check_window(block, window)
        return window
    if args.window is not None:
        raise UsageError(f"--window slides past the block size ({block}): --length {length} "
                         "fits in one block")
    return None


class Samplers:
    """A KVCacheSampler per sequence length a run needs (a window's last chunk may be shorter),
    compiled and captured as --compile and --cuda-graphs say."""

    def __init__(self, model: AOGPT, plan: Plan, args: argparse.Namespace,
                 device: torch.device):
        on_gpu = device.type == "cuda"
        self.model, self.plan = model, plan
        self.cuda_graphs = switch(args.cuda_graphs, on_gpu)
        self.compile = switch(args.compile, on_gpu and plan.calls >= COMPILE_PAYS_CALLS)
        self.made: dict[int, KVCacheSampler] = {}

    def __call__(self, positions: int) -> KVCacheSampler:
        if positions not in self.made:
            self.made[positions] = KVCacheSampler(
                self.model, self.plan.batch_size, positions, self.plan.config,
                cuda_graphs=self.cuda_graphs, compile=self.compile)
        return self.made[positions]

    @property
    def setup_seconds(self) -> float:
        return sum(s.setup_seconds for s in self.made.values())


def check_duration(plan: Plan, samplers: Samplers, args: argparse.Namespace,
                   device: torch.device, processes: int) -> str | None:
    """A run of many network calls is timed on one chunk (the first block of a batch; its
    samples are drawn again, the same, by the run) and its length said (spread over `processes`);
    one estimated past a day is refused unless --long-run: the refusal's message."""
    positions = min(plan.length, plan.block)
    if plan.calls < TIMED_FROM_CALLS or plan.mask[:positions].all():
        return None
    ids = torch.arange(min(plan.batch_size, args.num_samples))
    given = (plan.tokens[:positions].expand(len(ids), -1),
             plan.mask[:positions].expand(len(ids), -1))
    setup, started = samplers.setup_seconds, time.perf_counter()
    out = samplers(positions).generate(ids, *given)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    per_call = (time.perf_counter() - started - (samplers.setup_seconds - setup)) / max(
        out.network_calls, 1)
    seconds = per_call * plan.calls / processes
    said = (f"{plan.calls:,} network calls at most, {per_call * 1e3:.2f} ms each as timed on one "
            f"chunk" + (f", over {processes} processes" if processes > 1 else ""))
    if seconds > LONG_RUN_S and not args.long_run:
        return (f"the run would take about {duration(seconds)} ({said}): pass --long-run to "
                f"start it anyway, or generate less (--length, --num-samples)")
    print(f"estimate: about {duration(seconds)} ({said})", flush=True)
    return None


def run(plan: Plan, samplers: Samplers, args: argparse.Namespace, device: torch.device,
        encoding, share: RankShare) -> list[dict] | None:
    """This rank's share of the batches, with a progress bar counting chunks (a sliding
    window's) or batches, with the time left; rank 0 gets every batch's records, one per sample
    in id order (the other ranks None)."""
    given_positions = plan.mask.nonzero().flatten().tolist()
    batches = share.mine(list(range(0, args.num_samples, plan.batch_size)))
    per_batch = len(chunks(plan.length, plan.block, plan.window)) if plan.window else 1
    done = []  # per batch of this rank's share: its records
    with progress(total=len(batches) * per_batch, desc="sampling",
                  unit="chunk" if plan.window else "batch", disable=not share.is_main) as bar:
        for first in batches:
            finished = bar.n + per_batch  # once the batch is over, texts that stopped early too
            ids = torch.arange(first, min(first + plan.batch_size, args.num_samples))
            batch_start = time.perf_counter()
            given = plan.tokens.expand(len(ids), -1), plan.mask.expand(len(ids), -1)
            if plan.long:
                out = generate_long(samplers, plan.block, ids, plan.length,
                                    plan.window or plan.block, *given, plan.stop,
                                    record_calls=args.record_calls,
                                    chunk_done=lambda: bar.update(1) if plan.window else None)
            else:
                out = samplers(min(plan.length, plan.block)).generate(
                    ids, *given, record_calls=args.record_calls)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - batch_start
            bar.update(finished - bar.n)
            done.append(sample_records(ids.tolist(), out, encoding, plan.config, time_s=seconds,
                                       given_positions=given_positions))
    gathered = share.gather(done)
    return None if gathered is None else [record for batch in gathered for record in batch]


def report(records: list[dict], plan: Plan, way: Way, samplers: Samplers, elapsed: float,
           args: argparse.Namespace, reads_gpt2: bool) -> None:
    """The samples shown, the summary lines, and --out written."""
    for record in records[:args.show]:
        print(f"\n=== sample {record['sample']} ({len(record['tokens'])} tokens, "
              f"{record['network_calls']} network calls) ===\n{readable(record['text'])}")
    generated = sum(len(r["tokens"]) for r in records) - len(records) * int(plan.mask.sum())
    print(f"\n{len(records)} samples of {plan.length} tokens in {elapsed:.2f} s "
          f"({generated / elapsed:,.0f} generated tokens/s), "
          f"{way.summary(plan.config, records, plan.to_generate)}"
          + (f", {sum(r['tokens'].count(EOS) for r in records)} end-of-text tokens"
             if reads_gpt2 else ""))
    if plan.long:
        print(window_summary(records, plan.length, plan.window))
    if samplers.setup_seconds:
        shapes = sum(len(s.prepared_shapes) for s in samplers.made.values())
        print(f"compiling and capturing {shapes} call shapes: {samplers.setup_seconds:.1f} s, "
              f"apart from the generation time above; the first batch took "
              f"{records[0]['time_s']:.1f} s with it")
    if args.out:
        write_text_atomic(args.out, "".join(json.dumps(r) + "\n" for r in records))
        print(f"wrote {args.out}")


def load(args: argparse.Namespace, device: torch.device) -> tuple:
    """The checkpoint (its source, the model in the run's dtype), its tokenizer and the
    provenance records carry; the judge checked against it."""
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else reproducible_dtype(device)
    source = locate_checkpoint(args.ckpt)
    model = load_checkpoint(source.file, weights=args.weights, map_location=device).to(dtype)
    encoding = load_gpt2(args.tokenizer_file) if model.config.reads_gpt2 else TokenIds()
    origin = provenance(source, args.weights, vars(args), made_by=SAMPLES.made_by)
    if args.judge is not None:
        check_judge_matches(args.judge, origin)
    return source, model, encoding, origin


def prepare(args: argparse.Namespace, share: RankShare) -> tuple:
    """What a run needs before its first call, every input checked: (way, device, source,
    model, encoding, origin, plan)."""
    way = check_args(args)
    device = resolve_device(args.device, own=share.env.device)
    source, model, encoding, origin = load(args, device)
    return way, device, source, model, encoding, origin, plan_run(args, way, model, encoding)


def announce(source, origin: dict, plan: Plan, samplers: Samplers, args: argparse.Namespace,
             device: torch.device, share: RankShare) -> bool:
    """Rank 0 says what it samples from and estimates a long run, which every rank then starts
    or refuses alike: whether to start (rank 0 raises the refusal)."""
    if share.is_main:
        if source.unfinished:
            print(source.unfinished_note(), file=sys.stderr, flush=True)
        print(f"sampling from {source.file} ({describe_provenance(origin)})"
              + (f" on {share.world_size} processes" if share.world_size > 1 else ""), flush=True)
    refusal = share.agree(check_duration(plan, samplers, args, device, share.world_size)
                          if share.is_main else None)
    if refusal is not None and share.is_main:
        raise UsageError(refusal)
    return refusal is None


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    share = RankShare.join()
    way, device, source, model, encoding, origin, plan = share.checked(
        lambda: prepare(args, share))
    samplers = Samplers(model, plan, args, device)
    if not announce(source, origin, plan, samplers, args, device, share):
        return 2  # refused: rank 0 said why
    started, setup = time.perf_counter(), samplers.setup_seconds
    records = run(plan, samplers, args, device, encoding, share)
    if records is None:
        return 0  # rank 0 writes and judges them
    for record in records:  # the same provenance on every line, whichever rank drew it
        record["provenance"] = origin
    elapsed = time.perf_counter() - started - (samplers.setup_seconds - setup)
    report(records, plan, way, samplers, elapsed, args, model.config.reads_gpt2)
    if args.html:
        write_page(args.html, records, Pieces(encoding), title=f"Samples of {source.file}",
                   about=f"{len(records)} samples of {plan.length} tokens: "
                         f"{way.summary(plan.config, records, plan.to_generate)}", origin=origin)
        print(f"wrote {args.html}: open it in a browser")
    if args.judge:
        del model, samplers  # make room for the judge
        judge = Judge(args.judge, device, args.judge_weights)
        print(format_report(generative_perplexity([r["tokens"] for r in records], judge,
                                                  args.judge_batch_size)))
    return 0


def switch(choice: str, auto: bool) -> bool:
    """An auto|on|off flag's value."""
    return auto if choice == "auto" else choice == "on"


if __name__ == "__main__":
    sys.exit(main())
