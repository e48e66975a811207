"""trainer/sample.py: samples from a checkpoint to readable text and JSONL, prompts and infill
kept, bad input refused with one line."""

import json

import pytest
import torch
from conftest import run_cli

from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.trainer.sample import main

N = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny consolidated checkpoint with raw and EMA weights (and one without EMA)."""
    torch.manual_seed(0)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=24, cond_dim=8)
    raw = AOGPT(config).state_dict()
    ema = {name: t + 0.01 for name, t in raw.items()}
    folder = tmp_path_factory.mktemp("ckpt")
    save_consolidated(folder, config, raw, ema, step=1)
    save_consolidated(folder / "raw_only", config, raw, None, step=1)
    return folder


@pytest.fixture(scope="module")
def encoding():
    return load_gpt2()


def sample(checkpoint, tmp_path, *flags):
    out = tmp_path / "samples.jsonl"
    code = main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--steps", "4",
                 "--out", str(out), *flags])
    return code, [json.loads(line) for line in out.read_text().splitlines()] if code == 0 else []


def test_samples_are_written_as_jsonl_and_printed_readably(checkpoint, tmp_path, encoding, capsys):
    code, records = sample(checkpoint, tmp_path, "--num-samples", "3", "--batch-size", "2")
    assert code == 0 and [r["sample"] for r in records] == [0, 1, 2]
    for r in records:
        assert len(r["tokens"]) == N and sorted(r["order"]) == list(range(N))
        assert r["text"] == encoding.decode(r["tokens"])
        assert r["steps"] == 4 and r["network_calls"] == 4 and r["time_s"] > 0
        assert r["settings"]["schedule"] == "linear"
        assert r["settings"]["top_p_rule"] == "paper"  # the generative-perplexity protocol's
    printed = capsys.readouterr().out
    assert "=== sample 0" in printed and "3 samples of 16 tokens" in printed


def test_a_sample_does_not_depend_on_the_batch_size(checkpoint, tmp_path):
    _, batched = sample(checkpoint, tmp_path, "--num-samples", "3", "--counts", "binomial")
    _, alone = sample(checkpoint, tmp_path, "--num-samples", "3", "--batch-size", "1",
                      "--counts", "binomial")
    assert [r["tokens"] for r in batched] == [r["tokens"] for r in alone]


def test_prompt_and_infill_text_stay_where_they_were_put(checkpoint, tmp_path, encoding):
    infill = tmp_path / "infill.json"
    infill.write_text(json.dumps({"10": "the end", "14": [13, 198]}))
    code, records = sample(checkpoint, tmp_path, "--prompt", "Once upon", "--infill", str(infill),
                           "--num-samples", "2")
    assert code == 0
    prompt, end = encoding.encode_ordinary("Once upon"), encoding.encode_ordinary("the end")
    for r in records:
        assert r["tokens"][:len(prompt)] == prompt
        assert r["tokens"][10:10 + len(end)] == end and r["tokens"][14:16] == [13, 198]
        assert r["order"][:len(r["given_positions"])] == r["given_positions"]


def test_left_to_right_greedy_continuation(checkpoint, tmp_path):
    code, records = sample(checkpoint, tmp_path, "--order", "l2r", "--temperature", "0",
                           "--prompt", "Hello", "--num-samples", "2")
    assert code == 0 and records[0]["order"] == list(range(N))
    assert records[0]["tokens"] == records[1]["tokens"]  # greedy: nothing random left


@pytest.mark.parametrize("flags, message", [
    (["--infill", '{"14": "a b c d e f"}'], "does not fit"),
    (["--prompt", "a b", "--infill", '{"1": "c"}'], "overlaps"),
    (["--infill", "[1, 2]"], "JSON object"),
    (["--steps", "17"], "--steps must be in 1..16"),
    (["--seq-len", "25"], "block size"),
    (["--top-p", "0"], "top_p"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),  # 0 never means "the default"
    (["--seq-len", "0"], "--seq-len must be >= 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
])
def test_bad_input_is_one_line_and_exit_status_2(checkpoint, tmp_path, capsys, flags, message):
    assert main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--steps", "4", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_checkpoint_without_ema_needs_raw_weights(checkpoint, tmp_path, capsys):
    raw_only = checkpoint / "raw_only"
    assert main(["--ckpt", str(raw_only), "--seq-len", str(N), "--steps", "2"]) == 2
    assert 'weights="raw"' in capsys.readouterr().err
    assert main(["--ckpt", str(raw_only), "--seq-len", str(N), "--steps", "2",
                 "--weights", "raw"]) == 0


def test_judge_reports_generative_perplexity(checkpoint, tmp_path, capsys):
    code, _ = sample(checkpoint, tmp_path, "--num-samples", "2", "--judge", str(checkpoint))
    assert code == 0
    assert "generative perplexity" in capsys.readouterr().out


def test_the_script_runs_from_the_command_line(checkpoint):
    result = run_cli("trainer/sample.py", "--ckpt", str(checkpoint), "--seq-len", "8",
                     "--num-samples", "1")
    assert result.returncode == 0, result.stderr
    assert "1 samples of 8 tokens" in result.stdout
