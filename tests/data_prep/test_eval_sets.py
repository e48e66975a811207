"""data_prep/eval_sets.py: the eval sets' examples read from local files, their splits, and the two
packings, called as a library (eval_to_mds.py's end-to-end tests are in test_eval_to_mds.py)."""

import gzip
import json

import numpy as np
import pytest
from mds_testing import (
    read_column,
    read_samples,
)

from aogpt import UsageError
from aogpt.data_prep.detokenizers import DETOKENIZERS
from aogpt.data_prep.eval_sets import (
    EVAL_SETS,
    examples_digest,
    pack_concat,
    pack_per_example,
    read_examples,
    read_file,
    split_of,
)
from aogpt.data_prep.tokenizer import EOS, load_gpt2

SEQ_LEN = 16


@pytest.fixture(scope="module")
def encoding():
    return load_gpt2()


def test_an_explicit_split_gets_its_canonical_name():
    assert split_of(EVAL_SETS["ptb"], "valid", ["anything.txt"]) == "validation"
    assert split_of(EVAL_SETS["ptb"], "Dev", None) == "validation"
    assert split_of(EVAL_SETS["ptb"], "heldout", None) == "heldout"  # unknown names stay


def test_the_hub_split_defaults_to_the_papers():
    assert split_of(EVAL_SETS["wikitext2"], None, None) == "train"
    assert split_of(EVAL_SETS["lambada"], None, None) == "test"


def test_local_files_name_their_split():
    assert split_of(EVAL_SETS["wikitext103"], None, ["data/wiki.valid.raw"]) == "validation"
    assert split_of(EVAL_SETS["lambada"], None, ["lambada_test.jsonl"]) == "test"
    assert split_of(EVAL_SETS["ptb"], None, ["ptb-train.txt", "more_train.txt"]) == "train"


@pytest.mark.parametrize("paths", [["corpus.txt"], ["a.train.txt", "b.test.txt"]])
def test_files_that_name_no_split_or_two_are_refused(paths):
    with pytest.raises(UsageError, match="pass --split"):
        split_of(EVAL_SETS["ptb"], None, paths)


def test_wikitext_lines_keep_their_newline_and_blank_lines_become_empty(tmp_path):
    path = tmp_path / "wiki.test.raw"
    path.write_bytes(b" \n = Homarus = \n \r\n It is a lobster . \n")
    examples = read_file(path, EVAL_SETS["wikitext103"])
    assert examples == [("", 0), (" = Homarus = \n", 0), ("", 0), (" It is a lobster . \n", 0)]


def test_sentence_lines_are_stripped_and_bad_bytes_counted(tmp_path):
    path = tmp_path / "test.txt"
    path.write_bytes(b" the company rose N N \n caf\xe9 <unk> \n")
    examples = read_file(path, EVAL_SETS["ptb"])
    assert examples == [("the company rose N N", 0), ("caf\ufffd <unk>", 1)]


def test_jsonl_passages_are_read_plain_or_gzipped(tmp_path):
    quoted = "\N{LEFT DOUBLE QUOTATION MARK}Hi,\N{RIGHT DOUBLE QUOTATION MARK} said Anna"
    passages = ["She gave the book to Tom", quoted]
    lines = "".join(json.dumps({"text": text}) + "\n" for text in passages)
    (tmp_path / "plain.jsonl").write_text(lines)
    with gzip.open(tmp_path / "zipped.jsonl.gz", "wt") as file:
        file.write(lines)
    for name in ("plain.jsonl", "zipped.jsonl.gz"):
        assert read_file(tmp_path / name, EVAL_SETS["lambada"]) == [(p, 0) for p in passages]


def test_an_unsupported_file_type_is_refused(tmp_path):
    (tmp_path / "test.csv").write_text("a,b\n")
    with pytest.raises(UsageError, match="unsupported file type"):
        read_file(tmp_path / "test.csv", EVAL_SETS["ptb"])


def test_a_folder_is_read_in_sorted_file_order(tmp_path):
    folder = tmp_path / "ptb"
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "test.txt").write_text("third\n")
    (folder / "a.test.txt").write_text("first\nsecond\n")
    examples, description = read_examples(EVAL_SETS["ptb"], "test", [str(folder)])
    assert [text for text, _ in examples] == ["first", "second", "third"]
    assert description == f"{folder} (2 files)"


def test_the_digest_tells_where_examples_are_cut():
    assert examples_digest([("ab", 0), ("c", 0)]) != examples_digest([("a", 0), ("bc", 0)])
    assert examples_digest([("ab", 0)]) == examples_digest([("ab", 3)])  # the text only


def test_concat_packing_cuts_the_detokenized_stream_into_samples(tmp_path, encoding):
    examples = [(f" The lobster number {i} lives in the sea @-@ floor . \n", 0) for i in range(30)]
    stats = pack_concat(examples, EVAL_SETS["wikitext2"], "train", SEQ_LEN, tmp_path / "out",
                        tmp_path / "work", encoding, workers=1)
    detokenize = DETOKENIZERS["wikitext"]
    stream = [t for text, _ in examples for t in encoding.encode_ordinary(detokenize(text)) + [EOS]]
    samples = read_samples(tmp_path / "out")
    assert samples.shape == (len(stream) // SEQ_LEN, SEQ_LEN)
    np.testing.assert_array_equal(samples.reshape(-1), stream[:samples.size])
    assert stats["documents"] == len(examples) and stats["samples"] == len(samples)
    assert stats["dropped_tail_tokens"] == len(stream) % SEQ_LEN


def test_per_example_packing_pads_each_passage_and_marks_its_last_word(tmp_path, encoding):
    passages = ["She gave the book to Tom", "Anna waved at her brother Tom"]
    stats = pack_per_example([(p, 0) for p in passages], EVAL_SETS["lambada"], SEQ_LEN,
                             tmp_path, encoding)
    samples = read_samples(tmp_path)
    lengths, starts = read_column(tmp_path, "length"), read_column(tmp_path, "last_word_start")
    for tokens, length, start, passage in zip(samples, lengths, starts, passages, strict=True):
        assert encoding.decode(tokens[:length - 1].tolist()) == DETOKENIZERS["lambada"](passage)
        assert encoding.decode(tokens[start:length - 1].tolist()) == " Tom"
        assert (tokens[length - 1:] == EOS).all()
    assert stats["samples"] == stats["documents"] == 2 and stats["tokens"] == sum(lengths)


@pytest.mark.parametrize("passage, message", [
    ("word " * SEQ_LEN + "Tom", "raise --seq-len"),
    ("   ", "no last word"),
])
def test_per_example_packing_refuses_what_it_cannot_score(tmp_path, encoding, passage, message):
    with pytest.raises(UsageError, match=message):
        pack_per_example([(passage, 0)], EVAL_SETS["lambada"], SEQ_LEN, tmp_path, encoding)
