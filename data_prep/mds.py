"""MDS shards of fixed-size columns, written directly: byte for byte what MDSWriter writes.

Why not MDSWriter itself: importing streaming imports torch and transformers, about 4 s of CPU in
every process, which was most of the data-prep time of small and medium corpora (and data prep
needs no torch). Our samples also have fixed-size columns only, so a shard's samples are one
numpy buffer instead of a Python call per sample. The format (streaming's format/mds/README.md):
    shard      uint32 sample count | uint32 offsets[count + 1] | the writer's JSON config | samples
               (offsets are absolute byte positions; a sample of fixed-size columns is just their
               bytes, the columns in sorted name order)
    index.json {"version": 2, "shards": [shard config + samples, raw_data, zip_data, ...]}
               raw_data/zip_data = {"basename", "bytes", "hashes": {algorithm: hex digest}}
tests/data_prep/test_mds_shards.py checks shards and index against MDSWriter's. Compression (off by
default) goes through streaming's own codecs, and only then is streaming imported. read_rows maps a
shard's samples back as one such buffer, value_counts counts a column over a split with it (the
evaluator's unigram reference).

shard_problem() checks a shard file against its index entry (present, its size, its header, its
hashes): data_prep/verify.py checks whole datasets with it, the trainer checks sizes before a run.
"""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from aogpt.files import write_atomic, write_bytes_atomic, write_text_atomic

# Hashes of every shard file, in index.json (what MDSWriter(hashes=["xxh64"]) writes): checked by
# data_prep/verify.py, and by streaming when a reader asks (StreamingDataset(validate_hash=...)).
HASHES = ["xxh64"]

Bytes = bytes | bytearray | memoryview | np.ndarray  # what a shard's samples may be given as


def column_dtype(encoding: str) -> tuple[np.dtype, tuple[int, ...]]:
    """An MDS column encoding in numpy terms: "ndarray:uint16:1024" -> (uint16, (1024,)),
    "int32" -> (int32, ())."""
    if encoding.startswith("ndarray:"):
        _, dtype, shape = encoding.split(":")
        return np.dtype(dtype), tuple(int(size) for size in shape.split(","))
    return np.dtype(encoding), ()


def row_dtype(columns: dict[str, str]) -> np.dtype:
    """One sample as a packed numpy record, the columns in MDS's (sorted) order."""
    fields = []
    for name in sorted(columns):
        dtype, shape = column_dtype(columns[name])
        fields.append((name, dtype, shape) if shape else (name, dtype))
    return np.dtype(fields)


def shard_config(columns: dict[str, str], compression: str | None) -> dict:
    names = sorted(columns)
    sizes = [column_dtype(columns[name])[0].itemsize * int(np.prod(column_dtype(columns[name])[1]))
             for name in names]
    return {"column_encodings": [columns[name] for name in names], "column_names": names,
            "column_sizes": sizes, "compression": compression, "format": "mds", "hashes": HASHES,
            "size_limit": None, "version": 2}


def write_shard(folder: Path, number: int, columns: dict[str, str],
                samples: Bytes | Sequence[Bytes], compression: str | None = None) -> dict:
    """Writes shard.<number>.mds (atomically) from the samples' packed bytes, in one buffer or in
    several that follow each other (a shard's rows spread over the chunk files they are read
    from); returns its entry. An uncompressed shard is written and hashed part by part: it is
    never copied whole in memory (each 64 MiB copy costs its page faults too)."""
    parts = [samples] if isinstance(samples, Bytes) else list(samples)
    parts = [memoryview(part).cast("B") for part in parts]
    config = shard_config(columns, compression)
    header = json.dumps(config, sort_keys=True).encode()
    row_size = sum(config["column_sizes"])
    size = sum(part.nbytes for part in parts)
    count = size // row_size
    assert count * row_size == size, "samples must be whole rows"
    start = 4 + 4 * (count + 1) + len(header)
    offsets = start + row_size * np.arange(count + 1, dtype=np.int64)
    if offsets[-1] >= 2**32:
        raise ValueError(f"a shard must stay below 4 GiB (MDS offsets are uint32), "
                         f"not {offsets[-1]} bytes")
    head = np.uint32(count).tobytes() + offsets.astype(np.uint32).tobytes() + header
    raw_name = f"shard.{number:05d}.mds"
    if not compression:
        info = _write_parts(folder / raw_name, [memoryview(head), *parts])
        return {**config, "samples": count, "raw_data": info, "zip_data": None}
    from aogpt.data_prep.streaming_compat import streaming

    codecs = streaming.base.compression
    raw = b"".join([head, *parts])
    data = codecs.compress(compression, raw)
    name = f"{raw_name}.{codecs.get_compression_extension(compression)}"
    write_bytes_atomic(folder / name, data)
    return {**config, "samples": count, "raw_data": _file_info(raw_name, raw),
            "zip_data": _file_info(name, data)}


def _write_parts(path: Path, parts: list[memoryview]) -> dict:
    """Writes the parts one after the other (atomically) and hashes them on the way: the
    file's entry in the index."""
    digests = {name: new_hash(name) for name in HASHES}

    def write(partial: Path) -> None:
        with open(partial, "wb") as file:
            for part in parts:
                file.write(part)
                for digest in digests.values():
                    digest.update(part)

    write_atomic(path, write)
    return {"basename": path.name, "bytes": sum(part.nbytes for part in parts),
            "hashes": {name: digest.hexdigest() for name, digest in digests.items()}}


def write_index(folder: Path, entries: list[dict]) -> None:
    """folder/index.json listing the shards in order (written atomically)."""
    write_text_atomic(folder / "index.json", json.dumps({"version": 2, "shards": entries},
                                                        sort_keys=True))


def _file_info(basename: str, data: bytes) -> dict:
    return {"basename": basename, "bytes": len(data),
            "hashes": {name: new_hash(name, data).hexdigest() for name in HASHES}}


def new_hash(name: str, data: bytes = b""):
    """A hash object of any algorithm streaming accepts in an index (xxhash's, hashlib's)."""
    if name in xxhash.algorithms_available:
        return getattr(xxhash, name)(data)
    return hashlib.new(name, data)


def read_rows(folder: Path, entry: dict) -> np.ndarray:
    """A shard's samples as one numpy record array (row_dtype of its columns), mapped from the
    file rather than read sample by sample: streaming's reader costs a Python call chain per
    sample (~0.15 ms: 14 s for a 90,000-sample split). The raw file, or where only the
    compressed one is present, its bytes decompressed by streaming's codecs."""
    columns = dict(zip(entry["column_names"], entry["column_encodings"], strict=True))
    raw = Path(folder) / entry["raw_data"]["basename"]
    if raw.is_file():
        data = np.memmap(raw, dtype=np.uint8, mode="r")
    else:
        from aogpt.data_prep.streaming_compat import streaming

        packed = (Path(folder) / entry["zip_data"]["basename"]).read_bytes()
        data = np.frombuffer(streaming.base.compression.decompress(entry["compression"], packed),
                             dtype=np.uint8)
    count, first = (int(value) for value in data[:8].view(np.uint32))
    return np.frombuffer(data, dtype=row_dtype(columns), count=count, offset=first)


def value_counts(folder: Path, column: str, size: int, max_samples: int | None = None
                 ) -> np.ndarray:
    """How often each value 0..size-1 occurs in `column` over the folder's first `max_samples`
    samples (all by default), in the dataset's order, a shard at a time (read_rows): int64."""
    counts, left = np.zeros(size, dtype=np.int64), max_samples
    for entry in read_index(folder):
        rows = read_rows(folder, entry)[:left]
        counts += np.bincount(rows[column].ravel(), minlength=size)
        if left is not None:
            left -= len(rows)
            if left == 0:
                break
    return counts


# ---- checking shards against their index ---------------------------------------------------------

READ_CHUNK = 1 << 24


@dataclass(frozen=True)
class ShardProblem:
    path: Path | str  # the shard file (or index.json): a path, or an object's URL
    what: str  # what is wrong, e.g. "5,000 bytes, the index says 499,157 (truncated)"
    first_unreadable_sample: int | None = None  # within the shard, when the file is cut short


def read_index(folder: Path) -> list[dict]:
    """The shard entries of folder/index.json (OSError or ValueError if it cannot be read)."""
    index = json.loads((Path(folder) / "index.json").read_text())
    if not isinstance(index, dict) or not isinstance(index.get("shards"), list):
        raise ValueError("not an MDS index (no shard list)")
    return index["shards"]


def shard_problem(folder: Path, entry: dict, header: bool = True,
                  hashes: bool = True) -> ShardProblem | None:
    """What is wrong with a shard's files in `folder`, or None: present and of the size the index
    records (one stat per file), then with `header` the sample count and offsets at the start of
    the raw file, and with `hashes` the hashes the index records (reads every byte). A compressed
    shard is good when one of its files is present and every present one is good (a local reader
    decompresses next to the .zstd file)."""
    files = [(kind, entry[kind]) for kind in ("zip_data", "raw_data") if entry.get(kind)]
    present = [(kind, info) for kind, info in files if (Path(folder) / info["basename"]).is_file()]
    if not present:
        return ShardProblem(Path(folder) / files[0][1]["basename"], "missing")
    for kind, info in present:
        path = Path(folder) / info["basename"]
        problem = _file_problem(path, info, entry["samples"], kind == "raw_data", header)
        if problem is None and hashes:
            problem = _hash_problem(path, info)
        if problem is not None:
            return problem
    return None


def _file_problem(path: Path, info: dict, samples: int, raw: bool,
                  header: bool) -> ShardProblem | None:
    size = path.stat().st_size
    if size < info["bytes"]:
        first = first_unreadable_sample(path, samples) if raw else None
        lost = f": samples {first:,} to {samples - 1:,} are cut off" if first is not None else ""
        return ShardProblem(path, f"{size:,} bytes, the index says {info['bytes']:,} "
                                  f"(truncated{lost})", first)
    if size > info["bytes"]:
        return ShardProblem(path, f"{size:,} bytes, the index says {info['bytes']:,} (longer than "
                                  "written)")
    if not (raw and header):
        return None
    with open(path, "rb") as file:
        head = file.read(4 + 4 * (samples + 1))
    if len(head) < 4 + 4 * (samples + 1):
        return ShardProblem(path, "too short for its table of sample offsets")
    count = int(np.frombuffer(head[:4], np.uint32)[0])
    offsets = np.frombuffer(head[4:], np.uint32).astype(np.int64)
    if count != samples:
        return ShardProblem(path, f"its header counts {count:,} samples, the index {samples:,}")
    if np.any(np.diff(offsets) < 0) or offsets[0] < len(head) or offsets[-1] != size:
        return ShardProblem(path, "its table of sample offsets is damaged")
    return None


def first_unreadable_sample(path: Path, samples: int) -> int:
    """The first sample of a raw MDS shard that its file does not hold in full (`samples` when
    it holds them all)."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        table = file.read(4 + 4 * (samples + 1))[4:]
    offsets = np.frombuffer(table[: len(table) // 4 * 4], np.uint32).astype(np.int64)
    whole = offsets[1:] <= size  # sample i is whole when it ends (offsets[i + 1]) in the file
    return int(np.argmin(whole)) if not whole.all() else len(whole)


def _hash_problem(path: Path, info: dict) -> ShardProblem | None:
    recorded = info.get("hashes") or {}
    if not recorded:
        return None
    digests = {name: new_hash(name) for name in recorded}
    with open(path, "rb") as file:
        while chunk := file.read(READ_CHUNK):
            for digest in digests.values():
                digest.update(chunk)
    for name, expected in recorded.items():
        if digests[name].hexdigest() != expected:
            return ShardProblem(path, f"its {name} hash differs from the index's: its bytes are "
                                      "damaged")
    return None
