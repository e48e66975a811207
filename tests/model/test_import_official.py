"""Checkpoints in the paper code's format import into models that compute the same logits."""

import pytest
import torch
from conftest import run_cli, tool

from aogpt import UsageError
from aogpt.model import AOGPT, load_checkpoint, save_consolidated
from aogpt.model.checkpoint import read_consolidated
from aogpt.model.config import ModelConfig
from aogpt.model.official import convert_official, official_parameter_names

ARGS = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, bias=True, vocab_size=50304, dropout=0.0)
IDX = torch.randint(0, 50257, (2, 8), generator=torch.Generator().manual_seed(0))
ORDERS = torch.rand(2, 8, generator=torch.Generator().manual_seed(1)).argsort(1)

import_official = tool("import_official")  # its main, for refusals run in this process


def models() -> tuple[AOGPT, AOGPT]:
    """The raw model and its EMA, as the paper's trainer would hold them."""
    config = ModelConfig(**ARGS, cond_dim=128)
    torch.manual_seed(0)
    raw = AOGPT(config).eval()
    torch.manual_seed(1)
    return raw, AOGPT(config).eval()


def official_checkpoint(raw: AOGPT, ema: AOGPT) -> dict:
    """What the paper's train_AOGPT_CL.py saves: DDP around a compiled model, EMA as a list."""
    return {
        "model": {f"module._orig_mod.{k}": v.clone() for k, v in raw.state_dict().items()},
        "model_args": dict(ARGS),
        "ema_model": {"decay": 0.9999, "num_updates": 250,
                      "shadow_params": [p.detach().clone() for p in ema.parameters()]},
        "ema_rate": 0.9999,
        "optimizer": {"state": {}, "param_groups": []},
        "iter_num": 250,
        "config": {"learning_rate": 6e-4, "train_mode": "Random_CL"},
    }


def test_our_parameter_order_is_the_papers_listing():
    for bias in (True, False):
        with torch.device("meta"):
            model = AOGPT(ModelConfig(**{**ARGS, "bias": bias}))
        assert [n for n, _ in model.named_parameters()] == official_parameter_names(2, bias)


def test_imported_checkpoint_reproduces_the_raw_and_ema_logits(tmp_path):
    raw, ema = models()
    torch.save(official_checkpoint(raw, ema), tmp_path / "ckpt_250.pt")
    result = run_cli("tools/import_official.py", "--ckpt", str(tmp_path / "ckpt_250.pt"),
                     "--out", str(tmp_path / "imported"))
    assert result.returncode == 0, result.stderr
    assert "raw + EMA" in result.stdout and "step 250" in result.stdout
    for weights, reference in (("ema", ema), ("raw", raw)):
        imported = load_checkpoint(tmp_path / "imported", weights=weights)
        torch.testing.assert_close(imported.logits(IDX, ORDERS), reference.logits(IDX, ORDERS),
                                   rtol=0, atol=0)
    meta = read_consolidated(tmp_path / "imported")["meta"]
    assert meta["step"] == 250 and meta["ema_decay"] == 0.9999 and "ckpt_250.pt" in meta["source"]


def test_a_checkpoint_without_ema_imports_raw_weights_only():
    raw, ema = models()
    ckpt = official_checkpoint(raw, ema)
    del ckpt["ema_model"]
    config, state, ema_state, _ = convert_official(ckpt)
    assert ema_state is None and config.cond_dim == 128 and set(state) == set(raw.state_dict())


def broken(change: str) -> dict:
    ckpt = official_checkpoint(*models())
    model = ckpt["model"]
    if change == "missing":
        del model["module._orig_mod.transformer.h.1.attn.q_norm.weight"]
    elif change == "unexpected":
        model["module._orig_mod.transformer.h.0.attn.bias"] = torch.ones(1, 1, 8, 8)
    elif change == "shape":
        model["module._orig_mod.lm_head.bias"] = torch.zeros(50257)
    elif change == "shadow":
        ckpt["ema_model"]["shadow_params"].pop()
    elif change == "shadow_shape":
        ckpt["ema_model"]["shadow_params"][1] = torch.zeros(3, 16)
    elif change == "args":
        del ckpt["model_args"]["n_head"]
    return ckpt


@pytest.mark.parametrize("change, message", [
    ("missing", "missing keys: transformer.h.1.attn.q_norm.weight"),
    ("unexpected", "unexpected keys: transformer.h.0.attn.bias"),
    ("shape", r"lm_head.bias \(50257,\) \(expected \(50304,\)\)"),
    ("shadow", "shadow_params has 36 tensors, the model has 37"),
    ("shadow_shape", r"transformer.wpe.weight \(3, 16\)"),
    ("args", r"model_args lacks \['n_head'\]"),
])
def test_a_checkpoint_that_does_not_fit_names_what_is_wrong(change, message):
    with pytest.raises(UsageError, match=message):
        convert_official(broken(change))


def test_the_cli_reports_a_bad_checkpoint_in_one_line(run_main, tmp_path):
    torch.save(broken("shadow"), tmp_path / "bad.pt")
    # the command's one refusal as a real process, as a user meets it
    result = run_cli("tools/import_official.py", "--ckpt", str(tmp_path / "bad.pt"),
                     "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    code, _, err = run_main(import_official.main, "--ckpt", tmp_path / "absent.pt", "--out", "x")
    assert code == 2 and "does not exist" in err


def test_a_text_file_or_a_folder_is_named_for_what_it_is(run_main, tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    expected = "the ckpt_<iter>.pt file that the paper's training script saved"
    for ckpt, line in (
        (tmp_path / "notes.txt", f"error: {tmp_path / 'notes.txt'} is not a PyTorch checkpoint of "
                                 f"the paper's code (not the zip archive torch.save writes): give "
                                 f"{expected}"),
        (tmp_path, f"error: --ckpt {tmp_path} is a folder, not a file: give {expected}"),
    ):
        code, _, err = run_main(import_official.main, "--ckpt", ckpt, "--out", tmp_path / "out")
        assert code == 2 and err.splitlines() == [line]
    assert not (tmp_path / "out").exists()


def test_the_checkpoint_files_of_out_are_replaced_only_with_force_and_a_run_never(run_main,
                                                                                   tmp_path):
    torch.save(official_checkpoint(*models()), tmp_path / "ckpt_250.pt")
    out = tmp_path / "imported"
    argv = ["--ckpt", str(tmp_path / "ckpt_250.pt"), "--out", str(out)]
    assert run_cli("tools/import_official.py", *argv).returncode == 0
    weights = (out / "model.safetensors").read_bytes()
    code, _, err = run_main(import_official.main, *argv)
    assert code == 2 and err.splitlines() == [
        f"error: --out {out / 'model.json'} holds an earlier converted checkpoint of "
        "tools/import_official.py: pass --force to replace it, or choose another name"]
    assert run_cli("tools/import_official.py", *argv, "--force").returncode == 0
    assert (out / "model.safetensors").read_bytes() == weights  # the same conversion again
    best = tmp_path / "best"  # a training's checkpoint copied there: never replaced
    save_consolidated(best, AOGPT(ModelConfig(**ARGS)).config, {}, None, step=250,
                      source="aogpt trainer")
    code, _, err = run_main(import_official.main, *argv[:-1], best, "--force")
    assert code == 2 and err.splitlines() == [
        f"error: --out {best / 'model.json'} is a file that tools/import_official.py did not "
        "write: choose another name (--force replaces only an earlier converted checkpoint of "
        "tools/import_official.py)"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    code, _, err = run_main(import_official.main, *argv[:-1], tmp_path / "run")
    assert code == 2 and err.splitlines() == [
        f"error: --out {tmp_path / 'run'} is a training run (it holds metrics.jsonl): give a new "
        "folder for the converted checkpoint"]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["metrics.jsonl"]
