"""The run folder: its names, and which checkpoint tag a resume (or a report) takes."""

import json

import pytest

from aogpt import UsageError
from aogpt.run_folder import (
    RunFolder,
    complete_record,
    named_tag,
    step_of,
    tag_for,
)


def _complete_tag(run: RunFolder, step: int, files=("model.safetensors", "trainer_rank00000.pt")):
    """A finished tag: its files (of `step` bytes each), then complete.json listing them."""
    tag = tag_for(step)
    folder = run.tag_dir(tag)
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(bytes(step))
    record = complete_record(folder, tag)
    run.complete_file(tag).write_text(json.dumps(record))
    return folder


def test_the_names_are_the_documented_layout(tmp_path):
    run = RunFolder(tmp_path)
    assert run.final_weights == tmp_path / "final" / "model.safetensors"
    assert run.metrics_file == tmp_path / "metrics.jsonl"
    assert run.config_file == tmp_path / "config.yaml"
    assert run.latest_file == tmp_path / "checkpoints" / "latest"
    assert run.tag_dir(tag_for(1000)) == tmp_path / "checkpoints" / "step_00001000"
    assert run.partial_dir(tag_for(1000)) == tmp_path / "checkpoints" / "step_00001000.partial"
    assert (run.complete_file(tag_for(7))
            == tmp_path / "checkpoints" / "step_00000007" / "complete.json")
    assert step_of(tag_for(1000)) == 1000


def test_complete_record_lists_every_file_with_its_size(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    (tmp_path / "trainer_state.json").write_text("{}")
    (tmp_path / "sub").mkdir()  # folders are not files of the tag
    assert complete_record(tmp_path, "step_00000004") == {
        "tag": "step_00000004", "files": {"model.safetensors": 5, "trainer_state.json": 2}}


def test_latest_naming_a_complete_tag_is_taken_without_a_warning(tmp_path):
    run = RunFolder(tmp_path)
    _complete_tag(run, 4)
    _complete_tag(run, 8)
    run.latest_file.write_text(tag_for(4))  # not the newest: latest is what a save committed
    assert run.problem(tag_for(4)) is None
    assert run.resume_tag() == (tag_for(4), None)


def test_latest_naming_a_missing_tag_falls_back_to_the_newest_complete_tag(tmp_path):
    run = RunFolder(tmp_path)
    for step in (4, 8):
        _complete_tag(run, step)
    run.latest_file.write_text("step_00000099\n")
    missing = run.tag_dir("step_00000099")
    assert run.resume_tag() == (tag_for(8), f"latest names 'step_00000099': {missing} does not "
                                "exist; resuming from step_00000008, the newest complete "
                                "checkpoint")
    assert run.latest_tag() == tag_for(8)


@pytest.mark.parametrize("damage, named", [
    (lambda folder: (folder / "complete.json").unlink(), "has no complete.json"),
    (lambda folder: (folder / "complete.json").write_text("{"), "complete.json is unreadable"),
    (lambda folder: (folder / "trainer_rank00000.pt").unlink(), "trainer_rank00000.pt is missing"),
    (lambda folder: (folder / "model.safetensors").write_bytes(b"x"),
     "model.safetensors has 1 bytes, 8 were written"),
])
def test_a_damaged_tag_is_skipped_and_the_warning_says_why(tmp_path, damage, named):
    run = RunFolder(tmp_path)
    _complete_tag(run, 4)
    damage(_complete_tag(run, 8))
    run.latest_file.write_text(tag_for(8))
    tag, warning = run.resume_tag()
    assert tag == tag_for(4)
    assert named in warning and f"resuming from {tag_for(4)}" in warning


def test_a_partial_tag_is_never_chosen(tmp_path):
    run = RunFolder(tmp_path)
    _complete_tag(run, 4)
    partial = run.partial_dir(tag_for(8))  # an interrupted save, with every file of a tag
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(bytes(8))
    (partial / "complete.json").write_text(json.dumps(complete_record(partial, tag_for(8))))
    assert run.tags() == [tag_for(4)]
    assert run.resume_tag() == (tag_for(4), "no latest file; resuming from step_00000004, the "
                                "newest complete checkpoint")


def test_tags_are_ordered_by_step_not_by_name(tmp_path):
    run = RunFolder(tmp_path)
    for step in (100_000_000, 99_999_999, 5):  # past 8 digits, names no longer sort
        run.tag_dir(tag_for(step)).mkdir(parents=True)
    (run.checkpoints / "universal").mkdir()
    assert run.tags() == [tag_for(5), tag_for(99_999_999), tag_for(100_000_000)]


def test_checkpoints_but_none_complete_is_a_usage_error(tmp_path):
    run = RunFolder(tmp_path)
    run.checkpoints.mkdir()
    run.latest_file.write_text("step_00000099")
    with pytest.raises(UsageError, match="no complete checkpoint .* names 'step_00000099'"):
        run.resume_tag()


def test_nothing_saved_means_nothing_to_resume(tmp_path):
    assert RunFolder(tmp_path).resume_tag() == (None, None)
    assert RunFolder(tmp_path).tags() == []


def test_named_tag_is_latest_as_written_without_checks(tmp_path):
    assert named_tag(tmp_path) is None
    (tmp_path / "latest").write_text("step_00000012\n")
    assert named_tag(tmp_path) == "step_00000012"  # no such folder: load_checkpoint decides
