"""What a run measures of itself while it trains: zero-shot sets (eval.sets), scored as
trainer/evaluate.py scores the checkpoint of that step, and samples (eval.sample_every), the ones
trainer/sample.py draws from that checkpoint, with their entropy and generative perplexity."""

import json
import subprocess
import sys

import pytest
import torch
from eval_testing import build_lambada, build_wikitext
from trainer_testing import MAIN, REPO, SEQ_LEN, TINY_RUN

from aogpt import UsageError
from aogpt.trainer import evaluate as evaluate_py
from aogpt.trainer import genppl as genppl_py
from aogpt.trainer import sample as sample_py
from aogpt.trainer.config import EvalConfig
from aogpt.trainer.metrics import read_metrics
from aogpt.trainer.training_samples import sampling_config
from aogpt.trainer.zero_shot import EVAL_ORDER_SEED

# The commands that the run's own measurements must equal run in this process (run_main): the
# numbers are the point, not the process
STEPS = 4


def tiny_gpt2(folder):
    """A judge: a 1-layer GPT-2 made and saved by transformers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=SEQ_LEN)
                    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def run(text_data, tmp_path_factory):
    """One process, 4 steps of the tiny model, two zero-shot sets (concatenated WikiText and
    per-passage LAMBADA) scored at steps 2 and 4 with the EMA and the raw weights, and 2 samples
    of 8 steps drawn at steps 2 and 4, judged by a tiny GPT-2."""
    root = tmp_path_factory.mktemp("zero_shot")
    sets = [build_wikitext(root / "wikitext2", seq_len=SEQ_LEN),
            build_lambada(root / "lambada", seq_len=SEQ_LEN)]
    out = root / "run"
    args = ["--ds_config", "ds_configs/cpu.json", "--config", "configs/tiny.yaml",
            f"data.path={text_data}", f"out_dir={out}", *TINY_RUN, f"train.max_steps={STEPS}",
            "train.tokens_per_step=512", "eval.every=2", "checkpoint.every=2",
            f"eval.sets=[{','.join(map(str, sets))}]", f"eval.max_tokens={10 * SEQ_LEN}",
            "eval.raw_weights=true", "eval.sample_every=2", "eval.sample_count=2",
            "eval.sample_steps=8", f"eval.judge={tiny_gpt2(root / 'judge')}"]
    done = subprocess.run([sys.executable, MAIN, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, sets, done.stdout, root / "judge"


def evaluate(run_main, checkpoint, sets, weights, json_out) -> dict:
    code, _, err = run_main(
        evaluate_py.main, "--ckpt", checkpoint, *[a for s in sets for a in ("--data", s)],
        "--num-orders", "2", "--seed", EVAL_ORDER_SEED, "--weights", weights, "--precision",
        "fp32", "--max-samples", "10", "--json", json_out)
    assert code == 0, err[-3000:]
    return {result["data"]: result for result in json.loads(json_out.read_text())["results"]}


def test_in_training_scores_equal_evaluate_py_on_the_checkpoint_of_that_step(run, run_main,
                                                                             tmp_path):
    out, sets, _, _ = run
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if "eval_s" in r}
    assert sorted(records) == [2, 4]
    for step in (2, 4):
        checkpoint = out / "checkpoints" / f"step_{step:08d}"
        for weights in ("ema", "raw"):
            theirs = evaluate(run_main, checkpoint, sets, weights,
                              tmp_path / f"{step}-{weights}.json")
            for folder in sets:
                for kind, reading in (("l2r", "l2r"), ("random", "ao")):
                    ours = records[step][f"eval/{folder.name}/{weights}/{reading}_nll"]
                    # the same code on the same weights and samples; only the batch's shapes may
                    # differ, and fp32 sums of 64 tokens x 2 layers round at ~1e-7 relative
                    assert ours == pytest.approx(theirs[str(folder)][kind]["nll"], rel=1e-5)
                    assert records[step][f"eval/{folder.name}/{weights}/{reading}_ppl"] == \
                        pytest.approx(theirs[str(folder)][kind]["ppl"], rel=1e-5)


def test_the_ema_and_raw_weights_give_their_own_curves(run):
    out, _, _, _ = run
    last = [r for r in read_metrics(out / "metrics.jsonl") if "eval_s" in r][-1]
    assert last["eval/wikitext2/ema/l2r_nll"] != last["eval/wikitext2/raw/l2r_nll"]
    assert 0 < last["eval_fraction"] and last["eval_s"] > 0


def test_the_step_after_an_evaluation_is_timed_without_it(run):
    """The evaluation, samples and checkpoint of step 2 run before step 3 and are timed on their
    own: step 3's record (step_time, tokens_per_s, mfu) is its step's time only (it used to
    carry theirs, and a plot of the throughput dipped at every evaluation)."""
    out, _, _, _ = run
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    boundary = records[2]["eval_s"] + records[2]["sample_s"]
    assert records[3]["step_time"] < boundary
    assert records[3]["tokens_per_s"] == pytest.approx(512 / records[3]["step_time"])


def test_each_round_is_one_log_line_with_its_cost(run):
    _, _, stdout, _ = run
    lines = [line for line in stdout.splitlines() if "zero-shot (ema weights)" in line]
    assert [line.split(" | ")[0] for line in lines] == ["step 2", "step 4"]
    assert "wikitext2 ppl " in lines[0] and "lambada ppl " in lines[0]
    assert "(any order <= " in lines[0] and "% of the time since the last evaluation" in lines[0]


def test_each_sample_round_draws_what_sample_py_draws_from_that_steps_checkpoint(run, run_main,
                                                                                 tmp_path):
    out, _, _, _ = run
    for step in (2, 4):
        lines = (out / "samples" / f"step_{step:08d}.jsonl").read_text().splitlines()
        ours = [json.loads(line) for line in lines]
        assert [(r["sample"], r["step"], r["weights"], len(r["tokens"])) for r in ours] == \
            [(0, step, "ema", SEQ_LEN), (1, step, "ema", SEQ_LEN)]
        theirs_file = tmp_path / f"theirs-{step}.jsonl"
        code, _, err = run_main(sample_py.main, "--ckpt", out / "checkpoints" / f"step_{step:08d}",
                                "--num-samples", "2", "--steps", "8", "--out", theirs_file)
        assert code == 0, err[-3000:]
        theirs = [json.loads(line) for line in theirs_file.read_text().splitlines()]
        assert [r["tokens"] for r in ours] == [r["tokens"] for r in theirs]
        assert [r["text"] for r in ours] == [r["text"] for r in theirs]


def test_sample_metrics_are_genppl_pys_report_on_the_rounds_file(run, run_main, tmp_path):
    out, _, _, judge = run
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if "sample_entropy" in r}
    assert sorted(records) == [2, 4]
    report_file = tmp_path / "report.json"
    code, _, err = run_main(genppl_py.main, "--samples", out / "samples" / "step_00000004.jsonl",
                            "--judge", judge, "--json", report_file)
    assert code == 0, err[-3000:]
    report = json.loads(report_file.read_text())
    assert records[4]["sample_gen_ppl"] == pytest.approx(report["mean_ppl"], rel=1e-9)
    assert records[4]["sample_entropy"] == pytest.approx(report["entropy"], rel=1e-12)


def test_the_training_samples_take_a_draft_tree_and_refuse_a_bad_one():
    cfg = EvalConfig(sample_sampler="speculative", sample_draft=3, sample_tree=2,
                     sample_tree_depth=2, sample_predraft=3)
    config = sampling_config(cfg, any_order=True)
    assert (config.sampler, config.draft, config.tree, config.tree_depth, config.predraft) == (
        "speculative", 3, 2, 2, 3)
    with pytest.raises(UsageError, match="eval.sample_.*tree must be >= 1"):
        sampling_config(EvalConfig(sample_sampler="speculative", sample_tree=0), any_order=True)
    with pytest.raises(UsageError, match=r"eval.sample_.*tree_depth must be >= 0"):
        sampling_config(EvalConfig(sample_sampler="speculative", sample_tree_depth=-1),
                        any_order=True)
    with pytest.raises(UsageError, match=r"eval.sample_.*predraft must be >= 0"):
        sampling_config(EvalConfig(sample_sampler="speculative", sample_predraft=-1),
                        any_order=True)
