"""A synthetic language whose probability of every sequence is known exactly: the judge of samplers.

Natural text has no exact judge here (GPT-2 large cannot be downloaded, and a small model's
generative perplexity judges the judge as much as the samples). This language is made to be one:

    topic      z ~ uniform over `topics`                            hidden, fixed per sequence
    first      x_0 ~ uniform over `vocab` token ids
    next       x_t ~ T_z(x_{t-1}, .)                                 a sparse bigram per topic

Each topic gives every token `successors` likely next tokens (weights drawn from a Dirichlet of
`concentration`), and `smoothing` of the mass spreads over the whole vocabulary, so that every
sequence has a probability above 0. The bigram is short-range structure that punishes tokens
drawn independently side by side (two neighbours drawn apart rarely make a likely pair); the
topic is long-range structure (every token is evidence of it, and mixing two topics makes
unlikely pairs where they meet), so the order of generation and the number of tokens drawn
together both matter.

    log p(x) = logsumexp_z [ -log topics - log vocab + sum_t log T_z(x_{t-1}, x_t) ]     exact

The entropy per token of n-token sequences, H(X)/n, is the NLL per token of a perfect model (in
any order: every order's product of conditionals is the same joint). It is computed as
H(X) = H(X|Z) + H(Z) - H(Z|X): H(X|Z) exactly, by carrying each topic chain's marginal along the
positions; H(Z) = log topics; H(Z|X), what a sequence leaves unknown of its topic, is small and is
estimated from sequences the language draws, with its standard error.

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
VERSION = 1
NAME = "synthetic"  # the tokenizer name a data manifest records for it


@dataclass(frozen=True)
class LanguageSpec:
    """What a language is drawn from (synthetic_to_mds.py's flags)."""

    vocab: int = 128
    topics: int = 4
    successors: int = 4
    smoothing: float = 0.01
    concentration: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        for name in ("vocab", "topics", "successors"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.successors > self.vocab:
            raise UsageError(f"--successors ({self.successors}) cannot exceed --vocab "
                             f"({self.vocab})")
        if self.vocab > 65535:
            raise UsageError(f"--vocab must be at most 65535 (tokens are stored as uint16), got "
                             f"{self.vocab}")
        if not 0.0 < self.smoothing < 1.0:
            raise UsageError(f"--smoothing must be in (0, 1) (every sequence keeps a probability "
                             f"above 0), got {self.smoothing}")
        if self.concentration <= 0:
            raise UsageError(f"--concentration must be positive, got {self.concentration}")


class SyntheticLanguage:
    """The language: next_ids, next_weights (topics, vocab, successors) and smoothing."""

    def __init__(self, spec: LanguageSpec, next_ids: np.ndarray, next_weights: np.ndarray):
        self.spec = spec
        self.next_ids = next_ids.astype(np.int64)
        self.next_weights = next_weights.astype(np.float64)
        k, v = spec.topics, spec.vocab
        dense = np.zeros((k, v, v))
        np.put_along_axis(dense, self.next_ids, self.next_weights, axis=2)
        self.transition = (1 - spec.smoothing) * dense + spec.smoothing / v  # (topics, v, v)
        self.log_transition = np.log(self.transition)
        self.fingerprint = hashlib.sha256(json.dumps(self._tables(), sort_keys=True).encode()
                                          ).hexdigest()

    @classmethod
    def draw(cls, spec: LanguageSpec) -> SyntheticLanguage:
        """A new language from spec's seed."""
        spec.validate()
        rng = np.random.default_rng(spec.seed)
        k, v, s = spec.topics, spec.vocab, spec.successors
        next_ids = np.argsort(rng.random((k, v, v)), axis=2)[..., :s]  # s distinct successors
        next_weights = rng.dirichlet(np.full(s, spec.concentration), size=(k, v))
        return cls(spec, next_ids, next_weights)

    # ---- sequences ------------------------------------------------------------------------

    def sample(self, count: int, length: int, seed: int) -> np.ndarray:
        """(count, length) int64 sequences drawn from the language, the same for the same seed."""
        rng = np.random.default_rng([self.spec.seed, seed])
        topic = rng.integers(self.spec.topics, size=count)
        tokens = np.empty((count, length), dtype=np.int64)
        tokens[:, 0] = rng.integers(self.spec.vocab, size=count)
        cdf = np.cumsum(self.transition, axis=2)
        for t in range(1, length):
            row = cdf[topic, tokens[:, t - 1]]  # (count, vocab)
            point = rng.random(count)[:, None] * row[:, -1:]
            tokens[:, t] = np.minimum((row <= point).sum(axis=1), self.spec.vocab - 1)
        return tokens

    def topic_log_joint(self, tokens: np.ndarray) -> np.ndarray:
        """(count, topics): log p(x, z) of each sequence with each topic."""
        tokens = self.check_tokens(tokens)
        steps = self.log_transition[:, tokens[:, :-1], tokens[:, 1:]]  # (topics, count, n - 1)
        prior = -math.log(self.spec.topics) - math.log(self.spec.vocab)
        return (prior + steps.sum(axis=2)).T

    def log_prob(self, tokens: np.ndarray) -> np.ndarray:
        """(count,) float64: log p(x) of each sequence, exactly."""
        return _logsumexp(self.topic_log_joint(tokens), axis=1)

    def conditional_nll(self, tokens: np.ndarray) -> np.ndarray:
        """(count, n) float64: -log p(x_t | x_<t), left to right (their sum is -log p(x))."""
        tokens = self.check_tokens(tokens)
        steps = self.log_transition[:, tokens[:, :-1], tokens[:, 1:]].transpose(1, 2, 0)
        # log p(x_<=t, z) for every prefix: (count, n, topics)
        prefix = np.concatenate([np.zeros_like(steps[:, :1]), np.cumsum(steps, axis=1)], axis=1)
        prefix += -math.log(self.spec.topics) - math.log(self.spec.vocab)
        marginal = _logsumexp(prefix, axis=2)  # log p(x_<=t)
        return -np.diff(marginal, axis=1, prepend=0.0)

    def check_tokens(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 2 or tokens.shape[1] < 1:
            raise UsageError("the samples must be sequences of at least one token")
        if tokens.size and not 0 <= tokens.min() <= tokens.max() < self.spec.vocab:
            raise UsageError(f"the samples hold token ids outside 0..{self.spec.vocab - 1}, this "
                             f"language's vocabulary: they were not drawn from a model of it")
        return tokens

    # ---- entropy ----------------------------------------------------------------------------

    def entropy_per_token(self, length: int, draws: int = 4000, seed: int = 1) -> tuple[float, float]:
        """(H(X)/length, its standard error) for sequences of `length` tokens (see the top)."""
        v, k = self.spec.vocab, self.spec.topics
        row_entropy = -(self.transition * self.log_transition).sum(axis=2)  # (topics, vocab)
        marginal = np.full((k, v), 1.0 / v)  # each topic's p(x_t)
        given_topic = np.full(k, math.log(v))  # H(X | Z = z), position by position
        for _ in range(1, length):
            given_topic += (marginal * row_entropy).sum(axis=1)
            marginal = np.einsum("ka,kab->kb", marginal, self.transition)
        joint = self.topic_log_joint(self.sample(draws, length, seed))
        posterior = np.exp(joint - _logsumexp(joint, axis=1)[:, None])
        left = -(posterior * np.log(np.maximum(posterior, 1e-300))).sum(axis=1)  # H(Z | x)
        entropy = given_topic.mean() + math.log(k) - left.mean()
        return entropy / length, left.std(ddof=1) / math.sqrt(draws) / length

    # ---- the record in a data manifest --------------------------------------------------------

    def _tables(self) -> dict:
        return {"spec": self.spec.__dict__, "next_ids": self.next_ids.tolist(),
                "next_weights": self.next_weights.tolist()}

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
            language = cls(LanguageSpec(**record["spec"]), np.array(record["next_ids"]),
                           np.array(record["next_weights"]))
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
        return {"name": NAME, "n_vocab": self.spec.vocab, "language_sha256": self.fingerprint}


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


def _logsumexp(values: np.ndarray, axis: int) -> np.ndarray:
    top = values.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(values - top).sum(axis=axis, keepdims=True))).squeeze(axis)
