"""Samples while training: what the model writes, every `eval.sample_every` steps, from fixed seeds.

Rank 0 draws `eval.sample_count` samples of the EMA weights (the raw ones without EMA) with the
KV-cache sampler (model/sampler/), temperature `eval.sample_temperature` and the paper's nucleus
rule with `eval.sample_top_p`. `eval.sample_sampler` picks how: `parallel` (the default) is the
paper's sampler at its settings, `eval.sample_steps` network calls (its sample_AOGPT.sh: 256) on
the linear schedule; `speculative` draws exactly one token per call's distribution in fewer
calls, drafting `eval.sample_draft` positions ahead per call with `eval.sample_tree` candidates
each (an any-order model only). Sample i always has sample id i and seed 0, so every round draws
the same uniforms and orders and the samples change only as the weights do: `trainer/sample.py
--ckpt <the checkpoint of that step> --num-samples N --steps S` (or `--sampler speculative --draft
K --tree C`) draws the same tokens (on the same device and precision). Each round writes
out_dir/samples/step_<step>.jsonl (trainer/sample.py's lines, with the step and the weights, and
each sample's network calls, as --record-calls records them: a round is rare and the calls cost
little, so tools/replay.py's page of a round replays its true calls) and logs

    sample_entropy    mean unigram entropy of the samples (nats; natural 1024-token text: ~5.5-5.7,
                      degenerate repetitions far less)
    sample_gen_ppl    their generative perplexity under `eval.judge` (trainer/judge.py's mean_ppl),
                      when a judge is configured, and sample_repetition (repeated 4-grams)
    sample_true_nll   with a synthetic language's data folder as the judge: their exact NLL per
                      token, and sample_true_nll_gap, its excess over the language's entropy
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from aogpt import UsageError
from aogpt.data_prep.synthetic import TokenIds
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.files import write_text_atomic
from aogpt.model import AOGPT
from aogpt.model.config import ModelConfig
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT
from aogpt.model.sampler import KVCacheSampler, SamplingConfig, sample_records
from aogpt.model.sampler.window import unigram_entropy
from aogpt.run_folder import RunFolder
from aogpt.trainer.config import EvalConfig
from aogpt.trainer.judge import Judge, generative_perplexity


def sampling_config(cfg: EvalConfig, any_order: bool) -> SamplingConfig:
    config = SamplingConfig(sampler=cfg.sample_sampler, steps=cfg.sample_steps,
                            draft=cfg.sample_draft, tree=cfg.sample_tree,
                            tree_depth=cfg.sample_tree_depth, predraft=cfg.sample_predraft,
                            temperature=cfg.sample_temperature,
                            top_p=cfg.sample_top_p, top_p_rule="paper",
                            order=(ANY_ORDER if any_order else LEFT_TO_RIGHT).word)
    try:
        config.validate()
    except UsageError as err:
        raise UsageError(f"eval.sample_*: {err}") from None
    return config


class TrainingSamples:
    """Draws, writes and scores a round of samples (rank 0 only)."""

    def __init__(self, cfg: EvalConfig, model: ModelConfig, run_root: Path, device: torch.device):
        self.cfg, self.seq_len, self.device = cfg, model.block_size, device
        self.config = sampling_config(cfg, model.any_order)
        self.run_folder = RunFolder(run_root)
        self.encoding = load_gpt2() if model.reads_gpt2 else TokenIds()
        self._judge: Judge | None = None

    def judge(self) -> Judge | None:
        if self.cfg.judge is not None and self._judge is None:
            self._judge = Judge(self.cfg.judge, self.device, setting="eval.judge")
        return self._judge

    @torch.no_grad()
    def round(self, model: AOGPT, step: int, weights: str) -> dict[str, float]:
        """Samples of `model` at `step`: written to samples/step_<step>.jsonl; their metrics."""
        start = time.perf_counter()
        count = self.cfg.sample_count
        sampler = KVCacheSampler(model, count, self.seq_len, self.config)
        out = sampler.generate(torch.arange(count), record_calls=True)
        tokens = out.tokens.tolist()
        records = sample_records(list(range(count)), out, self.encoding, self.config, step=step,
                                 weights=weights)
        write_text_atomic(self.run_folder.samples_file(step),
                          "".join(json.dumps(record) + "\n" for record in records))
        metrics = {"sample_entropy": sum(map(unigram_entropy, tokens)) / count}
        judge = self.judge()
        if judge is not None:
            report = generative_perplexity(tokens, judge, progress=False)
            metrics["sample_gen_ppl"] = report["mean_ppl"]
            metrics["sample_repetition"] = report["repetition"]
            if "true_nll" in report:  # a synthetic language's exact judge
                metrics["sample_true_nll"] = report["true_nll"]
                metrics["sample_true_nll_gap"] = report["gap"]
        metrics["sample_s"] = time.perf_counter() - start
        return metrics
