"""Files and folders that are complete or absent, and the commit that wrote them: every writer goes
through here.

A file is written under a temporary name in its own folder (".NAME.partial-PID": hidden, on the
same filesystem, one per process) and renamed over NAME, so a reader (another rank, a resumed run,
a user's tool) sees the old file or the new one, never half of one, and a crash leaves at most a
hidden temporary behind. The file gets the permissions of any file its user creates (0666 less
the umask), whatever the writer chose (safetensors: readable by the owner only). durable=True also flushes the data and the rename to the disk, for what
must survive the loss of the node (checkpoints).

This module imports no torch: data_prep uses it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from aogpt import UsageError, __version__


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


def check_output_file(path: str | os.PathLike, flag: str, force: bool = False) -> Path:
    """Checks, before any work, that the file a command will write at the end can be written: not
    a folder, not an existing file unless `force` (the user's work is never replaced silently),
    in a folder that exists or can be made, and writable. `flag` names it in the message
    ("--json"). Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder: name a file in it")
    if path.exists() and not force:
        raise UsageError(f"{flag} {path} exists: pass --force to replace it, or choose another name")
    check_writable_folder(path.parent, f"{flag} {path}")
    return path


def check_writable_folder(folder: str | os.PathLike, what: str) -> None:
    """UsageError naming `what` unless `folder` exists or can be made, and a file can be created in
    it (tried: permission bits say nothing to root, nor about a read-only filesystem)."""
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
