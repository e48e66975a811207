"""The replay page (aogpt.trainer.replay, tools/replay.py) in a real headless Chromium: it opens
from a file with no network, plays a sample to its end showing the sample's own text, and steps
back a call exactly; samples made by trainer/sample.py from a tiny checkpoint of random weights
(whose tokens are spread over GPT-2's whole vocabulary: many are parts of a character)."""

import json
import re
import time

import pytest
import torch
from conftest import tool

from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import GPT2_VOCAB, ModelConfig
from aogpt.model.sampler import Generation, SamplingConfig, sample_records
from aogpt.trainer.sample import main as sample_main

N = 48
BLOCK = 64
replay = tool("replay")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=BLOCK, cond_dim=8)
    model = AOGPT(config)
    with torch.no_grad():  # distributions that depend on the context: drafts are rejected too
        model.lm_head.weight.mul_(300.0)
    folder = tmp_path_factory.mktemp("ckpt")
    save_consolidated(folder, config, model.state_dict(), None, step=1)
    return folder


def draw(checkpoint, out, *flags) -> list[dict]:
    assert sample_main(["--ckpt", str(checkpoint), "--weights", "raw", "--out", str(out),
                        "--show", "0", *flags]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def samples(checkpoint, tmp_path_factory):
    """Three samples of N tokens with a prompt and infill (given tokens), 12 calls each."""
    out = tmp_path_factory.mktemp("samples") / "samples.jsonl"
    return out, draw(checkpoint, out, "--seq-len", str(N), "--steps", "12", "--num-samples", "3",
                     "--prompt", "Once upon a time", "--infill", '{"30": " the river"}')


def write_page(samples_file, out) -> None:
    assert replay.main([str(samples_file), "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def page_file(samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "replay.html"
    write_page(samples[0], out)
    return out


def open_page(page, path) -> None:
    page.context.set_offline(True)
    page.goto(path.as_uri())
    page.wait_for_selector("#player[data-ready='1']")


def play_to_the_end(page) -> None:
    page.select_option(".speed", "1000")
    page.click(".play")
    page.wait_for_selector("#player[data-done='1'][data-playing='0']")


def cell_classes(page) -> list[str]:
    return page.eval_on_selector_all(".cells [data-p]", "cells => cells.map(c => c.className)")


def test_the_page_opens_from_a_file_and_requests_nothing(page, page_file):
    open_page(page, page_file)
    assert page.requests == [page_file.as_uri()]
    assert page.text_content(".position") == "call 0 of 42"  # 6 given, no calls recorded


def test_playing_a_sample_to_its_end_shows_its_text(page, page_file, samples):
    open_page(page, page_file)
    for index, record in enumerate(samples[1]):
        page.select_option(".picker", str(index))
        play_to_the_end(page)
        assert page.text_content(".text") == record["text"]
        generated = N - len(record["given_positions"])  # one position per step: no calls recorded
        assert page.text_content(".position") == f"call {generated} of {generated}"


def test_before_the_first_call_only_the_given_tokens_are_shown(page, page_file, samples):
    open_page(page, page_file)
    given = set(samples[1][0]["given_positions"])
    classes = cell_classes(page)
    assert [p for p, cls in enumerate(classes) if "given" in cls] == sorted(given)
    assert all("masked" in cls for p, cls in enumerate(classes) if p not in given)


def test_stepping_back_undoes_a_call(page, page_file, samples):
    open_page(page, page_file)
    record = samples[1][0]
    page.click(".forward")
    after_one = cell_classes(page)
    page.click(".forward")
    second = record["order"][len(record["given_positions"]) + 1]  # the position call 2 reveals
    assert "new" in cell_classes(page)[second]
    page.click(".back")
    assert cell_classes(page) == after_one
    assert "masked" in after_one[second]
    assert page.text_content(".position") == f"call 1 of {N - len(record['given_positions'])}"


@pytest.mark.slow  # samples drawn for it, then a browser
def test_a_text_past_the_block_shows_its_window_seams_and_ends_as_its_text(page, checkpoint,
                                                                            tmp_path):
    samples_file = tmp_path / "long.jsonl"
    [record] = draw(checkpoint, samples_file, "--length", "100", "--window", "32",
                    "--steps", "8", "--num-samples", "1")
    assert record["seams"] == [64, 96]  # chunks 0..64, 32..96, 64..100
    page_file = tmp_path / "long.html"
    write_page(samples_file, page_file)
    open_page(page, page_file)
    seams = page.eval_on_selector_all(".cells [data-seam]", "cells => cells.map(c => c.dataset.p)")
    assert seams == ["64", "96"]
    play_to_the_end(page)
    assert page.text_content(".text") == record["text"]


def html_page(checkpoint, tmp_path, *flags) -> tuple[dict, object]:
    """trainer/sample.py --html's page of one sample (its calls recorded) and its record."""
    out, page_file = tmp_path / "samples.jsonl", tmp_path / "samples.html"
    [record] = draw(checkpoint, out, "--seq-len", "24", "--num-samples", "1", "--html",
                    str(page_file), *flags)
    return record, page_file


@pytest.mark.slow  # samples drawn for it, then a browser
def test_sample_py_html_replays_the_speculative_samplers_drafts_and_their_fate(
        page, checkpoint, tmp_path):
    record, page_file = html_page(checkpoint, tmp_path, "--sampler", "speculative", "--draft",
                                  "4")
    open_page(page, page_file)
    call = next(k for k, c in enumerate(record["calls"]) if "rejected" in c)
    [[position, draft]] = record["calls"][call]["rejected"]
    page.fill(".slider", str(call))  # drafted and pending before the call that rejects it
    cell = f".cells [data-p='{position}']"
    assert "draft" in page.get_attribute(cell, "class")
    page.click(".forward")
    assert page.get_attribute(cell, "class").split() == ["cell", "final", "new", "redrawn"]
    page.hover(cell)
    assert f"(id {draft})" in page.text_content(".tip").split("rejected draft")[1]
    play_to_the_end(page)
    assert page.text_content(".text") == record["text"]


@pytest.mark.slow  # samples drawn for it, then a browser
def test_a_planners_candidates_show_their_scores_on_hover(page, checkpoint, tmp_path):
    record, page_file = html_page(checkpoint, tmp_path, "--planner", "margin")
    open_page(page, page_file)
    page.click(".forward")
    [chosen, runner_up] = record["calls"][0]["candidates"][:2]
    assert page.get_attribute(f".cells [data-p='{chosen[0]}']", "class") == "cell final new"
    page.hover(f".cells [data-p='{runner_up[0]}']")
    shown = re.search(r"candidate of call 1: score (\S+), rank 2 of 16", page.text_content(".tip"))
    assert float(shown[1]) == pytest.approx(runner_up[1], rel=1e-3)  # 4 digits on the page


def test_sample_py_refuses_a_page_name_it_would_not_write_before_any_work(run_main, tmp_path):
    code, out, err = run_main(sample_main, "--ckpt", tmp_path / "no_run", "--html",
                              tmp_path / "page.txt")
    assert code == 2 and err == (f"error: --html {tmp_path / 'page.txt'}: trainer/sample.py writes "
                                 "its replay page as .html: name the file page.html\n")


def test_a_bad_samples_file_is_refused_in_one_line(run_main, tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"step": 3, "loss": 2.5}\n')
    code, _, err = run_main(replay.main, bad, "--out", tmp_path / "page.html")
    assert code == 2 and err.count("\n") == 1
    assert f"error: SAMPLES {bad} line 1 is not a sample record" in err
    assert not (tmp_path / "page.html").exists()


def test_a_page_is_replaced_only_with_force_and_only_when_this_tool_wrote_it(run_main, samples,
                                                                             tmp_path):
    out = tmp_path / "replay.html"
    out.write_text("<html>my own page</html>")
    code, _, err = run_main(replay.main, samples[0], "--out", out, "--force")
    assert code == 2 and "is a file that tools/replay.py did not write" in err
    assert out.read_text() == "<html>my own page</html>"
    out.unlink()
    assert run_main(replay.main, samples[0], "--out", out)[0] == 0
    code, _, err = run_main(replay.main, samples[0], "--out", out)
    assert code == 2 and "pass --force to replace it" in err
    assert run_main(replay.main, samples[0], "--out", out, "--force")[0] == 0


def test_a_page_of_32_samples_of_1024_tokens_is_under_1_mb_and_opens_in_2_s(page, tmp_path):
    """At its largest: tokens drawn uniformly from GPT-2's vocabulary, as a random model draws
    them (every sample's vocabulary its own, most pieces bytes of a character), in random
    orders, written as trainer/sample.py writes records."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(GPT2_VOCAB, (32, 1024), generator=generator)
    orders = torch.stack([torch.randperm(1024, generator=generator) for _ in range(32)])
    out = Generation(tokens, orders, 64, 64, torch.full((32,), 64))
    records = sample_records(list(range(32)), out, load_gpt2(), SamplingConfig(steps=64))
    samples_file = tmp_path / "samples.jsonl"
    samples_file.write_text("".join(json.dumps(record) + "\n" for record in records))
    page_file = tmp_path / "samples.html"
    write_page(samples_file, page_file)
    assert page_file.stat().st_size < 1e6
    start = time.perf_counter()
    open_page(page, page_file)
    assert time.perf_counter() - start < 2.0
