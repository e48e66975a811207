"""benchmarks/sampling_race.py end to end: an AO-GPT and a left-to-right GPT of a tiny synthetic
language, both trained here by the real trainer (configs/synthetic.yaml and
configs/gpt_synthetic.yaml, shrunk; ~20 s of CPU, so slow), race left to right; and the pairs it
refuses (untrained models saved as training saves them: fast)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

from aogpt.data_prep.manifest import read_manifest
from aogpt.model import AOGPT, load_checkpoint, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.trainer.judge import Judge, generative_perplexity

sys.path.insert(0, str(REPO / "benchmarks"))
import sampling_race  # noqa: E402
from race_table import TINY_LANGUAGE, TINY_TRAINING  # noqa: E402

N, VOCAB = 16, 16  # race_table.TINY_LANGUAGE's
SHRUNK = TINY_TRAINING


def train(config: str, data: Path, out: Path) -> subprocess.Popen:
    """trainer/main.py in one process, as a user runs a preset, started in the background."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "trainer" / "main.py"), "--ds_config", "ds_configs/cpu.json",
         "--config", config, f"data.path={data}", f"out_dir={out}", *SHRUNK],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("race")
    data = root / "language"
    built = run_cli("data_prep/synthetic_to_mds.py", "--out", str(data),
                    *TINY_LANGUAGE)
    assert built.returncode == 0, built.stderr
    trainings = {name: train(config, data, root / name) for name, config in
                 (("ao", "configs/synthetic.yaml"), ("gpt", "configs/gpt_synthetic.yaml"))}
    for process in trainings.values():  # the two at once: one core each
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]
    return root, data


@pytest.fixture(scope="module")
def race(runs):
    root, data = runs
    code = sampling_race.main([
        "--ao", str(root / "ao"), "--gpt", str(root / "gpt"), "--judge", str(data),
        "--num-samples", "6", "--batch-sizes", "1,3", "--drafts", "2,4", "--trees", "1,2",
        "--tree-depths", "0,3", "--predrafts", "0,2", "--timed-batches", "2",
        "--repeats", "1", "--compile", "off", "--json", str(root / "race.json"),
        "--table", str(root / "race.md"), "--plot", str(root / "race.png")])
    assert code == 0
    return json.loads((root / "race.json").read_text()), root


@pytest.mark.slow
def test_the_race_times_and_judges_every_sampler_against_the_gpt(race, runs):
    data, root = race
    rows = {row["label"]: row for row in data["rows"]}
    speculative = [f"AO-GPT speculative K={k}{tree}{r}" for k, depth in ((2, 1), (4, 3))
                   for tree in ("", " C=2", f" C=2 L={depth}") for r in ("", " R=2")]
    assert list(rows) == [sampling_race.BASELINE, "AO-GPT, one token per call", *speculative]
    assert data["complete"] and data["runs"]["gpt"]["family"] == "left-to-right GPT"
    assert data["runs"]["ao"]["order"]["kind"] == "mixture"
    for row in rows.values():
        assert set(row["tokens_per_s"]) == {"1", "3"} and min(row["tokens_per_s"].values()) > 0
        assert row["judge"]["true_nll"] > 0 and row["samples"] == 6
        assert row["judge"]["entropy_rate"] == pytest.approx(
            read_manifest(runs[1])["entropy_per_token"])
        assert all(timing["fastest"] == "eager" for timing in row["timing"].values())
    assert rows[sampling_race.BASELINE]["speedup"] == {"1": 1.0, "3": 1.0}
    for label in list(rows)[2:]:
        assert rows[label]["calls_per_token"] < 1.0 and rows[label]["acceptance"] > 0
    assert rows["AO-GPT speculative K=4 C=2"]["settings"]["tree"] == 2
    assert rows["AO-GPT speculative K=4 C=2 L=3"]["settings"]["tree_depth"] == 3
    assert rows["AO-GPT speculative K=4 R=2"]["settings"]["predraft"] == 2
    assert rows["AO-GPT, one token per call"]["calls_per_token"] == 1.0
    assert "AO-GPT speculative K=4" in (root / "race.md").read_text()
    assert (root / "race.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_baseline_is_the_gpt_drawing_one_token_per_call_left_to_right(race, runs):
    """The GPT row judges exactly the samples its own cache draws one token per call, left to
    right, for the same ids: the race samples the baseline no other way."""
    data, root = race
    gpt = load_checkpoint(root / "gpt", weights="ema").eval()
    out = KVCacheSampler(gpt, 6, N, SamplingConfig(steps=N, order="l2r")).generate(
        torch.arange(6))
    assert out.network_calls == N and (out.orders == torch.arange(N)).all()
    report = generative_perplexity(out.tokens.tolist(), Judge(runs[1], torch.device("cpu")),
                                   progress=False)
    assert data["rows"][0]["judge"]["true_nll"] == report["true_nll"]


def saved(folder: Path, order: dict, tokenizer: dict, **shape) -> Path:
    """An untrained model saved as training saves it, with its run's order settings."""
    config = ModelConfig(**{"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": N,
                            "cond_dim": 8, "vocab_size": VOCAB, **shape})
    save_consolidated(folder, config, AOGPT(config).state_dict(), None, step=1,
                      data_tokenizers=[tokenizer], run_config={"order": order})
    return folder


@pytest.mark.parametrize("case, message", [
    ("gpt trained any order", "--gpt was trained on order.kind=mixture orders, not left to right"),
    ("ao is a gpt", "--ao is a left-to-right model: give an AO-GPT run"),
    ("other shape", "--ao has model.n_embd=16, --gpt 32"),
    ("other data", "give runs of the same data"),
])
def test_a_pair_that_is_no_race_is_refused_in_one_line(tmp_path, run_main, case, message):
    ours = {"name": "synthetic", "language_sha256": "a" * 64}
    mixture, l2r = {"kind": "mixture"}, {"kind": "l2r"}
    ao = saved(tmp_path / "ao", mixture, ours)
    gpt = {"gpt trained any order": lambda: saved(tmp_path / "gpt", mixture, ours),
           "ao is a gpt": lambda: saved(tmp_path / "gpt", l2r, ours),
           "other shape": lambda: saved(tmp_path / "gpt", l2r, ours, n_embd=32),
           "other data": lambda: saved(tmp_path / "gpt", l2r, {**ours, "language_sha256": "b"}),
           }[case]()
    if case == "ao is a gpt":
        ao, gpt = gpt, saved(tmp_path / "gpt2", l2r, ours, target_injection="none")
    code, _, err = run_main(sampling_race.main, "--ao", ao, "--gpt", gpt, "--weights", "raw",
                            "--json", tmp_path / "race.json")
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "race.json").exists()
