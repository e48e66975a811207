"""MDS shards of fixed-size columns, written directly: byte for byte what MDSWriter writes.

Why not MDSWriter itself: importing streaming imports torch and transformers, about 4 s of CPU in
every process, which was most of the data-prep time of small and medium corpora (and data prep
needs no torch). Our samples also have fixed-size columns only, so a shard's samples are one
numpy buffer instead of a Python call per sample. The format (streaming's format/mds/README.md):
    shard      uint32 sample count | uint32 offsets[count + 1] | the writer's JSON config | samples
               (offsets are absolute byte positions; a sample of fixed-size columns is just their
               bytes, the columns in sorted name order)
    index.json {"version": 2, "shards": [shard config + samples, raw_data, zip_data, ...]}
tests/data_prep/test_mds_shards.py checks shards and index against MDSWriter's. Compression (off by
default) goes through streaming's own codecs, and only then is streaming imported.
"""

import json
import os
from pathlib import Path

import numpy as np
import xxhash

HASHES = ["xxh3_64"]  # per shard file, in index.json: readers may verify them (validate_hash)
_HASH_FUNCTIONS = {"xxh3_64": xxhash.xxh3_64}


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


def write_shard(folder: Path, number: int, columns: dict[str, str], samples: bytes,
                compression: str | None = None) -> dict:
    """Writes shard.<number>.mds (atomically) from the samples' packed bytes; returns its entry."""
    config = shard_config(columns, compression)
    header = json.dumps(config, sort_keys=True).encode()
    row_size = sum(config["column_sizes"])
    count = len(samples) // row_size
    assert count * row_size == len(samples), "samples must be whole rows"
    start = 4 + 4 * (count + 1) + len(header)
    offsets = start + row_size * np.arange(count + 1, dtype=np.int64)
    if offsets[-1] >= 2**32:
        raise ValueError(f"a shard must stay below 4 GiB (MDS offsets are uint32), "
                         f"not {offsets[-1]} bytes")
    raw = np.uint32(count).tobytes() + offsets.astype(np.uint32).tobytes() + header + samples
    raw_name = f"shard.{number:05d}.mds"
    entry = {**config, "samples": count, "raw_data": _file_info(raw_name, raw), "zip_data": None}
    data, name = raw, raw_name
    if compression:
        from aogpt.data_prep.streaming_compat import streaming

        codecs = streaming.base.compression
        data = codecs.compress(compression, raw)
        name = f"{raw_name}.{codecs.get_compression_extension(compression)}"
        entry["zip_data"] = _file_info(name, data)
    partial = folder / (name + ".tmp")
    partial.write_bytes(data)
    os.replace(partial, folder / name)
    return entry


def write_index(folder: Path, entries: list[dict]) -> None:
    """folder/index.json listing the shards in order (written atomically)."""
    partial = folder / "index.json.tmp"
    with open(partial, "w") as out:
        json.dump({"version": 2, "shards": entries}, out, sort_keys=True)
    os.replace(partial, folder / "index.json")


def _file_info(basename: str, data: bytes) -> dict:
    return {"basename": basename, "bytes": len(data),
            "hashes": {name: _HASH_FUNCTIONS[name](data).hexdigest() for name in HASHES}}
