"""experiments/run.py end to end in miniature: train, evaluate, time, report; a re-run resumes."""

import json
import math

import pytest
from conftest import run_cli
from findings_testing import build_mini_data
from report import load_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MINIATURE = ["--only", "l2r,mixture10", "--seeds", "1337", "--steps", "2",
             "--set", "optim.warmup_steps=1", "--set", "train.tokens_per_step=1024",
             "--set", "train.log_every=1", "--eval-samples", "4", "--speed-steps", "2,4"]


@pytest.mark.slow
def test_suite_trains_evaluates_reports_and_a_rerun_only_redoes_what_is_missing(tmp_path):
    data = build_mini_data(tmp_path / "data")
    out = tmp_path / "findings"
    suite = ["experiments/run.py", "--suite", "findings", "--out", str(out), "--data", str(data)]
    result = run_cli(*suite, *MINIATURE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "jobs to run: 6 (0 done already)" in result.stdout

    record = json.loads((out / "suite.json").read_text())
    assert list(record["runs"]) == ["l2r-s1337", "mixture10-s1337"]
    for run in record["runs"].values():
        assert run["done"] and run["wall_s"] > 0 and run["config"]["train"]["max_steps"] == 2
        steps = [json.loads(line)["step"] for line in open(f"{run['out_dir']}/metrics.jsonl")]
        assert steps == [1, 2]
    assert record["seeds"] == [1337] and record["hardware"]["cores"] >= 1
    assert record["git_commit"] and record["wall_s"] > 0
    ensemble = json.loads((out / "evals" / "mixture10-s1337.ensemble.json").read_text())
    assert list(ensemble["results"][0]["ensemble"]["by_members"]) == ["1", "2", "4", "8", "16"]
    speed = json.loads((out / "speed.json").read_text())
    assert [row["steps"] for row in speed["results"]] == [2, 4]
    report = (out / "report.md").read_text()
    assert "## Finding 5: Context-order ensembles lower the perplexity" in report
    assert "Not run: needs the arm(s) uniform." in report  # Finding 1 without its other arm
    for figure in ("finding5.png", "sampling_speed.png"):
        assert (out / figure).read_bytes().startswith(PNG_MAGIC)
    assert "finding 5" in result.stdout and "report: " in result.stdout
    # the context-free reference is on the held-out samples evaluated: above a trained model's
    # ceiling of log(vocab) it cannot be, below the 2-step models it should be
    results = load_results(out)
    unigram = results.unigram_nll
    assert unigram < math.log(50257) and unigram < results.evals["l2r-s1337"]["l2r"]["nll"]

    # finished runs are not trained again; a missing evaluation is redone, and so is one made
    # before the suite scored the unigram reference with each evaluation
    (out / "evals" / "l2r-s1337.json").unlink()
    without_unigram = out / "evals" / "mixture10-s1337.json"
    payload = json.loads(without_unigram.read_text())
    del payload["results"][0]["unigram"]
    without_unigram.write_text(json.dumps(payload))
    again = run_cli(*suite, *MINIATURE)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "jobs to run: 2 (4 done already)" in again.stdout
    assert (out / "evals" / "l2r-s1337.json").is_file()
    assert "unigram" in json.loads(without_unigram.read_text())["results"][0]
    assert (out / "runs" / "l2r-s1337" / "train.log").read_text().count("\n$ ") == 1

    # other settings into the same folder would mix two experiments: refused
    changed = run_cli(*suite, *MINIATURE, "--steps", "3")
    assert changed.returncode == 2
    assert "was started with other settings (optim.decay_steps=2, optim.decay_steps=3" in (
        changed.stderr)
    # data packed for another sequence length: refused before any run starts
    other_length = run_cli(*suite, *MINIATURE, "--set", "model.block_size=32")
    assert other_length.returncode == 2
    assert ("holds sequences of 64 tokens, the runs' model.block_size is 32: pack the data with "
            "--seq-len 32, or add --set model.block_size=64") in other_length.stderr

    # published: the report's inputs (no weights, data or logs) copied elsewhere rebuild the
    # same report byte for byte
    published = tmp_path / "published"
    result = run_cli("experiments/run.py", "--report-only", "--out", str(out),
                     "--publish", str(published))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (published / "report.md").read_bytes() == (out / "report.md").read_bytes()
    files = sorted(str(p.relative_to(published)) for p in published.rglob("*") if p.is_file())
    assert "runs/l2r-s1337/metrics.jsonl" in files
    assert "evals/mixture10-s1337.ensemble.json" in files
    assert not [f for f in files if f.endswith((".safetensors", ".log", ".mds", ".pt"))]
    (published / "report.md").unlink()
    rebuilt = run_cli("experiments/run.py", "--report-only", "--out", str(published))
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert (published / "report.md").read_bytes() == (out / "report.md").read_bytes()
    written = (out / "report.md").stat().st_mtime_ns
    refused = run_cli("experiments/run.py", "--report-only", "--out", str(out),
                      "--publish", str(out))
    assert refused.returncode == 2 and "is --out itself" in refused.stderr
    assert (out / "report.md").stat().st_mtime_ns == written  # refused before writing anything
