"""Build the pretraining data: OpenWebText (or local text) -> GPT-2 tokens -> MDS train/ and val/.

    python data_prep/owt_to_mds.py --out data/owt [--source SRC ...] [--seq-len 1024]
        [--val-fraction 0.0005] [--workers N] [--tokenizer-file PATH] [--overwrite]

What it reads (the hub's OpenWebText, or local .txt, .jsonl[.gz], .parquet and OpenWebText's
archives), what it writes and how a re-run, --overwrite, --out s3://... and --slice I/N behave:
docs/data.md (and docs/cluster.md for buckets and SLURM arrays). This command wires the
pieces together; each says why it is built as it is:
    sources.py    the inputs, cut into chunks by the input alone (the hub's parquet export:
                  datasets >= 4 cannot run OpenWebText's loading script)
    packing.py    GPT-2 BPE with EOS after each document, cut into --seq-len samples with the
                  remainder carried into the next document, the same bytes for any --workers;
                  val/ by a hash of each document's text, so the split never moves
    build_dir.py  DIR/.partial: resumable, and DIR complete (manifest.json last) or absent
    remote.py     a bucket as --out, complete or absent without a rename
    slices.py     one corpus tokenized across nodes, byte for byte the one-task dataset
Each sample is one column `tokens` = ndarray:uint16:<seq-len>. Disk: the work files in
DIR/.partial need about as much space as the output.
"""

import argparse
import dataclasses
import itertools
import math
import sys
import time

import aogpt
from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep import packing, slices, sources
from aogpt.data_prep.cli import (
    add_output_flags,
    build_output,
    check_out,
    replaced_bytes_note,
    split_lines,
)
from aogpt.data_prep.manifest import new_manifest
from aogpt.data_prep.remote import is_remote, open_output
from aogpt.data_prep.tokenizer import describe
from aogpt.progress import duration

SPLITS = ("train", "val")
OPENWEBTEXT_DOCUMENTS = 8_013_769  # for the progress bar's total
COMPRESSIONS = ("none", "zstd", "gz", "br", "bz2", "snappy")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python data_prep/owt_to_mds.py",
        description="Tokenize OpenWebText (or local text) with GPT-2 BPE and pack it into "
                    "fixed-length MDS samples in OUT/train and OUT/val, with OUT/manifest.json.",
    )
    add = parser.add_argument
    add_output_flags(parser)
    add("--source", nargs="+", action="extend", metavar="SRC",
        help=f"Hugging Face dataset id (default: {sources.OPENWEBTEXT}) or local files/folders "
             f"({sources.SUPPORTED}); repeatable. A .txt file is one document (a folder of "
             f".txt files: one document each); for one document per line, write .jsonl with "
             f"one {{\"text\": ...}} per line")
    add("--seq-len", type=int, default=1024, help="tokens per sample (default 1024)")
    add("--val-fraction", type=float, default=0.0005,
        help="share of documents in val/, chosen by a hash of the text (default 0.0005)")
    add("--workers", type=int, default=packing.available_cores(),
        help="worker processes (default: all available cores); the output does not depend on it")
    add("--tokenizer-file", default=None, help="GPT-2 ranks file (gpt2.tiktoken) for offline use")
    add("--compression", default="none",
        help="shard compression: none (default), or zstd[:level], gz, br, bz2, snappy. Compressed "
             "local shards are decompressed next to themselves when read, which races on shared "
             "filesystems")
    add("--name", default=None,
        help="dataset name in the manifest (default: openwebtext for the hub's, else custom)")
    add("--docs-per-chunk", type=int, default=1000,
        help="documents per unit of work (default 1000); does not change the output")
    add("--samples-per-shard", type=int, default=None,
        help="samples per MDS shard (default: 64 MiB of tokens)")
    add("--slice", default=None, metavar="I/N",
        help="tokenize only slice I of N of the input files (0 <= I < N; one task of N, on any "
             "node) into OUT/.slices; the same command with --merge-slices N then writes OUT")
    add("--merge-slices", type=int, default=None, metavar="N",
        help="write OUT from the N finished slices: the dataset a one-task build writes, byte "
             "for byte")
    add("--hf-split", default="train", help="split of a hub dataset (default train)")
    add("--hf-config", default=None, help="config (subset) name of a hub dataset")
    add("--hf-revision", default=None,
        help=f"revision of a hub dataset (default: {sources.PARQUET_REVISION} for OpenWebText, "
             f"else the main branch)")
    args = parser.parse_args(argv)
    check_counts(args, "seq_len", "workers", "docs_per_chunk", "merge_slices")
    if args.slice is not None and args.merge_slices is not None:
        raise UsageError("--slice tokenizes one slice, --merge-slices merges them all: give one")
    args.slice = args.slice and slices.parse_slice(args.slice)
    if (args.slice or args.merge_slices) and is_remote(args.out) and args.staging is None:
        raise UsageError("--slice and --merge-slices with an s3:// --out need --staging: a "
                         "folder that every task sees (the slices meet there before the upload)")
    if args.samples_per_shard is None:  # after --seq-len is checked: this divides by it
        args.samples_per_shard = packing.default_samples_per_shard(args.seq_len)
    if not 0.0 <= args.val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    check_shard_size(args.samples_per_shard, args.seq_len)
    args.compression = parse_compression(args.compression)
    check_out(args.out, args.staging)
    return args


def check_shard_size(samples_per_shard: int, seq_len: int) -> None:
    # MDS stores sample offsets as uint32, so one shard must stay below 4 GiB.
    if samples_per_shard < 1 or samples_per_shard * (2 * seq_len + 4) >= 2**32:
        most = (2**32 - 1) // (2 * seq_len + 4)
        raise UsageError(f"--samples-per-shard must be between 1 and {most} for --seq-len "
                         f"{seq_len}, got {samples_per_shard}")


def parse_compression(name: str) -> str | None:
    """None for "none", else a codec name that streaming accepts: checked before any work (an
    unknown level such as zstd:99 used to fail at the first shard, after tokenizing)."""
    algorithm, _, level = name.partition(":")
    if algorithm not in COMPRESSIONS or (level and algorithm == "none"):
        raise UsageError(f"--compression {name!r} is not one of {', '.join(COMPRESSIONS)} "
                         f"(with an optional :level, e.g. zstd:7)")
    if name == "none":
        return None
    from aogpt.data_prep.streaming_compat import streaming  # imports torch: only to compress

    codecs = streaming.base.compression.get_compressions()
    if name not in codecs:
        levels = sorted(int(codec.partition(":")[2]) for codec in codecs
                        if codec.startswith(f"{algorithm}:"))
        takes = f"a level from {levels[0]} to {levels[-1]}" if levels else "no level"
        raise UsageError(f"--compression {name!r}: {algorithm} takes {takes}")
    return name


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    encoding = packing.load_encoding(args.tokenizer_file)
    inputs = [sources.resolve(spec, args.hf_split, args.hf_config, args.hf_revision)
              for spec in args.source or [sources.OPENWEBTEXT]]
    spec = packing.PackSpec(seq_len=args.seq_len, splits=SPLITS, val_fraction=args.val_fraction,
                            samples_per_shard=args.samples_per_shard, compression=args.compression)
    settings = {"tool": "owt_to_mds", "tool_version": aogpt.__version__,
                "sources": [source.fingerprint() for source in inputs],
                "docs_per_chunk": args.docs_per_chunk, "tokenizer": describe(encoding),
                "spec": dataclasses.asdict(spec)}
    out = open_output(args.out, args.staging, SPLITS)
    if args.slice:
        if out.holds(settings):
            print(f"{args.out} is complete already: nothing to do (--overwrite rebuilds it)")
            return 0
        slices.run_slice(out.slices_root(), *args.slice, inputs, settings, spec,
                         args.docs_per_chunk, encoding, args.workers)
        return 0
    built = []  # what this run tokenized (none: it uploaded a build staged by an earlier run)

    def make() -> dict:
        built.append(_build(args, inputs, spec, encoding, out, settings))
        return _manifest(args, inputs, spec, encoding, built[0])

    manifest = build_output(out, args.out, settings, args.overwrite, "documents", make)
    if manifest is None:
        return 0
    slices.remove(out.staging_root)  # merged and published: the slices have served
    _report(manifest, built[0] if built else None, args, time.perf_counter() - wall_start)
    return 0


def _build(args: argparse.Namespace, inputs: list[sources.Source], spec: packing.PackSpec,
           encoding, out, settings: dict) -> packing.BuildResult:
    """Tokenizes and packs the inputs (or merges their finished slices) into out's staging
    area."""
    split_dirs = {name: out.out / name for name in SPLITS}
    if args.merge_slices:
        metas = slices.finished_metas(out.staging_root, args.merge_slices, settings)
        result = packing.write(metas, spec, out.work, split_dirs, encoding, args.workers)
    else:
        chunks = itertools.chain.from_iterable(
            source.chunks(args.docs_per_chunk) for source in inputs)
        result = packing.build(chunks, spec, out.work, split_dirs, encoding, args.workers,
                               OPENWEBTEXT_DOCUMENTS if _is_openwebtext(inputs) else None)
    _check_result(result, args, _describe(inputs))
    return result


def _is_openwebtext(inputs: list[sources.Source]) -> bool:
    return all(isinstance(source, sources.HubDataset) and source.repo_id == sources.OPENWEBTEXT
               for source in inputs)


def _describe(inputs: list[sources.Source]) -> str:
    return "; ".join(source.describe() for source in inputs)


def _manifest(args: argparse.Namespace, inputs: list[sources.Source], spec: packing.PackSpec,
              encoding, result: packing.BuildResult) -> dict:
    return new_manifest(
        "pretrain", args.name or ("openwebtext" if _is_openwebtext(inputs) else "custom"),
        _describe(inputs), args.seq_len, describe(encoding),
        {name: {"path": name, **result.splits[name]} for name in SPLITS},
        val_fraction=args.val_fraction,
        split_rule="a document is in val when blake2b(text, 8 bytes) / 2**64 < val_fraction",
        samples_per_shard=args.samples_per_shard,
        compression=args.compression,
    )


# A document goes whole to one split: more text in it cannot give the other split any.
ONE_DOCUMENT = ("the input is one document (a .txt file is one), which goes whole to one split: "
                "give the text as several documents (a .jsonl with one {\"text\": ...} per line, "
                "or a folder of .txt files)")


def _check_result(result: packing.BuildResult, args: argparse.Namespace, description: str) -> None:
    train = result.splits["train"]
    documents = sum(result.splits[name]["documents"] for name in SPLITS)
    if not documents:
        raise UsageError(f"no documents in {description}: the input is empty")
    if train["samples"] == 0:
        advice = (ONE_DOCUMENT if documents == 1 and train["documents"] == 0
                  else "add text or lower --seq-len")
        raise UsageError(f"the training split has {train['tokens']} tokens, not enough for one "
                         f"sample of --seq-len {args.seq_len}: {advice}")


def _report(manifest: dict, result: packing.BuildResult | None, args: argparse.Namespace,
            wall: float) -> None:
    """The closing lines: warnings and notes, then what was written where, for a log. `result`
    is None when this run only uploaded a build staged by an earlier one."""
    splits = manifest["splits"]
    if args.val_fraction > 0 and splits["val"]["samples"] == 0:
        print(_empty_val_warning(splits, result and result.val_threshold, args))
    note = replaced_bytes_note(splits)
    if note:
        print(note)
    rate = result.tokenized / max(result.seconds, 1e-9) if result else 0.0
    how = (f"tokenized at {rate / 1e6:.2f}M tokens/s ({rate / args.workers / 1e6:.2f}M per "
           f"worker, {args.workers} workers)")
    if args.merge_slices:
        how = f"merged {args.merge_slices} slices"
    if result is None:
        how = "uploaded the staged build"
    print(f"done in {duration(wall)}: {sum(s['documents'] for s in splits.values()):,} documents, "
          f"{sum(s['tokens'] for s in splits.values()):,} tokens -> {args.out}; {how}")
    print("\n".join(split_lines(args.out, manifest)), flush=True)


def _empty_val_warning(splits: dict, threshold: tuple[float, int] | None,
                       args: argparse.Namespace) -> str:
    """What to pass to get a validation split: the smallest round --val-fraction that gives val/
    a sample and leaves one to train/ (the hash rule is fixed: the documents it takes are known)."""
    val, documents = splits["val"], sum(split["documents"] for split in splits.values())
    tokens = sum(split["tokens"] for split in splits.values())
    if documents == 1:
        advice = ONE_DOCUMENT
    elif threshold is None:  # resumed from an earlier version's work files, without positions
        advice = "raise --val-fraction or add text"
    elif tokens - threshold[1] >= args.seq_len and (fraction := _round_up(threshold[0])):
        advice = f"--val-fraction {fraction} or more gives it at least one"
    else:
        advice = "add text: the corpus is too small for a sample in each split"
    return (f"warning: val/ has no samples: --val-fraction {args.val_fraction:g} sent "
            f"{val['documents']:,} of {documents:,} documents there ({val['tokens']:,} tokens; "
            f"a sample takes {args.seq_len}); {advice}")


def _round_up(threshold: float) -> str | None:
    """The number of two significant digits just above `threshold`, as a user would type it; None
    when that is 1 or more (no --val-fraction can do it)."""
    step = 10.0 ** (math.floor(math.log10(threshold)) - 1)
    text = f"{(math.floor(threshold / step) + 1) * step:.2g}"
    if float(text) <= threshold:  # a hair below a round number, lost to floating point
        text = f"{float(text) + step:.2g}"
    return text if float(text) < 1 else None


if __name__ == "__main__":
    sys.exit(main())
