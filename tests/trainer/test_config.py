"""YAML presets -> typed, validated dataclasses; overrides; clear one-line errors."""

import dataclasses
import re

import pytest
import torch
import yaml
from conftest import run_cli

from aogpt import UsageError
from aogpt.model import OrderSampler
from aogpt.model import config as model_presets
from aogpt.model.orders import KINDS
from aogpt.trainer.config import (
    CheckpointConfig,
    DataConfig,
    EMAConfig,
    EvalConfig,
    OptimConfig,
    RecoveryConfig,
    RunConfig,
    TrainConfig,
    load_config,
    record_config,
    save_config,
)

PRESETS = ["ao_gpt_small", "ao_gpt_medium", "sigma_gpt_small", "sigma_gpt_medium",
           "gpt_small", "gpt_medium", "tiny", "synthetic", "synthetic_words", "gpt_synthetic",
           "gpt_synthetic_words"]


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_validates(repo, name):
    cfg = load_config(repo / "configs" / f"{name}.yaml")
    cfg.validate(world_size=1)
    assert isinstance(cfg, RunConfig)


def test_each_synthetic_gpt_is_its_ao_gpt_read_left_to_right(repo):
    """configs/gpt_synthetic*.yaml: the AO-GPT preset's data, shape, steps and optimiser, a plain
    GPT (no target conditioning) trained left to right: the sampling race's baseline."""
    for name in ("synthetic", "synthetic_words"):
        ao, gpt = (load_config(repo / "configs" / f"{prefix}{name}.yaml")
                   for prefix in ("", "gpt_"))
        assert gpt.order.kind == "l2r" and gpt.model.target_injection == "none"
        assert ao.order.kind == "mixture" and ao.order.p_left_to_right_end == 0.1
        assert (gpt.data, gpt.train, gpt.optim) == (ao.data, ao.train, ao.optim)
        assert dataclasses.replace(gpt.model, target_injection="adaln") == ao.model


def test_paper_presets_have_the_papers_settings(repo):
    small = load_config(repo / "configs" / "ao_gpt_small.yaml")
    medium = load_config(repo / "configs" / "ao_gpt_medium.yaml")
    assert (small.model.n_layer, small.model.n_head, small.model.n_embd) == (12, 12, 768)
    assert (medium.model.n_layer, medium.model.n_head, medium.model.n_embd) == (24, 16, 1024)
    assert small.train.tokens_per_step == medium.train.tokens_per_step == 1_048_576
    assert small.order.kind == "mixture" and small.order.p_left_to_right == 0.1
    assert small.optim.lr == 6e-4 and medium.optim.lr == 3e-4 and medium.optim.min_lr == 6e-5
    assert small.ema.decay == 0.9999
    assert small.gradient_accumulation_steps(world_size=16) == 4  # 2 nodes x 8 GPUs, as the paper


def test_baselines_switch_config_values_not_code(repo):
    sigma = load_config(repo / "configs" / "sigma_gpt_small.yaml")
    gpt = load_config(repo / "configs" / "gpt_small.yaml")
    assert sigma.model.target_injection == "sigma_sum" and sigma.model.tie_embeddings
    assert sigma.order.kind == "random" and not sigma.ema.enabled
    assert gpt.order.kind == "l2r" and gpt.model.target_injection == "adaln"


def test_dotted_overrides_are_typed(repo):
    cfg = load_config(repo / "configs" / "tiny.yaml",
                      ["train.max_steps=7", "order.p_left_to_right=0", "optim.lr=1e-3",
                       "data.path=/x/y", "model.qk_norm=false"])
    assert cfg.train.max_steps == 7 and isinstance(cfg.train.max_steps, int)
    assert cfg.order.p_left_to_right == 0.0 and isinstance(cfg.order.p_left_to_right, float)
    assert cfg.optim.lr == 1e-3 and cfg.data.path == "/x/y" and cfg.model.qk_norm is False


def test_streams_list_builds_nested_dataclasses(repo):
    cfg = load_config(repo / "configs" / "tiny.yaml",
                      ["data.streams=[{path: a, proportion: 0.7}, {path: b}]"])
    assert [s.path for s in cfg.data.streams] == ["a", "b"]
    assert cfg.data.streams[0].proportion == 0.7 and cfg.data.streams[1].proportion is None


@pytest.mark.parametrize("override, message", [
    ("train.max_step=3", "unknown config key train.max_step (did you mean train.max_steps?)"),
    ("modle.n_layer=3", "unknown config key modle (did you mean model?)"),
    ("train.max_steps=many", "train.max_steps must be an integer, got 'many'"),
    ("train.max_steps=2.5", "train.max_steps must be an integer"),
    ("model.qk_norm=1", "model.qk_norm must be true or false"),
    ("order.kind=zigzag", f"order.kind must be one of {', '.join(KINDS)} (also ltr, "
                          "left_to_right for l2r; uniform, ao, any, any_order for random); got "
                          "'zigzag'"),  # KINDS: a new kind is added in model/orders.py alone
    ("train.on_nonfinite=retry", "train.on_nonfinite must be one of stop, rollback; got 'retry'"),
    ("train", "is not of the form key.sub=value"),
])
def test_bad_overrides_name_the_problem(repo, override, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        load_config(repo / "configs" / "tiny.yaml", [override])


@pytest.mark.parametrize("override, world, message", [
    ("model.n_head=3", 1, "n_embd .64. must be divisible by model.n_head .3."),
    ("order.p_left_to_right=1.5", 1, "order.p_left_to_right must be in"),
    ("train.micro_batch_size=5", 1, "must be a multiple of train.micro_batch_size"),
    ("train.micro_batch_size=16", 4, "not divisible by micro_batch_size x world size"),
    ("order.schedule=linear", 1, "needs order.schedule_steps"),
    ("data.path=''", 1, "data.path is empty"),
    ("data.num_workers=-1", 1, "data.num_workers must be >= 0, got -1"),
    ("order.kind=blockwise order.block_size=48", 1,
     "order.block_size (48) must divide the sequence length (128)"),
    ("order.block_size=0", 1, "order.block_size must be positive, got 0"),
    ("model.target_injection=none", 1, "reads left to right only: set order.kind=l2r"),
    ("recovery.spike_factor=0.9", 1,
     "recovery.spike_factor must be above 1 (0 = no spike rule), got 0.9"),
    ("recovery.spike_window=0", 1, "recovery.spike_window must be positive, got 0"),
    ("recovery.max_rollbacks=0", 1, "recovery.max_rollbacks must be positive, got 0"),
    ("recovery.lr_factor=0", 1, "recovery.lr_factor must be in (0, 1] and recovery.lr_steps >= 0"),
    ("order.kind=planner order.planner_weights=ema ema.enabled=false", 1,
     "order.planner_weights=ema plans with the EMA's weights, and ema.enabled is false"),
])
def test_cross_field_rules(repo, override, world, message):
    cfg = load_config(repo / "configs" / "tiny.yaml", override.split())
    with pytest.raises(UsageError, match=re.escape(message) if "(" in message else message):
        cfg.validate(world_size=world)


@pytest.mark.parametrize("section, message", [
    (DataConfig(path="", streams=[]), "data.path is empty"),
    (TrainConfig(log_every=0), "train.log_every must be positive, got 0"),
    (OptimConfig(lr=1e-3, min_lr=2e-3), "optim.min_lr (0.002) must be in [0, optim.lr]"),
    (EMAConfig(decay=1.0), "ema.decay must be in (0, 1), got 1.0"),
    (CheckpointConfig(keep_last=0), "checkpoint.keep_last must be positive, got 0"),
    (RecoveryConfig(spike_factor=0.5), "recovery.spike_factor must be above 1"),
    (EvalConfig(sets=["a/wiki", "b/wiki"]), "eval.sets: two folders share a name (wiki, wiki)"),
])
def test_a_config_section_validates_its_own_fields_alone(section, message):
    """A section's own rules need no other section: RunConfig.validate adds those between them."""
    with pytest.raises(UsageError, match=re.escape(message)):
        section.validate()


def test_a_run_config_validates_every_section(repo):
    """A section whose rule is broken fails the whole config's validation, for each section."""
    broken = {"data": "data.num_workers=-1", "train": "train.max_steps=0",
              "optim": "optim.beta1=1", "ema": "ema.decay=0", "checkpoint": "checkpoint.every=0",
              "recovery": "recovery.lr_steps=-1", "eval": "eval.every=-1",
              "model": "model.dropout=1", "order": "order.p_left_to_right=2"}
    # logging has no rule; speed's are against the DeepSpeed JSON it runs with
    # (trainer/ds_config.py, tests/trainer/test_speed_levers.py)
    sections = [f.name for f in dataclasses.fields(RunConfig)
                if f.name not in ("out_dir", "logging", "speed")]
    assert sorted(broken) == sorted(sections)  # a new section adds its broken rule here
    for name, override in broken.items():
        cfg = load_config(repo / "configs" / "tiny.yaml", [override])
        with pytest.raises(UsageError, match=rf"^{name}\."):
            cfg.validate(world_size=1)


def test_base_presets_merge_and_missing_files_are_errors(tmp_path, repo):
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {repo / 'configs' / 'tiny.yaml'}\ntrain:\n  max_steps: 3\n")
    cfg = load_config(child)
    assert cfg.train.max_steps == 3 and cfg.model.n_embd == 64  # the rest comes from the base
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(UsageError, match=rf"config file {repo / 'configs'} is a folder, not a "
                                         r"file: give a YAML preset \(presets are in configs/\)"):
        load_config(repo / "configs")
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(UsageError, match="includes itself"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "bad.yaml").write_text("train: [1,\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_resolved_config_round_trips(tmp_path, repo):
    cfg = load_config(repo / "configs" / "ao_gpt_medium.yaml", ["train.seed=5"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["n_layer"] == 24
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary left


def test_demo_command_reports_config_errors_in_one_line(repo, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(
        "import sys\nfrom aogpt import cli_entry\nfrom aogpt.trainer.config import load_config\n"
        "@cli_entry\ndef main():\n    load_config(sys.argv[1], sys.argv[2:])\n"
        "sys.exit(main())\n")
    result = run_cli(str(script), str(repo / "configs" / "tiny.yaml"), "optim.lrr=1")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: unknown config key optim.lrr (did you mean optim.lr?)"


# How a model runs, not what it is: the YAML presets may tune these for their hardware.
RUNTIME_MODEL_FIELDS = {"attn_impl", "activation_checkpointing", "loss_chunk_size"}


@pytest.mark.parametrize("name, build", [
    ("ao_gpt_small", lambda: model_presets.small()),
    ("ao_gpt_medium", lambda: model_presets.medium()),
    ("sigma_gpt_small", lambda: model_presets.sigma_gpt(model_presets.small())),
    ("sigma_gpt_medium", lambda: model_presets.sigma_gpt(model_presets.medium())),
    ("tiny", lambda: model_presets.tiny()),
])
def test_python_model_presets_are_the_yaml_presets(repo, name, build):
    """The YAML files are what runs train; the Python presets (benchmarks, tests) must not drift."""
    yaml_model = dataclasses.asdict(load_config(repo / "configs" / f"{name}.yaml").model)
    python_model = dataclasses.asdict(build())
    differences = {field: (yaml_model[field], python_model[field]) for field in yaml_model
                   if field not in RUNTIME_MODEL_FIELDS
                   and yaml_model[field] != python_model[field]}
    assert differences == {}


def test_a_left_to_right_gpt_validates_when_it_reads_left_to_right(repo):
    cfg = load_config(repo / "configs" / "tiny.yaml",
                      ["model.target_injection=none", "order.kind=l2r"])
    cfg.validate(world_size=1)
    assert not cfg.model.any_order and cfg.model.family == "left-to-right GPT"
    assert load_config(repo / "configs" / "tiny.yaml").model.any_order


@pytest.mark.parametrize("alias, word", [("uniform", "random"), ("any_order", "random"),
                                         ("ltr", "l2r"), ("left_to_right", "l2r")])
def test_an_order_kind_alias_is_saved_as_its_word_and_trains_the_same_orders(repo, tmp_path,
                                                                            alias, word):
    aliased = load_config(repo / "configs" / "tiny.yaml", [f"order.kind={alias}"])
    canonical = load_config(repo / "configs" / "tiny.yaml", [f"order.kind={word}"])
    assert aliased == canonical and aliased.order.kind == word
    save_config(aliased, tmp_path / "config.yaml")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["order"]["kind"] == word
    samples = torch.arange(8)

    def draws(cfg):
        return OrderSampler(cfg.order, cfg.model.block_size, cfg.train.seed)(7, samples)

    assert all(torch.equal(a, c) for a, c in zip(draws(aliased), draws(canonical), strict=True))


def test_the_findings_configs_written_with_uniform_still_load(repo):
    """The committed findings runs and the suite's arm say `kind: uniform` (the word before
    random): they load as random, the orders they were trained with."""
    run = load_config(repo / "docs" / "findings" / "runs" / "uniform-s1337" / "config.yaml")
    arm_file = repo / "experiments" / "configs" / "arms" / "uniform.yaml"
    kind = yaml.safe_load(arm_file.read_text())["order"]["kind"]
    arm = load_config(repo / "experiments" / "configs" / "base_cpu.yaml", [f"order.kind={kind}"])
    assert kind == "uniform" and run.order.kind == arm.order.kind == "random"


def test_a_run_begun_with_an_alias_relaunches_without_a_config_change(repo, tmp_path):
    cfg = load_config(repo / "configs" / "tiny.yaml", ["order.kind=uniform"])
    config_file, changes = tmp_path / "config.yaml", tmp_path / "config_changes.jsonl"
    save_config(cfg, config_file)
    config_file.write_text(config_file.read_text().replace("kind: random", "kind: uniform"))
    assert record_config(cfg, config_file, changes, 10, None) == {}
    assert not changes.exists()
