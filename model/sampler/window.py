"""Text longer than the block: a window slides over it, semi-autoregressively (as MDLM and BD3-LM
generate past their training length).

The first chunk is an ordinary generation of the block's n positions. Each next one keeps the last
W tokens written as given tokens at positions 0..W-1 (rebased: the network sees a sequence that
starts W tokens before the new text) and generates the next n - W positions, in whatever way the
sampler's settings say (order, planner, speculative drafts), until the text reaches its length.
Positions the caller gives (a prompt, infill) stay given in whichever chunk covers them. Each
chunk draws with its own randomness: the sample ids offset by the chunk's index times
CHUNK_STRIDE, so a sample still depends only on its id and the seed, never on its batch.

Stop rules make the length variable (each sample stops on its own; the batch runs until all have
stopped or reached the length), checked after every chunk:
  at_eos            the text ends after its second end-of-text token (the first opens a document
                    in text packed as in training; the second closes it)
  entropy_below H   the unigram entropy (nats) of the last STOP_ENTROPY_TOKENS tokens fell below
                    H: the text has degenerated into repetition; it ends with that chunk
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aogpt import UsageError
from aogpt.model.sampler.outputs import LongGeneration
from aogpt.model.sampler.recording import cut_calls, shifted

if TYPE_CHECKING:
    from aogpt.model.sampler.engine import KVCacheSampler

CHUNK_STRIDE = 1 << 40  # sample ids must stay below it: chunk k draws with ids + k * CHUNK_STRIDE
STOP_ENTROPY_TOKENS = 256  # the entropy rule's window (BD3-LM checks its samples' tail alike)


@dataclass
class StopRules:
    eos: int | None = None  # at_eos: the end-of-text id (None: off)
    entropy_below: float | None = None  # nats (None: off)

    def where(self, tokens: list[int]) -> tuple[int, str] | None:
        """(the length the text keeps, why) if the text written so far stops, else None."""
        if self.eos is not None:
            ends = [i for i, token in enumerate(tokens) if token == self.eos]
            if len(ends) >= 2:
                return ends[1] + 1, "second end-of-text"
        if (self.entropy_below is not None
                and unigram_entropy(tokens[-STOP_ENTROPY_TOKENS:]) < self.entropy_below):
            return len(tokens), f"unigram entropy below {self.entropy_below}"
        return None


def unigram_entropy(tokens: Sequence[int]) -> float:
    """Entropy (nats) of the token frequencies of one text: the stop rule's, and what the judge
    (trainer/judge.py) reports of samples."""
    counts = Counter(tokens).values()
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts)


def check_window(block: int, window: int) -> None:
    """Refuses a window that leaves no room for new tokens (one line)."""
    if not 1 <= window < block:
        raise UsageError(f"--window must be in 1..{block - 1} (tokens kept from the text so far, "
                         f"below the block size {block}), got {window}")


def chunks(length: int, block: int, window: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk's positions in the text: the first is 0..block, each next one
    begins `window` positions before the last one's end."""
    spans, start, end = [], 0, min(block, length)
    spans.append((start, end))
    while end < length:
        start = end - window
        end = min(start + block, length)
        spans.append((start, end))
    return spans


def generate_long(sampler_for: Callable[[int], KVCacheSampler], block: int,
                  sample_ids: torch.Tensor, length: int, window: int, given_tokens: torch.Tensor,
                  given_mask: torch.Tensor, stop: StopRules | None = None,
                  record_calls: bool = False,
                  chunk_done: Callable[[], None] | None = None) -> LongGeneration:
    """Samples (b,) ids of `length` tokens; given_tokens and given_mask are (b, length).
    sampler_for(seq_len) returns a KVCacheSampler of that many positions (every chunk but
    perhaps the last has `block`). record_calls: each sample's calls, every chunk's, with
    positions in the text (recording.py). chunk_done() is called after each chunk (progress)."""
    b = len(sample_ids)
    spans = chunks(length, block, window)
    text = torch.zeros(b, length, dtype=torch.long)
    written = torch.zeros(b, length, dtype=torch.bool)
    orders: list[list[int]] = [[] for _ in range(b)]
    recorded: list[list[dict]] = [[] for _ in range(b)]
    calls, sample_calls = 0, [0] * b
    stopped: list[str | None] = [None] * b
    cut = [length] * b
    stats: dict[str, list[float]] = {}
    stop = stop or StopRules()
    for k, (start, end) in enumerate(spans):
        running = [i for i in range(b) if stopped[i] is None]
        if not running:
            break
        keep = torch.tensor(running)
        span = slice(start, end)
        tokens = torch.where(written[keep, span], text[keep, span], given_tokens[keep, span])
        mask = written[keep, span] | given_mask[keep, span]
        if mask.all():  # a prompt longer than the block: its chunks only slide over it
            text[keep, span], written[keep, span] = tokens, True
            if chunk_done:
                chunk_done()
            continue
        out = sampler_for(end - start).generate(sample_ids[keep] + k * CHUNK_STRIDE, tokens, mask,
                                                record_calls=record_calls)
        calls += out.network_calls
        for j, i in enumerate(running):
            new = [start + p for p in out.orders[j].tolist() if not mask[j, p]]
            orders[i] += new
            if record_calls:
                recorded[i] += [shifted(call, start) for call in out.calls[j]]
            sample_calls[i] += int(out.sample_calls[j])
            for name, values in out.stats.items():
                stats.setdefault(name, [0] * b)[i] += values[j].item()
        text[keep, span] = out.tokens
        written[keep, span] = True
        for i in running:
            verdict = stop.where(text[i, :end].tolist())
            if verdict is not None and (verdict[0] < length or end < length):
                cut[i], stopped[i] = verdict
        if chunk_done:
            chunk_done()
    return LongGeneration(
        texts=[text[i, :cut[i]].tolist() for i in range(b)],
        orders=[[p for p in orders[i] if p < cut[i]] for i in range(b)], network_calls=calls,
        sample_calls=sample_calls, seams=[start + window for start, _ in spans[1:]],
        stopped=stopped, stats=stats,
        calls=[cut_calls(recorded[i], cut[i]) for i in range(b)] if record_calls else None)
