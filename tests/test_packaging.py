"""The package installs as aogpt.* and the repo's scripts run from the repository root."""

import importlib

from conftest import run_cli


def test_installed_under_the_aogpt_namespace():
    for name in ("aogpt.model", "aogpt.trainer", "aogpt.data_prep"):
        assert importlib.import_module(name).__name__ == name
    assert importlib.util.find_spec("model") is None or "aogpt" not in str(
        importlib.util.find_spec("model").origin)


def test_streaming_imports_without_torchvision():
    from aogpt.data_prep.streaming_compat import streaming

    assert hasattr(streaming, "StreamingDataset") and hasattr(streaming, "MDSWriter")


def test_demo_runs_what_exists():
    result = run_cli("tools/demo.py")
    assert result.returncode == 0, result.stderr
    assert "tokenizer: gpt2, 50257 tokens" in result.stdout
