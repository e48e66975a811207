"""Check a data folder before a long run: every shard present, of the size, header and hashes its
index records, and the sample counts its manifest promises.

    python data_prep/verify.py DIR [DIR ...] [--sizes-only]

DIR is a folder made by data_prep/owt_to_mds.py (train/, val/, manifest.json) or by
data_prep/eval_to_mds.py. Every split is read in full to check the shards' hashes (xxh64, written
by the builders); a dataset built before shards carried hashes is checked for sizes, headers and
counts only ("no hashes recorded"). Exit status: 0 every split is good (one summary line each);
1 one line per damaged shard or index on stderr, saying what is wrong and how to fix it; 2 DIR is
not a finished data folder.
"""

import argparse
import hashlib
import sys
from pathlib import Path

from aogpt import cli_entry
from aogpt.data_prep import mds
from aogpt.data_prep.manifest import read_manifest
from aogpt.progress import progress

PROGRESS_FROM_BYTES = 512 << 20  # smaller splits are checked in moments: no progress bar


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python data_prep/verify.py",
        description="Check the shards of data folders made by data_prep/owt_to_mds.py or "
                    "eval_to_mds.py against their index and manifest.")
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="data folder")
    parser.add_argument("--sizes-only", action="store_true",
                        help="check files, sizes and counts without reading the shards")
    return parser.parse_args(argv)


def how_to_fix(folder: Path, manifest: dict) -> str:
    tool = (manifest.get("settings") or {}).get("tool", "owt_to_mds")
    return (f"re-copy it from where the dataset was built, or rebuild the dataset with "
            f"`python data_prep/{tool}.py --out {folder} --overwrite` and its original arguments")


def check_split(folder: Path, split: dict, contents: bool, name: str
                ) -> tuple[list[mds.ShardProblem], str]:
    """The problems of one split, and a summary line of what was checked."""
    split_dir = folder / split["path"]
    index = split_dir / "index.json"
    if not index.is_file():
        return [mds.ShardProblem(index, "missing")], f"{name}: no index"
    try:
        entries = mds.read_index(split_dir)
        total = sum(entry["raw_data"]["bytes"] for entry in entries)
        samples = sum(entry["samples"] for entry in entries)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [mds.ShardProblem(index, f"unreadable ({err})")], f"{name}: unreadable index"
    problems = []
    recorded = split.get("index_sha256")
    if recorded and hashlib.sha256(index.read_bytes()).hexdigest() != recorded:
        problems.append(mds.ShardProblem(index, "not the index the manifest recorded (its sha256 "
                                                "differs)"))
    if "samples" in split and samples != split["samples"]:
        problems.append(mds.ShardProblem(index, f"lists {samples:,} samples, the manifest "
                                                f"{split['samples']:,}"))
    if "shards" in split and len(entries) != split["shards"]:
        problems.append(mds.ShardProblem(index, f"lists {len(entries)} shards, the manifest "
                                                f"{split['shards']}"))
    hashed = sorted({name for entry in entries for kind in ("raw_data", "zip_data")
                     if entry.get(kind) for name in entry[kind].get("hashes") or {}})
    with progress(total=len(entries), unit="shard", desc=f"verify {name}",
                  disable=not contents or not hashed or total < PROGRESS_FROM_BYTES) as bar:
        for entry in entries:
            problem = mds.shard_problem(split_dir, entry, header=contents, hashes=contents)
            if problem is not None:
                problems.append(problem)
            bar.update(1)
    if not contents:
        checked = "files, sizes and counts checked (--sizes-only)"
    elif hashed:
        checked = f"sizes, headers and {', '.join(hashed)} hashes match"
    else:
        checked = "no hashes recorded: files, sizes, headers and counts checked"
    if problems:
        return problems, (f"{name}: DAMAGED, {len(problems)} problem{'s' * (len(problems) > 1)} "
                          f"in {len(entries):,} shard{'s' * (len(entries) != 1)}")
    return problems, (f"{name}: {samples:,} samples in {len(entries):,} "
                      f"shard{'s' * (len(entries) != 1)} ({total:,} bytes); {checked}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    damaged = 0
    for folder in args.dirs:
        manifest = read_manifest(folder)
        for name, split in manifest["splits"].items():
            problems, summary = check_split(folder, split, not args.sizes_only, name)
            for problem in problems:
                print(f"error: {problem.path}: {problem.what}: {how_to_fix(folder, manifest)}",
                      file=sys.stderr, flush=True)
            print(f"{folder}: {summary}", flush=True)
            damaged += len(problems)
    return 1 if damaged else 0


if __name__ == "__main__":
    sys.exit(main())
