"""Check a data folder before a long run: every shard present, of the size, header and hashes its
index records, and the sample counts its manifest promises.

    python data_prep/verify.py DIR [DIR ...] [--sizes-only]

DIR is a folder made by data_prep/owt_to_mds.py (train/, val/, manifest.json) or by
data_prep/eval_to_mds.py, or such a dataset in a bucket (s3://BUCKET/PREFIX). Every split is read
in full to check the shards' hashes (xxh64, written by the builders); a dataset built before
shards carried hashes is checked for sizes, headers and counts only ("no hashes recorded"). A
bucket's shards are downloaded one at a time into a temporary folder, checked there and deleted;
--sizes-only checks them by listing the bucket, without downloading any. Exit status: 0 every
split is good (one summary line each); 1 one line per damaged shard or index on stderr, saying
what is wrong and how to fix it; 2 DIR is not a finished data folder.
"""

import argparse
import contextlib
import dataclasses
import hashlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from aogpt import cli_entry
from aogpt.data_prep import mds, remote
from aogpt.data_prep.manifest import read_manifest, rebuild_command
from aogpt.progress import progress

PROGRESS_FROM_BYTES = 512 << 20  # smaller splits are checked in moments: no progress bar


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python data_prep/verify.py",
        description="Check the shards of data folders made by data_prep/owt_to_mds.py or "
                    "eval_to_mds.py against their index and manifest.")
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="data folder, or s3://BUCKET/PREFIX")
    parser.add_argument("--sizes-only", action="store_true",
                        help="check files, sizes and counts without reading the shards")
    return parser.parse_args(argv)


def how_to_fix(folder: str, manifest: dict) -> str:
    return (f"re-copy it from where the dataset was built, or rebuild the dataset with "
            f"{rebuild_command(folder, manifest)} and its original arguments")


def check_split(split_dir: Path, split: dict, contents: bool, name: str,
                fetch: Callable[[dict], contextlib.AbstractContextManager] | None = None
                ) -> tuple[list[mds.ShardProblem], str]:
    """The problems of one split in split_dir, and a summary line of what was checked. `fetch`
    (a remote split) brings each shard's files into split_dir while the shard is checked."""
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
            with fetch(entry) if fetch else contextlib.nullcontext():
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


def check_remote_split(url: str, manifest: dict, contents: bool, name: str
                       ) -> tuple[list[mds.ShardProblem], str]:
    """check_split on a bucket's split: its index.json and each shard in turn downloaded into a
    temporary folder (the problems name the objects' URLs); with --sizes-only, the listing's
    sizes instead."""
    split = manifest["splits"][name]
    store = remote.S3Prefix(url, "DIR")
    if not contents:
        problems = remote.shard_size_problems(url, manifest, "DIR", [name])
        summary = (f"{name}: {split['samples']:,} samples in {split['shards']:,} shards; "
                   f"objects and sizes checked by listing the bucket (--sizes-only)")
        return problems, (f"{name}: DAMAGED, {len(problems)} problems" if problems else summary)
    folder = "" if split["path"] == "." else split["path"]
    present = store.files(folder)

    @contextlib.contextmanager
    def fetch(entry: dict):
        names = [entry[kind]["basename"] for kind in ("raw_data", "zip_data") if entry.get(kind)]
        try:
            for basename in names:
                if remote.join(folder, basename) in present:
                    store.download(remote.join(folder, basename), split_dir / basename)
            yield
        finally:
            for basename in names:
                (split_dir / basename).unlink(missing_ok=True)

    with tempfile.TemporaryDirectory(prefix="aogpt-verify-") as tmp:
        split_dir = Path(tmp)
        if remote.join(folder, "index.json") in present:
            store.download(remote.join(folder, "index.json"), split_dir / "index.json")
        problems, summary = check_split(split_dir, split, contents, name, fetch)
        located = [dataclasses.replace(problem, path=remote.join(
            url, folder, Path(problem.path).name)) for problem in problems]
    return located, summary


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for folder in args.dirs:
        if remote.is_remote(folder):
            remote.check_url(folder, "DIR", writing=True)
    damaged = 0
    for folder in args.dirs:
        where = folder.rstrip("/")
        manifest = (remote.remote_manifest(where, "DIR") if remote.is_remote(folder)
                    else read_manifest(folder))
        for name, split in manifest["splits"].items():
            if remote.is_remote(folder):
                problems, summary = check_remote_split(where, manifest, not args.sizes_only, name)
            else:
                problems, summary = check_split(Path(folder) / split["path"], split,
                                                not args.sizes_only, name)
            for problem in problems:
                print(f"error: {problem.path}: {problem.what}: {how_to_fix(where, manifest)}",
                      file=sys.stderr, flush=True)
            print(f"{where}: {summary}", flush=True)
            damaged += len(problems)
    return 1 if damaged else 0


if __name__ == "__main__":
    sys.exit(main())
