"""Data-prep throughput: owt_to_mds.py end to end against plain tiktoken on the same text and cores.

    python benchmarks/data_prep_throughput.py [--megabytes 200] [--workers N] [--repeats 3]

Writes a JSONL corpus of real text (../shared/data's WikiText-2 and PTB cut into ~5 KB documents,
OpenWebText's average, repeated to the requested size; generated sentences where it is absent)
and measures, in one run and on the same cores:
  baseline  tiktoken over the same documents held in memory: N threads
            (encode_ordinary_batch), and N processes (a warm pool) calling encode_ordinary or
            encode_to_numpy (what owt_to_mds.py's workers call); the fastest one counts
  ours      `python data_prep/owt_to_mds.py --source corpus.jsonl --workers N` wall time: start-up,
            reading, tokenizing, packing, shard writing and index merging included
It prints tokens/s, tokens/s per core and the ratio ours / baseline (the goal is >= 0.95:
tokenizing is the limit, packing and writing shards must be nearly free), best of --repeats, and
the median of the ratios taken within each repeat (the steadier number where the machine's speed
drifts between repeats).
It also prints tokens per CPU-second, which stays comparable when other jobs load the machine
(wall-clock rates then swing from run to run); for ours it includes start-up of all processes.
"""

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from aogpt import UsageError, check_counts, cli_entry
from aogpt.data_prep.packing import available_cores
from aogpt.data_prep.tokenizer import load_gpt2

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

DOCUMENT_CHARS = 5000  # OpenWebText's documents average about 5 KB


def real_text() -> tuple[str, str]:
    files = [SHARED_DATA / "wikitext-2" / "valid.txt", SHARED_DATA / "ptb" / "valid.txt"]
    if all(path.is_file() for path in files):
        return "".join(path.read_text() for path in files), f"real text from {SHARED_DATA}"
    rng = random.Random(0)
    words = "the of and to in a is that for it as was with be by on not he this are or his".split()
    sentences = (" ".join(rng.choices(words, k=rng.randint(4, 25))).capitalize() + ".\n"
                 for _ in range(20_000))
    return "".join(sentences), "generated sentences (../shared/data is absent)"


def documents(text: str, megabytes: float) -> list[str]:
    """~5 KB documents cut at line ends, repeated until they add up to `megabytes`."""
    base, current = [], ""
    for line in re.split(r"(?<=\n)", text):
        current += line
        if len(current) >= DOCUMENT_CHARS:
            base.append(current)
            current = ""
    copies = max(1, round(megabytes * 1e6 / sum(map(len, base))))
    return base * copies


class Rate:
    """Tokens per second of wall time, and per CPU-second (robust to load from elsewhere): the
    best of the repeats, and each repeat's own (`walls`)."""

    def __init__(self) -> None:
        self.walls: list[float] = []
        self.cpu = 0.0

    @property
    def wall(self) -> float:
        return max(self.walls, default=0.0)

    def record(self, tokens: int, wall_seconds: float, cpu_seconds: float) -> None:
        self.walls.append(tokens / wall_seconds)
        self.cpu = max(self.cpu, tokens / cpu_seconds)


def paired_ratios(ours: Rate, baselines: tuple[Rate, ...]) -> list[float]:
    """Each repeat's ratio of ours to the fastest baseline of the same repeat: the runs of one
    repeat follow each other within a minute, so a machine whose speed drifts (this project's
    moves by up to a third within an hour) moves both sides of a ratio alike, where the best of
    each side may come from different hours."""
    return [wall / max(rate.walls[repeat] for rate in baselines)
            for repeat, wall in enumerate(ours.walls)]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for children and their workers
    return usage.ru_utime + usage.ru_stime


def baseline_threads(docs: list[str], workers: int, rate: Rate) -> None:
    encoding = load_gpt2()
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = sum(map(len, encoding.encode_ordinary_batch(docs, num_threads=workers)))
    rate.record(tokens, time.perf_counter() - wall, time.process_time() - cpu)


_encoding = None


def _load() -> None:
    global _encoding
    _encoding = load_gpt2()


def _count(docs: list[str], call: str = "encode_ordinary") -> tuple[int, float]:
    cpu = time.process_time()
    encode = getattr(_encoding, call)
    return sum(len(encode(text)) for text in docs), time.process_time() - cpu


def baseline_processes(docs: list[str], workers: int, rate: Rate,
                       call: str = "encode_ordinary") -> None:
    """A warm pool of processes calling `call` (encode_ordinary, or encode_to_numpy: the ids in
    a numpy buffer, no Python list, as owt_to_mds.py's workers encode)."""
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_load) as pool:
        list(pool.map(_count, [docs[:1]] * workers))  # start every worker before the clock
        batches = [docs[i:i + 256] for i in range(0, len(docs), 256)]
        wall, cpu = time.perf_counter(), time.process_time()
        results = list(pool.map(_count, batches, [call] * len(batches)))
        wall = time.perf_counter() - wall
    tokens = sum(count for count, _ in results)
    rate.record(tokens, wall, time.process_time() - cpu + sum(seconds for _, seconds in results))


def ours(corpus: Path, out: Path, workers: int, rate: Rate, tokenize_pass: Rate) -> None:
    """owt_to_mds.py end to end (a fresh process into a new folder, as users run it), and its
    tokenize pass alone."""
    command = [sys.executable, str(REPO / "data_prep" / "owt_to_mds.py"), "--source", str(corpus),
               "--out", str(out), "--workers", str(workers)]
    wall, cpu = time.perf_counter(), _children_cpu()
    result = subprocess.run(command, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if result.returncode:
        sys.exit(f"owt_to_mds.py failed:\n{result.stderr[-2000:]}")
    splits = json.loads((out / "manifest.json").read_text())["splits"].values()
    tokens = sum(split["tokens"] - split["documents"] for split in splits)  # EOS not counted
    rate.record(tokens, wall, cpu)
    reported = float(re.search(r"tokenized at ([\d.]+)M tokens/s", result.stdout).group(1)) * 1e6
    tokenize_pass.record(tokens, tokens / reported, float("inf"))
    shutil.rmtree(out)  # after the clock: the next run builds afresh too


def per_chunk_work(docs: list[str]) -> float:
    """CPU of a worker's whole per-chunk work (read its byte range, parse, hash for the split,
    encode, pack, write the chunk file) over plain encode_ordinary of the same documents, in this
    one process, interleaved: what data prep adds per token, without start-up and shards."""
    from aogpt.data_prep import packing, sources

    encoding = load_gpt2()
    packing._encoding = encoding  # what a worker holds
    corpus = Path(tempfile.mkdtemp(prefix="aogpt-bench-")) / "part.jsonl"
    corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    chunks = list(sources.jsonl_chunks(corpus, 1000))
    spec = packing.PackSpec(seq_len=1024, val_fraction=0.0005)
    ratios = []
    for _ in range(3):
        cpu = time.process_time()
        for text in docs:
            encoding.encode_ordinary(text)
        plain = time.process_time() - cpu
        with tempfile.TemporaryDirectory() as tmp:
            cpu = time.process_time()
            for index, chunk in enumerate(chunks):
                packing.tokenize_chunk(index, chunk, spec, tmp)
            ratios.append((time.process_time() - cpu) / plain)
    corpus.unlink()
    corpus.parent.rmdir()
    return min(ratios)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=200, help="corpus size (default 200)")
    parser.add_argument("--workers", type=int, default=available_cores(),
                        help="workers and threads (default: all available cores)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs (default 3)")
    args = parser.parse_args(argv)
    if not 0 < args.megabytes < math.inf:
        raise UsageError(f"--megabytes must be a positive number, got {args.megabytes:g}")
    check_counts(args, "workers", "repeats")
    return args


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text, origin = real_text()
    docs = documents(text, args.megabytes)
    threads, processes, numpy_out, end_to_end, tokenize_pass = (Rate() for _ in range(5))
    with tempfile.TemporaryDirectory(prefix="aogpt-bench-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
        print(f"corpus: {corpus.stat().st_size / 1e6:.0f} MB JSONL, {len(docs):,} documents, "
              f"{origin}; {args.workers} workers/threads on {os.cpu_count()} cores, "
              f"best of {args.repeats}")
        for _ in range(args.repeats):  # interleaved, so that load from elsewhere hits all alike
            baseline_threads(docs, args.workers, threads)
            baseline_processes(docs, args.workers, processes)
            baseline_processes(docs, args.workers, numpy_out, "encode_to_numpy")
            ours(corpus, Path(tmp) / "out", args.workers, end_to_end, tokenize_pass)
        chunk_cost = per_chunk_work(docs[:len(docs) // 10 or 1])
    n = args.workers
    for name, rate in ((f"baseline tiktoken encode_ordinary_batch, {n} threads", threads),
                       (f"baseline tiktoken encode_ordinary, {n} processes", processes),
                       (f"baseline tiktoken encode_to_numpy, {n} processes", numpy_out),
                       (f"owt_to_mds.py end to end, {n} workers", end_to_end)):
        print(f"{name:50s} {rate.wall / 1e6:6.2f}M tokens/s = {rate.wall / n / 1e6:.2f}M/s "
              f"per core; {rate.cpu / 1e6:.2f}M tokens per CPU-second")
    baselines = (threads, processes, numpy_out)
    best = max(baselines, key=lambda rate: rate.wall)
    print(f"{'  of which its tokenize pass':50s} {tokenize_pass.wall / 1e6:6.2f}M tokens/s")
    print(f"ratio owt_to_mds / best baseline: {end_to_end.wall / best.wall:.2f} in wall time "
          f"(goal >= 0.95), {end_to_end.cpu / max(rate.cpu for rate in baselines):.2f} in tokens "
          f"per CPU-second")
    ratios = paired_ratios(end_to_end, baselines)
    print(f"ratio within each repeat (ours / that repeat's fastest baseline): median "
          f"{statistics.median(ratios):.2f} ({', '.join(f'{ratio:.2f}' for ratio in ratios)})")
    print(f"per-chunk work of a worker / plain encode_ordinary, CPU in one process (a tenth of "
          f"the corpus, best of 3): {chunk_cost:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
