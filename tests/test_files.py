"""aogpt/files.py: a file is the old one or the new one, never half of one; no temporary stays."""

import json
import os

import pytest

from aogpt import UsageError, check_input_file
from aogpt.files import (
    check_writable_folder,
    staged_folder,
    write_atomic,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


def test_writers_replace_the_file_whole_and_leave_nothing_else(tmp_path):
    path = tmp_path / "sub" / "file.json"  # the folder is made
    write_json_atomic({"a": 1}, path)
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().endswith("\n")
    write_text_atomic(path, "text", durable=True)
    assert path.read_text() == "text"
    write_bytes_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert os.listdir(path.parent) == ["file.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("old")

    def half_then_fail(partial):
        partial.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["file.txt"]


def test_json_is_strict(tmp_path):
    with pytest.raises(ValueError):  # NaN is not JSON: other tools could not read the file
        write_json_atomic({"loss": float("nan")}, tmp_path / "x.json")
    assert not list(tmp_path.iterdir())


def test_a_file_gets_the_permissions_open_gives_whatever_the_writer_chose(tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    path = write_atomic(tmp_path / "w.bin", lambda partial: (partial.write_bytes(b"x"),
                                                            partial.chmod(0o600)))
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_an_input_that_is_a_folder_or_missing_is_named_as_such(tmp_path):
    (tmp_path / "samples.jsonl").write_text("{}")
    assert check_input_file(tmp_path / "samples.jsonl", "--samples", "a JSONL file") == (
        tmp_path / "samples.jsonl")
    with pytest.raises(UsageError, match=f"^--samples {tmp_path} is a folder, not a file: give a "
                                         "JSONL file$"):
        check_input_file(tmp_path, "--samples", "a JSONL file")
    with pytest.raises(UsageError, match="^--samples .*/absent.jsonl does not exist: give a JSONL"):
        check_input_file(tmp_path / "absent.jsonl", "--samples", "a JSONL file")


def test_a_staged_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with staged_folder(target) as staged:
        (staged / "new.txt").write_text("new")
        assert sorted(p.name for p in target.iterdir()) == ["old.txt"]  # untouched until the end
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # nothing hidden left


def test_a_staged_folder_that_fails_leaves_the_old_one_and_no_staging(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(OSError), staged_folder(target) as staged:
        (staged / "half.txt").write_text("half")
        raise OSError("disk full")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_an_earlier_report_without_made_by_is_known_by_its_format(repo):
    """The committed findings' evaluations were written before reports recorded made_by: the
    suite's re-evaluation (--force) may replace them, another command's --force may not."""
    from aogpt.trainer import evaluate, genppl

    legacy = repo / "docs" / "findings" / "evals" / "l2r-s1337.json"
    assert "made_by" not in json.dumps(json.loads(legacy.read_text()))
    assert evaluate.REPORT.wrote(legacy) and not genppl.REPORT.wrote(legacy)
    assert not evaluate.REPORT.wrote(repo / "docs" / "findings" / "runs" / "l2r-s1337" /
                                     "metrics.jsonl")


@pytest.mark.parametrize("path", ["s3:/bucket/run", "s3://bucket/run", "gs:/bucket/x.json"])
def test_a_local_path_that_begins_like_a_url_is_refused_and_not_made(tmp_path, monkeypatch,
                                                                     path):
    """A URL given where a command writes local files (s3://, which a Path cuts to s3:/) would
    become a folder named s3:."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=f"--out {path}: {path} begins like a URL "
                                         f"\\({path.split('/')[0]}\\), and this writes local "
                                         "files: give a local path"):
        check_writable_folder(path, f"--out {path}")
    assert list(tmp_path.iterdir()) == []
