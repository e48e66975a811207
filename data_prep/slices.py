"""A corpus tokenized on many nodes: each task tokenizes one slice of the input files into its own
folder, and a merge writes the dataset that a one-task build writes, byte for byte.

    python data_prep/owt_to_mds.py --out OUT --source FILES... --slice I/N      (N tasks, anywhere)
    python data_prep/owt_to_mds.py --out OUT --source FILES... --merge-slices N (once all are done)

Slicing: the input files in their fixed order (the --source order, a folder's files sorted) are
cut into N runs of consecutive files of about equal size (a file goes to the slice in which its
middle byte falls). Slice I tokenizes its files (pass 1 of packing.py) into OUT/.slices/I-of-N/:
settings.json first, the chunks' token files and counts, slice.json last (the commit mark). An
interrupted slice is run again alone and resumes from its finished chunks.

The merge reads the slices' chunks in slice order, which is the document stream of the whole
input in order, and cuts it into samples and shards (pass 2): samples, shards and index.json are
those of a one-task build of the same input and settings, for any N, because samples are cut
from the concatenated stream and never at a slice's end. The manifest records the same settings
as a one-task build, so either takes the other's output as done. A slice built with other
settings or inputs is refused by the merge, by name. OUT/.slices is deleted once OUT is published.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from aogpt import UsageError
from aogpt.data_prep import packing, sources
from aogpt.files import write_text_atomic

FOLDER = ".slices"  # in OUT (an s3:// OUT: in its --staging folder, which every task must see)
FINISHED = "slice.json"
SETTINGS = "settings.json"


def parse_slice(text: str) -> tuple[int, int]:
    """--slice I/N: (I, N) with 0 <= I < N."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise UsageError(f"--slice {text}: give I/N with 0 <= I < N, e.g. --slice 0/8 for the "
                         f"first of 8 tasks ($SLURM_ARRAY_TASK_ID/8 in a SLURM array)")
    return int(match.group(1)), int(match.group(2))


def slice_folder(root: Path, index: int, count: int) -> Path:
    return Path(root) / FOLDER / f"{index}-of-{count}"


def slice_sources(inputs: list[sources.Source], index: int, count: int
                  ) -> list[sources.LocalFiles]:
    """The input files of slice `index` of `count`, in order, grouped by the --source they came
    from: files whose middle byte falls in the slice's share of the total bytes."""
    if any(not isinstance(source, sources.LocalFiles) for source in inputs):
        raise UsageError("--slice and --merge-slices take local files (--source FILES or "
                         "folders): download a hub dataset first (its parquet files), then "
                         "slice those")
    sizes = [file.stat().st_size for source in inputs for file in source.files]
    total, start, picked, position = max(sum(sizes), 1), 0, [], 0
    for source in inputs:
        mine = []
        for file in source.files:
            middle = start + sizes[position] / 2
            if min(int(middle * count / total), count - 1) == index:
                mine.append(file)
            start += sizes[position]
            position += 1
        if mine:
            picked.append(sources.LocalFiles(source.name, mine))
    return picked


def run_slice(root: Path, index: int, count: int, inputs: list[sources.Source], settings: dict,
              spec: packing.PackSpec, docs_per_chunk: int, encoding, workers: int) -> None:
    """Tokenizes slice `index` of `count` into its folder (resumed when its settings match);
    prints what it did."""
    settings = json.loads(json.dumps(settings))
    folder = slice_folder(root, index, count)
    what = f"slice {index} of {count}"
    if _saved(folder / FINISHED, "settings") == settings:
        print(f"{what} is finished already in {folder}: nothing to do")
        return
    if folder.exists() and _saved(folder / SETTINGS) != settings:
        print(f"starting over: {folder} was made with other settings or inputs", flush=True)
        shutil.rmtree(folder)
    elif folder.exists():
        print(f"resuming the interrupted {what} in {folder}", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / SETTINGS, json.dumps(settings, indent=1))
    mine = slice_sources(inputs, index, count)
    start = time.perf_counter()
    try:
        chunks = (chunk for source in mine for chunk in source.chunks(docs_per_chunk))
        metas, tokenized, _ = packing.tokenize(chunks, spec, folder / "chunks", encoding, workers)
    except UsageError:
        shutil.rmtree(folder, ignore_errors=True)  # bad input: the same again on a re-run
        raise
    write_text_atomic(folder / FINISHED, json.dumps({"settings": settings, "slice": [index, count],
                                                     "chunks": len(metas)}, indent=1))
    files = sum(len(source.files) for source in mine)
    documents = sum(meta[name]["documents"] for meta in metas for name in spec.splits)
    rate = tokenized / max(time.perf_counter() - start, 1e-9)
    print(f"{what} done: {files:,} files, {documents:,} documents -> {folder}; tokenized at "
          f"{rate / 1e6:.2f}M tokens/s ({workers} workers). When every slice is done: the same "
          f"command with --merge-slices {count} instead of --slice")


def finished_metas(root: Path, count: int, settings: dict) -> list[dict]:
    """The chunks of all `count` slices in order (each with its folder), once every slice is
    finished with these settings; a one-line UsageError naming the first that is not."""
    settings = json.loads(json.dumps(settings))
    metas = []
    for index in range(count):
        folder = slice_folder(root, index, count)
        finished = _saved(folder / FINISHED)
        if finished is None:
            state = "was never started" if not folder.exists() else "is not finished"
            raise UsageError(f"slice {index} of {count} {state} ({folder} has no {FINISHED}): "
                             f"run it with --slice {index}/{count} (alone; the finished slices "
                             f"are kept), then merge again")
        if finished.get("settings") != settings:
            raise UsageError(f"slice {index} of {count} in {folder} was built with other "
                             f"settings or inputs than this merge: run it again with this "
                             f"command's flags and --slice {index}/{count}, then merge again")
        chunks = folder / "chunks"
        metas += [{**json.loads((chunks / f"{chunk:08d}.json").read_text()), "dir": str(chunks)}
                  for chunk in range(finished["chunks"])]
    return metas


def remove(root: Path) -> None:
    """Deletes OUT/.slices (what the slices' tasks wrote), once the merge is published."""
    shutil.rmtree(Path(root) / FOLDER, ignore_errors=True)


def _saved(path: Path, key: str | None = None):
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved.get(key) if key and isinstance(saved, dict) else saved
