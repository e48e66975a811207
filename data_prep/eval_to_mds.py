"""Build a zero-shot evaluation set (WikiText-2/103, PTB, LAMBADA, LM1B) as GPT-2 tokens in MDS.

    python data_prep/eval_to_mds.py --dataset {wikitext2,wikitext103,ptb,lambada,lm1b} --out DIR
        [--source PATH ...] [--split S] [--seq-len 1024] [--packing concat|per_example]
        [--reference-packing]

Without --source the dataset comes from the Hugging Face hub; with it, from local files: lines of
text (.txt/.raw/.tokens: WikiText's raw files, Mikolov's PTB, LM1B's sentence files, LAMBADA's
plain-text passages), .jsonl[.gz] with a "text" field (LAMBADA's lambada_test.jsonl) or .parquet.
The MDS files go directly into DIR with DIR/manifest.json (kind "eval", one split, path ".").

The protocol is the paper's (AO-GPT, which took it from SEDD):
- An example is one row of the hub dataset. WikiText: one line of the raw file, headings and blank
  lines included (a non-blank line keeps its "\\n", a blank line is an empty example that still gets
  its EOS), which is how the hub's rows are cut; PTB and LM1B: one sentence (a line, stripped);
  LAMBADA: one passage.
- Each example goes through its dataset's detokenizer (detokenizers.py), GPT-2 BPE, then EOS.
- --packing concat (default): the examples' tokens are concatenated in order and cut into samples
  of --seq-len tokens. The paper concatenated groups of 1000 examples (a datasets.map batch) and
  dropped each group's remainder; here the remainder is carried over and only the final tail is
  dropped, unless --reference-packing reproduces the per-1000-example drop for exact parity.
- --packing per_example (LAMBADA): one passage per sample, padded with EOS to --seq-len, plus the
  columns `length` (its real tokens, EOS included) and `last_word_start` (the index of the last
  word's first token): the target word is tokens[last_word_start : length - 1].
- The split is explicit and recorded in the manifest. Defaults are the paper's: WikiText-2 is
  scored on its *train* split, the others on test. Local files name theirs (train/valid/test in
  the file name) or take --split.
"""

import argparse
import hashlib
import io
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import aogpt
from aogpt import UsageError, cli_entry
from aogpt.data_prep import mds, packing, sources
from aogpt.data_prep.build_dir import OutputDir
from aogpt.data_prep.detokenizers import DETOKENIZERS
from aogpt.data_prep.manifest import new_manifest
from aogpt.data_prep.tokenizer import EOS, describe, load_gpt2

REFERENCE_GROUP = 1000  # examples per datasets.map batch in the paper's pipeline
LINE_FILES = (".txt", ".raw", ".tokens")
SPLIT_NAMES = {"train": "train", "valid": "validation", "validation": "validation",
               "val": "validation", "dev": "validation", "test": "test"}
PER_EXAMPLE_COLUMNS = {"length": "int32", "last_word_start": "int32"}


@dataclass(frozen=True)
class EvalSet:
    repo_id: str
    config: str | None
    field: str  # the text's field in the hub dataset
    split: str  # the paper's split
    detokenizer: str
    example: str  # "line": a raw line ("\n" kept, blank -> ""); "sentence"/"passage": stripped


EVAL_SETS = {
    "wikitext2": EvalSet("Salesforce/wikitext", "wikitext-2-raw-v1", "text", "train", "wikitext",
                         "line"),
    "wikitext103": EvalSet("Salesforce/wikitext", "wikitext-103-raw-v1", "text", "test", "wikitext",
                           "line"),
    "ptb": EvalSet("ptb-text-only/ptb_text_only", None, "sentence", "test", "ptb", "sentence"),
    "lambada": EvalSet("EleutherAI/lambada_openai", None, "text", "test", "lambada", "passage"),
    "lm1b": EvalSet("dvruette/lm1b", None, "text", "test", "lm1b", "sentence"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python data_prep/eval_to_mds.py",
        description="Detokenize, GPT-2-tokenize and pack a zero-shot eval set into MDS in OUT "
                    "(one split), with OUT/manifest.json, following the paper's protocol.",
    )
    parser.add_argument("--dataset", required=True, choices=sorted(EVAL_SETS))
    parser.add_argument("--out", type=Path, required=True, help="output folder")
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
    parser.add_argument("--overwrite", action="store_true",
                        help="rebuild OUT even when it is complete")
    args = parser.parse_args(argv)
    if args.seq_len < 1:
        raise UsageError(f"--seq-len must be at least 1, got {args.seq_len}")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.packing == "per_example" and args.dataset != "lambada":
        raise UsageError("--packing per_example is for lambada (last-word scoring); use concat")
    if args.packing == "per_example" and args.reference_packing:
        raise UsageError("--reference-packing applies to --packing concat only")
    for spec in args.source or []:
        if not Path(spec).expanduser().exists():
            raise UsageError(f"source {spec} does not exist: check the path")
    args.split = _split_name(args)
    return args


def _split_name(args: argparse.Namespace) -> str:
    if args.split:
        return SPLIT_NAMES.get(args.split.lower(), args.split)
    if not args.source:
        return EVAL_SETS[args.dataset].split
    found = {SPLIT_NAMES[word] for spec in args.source for word in SPLIT_NAMES
             if word in Path(spec).name.lower().replace("_", ".").replace("-", ".").split(".")}
    if len(found) != 1:
        raise UsageError(f"cannot tell the split of {' '.join(args.source)} from the file name: "
                         f"pass --split (e.g. --split test)")
    return found.pop()


# ---- examples ----------------------------------------------------------------------------------

def read_examples(args: argparse.Namespace) -> tuple[list[sources.Document], str]:
    """All examples of the split in order (eval sets fit in memory), and where they came from."""
    eval_set = EVAL_SETS[args.dataset]
    if not args.source:
        hub = sources.HubDataset(eval_set.repo_id, eval_set.config, args.split,
                                 text_field=eval_set.field)
        return _flatten(hub.chunks(REFERENCE_GROUP)), hub.describe()
    examples, described = [], []
    for spec in args.source:
        path = Path(spec).expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            examples += _read_file(file, eval_set)
        described.append(f"{spec} ({len(files)} files)")
    return examples, "; ".join(described)


def _read_file(path: Path, eval_set: EvalSet) -> list[sources.Document]:
    name = path.name.lower()
    if name.endswith(LINE_FILES):
        return list(_lines(path.read_bytes(), raw=eval_set.example == "line"))
    if name.endswith((".jsonl", ".jsonl.gz")):
        return _flatten(sources.jsonl_chunks(path, REFERENCE_GROUP))
    if name.endswith(".parquet"):
        return _flatten(sources.parquet_chunks(path, REFERENCE_GROUP, eval_set.field))
    raise UsageError(f"{path}: unsupported file type for an eval set (supported: "
                     f"{', '.join(LINE_FILES)}, .jsonl, .jsonl.gz, .parquet)")


def _flatten(chunks: Iterable[sources.Chunk]) -> list[sources.Document]:
    return [doc for chunk in chunks for doc in chunk.documents()]


def _lines(data: bytes, raw: bool) -> Iterator[sources.Document]:
    """One example per line, as the hub's rows are cut (see the module docstring)."""
    for line in io.BytesIO(data):
        text, replaced = sources.decode_utf8(line)
        text = text.replace("\r\n", "\n")
        if raw:
            yield (text if text.strip() else ""), replaced
        else:
            yield text.strip(), replaced


# ---- packing -----------------------------------------------------------------------------------

def pack_concat(examples: list[sources.Document], args: argparse.Namespace, out: OutputDir,
                encoding) -> dict:
    spec = packing.PackSpec(seq_len=args.seq_len, splits=(args.split,),
                            detokenizer=EVAL_SETS[args.dataset].detokenizer,
                            group_size=REFERENCE_GROUP if args.reference_packing else None,
                            samples_per_shard=packing.default_samples_per_shard(args.seq_len))
    # Chunks of whole reference groups, so that a group never straddles two workers.
    chunks = (sources.Decoded(examples[i:i + REFERENCE_GROUP])
              for i in range(0, len(examples), REFERENCE_GROUP))
    result = packing.build(chunks, spec, out.work, {args.split: out.out}, encoding, args.workers)
    return result.splits[args.split]


def pack_per_example(examples: list[sources.Document], args: argparse.Namespace, out: OutputDir,
                     encoding) -> dict:
    """One passage per sample, padded with EOS, with its length and the start of its last word."""
    detokenize = DETOKENIZERS[EVAL_SETS[args.dataset].detokenizer]
    columns = {**packing.mds_columns(args.seq_len), **PER_EXAMPLE_COLUMNS}
    rows = np.zeros(len(examples), dtype=mds.row_dtype(columns))
    rows["tokens"] = EOS  # the padding
    for row, (number, (text, _)) in zip(rows, enumerate(examples, start=1), strict=True):
        context, _, last_word = detokenize(text).rpartition(" ")
        if not last_word.strip():
            raise UsageError(f"example {number} has no last word to score: {text[:60]!r}")
        context_ids = encoding.encode_ordinary(context)
        ids = context_ids + encoding.encode_ordinary(" " + last_word) + [EOS]
        if len(ids) > args.seq_len:
            raise UsageError(f"example {number} has {len(ids)} tokens, more than --seq-len "
                             f"{args.seq_len}: raise --seq-len")
        row["tokens"][:len(ids)] = ids
        row["length"], row["last_word_start"] = len(ids), len(context_ids)
    per_shard = packing.default_samples_per_shard(args.seq_len)
    entries = [mds.write_shard(out.out, number, columns, rows[first:first + per_shard].tobytes())
               for number, first in enumerate(range(0, len(rows), per_shard))]
    mds.write_index(out.out, entries)
    replaced = [count for _, count in examples]
    return {"documents": len(rows), "tokens": int(rows["length"].sum()), "group_dropped_tokens": 0,
            "replaced_bytes": sum(replaced), "replaced_documents": sum(map(bool, replaced)),
            "samples": len(rows), "dropped_tail_tokens": 0, "shards": len(entries)}


@cli_entry
def main(argv: list[str] | None = None) -> int:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    encoding = load_gpt2(args.tokenizer_file)
    packing.check_fits_uint16(encoding)
    eval_set = EVAL_SETS[args.dataset]
    out = OutputDir(args.out, owns=_owned)
    examples, description = read_examples(args)
    if not examples:
        raise UsageError(f"no examples in {description}: the input is empty")
    settings = {"tool": "eval_to_mds", "tool_version": aogpt.__version__, "dataset": args.dataset,
                "examples_sha256": _digest(examples), "split": args.split, "seq_len": args.seq_len,
                "packing": args.packing, "reference_packing": args.reference_packing,
                "tokenizer": describe(encoding)}
    if not out.start(settings, args.overwrite):
        print(f"{args.out} is complete already: nothing to do (--overwrite rebuilds it)")
        return 0
    try:
        pack = pack_per_example if args.packing == "per_example" else pack_concat
        stats = pack(examples, args, out, encoding)
        if stats["samples"] == 0:
            raise UsageError(f"{stats['tokens']} tokens are not enough for one sample of "
                             f"--seq-len {args.seq_len}: lower --seq-len")
    except UsageError:
        out.discard()
        raise
    extra = {}
    if args.packing == "per_example":
        extra = {"columns": {**packing.mds_columns(args.seq_len), **PER_EXAMPLE_COLUMNS},
                 "pad_id": EOS}
    manifest = new_manifest(
        "eval", args.dataset, description, args.seq_len, describe(encoding),
        {args.split: {"path": ".", **stats}},
        split=args.split, detokenizer=eval_set.detokenizer, packing=args.packing,
        reference_packing=args.reference_packing,
        example=eval_set.example,
        **extra,
    )
    out.publish(manifest)
    print(f"done: {args.dataset} {args.split}: {stats['documents']:,} examples, "
          f"{stats['tokens']:,} tokens, {stats['samples']:,} samples of {args.seq_len} "
          f"({args.packing}"
          f"{', reference packing' if args.reference_packing else ''}; "
          f"{stats['dropped_tail_tokens'] + stats['group_dropped_tokens']:,} tokens dropped) "
          f"in {time.perf_counter() - wall_start:.1f} s -> {args.out}")
    return 0


def _digest(examples: list[sources.Document]) -> str:
    """Identifies the input, so that an interrupted build is only resumed on the same examples."""
    digest = hashlib.sha256()
    for text, _ in examples:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def _owned(name: str) -> bool:
    """What this tool writes into DIR: index.json and the shards."""
    return name == "index.json" or name.startswith("shard.")


if __name__ == "__main__":
    sys.exit(main())

