"""Shared fixtures: the repository root and the real text of ../shared/data when present."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def shared_text() -> Path:
    """WikiText-2 validation text from ../shared/data; the test is skipped where it is absent."""
    path = SHARED_DATA / "wikitext-2" / "valid.txt"
    if not path.is_file():
        pytest.skip(f"real text not available here ({path} is absent: a fresh clone elsewhere)")
    return path


def run_cli(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Runs a command of this repo with the test's interpreter and captures its output."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env)
