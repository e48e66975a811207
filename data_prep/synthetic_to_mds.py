"""Build a synthetic language's data: sequences drawn from it -> MDS train/ and val/, with the
language itself in the manifest, so that its exact probabilities judge what a model samples.

    python data_prep/synthetic_to_mds.py --out data/synthetic [--seq-len 128]
        [--train-samples 40000] [--val-samples 512] [--vocab 128] [--topics 4] [--states 4]
        [--emit 10] [--stay 0.95] [--smoothing 0.01] [--concentration 1.0] [--seed 0]
        [--overwrite] [--staging DIR]
    python data_prep/synthetic_to_mds.py --out data/synthetic_words --preset words
        [--words 16] [--min-length 2] [--max-length 8] [--vocab ...] [--topics ...] [...]

Each sample is one sequence of --seq-len tokens of the language (data_prep/synthetic.py, a hidden
Markov model): --preset topics (the default) has a topic per sequence and sticky states of that
topic, each emitting a few token ids, so its next token is uncertain; --preset words spells one
topic's words one after another, so its next token is often nearly certain given the tokens
before, and a draft of positions ahead is often wrong. train/ and val/ are drawn apart, from seeds
of their own. The manifest records the language (every table, and its fingerprint) and the
entropy per token of sequences of --seq-len tokens: the loss a perfect model reaches, in any
order.
Train a model on it with configs/synthetic.yaml (configs/synthetic_words.yaml; a left-to-right
GPT of the same size: configs/gpt_synthetic*.yaml); judge samples with
`python trainer/genppl.py --samples FILE --judge DIR` (or sample.py --judge DIR).

An interrupted run resumes (or restarts) like the other builders; a finished folder is left
alone unless --overwrite. --out s3://BUCKET/PREFIX builds in a local --staging folder, then
uploads (data_prep/remote.py).
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

import aogpt
from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep.cli import build_output, builder_parser, check_out, split_lines
from aogpt.data_prep.manifest import new_manifest
from aogpt.data_prep.packing import write_rows
from aogpt.data_prep.remote import open_output
from aogpt.data_prep.synthetic import SPECS, LanguageSpec, SyntheticLanguage
from aogpt.progress import duration

SPLITS = {"train": 1, "val": 2}  # each split's sequences are drawn with this seed
DRAW_CHUNK = 8192  # sequences drawn at a time


# each preset's flags: (spec field, help); --vocab, --topics, --smoothing, --concentration and
# --seed are every preset's
FLAG_HELP = {
    "vocab": "token ids", "topics": "hidden topics",
    "states": "hidden states per topic",
    "emit": "likely token ids per state",
    "stay": "probability that the next token has the same state",
    "words": "words per topic",
    "min_length": "token ids of the shortest word's spelling",
    "max_length": "token ids of the longest word's spelling",
    "smoothing": "mass spread over every next token",
    "concentration": "Dirichlet concentration of a state's emission weights (topics) or of a "
                     "topic's word frequencies (words)",
    "seed": "the language's seed",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = builder_parser("python data_prep/synthetic_to_mds.py", __doc__, "language's data")
    add = parser.add_argument
    add("--preset", choices=tuple(SPECS), default=LanguageSpec.preset,
        help="topics (default: uncertain next tokens) or words (nearly certain ones, hard to "
             "draft)")
    add("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    add("--train-samples", type=int, default=40_000, help="sequences in train/ (default 40000)")
    add("--val-samples", type=int, default=512, help="sequences in val/ (default 512)")
    for field, text in FLAG_HELP.items():
        kind = type(next(getattr(spec(), field) for spec in SPECS.values()
                         if hasattr(spec(), field)))
        defaults = ", ".join(f"{name} {getattr(spec(), field)}" for name, spec in SPECS.items()
                             if hasattr(spec(), field))
        add(f"--{field.replace('_', '-')}", type=kind, default=None,
            help=f"{text} (default: {defaults})")
    args = parser.parse_args(argv)
    check_counts(args, "seq_len", "train_samples", "val_samples")
    language_spec(args).validate()
    check_out(args.out, args.staging)
    return args


def language_spec(args: argparse.Namespace):
    """The --preset's spec with the flags given (a flag of another preset: UsageError)."""
    spec = SPECS[args.preset]
    fields = {field.name for field in dataclasses.fields(spec)}
    given = {field: getattr(args, field) for field in FLAG_HELP if getattr(args, field) is not None}
    foreign = sorted(set(given) - fields)
    if foreign:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in foreign)
        owner = next(name for name, other in SPECS.items()
                     if foreign[0] in {f.name for f in dataclasses.fields(other)})
        raise UsageError(f"{flags} set the {owner} preset's language, not --preset "
                         f"{args.preset}'s: drop {flags}, or give --preset {owner}")
    return spec(**given)


def write_split(language: SyntheticLanguage, folder: Path, count: int, seq_len: int,
                seed: int) -> dict:
    """`count` sequences of the language as MDS shards in folder; the split's manifest entry."""
    rows = np.concatenate([language.sample(min(DRAW_CHUNK, count - first), seq_len,
                                           seed=seed * 1_000_003 + first // DRAW_CHUNK)
                           for first in range(0, count, DRAW_CHUNK)])
    return write_rows(folder, rows)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    language = SyntheticLanguage.draw(language_spec(args))
    counts = {"train": args.train_samples, "val": args.val_samples}
    settings = {"tool": "synthetic_to_mds", "tool_version": aogpt.__version__,
                "language": language.spec.record(), "seq_len": args.seq_len,
                "samples": counts}
    out = open_output(args.out, args.staging, tuple(SPLITS))

    def make() -> dict:
        print(f"drawing {sum(counts.values()):,} sequences of {args.seq_len} tokens from the "
              f"{args.preset} language {language.fingerprint[:12]} ({language.summary()})",
              flush=True)
        splits = {name: {"path": name, **write_split(language, out.out / name, counts[name],
                                                     args.seq_len, seed)}
                  for name, seed in SPLITS.items()}
        entropy, error = language.entropy_per_token(args.seq_len)
        return new_manifest(
            "pretrain", "synthetic", f"synthetic language {language.fingerprint[:12]} "
            f"({language.spec.record()})", args.seq_len, language.describe(), splits,
            entropy_per_token=entropy, entropy_per_token_error=error, language=language.record())

    manifest = build_output(out, args.out, settings, args.overwrite, "sequences", make)
    if manifest is None:
        return 0
    entropy, error = manifest["entropy_per_token"], manifest["entropy_per_token_error"]
    print(f"done in {duration(time.perf_counter() - wall_start)}: entropy {entropy:.4f} +- "
          f"{error:.4f} nats per token, the loss of a perfect model in any order")
    print("\n".join(split_lines(args.out, manifest, "sequences")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
