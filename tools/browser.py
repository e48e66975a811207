"""Debian's headless Chromium driven by Playwright's Python client: what the browser tests
(tests/conftest.py: the browser and page fixtures) and tools/screenshots.py open pages with.

Playwright launches the system's browser (`apt-get install chromium`; .ci/run installs it) and
never downloads one of its own. Each launch gets a fresh, empty profile (Playwright makes a
temporary --user-data-dir) and the flags below: no sandbox (CI runs as root), no GPU, and none of
the browser's own traffic (component updates, sync, field trials), so that what a page requests
is all the network sees.
"""

from __future__ import annotations

import shutil

BROWSERS = ("chromium", "chromium-browser")  # Debian's name, and Ubuntu's
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def find_chromium() -> str | None:
    return next(filter(None, map(shutil.which, BROWSERS)), None)


def missing() -> str | None:
    """Why no browser can be launched here, in one line; None when one can."""
    if find_chromium() is None:
        return "Chromium is not installed (.ci/run installs Debian's: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's Python client is not installed (pip install -e '.[test]')"
    return None


def launch(playwright):
    """A headless Chromium of `playwright` (a started sync_playwright())."""
    return playwright.chromium.launch(executable_path=find_chromium(), args=FLAGS)
