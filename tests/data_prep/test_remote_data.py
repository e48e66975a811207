"""Data prep into a bucket of a real S3 server (tests/s3_testing.py): owt_to_mds.py and
eval_to_mds.py with --out s3://..., verify.py on the bucket, an interrupted upload resumed, and bad
input refused on one line with nothing written to the bucket."""

import json
import subprocess
import sys

import pytest
from conftest import REPO
from mds_testing import EVAL_TO_MDS, OWT_TO_MDS, files_of, generated_documents, write_jsonl

from aogpt.data_prep import remote
from aogpt.data_prep.owt_to_mds import main as owt_to_mds
from aogpt.data_prep.verify import main as verify

FLAGS = ["--seq-len", "64", "--val-fraction", "0.1", "--samples-per-shard", "40", "--workers", "1"]


@pytest.fixture(scope="module")
def bucket(s3_server) -> str:
    return s3_server.bucket("aogpt-prep")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "docs.jsonl",
                       generated_documents(count=120))


@pytest.fixture(scope="module")
def local_build(corpus, tmp_path_factory):
    """The same dataset built into a local folder: what the bucket must hold, byte for byte."""
    out = tmp_path_factory.mktemp("local") / "data"
    assert owt_to_mds(["--out", str(out), "--source", str(corpus), *FLAGS]) == 0
    return out


@pytest.fixture(scope="module")
def uploaded(bucket, corpus, tmp_path_factory) -> str:
    """owt_to_mds.py --out s3://aogpt-prep/owt, as a user runs it."""
    url = f"{bucket}/owt"
    staging = tmp_path_factory.mktemp("staging") / "owt"
    result = run("data_prep/owt_to_mds.py", "--out", url, "--source", str(corpus),
                 "--staging", str(staging), *FLAGS)
    assert result.returncode == 0, result.stderr
    assert not staging.exists()  # the staged copy is gone once uploaded
    return url


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_bucket_receives_byte_for_byte_what_a_local_build_writes(s3_server, uploaded,
                                                                   local_build):
    objects = s3_server.objects(uploaded)
    local = files_of(local_build)
    assert set(objects) == set(local) | {"manifest.json"}  # no upload record left behind
    for name, data in local.items():
        assert s3_server.read(f"{uploaded}/{name}") == data, name
    manifest = json.loads(s3_server.read(f"{uploaded}/manifest.json"))
    assert manifest["splits"] == json.loads((local_build / "manifest.json").read_text())["splits"]
    assert manifest["shard_hashes"] == ["xxh64"]


def test_a_complete_bucket_is_left_alone_on_a_rerun(uploaded, corpus, capsys):
    before = remote.S3Prefix(uploaded, "test").files()
    assert owt_to_mds(["--out", uploaded, "--source", str(corpus), *FLAGS]) == 0
    assert "is complete already: nothing to do" in capsys.readouterr().out
    assert remote.S3Prefix(uploaded, "test").files() == before


def test_verify_checks_every_shard_in_the_bucket(uploaded):
    result = run("data_prep/verify.py", uploaded)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["train", "val"]
    assert all(line.startswith(f"{uploaded}: ") for line in lines)
    assert all(line.endswith("sizes, headers and xxh64 hashes match") for line in lines)


def test_verify_names_a_shard_damaged_in_the_bucket(s3_server, bucket, corpus, tmp_path, capsys):
    url = f"{bucket}/damaged"
    assert owt_to_mds(["--out", url, "--source", str(corpus), "--staging", str(tmp_path / "s"),
                       *FLAGS]) == 0
    flipped, cut = f"{url}/train/shard.00001.mds", f"{url}/train/shard.00002.mds"
    data = bytearray(s3_server.read(flipped))
    data[-10] ^= 0xFF  # same size: only the hash can tell
    s3_server.write(flipped, bytes(data))
    s3_server.write(cut, s3_server.read(cut)[:1000])
    capsys.readouterr()
    assert verify([url]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2
    assert errors[0].startswith(f"error: {flipped}: its xxh64 hash differs from the index's")
    assert errors[1].startswith(f"error: {cut}: 1,000 bytes, the index says ")
    assert verify([url, "--sizes-only"]) == 1  # a listing finds the cut one without downloading
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {cut}: 1,000 bytes, the index says")


def test_an_interrupted_upload_resumes_and_sends_only_what_is_missing(
        bucket, corpus, local_build, tmp_path, monkeypatch, s3_server):
    url, staging = f"{bucket}/interrupted", tmp_path / "staging"
    sent = []
    real_upload = remote.S3Prefix.upload

    def upload(self, relative):
        if len(sent) >= 3:
            raise KeyboardInterrupt  # Ctrl-C once three objects are there
        real_upload(self, relative)
        sent.append(relative)

    monkeypatch.setattr(remote.S3Prefix, "upload", upload)
    args = ["--out", url, "--source", str(corpus), "--staging", str(staging), *FLAGS]
    assert owt_to_mds(args) == 130
    objects = s3_server.objects(url)
    assert remote.UPLOAD_RECORD in objects and "manifest.json" not in objects
    assert (staging / "manifest.json").is_file()  # the build itself is done and kept
    monkeypatch.setattr(remote.S3Prefix, "upload", real_upload)
    counted = []
    monkeypatch.setattr(remote.S3Prefix, "upload",
                        lambda self, relative: counted.append(relative) or real_upload(self,
                                                                                       relative))
    assert owt_to_mds(args) == 0
    assert not set(counted) & set(sent)
    assert len(counted) == len(files_of(local_build)) + 1 - len(sent)
    assert set(s3_server.objects(url)) == set(files_of(local_build)) | {"manifest.json"}
    for name, data in files_of(local_build).items():
        assert s3_server.read(f"{url}/{name}") == data, name


def test_other_settings_need_overwrite_which_replaces_the_old_objects(
        s3_server, bucket, corpus, tmp_path, capsys):
    url = f"{bucket}/replaced"
    first = ["--out", url, "--source", str(corpus), "--staging", str(tmp_path / "s"), *FLAGS]
    assert owt_to_mds([*first, "--samples-per-shard", "10"]) == 0
    before = s3_server.objects(url)
    capsys.readouterr()
    assert owt_to_mds(first) == 2
    assert "holds a finished dataset built with other settings" in capsys.readouterr().err
    assert s3_server.objects(url) == before
    assert owt_to_mds([*first, "--overwrite"]) == 0
    after = s3_server.objects(url)
    assert len([name for name in after if name.endswith(".mds")]) < len(
        [name for name in before if name.endswith(".mds")])  # the old extra shards are gone
    assert verify([url]) == 0


def test_eval_set_into_a_bucket(s3_server, bucket, tmp_path):
    lines = tmp_path / "wiki.test.raw"
    lines.write_text("".join(f" = Heading {i} = \n\n{text}\n"
                             for i, text in enumerate(generated_documents(count=30))))
    url = f"{bucket}/wikitext"
    result = run(EVAL_TO_MDS, "--dataset", "wikitext2", "--source", str(lines), "--out", url,
                 "--seq-len", "64", "--staging", str(tmp_path / "staging"))
    assert result.returncode == 0, result.stderr
    objects = s3_server.objects(url)
    assert {"manifest.json", "index.json", "shard.00000.mds"} <= set(objects)
    assert json.loads(s3_server.read(f"{url}/manifest.json"))["kind"] == "eval"
    assert run("data_prep/verify.py", url).returncode == 0


# ---- bad input: one line, nothing in the bucket -------------------------------------------------

@pytest.mark.parametrize("out, words", [
    ("ftp://host/data", "unknown scheme ftp:// (this command takes a local folder or s3://)"),
    ("gs://bucket/data", "unknown scheme gs:// (this command takes a local folder or s3://)"),
    ("s3://aogpt-prep", "names no prefix"),
    ("s3://no-such-bucket/data", "the bucket no-such-bucket does not exist"),
], ids=["unknown scheme", "a store streaming reads but we do not write", "no prefix",
        "no bucket"])
def test_a_bad_out_url_is_one_line(bucket, corpus, s3_server, out, words):
    result = run(OWT_TO_MDS, "--out", out, "--source", str(corpus), *FLAGS)
    assert result.returncode == 2 and words in one_error_line(result)
    assert s3_server.objects(bucket) == s3_server.objects(bucket)  # (listing works: nothing new)


def test_missing_credentials_are_one_line(bucket, corpus, s3_server, tmp_path):
    env = {name: value for name, value in __import__("os").environ.items()
           if not name.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    result = run(OWT_TO_MDS, "--out", f"{bucket}/nocredentials", "--source", str(corpus), *FLAGS,
                 env=env)
    assert result.returncode == 2
    assert "no S3 credentials found: set AWS_ACCESS_KEY_ID" in one_error_line(result)
    assert not s3_server.objects(f"{bucket}/nocredentials")


def test_a_prefix_holding_another_tools_files_is_refused_and_kept(s3_server, bucket, corpus):
    url = f"{bucket}/theirs"
    s3_server.write(f"{url}/notes.txt", b"mine")
    s3_server.write(f"{url}/train/shard.00000.mds", b"another tool's shard")
    result = run(OWT_TO_MDS, "--out", url, "--source", str(corpus), "--overwrite", *FLAGS)
    assert result.returncode == 2
    assert "holds 'notes.txt', which this tool did not write" in one_error_line(result)
    assert "(nothing was deleted)" in result.stderr
    assert s3_server.objects(url) == {"notes.txt": 4, "train/shard.00000.mds": 20}


def test_verify_of_a_prefix_without_a_manifest_is_one_line(bucket):
    result = run("data_prep/verify.py", f"{bucket}/nothing-here")
    assert result.returncode == 2
    assert "has no manifest.json (not a finished aogpt data folder)" in one_error_line(result)


def test_slices_merged_into_a_bucket_are_the_one_task_build(s3_server, bucket, tmp_path,
                                                             corpus):
    """A corpus of two files sliced over 2 tasks meeting in one --staging folder, merged and
    uploaded: the objects of the local one-task build of the same files."""
    parts = corpus.read_text().splitlines(keepends=True)
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(parts[:60]))
    (folder / "b.jsonl").write_text("".join(parts[60:]))
    url, staging = f"{bucket}/sliced", tmp_path / "shared-staging"
    args = ["--out", url, "--source", str(folder), "--staging", str(staging), *FLAGS]
    reference = tmp_path / "reference"
    assert owt_to_mds(["--out", str(reference), "--source", str(folder), *FLAGS]) == 0
    for index in range(2):
        assert owt_to_mds([*args, "--slice", f"{index}/2"]) == 0
    assert not s3_server.objects(url)  # nothing in the bucket before the merge
    assert owt_to_mds([*args, "--merge-slices", "2"]) == 0
    assert not staging.exists()  # slices and staged copy gone once uploaded
    for name, data in files_of(reference).items():
        assert s3_server.read(f"{url}/{name}") == data, name
    assert set(s3_server.objects(url)) == set(files_of(reference)) | {"manifest.json"}
