"""tools/playground.py as a visitor uses it: its server started as a user starts it (a process on
127.0.0.1, a tiny checkpoint of random weights), its page in a real headless Chromium. A gap is
filled end to end with the tokens trainer/sample.py draws for the same infill and seed; bad input
gets one line on the page; a request made while another runs waits in the queue, and says so."""

import json
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
import torch
from conftest import REPO

from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.trainer.sample import main as sample_main

pytestmark = pytest.mark.slow  # a server process (imports: seconds) and sampling through it

BLOCK = 128
GENERATION_TIMEOUT_MS = 180_000  # a loaded 2-core machine is many times slower than an idle one


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=BLOCK, cond_dim=8)
    folder = tmp_path_factory.mktemp("ckpt")
    save_consolidated(folder, config, AOGPT(config).state_dict(), None, step=1)
    return folder


@pytest.fixture(scope="module")
def server(checkpoint):
    """The playground's address; the process is stopped with Ctrl-C's signal after the tests."""
    process = subprocess.Popen(
        [sys.executable, "tools/playground.py", "--ckpt", str(checkpoint), "--weights", "raw",
         "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = process.stdout.readline()
        address = re.search(r"on (http://127\.0\.0\.1:\d+)$", first.strip())
        assert address, first + process.stdout.read() if process.poll() is not None else first
        assert "this machine only" in process.stdout.readline()
        yield address[1]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def open_playground(page, server) -> None:
    page.goto(server)
    page.wait_for_selector("#ask")


def ask(page, text: str, **choices: str) -> None:
    page.fill("#text", text)
    for name, value in choices.items():
        if page.eval_on_selector(f"#{name}", "e => e.tagName") == "SELECT":
            page.select_option(f"#{name}", value)
        else:
            page.fill(f"#{name}", value)
    page.click("#go")


def test_a_gap_is_filled_end_to_end_as_sample_py_fills_it(page, server, checkpoint,
                                                          tmp_path):
    open_playground(page, server)
    ask(page, "Once upon[_____] time, the end", sampler="parallel", planner="random", seed="3")
    page.wait_for_selector("#player[data-ready='1']", timeout=GENERATION_TIMEOUT_MS)
    page.click("#player .last")
    shown = page.text_content("#player .text")
    out = tmp_path / "same.jsonl"
    assert sample_main(["--ckpt", str(checkpoint), "--weights", "raw", "--seq-len", "11",
                        "--infill", '{"0": "Once upon", "7": " time, the end"}', "--seed", "3",
                        "--num-samples", "1", "--out", str(out), "--show", "0"]) == 0
    record = json.loads(out.read_text())
    assert shown == record["text"]
    assert shown.startswith("Once upon") and shown.endswith(" time, the end")
    assert page.text_content("#player .position") == "call 5 of 5"  # one call per position


def test_a_gap_past_the_block_gets_one_line_on_the_page(page, server):
    open_playground(page, server)
    ask(page, f"Once upon a time[{BLOCK}]")
    page.wait_for_selector("#error:not(:empty)")
    assert page.text_content("#error") == (
        f"the text and its gaps take {BLOCK + 4} tokens, past the model's block of {BLOCK}: "
        "shorten a gap or the text")


def test_an_unknown_sampler_gets_one_line_on_the_page(page, server):
    open_playground(page, server)
    page.eval_on_selector("#sampler", "s => s.add(new Option('sideways', 'sideways'))")
    ask(page, "Once upon[___] time", sampler="sideways")
    page.wait_for_selector("#error:not(:empty)")
    assert page.text_content("#error") == "unknown sampler 'sideways': choose parallel or " \
                                          "speculative"


def post(server: str, fields: dict) -> dict:
    request = urllib.request.Request(f"{server}/jobs", json.dumps(fields).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_request_made_while_others_run_waits_and_says_so(page, server):
    open_playground(page, server)
    # prompts continued to the whole block, one call per token: a few tenths of a second each
    before = [post(server, {"text": "Once", "length": str(BLOCK)}) for _ in range(3)]
    assert [job["state"] for job in before] == ["running", "queued", "queued"] or before[0][
        "state"] == "queued"  # the first may not have been picked up yet
    ask(page, "Once upon[___] time")
    page.wait_for_selector("#status[data-state='queued']")
    assert re.fullmatch(r"queued: [1-3] requests? ahead of yours", page.text_content("#status"))
    page.wait_for_selector("#player[data-ready='1']", timeout=GENERATION_TIMEOUT_MS)
