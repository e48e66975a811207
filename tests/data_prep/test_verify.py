"""data_prep/verify.py checks a dataset made by owt_to_mds.py before a long run: each kind of damage
is named on one line with the file and the fix, a good dataset passes."""

import hashlib
import json
import shutil

import pytest
from conftest import run_cli
from mds_testing import generated_documents, write_jsonl

from aogpt.data_prep.owt_to_mds import main as owt_to_mds
from aogpt.data_prep.verify import main as verify


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A dataset of several shards per split, as owt_to_mds.py writes it."""
    root = tmp_path_factory.mktemp("verify")
    source = write_jsonl(root / "docs.jsonl", generated_documents(count=120))
    out = root / "data"
    assert owt_to_mds(["--out", str(out), "--source", str(source), "--seq-len", "64",
                       "--val-fraction", "0.1", "--samples-per-shard", "200",
                       "--workers", "1"]) == 0
    return out


@pytest.fixture
def data(built, tmp_path):
    """A fresh copy to damage."""
    return shutil.copytree(built, tmp_path / "data")


def errors_of(capsys) -> list[str]:
    err = capsys.readouterr().err.strip()
    return err.splitlines() if err else []


def test_a_dataset_as_built_passes_and_its_shards_carry_xxh64_hashes(data):
    index = json.loads((data / "train" / "index.json").read_text())
    assert len(index["shards"]) > 1
    for shard in index["shards"]:
        assert shard["hashes"] == ["xxh64"] and set(shard["raw_data"]["hashes"]) == {"xxh64"}
    result = run_cli("data_prep/verify.py", str(data))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["train", "val"]
    assert all(line.endswith("sizes, headers and xxh64 hashes match") for line in lines)


def test_verify_does_not_import_torch():
    result = run_cli("-c", "import sys; import aogpt.data_prep.verify; "
                           "assert 'torch' not in sys.modules, 'torch imported'")
    assert result.returncode == 0, result.stderr


def test_a_truncated_shard_is_named_with_the_samples_it_lost(data, capsys):
    shard = data / "train" / "shard.00001.mds"
    size = shard.stat().st_size
    with open(shard, "r+b") as file:
        file.truncate(size - 1000)
    assert verify([str(data)]) == 1
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {shard}: {size - 1000:,} bytes, the index says {size:,} "
                            "(truncated: samples 192 to 199 are cut off): re-copy it")
    assert "data_prep/owt_to_mds.py --out" in error and "--overwrite" in error


def test_a_flipped_byte_is_named_by_its_hash(data, capsys):
    shard = data / "val" / "shard.00000.mds"
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x01  # a token of the last sample: size and header still right
    shard.write_bytes(bytes(raw))
    assert verify([str(data)]) == 1
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {shard}: its xxh64 hash differs from the index's")


def test_a_missing_shard_is_named(data, capsys):
    (data / "train" / "shard.00000.mds").unlink()
    assert verify([str(data)]) == 1
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {data / 'train' / 'shard.00000.mds'}: missing: re-copy it")


def test_a_missing_index_is_named(data, capsys):
    (data / "val" / "index.json").unlink()
    assert verify([str(data)]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: {data / 'val' / 'index.json'}: missing: re-copy it from "
                                f"where the dataset was built, or rebuild the dataset with `python "
                                f"data_prep/owt_to_mds.py --out {data} --overwrite` and its "
                                "original arguments"]
    assert "train: " in out and "xxh64 hashes match" in out  # the other split is still checked


def test_a_damaged_offset_table_is_named(data, capsys):
    shard = data / "train" / "shard.00000.mds"
    raw = bytearray(shard.read_bytes())
    raw[0:4] = (7).to_bytes(4, "little")  # the sample count of the header
    shard.write_bytes(bytes(raw))
    assert verify([str(data), "--sizes-only"]) == 0  # what the trainer checks before a run
    capsys.readouterr()
    assert verify([str(data)]) == 1
    (error,) = errors_of(capsys)
    assert error.startswith(f"error: {shard}: its header counts 7 samples, the index 200")


def test_a_dataset_built_without_hashes_is_still_checked(data, capsys):
    """Datasets from before shards carried hashes: sizes, headers and counts only, said so."""
    index_path = data / "train" / "index.json"
    index = json.loads(index_path.read_text())
    for shard in index["shards"]:
        shard["hashes"], shard["raw_data"]["hashes"] = [], {}
    index_path.write_text(json.dumps(index, sort_keys=True))
    manifest = json.loads((data / "manifest.json").read_text())
    index_sha256 = hashlib.sha256(index_path.read_bytes()).hexdigest()
    manifest["splits"]["train"]["index_sha256"] = index_sha256
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert verify([str(data)]) == 0
    train = capsys.readouterr().out.splitlines()[0]
    assert train.endswith("no hashes recorded: files, sizes, headers and counts checked")
    with open(data / "train" / "shard.00000.mds", "r+b") as file:
        file.truncate(100)
    assert verify([str(data)]) == 1
    (error,) = errors_of(capsys)
    assert "shard.00000.mds: 100 bytes, the index says" in error


def test_an_index_that_disagrees_with_the_manifest_is_named(data, capsys):
    index_path = data / "train" / "index.json"
    index = json.loads(index_path.read_text())
    index["shards"].pop()  # a shard dropped from the index: its samples would silently vanish
    index_path.write_text(json.dumps(index, sort_keys=True))
    assert verify([str(data)]) == 1
    errors = errors_of(capsys)
    assert all(error.startswith(f"error: {index_path}: ") for error in errors)
    assert any("not the index the manifest recorded" in error for error in errors)
    assert any("shards, the manifest" in error for error in errors)


def test_a_folder_that_is_not_a_dataset_is_a_usage_error(tmp_path, capsys):
    assert verify([str(tmp_path)]) == 2
    assert "has no manifest.json" in capsys.readouterr().err
