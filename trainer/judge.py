"""The judge of generated text: how likely a language model (or a synthetic language's exact
probabilities) finds samples, and what a judge's score can hide (their unigram entropy and
repetition).

A judge is a local Hugging Face GPT-2 folder (read from disk only, never downloaded), a checkpoint
of this project (scoring left to right), or a synthetic language's data folder (the truth). As in
the paper (SEDD's protocol), each sample is scored on its tokens 2..n given the ones before (no
BOS). generative_perplexity's report holds:
  mean_ppl       mean over samples of exp(mean NLL of the sample) (the paper's number), and std
  ppl            exp(mean NLL over all scored tokens)
  entropy        mean over samples of the unigram entropy of the sample's tokens (nats): a guard
                 against degenerate samples, which a judge may like (repetitions) but which
                 have a low entropy (natural 1024-token text: about 5.5-5.7)
  repetition     the mean share of repeated 4-grams
  true_nll ...   with a synthetic language: the samples' exact NLL and its gap to the entropy
trainer/genppl.py scores a sample file with it, trainer/sample.py --judge the samples it draws,
and trainer/training_samples.py the samples drawn while training.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from aogpt import UsageError
from aogpt.data_prep.manifest import FILENAME as MANIFEST
from aogpt.data_prep.synthetic import NAME as SYNTHETIC
from aogpt.data_prep.synthetic import SyntheticLanguage, load_language
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import locate_checkpoint, resolve_checkpoint_file
from aogpt.model.sampler.window import unigram_entropy
from aogpt.progress import progress as progress_bar

if TYPE_CHECKING:
    from aogpt.trainer.ranks import RankShare


def check_judge(path: str | Path, setting: str = "--judge") -> None:
    """UsageError (one line, naming `setting`) unless `path` is a local Hugging Face GPT-2 folder,
    a checkpoint of this project, or a synthetic language's data folder. transformers would load
    any other model's folder as a GPT-2 with random weights (e.g. this project's own Hugging Face
    export) and score with those."""
    if (Path(path) / MANIFEST).is_file():
        load_language(path, setting)
        return
    config_file = Path(path) / "config.json"
    if config_file.is_file():
        try:
            model_type = json.loads(config_file.read_text()).get("model_type")
        except (json.JSONDecodeError, AttributeError):
            model_type = None
        if model_type != "gpt2":
            raise UsageError(f"{setting}: {path} holds a {model_type or 'unreadable'} model, not a "
                             "Hugging Face GPT-2 (model_type gpt2): give a GPT-2 folder saved with "
                             "save_pretrained, e.g. gpt2-large")
        return
    try:
        resolve_checkpoint_file(path)
    except UsageError as err:
        raise UsageError(f"{setting}: {path} is neither a Hugging Face GPT-2 folder (no "
                         f"config.json) nor a checkpoint of this project ({err})") from None


def check_judge_matches(path: str | Path, sampled_from: dict | None,
                        setting: str = "--judge") -> None:
    """A synthetic language judges only the samples of a model trained on it: UsageError when the
    checkpoint the samples came from records other training data (its data_tokenizers)."""
    if not (Path(path) / MANIFEST).is_file() or not sampled_from:
        return
    trained_on = sampled_from.get("data_tokenizers") or []
    if not trained_on:
        return  # a checkpoint from before the data was recorded: nothing to compare
    language = load_language(path, setting)
    if not any(t.get("language_sha256") == language.fingerprint for t in trained_on):
        learned = ", ".join(f"synthetic language {t['language_sha256'][:12]}"
                            if t.get("name") == SYNTHETIC else f"{t.get('name')} text"
                            for t in trained_on)
        raise UsageError(f"{setting} {path} is synthetic language {language.fingerprint[:12]}, "
                         f"but the samples' model was trained on {learned}: judge with the data "
                         "folder the model was trained on")


class Judge:
    """Scores token sequences left to right: nll(tokens (b, n)) -> -log p of each token given the
    ones before it: (b, n-1) for a language model (tokens 1..n-1: there is no BOS), (b, n) for a
    synthetic language, whose probabilities are exact from the first token. setting: the flag or
    config key that named it, for errors."""

    def __init__(self, path: str | Path, device: torch.device, weights: str = "ema",
                 setting: str = "--judge"):
        check_judge(path, setting)
        path = Path(path)
        self.max_len: int
        self.source = None  # the project checkpoint read, if the judge is one
        self.language: SyntheticLanguage | None = None
        self.name = str(path)
        if (path / MANIFEST).is_file():  # a synthetic language: the truth, no network
            self.kind, self.max_len = "synthetic", sys.maxsize
            self.language = load_language(path, setting)
            return
        if (path / "config.json").is_file():  # a Hugging Face folder
            from transformers import GPT2LMHeadModel  # slow import, only when needed

            try:
                model = GPT2LMHeadModel.from_pretrained(path, local_files_only=True)
            except (OSError, ValueError) as err:
                raise UsageError(f"--judge {path} is not a loadable GPT-2 folder: "
                                 f"{str(err).splitlines()[0]}") from err
            self.kind, self.max_len = "hf", model.config.n_positions
        else:
            self.source = locate_checkpoint(path)
            if self.source.unfinished:
                print(self.source.unfinished_note(), file=sys.stderr, flush=True)
            model = load_checkpoint(self.source.file, weights=weights, map_location=device)
            self.kind, self.max_len = "aogpt", model.config.block_size
        self.model = model.to(device).eval()
        self.device = device

    @torch.no_grad()
    def nll(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > self.max_len:
            raise UsageError(f"samples of {tokens.size(1)} tokens are longer than the judge's "
                             f"context ({self.max_len})")
        if self.language is not None:
            return torch.from_numpy(self.language.conditional_nll(tokens.numpy()))
        tokens = tokens.to(self.device)
        if self.kind == "aogpt":
            return self.model.token_nll(tokens)[:, 1:].double()  # drop the [None] -> x_0 term
        logits = self.model(tokens).logits[:, :-1].double()
        return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")


REPEAT_N = 4  # the n-grams the repetition rate counts


def repetition(tokens: Sequence[int], n: int = REPEAT_N) -> float:
    """The share of a sample's n-grams that repeat an earlier n-gram of it: 1 - distinct / all
    (Welleck et al.'s seq-rep-n; 0 for a sample without a repeat)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def diversity(samples: Sequence[Sequence[int]]) -> dict:
    """Mean unigram entropy and repetition rate of the samples: what a judge's score can hide
    (a judge may like degenerate repetitions)."""
    return {"entropy": sum(map(unigram_entropy, samples)) / len(samples),
            "repetition": sum(map(repetition, samples)) / len(samples)}


def generative_perplexity(samples: Sequence[Sequence[int]], judge: Judge,
                          batch_size: int = 8, progress: bool = True,
                          share: RankShare | None = None) -> dict | None:
    """The report described at the top of this module, for these token sequences (>= 2 tokens).
    With a RankShare, each rank judges its share of the batches and rank 0 alone gets the report
    (the others None), the one-process report to the last bit: the same batches, summed in the
    same order."""
    if not samples:
        raise UsageError("no samples to score")
    if any(len(s) < 2 for s in samples):
        raise UsageError("every sample needs at least 2 tokens to be scored")
    # batches of equal length, so no padding can leak into a score
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_length.setdefault(len(s), []).append(i)
    batches = [idx[k:k + batch_size] for idx in by_length.values()
               for k in range(0, len(idx), batch_size)]
    scored = []  # per batch: each sample's mean NLL, the batch's sum and its tokens
    mine = batches if share is None else share.mine(batches)
    with progress_bar(mine, desc="judging", unit="batch", disable=not progress) as bar:
        for batch in bar:
            nll = judge.nll(torch.tensor([samples[i] for i in batch]))  # (b, n-1)
            scored.append((nll.mean(dim=1).cpu(), float(nll.sum()), nll.numel()))
    scored = scored if share is None else share.gather(scored)
    if scored is None:
        return None
    sample_nll = torch.empty(len(samples), dtype=torch.float64)  # mean per sample
    total_nll, total_tokens = 0.0, 0
    for batch, (means, batch_nll, tokens) in zip(batches, scored, strict=True):
        sample_nll[batch] = means
        total_nll += batch_nll
        total_tokens += tokens
    ppl = sample_nll.exp()
    report = {"judge": judge.name, "samples": len(samples), "tokens_scored": total_tokens,
              "mean_ppl": float(ppl.mean()), "std_ppl": float(ppl.std()) if len(ppl) > 1 else 0.0,
              "ppl": math.exp(total_nll / total_tokens), **diversity(samples)}
    if judge.language is not None:
        report.update(true_nll_report(judge.language, sample_nll, by_length))
    return report


def headline(report: dict) -> tuple[float, float]:
    """A report's number and its standard error: the true NLL per token with a synthetic
    language, else the mean generative perplexity (nan without a judge: diversity only)."""
    if "true_nll" in report:
        return report["true_nll"], report["true_nll_error"]
    if "mean_ppl" in report:
        return report["mean_ppl"], report["std_ppl"] / math.sqrt(report["samples"])
    return math.nan, math.nan


def true_nll_report(language: SyntheticLanguage, sample_nll: torch.Tensor,
                    by_length: dict[int, list[int]]) -> dict:
    """A synthetic judge's numbers: the samples' true NLL per token (with its standard error),
    the language's entropy per token at the samples' lengths (a perfect sampler's NLL), the gap,
    and the unigram entropy and repetition of as many of the language's own sequences."""
    weights = torch.zeros(len(sample_nll), dtype=torch.float64)
    entropy, reference = 0.0, []
    for length, indices in by_length.items():
        weights[indices] = length
        entropy += language.entropy_per_token(length)[0] * length * len(indices)
        reference += language.sample(min(len(indices), 2000), length, seed=0).tolist()
    weights /= weights.sum()
    nll = float((weights * sample_nll).sum())
    error = float(sample_nll.std() * weights.square().sum().sqrt()) if len(weights) > 1 else 0.0
    rate = entropy / sum(length * len(i) for length, i in by_length.items())
    return {"true_nll": nll, "true_nll_error": error, "entropy_rate": rate, "gap": nll - rate,
            "language": language.fingerprint,
            "reference": {"samples": len(reference), **diversity(reference)}}


def format_report(report: dict) -> str:
    if "true_nll" in report:  # a synthetic language: its exact judge
        reference = report["reference"]
        return (f"true NLL ({report['samples']} samples, exact): {report['true_nll']:.4f} +- "
                f"{report['true_nll_error']:.4f} nats/token against the language's entropy "
                f"{report['entropy_rate']:.4f} (gap {report['gap']:+.4f}); unigram entropy "
                f"{report['entropy']:.3f} (language {reference['entropy']:.3f}), repetition "
                f"{report['repetition']:.3f} (language {reference['repetition']:.3f})")
    return (f"generative perplexity ({report['judge']}, {report['samples']} samples): "
            f"mean {report['mean_ppl']:.2f} +- {report['std_ppl']:.2f}, "
            f"exp(mean nll) {report['ppl']:.2f}, unigram entropy {report['entropy']:.3f}, "
            f"repetition {report['repetition']:.3f}")
