"""Reading checkpoints of the paper's own code (github.com/scxue/AO-GPT-MDM) into this project.

Its training script saves a torch dict with `model` (a state dict, maybe behind `module.` or
`_orig_mod.` prefixes), `model_args` (n_layer, n_head, n_embd, block_size, bias, vocab_size,
dropout), `ema_model` = {decay, num_updates, shadow_params: a list of tensors in the order of
model.parameters(), with no names}, plus optimizer, iter_num and config. This module's network
uses the paper's parameter names, so the raw weights map one to one; the EMA list is named by
the paper's parameter order, written out below.
"""

from __future__ import annotations

import os
import pickle
import zipfile

import torch

from aogpt import UsageError, check_input_file
from aogpt.model.checkpoint import strip_prefixes
from aogpt.model.config import ModelConfig
from aogpt.model.gpt import AOGPT

EXPECTED = "the ckpt_<iter>.pt file that the paper's training script saved"
MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def official_parameter_names(n_layer: int, bias: bool = True) -> list[str]:
    """The paper model's parameters in model.parameters() order: the order of its EMA list."""

    def linear(name: str) -> list[str]:
        return [f"{name}.weight"] + ([f"{name}.bias"] if bias else [])

    names = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.wtpe.weight",
             "transformer.wnonee.weight"]
    for i in range(n_layer):
        block = f"transformer.h.{i}"
        names += [f"{block}.ln_1.weight", *linear(f"{block}.attn.c_attn"),
                  *linear(f"{block}.attn.c_proj"), f"{block}.attn.q_norm.weight",
                  f"{block}.attn.k_norm.weight", f"{block}.ln_2.weight",
                  *linear(f"{block}.mlp.c_fc"), *linear(f"{block}.mlp.c_proj"),
                  f"{block}.adaLN.1.weight", f"{block}.adaLN.1.bias"]
    # the adaLN linears and lm_head always have a bias, whatever model_args.bias says
    return names + ["transformer.final_layer.ln_f.weight",
                    "transformer.final_layer.adaLN_final.1.weight",
                    "transformer.final_layer.adaLN_final.1.bias",
                    "lm_head.weight", "lm_head.bias"]


def load_official(path: str | os.PathLike, trust_pickle: bool = False) -> dict:
    """torch.load of a checkpoint file of the paper's code, tensors only unless trusted."""
    path = check_input_file(path, "--ckpt", EXPECTED)
    if not zipfile.is_zipfile(path):  # torch.save's format since torch 1.6, which the paper used
        raise UsageError(f"{path} is not a PyTorch checkpoint of the paper's code (not the zip "
                         f"archive torch.save writes): give {EXPECTED}")
    try:
        # mmap: the optimizer state, often most of the file, is never read
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle, mmap=True)
    except pickle.UnpicklingError as err:
        raise UsageError(
            f"{path} holds Python objects beyond tensors and plain values: if you trust the file, "
            "re-run with --trust-pickle"
        ) from err
    except (RuntimeError, EOFError) as err:
        raise UsageError(f"{path} is not a readable torch checkpoint: "
                         f"{str(err).splitlines()[0]}") from err


def config_from_official(model_args: dict, state: dict[str, torch.Tensor]) -> ModelConfig:
    """The AO-GPT config that the paper's `model_args` describe (cond_dim read off wtpe)."""
    missing = [k for k in MODEL_ARGS if k not in model_args]
    if missing:
        raise UsageError(f"the checkpoint's model_args lacks {missing}: "
                         "is it an AO-GPT checkpoint?")
    wtpe = state.get("transformer.wtpe.weight")
    return ModelConfig(**{k: model_args[k] for k in MODEL_ARGS},
                       cond_dim=wtpe.shape[1] if wtpe is not None else 128)


def _check_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Size]) -> None:
    missing = [n for n in expected if n not in state]
    unexpected = [n for n in state if n not in expected]
    mismatched = [f"{n} {tuple(state[n].shape)} (expected {tuple(shape)})"
                  for n, shape in expected.items() if n in state and state[n].shape != shape]
    problems = [f"{label}: {', '.join(items)}" for label, items in
                (("missing keys", missing), ("unexpected keys", unexpected),
                 ("mismatched shapes", mismatched)) if items]
    if problems:
        raise UsageError(f"the checkpoint's model does not match AO-GPT with its model_args; "
                         f"{'; '.join(problems)}")


def convert_official(ckpt: dict, source: str = "") -> tuple[ModelConfig, dict, dict | None, dict]:
    """(config, raw state dict, EMA state dict or None, meta) from a loaded official checkpoint."""
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UsageError("not a checkpoint of the paper's code: "
                         "it needs the keys 'model' and 'model_args'")
    state = strip_prefixes(ckpt["model"])
    config = config_from_official(ckpt["model_args"], state)
    expected = {n: p.shape for n, p in AOGPT.unfilled(config).named_parameters()}
    names = official_parameter_names(config.n_layer, config.bias)
    assert list(expected) == names, "AOGPT's parameters no longer follow the paper's names/order"
    _check_state(state, expected)
    raw = {n: state[n] for n in names}

    ema, meta = None, {"source": source, "step": ckpt.get("iter_num"),
                       "official_config": ckpt.get("config")}
    if ckpt.get("ema_model") is not None:
        shadow = list(ckpt["ema_model"]["shadow_params"])
        if len(shadow) != len(names):
            raise UsageError(f"ema_model.shadow_params has {len(shadow)} tensors, the model has "
                             f"{len(names)} parameters: the EMA belongs to another model")
        ema = dict(zip(names, shadow, strict=True))
        mismatched = [f"#{i} {n} {tuple(ema[n].shape)} (expected {tuple(expected[n])})"
                      for i, n in enumerate(names) if ema[n].shape != expected[n]]
        if mismatched:
            raise UsageError(f"ema_model.shadow_params mismatched shapes: {', '.join(mismatched)}")
        meta["ema_decay"] = ckpt["ema_model"].get("decay")
        meta["ema_num_updates"] = ckpt["ema_model"].get("num_updates")
    return config, raw, ema, meta
