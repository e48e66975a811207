"""The pictures of docs/replay.md: the replay page and the playground, as headless Chromium shows
them.

    python tools/screenshots.py --ckpt RUN [--out docs] [--force]

Runs the commands as a user does, each its own process: trainer/sample.py draws speculative
samples with their calls recorded and writes their page (--html); tools/playground.py serves a
playground, whose page fills a gap with the confidence planner. Chromium (tools/browser.py) opens
both, stops each halfway through its calls with a cell hovered, and saves replay.png and
playground.png in --out. An existing picture is replaced only with --force, and only when this
tool made it.
"""

from __future__ import annotations

import argparse
import io
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from browser import launch, missing
from PIL import Image  # matplotlib's own dependency
from PIL.PngImagePlugin import PngInfo

from aogpt import RunFailure, UsageError, cli_entry
from aogpt.files import OutputFile, check_output_file, png_provenance, write_atomic
from aogpt.model.checkpoint import provenance

REPO = Path(__file__).resolve().parent.parent
PICTURE = OutputFile("tools/screenshots.py", "screenshot", (".png",))
SAMPLE = ["--num-samples", "4", "--sampler", "speculative", "--draft", "4", "--seed", "1",
          "--temperature", "0.8", "--prompt", "ROMEO:"]
GAPS = "ROMEO: O, she doth[______] the torches to burn bright![____] she hangs upon the cheek"
VIEWPORT = {"width": 1100, "height": 720}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tools/screenshots.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="the run whose samples are shown")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="folder (default docs)")
    parser.add_argument("--force", action="store_true", help="replace pictures this tool made")
    return parser.parse_args(argv)


def command(*args: str) -> None:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise RunFailure(f"{' '.join(args[:1])} failed: {done.stderr.strip().splitlines()[-1]}")


def halfway(page) -> None:
    """The player at half its calls, the first pending draft or candidate (else a new cell)
    hovered."""
    total = int(page.get_attribute(".slider", "max"))
    page.click(".first")
    for _ in range(total // 2):
        page.click(".forward")
    for selector in (".cell.draft", ".cell.candidate", ".cell.new"):
        if page.query_selector(f".cells {selector}"):
            page.hover(f".cells {selector}")
            break


def page_picture(playwright, ckpt: str, out: Path, origin: dict) -> None:
    with tempfile.TemporaryDirectory() as work:
        html = Path(work) / "samples.html"
        command("trainer/sample.py", "--ckpt", ckpt, *SAMPLE, "--record-calls", "--html",
                str(html), "--show", "0")
        browser = launch(playwright)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(html.as_uri())
        page.wait_for_selector("#player[data-ready='1']")
        halfway(page)
        save(page, out, origin)
        browser.close()


def playground_picture(playwright, ckpt: str, out: Path, origin: dict) -> None:
    server = subprocess.Popen([sys.executable, "tools/playground.py", "--ckpt", ckpt, "--port",
                               "0"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        address = re.search(r"on (http://\S+)$", server.stdout.readline().strip())
        if address is None:
            raise RunFailure("tools/playground.py did not start: run it alone to see why")
        browser = launch(playwright)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(address[1])
        page.fill("#text", GAPS)
        page.select_option("#planner", "confidence")
        page.click("#go")
        page.wait_for_selector("#player[data-ready='1']", timeout=300_000)
        halfway(page)
        save(page, out, origin)
        browser.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


def save(page, out: Path, origin: dict) -> None:
    """The page as a PNG at `out`, its provenance in the PNG's text, as plot_metrics.py's."""
    info = PngInfo()
    for key, value in png_provenance(origin).items():
        info.add_text(key, value)
    with Image.open(io.BytesIO(page.screenshot())) as image:
        write_atomic(out, lambda path: image.save(path, format="PNG", pnginfo=info))
    print(f"wrote {out}")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = missing()
    if reason:
        raise UsageError(reason)
    pictures = {name: check_output_file(args.out / f"{name}.png", "--out", args.force, PICTURE)
                for name in ("replay", "playground")}
    origin = provenance(None, None, vars(args), made_by=PICTURE.made_by, ckpt=args.ckpt)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        page_picture(playwright, args.ckpt, pictures["replay"], origin)
        playground_picture(playwright, args.ckpt, pictures["playground"], origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
