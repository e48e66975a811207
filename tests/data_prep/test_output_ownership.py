"""What a builder may replace, with real builders writing real datasets: a dataset (or an
unfinished build) that another builder made is never replaced, --overwrite or not, and no refusal
advises a flag that would; a staging folder is the tool's own or refused; every builder writes a
bucket of a real S3 server (tests/s3_testing.py) through its staging folder, and none ever makes a
path that begins like a URL. Around each refused command, every file is hash-checked unchanged."""

import hashlib
import json
from pathlib import Path

import pytest
from mds_testing import files_of, generated_documents, write_jsonl

from aogpt.data_prep import eval_to_mds, owt_to_mds, remote, sudoku_to_mds, synthetic_to_mds

# each builder, small: its main and its flags (a source file is made by `sources`)
BUILDERS = {
    "owt_to_mds": (owt_to_mds.main, ["--seq-len", "32", "--val-fraction", "0.1",
                                     "--workers", "1"]),
    "eval_to_mds": (eval_to_mds.main, ["--dataset", "wikitext2", "--seq-len", "32",
                                       "--workers", "1"]),
    "synthetic_to_mds": (synthetic_to_mds.main, ["--seq-len", "16", "--train-samples", "40",
                                                 "--val-samples", "8", "--vocab", "16"]),
    "sudoku_to_mds": (sudoku_to_mds.main, ["--box", "2x2", "--train-grids", "30",
                                           "--val-grids", "6", "--givens", "8",
                                           "--puzzles", "2"]),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, list[str]]:
    """The --source flags of the builders that read text."""
    folder = tmp_path_factory.mktemp("sources")
    documents = generated_documents(count=30)
    raw = folder / "wiki.test.raw"
    raw.write_text("".join(f" = Heading {i} = \n\n{text}\n" for i, text in enumerate(documents)))
    return {"owt_to_mds": ["--source", str(write_jsonl(folder / "docs.jsonl", documents))],
            "eval_to_mds": ["--source", str(raw)]}


def command(builder: str, sources: dict, out, *flags: str) -> tuple:
    main, own = BUILDERS[builder]
    return main, [*own, *sources.get(builder, []), "--out", str(out), *flags]


def run(builder: str, sources: dict, out, *flags: str) -> int:
    main, argv = command(builder, sources, out, *flags)
    return main(argv)


@pytest.fixture(scope="module")
def datasets(sources, tmp_path_factory) -> dict[str, Path]:
    """One finished dataset of each builder, which the tests only read."""
    root = tmp_path_factory.mktemp("datasets")
    for builder in BUILDERS:
        assert run(builder, sources, root / builder) == 0, builder
    return {builder: root / builder for builder in BUILDERS}


def hashes(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`, each file's sha256."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file() else "folder" for path in sorted(folder.rglob("*"))}


def one_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# ---- another builder's dataset ----------------------------------------------------------------


def test_every_manifest_records_its_builder(datasets):
    for builder, folder in datasets.items():
        assert json.loads((folder / "manifest.json").read_text())["builder"] == builder


# every builder once as each side in the fast set (a cycle), every other pair with the slow ones
NEXT = [*list(BUILDERS)[1:], "owt_to_mds"]
CYCLE = set(zip(BUILDERS, NEXT, strict=True))
PAIRS = [pytest.param(theirs, ours, id=f"{theirs}-by-{ours}",
                      marks=() if (theirs, ours) in CYCLE else pytest.mark.slow)
         for theirs in BUILDERS for ours in BUILDERS if ours != theirs]


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "--overwrite"])
@pytest.mark.parametrize("theirs, ours", PAIRS)
def test_another_builders_dataset_is_refused_naming_it_and_kept(datasets, sources, capsys,
                                                                theirs, ours, overwrite):
    around = hashes(datasets[theirs].parent)
    code = run(ours, sources, datasets[theirs], *(["--overwrite"] if overwrite else []))
    line = one_error(capsys)
    assert code == 2
    assert (f"holds a dataset that data_prep/{theirs}.py built" in line
            and f"data_prep/{ours}.py replaces only its own, even with --overwrite: choose "
                "another --out (nothing was deleted)" in line), line
    assert "pass --overwrite" not in line
    assert hashes(datasets[theirs].parent) == around


def test_the_same_builders_dataset_of_other_settings_is_rebuilt_with_overwrite(sources, tmp_path,
                                                                               capsys):
    out = tmp_path / "grids"
    assert run("sudoku_to_mds", sources, out) == 0
    capsys.readouterr()
    assert run("sudoku_to_mds", sources, out, "--seed", "1") == 2
    assert "built with other settings or inputs: pass --overwrite" in one_error(capsys)
    assert run("sudoku_to_mds", sources, out, "--seed", "1", "--overwrite") == 0
    assert json.loads((out / "manifest.json").read_text())["settings"]["seed"] == 1


def test_another_builders_unfinished_build_is_refused_and_kept(sources, tmp_path, capsys,
                                                               monkeypatch):
    out = tmp_path / "grids"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sudoku_to_mds, "draw_grids", interrupted)
    assert run("sudoku_to_mds", sources, out) == 130  # Ctrl-C: .partial is kept to resume
    around = hashes(tmp_path)
    assert "grids/.partial/settings.json" in around
    capsys.readouterr()
    assert run("synthetic_to_mds", sources, out, "--overwrite") == 2
    line = one_error(capsys)
    assert "holds an unfinished build of data_prep/sudoku_to_mds.py (.partial)" in line
    assert line.endswith("finish it with that command, or choose another --out (nothing was "
                         "deleted)")
    assert hashes(tmp_path) == around


def test_mds_folders_without_a_manifest_are_refused_even_with_overwrite(datasets, sources,
                                                                        tmp_path, capsys):
    out = tmp_path / "unnamed"
    for split in ("train", "val"):
        for name, data in files_of(datasets["owt_to_mds"] / split).items():
            (out / split / name).parent.mkdir(parents=True, exist_ok=True)
            (out / split / name).write_bytes(data)
    around = hashes(tmp_path)
    assert run("owt_to_mds", sources, out, "--overwrite") == 2
    line = one_error(capsys)
    assert "holds train/ but no manifest.json, so which tool wrote it is unknown" in line
    assert "pass --overwrite" not in line
    assert hashes(tmp_path) == around


# ---- URLs: every builder writes a bucket, and never a folder named like one ------------------


@pytest.mark.parametrize("out", ["s3:/bucket/data", "gs:/bucket/data"])
@pytest.mark.parametrize("builder", BUILDERS)
def test_an_out_that_begins_like_a_url_is_refused_and_nothing_is_made(sources, tmp_path,
                                                                      monkeypatch, capsys,
                                                                      builder, out):
    monkeypatch.chdir(tmp_path)
    assert run(builder, sources, out) == 2
    assert f"--out {out} is neither a URL (write s3://BUCKET/PREFIX" in one_error(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def bucket(s3_server) -> str:
    return s3_server.bucket("aogpt-owners")


@pytest.mark.parametrize("builder", [pytest.param("synthetic_to_mds", marks=pytest.mark.slow),
                                     "sudoku_to_mds"])
def test_a_builder_writes_the_bucket_what_it_writes_a_folder(s3_server, bucket, datasets,
                                                             sources, tmp_path, monkeypatch,
                                                             builder):
    """(owt_to_mds and eval_to_mds: test_remote_data.py.) Run from an empty folder, which stays
    empty: no folder named s3: is made."""
    monkeypatch.chdir(tmp_path)
    url = f"{bucket}/{builder}"
    assert run(builder, sources, url) == 0
    assert list(tmp_path.iterdir()) == []
    local = files_of(datasets[builder])
    assert set(s3_server.objects(url)) == set(local) | {"manifest.json"}
    for name, data in local.items():
        assert s3_server.read(f"{url}/{name}") == data, name
    manifest = json.loads(s3_server.read(f"{url}/manifest.json"))
    assert manifest["builder"] == builder
    assert manifest["splits"] == json.loads(
        (datasets[builder] / "manifest.json").read_text())["splits"]


@pytest.mark.slow  # an upload, then the refusal (the local folder's is a fast test above)
def test_another_builders_dataset_in_a_bucket_is_refused_and_kept(s3_server, bucket, sources,
                                                                  capsys):
    url = f"{bucket}/theirs"
    assert run("sudoku_to_mds", sources, url) == 0
    before = {name: s3_server.read(f"{url}/{name}") for name in s3_server.objects(url)}
    capsys.readouterr()
    assert run("synthetic_to_mds", sources, url, "--overwrite") == 2
    line = one_error(capsys)
    assert (f"--out {url} holds a dataset that data_prep/sudoku_to_mds.py built (sudoku), "
            "and data_prep/synthetic_to_mds.py replaces only its own, even with --overwrite: "
            "choose another prefix (nothing was deleted)") in line
    assert {name: s3_server.read(f"{url}/{name}") for name in s3_server.objects(url)} == before


# ---- the staging folder: the tool's own ------------------------------------------------------


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "--overwrite"])
@pytest.mark.parametrize("settings", ["same", "other"])
def test_a_staging_folder_holding_a_dataset_is_refused_and_kept(s3_server, bucket, datasets,
                                                                sources, capsys, settings,
                                                                overwrite):
    """The dataset a local build of the same (or other) settings wrote: never taken for a staged
    build, uploaded and deleted."""
    url, staging = f"{bucket}/staged-{settings}-{overwrite}", datasets["owt_to_mds"]
    around = hashes(staging.parent)
    flags = [*(["--seq-len", "16"] if settings == "other" else []),
             *(["--overwrite"] if overwrite else [])]
    assert run("owt_to_mds", sources, url, "--staging", str(staging), *flags) == 2
    line = one_error(capsys)
    assert (f"--staging {staging} holds a finished dataset (custom, built by "
            "data_prep/owt_to_mds.py), and a staging folder is this tool's alone") in line
    assert line.endswith("give a new or empty --staging (nothing was deleted)")
    assert hashes(staging.parent) == around
    assert s3_server.objects(url) == {}


def test_a_staging_folder_holding_other_files_is_refused_and_kept(s3_server, bucket, sources,
                                                                  tmp_path, capsys):
    staging = tmp_path / "scratch"
    staging.mkdir()
    (staging / "notes.txt").write_text("mine")
    around = hashes(tmp_path)
    assert run("sudoku_to_mds", sources, f"{bucket}/notes", "--staging", str(staging)) == 2
    assert f"--staging {staging} holds 'notes.txt'" in one_error(capsys)
    assert hashes(tmp_path) == around
    assert s3_server.objects(f"{bucket}/notes") == {}


@pytest.mark.slow  # an upload
def test_an_empty_staging_folder_given_is_used_and_left_empty(s3_server, bucket, sources,
                                                              tmp_path):
    staging = tmp_path / "empty"
    staging.mkdir()
    assert run("sudoku_to_mds", sources, f"{bucket}/empty", "--staging", str(staging)) == 0
    assert "manifest.json" in s3_server.objects(f"{bucket}/empty")
    assert list(staging.iterdir()) == []  # the tool's files went, the folder it was given stays


@pytest.mark.slow  # an upload
def test_after_an_upload_only_the_staged_files_are_removed(s3_server, bucket, sources, tmp_path,
                                                           monkeypatch):
    """A file put into the staging folder while the upload runs is not the tool's to delete."""
    staging, url = tmp_path / "staging", f"{bucket}/shared"
    real_upload = remote.S3Prefix.upload

    def upload(self, relative):
        (staging / "train" / "notes.txt").write_text("mine")
        real_upload(self, relative)

    monkeypatch.setattr(remote.S3Prefix, "upload", upload)
    assert run("sudoku_to_mds", sources, url, "--staging", str(staging)) == 0
    assert hashes(tmp_path) == {"staging": "folder", "staging/train": "folder",
                                "staging/train/notes.txt": hashlib.sha256(b"mine").hexdigest()}
    assert "manifest.json" in s3_server.objects(url)


@pytest.mark.slow  # an interrupted upload, the refusal, the upload finished
def test_the_staging_folder_of_another_urls_upload_is_refused_and_kept(s3_server, bucket,
                                                                       sources, tmp_path,
                                                                       monkeypatch, capsys):
    staging = tmp_path / "staging"

    def interrupted(self, relative):
        raise KeyboardInterrupt

    monkeypatch.setattr(remote.S3Prefix, "upload", interrupted)
    assert run("sudoku_to_mds", sources, f"{bucket}/first", "--staging", str(staging)) == 130
    monkeypatch.undo()
    around = hashes(tmp_path)
    capsys.readouterr()
    assert run("sudoku_to_mds", sources, f"{bucket}/second", "--staging", str(staging)) == 2
    assert (f"--staging {staging} is the staging folder of an upload to {bucket}/first: finish "
            "that one with its command") in one_error(capsys)
    assert hashes(tmp_path) == around
    assert run("sudoku_to_mds", sources, f"{bucket}/first", "--staging", str(staging)) == 0
    assert not staging.exists()  # the interrupted upload, finished: the folder it made is gone
