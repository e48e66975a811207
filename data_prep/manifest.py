"""manifest.json: what a data folder holds, how it was built, and whether a model can read it.

A data folder DIR holds MDS datasets plus DIR/manifest.json: pretraining data
(data_prep/owt_to_mds.py) has DIR/train/ and DIR/val/, and so have a synthetic language's
(data_prep/synthetic_to_mds.py, whose manifest holds the language) and Sudoku's grids
(data_prep/sudoku_to_mds.py, whose manifest holds the held-out puzzles); an eval set
(data_prep/eval_to_mds.py) has its one split directly in DIR/ (path "."). Every sample has the
column `tokens` = ndarray:uint16:<seq_len>: GPT-2 ids with EOS after each document, or the ids of
a vocabulary that is not text (the synthetic language's, Sudoku's digits). An eval set packed one
example per sample (--packing per_example) adds each example's `length` and `last_word_start`.

The builders write manifest.json last, so its presence means the folder is complete; it names
its builder ("builder"), the one tool that may replace the folder (--overwrite). Readers call
read_manifest / split_path / check_compatible and get a one-line UsageError that says how to fix
the folder instead of a failure deep inside streaming or the model.
"""

import datetime
import json
from pathlib import Path

import aogpt
from aogpt import UsageError
from aogpt.data_folder import MANIFEST_FILE as FILENAME
from aogpt.data_prep import mds, tokenizer
from aogpt.files import write_text_atomic

FORMAT = "aogpt-mds"
VERSION = 1
COLUMN = "tokens"
DTYPE = "uint16"
KINDS = ("pretrain", "eval")
REQUIRED_KEYS = ("kind", "dataset", "seq_len", "tokenizer", "splits")
HOW_TO_BUILD = (
    "build it with `python data_prep/owt_to_mds.py --out DIR` "
    "(or data_prep/eval_to_mds.py for an eval set)"
)


def new_manifest(kind: str, dataset: str, source: str, seq_len: int, tokenizer_info: dict,
                 splits: dict[str, dict], **extra) -> dict:
    """A complete manifest; `splits` maps each split name to {"path": ..., counts...}."""
    assert kind in KINDS, kind
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "dataset": dataset,
        "source": source,
        "seq_len": seq_len,
        "column": COLUMN,
        "dtype": DTYPE,
        "tokenizer": tokenizer_info,
        "splits": splits,
        "shard_hashes": mds.HASHES,  # every shard's, in its index (absent: built before they were)
        "tool_version": aogpt.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def write_manifest(path: Path, manifest: dict) -> None:
    """Writes atomically (temp file, then rename): a reader never sees half a manifest."""
    write_text_atomic(path, json.dumps(manifest, indent=2) + "\n")


def read_manifest(data_dir: str | Path) -> dict:
    """The manifest of a finished data folder; a UsageError that says how to build one otherwise."""
    path = Path(data_dir) / FILENAME
    if not path.is_file():
        what = "does not exist" if not Path(data_dir).exists() else f"has no {FILENAME}"
        raise UsageError(f"data folder {data_dir} {what} (not a finished aogpt data folder): "
                         f"{HOW_TO_BUILD}")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not valid JSON ({err}): delete the folder and "
                         f"{HOW_TO_BUILD}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError(f"{path} is not an aogpt data manifest (format is not {FORMAT!r}): "
                         f"{HOW_TO_BUILD}")
    if manifest.get("version") != VERSION:
        raise UsageError(f"{path} has manifest version {manifest.get('version')!r}, this aogpt "
                         f"reads version {VERSION}: rebuild it with this version's data_prep")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise UsageError(f"{path} lacks {', '.join(missing)}: the folder is damaged; "
                         f"{HOW_TO_BUILD}")
    return manifest


def builder_of(manifest: dict) -> str | None:
    """The data_prep tool that built a dataset (owt_to_mds, eval_to_mds, synthetic_to_mds,
    sudoku_to_mds): its manifest's "builder", or the tool its settings name (a manifest written
    before it recorded one); None when neither says."""
    return manifest.get("builder") or (manifest.get("settings") or {}).get("tool")


def describe_builder(builder: str | None) -> str:
    return f"data_prep/{builder}.py" if builder else "an unknown tool"


def rebuild_command(location: str, manifest: dict) -> str:
    """The command that rebuilds a damaged dataset: the data_prep tool that built it, into the
    same location."""
    tool = describe_builder(builder_of(manifest) or "owt_to_mds")
    return f"`python {tool} --out {location} --overwrite`"


def split_path(data_dir: str | Path, split: str) -> Path:
    """The folder holding `split`'s index.json (DIR/train, DIR/val, or DIR for an eval set)."""
    splits = read_manifest(data_dir)["splits"]
    if split not in splits:
        raise UsageError(f"data folder {data_dir} has no split {split!r} "
                         f"(it has: {', '.join(splits)})")
    path = Path(data_dir) / splits[split]["path"]
    if not (path / "index.json").is_file():
        raise UsageError(f"{path / 'index.json'} is missing: the data folder is damaged; "
                         f"delete it and {HOW_TO_BUILD}")
    return path


def check_compatible(manifest: dict, seq_len: int, vocab_size: int | None = None) -> None:
    """Refuses data made with another tokenizer or for another sequence length than the model's,
    and (given the model's vocab_size) data whose token ids the model has no row for: GPT-2 BPE
    for a model of a few ids, or data of more ids than the model has. Data that is not text (a
    synthetic language, a puzzle) records its tokenizer as {"name": ..., "n_vocab": ...,
    "text": false}."""
    info = manifest["tokenizer"]
    if info.get("text") is False:
        if vocab_size is not None and vocab_size < info.get("n_vocab", 0):
            raise UsageError(f"the data is {info.get('name')} token ids 0..{info['n_vocab'] - 1}, "
                             f"the model's vocabulary has {vocab_size}: set model.vocab_size="
                             f"{info['n_vocab']}")
    elif info.get("name") != tokenizer.NAME or info.get("ranks_sha256") != tokenizer.RANKS_SHA256:
        raise UsageError(
            f"the data was tokenized with {info.get('name')!r} (ranks sha256 "
            f"{str(info.get('ranks_sha256'))[:12]}...), the model uses GPT-2 "
            f"({tokenizer.RANKS_SHA256[:12]}...): rebuild the data with data_prep/owt_to_mds.py"
        )
    elif vocab_size is not None and vocab_size < tokenizer.N_VOCAB:
        raise UsageError(f"the data is GPT-2 text ({tokenizer.N_VOCAB} tokens), the model's "
                         f"vocabulary has {vocab_size} (a model of a few token ids): train or "
                         "evaluate it on data of its own ids")
    if manifest["seq_len"] != seq_len:
        raise UsageError(
            f"the data has samples of {manifest['seq_len']} tokens, the model's sequence length "
            f"is {seq_len}: rebuild the data with --seq-len {seq_len} or set "
            f"model.block_size={manifest['seq_len']}"
        )
