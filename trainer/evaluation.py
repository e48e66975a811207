"""Zero-shot evaluation: exact left-to-right NLL, the any-order bound, the context-order ensemble.

For each sequence x of n tokens (a data folder's samples in order, split over ranks by stride):

    l2r        -log p(x) along the identity order: the exact likelihood under one order.
    random     -log p(x | σ) for K seeded uniform orders σ per sequence. Its mean over σ is the
               AO-AR loss, the masked diffusion model's negative ELBO, so exp() of it bounds the
               perplexity from above ("<= PPL"). Reported with the std over the K.
    planner    -log p(x) along the order a planner (model/sampler/planners.py: confidence,
               margin, entropy, threshold) takes while it reveals x's own tokens: the planner
               decides from the tokens revealed so far only, so each x has one path and these are
               a normalised distribution over texts. An exact likelihood (of the model read in
               the planner's order), not a bound. Costs about n^2/2 rows per sequence (every
               remaining position is a candidate at each of its n calls).
    ensemble   the paper's context-order ensemble (Finding 5): for the i-th target of a base order
               σ, p_ens = mean over M members of p(x[σ_i] | the context σ_<i re-permuted), member 0
               being σ itself; the NLL of p_ens per token. One run reports every size M' <= M
               asked for, each the average over the first M' members. Its mathematics, and how
               it is computed cheaply: trainer/ensemble.py.

Evaluator.run is the one batch loop of this module's scores: it takes any iterable of batches,
a data folder's (score_data: evaluate.py, the zero-shot sets while training) or the training
data's val loader (trainer/validator.py). lm-eval's requests (trainer/lm_harness.py) and the
judge's samples (trainer/judge.py) are batched where they are made, by their own loops.
Everything is token-weighted (sum of NLL over all ranks / sum of tokens), no sample is scored
twice and the last partial batch counts. Every random choice is a counter-based hash of (seed,
global sample index, ...), so results depend neither on the batch size nor on the number of
ranks.

Samples of a per-example data folder (LAMBADA's --packing per_example) carry a `length`: only
their first `length` tokens are real, and every order reads them first, so that the EOS padding
after them is never seen nor scored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from aogpt import UsageError, check_counts
from aogpt.data_prep import mds, remote
from aogpt.data_prep.manifest import COLUMN, check_compatible, read_manifest, split_path
from aogpt.data_prep.streaming_compat import streaming
from aogpt.model import AOGPT, OrderConfig, OrderSampler
from aogpt.model.orders import (
    ANY_ORDER,
    LEFT_TO_RIGHT,
    READING_WORDS,
    per_reading,
    reading_named,
)
from aogpt.model.sampler import KVCacheSampler, SamplingConfig
from aogpt.model.sampler.ways import named
from aogpt.progress import progress as progress_bar
from aogpt.trainer.data import CopiedStream, loader_failure
from aogpt.trainer.ensemble import choose_targets, ensemble_member_nll, ensemble_sums

# One batch of scoring: (sample_indices (b,) the samples' indices in their dataset, which pick
# their orders; tokens (b, n) int64; lengths (b,) the real tokens of each sample)
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

PRECISIONS = {
    "fp32": "fp32 weights and activations, TF32 off, log-softmax in fp32",
    "bf16": "bf16 autocast over fp32 weights, log-softmax in fp32",
}


@contextlib.contextmanager
def precision_policy(precision: str, device: torch.device) -> Iterator[None]:
    """The numerics PRECISIONS names, around scoring only: every evaluation (evaluate.py, the
    trainer's, lm-eval's) scores inside it. fp32 turns TF32 off for its duration and back after,
    so a training process, which runs its own matmuls with TF32, scores in true fp32."""
    if precision == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@dataclass(frozen=True)
class EvalSettings:
    orders: tuple[str, ...] = READING_WORDS  # the readings scored (orders.READINGS' words)
    num_orders: int = 4  # K random orders per sequence
    ensemble: tuple[int, ...] = ()  # ensemble sizes to report, ascending; the largest is run
    ensemble_targets: int | None = None  # targets scored per sequence; None: all of them
    ensemble_base: str = ANY_ORDER.word  # the base order σ: any order (the paper) or l2r
    batch_size: int = 8  # sequences per forward; ensemble forwards hold batch_size x n slots
    max_samples: int | None = None  # the first N samples of each data folder
    seed: int = 0
    precision: str = "fp32"
    planners: tuple[str, ...] = ()  # planners whose orders score the text (planners.py)

    def __post_init__(self):
        # an alias names its reading by its word, the key of the results
        object.__setattr__(self, "orders", tuple(
            reading_named(word, "--orders").word for word in self.orders))
        object.__setattr__(self, "ensemble_base",
                           reading_named(self.ensemble_base, "--ensemble-base").word)

    def validate(self, model: AOGPT) -> None:
        """UsageError for settings that cannot run, or cannot run on this model."""
        if not (self.orders or self.ensemble or self.planners):
            raise UsageError(f"--orders: give a comma list of {', '.join(READING_WORDS)} (or "
                             "an --ensemble)")
        check_counts(self, "num_orders", "batch_size", "ensemble_targets", "max_samples")
        if self.ensemble_targets == 1:  # the standard error of a mean needs two
            raise UsageError("--ensemble-targets must be at least 2 (a standard error needs two "
                             "targets per sequence), got 1; leave it out to score every target")
        if any(m < 1 for m in self.ensemble):
            raise UsageError(f"--ensemble sizes must be positive, got {list(self.ensemble)}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}")
        unknown = [p for p in self.planners if p not in named("planner")]
        if unknown:
            raise UsageError(f"--planners {','.join(unknown)}: each must be one of "
                             f"{', '.join(named('planner'))}")
        if set(self.orders) - {LEFT_TO_RIGHT.word} or self.ensemble or self.planners:
            model.config.require_any_order("it cannot score other orders; use --orders "
                                           f"{LEFT_TO_RIGHT.word} and no --ensemble")

    @property
    def members(self) -> int:
        return max(self.ensemble, default=0)


# ---- data ----------------------------------------------------------------------------------------

class EvalData:
    """A data folder's evaluation split (a pretraining folder's val, an eval set's only split),
    read by random access in sample order: no shuffle, no workers. A bucket's dataset
    (s3://BUCKET/PREFIX) is copied shard by shard into `cache` (default: a folder per dataset
    under $TMPDIR, shared by the node's ranks), each copy checked against its index's hash."""

    def __init__(self, data_dir: str | Path, block_size: int, max_samples: int | None = None,
                 cache: str | Path | None = None, vocab_size: int | None = None):
        self.remote = str(data_dir).rstrip("/") if remote.is_remote(data_dir) else None
        self.path = self.remote or Path(data_dir)
        self.manifest = (remote.remote_manifest(self.remote, "--data") if self.remote
                         else read_manifest(data_dir))
        splits = self.manifest["splits"]
        self.split = "val" if self.manifest["kind"] == "pretrain" else next(iter(splits))
        self.seq_len = self.manifest["seq_len"]
        # the tokenizer must match; any seq_len up to the model's block_size can be scored
        check_compatible(self.manifest, self.seq_len, vocab_size)
        if self.seq_len > block_size:
            raise UsageError(f"{data_dir} has samples of {self.seq_len} tokens, more than the "
                             f"model's block_size {block_size}: rebuild it with --seq-len "
                             f"{block_size}")
        if self.remote:
            identity = f"{self.remote} {splits[self.split].get('index_sha256')}"
            self.cache = Path(cache or Path(tempfile.gettempdir()) / "aogpt-eval-cache") / (
                hashlib.sha256(identity.encode()).hexdigest()[:12])
        else:
            self.split_dir = split_path(data_dir, self.split)
        size = splits[self.split]["samples"]
        self.num_samples = size if max_samples is None else min(size, max_samples)
        self._dataset = None

    @property
    def dataset(self):
        """Opened on first use, once the process group exists (streaming looks for it)."""
        if self._dataset is None and self.remote:
            stream = CopiedStream(
                remote=remote.join(self.remote, self.manifest["splits"][self.split]["path"]),
                local=str(self.cache),
                validate_hash=next(iter(self.manifest.get("shard_hashes", [])), None))
            self._dataset = streaming.StreamingDataset(streams=[stream], shuffle=False,
                                                       batch_size=1)
        if self._dataset is None:
            shards = json.loads((self.split_dir / "index.json").read_text())["shards"]
            if all((self.split_dir / shard["raw_data"]["basename"]).is_file() for shard in shards):
                self._dataset = streaming.LocalDataset(str(self.split_dir))
            else:  # compressed shards: streaming decompresses them next to the originals
                self._dataset = streaming.StreamingDataset(
                    local=str(self.split_dir), remote=None, shuffle=False, batch_size=1)
        return self._dataset

    @property
    def name(self) -> str:
        return self.manifest["dataset"]

    def batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[Batch]:
        """This rank's samples rank, rank + world_size, ..., in Batches. A shard that cannot be
        copied or read is one line (RunFailure), as in training."""
        mine = range(rank, self.num_samples, world_size)
        for start in range(0, len(mine), batch_size):
            indices = mine[start:start + batch_size]
            try:
                samples = [self.dataset[i] for i in indices]
            except Exception as err:
                raise loader_failure(err, self.dataset, "evaluation",
                                     {str(self.path): self.manifest}) from None
            tokens = np.stack([s["tokens"] for s in samples]).astype(np.int64)
            lengths = [int(s.get("length", self.seq_len)) for s in samples]
            yield torch.tensor(list(indices)), torch.from_numpy(tokens), torch.tensor(lengths)

    def num_batches(self, rank: int, world_size: int, batch_size: int) -> int:
        return math.ceil(len(range(rank, self.num_samples, world_size)) / batch_size)


def unigram_reference(counts_from: str | Path, data: EvalData,
                      max_count_samples: int = 200_000) -> dict:
    """The score of a model that ignores all context, for scale: each token of `data` costs
    -log of its frequency in the train split of the pretraining folder `counts_from` (its first
    `max_count_samples` samples, add-1/2 smoothing over the tokenizer's vocabulary). A model at
    this level has learned token frequencies only, which is where any-order training of a tiny
    model sits for its first million or so tokens."""
    manifest = read_manifest(counts_from)
    if manifest["kind"] != "pretrain":
        raise UsageError(f"--unigram-from {counts_from}: needs a pretraining folder (with a train "
                         f"split), not an eval set")
    check_compatible(manifest, manifest["seq_len"])
    vocab = manifest["tokenizer"]["n_vocab"]
    # packed text: every token of a sample is real
    counts = 0.5 + mds.value_counts(split_path(counts_from, "train"), COLUMN, vocab,
                                    max_count_samples)
    log_p = np.log(counts) - np.log(counts.sum())
    nll, tokens = 0.0, 0
    for _, idx, lengths in data.batches(rank=0, world_size=1, batch_size=256):
        real = torch.arange(idx.shape[1]) < lengths[:, None]  # (b, n): not padding
        nll -= log_p[idx[real].numpy()].sum()
        tokens += int(real.sum())
    return {**_score(nll, tokens), "tokens": tokens,
            "counted_tokens": int(counts.sum() - 0.5 * vocab), "counts_from": str(counts_from)}


# ---- orders --------------------------------------------------------------------------------------

def real_first(orders: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The orders (b, n) changed to read each sample's real tokens (positions < length) first,
    in their relative order, then its padding: a uniform order stays uniform over the real ones."""
    is_padding = (orders >= lengths[:, None]).to(torch.int8)
    return orders.gather(1, torch.sort(is_padding, dim=1, stable=True).indices)


def planner_kind(planner: str) -> str:
    """A planner's key in the results: "planner margin"."""
    return f"planner {planner}"


# ---- tallies and the evaluator -------------------------------------------------------------------

@dataclass
class Tally:
    """What one kind of score adds up on this rank; summed over ranks at the end."""

    sums: torch.Tensor  # float64, the kind's own layout
    forwards: int = 0  # sequences (rows) run through the network
    slot_forwards: int = 0  # their slots, padding included: the cost in token-forwards
    paper_slot_forwards: int = 0  # what the paper's script would run (ensemble only)
    seconds: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)

    def reduced(self) -> Tally:
        """The sums over all ranks (collective; a copy when there is one process)."""
        counters = [self.forwards, self.slot_forwards, self.paper_slot_forwards,
                    *self.extra.values()]
        flat = torch.cat([self.sums.flatten(),
                          torch.tensor(counters, dtype=torch.float64, device=self.sums.device)])
        seconds = torch.tensor([self.seconds], dtype=torch.float64, device=self.sums.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flat)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's time
        size = self.sums.numel()
        values = [round(v) for v in flat[size:].tolist()]
        return Tally(flat[:size].view_as(self.sums).cpu(), *values[:3], seconds.item(),
                     dict(zip(self.extra, values[3:], strict=True)))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _score(nll_sum: float, tokens: float) -> dict:
    """The token-weighted NLL and its perplexity; None for both when no token was scored."""
    if not tokens:
        return {"nll": None, "ppl": None}
    return {"nll": nll_sum / tokens, "ppl": math.exp(nll_sum / tokens)}


@dataclass(frozen=True)
class ReadingScore:
    """How the evaluator scores a text along a reading (READING_SCORES)."""

    # the orders of a batch's k-th forward: (order sampler, k, sample indices (b,), lengths (b,),
    # n) -> (b, n) orders that read the real tokens first
    orders: Callable[[OrderSampler, int, torch.Tensor, torch.Tensor, int], torch.Tensor]
    # settings.num_orders random orders, whose mean is a bound reported with its spread over the
    # orders; or one order, whose nll is an exact likelihood
    random: bool
    # its orders are the identity: run as the network's causal path (no orders), which computes
    # the same numbers without the target positions' gathers
    causal: bool = False


def _identity_orders(sampler: OrderSampler, k: int, sample_indices: torch.Tensor,
                     lengths: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(n, device=sample_indices.device).expand(len(sample_indices), n)


def _random_orders(sampler: OrderSampler, k: int, sample_indices: torch.Tensor,
                   lengths: torch.Tensor, n: int) -> torch.Tensor:
    return real_first(sampler(k, sample_indices)[0], lengths)


# EvalSettings.orders' words -> how each is scored (model/orders.py per_reading: a new reading
# needs its entry here)
READING_SCORES = per_reading("trainer/evaluation.py READING_SCORES", {
    LEFT_TO_RIGHT.word: ReadingScore(_identity_orders, random=False, causal=True),
    ANY_ORDER.word: ReadingScore(_random_orders, random=True),
})


class Evaluator:
    """Scores data folders with one model and one EvalSettings on this rank's share of samples."""

    def __init__(self, model: AOGPT, settings: EvalSettings, device: torch.device,
                 rank: int = 0, world_size: int = 1):
        settings.validate(model)
        self.model, self.settings, self.device = model, settings, device
        self.rank, self.world_size = rank, world_size
        self._planner_samplers: dict[tuple[str, int, int], KVCacheSampler] = {}

    def precision(self):
        """The context every score of this evaluator is made in (precision_policy)."""
        return precision_policy(self.settings.precision, self.device)

    @contextlib.contextmanager
    def timed(self, tally: Tally):
        def sync():
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        sync()
        start = time.perf_counter()
        yield
        sync()
        tally.seconds += time.perf_counter() - start

    @torch.inference_mode()
    def run(self, batches: Iterable[Batch], seq_len: int) -> dict[str, dict]:
        """Every score the settings ask for over this rank's `batches` of sequences of seq_len
        tokens, summed over all ranks, by kind (l2r, random, ensemble, planner P): every rank
        gets them (collective: each rank passes its own share of the samples)."""
        tallies, sampler = self.new_tallies(), self.order_sampler(seq_len)
        with self.precision():
            for batch in batches:
                self.score_batch(sampler, tallies, *(t.to(self.device) for t in batch))
        summarize = {**{word: self.summarize_random if score.random else self.summarize_exact
                        for word, score in READING_SCORES.items()},
                     "ensemble": self.summarize_ensemble,
                     **{planner_kind(p): self.summarize_planner for p in self.settings.planners}}
        return {kind: summarize[kind](tally.reduced()) for kind, tally in tallies.items()}

    def score_data(self, data: EvalData, progress: bool = False) -> dict:
        """The results for one data folder, this rank scoring its strided share of the samples
        (every rank gets them; collective)."""
        size = self.settings.batch_size
        batches = data.batches(self.rank, self.world_size, size)
        with progress_bar(batches, total=data.num_batches(self.rank, self.world_size, size),
                          desc=data.name, unit="batch", disable=not progress) as bar:
            scores = self.run(bar, data.seq_len)
        return {"data": str(data.path), "dataset": data.name, "split": data.split,
                "samples": data.num_samples, "seq_len": data.seq_len, **scores}

    def new_tallies(self) -> dict[str, Tally]:
        """Empty sums per kind of score: (nll, tokens), per order for a random reading, and
        (estimate, variance) per size for the ensemble."""
        s = self.settings

        def sums(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=self.device)

        tallies = {word: Tally(sums(s.num_orders, 2) if READING_SCORES[word].random else sums(2))
                   for word in s.orders}
        if s.ensemble:
            tallies["ensemble"] = Tally(sums(len(s.ensemble), 2),
                                        extra={"tokens": 0, "scored_targets": 0})
        for planner in s.planners:
            tallies[planner_kind(planner)] = Tally(sums(2), extra={"network_calls": 0})
        return tallies

    def order_sampler(self, seq_len: int) -> OrderSampler:
        """The seed convention of every evaluation: the k-th random order of the sample with
        dataset index i is the any-order OrderSampler's draw at step k for i, under
        settings.seed."""
        return OrderSampler(OrderConfig(kind=ANY_ORDER.word), seq_len, self.settings.seed)

    def score_batch(self, sampler: OrderSampler, tallies: dict[str, Tally],
                    sample_indices: torch.Tensor, idx: torch.Tensor, lengths: torch.Tensor) -> None:
        """Adds one batch's scores to the tallies: idx (b, n) with real tokens before lengths
        (b,), sample_indices (b,) their indices in the dataset (which pick their orders)."""
        s, model = self.settings, self.model
        b, n = idx.shape
        # (b, n): slot k scores a token
        real = torch.arange(n, device=idx.device) < lengths[:, None]
        scored = {}  # base orders already run: kind -> (orders, nll)

        def order_nll(tally: Tally, orders: torch.Tensor) -> torch.Tensor:
            tally.forwards, tally.slot_forwards = tally.forwards + b, tally.slot_forwards + b * n
            return model(idx, orders).double()  # (b, n)

        for word, score in READING_SCORES.items():
            if word not in tallies:
                continue
            tally = tallies[word]
            with self.timed(tally):
                for k in range(s.num_orders if score.random else 1):
                    orders = score.orders(sampler, k, sample_indices, lengths, n)
                    nll = order_nll(tally, None if score.causal else orders)
                    sums = torch.stack([(nll * real).sum(), real.sum()])
                    if score.random:
                        tally.sums[k] += sums
                    else:
                        tally.sums += sums
                    if k == 0:
                        scored[word] = orders, nll
        if "ensemble" in tallies:
            self.score_ensemble(tallies["ensemble"], sampler, scored, sample_indices, idx, lengths)
        for planner in s.planners:
            self.score_planner(tallies[planner_kind(planner)], planner, sample_indices, idx,
                               lengths)

    def score_planner(self, tally: Tally, planner: str, sample_indices: torch.Tensor,
                      idx: torch.Tensor, lengths: torch.Tensor) -> None:
        """The text's log-likelihood along the order the planner takes revealing its tokens
        (teacher forcing). Padding past a sample's length is given (read first, not scored)."""
        b, n = idx.shape
        with self.timed(tally):
            padding = torch.arange(n, device=idx.device) >= lengths[:, None]
            key = (planner, self.settings.batch_size, n)  # one sampler (and cache) per planner
            if key not in self._planner_samplers:
                config = SamplingConfig(planner=planner, seed=self.settings.seed)
                self._planner_samplers[key] = KVCacheSampler(
                    self.model, self.settings.batch_size, n, config, cuda_graphs=False,
                    compile=False)
            out = self._planner_samplers[key].generate(sample_indices, idx, padding,
                                                       forced_tokens=idx)
            tally.sums += torch.tensor([-out.stats["log_likelihood"].sum().item(),
                                        float(lengths.sum())], dtype=torch.float64,
                                       device=tally.sums.device)
            tally.forwards += out.network_calls * b
            tally.slot_forwards += out.rows * b
            tally.extra["network_calls"] += int(out.sample_calls.sum())

    def score_ensemble(self, tally: Tally, sampler: OrderSampler, scored: dict,
                       sample_indices: torch.Tensor, idx: torch.Tensor,
                       lengths: torch.Tensor) -> None:
        s, model = self.settings, self.model
        b, n = idx.shape
        with self.timed(tally):
            # The base order's forward: counted here even when shared with an order kind above.
            tally.forwards, tally.slot_forwards = tally.forwards + b, tally.slot_forwards + b * n
            if s.ensemble_base in scored:
                base_orders, base_nll = scored[s.ensemble_base]
            else:
                base_orders = READING_SCORES[s.ensemble_base].orders(sampler, 0, sample_indices,
                                                                     lengths, n)
                base_nll = model(idx, base_orders).double()
            unit_sample, unit_target, counts = choose_targets(
                s.seed, sample_indices, lengths, s.ensemble_targets, n)
            unit_nll = base_nll[unit_sample, unit_target][:, None]  # (U, 1): member 0
            if s.members > 1:
                members, forwards, slot_forwards = ensemble_member_nll(
                    model, idx, base_orders, sample_indices[unit_sample], unit_sample,
                    unit_target, s.members, s.seed, s.batch_size * n)
                unit_nll = torch.cat([unit_nll, members], dim=1)  # (U, M)
                tally.forwards += forwards
                tally.slot_forwards += slot_forwards
            tally.sums += ensemble_sums(unit_nll, unit_sample, counts, lengths, s.ensemble)
            tally.extra["tokens"] += int(lengths.sum())
            tally.extra["scored_targets"] += len(unit_target)
            # the paper: per sequence, 1 + targets x (M-1) full forwards of n+1 slots
            tally.paper_slot_forwards += int((1 + counts * (s.members - 1)).sum()) * (n + 1)

    # ---- results -----------------------------------------------------------------------------

    @staticmethod
    def _cost(tally: Tally) -> dict:
        return {"forwards": tally.forwards, "token_forwards": tally.slot_forwards,
                "wall_s": round(tally.seconds, 3)}

    def summarize_exact(self, tally: Tally) -> dict:
        nll_sum, tokens = tally.sums.tolist()
        return {**_score(nll_sum, tokens), "tokens": round(tokens), **self._cost(tally)}

    def summarize_planner(self, tally: Tally) -> dict:
        nll_sum, tokens = tally.sums.tolist()
        return {**_score(nll_sum, tokens), "tokens": round(tokens), "likelihood": "exact",
                "network_calls": tally.extra["network_calls"], **self._cost(tally)}

    def summarize_random(self, tally: Tally) -> dict:
        per_order = (tally.sums[:, 0] / tally.sums[:, 1]).tolist()
        sums = tally.sums.sum(dim=0).tolist()
        std = float(np.std(per_order, ddof=1)) if len(per_order) > 1 else None
        return {**_score(*sums), "tokens": round(tally.sums[0, 1].item()),
                "num_orders": len(per_order), "nll_std": std, "nll_per_order": per_order,
                **self._cost(tally)}

    def summarize_ensemble(self, tally: Tally) -> dict:
        s, tokens = self.settings, tally.extra["tokens"]
        by_members = {}
        for m, (total, variance) in zip(s.ensemble, tally.sums.tolist(), strict=True):
            by_members[str(m)] = {**_score(total, tokens),
                                  "nll_se": _finite(math.sqrt(variance) / tokens)}
        return {"base": s.ensemble_base, "members": s.members,
                "targets_per_sequence": s.ensemble_targets, "tokens": tokens,
                "scored_targets": tally.extra["scored_targets"], "by_members": by_members,
                **self._cost(tally), "paper_token_forwards": tally.paper_slot_forwards}
