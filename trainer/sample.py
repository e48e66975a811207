"""Generate text with an AO-GPT checkpoint: the paper's any-order sampler with a KV cache.

    python trainer/sample.py --ckpt PATH [--num-samples N] [--steps S] [--seq-len L]
        [--temperature T] [--top-p P] [--top-k K] [--prompt TEXT] [--infill JSON-or-file]
        [--seed X] [--out FILE.jsonl [--force]] [--schedule linear|cosine]
        [--counts deterministic|binomial] [--order random|l2r] [--weights ema|raw]
        [--batch-size B] [--judge PATH]

Every sample fixes its generation order up front (the prompt and infill positions first, then
the rest in random or left-to-right order) and reveals the rest in S network calls: linear or
cosine schedule, the paper's deterministic counts or exact Binomial ones (Lemma 1). S = L is
exact ancestral sampling. Sample i's order and tokens depend only on (--seed, i), not on the
batch size. How the steps work: model/sampler/.

--infill places text at token positions: a JSON object (or a file holding one) mapping a start
position to a string or a list of token ids, e.g. '{"0": "The city of", "40": [13, 383]}'.
--prompt TEXT is the same as '{"0": TEXT}'.
--out writes one JSON object per sample (an existing file is replaced only with --force): sample,
tokens, text, order, given_positions, steps, network_calls, time_s (seconds of its batch), the
sampler's settings, and provenance: the checkpoint file read (a run that has not finished is read
through its latest checkpoint, which a line on stderr says), its tag and step, the weights, every
flag and the code's version and commit. --judge PATH also reports the
generative perplexity (a local Hugging Face GPT-2 folder or a checkpoint of this project; see
trainer/genppl.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from aogpt import UsageError, check_counts, check_input_file, cli_entry
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.files import check_output_file, write_text_atomic
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import describe_provenance, locate_checkpoint, provenance
from aogpt.model.orders import ANY_ORDER, READINGS, reading_named
from aogpt.model.precision import reproducible_dtype, resolve_device
from aogpt.model.sampler import Generation, KVCacheSampler, SamplingConfig, given_tokens
from aogpt.progress import progress
from aogpt.trainer.genppl import Judge, check_judge, format_report, generative_perplexity

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt", required=True, help="out_dir, checkpoint folder or model.safetensors")
    add("--weights", choices=("ema", "raw"), default="ema", help="default ema (as the paper)")
    add("--num-samples", type=int, default=4, help="how many sequences (default 4)")
    add("--batch-size", type=int, default=None, help="sequences per batch (default: all, at most 32)")
    add("--seq-len", type=int, default=None, help="tokens per sequence (default: the block size)")
    add("--steps", type=int, default=None,
        help="network calls S (default: one per token to generate, exact ancestral sampling)")
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
    add("--no-cuda-graphs", action="store_true", help="run the GPU steps eagerly")
    add("--tokenizer-file", default=None, help="GPT-2 ranks file (offline tokenizer)")
    return parser.parse_args(argv)


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


def given_by_flags(encoding, seq_len: int, prompt: str | None,
                   infill: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens and mask that --prompt and --infill give in a sequence of --seq-len tokens
    (given_tokens); what is wrong with them is said naming those flags."""
    try:
        return given_tokens(seq_len, prompt, infill, encoding)
    except UsageError as err:
        flags = " and ".join(flag for flag, value in (("--prompt", prompt), ("--infill", infill))
                             if value is not None)
        raise UsageError(f"{flags} (--seq-len {seq_len}): {err}") from None


def sample_records(sample_ids: list[int], out: Generation, encoding, config: SamplingConfig,
                   **fields) -> list[dict]:
    """One JSON-ready record per sample of a generate() call, as --out writes them (and the
    trainer's samples while training), with `fields` added to each."""
    settings = dataclasses.asdict(config)
    return [{"sample": i, "tokens": tokens, "text": encoding.decode(tokens), "order": order,
             "steps": config.steps, "network_calls": out.network_calls, "settings": settings,
             **fields}
            for i, tokens, order in zip(sample_ids, out.tokens.tolist(), out.orders.tolist(),
                                        strict=True)]


def readable(text: str) -> str:
    return text.replace("<|endoftext|>", "\n<|endoftext|>\n")


def check_args(args: argparse.Namespace) -> None:
    """The checks that need no checkpoint, before any work: counts, the order, the output file,
    the judge."""
    check_counts(args, "num_samples", "batch_size", "seq_len", "steps", "judge_batch_size")
    args.order = reading_named(args.order, "--order").word  # records and provenance say the word
    if args.show < 0:
        raise UsageError(f"--show must be >= 0 (0 prints none), got {args.show}")
    if args.out is not None:
        check_output_file(args.out, "--out", args.force)
    if args.judge is not None:
        check_judge(args.judge)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    batch_size = args.batch_size if args.batch_size is not None else min(args.num_samples, 32)
    device = resolve_device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else reproducible_dtype(device)
    encoding = load_gpt2(args.tokenizer_file)
    source = locate_checkpoint(args.ckpt)
    if source.unfinished:
        print(source.unfinished_note(), file=sys.stderr, flush=True)
    model = load_checkpoint(source.file, weights=args.weights, map_location=device).to(dtype)
    seq_len = args.seq_len if args.seq_len is not None else model.config.block_size
    if not 1 <= seq_len <= model.config.block_size:
        raise UsageError(f"--seq-len must be in 1..{model.config.block_size} (the model's block "
                         f"size), got {seq_len}")
    infill = read_infill(args.infill) if args.infill else None
    tokens, mask = given_by_flags(encoding, seq_len, args.prompt, infill)
    to_generate = seq_len - int(mask.sum())
    if to_generate == 0:
        raise UsageError("the prompt and infill already fill every position: nothing to generate")
    steps = args.steps if args.steps is not None else to_generate
    if not 1 <= steps <= to_generate:
        raise UsageError(f"--steps must be in 1..{to_generate} (the positions to generate), "
                         f"got {steps}")
    config = SamplingConfig(steps=steps, schedule=args.schedule, counts=args.counts,
                            order=args.order, temperature=args.temperature, top_p=args.top_p,
                            top_p_rule=args.top_p_rule,
                            top_k=args.top_k, seed=args.seed)
    sampler = KVCacheSampler(model, batch_size, seq_len, config,
                             cuda_graphs=False if args.no_cuda_graphs else None)
    origin = provenance(source, args.weights, vars(args))
    print(f"sampling from {source.file} ({describe_provenance(origin)})", flush=True)
    records, started = [], time.perf_counter()
    with progress(range(0, args.num_samples, batch_size), desc="sampling", unit="batch") as bar:
        for first in bar:
            ids = torch.arange(first, min(first + batch_size, args.num_samples))
            batch_start = time.perf_counter()
            out = sampler.generate(ids, tokens.expand(len(ids), -1), mask.expand(len(ids), -1))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - batch_start
            records += sample_records(ids.tolist(), out, encoding, config, time_s=seconds,
                                      given_positions=mask.nonzero().flatten().tolist(),
                                      provenance=origin)
    elapsed = time.perf_counter() - started
    for record in records[:args.show]:
        print(f"\n=== sample {record['sample']} ({seq_len} tokens, {record['network_calls']} "
              f"network calls) ===\n{readable(record['text'])}")
    eos = sum(r["tokens"].count(EOS) for r in records)
    print(f"\n{len(records)} samples of {seq_len} tokens in {elapsed:.2f} s "
          f"({len(records) * to_generate / elapsed:,.0f} generated tokens/s), {steps} steps, "
          f"{eos} end-of-text tokens")
    if args.out:
        write_text_atomic(args.out, "".join(json.dumps(r) + "\n" for r in records))
        print(f"wrote {args.out}")
    if args.judge:
        del model, sampler  # make room for the judge
        judge = Judge(args.judge, device, args.judge_weights)
        report = generative_perplexity([r["tokens"] for r in records], judge,
                                       args.judge_batch_size)
        print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
