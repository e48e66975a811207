"""streaming_compat.py: opening datasets one after another holds no file descriptors."""

import os

import numpy as np

from aogpt.data_prep import mds
from aogpt.data_prep.streaming_compat import release_shared_memory, streaming

COLUMNS = {"tokens": "ndarray:uint16:8"}


def _open_file_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _dataset(folder):
    return streaming.StreamingDataset(local=str(folder), remote=None, shuffle=False,
                                      batch_size=1)


def test_datasets_opened_and_released_one_after_another_hold_no_file_descriptors(tmp_path):
    rows = np.zeros(4, dtype=mds.row_dtype(COLUMNS))
    mds.write_index(tmp_path, [mds.write_shard(tmp_path, 0, COLUMNS, rows.tobytes(), None)])
    # A live dataset: each new one attaches to its six shared-memory blocks to pick a free
    # prefix. Streaming alone keeps those attachments (and each new dataset's own blocks) open
    # until exit: 2 descriptors per block, 24 per dataset here, 480 over the loop.
    live = _dataset(tmp_path)
    before = _open_file_descriptors()
    for _ in range(20):
        dataset = _dataset(tmp_path)
        assert dataset[3]["tokens"].tolist() == [0] * 8
        release_shared_memory(dataset)
    assert _open_file_descriptors() == before
    release_shared_memory(live)
    assert _open_file_descriptors() < before  # the live one's blocks: found and closed too
