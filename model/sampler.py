"""Any-order generation with a static KV cache: the paper's decoder sampler.

Each sample draws its order σ up front (given positions first, the rest random or left to right)
and a number of revealed tokens N_i after each step i = 1..S (N_0 = number of given tokens,
N_S = n). The training stream has one slot per prediction (model/gpt.py):

    slot k   holds x[σ_{k-1}] at its position ([None] for k = 0)   condition σ_k   predicts x[σ_k]

A step with c = N_{i-1} tokens known and hi = N_i to reveal feeds the contiguous slots lo..hi-1:
the real slots lo..c (tokens revealed by the last step, c's token being the latest, a_m) and, in
slots c+1..hi-1, copies of slot c's token with their own targets σ_k. The "parallel generation
mask" lets row k see

    key j   iff   j == k   or   (j <= k and j < c)

i.e. the cache and the new real rows causally, and among the r = hi - c target rows only the
diagonal. Each target row therefore computes exactly what training computes for the order
"σ_0..σ_{c-1}, then σ_k": all r targets are drawn independently given the c known tokens, the
masked-diffusion step of Lemma 1, at the cost of the r target rows. Real slots keep their keys
and values in the cache (a token's next target is fixed by the order, so they equal a full
forward's); copies are overwritten by the next step. With S = n every step reveals one token and
this is exact ancestral sampling; over all steps about 2n rows go through the network.

A step is small (b x r rows) and made of hundreds of small operations, so its cost is their
launches, not their arithmetic. On a GPU the whole step is compiled by inductor (one graph per
step shape, fused kernels) and replayed as a CUDA graph; the AdaLN modulations, which depend on
the target position only, are tables built once per sampler (AOGPT.adaln_tables), and the
parallel generation mask is converted to an attention bias once per step, not in every layer.

The cache is preallocated once, [n_layer, 2, b, h, n+1, hd]: slot n is a trash slot where rows
that only pad a batch write. Samples of a batch may reveal different numbers of tokens per step
(binomial counts, per-sample prompts): every sample runs the same number of rows, and the rows
past its own window are padding. All bookkeeping is planned on the host before the first step,
so a step never waits on the device; on a GPU each step shape (bucketed) is a CUDA graph.

Randomness is counter-based (model/orders.py): the order, the counts and the token drawn at each
position depend only on (seed, sample id), never on the batch a sample runs in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from aogpt import UsageError
from aogpt.model.config import GPT2_VOCAB, require_choices
from aogpt.model.gpt import AOGPT
from aogpt.model.orders import (
    ANY_ORDER,
    LEFT_TO_RIGHT,
    READING_WORDS,
    Stream,
    counter_uniform,
    reading_named,
    shuffle,
    unshuffle,
)

KEY_BLOCK = 128  # CUDA graphs attend over a multiple of this many cache slots
# On a CPU, calls of up to this many rows attend to the whole cache (plan_steps). Small model,
# bf16, batch 4, n = 1024 on a 2-core AVX512-BF16 EPYC: generation at S = 1024 (1 row a call)
# 36.9 -> 27.7 s, S = 256 (~8 rows) 11.9 -> 11.3 s, S = 128 (~16) 9.4 -> 9.1 s; at S = 64 (~32)
# the whole cache is slower (6.5 -> 7.9 s).
WHOLE_CACHE_ROWS = 16


@dataclass
class SamplingConfig:
    steps: int = 256  # network calls at most; steps = n is exact ancestral sampling
    # revealed fraction after step i of S: "linear" i/S, "cosine" 1 - cos(i/S * pi/2)
    schedule: Literal["linear", "cosine"] = "linear"
    # "deterministic": the paper's counts (at least one token per step); "binomial": each masked
    # token is revealed with the schedule's probability, exactly as in Lemma 1
    counts: Literal["deterministic", "binomial"] = "deterministic"
    order: Literal[READING_WORDS] = ANY_ORDER.word  # of the positions that are not given
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    # which tokens the nucleus keeps: "standard" (as transformers and most samplers) the smallest
    # set of most likely tokens whose mass reaches top_p (mass >= top_p); "paper" (the AO-GPT
    # paper's code) every token up to where the cumulative mass exceeds top_p, at least the most
    # likely one (mass <= top_p). "paper" keeps one token fewer whenever the mass does not hit
    # top_p exactly, so its samples are a little less diverse, and its generative perplexity lower.
    top_p_rule: Literal["standard", "paper"] = "standard"
    top_k: int = 0  # 0 = off
    seed: int = 0

    def __post_init__(self):
        self.order = reading_named(self.order, "order").word  # an alias is kept as its word

    def validate(self) -> None:
        if self.steps < 1:
            raise UsageError(f"steps must be >= 1, got {self.steps}")
        require_choices(self, ("schedule", "counts", "top_p_rule"))
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0 (0 = off), got {self.top_k}")


# ---- given tokens: a prompt and infill ------------------------------------------------------------


def given_tokens(seq_len: int, prompt: str | Sequence[int] | torch.Tensor | None = None,
                 infill: Mapping[int | str, str | Sequence[int] | torch.Tensor] | None = None,
                 encoding=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_len,) tokens and mask of the given positions, as generate() takes them (expanded to
    (b, seq_len)): the prompt from position 0, then each infill value from its start position,
    e.g. {40: " the river", "60": [13, 383]}; each is text or token ids (a list or a tensor). A
    key may be a string, as in a JSON object.

    encoding turns text into GPT-2 ids, so text needs one: tiktoken's
    (aogpt.data_prep.tokenizer.load_gpt2), whose encode_ordinary reads "<|endoftext|>" as plain
    text, or any tokenizer with encode(text). Bad input is a UsageError that names positions, not
    flags: a command says which of its flags gave them.
    """
    pieces = [] if prompt is None else [(0, prompt)]
    pieces += list((infill or {}).items())
    tokens = torch.zeros(seq_len, dtype=torch.long)
    mask = torch.zeros(seq_len, dtype=torch.bool)
    for key, piece in pieces:
        try:
            start = int(key)
        except ValueError as err:
            raise UsageError(f"infill key {key!r} is not a token position") from err
        ids = _token_ids(start, piece, encoding)
        end = start + len(ids)
        if start < 0 or end > seq_len:
            raise UsageError(f"given text at {start}..{end - 1} does not fit in a sequence of "
                             f"{seq_len} tokens")
        if mask[start:end].any():
            raise UsageError(f"given text at {start}..{end - 1} overlaps other given text")
        tokens[start:end] = ids
        mask[start:end] = True
    return tokens, mask


def _token_ids(start: int, piece, encoding) -> torch.Tensor:
    """The GPT-2 ids (n,) int64 of one given piece: text through `encoding`, or ids as they are."""
    if isinstance(piece, str):
        if encoding is None:
            raise UsageError(f"given text at {start} needs a tokenizer: pass encoding, or give "
                             "token ids")
        # tiktoken's encode refuses special tokens in text: prefer its encode_ordinary when present
        encode = getattr(encoding, "encode_ordinary", None) or encoding.encode
        return torch.tensor(encode(piece), dtype=torch.long)
    try:
        ids = torch.as_tensor(piece)
    except (TypeError, ValueError, RuntimeError):  # what as_tensor raises for other than numbers
        ids = None
    # a list of ids, or a tensor of them (flattened: a tokenizer's (1, n) too); an empty list
    # reads as float32
    if ids is None or ids.dim() == 0 or (ids.numel() and (ids.is_floating_point() or ids.is_complex())):
        raise UsageError(f"given tokens at {start}: give a string or a list of token ids")
    ids = ids.flatten().long().cpu()
    if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) < GPT2_VOCAB:
        raise UsageError(f"given tokens at {start}: token ids must be in 0..{GPT2_VOCAB - 1}")
    return ids


# ---- what to reveal, and when: decided before any network call -----------------------------------


def revealed_fraction(schedule: str, steps: int) -> torch.Tensor:
    """(steps + 1,) float64: the fraction of masked tokens revealed after each step, 0 ... 1."""
    t = torch.arange(steps + 1, dtype=torch.float64) / steps
    fraction = t if schedule == "linear" else 1 - torch.cos(t * math.pi / 2)
    fraction[-1] = 1.0  # cos(pi/2) is not exactly 0 in floating point
    return fraction


def reveal_counts(config: SamplingConfig, given: torch.Tensor, seq_len: int,
                  sample_ids: torch.Tensor) -> torch.Tensor:
    """(b, steps + 1) int64 on the CPU: N_i, the tokens known after step i (N_0 = given count).

    given (b,): positions given per sample. "deterministic" reveals floor(fraction * masked) but at
    least one more token per step while any is masked; "binomial" draws each masked token's
    reveal independently (the counts are then Binomial, and a step may reveal none).
    """
    given, sample_ids = given.cpu(), sample_ids.cpu()
    masked = (seq_len - given)[:, None]  # (b, 1)
    fraction = revealed_fraction(config.schedule, config.steps)
    if config.counts == "deterministic":
        base = torch.floor(masked * fraction + 1e-9).long()  # exact for linear fractions i/S
        steps = torch.arange(config.steps + 1)
        revealed = (base - steps).cummax(dim=1).values + steps  # N_i >= N_{i-1} + 1
    else:
        # a token is revealed by step i iff its uniform u <= fraction_i: count them per step
        positions = torch.arange(seq_len)
        u = counter_uniform(config.seed, sample_ids[:, None], Stream.REVEAL, positions)
        u = torch.where(positions < masked, u, 2.0).sort(dim=1).values
        revealed = torch.searchsorted(u, fraction.expand(len(u), -1).contiguous(), right=True)
    return (given[:, None] + revealed.clamp(max=masked)).long()


def draw_orders(config: SamplingConfig, given_mask: torch.Tensor,
                sample_ids: torch.Tensor) -> torch.Tensor:
    """(b, n) int64: given positions first (ascending), then the others in random or l2r order."""
    b, n = given_mask.shape
    positions = torch.arange(n, device=given_mask.device)
    if config.order == ANY_ORDER.word:
        keys = counter_uniform(config.seed, sample_ids[:, None], Stream.SAMPLE_ORDER, positions)
    else:
        keys = positions.double().expand(b, n) / n
    keys = torch.where(given_mask, positions.double() - n, keys)
    return keys.argsort(dim=1, stable=True)


@dataclass
class StepPlan:
    """The network calls of one generation. bounds (calls, 3, b): lo, c, hi per sample (the rows
    fed are slots lo..max(hi, c+1)-1, the targets slots c..hi-1); shapes: (rows, targets, keys)
    per call, after bucketing."""

    bounds: torch.Tensor
    shapes: list[tuple[int, int, int]]


def _bucket(size: int, cap: int) -> int:
    return min(1 << (size - 1).bit_length(), cap)


def plan_steps(counts: torch.Tensor, seq_len: int, bucketed: bool,
               whole_cache: bool = False) -> StepPlan:
    """Turns the reveal counts (b, S+1) into network calls, skipping steps that reveal nothing.

    bucketed: round the shapes up (rows and targets to powers of two, keys to KEY_BLOCK) so that
    few distinct shapes occur, one CUDA graph each. whole_cache: a call of at most
    WHOLE_CACHE_ROWS rows attends to all seq_len + 1 slots (those it may not see are masked): a
    CPU's bf16 matmul copies a strided slice of the cache first, which costs a few-row call more
    than the masked slots do.
    """
    known, reveal = counts[:, :-1].T, counts[:, 1:].T  # (S, b): c and hi of every step
    active = (reveal > known).any(dim=1)
    c, hi = known[active], reveal[active]
    # real rows up to c are in the cache after a call; a sample that revealed nothing at the
    # last call still needs row c again (as a query) when its targets come
    fed = torch.cat([torch.zeros_like(c[:1]), c[:-1] + 1])
    lo = torch.minimum(fed, c)
    end = torch.maximum(hi, c + 1).clamp(max=seq_len)
    rows = (end - lo).amax(dim=1).tolist()
    targets = (hi - c).amax(dim=1).tolist()
    keys = end.amax(dim=1).tolist()
    if bucketed:
        rows = [_bucket(r, seq_len) for r in rows]
        targets = [_bucket(r, seq_len) for r in targets]
        keys = [min(-(-k // KEY_BLOCK) * KEY_BLOCK, seq_len) for k in keys]
    if whole_cache:
        keys = [seq_len + 1 if r <= WHOLE_CACHE_ROWS else k for r, k in zip(rows, keys, strict=True)]
    return StepPlan(torch.stack([lo, c, hi], dim=1), list(zip(rows, targets, keys, strict=True)))


# ---- drawing tokens --------------------------------------------------------------------------------


def filter_logits(logits: torch.Tensor, config: SamplingConfig,
                  real_vocab: int = GPT2_VOCAB) -> torch.Tensor:
    """Logits (..., vocab) -> (..., real_vocab) scaled by the temperature, with -inf for the
    tokens outside top-k and the top-p nucleus. The padded ids >= real_vocab are cut off."""
    logits = logits[..., :real_vocab]
    if config.temperature > 0 and config.temperature != 1.0:
        logits = logits / config.temperature
    if config.top_k:
        kth = logits.topk(min(config.top_k, real_vocab), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass = probs.cumsum(dim=-1)  # up to and including each token
        if config.top_p_rule == "standard":  # the mass before it already reaches top_p
            outside = mass - probs >= config.top_p
        else:  # "paper": the mass up to it exceeds top_p; the most likely token always stays
            outside = mass > config.top_p
            outside[..., 0] = False
        logits = logits.masked_fill(outside.scatter(-1, sorted_ids, outside), float("-inf"))
    return logits


def token_uniforms(config: SamplingConfig, sample_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(b, seq_len) float64 in [0, 1): the uniform that draws the token at each position, keyed
    by (seed, sample id, position), so a token is the same whatever batch or step draws it."""
    positions = torch.arange(seq_len, device=sample_ids.device)
    return counter_uniform(config.seed, sample_ids[:, None], Stream.TOKEN, positions)


CDF_BLOCK = 256  # tokens per block of the two-level inverse CDF (sample_from_logits)


def sample_from_logits(logits: torch.Tensor, config: SamplingConfig,
                       uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of logits (b, r, vocab): (b, r) int64, by inverse-CDF sampling with
    the given uniforms (b, r) (see token_uniforms)."""
    logits = filter_logits(logits, config)
    if config.temperature == 0:
        return logits.argmax(dim=-1)
    return inverse_cdf(logits.float().softmax(dim=-1), uniforms)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The first token whose cumulative probability exceeds u x total: probs (..., vocab) fp32,
    uniforms (...) float64 in [0, 1) -> (...) int64. A token of probability 0 (filtered out) is
    never drawn.

    Summing 50K probabilities needs float64, but not over the whole vocabulary: the blocks of
    CDF_BLOCK tokens are summed (read once, fp32 in, float64 sums out), the uniform finds its
    block in their (vocab / CDF_BLOCK) running sums, then its token in that block's own running
    sum. Both levels sum the same fp32 numbers in float64, so the token is the one a float64
    running sum over all 50K would give, except when u x total falls within float64 rounding
    (~1e-16 relative) of a boundary between two tokens.
    """
    vocab = probs.size(-1)
    whole = vocab // CDF_BLOCK * CDF_BLOCK  # the last block may be short: summed apart, no copy
    # converted whole, then summed: a CPU's sum(dtype=float64) of the strided blocks converts
    # element by element (small, batch 4, S = 64: 7-23 ms a call against ~1 ms)
    wide = probs.double()
    sums = wide[..., :whole].unflatten(-1, (-1, CDF_BLOCK)).sum(dim=-1)
    if whole < vocab:
        sums = torch.cat([sums, wide[..., whole:].sum(dim=-1, keepdim=True)], dim=-1)
    ends = sums.cumsum(dim=-1)  # (..., blocks)
    total = ends[..., -1]
    point = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(ends, point[..., None], right=True).clamp(max=ends.size(-1) - 1)
    start = torch.where(block > 0, ends.gather(-1, (block - 1).clamp(min=0)), 0.0)  # (..., 1)
    tokens = block * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)  # (..., CDF_BLOCK)
    inside = probs.gather(-1, tokens.clamp(max=vocab - 1)) * (tokens < vocab)  # past it: 0
    running = start + inside.cumsum(dim=-1, dtype=torch.float64)  # (..., CDF_BLOCK)
    # the two levels round differently: should point reach past the block's own running sum
    # (a ~1e-16 difference), its last token of non-zero probability is the one
    last = (torch.arange(CDF_BLOCK, device=probs.device) * (inside > 0)).amax(dim=-1, keepdim=True)
    offset = torch.searchsorted(running, point[..., None], right=True).clamp(max=last)
    return (block * CDF_BLOCK + offset).squeeze(-1)


# ---- the cache and the sampler ---------------------------------------------------------------------


class StaticKVCache:
    """Keys and values of every layer, each (b, h, slots, hd), allocated once.

    Before each call, `prepare` says where the new rows go and how many slots they may see;
    attention then calls `update` (the attention.KVCache protocol) once per layer. Each layer's
    keys and values are a tensor of their own, not views of one: a compiled step then writes
    its new rows into them in place, where writing into a view makes inductor copy the base.

    keys_last: the keys are stored as (b, h, hd, slots) and handed to attention as a transposed
    view, so that q @ k^T reads them as they lie. A CPU's bf16 batched matmul copies k^T first
    whenever the visible slots are fewer than all of them (small model, batch 4, 31 rows, 600 of
    1025 slots: 1.76 ms -> 1.03 ms a layer on an AVX512-BF16 EPYC); the GPU kernels want
    (b, h, slots, hd).
    """

    def __init__(self, n_layer: int, batch: int, n_head: int, slots: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, keys_last: bool = False):
        shape = (batch, n_head, slots, head_dim)
        key_shape = (batch, n_head, head_dim, slots) if keys_last else shape
        self.keys_last = keys_last
        self.keys = [torch.zeros(key_shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.rows = torch.arange(batch, device=device)[:, None]  # (b, 1)
        self.write_slots: torch.Tensor | None = None
        self.visible = slots

    def prepare(self, write_slots: torch.Tensor, visible: int) -> None:
        """write_slots (b, s): the slot of each new row; visible: slots 0..visible-1 are attended."""
        self.write_slots, self.visible = write_slots, visible

    @property
    def kv(self) -> torch.Tensor:
        """A copy of the whole cache, (n_layer, 2, b, h, slots, hd): for inspection."""
        keys = [k.transpose(-2, -1) if self.keys_last else k for k in self.keys]
        return torch.stack([torch.stack(pair) for pair in zip(keys, self.values, strict=True)])

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        # indexing (b, s) pairs moves them first: the values go in as (b, s_new, h, hd), in the
        # cache's dtype (under autocast the projections come in bf16 over fp32 weights)
        if self.keys_last:
            keys[self.rows, :, :, self.write_slots] = k.transpose(1, 2).to(keys.dtype)
            visible_keys = keys[..., :self.visible].transpose(-2, -1)
        else:
            keys[self.rows, :, self.write_slots] = k.transpose(1, 2).to(keys.dtype)
            visible_keys = keys[:, :, :self.visible]
        values[self.rows, :, self.write_slots] = v.transpose(1, 2).to(values.dtype)
        return visible_keys, values[:, :, :self.visible]


@dataclass
class Generation:
    tokens: torch.Tensor  # (b, n) int64, at their original positions
    orders: torch.Tensor  # (b, n) int64, the order each sample was generated in
    network_calls: int
    rows: int  # token rows per sequence pushed through the network (padding included)


@dataclass
class StepOutput:
    """Handed to generate's on_step after every call; tensors may be reused by the next call."""

    call: int
    logits: torch.Tensor  # (b, r, vocab) float, the unfiltered logits of the targets
    target_slots: torch.Tensor  # (b, r): targets are orders[:, slot]; slot >= hi is padding
    valid: torch.Tensor  # (b, r) bool
    bounds: torch.Tensor  # (3, b): lo, c, hi of this call


class KVCacheSampler:
    """Generates batches of batch_size sequences of seq_len tokens with `model`.

        sampler = KVCacheSampler(model, batch_size=32, seq_len=1024, config=SamplingConfig())
        out = sampler.generate(torch.arange(32))     # sample ids 0..31
        out.tokens                                   # (32, 1024)

    A prompt and infill (given_tokens) are the same for every sample of the batch:

        tokens, mask = given_tokens(1024, prompt="The city of", infill={40: " river"},
                                    encoding=encoding)
        out = sampler.generate(torch.arange(32), tokens.expand(32, -1), mask.expand(32, -1))

    The model runs in its own dtype (cast it to bf16 on a GPU) and must be in eval mode.
    cuda_graphs, compile: None = on a CUDA device. compile: each step shape through
    torch.compile (inductor; on a CPU it takes longer to compile than short runs gain).
    """

    def __init__(self, model: AOGPT, batch_size: int, seq_len: int, config: SamplingConfig,
                 cuda_graphs: bool | None = None, compile: bool | None = None):
        config.validate()
        mc = model.config
        if not 1 <= seq_len <= mc.block_size:
            raise UsageError(f"seq_len must be in 1..{mc.block_size} (the model's block size), "
                             f"got {seq_len}")
        if model.training:
            raise UsageError("the model is in training mode: call model.eval() before sampling")
        if config.order != LEFT_TO_RIGHT.word:
            mc.require_any_order(f"use order={LEFT_TO_RIGHT.word}")
        weight = model.lm_head.weight
        self.model, self.config, self.seq_len, self.batch_size = model, config, seq_len, batch_size
        self.device = weight.device
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and self.device.type != "cuda":
            raise UsageError("CUDA graphs need the model on a CUDA device")
        self.compiled = self.device.type == "cuda" if compile is None else compile
        # compiled: one graph per step shape, so shapes are bucketed to keep them few
        self.bucketed = self.cuda_graphs or self.compiled
        self._network_step = (torch.compile(self._step, dynamic=False, fullgraph=True)
                              if self.compiled else self._step)
        with torch.no_grad():
            self.adaln_tables, _ = model.adaln_tables()  # fixed addresses, refreshed in place
        self._tables_version = self._weights_version()
        # a CPU's calls of more than WHOLE_CACHE_ROWS rows (about 2 n / S per sample) attend to a
        # slice of the cache, where keys stored last save a copy (small, batch 4, n = 1024: S = 64
        # 9.3 -> 9.0 s); calls of fewer attend to all of it, where they cost (S = 1024: 42 -> 47 s)
        keys_last = self.device.type == "cpu" and 2 * seq_len > WHOLE_CACHE_ROWS * config.steps
        self.cache = StaticKVCache(mc.n_layer, batch_size, mc.n_head, seq_len + 1, mc.head_dim,
                                   weight.dtype, self.device, keys_last=keys_last)
        # the state a step reads and writes (fixed addresses, as CUDA graphs need)
        self.orders = torch.zeros(batch_size, seq_len, dtype=torch.long, device=self.device)
        self.ordered = torch.zeros(batch_size, seq_len + 1, dtype=torch.long, device=self.device)
        self.uniforms = torch.zeros(batch_size, seq_len, dtype=torch.float64, device=self.device)
        self.bounds = torch.zeros(3, batch_size, dtype=torch.long, device=self.device)
        self._graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self._pool = None

    @torch.no_grad()
    def generate(self, sample_ids: torch.Tensor, given_tokens: torch.Tensor | None = None,
                 given_mask: torch.Tensor | None = None,
                 on_step: Callable[[StepOutput], None] | None = None) -> Generation:
        """Samples (b,) ids (b <= batch_size; they key the randomness). given_tokens and
        given_mask (b, n) fix tokens at chosen positions (a prompt, or any infill pattern)."""
        b, n, full = len(sample_ids), self.seq_len, self.batch_size
        if not 1 <= b <= full:
            raise UsageError(f"generate takes 1..{full} sample ids, got {b}")
        if given_mask is None:
            given_mask = torch.zeros(b, n, dtype=torch.bool)
            given_tokens = torch.zeros(b, n, dtype=torch.long)
        if given_mask.shape != (b, n) or given_tokens is None or given_tokens.shape != (b, n):
            raise UsageError(f"given_tokens and given_mask must both be (samples, seq_len) = {(b, n)}")
        pad = torch.arange(full) % b  # a short batch repeats its samples; the copies are dropped
        sample_ids, given_tokens, given_mask = (t.to(self.device)[pad]
                                                for t in (sample_ids, given_tokens, given_mask))
        counts = reveal_counts(self.config, given_mask.sum(dim=1), n, sample_ids)
        plan = plan_steps(counts, n, bucketed=self.bucketed, whole_cache=self.device.type == "cpu")
        self._refresh_tables()
        self.uniforms.copy_(token_uniforms(self.config, sample_ids, n))
        self.orders.copy_(draw_orders(self.config, given_mask, sample_ids))
        self.ordered[:, :n].copy_(shuffle(given_tokens.long(), self.orders))
        bounds = plan.bounds.to(self.device)
        for call, shape in enumerate(plan.shapes):
            self.bounds.copy_(bounds[call])
            logits, target_slots, valid = self._run(*shape)
            if on_step is not None:
                on_step(StepOutput(call, logits, target_slots, valid, self.bounds))
        tokens = unshuffle(self.ordered[:, :n], self.orders)
        return Generation(tokens[:b].clone(), self.orders[:b].clone(), len(plan.shapes),
                          sum(rows for rows, _, _ in plan.shapes))

    def _weights_version(self) -> int:
        """Changes whenever a weight the AdaLN tables are made of is changed in place (a host
        counter: reading it waits for nothing). Weights made under torch.inference_mode keep no
        counter: they count as unchanged."""
        return sum(0 if p.is_inference() else p._version for name, p in self.model.named_parameters()
                   if "adaLN" in name or "wtpe" in name)

    def _refresh_tables(self) -> None:
        """Rebuilds the AdaLN tables if the model's weights changed since (an optimizer step, a
        load_state_dict): into the same tensors, which captured CUDA graphs read."""
        version = self._weights_version()
        if version == self._tables_version:
            return
        with torch.no_grad():
            for table, fresh in zip(self.adaln_tables, self.model.adaln_tables()[0], strict=True):
                if table is not None:
                    table.copy_(fresh)
        self._tables_version = self._weights_version()

    def _run(self, rows: int, targets: int, keys: int):
        run = self._replay if self.cuda_graphs else self._network_step
        if not self.compiled:  # eager: not even importing dynamo (a second of a CPU's start-up)
            return run(rows, targets, keys)
        # a graph per step shape: raise dynamo's limit of recompilations of one function to the
        # number of shapes a plan can have (rows, targets: powers of two; keys: KEY_BLOCK steps)
        shapes = (self.seq_len.bit_length() + 1) ** 2 * (-(-self.seq_len // KEY_BLOCK))
        with torch._dynamo.config.patch(recompile_limit=max(8, shapes)):
            return run(rows, targets, keys)

    def _replay(self, rows: int, targets: int, keys: int):
        shape = (rows, targets, keys)
        if shape not in self._graphs:
            # A step is idempotent (same inputs, same writes), so the warm-up run that sets up
            # cuBLAS and attention workspaces (and compiles) outside the capture may run it.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._network_step(*shape)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self._network_step(*shape)
            self._graphs[shape] = (graph, outputs)
        graph, outputs = self._graphs[shape]
        graph.replay()
        return outputs

    def _step(self, rows: int, targets: int, keys: int):
        """One network call on the current bounds: feeds `rows` rows per sample, draws up to
        `targets` tokens per sample into self.ordered, attends over `keys` cache slots."""
        n = self.seq_len
        lo, c, hi = self.bounds[0, :, None], self.bounds[1, :, None], self.bounds[2, :, None]
        slot = lo + torch.arange(rows, device=self.device)  # (b, rows)
        fed = slot < torch.maximum(hi, c + 1).clamp(max=n)
        # a row at slot k carries the token of slot min(k, c): its own, or a_m's for the copies
        source = torch.minimum(slot, c)
        token_index = (source - 1).clamp(min=0)
        tokens = self.ordered.gather(1, token_index)
        positions = torch.where(source == 0, -1, self.orders.gather(1, token_index))
        target_positions = self.orders.gather(1, slot.clamp(max=n - 1))
        # padding rows write to the trash slot n and attend like row c (all finite keys)
        self.cache.prepare(torch.where(fed, slot, n), keys)
        query = torch.where(fed, slot, c)[:, None, :, None]  # (b, 1, rows, 1)
        key = torch.arange(keys, device=self.device)
        mask = (key == query) | ((key <= query) & (key < c[:, None, None]))  # (b, 1, rows, keys)
        hidden = self.model.forward_stream(tokens, positions, target_positions, mask, self.cache,
                                           self.adaln_tables)
        # target rows: slots c..hi-1, at row offset c - lo
        target_slots = c + torch.arange(targets, device=self.device)  # (b, targets)
        valid = target_slots < hi
        row = (target_slots - lo).clamp(max=rows - 1)
        chosen = hidden.gather(1, row[..., None].expand(-1, -1, hidden.size(-1)))
        logits = self.model.lm_head(chosen)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (b, targets, vocab)
        drawn_positions = self.orders.gather(1, target_slots.clamp(max=n - 1))
        drawn = sample_from_logits(logits, self.config, self.uniforms.gather(1, drawn_positions))
        self.ordered.scatter_(1, torch.where(valid, target_slots, n), drawn)
        return logits, target_slots, valid
