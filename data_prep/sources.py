"""Where documents come from: local corpora or the Hugging Face hub, cut into chunks of work.

A source yields chunks: picklable payloads of at most `docs_per_chunk` documents (or one
OpenWebText subset archive) that a worker process turns into text with `.documents()`. The main
process only reads bytes, lines and parquet batches; decoding, JSON parsing and decompressing
OpenWebText's .xz subsets happen in the workers, so reading keeps up with many tokenizing cores.
How the stream is cut into chunks depends on the input alone, never on the number of workers.

Local formats (a file, or a folder searched recursively in sorted path order):
  .txt                    one document per file
  .jsonl, .jsonl.gz       one JSON object per line, the document in its "text" field
  .parquet                the document in column "text"
  .xz                     an OpenWebText subset: an xz-compressed tar of .txt documents
  .tar .tar.gz .tgz .tar.xz .txz
                          an archive of .xz subsets and/or .txt documents (OpenWebText's
                          urlsf_subsetNN.tar, or its openwebtext.tar.xz)
Bytes that are not UTF-8 are replaced by U+FFFD and counted, never fatal.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import mmap
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from aogpt import UsageError

OPENWEBTEXT = "Skylion007/openwebtext"
# datasets >= 4 no longer runs loading scripts (OpenWebText's is one); the hub's parquet export
# of the same data loads everywhere.
PARQUET_REVISION = "refs/convert/parquet"
TEXT_FIELD = "text"

_KINDS = {".txt": "txt", ".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".parquet": "parquet",
          ".xz": "xz", ".tar": "tar", ".tar.gz": "tar", ".tgz": "tar", ".tar.xz": "tar",
          ".txz": "tar"}
SUPPORTED = ", ".join(_KINDS)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # how surrogateescape spells an undecodable byte

Document = tuple[str, int]  # (text, number of bytes that were not UTF-8)


def decode_utf8(data: bytes) -> Document:
    """The text, with each byte that is not UTF-8 replaced by U+FFFD, and how many there were."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        return _ESCAPED_BYTE.subn("\ufffd", data.decode("utf-8", errors="surrogateescape"))


# ---- chunks: what a worker receives --------------------------------------------------------------

@dataclass
class Decoded:
    """Documents that are text already (the hub, parquet, line-based eval files)."""
    docs: list[Document]

    def documents(self) -> list[Document]:
        return self.docs


@dataclass
class TextFiles:
    """The bytes of .txt files, one document each."""
    blobs: list[bytes]

    def documents(self) -> list[Document]:
        return [decode_utf8(blob) for blob in self.blobs]


@dataclass
class JsonLines:
    """Lines of a .jsonl.gz file with their 1-based line numbers (for error messages)."""
    path: str
    lines: list[tuple[int, bytes]]

    def documents(self) -> list[Document]:
        return [_json_document(self.path, number, line) for number, line in self.lines]


@dataclass
class JsonRange:
    """Lines of a .jsonl file as a byte range of it, read by the worker that parses them: the
    main process only finds where each chunk starts, and sends no text to the workers. The range
    starts at line `first_line` (1-based, for error messages)."""
    path: str
    start: int
    end: int
    first_line: int

    def documents(self) -> list[Document]:
        with open(self.path, "rb") as file:
            file.seek(self.start)
            data = file.read(self.end - self.start)
        # Each line parsed as a view of the range, not split into copies first (0.5% of the CPU)
        view, documents, position, number = memoryview(data), [], 0, self.first_line
        while position < len(data):
            end = data.find(b"\n", position)
            end = len(data) if end < 0 else end
            if not _blank(data, position, end):
                documents.append(_json_document(self.path, number, view[position:end]))
            position, number = end + 1, number + 1
        return documents


def _json_document(path: str, number: int, line: bytes | memoryview) -> Document:
    try:
        record, replaced = _parse_json(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path} line {number} is not valid JSON ({err.msg}): fix or delete "
                         f"that line") from None
    if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
        raise UsageError(f"{path} line {number} has no string field {TEXT_FIELD!r}: each line "
                         f"must be like {{\"text\": \"...\"}}")
    return record[TEXT_FIELD], replaced


def _parse_json(line: bytes | memoryview) -> tuple[object, int]:
    try:  # orjson parses ~10x faster than json: JSON parsing was ~5% of data prep's CPU
        return orjson.loads(line), 0
    except orjson.JSONDecodeError:  # strictly UTF-8 and no lone surrogates: json's rules then
        line = bytes(line)
    try:
        return json.loads(line), 0  # json decodes UTF-8 bytes itself
    except UnicodeDecodeError:  # not UTF-8: replace and count the bad bytes
        text, replaced = decode_utf8(line)
        return json.loads(text), replaced


@dataclass
class XzSubset:
    """One OpenWebText subset archive (an xz-compressed tar of .txt documents), still compressed."""
    name: str
    data: bytes

    def documents(self) -> list[Document]:
        try:
            with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:xz") as archive:
                return [decode_utf8(archive.extractfile(member).read())
                        for member in archive.getmembers()
                        if member.isfile() and member.name.endswith(".txt")]
        except (tarfile.TarError, lzma.LZMAError, EOFError) as err:
            raise UsageError(f"{self.name} is not an OpenWebText subset (an xz-compressed tar of "
                             f".txt files): {err}") from None


Chunk = Decoded | TextFiles | JsonLines | JsonRange | XzSubset


# ---- local files -------------------------------------------------------------------------------

def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(_KINDS, key=len, reverse=True):  # ".tar.xz" is an archive, ".xz" a subset
        if name.endswith(suffix):
            return _KINDS[suffix]
    return None


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


@dataclass
class LocalFiles:
    """Files named on the command line; a folder stands for its supported files, sorted by path."""
    name: str
    files: list[Path]

    @classmethod
    def find(cls, path: Path) -> LocalFiles:
        if path.is_file():
            if file_kind(path) is None:
                raise UsageError(f"{path}: unsupported file type (supported: {SUPPORTED})")
            return cls(str(path), [path])
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
        for file in files:
            if file_kind(file) is None:
                raise UsageError(f"{file}: unsupported file type in source folder {path} "
                                 f"(supported: {SUPPORTED}): move it out or name the files to use")
        if not files:
            raise UsageError(f"source folder {path} holds no files (supported: {SUPPORTED})")
        return cls(str(path), files)

    def describe(self) -> str:
        size = sum(file.stat().st_size for file in self.files)
        return f"{self.name} ({len(self.files)} files, {size / 1e6:.1f} MB)"

    def fingerprint(self) -> list:
        """Changes when any input file does: an interrupted build is never resumed on new data."""
        return [[str(file.resolve()), file.stat().st_size, file.stat().st_mtime_ns]
                for file in self.files]

    def chunks(self, docs_per_chunk: int) -> Iterator[Chunk]:
        return _batch_text_files(self._items(docs_per_chunk), docs_per_chunk)

    def _items(self, docs_per_chunk: int) -> Iterator[bytes | Chunk]:
        """Chunks, and the bytes of single .txt documents (batched by _batch_text_files)."""
        for file in self.files:
            kind = file_kind(file)
            if kind == "txt":
                yield file.read_bytes()
            elif kind == "jsonl":
                yield from jsonl_chunks(file, docs_per_chunk)
            elif kind == "parquet":
                yield from parquet_chunks(file, docs_per_chunk)
            elif kind == "xz":
                yield XzSubset(str(file), file.read_bytes())
            else:
                yield from _archive_items(file)


def _batch_text_files(items: Iterator[bytes | Chunk], docs_per_chunk: int) -> Iterator[Chunk]:
    """Consecutive .txt documents share TextFiles chunks; other chunks pass through in order."""
    pending: list[bytes] = []
    for item in items:
        if isinstance(item, bytes):
            pending.append(item)
            if len(pending) == docs_per_chunk:
                yield TextFiles(pending)
                pending = []
        else:
            if pending:
                yield TextFiles(pending)
                pending = []
            yield item
    if pending:
        yield TextFiles(pending)


def jsonl_chunks(path: Path, docs_per_chunk: int) -> Iterator[JsonLines | JsonRange]:
    """Chunks of docs_per_chunk non-blank lines: byte ranges of a .jsonl file, the lines
    themselves of a .jsonl.gz."""
    if not path.name.lower().endswith(".gz"):
        yield from _jsonl_ranges(path, docs_per_chunk)
        return
    lines: list[tuple[int, bytes]] = []
    with gzip.open(path, "rb") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            lines.append((number, line))
            if len(lines) == docs_per_chunk:
                yield JsonLines(str(path), lines)
                lines = []
    if lines:
        yield JsonLines(str(path), lines)


_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def _blank(data: bytes | mmap.mmap, start: int, end: int) -> bool:
    """Whether data[start:end] is whitespace only (a JSON line starts with "{" almost always: its
    first byte tells, without a copy)."""
    return start == end or (data[start] in _WHITESPACE and not data[start:end].strip())


def _jsonl_ranges(path: Path, docs_per_chunk: int) -> Iterator[JsonRange]:
    """The byte ranges of docs_per_chunk non-blank lines each (the chunks jsonl_chunks made of
    the lines themselves, so a build resumes on the same chunks): one memchr per line."""
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        position, number, count, first, start = 0, 1, 0, 1, 0
        while position < size:
            end = data.find(b"\n", position)
            end = size if end < 0 else end + 1
            if not _blank(data, position, end):
                if count == 0:
                    start, first = position, number
                count += 1
                if count == docs_per_chunk:
                    yield JsonRange(str(path), start, end, first)
                    count = 0
            position, number = end, number + 1
        if count:
            yield JsonRange(str(path), start, size, first)


def parquet_chunks(path: Path, docs_per_chunk: int, column: str = TEXT_FIELD) -> Iterator[Decoded]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if column not in parquet.schema_arrow.names:
        raise UsageError(f"{path} has no column {column!r} (columns: "
                         f"{', '.join(parquet.schema_arrow.names)})")
    first_row = 0
    for batch in parquet.iter_batches(batch_size=docs_per_chunk, columns=[column]):
        texts = batch.column(0).to_pylist()
        yield Decoded([_as_document(text, f"{path} row {first_row + i}")
                       for i, text in enumerate(texts)])
        first_row += len(texts)


def _as_document(value: str | bytes | None, where: str) -> Document:
    if isinstance(value, str):
        return value, 0
    if isinstance(value, bytes):
        return decode_utf8(value)
    raise UsageError(f"{where} has no text (it is {value!r})")


def _archive_items(path: Path) -> Iterator[bytes | XzSubset]:
    """The .txt documents (bytes) and .xz subsets of a tar archive, in archive order."""
    try:
        with tarfile.open(path, mode="r|*") as archive:  # streamed: the archive may be huge
            for member in archive:
                name = Path(member.name).name
                if not member.isfile() or name.startswith("."):
                    continue
                kind = file_kind(Path(name))
                if kind not in ("txt", "xz"):
                    raise UsageError(f"{path} holds {member.name}, neither an .xz subset nor a "
                                     f".txt document: extract the archive and pass its files")
                data = archive.extractfile(member).read()
                yield XzSubset(f"{path}:{member.name}", data) if kind == "xz" else data
    except (tarfile.TarError, lzma.LZMAError, EOFError, gzip.BadGzipFile) as err:
        raise UsageError(f"{path} is not a readable tar archive: {err}") from None


# ---- the Hugging Face hub ----------------------------------------------------------------------

@dataclass
class HubDataset:
    """A dataset on the Hugging Face hub, streamed (OpenWebText's 8M documents never sit in RAM)."""
    repo_id: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None
    text_field: str = TEXT_FIELD

    def describe(self) -> str:
        parts = [f"hf:{self.repo_id}", f"config={self.config}" if self.config else "",
                 f"split={self.split}", f"revision={self.revision}" if self.revision else ""]
        return " ".join(part for part in parts if part)

    def fingerprint(self) -> str:
        return self.describe()

    def chunks(self, docs_per_chunk: int) -> Iterator[Decoded]:
        dataset = load_hub_dataset(self.repo_id, self.config, self.split, self.revision)
        for batch in dataset.iter(batch_size=docs_per_chunk):
            if self.text_field not in batch:
                raise UsageError(f"{self.describe()} has no field {self.text_field!r} (fields: "
                                 f"{', '.join(batch)})")
            yield Decoded([_as_document(text, f"a row of {self.describe()}")
                           for text in batch[self.text_field]])


def load_hub_dataset(repo_id: str, config: str | None, split: str, revision: str | None):
    """datasets.load_dataset, streaming; a script-based dataset falls back to its parquet export."""
    import datasets  # slow to import: only hub sources pay for it

    def load(rev: str | None):
        return datasets.load_dataset(repo_id, config, split=split, revision=rev, streaming=True)

    try:
        try:
            return load(revision)
        except RuntimeError as err:
            if revision is not None or "scripts are no longer supported" not in str(err):
                raise
            return load(PARQUET_REVISION)
    except Exception as err:  # the hub's errors are many (network, not found, bad split)
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UsageError(f"could not load {repo_id} (split {split}) from the Hugging Face hub "
                         f"({type(err).__name__}: {reason}): check the id, split and network, "
                         f"or pass local files with --source") from None


Source = LocalFiles | HubDataset


def resolve(spec: str, hub_split: str = "train", hub_config: str | None = None,
            hub_revision: str | None = None) -> Source:
    """A --source argument: an existing path, else a hub dataset id (Skylion007/openwebtext)."""
    path = Path(spec).expanduser()
    if path.exists():
        return LocalFiles.find(path)
    if _HUB_ID.fullmatch(spec) and file_kind(path) is None:
        if hub_revision is None and spec == OPENWEBTEXT:
            hub_revision = PARQUET_REVISION
        return HubDataset(spec, hub_config, hub_split, hub_revision)
    raise UsageError(f"source {spec} does not exist: check the path (or give a Hugging Face "
                     f"dataset id like {OPENWEBTEXT})")
