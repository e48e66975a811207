"""Build a zero-shot evaluation set (WikiText-2/103, PTB, LAMBADA, LM1B) as GPT-2 tokens in MDS.

    python data_prep/eval_to_mds.py --dataset NAME --out DIR      (NAME: data_prep/eval_sets.py)
        [--source PATH ...] [--split S] [--seq-len 1024] [--packing concat|per_example]
        [--reference-packing]

Without --source the dataset comes from the Hugging Face hub; with it, from local files (lines of
text, .jsonl[.gz] or .parquet). The MDS files go directly into DIR with DIR/manifest.json (kind
"eval", one split, path ".").

Examples, splits and packing follow the paper's protocol, described in data_prep/eval_sets.py:
--packing concat (default) cuts the examples' token stream into samples of --seq-len tokens,
--reference-packing drops the remainder of every 1000 examples as the paper's pipeline did, and
--packing per_example (LAMBADA) makes one EOS-padded sample per passage with its `length` and
`last_word_start`. The split is recorded in the manifest. --out s3://BUCKET/PREFIX builds in a
local --staging folder, then uploads (data_prep/remote.py).
"""

import argparse
import sys
import time
from pathlib import Path

import aogpt
from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep import packing
from aogpt.data_prep.cli import (
    add_output_flags,
    build_output,
    check_out,
    replaced_bytes_note,
    split_lines,
)
from aogpt.data_prep.eval_sets import (
    EVAL_SETS,
    REFERENCE_GROUP,
    examples_digest,
    last_word_warning,
    pack_concat,
    pack_per_example,
    per_example_columns,
    read_examples,
    split_of,
)
from aogpt.data_prep.manifest import new_manifest
from aogpt.data_prep.remote import open_output
from aogpt.data_prep.tokenizer import EOS, describe
from aogpt.progress import duration


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python data_prep/eval_to_mds.py",
        description="Detokenize, GPT-2-tokenize and pack a zero-shot eval set into MDS in OUT "
                    "(one split), with OUT/manifest.json, following the paper's protocol.",
    )
    parser.add_argument("--dataset", required=True, choices=sorted(EVAL_SETS))
    add_output_flags(parser, "set")
    parser.add_argument("--source", nargs="+", action="extend", metavar="PATH",
                        help="local files/folders instead of the hub (.txt/.raw/.tokens lines, "
                             ".jsonl[.gz] field text, .parquet)")
    parser.add_argument("--split", default=None,
                        help="split to build (hub default: the paper's, i.e. train for wikitext2, "
                             "test for the others; local: from the file name)")
    parser.add_argument("--seq-len", type=int, default=1024,
                        help="tokens per sample (default 1024)")
    parser.add_argument("--packing", choices=("concat", "per_example"), default="concat",
                        help="concat: one token stream cut into samples (default); per_example: "
                             "one LAMBADA passage per sample, with its length and last word")
    parser.add_argument("--reference-packing", action="store_true",
                        help=f"drop the remainder of every {REFERENCE_GROUP} examples like the "
                             f"paper's pipeline (default: carry it over)")
    parser.add_argument("--workers", type=int, default=packing.available_cores(),
                        help="worker processes (default: all available cores)")
    parser.add_argument("--tokenizer-file", default=None, help="GPT-2 ranks file (gpt2.tiktoken)")
    args = parser.parse_args(argv)
    check_counts(args, "seq_len", "workers")
    if args.packing == "per_example" and not EVAL_SETS[args.dataset].last_word:
        last_word = ", ".join(name for name, eval_set in EVAL_SETS.items() if eval_set.last_word)
        raise UsageError(f"--packing per_example is for the sets scored on their last word "
                         f"({last_word}); use concat")
    if args.packing == "per_example" and args.reference_packing:
        raise UsageError("--reference-packing applies to --packing concat only")
    for spec in args.source or []:
        if not Path(spec).expanduser().exists():
            raise UsageError(f"source {spec} does not exist: check the path")
    args.split = split_of(EVAL_SETS[args.dataset], args.split, args.source)
    check_out(args.out, args.staging)
    return args


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    encoding = packing.load_encoding(args.tokenizer_file)
    eval_set = EVAL_SETS[args.dataset]
    out = open_output(args.out, args.staging, splits=(".",))
    examples, description = read_examples(eval_set, args.split, args.source)
    if not examples:
        raise UsageError(f"no examples in {description}: the input is empty")
    warning = last_word_warning(examples, eval_set)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    settings = {"tool": "eval_to_mds", "tool_version": aogpt.__version__, "dataset": args.dataset,
                "examples_sha256": examples_digest(examples), "split": args.split,
                "seq_len": args.seq_len,
                "packing": args.packing, "reference_packing": args.reference_packing,
                "tokenizer": describe(encoding)}
    manifest = build_output(out, args.out, settings, args.overwrite, "examples",
                            lambda: _build(args, eval_set, examples, description, encoding, out))
    if manifest is None:
        return 0
    _report(manifest, args, time.perf_counter() - wall_start)
    return 0


def _build(args: argparse.Namespace, eval_set, examples: list, description: str, encoding,
           out) -> dict:
    """Packs the examples into out's staging area; returns the manifest."""
    if args.packing == "per_example":
        stats = pack_per_example(examples, eval_set, args.seq_len, out.out, encoding)
    else:
        stats = pack_concat(examples, eval_set, args.split, args.seq_len, out.out, out.work,
                            encoding, args.workers, args.reference_packing)
    if stats["samples"] == 0:
        raise UsageError(f"{stats['tokens']} tokens are not enough for one sample of "
                         f"--seq-len {args.seq_len}: lower --seq-len")
    extra = {}
    if args.packing == "per_example":
        extra = {"columns": per_example_columns(args.seq_len), "pad_id": EOS}
    return new_manifest(
        "eval", args.dataset, description, args.seq_len, describe(encoding),
        {args.split: {"path": ".", **stats}},
        split=args.split, detokenizer=eval_set.detokenizer, packing=args.packing,
        reference_packing=args.reference_packing,
        example=eval_set.example,
        **extra,
    )


def _report(manifest: dict, args: argparse.Namespace, wall: float) -> None:
    """The closing lines: the note on replaced bytes, then what was written where, for a log."""
    note = replaced_bytes_note(manifest["splits"])
    if note:
        print(note)
    stats = manifest["splits"][args.split]
    dropped = stats["dropped_tail_tokens"] + stats["group_dropped_tokens"]
    print(f"done in {duration(wall)}: {args.dataset} {args.split} -> {args.out} ({args.packing}"
          f"{', reference packing' if args.reference_packing else ''}; {dropped:,} tokens "
          f"dropped)")
    print("\n".join(split_lines(args.out, manifest, "examples")), flush=True)


if __name__ == "__main__":
    sys.exit(main())

