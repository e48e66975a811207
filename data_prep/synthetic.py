"""A synthetic language whose probability of every sequence is known exactly: the judge of samplers.

Natural text has no exact judge here (GPT-2 large cannot be downloaded, and a small model's
generative perplexity judges the judge as much as the samples). This language is made to be one,
a hidden Markov model:

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

    log p(x)   the forward algorithm over the topics x states hidden states     exact
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

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aogpt import UsageError

FORMAT = "aogpt-synthetic-language"
VERSION = 2
NAME = "synthetic"  # the tokenizer name a data manifest records for it


@dataclass(frozen=True)
class LanguageSpec:
    """What a language is drawn from (synthetic_to_mds.py's flags)."""

    vocab: int = 128
    topics: int = 4
    states: int = 4  # per topic
    emit: int = 10  # likely token ids per state
    stay: float = 0.95
    smoothing: float = 0.01
    concentration: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        for name in ("vocab", "topics", "states", "emit"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.emit > self.vocab:
            raise UsageError(f"--emit ({self.emit}) cannot exceed --vocab ({self.vocab})")
        if self.vocab > 65535:
            raise UsageError(f"--vocab must be at most 65535 (tokens are stored as uint16), got "
                             f"{self.vocab}")
        if not 0.0 < self.smoothing < 1.0:
            raise UsageError(f"--smoothing must be in (0, 1) (every sequence keeps a probability "
                             f"above 0), got {self.smoothing}")
        if not 0.0 < self.stay <= 1.0:
            raise UsageError(f"--stay must be in (0, 1], got {self.stay}")
        if self.concentration <= 0:
            raise UsageError(f"--concentration must be positive, got {self.concentration}")


class SyntheticLanguage:
    """The language: each hidden state's emission ids and weights, (topics x states, emit)."""

    def __init__(self, spec: LanguageSpec, emit_ids: np.ndarray, emit_weights: np.ndarray):
        self.spec = spec
        self.emit_ids = emit_ids.astype(np.int64)
        self.emit_weights = emit_weights.astype(np.float64)
        k, s, v = spec.topics, spec.states, spec.vocab
        dense = np.zeros((k * s, v))
        np.put_along_axis(dense, self.emit_ids, self.emit_weights, axis=1)
        self.emission = (1 - spec.smoothing) * dense + spec.smoothing / v  # (hidden, vocab)
        within = np.full((s, s), (1 - spec.stay) / (s - 1) if s > 1 else 0.0)
        np.fill_diagonal(within, spec.stay if s > 1 else 1.0)
        self.transition = np.kron(np.eye(k), within)  # a topic's states only: (hidden, hidden)
        self.start = np.full(k * s, 1.0 / (k * s))
        self.fingerprint = hashlib.sha256(json.dumps(self._tables(), sort_keys=True).encode()
                                          ).hexdigest()

    @classmethod
    def draw(cls, spec: LanguageSpec) -> SyntheticLanguage:
        """A new language from spec's seed."""
        spec.validate()
        rng = np.random.default_rng(spec.seed)
        hidden, v = spec.topics * spec.states, spec.vocab
        emit_ids = np.argsort(rng.random((hidden, v)), axis=1)[:, :spec.emit]  # distinct ids
        emit_weights = rng.dirichlet(np.full(spec.emit, spec.concentration), size=hidden)
        return cls(spec, emit_ids, emit_weights)

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
                belief = belief @ self.transition
            joint = belief * self.emission[:, tokens[:, t]].T  # p(s_t, x_t | x_<t)
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

    def entropy_per_token(self, length: int, draws: int = 20_000,
                          seed: int = 1) -> tuple[float, float]:
        """(H(X)/length, its standard error) for sequences of `length` tokens: the mean of
        -log p(x)/length over `draws` sequences the language draws (20,000: about 1e-3 nats)."""
        nll = np.concatenate([-self.log_prob(self.sample(min(4096, draws - first), length,
                                                          seed * 1_000_003 + first)) / length
                              for first in range(0, draws, 4096)])
        return float(nll.mean()), float(nll.std(ddof=1) / math.sqrt(draws))

    # ---- the record in a data manifest --------------------------------------------------------

    def _tables(self) -> dict:
        return {"spec": self.spec.__dict__, "emit_ids": self.emit_ids.tolist(),
                "emit_weights": self.emit_weights.tolist()}

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
            language = cls(LanguageSpec(**record["spec"]), np.array(record["emit_ids"]),
                           np.array(record["emit_weights"]))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
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
    return SyntheticLanguage.from_record(manifest.get("language", {}),
                                         f"{setting} {data_dir}/manifest.json")
