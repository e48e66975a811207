"""Drawing tokens from logits: temperature, top-k and top-p, and inverse-CDF draws keyed by
position, so that a position's token depends on (seed, sample, position) only.

One way of drawing: the distribution token_probs gives, inverted at the position's uniform
(inverse_cdf); sample_from_logits is the two together, and a strategy that needs the
distribution besides (speculative.py's acceptance) calls them one after the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aogpt.model.config import GPT2_VOCAB
from aogpt.model.orders import Stream, counter_uniform

if TYPE_CHECKING:
    from aogpt.model.sampler.config import SamplingConfig


def filter_logits(logits: torch.Tensor, config: SamplingConfig,
                  real_vocab: int = GPT2_VOCAB) -> torch.Tensor:
    """Logits (..., vocab) -> (..., real_vocab) scaled by the temperature, with -inf for the
    tokens outside top-k and the top-p nucleus. The padded ids >= real_vocab are cut off."""
    logits = logits[..., :real_vocab]
    if config.temperature > 0 and config.temperature != 1.0:
        logits = logits / config.temperature
    if config.top_k:
        kth = logits.topk(min(config.top_k, logits.size(-1)), dim=-1).values[..., -1:]
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


def position_uniforms(config: SamplingConfig, sample_ids: torch.Tensor, seq_len: int,
                      stream: Stream = Stream.TOKEN) -> torch.Tensor:
    """(b, seq_len) float64 in [0, 1): one uniform per position, keyed by (seed, sample id,
    stream, position), so a draw is the same whatever batch or step makes it. Stream.TOKEN draws
    each position's token."""
    positions = torch.arange(seq_len, device=sample_ids.device)
    return counter_uniform(config.seed, sample_ids[:, None], stream, positions)


def token_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The distribution each row's token is drawn from, (..., real vocab) fp32: the softmax of
    filter_logits, or all mass on the most likely token when greedy (temperature 0)."""
    logits = filter_logits(logits, config)
    if config.temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(
            -1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return logits.float().softmax(dim=-1)


CDF_BLOCK = 256  # tokens per block of the two-level inverse CDF (inverse_cdf)


def sample_from_logits(logits: torch.Tensor, config: SamplingConfig,
                       uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of logits (b, r, vocab): (b, r) int64, drawn from token_probs by
    inverse CDF with the given uniforms (b, r) (position_uniforms); greedy: the most likely."""
    return inverse_cdf(token_probs(logits, config), uniforms)


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
    width = torch.arange(min(CDF_BLOCK, vocab), device=probs.device)  # a small vocabulary: one
    tokens = block * CDF_BLOCK + width  # (..., width)
    inside = probs.gather(-1, tokens.clamp(max=vocab - 1)) * (tokens < vocab)  # past it: 0
    running = start + inside.cumsum(dim=-1, dtype=torch.float64)  # (..., width)
    # the two levels round differently: should point reach past the block's own running sum
    # (a ~1e-16 difference), its last token of non-zero probability is the one
    last = (width * (inside > 0)).amax(dim=-1, keepdim=True)
    offset = torch.searchsorted(running, point[..., None], right=True).clamp(max=last)
    return (block * CDF_BLOCK + offset).squeeze(-1)
