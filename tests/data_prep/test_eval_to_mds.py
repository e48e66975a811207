"""eval_to_mds.py: every eval set from local files, by the paper's protocol."""

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA, run_cli
from mds_testing import (
    EVAL_TO_MDS,
    FakeHub,
    read_column,
    read_samples,
)

from aogpt.data_prep import manifest as manifest_lib
from aogpt.data_prep.detokenizers import DETOKENIZERS
from aogpt.data_prep.eval_to_mds import main
from aogpt.data_prep.tokenizer import EOS, load_gpt2

SEQ_LEN = 64


def _wikitext_lines(rng: random.Random) -> list[str]:
    words = 'the lobster lives in 2 @,@ 000 m deep , eats ( small ) fish , is " blue " .'.split()
    lines = []
    for article in range(40):
        lines += [" \n", f" = Article {article} = \n", " \n"]
        lines += [
            " " + " ".join(rng.choices(words, k=rng.randint(5, 60))) + " \n" for _ in range(5)
        ]
        lines += [" \n", " = = Range = = \n", " \n", " It 's 4 @.@ 9 lb . \n"]
    return lines


def _ptb_lines(rng: random.Random) -> list[str]:
    words = "the company 's shares rose N N to $ N million <unk> and does n't \\/ plan".split()
    return [" " + " ".join(rng.choices(words, k=rng.randint(3, 25))) + " \n" for _ in range(2500)]


def _lm1b_lines(rng: random.Random) -> list[str]:
    words = 'He said : " it is , ok . " Really ? http : / / x.com ( yes ) $ 5'.split()
    return [" ".join(rng.choices(words, k=rng.randint(3, 20))) + "\n" for _ in range(300)]


def _lambada_passages(rng: random.Random) -> list[str]:
    quoted = "\N{LEFT DOUBLE QUOTATION MARK}Come here,\N{RIGHT DOUBLE QUOTATION MARK}"
    words = f"{quoted} said Anna to her brother Tom".split()
    return [" ".join(rng.choices(words, k=rng.randint(8, 40))) + " Tom" for _ in range(50)]


def _local_file(tmp_path, dataset: str) -> tuple[str, list[str]]:
    """A file in each dataset's format (real ones from ../shared/data if present), its examples."""
    rng = random.Random(0)
    shared = {
        "wikitext2": SHARED_DATA / "wikitext-2" / "valid.txt",
        "ptb": SHARED_DATA / "ptb" / "valid.txt",
    }
    if dataset in shared and shared[dataset].is_file():
        lines = shared[dataset].read_text().split("\n")  # lines end at "\n" only, as in a file
        lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
        path = shared[dataset]
    elif dataset == "lambada":
        passages = _lambada_passages(rng)
        path = tmp_path / "lambada_test.jsonl"
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in passages))
        return str(path), passages
    else:
        make = {
            "wikitext2": _wikitext_lines,
            "wikitext103": _wikitext_lines,
            "ptb": _ptb_lines,
            "lm1b": _lm1b_lines,
        }[dataset]
        lines = make(rng)
        path = tmp_path / ("wiki.valid.raw" if dataset.startswith("wikitext") else "valid.txt")
        path.write_text("".join(lines))
    if dataset.startswith("wikitext"):  # the hub's rows: raw lines, blank ones empty
        return str(path), [line if line.strip() else "" for line in lines]
    return str(path), [line.strip() for line in lines]


def _stream(examples: list[str], detokenizer: str) -> list[list[int]]:
    """The reference, per example: detokenize, tokenize with plain tiktoken, then EOS."""
    encoding, detokenize = load_gpt2(), DETOKENIZERS[detokenizer]
    return [encoding.encode_ordinary(detokenize(text)) + [EOS] for text in examples]


@pytest.mark.parametrize(
    "dataset,detokenizer",
    [
        ("wikitext2", "wikitext"),
        ("wikitext103", "wikitext"),
        ("ptb", "ptb"),
        ("lm1b", "lm1b"),
        ("lambada", "lambada"),
    ],
)
def test_local_files_pack_the_detokenized_examples(tmp_path, dataset, detokenizer):
    path, examples = _local_file(tmp_path, dataset)
    out = tmp_path / "out"
    assert (
        main(
            [
                "--dataset",
                dataset,
                "--source",
                path,
                "--out",
                str(out),
                "--seq-len",
                str(SEQ_LEN),
                "--workers",
                "1",
            ]
        )
        == 0
    )
    manifest = manifest_lib.read_manifest(out)
    split = "test" if dataset == "lambada" else "validation"
    assert manifest["kind"] == "eval" and manifest["split"] == split
    assert manifest["detokenizer"] == detokenizer and manifest["splits"][split]["path"] == "."
    stream = np.array(
        [token for ids in _stream(examples, detokenizer) for token in ids], dtype=np.uint16
    )
    samples = read_samples(manifest_lib.split_path(out, split))
    np.testing.assert_array_equal(samples.reshape(-1), stream[: len(stream) // SEQ_LEN * SEQ_LEN])
    assert manifest["splits"][split]["documents"] == len(examples)
    assert manifest["splits"][split]["dropped_tail_tokens"] == len(stream) % SEQ_LEN


def test_reference_packing_drops_the_remainder_of_every_1000_examples(tmp_path):
    path, examples = _local_file(tmp_path, "ptb")
    assert len(examples) > 2000
    assert (
        main(
            [
                "--dataset",
                "ptb",
                "--source",
                path,
                "--out",
                str(tmp_path / "out"),
                "--seq-len",
                str(SEQ_LEN),
                "--reference-packing",
                "--workers",
                "2",
            ]
        )
        == 0
    )
    expected = []
    per_example = _stream(examples, "ptb")
    for first in range(0, len(per_example), 1000):
        group = [token for ids in per_example[first : first + 1000] for token in ids]
        expected += group[: len(group) // SEQ_LEN * SEQ_LEN]
    samples = read_samples(tmp_path / "out")
    np.testing.assert_array_equal(samples.reshape(-1), np.array(expected, dtype=np.uint16))
    manifest = manifest_lib.read_manifest(tmp_path / "out")
    assert manifest["reference_packing"] is True
    assert manifest["splits"]["validation"]["group_dropped_tokens"] == sum(
        map(len, per_example)
    ) - len(expected)


def test_lambada_per_example_marks_length_and_last_word(tmp_path):
    path, passages = _local_file(tmp_path, "lambada")
    out = tmp_path / "out"
    assert (
        main(
            [
                "--dataset",
                "lambada",
                "--source",
                path,
                "--out",
                str(out),
                "--packing",
                "per_example",
                "--seq-len",
                str(SEQ_LEN),
            ]
        )
        == 0
    )
    samples = read_samples(out)
    lengths, starts = read_column(out, "length"), read_column(out, "last_word_start")
    encoding = load_gpt2()
    assert len(samples) == len(passages)
    for tokens, length, start, passage in zip(samples, lengths, starts, passages, strict=True):
        assert encoding.decode(tokens[: length - 1].tolist()) == DETOKENIZERS["lambada"](passage)
        assert encoding.decode(tokens[start : length - 1].tolist()) == " " + passage.split()[-1]
        assert (tokens[length - 1 :] == EOS).all()
    assert manifest_lib.read_manifest(out)["packing"] == "per_example"


@pytest.mark.parametrize("text", ["LAMBADA passages", "WikiText lines"])
def test_lambada_from_text_that_does_not_end_in_words_gets_a_warning(tmp_path, capsys, text):
    """LAMBADA is scored on each passage's last word: WikiText's lines end in punctuation or are
    blank, and a set built from them (it packs, --packing concat) would not be LAMBADA."""
    path, _ = _local_file(tmp_path, "lambada" if text == "LAMBADA passages" else "wikitext2")
    if text == "WikiText lines":
        moved = tmp_path / "lambada_test.txt"  # the split in its name, as a LAMBADA file has
        moved.write_text(Path(path).read_text())
        path = str(moved)
    assert main(["--dataset", "lambada", "--source", path, "--out", str(tmp_path / "out"),
                 "--seq-len", str(SEQ_LEN), "--workers", "1"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    if text == "LAMBADA passages":
        assert warnings == []
        return
    (warning,) = warnings
    odd, examples = (int(number.replace(",", "")) for number in
                     re.fullmatch(r"warning: ([\d,]+) of ([\d,]+) examples .*", warning).groups())
    assert odd > 0.5 * examples
    assert warning.endswith(
        "examples are empty or end in punctuation, not in a word: LAMBADA's passages end with the "
        'word the model must predict, one passage per example (.jsonl with one {"text": ...} per '
        "line). Is this LAMBADA?")


def test_wikitext2_from_the_hub_uses_the_papers_train_split(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = ["", " = Homarus = \n", "", " It is a lobster , 2 @.@ 5 m long . \n"] * 40
    hub = FakeHub([{"text": text} for text in rows])
    monkeypatch.setattr(datasets, "load_dataset", hub)
    assert (
        main(
            [
                "--dataset",
                "wikitext2",
                "--out",
                str(tmp_path / "out"),
                "--seq-len",
                str(SEQ_LEN),
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert hub.calls == [
        {
            "path": "Salesforce/wikitext",
            "name": "wikitext-2-raw-v1",
            "split": "train",
            "revision": None,
            "streaming": True,
        }
    ]
    manifest = manifest_lib.read_manifest(tmp_path / "out")
    assert manifest["split"] == "train" and list(manifest["splits"]) == ["train"]
    stream = [token for ids in _stream(rows, "wikitext") for token in ids]
    np.testing.assert_array_equal(
        read_samples(tmp_path / "out").reshape(-1), stream[: len(stream) // SEQ_LEN * SEQ_LEN]
    )


def test_a_local_file_without_a_split_in_its_name_needs_split(tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text("some words here\n")
    assert (
        main(
            [
                "--dataset",
                "ptb",
                "--source",
                str(tmp_path / "corpus.txt"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert "pass --split" in capsys.readouterr().err


def test_per_example_packing_is_for_lambada_only(tmp_path):
    result = run_cli(
        EVAL_TO_MDS, "--dataset", "ptb", "--packing", "per_example", "--out", str(tmp_path / "out")
    )
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "per_example is for the sets scored on their last word (lambada)" in result.stderr
    assert not (tmp_path / "out").exists()


def _ptb_args(path: str, out) -> list[str]:
    return ["--dataset", "ptb", "--source", path, "--out", str(out), "--seq-len", str(SEQ_LEN),
            "--workers", "1"]


def test_overwrite_refuses_a_folder_holding_a_file_it_did_not_write(tmp_path):
    path, _ = _local_file(tmp_path, "ptb")
    out = tmp_path / "out"
    assert main(_ptb_args(path, out)) == 0
    shutil.copy(out / "shard.00000.mds", out / "shard.00000.mds.bak")  # a user's, named alike
    before = {entry.name: entry.read_bytes() for entry in out.iterdir()}
    result = run_cli(EVAL_TO_MDS, *_ptb_args(path, out), "--overwrite")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: output folder {out} holds 'shard.00000.mds.bak', which this tool did not write: "
        f"move it elsewhere or choose another --out (nothing was deleted)"
    ]
    assert {entry.name: entry.read_bytes() for entry in out.iterdir()} == before
    assert len(read_samples(out)) == manifest_lib.read_manifest(out)["splits"]["validation"][
        "samples"]


def test_bytes_that_are_not_utf8_get_the_note_owt_to_mds_prints(tmp_path, capsys):
    source = tmp_path / "test.txt"
    source.write_bytes(b" the caf\xe9 is open .\n" * 30 + b" a na\xefve \xff\xfe man .\n")
    out = tmp_path / "out"
    assert main(["--dataset", "ptb", "--source", str(source), "--out", str(out),
                 "--seq-len", str(SEQ_LEN), "--workers", "1"]) == 0
    assert "note: 33 bytes in 31 documents were not UTF-8 and became U+FFFD" in (
        capsys.readouterr().out)
    examples = ["the caf\ufffd is open ."] * 30 + ["a na\ufffdve \ufffd\ufffd man ."]
    stream = np.array([token for ids in _stream(examples, "ptb") for token in ids], dtype=np.uint16)
    np.testing.assert_array_equal(read_samples(out).reshape(-1),
                                  stream[: len(stream) // SEQ_LEN * SEQ_LEN])
