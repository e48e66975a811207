"""Consolidated checkpoints: the model's config and full weights in a folder, no DeepSpeed.

    FOLDER/model.safetensors   tensors "raw/<parameter>" and "ema/<parameter>" (no "ema/" when
                               trained without EMA); its header's metadata "aogpt" holds the JSON
                               {"format": "aogpt-consolidated", "version": 2,
                                "model_config": {...ModelConfig fields}, "meta": {step, ...}}
    FOLDER/model.json          the same JSON, indented, for people and tools (loading reads the
                               header, so the weights file alone is a complete checkpoint)

safetensors holds tensors and strings only: loading one never unpickles anything, and reads only
the weight set asked for. Version 1, one torch file model.pt {"format", "version": 1,
"model_config", "weights": {"raw", "ema"}, "meta"}, still loads, through torch.load's
weights_only unpickler (tensors and plain containers, nothing executable).

The trainer writes one into every checkpoint tag and into out_dir/final/ (the run folder:
aogpt/run_folder.py, which also names these two files), tools/import_official.py converts the
paper's checkpoints into one, and load_checkpoint turns any of them back into a model.
locate_checkpoint says which file a path means, and provenance is the record of it (file, tag,
step, weights, settings, code) that every output of the commands carries.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from aogpt import UsageError
from aogpt.files import code_version, write_atomic, write_json_atomic
from aogpt.model.config import ModelConfig
from aogpt.model.gpt import AOGPT
from aogpt.run_folder import (
    CONFIG_FILE,
    TAG_PATTERN,
    WEIGHTS_FILE,
    RunFolder,
    named_tag,
)

FORMAT = "aogpt-consolidated"
VERSION = 2
LEGACY_FILE = "model.pt"  # version 1
HEADER_KEY = "aogpt"
WEIGHT_SETS = ("raw", "ema")
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP/DeepSpeed and torch.compile wrappers
TIED_HEAD = "lm_head.weight"  # with tie_embeddings, the same tensor as transformer.wte.weight


def strip_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameter names without the `module.` / `_orig_mod.` prefixes that wrappers add."""
    clean = {}
    for name, tensor in state_dict.items():
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        clean[name] = tensor
    return clean


def save_consolidated(folder: str | os.PathLike, model_config: ModelConfig,
                      raw: dict[str, torch.Tensor], ema: dict[str, torch.Tensor] | None,
                      **meta) -> Path:
    """Writes FOLDER/model.json, then FOLDER/model.safetensors, each atomically (a temp file,
    then a rename): the weights file appears last, complete. Returns its path.

    meta: JSON values (numbers, strings, lists, dicts), e.g. step, tokens_seen, git_sha,
    run_config, source.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, "version": VERSION,
              "model_config": dataclasses.asdict(model_config), "meta": meta}
    text = json.dumps(header, allow_nan=False, default=_plain)
    tensors, storages = {}, set()
    for which, state in (("raw", raw), ("ema", ema)):
        for name, tensor in strip_prefixes(state or {}).items():
            if name == TIED_HEAD and model_config.tie_embeddings:
                continue  # the same tensor as wte's: stored once, tied again when loaded
            tensor = tensor.detach().cpu().contiguous()
            if tensor.untyped_storage().data_ptr() in storages:  # safetensors refuses aliases
                tensor = tensor.clone()
            storages.add(tensor.untyped_storage().data_ptr())
            tensors[f"{which}/{name}"] = tensor
    write_json_atomic(json.loads(text), folder / CONFIG_FILE)
    return write_atomic(folder / WEIGHTS_FILE,
                        lambda partial: save_file(tensors, partial, metadata={HEADER_KEY: text}))


def _plain(value):
    """JSON for the tensors and numpy numbers that metadata read from other files may hold."""
    if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"checkpoint metadata must be JSON values, got {type(value).__name__}")


def copy_consolidated(source: str | os.PathLike, folder: str | os.PathLike) -> None:
    """Copies the checkpoint in folder `source` into `folder`, in save_consolidated's order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        write_atomic(folder / name,
                     lambda partial, name=name: shutil.copyfile(Path(source) / name, partial))


@dataclasses.dataclass(frozen=True)
class CheckpointSource:
    """The weights file a --ckpt path means (see locate_checkpoint) and where it was found.

    tag: "final", a checkpoint tag (step_N), or None for a file or folder outside a run.
    unfinished: `given` is a run folder without final/ (still training, preempted, killed): the
    checkpoint its `latest` names stands in for the finished weights."""

    given: Path
    file: Path
    tag: str | None
    unfinished: bool = False

    def unfinished_note(self) -> str | None:
        """One line saying which checkpoint stands in for an unfinished run's final weights."""
        if not self.unfinished:
            return None
        return (f"note: {self.given} has no final/ (the run has not finished): reading its "
                f"latest checkpoint, {self.tag}")


def locate_checkpoint(path: str | os.PathLike) -> CheckpointSource:
    """The weights file that `path` means: the file itself, DIR/model.safetensors (or a version 1
    DIR/model.pt), the same in OUT_DIR/final/, or, for a run without final/ yet (still training,
    preempted), in the checkpoint `latest` points to. That tag is taken as named, without
    RunFolder.resume_tag's completeness check: a folder of consolidated weights alone (copied,
    or written by save_consolidated) has no complete.json and still loads."""
    path = Path(path)
    run = RunFolder(path)
    folders = [(path, False), (run.final, False)]
    for checkpoints in (run.checkpoints, path):  # an out_dir, or a checkpoints folder itself
        tag = named_tag(checkpoints)
        if tag is not None:
            folders.append((checkpoints / tag, checkpoints == run.checkpoints))
    candidates = [(path, False)] + [(folder / name, unfinished) for folder, unfinished in folders
                                    for name in (WEIGHTS_FILE, LEGACY_FILE)]
    for candidate, unfinished in candidates:
        if candidate.is_file():
            folder = candidate.parent.name
            tag = folder if folder == run.final.name or TAG_PATTERN.match(folder) else None
            return CheckpointSource(path, candidate, tag, unfinished)
    raise UsageError(
        f"no checkpoint at {path}: give a {WEIGHTS_FILE} (or a version 1 {LEGACY_FILE}), a folder "
        f"holding one, or a training out_dir (its final/, else its latest checkpoint)"
    )


def resolve_checkpoint_file(path: str | os.PathLike) -> Path:
    """The weights file that `path` means (see locate_checkpoint)."""
    return locate_checkpoint(path).file


def provenance(source: CheckpointSource | None, weights: str | None, settings: dict,
               **inputs) -> dict:
    """Where an output came from, as every output file of the commands records it: the checkpoint
    file read (not the path given: a run's final/ or latest checkpoint), its tag and the step it
    was saved at, the weights (ema or raw), the command's settings, its other `inputs` (JSON
    values), the code (aogpt_version, git_sha) and the time. source None: no checkpoint of this
    project was read (a Hugging Face judge). The deepspeed launcher's --local_rank is no setting:
    the same run on one process or many records the same settings."""
    settings = {key: value for key, value in settings.items() if key != "local_rank"}
    record = {}
    if source is not None:
        meta = read_consolidated(source.file, weights=())["meta"]
        record = {"checkpoint": str(source.file.resolve()), "tag": source.tag,
                  "step": meta.get("step"), "unfinished_run": source.unfinished,
                  "weights": weights, "data_tokenizers": meta.get("data_tokenizers")}
    return {**record, **inputs, "settings": json.loads(json.dumps(settings, default=str)),
            **code_version(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def describe_provenance(record: dict) -> str:
    """'step_00000004, step 4' for a provenance record: what a command says it read."""
    step = record.get("step")
    parts = [record.get("tag"), None if step is None else f"step {step}"]
    return ", ".join(part for part in parts if part) or "no step recorded"


def read_consolidated(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                      weights: tuple[str, ...] = WEIGHT_SETS) -> dict:
    """A checkpoint of either version (any path form load_checkpoint accepts):
    {"model_config": dict, "meta": dict, "weights": {set: state_dict or None}} for each weight
    set named in `weights` (None: the checkpoint has none, e.g. no EMA). Only those are read."""
    file = resolve_checkpoint_file(path)
    if file.suffix == ".pt":
        return _read_version_1(file, map_location, weights)
    try:
        with safe_open(file, framework="pt", device=str(map_location)) as reader:
            header = json.loads((reader.metadata() or {}).get(HEADER_KEY, "null"))
            _check_header(file, header)
            names = list(reader.keys())
            state = {which: {name.split("/", 1)[1]: reader.get_tensor(name)
                             for name in names if name.startswith(f"{which}/")} or None
                     for which in weights}
    except (SafetensorError, OSError, json.JSONDecodeError) as err:
        raise UsageError(f"{file} is not a readable aogpt checkpoint: "
                         f"{str(err).splitlines()[0]}") from err
    config = model_config_from_dict(header["model_config"])
    for sets in state.values():
        if sets is not None and config.tie_embeddings:
            sets[TIED_HEAD] = sets["transformer.wte.weight"]
    return {"model_config": header["model_config"], "meta": header["meta"], "weights": state}


def _read_version_1(file: Path, map_location, weights: tuple[str, ...]) -> dict:
    try:
        # mmap: only the tensors used are read (the weight set asked for, not the other one)
        ckpt = torch.load(file, map_location=map_location, weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise UsageError(f"{file} is not a readable aogpt checkpoint: "
                         f"{str(err).splitlines()[0]}") from err
    _check_header(file, ckpt, version=1)
    return {"model_config": ckpt["model_config"], "meta": ckpt["meta"],
            "weights": {which: ckpt["weights"].get(which) for which in weights}}


def _check_header(file: Path, header, version: int = VERSION) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise UsageError(
            f"{file} is not an aogpt consolidated checkpoint (format {FORMAT!r} expected); "
            "convert the paper's checkpoints with tools/import_official.py"
        )
    if header.get("version") != version:
        raise UsageError(f"{file} has format version {header.get('version')}, this code reads "
                         f"version {version} from a {file.suffix} file")


def model_config_from_dict(values: dict) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UsageError(f"checkpoint's model_config has fields this code does not know: {unknown}")
    return ModelConfig(**values)


def load_checkpoint(path: str | os.PathLike, weights: Literal["ema", "raw"] = "ema",
                    map_location: str | torch.device = "cpu", attn_impl: str = "auto") -> AOGPT:
    """An AOGPT in eval mode from a weights file, a folder holding one, or an out_dir.

    weights="ema" (the default, as the paper evaluates) or "raw". A checkpoint without EMA
    weights is an error for "ema", never a silent fallback to the raw ones.
    attn_impl: the attention kernel to run with. The one saved in model_config is what training
    ran with, not a property of the weights: a model trained with flash-attn loads on a CPU.
    """
    if weights not in WEIGHT_SETS:
        raise UsageError(f"weights must be 'ema' or 'raw', got {weights!r}")
    ckpt = read_consolidated(path, map_location, weights=(weights,))
    state = ckpt["weights"][weights]
    if state is None:
        raise UsageError(
            f"{resolve_checkpoint_file(path)} holds no EMA weights (trained without EMA): "
            'load it with weights="raw"'
        )
    config = dataclasses.replace(model_config_from_dict(ckpt["model_config"]), attn_impl=attn_impl)
    model = AOGPT.unfilled(config)
    try:
        model.load_state_dict(strip_prefixes(state), strict=True, assign=True)
    except RuntimeError as err:
        raise UsageError(
            f"{resolve_checkpoint_file(path)}: {weights} weights do not fit its model_config: "
            f"{' '.join(str(err).split())}"
        ) from err
    if config.tie_embeddings:  # assign=True gave the head its own Parameter: share wte's again
        model.lm_head.weight = model.transformer.wte.weight
    model.decide_attention_kernel()  # for the device the weights were assigned on, not meta
    return model.eval()
