"""owt_to_mds.py: exact token streams, the same output for any worker count, resumable, strict."""

import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import psutil
import pytest
import tiktoken
from conftest import REPO, run_cli
from mds_testing import (
    OWT_TO_MDS,
    FakeHub,
    files_of,
    generated_documents,
    in_val,
    manifest_of,
    read_samples,
    real_or_generated_documents,
    token_stream,
    write_jsonl,
)

from aogpt import UsageError
from aogpt.data_prep import manifest as manifest_lib
from aogpt.data_prep import packing, sources
from aogpt.data_prep.owt_to_mds import main
from aogpt.data_prep.tokenizer import EOS, RANKS_SHA256, load_gpt2

SEQ_LEN = 64
SAMPLES_PER_SHARD = "4"  # many small shards: an interrupted run stops with some written, some not


@pytest.fixture
def documents(request) -> list[str]:
    return real_or_generated_documents(request)


def cli_args(out, *sources_, workers=1, extra=()) -> list[str]:
    return ["--out", str(out), "--source", *map(str, sources_), "--seq-len", str(SEQ_LEN),
            "--workers", str(workers), "--val-fraction", "0.1", *extra]


def build(out, *sources_, workers=1, extra=()) -> int:
    return main(cli_args(out, *sources_, workers=workers, extra=extra))


def test_samples_concatenate_to_the_tokenized_document_stream(tmp_path, documents):
    assert build(tmp_path / "out", write_jsonl(tmp_path / "docs.jsonl", documents)) == 0
    manifest = manifest_lib.read_manifest(tmp_path / "out")
    for split, wanted in (("train", False), ("val", True)):
        stream = token_stream([text for text in documents if in_val(text, 0.1) == wanted])
        counts = manifest["splits"][split]
        samples = read_samples(manifest_lib.split_path(tmp_path / "out", split))
        assert samples.shape == (len(stream) // SEQ_LEN, SEQ_LEN)
        np.testing.assert_array_equal(samples.reshape(-1), stream[: samples.size])
        assert counts["tokens"] == len(stream) and counts["samples"] == len(samples)
        assert counts["dropped_tail_tokens"] == len(stream) % SEQ_LEN
        assert counts["documents"] == sum(in_val(text, 0.1) == wanted for text in documents)
    assert manifest["splits"]["val"]["samples"] > 0
    assert manifest["kind"] == "pretrain" and manifest["seq_len"] == SEQ_LEN
    assert manifest["tokenizer"]["ranks_sha256"] == RANKS_SHA256


def test_output_is_identical_for_any_worker_count_chunk_size_and_start(tmp_path, documents):
    """Workers forked (this process alone: the command line) or spawned (another thread runs, as
    under pytest-xdist) write the same bytes as one process."""
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    shards = ["--samples-per-shard", "16"]
    assert build(tmp_path / "one", corpus, workers=1, extra=shards) == 0
    assert build(tmp_path / "two", corpus, workers=2, extra=[*shards, "--docs-per-chunk", "3"]) == 0
    waiting = threading.Event()
    thread = threading.Thread(target=waiting.wait)
    thread.start()
    try:
        assert packing.start_method() == "spawn"
        assert build(tmp_path / "spawned", corpus, workers=2, extra=shards) == 0
    finally:
        waiting.set()
        thread.join()
    one = files_of(tmp_path / "one")
    assert len([name for name in one if name.endswith(".mds")]) > 3
    for other in ("two", "spawned"):
        assert files_of(tmp_path / other) == one, other
        assert manifest_of(tmp_path / other) == manifest_of(tmp_path / "one")


def test_every_local_format_gives_the_same_samples(tmp_path, documents):
    write_jsonl(tmp_path / "reference.jsonl", documents)
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, text in enumerate(documents):
        (folder / f"doc_{i:04d}.txt").write_text(text)
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt") as stream:
        stream.write("".join(json.dumps({"text": text}) + "\n" for text in documents))
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": documents}), tmp_path / "docs.parquet", row_group_size=7)
    # OpenWebText's layout: urlsf_subsetNN.tar holding .xz subsets, each an xz'd tar of .txt files.
    half = len(documents) // 2
    subsets = [_xz_subset(documents[:half]), _xz_subset(documents[half:])]
    (tmp_path / "subset.xz").write_bytes(subsets[0])
    with tarfile.open(tmp_path / "urlsf_subset00.tar", "w") as archive:
        for i, data in enumerate(subsets):
            _add(archive, f"openwebtext/urlsf_subset00-{i}_data.xz", data)
    with tarfile.open(tmp_path / "documents.tar.gz", "w:gz") as archive:
        for i, text in enumerate(documents):
            _add(archive, f"docs/{i:04d}.txt", text.encode())

    assert build(tmp_path / "reference", tmp_path / "reference.jsonl") == 0
    expected = files_of(tmp_path / "reference" / "train")
    for name, inputs in {
        "txt": [folder],
        "gz": [tmp_path / "docs.jsonl.gz"],
        "parquet": [tmp_path / "docs.parquet"],
        "tar": [tmp_path / "urlsf_subset00.tar"],
        "tar_of_txt": [tmp_path / "documents.tar.gz"],
        "xz_then_txt": [tmp_path / "subset.xz", *sorted(folder.iterdir())[half:]],
    }.items():
        assert build(tmp_path / f"from_{name}", *inputs) == 0, name
        assert files_of(tmp_path / f"from_{name}" / "train") == expected, name


def _xz_subset(texts: list[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for i, text in enumerate(texts):
            _add(archive, f"{i:07d}-{i:032x}.txt", text.encode())
    return buffer.getvalue()


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def test_non_utf8_bytes_are_replaced_and_counted(tmp_path, capsys):
    folder = tmp_path / "txt"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"caf\xe9 au lait, " * 40 + b"\xff\xfe end")
    (folder / "b.txt").write_bytes(b"clean text, " * 40)
    (folder / "c.jsonl").write_bytes(b'{"text": "na\xefve, " }\n' * 30)
    assert build(tmp_path / "out", folder, extra=["--val-fraction", "0"]) == 0
    assert "note: 72 bytes in 31 documents were not UTF-8 and became U+FFFD" in (
        capsys.readouterr().out)
    train = manifest_lib.read_manifest(tmp_path / "out")["splits"]["train"]
    assert train["replaced_bytes"] == 42 + 30 and train["replaced_documents"] == 1 + 30
    expected = token_stream(
        [
            ("caf\ufffd au lait, " * 40 + "\ufffd\ufffd end"),
            "clean text, " * 40,
            *["na\ufffdve, "] * 30,
        ]
    )
    np.testing.assert_array_equal(
        read_samples(tmp_path / "out" / "train").reshape(-1), expected[: train["samples"] * SEQ_LEN]
    )


def test_complete_output_is_left_alone_unless_overwrite(tmp_path, documents, capsys):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    assert build(tmp_path / "out", corpus) == 0
    index = tmp_path / "out" / "train" / "index.json"
    before = index.stat().st_mtime_ns
    assert build(tmp_path / "out", corpus) == 0
    assert "complete already" in capsys.readouterr().out
    assert index.stat().st_mtime_ns == before
    assert build(tmp_path / "out", corpus, extra=["--overwrite"]) == 0
    assert index.stat().st_mtime_ns != before and not (tmp_path / "out" / ".partial").exists()


def test_complete_output_built_with_other_settings_is_refused(tmp_path, documents, capsys):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    assert build(tmp_path / "out", corpus) == 0
    assert build(tmp_path / "out", corpus, extra=["--val-fraction", "0.2"]) == 2
    assert "built with other settings" in capsys.readouterr().err


def test_overwrite_refuses_a_split_folder_holding_a_file_it_did_not_write(tmp_path, documents):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    out = tmp_path / "out"
    assert build(out, corpus) == 0
    (out / "train" / "notes.txt").write_text("precious")
    before = files_of(out), (out / "manifest.json").read_bytes()
    result = run_cli(OWT_TO_MDS, *cli_args(out, corpus, extra=["--overwrite"]))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: output folder {out} holds 'train/notes.txt', which train/index.json does not "
        f"list, so it is not this tool's to delete: move it elsewhere or choose another --out "
        f"(nothing was deleted)"
    ]
    assert (files_of(out), (out / "manifest.json").read_bytes()) == before  # not half deleted
    assert len(read_samples(out / "train")) == manifest_lib.read_manifest(out)["splits"]["train"][
        "samples"]
    (out / "train" / "notes.txt").unlink()  # moved away: now the rebuild goes ahead
    assert build(out, corpus, extra=["--overwrite"]) == 0
    assert files_of(out) == {name: data for name, data in before[0].items()
                             if name != "train/notes.txt"}


def test_an_empty_val_split_names_the_smallest_val_fraction_that_fills_it(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "docs.jsonl", generated_documents(40))
    default = ["--val-fraction", "0.0005"]  # the default, given after build()'s own
    assert build(tmp_path / "small", corpus, extra=[*default, "--docs-per-chunk", "7"]) == 0
    (warning,) = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert warning.startswith("warning: val/ has no samples: --val-fraction 0.0005 sent 0 of 40 "
                              "documents there (0 tokens; a sample takes 64); --val-fraction ")
    fraction = float(re.fullmatch(r".*; --val-fraction ([\d.e-]+) or more gives it at least one",
                                  warning).group(1))
    for name, value, has_samples in (("enough", fraction, True), ("less", fraction / 1.15, False)):
        assert build(tmp_path / name, corpus, extra=["--val-fraction", str(value)]) == 0
        val = manifest_lib.read_manifest(tmp_path / name)["splits"]["val"]
        assert (val["samples"] > 0) == has_samples, (name, value)
    assert len(read_samples(tmp_path / "enough" / "val")) > 0


def test_one_txt_file_is_told_to_become_several_documents_not_more_text(tmp_path, capsys):
    """A .txt file is one document, and a document goes whole to one split: no --val-fraction and
    no more text in that file can give both splits a sample."""
    text = tmp_path / "book.txt"
    text.write_text(" ".join(generated_documents(40)))
    advice = ("the input is one document (a .txt file is one), which goes whole to one split: "
              'give the text as several documents (a .jsonl with one {"text": ...} per line, or '
              "a folder of .txt files)")
    assert build(tmp_path / "to_train", text, extra=["--val-fraction", "0.01"]) == 0
    assert f"warning: val/ has no samples: --val-fraction 0.01 sent 0 of 1 documents there " \
           f"(0 tokens; a sample takes 64); {advice}" in capsys.readouterr().out
    assert build(tmp_path / "to_val", text, extra=["--val-fraction", "0.99"]) == 2
    assert capsys.readouterr().err.endswith("error: the training split has 0 tokens, not enough "
                                            f"for one sample of --seq-len 64: {advice}\n")


def test_help_says_a_txt_file_is_one_document_and_how_to_give_one_per_line():
    help_text = " ".join(run_cli(OWT_TO_MDS, "--help").stdout.split())
    assert "A .txt file is one document" in help_text
    assert 'for one document per line, write .jsonl with one {"text": ...} per line' in help_text


def test_compressed_shards_hold_the_same_samples(tmp_path, documents):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    assert build(tmp_path / "plain", corpus) == 0
    assert build(tmp_path / "zstd", corpus, extra=["--compression", "zstd:7"]) == 0
    assert next((tmp_path / "zstd" / "train").glob("shard.*.mds.zstd"))
    np.testing.assert_array_equal(
        read_samples(tmp_path / "zstd" / "train"), read_samples(tmp_path / "plain" / "train")
    )


def test_a_log_file_gets_plain_progress_lines_and_a_closing_summary(tmp_path, documents):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    out, log = tmp_path / "out", tmp_path / "build.log"
    with open(log, "w") as stream:  # not a terminal, as under SLURM or nohup
        done = subprocess.run([sys.executable, OWT_TO_MDS, *cli_args(out, corpus)],
                              stdout=stream, stderr=subprocess.STDOUT, cwd=REPO)
    assert done.returncode == 0, log.read_text()
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert any(line.startswith("tokenize: ") for line in lines)
    splits = manifest_lib.read_manifest(out)["splits"]
    tokens = splits["train"]["tokens"] + splits["val"]["tokens"]
    done_line = (rf"done in \d+ s: {len(documents):,} documents, {tokens:,} tokens -> "
                 rf"{re.escape(str(out))}; tokenized at .* tokens/s .*")
    assert re.fullmatch(done_line, lines[-3]), lines[-3]
    assert lines[-2:] == [
        f"  {name}: {split['samples']:,} samples of {SEQ_LEN} tokens from "
        f"{split['documents']:,} documents ({split['tokens']:,} tokens) in {out / name}"
        for name, split in splits.items()
    ]


# ---- interrupted runs ----------------------------------------------------------------------------


def _kill_when(args: list[str], ready) -> tuple[int, list[psutil.Process]]:
    """Starts owt_to_mds.py, SIGKILLs its main process once ready() holds; returns its workers."""
    process = subprocess.Popen(
        [sys.executable, OWT_TO_MDS, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    try:
        while not ready():
            assert process.poll() is None, "the build ended before it could be interrupted"
            assert time.monotonic() < deadline, "the build never got to the interruption point"
            time.sleep(0.002)
        workers = psutil.Process(process.pid).children()
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        return process.returncode, workers
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def _resume_matches_a_clean_build(tmp_path, corpus, args, out):
    result = run_cli(OWT_TO_MDS, *args)
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stdout
    assert build(tmp_path / "clean", corpus, extra=["--samples-per-shard", SAMPLES_PER_SHARD]) == 0
    assert files_of(out) == files_of(tmp_path / "clean")
    assert manifest_of(out) == manifest_of(tmp_path / "clean")
    assert not (out / ".partial").exists()


def _resumable_args(out, corpus, workers: int, docs_per_chunk: int) -> list[str]:
    return ["--out", str(out), "--source", str(corpus), "--seq-len", str(SEQ_LEN),
            "--workers", str(workers), "--val-fraction", "0.1",
            "--docs-per-chunk", str(docs_per_chunk), "--samples-per-shard", SAMPLES_PER_SHARD]


def test_killed_while_tokenizing_resumes_to_the_same_result(tmp_path, documents):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    out = tmp_path / "out"
    args = _resumable_args(out, corpus, workers=1, docs_per_chunk=1)
    chunks = out / ".partial" / "work" / "chunks"
    returncode, _ = _kill_when(args, lambda: any(chunks.glob("*.json")))
    assert returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()
    assert 0 < len(list(chunks.glob("*.json"))) < len(documents)
    _resume_matches_a_clean_build(tmp_path, corpus, args, out)


def test_killed_while_writing_shards_resumes_to_the_same_result(tmp_path, documents):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    out = tmp_path / "out"
    args = _resumable_args(out, corpus, workers=2, docs_per_chunk=5)
    written = out / ".partial" / "work" / "shards" / "train"
    returncode, workers = _kill_when(args, lambda: any(written.glob("*.json")))
    assert returncode == -signal.SIGKILL and not (out / "manifest.json").exists()
    shards_at_kill = len(list(written.glob("*.json")))
    _, alive = psutil.wait_procs(workers, timeout=10)  # orphaned workers notice and exit
    assert not alive
    _resume_matches_a_clean_build(tmp_path, corpus, args, out)
    assert shards_at_kill < manifest_lib.read_manifest(out)["splits"]["train"]["shards"]


# ---- the Hugging Face hub (no network: datasets.load_dataset is replaced) -----------------------


def test_openwebtext_streams_from_the_hubs_parquet_export(tmp_path, documents, monkeypatch):
    datasets = pytest.importorskip("datasets")
    hub = FakeHub([{"text": text} for text in documents])
    monkeypatch.setattr(datasets, "load_dataset", hub)
    assert (
        main(
            [
                "--out",
                str(tmp_path / "out"),
                "--seq-len",
                str(SEQ_LEN),
                "--val-fraction",
                "0",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert hub.calls == [
        {
            "path": "Skylion007/openwebtext",
            "name": None,
            "split": "train",
            "revision": "refs/convert/parquet",
            "streaming": True,
        }
    ]
    manifest = manifest_lib.read_manifest(tmp_path / "out")
    assert manifest["dataset"] == "openwebtext" and "Skylion007/openwebtext" in manifest["source"]
    stream = token_stream(documents)
    np.testing.assert_array_equal(
        read_samples(tmp_path / "out" / "train").reshape(-1),
        stream[: len(stream) // SEQ_LEN * SEQ_LEN],
    )


def test_script_based_hub_dataset_falls_back_to_its_parquet_export(
    tmp_path, documents, monkeypatch
):
    datasets = pytest.importorskip("datasets")
    hub = FakeHub([{"text": text} for text in documents], script_based=True)
    monkeypatch.setattr(datasets, "load_dataset", hub)
    assert build(tmp_path / "out", "someone/old-corpus") == 0
    assert [call["revision"] for call in hub.calls] == [None, sources.PARQUET_REVISION]


# ---- bad input: one line, exit 2, nothing left behind --------------------------------------------


def _fails(capsys, tmp_path, *sources_, extra=(), match: str) -> None:
    out = tmp_path / "out"
    assert build(out, *sources_, extra=extra) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # progress bars may come first
    errors = [line for line in lines if "error: " in line]
    assert errors == [lines[-1]] and lines[-1].startswith("error: ") and match in lines[-1], lines
    assert not out.exists() or not (out / ".partial").exists()


def test_missing_source_path_is_refused(tmp_path, capsys):
    _fails(capsys, tmp_path, tmp_path / "nope.jsonl", match="does not exist")


def test_unsupported_file_type_is_refused(tmp_path, capsys):
    (tmp_path / "notes.docx").write_text("x")
    _fails(capsys, tmp_path, tmp_path / "notes.docx", match="unsupported file type")


def test_a_sequence_length_of_zero_is_refused(tmp_path, capsys):
    (tmp_path / "docs.jsonl").write_text('{"text": "a document"}\n')
    _fails(capsys, tmp_path, tmp_path / "docs.jsonl", extra=("--seq-len", "0"),
           match="--seq-len must be at least 1, got 0")


def test_empty_corpus_is_refused(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("\n")
    _fails(capsys, tmp_path, tmp_path / "empty.jsonl", match="no documents")
    assert not (tmp_path / "out").exists()


def test_jsonl_line_without_text_names_file_and_line(tmp_path, capsys, documents):
    corpus = write_jsonl(tmp_path / "docs.jsonl", documents)
    with corpus.open("a") as stream:
        stream.write('{"title": "no text here"}\n')
    _fails(
        capsys,
        tmp_path,
        corpus,
        match=f"{corpus} line {len(documents) + 1} has no string field 'text'",
    )
    assert not (tmp_path / "out").exists()


def test_output_folder_holding_other_files_is_refused(tmp_path, capsys, documents):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("precious")
    _fails(
        capsys,
        tmp_path,
        write_jsonl(tmp_path / "docs.jsonl", documents),
        extra=["--overwrite"],
        match="which this tool did not write",
    )
    assert (tmp_path / "out" / "thesis.tex").read_text() == "precious"


def test_tokenizer_whose_ids_do_not_fit_uint16_is_refused(tmp_path):
    gpt2 = load_gpt2()
    big = tiktoken.Encoding(
        name="big",
        pat_str=gpt2._pat_str,
        mergeable_ranks=gpt2._mergeable_ranks,
        special_tokens={"<|endoftext|>": EOS, "<|big|>": 70_000},
    )
    spec = packing.PackSpec(seq_len=SEQ_LEN)
    with pytest.raises(UsageError, match="do not fit the uint16"):
        packing.build(iter([]), spec, tmp_path / "work", {}, big, workers=1)
    assert not (tmp_path / "work").exists()


def test_cli_prints_help_and_exits_2_on_bad_input(tmp_path):
    assert "--val-fraction" in run_cli(OWT_TO_MDS, "--help").stdout
    result = run_cli(
        OWT_TO_MDS, "--out", str(tmp_path / "out"), "--source", str(tmp_path / "missing.txt")
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "does not exist" in result.stderr
