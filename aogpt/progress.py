"""Progress that reads well on a terminal and in a log file: every long command shows it this way.

    with progress(total=n, desc="tokenize", unit="doc") as bar:
        for ... : bar.update(k)

On a terminal (stderr is a TTY) it is a tqdm bar. Otherwise (a SLURM output file, nohup, a pipe)
a bar's carriage returns would pile up into one unreadable line, so it prints a plain line at most
every `every_s` seconds and one at the end:

    tokenize: 1,200/5,000 doc (24%), 310 doc/s, 12 s left

`write` prints a line either way without breaking the bar. Disabled (another rank), it prints
nothing. tqdm itself imports no torch: data_prep uses this too.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm

PLAIN_EVERY_S = 30.0


def on_terminal() -> bool:
    return sys.stderr.isatty()


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '2 h 07 min', '3 d 04 h': for ETAs and wall times in log lines."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


class PlainProgress:
    """tqdm's small API (update, set_postfix, write, reset, close) as plain lines for a log file."""

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "it",
                 initial: float = 0, every_s: float = PLAIN_EVERY_S, disable: bool = False,
                 iterable: Iterable | None = None):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.n, self.disable, self.iterable = initial, disable, iterable
        self.postfix = ""
        self._start = self._last = time.monotonic()
        self._start_n = initial
        self._closed = False

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update(1)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._print()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{key}={value}" for key, value in items.items())

    def write(self, line: str) -> None:
        if not self.disable:
            print(line, flush=True)

    def reset(self, total: float | None = None) -> None:
        self.total, self.n, self._start_n = total, 0, 0
        self._start = time.monotonic()

    def line(self) -> str:
        elapsed = time.monotonic() - self._start
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        done = f"{self.n:,.0f}" + (
            f"/{self.total:,.0f} {self.unit} ({100 * self.n / self.total:.0f}%)" if self.total
            else f" {self.unit}")
        left = (f", {duration((self.total - self.n) / rate)} left"
                if self.total and rate > 0 and self.n < self.total else "")
        return (f"{self.desc + ': ' if self.desc else ''}{done}, {rate:,.1f} {self.unit}/s{left}"
                + (f", {self.postfix}" if self.postfix else ""))

    def _print(self) -> None:
        if not self.disable:
            print(self.line(), file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.n != self._start_n and math.isfinite(self.every_s):  # inf: lines by write only
                self._print()


def progress(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
             unit: str = "it", initial: float = 0, disable: bool = False,
             every_s: float = PLAIN_EVERY_S) -> tqdm | PlainProgress:
    """A tqdm bar on a terminal, plain lines every `every_s` seconds otherwise (see above)."""
    if on_terminal():
        from tqdm import tqdm  # only here: importing it costs ~60 ms (its version lookup)

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial,
                    disable=disable, dynamic_ncols=True, mininterval=0.5)
    return PlainProgress(total, desc, unit, initial, every_s, disable, iterable)
