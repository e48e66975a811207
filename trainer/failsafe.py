"""How a run ends when it cannot go on: one line naming the cause, a non-zero exit status, within
a bounded time, whatever state the process is in.

    SignalWatchdog(grace_s, ...)    after SIGTERM/SIGUSR1, ends the process if the run has not
                                    saved and exited within grace_s (a step or a save that never
                                    finishes: a hung peer, a stuck filesystem)
    exit_deadline(seconds)          after a failure, the process is gone within `seconds` even if
                                    something (a library thread, a collective) holds its exit
    end_child_processes()           loader workers ignore SIGTERM (trainer/data.py): kill them

Exit statuses of trainer/main.py: 0 done; 1 the run failed while training (one line `error: ...`:
a shard the loader cannot read, a bad step (trainer/recovery.py), another rank lost, no checkpoint within the
grace after a signal; see aogpt.RunFailure); 2 bad input found before training; 75 stopped by a
signal after saving a checkpoint (EXIT_PREEMPTED).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import torch

from aogpt import RunFailure
from aogpt.trainer.checkpoint import EXIT_PREEMPTED, PreemptionFlag

EXIT_FAILED = 1  # what aogpt.cli_entry returns for a RunFailure


class EveryRankFailure(RunFailure):
    """A RunFailure that every rank meets at the same point (a value all ranks reduce together):
    rank 0 alone reports it, so that the log holds one line and not one per rank."""


def is_collective_failure(err: BaseException) -> bool:
    """A collective that failed or timed out because another rank died or hung (gloo raises plain
    RuntimeErrors, NCCL DistBackendErrors)."""
    if isinstance(err, torch.distributed.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        mark in text for mark in ("gloo/transport", "Connection reset by peer", "Connection closed",
                                  "Timed out waiting", "NCCL"))


def first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def end_child_processes() -> None:
    """SIGKILL every multiprocessing child (loader workers, which ignore SIGTERM), then reap."""
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(timeout=5)


def _die(status: int, line: str | None) -> None:
    """Ends the process from any thread, now: os.write (no buffered stream's lock), no atexit."""
    if line:  # on a line of its own, should a progress bar be half-way through one
        os.write(2, ("\n" + line.rstrip("\n") + "\n").encode())
    try:
        end_child_processes()
    finally:
        os._exit(status)


def exit_deadline(seconds: float, status: int = EXIT_FAILED) -> None:
    """Ends the process after `seconds` if it is still running (call once it is failing)."""

    def expire() -> None:
        time.sleep(seconds)
        _die(status, f"error: the process did not exit within {seconds:.0f} s of its failure: "
                     "ended")

    threading.Thread(target=expire, name="exit-deadline", daemon=True).start()


class SignalWatchdog:
    """Bounds the time from SIGTERM/SIGUSR1 to the end of the process.

    The training loop answers a signal at the next step boundary: it saves a checkpoint and exits
    (trainer/checkpoint.py PreemptionFlag). When no step can finish (a hung rank, a stuck read),
    that never happens; this watchdog then ends the process grace_s after the signal with one line
    saying that no checkpoint could be saved, and exit status 1. A save that finishes within the
    grace ends the process before the watchdog looks (mark it with `saved()`; should the exit
    itself then hang, the watchdog ends the process with EXIT_PREEMPTED).

    Python runs signal handlers in the main thread only, between bytecodes: a main thread blocked
    in a collective or a read never runs one. The C-level handler does write the signal's number to
    the wakeup fd at once, which a thread of our own reads (signal.set_wakeup_fd).
    """

    def __init__(self, grace_s: float, last_checkpoint: Callable[[], str]):
        self.grace_s = grace_s
        self.last_checkpoint = last_checkpoint
        self._saved = threading.Event()
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="signal-watchdog", daemon=True).start()

    def saved(self) -> None:
        """The checkpoint answering the signal is complete: the process may only exit now."""
        self._saved.set()

    def _watch(self) -> None:
        watched = {int(sig) for sig in PreemptionFlag.SIGNALS}
        while True:
            data = self._reader.recv(64)
            if not data:
                return
            received = [number for number in data if number in watched]
            if received:
                break
        name = signal.Signals(received[0]).name
        time.sleep(self.grace_s)
        if self._saved.is_set():
            _die(EXIT_PREEMPTED, f"the process did not exit within checkpoint.signal_grace_s="
                                 f"{self.grace_s:g} s of {name} after saving its checkpoint: ended")
        try:
            last = self.last_checkpoint()
        except Exception as err:  # the checkpoint folder itself may be what is broken
            last = f"unknown ({first_line(err)})"
        _die(EXIT_FAILED, f"error: no checkpoint could be saved within checkpoint.signal_grace_s="
                          f"{self.grace_s:g} s of {name} (no step or save finished): stopped "
                          f"without one; the last complete checkpoint is {last}")


def silence_in_child() -> None:
    """In a forked child (a loader worker): the parent's watchdog must not hear its signals."""
    signal.set_wakeup_fd(-1)
