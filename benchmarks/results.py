"""A benchmark's --json file, written after every row it measures.

A measurement may be cut short: a device call has a time limit (benchmarks/gpu_report.py runs
every GPU measurement in one call of 10 minutes), a user presses Ctrl-C. So each benchmark
rewrites its whole JSON (atomically: a reader never sees half a file) the moment a row is
measured, with "complete": false until its last row; a run cut short leaves every row it
finished, and says it was cut.

    results = ResultsFile(args.json, {"preset": "small", "results": []})
    for ...:
        results.data["results"].append(row)
        results.row_done()
    results.finish()

AOGPT_TEST_STOP_AFTER_ROWS=N (tests only) ends the process right after its N-th row is written,
as a time limit would: tests/benchmarks/test_results_files.py runs every benchmark so.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from aogpt.files import write_json_atomic, write_text_atomic

STOP_VARIABLE = "AOGPT_TEST_STOP_AFTER_ROWS"
STOPPED = 3  # the exit status of a run the test hook stopped


class ResultsFile:
    def __init__(self, path: Path | None, data: dict):
        self.path, self.data, self.rows = path, data, 0
        self.data["complete"] = False

    def row_done(self) -> None:
        """A row was added to self.data: the file is written now."""
        self.rows += 1
        self._write()
        if self.rows == int(os.environ.get(STOP_VARIABLE) or 0):
            print(f"stopped after {self.rows} rows ({STOP_VARIABLE})", file=sys.stderr, flush=True)
            sys.exit(STOPPED)

    def finish(self) -> None:
        self.data["complete"] = True
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            write_json_atomic(self.data, self.path, indent=2)


def show_table(text: str, path: Path | None) -> None:
    """A benchmark's table of results: printed after its rows' lines, and written to its --table
    file where one is given."""
    print("\n" + text)
    if path:
        write_text_atomic(path, text)


EXCEPTION_LINE = re.compile(r"\b\w*(?:Error|Exception)\b\s*[:(]")


def why(text: str) -> str:
    """The one line of a failure's text that says why: the last line naming an exception with its
    message (an Inductor failure opens with "SubprocException: An exception occurred in a
    subprocess:" and ends with the ValueError that caused it), else the first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if EXCEPTION_LINE.search(line)
             and not line.rstrip().endswith(":")]
    return (named or lines or ["no message"])[-1][:300]
