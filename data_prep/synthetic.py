"""Synthetic languages whose probability of every sequence is known exactly: the judges of samplers.

Natural text has no exact judge here (GPT-2 large cannot be downloaded, and a small model's
generative perplexity judges the judge as much as the samples). A synthetic language is made to
be one: a hidden Markov model, whose forward algorithm gives any text's probability. Two presets.

"topics" (LanguageSpec), the first, whose next token is uncertain:

    topic      z ~ uniform over `topics`                      fixed per sequence: long range
    state      s_0 ~ uniform over the topic's `states`;       sticky: short range (segments of
               s_t = s_{t-1} with probability `stay`,         about 1 / (1 - stay) tokens)
               else another state of the same topic
    token      x_t ~ E(s_t, .)                                each state emits `emit` likely token
                                                              ids (Dirichlet weights of
                                                              `concentration`), and `smoothing`
                                                              of its mass over every id

Two tokens near each other were most likely emitted by the same state, and any two by states of
the same topic: drawing neighbours independently (several tokens per network call) makes pairs
that no single state would emit, and mixing topics makes them anywhere, so the order and the
number of tokens drawn together both show in the probability. A tiny any-order model learns it
on a CPU in minutes (which neighbours share a state is smooth in distance; a sparse bigram, tried
first, left a tiny model on the unigram plateau for 10M tokens at 128 positions).

"words" (WordsSpec), the hard one to draft, whose next token is often nearly certain given
context that a draft does not see:

    topic      z ~ uniform over `topics`                      fixed per sequence: which lexicon
                                                              (a state of long memory)
    word       w ~ the topic's frequencies (Dirichlet of      at the end of each word: where the
               `concentration`) over its `words` words        entropy is
    letter     x_t = the i-th token id of w's spelling        nearly certain given the word's
               (min_length..max_length ids, drawn once),      first tokens, up to `smoothing`
               up to `smoothing` of the mass over every id

Its entropy rate is low (about H(w | z) over the mean word length: ~0.6 nats per token against
the first language's 2.2), yet a position a few tokens ahead is uncertain given the known tokens
(which word comes, and where) and nearly certain once the tokens between are known: a draft drawn
from the marginals of the positions ahead (speculative decoding) is often wrong, so draft lengths
and trees pay their real cost here, which the first language, whose drafts are nearly always
accepted, hides.

Both are the same machine: hidden states whose transition is a permutation part plus a low-rank
part, T = P diag(move) + B_from B_to (sticky states stay: P is the identity; a letter moves on to
the next: P is a shift; a state branches into its topic's states: the rank is the number of
topics), so the forward algorithm costs O(states x topics) per token, not states^2 (the words
language has hundreds of states):

    log p(x)   the forward algorithm over the hidden states                        exact
    -log p(x_t | x_<t)   its normalisers, left to right (they sum to -log p(x))     exact

The entropy per token of n-token sequences, H(X)/n, is the NLL per token of a perfect model (in
any order: every order's product of conditionals is the same joint); it is the mean of
-log p(x)/n over sequences the language draws, with its standard error.

A language is its parameters: the manifest of its data folder holds them all (the tables, not
just the seed: numpy may draw other numbers from the same seed in another version), so that the
judge can be rebuilt anywhere from the folder, and their fingerprint (sha256) names it in
reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from aogpt import UsageError

FORMAT = "aogpt-synthetic-language"
VERSION = 2
NAME = "synthetic"  # the tokenizer name a data manifest records for it
ENTROPY_DRAWS = 20_000  # sequences whose mean -log p(x) / n is the entropy per token
MAX_STATES = 4096  # hidden states of a language at most: its dense transition is states^2 floats


@dataclass(frozen=True)
class CommonSpec:
    """What every preset's language is drawn from besides its own settings (their flags)."""

    vocab: int = 128
    topics: int = 4
    smoothing: float = 0.01  # mass spread over every id: every sequence keeps a probability
    concentration: float = 1.0  # of the preset's Dirichlet weights
    seed: int = 0

    def check(self, counts: tuple[str, ...]) -> None:
        """The checks every preset shares, with the counts of its own that must be >= 1."""
        for name in ("vocab", "topics", *counts):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got "
                                 f"{getattr(self, name)}")
        if self.vocab > 65535:
            raise UsageError(f"--vocab must be at most 65535 (tokens are stored as uint16), got "
                             f"{self.vocab}")
        if not 0.0 < self.smoothing < 1.0:
            raise UsageError(f"--smoothing must be in (0, 1) (every sequence keeps a probability "
                             f"above 0), got {self.smoothing}")
        if self.concentration <= 0:
            raise UsageError(f"--concentration must be positive, got {self.concentration}")


@dataclass(frozen=True)
class LanguageSpec(CommonSpec):
    """What the "topics" language is drawn from (synthetic_to_mds.py's flags)."""

    preset: ClassVar[str] = "topics"
    states: int = 4  # per topic
    emit: int = 10  # likely token ids per state
    stay: float = 0.95

    def validate(self) -> None:
        self.check(("states", "emit"))
        if self.emit > self.vocab:
            raise UsageError(f"--emit ({self.emit}) cannot exceed --vocab ({self.vocab})")
        if not 0.0 < self.stay <= 1.0:
            raise UsageError(f"--stay must be in (0, 1], got {self.stay}")
        if self.topics * self.states > MAX_STATES:
            raise UsageError(f"--topics x --states must be at most {MAX_STATES} hidden states, "
                             f"got {self.topics * self.states}")

    def record(self) -> dict:
        return dataclasses.asdict(self)  # as before there were presets: no preset key


@dataclass(frozen=True)
class WordsSpec(CommonSpec):
    """What the "words" language is drawn from (synthetic_to_mds.py --preset words's flags)."""

    preset: ClassVar[str] = "words"
    words: int = 16  # per topic
    min_length: int = 2  # token ids per word's spelling
    max_length: int = 8

    def validate(self) -> None:
        self.check(("words", "min_length"))
        if self.max_length < self.min_length:
            raise UsageError(f"--max-length ({self.max_length}) must be at least --min-length "
                             f"({self.min_length})")
        if self.topics * self.words * self.max_length > MAX_STATES:
            raise UsageError(f"--topics x --words x --max-length must be at most {MAX_STATES} "
                             f"hidden states (one per letter), got "
                             f"{self.topics * self.words * self.max_length}")

    def record(self) -> dict:
        return {"preset": self.preset, **dataclasses.asdict(self)}


SPECS = {spec.preset: spec for spec in (LanguageSpec, WordsSpec)}  # the presets


@dataclass(frozen=True)
class HiddenChain:
    """The hidden states' Markov chain: start (h,) and the transition T = P diag(move) +
    branch_from @ branch_to, where P sends state s to successor[s] (a permutation of the h
    states), branch_from is (h, r) and branch_to (r, h)."""

    start: np.ndarray
    successor: np.ndarray
    move: np.ndarray
    branch_from: np.ndarray
    branch_to: np.ndarray

    def dense(self) -> np.ndarray:
        """T itself, (h, h)."""
        transition = self.branch_from @ self.branch_to
        transition[np.arange(len(self.move)), self.successor] += self.move
        return transition

    def advance(self, belief: np.ndarray) -> np.ndarray:
        """belief @ T for beliefs (b, h), in O(b h r)."""
        predecessor = np.argsort(self.successor)  # each state's, under P
        # einsum, not BLAS: the rank is a few topics, and a threaded BLAS call on such thin
        # matrices cost 30x more on a busy machine
        branched = np.einsum("br,rh->bh", np.einsum("bh,hr->br", belief, self.branch_from),
                             self.branch_to)
        return branched + np.take(belief * self.move, predecessor, axis=1)


class SyntheticLanguage:
    """A language: its spec, the tables drawn from it (what a record holds), and the hidden
    Markov model they make: `chain` and `emission` (hidden, vocab). SyntheticLanguage.draw(spec)
    makes the preset's language (LANGUAGES)."""

    def __init__(self, spec, tables: dict, chain: HiddenChain, emission: np.ndarray):
        self.spec, self.tables, self.chain, self.emission = spec, tables, chain, emission
        self._emitting = np.ascontiguousarray(emission.T)  # (vocab, hidden): p(x | s) by token
        self._entropy: dict[tuple[int, int, int], tuple[float, float]] = {}
        self.start = chain.start
        self.transition = chain.dense()  # (hidden, hidden): sampling's
        self.fingerprint = hashlib.sha256(json.dumps(self._tables(), sort_keys=True).encode()
                                          ).hexdigest()

    @classmethod
    def draw(cls, spec) -> SyntheticLanguage:
        """A new language of spec's preset, from spec's seed."""
        spec.validate()
        language = LANGUAGES[spec.preset]
        return language(spec, language.draw_tables(spec, np.random.default_rng(spec.seed)))

    # ---- sequences ------------------------------------------------------------------------

    def sample(self, count: int, length: int, seed: int) -> np.ndarray:
        """(count, length) int64 sequences drawn from the language, the same for the same seed."""
        rng = np.random.default_rng([self.spec.seed, seed])
        emit_cdf, move_cdf = np.cumsum(self.emission, axis=1), np.cumsum(self.transition, axis=1)
        state = np.minimum((np.cumsum(self.start) <= rng.random(count)[:, None]).sum(axis=1),
                           len(self.start) - 1)
        tokens = np.empty((count, length), dtype=np.int64)
        for t in range(length):
            if t:
                point = rng.random(count)[:, None]
                state = np.minimum((move_cdf[state] <= point).sum(axis=1), len(self.start) - 1)
            point = rng.random(count)[:, None] * emit_cdf[state, -1:]
            tokens[:, t] = np.minimum((emit_cdf[state] <= point).sum(axis=1), self.spec.vocab - 1)
        return tokens

    def conditional_nll(self, tokens: np.ndarray) -> np.ndarray:
        """(count, n) float64: -log p(x_t | x_<t), left to right (their sum is -log p(x)): the
        forward algorithm's normalisers."""
        tokens = self.check_tokens(tokens)
        belief = np.broadcast_to(self.start, (len(tokens), len(self.start)))  # p(s_t | x_<t)
        nll = np.empty(tokens.shape)
        for t in range(tokens.shape[1]):
            if t:
                belief = self.chain.advance(belief)
            joint = belief * self._emitting[tokens[:, t]]  # p(s_t, x_t | x_<t)
            norm = joint.sum(axis=1)
            nll[:, t] = -np.log(norm)
            belief = joint / norm[:, None]
        return nll

    def log_prob(self, tokens: np.ndarray) -> np.ndarray:
        """(count,) float64: log p(x) of each sequence, exactly."""
        return -self.conditional_nll(tokens).sum(axis=1)

    def check_tokens(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 2 or tokens.shape[1] < 1:
            raise UsageError("the samples must be sequences of at least one token")
        if tokens.size and not 0 <= tokens.min() <= tokens.max() < self.spec.vocab:
            raise UsageError(f"the samples hold token ids outside 0..{self.spec.vocab - 1}, this "
                             f"language's vocabulary: they were not drawn from a model of it")
        return tokens

    # ---- entropy ----------------------------------------------------------------------------

    def entropy_per_token(self, length: int, draws: int = ENTROPY_DRAWS,
                          seed: int = 1) -> tuple[float, float]:
        """(H(X)/length, its standard error) for sequences of `length` tokens: the mean of
        -log p(x)/length over `draws` sequences the language draws (20,000: about 1e-3 nats).
        Kept once computed (seconds each: a judge asks again for every set of samples)."""
        key = (length, draws, seed)
        if key not in self._entropy:
            nll = np.concatenate([-self.log_prob(self.sample(min(4096, draws - first), length,
                                                              seed * 1_000_003 + first)) / length
                                  for first in range(0, draws, 4096)])
            self._entropy[key] = float(nll.mean()), float(nll.std(ddof=1) / math.sqrt(draws))
        return self._entropy[key]

    def recorded_entropy(self, length: int, entropy: float, error: float) -> None:
        """Takes entropy_per_token(length) at its defaults from a record of it (a data folder's
        manifest: the same computation when the folder was built)."""
        self._entropy[(length, ENTROPY_DRAWS, 1)] = entropy, error

    # ---- the record in a data manifest --------------------------------------------------------

    def _tables(self) -> dict:
        return {"spec": self.spec.record(), **self.tables}

    def record(self) -> dict:
        """Everything the language is, for the manifest of its data folder."""
        return {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
                **self._tables()}

    @classmethod
    def from_record(cls, record: dict, where: str) -> SyntheticLanguage:
        try:
            if record.get("format") != FORMAT:
                raise ValueError(f"its format is not {FORMAT!r}")
            if record.get("version") != VERSION:
                raise ValueError(f"version {record.get('version')!r}, this aogpt reads {VERSION}")
            fields = dict(record["spec"])
            preset = fields.pop("preset", LanguageSpec.preset)
            if preset not in LANGUAGES:
                raise ValueError(f"its preset {preset!r} is none of {', '.join(LANGUAGES)}")
            language = LANGUAGES[preset]
            language = language(SPECS[preset](**fields),
                                {name: record[name] for name in language.TABLES})
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
            raise UsageError(f"{where} holds no readable synthetic language ({err}): rebuild it "
                             "with data_prep/synthetic_to_mds.py") from None
        if language.fingerprint != record.get("fingerprint"):
            raise UsageError(f"{where}: the language's tables do not match its fingerprint (the "
                             "manifest was edited or damaged): rebuild it with "
                             "data_prep/synthetic_to_mds.py")
        return language

    def describe(self) -> dict:
        """What a data manifest records of the language as its tokenizer."""
        return {"name": NAME, "n_vocab": self.spec.vocab, "text": False,
                "language_sha256": self.fingerprint}


def smoothed(likely: np.ndarray, smoothing: float) -> np.ndarray:
    """An emission table (hidden, vocab): each state's likely ids' weights `likely` (rows summing
    to 1), with `smoothing` of the mass spread over every id."""
    return (1 - smoothing) * likely + smoothing / likely.shape[1]


class TopicsLanguage(SyntheticLanguage):
    """The "topics" preset: each hidden state's emission ids and weights, (topics x states,
    emit)."""

    TABLES = ("emit_ids", "emit_weights")

    def __init__(self, spec: LanguageSpec, tables: dict):
        k, s, v = spec.topics, spec.states, spec.vocab
        emit_ids = np.asarray(tables["emit_ids"], dtype=np.int64)
        emit_weights = np.asarray(tables["emit_weights"], dtype=np.float64)
        likely = np.zeros((k * s, v))
        np.put_along_axis(likely, emit_ids, emit_weights, axis=1)
        switch = (1 - spec.stay) / (s - 1) if s > 1 else 0.0  # to each other state of the topic
        members = np.kron(np.eye(k), np.ones((s, 1)))  # (hidden, topics): a state's topic
        chain = HiddenChain(start=np.full(k * s, 1.0 / (k * s)), successor=np.arange(k * s),
                            move=np.full(k * s, (spec.stay if s > 1 else 1.0) - switch),
                            branch_from=members * switch, branch_to=members.T.copy())
        super().__init__(spec, {"emit_ids": emit_ids.tolist(),
                                "emit_weights": emit_weights.tolist()},
                         chain, smoothed(likely, spec.smoothing))

    def summary(self) -> str:
        s = self.spec
        return f"{s.vocab} token ids, {s.topics} topics x {s.states} states"

    @staticmethod
    def draw_tables(spec: LanguageSpec, rng: np.random.Generator) -> dict:
        hidden, v = spec.topics * spec.states, spec.vocab
        emit_ids = np.argsort(rng.random((hidden, v)), axis=1)[:, :spec.emit]  # distinct ids
        emit_weights = rng.dirichlet(np.full(spec.emit, spec.concentration), size=hidden)
        return {"emit_ids": emit_ids, "emit_weights": emit_weights}


class WordsLanguage(SyntheticLanguage):
    """The "words" preset: each topic's words' spellings (lists of token ids) and frequencies.
    A hidden state is a letter of a word: (topic, word, letter), topic-major."""

    TABLES = ("spellings", "frequencies")

    def __init__(self, spec: WordsSpec, tables: dict):
        spellings = [[[int(t) for t in word] for word in topic] for topic in tables["spellings"]]
        frequencies = np.asarray(tables["frequencies"], dtype=np.float64)  # (topics, words)
        letters = [t for topic in spellings for word in topic for t in word]
        if (len(spellings) != spec.topics or frequencies.shape != (spec.topics, spec.words)
                or any(len(topic) != spec.words or not all(topic) for topic in spellings)
                or not 0 <= min(letters) <= max(letters) < spec.vocab):
            raise ValueError("its spellings or frequencies do not fit its spec")
        hidden = len(letters)
        last = np.cumsum([len(word) for topic in spellings for word in topic]) - 1
        first = np.concatenate([[0], last[:-1] + 1])
        topic_of = np.repeat(np.arange(spec.topics), spec.words)  # of each word
        ends = np.zeros((hidden, spec.topics))  # a word's last letter branches into its topic
        ends[last, topic_of] = 1.0
        starts = np.zeros((spec.topics, hidden))  # ... to the first letter of a word of it
        starts[topic_of, first] = frequencies.flatten()
        move = np.ones(hidden)
        move[last] = 0.0
        chain = HiddenChain(start=starts.mean(axis=0), successor=(np.arange(hidden) + 1) % hidden,
                            move=move, branch_from=ends, branch_to=starts)
        emission = smoothed(np.eye(spec.vocab)[letters], spec.smoothing)
        super().__init__(spec, {"spellings": spellings, "frequencies": frequencies.tolist()},
                         chain, emission)

    def summary(self) -> str:
        s = self.spec
        return (f"{s.vocab} token ids, {s.topics} topics x {s.words} words of "
                f"{s.min_length}..{s.max_length} ids, {len(self.start)} hidden states")

    @staticmethod
    def draw_tables(spec: WordsSpec, rng: np.random.Generator) -> dict:
        lengths = rng.integers(spec.min_length, spec.max_length + 1, size=(spec.topics,
                                                                            spec.words))
        spellings = [[rng.integers(0, spec.vocab, size=length).tolist() for length in topic]
                     for topic in lengths]
        frequencies = rng.dirichlet(np.full(spec.words, spec.concentration), size=spec.topics)
        return {"spellings": spellings, "frequencies": frequencies}


LANGUAGES: dict[str, type[SyntheticLanguage]] = {LanguageSpec.preset: TopicsLanguage,
                                                 WordsSpec.preset: WordsLanguage}


class TokenIds:
    """The text of a synthetic language: its token ids written out, "17 3 95". Commands that show
    or take text (sample.py's records and --prompt) use it where GPT-2's encoding would be."""

    name = NAME

    def decode(self, tokens) -> str:
        return " ".join(str(int(token)) for token in tokens)

    def encode(self, text: str) -> list[int]:
        try:
            return [int(word) for word in text.split()]
        except ValueError:
            raise UsageError(f"{text[:40]!r} is not text of a synthetic language: give its token "
                             "ids, e.g. '17 3 95'") from None


def is_synthetic(manifest: dict) -> bool:
    return manifest.get("tokenizer", {}).get("name") == NAME


def load_language(data_dir: str | Path, setting: str) -> SyntheticLanguage:
    """The language of a data folder made by data_prep/synthetic_to_mds.py."""
    from aogpt.data_prep.manifest import read_manifest

    manifest = read_manifest(data_dir)
    if not is_synthetic(manifest):
        raise UsageError(f"{setting} {data_dir} holds {manifest['dataset']} data, not a synthetic "
                         "language: give a folder made by data_prep/synthetic_to_mds.py")
    language = SyntheticLanguage.from_record(manifest.get("language", {}),
                                             f"{setting} {data_dir}/manifest.json")
    if "entropy_per_token" in manifest:  # the builder's, at its seq_len
        language.recorded_entropy(manifest["seq_len"], manifest["entropy_per_token"],
                                  manifest["entropy_per_token_error"])
    return language
