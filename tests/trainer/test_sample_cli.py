"""trainer/sample.py: samples from a checkpoint to readable text and JSONL, prompts and infill
kept, each record naming where it came from, bad input refused with one line before any work."""

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, UNWRITABLE_FILES, run_cli, unwritable_file

import aogpt
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.model import AOGPT, load_checkpoint, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.run_folder import RunFolder, tag_for
from aogpt.trainer import sample as sample_module
from aogpt.trainer.sample import main

N = 16
COMMIT = r"[0-9a-f]{40}(\+dirty)?"  # git_sha()'s form; its value moves with each commit


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
    out = tmp_path / "samples.jsonl"  # each call replaces the last one's file
    code = main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--steps", "4",
                 "--out", str(out), "--force", *flags])
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


def speculative(checkpoint, tmp_path, *flags):
    out = tmp_path / "speculative.jsonl"
    code = main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--sampler", "speculative",
                 "--out", str(out), "--force", *flags])
    return code, [json.loads(line) for line in out.read_text().splitlines()] if code == 0 else []


def test_the_speculative_sampler_records_each_samples_calls_and_drafts(checkpoint, tmp_path,
                                                                       capsys):
    code, records = speculative(checkpoint, tmp_path, "--draft", "3", "--num-samples", "3")
    assert code == 0
    for r in records:
        assert r["steps"] is None and r["settings"]["sampler"] == "speculative"
        assert r["settings"]["draft"] == 3
        # every call makes one token final besides the drafts it accepts
        assert N <= r["network_calls"] + r["drafts_accepted"] <= N + 1
        assert r["drafts_accepted"] <= r["drafts_decided"]
        assert r["network_calls"] <= r["batch_network_calls"]
    assert "network calls per token" in capsys.readouterr().out


def test_a_speculative_sample_does_not_depend_on_the_batch_size(checkpoint, tmp_path):
    _, batched = speculative(checkpoint, tmp_path, "--num-samples", "3", "--prompt", "Once")
    _, alone = speculative(checkpoint, tmp_path, "--num-samples", "3", "--prompt", "Once",
                           "--batch-size", "1")
    assert [r["tokens"] for r in batched] == [r["tokens"] for r in alone]
    assert [r["network_calls"] for r in batched] == [r["network_calls"] for r in alone]


@pytest.mark.parametrize("depth, predraft", [("0", "0"), ("2", "0"), ("0", "2")])
def test_a_draft_tree_is_recorded_and_does_not_depend_on_the_batch_size(checkpoint, tmp_path,
                                                                        depth, predraft):
    tree = ("--tree", "3", "--tree-depth", depth, "--predraft", predraft)
    code, batched = speculative(checkpoint, tmp_path, *tree, "--num-samples", "3")
    assert code == 0 and all(
        (r["settings"]["tree"], r["settings"]["tree_depth"], r["settings"]["predraft"])
        == (3, int(depth), int(predraft)) for r in batched)
    _, alone = speculative(checkpoint, tmp_path, *tree, "--num-samples", "3", "--batch-size", "1")
    assert [r["tokens"] for r in batched] == [r["tokens"] for r in alone]
    assert [r["network_calls"] for r in batched] == [r["network_calls"] for r in alone]


def test_branches_without_a_tree_are_refused_in_one_line(checkpoint, tmp_path, capsys):
    code, _ = speculative(checkpoint, tmp_path, "--tree-depth", "2")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and (
        "--tree-depth 2 branches from the candidates after the first of each drafted position: "
        "give --tree C > 1 too") in err
    assert not (tmp_path / "speculative.jsonl").exists()


def test_a_draft_past_the_positions_left_is_clipped_and_said(checkpoint, tmp_path, capsys):
    code, records = speculative(checkpoint, tmp_path, "--draft", "40", "--num-samples", "1")
    assert code == 0 and records[0]["settings"]["draft"] == N - 1
    assert f"note: --draft 40 reaches past the {N} positions to generate: drafting {N - 1}" in (
        capsys.readouterr().err)


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


@pytest.mark.parametrize("alias, word", [("uniform", "random"), ("any", "random"),
                                         ("ltr", "l2r"), ("left_to_right", "l2r")])
def test_an_order_alias_draws_the_tokens_of_its_word(checkpoint, tmp_path, alias, word):
    def drawn(order):
        code, records = sample(checkpoint, tmp_path, "--order", order, "--num-samples", "2",
                               "--seed", "3")
        assert code == 0
        return [(r["tokens"], r["order"], r["settings"], r["provenance"]["settings"]["order"])
                for r in records]

    assert drawn(alias) == drawn(word)
    assert drawn(word)[0][2]["order"] == word


def planned(checkpoint, tmp_path, *flags):
    out = tmp_path / "planned.jsonl"
    length = [] if "--length" in flags else ["--seq-len", str(N)]
    code = main(["--ckpt", str(checkpoint), *length, "--out", str(out), "--force", *flags])
    return code, [json.loads(line) for line in out.read_text().splitlines()] if code == 0 else []


@pytest.mark.parametrize("flags, calls", [
    (["--planner", "confidence"], N - 1),  # one call per token, the prompt's first included
    # 3 per call, and a last call that scores the last call's other two reveals
    (["--planner", "margin", "--reveal", "3"], -(-(N - 1) // 3) + 1),
    (["--planner", "entropy", "--block", "4", "--candidates", "2"], N - 1),
    (["--planner", "threshold", "--threshold", "0.5"], None),  # its own number of calls
])
def test_a_planners_samples_record_the_order_taken_and_its_log_likelihood(
        checkpoint, tmp_path, capsys, flags, calls):
    code, records = planned(checkpoint, tmp_path, "--num-samples", "3", "--prompt", "Once", *flags)
    assert code == 0
    for r in records:
        assert r["settings"]["planner"] == flags[1] and sorted(r["order"]) == list(range(N))
        assert r["order"][0] == 0  # the prompt's position comes first
        assert r["log_likelihood"] < 0
        assert r["network_calls"] == calls if calls else 1 <= r["network_calls"] <= N - 1
    # (batch invariance: tests/model/test_planners.py, on a model whose scores differ by more
    # than rounding; this random model's near-uniform rows tie within it)
    assert f"{flags[1]} planner:" in capsys.readouterr().out


def test_planner_l2r_is_the_left_to_right_order(checkpoint, tmp_path):
    _, planned_l2r = planned(checkpoint, tmp_path, "--planner", "l2r")
    _, ordered = planned(checkpoint, tmp_path, "--order", "l2r")
    assert [r["tokens"] for r in planned_l2r] == [r["tokens"] for r in ordered]
    assert all(r["order"] == list(range(N)) for r in planned_l2r)


@pytest.mark.parametrize("flags, message", [
    (["--planner", "sideways"], "error: --planner 'sideways' is none of random, l2r, confidence, "
                                "margin, entropy, threshold"),
    (["--planner", "margin", "--candidates", "0"], "error: --candidates must be >= 1 (unset: all), "
                                                   "got 0"),
    (["--planner", "margin", "--reveal", "0"], "error: --reveal must be >= 1 (positions revealed "
                                               "per call), got 0"),
    (["--planner", "threshold", "--threshold", "1"], "error: --threshold must be in (0, 1)"),
    (["--planner", "threshold", "--threshold", "0"], "error: --threshold must be in (0, 1)"),
    (["--threshold", "0.5"], "error: --threshold is read by --planner threshold, not by --sampler "
                             "parallel"),
    (["--planner", "threshold", "--reveal", "2"],
     "error: --reveal is read by --planner confidence or margin or entropy, not by --planner "
     "threshold"),
    (["--planner", "l2r", "--order", "random"], "error: --planner l2r contradicts --order "
                                                "random: give one"),
    (["--planner", "l2r", "--order", "ltr"], ""),  # one order, by two of its names
    (["--planner", "margin", "--reveal", str(N + 1)],
     f"error: --reveal must be in 1..{N} (the {N} positions to generate), got {N + 1}"),
    (["--planner", "threshold", "--candidates", str(N + 1)], "error: --candidates must be in "
                                                            f"1..{N}"),
    (["--planner", "entropy", "--block", str(N + 1)], f"error: --block must be in 1..{N}"),
    (["--planner", "confidence", "--steps", "4"], "error: --steps is read by --sampler parallel, "
                                                  "not by --planner confidence"),
    (["--planner", "entropy", "--schedule", "cosine"], "error: --schedule is read by --sampler "
                                                       "parallel, not by --planner entropy"),
    (["--planner", "margin", "--sampler", "parallel"], ""),  # the default sampler: no conflict
    (["--planner", "margin", "--sampler", "speculative"], "error: --planner margin chooses "
                                                          "positions call by call"),
])
def test_a_planners_bad_input_is_one_line(checkpoint, tmp_path, capsys, flags, message):
    code = main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--out",
                 str(tmp_path / "x.jsonl"), *flags])
    err = capsys.readouterr().err
    if not message:
        assert code == 0
        return
    assert code == 2 and message in err and err.strip().count("\n") <= 1, err


def test_a_text_past_the_block_slides_a_window_and_records_its_seams(checkpoint, tmp_path, capsys):
    code, records = planned(checkpoint, tmp_path, "--length", "40", "--window", "8",
                            "--num-samples", "2", "--sampler", "speculative")
    assert code == 0
    for r in records:
        assert r["length"] == len(r["tokens"]) == 40 and r["seams"] == [24]
        assert sorted(r["order"]) == list(range(40)) and r["stopped"] is None
        assert r["network_calls"] < 40  # drafts accepted across chunks
    assert "sliding window of 8 tokens, lengths 40..40 of 40" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--length", "30", "--seq-len", "16"], "error: --length and --seq-len both set the text's"),
    (["--length", "40", "--window", "24"], "error: --window must be in 1..23"),
    (["--length", "40", "--window", "0"], "error: --window must be at least 1, got 0"),
    (["--length", "20", "--window", "4"], "error: --window slides past the block size (24): "
                                          "--length 20 fits in one block"),
    (["--length", "3", "--prompt", "a b c d e"], "error: --prompt (--length 3): given text at 0..4 "
                                                 "does not fit in a sequence of 3 tokens"),
    (["--length", "40", "--infill", '{"39": "a b"}'], "error: --infill (--length 40): given text "
                                                      "at 39..40 does not fit"),
    (["--stop-entropy", "0"], "error: --stop-entropy must be a finite number of nats above 0, "
                              "got 0.0"),
    (["--stop-entropy", "nan"], "error: --stop-entropy must be a finite number of nats above 0, "
                                "got nan"),
    (["--stop-entropy", "inf"], "error: --stop-entropy must be a finite number of nats above 0, "
                                "got inf"),
])
def test_a_long_texts_bad_input_is_one_line(checkpoint, tmp_path, capsys, flags, message):
    code = main(["--ckpt", str(checkpoint), "--out", str(tmp_path / "x.jsonl"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("flags, message", [
    # model/sampler/given.py's given_tokens says what is wrong, in positions; sample.py names the
    # flags
    (["--infill", '{"14": "a b c d e f"}'], "error: --infill (--seq-len 16): given text at 14..19 "
                                            "does not fit in a sequence of 16 tokens"),
    (["--prompt", "a b", "--infill", '{"1": "c"}'], "error: --prompt and --infill (--seq-len 16): "
                                                    "given text at 1..1 overlaps other given text"),
    (["--prompt", "a b c d e f g h i j k l m n o p q"],
     "error: --prompt (--seq-len 16): given text at 0..16 does not fit in a sequence of 16 tokens"),
    (["--infill", '{"x": "a"}'], "error: --infill (--seq-len 16): infill key 'x' is not a token "
                                 "position"),
    (["--infill", '{"3": [50257]}'], "error: --infill (--seq-len 16): given tokens at 3: token ids "
                                     "must be in 0..50256"),
    (["--infill", "[1, 2]"], "JSON object"),
    (["--steps", "17"], "--steps must be in 1..16"),
    (["--seq-len", "25"], "block size"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "nan"], "top_p must be in (0, 1], got nan"),
    (["--temperature", "nan"], "temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["--temperature", "inf"], "temperature must be a finite number >= 0 (0 = greedy), got inf"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),  # 0 never means "the default"
    (["--seq-len", "0"], "--seq-len must be at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--judge-batch-size", "0"], "--judge-batch-size must be at least 1, got 0"),
    (["--show", "-1"], "--show must be >= 0 (0 prints none), got -1"),
    (["--infill", "{0: 1}"], "--infill is not valid JSON"),
    (["--order", "reverse"], "error: --order: 'reverse' names no order: use l2r (also ltr, "
                             "left_to_right) or random (also uniform, ao, any, any_order)"),
    (["--sampler", "speculative"], "error: --steps is read by --sampler parallel, not by "
                                   "--sampler speculative"),
    (["--draft", "2"], "error: --draft is read by --sampler speculative, not by --sampler "
                       "parallel"),
])
def test_bad_input_is_one_line_and_exit_status_2(checkpoint, tmp_path, capsys, flags, message):
    assert main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--steps", "4", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("draft", ["0", "-2"])
def test_a_draft_below_one_is_one_line(checkpoint, capsys, draft):
    assert main(["--ckpt", str(checkpoint), "--sampler", "speculative", "--draft", draft]) == 2
    err = capsys.readouterr().err
    assert f"--draft must be >= 1 (positions drafted ahead per call), got {draft}" in err
    assert err.count("\n") == 1


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


def test_a_missing_or_folder_infill_file_is_named_as_such(checkpoint, tmp_path, capsys):
    expected = ("a file holding a JSON object, or the object itself, e.g. "
                "'{\"0\": \"Once upon a time\"}'")
    for path, what in ((tmp_path / "gap.json", "does not exist"),
                       (tmp_path, "is a folder, not a file")):
        assert main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--infill", str(path)]) == 2
        assert capsys.readouterr().err == f"error: --infill {path} {what}: give {expected}\n"


def test_an_existing_out_file_is_replaced_only_with_force_and_only_earlier_samples(
        checkpoint, tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    out.write_text("my earlier samples\n")
    args = ["--ckpt", str(checkpoint), "--seq-len", str(N), "--steps", "4", "--out", str(out)]
    assert main([*args, "--force"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: --out {out} is a file that trainer/sample.py did not write: choose another name "
        "(--force replaces only an earlier sample file of trainer/sample.py)\n")
    assert out.read_text() == "my earlier samples\n"
    out.unlink()
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: --out {out} holds an earlier sample file of trainer/sample.py: pass --force to "
        "replace it, or choose another name\n")
    assert main([*args, "--force"]) == 0
    record = json.loads(out.read_text().splitlines()[0])
    assert record["sample"] == 0 and record["provenance"]["made_by"] == "trainer/sample.py"


@pytest.mark.parametrize("case", UNWRITABLE_FILES)
def test_an_out_that_cannot_be_written_is_refused_before_sampling(checkpoint, tmp_path, capsys,
                                                                   case):
    out = unwritable_file(tmp_path, case, "s.jsonl")
    assert main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert UNWRITABLE_FILES[case] in captured.err


def unfinished_run(folder, step: int):
    """A run folder as the trainer leaves it before final/: a consolidated checkpoint in the tag
    that `latest` names."""
    run = RunFolder(folder)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=24, cond_dim=8)
    torch.manual_seed(step)
    weights = AOGPT(config).state_dict()
    save_consolidated(run.tag_dir(tag_for(step)), config, weights, weights, step=step)
    run.latest_file.write_text(tag_for(step))
    return run


def test_each_record_names_the_checkpoint_read_its_step_the_settings_and_the_code(tmp_path, capsys):
    """An unfinished run is read through its latest checkpoint, and says so on stderr."""
    run = unfinished_run(tmp_path / "run", step=3)
    out = tmp_path / "samples.jsonl"
    assert main(["--ckpt", str(run.root), "--seq-len", "8", "--num-samples", "2", "--weights",
                 "raw", "--out", str(out)]) == 0
    read = run.tag_dir(tag_for(3)) / "model.safetensors"
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (
        f"note: {run.root} has no final/ (the run has not finished): reading its latest "
        f"checkpoint, {tag_for(3)}")
    assert f"sampling from {read} ({tag_for(3)}, step 3)" in captured.out
    for record in map(json.loads, out.read_text().splitlines()):
        origin = record["provenance"]
        assert (origin["checkpoint"], origin["tag"], origin["step"], origin["weights"]) == (
            str(read.resolve()), tag_for(3), 3, "raw")
        assert origin["unfinished_run"] and origin["settings"]["ckpt"] == str(run.root)
        assert origin["settings"]["num_samples"] == 2 and origin["settings"]["seq_len"] == 8
        assert origin["aogpt_version"] == aogpt.__version__
        assert re.fullmatch(COMMIT, origin["git_sha"])


@pytest.fixture
def a_day_is_short(monkeypatch):
    """Runs of 50 calls are timed, and a run of 10 ms is "over a day": the estimate and its
    refusal at a test's scale (the timing itself is real)."""
    monkeypatch.setattr(sample_module, "TIMED_FROM_CALLS", 50)
    monkeypatch.setattr(sample_module, "LONG_RUN_S", 0.01)


# 19 chunks of 4 calls each
LONG = ["--length", "240", "--window", "12", "--num-samples", "1", "--steps", "4"]


def test_a_run_estimated_past_a_day_is_refused_with_its_estimate(checkpoint, tmp_path, capsys,
                                                                 a_day_is_short):
    out = tmp_path / "long.jsonl"
    assert main(["--ckpt", str(checkpoint), *LONG, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: the run would take about \d+ s \(76 network calls at most, "
                        r"[\d.]+ ms each as timed on one chunk\): pass --long-run to start it "
                        r"anyway, or generate less \(--length, --num-samples\)\n", err), err
    assert not out.exists()


@pytest.mark.slow  # 19 chunks sampled
def test_a_long_run_says_its_estimate_and_its_progress_chunk_by_chunk(checkpoint, tmp_path,
                                                                      capsys, a_day_is_short):
    code, records = planned(checkpoint, tmp_path, *LONG, "--long-run")
    assert code == 0 and len(records[0]["tokens"]) == 240
    out, err = capsys.readouterr()
    assert re.search(r"^estimate: about \d+ s \(76 network calls at most, [\d.]+ ms each", out,
                     re.MULTILINE), out
    assert re.search(r"^sampling: 19/19 chunk \(100%\), [\d.,]+ chunk/s$", err, re.MULTILINE), err


def test_progress_written_to_a_log_file_has_no_carriage_returns(checkpoint, tmp_path):
    """A SLURM or nohup log is a file: plain lines, not a terminal's redrawn bar."""
    log = tmp_path / "sample.log"
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "trainer/sample.py", "--ckpt", str(checkpoint),
                               "--seq-len", "8", "--num-samples", "3", "--batch-size", "1"],
                              cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "sampling: 3/3 batch (100%)" in text


@pytest.mark.parametrize("sampler", ["parallel", "speculative"])
def test_the_hf_model_draws_what_sample_py_draws_from_the_same_given_text(checkpoint, tmp_path,
                                                                          encoding, sampler):
    """generate_any_order's `given` and sample.py's --prompt/--infill go through the same
    given_tokens: the same seed and sample ids draw the same tokens in the same orders, with
    either sampler (generate_any_order takes SamplingConfig's fields)."""
    steps = {"parallel": ["--steps", "4"], "speculative": ["--sampler", sampler, "--draft", "3"]}
    out_file = tmp_path / "samples.jsonl"
    assert main(["--ckpt", str(checkpoint), "--seq-len", str(N), "--out", str(out_file),
                 "--prompt", "Once upon", "--infill", '{"10": [13, 198]}', "--num-samples", "3",
                 "--seed", "5", "--dtype", "fp32", *steps[sampler]]) == 0
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    project = load_checkpoint(checkpoint)  # EMA weights, as sample.py reads by default
    from aogpt.model.hf.configuration_aogpt import AOGPTConfig  # imports transformers: not
    from aogpt.model.hf.modeling_aogpt import AOGPTForCausalLM  # at collection, on every worker

    hf = AOGPTForCausalLM(AOGPTConfig(**dataclasses.asdict(project.config))).eval()
    hf.aogpt.load_state_dict(project.state_dict())
    settings = {"parallel": {"steps": 4}, "speculative": {"sampler": sampler, "draft": 3}}
    out = hf.generate_any_order(num_samples=3, seq_len=N, seed=5, **settings[sampler],
                                given={0: encoding.encode_ordinary("Once upon"), 10: [13, 198]})
    assert out.tokens.tolist() == [r["tokens"] for r in records]
    assert out.orders.tolist() == [r["order"] for r in records]
