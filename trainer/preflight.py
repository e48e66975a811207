"""A run's pre-flight: every check that can fail on user input, cheap and before any process group
exists, and the Plan it hands the Trainer (trainer/loop.py).

    plan = preflight("configs/tiny.yaml", "ds_configs/cpu.json", ["train.max_steps=100"], dist_env)

trainer/main.py runs it before it trains; benchmarks/train_throughput.py before it times steps.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.files import git_sha
from aogpt.model.warm_start import check_source
from aogpt.run_folder import RunFolder
from aogpt.trainer import speed, training_samples, zero_shot
from aogpt.trainer.checkpoint import check_resumable, read_run_state
from aogpt.trainer.config import RunConfig, load_config, resolve_device_choices
from aogpt.trainer.data import check_data
from aogpt.trainer.dist_env import DistEnv
from aogpt.trainer.ds_config import load_ds_config, resolve_ds_config, sync_warnings, zero_stage
from aogpt.trainer.evaluation import EvalData
from aogpt.trainer.judge import check_judge, check_judge_matches
from aogpt.trainer.out_dir import check_fresh_start, check_out_dir


@dataclass
class Plan:
    """Everything checked before the heavy work starts."""

    cfg: RunConfig
    ds_config: dict
    manifests: dict[str, dict]
    resume_tag: str | None
    elastic: bool = False  # the tag was written by another number of processes or ZeRO stage
    zero_shot_sets: dict[str, EvalData] = dataclasses.field(default_factory=dict)  # by name
    git_sha: str | None = dataclasses.field(default_factory=git_sha)  # the code that runs
    start_over: bool = False  # from step 0, an earlier run in out_dir set aside (--start-over)


def preflight(config: str, ds_config_file: str, overrides: list[str], dist_env: DistEnv,
              start_over: bool = False) -> Plan:
    """The run of the preset `config` with `overrides` under the DeepSpeed JSON `ds_config_file`,
    checked; start_over: from step 0 whatever out_dir holds (trainer/out_dir.py)."""
    cfg = load_config(config, overrides)
    resolve_device_choices(cfg, dist_env.device.type)
    cfg.validate(world_size=dist_env.world_size)
    check_out_dir(cfg.out_dir)
    ds_config = resolve_ds_config(load_ds_config(ds_config_file), cfg, dist_env.world_size)
    manifests = check_data(cfg, dist_env)
    if cfg.model.init_from:
        check_source(cfg.model.init_from, cfg.model)
    # each zero-shot set: there, made for this model, not empty; checked even when not scored
    sets = zero_shot.open_sets(cfg.eval.sets, cfg.model.block_size, cfg.eval.max_tokens,
                               cfg.model.vocab_size)
    check_sampling(cfg, manifests)
    run_folder = RunFolder(cfg.out_dir)
    tag, warning = (None, None) if start_over else run_folder.resume_tag()
    if tag is None and not start_over:
        check_fresh_start(run_folder)
    if dist_env.is_main:
        for line in filter(None, [*sync_warnings(ds_config), warning, *unused_settings(cfg),
                                  *speed.unavailable(cfg, dist_env.device)]):
            print(f"warning: {line}", file=sys.stderr, flush=True)
    elastic = tag is not None and resumes_elastically(run_folder, tag, cfg, ds_config, dist_env)
    if elastic:
        ds_config.setdefault("checkpoint", {})["load_universal"] = True
    return Plan(cfg=cfg, ds_config=ds_config, manifests=manifests, resume_tag=tag, elastic=elastic,
                zero_shot_sets=sets if cfg.eval.every else {}, start_over=start_over)


def check_sampling(cfg: RunConfig, manifests: dict[str, dict]) -> None:
    """The settings of the samples drawn while training, the tokenizer that decodes them, and
    their judge (made for the training data's tokens)."""
    if cfg.eval.sample_every:
        training_samples.sampling_config(cfg.eval, cfg.model.any_order)
        if cfg.model.reads_gpt2:
            load_gpt2()
    if cfg.eval.judge is not None:
        check_judge(cfg.eval.judge, "eval.judge")
        check_judge_matches(cfg.eval.judge, {"data_tokenizers": [
            manifest["tokenizer"] for manifest in manifests.values()]}, "eval.judge")


def resumes_elastically(run_folder: RunFolder, tag: str, cfg: RunConfig, ds_config: dict,
                        dist_env: DistEnv) -> bool:
    """Whether the checkpoint `tag` is resumed on another number of processes or ZeRO stage than
    it was written by (then it loads as a universal checkpoint, said here); UsageError when it
    cannot be resumed at all (another model shape)."""
    state = read_run_state(run_folder, tag)
    elastic = check_resumable(state, cfg.model, dist_env.world_size, zero_stage(ds_config),
                              run_folder.tag_dir(tag))
    if elastic and dist_env.is_main:
        print(f"elastic resume: {tag} was written by {state['world_size']} processes under "
              f"ZeRO-{state['zero_stage']}, this run has {dist_env.world_size} under "
              f"ZeRO-{zero_stage(ds_config)}: loading it as a universal checkpoint", flush=True)
    return elastic


def unused_settings(cfg: RunConfig) -> list[str]:
    """Settings given that another setting turns off: said at the start, not found out at the
    end."""
    lines = []
    if cfg.eval.sets and not cfg.eval.every:
        lines.append("eval.sets are not scored: eval.every=0 turns evaluation off")
    if cfg.eval.judge is not None and not cfg.eval.sample_every:
        lines.append("eval.judge is not used: eval.sample_every=0 draws no samples to judge")
    return lines
