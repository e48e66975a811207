"""A store that accepts connections and never answers (tests/s3_testing.py's SilentServer): every
command that talks to object storage gives up within its budget (AOGPT_S3_TIMEOUT_S, the
documented setting; small here) plus 10 s, with one line naming the endpoint and the setting,
and says so every 30 s while it waits; nothing is written around it."""

import hashlib
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO
from s3_testing import CREDENTIALS, CutShortServer, SilentServer

from aogpt import UsageError
from aogpt.data_prep import remote, verify

BUDGET_S = 2


def silent_env(server: SilentServer, budget: float = BUDGET_S) -> dict[str, str]:
    return {**os.environ, **server.env, remote.TIMEOUT_SETTING: str(budget)}


def hashes(folder) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file() else "folder" for path in sorted(folder.rglob("*"))}


def timed(args: list[str], env: dict, cwd) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                            env=env, timeout=300)
    return result, time.monotonic() - started


def test_a_silent_endpoint_ends_a_build_in_one_line_within_the_budget(tmp_path):
    """As a user meets it: a builder's process, from a folder that stays as it was (no staging
    folder, no folder named s3:)."""
    (tmp_path / "notes.txt").write_text("mine")
    around = hashes(tmp_path)
    with SilentServer() as server:
        result, seconds = timed([str(REPO / "data_prep" / "sudoku_to_mds.py"), "--out",
                                 "s3://bucket/grids", "--box", "2x2"], silent_env(server),
                                tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"error: --out s3://bucket/grids: the S3 endpoint {server.url} did not answer in \d+ s "
        rf"\(1 try, the last: ReadTimeoutError; {remote.TIMEOUT_SETTING}={BUDGET_S}\): check "
        rf"S3_ENDPOINT_URL and the network, or raise {remote.TIMEOUT_SETTING} for a slow store",
        line), line
    assert seconds < BUDGET_S + 10
    assert hashes(tmp_path) == around


@pytest.mark.slow  # waits its budget (the builder's test above is the fast one)
def test_a_silent_endpoint_ends_verify_in_one_line_within_the_budget(monkeypatch, run_main):
    with SilentServer() as server:
        for name, value in silent_env(server).items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        code, _, err = run_main(verify.main, "s3://bucket/grids")
        assert time.monotonic() - started < BUDGET_S + 10
    assert code == 2 and err.count("\n") == 1
    assert f"error: DIR s3://bucket/grids: the S3 endpoint {server.url} did not answer" in err


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan"])
def test_a_bad_timeout_setting_is_one_line(monkeypatch, run_main, value):
    monkeypatch.setenv(remote.TIMEOUT_SETTING, value)
    for name, setting in CREDENTIALS.items():
        monkeypatch.setenv(name, setting)
    code, _, err = run_main(verify.main, "s3://bucket/grids")
    assert code == 2
    assert err == (f"error: {remote.TIMEOUT_SETTING}={value!r}: give the seconds (> 0) a "
                   f"request to object storage may wait in all, e.g. "
                   f"{remote.TIMEOUT_SETTING}=60\n")


@pytest.mark.slow  # waits 40 s by design
def test_a_long_wait_says_so_every_30_s_then_gives_up(tmp_path):
    with SilentServer() as server:
        result, seconds = timed(["data_prep/verify.py", "s3://bucket/grids"],
                                silent_env(server, 40), REPO)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 2, result.stderr
    assert re.fullmatch(rf"waiting for the S3 endpoint {server.url}: no answer for 3\d s "
                        rf"\(ReadTimeoutError\), trying again until 40 s "
                        rf"\({remote.TIMEOUT_SETTING}\)", lines[0]), lines[0]
    assert re.search(r"did not answer in 4\d s \(4 tries, the last: ReadTimeoutError; ",
                     lines[1]), lines[1]
    assert seconds < 40 + 10


def test_a_body_cut_short_is_tried_again_then_one_line_and_no_partial_file(tmp_path,
                                                                            monkeypatch):
    """A store that goes away while an object streams in (its body ends before its length):
    a dropped connection, tried again within the budget like a silence, then the same one line;
    the shard's name never holds part of it."""
    with CutShortServer() as server:
        for name, value in silent_env(server).items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        with pytest.raises(UsageError) as failure:
            remote.download_url("s3://bucket/train/shard.00000.mds", tmp_path / "shard.mds",
                                "data s3://bucket/train")
        assert time.monotonic() - started < BUDGET_S + 10
    assert re.fullmatch(
        rf"data s3://bucket/train: the S3 endpoint {server.url} did not answer in \d+ s \(\d+ "
        rf"tries, the last: (IncompleteReadError|ResponseStreamingError); "
        rf"{remote.TIMEOUT_SETTING}={BUDGET_S}\): check S3_ENDPOINT_URL and the network, or "
        rf"raise {remote.TIMEOUT_SETTING} for a slow store", str(failure.value))
    assert list(tmp_path.iterdir()) == []
