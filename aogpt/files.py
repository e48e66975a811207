"""Files and folders that are complete or absent, who may replace them, and the commit that wrote
them: every writer goes through here.

A file is written under a temporary name in its own folder (".NAME.partial-PID": hidden, on the
same filesystem, one per process) and renamed over NAME, so a reader (another rank, a resumed run,
a user's tool) sees the old file or the new one, never half of one, and a crash leaves at most a
hidden temporary behind. The file gets the permissions of any file its user creates (0666 less
the umask), whatever the writer chose (safetensors: readable by the owner only). durable=True
also flushes the data and the rename to the disk, for what must survive the loss of the node
(checkpoints).

What a file was written by is recorded in it (file_record: a JSON report's or JSON Lines' first
object, a PNG's text chunk, a safetensors header), so that a command replaces only its own
outputs: check_output_file, before any work, refuses an existing file unless --force is given and
the same command wrote it, naming what the file is otherwise (a run's, a dataset's, another
command's).

This module imports no torch: data_prep uses it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aogpt import UsageError, __version__
from aogpt.data_folder import describe_dataset_file
from aogpt.run_folder import describe_run_file


def write_atomic(path: str | os.PathLike, write: Callable[[Path], object],
                 durable: bool = False) -> Path:
    """Calls write(temporary path), then renames the temporary file to `path` (made in `path`'s
    folder, which is created if needed). On any error the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        write(partial)
        ordinary_permissions(partial)
        if durable:
            fsync_path(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    if durable:
        fsync_path(path.parent)
    return path


def replace_folder(staged: str | os.PathLike, path: str | os.PathLike,
                   durable: bool = False) -> Path:
    """Puts the complete folder `staged` in `path`'s place: an existing `path` is moved aside
    first and removed after, so `path` is the old folder or the new one, never a mix of them.
    durable=True also flushes the renames to the disk."""
    staged, path = Path(staged), Path(path)
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(staged, path)
    if durable:
        fsync_path(path.parent)
    shutil.rmtree(old, ignore_errors=True)
    return path


@contextlib.contextmanager
def staged_folder(path: str | os.PathLike, durable: bool = False) -> Iterator[Path]:
    """An empty hidden folder next to `path` (".NAME.partial-PID", same filesystem) to write a
    folder's files into; when the block ends, it replaces `path` (replace_folder). On an error
    it is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.partial-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        yield staged
        replace_folder(staged, path, durable)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, durable: bool = False) -> Path:
    return write_atomic(path, lambda partial: partial.write_bytes(data), durable)


def write_text_atomic(path: str | os.PathLike, text: str, durable: bool = False) -> Path:
    return write_atomic(path, lambda partial: partial.write_text(text), durable)


def write_json_atomic(obj, path: str | os.PathLike, indent: int | None = 1,
                      durable: bool = False) -> Path:
    """Strict JSON (no NaN or infinity, which other tools cannot read), newline-terminated."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n",
                             durable)


@dataclass(frozen=True)
class OutputFile:
    """A file that a command writes, as check_output_file knows it: the command (the `made_by` of
    the file's provenance), what the file is, the suffixes of its format, and its signature: the
    keys of the record that files it wrote before they recorded made_by hold (none: no such files).
    """

    made_by: str  # "trainer/evaluate.py"
    what: str  # "evaluation report"
    suffixes: tuple[str, ...]  # (".json",)
    signature: tuple[str, ...] = ()

    def wrote(self, path: Path) -> bool:
        """Whether `path` is a file this command wrote: its provenance's made_by names it, or it
        has none and the file's record holds the signature (file_record, provenance_of)."""
        record = file_record(path)
        if record is None:
            return False
        origin = provenance_of(record)
        if isinstance(origin, dict) and "made_by" in origin:
            return origin["made_by"] == self.made_by
        return bool(self.signature) and all(key in record for key in self.signature)


def check_output_file(path: str | os.PathLike, flag: str, force: bool,
                      output: OutputFile) -> Path:
    """Checks, before any work, that the file `output` a command writes at the end can be written
    at `path` (`flag` names it: "--json"): a name with the format's suffix, not a folder, not in a
    folder whose files the trainer replaces whole (a run's final/, checkpoints/, samples/), and
    in a folder that exists or can be made and is writable. An existing file is replaced only
    with `force`, and only when the same command wrote it (its provenance says so); anything
    else there (a run's config or metrics, a dataset's manifest, a corpus, another command's
    output) is refused naming what it is. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder: name a file in it")
    if path.exists():
        if not path.is_file() or not output.wrote(path):
            raise UsageError(f"{flag} {path} is {describe_file(path, output)}: choose another "
                             f"name (--force replaces only an earlier {output.what} of "
                             f"{output.made_by})")
        if not force:
            raise UsageError(f"{flag} {path} holds an earlier {output.what} of {output.made_by}: "
                             "pass --force to replace it, or choose another name")
    if path.suffix not in output.suffixes:
        raise UsageError(f"{flag} {path}: {output.made_by} writes its {output.what} as "
                         f"{' or '.join(output.suffixes)}: name the file "
                         f"{path.with_suffix(output.suffixes[0]).name}")
    trainers = describe_run_file(path)  # a new file too: the trainer replaces those folders whole
    if trainers:
        raise UsageError(f"{flag} {path} would be {trainers}: choose a name outside the "
                         "trainer's files")
    check_writable_folder(path.parent, f"{flag} {path}")
    return path


def describe_file(path: Path, output: OutputFile) -> str:
    """What the file at `path` is, for a refusal: a training run's or a dataset's own file, an
    output of another command of this project, or just a file `output`'s command did not write."""
    found = describe_run_file(path) or describe_dataset_file(path)
    if found:
        return found
    record = file_record(path)
    origin = provenance_of(record) if record is not None else None
    if isinstance(origin, dict) and origin.get("made_by"):
        return f"an output of {origin['made_by']}"
    return f"a file that {output.made_by} did not write"


# ---- provenance recorded in files ----------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROVENANCE = "provenance"  # the key of a file's provenance record; the PNG text chunk's name
READ_AT_MOST = 2**30  # bytes: a larger file is no output of these commands


def file_record(path: str | os.PathLike) -> dict | None:
    """The JSON record a file written by this project carries, read by its format; None for any
    other file:
        JSON object         the object (evaluate.py's and genppl.py's reports)
        JSON Lines          its first line's object (sample.py's samples)
        PNG                 {"provenance": its "provenance" text chunk, JSON} (plot_metrics.py)
        HTML                {"provenance": its "provenance" JSON script element} (a replay page)
        safetensors         the JSON header stored in its metadata (a consolidated checkpoint)
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            start = file.read(8)
            if start == PNG_SIGNATURE:
                return _png_record(path)
            if path.suffix == ".safetensors":
                return _safetensors_record(file, int.from_bytes(start, "little"))
            if path.suffix == ".html":
                return _html_record(path)
            if not start.lstrip().startswith(b"{") or path.stat().st_size > READ_AT_MOST:
                return None
            file.seek(0)
            text = file.read().decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:  # JSON Lines
        try:
            record = json.loads(text.split("\n", 1)[0])
        except json.JSONDecodeError:
            return None
    return record if isinstance(record, dict) else None


def provenance_of(record: dict):
    """The provenance in a file's record: its "provenance" field, or a consolidated checkpoint's
    "meta"."""
    return record.get(PROVENANCE, record.get("meta"))


def png_provenance(record: dict) -> dict[str, str]:
    """The PNG metadata that makes `record` a PNG's provenance (matplotlib's savefig metadata=)."""
    return {PROVENANCE: json.dumps(record, default=str)}


def _png_record(path: Path) -> dict | None:
    from PIL import Image  # matplotlib's own dependency; only here

    try:
        with Image.open(path) as image:
            text = image.text.get(PROVENANCE)
        return {PROVENANCE: json.loads(text)} if text else None
    except (OSError, SyntaxError, ValueError):  # PIL's errors for a damaged PNG, or not JSON
        return None


HTML_PROVENANCE = re.compile(r'<script type="application/json" id="provenance">(.*?)</script>',
                             re.DOTALL)


def html_provenance(record: dict) -> str:
    """The element that makes `record` an HTML page's provenance (JSON that cannot close it)."""
    text = json.dumps(record, default=str).replace("<", "\\u003c")
    return f'<script type="application/json" id="provenance">{text}</script>'


def _html_record(path: Path) -> dict | None:
    if path.stat().st_size > READ_AT_MOST:
        return None
    found = HTML_PROVENANCE.search(path.read_text(encoding="utf-8", errors="replace"))
    try:
        return {PROVENANCE: json.loads(found[1])} if found else None
    except json.JSONDecodeError:
        return None


def _safetensors_record(file, header_size: int) -> dict | None:
    if not 0 < header_size < READ_AT_MOST:
        return None
    header = json.loads(file.read(header_size))
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    for value in (metadata or {}).values():
        try:
            record = json.loads(value)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            return record
    return None


# A URL given where a local path is written ("s3://b/x", which a Path cuts to "s3:/b/x") would
# become a folder named "s3:": refused instead
URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def check_writable_folder(folder: str | os.PathLike, what: str) -> None:
    """UsageError naming `what` unless `folder` exists or can be made, and a file can be created in
    it (tried: permission bits say nothing to root, nor about a read-only filesystem); and
    unless it begins like a URL, which would be made as a local folder named after its scheme."""
    if URL_LIKE.match(str(folder)):
        raise UsageError(f"{what}: {folder} begins like a URL ({str(folder).split('/')[0]}), and "
                         f"this writes local files: give a local path")
    folder = Path(folder)
    existing = folder
    while not existing.exists():  # the nearest folder that exists decides whether it can be made
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{what}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise UsageError(f"{what}: cannot write in {existing} ({err.strerror or err})") from None


def ordinary_permissions(path: str | os.PathLike) -> None:
    """Gives `path` the permissions open() gives a new file: 0666 less the process's umask (so a
    team's shared checkpoint folder stays readable by the team)."""
    umask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    Path(path).chmod(0o666 & ~umask)


def fsync_path(path: str | os.PathLike) -> None:
    """Flushes a file's data, or a folder's entries (a rename), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def git_sha() -> str | None:
    """The commit of this code ("+dirty" with uncommitted changes); None outside a git checkout."""
    repo = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def code_version() -> dict:
    """The code that made an output, as every output file records it: the package version and
    the commit (git_sha)."""
    return {"aogpt_version": __version__, "git_sha": git_sha()}
