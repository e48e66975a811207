"""A data folder as every floor recognises one: DIR/manifest.json marks a finished aogpt data folder
(written last by its builder; data_prep/manifest.py reads and writes it), an index.json an MDS
split. Here, on the ground floor, so that aogpt.files can name a dataset's file without loading
the data pipeline.
"""

from __future__ import annotations

from pathlib import Path

MANIFEST_FILE = "manifest.json"
MDS_INDEX = "index.json"  # every MDS split's (the streaming library's name)


def dataset_folder(path: str | Path) -> Path | None:
    """The data folder that `path` is or lies in (two levels at most: DIR/train/shard.00000.mds):
    one holding manifest.json, or an MDS split (index.json) without one; None outside any."""
    path = Path(path)
    candidates = [path, *list(path.parents)[:2]]
    for marker in (MANIFEST_FILE, MDS_INDEX):
        for folder in candidates:
            if (folder / marker).is_file():
                return folder
    return None


def describe_dataset_file(path: str | Path) -> str | None:
    """What `path` is in a data folder ("the manifest of dataset data/owt", "a file of dataset
    data/owt"); None outside one."""
    path = Path(path)
    folder = dataset_folder(path.parent)
    if folder is None:
        return None
    return f"{'the manifest' if path == folder / MANIFEST_FILE else 'a file'} of dataset {folder}"
