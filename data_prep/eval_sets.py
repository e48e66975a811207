"""The zero-shot evaluation sets (WikiText-2/103, PTB, LAMBADA, LM1B): where they come from, how
their examples are read, and how the examples become GPT-2 token samples in MDS.

The protocol is the paper's (AO-GPT, which took it from SEDD):
- An example is one row of the hub dataset. WikiText: one line of the raw file, headings and blank
  lines included (a non-blank line keeps its "\\n", a blank line is an empty example that still gets
  its EOS), which is how the hub's rows are cut; PTB and LM1B: one sentence (a line, stripped);
  LAMBADA: one passage.
- Each example goes through its dataset's detokenizer (detokenizers.py), GPT-2 BPE, then EOS.
- pack_concat: the examples' tokens are concatenated in order and cut into samples of seq_len
  tokens. The paper concatenated groups of 1000 examples (a datasets.map batch) and dropped each
  group's remainder; here the remainder is carried over and only the final tail is dropped,
  unless reference_packing reproduces the per-1000-example drop for exact parity.
- pack_per_example (LAMBADA): one passage per sample, padded with EOS to seq_len, plus the
  columns `length` (its real tokens, EOS included) and `last_word_start` (the index of the last
  word's first token): the target word is tokens[last_word_start : length - 1].
- The split is explicit. Defaults are the paper's: WikiText-2 is scored on its *train* split, the
  others on test. Local files name theirs (train/valid/test in the file name) or are told it.

Local files are lines of text (.txt/.raw/.tokens: WikiText's raw files, Mikolov's PTB, LM1B's
sentence files, LAMBADA's plain-text passages), .jsonl[.gz] with a "text" field (LAMBADA's
lambada_test.jsonl) or .parquet.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken

from aogpt import UsageError
from aogpt.data_prep import mds, packing, sources
from aogpt.data_prep.detokenizers import DETOKENIZERS
from aogpt.data_prep.tokenizer import EOS

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
    last_word: bool = False  # scored on each example's last word: --packing per_example applies


EVAL_SETS = {
    "wikitext2": EvalSet("Salesforce/wikitext", "wikitext-2-raw-v1", "text", "train", "wikitext",
                         "line"),
    "wikitext103": EvalSet("Salesforce/wikitext", "wikitext-103-raw-v1", "text", "test", "wikitext",
                           "line"),
    "ptb": EvalSet("ptb-text-only/ptb_text_only", None, "sentence", "test", "ptb", "sentence"),
    "lambada": EvalSet("EleutherAI/lambada_openai", None, "text", "test", "lambada", "passage",
                       last_word=True),
    "lm1b": EvalSet("dvruette/lm1b", None, "text", "test", "lm1b", "sentence"),
}


def split_of(eval_set: EvalSet, split: str | None, paths: Sequence[str] | None) -> str:
    """The split to build: `split` in its canonical name (valid/dev/val -> validation), else the
    paper's split of the hub dataset, else the one split that the local files' names say."""
    if split:
        return SPLIT_NAMES.get(split.lower(), split)
    if not paths:
        return eval_set.split
    found = {SPLIT_NAMES[word] for spec in paths for word in SPLIT_NAMES
             if word in Path(spec).name.lower().replace("_", ".").replace("-", ".").split(".")}
    if len(found) != 1:
        raise UsageError(f"cannot tell the split of {' '.join(paths)} from the file name: "
                         f"pass --split (e.g. --split test)")
    return found.pop()


def per_example_columns(seq_len: int) -> dict[str, str]:
    """The MDS columns of pack_per_example's samples."""
    return {**packing.mds_columns(seq_len), **PER_EXAMPLE_COLUMNS}


# ---- examples ----------------------------------------------------------------------------------

def read_examples(eval_set: EvalSet, split: str,
                  paths: Sequence[str] | None = None) -> tuple[list[sources.Document], str]:
    """All examples of the split in order (eval sets fit in memory), and where they came from:
    the hub dataset's split, or the files and folders in `paths` (read whole, in sorted order)."""
    if not paths:
        hub = sources.HubDataset(eval_set.repo_id, eval_set.config, split,
                                 text_field=eval_set.field)
        return _flatten(hub.chunks(REFERENCE_GROUP)), hub.describe()
    examples, described = [], []
    for spec in paths:
        path = Path(spec).expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            examples += read_file(file, eval_set)
        described.append(f"{spec} ({len(files)} files)")
    return examples, "; ".join(described)


def read_file(path: Path, eval_set: EvalSet) -> list[sources.Document]:
    """The examples of one local file, by its type (see the module docstring)."""
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


def examples_digest(examples: list[sources.Document]) -> str:
    """Identifies the input, so that an interrupted build is only resumed on the same examples."""
    digest = hashlib.sha256()
    for text, _ in examples:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


# ---- packing -----------------------------------------------------------------------------------

def pack_concat(examples: list[sources.Document], eval_set: EvalSet, split: str, seq_len: int,
                out_dir: Path, work_dir: Path, encoding: tiktoken.Encoding, workers: int,
                reference_packing: bool = False) -> dict:
    """Writes the examples' concatenated tokens as samples of seq_len into out_dir (scratch files
    in work_dir); returns the split's manifest statistics."""
    spec = packing.PackSpec(seq_len=seq_len, splits=(split,), detokenizer=eval_set.detokenizer,
                            group_size=REFERENCE_GROUP if reference_packing else None,
                            samples_per_shard=packing.default_samples_per_shard(seq_len))
    # Chunks of whole reference groups, so that a group never straddles two workers.
    chunks = (sources.Decoded(examples[i:i + REFERENCE_GROUP])
              for i in range(0, len(examples), REFERENCE_GROUP))
    result = packing.build(chunks, spec, work_dir, {split: out_dir}, encoding, workers)
    return result.splits[split]


# LAMBADA's passages end with the word to predict (its evaluations split each at its last space);
# more than this share of examples ending otherwise is taken for text of another kind.
NOT_A_LAST_WORD_SHARE = 0.05
SENTENCE_END = tuple(".!?;:,)]}\"'")


def last_word_warning(examples: Sequence[sources.Document], eval_set: EvalSet) -> str | None:
    """A warning when a set scored on its examples' last word (LAMBADA) is built from text that
    does not look like it: examples that are empty or end in punctuation instead of a word."""
    if not eval_set.last_word or not examples:
        return None
    ends = [text.rstrip() for text, _ in examples]
    odd = sum(not text or text.endswith(SENTENCE_END) for text in ends)
    if odd <= NOT_A_LAST_WORD_SHARE * len(ends):
        return None
    return (f"warning: {odd:,} of {len(ends):,} examples are empty or end in punctuation, not in "
            f"a word: LAMBADA's passages end with the word the model must predict, one passage "
            f"per example (.jsonl with one {{\"text\": ...}} per line). Is this LAMBADA?")


def pack_per_example(examples: list[sources.Document], eval_set: EvalSet, seq_len: int,
                     out_dir: Path, encoding: tiktoken.Encoding) -> dict:
    """One passage per sample, padded with EOS, with its length and the start of its last word,
    written into out_dir; returns the split's manifest statistics."""
    detokenize = DETOKENIZERS[eval_set.detokenizer]
    columns = per_example_columns(seq_len)
    rows = np.zeros(len(examples), dtype=mds.row_dtype(columns))
    rows["tokens"] = EOS  # the padding
    for row, (number, (text, _)) in zip(rows, enumerate(examples, start=1), strict=True):
        context, _, last_word = detokenize(text).rpartition(" ")
        if not last_word.strip():
            raise UsageError(f"example {number} has no last word to score: {text[:60]!r}")
        context_ids = encoding.encode_ordinary(context)
        ids = context_ids + encoding.encode_ordinary(" " + last_word) + [EOS]
        if len(ids) > seq_len:
            raise UsageError(f"example {number} has {len(ids)} tokens, more than --seq-len "
                             f"{seq_len}: raise --seq-len")
        row["tokens"][:len(ids)] = ids
        row["length"], row["last_word_start"] = len(ids), len(context_ids)
    per_shard = packing.default_samples_per_shard(seq_len)
    entries = [mds.write_shard(out_dir, number, columns, rows[first:first + per_shard].tobytes())
               for number, first in enumerate(range(0, len(rows), per_shard))]
    mds.write_index(out_dir, entries)
    replaced = [count for _, count in examples]
    return {"documents": len(rows), "tokens": int(rows["length"].sum()), "group_dropped_tokens": 0,
            "replaced_bytes": sum(replaced), "replaced_documents": sum(map(bool, replaced)),
            "samples": len(rows), "dropped_tail_tokens": 0, "shards": len(entries)}
