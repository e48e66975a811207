"""aogpt.data_prep.manifest: the readers' contract, with one-line errors that say how to fix."""

import json

import pytest

from aogpt import UsageError
from aogpt.data_prep import manifest, tokenizer


def _write(folder, **changes) -> dict:
    content = manifest.new_manifest(
        "pretrain",
        "openwebtext",
        "test",
        1024,
        tokenizer.describe(tokenizer.load_gpt2()),
        {"train": {"path": "train", "samples": 1}, "val": {"path": "val", "samples": 0}},
    )
    content.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    manifest.write_manifest(folder / manifest.FILENAME, content)
    return content


def test_round_trip_and_split_paths(tmp_path):
    written = _write(tmp_path)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "index.json").write_text("{}")
    assert manifest.read_manifest(tmp_path) == written
    assert manifest.split_path(tmp_path, "train") == tmp_path / "train"
    manifest.check_compatible(written, 1024)


def test_missing_manifest_says_how_to_build_one(tmp_path):
    with pytest.raises(UsageError, match="no manifest.json.*owt_to_mds.py"):
        manifest.read_manifest(tmp_path)
    with pytest.raises(UsageError, match="does not exist.*owt_to_mds.py"):
        manifest.read_manifest(tmp_path / "absent")


def test_invalid_or_foreign_manifest_is_refused(tmp_path):
    (tmp_path / manifest.FILENAME).write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        manifest.read_manifest(tmp_path)
    (tmp_path / manifest.FILENAME).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(UsageError, match="not an aogpt data manifest"):
        manifest.read_manifest(tmp_path)
    _write(tmp_path, version=99)
    with pytest.raises(UsageError, match="version 99"):
        manifest.read_manifest(tmp_path)


def test_unknown_or_missing_split_is_refused(tmp_path):
    _write(tmp_path)
    with pytest.raises(UsageError, match="no split 'test' \\(it has: train, val\\)"):
        manifest.split_path(tmp_path, "test")
    with pytest.raises(UsageError, match="index.json is missing"):
        manifest.split_path(tmp_path, "val")


def test_other_tokenizer_or_sequence_length_is_incompatible(tmp_path):
    written = _write(tmp_path)
    with pytest.raises(UsageError, match="--seq-len 512 or set model.block_size=1024"):
        manifest.check_compatible(written, 512)
    other = dict(written, tokenizer={"name": "gpt2", "ranks_sha256": "0" * 64})
    with pytest.raises(UsageError, match="rebuild the data"):
        manifest.check_compatible(other, 1024)
