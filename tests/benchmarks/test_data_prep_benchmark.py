"""benchmarks/data_prep_throughput.py runs end to end (a smoke test on a tiny corpus), and refuses
sizes and counts that mean nothing."""

import re

import pytest
from conftest import run_cli

BENCHMARK = "benchmarks/data_prep_throughput.py"


def test_benchmark_prints_the_ratio():
    result = run_cli(BENCHMARK, "--megabytes", "1", "--repeats", "1", "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert "ratio owt_to_mds / best baseline" in result.stdout and "per core" in result.stdout
    paired = re.search(r"ratio within each repeat .*: median ([\d.]+) \(([\d.]+)\)",
                       result.stdout)
    assert paired and paired[1] == paired[2]  # one repeat: its own ratio is the median
    # every baseline the ratio takes the best of, encode_to_numpy (what the workers call) too
    for baseline in ("encode_ordinary_batch, 2 threads", "encode_ordinary, 2 processes",
                     "encode_to_numpy, 2 processes"):
        assert f"baseline tiktoken {baseline}" in result.stdout


@pytest.mark.parametrize("flag,value,message", [
    ("--megabytes", "0", "--megabytes must be a positive number, got 0"),
    ("--megabytes", "-1", "--megabytes must be a positive number, got -1"),
    ("--workers", "0", "--workers must be at least 1, got 0"),
    ("--repeats", "0", "--repeats must be at least 1, got 0"),
])
def test_a_size_or_count_that_means_nothing_is_one_line(flag, value, message):
    result = run_cli(BENCHMARK, flag, value)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: {message}"] and result.stdout == ""


def test_the_split_read_benchmark_counts_both_ways_and_prints_the_ratio():
    """A small split (several shards are tests/data_prep/test_mds_shards.py's): the command fails
    where the two ways count differently."""
    result = run_cli("benchmarks/split_read.py", "--samples", "2000", "--seq-len", "64",
                     "--repeats", "1")
    assert result.returncode == 0, result.stderr
    assert "split: 2,000 samples of 64 tokens, MDS shards: 1;" in result.stdout
    assert re.search(r"baseline streaming LocalDataset, a sample at a time +[\d,]+ samples/s",
                     result.stdout)
    assert re.search(r"ours mds.read_rows, a shard at a time +[\d,]+ samples/s", result.stdout)
    assert re.search(r"ratio ours / baseline: [\d,]+x", result.stdout)
