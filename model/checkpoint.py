"""Consolidated checkpoints: one torch file with the model config and full weights, no DeepSpeed.

    {"format": "aogpt-consolidated", "version": 1, "model_config": {...ModelConfig fields},
     "weights": {"raw": state_dict, "ema": state_dict | None}, "meta": {step, tokens_seen, ...}}

The trainer writes one as out_dir/final/model.pt, tools/import_official.py converts the paper's
checkpoints into one, and load_checkpoint turns any of them back into a model.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from typing import Literal

import torch

from aogpt import UsageError
from aogpt.model.config import ModelConfig
from aogpt.model.gpt import AOGPT

FORMAT = "aogpt-consolidated"
VERSION = 1
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP/DeepSpeed and torch.compile wrappers


def strip_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameter names without the `module.` / `_orig_mod.` prefixes that wrappers add."""
    clean = {}
    for name, tensor in state_dict.items():
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        clean[name] = tensor
    return clean


def save_consolidated(path: str | os.PathLike, model_config: ModelConfig,
                      raw: dict[str, torch.Tensor], ema: dict[str, torch.Tensor] | None,
                      **meta) -> None:
    """Writes the consolidated checkpoint atomically (temp file, then rename).

    meta: plain Python values (numbers, strings, lists, dicts), e.g. step, tokens_seen, git_sha,
    run_config, source; they are loaded back with torch.load(weights_only=True).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_config": dataclasses.asdict(model_config),
        "weights": {"raw": _to_cpu(raw), "ema": None if ema is None else _to_cpu(ema)},
        "meta": meta,
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _to_cpu(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu() for name, tensor in strip_prefixes(state_dict).items()}


def resolve_checkpoint_file(path: str | os.PathLike) -> Path:
    """The model.pt that `path` means: the file itself, DIR/model.pt, OUT_DIR/final/model.pt, or,
    for a run without final/ yet (still training, preempted), the checkpoint `latest` points to."""
    path = Path(path)
    candidates = [path, path / "model.pt", path / "final" / "model.pt"]
    for checkpoints in (path / "checkpoints", path):
        latest = checkpoints / "latest"  # DeepSpeed's pointer: the newest complete tag's name
        if latest.is_file():
            candidates.append(checkpoints / latest.read_text().strip() / "model.pt")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise UsageError(
        f"no checkpoint at {path}: give a consolidated model.pt, a folder holding model.pt, "
        "or a training out_dir (final/model.pt, else its latest checkpoint)"
    )


def read_consolidated(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Loads and checks a consolidated checkpoint file (any form load_checkpoint accepts)."""
    file = resolve_checkpoint_file(path)
    try:
        # mmap: only the tensors used are read (the weight set asked for, not the other one)
        ckpt = torch.load(file, map_location=map_location, weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise UsageError(f"{file} is not a readable aogpt checkpoint: {str(err).splitlines()[0]}") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UsageError(
            f"{file} is not an aogpt consolidated checkpoint (format {FORMAT!r} expected); "
            "convert the paper's checkpoints with tools/import_official.py"
        )
    if ckpt.get("version") != VERSION:
        raise UsageError(f"{file} has format version {ckpt.get('version')}, this code reads {VERSION}")
    return ckpt


def model_config_from_dict(values: dict) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UsageError(f"checkpoint's model_config has fields this code does not know: {unknown}")
    return ModelConfig(**values)


def load_checkpoint(path: str | os.PathLike, weights: Literal["ema", "raw"] = "ema",
                    map_location: str | torch.device = "cpu", attn_impl: str = "auto") -> AOGPT:
    """An AOGPT in eval mode from a consolidated file, a folder holding model.pt, or an out_dir.

    weights="ema" (the default, as the paper evaluates) or "raw". A checkpoint without EMA
    weights is an error for "ema", never a silent fallback to the raw ones.
    attn_impl: the attention kernel to run with. The one saved in model_config is what training
    ran with, not a property of the weights: a model trained with flash-attn loads on a CPU.
    """
    if weights not in ("ema", "raw"):
        raise UsageError(f"weights must be 'ema' or 'raw', got {weights!r}")
    ckpt = read_consolidated(path, map_location)
    state = ckpt["weights"].get(weights)
    if state is None:
        raise UsageError(
            f"{resolve_checkpoint_file(path)} holds no EMA weights (trained without EMA): "
            'load it with weights="raw"'
        )
    config = dataclasses.replace(model_config_from_dict(ckpt["model_config"]), attn_impl=attn_impl)
    with torch.device("meta"):  # no time spent initializing weights that are overwritten
        model = AOGPT(config)
    try:
        model.load_state_dict(strip_prefixes(state), strict=True, assign=True)
    except RuntimeError as err:
        raise UsageError(
            f"{resolve_checkpoint_file(path)}: {weights} weights do not fit its model_config: "
            f"{' '.join(str(err).split())}"
        ) from err
    if config.tie_embeddings:  # assign=True gave the head its own Parameter: share wte's again
        model.lm_head.weight = model.transformer.wte.weight
    return model.eval()
