"""Helpers for the findings-suite tests: experiments/ on the import path, a small real corpus."""

from __future__ import annotations

import json
import pydoc_data.topics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))  # run.py imports its siblings the same way


def build_mini_data(out: Path, seq_len: int = 64) -> Path:
    """Python's reference-manual topics (English prose shipped with the interpreter: real text,
    offline) packed by the real owt_to_mds.py into sequences of `seq_len` (64: the CPU suite's)."""
    documents = [text for text in pydoc_data.topics.topics.values() if len(text) > 200]
    source = out.parent / f"{out.name}.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    result = subprocess.run(
        [sys.executable, str(REPO / "data_prep" / "owt_to_mds.py"), "--out", str(out),
         "--source", str(source), "--seq-len", str(seq_len), "--val-fraction", "0.05",
         "--workers", "1"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out
