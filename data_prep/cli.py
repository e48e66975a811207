"""What the data-prep commands share at their edges: flags and --out checked before any work (a
build can take hours; a typo must not cost them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aogpt import UsageError
from aogpt.files import check_writable_folder


def check_counts(args: argparse.Namespace, *names: str) -> None:
    """Refuses 0 and negative values of the flags `names` (dest names): for these, 0 is never
    "the default"."""
    for name in names:
        value = getattr(args, name)
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def check_out(folder: Path) -> None:
    """--out is, or can be made, a folder this process can write in (tried, so /proc, /sys and a
    read-only filesystem are found even by root)."""
    try:
        check_writable_folder(folder, f"--out {folder}")
    except UsageError as err:
        raise UsageError(f"{err}: choose another --out") from None

