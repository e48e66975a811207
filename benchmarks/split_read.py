"""Reading a whole training split in one process, as trainer/evaluate.py's --unigram-from does.

    python benchmarks/split_read.py [--samples 20000] [--seq-len 1024] [--repeats 3]

Writes a split of random GPT-2 ids in MDS shards of 64 MiB (data_prep/mds.py's writer, byte for
byte streaming's), then counts its token frequencies two ways, in this process and on the same
files:
  baseline  streaming's LocalDataset, a sample at a time (what the evaluator did before; streaming
            has no call that reads more than one sample), the samples then counted in one call
  ours      data_prep/mds.py's value_counts: read_rows maps each shard as one numpy record array
The counts must be equal (the command fails otherwise). It prints samples/s of each, best of
--repeats (other work on the machine only adds time), and the ratio ours / baseline.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from aogpt import check_counts, cli_entry
from aogpt.data_prep import mds
from aogpt.data_prep.manifest import COLUMN
from aogpt.data_prep.streaming_compat import streaming

VOCAB = 50257
SHARD_BYTES = 64 << 20


def write_split(folder: Path, samples: int, seq_len: int) -> None:
    columns = {COLUMN: f"ndarray:uint16:{seq_len}"}
    per_shard = max(1, SHARD_BYTES // (2 * seq_len))
    rng = np.random.default_rng(0)
    entries = []
    for number, first in enumerate(range(0, samples, per_shard)):
        rows = np.zeros(min(per_shard, samples - first), dtype=mds.row_dtype(columns))
        rows[COLUMN] = rng.integers(0, VOCAB, size=rows[COLUMN].shape)
        entries.append(mds.write_shard(folder, number, columns, rows.tobytes()))
    mds.write_index(folder, entries)


def counts_sample_by_sample(folder: Path) -> np.ndarray:
    """The baseline at its best: the samples gathered, then counted in one call (a count per
    sample adds a vocabulary-sized array each time, which the evaluator did too)."""
    split = streaming.LocalDataset(str(folder))
    tokens = np.concatenate([split[i][COLUMN] for i in range(len(split))])
    return np.bincount(tokens, minlength=VOCAB)


def counts_shard_by_shard(folder: Path) -> np.ndarray:
    """What trainer/evaluation.py's unigram_reference calls."""
    return mds.value_counts(folder, COLUMN, VOCAB)


def best_seconds(count, folder: Path, repeats: int) -> tuple[float, np.ndarray]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        counts = count(folder)
        times.append(time.perf_counter() - start)
    return min(times), counts


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000, help="samples (default 20,000)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens each (default 1024)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    args = parser.parse_args(argv)
    check_counts(args, "samples", "seq_len", "repeats")
    with tempfile.TemporaryDirectory(prefix="aogpt-bench-") as tmp:
        folder = Path(tmp)
        write_split(folder, args.samples, args.seq_len)
        print(f"split: {args.samples:,} samples of {args.seq_len} tokens, MDS shards: "
              f"{len(mds.read_index(folder))}; best of {args.repeats}")
        baseline, theirs = best_seconds(counts_sample_by_sample, folder, args.repeats)
        ours, counts = best_seconds(counts_shard_by_shard, folder, args.repeats)
    if not np.array_equal(counts, theirs):
        print("error: the two ways counted different tokens", file=sys.stderr)
        return 1
    for name, seconds in (("baseline streaming LocalDataset, a sample at a time", baseline),
                          ("ours mds.read_rows, a shard at a time", ours)):
        print(f"{name:52s} {args.samples / seconds:14,.0f} samples/s ({seconds:.3f} s)")
    print(f"ratio ours / baseline: {baseline / ours:,.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
