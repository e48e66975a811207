"""A corpus tokenized in N slices (owt_to_mds.py --slice I/N on N tasks) and merged
(--merge-slices N): the dataset a one-task build writes, byte for byte, for N = 1, 2, 3; an
interrupted slice is redone alone; a merge of slices of other settings or of unfinished slices is
one line."""

import json

import pytest
from mds_testing import (
    files_of,
    generated_documents,
    manifest_of,
    read_samples,
    write_jsonl,
)

from aogpt.data_prep import packing, slices, sources
from aogpt.data_prep.owt_to_mds import main

FLAGS = ["--seq-len", "64", "--val-fraction", "0.1", "--samples-per-shard", "25", "--workers",
         "1", "--docs-per-chunk", "7"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Seven .jsonl files of unequal sizes, and a .txt document among them."""
    folder = tmp_path_factory.mktemp("corpus")
    documents = generated_documents(count=140, seed=3)
    sizes = [5, 40, 12, 30, 3, 25, 24]
    start = 0
    for number, size in enumerate(sizes):
        write_jsonl(folder / f"part{number}.jsonl", documents[start:start + size])
        start += size
    (folder / "part3b.txt").write_text(documents[-1])
    return folder


@pytest.fixture(scope="module")
def one_task(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "data"
    assert main(["--out", str(out), "--source", str(corpus), *FLAGS]) == 0
    return out


def build_in_slices(out, corpus, count: int) -> None:
    for index in reversed(range(count)):  # in any order: here the last first
        assert main(["--out", str(out), "--source", str(corpus), *FLAGS,
                     "--slice", f"{index}/{count}"]) == 0
    assert main(["--out", str(out), "--source", str(corpus), *FLAGS,
                 "--merge-slices", str(count)]) == 0


@pytest.mark.parametrize("count", [1, 2, 3])
def test_slices_merged_are_the_one_task_build_byte_for_byte(one_task, corpus, tmp_path, count):
    out = tmp_path / "data"
    build_in_slices(out, corpus, count)
    assert files_of(out) == files_of(one_task)  # every shard and index.json
    assert manifest_of(out) == manifest_of(one_task)
    settings = [json.loads((folder / "manifest.json").read_text())["settings"]
                for folder in (out, one_task)]
    assert settings[0] == settings[1]
    assert not (out / slices.FOLDER).exists()  # the slices are gone once merged
    assert len(read_samples(out / "train")) == manifest_of(out)["splits"]["train"]["samples"]


def test_every_file_is_in_exactly_one_slice_in_order(corpus):
    inputs = [sources.resolve(str(corpus))]
    every = [file for source in inputs for file in source.files]
    for count in (1, 2, 3, 5, 9):
        parts = [[file for source in slices.slice_sources(inputs, index, count)
                  for file in source.files] for index in range(count)]
        assert [file for part in parts for file in part] == every
    assert all(slices.slice_sources(inputs, index, 3) for index in range(3))  # none idle here


def test_an_interrupted_slice_is_redone_alone_and_the_merge_waits_for_it(
        one_task, corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "data"
    args = ["--out", str(out), "--source", str(corpus), *FLAGS]
    assert main([*args, "--slice", "0/3"]) == 0 and main([*args, "--slice", "2/3"]) == 0
    finished = {path: path.stat().st_mtime_ns for path in (out / slices.FOLDER).rglob("*")}
    real, done = packing.tokenize_chunk, []

    def interrupted(*chunk_args):  # Ctrl-C after two chunks of slice 1
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(real(*chunk_args))
        return done[-1]

    monkeypatch.setattr(packing, "tokenize_chunk", interrupted)
    assert main([*args, "--slice", "1/3"]) == 130
    monkeypatch.setattr(packing, "tokenize_chunk", real)
    capsys.readouterr()
    assert main([*args, "--merge-slices", "3"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"error: slice 1 of 3 is not finished ({out / slices.FOLDER / '1-of-3'} has "
                     f"no slice.json): run it with --slice 1/3 (alone; the finished slices are "
                     f"kept), then merge again")
    assert main([*args, "--slice", "1/3"]) == 0
    assert "resuming the interrupted slice 1 of 3" in capsys.readouterr().out
    assert all(path.stat().st_mtime_ns == mtime for path, mtime in finished.items())
    assert main([*args, "--merge-slices", "3"]) == 0
    assert files_of(out) == files_of(one_task)


def test_a_merge_of_slices_built_with_other_settings_is_one_line(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    args = ["--out", str(out), "--source", str(corpus), *FLAGS]
    assert main([*args, "--slice", "0/2"]) == 0
    assert main([*args, "--slice", "1/2", "--val-fraction", "0.2"]) == 0
    capsys.readouterr()
    assert main([*args, "--merge-slices", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: slice 1 of 2 in {out / slices.FOLDER / '1-of-2'} was built with other settings "
        f"or inputs than this merge: run it again with this command's flags and --slice 1/2, "
        f"then merge again")
    assert not (out / "train").exists() and (out / slices.FOLDER / "0-of-2").is_dir()


@pytest.mark.parametrize("flags, words", [
    (["--slice", "3/3"], "--slice 3/3: give I/N with 0 <= I < N"),
    (["--slice", "x"], "--slice x: give I/N with 0 <= I < N"),
    (["--slice", "0/2", "--merge-slices", "2"], "give one"),
    (["--merge-slices", "0"], "--merge-slices must be at least 1"),
])
def test_bad_slice_flags_are_one_line(corpus, tmp_path, capsys, flags, words):
    assert main(["--out", str(tmp_path / "data"), "--source", str(corpus), *FLAGS, *flags]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
