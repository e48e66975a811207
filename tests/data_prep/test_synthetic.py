"""The synthetic languages (data_prep/synthetic.py: the "topics" and "words" presets) and their data
folders (synthetic_to_mds.py): exact probabilities, an exact entropy, and the folder a model
trains on and a judge reads."""

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
from aogpt.data_prep.synthetic import (
    LanguageSpec,
    SyntheticLanguage,
    TokenIds,
    WordsSpec,
    load_language,
)

SYNTHETIC_TO_MDS = "data_prep/synthetic_to_mds.py"
TINY = LanguageSpec(vocab=3, topics=2, states=2, emit=2, stay=0.7, smoothing=0.05, seed=4)
# two topics of two words of 1..3 letters over 3 ids: short enough to enumerate
TINY_WORDS = WordsSpec(vocab=3, topics=2, words=2, min_length=1, max_length=3, smoothing=0.05,
                       seed=4)
PRESETS = pytest.mark.parametrize("spec", [TINY, TINY_WORDS], ids=["topics", "words"])


def every_sequence(vocab: int, length: int) -> np.ndarray:
    return np.array(list(itertools.product(range(vocab), repeat=length)))


@PRESETS
def test_the_probabilities_of_every_sequence_sum_to_one(spec):
    language = SyntheticLanguage.draw(spec)
    assert np.exp(language.log_prob(every_sequence(3, 4))).sum() == pytest.approx(1, abs=1e-12)


@pytest.mark.parametrize("spec", [LanguageSpec(seed=3), WordsSpec(seed=3)],
                         ids=["topics", "words"])
def test_each_conditional_is_the_ratio_of_two_prefix_probabilities(spec):
    """-log p(x_t | x_<t) = log p(x_<t) - log p(x_<=t): the forward algorithm's normalisers are
    the exact conditionals, position by position."""
    language = SyntheticLanguage.draw(spec)
    tokens = language.sample(20, 12, seed=1)
    prefixes = np.stack([language.log_prob(tokens[:, :t + 1]) for t in range(12)], axis=1)
    expected = -np.diff(prefixes, axis=1, prepend=0.0)
    np.testing.assert_allclose(language.conditional_nll(tokens), expected, rtol=1e-10)


@pytest.mark.parametrize("spec", [LanguageSpec(seed=2), WordsSpec(seed=2)],
                         ids=["topics", "words"])
def test_the_forward_step_is_the_dense_transition(spec):
    """The chain's permutation-plus-low-rank step is belief @ T, and T's rows are distributions."""
    language = SyntheticLanguage.draw(spec)
    belief = np.random.default_rng(0).dirichlet(np.ones(len(language.start)), size=5)
    np.testing.assert_allclose(language.chain.advance(belief), belief @ language.transition,
                               rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(language.transition.sum(axis=1), 1.0, rtol=1e-12)
    assert language.transition.min() >= 0


@PRESETS
def test_the_entropy_is_the_enumerated_one_within_its_standard_error(spec):
    language = SyntheticLanguage.draw(spec)
    sequences = every_sequence(3, 5)
    p = np.exp(language.log_prob(sequences))
    entropy, error = language.entropy_per_token(5, draws=20_000)
    assert abs(entropy - float(-(p * np.log(p)).sum() / 5)) <= 4 * error
    assert error < 3e-3


@PRESETS
def test_sequences_are_drawn_from_the_language(spec):
    language = SyntheticLanguage.draw(spec)
    expected = np.exp(language.log_prob(every_sequence(3, 3))) * 20_000
    drawn = language.sample(20_000, 3, seed=7)
    counts = np.bincount(drawn @ np.array([9, 3, 1]), minlength=27)
    big = expected >= 5
    statistic = ((counts - expected) ** 2 / expected)[big].sum()
    assert statistic < 60 and counts[~big].sum() < 40  # chi-square, <= 26 degrees: p ~ 2e-4


def draft_agreement(language: SyntheticLanguage, ahead: int, count: int = 100,
                    length: int = 40) -> float:
    """How much a perfect model's draft `ahead` positions past the known tokens agrees with what
    the tokens between make of that position: 1 - E[TV(p(x_t+j | x_<=t), p(x_t+j | x_<t+j))]
    over the language's own sequences (speculative decoding accepts such a draft, once the
    drafts before it are, with this probability), by the forward algorithm."""
    tokens = language.sample(count, length, seed=5)
    belief = np.broadcast_to(language.start, (count, len(language.start)))
    before, after = [], []  # p(s_t | x_<t), p(s_t | x_<=t)
    for t in range(length):
        before.append(belief)
        joint = belief * language.emission[:, tokens[:, t]].T
        after.append(joint / joint.sum(axis=1, keepdims=True))
        belief = language.chain.advance(after[-1])
    agreement = []
    for t in range(8, length - ahead):
        ahead_of_t = after[t]
        for _ in range(ahead):
            ahead_of_t = language.chain.advance(ahead_of_t)
        marginal, conditional = (b @ language.emission for b in (ahead_of_t, before[t + ahead]))
        agreement.append(np.minimum(marginal, conditional).sum(axis=1).mean())
    return float(np.mean(agreement))


def test_the_words_language_is_low_in_entropy_and_hard_to_draft():
    """At the presets' defaults: a third of the first language's entropy, its next token nearly
    certain most of the time, and drafts 6 positions ahead mostly wrong where the first
    language's mostly agree."""
    topics, words = SyntheticLanguage.draw(LanguageSpec()), SyntheticLanguage.draw(WordsSpec())
    assert words.entropy_per_token(32, draws=1000)[0] < topics.entropy_per_token(
        32, draws=2000)[0] / 3
    sure = np.exp(-words.conditional_nll(words.sample(300, 40, seed=3))[:, 8:]) > 0.9
    assert sure.mean() > 0.6
    assert draft_agreement(topics, 6) > 0.6
    assert draft_agreement(words, 6) < 0.4


def test_the_first_languages_fingerprint_is_the_one_before_presets():
    """Data folders built before the words preset name their language by this fingerprint."""
    assert SyntheticLanguage.draw(LanguageSpec()).fingerprint == (
        "024ce71a9d46407457ebb10e01d91592116dbeb0314697808414182926357c04")


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
    rebuilt = SyntheticLanguage.from_record(manifest["language"], "here")  # computes it again
    assert manifest["entropy_per_token"] == pytest.approx(rebuilt.entropy_per_token(32)[0])
    assert language.entropy_per_token(32) == (manifest["entropy_per_token"],
                                              manifest["entropy_per_token_error"])
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


def test_a_words_folder_holds_its_language_and_its_sequences(tmp_path, run_main):
    out = tmp_path / "words"
    code, printed, err = run_main(synthetic_to_mds.main, "--out", out, "--preset", "words",
                                  "--seq-len", "24", "--train-samples", "50", "--val-samples",
                                  "10", "--vocab", "20", "--words", "3", "--max-length", "4")
    assert code == 0, err
    assert "from the words language" in printed
    manifest = read_manifest(out)
    language = load_language(out, "--judge")
    assert language.spec == WordsSpec(vocab=20, words=3, max_length=4)
    assert manifest["language"]["spec"]["preset"] == "words"
    assert manifest["settings"]["language"]["preset"] == "words"
    assert np.array_equal(read_samples(out / "train"), language.sample(50, 24, seed=1_000_003))
    assert language.fingerprint == SyntheticLanguage.draw(language.spec).fingerprint


@pytest.mark.parametrize("flags, message", [
    (["--vocab", "0"], "--vocab must be >= 1"),
    (["--emit", "9", "--vocab", "8"], "--emit (9) cannot exceed --vocab (8)"),
    (["--stay", "0"], "--stay must be in (0, 1]"),
    (["--smoothing", "0"], "--smoothing must be in (0, 1)"),
    (["--train-samples", "0"], "--train-samples must be"),
    (["--words", "4"], "--words set the words preset's language, not --preset topics's: drop "
                       "--words, or give --preset words"),
    (["--preset", "words", "--stay", "0.5"], "--stay set the topics preset's language"),
    (["--preset", "words", "--min-length", "5", "--max-length", "3"],
     "--max-length (3) must be at least --min-length (5)"),
    (["--preset", "words", "--words", "1000"], "must be at most 4096 hidden states"),
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
