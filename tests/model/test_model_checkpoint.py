"""Consolidated checkpoints round-trip from every path form, with EMA or raw weights."""

import dataclasses
import json
import os
import pickle
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from aogpt import UsageError
from aogpt.model import AOGPT, load_checkpoint, save_consolidated
from aogpt.model.checkpoint import locate_checkpoint, provenance, read_consolidated
from aogpt.model.config import ModelConfig, sigma_gpt


def tiny_config() -> ModelConfig:
    return ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, cond_dim=4)


def two_weight_sets(config: ModelConfig):
    torch.manual_seed(0)
    raw = AOGPT(config)
    torch.manual_seed(1)
    ema = AOGPT(config)
    return raw, ema


IDX = torch.randint(0, 50257, (2, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("form", ["file", "folder", "out_dir"])
def test_load_checkpoint_reads_every_path_form(tmp_path, form):
    config = tiny_config()
    raw, ema = two_weight_sets(config)
    save_consolidated(tmp_path / "final", config, raw.state_dict(), ema.state_dict(),
                      step=5, tokens_seen=40, source="test")
    path = {"file": tmp_path / "final" / "model.safetensors", "folder": tmp_path / "final",
            "out_dir": tmp_path}[form]
    loaded = load_checkpoint(path)
    assert not loaded.training and loaded.config == config
    torch.testing.assert_close(loaded(IDX), ema.eval()(IDX))
    torch.testing.assert_close(load_checkpoint(path, weights="raw")(IDX), raw.eval()(IDX))


def test_a_run_without_final_loads_its_latest_checkpoint(tmp_path):
    config = tiny_config()
    old, new = two_weight_sets(config)
    for tag, weights in (("step_00000004", old), ("step_00000008", new)):
        save_consolidated(tmp_path / "checkpoints" / tag, config, weights.state_dict(), None)
    (tmp_path / "checkpoints" / "latest").write_text("step_00000008")
    for path in (tmp_path, tmp_path / "checkpoints"):
        torch.testing.assert_close(load_checkpoint(path, weights="raw")(IDX), new.eval()(IDX))


def test_checkpoint_folder_holds_the_documented_layout(tmp_path):
    config = tiny_config()
    raw, ema = two_weight_sets(config)
    save_consolidated(tmp_path, config, raw.state_dict(), ema.state_dict(), step=3,
                      git_sha="abc", loss=torch.tensor(2.5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    for path in tmp_path.iterdir():  # as any file its user writes (safetensors alone: 0600)
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    with safe_open(tmp_path / "model.safetensors", framework="pt") as reader:
        header = json.loads(reader.metadata()["aogpt"])
        names = set(reader.keys())
        torch.testing.assert_close(reader.get_tensor("ema/lm_head.bias"), ema.lm_head.bias,
                                   rtol=0, atol=0)
    assert (header["format"], header["version"]) == ("aogpt-consolidated", 2)
    assert header["model_config"] == dataclasses.asdict(config)
    assert header["meta"] == {"step": 3, "git_sha": "abc", "loss": 2.5}  # tensors as numbers
    assert json.loads((tmp_path / "model.json").read_text()) == header
    assert names == {f"{which}/{name}" for which in ("raw", "ema") for name in raw.state_dict()}
    ckpt = read_consolidated(tmp_path, weights=("raw",))
    assert list(ckpt["weights"]) == ["raw"]  # only the set asked for is read


def test_loading_never_unpickles(tmp_path, monkeypatch):
    config = tiny_config()
    raw, ema = two_weight_sets(config)
    save_consolidated(tmp_path, config, raw.state_dict(), ema.state_dict())

    def refuse(*args, **kwargs):
        raise AssertionError("a weights file was unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    torch.testing.assert_close(load_checkpoint(tmp_path)(IDX), ema.eval()(IDX))


def test_a_version_1_torch_file_still_loads(tmp_path):
    config = tiny_config()
    raw, ema = two_weight_sets(config)
    torch.save({"format": "aogpt-consolidated", "version": 1,
                "model_config": dataclasses.asdict(config),
                "weights": {"raw": raw.state_dict(), "ema": ema.state_dict()},
                "meta": {"step": 7}}, tmp_path / "model.pt")
    torch.testing.assert_close(load_checkpoint(tmp_path)(IDX), ema.eval()(IDX))
    torch.testing.assert_close(load_checkpoint(tmp_path / "model.pt", weights="raw")(IDX),
                               raw.eval()(IDX))
    assert read_consolidated(tmp_path)["meta"] == {"step": 7}


def test_a_checkpoint_trained_with_flash_attn_loads_on_a_cpu_without_it(tmp_path):
    """The kernel is a runtime choice: the saved attn_impl never stops a model from loading."""
    trained = dataclasses.replace(tiny_config(), attn_impl="flash_attn")
    raw, _ = two_weight_sets(tiny_config())  # the same weights, on a kernel that runs here
    save_consolidated(tmp_path, trained, raw.state_dict(), None)
    saved = read_consolidated(tmp_path)["model_config"]
    assert saved["attn_impl"] == "flash_attn"
    expected = raw.float().eval()(IDX)
    loaded = load_checkpoint(tmp_path, weights="raw")
    assert loaded.config.attn_impl == "auto"
    assert next(loaded.parameters()).dtype == torch.float32
    torch.testing.assert_close(loaded(IDX), expected)
    chosen = load_checkpoint(tmp_path, weights="raw", attn_impl="math")
    assert chosen.config.attn_impl == "math"
    torch.testing.assert_close(chosen(IDX), expected)


def test_asking_for_ema_weights_that_are_absent_says_to_use_raw(tmp_path):
    config = tiny_config()
    raw, _ = two_weight_sets(config)
    save_consolidated(tmp_path, config, raw.state_dict(), None)
    with pytest.raises(UsageError, match='weights="raw"'):
        load_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path, weights="raw") is not None


def test_wrapper_prefixes_in_saved_weights_are_stripped(tmp_path):
    config = tiny_config()
    raw, _ = two_weight_sets(config)
    prefixed = {f"module._orig_mod.{k}": v for k, v in raw.state_dict().items()}
    save_consolidated(tmp_path, config, prefixed, None)
    torch.testing.assert_close(load_checkpoint(tmp_path, weights="raw")(IDX), raw.eval()(IDX))


def test_a_tied_head_stays_tied_after_loading(tmp_path):
    config = sigma_gpt(tiny_config())
    raw, ema = two_weight_sets(config)
    save_consolidated(tmp_path, config, raw.state_dict(), ema.state_dict())
    with safe_open(tmp_path / "model.safetensors", framework="pt") as reader:
        assert "ema/lm_head.weight" not in reader.keys()  # stored once, as the embedding
    loaded = load_checkpoint(tmp_path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert loaded.num_params() == ema.num_params()
    torch.testing.assert_close(loaded(IDX), ema.eval()(IDX))


def test_missing_or_foreign_files_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nowhere")
    torch.save({"model": {}}, tmp_path / "model.pt")
    with pytest.raises(UsageError, match="import_official"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.pt").write_text("not torch")
    with pytest.raises(UsageError, match="not a readable"):
        load_checkpoint(tmp_path)
    foreign = tmp_path / "hub"
    foreign.mkdir()
    save_file({"wte": torch.zeros(2)}, foreign / "model.safetensors")  # no aogpt header
    with pytest.raises(UsageError, match="import_official"):
        load_checkpoint(foreign)
    (foreign / "model.safetensors").write_bytes(b"\x08" + bytes(20))  # truncated header
    with pytest.raises(UsageError, match="not a readable"):
        load_checkpoint(foreign)
    with pytest.raises(UsageError, match="'ema' or 'raw'"):
        load_checkpoint(tmp_path, weights="best")


def test_weights_that_do_not_fit_the_config_are_a_usage_error(tmp_path):
    config = tiny_config()
    raw, _ = two_weight_sets(config)
    state = raw.state_dict()
    del state["lm_head.bias"]
    save_consolidated(tmp_path, config, state, None)
    with pytest.raises(UsageError, match="lm_head.bias"):
        load_checkpoint(tmp_path, weights="raw")


def test_locate_checkpoint_says_which_tag_it_read_and_whether_the_run_had_finished(tmp_path):
    config = tiny_config()
    raw, _ = two_weight_sets(config)
    save_consolidated(tmp_path / "checkpoints" / "step_00000004", config, raw.state_dict(), None)
    (tmp_path / "checkpoints" / "latest").write_text("step_00000004")
    tag_file = tmp_path / "checkpoints" / "step_00000004" / "model.safetensors"
    source = locate_checkpoint(tmp_path)  # no final/ yet: the run has not finished
    assert (source.file, source.tag, source.unfinished) == (tag_file, "step_00000004", True)
    assert source.unfinished_note() == (f"note: {tmp_path} has no final/ (the run has not "
                                        "finished): reading its latest checkpoint, step_00000004")
    for path in (tmp_path / "checkpoints", tag_file):  # asked for by name: no note
        assert (locate_checkpoint(path).tag, locate_checkpoint(path).unfinished_note()) == (
            "step_00000004", None)
    save_consolidated(tmp_path / "final", config, raw.state_dict(), None)
    source = locate_checkpoint(tmp_path)
    assert (source.file, source.tag, source.unfinished) == (
        tmp_path / "final" / "model.safetensors", "final", False)


def test_provenance_names_the_file_read_its_step_the_weights_settings_and_code(tmp_path):
    config = tiny_config()
    raw, ema = two_weight_sets(config)
    save_consolidated(tmp_path / "final", config, raw.state_dict(), ema.state_dict(), step=7)
    record = provenance(locate_checkpoint(tmp_path), "ema", {"out": tmp_path / "x.json"},
                        data=["wikitext2"])
    assert record["checkpoint"] == str((tmp_path / "final" / "model.safetensors").resolve())
    assert (record["tag"], record["step"], record["weights"], record["unfinished_run"]) == (
        "final", 7, "ema", False)
    assert record["settings"] == {"out": str(tmp_path / "x.json")}  # JSON values only
    assert record["data"] == ["wikitext2"] and record["aogpt_version"] and record["created"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", record["git_sha"])
    json.dumps(record, allow_nan=False)  # as the commands write it
