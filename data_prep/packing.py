"""Documents -> GPT-2 tokens -> fixed-length MDS samples, in parallel, alike for any worker count.

Two passes, each spread over the worker processes:
1. tokenize: each chunk of documents (cut by the sources, never by the number of workers) is
   tokenized by one worker, EOS after every document, and each document goes to a split by a
   hash of its text. The worker writes work/chunks/<i>.<split>.u16 and then <i>.json with the
   counts; the json is the commit mark, so a re-run after a crash skips the chunks that have one.
2. write: prefix sums of the chunks' token counts give every sample its place in its split's
   token stream, so shard p (samples [p*P, (p+1)*P)) can be written by any worker from the few
   chunk files it overlaps (mds.py; its index entry, saved in work/shards/, is the commit mark).
   The split's index.json then lists the shards in order.

The concatenation of a split's samples is therefore its document stream token for token; only the
final tail shorter than seq_len is dropped (and counted). Memory stays bounded: at most two chunks
per worker are in flight, and a shard is written from the chunk files' pages, mapped in place
(a 64 MiB shard took 0.36 s copied through new arrays, 0.04 s from the mapped pages).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken

from aogpt import UsageError
from aogpt.data_prep import mds
from aogpt.data_prep.detokenizers import DETOKENIZERS
from aogpt.data_prep.manifest import COLUMN
from aogpt.data_prep.sources import Chunk
from aogpt.data_prep.tokenizer import EOS, load_gpt2
from aogpt.files import write_atomic, write_bytes_atomic
from aogpt.progress import progress

SHARD_BYTES = 1 << 26  # 64 MiB of tokens per shard: streaming's default shard size
COUNTS = ("documents", "tokens", "group_dropped_tokens", "replaced_bytes", "replaced_documents")
_EOS = np.array([EOS], dtype=np.uint32)


def available_cores() -> int:
    """The cores this process may run on (a SLURM allocation's, not the whole node's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_samples_per_shard(seq_len: int) -> int:
    return max(1, SHARD_BYTES // (2 * seq_len))


def mds_columns(seq_len: int) -> dict[str, str]:
    return {COLUMN: f"ndarray:uint16:{seq_len}"}


def write_rows(folder: Path, rows: np.ndarray) -> dict:
    """Samples made whole rather than packed from documents (a synthetic language's sequences,
    Sudoku grids): (count, seq_len) token ids -> MDS shards and index.json in folder. Returns the
    split's manifest counts, one document per sample."""
    count, seq_len = rows.shape
    rows = rows.astype(np.uint16)
    per_shard = default_samples_per_shard(seq_len)
    folder.mkdir(parents=True, exist_ok=True)
    entries = [mds.write_shard(folder, number, mds_columns(seq_len),
                               rows[first:first + per_shard].tobytes())
               for number, first in enumerate(range(0, count, per_shard))]
    mds.write_index(folder, entries)
    return {"documents": count, "tokens": count * seq_len, "samples": count,
            "shards": len(entries), "replaced_bytes": 0, "replaced_documents": 0}


@dataclass(frozen=True)
class PackSpec:
    """What to build: everything here (not the worker count) determines the output bytes."""
    seq_len: int
    splits: tuple[str, ...] = ("train", "val")
    val_fraction: float = 0.0  # with two splits: the share of documents that go to the second
    detokenizer: str | None = None  # a key of detokenizers.DETOKENIZERS
    group_size: int | None = None  # reference packing: drop each group's remainder (SEDD protocol)
    samples_per_shard: int = 32768
    compression: str | None = None

    @property
    def splits_by_hash(self) -> bool:
        return len(self.splits) == 2 and self.val_fraction > 0

    @staticmethod
    def position(text: str) -> float:
        """A document's place in [0, 1), fixed by its text alone: below val_fraction it goes to
        the second split, so the split never changes between runs."""
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64


@dataclass
class BuildResult:
    splits: dict[str, dict]  # per split: the counts for the manifest
    tokenized: int  # tokens tokenized by this run (a resumed run skips finished chunks)
    seconds: float
    # (position, tokens): a val_fraction above position gives the second split these tokens, its
    # first sample (None: one split, or no such position)
    val_threshold: tuple[float, int] | None = None


def load_encoding(tokenizer_file: str | os.PathLike | None) -> tiktoken.Encoding:
    """GPT-2's encoding (tokenizer.load_gpt2), refused at once if its ids do not fit the shards."""
    encoding = load_gpt2(tokenizer_file)
    check_fits_uint16(encoding)
    return encoding


def check_fits_uint16(encoding: tiktoken.Encoding) -> None:
    if encoding.max_token_value >= 2**16:
        raise UsageError(f"tokenizer {encoding.name} has token ids up to "
                         f"{encoding.max_token_value}, which do not fit the uint16 shards: use a "
                         f"vocabulary of at most 65536")


# ---- pass 1: tokenize a chunk (runs in a worker) -------------------------------------------------

_encoding: tiktoken.Encoding | None = None


def _encode(text: str) -> np.ndarray:
    try:
        return _encoding.encode_to_numpy(text, disallowed_special=())  # = encode_ordinary, no list
    except UnicodeEncodeError:  # lone surrogates (JSON "\ud800" escapes): replaced, like tiktoken
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return _encoding.encode_to_numpy(text, disallowed_special=())


def tokenize_chunk(index: int, chunk: Chunk, spec: PackSpec, chunk_dir: str) -> dict:
    """Tokenizes a chunk into <chunk_dir>/<index>.<split>.u16; returns (and saves) its counts."""
    detokenize = DETOKENIZERS[spec.detokenizer] if spec.detokenizer else None
    pieces: list[list[np.ndarray]] = [[] for _ in spec.splits]  # [ids, EOS, ids, EOS, ...]
    counts = [dict.fromkeys(COUNTS, 0) for _ in spec.splits]
    placed: list[list] = []  # [position, tokens] per document: lists, as JSON reads them back
    for text, replaced in chunk.documents():
        ids = _encode(detokenize(text) if detokenize else text)
        split = 0
        if spec.splits_by_hash:
            position = spec.position(text)
            split = int(position < spec.val_fraction)
            placed.append([position, len(ids) + 1])
        pieces[split] += (ids, _EOS)
        count = counts[split]
        count["documents"] += 1
        count["tokens"] += len(ids) + 1
        count["replaced_bytes"] += replaced
        count["replaced_documents"] += int(replaced > 0)
    meta = {"index": index}
    if spec.splits_by_hash:
        meta["lowest"] = lowest_placed(placed, spec.seq_len)
    for split, name in enumerate(spec.splits):
        tokens = _join(pieces[split], spec, counts[split])
        write_atomic(Path(chunk_dir) / f"{index:08d}.{name}.u16", tokens.tofile)
        meta[name] = counts[split]
    write_bytes_atomic(Path(chunk_dir) / f"{index:08d}.json", json.dumps(meta).encode())
    return meta


def lowest_placed(placed: list[list], seq_len: int) -> list[list]:
    """A chunk's documents of lowest position, up to the first whose tokens add up to one sample:
    the only ones of the chunk that val_threshold can need (those before any later one of the
    chunk make a sample already)."""
    lowest, tokens = [], 0
    for position, count in sorted(placed):
        if tokens >= seq_len:
            break
        lowest.append([position, count])
        tokens += count
    return lowest


def val_threshold(metas: list[dict], seq_len: int) -> tuple[float, int] | None:
    """The position at which the documents in position order first add up to one sample, and
    their tokens: any val_fraction above it gives the second split a sample. None when they never
    do (or the work files are an earlier version's, without "lowest")."""
    tokens = 0
    for position, count in sorted(item for meta in metas for item in meta.get("lowest", [])):
        tokens += count
        if tokens >= seq_len:
            return position, tokens
    return None


def _join(pieces: list[np.ndarray], spec: PackSpec, counts: dict) -> np.ndarray:
    """The chunk's token stream of one split; reference packing cuts each group to whole samples."""
    if spec.group_size:
        step = 2 * spec.group_size  # two pieces per document
        groups = [np.concatenate(pieces[i:i + step]) for i in range(0, len(pieces), step)]
        counts["group_dropped_tokens"] = sum(len(group) % spec.seq_len for group in groups)
        pieces = [group[:len(group) - len(group) % spec.seq_len] for group in groups]
    if not pieces:
        return np.empty(0, dtype=np.uint16)
    return np.concatenate(pieces, dtype=np.uint16, casting="unsafe")  # ids < 2**16: checked


# ---- pass 2: write one shard (runs in a worker) --------------------------------------------------

@dataclass(frozen=True)
class ShardTask:
    split_dir: str
    number: int  # shard.<number>.mds
    samples: int
    reads: tuple[tuple[str, int, int], ...]  # (chunk file, first token, token count), in order
    entry: str  # where its index entry is saved: the commit mark a resumed run looks for
    seq_len: int
    compression: str | None


def write_shard(task: ShardTask) -> int:
    parts = [_mapped_tokens(path, first, count) for path, first, count in task.reads]
    assert sum(part.nbytes for part in parts) == 2 * task.samples * task.seq_len
    entry = mds.write_shard(Path(task.split_dir), task.number, mds_columns(task.seq_len), parts,
                            task.compression)
    write_bytes_atomic(Path(task.entry), json.dumps(entry).encode())
    return task.samples


def _mapped_tokens(path: str, first: int, count: int) -> memoryview:
    """Tokens [first, first + count) of a chunk file as its pages in the page cache, mapped rather
    than read into new memory; the mapping closes with the last view of it."""
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return memoryview(mapped)[2 * first:2 * (first + count)]


def plan_shards(chunk_files: list[str], chunk_tokens: list[int], spec: PackSpec, split_dir: Path,
                entry_dir: Path) -> list[ShardTask]:
    """Cuts a split's token stream (the chunk files in order) into shards of samples_per_shard."""
    starts = np.cumsum([0, *chunk_tokens])  # where each chunk begins in the split's token stream
    total_samples = int(starts[-1]) // spec.seq_len
    tasks = []
    for number, first_sample in enumerate(range(0, total_samples, spec.samples_per_shard)):
        samples = min(spec.samples_per_shard, total_samples - first_sample)
        position, end = first_sample * spec.seq_len, (first_sample + samples) * spec.seq_len
        chunk = int(np.searchsorted(starts, position, side="right")) - 1
        reads = []
        while position < end:
            take = min(end, int(starts[chunk + 1])) - position
            if take > 0:
                reads.append((chunk_files[chunk], position - int(starts[chunk]), take))
            position += take
            chunk += 1
        entry = str(entry_dir / f"{number:05d}.json")
        tasks.append(ShardTask(str(split_dir), number, samples, tuple(reads), entry, spec.seq_len,
                               spec.compression))
    return tasks


# ---- the two passes, driven from the main process ------------------------------------------------

def build(chunks: Iterable[Chunk], spec: PackSpec, work_dir: Path, split_dirs: dict[str, Path],
          encoding: tiktoken.Encoding, workers: int,
          total_documents: int | None = None) -> BuildResult:
    """Tokenizes `chunks`, writes each split's MDS into split_dirs[split]; resumes finished work."""
    check_fits_uint16(encoding)
    with _worker_pool(workers, encoding) as pool:
        metas, tokenized, seconds = _tokenize_all(pool, chunks, spec, work_dir / "chunks",
                                                  workers, total_documents)
        return _write_all(pool, metas, spec, work_dir, split_dirs, tokenized, seconds)


def tokenize(chunks: Iterable[Chunk], spec: PackSpec, chunk_dir: Path,
             encoding: tiktoken.Encoding, workers: int) -> tuple[list[dict], int, float]:
    """Pass 1 alone (one slice of a corpus tokenized on many nodes, data_prep/slices.py): the
    chunks' counts in order (each with "dir", its folder), the tokens tokenized by this run, and
    its seconds."""
    check_fits_uint16(encoding)
    with _worker_pool(workers, encoding) as pool:
        return _tokenize_all(pool, chunks, spec, chunk_dir, workers, None)


def write(metas: list[dict], spec: PackSpec, work_dir: Path, split_dirs: dict[str, Path],
          encoding: tiktoken.Encoding, workers: int) -> BuildResult:
    """Pass 2 alone, over the chunks of `metas` in order, wherever their folders are (the slices
    of a corpus, merged): the same shards as build() makes of the same documents."""
    with _worker_pool(workers, encoding) as pool:
        return _write_all(pool, metas, spec, work_dir, split_dirs, 0, 0.0)


def _write_all(pool, metas: list[dict], spec: PackSpec, work_dir: Path,
               split_dirs: dict[str, Path], tokenized: int, seconds: float) -> BuildResult:
    if spec.group_size:
        assert all(meta[name]["documents"] % spec.group_size == 0
                   for meta in metas[:-1] for name in spec.splits), "chunks of whole groups"
    splits = {name: _write_split(pool, name, metas, spec, work_dir, split_dirs[name])
              for name in spec.splits}
    threshold = val_threshold(metas, spec.seq_len) if spec.splits_by_hash else None
    return BuildResult(splits, tokenized, seconds, threshold)


def _tokenize_all(pool, chunks: Iterable[Chunk], spec: PackSpec, chunk_dir: Path, workers: int,
                  total_documents: int | None) -> tuple[list[dict], int, float]:
    chunk_dir.mkdir(parents=True, exist_ok=True)
    metas: dict[int, dict] = {}
    tokenized, start = 0, time.perf_counter()
    bar = progress(total=total_documents, unit="doc", desc="tokenize")

    def record(meta: dict, fresh: bool) -> None:
        nonlocal tokenized
        metas[meta["index"]] = {**meta, "dir": str(chunk_dir)}
        bar.update(sum(meta[name]["documents"] for name in spec.splits))
        if fresh:
            tokenized += sum(meta[name]["tokens"] for name in spec.splits)
            rate = tokenized / (time.perf_counter() - start)
            bar.set_postfix({"tokens/s": f"{rate / 1e6:.2f}M"})

    in_flight: set[Future] = set()
    with bar:
        for index, chunk in enumerate(chunks):
            done = chunk_dir / f"{index:08d}.json"
            if done.is_file():  # finished by an interrupted run
                record(json.loads(done.read_text()), fresh=False)
                continue
            in_flight.add(pool.submit(tokenize_chunk, index, chunk, spec, str(chunk_dir)))
            if len(in_flight) >= 2 * workers:  # bounded: the reader never runs far ahead
                finished, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
                    record(future.result(), fresh=True)
        for future in as_completed(in_flight):
            record(future.result(), fresh=True)
    return ([metas[index] for index in range(len(metas))], tokenized,
            time.perf_counter() - start)


def _write_split(pool, name: str, metas: list[dict], spec: PackSpec, work_dir: Path,
                 split_dir: Path) -> dict:
    counts = {key: sum(meta[name][key] for meta in metas) for key in COUNTS}
    files = [str(Path(meta["dir"]) / f"{meta['index']:08d}.{name}.u16") for meta in metas]
    lengths = [meta[name]["tokens"] - meta[name]["group_dropped_tokens"] for meta in metas]
    entry_dir = work_dir / "shards" / name
    entry_dir.mkdir(parents=True, exist_ok=True)
    split_dir.mkdir(parents=True, exist_ok=True)
    tasks = plan_shards(files, lengths, spec, split_dir, entry_dir)
    todo = [task for task in tasks if not Path(task.entry).is_file()]
    samples = sum(task.samples for task in tasks)
    with progress(total=samples, initial=samples - sum(task.samples for task in todo),
                  unit="sample", desc=f"write {name}") as bar:
        for future in as_completed([pool.submit(write_shard, task) for task in todo]):
            bar.update(future.result())
    mds.write_index(split_dir, [json.loads(Path(task.entry).read_text()) for task in tasks])
    return {
        **counts,
        "samples": samples,
        "dropped_tail_tokens": sum(lengths) - samples * spec.seq_len,
        "shards": len(tasks),
        "index_sha256": hashlib.sha256((split_dir / "index.json").read_bytes()).hexdigest(),
    }


# ---- workers -----------------------------------------------------------------------------------

class _InProcess:
    """workers=1: the tasks run right here (no process start-up, plain tracebacks)."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as err:  # handed to the caller through the future, as a pool would
            future.set_exception(err)
        return future


def _init_worker(encoding: tiktoken.Encoding, parent_pid: int) -> None:
    global _encoding
    _encoding = encoding
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    # A worker whose main process was killed (SIGKILL, OOM) would wait on its queue forever.
    while os.getppid() == parent_pid:
        time.sleep(1)
    os._exit(1)


def start_method() -> str:
    """How the workers start: fork where it is safe, spawn elsewhere. A forked worker has the
    main process's modules and encoding at once; a spawned one imports them and rebuilds the
    encoding first (~0.4 s of both cores, 3% of tokenizing 200 MB on 2). Fork is safe only while
    this process runs no other Python thread, which could hold a lock the copy would wait on
    forever (tqdm's monitor and a hub dataset's readers start later, or are there already: spawn
    then; numpy's BLAS threads are fork-aware), and only on Linux (macOS's system libraries are
    not fork-safe)."""
    return "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"


@contextlib.contextmanager
def _worker_pool(workers: int, encoding: tiktoken.Encoding) -> Iterator:
    global _encoding
    if workers == 1:
        _encoding = encoding
        yield _InProcess()
        return
    method = start_method()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_init_worker, initargs=(encoding, os.getpid()))
    try:
        if method == "fork":  # all of them now, while this process has no other thread
            pool.submit(int).result()
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
