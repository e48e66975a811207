"""Generative perplexity: how likely a judge language model finds generated samples.

    python trainer/genppl.py --samples FILE.jsonl --judge PATH [--batch-size B] [--device D]
        [--json OUT [--force]]

--samples is what trainer/sample.py writes (a `tokens` list per line). --judge is either a local
Hugging Face GPT-2 folder (config.json + weights, e.g. gpt2-large saved with save_pretrained; it
is read from disk only, never downloaded) or any checkpoint of this project, which then scores
left to right. As in the paper (SEDD's protocol), each sample is scored on its tokens 2..n given
the ones before (no BOS), and the report holds:
  mean_ppl       mean over samples of exp(mean NLL of the sample) (the paper's number), and std
  ppl            exp(mean NLL over all scored tokens)
  entropy        mean over samples of the unigram entropy of the sample's tokens (nats): a guard
                 against degenerate samples, which a judge may like (repetitions) but which
                 have a low entropy (natural 1024-token text: about 5.5-5.7)
--json writes the report (an existing file is replaced only with --force) with its provenance:
the judge (a project checkpoint: the file read, its tag and step, the weights), the samples file
and the provenance its first line carries (the checkpoint sample.py read), every flag, and the
code's version and commit.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from aogpt import UsageError, check_counts, check_input_file, cli_entry
from aogpt.data_prep.manifest import FILENAME as MANIFEST
from aogpt.data_prep.synthetic import NAME as SYNTHETIC
from aogpt.data_prep.synthetic import SyntheticLanguage, load_language
from aogpt.files import OutputFile, check_output_file, write_json_atomic
from aogpt.model import load_checkpoint
from aogpt.model.checkpoint import locate_checkpoint, provenance, resolve_checkpoint_file
from aogpt.model.precision import resolve_device
from aogpt.model.sampler.window import unigram_entropy
from aogpt.progress import progress as progress_bar

# --json; an earlier report without made_by is known by its keys
REPORT = OutputFile("trainer/genppl.py", "generative-perplexity report", (".json",),
                    signature=("mean_ppl", "tokens_scored", "entropy"))


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
                          batch_size: int = 8, progress: bool = True) -> dict:
    """The report described at the top of this file, for these token sequences (>= 2 tokens)."""
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
    sample_nll = torch.empty(len(samples), dtype=torch.float64)  # mean per sample
    total_nll, total_tokens = 0.0, 0
    with progress_bar(batches, desc="judging", unit="batch", disable=not progress) as bar:
        for batch in bar:
            nll = judge.nll(torch.tensor([samples[i] for i in batch]))  # (b, n-1)
            sample_nll[batch] = nll.mean(dim=1).cpu()
            total_nll += float(nll.sum())
            total_tokens += nll.numel()
    ppl = sample_nll.exp()
    report = {"judge": judge.name, "samples": len(samples), "tokens_scored": total_tokens,
              "mean_ppl": float(ppl.mean()), "std_ppl": float(ppl.std()) if len(ppl) > 1 else 0.0,
              "ppl": math.exp(total_nll / total_tokens), **diversity(samples)}
    if judge.language is not None:
        report.update(true_nll_report(judge.language, sample_nll, by_length))
    return report


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


def read_samples(path: Path) -> tuple[list[list[int]], dict | None]:
    """The token lists of a sample.py --out file, and the provenance its first line carries
    (None in files without one, e.g. the trainer's samples)."""
    check_input_file(path, "--samples", "a JSONL file written by trainer/sample.py --out")
    samples, origin = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            samples.append([int(t) for t in record["tokens"]])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{path}:{number}: not a sample line with a `tokens` list ({err})") from err
        if len(samples) == 1:
            origin = record.get("provenance")
    return samples, origin


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=Path, required=True, help="JSONL from trainer/sample.py")
    parser.add_argument("--judge", required=True,
                        help="local Hugging Face GPT-2 folder, or a checkpoint of this project")
    parser.add_argument("--weights", choices=("ema", "raw"), default="ema",
                        help="weights of a project-checkpoint judge (default ema)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per forward (default 8)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    return parser.parse_args(argv)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_counts(args, "batch_size")
    if args.json:
        check_output_file(args.json, "--json", args.force, REPORT)
    samples, sampled_from = read_samples(args.samples)
    check_judge_matches(args.judge, sampled_from)
    judge = Judge(args.judge, resolve_device(args.device), args.weights)
    report = generative_perplexity(samples, judge, args.batch_size)
    print(format_report(report))
    if args.json:
        origin = provenance(judge.source, args.weights if judge.source else None, vars(args),
                            made_by=REPORT.made_by, judge=str(Path(args.judge).resolve()),
                            samples=str(args.samples.resolve()), sampled_from=sampled_from)
        write_json_atomic({**report, "provenance": origin}, args.json, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
