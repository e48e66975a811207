"""Helpers for the data_prep tests: real text, an independent reference stream, MDS read back."""

import hashlib
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from aogpt.data_prep.sources import PARQUET_REVISION
from aogpt.data_prep.streaming_compat import release_shared_memory, streaming
from aogpt.data_prep.tokenizer import EOS, load_gpt2

REPO = Path(__file__).resolve().parents[2]
OWT_TO_MDS = str(REPO / "data_prep" / "owt_to_mds.py")
EVAL_TO_MDS = str(REPO / "data_prep" / "eval_to_mds.py")

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "lobster café naïve Zürich 1,024 3.5 (brackets) \"quoted\" it's don't"
).split()


def generated_documents(count: int = 40, seed: int = 0) -> list[str]:
    """Stand-in text where ../shared/data is absent: sentences of common words, numbers, unicode."""
    rng = random.Random(seed)
    documents = []
    for _ in range(count):
        sentences = [
            " ".join(rng.choices(_WORDS, k=rng.randint(3, 25))).capitalize() + "."
            for _ in range(rng.randint(1, 40))
        ]
        documents.append(" ".join(sentences))
    documents[3] += " A literal <|endoftext|> in the text is ordinary text."
    return documents


def wikitext_articles(path: Path) -> list[str]:
    """WikiText's articles: each starts at a " = Title = " line."""
    return [article for article in re.split(r"\n(?= = [^=])", path.read_text()) if article.strip()]


def real_or_generated_documents(request) -> list[str]:
    """Real text (WikiText-2 articles, conftest's shared_text) when present, else generated text."""
    try:
        return wikitext_articles(request.getfixturevalue("shared_text"))
    except pytest.skip.Exception:
        return generated_documents()


def write_jsonl(path: Path, documents: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    return path


def in_val(text: str, val_fraction: float) -> bool:
    """The documented split rule, restated independently of data_prep."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def token_stream(documents: list[str]) -> np.ndarray:
    """The reference: each document tokenized on its own with plain tiktoken, EOS after each."""
    encoding = load_gpt2()
    ids = [token for text in documents for token in encoding.encode_ordinary(text) + [EOS]]
    return np.array(ids, dtype=np.uint16)


def read_samples(split_dir: Path) -> np.ndarray:
    """All samples of an MDS split, in order, read back by streaming: (samples, seq_len)."""
    dataset = streaming.StreamingDataset(
        local=str(split_dir), remote=None, shuffle=False, num_canonical_nodes=1, batch_size=1
    )
    samples = np.stack([dataset[i]["tokens"] for i in range(dataset.size)])
    release_shared_memory(dataset)
    return samples


def read_column(split_dir: Path, column: str) -> list:
    dataset = streaming.StreamingDataset(
        local=str(split_dir), remote=None, shuffle=False, num_canonical_nodes=1, batch_size=1
    )
    values = [dataset[i][column] for i in range(dataset.size)]
    release_shared_memory(dataset)
    return values


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (except the manifest, which holds a timestamp) by relative path."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != "manifest.json"
    }


def manifest_of(folder: Path) -> dict:
    """The manifest less what may differ between equal builds: time, and the options used."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("created")
    manifest.pop("settings")
    return manifest


class FakeHub:
    """Stands in for datasets.load_dataset and records how it was called."""

    def __init__(self, rows: list[dict], script_based: bool = False):
        self.rows, self.script_based, self.calls = rows, script_based, []

    def __call__(self, path, name=None, **kwargs):
        import datasets

        self.calls.append({"path": path, "name": name, **kwargs})
        if self.script_based and kwargs.get("revision") != PARQUET_REVISION:
            raise RuntimeError(
                f"Dataset scripts are no longer supported, but found {path.split('/')[1]}.py"
            )
        return datasets.Dataset.from_list(self.rows).to_iterable_dataset()
