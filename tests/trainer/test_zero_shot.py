"""Zero-shot sets scored while training (eval.sets): the numbers trainer/evaluate.py gives for the
checkpoint of that step, logged under one name per set, weights and reading, every evaluation."""

import json
import subprocess
import sys

import pytest
from eval_testing import build_lambada, build_wikitext
from trainer_testing import MAIN, REPO, SEQ_LEN, TINY_RUN, build_data, real_documents

from aogpt.trainer.metrics import read_metrics
from aogpt.trainer.zero_shot import EVAL_ORDER_SEED

EVALUATE = str(REPO / "trainer" / "evaluate.py")
STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One process, 4 steps of the tiny model, two zero-shot sets (concatenated WikiText and
    per-passage LAMBADA) scored at steps 2 and 4 with the EMA and the raw weights."""
    root = tmp_path_factory.mktemp("zero_shot")
    data = build_data(root / "text", real_documents())
    sets = [build_wikitext(root / "wikitext2", seq_len=SEQ_LEN),
            build_lambada(root / "lambada", seq_len=SEQ_LEN)]
    out = root / "run"
    args = ["--ds_config", "ds_configs/cpu.json", "--config", "configs/tiny.yaml",
            f"data.path={data}", f"out_dir={out}", *TINY_RUN, f"train.max_steps={STEPS}",
            "train.tokens_per_step=512", "eval.every=2", "checkpoint.every=2",
            f"eval.sets=[{','.join(map(str, sets))}]", f"eval.max_tokens={20 * SEQ_LEN}",
            "eval.raw_weights=true"]
    done = subprocess.run([sys.executable, MAIN, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, sets, done.stdout


def evaluate(checkpoint, sets, weights, json_out) -> dict:
    done = subprocess.run(
        [sys.executable, EVALUATE, "--ckpt", str(checkpoint), *[a for s in sets for a in
         ("--data", str(s))], "--num-orders", "2", "--seed", str(EVAL_ORDER_SEED),
         "--weights", weights, "--precision", "fp32", "--max-samples", "20",
         "--json", str(json_out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {result["data"]: result for result in json.loads(json_out.read_text())["results"]}


def test_in_training_scores_equal_evaluate_py_on_the_checkpoint_of_that_step(run, tmp_path):
    out, sets, _ = run
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if "eval_s" in r}
    assert sorted(records) == [2, 4]
    for step in (2, 4):
        checkpoint = out / "checkpoints" / f"step_{step:08d}"
        for weights in ("ema", "raw"):
            theirs = evaluate(checkpoint, sets, weights, tmp_path / f"{step}-{weights}.json")
            for folder in sets:
                for kind, reading in (("l2r", "l2r"), ("random", "ao")):
                    ours = records[step][f"eval/{folder.name}/{weights}/{reading}_nll"]
                    # the same code on the same weights and samples; only the batch's shapes may
                    # differ, and fp32 sums of 64 tokens x 2 layers round at ~1e-7 relative
                    assert ours == pytest.approx(theirs[str(folder)][kind]["nll"], rel=1e-5)
                    assert records[step][f"eval/{folder.name}/{weights}/{reading}_ppl"] == \
                        pytest.approx(theirs[str(folder)][kind]["ppl"], rel=1e-5)


def test_the_ema_and_raw_weights_give_their_own_curves(run):
    out, _, _ = run
    last = [r for r in read_metrics(out / "metrics.jsonl") if "eval_s" in r][-1]
    assert last["eval/wikitext2/ema/l2r_nll"] != last["eval/wikitext2/raw/l2r_nll"]
    assert 0 < last["eval_fraction"] and last["eval_s"] > 0


def test_each_round_is_one_log_line_with_its_cost(run):
    _, _, stdout = run
    lines = [line for line in stdout.splitlines() if "zero-shot (ema weights)" in line]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    assert "wikitext2 ppl " in lines[0] and "lambada ppl " in lines[0]
    assert "(any order <= " in lines[0] and "% of the time since the last evaluation" in lines[0]
