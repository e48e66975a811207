"""`python -m aogpt.data_prep.corpora shakespeare|python-docs --out DIR`: a small real corpus that
needs no dataset download, written into DIR (the library, and where each corpus comes from:
data_prep/corpora/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aogpt import cli_entry
from aogpt.data_prep import corpora
from aogpt.files import check_writable_folder


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aogpt.data_prep.corpora",
                                     description=corpora.__doc__.split("\n\n")[0])
    parser.add_argument("corpus", choices=sorted(corpora.CORPORA))
    parser.add_argument("--out", type=Path, required=True,
                        help="folder to write into (plays already there are kept)")
    args = parser.parse_args(argv)
    check_writable_folder(args.out, "--out")
    written = corpora.CORPORA[args.corpus](args.out)
    documents = (len(list(written.glob("*.txt"))) if written.is_dir()
                 else len(written.read_text().splitlines()))
    print(f"{args.corpus}: {documents} documents in {written} (give it to data_prep/owt_to_mds.py "
          f"--source)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
