"""What the data-prep commands share at their edges: flags and --out checked before any work (a
build can take hours; a typo must not cost them), and the lines they end with, written to read
as well in a log file as on a terminal."""

from __future__ import annotations

from pathlib import Path

from aogpt import UsageError
from aogpt.data_prep.build_dir import OutputDir
from aogpt.data_prep.remote import check_url, is_remote, join
from aogpt.files import check_writable_folder


def check_out(out: str, staging: Path | None = None) -> None:
    """--out is, or can be made, a folder this process can write in (tried, so /proc, /sys and a
    read-only filesystem are found even by root); or a URL of a store the builders write to,
    whose --staging folder is such a folder. The bucket itself is checked when opened."""
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


def start_build(out: OutputDir, settings: dict, overwrite: bool, noun: str) -> bool:
    """Starts (or resumes) a local build in `out`; when `out` holds this build already, says so
    with its splits (what they hold of `noun`) and returns False: nothing to do."""
    if out.start(settings, overwrite):
        return True
    print(f"{out.root} is complete already: nothing to do (--overwrite rebuilds it)")
    print("\n".join(split_lines(out.root, out.finished_manifest(), noun)))
    return False


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
