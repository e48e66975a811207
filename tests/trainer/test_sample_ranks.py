"""Sampling and judging spread over the processes of a launch (trainer/ranks.py): two CPU
processes under torchrun write the one-process run's samples and report, record for record
(each batch's own seconds aside)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO
from test_synthetic_judge import VOCAB, build, model_of

from aogpt.data_prep.manifest import read_manifest
from aogpt.trainer import genppl, sample

pytestmark = pytest.mark.slow  # two torchrun launches of 2 processes: ~15 s of CPU

# 7 samples in batches of 2: 4 batches, the last one short; rank 0 draws batches 0 and 2
SAMPLING = ["--weights", "raw", "--num-samples", "7", "--batch-size", "2", "--sampler",
            "speculative", "--draft", "3", "--tree", "2", "--show", "0"]


def torchrun(command: str, *args) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         command, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    language = build(root / "language", seed=0)
    return model_of(root / "model", read_manifest(language)["tokenizer"]), language


def records(text: str) -> list[dict]:
    """A sample file's records without what differs between any two runs: each batch's seconds
    and the time the run began."""
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        del line["time_s"]
        del line["provenance"]["created"]
    return lines


def taken(path) -> str:
    """The file's text, the file removed: the next run writes the same path (which the commands
    record among their flags)."""
    text = path.read_text()
    path.unlink()
    return text


def test_two_processes_write_the_one_process_samples(model, tmp_path, run_main):
    checkpoint, _ = model
    out = tmp_path / "samples.jsonl"
    code, _, err = run_main(sample.main, "--ckpt", checkpoint, *SAMPLING, "--out", out)
    assert code == 0, err
    one = records(taken(out))
    launched = torchrun("trainer/sample.py", "--ckpt", checkpoint, *SAMPLING, "--out", out)
    assert "on 2 processes" in launched.stdout
    two = records(taken(out))
    assert [r["sample"] for r in two] == list(range(7))
    assert json.dumps(two) == json.dumps(one)  # byte for byte, key order included


def test_two_processes_judge_to_the_one_process_report(model, tmp_path, run_main):
    checkpoint, language = model
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"tokens": [(7 * i + 3 * k) % VOCAB for k in
                                                      range(4 + i % 3)]}) + "\n"
                               for i in range(9)))  # three lengths: batches of each
    flags = ["--samples", samples, "--judge", language, "--batch-size", "2"]
    out = tmp_path / "report.json"
    code, _, err = run_main(genppl.main, *flags, "--json", out)
    assert code == 0, err
    one = json.loads(taken(out))
    torchrun("trainer/genppl.py", *flags, "--json", out)
    two = json.loads(taken(out))
    for report in (one, two):
        del report["provenance"]["created"]
    assert json.dumps(two) == json.dumps(one)
