"""A training run's configuration: typed dataclasses loaded from YAML presets plus dotted overrides.

    cfg = load_config("configs/ao_gpt_small.yaml",
                      ["train.max_steps=100", "order.p_left_to_right=0"])

A preset may start from another with `base: other.yaml` (a path relative to the preset). Every
value is type-checked and unknown keys are rejected with the closest valid name. The rules on the
values are checked by `RunConfig.validate` before any heavy work starts: each section validates
its own fields (its `validate`), RunConfig.validate adds only the rules between sections (the
batch arithmetic, what the model's sequence and reading order allow).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from aogpt import UsageError, check_input_file
from aogpt.files import write_text_atomic
from aogpt.model.config import ModelConfig
from aogpt.model.orders import LEFT_TO_RIGHT, OrderConfig
from aogpt.model.precision import training_precision
from aogpt.model.sampler.ways import DEFAULT_SAMPLER, SAMPLERS, WAYS


def require_positive(section, prefix: str, names: tuple[str, ...]) -> None:
    """UsageError naming the first of the config section's fields `names` that is not above 0
    (`prefix`: the section's key, "train")."""
    for name in names:
        if getattr(section, name) <= 0:
            raise UsageError(f"{prefix}.{name} must be positive, got {getattr(section, name)}")


@dataclass
class StreamConfig:
    """One MDS dataset mixed into training (see DataConfig.streams)."""

    path: str = ""
    proportion: float | None = None  # share of each epoch; None splits what is left evenly


@dataclass
class DataConfig:
    # A folder made by data_prep/owt_to_mds.py (holding train/ and val/), or a remote URL.
    path: str = ""
    # Several datasets mixed by proportion; when given, `path` is not used for training.
    streams: list[StreamConfig] = field(default_factory=list)
    # Where shards of a remote dataset are cached on each node (default: under out_dir). Set it
    # for a local path too to copy the shards from a shared filesystem to node-local disk.
    local_cache: str | None = None
    shuffle_algo: Literal["py1e", "py1br", "py1s", "py2s", "naive"] = "py1e"
    # Fixes the sample order independently of the node count; keep it constant across resumes.
    num_canonical_nodes: int | None = None
    num_workers: int = 2

    def validate(self) -> None:
        if self.num_workers < 0:
            raise UsageError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if not self.path and not self.streams:
            raise UsageError("data.path is empty: "
                             "point it at a folder made by data_prep/owt_to_mds.py")


@dataclass
class TrainConfig:
    max_steps: int = 500_000
    seed: int = 1337
    tokens_per_step: int = 1_048_576  # global batch in tokens, fixed whatever the world size
    micro_batch_size: int = 16  # sequences per GPU per forward; accumulation is derived
    log_every: int = 10
    # autocast_bf16: fp32 weights and residual stream, bf16 matmuls under torch.autocast (how the
    # paper trained); bf16: DeepSpeed's bf16 mode, weights and activations in bf16 (AdaLN's
    # near-zero gates at init make block updates smaller than bf16's resolution of the residual
    # stream); fp32. auto: autocast_bf16 on a GPU, fp32 on a CPU (model/precision.py says why).
    precision: Literal["auto", "autocast_bf16", "bf16", "fp32"] = "auto"
    # torch.compile the network (compile_scope), the loss's softmax and the order sampler;
    # auto: on a GPU only (on a CPU the compilation takes longer than short runs gain).
    compile: bool | Literal["auto"] = "auto"
    # what one compiled graph spans: "block" (each transformer block; all blocks share the
    # graph: compiles fast, and ZeRO-3 gathers each block's weights around it) or "network"
    # (embeddings, every block and the final layer: inductor can also fuse across block
    # boundaries, one long compile; ZeRO-1/2 only)
    compile_scope: Literal["block", "network"] = "block"
    # A collective (gradient reduction, barrier) that waits longer for another rank fails and
    # ends the run (a dead or hung rank), instead of waiting forever.
    collective_timeout_s: float = 600.0
    # What a bad step does (a loss or gradient norm that is not finite, or a spike by the
    # recovery.spike_* rule): "stop" ends the run naming the last complete checkpoint; "rollback"
    # reloads the last complete checkpoint before the bad step, moves the data stream past that
    # step's samples and goes on (see recovery.*)
    on_nonfinite: Literal["stop", "rollback"] = "stop"

    def validate(self) -> None:
        require_positive(self, "train", ("max_steps", "tokens_per_step", "micro_batch_size",
                                         "log_every", "collective_timeout_s"))


@dataclass
class OptimConfig:
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 2000
    decay_steps: int = 500_000  # cosine from lr to min_lr ends here, then min_lr
    weight_decay: float = 0.03  # on >= 2-D weights only; the released checkpoints' value
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0

    def validate(self) -> None:
        require_positive(self, "optim", ("lr",))
        if not 0 <= self.min_lr <= self.lr:
            raise UsageError(f"optim.min_lr ({self.min_lr}) must be in [0, optim.lr]")
        if self.warmup_steps < 0 or self.decay_steps < self.warmup_steps:
            raise UsageError("optim.decay_steps must be >= optim.warmup_steps >= 0")
        if not 0.0 <= self.beta1 < 1.0 or not 0.0 <= self.beta2 < 1.0:
            raise UsageError("optim.beta1 and optim.beta2 must be in [0, 1)")


@dataclass
class EMAConfig:
    enabled: bool = True
    decay: float = 0.9999  # with the (1+n)/(10+n) warm-up

    def validate(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise UsageError(f"ema.decay must be in (0, 1), got {self.decay}")


@dataclass
class CheckpointConfig:
    every: int = 10_000  # steps; also on SIGTERM, SIGUSR1 and Ctrl-C
    keep_last: int = 3
    # After SIGTERM, SIGUSR1 or Ctrl-C, the run saves at the next step and exits; if it has not
    # within this many seconds (no step can finish), it exits anyway, status 1, without a
    # checkpoint. Keep it below the launcher's own grace (AOGPT_SIGNAL_GRACE, 240 s, in the SLURM
    # templates).
    signal_grace_s: float = 180.0

    def validate(self) -> None:
        require_positive(self, "checkpoint", ("every", "keep_last", "signal_grace_s"))


@dataclass
class RecoveryConfig:
    # loss spikes count as bad steps when above this many times the median loss of the
    # spike_window steps before them, spike_steps steps in a row (0 = no spike rule)
    spike_factor: float = 0.0
    spike_steps: int = 3
    spike_window: int = 100
    # train.on_nonfinite=rollback gives up (one line, status 1) at a bad step after this many
    max_rollbacks: int = 3
    # after a rollback the learning rate is multiplied by lr_factor, from the checkpoint rolled
    # back to until lr_steps steps past the bad step (1.0: unchanged)
    lr_factor: float = 1.0
    lr_steps: int = 0

    def validate(self) -> None:
        require_positive(self, "recovery", ("spike_steps", "spike_window", "max_rollbacks"))
        if self.spike_factor != 0 and self.spike_factor <= 1:
            raise UsageError(f"recovery.spike_factor must be above 1 (0 = no spike rule), got "
                             f"{self.spike_factor}")
        if not 0 < self.lr_factor <= 1 or self.lr_steps < 0:
            raise UsageError(f"recovery.lr_factor must be in (0, 1] and recovery.lr_steps >= 0, "
                             f"got {self.lr_factor} and {self.lr_steps}")


@dataclass
class EvalConfig:
    every: int = 2500  # steps; 0 turns periodic validation (and the zero-shot sets) off
    batches: int = 8  # validation batches per rank
    num_orders: int = 10  # random orders per sequence for the any-order loss (the paper: 10)
    # zero-shot sets (folders made by data_prep/eval_to_mds.py at model.block_size), scored at
    # every evaluation as trainer/evaluate.py scores them: left to right and any order
    sets: list[str] = field(default_factory=list)
    max_tokens: int | None = None  # per set and evaluation: its first samples up to this; None: all
    raw_weights: bool = False  # score the zero-shot sets with the raw weights too (EMA always)
    # samples while training (trainer/training_samples.py): every sample_every steps (0 = off),
    # sample_count samples of the EMA weights from fixed seeds with the KV-cache sampler
    sample_every: int = 0
    sample_count: int = 4
    # "parallel" (the paper's, sample_steps calls) or "speculative" (exactly one token per call's
    # distribution, in fewer calls; sample_draft positions drafted ahead per call, sample_tree
    # candidates for each)
    sample_sampler: Literal[SAMPLERS] = DEFAULT_SAMPLER
    sample_steps: int = 256  # network calls S (the paper's sample_AOGPT.sh: 256)
    sample_draft: int = 4
    sample_tree: int = 1  # speculative: candidates kept per drafted position (1: a chain)
    # speculative trees: positions verified on the branch of a candidate other than the first
    sample_tree_depth: int = 0
    # speculative: drafts after a redrawn position drawn from rows that saw only final tokens
    sample_predraft: int = 0
    sample_temperature: float = 1.0
    sample_top_p: float = 1.0  # the paper's nucleus rule (trainer/sample.py --top-p-rule paper)
    # the samples' judge: a local Hugging Face GPT-2 folder (generative perplexity), or a synthetic
    # language's data folder (data_prep/synthetic_to_mds.py: their exact NLL)
    judge: str | None = None

    def validate(self) -> None:
        """The checks of these fields alone; those against the model are RunConfig.validate's."""
        require_positive(self, "eval", ("batches", "num_orders"))
        if self.every < 0:
            raise UsageError(f"eval.every must be >= 0 (0 = off), got {self.every}")
        if self.sample_every < 0:
            raise UsageError(f"eval.sample_every must be >= 0 (0 = off), got {self.sample_every}")
        if self.sample_every and self.sample_count < 1:
            raise UsageError(f"eval.sample_count must be >= 1, got {self.sample_count}")
        names = [Path(folder).name for folder in self.sets]
        if len(set(names)) < len(names):
            raise UsageError(f"eval.sets: two folders share a name ({', '.join(names)}): their "
                             "metrics are named after the folder, give each its own")


@dataclass
class LoggingConfig:
    # auto: online when WANDB_API_KEY is set, otherwise off. Never prompts.
    wandb: Literal["auto", "off", "online", "offline"] = "auto"
    wandb_project: str = "aogpt"
    wandb_run_name: str | None = None


@dataclass
class SpeedConfig:
    """Levers on the training step's speed (trainer/speed.py), each off until a GPU measures it
    faster (docs/performance.md says what each does, benchmarks/gpu_report.py measures them)."""

    # one gradient reduction per optimizer step: the micro-steps' gradients summed locally, then
    # reduced once (DeepSpeed's engine.coalesce_grad_reduction); not under DeepSpeed's bf16
    # optimizer wrapper (train.precision=bf16)
    coalesce_grad_reduction: bool = False
    # the optimizer's update and the EMA's in one compiled pass over the fp32 master weights
    fused_optimizer_ema: bool = False
    # DeepSpeed's engine.compile of the whole model instead of train.compile_scope's graphs:
    # "compiled_autograd" (the backward compiled too) or "deepcompile" (CUDA only); ZeRO-1/2
    engine_compile: Literal["off", "compiled_autograd", "deepcompile"] = "off"
    # the compiled graphs replayed as CUDA graphs (inductor's reduce-overhead mode; CUDA only)
    cuda_graphs: bool = False


@dataclass
class RunConfig:
    out_dir: str = "runs/default"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    order: OrderConfig = field(default_factory=OrderConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def validate(self, world_size: int | None = None) -> None:
        """Each section checks its own fields; here only the rules between sections (and, with
        world_size, the batch arithmetic)."""
        for section in (self.model, self.train, self.checkpoint, self.recovery, self.eval,
                        self.optim, self.ema, self.data):
            section.validate()
        self.validate_eval_against_model()
        self.order.validate(self.model.block_size)
        if self.order.kind != LEFT_TO_RIGHT.word:
            self.model.require_any_order(f"set order.kind={LEFT_TO_RIGHT.word}")
        if self.order.planner_weights == "ema" and not self.ema.enabled:
            raise UsageError("order.planner_weights=ema plans with the EMA's weights, and "
                             "ema.enabled is false: turn the EMA on or plan with "
                             "order.planner_weights=current")
        tokens_per_micro_batch = self.train.micro_batch_size * self.model.block_size
        if self.train.tokens_per_step % tokens_per_micro_batch:
            raise UsageError(
                f"train.tokens_per_step ({self.train.tokens_per_step}) must be a multiple of "
                f"train.micro_batch_size x model.block_size ({tokens_per_micro_batch})"
            )
        if world_size is not None:
            self.gradient_accumulation_steps(world_size)

    def validate_eval_against_model(self) -> None:
        """What evaluation reads and samples must fit the model's sequence and reading order."""
        block_size, evaluation = self.model.block_size, self.eval
        if evaluation.max_tokens is not None and evaluation.max_tokens < block_size:
            raise UsageError(f"eval.max_tokens must be at least one sample of model.block_size = "
                             f"{block_size} tokens, got {evaluation.max_tokens} (null: every "
                             "sample of each set)")
        if not evaluation.sample_every:
            return
        if not 1 <= evaluation.sample_steps <= block_size:
            raise UsageError(f"eval.sample_steps must be in 1..{block_size} (model.block_size), "
                             f"got {evaluation.sample_steps}")
        if not self.model.any_order and evaluation.sample_steps != block_size:
            raise UsageError("a left-to-right GPT samples one token per step: set "
                             f"eval.sample_steps={block_size}")
        if not self.model.any_order and WAYS[evaluation.sample_sampler].any_order:
            raise UsageError("a left-to-right GPT cannot give positions ahead of the next one: "
                             f"set eval.sample_sampler={DEFAULT_SAMPLER}")

    @property
    def sequences_per_step(self) -> int:
        return self.train.tokens_per_step // self.model.block_size

    def gradient_accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step so that every step sees exactly tokens_per_step tokens."""
        per_micro_step = self.train.micro_batch_size * world_size
        if self.sequences_per_step % per_micro_step:
            raise UsageError(
                f"the global batch of {self.sequences_per_step} sequences is not divisible by "
                f"micro_batch_size x world size = {self.train.micro_batch_size} x {world_size}: "
                "change train.micro_batch_size or train.tokens_per_step"
            )
        return self.sequences_per_step // per_micro_step


# ---- loading -------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike, overrides: list[str] = ()) -> RunConfig:
    """Reads a YAML preset (following `base:` links), applies `key.sub=value` overrides, validates
    types."""
    tree = _read_preset(Path(path), seen=())
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            raise UsageError(f"override {override!r} is not of the form key.sub=value")
        _set_dotted(tree, key.strip(), yaml.safe_load(raw) if raw.strip() else None)
    return _build(RunConfig, tree, prefix="")


def resolve_device_choices(cfg: RunConfig, device_type: str) -> None:
    """Replaces the "auto" of train.precision and train.compile with this device type's choice."""
    if cfg.train.precision == "auto":
        cfg.train.precision = training_precision(torch.device(device_type))
    if cfg.train.compile == "auto":
        cfg.train.compile = device_type == "cuda"


def config_to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | os.PathLike) -> None:
    """Writes the resolved config atomically (temp file, then rename)."""
    write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def flat_config(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"train.max_steps": 200, ...} of a config dict, values as JSON reads them back."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = json.loads(json.dumps(value))
    return flat


def record_config(cfg: RunConfig, config_file: Path, changes_file: Path, step: int,
                  git_sha: str | None) -> dict[str, list]:
    """config.yaml is the config a run began with, written once; a relaunch with other settings
    appends what changed ({key: [before, now]}), from which step and by which code, to
    config_changes.jsonl. Returns that change (empty when none)."""
    now = flat_config(config_to_dict(cfg))
    if not config_file.is_file():
        save_config(cfg, config_file)
        return {}
    before = flat_config(yaml.safe_load(config_file.read_text()) or {})
    if changes_file.is_file():
        for line in changes_file.read_text().splitlines():
            before.update({key: value[1] for key, value in json.loads(line)["changed"].items()})
    # a run begun with an alias (order.kind: uniform, before the word was random) changed nothing
    aliases = _field_aliases(RunConfig)
    before = {key: aliases[key].get(value, value) if key in aliases and isinstance(value, str)
              else value for key, value in before.items()}
    changed = {key: [before.get(key), value] for key, value in now.items()
               if before.get(key) != value}
    if changed:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": step,
                  "git_sha": git_sha, "changed": changed}
        with changes_file.open("a") as file:
            file.write(json.dumps(record) + "\n")
    return changed


def _field_aliases(cls: type, prefix: str = "") -> dict[str, dict[str, str]]:
    """{"order.kind": {"uniform": "random", ...}}: the fields that accept aliases, by dotted key."""
    found, hints = {}, typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            found.update(_field_aliases(hints[f.name], f"{prefix}{f.name}."))
        elif "aliases" in f.metadata:
            found[prefix + f.name] = f.metadata["aliases"]
    return found


def _read_preset(path: Path, seen: tuple[Path, ...]) -> dict:
    check_input_file(path, "config file", "a YAML preset (presets are in configs/)")
    if path.resolve() in seen:
        raise UsageError(f"config {path} includes itself through `base:`")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UsageError(f"config {path}{where} is not valid YAML: "
                         f"{getattr(err, 'problem', err)}") from None
    if not isinstance(tree, dict):
        raise UsageError(f"config {path} must be a mapping of keys to values")
    base = tree.pop("base", None)
    if base is None:
        return tree
    merged = _read_preset(path.parent / base, seen + (path.resolve(),))
    _deep_merge(merged, tree)
    return merged


def _deep_merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UsageError(f"override {dotted}: {part} is a value, not a section")
    node[leaf] = value


def _build(cls: type, values: Any, prefix: str) -> Any:
    if not isinstance(values, dict):
        raise UsageError(f"{prefix.rstrip('.') or 'config'} must be a section (a mapping), "
                         f"got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = (f" (did you mean {prefix}{close[0]}?)" if close
                    else f" (known: {', '.join(fields)})")
            raise UsageError(f"unknown config key {prefix}{key}{hint}")
        # a field's metadata may name aliases of its Literal values (order.kind=uniform is random)
        aliases = fields[key].metadata.get("aliases", {})
        kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}", aliases)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, name: str, aliases: dict[str, str] | None = None) -> Any:
    """Checks (and where lossless, converts) a YAML value against a dataclass field's type; a
    Literal value's alias (in `aliases`) becomes the value it stands for."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, f"{name}.")
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, name)
            except UsageError as err:
                errors.append(str(err))
        raise UsageError(errors[0])
    if origin is Literal:
        allowed = typing.get_args(hint)
        aliases = aliases or {}
        value = aliases.get(value, value) if isinstance(value, str) else value
        if value not in allowed:
            raise UsageError(f"{name} must be one of {', '.join(map(str, allowed))}"
                             f"{_aliases_text(aliases)}; got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise UsageError(f"{name} must be a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_coerce(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{name} must be true or false, got {value!r}")
        return value
    if hint in (int, float) and isinstance(value, str):
        try:  # YAML 1.1 reads 6e-4 and 1e6 (no dot) as strings
            value = float(value)
        except ValueError:
            pass
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise UsageError(f"{name} must be an integer, got {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{name} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise UsageError(f"{name} must be a string, got {value!r}")
        return value
    raise TypeError(f"config field {name} has a type the loader does not handle: {hint}")


def _aliases_text(aliases: dict[str, str]) -> str:
    """" (also uniform, ao for random; ltr for l2r)": the aliases of each value, or nothing."""
    by_value: dict[str, list[str]] = {}
    for alias, value in aliases.items():
        by_value.setdefault(value, []).append(alias)
    groups = "; ".join(f"{', '.join(names)} for {value}" for value, names in by_value.items())
    return f" (also {groups})" if groups else ""
