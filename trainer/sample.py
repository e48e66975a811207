"""Generate text with an AO-GPT checkpoint: any-order sampling with a KV cache.

    python trainer/sample.py --ckpt PATH [--num-samples N] [--seq-len L | --length L [--window W]]
        [--stop-at-eos] [--stop-entropy H]
        [--sampler parallel [--steps S] | --sampler speculative [--draft K]]
        [--planner random|l2r|confidence|margin|entropy|threshold [--reveal R] [--threshold P]
         [--candidates C] [--block B]]
        [--temperature T] [--top-p P] [--top-k K] [--prompt TEXT] [--infill JSON-or-file]
        [--seed X] [--out FILE.jsonl [--force]] [--schedule linear|cosine]
        [--counts deterministic|binomial] [--order random|l2r] [--weights ema|raw]
        [--batch-size B] [--judge PATH]

Every sample fixes its generation order up front (the prompt and infill positions first, then
the rest in random or left-to-right order). Two samplers (model/sampler/):
  parallel     (default) the paper's: reveals the rest in S network calls, several tokens per call
               drawn independently (linear or cosine schedule, the paper's deterministic counts or
               exact Binomial ones, Lemma 1). S = L is exact ancestral sampling; fewer calls depart
               from the model's joint distribution.
  speculative  exactly the joint of S = L (one token per call) in fewer calls: each call drafts K
               positions ahead from the model's own marginals and verifies the earlier drafts
               along the order (any-subset speculative decoding, arXiv 2504.20456). It decides
               its own number of calls: at most one per token, fewer as drafts are accepted.
Or the model chooses the order as it goes (--planner, model/sampler/planners.py): each call
scores candidate positions (every remaining one, --candidates C of them, or those of the current
--block of B positions) against the exact cache and reveals the --reveal R best by confidence (top
probability), margin (top-1 minus top-2) or entropy, or every candidate whose top probability
reaches --threshold P (threshold, at least one). --planner random and l2r are the fixed orders
(--order). A planner's sample records the order it took and its exact log-likelihood along it
(with R = 1 each token comes from its exact conditional, so it is the sample's log-probability
under the planner's own process).
Sample i's order and tokens depend only on (--seed, i), not on the batch size.
--length L past the block size slides a window (model/sampler/window.py): each chunk after the
first keeps the last --window W tokens (default half the block) as given tokens and generates the
next block - W positions, until L. --stop-at-eos ends a text after its second end-of-text token,
--stop-entropy H when the unigram entropy of its last 256 tokens falls below H nats (repetition);
records then carry length, seams (where each chunk began generating) and stopped (why).
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
the weights, every flag and the code's version and commit. --judge PATH also reports the
generative perplexity (a local Hugging Face GPT-2 folder or a checkpoint of this project; see
trainer/genppl.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from aogpt import UsageError, check_counts, check_input_file, cli_entry
from aogpt.data_prep.synthetic import TokenIds
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.files import OutputFile, check_output_file, write_text_atomic
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import describe_provenance, locate_checkpoint, provenance
from aogpt.model.orders import ANY_ORDER, READING_WORDS, READINGS, reading_named
from aogpt.model.precision import reproducible_dtype, resolve_device
from aogpt.model.sampler import (
    PLANNERS,
    SAMPLERS,
    KVCacheSampler,
    SamplingConfig,
    given_tokens,
    sample_records,
)
from aogpt.model.sampler.window import (
    STOP_ENTROPY_TOKENS,
    StopRules,
    check_window,
    generate_long,
)
from aogpt.progress import progress
from aogpt.trainer.judge import (
    Judge,
    check_judge,
    check_judge_matches,
    format_report,
    generative_perplexity,
)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# --compile auto's threshold: compiling costs seconds per call shape (a run has 10 to 20 of them)
# and saves a fraction of a millisecond per call on a GPU, so it pays over tens of thousands of
# calls; an estimate until benchmarks/gpu_report.py measures both on a GPU
COMPILE_PAYS_CALLS = 50_000
# --out; earlier samples without made_by are known by their records' keys
SAMPLES = OutputFile("trainer/sample.py", "sample file", (".jsonl",),
                     signature=("sample", "tokens", "network_calls", "settings"))


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
    add("--sampler", choices=SAMPLERS, default="parallel",
        help="parallel (default, the paper's) or speculative (exact, fewer calls)")
    add("--steps", type=int, default=None,
        help="parallel: network calls S (default: one per token to generate, exact ancestral "
             "sampling)")
    add("--draft", type=int, default=None,
        help=f"speculative: positions drafted ahead per call (default "
             f"{SamplingConfig.draft}); a call yields at most K + 1 tokens")
    add("--planner", default=None, metavar="|".join(PLANNER_CHOICES),
        help=f"who orders the positions: {' or '.join(READING_WORDS)} (fixed up front, as "
             "--order), or the model call by call: confidence, margin, entropy, threshold "
             "(default: --order)")
    add("--reveal", type=int, default=None,
        help=f"confidence, margin, entropy: positions revealed per call (default "
             f"{SamplingConfig.reveal})")
    add("--threshold", type=float, default=None,
        help=f"threshold: reveal every candidate whose top probability reaches P, in (0, 1) "
             f"(default {SamplingConfig.threshold})")
    add("--candidates", type=int, default=None,
        help="planners: score the next C positions of the sample's order per call (default all)")
    add("--block", type=int, default=None,
        help="planners: choose within blocks of B positions, left to right (default: one block)")
    add("--schedule", choices=("linear", "cosine"), default="linear")
    add("--counts", choices=("deterministic", "binomial"), default="deterministic",
        help="tokens revealed per step: the paper's fixed counts or Lemma 1's Binomial ones")
    add("--order", default=ANY_ORDER.word, help="order of the positions not given: "
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
    add("--force", action="store_true", help="replace the --out file if it exists")
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
    return parser.parse_args(argv)


# --planner: the fixed orders by their reading's word, then the model's planners
PLANNER_CHOICES = (ANY_ORDER.word, *(word for word in READING_WORDS if word != ANY_ORDER.word),
                   *(p for p in PLANNERS if p != "order"))

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


def check_args(args: argparse.Namespace) -> None:
    """The checks that need no checkpoint, before any work: counts, the order, the output file,
    the judge."""
    check_counts(args, "num_samples", "batch_size", "seq_len", "steps", "judge_batch_size",
                 "length", "window")
    if args.length is not None and args.seq_len is not None:
        raise UsageError("--length and --seq-len both set the text's length: give one")
    if args.stop_entropy is not None and args.stop_entropy <= 0:
        raise UsageError(f"--stop-entropy must be above 0 nats, got {args.stop_entropy}")
    if args.sampler == "speculative" and args.steps is not None:
        raise UsageError("--steps sets the parallel sampler's network calls; the speculative "
                         "sampler decides its own (one per token at most, fewer as drafts are "
                         "accepted): drop --steps, or set --draft K")
    if args.sampler == "parallel" and args.draft is not None:
        raise UsageError("--draft is the speculative sampler's: add --sampler speculative")
    if args.draft is not None and args.draft < 1:
        raise UsageError(f"--draft must be >= 1 (positions drafted ahead per call), got "
                         f"{args.draft}")
    args.order = reading_named(args.order, "--order").word  # records and provenance say the word
    check_planner(args)
    if args.show < 0:
        raise UsageError(f"--show must be >= 0 (0 prints none), got {args.show}")
    if args.out is not None:
        check_output_file(args.out, "--out", args.force, SAMPLES)
    if args.judge is not None:
        check_judge(args.judge)


def check_planner(args: argparse.Namespace) -> None:
    """--planner and its flags: --planner random|l2r becomes --order; a planner's flags without
    it, or with one that does not read them, are refused."""
    check_counts(args, "reveal", "candidates", "block")
    if args.planner is not None and args.planner not in PLANNER_CHOICES:
        raise UsageError(f"--planner {args.planner!r} is none of {', '.join(PLANNER_CHOICES)}")
    if args.threshold is not None and not 0.0 < args.threshold < 1.0:
        raise UsageError(f"--threshold must be in (0, 1) (a top probability), got {args.threshold}")
    if args.planner in READING_WORDS:
        word = reading_named(args.planner, "--planner").word
        if args.order != ANY_ORDER.word and args.order != word:
            raise UsageError(f"--planner {args.planner} contradicts --order {args.order}: give one")
        args.order, args.planner = word, "order"
    planner = args.planner or "order"
    if planner != "order" and args.sampler == "speculative":
        raise UsageError(f"--planner {planner} chooses positions call by call; the speculative "
                         "sampler drafts along an order fixed up front: drop --sampler speculative")
    if planner != "order" and args.steps is not None:
        raise UsageError(f"--steps sets the parallel sampler's calls; --planner {planner} makes "
                         "one call per --reveal positions (or per threshold pass): drop --steps")
    needs = {"reveal": ("confidence", "margin", "entropy"), "threshold": ("threshold",),
             "candidates": PLANNERS[1:], "block": PLANNERS[1:]}
    for flag, planners in needs.items():
        if getattr(args, flag) is not None and planner not in planners:
            raise UsageError(f"--{flag} is read by --planner {' or '.join(planners)}, not by "
                             f"{'--planner ' + planner if planner != 'order' else 'a fixed order'}")
    args.planner = planner


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    batch_size = args.batch_size if args.batch_size is not None else min(args.num_samples, 32)
    device = resolve_device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else reproducible_dtype(device)
    source = locate_checkpoint(args.ckpt)
    if source.unfinished:
        print(source.unfinished_note(), file=sys.stderr, flush=True)
    model = load_checkpoint(source.file, weights=args.weights, map_location=device).to(dtype)
    encoding = load_gpt2(args.tokenizer_file) if model.config.reads_gpt2 else TokenIds()
    origin = provenance(source, args.weights, vars(args), made_by=SAMPLES.made_by)
    if args.judge is not None:
        check_judge_matches(args.judge, origin)
    block = model.config.block_size
    length = next((v for v in (args.length, args.seq_len) if v is not None), block)
    if args.seq_len is not None and not 1 <= args.seq_len <= block:
        raise UsageError(f"--seq-len must be in 1..{block} (the model's block size), got "
                         f"{args.seq_len}: --length L generates past it")
    window = None
    if length > block:
        window = args.window if args.window is not None else block // 2
        check_window(block, window)
    elif args.window is not None:
        raise UsageError(f"--window slides past the block size ({block}): --length {length} "
                         "fits in one block")
    seq_len = min(length, block)  # positions of one network sequence
    infill = read_infill(args.infill) if args.infill else None
    tokens, mask = given_by_flags(encoding, length, args.prompt, infill,
                                  "--length" if args.length is not None else "--seq-len")
    to_generate = length - int(mask.sum())  # in the whole text
    if to_generate == 0:
        raise UsageError("the prompt and infill already fill every position: nothing to generate")
    per_chunk = to_generate if window is None else block - window  # at most, after the first
    steps = args.steps if args.steps is not None else (to_generate if window is None else block)
    if args.steps is not None and not 1 <= steps <= per_chunk:
        raise UsageError(f"--steps must be in 1..{per_chunk} (the positions to generate"
                         f"{' per chunk' if window else ''}), got {steps}")
    draft = args.draft if args.draft is not None else SamplingConfig.draft
    if args.sampler == "speculative" and draft >= per_chunk:
        draft = max(1, per_chunk - 1)
        print(f"note: --draft {args.draft} reaches past the {per_chunk} positions to generate"
              f"{' per chunk' if window else ''}: drafting {draft}", file=sys.stderr, flush=True)
    planned = {flag: getattr(args, flag) for flag in ("reveal", "threshold", "candidates", "block")
               if getattr(args, flag) is not None}
    config = SamplingConfig(sampler=args.sampler, steps=steps, draft=draft, planner=args.planner,
                            **planned, schedule=args.schedule, counts=args.counts, order=args.order,
                            temperature=args.temperature, top_p=args.top_p,
                            top_p_rule=args.top_p_rule, top_k=args.top_k, seed=args.seed)
    calls = -(-args.num_samples // batch_size) * (  # at most
        steps if args.sampler == "parallel" and args.planner == "order" and window is None
        else to_generate)
    samplers: dict[int, KVCacheSampler] = {}

    def sampler_for(positions: int) -> KVCacheSampler:  # a window's last chunk may be shorter
        if positions not in samplers:
            samplers[positions] = KVCacheSampler(
                model, batch_size, positions, config,
                cuda_graphs=switch(args.cuda_graphs, device.type == "cuda"),
                compile=switch(args.compile, device.type == "cuda" and calls >= COMPILE_PAYS_CALLS))
        return samplers[positions]

    if args.stop_at_eos and not model.config.reads_gpt2:
        raise UsageError("--stop-at-eos: this model's token ids have no end-of-text token (it "
                         "reads no GPT-2 text): use --stop-entropy H or a fixed --length")
    stop = StopRules(eos=EOS if args.stop_at_eos else None, entropy_below=args.stop_entropy)
    long = window is not None or args.stop_at_eos or args.stop_entropy is not None
    print(f"sampling from {source.file} ({describe_provenance(origin)})", flush=True)
    records, started = [], time.perf_counter()
    given_positions = mask.nonzero().flatten().tolist()
    with progress(range(0, args.num_samples, batch_size), desc="sampling", unit="batch") as bar:
        for first in bar:
            ids = torch.arange(first, min(first + batch_size, args.num_samples))
            batch_start = time.perf_counter()
            given = tokens.expand(len(ids), -1), mask.expand(len(ids), -1)
            if long:
                out = generate_long(sampler_for, block, ids, length, window or block, *given, stop)
            else:
                out = sampler_for(seq_len).generate(ids, *given)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - batch_start
            records += sample_records(ids.tolist(), out, encoding, config, time_s=seconds,
                                      given_positions=given_positions, provenance=origin)
    setup = sum(s.setup_seconds for s in samplers.values())
    elapsed = time.perf_counter() - started - setup
    for record in records[:args.show]:
        print(f"\n=== sample {record['sample']} ({len(record['tokens'])} tokens, "
              f"{record['network_calls']} network calls) ===\n{readable(record['text'])}")
    generated = sum(len(r["tokens"]) for r in records) - len(records) * len(given_positions)
    print(f"\n{len(records)} samples of {length} tokens in {elapsed:.2f} s "
          f"({generated / elapsed:,.0f} generated tokens/s), "
          f"{calls_summary(records, config, to_generate)}"
          + (f", {sum(r['tokens'].count(EOS) for r in records)} end-of-text tokens"
             if model.config.reads_gpt2 else ""))
    if long:
        print(window_summary(records, length, window))
    if setup:
        shapes = sum(len(s.prepared_shapes) for s in samplers.values())
        print(f"compiling and capturing {shapes} call shapes: {setup:.1f} s, apart from the "
              f"generation time above; the first batch took {records[0]['time_s']:.1f} s with it")
    if args.out:
        write_text_atomic(args.out, "".join(json.dumps(r) + "\n" for r in records))
        print(f"wrote {args.out}")
    if args.judge:
        del model, samplers  # make room for the judge
        judge = Judge(args.judge, device, args.judge_weights)
        report = generative_perplexity([r["tokens"] for r in records], judge,
                                       args.judge_batch_size)
        print(format_report(report))
    return 0


def switch(choice: str, auto: bool) -> bool:
    """An auto|on|off flag's value."""
    return auto if choice == "auto" else choice == "on"


def calls_summary(records: list[dict], config: SamplingConfig, to_generate: int) -> str:
    """'256 steps', for the speculative sampler its calls per token and acceptance, for a planner
    its calls per sample and the samples' mean log-likelihood per token."""
    if config.planner != "order":
        calls = sum(r["network_calls"] for r in records) / len(records)
        nll = -sum(r["log_likelihood"] for r in records) / len(records) / to_generate
        return (f"{config.planner} planner: {calls:.1f} network calls per sample, "
                f"{nll:.4f} nats per generated token along the orders taken")
    if config.sampler == "parallel":
        return (f"{config.steps} steps" if "seams" not in records[0] else
                f"{sum(r['network_calls'] for r in records) / len(records):.1f} network calls "
                "per sample")
    calls = sum(r["network_calls"] for r in records)
    decided = sum(r["drafts_decided"] for r in records)
    accepted = sum(r["drafts_accepted"] for r in records)
    return (f"speculative (draft {config.draft}): {calls / len(records) / to_generate:.3f} "
            f"network calls per token, {accepted / max(decided, 1):.0%} of {decided:,} drafts "
            "accepted")


if __name__ == "__main__":
    sys.exit(main())
