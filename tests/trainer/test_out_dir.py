"""trainer/out_dir.py: what a training may write beside, what it must never replace. The folders
are made by this project's own writers; the trainings themselves are in test_training_log.py."""

import json

import pytest
import yaml

from aogpt import UsageError
from aogpt.files import write_json_atomic
from aogpt.run_folder import RunFolder
from aogpt.trainer.out_dir import check_out_dir, finished_because, set_aside


def test_a_new_an_empty_or_a_runs_folder_is_accepted(tmp_path):
    check_out_dir(tmp_path / "new")
    check_out_dir(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("a run's folder may hold the user's notes")
    check_out_dir(tmp_path)


def test_logs_and_outputs_of_this_projects_commands_may_sit_beside_a_run(tmp_path):
    (tmp_path / "train.log").write_text("nohup's output\n")
    (tmp_path / ".eval.json.partial-12").write_text("{")
    write_json_atomic({"results": [], "provenance": {"made_by": "trainer/evaluate.py"}},
                      tmp_path / "eval.json")
    # experiments/run.py's record of the run, written before the run starts
    write_json_atomic({"overrides": [], "provenance": {"made_by": "experiments/run.py"}},
                      tmp_path / "suite_run.json")
    (tmp_path / "run.lock").write_text("{}")  # the trainer's own
    check_out_dir(tmp_path)


@pytest.mark.parametrize("case, what", [
    ("dataset", "a dataset (data_prep's)"),
    ("in a dataset", "part of the dataset {tmp_path}"),
    ("new, in a dataset", "part of the dataset {tmp_path}"),
    ("export", "an exported model (aogpt_export.json)"),
    ("checkpoint", "a checkpoint (model.safetensors)"),
    ("runs", "training runs (a, b)"),
    ("files", "files the trainer did not write (e.g. README.md; 2 in all)"),
])
def test_anything_else_is_refused_naming_it(tmp_path, case, what):
    out = tmp_path
    if case.endswith("dataset"):
        (tmp_path / "manifest.json").write_text("{}")
        (tmp_path / "train").mkdir()
        out = {"dataset": tmp_path, "in a dataset": tmp_path / "train",
               "new, in a dataset": tmp_path / "run"}[case]
    elif case == "export":
        (tmp_path / "aogpt_export.json").write_text("{}")
    elif case == "checkpoint":
        (tmp_path / "model.safetensors").write_bytes(b"")
    elif case == "runs":
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "config.yaml").write_text("{}")
    else:
        (tmp_path / "README.md").write_text("# mine")
        (tmp_path / "setup.py").write_text("")
    with pytest.raises(UsageError) as refusal:
        check_out_dir(out)
    assert str(refusal.value) == (
        f"out_dir {out} holds {what.format(tmp_path=tmp_path)}: a training writes into a new or "
        "empty folder, or its own earlier run: choose another out_dir")


def a_run(folder, last_step: int, every: int = 10, max_steps: int = 100) -> RunFolder:
    run = RunFolder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    run.config_file.write_text(yaml.safe_dump({"checkpoint": {"every": every},
                                               "train": {"max_steps": max_steps}}))
    run.metrics_file.write_text("".join(json.dumps({"step": step}) + "\n"
                                        for step in range(1, last_step + 1)))
    return run


def test_a_run_is_finished_when_it_wrote_final_or_reached_a_checkpoint_step(tmp_path):
    assert finished_because(a_run(tmp_path / "early", last_step=9)) is None  # never saved
    assert finished_because(a_run(tmp_path / "saved", last_step=10)) == (
        "a run trained to step 10 (its metrics)")  # its checkpoints were deleted since
    assert finished_because(a_run(tmp_path / "short", last_step=5, max_steps=5)) == (
        "a run trained to step 5 (its metrics)")
    final = a_run(tmp_path / "final", last_step=0)
    final.final.mkdir()
    assert finished_because(final) == f"a finished run ({final.final}/)"


def test_set_aside_moves_the_trainers_files_and_leaves_the_rest(tmp_path):
    run = a_run(tmp_path / "run", last_step=3)
    (run.root / "train.log").write_text("this launch's own log, being written")
    run.lock_file.write_text("{}")
    folder, names = set_aside(run)
    assert folder.parent == run.previous and names == ["config.yaml", "metrics.jsonl"]
    assert sorted(path.name for path in run.root.iterdir()) == ["previous", "run.lock", "train.log"]
    assert set_aside(run) is None  # nothing left to move
