"""streaming_compat.py: opening datasets one after another holds no file descriptors."""

import os
import subprocess
import sys

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


def test_streaming_starts_without_transformers_and_its_loader_still_takes_their_batches():
    """Importing streaming here leaves transformers out (7 s of every command's start-up), and
    the loader's batch-size check still accepts transformers' batches, which a later import
    loads for real."""
    script = """
import sys
from aogpt.data_prep.streaming_compat import streaming
print(sorted(name for name in sys.modules if name.split(".")[0] == "transformers"))
from transformers.tokenization_utils_base import BatchEncoding
batch = BatchEncoding({"input_ids": [[1, 2, 3], [4, 5, 6]]})
print(type(batch).__module__, streaming.StreamingDataLoader._get_batch_size(None, batch))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "transformers.tokenization_utils_base 2"]
