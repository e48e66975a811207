"""configs/synthetic.yaml trains a tiny AO-GPT of the synthetic language on the CPU, and the
language judges its samples while it trains (a short run of the preset: the real trainer)."""

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_cli
from trainer_testing import MAIN

from aogpt.trainer.metrics import read_metrics


@pytest.mark.slow
def test_the_synthetic_preset_leaves_the_unigram_plateau_and_its_samples_are_judged(tmp_path):
    data = tmp_path / "synthetic"
    built = run_cli("data_prep/synthetic_to_mds.py", "--out", str(data), "--train-samples", "3000",
                    "--val-samples", "64")
    assert built.returncode == 0, built.stderr
    entropy = json.loads((data / "manifest.json").read_text())["entropy_per_token"]
    out = tmp_path / "run"
    steps = 80
    done = subprocess.run(
        [sys.executable, MAIN, "--ds_config", "ds_configs/cpu.json", "--config",
         "configs/synthetic.yaml", f"data.path={data}", f"out_dir={out}",
         f"train.max_steps={steps}", f"optim.decay_steps={steps}", "order.schedule_steps=40",
         "eval.every=40", f"checkpoint.every={steps}", "data.num_workers=1",
         f"eval.sample_every={steps}", "eval.sample_count=8", f"eval.judge={data}",
         "eval.sample_sampler=speculative"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    last = records[steps]
    # a model of the token frequencies alone scores ~log(128) = 4.85 nats in any order; this
    # short run is well below it (the full recipe ends within a few percent of the entropy)
    assert last["val_loss_l2r"] < 3.2 and last["val_loss_ao"] < 3.8
    assert last["val_loss_ao"] < records[40]["val_loss_ao"] and last["val_loss_ao"] > entropy
    # its samples, judged by the language: an exact NLL above the entropy, by a finite gap
    assert math.isfinite(last["sample_true_nll"]) and last["sample_true_nll"] > 0
    assert last["sample_true_nll_gap"] == pytest.approx(last["sample_true_nll"] - entropy,
                                                        abs=5e-3)
