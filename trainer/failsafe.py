"""How a run stops: on a signal, at a step boundary with a checkpoint; when it cannot go on, with
one line naming the cause and a non-zero exit status, within a bounded time, whatever state the
process is in.

    PreemptionFlag(announce)        SIGTERM, SIGUSR1 (a scheduler's preemption) and Ctrl-C (SIGINT)
                                    ask the loop to save at the next step boundary and exit
    SignalWatchdog(grace_s, ...)    after such a signal, ends the process if the run has not saved
                                    and exited within grace_s (a step or a save that never
                                    finishes: a hung peer, a stuck filesystem); a second Ctrl-C
                                    ends it at once, saying what is lost
    exit_deadline(seconds)          after a failure, the process is gone within `seconds` even if
                                    something (a library thread, a collective) holds its exit
    end_child_processes()           loader workers ignore these signals (trainer/data.py): kill them

Exit statuses of trainer/main.py: 0 done; 1 the run failed while training (one line `error: ...`:
a shard the loader cannot read, a bad step (trainer/recovery.py), another rank lost, no checkpoint
within the grace after a signal; see aogpt.RunFailure); 2 bad input found before training; 75
stopped by a signal after saving a checkpoint (EXIT_PREEMPTED); 130 stopped at once by a second
Ctrl-C, without saving (EXIT_INTERRUPTED).
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

EXIT_FAILED = 1  # what aogpt.cli_entry returns for a RunFailure
EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: stopped after a checkpoint, re-run to resume
EXIT_INTERRUPTED = 130  # the shell's status for a process ended by Ctrl-C
SECOND_CTRL_C = ("Ctrl-C: saving a checkpoint at the end of this step, then stopping (press Ctrl-C "
                 "again to stop at once without saving)")


class PreemptionFlag:
    """Set by SIGTERM, SIGUSR1 or SIGINT; the training loop saves at the next step boundary and
    exits. Ctrl-C is answered like a scheduler's preemption, so that it never costs the steps since
    the last checkpoint; a second Ctrl-C is the watchdog's (SignalWatchdog)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, announce: bool = True):
        self.received: str | None = None
        self.announce = announce  # rank 0 says what a Ctrl-C does
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        # Only a flag: saving needs every rank at the same point, which a handler cannot ensure.
        if signum == signal.SIGINT and self.announce and self.received != "SIGINT":
            # os.write: a print() here could land inside one of the main thread's own prints
            os.write(2, f"\n{SECOND_CTRL_C}\n".encode())
        # A Ctrl-C names the stop even after a SIGTERM: the launcher forwards one to its ranks
        # because of the same Ctrl-C, and under load it can reach a rank first
        self.received = ("SIGINT" if signum == signal.SIGINT
                         else self.received or signal.Signals(signum).name)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def wait(self, seconds: float) -> None:
        """Sleeps `seconds`, or less: until one of these signals arrives (time.sleep would go on
        sleeping after the handler)."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))


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
    # the last word: while the children are ended, the main thread may wake to their death (the
    # loader's "worker exited unexpectedly") and report it as the cause
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
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
    """Bounds the time from SIGTERM/SIGUSR1/SIGINT to the end of the process.

    The training loop answers a signal at the next step boundary: it saves a checkpoint and exits
    (PreemptionFlag). When no step can finish (a hung rank, a stuck read), that never happens; this
    watchdog then ends the process grace_s after the signal with one line saying that no
    checkpoint could be saved, and exit status 1. A save that finishes within the grace ends the
    process before the watchdog looks (mark it with `saved()`; should the exit itself then hang,
    the watchdog ends the process with EXIT_PREEMPTED). A second Ctrl-C within the grace ends the
    process at once (EXIT_INTERRUPTED), naming the checkpoint a re-run resumes from: a user who
    presses it twice does not want to wait. Other signals after the first change nothing (a
    launcher forwards Ctrl-C to its ranks as SIGTERM).

    Python runs signal handlers in the main thread only, between bytecodes: a main thread blocked
    in a collective or a read never runs one. The C-level handler does write the signal's number to
    the wakeup fd at once, which a thread of our own reads (signal.set_wakeup_fd).
    """

    def __init__(self, grace_s: float, last_checkpoint: Callable[[], str], announce: bool = True):
        self.grace_s = grace_s
        self.last_checkpoint = last_checkpoint
        self.announce = announce  # rank 0 says why the process ends, the others end silently
        self._saved = threading.Event()
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="signal-watchdog", daemon=True).start()

    def saved(self) -> None:
        """The checkpoint answering the signal is complete: the process may only exit now."""
        self._saved.set()

    def _next_signals(self, timeout: float | None) -> list[int]:
        """The watched signals received next (blocks up to `timeout`; [] when it passed)."""
        watched = {int(sig) for sig in PreemptionFlag.SIGNALS}
        self._reader.settimeout(timeout)
        try:
            data = self._reader.recv(64)
        except TimeoutError:
            return []
        if not data:  # the process is closing the socket: nothing more to watch
            raise EOFError
        return [number for number in data if number in watched]

    def _watch(self) -> None:
        try:
            received = []
            while not received:
                received = self._next_signals(None)
            name = signal.Signals(received[0]).name
            ctrl_c = received.count(signal.SIGINT)
            deadline = time.monotonic() + self.grace_s
            while ctrl_c < 2 and (left := deadline - time.monotonic()) > 0:
                ctrl_c += self._next_signals(left).count(signal.SIGINT)
        except EOFError:
            return
        if ctrl_c >= 2:
            self._end(EXIT_INTERRUPTED, "a second Ctrl-C: stopped at once without saving; the "
                                        "steps after the last complete checkpoint are lost, a "
                                        "re-run resumes from it: {last}")
        if self._saved.is_set():
            self._end(EXIT_PREEMPTED, f"the process did not exit within "
                                      f"checkpoint.signal_grace_s={self.grace_s:g} s of {name} "
                                      "after saving its checkpoint: ended")
        self._end(EXIT_FAILED, f"error: no checkpoint could be saved within "
                               f"checkpoint.signal_grace_s={self.grace_s:g} s of {name} (no step "
                               "or save finished): stopped without one; the last complete "
                               "checkpoint is {last}")

    def _end(self, status: int, line: str) -> None:
        if not self.announce:
            _die(status, None)
        try:
            last = self.last_checkpoint()
        except Exception as err:  # the checkpoint folder itself may be what is broken
            last = f"unknown ({first_line(err)})"
        _die(status, line.replace("{last}", last))


def silence_in_child() -> None:
    """In a forked child (a loader worker): the parent's watchdog must not hear its signals."""
    signal.set_wakeup_fd(-1)
