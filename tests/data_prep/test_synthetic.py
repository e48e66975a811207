"""The synthetic language (data_prep/synthetic.py) and its data folder (synthetic_to_mds.py): exact
probabilities, an exact entropy, and the folder a model trains on and a judge reads."""

import itertools
import json
import math

import numpy as np
import pytest
from conftest import run_cli
from mds_testing import read_samples

from aogpt import UsageError
from aogpt.data_prep import synthetic_to_mds
from aogpt.data_prep.manifest import read_manifest
from aogpt.data_prep.synthetic import LanguageSpec, SyntheticLanguage, TokenIds, load_language

SYNTHETIC_TO_MDS = "data_prep/synthetic_to_mds.py"
TINY = LanguageSpec(vocab=3, topics=2, states=2, emit=2, stay=0.7, smoothing=0.05, seed=4)


def every_sequence(vocab: int, length: int) -> np.ndarray:
    return np.array(list(itertools.product(range(vocab), repeat=length)))


def test_the_probabilities_of_every_sequence_sum_to_one():
    language = SyntheticLanguage.draw(TINY)
    assert np.exp(language.log_prob(every_sequence(3, 4))).sum() == pytest.approx(1, abs=1e-12)


def test_each_conditional_is_the_ratio_of_two_prefix_probabilities():
    """-log p(x_t | x_<t) = log p(x_<t) - log p(x_<=t): the forward algorithm's normalisers are
    the exact conditionals, position by position."""
    language = SyntheticLanguage.draw(LanguageSpec(seed=3))
    tokens = language.sample(20, 12, seed=1)
    prefixes = np.stack([language.log_prob(tokens[:, :t + 1]) for t in range(12)], axis=1)
    expected = -np.diff(prefixes, axis=1, prepend=0.0)
    np.testing.assert_allclose(language.conditional_nll(tokens), expected, rtol=1e-10)


def test_the_entropy_is_the_enumerated_one_within_its_standard_error():
    language = SyntheticLanguage.draw(TINY)
    sequences = every_sequence(3, 5)
    p = np.exp(language.log_prob(sequences))
    entropy, error = language.entropy_per_token(5, draws=20_000)
    assert abs(entropy - float(-(p * np.log(p)).sum() / 5)) <= 4 * error
    assert error < 3e-3


def test_sequences_are_drawn_from_the_language():
    language = SyntheticLanguage.draw(TINY)
    expected = np.exp(language.log_prob(every_sequence(3, 3))) * 20_000
    drawn = language.sample(20_000, 3, seed=7)
    counts = np.bincount(drawn @ np.array([9, 3, 1]), minlength=27)
    statistic = ((counts - expected) ** 2 / expected).sum()
    assert statistic < 60  # chi-square, 26 degrees of freedom: p ~ 2e-4


def test_a_seed_gives_the_same_language_and_sequences():
    first, again = SyntheticLanguage.draw(LanguageSpec()), SyntheticLanguage.draw(LanguageSpec())
    assert first.fingerprint == again.fingerprint
    assert np.array_equal(first.sample(4, 16, seed=2), again.sample(4, 16, seed=2))
    assert SyntheticLanguage.draw(LanguageSpec(seed=1)).fingerprint != first.fingerprint


def test_token_ids_are_the_text_of_a_synthetic_model():
    assert TokenIds().decode([17, 3, 95]) == "17 3 95"
    assert TokenIds().encode(" 17 3  95 ") == [17, 3, 95]
    with pytest.raises(UsageError, match="not text of a synthetic language"):
        TokenIds().encode("the cat")


# ---- the data folder --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic") / "data"
    result = run_cli(SYNTHETIC_TO_MDS, "--out", str(out), "--seq-len", "32", "--train-samples",
                     "300", "--val-samples", "40", "--vocab", "16", "--topics", "2")
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_the_folder_holds_the_language_its_entropy_and_its_sequences(synthetic_data):
    out, log = synthetic_data
    manifest = read_manifest(out)
    language = load_language(out, "--judge")
    assert manifest["tokenizer"] == language.describe()
    assert manifest["tokenizer"]["n_vocab"] == 16 and manifest["seq_len"] == 32
    assert manifest["entropy_per_token"] == pytest.approx(language.entropy_per_token(32)[0])
    train = read_samples(out / "train")
    assert train.shape == (300, 32) and train.max() < 16
    # the language's own draws (train/'s seed 1, in chunks of 8192): their NLL is its entropy
    assert np.array_equal(train, language.sample(300, 32, seed=1 * 1_000_003))
    nll = -language.log_prob(train) / 32
    assert abs(nll.mean() - manifest["entropy_per_token"]) < 4 * nll.std() / math.sqrt(300)
    assert read_samples(out / "val").shape == (40, 32)
    assert f"entropy {manifest['entropy_per_token']:.4f} +- " in log


def test_a_second_run_finds_the_folder_complete(synthetic_data, run_main):
    out, _ = synthetic_data
    result = run_cli(SYNTHETIC_TO_MDS, "--out", str(out), "--seq-len", "32", "--train-samples",
                     "300", "--val-samples", "40", "--vocab", "16", "--topics", "2")
    assert result.returncode == 0 and "is complete already" in result.stdout
    code, _, err = run_main(synthetic_to_mds.main, "--out", out, "--seq-len", "32", "--vocab", "16")
    assert code == 2 and "built with other settings" in err


def test_an_edited_language_is_refused_in_one_line(synthetic_data, tmp_path):
    out, _ = synthetic_data
    edited = tmp_path / "edited"
    edited.mkdir()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["language"]["emit_weights"][0][0] += 0.01
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="do not match its fingerprint"):
        load_language(edited, "--judge")


@pytest.mark.parametrize("flags, message", [
    (["--vocab", "0"], "--vocab must be >= 1"),
    (["--emit", "9", "--vocab", "8"], "--emit (9) cannot exceed --vocab (8)"),
    (["--stay", "0"], "--stay must be in (0, 1]"),
    (["--smoothing", "0"], "--smoothing must be in (0, 1)"),
    (["--train-samples", "0"], "--train-samples must be"),
])
def test_bad_settings_are_one_line_before_any_work(run_main, flags, message, tmp_path):
    argv = ["--out", str(tmp_path / "out"), *flags]
    if flags == ["--vocab", "0"]:  # the command's one refusal as a user meets it: a real process
        result = run_cli(SYNTHETIC_TO_MDS, *argv)
        code, err = result.returncode, result.stderr
    else:  # the others in this process, without a process's seconds of imports each
        code, _, err = run_main(synthetic_to_mds.main, *argv)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_entropy_is_the_mean_nll_of_other_draws_within_the_errors():
    """The recorded entropy is an estimate: fresh sequences of another seed agree with it within
    both standard errors."""
    language = SyntheticLanguage.draw(LanguageSpec(vocab=32, topics=3))
    entropy, error = language.entropy_per_token(24)
    nll = -language.log_prob(language.sample(20_000, 24, seed=3)) / 24
    assert abs(nll.mean() - entropy) < 4 * math.hypot(nll.std() / math.sqrt(len(nll)), error)
