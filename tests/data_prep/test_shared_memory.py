"""data_prep/shared_memory/: streaming's shared memory on a host shared by several runs. Real
processes open real streaming datasets; one is killed with SIGKILL, as a lost run is."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from mds_testing import REPO

from aogpt.data_prep import mds
from aogpt.data_prep.shared_memory import host_lock, remove_dead_blocks, streaming_blocks

COLUMNS = {"tokens": "ndarray:uint16:8"}

# Opens the dataset in argv[1] once the file argv[2] exists (all readers start at that moment),
# reads a sample, says its prefix, then on each line of stdin reads a whole new epoch (which
# goes through the dataset's shared memory by name again).
READER = """
import os, sys, time
from aogpt.data_prep.streaming_compat import streaming
folder, start = sys.argv[1:3]
while not os.path.exists(start):
    time.sleep(0.001)
datasets = [streaming.StreamingDataset(local=folder, shuffle=False, batch_size=1)
            for _ in range(int(sys.argv[3]))]
for dataset in datasets:
    next(iter(dataset))
print(" ".join(f"{dataset._shm_prefix_int:06}" for dataset in datasets), flush=True)
for line in sys.stdin:
    print(sum(len(sample["tokens"]) for sample in datasets[0]), flush=True)
"""


def tiny_dataset(folder: Path) -> Path:
    rows = np.zeros(4, dtype=mds.row_dtype(COLUMNS))
    mds.write_index(folder, [mds.write_shard(folder, 0, COLUMNS, rows.tobytes(), None)])
    return folder


def start_readers(folder: Path, start: Path, count: int,
                  datasets: int = 1) -> list[subprocess.Popen]:
    """Each in a process group of its own, which a kill ends whole (its resource tracker, which
    would unlink its blocks, too), as a lost run ends."""
    return [subprocess.Popen([sys.executable, "-c", READER, str(folder), str(start), str(datasets)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
                             start_new_session=True)
            for _ in range(count)]


def prefixes_of(reader: subprocess.Popen) -> list[str]:
    line = reader.stdout.readline()
    assert line, f"the reader failed (status {reader.wait()})"
    return line.split()


def listed(output: str, what: str) -> set[str]:
    """The prefixes that the shared-memory command's line lists after `what` (none: empty)."""
    found = re.search(rf"{what} \(([\d, ]+)\)", output)
    return set(found[1].split(", ")) if found else set()


def read_an_epoch(reader: subprocess.Popen) -> int:
    reader.stdin.write("\n")
    reader.stdin.flush()
    return int(reader.stdout.readline())


def test_readers_started_at_once_get_their_own_blocks_and_only_a_killed_ones_go(tmp_path):
    """Three readers open two datasets each at the same moment; one is killed, and the sweep
    that removes dead runs' blocks removes its blocks alone, while the others read on; the
    command that runs the sweep says so. Streaming alone lets two datasets opened at once take
    the same prefix (FileExistsError: '/000001_locals', mosaicml/streaming#884): 1 of 3 tries of
    6 such readers failed so."""
    folder, start = tiny_dataset(tmp_path / "data"), tmp_path / "start"
    readers = start_readers(folder, start, 3, datasets=2)
    try:
        start.touch()
        prefixes = [prefixes_of(reader) for reader in readers]
        assert len({prefix for pair in prefixes for prefix in pair}) == 6, prefixes
        killed = readers.pop()
        dead, live = prefixes.pop(), [prefix for pair in prefixes for prefix in pair]
        # The host's lock from the kill to the sweep, as the command holds it around its sweep:
        # a run beside this test that opens a dataset (a pytest-xdist worker) sweeps under the
        # same lock, so it cannot remove the killed reader's blocks first.
        with host_lock():
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait()
            assert set(dead) <= set(streaming_blocks())  # a killed process leaves its blocks
            line = remove_dead_blocks().describe()  # what the command prints
        removed, in_use = (listed(line, what)
                           for what in ("whose processes are gone", "in use alone"))
        assert set(dead) <= removed and set(live) <= in_use, line
        assert not set(dead) & set(streaming_blocks())
        result = subprocess.run([sys.executable, "-m", "aogpt.data_prep.shared_memory"],
                                capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr
        assert set(live) <= listed(result.stdout, "in use alone"), result.stdout
        for prefix in live:
            assert {path.name for path in streaming_blocks()[prefix]} == {
                f"{prefix}_{name}" for name in ("locals", "barrier", "next_epoch", "cache_usage",
                                                "shard_states", "shard_access_times")}
        assert [read_an_epoch(reader) for reader in readers] == [4 * 8] * 2  # their memory is whole
    finally:
        for reader in readers:
            os.killpg(reader.pid, signal.SIGKILL)
            reader.wait()
        with host_lock():
            remove_dead_blocks()  # what this test's readers left


def test_the_block_names_are_the_installed_streamings():
    """shared_memory writes out streaming's list of a dataset's blocks (it imports no streaming):
    a streaming that names another block would leave it behind."""
    from aogpt.data_prep.shared_memory import BLOCK_NAMES
    from aogpt.data_prep.streaming_compat import streaming

    assert BLOCK_NAMES == tuple(streaming.base.constant.SHM_TO_CLEAN)
