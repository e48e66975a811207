"""data_prep/mds.py writes what streaming's MDSWriter writes, byte for byte."""

import json

import numpy as np
import pytest
from mds_testing import (
    read_column,
    read_samples,
)

from aogpt.data_prep import mds
from aogpt.data_prep.streaming_compat import streaming

COLUMNS = {"tokens": "ndarray:uint16:16", "length": "int32", "last_word_start": "int32"}


def _rows(count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = np.zeros(count, dtype=mds.row_dtype(COLUMNS))
    rows["tokens"] = rng.integers(0, 50257, size=(count, 16))
    rows["length"] = rng.integers(1, 17, size=count)
    rows["last_word_start"] = rng.integers(0, 16, size=count)
    return rows


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_shards_and_index_equal_mdswriters(tmp_path, compression):
    rows = _rows(37)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    entries = [
        mds.write_shard(ours, number, COLUMNS, rows[first : first + 16].tobytes(), compression)
        for number, first in enumerate(range(0, len(rows), 16))
    ]
    mds.write_index(ours, entries)
    for first in range(
        0, len(rows), 16
    ):  # one MDSWriter per shard: ours cuts shards by sample count
        folder = theirs / f"{first // 16}"
        with streaming.MDSWriter(
            out=str(folder),
            columns=COLUMNS,
            compression=compression,
            hashes=mds.HASHES,
            size_limit=None,
        ) as writer:
            for row in rows[first : first + 16]:
                writer.write({name: row[name] for name in COLUMNS})
    for number in range(len(entries)):
        name = entries[number]["zip_data" if compression else "raw_data"]["basename"]
        their_shard = next((theirs / str(number)).glob("shard.00000.mds*"))
        assert (ours / name).read_bytes() == their_shard.read_bytes()
        their_entry = json.loads((theirs / str(number) / "index.json").read_text())["shards"][0]
        for info in ("raw_data", "zip_data"):
            if their_entry[info]:
                their_entry[info]["basename"] = their_entry[info]["basename"].replace(
                    "00000", f"{number:05d}"
                )
        assert entries[number] == their_entry


def test_streaming_reads_every_column_back(tmp_path):
    rows = _rows(20)
    mds.write_index(tmp_path, [mds.write_shard(tmp_path, 0, COLUMNS, rows.tobytes())])
    np.testing.assert_array_equal(read_samples(tmp_path), rows["tokens"])
    assert read_column(tmp_path, "length") == rows["length"].tolist()
    assert read_column(tmp_path, "last_word_start") == rows["last_word_start"].tolist()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_read_rows_gives_each_shard_mdswriter_wrote_as_one_array(tmp_path, compression):
    """Shards of streaming's own writer (several, cut by its size limit), read a shard at a time;
    a compressed one is decompressed in memory, nothing written beside it."""
    rows = _rows(300)
    with streaming.MDSWriter(out=str(tmp_path), columns=COLUMNS, compression=compression,
                             hashes=mds.HASHES, size_limit=4096) as writer:
        for row in rows:
            writer.write({name: row[name] for name in COLUMNS})
    files = sorted(path.name for path in tmp_path.iterdir())
    entries = mds.read_index(tmp_path)
    assert len(entries) > 1
    read = np.concatenate([mds.read_rows(tmp_path, entry) for entry in entries])
    assert read.dtype == rows.dtype and read.tobytes() == rows.tobytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == files
