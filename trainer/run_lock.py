"""One training at a time in an out_dir: out_dir/run.lock, held by rank 0 for the life of the run.

Two trainings writing the same folder would overwrite each other's checkpoints and interleave
their metrics. The lock is a small JSON file made with O_EXCL (which shared filesystems honour,
unlike flock on some of them) naming its holder: host, process id and start time, the SLURM job,
the command. A lock whose holder is gone is taken over with a warning:
- on the same host, the process is gone (or its id now belongs to a younger process);
- the same SLURM job: a requeued job starts again after its previous attempt was killed;
- elsewhere, its heartbeat stopped: the holder touches the file every HEARTBEAT_S seconds, and
  one untouched for STALE_AFTER_S belongs to a process that is gone (a node that died).
Any other holder is alive, and the new run is refused with one line naming it. The lock goes
when the run ends, however it ends short of kill -9 (which the rules above answer).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

from aogpt import UsageError
from aogpt.files import check_writable_folder

HEARTBEAT_S = 60.0
STALE_AFTER_S = 5 * HEARTBEAT_S
WRITING_S = 5.0  # an unreadable lock younger than this may be being written: its maker is alive


def holder_record() -> dict:
    """Who this process is, as a lock records it."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": psutil.Process().create_time(), "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "command": " ".join(sys.argv)}


def stale_because(holder: dict, modified: float, me: dict) -> str | None:
    """Why the lock of `holder` (file last touched at `modified`) is stale for `me`; None if its
    holder may still be running."""
    if holder.get("slurm_job") and holder["slurm_job"] == me["slurm_job"]:
        return f"an earlier attempt of SLURM job {holder['slurm_job']}"
    if holder.get("host") == me["host"]:
        try:
            process = psutil.Process(holder["pid"])
            # a zombie has ended: killed (-9) and not yet reaped, which a container's init may
            # leave for seconds after the launcher that started it died
            alive = (process.create_time() <= holder["started"] + 1
                     and process.status() != psutil.STATUS_ZOMBIE)
        except (psutil.NoSuchProcess, KeyError, TypeError):
            alive = False
        return None if alive else f"process {holder.get('pid')} on this host, which has ended"
    silent = time.time() - modified
    if silent > STALE_AFTER_S:
        return (f"process {holder.get('pid')} on {holder.get('host')}, silent for "
                f"{silent / 60:.0f} min")
    return None


class RunLock:
    """out_dir/run.lock for this process (see the module's docstring)."""

    def __init__(self, lock_file: str | os.PathLike):
        self.file = Path(lock_file)
        self.record = holder_record()
        self._stop = threading.Event()

    def acquire(self) -> None:
        """Takes the lock or raises UsageError naming its live holder; a stale lock is taken
        over with a warning on stderr."""
        check_writable_folder(self.file.parent, f"out_dir {self.file.parent}")
        self.file.parent.mkdir(parents=True, exist_ok=True)
        while not self._create():
            try:
                modified = self.file.stat().st_mtime
                holder = json.loads(self.file.read_text())
            except FileNotFoundError:
                continue  # released in the meantime: try again
            except (OSError, ValueError):  # half-written: its maker is writing it, or was killed
                age = time.time() - modified
                if age < WRITING_S:
                    time.sleep(0.05)
                    continue
                holder = {}
                why = (f"an unreadable lock last written {age / 60:.0f} min ago (its maker was "
                       "killed while writing it)")
            else:
                why = stale_because(holder, modified, self.record)
            if why is None:
                raise UsageError(
                    f"out_dir {self.file.parent} is in use by another training (process "
                    f"{holder.get('pid')} on {holder.get('host')}, started "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(holder.get('started', 0)))}"
                    f": {holder.get('command', '?')}): wait for it to end, or choose another "
                    f"out_dir; if that process is gone, delete {self.file}")
            print(f"warning: taking over {self.file} from {why}", file=sys.stderr, flush=True)
            self.file.unlink(missing_ok=True)
        threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True).start()

    def _create(self) -> bool:
        try:
            fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as file:
            json.dump(self.record, file)
        return True

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.file)
            except OSError:
                return  # the folder is gone or unwritable: the run will say so itself

    def release(self) -> None:
        """Removes the lock if it is still this process's."""
        self._stop.set()
        try:
            if json.loads(self.file.read_text()) == json.loads(json.dumps(self.record)):
                self.file.unlink()
        except (OSError, ValueError):
            pass
