"""experiments/: arms as config overrides, the runs of the suite, the commands of each scale."""

import sys
from dataclasses import replace
from pathlib import Path

import findings_testing  # noqa: F401  (puts experiments/ on the import path)
import plan
import pytest
import yaml
from conftest import run_cli
from run import Job, main, run_jobs

from aogpt import UsageError


def test_an_arm_file_becomes_dotted_overrides_that_read_back_as_the_same_values():
    tree = {"order": {"kind": "blockwise", "block_size": 8, "blockwise_fixed": True,
                      "p_left_to_right": 0.1}, "logging": {"wandb": "off"}}
    overrides = plan.flatten(tree)
    assert overrides == ["order.kind=blockwise", "order.block_size=8",
                         "order.blockwise_fixed=true", "order.p_left_to_right=0.1",
                         'logging.wandb="off"']  # bare off would read back as false
    for override in overrides:
        key, _, text = override.partition("=")
        section, leaf = key.split(".")
        assert yaml.safe_load(text) == tree[section][leaf]


def test_the_key_arms_train_every_seed_and_the_others_the_first(tmp_path):
    runs = plan.plan_runs("cpu", plan.ARMS, (1337, 1338), tmp_path, tmp_path / "data", [])
    names = [run.name for run in runs]
    assert names == ["l2r-s1337", "l2r-s1338", "uniform-s1337", "uniform-s1338",
                     "mixture10-s1337", "mixture10-s1338", "fixed_random-s1337",
                     "blockwise8-s1337", "blockwise32-s1337", "curriculum-s1337",
                     "curriculum-s1338", "planner-s1337", "planner-s1338", "bell-s1337",
                     "bell-s1338"]
    steps = {run.config.train.max_steps for run in runs}
    tokens = {run.config.train.tokens_per_step for run in runs}
    assert len(steps) == 1 and len(tokens) == 1  # every arm trains the same tokens
    blockwise8 = runs[7].config.order
    assert (blockwise8.kind, blockwise8.block_size, blockwise8.blockwise_fixed) == (
        "blockwise", 8, True)


@pytest.mark.parametrize("scale", plan.SCALES)
def test_every_arm_differs_from_its_base_only_in_orders_and_seed(scale, tmp_path):
    runs = plan.plan_runs(scale, plan.ARMS, (1, 2), tmp_path, tmp_path / "data",
                          ["train.max_steps=7"])
    for run in runs:
        assert run.config.train.max_steps == 7
        assert {o.split("=")[0].split(".")[0] for o in run.overrides} <= {
            "order", "train", "out_dir", "data"}


@pytest.mark.parametrize("extra, schedule_steps", [
    ([], 175),  # base_cpu.yaml's 350 steps
    (["train.max_steps=7"], 4),  # --steps moves the curriculum with the run
    (["train.max_steps=7", "order.schedule_steps=2"], 2),  # the user's value wins
])
def test_the_curriculum_reads_left_to_right_first_over_half_the_run(extra, schedule_steps,
                                                                    tmp_path):
    arm = plan.ARMS_BY_NAME["curriculum"]
    (run,) = plan.plan_runs("cpu", (arm,), (1,), tmp_path, tmp_path / "data", extra)
    order = run.config.order
    assert (order.kind, order.schedule, order.p_left_to_right, order.p_left_to_right_end) == (
        "mixture", "linear", 1.0, 0.1)
    assert order.schedule_steps == schedule_steps


def test_the_new_recipes_train_planner_aligned_and_bell_weighted_orders(tmp_path):
    arms = (plan.ARMS_BY_NAME["planner"], plan.ARMS_BY_NAME["bell"])
    planner, bell = plan.plan_runs("cpu", arms, (1,), tmp_path, tmp_path / "data", [],
                                   "synthetic")
    assert (planner.config.order.kind, planner.config.order.planner,
            planner.config.order.p_planner, planner.config.order.weighting) == (
        "planner", "margin", 0.5, "uniform")
    assert (bell.config.order.kind, bell.config.order.weighting) == ("random", "bell")


@pytest.mark.parametrize("arm", plan.ARMS, ids=[arm.name for arm in plan.ARMS])
def test_on_the_synthetic_language_every_arm_learns_its_128_token_ids(arm, tmp_path):
    (run,) = plan.plan_runs("cpu", (arm,), (1,), tmp_path, tmp_path / "data", [], "synthetic")
    shakespeare = plan.plan_runs("cpu", (arm,), (1,), tmp_path, tmp_path / "data", [])[0]
    assert run.config.model.vocab_size == 128 and shakespeare.config.model.vocab_size == 50304
    # the arm is the same recipe (a schedule spans its share of each base's steps)
    assert replace(run.config.order, schedule_steps=0) == replace(shakespeare.config.order,
                                                                  schedule_steps=0)
    command = plan.train_command("cpu", run, "synthetic")
    assert command[command.index("--config") + 1] == "experiments/configs/base_cpu_synthetic.yaml"


def test_synthetic_dry_run_draws_the_language_and_scores_the_planners_order(tmp_path, capsys):
    out = tmp_path / "findings"
    assert main(["--suite", "findings", "--corpus", "synthetic", "--out", str(out),
                 "--only", "planner", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "data_prep/synthetic_to_mds.py --out" in printed and "--seq-len 64" in printed
    assert "--config experiments/configs/base_cpu_synthetic.yaml" in printed
    assert "--planners margin" in printed
    assert not out.exists()


def test_steps_set_the_schedule_too_on_cpu():
    assert plan.SCALE_SETTINGS["cpu"].step_keys == ("train.max_steps", "optim.decay_steps")


def test_gpu_dry_run_prints_one_deepspeed_launch_per_run_and_writes_nothing(tmp_path):
    out = tmp_path / "findings"
    result = run_cli("experiments/run.py", "--suite", "findings", "--scale", "gpu", "--out",
                     str(out), "--data", str(tmp_path / "owt"), "--dry-run")
    assert result.returncode == 0, result.stderr
    trains = [line for line in result.stdout.splitlines() if "trainer/main.py" in line]
    assert len(trains) == 15  # plan.ARMS: 6 arms with both seeds, 3 with the first
    for line in trains:
        assert line.startswith(str(Path(sys.executable).parent / "deepspeed") + " --master_port ")
        assert "--num_gpus" not in line  # the launcher's default: every local GPU
        assert ("--ds_config ds_configs/zero2.json "
                "--config experiments/configs/base_gpu.yaml") in line
        assert f"data.path={tmp_path / 'owt'}" in line
    evals = [line for line in result.stdout.splitlines() if "trainer/evaluate.py" in line]
    assert len(evals) == 15 + 2  # every run, and the ensemble of each mixture10 run
    assert all("torchrun --standalone --nproc_per_node gpu" in line for line in evals)
    assert all(line.endswith(" --force") for line in evals)  # a stale evaluation is redone
    assert "benchmarks/generation_speed.py --preset small" in result.stdout
    assert not out.exists()


def test_cpu_dry_run_trains_single_processes(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "f"), "--only", "l2r", "--seeds", "5", "--steps", "3",
                 "--set", "optim.warmup_steps=1", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "data_prep/owt_to_mds.py" in printed  # Shakespeare, packed once into OUT/data
    train = next(line for line in printed.splitlines() if "trainer/main.py" in line)
    assert train.startswith(f"{sys.executable} trainer/main.py --ds_config ds_configs/cpu.json")
    assert "train.seed=5" in train and "train.max_steps=3 optim.decay_steps=3" in train
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("args, message", [
    (["--scale", "gpu"], "error: --scale gpu needs --data DIR"),
    (["--only", "l2r,sideways"], "error: --only 'l2r,sideways': unknown arm(s) sideways"),
    (["--seeds", "1,1"], "error: --seeds '1,1': give distinct non-negative integers"),
    (["--scale", "gpu", "--data", "d", "--parallel", "2"], "error: --parallel 2:"),
    (["--scale", "gpu", "--data", "d", "--corpus", "synthetic"],
     "error: --corpus synthetic is a --scale cpu suite"),
    # --dry-run: were a count accepted, the suite would only print its commands, not run them
    # (--parallel 0 is not its default)
    (["--parallel", "0", "--dry-run"], "error: --parallel must be at least 1, got 0"),
    (["--eval-samples", "-1", "--dry-run"], "error: --eval-samples must be at least 1, got -1"),
    (["--speed-steps", "0,16", "--dry-run"],
     "error: --speed-steps '0,16': give step counts of 1 or more"),
    (["--steps", "2", "--dry-run"],
     "error: --steps 2 is shorter than the learning-rate warm-up (20 steps, "
     "optim.warmup_steps of experiments/configs/base_cpu.yaml), and on --scale "
     "cpu --steps is also the length of the schedule: give --steps 20 or more, "
     "or shorten the warm-up too with --set optim.warmup_steps=N (N <= 2)\n"),
    (["--set", "train.max_steps"], "error: --set 'train.max_steps' is not of the form"),
    (["--data", "nowhere"], "error: data folder {cwd}/nowhere does not exist"),
    (["--report-only"], "error: {out}/suite.json does not exist: run the suite into"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, args, message):
    out = tmp_path / "f"
    assert main(["--out", str(out), *args]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(message.format(out=out, cwd=Path.cwd()))
    assert stderr.count("\n") == 1


@pytest.mark.parametrize("flag", ["--out", "--publish"])
def test_a_suite_folder_that_is_a_file_is_refused(tmp_path, capsys, flag):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    args = {"--out": tmp_path / "f", flag: notes}
    assert main([str(part) for pair in args.items() for part in pair]) == 2
    assert capsys.readouterr().err == f"error: {flag} {notes}: {notes} is a file, not a folder\n"
    assert notes.read_text() == "mine"


def test_an_arm_config_with_a_base_is_refused(tmp_path, monkeypatch):
    (tmp_path / "arms").mkdir()
    (tmp_path / "arms" / "l2r.yaml").write_text("base: x.yaml\norder:\n  kind: l2r\n")
    monkeypatch.setattr(plan, "CONFIGS", tmp_path)
    with pytest.raises(UsageError, match="without `base:`"):
        plan.arm_overrides(plan.ARMS_BY_NAME["l2r"])


def test_jobs_wait_for_their_dependencies_and_are_skipped_when_one_fails(tmp_path):
    def job(name, code, after=()):
        script = f"open({str(tmp_path / name)!r}, 'w').close(); raise SystemExit({code})"
        return Job(name, [sys.executable, "-c", script], tmp_path / f"{name}.log", after=after)

    status = run_jobs([job("train", 0), job("broken", 3), job("eval", 0, after=("train",)),
                       job("eval broken", 0, after=("broken",))], parallel=2, env={})
    assert status == {"train": 0, "broken": 3, "eval": 0, "eval broken": None}
    assert not (tmp_path / "eval broken").exists()
    assert (tmp_path / "broken.log").read_text().startswith("\n$ ")
