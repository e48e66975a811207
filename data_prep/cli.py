"""What the data-prep commands share at their edges: flags and --out checked before any work (a
build can take hours; a typo must not cost them), and the lines they end with, written to read
as well in a log file as on a terminal."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from aogpt import UsageError
from aogpt.data_prep.build_dir import OutputDir
from aogpt.data_prep.remote import RemoteOutput, check_url, is_remote, join
from aogpt.files import URL_LIKE, check_writable_folder


def builder_parser(prog: str, doc: str, noun: str) -> argparse.ArgumentParser:
    """A builder's parser whose help is its module's docstring (the first paragraph, then the rest
    as written), with the output flags every builder takes (the built data called `noun`)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(parser, noun)
    return parser


def add_output_flags(parser: argparse.ArgumentParser, noun: str = "dataset") -> None:
    """--out, --staging and --overwrite, as every builder takes them."""
    add = parser.add_argument
    add("--out", required=True,
        help="output folder, or s3://BUCKET/PREFIX (built in --staging, then uploaded)")
    add("--staging", type=Path, default=None,
        help=f"with an s3:// --out: a new or empty local folder the {noun} is built in before "
             f"the upload, then deleted (default: one per URL under $TMPDIR); on a disk that "
             f"outlives the job, an interrupted run resumes its build too")
    add("--overwrite", action="store_true",
        help="rebuild OUT even when it is complete (only a dataset that this command built)")


def check_out(out: str, staging: Path | None = None) -> None:
    """--out is, or can be made, a folder this process can write in (tried, so /proc, /sys and a
    read-only filesystem are found even by root); or a URL of a store the builders write to,
    whose --staging folder is such a folder. The bucket itself is checked when opened."""
    for flag, path in (("--out", out), ("--staging", staging)):
        if path is not None and not is_remote(path) and URL_LIKE.match(str(path)):
            raise UsageError(f"{flag} {path} is neither a URL (write s3://BUCKET/PREFIX, with two "
                             f"slashes) nor a folder name this command makes (it begins with a "
                             f"scheme): give a URL or a local folder")
    if staging is not None and is_remote(staging):
        raise UsageError(f"--staging {staging}: the staging folder is a local folder, where the "
                         f"build happens before the upload to --out")
    if is_remote(out):
        check_url(out, "--out", writing=True)
        if staging is not None:
            check_writable_folder(staging, f"--staging {staging}")
        return
    if staging is not None:
        raise UsageError(f"--staging is for an s3:// --out; --out {out} is a local folder, "
                         f"where the build happens itself")
    try:
        check_writable_folder(out, f"--out {out}")
    except UsageError as err:
        raise UsageError(f"{err}: choose another --out") from None


def build_output(out: OutputDir | RemoteOutput, location: str, settings: dict, overwrite: bool,
                 noun: str, make: Callable[[], dict]) -> dict | None:
    """A builder's life at its --out (a folder, or a bucket through its staging folder): started
    or resumed; make() builds into out.out and returns the manifest, unless the staging folder
    holds the finished build already (an upload was interrupted); published (uploaded). Returns
    the manifest; None when `location` holds this build already, which is said with its splits
    (what they hold of `noun`). Bad input in make() (a UsageError) leaves nothing behind."""
    if not out.start(settings, overwrite):
        print(f"{location} is complete already: nothing to do (--overwrite rebuilds it)")
        print("\n".join(split_lines(location, out.finished_manifest(), noun)))
        return None
    if out.built:
        return out.publish(None)
    try:
        manifest = make()
    except UsageError:
        out.discard()  # a re-run would fail the same way
        raise
    return out.publish(manifest)


def replaced_bytes_note(splits: dict[str, dict]) -> str | None:
    """The note on bytes that were not UTF-8 (replaced by U+FFFD, never fatal), if there were."""
    replaced = sum(split["replaced_bytes"] for split in splits.values())
    if not replaced:
        return None
    documents = sum(split["replaced_documents"] for split in splits.values())
    return (f"note: {replaced:,} bytes in {documents:,} documents were not UTF-8 and became "
            f"U+FFFD")


def split_lines(folder: Path, manifest: dict, noun: str = "documents") -> list[str]:
    """One line per split of a data folder: its samples, what they were made of, where they are."""
    return [f"  {name}: {split['samples']:,} samples of {manifest['seq_len']} tokens from "
            f"{split['documents']:,} {noun} ({split['tokens']:,} tokens) in "
            f"{join(str(folder), split['path'])}" for name, split in manifest["splits"].items()]
