"""Build a synthetic language's data: sequences drawn from it -> MDS train/ and val/, with the
language itself in the manifest, so that its exact probabilities judge what a model samples.

    python data_prep/synthetic_to_mds.py --out data/synthetic [--seq-len 128]
        [--train-samples 40000] [--val-samples 512] [--vocab 128] [--topics 4] [--states 4]
        [--emit 10] [--stay 0.95] [--smoothing 0.01] [--concentration 1.0] [--seed 0]
        [--overwrite] [--staging DIR]

Each sample is one sequence of --seq-len tokens of the language (data_prep/synthetic.py: a hidden
Markov model, a topic per sequence and sticky states of that topic, each emitting a few token
ids); train/ and val/ are drawn apart, from seeds of their own. The manifest records the language
(every table, and its fingerprint) and the entropy per token of sequences of --seq-len tokens: the
loss a perfect model reaches, in any order.
Train a model on it with configs/synthetic.yaml; judge samples with
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
from aogpt import check_counts, cli_entry
from aogpt.data_prep.cli import add_output_flags, build_output, check_out, split_lines
from aogpt.data_prep.manifest import new_manifest
from aogpt.data_prep.packing import write_rows
from aogpt.data_prep.remote import open_output
from aogpt.data_prep.synthetic import LanguageSpec, SyntheticLanguage
from aogpt.progress import duration

SPLITS = {"train": 1, "val": 2}  # each split's sequences are drawn with this seed
DRAW_CHUNK = 8192  # sequences drawn at a time


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python data_prep/synthetic_to_mds.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    spec = LanguageSpec()
    add_output_flags(parser, "language's data")
    add("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    add("--train-samples", type=int, default=40_000, help="sequences in train/ (default 40000)")
    add("--val-samples", type=int, default=512, help="sequences in val/ (default 512)")
    add("--vocab", type=int, default=spec.vocab, help=f"token ids (default {spec.vocab})")
    add("--topics", type=int, default=spec.topics, help=f"hidden topics (default {spec.topics})")
    add("--states", type=int, default=spec.states,
        help=f"hidden states per topic (default {spec.states})")
    add("--emit", type=int, default=spec.emit,
        help=f"likely token ids per state (default {spec.emit})")
    add("--stay", type=float, default=spec.stay,
        help=f"probability that the next token has the same state (default {spec.stay})")
    add("--smoothing", type=float, default=spec.smoothing,
        help=f"mass spread over every next token (default {spec.smoothing})")
    add("--concentration", type=float, default=spec.concentration,
        help=f"Dirichlet concentration of a state's emission weights "
             f"(default {spec.concentration})")
    add("--seed", type=int, default=spec.seed, help="the language's seed (default 0)")
    args = parser.parse_args(argv)
    check_counts(args, "seq_len", "train_samples", "val_samples")
    language_spec(args).validate()
    check_out(args.out, args.staging)
    return args


def language_spec(args: argparse.Namespace) -> LanguageSpec:
    return LanguageSpec(vocab=args.vocab, topics=args.topics, states=args.states, emit=args.emit,
                        stay=args.stay, smoothing=args.smoothing,
                        concentration=args.concentration, seed=args.seed)


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
                "language": dataclasses.asdict(language.spec), "seq_len": args.seq_len,
                "samples": counts}
    out = open_output(args.out, args.staging, tuple(SPLITS))

    def make() -> dict:
        print(f"drawing {sum(counts.values()):,} sequences of {args.seq_len} tokens from a "
              f"synthetic language of {args.vocab} tokens, {args.topics} topics x {args.states} "
              f"states ({language.fingerprint[:12]})", flush=True)
        splits = {name: {"path": name, **write_split(language, out.out / name, counts[name],
                                                     args.seq_len, seed)}
                  for name, seed in SPLITS.items()}
        entropy, error = language.entropy_per_token(args.seq_len)
        return new_manifest(
            "pretrain", "synthetic", f"synthetic language {language.fingerprint[:12]} "
            f"({dataclasses.asdict(language.spec)})", args.seq_len, language.describe(), splits,
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
