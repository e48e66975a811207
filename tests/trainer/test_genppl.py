"""Generative perplexity: per-sample and pooled perplexity and unigram entropy, judged by a local
Hugging Face GPT-2 folder or by a checkpoint of this project."""

import json
import math
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

import aogpt
from aogpt import UsageError
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import ModelConfig
from aogpt.model.sampler.window import unigram_entropy
from aogpt.run_folder import RunFolder, tag_for
from aogpt.trainer import sample
from aogpt.trainer.genppl import main
from aogpt.trainer.judge import Judge, generative_perplexity

COMMIT = r"[0-9a-f]{40}(\+dirty)?"  # git_sha()'s form; its value moves with each commit


@pytest.fixture(scope="module")
def hf_judge_dir(tmp_path_factory):
    """A tiny randomly initialized GPT-2 saved as a local Hugging Face folder (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32))
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def project_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    config = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, cond_dim=8)
    folder = tmp_path_factory.mktemp("ckpt")
    return save_consolidated(folder, config, AOGPT(config).state_dict(), None)


def samples(b=5, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50257, (b, n), generator=g).tolist()


def test_hf_judge_scores_each_token_given_the_ones_before(hf_judge_dir):
    from transformers import GPT2LMHeadModel

    judge = Judge(hf_judge_dir, torch.device("cpu"))
    tokens = torch.tensor(samples(2))
    logits = GPT2LMHeadModel.from_pretrained(hf_judge_dir).eval()(tokens).logits
    # log-softmax in float64, as the judge's: in fp32 its sum of 50257 exps was 6 ulps of 10.8
    # off (6e-6), a CPU-dependent amount whose worst case (~50257 / 8 additions per lane,
    # ~4e-4) is beyond 1e-4. The logits are the same fp32 forward, so only float64 rounding
    # is left; a token scored against its neighbour's context or target moves by ~0.07.
    expected = F.cross_entropy(logits[:, :-1].double().transpose(1, 2), tokens[:, 1:],
                               reduction="none")
    torch.testing.assert_close(judge.nll(tokens), expected, rtol=1e-12, atol=1e-12)


def test_report_holds_mean_per_sample_ppl_pooled_ppl_and_entropy(hf_judge_dir):
    judge = Judge(hf_judge_dir, torch.device("cpu"))
    data = samples(5) + samples(2, n=7, seed=1)  # two lengths: batched apart, no padding
    report = generative_perplexity(data, judge, batch_size=2, progress=False)
    nll = [judge.nll(torch.tensor([s]))[0] for s in data]  # one at a time: other forwards
    # A perplexity's relative error is its NLL's absolute one. The NLLs are float64 from fp32
    # logits below 0.4 in size (ulp 3e-8), which a forward of another batch may move by a few
    # ulps: the NLLs by < 2e-7 (measured: 5e-10). Dropping or adding a token moves a sample's
    # mean NLL by ~0.07 / 11.
    per_sample = [math.exp(float(x.mean())) for x in nll]
    assert report["mean_ppl"] == pytest.approx(sum(per_sample) / len(per_sample), rel=1e-6)
    pooled = float(sum(x.sum() for x in nll)) / sum(len(x) for x in nll)
    assert report["ppl"] == pytest.approx(math.exp(pooled), rel=1e-6)
    assert report["tokens_scored"] == 5 * 11 + 2 * 6 and report["samples"] == 7


def test_unigram_entropy_flags_collapsed_samples():
    assert unigram_entropy([7] * 50) == 0.0
    assert unigram_entropy(list(range(64))) == pytest.approx(math.log(64))


def test_a_project_checkpoint_judges_left_to_right_without_the_first_token(project_ckpt):
    judge = Judge(project_ckpt, torch.device("cpu"), weights="raw")
    tokens = torch.tensor(samples(2))
    torch.testing.assert_close(judge.nll(tokens), judge.model.token_nll(tokens)[:, 1:].double())


def test_samples_longer_than_the_judges_context_are_refused(hf_judge_dir):
    judge = Judge(hf_judge_dir, torch.device("cpu"))
    with pytest.raises(UsageError, match="longer than the judge"):
        judge.nll(torch.zeros(1, 33, dtype=torch.long))


def test_cli_reads_sample_jsonl_and_writes_the_report(hf_judge_dir, tmp_path, capsys):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in samples(3)))
    out = tmp_path / "report.json"
    assert main(["--samples", str(path), "--judge", str(hf_judge_dir), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["samples"] == 3 and report["mean_ppl"] > 1
    assert "generative perplexity" in capsys.readouterr().out


def test_a_judge_that_is_an_unfinished_run_says_which_checkpoint_judges(project_ckpt, tmp_path,
                                                                         capsys):
    run = RunFolder(tmp_path / "run")  # as the trainer leaves it before final/
    shutil.copytree(project_ckpt.parent, run.tag_dir(tag_for(4)))
    run.latest_file.write_text(tag_for(4))
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in samples(2)))
    assert main(["--samples", str(path), "--judge", str(run.root), "--weights", "raw"]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"note: {run.root} has no final/ (the run has not finished): reading its latest "
        f"checkpoint, {tag_for(4)}")


def test_cli_refuses_a_file_without_tokens(hf_judge_dir, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "no tokens here"}\n')
    assert main(["--samples", str(path), "--judge", str(hf_judge_dir)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_a_judge_folder_of_another_model_is_refused_not_loaded_as_a_random_gpt2(tmp_path, capsys):
    """transformers reads any config.json as a GPT-2 and starts missing weights at random: this
    project's own Hugging Face export (model_type aogpt) would be scored by a random model."""
    judge = tmp_path / "export"
    judge.mkdir()
    (judge / "config.json").write_text(json.dumps({"model_type": "aogpt"}))
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"tokens": samples(1)[0]}) + "\n")
    assert main(["--samples", str(path), "--judge", str(judge)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --judge: {judge} holds a aogpt model, not a Hugging Face GPT-2 (model_type gpt2): "
        "give a GPT-2 folder saved with save_pretrained, e.g. gpt2-large")


def test_an_existing_report_is_replaced_only_with_force_and_only_an_earlier_report(
        hf_judge_dir, tmp_path, capsys):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in samples(2)))
    out = tmp_path / "report.json"
    out.write_text("my earlier report")
    args = ["--samples", str(path), "--judge", str(hf_judge_dir), "--json", str(out)]
    assert main([*args, "--force"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (  # refused before any scoring
        f"error: --json {out} is a file that trainer/genppl.py did not write: choose another "
        "name (--force replaces only an earlier generative-perplexity report of "
        "trainer/genppl.py)\n")
    assert out.read_text() == "my earlier report"
    out.unlink()
    assert main(args) == 0
    assert capsys.readouterr().out.endswith(f"wrote {out}\n")
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: --json {out} holds an earlier generative-perplexity report of trainer/genppl.py: "
        "pass --force to replace it, or choose another name\n")
    assert main([*args, "--force"]) == 0
    assert json.loads(out.read_text())["samples"] == 2


def test_a_folder_given_as_samples_is_named_as_a_folder(hf_judge_dir, tmp_path, capsys):
    assert main(["--samples", str(tmp_path), "--judge", str(hf_judge_dir)]) == 2
    assert capsys.readouterr().err == (f"error: --samples {tmp_path} is a folder, not a file: give "
                                       "a JSONL file written by trainer/sample.py --out\n")


def test_the_report_records_the_judge_the_samples_and_where_they_came_from(project_ckpt, tmp_path):
    samples_file = tmp_path / "samples.jsonl"
    assert sample.main(["--ckpt", str(project_ckpt), "--weights", "raw", "--seq-len", "8",
                        "--num-samples", "2", "--out", str(samples_file)]) == 0
    out = tmp_path / "report.json"
    assert main(["--samples", str(samples_file), "--judge", str(project_ckpt), "--weights", "raw",
                 "--json", str(out)]) == 0
    origin = json.loads(out.read_text())["provenance"]
    assert (origin["checkpoint"], origin["step"], origin["weights"]) == (
        str(project_ckpt.resolve()), None, "raw")  # the judge, saved without a step
    assert origin["samples"] == str(samples_file.resolve())
    sampled = json.loads(samples_file.read_text().splitlines()[0])["provenance"]
    assert origin["sampled_from"] == sampled
    assert sampled["checkpoint"] == str(project_ckpt.resolve())
    assert origin["settings"]["batch_size"] == 8
    assert origin["aogpt_version"] == aogpt.__version__ and re.fullmatch(COMMIT, origin["git_sha"])
