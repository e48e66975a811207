"""Evaluation while training: when it happens, and what it scores with which weights.

Every eval.every steps (and at the last), each of the run's evaluation weights (the EMA's, the
paper's choice, and the raw ones when eval.raw_weights asks) is copied into a plain network and
scored by trainer/evaluation.py's Evaluator, the routine trainer/evaluate.py runs:
    val_loss_l2r, val_loss_ao     the training data's val split, eval.batches per rank, the first
                                  weights only (left to right, and over eval.num_orders orders)
    eval/<set>/<weights>/...      each zero-shot set of eval.sets (trainer/zero_shot.py)
Every eval.sample_every steps, rank 0 draws a round of samples of the first weights
(trainer/training_samples.py). A round of samples after an evaluation of the same step reuses
its copy of the weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch

from aogpt.model import AOGPT
from aogpt.model.orders import ANY_ORDER, LEFT_TO_RIGHT
from aogpt.trainer import zero_shot
from aogpt.trainer.config import RunConfig
from aogpt.trainer.data import validation_loader
from aogpt.trainer.dist_env import DistEnv
from aogpt.trainer.ema import ShardedEMA, full_weights
from aogpt.trainer.evaluation import EvalData, Evaluator
from aogpt.trainer.metrics import loss_key, validation_line, validation_losses
from aogpt.trainer.training_samples import TrainingSamples


def token_weighted(nll_sum: float, tokens: float) -> float | None:
    return nll_sum / tokens if tokens else None


@dataclass
class Report:
    """What the Validator did after a step: its metrics (for metrics.jsonl) and its log lines,
    rank 0's; `ran`: it read the device, alike on every rank (a boundary where trainer/recovery.py
    looks for bad steps)."""

    metrics: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    ran: bool = False


class Validator:
    def __init__(self, cfg: RunConfig, env: DistEnv, engine, ema: ShardedEMA | None,
                 manifests: dict[str, dict], zero_shot_sets: dict[str, EvalData], out_dir: Path):
        self.cfg, self.env, self.engine, self.ema = cfg, env, engine, ema
        self.device = env.device
        self.val_loader = (validation_loader(cfg, manifests, env, self.device)
                           if cfg.eval.every else None)
        self.zero_shot_sets = zero_shot_sets
        self.weights = ["ema"] if ema is not None else ["raw"]
        if cfg.eval.raw_weights and ema is not None and zero_shot_sets:
            self.weights.append("raw")
        self.samples = (TrainingSamples(cfg.eval, cfg.model, out_dir, self.device)
                        if cfg.eval.sample_every and env.is_main else None)
        self._model: AOGPT | None = None
        self._model_holds: tuple[int, str] | None = None  # (step, weights) it was loaded with
        self._last_round = time.perf_counter()
        self._last_validation: dict = {}  # of the last evaluation, for the run's summary

    def should_evaluate(self, step: int, last: bool) -> bool:
        every = self.cfg.eval.every
        return bool(every) and (step % every == 0 or last)

    def should_sample(self, step: int, last: bool) -> bool:
        every = self.cfg.eval.sample_every
        return bool(every) and (step % every == 0 or last)

    def start_clock(self) -> None:
        """The time a round's cost is measured against starts now (the loop's start)."""
        self._last_round = time.perf_counter()

    def after_step(self, step: int, last: bool) -> Report:
        """Collective, after every step: the evaluation and the round of samples due at `step`
        (`last`: the run's last step), done; what they found and the lines that say it."""
        report = Report()
        if self.should_evaluate(step, last):
            self._last_validation = self.evaluate(step)
            report.metrics.update(self._last_validation)
            report.lines.append(validation_line(report.metrics, step, self.weights[0]))
            if self.zero_shot_sets:
                report.lines.append(f"step {step} | " + zero_shot.describe(
                    report.metrics, list(self.zero_shot_sets), self.weights[0]))
            report.ran = True
        if self.should_sample(step, last):
            report.metrics.update(self.sample(step))
            report.ran = True
        return report

    def summary(self) -> str | None:
        """The last validation losses, for the run's closing lines; None before any."""
        if not self._last_validation:
            return None
        return validation_losses(self._last_validation, self.weights[0])

    def restart(self, progress) -> None:
        """After a rollback to `progress`: the weights copied at a step no longer stand for it
        (the same steps again, with other weights)."""
        self._model_holds = None

    def model(self, step: int, weights: str, everywhere: bool = True) -> AOGPT | None:
        """Collective: a plain copy of the network holding this step's `weights` ("ema" or
        "raw"); the engine's own weights stay untouched. Only rank 0 gets one unless
        `everywhere` (the others get None). What every rank was given once in a step is reused
        in that step: every rank decides alike."""
        if self._model_holds == (step, weights):
            return self._model
        full = full_weights(self.engine, self.ema, use_ema=weights == "ema",
                            keep=everywhere or self.env.is_main)
        self._model_holds = (step, weights) if everywhere else None
        if not (everywhere or self.env.is_main):
            return None
        if self._model is None:
            with torch.device(self.device):
                self._model = AOGPT(self.cfg.model).eval()
        self._model.load_state_dict(full)
        return self._model

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float | None]:
        """Collective: the validation losses, each zero-shot set under each of the weights, and
        what the round cost (eval_s, and eval_fraction of the time since the last round)."""
        cfg, env = self.cfg, self.env
        start = time.perf_counter()
        record = {}
        for weights in self.weights:
            model = self.model(step, weights)
            settings = zero_shot.settings(model, self.precision, cfg.train.micro_batch_size,
                                          cfg.eval.num_orders)
            evaluator = Evaluator(model, settings, self.device, env.rank, env.world_size)
            if weights == self.weights[0]:
                record.update(self.validate(evaluator))
            for name, data in self.zero_shot_sets.items():
                record.update(zero_shot.score(evaluator, data, weights, name))
        end = time.perf_counter()
        record["eval_s"] = end - start
        record["eval_fraction"] = (end - start) / max(end - self._last_round, 1e-9)
        self._last_round = end
        return record

    def sample(self, step: int) -> dict[str, float]:
        """Collective (the weights are gathered): rank 0 draws, writes and scores a round of
        samples of the first weights; its metrics."""
        model = self.model(step, self.weights[0], everywhere=False)
        if self.samples is None:
            return {}
        return self.samples.round(model, step, self.weights[0])

    @property
    def precision(self) -> str:
        return "fp32" if self.cfg.train.precision == "fp32" else "bf16"

    def validate(self, evaluator: Evaluator) -> dict[str, float | None]:
        """val_loss_l2r and val_loss_ao (token-weighted over eval.num_orders seeded orders, keyed
        on each sample's index in the dataset, as the loader gives it) on eval.batches batches of
        the val split: the evaluator's own batch loop over the loader's batches."""
        batches = ((sample_ids, idx, torch.full_like(sample_ids, idx.shape[1]))  # no padding
                   for idx, sample_ids in islice(self.val_loader, self.cfg.eval.batches))
        scores = evaluator.run(batches, self.cfg.model.block_size)
        return {loss_key(reading, validation=True): scores[reading.word]["nll"]
                if reading.word in scores else None for reading in (LEFT_TO_RIGHT, ANY_ORDER)}

    def close(self) -> None:
        if self.val_loader is not None:
            self.val_loader.close()
