"""A synthetic language's data folder as the judge (trainer/genppl.py, sample.py --judge): exact
NLL of any samples, the language's entropy beside it, and refused for another language's model."""

import json
import math

import pytest
import torch
from conftest import run_cli

from aogpt import UsageError
from aogpt.data_prep.manifest import check_compatible, read_manifest
from aogpt.data_prep.synthetic import load_language
from aogpt.data_prep.tokenizer import RANKS_SHA256
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.trainer.genppl import main as genppl_main
from aogpt.trainer.sample import main as sample_main

N, VOCAB = 16, 16


def build(folder, seed: int):
    result = run_cli("data_prep/synthetic_to_mds.py", "--out", str(folder), "--seq-len", str(N),
                     "--train-samples", "64", "--val-samples", "16", "--vocab", str(VOCAB),
                     "--topics", "2", "--seed", str(seed))
    assert result.returncode == 0, result.stderr
    return folder


@pytest.fixture(scope="module")
def language_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("languages")
    return build(root / "ours", seed=0), build(root / "theirs", seed=1)


def model_of(folder, tokenizer: dict):
    """An (untrained) model of a language, saved as training saves it: with its data's
    tokenizer."""
    torch.manual_seed(0)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=N, cond_dim=8,
                         vocab_size=VOCAB)
    save_consolidated(folder, config, AOGPT(config).state_dict(), None, step=1,
                      data_tokenizers=[tokenizer])
    return folder


@pytest.fixture(scope="module")
def checkpoints(language_data, tmp_path_factory):
    ours, theirs = language_data
    root = tmp_path_factory.mktemp("models")
    return (model_of(root / "ours", read_manifest(ours)["tokenizer"]),
            model_of(root / "theirs", read_manifest(theirs)["tokenizer"]))


def test_the_languages_own_sequences_score_its_entropy(language_data, tmp_path, capsys):
    ours, _ = language_data
    language = load_language(ours, "--judge")
    samples = tmp_path / "truth.jsonl"
    samples.write_text("".join(json.dumps({"tokens": row}) + "\n"
                               for row in language.sample(3000, N, seed=9).tolist()))
    report_file = tmp_path / "report.json"
    assert genppl_main(["--samples", str(samples), "--judge", str(ours), "--json",
                        str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    assert report["entropy_rate"] == pytest.approx(read_manifest(ours)["entropy_per_token"])
    assert abs(report["gap"]) < 4 * report["true_nll_error"]  # the truth is at the entropy
    assert report["ppl"] == pytest.approx(math.exp(report["true_nll"]))
    # a sample's unigram entropy and repetition, and the language's own, side by side
    assert report["entropy"] == pytest.approx(report["reference"]["entropy"], abs=0.05)
    assert report["repetition"] == pytest.approx(report["reference"]["repetition"], abs=0.02)
    assert "nats/token against the language's entropy" in capsys.readouterr().out


def test_samples_of_a_model_of_the_language_are_ids_and_judged_exactly(checkpoints, language_data,
                                                                       tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    assert sample_main(["--ckpt", str(checkpoints[0]), "--weights", "raw", "--num-samples", "4",
                        "--prompt", "3 4", "--sampler", "speculative", "--judge",
                        str(language_data[0]), "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["tokens"][:2] == [3, 4] and max(r["tokens"]) < VOCAB for r in records)
    assert all(r["text"] == " ".join(map(str, r["tokens"])) for r in records)
    printed = capsys.readouterr().out
    assert "true NLL (4 samples, exact)" in printed and "end-of-text" not in printed


def test_a_judge_of_another_language_is_refused_in_one_line(checkpoints, language_data, tmp_path,
                                                            capsys):
    ours, theirs = language_data
    fingerprint = load_language(ours, "--judge").fingerprint[:12]
    assert sample_main(["--ckpt", str(checkpoints[1]), "--weights", "raw", "--judge",
                        str(ours)]) == 2
    err = capsys.readouterr().err
    assert f"--judge {ours} is synthetic language {fingerprint}, but the samples' model was " \
           "trained on synthetic language" in err and err.count("\n") == 1
    out = tmp_path / "theirs.jsonl"
    assert sample_main(["--ckpt", str(checkpoints[1]), "--weights", "raw", "--num-samples", "1",
                        "--out", str(out)]) == 0
    assert genppl_main(["--samples", str(out), "--judge", str(ours)]) == 2
    assert "judge with the data folder the model was trained on" in capsys.readouterr().err


def test_a_gpt2_folder_for_a_synthetic_model_and_the_reverse_are_refused(language_data):
    manifest = read_manifest(language_data[0])
    check_compatible(manifest, N, VOCAB)
    with pytest.raises(UsageError, match=f"the data is synthetic token ids 0..{VOCAB - 1}, the "
                       f"model's vocabulary has {VOCAB - 1}: set model.vocab_size={VOCAB}"):
        check_compatible(manifest, N, VOCAB - 1)
    gpt2 = {**manifest, "tokenizer": {"name": "gpt2", "ranks_sha256": RANKS_SHA256}}
    with pytest.raises(UsageError, match="the data is GPT-2 text"):
        check_compatible(gpt2, N, VOCAB)

