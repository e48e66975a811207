"""`python -m aogpt.data_prep.shared_memory`: removes the shared-memory blocks of streaming runs
that are gone (the library: data_prep/shared_memory/__init__.py)."""

from __future__ import annotations

import argparse
import sys

from aogpt import cli_entry
from aogpt.data_prep import shared_memory
from aogpt.data_prep.shared_memory import host_lock, remove_dead_blocks


@cli_entry
def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m aogpt.data_prep.shared_memory",
                            description=shared_memory.__doc__.split("\n\n")[0]).parse_args(argv)
    with host_lock():
        sweep = remove_dead_blocks()
    print(sweep.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
