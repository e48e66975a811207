"""The trainer's pure parts: DeepSpeed JSON vs YAML, LR schedule, launch environment, checkpoint
bookkeeping, MFU peaks. No process group, no data."""

import dataclasses
import json
import math
import pickle
import re

import pytest
import torch

from aogpt import UsageError
from aogpt.run_folder import RunFolder, tag_for
from aogpt.trainer.checkpoint import (
    RUN_STATE,
    check_resumable,
    commit_tag,
    load_rank_state,
    prune_tags,
    rank_files,
    read_run_state,
    restore_rng_states,
    rewind_tags,
    rng_states,
    save_torch_atomic,
)
from aogpt.trainer.config import OptimConfig, StreamConfig, load_config, resolve_device_choices
from aogpt.trainer.data import training_locations
from aogpt.trainer.dist_env import DistEnv, local_gpu_index, setup_distributed_env
from aogpt.trainer.ds_config import load_ds_config, resolve_ds_config, sync_warnings, zero_stage
from aogpt.trainer.lr_schedule import learning_rate
from aogpt.trainer.metrics import peak_flops, read_metrics, truncate_metrics


@pytest.fixture
def tiny(repo):
    cfg = load_config(repo / "configs" / "tiny.yaml")
    resolve_device_choices(cfg, "cpu")
    return cfg


# ---- DeepSpeed JSON and YAML ---------------------------------------------------------------------


@pytest.mark.parametrize("name, stage", [("zero1", 1), ("zero2", 2), ("zero3", 3), ("cpu", 1)])
def test_shipped_ds_configs_take_batch_and_clipping_from_the_yaml(repo, tiny, name, stage):
    ds = resolve_ds_config(load_ds_config(repo / "ds_configs" / f"{name}.json"), tiny, world_size=2)
    assert ds["train_batch_size"] == tiny.sequences_per_step == 32
    assert ds["train_micro_batch_size_per_gpu"] == tiny.train.micro_batch_size
    assert ds["gradient_accumulation_steps"] == tiny.gradient_accumulation_steps(2) == 2
    assert ds["gradient_clipping"] == tiny.optim.grad_clip
    assert zero_stage(ds) == stage
    assert "optimizer" not in ds and "scheduler" not in ds
    if ds["bf16"]["enabled"]:
        assert ds["data_types"]["grad_accum_dtype"] == "fp32"


@pytest.mark.parametrize("precision", ["autocast_bf16", "bf16", "fp32"])
def test_shipped_ds_configs_leave_deepspeed_nothing_that_waits_for_the_device(repo, tiny,
                                                                              precision):
    tiny.train.precision = precision
    for name in ("zero1", "zero2", "zero3", "cpu"):
        ds = resolve_ds_config(load_ds_config(repo / "ds_configs" / f"{name}.json"), tiny, 2)
        assert sync_warnings(ds) == [], name
        assert ds["timers"]["throughput"]["enabled"] is False


def test_deepspeeds_synchronising_throughput_timer_is_off_unless_the_json_asks(tiny):
    ds = resolve_ds_config({"zero_optimization": {"stage": 1}}, tiny, world_size=1)
    assert ds["timers"] == {"throughput": {"enabled": False}}  # DeepSpeed's default is on


@pytest.mark.parametrize("ds, warning", [
    ({"timers": {"throughput": {"enabled": True}}},
     "enables timers.throughput with synchronized=true"),
    ({"wall_clock_breakdown": True}, "sets wall_clock_breakdown=true"),
    ({"bf16": {"enabled": "auto", "check_grad_overflow": True}},
     "sets bf16.check_grad_overflow=true"),
    ({"zero_optimization": {"stage": 2, "overlap_comm": True}},
     "sets zero_optimization.overlap_comm=true"),
], ids=["timer", "wall-clock-breakdown", "overflow-check", "overlap-comm"])
def test_a_json_that_makes_deepspeed_wait_for_the_device_gets_one_warning(tiny, ds, warning):
    tiny.train.precision = "bf16"
    ds.setdefault("zero_optimization", {"stage": 1})
    warnings = sync_warnings(resolve_ds_config(ds, tiny, world_size=1))
    assert len(warnings) == 1 and warning in warnings[0]


def test_one_compiled_graph_for_the_whole_network_is_refused_under_zero3(tiny):
    tiny.train.compile, tiny.train.compile_scope = True, "network"
    with pytest.raises(UsageError, match="train.compile_scope=network needs ZeRO-1 or 2"):
        resolve_ds_config({"zero_optimization": {"stage": 3}}, tiny, world_size=1)
    assert zero_stage(resolve_ds_config({"zero_optimization": {"stage": 2}}, tiny, 1)) == 2


def test_a_throughput_timer_that_does_not_synchronise_gets_no_warning(tiny):
    ds = {"timers": {"throughput": {"enabled": True, "synchronized": False}},
          "zero_optimization": {"stage": 1}}
    assert sync_warnings(resolve_ds_config(ds, tiny, world_size=1)) == []


def test_concrete_json_values_that_agree_with_the_yaml_are_accepted(tiny):
    ds = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1,
          "zero_optimization": {"stage": 2}}
    assert resolve_ds_config(ds, tiny, world_size=1)["gradient_accumulation_steps"] == 4


def test_bf16_gets_fp32_gradient_accumulation_when_unset(tiny):
    tiny.train.precision = "bf16"
    ds = resolve_ds_config({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, tiny, 1)
    assert ds["data_types"]["grad_accum_dtype"] == "fp32"


@pytest.mark.parametrize("device, precision, compiled", [("cuda", "autocast_bf16", True),
                                                         ("cpu", "fp32", False)])
def test_auto_precision_and_compile_follow_the_device(repo, device, precision, compiled):
    cfg = load_config(repo / "configs" / "ao_gpt_small.yaml")
    assert (cfg.train.precision, cfg.train.compile) == ("auto", "auto")
    resolve_device_choices(cfg, device)
    assert (cfg.train.precision, cfg.train.compile) == (precision, compiled)


@pytest.mark.parametrize("precision, engine_bf16", [("autocast_bf16", False), ("bf16", True),
                                                    ("fp32", False)])
def test_train_precision_decides_deepspeeds_bf16_mode(repo, tiny, precision, engine_bf16):
    tiny.train.precision = precision
    for name in ("zero1", "zero2", "zero3", "cpu"):
        ds = resolve_ds_config(load_ds_config(repo / "ds_configs" / f"{name}.json"), tiny, 2)
        assert ds["bf16"]["enabled"] is engine_bf16


def test_a_json_bf16_setting_against_train_precision_is_a_usage_error(tiny):
    tiny.train.precision = "autocast_bf16"
    with pytest.raises(UsageError, match=re.escape(
            "sets bf16.enabled=true but train.precision is autocast_bf16")):
        resolve_ds_config({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, tiny, 1)


@pytest.mark.parametrize("ds, message", [
    ({"train_micro_batch_size_per_gpu": 4},
     "sets train_micro_batch_size_per_gpu=4 but the YAML gives 8 (from train.micro_batch_size)"),
    ({"gradient_clipping": 0.5}, "sets gradient_clipping=0.5 but the YAML gives 1.0"),
    ({"train_batch_size": 64}, "sets train_batch_size=64 but the YAML gives 32"),
    ({"optimizer": {"type": "AdamW"}}, "has a \"optimizer\" block"),
    ({"scheduler": {"type": "WarmupCosineLR"}}, "has a \"scheduler\" block"),
    ({"data_types": {"grad_accum_dtype": "bf16"}}, "grad_accum_dtype is 'bf16'"),
    ({"fp16": {"enabled": True}}, "fp16 is not supported"),
    ({"zero_optimization": {"stage": 0}}, "zero_optimization.stage is 0"),
    ({"zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"}},
     "\"auto\" for zero_optimization.reduce_bucket_size"),
])
def test_json_contradicting_the_yaml_is_a_usage_error(tiny, ds, message):
    ds.setdefault("zero_optimization", {"stage": 1})
    tiny.train.precision = "bf16" if "data_types" in ds else tiny.train.precision
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve_ds_config(ds, tiny, world_size=1)


def test_missing_or_broken_ds_config_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_ds_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{stage: 1")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_ds_config(tmp_path / "bad.json")


# ---- learning rate -------------------------------------------------------------------------------


def test_lr_warms_up_linearly_from_zero_then_cosine_to_min_lr():
    optim = OptimConfig(lr=6e-4, min_lr=6e-5, warmup_steps=2000, decay_steps=500_000)
    assert learning_rate(0, optim) == 0.0
    assert learning_rate(1000, optim) == pytest.approx(3e-4)
    assert learning_rate(2000, optim) == pytest.approx(6e-4)
    middle = (2000 + 500_000) // 2
    assert learning_rate(middle, optim) == pytest.approx((6e-4 + 6e-5) / 2)
    assert learning_rate(500_000, optim) == pytest.approx(6e-5)
    assert learning_rate(10**7, optim) == 6e-5
    # nanoGPT's formula, written out, at an arbitrary step
    step = 123_456
    ratio = (step - 2000) / (500_000 - 2000)
    assert learning_rate(step, optim) == pytest.approx(
        6e-5 + 0.5 * (1 + math.cos(math.pi * ratio)) * 5.4e-4)


# ---- launch environment --------------------------------------------------------------------------


def test_srun_variables_become_torch_ones():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
           "SLURM_TASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    dist_env = setup_distributed_env(env)
    assert (dist_env.rank, dist_env.local_rank,
            dist_env.world_size, dist_env.local_world_size) == (5, 1, 8, 4)
    assert env["RANK"] == "5" and env["LOCAL_WORLD_SIZE"] == "4"


def test_srun_without_master_address_says_what_to_export():
    with pytest.raises(UsageError, match="MASTER_ADDR and MASTER_PORT not set"):
        setup_distributed_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                               "SLURM_NTASKS_PER_NODE": "2"})


def test_deepspeed_launchers_local_size_becomes_local_world_size():
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert setup_distributed_env(env).local_world_size == 2 and env["LOCAL_WORLD_SIZE"] == "2"


def test_torchrun_variables_win_over_slurm_ones():
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "h", "MASTER_PORT": "1", "SLURM_PROCID": "7", "SLURM_NTASKS": "16"}
    assert setup_distributed_env(env).world_size == 2


def test_plain_python_is_a_world_of_one_on_a_free_port():
    env = {}
    dist_env = setup_distributed_env(env)
    assert (dist_env.rank, dist_env.world_size) == (0, 1)
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0


@pytest.mark.parametrize("local_world_size", [1, 2, 4, 8])
def test_a_process_that_sees_all_local_gpus_takes_its_local_rank(local_world_size):
    for device_count in (local_world_size, 8):
        for local_rank in range(local_world_size):
            assert local_gpu_index(local_rank, local_world_size, device_count) == local_rank


@pytest.mark.parametrize("local_rank", [0, 1, 3, 7])
def test_a_process_given_one_gpu_takes_device_zero(local_rank):
    assert local_gpu_index(local_rank, 8, device_count=1) == 0


@pytest.mark.parametrize(("local_rank", "local_world_size", "device_count"),
                         [(3, 4, 2), (0, 8, 4), (5, 8, 7), (2, 2, 2)])
def test_gpus_that_cannot_be_shared_one_per_process_are_a_usage_error(local_rank, local_world_size,
                                                                       device_count):
    with pytest.raises(UsageError) as err:
        local_gpu_index(local_rank, local_world_size, device_count, visible_devices="2,3")
    message = str(err.value)
    assert f"LOCAL_RANK {local_rank}" in message and f"sees {device_count} GPUs" in message
    assert "CUDA_VISIBLE_DEVICES=2,3" in message and "--gpus-per-task=1" in message
    assert "\n" not in message


def test_plain_srun_with_one_gpu_per_task_trains_on_device_zero(monkeypatch):
    """srun --gpus-per-task=1: CUDA_VISIBLE_DEVICES holds one GPU, LOCAL_RANK goes up to 3."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    env = DistEnv(rank=7, local_rank=3, world_size=8, local_world_size=4)
    assert env.device == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert env.device == torch.device("cuda", 3)


# ---- checkpoints ---------------------------------------------------------------------------------


def _saved_tag(run, step, files=("model.pt", "trainer_rank00000.pt",
                                  "zero_pp_rank_1_mp_rank_00_optim_states.pt")):
    """A tag saved the way the trainer saves one: files into the .partial folder, then commit."""
    work = run.partial_dir(tag_for(step))
    work.mkdir(parents=True)
    for name in files:
        (work / name).write_bytes(bytes(step))
    commit_tag(run, tag_for(step))
    return run.tag_dir(tag_for(step))


def test_a_committed_tag_is_complete_and_latest_names_it(tmp_path):
    run = RunFolder(tmp_path)
    folder = _saved_tag(run, 4)
    assert run.problem(tag_for(4)) is None
    assert run.resume_tag() == (tag_for(4), None)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", tag_for(4)]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000004"
    assert json.loads((folder / "complete.json").read_text())["files"]["model.pt"] == 4


def test_a_commit_replaces_an_incomplete_tag_of_the_same_step(tmp_path):
    run = RunFolder(tmp_path)
    run.tag_dir(tag_for(4)).mkdir(parents=True)  # an earlier, interrupted run's leftover
    _saved_tag(run, 4)
    assert run.problem(tag_for(4)) is None and run.resume_tag() == (tag_for(4), None)


def test_each_rank_fsyncs_its_own_files_and_rank_zero_the_shared_ones(tmp_path):
    for name in ("model.pt", "trainer_state.json", "mp_rank_00_model_states.pt",
                 "trainer_rank00000.pt", "trainer_rank00001.pt",
                 "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_11_mp_rank_00_model_states.pt"):
        (tmp_path / name).write_text("x")
    assert [p.name for p in rank_files(tmp_path, 1)] == [
        "trainer_rank00001.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert [p.name for p in rank_files(tmp_path, 0)] == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "model.pt",
        "mp_rank_00_model_states.pt", "trainer_rank00000.pt", "trainer_state.json"]


def test_retention_keeps_the_last_k_complete_tags_and_removes_leftovers(tmp_path):
    run = RunFolder(tmp_path)
    for step in (4, 8, 12, 16):
        _saved_tag(run, step)
    (run.tag_dir(tag_for(12)) / "model.pt").unlink()  # damaged after its save
    run.tag_dir(tag_for(20)).mkdir()  # a tag without complete.json
    run.partial_dir(tag_for(24)).mkdir()  # an interrupted save
    prune_tags(run, keep_last=2)
    assert run.tags() == [tag_for(8), tag_for(16)]  # the 2 newest complete ones
    assert not list(run.checkpoints.glob("*.partial"))


def test_retention_never_deletes_the_tag_latest_names_nor_newer_complete_ones(tmp_path):
    run = RunFolder(tmp_path)
    for step in (4, 8, 12):
        _saved_tag(run, step)
    run.latest_file.write_text(tag_for(8))  # edited by hand
    prune_tags(run, keep_last=1)
    assert run.tags() == [tag_for(8), tag_for(12)]


def test_a_rewind_points_latest_before_the_bad_step_and_removes_the_tags_after_it(tmp_path):
    run = RunFolder(tmp_path)
    for step in (4, 8, 12):
        _saved_tag(run, step)
    (run.tag_dir(tag_for(8)) / "model.pt").unlink()  # damaged: not a tag to go back to
    run.tag_dir(tag_for(16)).mkdir()  # a tag without complete.json, after the bad step
    assert rewind_tags(run, before_step=12) == tag_for(4)  # the newest complete tag before 12
    assert run.latest_file.read_text() == tag_for(4)
    assert run.tags() == [tag_for(4)]  # those after it may hold weights of the bad steps
    assert rewind_tags(run, before_step=4) is None  # none before: nothing changes
    assert run.latest_file.read_text() == tag_for(4) and run.tags() == [tag_for(4)]


def test_resuming_another_model_shape_names_the_fields(tiny, tmp_path):
    saved = {"model_config": dataclasses.asdict(tiny.model), "world_size": 2, "zero_stage": 1}
    changed = dataclasses.replace(tiny.model, n_layer=3, n_embd=96, attn_impl="math")
    with pytest.raises(UsageError, match=r"model.n_layer 2 -> 3, model.n_embd 64 -> 96:") as err:
        check_resumable(saved, changed, 2, 1, tmp_path)
    assert "attn_impl" not in str(err.value)  # a kernel choice may change on resume
    check_resumable(saved, dataclasses.replace(tiny.model, attn_impl="math"), 2, 1, tmp_path)


def test_another_world_size_or_zero_stage_resumes_elastically(tiny, tmp_path):
    saved = {"model_config": dataclasses.asdict(tiny.model), "world_size": 2, "zero_stage": 1}
    assert check_resumable(saved, tiny.model, 2, 1, tmp_path) is False
    assert check_resumable(saved, tiny.model, 4, 1, tmp_path) is True
    assert check_resumable(saved, tiny.model, 2, 3, tmp_path) is True


def test_unreadable_run_state_is_a_usage_error(tmp_path):
    run = RunFolder(tmp_path)
    _saved_tag(run, 4, files=(RUN_STATE,))
    (run.tag_dir(tag_for(4)) / RUN_STATE).write_text("{")
    with pytest.raises(UsageError, match="is unreadable"):
        read_run_state(run, tag_for(4))


def test_rng_states_round_trip():
    states = rng_states()
    expected = torch.rand(3)
    torch.rand(5)
    restore_rng_states(states)
    assert torch.equal(torch.rand(3), expected)


class _Payload:
    """What an untrusted pickle could carry: unpickling it would run its __reduce__."""

    def __reduce__(self):
        return (print, ("unpickled",))


def test_rank_state_files_load_without_unpickling_anything_but_tensors_and_numpy_arrays(tmp_path):
    state = {"ema": {"num_updates": 3, "decay": 0.99, "shadow": [torch.ones(2)]},
             "rng": rng_states()}
    save_torch_atomic(state, tmp_path / "rank.pt")
    loaded = load_rank_state(tmp_path / "rank.pt")
    assert loaded["ema"]["num_updates"] == 3
    assert torch.equal(loaded["ema"]["shadow"][0], torch.ones(2))
    numpy_state = loaded["rng"]["numpy"]
    assert numpy_state[0] == "MT19937" and (numpy_state[1] == state["rng"]["numpy"][1]).all()
    save_torch_atomic({"rng": _Payload()}, tmp_path / "foreign.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_rank_state(tmp_path / "foreign.pt")


def test_resumed_run_drops_metrics_logged_after_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 8)))
    truncate_metrics(path, last_step=4)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]


# ---- data mixing, MFU ----------------------------------------------------------------------------


def test_stream_proportions_left_unset_share_what_is_left(tiny):
    tiny.data.streams = [StreamConfig("a", 0.5), StreamConfig("b"), StreamConfig("c")]
    assert training_locations(tiny) == [("a", 0.5), ("b", 0.25), ("c", 0.25)]
    tiny.data.streams = [StreamConfig("a", 0.7), StreamConfig("b", 0.7)]
    with pytest.raises(UsageError, match="must be positive and sum to at most 1"):
        training_locations(tiny)


@pytest.mark.parametrize("device, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("Tesla T4", None),
])
def test_mfu_peak_follows_the_device(device, peak):
    assert peak_flops(device) == peak
